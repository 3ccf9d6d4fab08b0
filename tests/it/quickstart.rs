//! The quickstart (`scripts/quickstart.sh` runs `msr-quickstart`) as two
//! users on one machine would run it: two runs at once each get their own
//! private run folder (printed, mode 0700) and their own free ports, and
//! both report their shares and stop cleanly.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use system_tests::{bin_path, ChildGuard};

/// Waits for `guard` to exit within `limit`.
fn finish(mut guard: ChildGuard, limit: Duration) -> Option<std::process::ExitStatus> {
    guard.wait_exit(limit)
}

#[test]
fn two_quickstarts_at_once_each_run_in_a_private_folder_on_free_ports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runs: Vec<(ChildGuard, std::path::PathBuf)> = (0..2)
        .map(|i| {
            let out = dir.path().join(format!("quickstart-{i}.out"));
            let file = std::fs::File::create(&out).expect("output file");
            let guard = ChildGuard {
                child: Command::new(bin_path("msr-quickstart"))
                    .args(["--once", "--selections", "2000"])
                    // Both under this test's folder, as under one user's.
                    .env("XDG_RUNTIME_DIR", dir.path())
                    .stdin(Stdio::null())
                    .stdout(file.try_clone().expect("clone"))
                    .stderr(file)
                    .spawn()
                    .expect("run msr-quickstart (cargo build --workspace --bins first)"),
            };
            (guard, out)
        })
        .collect();
    let mut folders = Vec::new();
    for (guard, out) in runs {
        let status = finish(guard, Duration::from_secs(120));
        let text = std::fs::read_to_string(&out).expect("output");
        assert!(status.is_some_and(|s| s.success()), "{status:?}\n{text}");
        let folder = text
            .lines()
            .find_map(|l| l.strip_prefix("==> run folder "))
            .and_then(|l| l.split(" (").next())
            .unwrap_or_else(|| panic!("no run folder printed:\n{text}"))
            .to_owned();
        assert!(text.contains("observed"), "no share report:\n{text}");
        assert!(text.contains("msr-collector exited cleanly"), "{text}");
        let mode = std::fs::metadata(&folder)
            .expect("run folder")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{folder}");
        assert!(
            std::path::Path::new(&folder).join("collector.log").exists(),
            "{folder}"
        );
        folders.push(folder);
    }
    assert_ne!(folders[0], folders[1], "two runs shared a folder");
}
