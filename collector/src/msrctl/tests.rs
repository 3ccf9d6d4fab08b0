use msr_shared::admin::{ContactProperty, Distance, Request, SelectQuery};

use super::*;

fn parse(line: &str) -> Result<Cli, clap::Error> {
    let args: Vec<OsString> = std::iter::once("msrctl")
        .chain(line.split_whitespace())
        .map(Into::into)
        .collect();
    Cli::try_parse_from(rewrite_aliases(args))
}

fn request(line: &str) -> Request {
    parse(line)
        .map(|cli| cli.command.to_request())
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}

#[test]
fn leg_list_maps_to_its_request_with_a_bounded_limit() {
    assert_eq!(
        request("leg list --msr msr_1 --older-than 60"),
        Request::LegList {
            msr: Some("msr_1".into()),
            older_than_secs: Some(60),
            limit: Some(1_000),
        }
    );
    assert_eq!(
        request("leg list --limit 5"),
        Request::LegList {
            msr: None,
            older_than_secs: None,
            limit: Some(5),
        }
    );
    for bad in [
        "leg list --limit 0",
        "leg list --limit 10001",
        "leg list --older-than -1",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn commands_map_to_requests() {
    assert_eq!(
        request("resource unset lo@msr_1 site"),
        Request::ResourceUnset {
            contact: "lo@msr_1".into(),
            property: ContactProperty::Site
        }
    );
    assert!(parse("resource unset lo@msr_1 coefficient").is_err());
    assert_eq!(
        request("site declare local"),
        Request::SiteDeclare {
            name: "local".into()
        }
    );
    assert_eq!(
        request("site distance a b infinity"),
        Request::SiteDistance {
            a: "a".into(),
            b: "b".into(),
            distance: Distance::Infinity
        }
    );
    assert_eq!(
        request("site matrix local remote"),
        Request::SiteMatrix {
            names: vec!["local".into(), "remote".into()]
        }
    );
    assert_eq!(
        request("msr set msr_1 performance_coefficient 2"),
        Request::MsrSetPerformanceCoefficient {
            msr: "msr_1".into(),
            value: 2.0
        }
    );
    assert_eq!(
        request("msr set msr_1 active false"),
        Request::MsrSetActive {
            msr: "msr_1".into(),
            active: false
        }
    );
    assert_eq!(
        request("resource list active"),
        Request::ResourceList { active_only: true }
    );
    assert_eq!(
        request("resource list"),
        Request::ResourceList { active_only: false }
    );
    assert_eq!(
        request("resource set lo@msr_1 site remote"),
        Request::ResourceSetSite {
            contact: "lo@msr_1".into(),
            site: "remote".into()
        }
    );
    assert_eq!(
        request("subscription set msr_1 eltex-call-count expires 30"),
        Request::SubscriptionSetExpires {
            msr: "msr_1".into(),
            event: "eltex-call-count".into(),
            expires_secs: 30
        }
    );
    assert_eq!(
        request("--json select --zone z --site s --msr msr_1 --random 58 --explain"),
        Request::Select(SelectQuery {
            msr: Some("msr_1".into()),
            random: Some(58.0),
            explain: true,
            ..SelectQuery::new("z", "s")
        })
    );
}

#[test]
fn seed_slash_paths_are_aliases() {
    assert_eq!(
        request("system/media/site/declare remote_side"),
        Request::SiteDeclare {
            name: "remote_side".into()
        }
    );
    assert_eq!(request("/system/media/site/list"), Request::SiteList {});
    assert_eq!(request("zone list"), Request::ZoneList {});
    assert_eq!(request("system/media/zone/list"), Request::ZoneList {});
    assert_eq!(
        request("--socket /tmp/x.sock system/media/site/distance remote_1 local 64"),
        Request::SiteDistance {
            a: "remote_1".into(),
            b: "local".into(),
            distance: Distance::Finite(64.0)
        }
    );
    assert_eq!(
        request("system/media/msr/subscription/set msr_1 eltex-call-count expires 30"),
        Request::SubscriptionSetExpires {
            msr: "msr_1".into(),
            event: "eltex-call-count".into(),
            expires_secs: 30
        }
    );
    assert_eq!(
        request("system/media/msr/subscription/list"),
        Request::SubscriptionList {}
    );
    assert_eq!(
        request("system/media/resource/list active"),
        Request::ResourceList { active_only: true }
    );
    // Only the command word is rewritten; a later argument keeps its slash.
    assert_eq!(
        request("resource set eth0/1@msr_1 zone rtk"),
        Request::ResourceSetZone {
            contact: "eth0/1@msr_1".into(),
            zone: "rtk".into()
        }
    );
}

#[test]
fn usage_errors() {
    for bad in [
        "site distance a b -1",
        "site distance a b far",
        "msr set msr_1 active maybe",
        "msr set msr_1 performance_coefficient x",
        "msr set msr_1 performance_coefficient nan",
        "msr set msr_1 performance_coefficient inf",
        "select --zone z --site s --random nan",
        "select --zone z --site s --random 1e400",
        "subscription set m eltex-call-count expires 0",
        "resource list passive",
        "frobnicate",
    ] {
        let error = parse(bad).expect_err(bad);
        assert!(error.use_stderr(), "{bad}");
    }
}

#[test]
fn socket_default_and_flag() {
    let cli = parse("--socket /tmp/c.sock site list").expect("parse");
    assert_eq!(cli.socket, Some(PathBuf::from("/tmp/c.sock")));
    let flag = Path::new("/tmp/c.sock");
    assert_eq!(
        resolve_socket(Some(flag), Some("/tmp/env.sock".into())),
        flag
    );
    assert_eq!(
        resolve_socket(None, Some("/tmp/env.sock".into())),
        PathBuf::from("/tmp/env.sock")
    );
    assert_eq!(resolve_socket(None, None), PathBuf::from(DEFAULT_SOCKET));
}

#[test]
fn empty_socket_variable_means_the_default() {
    // clap's `env` took an empty MSRCTL_SOCKET for a missing --socket
    // value: "a value is required for '--socket <SOCKET>'".
    let cli = parse("site list").expect("parse");
    assert_eq!(cli.socket, None);
    assert_eq!(
        resolve_socket(None, Some(OsString::new())),
        PathBuf::from(DEFAULT_SOCKET)
    );
}

#[test]
fn negative_zero_is_read_as_zero() {
    let Request::SiteDistance {
        distance: Distance::Finite(distance),
        ..
    } = request("site distance a b -0")
    else {
        panic!("distance")
    };
    assert!(distance == 0.0 && distance.is_sign_positive());
    let Request::Select(SelectQuery {
        random: Some(draw), ..
    }) = request("select --zone z --site s --random -0")
    else {
        panic!("select")
    };
    assert!(draw == 0.0 && draw.is_sign_positive());
    let Request::MsrSetPerformanceCoefficient { value, .. } =
        request("msr set m performance_coefficient -0.0")
    else {
        panic!("coefficient")
    };
    assert!(value == 0.0 && value.is_sign_positive());
    // The JSON a script sees says 0 too.
    let line = serde_json::to_string(&request("site distance a b -0")).expect("serialize");
    assert!(line.ends_with(r#""distance":0.0}"#), "{line}");
}

#[test]
fn unavailable_exits_3() {
    let command = Command::Site(SiteCommand::List);
    let busy = Response::error(
        msr_shared::admin::ErrorCode::Unavailable,
        "too many control connections (at most 256)",
    );
    for json in [false, true] {
        let out = output(&command, json, &busy);
        assert_eq!(out.code, EXIT_UNREACHABLE, "json {json}");
        assert!(out.stderr.contains("too many control connections"));
    }
}

#[test]
fn a_path_that_is_not_a_socket_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("control.sock");
    std::fs::write(&file, "x").expect("write");
    for (path, what) in [
        (dir.path().to_owned(), "a directory"),
        (file, "a regular file"),
    ] {
        let error = call(&path, &Request::SiteList {}).expect_err("not a socket");
        let text = error.to_string();
        assert!(
            matches!(error, TransportError::NotASocket { .. })
                && text.contains(&format!("is {what}, not a socket")),
            "{text}"
        );
    }
    let missing = dir.path().join("none.sock");
    let error = call(&missing, &Request::SiteList {}).expect_err("missing");
    assert!(matches!(error, TransportError::Connect { .. }), "{error}");
}

/// A stand-in collector on a fresh socket: reads one request line, then
/// runs `answer` on the connection.
fn fake_collector(
    answer: impl FnOnce(&mut std::os::unix::net::UnixStream) + Send + 'static,
) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<()>) {
    use std::io::BufRead;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("control.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let server = std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let mut line = String::new();
        if let Ok(reader) = stream.try_clone() {
            let _ = std::io::BufReader::new(reader).read_line(&mut line);
        }
        answer(&mut stream);
    });
    (dir, path, server)
}

#[test]
fn the_reply_deadline_covers_the_whole_answer() {
    use std::io::Write;
    // A valid answer, one byte every 20 ms: about 1.1 s in all. Each read
    // gets a byte long before any per-read timeout.
    let line = "{\"ok\":true,\"data\":{\"kind\":\"sites\",\"sites\":[\"local\"]}}\n";
    let (_dir, path, server) = fake_collector(move |stream| {
        for byte in line.as_bytes() {
            if stream.write_all(&[*byte]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let started = std::time::Instant::now();
    let error = call_within(&path, &Request::SiteList {}, Duration::from_millis(300))
        .expect_err("too slow");
    let elapsed = started.elapsed();
    assert!(matches!(error, TransportError::NoAnswer { .. }), "{error}");
    assert!(
        error.to_string().starts_with(&format!(
            "no answer from the collector at {}",
            path.display()
        )),
        "{error}"
    );
    assert!(error.to_string().ends_with("within 300 ms"), "{error}");
    assert!(elapsed < Duration::from_millis(900), "{elapsed:?}");
    server.join().expect("server");
    assert_eq!(
        crate::api::control::describe_duration(REPLY_TIMEOUT),
        "10 s",
        "msrctl says `within 10 s`"
    );
    // The same answer at full speed is read.
    let (_dir, path, server) = fake_collector(move |stream| {
        let _ = stream.write_all(line.as_bytes());
    });
    let response = call(&path, &Request::SiteList {}).expect("answer");
    assert_eq!(
        response,
        Response::Ok(msr_shared::admin::ResponseData::Sites {
            sites: vec!["local".into()]
        })
    );
    server.join().expect("server");
}

#[test]
fn a_refusal_sent_before_the_request_is_read() {
    use std::io::Write;
    // A full collector answers `unavailable` and closes without reading
    // the request: msrctl's send may fail, the answer is still read.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("control.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let server = std::thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            let _ = stream.write_all(
                b"{\"ok\":false,\"error\":{\"code\":\"unavailable\",\
                  \"message\":\"too many control connections (at most 256)\"}}\n",
            );
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    let response = call(&path, &Request::SiteList {}).expect("the refusal is an answer");
    let out = output(&Command::Site(SiteCommand::List), false, &response);
    assert_eq!(out.code, EXIT_UNREACHABLE);
    assert_eq!(
        out.stderr,
        "error: unavailable: too many control connections (at most 256)\n"
    );
    server.join().expect("server");
}

#[test]
fn the_answer_size_is_bounded() {
    use std::io::Write;
    let (_dir, path, server) = fake_collector(|stream| {
        let chunk = vec![b'x'; 1024 * 1024];
        for _ in 0..=MAX_REPLY_BYTES / chunk.len() {
            if stream.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let error = call(&path, &Request::SiteList {}).expect_err("too long");
    assert!(matches!(error, TransportError::TooLong { .. }), "{error}");
    assert!(
        error.to_string().contains("longer than 67108864 bytes"),
        "{error}"
    );
    server.join().expect("server");
}

#[test]
fn output_codes() {
    let command = Command::Site(SiteCommand::List);
    let ok = Response::Ok(msr_shared::admin::ResponseData::Sites {
        sites: vec!["local".into()],
    });
    let out = output(&command, false, &ok);
    assert_eq!(
        (out.stdout.as_str(), out.code),
        ("List of all sites:\n local\n", 0)
    );
    let out = output(&command, true, &ok);
    let value: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(value["sites"][0], "local");
    let refused = Response::error(
        msr_shared::admin::ErrorCode::SiteExists,
        "site `local` is already declared",
    );
    let out = output(&command, false, &refused);
    assert_eq!(out.code, EXIT_REFUSED);
    assert_eq!(
        out.stderr,
        "error: site_exists: site `local` is already declared\n"
    );
    // With --json a script reads the refusal as the protocol's error object.
    let out = output(&command, true, &refused);
    assert_eq!(out.code, EXIT_REFUSED);
    let value: serde_json::Value = serde_json::from_str(&out.stderr).expect("json");
    assert_eq!(
        value,
        serde_json::json!({"code": "site_exists", "message": "site `local` is already declared"})
    );
}

/// `msr forget` is answered with the MSR list without it: msrctl says what
/// happened above it.
#[test]
fn msr_forget_says_what_it_did() {
    let command = Command::Msr(MsrCommand::Forget {
        name: "msr_1".into(),
    });
    let ok = Response::Ok(msr_shared::admin::ResponseData::Sites { sites: vec![] });
    let out = output(&command, false, &ok);
    assert!(
        out.stdout
            .starts_with("Forgot msr msr_1: its row is gone until it registers again.\n"),
        "{}",
        out.stdout
    );
    // --json stays the protocol's answer.
    assert!(!output(&command, true, &ok).stdout.contains("Forgot"));
}

/// The collector was reached and refused the change: exit 1, not 3.
#[test]
fn a_conflict_and_an_unreachable_store_exit_1() {
    let command = Command::Site(SiteCommand::Declare { name: "x".into() });
    for (code, text) in [
        (ErrorCode::Conflict, "conflict"),
        (ErrorCode::StoreUnavailable, "store_unavailable"),
    ] {
        let out = output(&command, false, &Response::error(code, "nothing changed"));
        assert_eq!(out.code, EXIT_REFUSED);
        assert_eq!(out.stderr, format!("error: {text}: nothing changed\n"));
    }
    assert_eq!(request("cluster list"), Request::ClusterList {});
}

#[test]
fn negative_values_reach_validation() {
    // Not mistaken for flags: the value's own check explains the error.
    let error = parse("site distance a b -5").expect_err("negative distance");
    assert!(
        error.to_string().contains("expected a number >= 0"),
        "{error}"
    );
    assert_eq!(
        request("msr set msr_1 performance_coefficient -1"),
        Request::MsrSetPerformanceCoefficient {
            msr: "msr_1".into(),
            value: -1.0
        }
    );
}

#[test]
fn unreachable_socket_exits_3() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("none.sock");
    let args = [
        "msrctl",
        "--socket",
        socket.to_str().expect("utf-8"),
        "site",
        "list",
    ];
    assert_eq!(
        run(args.iter().map(OsString::from).collect()),
        EXIT_UNREACHABLE
    );
    assert_eq!(
        run(["msrctl", "nonsense"].iter().map(OsString::from).collect()),
        EXIT_USAGE
    );
}
