//! A real Kamailio (Debian's `kamailio` package, which `scripts/test.sh`
//! installs) as an independent peer: started in the foreground on a free
//! loopback port with a config from `tests/kamailio/`, queried over its
//! `ctl` binrpc socket with `kamcmd`, stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{free_udp_port, wait_for, ChildGuard};

/// A running Kamailio.
pub struct Kamailio {
    /// Its SIP (UDP) port on 127.0.0.1.
    pub port: u16,
    /// The `ctl` binrpc socket `kamcmd` talks to.
    pub ctl: PathBuf,
    /// Its stderr log.
    pub log: PathBuf,
    child: Option<ChildGuard>,
}

impl Kamailio {
    /// Starts Kamailio with `tests/kamailio/{config}` (its `LISTEN` and
    /// `CTL_SOCKET` filled in) and waits until its control socket answers.
    pub async fn start(dir: &Path, config: &str) -> Kamailio {
        Self::start_with(dir, config, &[]).await
    }

    /// [`start`](Self::start) with more placeholders of the config
    /// replaced (`(name, value)`, each name replaced before `LISTEN`).
    pub async fn start_with(
        dir: &Path,
        config: &str,
        substitutions: &[(&str, String)],
    ) -> Kamailio {
        let port = free_udp_port();
        let ctl = dir.join("kamailio.ctl");
        let source = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("kamailio")
            .join(config);
        let mut text = std::fs::read_to_string(&source)
            .unwrap_or_else(|e| panic!("read {}: {e}", source.display()));
        for (name, value) in substitutions {
            text = text.replace(name, value);
        }
        let text = text
            .replace("LISTEN", &format!("127.0.0.1:{port}"))
            .replace("CTL_SOCKET", &ctl.display().to_string());
        let cfg = dir.join(config);
        std::fs::write(&cfg, text).expect("write kamailio config");
        Self::spawn(dir, &cfg, port, ctl, &[]).await
    }

    /// Starts Kamailio with the config file `cfg` as it is (the shipped
    /// example), its `#!define`s set on the command line (`-A NAME=VALUE`,
    /// which the file's `#!ifndef` guards honour): `LISTEN` on a free
    /// loopback port and `CTL_SOCKET` in `dir`, plus `defines` (string
    /// values quoted as the file's are, integers bare, e.g.
    /// `ENGINE_TIMEOUT`) and `flags`, defined without a value (`-A NAME`,
    /// e.g. `WITH_HTTP_SELECT`).
    pub async fn start_file(
        dir: &Path,
        cfg: &Path,
        defines: &[(&str, String)],
        flags: &[&str],
    ) -> Kamailio {
        let port = free_udp_port();
        let ctl = dir.join("kamailio.ctl");
        let mut all = vec![
            format!("LISTEN=udp:127.0.0.1:{port}"),
            format!("CTL_SOCKET=\"unix:{}\"", ctl.display()),
        ];
        all.extend(defines.iter().map(|(k, v)| {
            if v.parse::<i64>().is_ok() {
                format!("{k}={v}")
            } else {
                format!("{k}=\"{v}\"")
            }
        }));
        all.extend(flags.iter().map(|f| (*f).to_owned()));
        Self::spawn(dir, cfg, port, ctl, &all).await
    }

    /// Runs Kamailio on `cfg` with each of `defines` as `-A`.
    async fn spawn(
        dir: &Path,
        cfg: &Path,
        port: u16,
        ctl: PathBuf,
        defines: &[String],
    ) -> Kamailio {
        let log = dir.join("kamailio.log");
        let file = std::fs::File::create(&log).expect("kamailio log");
        let err = file.try_clone().expect("clone log");
        let mut cmd = Command::new("kamailio");
        // -DD: no daemon, -E: log to stderr; its own runtime dir.
        cmd.args(["-DD", "-E", "-f"]).arg(cfg).arg("-Y").arg(dir);
        for define in defines {
            cmd.arg("-A").arg(define);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start kamailio (is it installed?): {e}"));
        let k = Kamailio {
            port,
            ctl,
            log,
            child: Some(ChildGuard { child }),
        };
        let up = wait_for(Duration::from_secs(10), || async {
            k.rpc(&["core.version"]).filter(|v| v.contains("kamailio"))
        })
        .await;
        assert!(
            up.is_some(),
            "kamailio did not answer on {}:\n{}",
            k.ctl.display(),
            std::fs::read_to_string(&k.log).unwrap_or_default()
        );
        k
    }

    /// Kamailio's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The SIP URI of this Kamailio, as an MSR's `realm` names it.
    pub fn realm(&self) -> String {
        format!("sip:127.0.0.1:{}", self.port)
    }

    /// `kamcmd` with `args` over the ctl socket; `None` when it fails.
    pub fn rpc(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("kamcmd")
            .arg("-s")
            .arg(format!("unix:{}", self.ctl.display()))
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Kamailio {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- kamailio log -----\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        if let Some(mut c) = self.child.take() {
            if c.terminate(Duration::from_secs(5)).is_none() {
                c.kill9();
            }
        }
    }
}
