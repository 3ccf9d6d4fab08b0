use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;

use std::path::Path;

use super::*;

fn log_file(dir: &Path, name: &str) -> LogFile {
    LogFile {
        dir: dir.to_path_buf(),
        name: name.to_owned(),
    }
}

#[test]
fn from_config_needs_both_path_and_name() -> Result<(), Box<dyn std::error::Error>> {
    let text = |general: &str| {
        format!(
            r#"<config><general max-calls="10" load-sensor="calls" {general}/><transport bind-addr="127.0.0.1" port="5070"/><media port-start="20000" port-range="100"/></config>"#
        )
    };
    let parse = |general: &str| crate::config::parse(&text(general), Path::new("t.xml"));
    let both = parse(r#"log-path="/var/log/ecss" log-name="msr.log""#)?;
    let file = LogFile::from_config(&both.general).ok_or("a log file")?;
    assert_eq!(file.path(), PathBuf::from("/var/log/ecss/msr.log"));
    assert_eq!(
        LogFile::from_config(&parse(r#"log-path="/var/log/ecss""#)?.general),
        None
    );
    assert_eq!(
        LogFile::from_config(&parse(r#"log-name="msr.log""#)?.general),
        None
    );
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
    assert_eq!(checked.path, file.path());
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
