//! `msr-agent` command-line smoke tests (only this package sees
//! `CARGO_BIN_EXE_msr-agent`): `--check-config` and the log file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_msr-agent"))
}

/// A valid config whose `<general>` carries `log` (attributes).
fn write_config(dir: &Path, log: &str) -> PathBuf {
    let text = format!(
        r#"<?xml version="1.0" encoding="utf-8"?>
<config>
    <general max-calls="100" load-sensor="calls" load-delta="5" {log}/>
    <transport bind-addr="127.0.0.1" port="0" transport="udp"/>
    <media port-start="20000" port-range="1000"/>
</config>
"#
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
        &format!(r#"log-path="{}" log-name="x.log""#, missing.display()),
    );
    let expected = format!(
        "error: {}: cannot open log file: No such file or directory (os error 2)",
        missing.join("x.log").display()
    );

    let checked = check_config(&config, &[]);
    assert_eq!(checked.status.code(), Some(1), "{checked:?}");
    assert_eq!(text(&checked.stderr).trim_end(), expected);
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
        &format!(r#"log-path="{}" log-name="x.log""#, dir.path().display()),
    );
    let checked = check_config(&config, &[]);
    assert!(checked.status.success(), "{checked:?}");
    let stdout = text(&checked.stdout);
    let log = dir.path().join("x.log");
    assert!(
        stdout.contains(&format!("{}: ok", config.display()))
            && stdout.contains(&format!("log: {}", log.display())),
        "{stdout}"
    );
    assert!(!log.exists(), "--check-config created the log file");
}
