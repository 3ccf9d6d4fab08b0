use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;

use std::path::Path;

use super::*;

fn log_file(dir: &Path, name: &str) -> LogFile {
    LogFile::new(dir.join(name))
}

/// The engine's `<general log-path log-name>` is the engine's file: only
/// `<agent log-file>` names the agent's own.
#[test]
fn only_agent_log_file_names_the_agents_file() -> Result<(), Box<dyn std::error::Error>> {
    let text = |general: &str, agent: &str| {
        format!(
            r#"<config><general max-calls="10" load-sensor="calls" {general}/><transport bind-addr="127.0.0.1" port="5070"/><media port-start="20000" port-range="100"/>{agent}</config>"#
        )
    };
    let parse = |general: &str, agent: &str| {
        crate::config::parse(&text(general, agent), Path::new("t.xml"))
    };
    let engine_only = parse(r#"log-path="/var/log/ecss" log-name="msr.log""#, "")?;
    assert_eq!(LogFile::from_config(&engine_only.agent), None);
    let own = parse(
        r#"log-path="/var/log/ecss" log-name="msr.log""#,
        r#"<agent log-file="/var/log/msr-agent/agent.log"/>"#,
    )?;
    let file = LogFile::from_config(&own.agent).ok_or("a log file")?;
    assert_eq!(file.path(), Path::new("/var/log/msr-agent/agent.log"));
    Ok(())
}

/// logrotate moves the file away and the daemon gets SIGHUP: the next lines
/// go to a new file at the path, and nothing written before is lost.
#[test]
fn reopen_writes_to_a_new_file_at_the_same_path() -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write;
    let dir = tempfile::tempdir()?;
    let file = log_file(dir.path(), "agent.log");
    let mut writer = file.open_reopening()?;
    writer.write_all(b"before\n")?;
    let rotated = dir.path().join("agent.log.1");
    std::fs::rename(file.path(), &rotated)?;
    writer.write_all(b"still old\n")?;
    writer.reopen()?;
    writer.write_all(b"after\n")?;
    writer.flush()?;
    assert_eq!(std::fs::read_to_string(&rotated)?, "before\nstill old\n");
    assert_eq!(std::fs::read_to_string(file.path())?, "after\n");
    Ok(())
}

#[test]
fn check_never_creates_the_file_and_open_does() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let file = log_file(dir.path(), "agent.log");
    file.check()?;
    assert!(!file.path().exists(), "check created the file");
    file.open()?;
    assert!(file.path().exists());
    // An existing, writable file: ok, and left as it is.
    std::fs::write(file.path(), "kept\n")?;
    file.check()?;
    assert_eq!(std::fs::read_to_string(file.path())?, "kept\n");
    Ok(())
}

#[test]
fn a_missing_directory_gives_the_daemons_error() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let file = log_file(&dir.path().join("nonexistent").join("dir"), "x.log");
    let checked = file.check().err().ok_or("check must fail")?;
    assert!(!file.path().exists());
    let opened = file.open().err().ok_or("open must fail")?;
    assert_eq!(checked.to_string(), opened.to_string());
    assert_eq!(
        checked.to_string(),
        format!(
            "{}: cannot open log file: No such file or directory (os error 2)",
            file.path().display()
        )
    );
    assert_eq!(checked.path.as_path(), file.path());
    Ok(())
}

#[test]
fn a_file_where_the_directory_should_be_is_reported() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let not_dir = dir.path().join("plain");
    std::fs::write(&not_dir, "")?;
    let file = log_file(&not_dir, "x.log");
    let checked = file.check().err().ok_or("check must fail")?;
    let opened = file.open().err().ok_or("open must fail")?;
    assert_eq!(checked.to_string(), opened.to_string());
    assert_eq!(
        checked.to_string(),
        format!(
            "{}: cannot open log file: Not a directory (os error 20)",
            file.path().display()
        )
    );
    Ok(())
}

/// Whatever the user the tests run as (root may write anywhere), check's
/// verdict is what open then does.
#[test]
fn check_agrees_with_open_on_read_only_directories_and_files(
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked)?;
    std::fs::set_permissions(&locked, Permissions::from_mode(0o555))?;
    let in_locked = log_file(&locked, "x.log");
    let checked = in_locked.check();
    assert!(!in_locked.path().exists());
    let opened = in_locked.open();
    assert_eq!(checked.is_ok(), opened.is_ok(), "{checked:?} vs {opened:?}");
    if let Err(e) = checked {
        assert!(e.to_string().contains("Permission denied"), "{e}");
    }
    std::fs::set_permissions(&locked, Permissions::from_mode(0o755))?;

    let read_only = log_file(dir.path(), "ro.log");
    std::fs::write(read_only.path(), "")?;
    std::fs::set_permissions(read_only.path(), Permissions::from_mode(0o444))?;
    let checked = read_only.check();
    let opened = read_only.open();
    assert_eq!(checked.is_ok(), opened.is_ok(), "{checked:?} vs {opened:?}");
    Ok(())
}
