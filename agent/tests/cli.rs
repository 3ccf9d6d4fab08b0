//! `msr-agent` command-line smoke tests (only this package sees
//! `CARGO_BIN_EXE_msr-agent`): `--check-config`, the log file, and the
//! agent's own port beside the media engine's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_msr-agent"))
}

/// A valid config whose `<agent>` carries `agent` (attributes).
fn write_config(dir: &Path, agent: &str) -> PathBuf {
    write_config_on(dir, 0, agent)
}

/// A valid config for an engine on `127.0.0.1:engine_port`, whose
/// `<general>` names the engine's own log file in `dir/engine-logs`.
fn write_config_on(dir: &Path, engine_port: u16, agent: &str) -> PathBuf {
    let engine_logs = dir.join("engine-logs");
    let text = format!(
        r#"<?xml version="1.0" encoding="utf-8"?>
<config>
    <general max-calls="100" load-sensor="calls" load-delta="5" log-path="{}" log-name="msr.log" log-rotate="yes"/>
    <transport bind-addr="127.0.0.1" port="{engine_port}" transport="udp"/>
    <media port-start="20000" port-range="1000"/>
    <accounts>
        <dynamic msr_name="msr_1" realm="sip:127.0.0.1:5060" auth_name="msr" auth_password="msr-secret"/>
    </accounts>
    <agent {agent}/>
</config>
"#,
        engine_logs.display()
    );
    let path = dir.join("config.xml");
    std::fs::write(&path, text).expect("write config");
    path
}

fn check_config(config: &Path, extra: &[&str]) -> Output {
    agent()
        .arg("--config")
        .arg(config)
        .arg("--check-config")
        .args(extra)
        .output()
        .expect("run msr-agent --check-config")
}

/// Runs the daemon, which must exit on its own within 10 s.
fn run_daemon(config: &Path) -> Output {
    let mut child = agent()
        .arg("--config")
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn msr-agent");
    let end = Instant::now() + Duration::from_secs(10);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            panic!("msr-agent did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A log directory that does not exist: `--check-config` fails with the
/// error the daemon stops with, naming the log file.
#[test]
fn check_config_reports_a_log_file_the_daemon_cannot_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nonexistent").join("dir");
    let config = write_config(
        dir.path(),
        &format!(r#"log-file="{}""#, missing.join("x.log").display()),
    );
    let expected = format!(
        "error: {}: cannot open log file: No such file or directory (os error 2)",
        missing.join("x.log").display()
    );

    let checked = check_config(&config, &[]);
    assert_eq!(checked.status.code(), Some(1), "{checked:?}");
    assert_eq!(
        text(&checked.stderr),
        format!(
            "{}: msr-agent would not start on this host (1 reason):\n  {expected}\nwarnings: none\n",
            config.display()
        )
    );
    assert!(!text(&checked.stdout).contains(": ok"), "{checked:?}");

    let daemon = run_daemon(&config);
    assert_eq!(daemon.status.code(), Some(1), "{daemon:?}");
    assert_eq!(text(&daemon.stderr).trim_end(), expected);

    // With --log-stderr the file is not used, so it is not checked either.
    let stderr_only = check_config(&config, &["--log-stderr"]);
    assert!(stderr_only.status.success(), "{stderr_only:?}");
    assert!(
        text(&stderr_only.stdout).contains("log: stderr"),
        "{stderr_only:?}"
    );
}

/// A writable log directory: ok, the summary names the file, and the check
/// does not create it.
#[test]
fn check_config_accepts_a_writable_log_directory_without_creating_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(r#"log-file="{}""#, dir.path().join("x.log").display()),
    );
    let checked = check_config(&config, &[]);
    assert!(checked.status.success(), "{checked:?}");
    let stdout = text(&checked.stdout);
    let log = dir.path().join("x.log");
    assert!(
        stdout.contains(&format!(
            "{}: ok, msr-agent would start on this host",
            config.display()
        )) && stdout.contains(&format!("log: {}", log.display())),
        "{stdout}"
    );
    assert!(!log.exists(), "--check-config created the log file");
}

/// The engine's `<general log-path log-name>` is the engine's: by default
/// the agent logs to stderr, and `--log-file` names its own file.
#[test]
fn the_engines_log_file_is_never_the_agents() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "");
    let checked = check_config(&config, &[]);
    assert!(checked.status.success(), "{checked:?}");
    assert!(text(&checked.stdout).contains("log: stderr"), "{checked:?}");
    let own = dir.path().join("agent.log");
    let checked = check_config(&config, &["--log-file", &own.display().to_string()]);
    assert!(checked.status.success(), "{checked:?}");
    assert!(
        text(&checked.stdout).contains(&format!("log: {}", own.display())),
        "{checked:?}"
    );
    assert!(!dir.path().join("engine-logs").exists());
}

/// SPEC §1: the agent runs beside the media engine. With the engine's SIP
/// port held by another process, the agent starts on the next port (the
/// default), logs to stderr, writes nothing in the engine's log directory,
/// and stops cleanly on SIGTERM; `--sip-port` with the engine's port is a
/// config error naming both.
#[test]
fn the_agent_starts_beside_an_engine_that_holds_its_port() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let engine_logs = dir.path().join("engine-logs");
    std::fs::create_dir(&engine_logs).expect("mkdir");
    // The "engine": a UDP socket on a port whose next port is free.
    let (engine, agent_port) = (0..50)
        .find_map(|_| {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
            let port = s.local_addr().ok()?.port().checked_add(1)?;
            std::net::UdpSocket::bind(("127.0.0.1", port)).ok()?;
            Some((s, port))
        })
        .expect("a port pair");
    let engine_port = engine.local_addr().expect("addr").port();
    let config = write_config_on(dir.path(), engine_port, "");

    let refused = check_config(&config, &["--sip-port", &engine_port.to_string()]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        text(&refused.stderr).contains(&format!(
            "--sip-port {engine_port}: collides with the media engine's <transport port=\"{engine_port}\">"
        )),
        "{refused:?}"
    );

    let mut child = agent()
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn msr-agent");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let want = format!("listening on udp 127.0.0.1:{agent_port}");
    let end = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains(&want)) {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("no {want:?} in {seen:#?}");
            }
        }
    }
    let pid = i32::try_from(child.id()).expect("pid");
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let end = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("msr-agent did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(0));
    assert_eq!(
        std::fs::read_dir(&engine_logs).expect("read_dir").count(),
        0,
        "the agent wrote into the engine's log directory"
    );
    drop(engine);
}

/// The seed's config names the MSR host's address (192.168.2.21): on any
/// other host the agent cannot bind its SIP port there, so the check says
/// it would not start, and why, with exit code 1 (SPEC §13).
#[test]
fn check_config_refuses_a_bind_addr_that_is_not_this_hosts() {
    let seed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config-examples/msr.xml");
    let checked = check_config(&seed, &["--log-stderr"]);
    assert_eq!(checked.status.code(), Some(1), "{checked:?}");
    let stderr = text(&checked.stderr);
    assert!(
        stderr.contains("msr-agent would not start on this host (1 reason):\n  error: <transport bind-addr=\"192.168.2.21\">: 192.168.2.21 is not an address of this host\n"),
        "{stderr}"
    );
    assert!(stderr.ends_with("warnings: none\n"), "{stderr}");
}

/// `msr-agent drain` with no agent running: exit 1, naming the socket
/// (SPEC §14's MSR-side drain).
#[test]
fn drain_without_a_running_agent_names_the_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("control.sock");
    let out = agent()
        .args(["drain", "--control-socket"])
        .arg(&socket)
        .stdin(Stdio::null())
        .output()
        .expect("run msr-agent drain");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("no msr-agent answers at {}", socket.display())),
        "{stderr}"
    );
    let help = agent()
        .args(["drain", "--help"])
        .output()
        .expect("msr-agent drain --help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--exit-when-empty") && help.contains("systemctl restart rtpengine"));
}
