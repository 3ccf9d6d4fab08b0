//! The control socket's bound per client (docs/interfaces.md, "Control protocol"): one
//! user id holds at most 64 connections; past that it gets a one-line
//! refusal, and msrctl run by another user is still served.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use msr_collector::api::control::MAX_CONNECTIONS_PER_CLIENT;
use msr_shared::admin::{Request, Response};
use system_tests::system::{Collector, CollectorOpts};
use system_tests::{bin_path, AdminClient};
use tokio::io::{AsyncBufReadExt, BufReader};

/// `nobody` on Debian: a user that is neither root nor the collector's.
const OTHER_UID: u32 = 65534;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_holding_its_share_does_not_lock_out_another() {
    let dir = tempfile::tempdir().expect("tempdir");
    let collector = Collector::start(dir.path(), "c", &CollectorOpts::default()).await;
    // This test's user holds its whole share, each connection served.
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS_PER_CLIENT {
        let mut client = AdminClient::connect(&collector.socket)
            .await
            .expect("connect");
        let answer = client.call(&Request::SiteList {}).await.expect("answer");
        assert!(matches!(answer, Response::Ok(_)), "{answer:?}");
        held.push(client);
    }
    // The next gets one error line, then the end of the stream.
    let stream = tokio::net::UnixStream::connect(&collector.socket)
        .await
        .expect("connect");
    let mut lines = BufReader::new(stream).lines();
    let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
        .await
        .expect("a line within 5 s")
        .expect("read")
        .unwrap_or_default();
    let uid = std::fs::metadata(&collector.socket).expect("socket").uid();
    assert!(
        line.contains(&format!(
            "too many control connections from uid {uid} (at most {MAX_CONNECTIONS_PER_CLIENT} per user)"
        )),
        "{line}"
    );
    assert_eq!(lines.next_line().await.expect("read"), None);
    assert!(
        collector.log_text().contains("control connection refused"),
        "{}",
        collector.log_text()
    );
    if uid == 0 {
        // Another user's msrctl is served meanwhile (the test's directory
        // and the socket opened to it for this).
        for path in [dir.path(), collector.socket.as_path()] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        }
        let out = Command::new(bin_path("msrctl"))
            .arg("--socket")
            .arg(&collector.socket)
            .args(["site", "list"])
            .uid(OTHER_UID)
            .gid(OTHER_UID)
            .stdin(Stdio::null())
            .output()
            .expect("run msrctl as another user");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("local"));
    }
    // A place given back is served again, once the server has seen that
    // connection close (its task ends on the EOF).
    held.pop();
    let served = system_tests::wait_for(Duration::from_secs(5), || async {
        let (ok, out, _) = collector.msrctl(&["site", "list"]);
        (ok && out.contains("local")).then_some(())
    })
    .await;
    assert!(served.is_some(), "a place given back is served again");
}
