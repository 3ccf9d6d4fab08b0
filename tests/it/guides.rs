//! Guides that run as written (issue 44): the runnable rtpengine guide
//! `scripts/try-rtpengine.sh` (docs/rtpengine.md, "Try it on one host"),
//! the `rtpengine.conf` block of docs/rtpengine.md started by rtpengine
//! itself, and the TLS recipe of docs/configuration.md run in bash, making
//! the files the TLS examples name, which its "verify" commands accept.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use system_tests::{bin_path, example, free_udp_port, workspace_root, ChildGuard};

/// The text of the first fenced block of language `lang` after `marker`
/// in the doc `doc` (relative to the workspace root), its indentation
/// (a block inside a list item) removed.
fn fenced_after(doc: &str, marker: &str, lang: &str) -> String {
    let path = workspace_root().join(doc);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let from = text
        .find(marker)
        .unwrap_or_else(|| panic!("{doc} no longer says {marker:?}"));
    let mut lines = text[from..].lines();
    let open = format!("```{lang}");
    let indent = lines
        .by_ref()
        .find(|l| l.trim_start() == open)
        .map(|l| l.len() - l.trim_start().len())
        .unwrap_or_else(|| panic!("no ```{lang} block after {marker:?} in {doc}"));
    let mut block = String::new();
    for line in lines {
        if line.trim_start() == "```" {
            return block;
        }
        block.push_str(line.get(indent..).unwrap_or(line.trim_start()));
        block.push('\n');
    }
    panic!("the ```{lang} block after {marker:?} in {doc} is not closed")
}

/// Runs `scripts/try-rtpengine.sh` with `args`, its binaries from this
/// test's target folder (`CARGO_TARGET_DIR`, `--release` for a release
/// build): (exit status, stdout and stderr).
fn try_rtpengine(args: &[&str], limit: Duration) -> (Option<std::process::ExitStatus>, String) {
    let profile_dir = bin_path("msr-collector")
        .parent()
        .map(Path::to_path_buf)
        .expect("the binaries' folder");
    let target_dir = profile_dir
        .parent()
        .map(Path::to_path_buf)
        .expect("the target folder");
    let mut args: Vec<&str> = args.to_vec();
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        args.push("--release");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("try-rtpengine.out");
    let file = std::fs::File::create(&out).expect("output file");
    let mut guard = ChildGuard {
        child: Command::new("bash")
            .arg(workspace_root().join("scripts/try-rtpengine.sh"))
            .args(&args)
            .env("CARGO_TARGET_DIR", &target_dir)
            // Its run folder under this test's own.
            .env("XDG_RUNTIME_DIR", dir.path())
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone"))
            .stderr(file)
            .spawn()
            .expect("run scripts/try-rtpengine.sh"),
    };
    let status = guard.wait_exit(limit);
    if status.is_none() {
        // Too slow: SIGTERM, so that its trap stops what it started (the
        // guard's SIGKILL would not); the test fails on the `None`.
        let _ = guard.terminate(Duration::from_secs(20));
    }
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    (status, text)
}

/// The guide runs as written: 30 calls with RTP through Kamailio and three
/// rtpengines, every one successful, each rtpengine relaying exactly the
/// calls the collector placed on it, every one of them used (30 calls
/// drawn over three relays: each is skipped with a chance of 3 × (2/3)^30,
/// about 1 in 66,000), and nothing left behind: its run folder is gone.
#[test]
fn the_try_rtpengine_guide_places_calls_with_rtp_through_each_rtpengine() {
    let (status, text) = try_rtpengine(
        &["--calls", "30", "--rate", "20", "--hold", "3000"],
        Duration::from_secs(150),
    );
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{text}");
    for line in [
        "30 of 30 calls succeeded, 0 failed",
        "each rtpengine relayed exactly the calls the collector placed on it",
        "every rtpengine got calls",
        "try-rtpengine: ok",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    for msr in ["rtpe_1", "rtpe_2", "rtpe_3"] {
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with(msr) && l.contains("relayed"))
            .unwrap_or_else(|| panic!("no share of {msr}:\n{text}"));
        // Its RTP went through it: "…, N RTP packets", N > 0.
        let packets: u64 = row
            .split(", ")
            .nth(1)
            .and_then(|p| p.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no packet count in {row:?}"));
        assert!(packets > 0, "{row}");
    }
    let folder = text
        .lines()
        .find_map(|l| l.strip_prefix("==> run folder "))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_else(|| panic!("no run folder printed:\n{text}"));
    assert!(
        !Path::new(folder).exists(),
        "the run folder stays after a success: {folder}"
    );
}

#[test]
fn the_try_rtpengine_guide_has_help() {
    let (status, text) = try_rtpengine(&["--help"], Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{text}");
    assert!(
        text.starts_with("Usage: scripts/try-rtpengine.sh"),
        "{text}"
    );
    let (status, text) = try_rtpengine(&["--calls", "none"], Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{text}");
    assert!(text.contains("not a positive number: none"), "{text}");
}

/// docs/rtpengine.md's `rtpengine.conf` is a file rtpengine accepts (it
/// refuses a comment after a value): started with it (`--config-file`,
/// `--config-section=rtpengine`), rtpengine reaches `Startup complete`.
/// Only what cannot be on this host changes: the documentation address
/// (192.0.2.31) is 127.0.0.1, and its ng, CLI and HTTP ports are free
/// ones.
#[test]
fn the_rtpengine_conf_of_the_guide_starts_rtpengine() {
    let block = fenced_after("docs/rtpengine.md", "rtpengine.conf`, section", "ini");
    assert!(block.starts_with("[rtpengine]\n"), "{block}");
    let conf = block
        .replace("192.0.2.31", "127.0.0.1")
        .replace(":2223", &format!(":{}", free_udp_port()))
        .replace(":2224", &format!(":{}", free_udp_port()))
        .replace(":2225", &format!(":{}", free_tcp_port()));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rtpengine.conf");
    std::fs::write(&path, &conf).expect("write rtpengine.conf");
    let log = dir.path().join("rtpengine.log");
    let file = std::fs::File::create(&log).expect("log");
    let mut guard = ChildGuard {
        child: Command::new("rtpengine")
            .arg(format!("--config-file={}", path.display()))
            .args(["--config-section=rtpengine", "--foreground", "--log-stderr"])
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone"))
            .stderr(file)
            .spawn()
            .expect("start rtpengine (scripts/deps.sh installs rtpengine-daemon)"),
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let started = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("Startup complete") {
            break true;
        }
        if std::time::Instant::now() >= deadline || matches!(guard.child.try_wait(), Ok(Some(_))) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = guard.terminate(Duration::from_secs(5));
    assert!(
        started,
        "rtpengine refused the guide's file:\n{conf}\n{text}"
    );
}

/// A TCP port free a moment ago (rtpengine's HTTP listener).
fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free tcp port")
}

/// The file names (the last path component) of `attrs`' values in `text`
/// (`cert = "…"` in TOML, `tls-ca="…"` in XML).
fn named_files(text: &str, attrs: &[&str]) -> Vec<String> {
    attrs
        .iter()
        .map(|attr| {
            let at = text
                .find(attr)
                .unwrap_or_else(|| panic!("no {attr} in the example"));
            let value = text[at + attr.len()..]
                .split('"')
                .nth(1)
                .unwrap_or_else(|| panic!("no value of {attr}"));
            PathBuf::from(value)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| panic!("{attr} names no file: {value}"))
        })
        .collect()
}

/// docs/configuration.md's TLS recipe, run in bash as the doc says, makes
/// every file `config-examples/collector-tls.toml` and `msr-tls.xml` name,
/// and its "verify" block says `OK` for both certificates and shows the
/// names the text tells the reader to look for.
#[test]
fn the_tls_recipe_makes_the_files_the_examples_name_and_verifies() {
    let recipe = fenced_after(
        "docs/configuration.md",
        "## Certificates for SIP over TLS",
        "bash",
    );
    let verify = fenced_after("docs/configuration.md", "Verify before installing", "bash");
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |script: &str| {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("bash");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{script}\n{text}");
        text
    };
    run(&recipe);
    let collector = std::fs::read_to_string(example("collector-tls.toml")).expect("example");
    let agent = std::fs::read_to_string(example("msr-tls.xml")).expect("example");
    let mut files = named_files(&collector, &["cert =", "key =", "client_ca ="]);
    files.extend(named_files(&agent, &["tls-ca=", "tls-cert=", "tls-key="]));
    for f in &files {
        assert!(
            dir.path().join(f).exists(),
            "the recipe makes no {f}, which the TLS examples name"
        );
    }
    let seen = run(&verify);
    for want in [
        "collector.pem: OK",
        "msr_1.pem: OK",
        "IP Address:127.0.0.1",
        "DNS:msr_1",
        "TLS Web Server Authentication",
        "TLS Web Client Authentication",
        "notAfter=",
    ] {
        assert!(seen.contains(want), "no {want:?} in:\n{seen}");
    }
}
