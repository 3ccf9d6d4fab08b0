//! Whole-system helpers for the lifecycle and selection tests: the real
//! `msr-collector`, `msr-agent` and `msrctl` binaries, each test in its own
//! temporary directory with its own ports, control socket, state file,
//! configs and `file:` calls source.
//!
//! Children log to files in the test's directory; when a test panics the
//! [`Collector`]s and [`Agent`]s still alive print the tail of their logs
//! (so a failure in CI shows what the processes saw). State is always read
//! through a fresh control-socket connection per poll, so polls survive a
//! collector restart.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use msr_shared::admin::RegistrationStatus;
use msr_shared::admin::{Request, ResourceInfo, Response, ResponseData, SubscriptionInfo};
use msr_shared::subscription::SubscriptionState;

use crate::{bin_path, free_udp_port, wait_for, AdminClient, ChildGuard};

/// Spawns `bin` with `args`, stdout and stderr appended to `log`.
fn spawn_logged(bin: &str, args: &[&str], log: &Path) -> ChildGuard {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", log.display()));
    let err = file.try_clone().expect("clone log handle");
    let child = Command::new(bin_path(bin))
        .args(args)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin_path(bin).display()));
    ChildGuard { child }
}

/// Writes `text` to `path` atomically (temporary file in the same directory,
/// then rename), as an editor or the media engine would.
pub fn write_atomic(path: &Path, text: &str) {
    try_write_atomic(path, text).unwrap_or_else(|e| panic!("{e}"));
}

/// [`write_atomic`] for a tool: the error says which file failed.
pub fn try_write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))
}

/// How many lines of the log at `path` contain every one of `needles`.
pub fn count_log_lines(path: &Path, needles: &[&str]) -> usize {
    read_log(path)
        .lines()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .count()
}

/// Waits until more than `before` lines of the log at `path` contain every
/// one of `needles`, at most `limit`.
pub async fn wait_log_lines(path: &Path, before: usize, needles: &[&str], limit: Duration) -> bool {
    wait_for(limit, || async move {
        (count_log_lines(path, needles) > before).then_some(())
    })
    .await
    .is_some()
}

/// The log text with ANSI colour sequences removed (the collector colours
/// its log even into a file).
pub fn read_log(path: &Path) -> String {
    let raw = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The last `n` lines of a log, with raw SIP message dumps shortened.
fn log_tail(path: &Path, n: usize) -> String {
    let text = read_log(path);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines[start..]
        .iter()
        .map(|l| {
            if l.len() > 400 {
                format!(
                    "{}…",
                    &l[..l.char_indices().nth(400).map_or(l.len(), |(i, _)| i)]
                )
            } else {
                (*l).to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Settings of a test collector.
#[derive(Debug, Clone)]
pub struct CollectorOpts {
    /// `node`.
    pub node: String,
    /// `sip.min_expires`.
    pub min_expires: u32,
    /// `subscription.expires`.
    pub subscription_expires: u32,
    /// `sip.transports`: TCP beside UDP, on the same port.
    pub tcp: bool,
    /// `sip.transports` with `"tls"`: the config then needs a `[sip.tls]`
    /// table (given as the extra text) with `listen = "127.0.0.1:0"`.
    pub tls: bool,
}

impl Default for CollectorOpts {
    fn default() -> Self {
        Self {
            node: "core1@test".into(),
            min_expires: 2,
            subscription_expires: 30,
            tcp: false,
            tls: false,
        }
    }
}

/// A running `msr-collector` with its own port, socket, state and log.
pub struct Collector {
    /// Label used in file names and failure output.
    pub name: String,
    /// The SIP (UDP) port on 127.0.0.1.
    pub port: u16,
    /// The HTTP port, when its config has `[http] listen` on port 0 (the
    /// port the collector announced).
    pub http_port: Option<u16>,
    /// The redirect server's port, likewise.
    pub redirect_port: Option<u16>,
    /// The SIP TLS port, likewise.
    pub tls_port: Option<u16>,
    /// The control socket.
    pub socket: PathBuf,
    /// The operator-configuration store.
    pub state: PathBuf,
    /// The TOML config file.
    pub config: PathBuf,
    /// stdout + stderr of every run (appended across restarts).
    pub log: PathBuf,
    /// The process, `None` while stopped.
    pub child: Option<ChildGuard>,
}

impl Collector {
    /// Writes a config into `dir` (files prefixed with `name`) and starts
    /// the collector on port 0; its ports are the ones it announces in its
    /// `listening on …` lines, and the config is rewritten with them, so a
    /// restart binds the same ones. Waits for the control socket.
    pub async fn start(dir: &Path, name: &str, opts: &CollectorOpts) -> Collector {
        Self::start_with(dir, name, opts, "").await
    }

    /// [`start`](Self::start) with a redirect server on a free UDP port
    /// (`[redirect] listen = "127.0.0.1:0"`), and that port.
    pub async fn start_with_redirect(dir: &Path, name: &str) -> (Collector, u16) {
        let collector = Self::start_with(
            dir,
            name,
            &CollectorOpts::default(),
            "[redirect]\nlisten = \"127.0.0.1:0\"\n",
        )
        .await;
        let port = collector
            .redirect_port
            .expect("the redirect port announced");
        (collector, port)
    }

    /// [`start`](Self::start) with the HTTP API on a free port
    /// (`[http] listen = "127.0.0.1:0"`), and that port.
    pub async fn start_with_http(dir: &Path, name: &str) -> (Collector, u16) {
        let collector = Self::start_with(
            dir,
            name,
            &CollectorOpts::default(),
            "[http]\nlisten = \"127.0.0.1:0\"\n",
        )
        .await;
        let port = collector.http_port.expect("the http port announced");
        (collector, port)
    }

    /// [`start`](Self::start) with `extra` appended to the config (e.g.
    /// [`Etcd::store_toml`]).
    pub async fn start_with(
        dir: &Path,
        name: &str,
        opts: &CollectorOpts,
        extra: &str,
    ) -> Collector {
        let mut c = Self::write(dir, name, opts, extra, 0);
        c.spawn().await;
        c.learn_ports();
        c
    }

    /// Writes the config as [`start_with`](Self::start_with) does, without
    /// starting the collector, for a test that needs its address first:
    /// its SIP port is one that was free a moment ago.
    pub fn configure(dir: &Path, name: &str, opts: &CollectorOpts, extra: &str) -> Collector {
        Self::write(dir, name, opts, extra, free_udp_port())
    }

    /// The ports the collector announced at its first start (`listening on
    /// udp …`, `listening on http …`, `redirect server listening on udp
    /// …`), written back into its config for the next start.
    fn learn_ports(&mut self) {
        let log = read_log(&self.log);
        let announced = |needle: &str| -> Option<u16> {
            let line = log.lines().find(|l| l.contains(needle))?;
            let addr = line.split(needle).nth(1)?.split_whitespace().next()?;
            addr.parse::<std::net::SocketAddr>().ok().map(|a| a.port())
        };
        let Ok(text) = std::fs::read_to_string(&self.config) else {
            return;
        };
        let mut section = String::new();
        let mut out = String::new();
        for line in text.lines() {
            if line.starts_with('[') {
                section = line.trim_matches(|c| c == '[' || c == ']').to_owned();
            }
            let port = match section.as_str() {
                "sip" => announced("listening on udp "),
                "http" => announced("listening on http "),
                "redirect" => announced("redirect server listening on udp "),
                "sip.tls" => announced("listening on tls "),
                _ => None,
            };
            match port {
                Some(p) if line.trim() == "listen = \"127.0.0.1:0\"" => {
                    out.push_str(&format!("listen = \"127.0.0.1:{p}\"\n"));
                    match section.as_str() {
                        "sip" => self.port = p,
                        "http" => self.http_port = Some(p),
                        "sip.tls" => self.tls_port = Some(p),
                        _ => self.redirect_port = Some(p),
                    }
                }
                _ => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        std::fs::write(&self.config, out).expect("rewrite collector config");
    }

    fn write(dir: &Path, name: &str, opts: &CollectorOpts, extra: &str, port: u16) -> Collector {
        let socket = dir.join(format!("{name}.sock"));
        let state = dir.join(format!("{name}-state.json"));
        let config = dir.join(format!("{name}.toml"));
        let log = dir.join(format!("{name}.log"));
        let text = format!(
            r#"node = "{node}"
[sip]
listen = "127.0.0.1:{port}"
transports = {transports}
realm = "msr.local"
min_expires = {min}
max_expires = 3600
[[accounts]]
auth_name = "msr"
password = "msr-secret"
[defaults]
zone = "default"
site = "local"
[subscription]
event = "eltex-call-count"
expires = {sub}
[control]
socket = "{socket}"
[state]
path = "{state}"
{http}
{extra}
"#,
            // SPEC §11 turns HTTP on at 127.0.0.1:8080 by default: parallel
            // test collectors would fight over it, so only the tests that
            // use it set a port of their own.
            http = if extra.contains("[http]") {
                ""
            } else {
                "[http]\nlisten = \"off\""
            },
            node = opts.node,
            transports = match (opts.tcp, opts.tls) {
                (false, false) => r#"["udp"]"#,
                (true, false) => r#"["udp", "tcp"]"#,
                (false, true) => r#"["udp", "tls"]"#,
                (true, true) => r#"["udp", "tcp", "tls"]"#,
            },
            min = opts.min_expires,
            sub = opts.subscription_expires,
            socket = socket.display(),
            state = state.display(),
        );
        std::fs::write(&config, text).expect("write collector config");
        Collector {
            name: name.to_owned(),
            port,
            http_port: None,
            redirect_port: None,
            tls_port: None,
            socket,
            state,
            config,
            log,
            child: None,
        }
    }

    /// Starts the process (again) with the same config and state; waits
    /// until its control socket answers.
    pub async fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} already running", self.name);
        // A socket file left by a killed collector must not fool the wait.
        let cfg = self.config.display().to_string();
        self.child = Some(spawn_logged(
            "msr-collector",
            &["--config", &cfg],
            &self.log,
        ));
        let socket = self.socket.clone();
        let up = wait_for(Duration::from_secs(10), || {
            let socket = socket.clone();
            async move {
                let mut c = AdminClient::connect(&socket).await.ok()?;
                matches!(c.call(&Request::SiteList {}).await, Ok(Response::Ok(_))).then_some(())
            }
        })
        .await;
        assert!(
            up.is_some(),
            "{} control socket did not answer within 10 s\n{}",
            self.name,
            log_tail(&self.log, 40)
        );
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill9();
        }
    }

    /// `kill -HUP`: the collector reads its configuration again (SPEC §13).
    pub fn hup(&self) {
        let pid = self
            .child
            .as_ref()
            .expect("collector running")
            .pid()
            .to_string();
        assert!(
            self.child
                .as_ref()
                .is_some_and(|c| c.signal(crate::Signal::SIGHUP)),
            "kill -HUP {pid}"
        );
    }

    /// SIGTERM; returns the exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .take()
            .and_then(|mut c| c.terminate(Duration::from_secs(8)))
    }

    /// The realm URI agents register to.
    pub fn realm(&self) -> String {
        format!("sip:127.0.0.1:{}", self.port)
    }

    /// The `sips:` realm URI agents register to over TLS.
    pub fn tls_realm(&self) -> String {
        let port = self.tls_port.expect("the collector listens on tls");
        format!("sips:127.0.0.1:{port}")
    }

    /// One control request on a fresh connection.
    pub async fn call(&self, request: &Request) -> anyhow::Result<Response> {
        let mut c = AdminClient::connect(&self.socket).await?;
        c.call(request).await
    }

    /// One control request that must succeed.
    pub async fn ok(&self, request: &Request) -> ResponseData {
        match self.call(request).await {
            Ok(Response::Ok(data)) => data,
            other => panic!("{}: {request:?} → {other:?}", self.name),
        }
    }

    /// The live load table, or `None` if the collector does not answer.
    pub async fn rows(&self) -> Option<Vec<ResourceInfo>> {
        match self
            .call(&Request::ResourceList { active_only: false })
            .await
        {
            Ok(Response::Ok(ResponseData::Resources { rows })) => Some(rows),
            _ => None,
        }
    }

    /// The subscription list, or `None` if the collector does not answer.
    pub async fn subscriptions(&self) -> Option<Vec<SubscriptionInfo>> {
        match self.call(&Request::SubscriptionList {}).await {
            Ok(Response::Ok(ResponseData::Subscriptions { rows })) => Some(rows),
            _ => None,
        }
    }

    /// Polls the load table every 20 ms until `check` accepts it, at most
    /// `limit`.
    pub async fn wait_rows<T>(
        &self,
        limit: Duration,
        check: impl Fn(&[ResourceInfo]) -> Option<T>,
    ) -> Option<T> {
        let check = &check;
        wait_for(limit, || async move {
            self.rows().await.and_then(|r| check(&r))
        })
        .await
    }

    /// Polls the subscription list every 20 ms until `check` accepts it.
    pub async fn wait_subs<T>(
        &self,
        limit: Duration,
        check: impl Fn(&[SubscriptionInfo]) -> Option<T>,
    ) -> Option<T> {
        let check = &check;
        wait_for(limit, || async move {
            self.subscriptions().await.and_then(|r| check(&r))
        })
        .await
    }

    /// Runs `msrctl --socket … ARGS`; returns (success, stdout, stderr).
    pub fn msrctl(&self, args: &[&str]) -> (bool, String, String) {
        msrctl(&self.socket, args)
    }

    /// Runs `msrctl --socket … --json ARGS`, which must succeed, and parses
    /// its output.
    pub fn msrctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let (ok, out, err) = self.msrctl(&full);
        assert!(ok, "msrctl {full:?} failed: {err}");
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("msrctl {full:?}: not json ({e}): {out}"))
    }

    /// The log so far, without colours.
    pub fn log_text(&self) -> String {
        read_log(&self.log)
    }

    /// Runs `msr-loadgen notify --check` against this collector's SIP
    /// port `port` with `args`, 200 MSRs sending `rate` NOTIFYs a second
    /// for 3 s, which must pass: every MSR
    /// registered and subscribed, every NOTIFY answered 200, every row
    /// showing its last load. Its output.
    pub async fn loadgen_notify(&self, port: u16, rate: u32, args: &[&str]) -> String {
        let out = tokio::process::Command::new(bin_path("msr-loadgen"))
            .arg("notify")
            .args(["--msrs", "200", "--duration", "3", "--rate"])
            .arg(rate.to_string())
            .args(args)
            .arg("--collector")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--socket")
            .arg(&self.socket)
            .args(["--setup-timeout", "30", "--verify-wait", "10", "--check"])
            .output()
            .await
            .expect("run msr-loadgen");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "msr-loadgen notify {args:?} failed:\n{stdout}{}\n--- collector\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        stdout
    }

    /// Waits until more than `before` log lines contain every one of
    /// `needles`, at most `limit`.
    pub async fn wait_log(&self, before: usize, needles: &[&str], limit: Duration) -> bool {
        wait_log_lines(&self.log, before, needles, limit).await
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- {} log (tail) -----\n{}",
                self.name,
                log_tail(&self.log, 60)
            );
        }
    }
}

/// Runs `msrctl --socket SOCKET ARGS`; returns (success, stdout, stderr).
pub fn msrctl(socket: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin_path("msrctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run msrctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One `<dynamic>` account of a test agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountSpec {
    /// `msr_name`.
    pub msr: String,
    /// `realm`, e.g. `sip:127.0.0.1:5060`.
    pub realm: String,
}

impl AccountSpec {
    /// An account `msr` registering to `collector`.
    pub fn new(msr: &str, collector: &Collector) -> Self {
        Self {
            msr: msr.to_owned(),
            realm: collector.realm(),
        }
    }
}

/// The knobs of a test agent's XML config.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// `<dynamic>` accounts, in order.
    pub accounts: Vec<AccountSpec>,
    /// `general load-delta`.
    pub load_delta: u8,
    /// `general max-calls`.
    pub max_calls: u32,
    /// `agent register-expires`.
    pub register_expires: u32,
    /// `agent max-subscription-expires`.
    pub max_subscription_expires: u32,
    /// `agent sample-interval-ms`.
    pub sample_interval_ms: u64,
    /// `agent notify-min-interval-ms`.
    pub notify_min_interval_ms: u64,
    /// `transport port`: the media engine's SIP port (its media-control
    /// port is the next one); nothing listens there.
    pub engine_port: u16,
    /// `agent sip-port`: 0 (the default) for an ephemeral port, which the
    /// registered contact carries; a fixed one for a test that talks to
    /// the agent before it registers.
    pub sip_port: u16,
    /// `agent notify-high-water`.
    pub notify_high_water: u8,
    /// Every account's `auth_password` (the test collectors know
    /// `msr-secret`).
    pub auth_password: String,
    /// More attributes of `<agent>`, e.g. `tls-ca="…"`. Without an
    /// `engine-probe` among them the probe is off: nothing listens at the
    /// engine's port here (SPEC §14).
    pub agent_attributes: String,
    /// The `<codec …/>` attributes (SPEC §2, §15), e.g. `pcma="1" h264="1"`;
    /// `None` (the default) writes no `<codec>`, so the agent reports no
    /// codecs and its MSR takes any offer, as before §15.
    pub codecs: Option<String>,
}

impl Default for AgentSpec {
    fn default() -> Self {
        Self {
            accounts: Vec::new(),
            load_delta: 5,
            max_calls: 100,
            register_expires: 6,
            max_subscription_expires: 3600,
            sample_interval_ms: 200,
            notify_min_interval_ms: 1000,
            engine_port: 5090,
            sip_port: 0,
            notify_high_water: msr_agent::notifier::DEFAULT_HIGH_WATER,
            auth_password: "msr-secret".into(),
            agent_attributes: String::new(),
            codecs: None,
        }
    }
}

/// The MSR config for `spec`, with `calls-source="file:{calls}"`, a media
/// engine on `127.0.0.1:{engine_port}` (nothing listens there, so the
/// engine probe is off unless `spec.agent_attributes` sets one) with its
/// media-control port above it, and the agent's SIP port `spec.sip_port`
/// (`sip-port="0"` by default: the contact carries the bound port).
pub fn agent_xml(spec: &AgentSpec, calls: &Path) -> String {
    let accounts: String = spec
        .accounts
        .iter()
        .map(|a| {
            format!(
                "        <dynamic msr_name=\"{}\" realm=\"{}\" auth_name=\"msr\" auth_password=\"{}\" dtmf_mode=\"rfc\"/>\n",
                a.msr, a.realm, spec.auth_password
            )
        })
        .collect();
    format!(
        r#"<?xml version="1.0" encoding="utf-8"?>
<config date="00:00:00 01.01.2025">
    <general log-level="3" log-rotate="no" max-calls="{max_calls}" load-sensor="calls" load-delta="{delta}"/>
    <transport bind-addr="127.0.0.1" port="{engine}" transport="udp"/>
    <media port-start="20000" port-range="1000"/>
{codec}    <accounts>
{accounts}    </accounts>
    <pbyte>
        <mcc bind-addr="127.0.0.1" port="{mcc}"/>
    </pbyte>
    <agent sip-port="{sip_port}" register-expires="{reg}" max-subscription-expires="{maxsub}" calls-source="file:{calls}" notify-high-water="{hw}" notify-min-interval-ms="{nmi}" sample-interval-ms="{sample}" {more}/>
</config>
"#,
        engine = spec.engine_port,
        sip_port = spec.sip_port,
        mcc = spec.engine_port + 1,
        max_calls = spec.max_calls,
        delta = spec.load_delta,
        reg = spec.register_expires,
        maxsub = spec.max_subscription_expires,
        calls = calls.display(),
        nmi = spec.notify_min_interval_ms,
        hw = spec.notify_high_water,
        sample = spec.sample_interval_ms,
        codec = spec
            .codecs
            .as_ref()
            .map_or(String::new(), |attributes| format!(
                "    <codec {attributes}/>\n"
            )),
        more = if spec.agent_attributes.contains("engine-probe") {
            spec.agent_attributes.clone()
        } else {
            format!(r#"engine-probe="off" {}"#, spec.agent_attributes)
        },
    )
}

/// A running `msr-agent` with its own config, calls file and log.
pub struct Agent {
    /// Label used in file names and failure output.
    pub name: String,
    /// The watched XML config.
    pub config: PathBuf,
    /// The `file:` calls source.
    pub calls: PathBuf,
    /// stdout + stderr of every run.
    pub log: PathBuf,
    /// The process, `None` while stopped.
    pub child: Option<ChildGuard>,
}

impl Agent {
    /// Writes the config and a calls file holding `calls`, then starts the
    /// agent.
    pub fn start(dir: &Path, name: &str, spec: &AgentSpec, calls: u32) -> Agent {
        let config = dir.join(format!("{name}.xml"));
        let calls_path = dir.join(format!("{name}.calls"));
        let log = dir.join(format!("{name}.log"));
        write_atomic(&calls_path, &format!("{calls}\n"));
        std::fs::write(&config, agent_xml(spec, &calls_path)).expect("write agent config");
        let mut a = Agent {
            name: name.to_owned(),
            config,
            calls: calls_path,
            log,
            child: None,
        };
        a.spawn();
        a
    }

    /// Writes `xml` as the config and starts the agent (for a calls source
    /// other than [`agent_xml`]'s `file:`, e.g. `rtpengine`).
    pub fn start_xml(dir: &Path, name: &str, xml: &str) -> Agent {
        let config = dir.join(format!("{name}.xml"));
        std::fs::write(&config, xml).expect("write agent config");
        let mut a = Agent {
            name: name.to_owned(),
            config,
            calls: dir.join(format!("{name}.calls")),
            log: dir.join(format!("{name}.log")),
            child: None,
        };
        a.spawn();
        a
    }

    /// Starts the process (again) with its current config.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} already running", self.name);
        let cfg = self.config.display().to_string();
        let control = self.control_socket().display().to_string();
        self.child = Some(spawn_logged(
            "msr-agent",
            &[
                "--config",
                &cfg,
                "--log-stderr",
                "--control-socket",
                &control,
            ],
            &self.log,
        ));
    }

    /// The agent's control socket (`msr-agent drain`), beside its config.
    pub fn control_socket(&self) -> PathBuf {
        self.config.with_extension("sock")
    }

    /// Runs `msr-agent ARGS --control-socket SOCKET` against this agent:
    /// (exit status, stdout, stderr).
    pub fn command(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = Command::new(bin_path("msr-agent"))
            .args(args)
            .arg("--control-socket")
            .arg(self.control_socket())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run msr-agent {args:?}: {e}"));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The media engine reports `n` sessions.
    pub fn set_calls(&self, n: u32) {
        write_atomic(&self.calls, &format!("{n}\n"));
    }

    /// Rewrites the watched config (atomically).
    pub fn rewrite(&self, spec: &AgentSpec) {
        write_atomic(&self.config, &agent_xml(spec, &self.calls));
    }

    /// Writes arbitrary text as the config (for broken files).
    pub fn rewrite_raw(&self, text: &str) {
        write_atomic(&self.config, text);
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.child.try_wait(), Ok(None)))
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill9();
        }
    }

    /// SIGTERM; returns the exit status (None: did not exit within 8 s).
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .take()
            .and_then(|mut c| c.terminate(Duration::from_secs(8)))
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        read_log(&self.log)
    }

    /// How many log lines contain every one of `needles`.
    pub fn log_count(&self, needles: &[&str]) -> usize {
        count_log_lines(&self.log, needles)
    }

    /// Waits until more than `before` log lines contain every one of
    /// `needles`, at most `limit`.
    pub async fn wait_log(&self, before: usize, needles: &[&str], limit: Duration) -> bool {
        wait_log_lines(&self.log, before, needles, limit).await
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- {} log (tail) -----\n{}",
                self.name,
                log_tail(&self.log, 40)
            );
        }
    }
}

/// The row of contact `lo@{msr}` if it is registered, subscribed and
/// reporting `load` (any load when `None`).
pub fn live_row<'a>(
    rows: &'a [ResourceInfo],
    msr: &str,
    load: Option<u8>,
) -> Option<&'a ResourceInfo> {
    rows.iter().find(|r| {
        r.msr == msr
            && r.status == RegistrationStatus::Registered
            && r.subscription == Some(SubscriptionState::Active)
            && r.load.is_some()
            && load.is_none_or(|l| r.load == Some(l))
    })
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// A single-member etcd (Debian's `etcd-server`) on two free loopback
/// ports with a data directory inside the test's directory; stopped when
/// dropped. [`kill9`](Self::kill9) and [`start`](Self::start) again keep the
/// ports and the data.
pub struct Etcd {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<ChildGuard>,
}

impl Etcd {
    /// Starts etcd in `dir` and waits until it answers.
    pub async fn start_in(dir: &Path) -> Etcd {
        let client_port = free_tcp_port();
        let mut peer_port = free_tcp_port();
        while peer_port == client_port {
            peer_port = free_tcp_port();
        }
        let mut etcd = Etcd {
            url: format!("http://127.0.0.1:{client_port}"),
            client_port,
            peer_port,
            data_dir: dir.join("etcd-data"),
            log: dir.join("etcd.log"),
            child: None,
        };
        etcd.start().await;
        etcd
    }

    /// Starts the process (again) on the same ports and data; waits until
    /// `/health` says so.
    pub async fn start(&mut self) {
        assert!(self.child.is_none(), "etcd already running");
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let cluster = format!("test={peer}");
        let data = self.data_dir.display().to_string();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("etcd log");
        let err = file.try_clone().expect("clone log handle");
        let child = Command::new("etcd")
            .args([
                "--name",
                "test",
                "--data-dir",
                &data,
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &cluster,
            ])
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .expect("cannot start etcd (scripts/test.sh installs etcd-server)");
        self.child = Some(ChildGuard { child });
        let port = self.client_port;
        let up = wait_for(Duration::from_secs(20), || async move {
            healthy(port).then_some(())
        })
        .await;
        assert!(
            up.is_some(),
            "etcd did not become healthy within 20 s\n{}",
            log_tail(&self.log, 30)
        );
    }

    /// SIGKILL: etcd goes away at once, as a crashed host would.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill9();
        }
    }

    /// The `[store]` table of a collector on this etcd.
    pub fn store_toml(&self, prefix: &str, lease_ttl_secs: u64) -> String {
        format!(
            "[store]\nbackend = \"etcd\"\nendpoints = [\"{}\"]\nprefix = \"{prefix}\"\n\
             lease_ttl_secs = {lease_ttl_secs}\nrequest_timeout_ms = 1000\n",
            self.url
        )
    }
}

/// Whether etcd on `port` answers `GET /health` with `"health":"true"`.
fn healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text.contains("\"health\":\"true\"")
}
