//! Selection (SPEC §6–§8) through the real binaries: one `msr-collector`,
//! three `msr-agent`s with loads 55 / 40 / 60 % (SPEC §7's worked
//! example), operator settings made with `msrctl`, selections through the
//! control socket and `msrctl select`; and the site matrix compared with
//! the seed's two tables.

use std::collections::BTreeMap;
use std::time::Duration;

use msr_shared::admin::{
    ErrorCode, Explain, Request, Response, ResponseData, SelectQuery, Selection,
};
use system_tests::system::{live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts};
use system_tests::AdminClient;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn msrctl_ok(c: &Collector, args: &[&str]) -> String {
    let (ok, out, err) = c.msrctl(args);
    assert!(ok, "msrctl {args:?} failed: {out}{err}");
    out
}

fn select_req(site: &str, random: Option<f64>, explain: bool) -> Request {
    Request::Select(SelectQuery {
        random,
        explain,
        ..SelectQuery::new("default", site)
    })
}

async fn select(
    client: &mut AdminClient,
    site: &str,
    random: Option<f64>,
    explain: bool,
) -> Selection {
    match client
        .call(&select_req(site, random, explain))
        .await
        .expect("select")
    {
        Response::Ok(ResponseData::Selected(s)) => s,
        other => panic!("select at {site}: {other:?}"),
    }
}

/// Three MSRs, SPEC §7's worked example: loads 55 / 40 / 60 %,
/// coefficients 1.0 / 0.9 / 1.2 → intervals [0,45) [45,99) [99,147).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selection_follows_weights_sites_and_draws() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A long subscription: the loads must not move during the test.
    let opts = CollectorOpts {
        subscription_expires: 120,
        ..CollectorOpts::default()
    };
    let c = Collector::start(dir.path(), "core1", &opts).await;
    let mut agents = Vec::new();
    for (msr, calls) in [("msr_1", 55), ("msr_2", 40), ("msr_3", 60)] {
        let spec = AgentSpec {
            accounts: vec![AccountSpec::new(msr, &c)],
            register_expires: 30,
            ..AgentSpec::default()
        };
        agents.push(Agent::start(dir.path(), msr, &spec, calls));
    }
    c.wait_rows(secs(10), |rows| {
        [("msr_1", 55), ("msr_2", 40), ("msr_3", 60)]
            .iter()
            .all(|&(m, l)| live_row(rows, m, Some(l)).is_some())
            .then_some(())
    })
    .await
    .expect("three MSRs live with loads 55/40/60");

    // Operator settings through msrctl. The default site `local` may be
    // declared by the collector already.
    let (ok, _, err) = c.msrctl(&["site", "declare", "local"]);
    assert!(ok || err.contains("site_exists"), "{err}");
    msrctl_ok(&c, &["site", "declare", "remote"]);
    msrctl_ok(&c, &["site", "distance", "local", "remote", "10"]);
    let out = msrctl_ok(
        &c,
        &["msr", "set", "msr_2", "performance_coefficient", "0.9"],
    );
    assert!(
        out.contains("performance_coefficient") && out.contains("0.9"),
        "{out}"
    );
    msrctl_ok(
        &c,
        &["msr", "set", "msr_3", "performance_coefficient", "1.2"],
    );
    let msrs = c.msrctl_json(&["msr", "list"]);
    let coef: BTreeMap<String, f64> = msrs["msrs"]
        .as_array()
        .expect("msrs")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_owned(),
                m["performance_coefficient"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    assert_eq!(coef.get("msr_1"), Some(&1.0));
    assert_eq!(coef.get("msr_2"), Some(&0.9));
    assert_eq!(coef.get("msr_3"), Some(&1.2));

    // The interval table (explain), JSON: SPEC §7's worked example.
    let mut client = AdminClient::connect_retry(&c.socket, secs(5))
        .await
        .expect("control socket");
    let s = select(&mut client, "local", Some(58.0), true).await;
    assert_eq!(s.msr, "msr_2", "SPEC §7: the draw 58 picks msr_2");
    assert_eq!(s.total, 147.0);
    let explain: Explain = *s.explain.expect("explain");
    let table: Vec<(String, f64, f64, f64)> = explain
        .intervals
        .iter()
        .map(|i| (i.msr.clone(), i.weight, i.bottom, i.top))
        .collect();
    let expected = [
        ("msr_1", 45.0, 0.0, 45.0),
        ("msr_2", 54.0, 45.0, 99.0),
        ("msr_3", 48.0, 99.0, 147.0),
    ];
    assert_eq!(table.len(), 3, "{table:?}");
    for ((m, w, b, t), (em, ew, eb, et)) in table.iter().zip(expected) {
        assert_eq!(m, em);
        for (got, want) in [(w, ew), (b, eb), (t, et)] {
            assert!((got - want).abs() < 1e-9, "{table:?}");
        }
    }
    // The same table as an operator reads it.
    let human = msrctl_ok(
        &c,
        &[
            "select",
            "--zone",
            "default",
            "--site",
            "local",
            "--random",
            "58",
            "--explain",
        ],
    );
    for needle in ["Intervals", "[0, 45)", "[45, 99)", "[99, 147)", "msr_2"] {
        assert!(
            human.contains(needle),
            "`{needle}` missing from select --explain:\n{human}"
        );
    }
    let lines: Vec<&str> = human.lines().collect();
    for (msr, interval) in [
        ("msr_1", "[0, 45)"),
        ("msr_2", "[45, 99)"),
        ("msr_3", "[99, 147)"),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("│ {msr} ")) && l.contains(interval)),
            "row {msr} {interval} in:\n{human}"
        );
    }

    // A fixed draw is reproducible, through msrctl and the socket, and
    // boundaries are half-open.
    for (r, want) in [
        (0.0, "msr_1"),
        (44.99, "msr_1"),
        (45.0, "msr_2"),
        (98.5, "msr_2"),
        (99.0, "msr_3"),
        (146.9, "msr_3"),
    ] {
        let a = select(&mut client, "local", Some(r), false).await;
        let b = select(&mut client, "local", Some(r), false).await;
        assert_eq!((a.msr.as_str(), b.msr.as_str()), (want, want), "draw {r}");
        assert_eq!(a.draw, r);
    }
    let runs: Vec<String> = (0..3)
        .map(|_| {
            c.msrctl_json(&[
                "select", "--zone", "default", "--site", "local", "--random", "100",
            ])["msr"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(runs, ["msr_3", "msr_3", "msr_3"]);
    let (ok, _, err) = c.msrctl(&[
        "select", "--zone", "default", "--site", "local", "--random", "147",
    ]);
    assert!(
        !ok && !err.is_empty(),
        "a draw outside [0, total) is refused"
    );

    // 1,000 random draws (socket) + 20 via msrctl: shares follow the weights.
    const N: usize = 1000;
    let mut picks: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..N {
        let s = select(&mut client, "local", None, false).await;
        assert!((0.0..147.0).contains(&s.draw), "{s:?}");
        *picks.entry(s.msr).or_default() += 1;
    }
    for _ in 0..20 {
        let v = c.msrctl_json(&["select", "--zone", "default", "--site", "local"]);
        let msr = v["msr"].as_str().expect("msr").to_owned();
        assert!(["msr_1", "msr_2", "msr_3"].contains(&msr.as_str()), "{v}");
    }
    // Binomial: s.d. of a share p over N draws is √(p(1−p)/N) ≤ 0.0153 here;
    // 5 s.d. (≈ 0.077) leaves a false alarm rate below 1e-6 per MSR while
    // a wrong formula (e.g. equal shares, or 56 instead of 54) of the seed's
    // kind is still caught when its shift is larger.
    for (msr, w) in [("msr_1", 45.0), ("msr_2", 54.0), ("msr_3", 48.0)] {
        let p: f64 = w / 147.0;
        let sd = (p * (1.0 - p) / N as f64).sqrt();
        let got = picks.get(msr).copied().unwrap_or(0) as f64 / N as f64;
        assert!(
            (got - p).abs() <= 5.0 * sd,
            "{msr}: share {got:.3}, expected {p:.3} ± {:.3} (5 s.d.): {picks:?}",
            5.0 * sd
        );
    }

    // Sites: msr_3's contact moved to `remote` (10 away from `local`).
    let out = msrctl_ok(&c, &["resource", "set", "lo@msr_3", "site", "remote"]);
    assert!(out.contains("remote"), "{out}");
    let s = select(&mut client, "local", Some(0.0), true).await;
    let explain = s.explain.expect("explain");
    let msrs: Vec<&str> = explain.intervals.iter().map(|i| i.msr.as_str()).collect();
    assert_eq!(msrs, ["msr_1", "msr_2"], "msr_3 is farther from local");
    assert_eq!(s.total, 99.0);
    let c3 = explain
        .candidates
        .iter()
        .find(|x| x.msr == "msr_3")
        .expect("msr_3 candidate");
    assert_eq!(c3.outcome, msr_shared::admin::ExplainOutcome::Farther);
    let human = msrctl_ok(
        &c,
        &[
            "select",
            "--zone",
            "default",
            "--site",
            "local",
            "--explain",
        ],
    );
    assert!(
        human.contains("farther") && human.contains("[45, 99)"),
        "{human}"
    );
    // From `remote` only msr_3 is at the minimum distance (0).
    for _ in 0..20 {
        assert_eq!(
            select(&mut client, "remote", None, false).await.msr,
            "msr_3"
        );
    }
    // Infinity: `remote` unreachable from `local` and vice versa.
    msrctl_ok(&c, &["site", "distance", "local", "remote", "infinity"]);
    msrctl_ok(&c, &["resource", "set", "lo@msr_1", "site", "remote"]);
    msrctl_ok(&c, &["resource", "set", "lo@msr_2", "site", "remote"]);
    match client
        .call(&select_req("local", None, false))
        .await
        .expect("select")
    {
        Response::Err(e) => assert_eq!(e.code, ErrorCode::MsrNotFound, "{e:?}"),
        other => panic!("no finite distance: expected msr_not_found, got {other:?}"),
    }
    let (ok, _, err) = c.msrctl(&["select", "--zone", "default", "--site", "local"]);
    assert!(!ok && err.contains("msr_not_found"), "{err}");
    let (ok, _, err) = c.msrctl(&["select", "--zone", "default", "--site", "nowhere"]);
    assert!(!ok && err.contains("unknown_site"), "{err}");
    drop(agents);
}

/// The body rows of a box-drawn table: every `│ … │` line, cells trimmed.
fn table_rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('│'))
        .map(|l| {
            l.trim_matches('│')
                .split('│')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The seed's `site/matrix` tables (seed 000), verbatim.
const SEED_MATRIX_1: &str = "\
┌───────────┬───┬────┬────┬────┬───┐
│ Site-name │ # │ 1  │ 2  │ 3  │ 4 │
├───────────┼───┼────┼────┼────┼───┤
│ local     │ 1 │  0 │ 10 │ 20 │   │
│ site_102  │ 2 │ 10 │    │    │   │
│ site_103  │ 3 │ 20 │    │    │   │
│ site_104  │ 4 │    │    │    │ 0 │
└───────────┴───┴────┴────┴────┴───┘";

const SEED_MATRIX_2: &str = "\
┌─────────────┬───┬────┬───┬────┐
│  Site-name  │ # │ 1  │ 2 │ 3  │
├─────────────┼───┼────┼───┼────┤
│ local       │ 1 │  0 │   │ 32 │
│ remote      │ 2 │    │ 0 │    │
│ remote_1    │ 3 │ 32 │   │  0 │
│ remote_side │ 4 │    │   │    │
└─────────────┴───┴────┴───┴────┘";

/// Compares msrctl's matrix with a seed table: the same rows and cells
/// (empty = infinity), then the whole box line by line. msrctl centres the
/// header like the seed (`│  Site-name  │` in the wider column of the
/// second table), so no alignment difference is tolerated; trailing
/// whitespace and the transcript's indentation are ignored.
fn assert_matrix_like_seed(out: &str, seed: &str) {
    assert_eq!(
        table_rows(out),
        table_rows(seed),
        "cells differ:\n{out}\nseed:\n{seed}"
    );
    let box_lines = |t: &str| -> Vec<String> {
        t.lines()
            .map(|l| l.trim().to_owned())
            .filter(|l| l.starts_with(['┌', '├', '└', '│']))
            .collect()
    };
    assert_eq!(
        box_lines(out),
        box_lines(seed),
        "table differs:\n{out}\nseed:\n{seed}"
    );
    assert!(
        out.contains("empty distance - infinity distance between sites"),
        "legend missing:\n{out}"
    );
}

/// `site matrix` reproduces the seed's two tables. SPEC §6 makes a site's
/// own distance default to 0, but the seed shows site_102, site_103 and
/// remote_side with an empty (infinite) own distance: the test sets those
/// to `infinity` explicitly (a drained site), which is what the seed's
/// operator must have done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn site_matrix_reproduces_the_seed_tables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(dir.path(), "core1", &CollectorOpts::default()).await;
    let (ok, _, err) = c.msrctl(&["site", "declare", "local"]);
    assert!(ok || err.contains("site_exists"), "{err}");

    // Seed example 1: `system/media/site/matrix`.
    for s in ["site_102", "site_103", "site_104"] {
        let out = msrctl_ok(&c, &["site", "declare", s]);
        assert!(out.contains(s), "{out}");
    }
    for (a, b, d) in [
        ("local", "site_102", "10"),
        ("site_103", "local", "20"),
        ("site_102", "site_102", "infinity"),
        ("site_103", "site_103", "infinity"),
        ("site_104", "site_104", "0"),
    ] {
        let out = msrctl_ok(&c, &["site", "distance", a, b, d]);
        assert!(out.contains(d), "{out}");
    }
    let out = msrctl_ok(&c, &["site", "matrix"]);
    assert_matrix_like_seed(&out, SEED_MATRIX_1);
    let json = c.msrctl_json(&["site", "matrix"]);
    assert_eq!(
        json["sites"],
        serde_json::json!(["local", "site_102", "site_103", "site_104"])
    );
    assert_eq!(
        json["cells"][0],
        serde_json::json!([0.0, 10.0, 20.0, "infinity"])
    );
    assert_eq!(
        json["cells"][2][0],
        serde_json::json!(20.0),
        "distances are symmetric"
    );

    // Seed example 2: the sites of the second transcript, then
    // `system/media/site/matrix local remote remote_1` (3 columns).
    for s in ["site_102", "site_103", "site_104"] {
        msrctl_ok(&c, &["site", "remove", s]);
    }
    for s in ["remote", "remote_1", "remote_side"] {
        msrctl_ok(&c, &["site", "declare", s]);
    }
    msrctl_ok(&c, &["site", "distance", "remote_1", "local", "32"]);
    msrctl_ok(
        &c,
        &["site", "distance", "remote_side", "remote_side", "infinity"],
    );
    let sites = c.msrctl_json(&["site", "list"]);
    assert_eq!(
        sites["sites"],
        serde_json::json!(["local", "remote", "remote_1", "remote_side"])
    );
    let out = msrctl_ok(&c, &["site", "matrix", "local", "remote", "remote_1"]);
    assert_matrix_like_seed(&out, SEED_MATRIX_2);
    let json = c.msrctl_json(&["site", "matrix", "local", "remote", "remote_1"]);
    assert_eq!(json["columns"], serde_json::json!([0, 1, 2]));
    assert_eq!(
        json["cells"].as_array().map(Vec::len),
        Some(4),
        "every site is a row"
    );
    // The slash-path spelling of the seed, if accepted, gives the same table.
    let (ok, alias, _) = c.msrctl(&["system/media/site/matrix", "local", "remote", "remote_1"]);
    if ok {
        assert_eq!(table_rows(&alias), table_rows(&out));
    }
}

/// Runs msrctl with `env` set and no `--socket`; returns (exit code,
/// stdout, stderr).
fn msrctl_env(env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(system_tests::bin_path("msrctl"))
        .envs(env.iter().copied())
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run msrctl");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes raw bytes on a fresh control connection and reads one response
/// line (`None` when the collector closed the connection instead).
async fn raw_exchange(socket: &std::path::Path, writes: &[&[u8]]) -> Vec<Option<Response>> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect");
    let (read, mut write) = stream.into_split();
    let mut lines = tokio::io::BufReader::new(read).lines();
    let mut answers = Vec::new();
    for bytes in writes {
        write.write_all(bytes).await.expect("write");
        let line = tokio::time::timeout(secs(5), lines.next_line())
            .await
            .expect("an answer within 5 s")
            .expect("read");
        answers.push(line.map(|l| serde_json::from_str(&l).expect("json")));
    }
    answers
}

fn refused_with(response: &Option<Response>) -> (ErrorCode, String) {
    match response {
        Some(Response::Err(e)) => (e.code, e.message.clone()),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The control socket and msrctl against bad input and abusive clients,
/// through the real binaries: closed connections free their slot, a full
/// server makes msrctl exit 3, bad UTF-8 and unknown fields are
/// `bad_request`, a line of exactly 64 KiB is read, and numbers are shown
/// compactly (`-0` as `0`, `1e308`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_socket_and_msrctl_hold_up_against_bad_clients() {
    use msr_collector::api::control::{
        MAX_CONNECTIONS, MAX_CONNECTIONS_PER_CLIENT, MAX_LINE_BYTES,
    };
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(dir.path(), "core1", &CollectorOpts::default()).await;

    // Clients doing connect(); close() in a loop while msrctl is used: the
    // server counted closed connections that it had not reaped yet and
    // refused msrctl with `too many control connections`.
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));
    let flood: Vec<_> = (0..2)
        .map(|_| {
            let (socket, stop, cycles) = (c.socket.clone(), Arc::clone(&stop), Arc::clone(&cycles));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let many = system_tests::wait_for(secs(10), || async {
        (cycles.load(Ordering::Relaxed) > MAX_CONNECTIONS).then_some(())
    })
    .await;
    assert!(many.is_some(), "the flood did not get going");
    let mut failures = Vec::new();
    for _ in 0..15 {
        let (ok, _, err) = c.msrctl(&["site", "list"]);
        if !ok {
            failures.push(err);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for thread in flood {
        thread.join().expect("flood thread");
    }
    assert!(
        failures.is_empty(),
        "msrctl failed {} times during {} connect/close cycles: {failures:?}",
        failures.len(),
        cycles.load(Ordering::Relaxed)
    );
    let (ok, out, err) = c.msrctl(&["site", "list"]);
    assert!(ok && out.contains("local"), "{out}{err}");

    // A full server (for this test's user, which holds its share of the
    // places): msrctl exits 3 (cannot be reached), not 1.
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS_PER_CLIENT {
        held.push(
            tokio::net::UnixStream::connect(&c.socket)
                .await
                .expect("connect"),
        );
    }
    // The server has taken every slot once it refuses a probe.
    let full = system_tests::wait_for(secs(5), || async {
        let answers = raw_exchange(&c.socket, &[b"{\"op\":\"site_list\"}\n"]).await;
        matches!(&answers[0], Some(Response::Err(e)) if e.code == ErrorCode::Unavailable)
            .then_some(())
    })
    .await;
    assert!(full.is_some(), "the server never filled up");
    let sock = c.socket.to_str().expect("utf-8 path");
    let (code, _, err) = msrctl_env(&[], &["--socket", sock, "site", "list"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("too many control connections"), "{err}");
    drop(held);
    let freed = system_tests::wait_for(secs(5), || async {
        c.msrctl(&["site", "list"]).0.then_some(())
    })
    .await;
    assert!(freed.is_some(), "closing the connections frees their slots");

    // Invalid UTF-8 is a bad request, and the connection stays open.
    let answers = raw_exchange(
        &c.socket,
        &[
            b"{\"op\":\"site_declare\",\"name\":\"bad\xff\xfeutf\"}\n",
            b"{\"op\":\"msr_list\",\"x\":1}\n",
            b"{\"op\":\"site_distance\",\"a\":\"local\",\"b\":\"local\",\"distance\":null}\n",
            b"{\"op\":\"site_list\"}\n",
        ],
    )
    .await;
    let (code, message) = refused_with(&answers[0]);
    assert_eq!(code, ErrorCode::BadRequest, "{message}");
    assert!(message.contains("not valid utf-8"), "{message}");
    let (code, message) = refused_with(&answers[1]);
    assert_eq!(code, ErrorCode::BadRequest, "{message}");
    assert!(message.contains("unknown field `x`"), "{message}");
    let (code, message) = refused_with(&answers[2]);
    assert_eq!(code, ErrorCode::BadRequest, "{message}");
    assert!(
        message.contains("distance: expected a number >= 0 or \"infinity\", not null"),
        "{message}"
    );
    match &answers[3] {
        Some(Response::Ok(ResponseData::Sites { sites })) => {
            assert!(!sites.iter().any(|s| s.starts_with("bad")), "{sites:?}");
        }
        other => panic!("site list after the bad lines: {other:?}"),
    }

    // A line of exactly MAX_LINE_BYTES is read; one byte more is refused.
    let mut exact = b"{\"op\":\"site_list\"}".to_vec();
    exact.resize(MAX_LINE_BYTES, b' ');
    exact.push(b'\n');
    let mut long = exact.clone();
    long.insert(0, b' ');
    let answers = raw_exchange(&c.socket, &[&exact, &long]).await;
    assert!(
        matches!(answers[0], Some(Response::Ok(ResponseData::Sites { .. }))),
        "{:?}",
        answers[0]
    );
    let (code, message) = refused_with(&answers[1]);
    assert_eq!(
        (code, message.as_str()),
        (
            ErrorCode::BadRequest,
            "request line longer than 65536 bytes"
        )
    );

    // Numbers: -0 is 0, huge and tiny ones in exponent form.
    msrctl_ok(&c, &["site", "declare", "far"]);
    let out = msrctl_ok(&c, &["site", "distance", "local", "local", "-0"]);
    assert_eq!(out, "Distance between local and local changed to: 0.\n");
    let out = msrctl_ok(&c, &["site", "distance", "local", "far", "1e308"]);
    assert_eq!(out, "Distance between local and far changed to: 1e308.\n");
    let out = msrctl_ok(&c, &["site", "distance", "far", "far", "5e-324"]);
    assert_eq!(out, "Distance between far and far changed to: 5e-324.\n");
    let out = msrctl_ok(&c, &["site", "matrix"]);
    assert_eq!(
        table_rows(&out)[1..],
        [
            ["far", "1", "5e-324", "1e308"],
            ["local", "2", "1e308", "0"]
        ],
        "{out}"
    );
    assert!(out.lines().all(|l| l.chars().count() < 60), "{out}");
    let out = msrctl_ok(&c, &["msr", "set", "m", "performance_coefficient", "0.001"]);
    assert!(out.contains(" from  1.0\n to    0.001\n"), "{out}");
    for bad in ["1e308", "1e-300"] {
        let (ok, _, err) = c.msrctl(&["msr", "set", "m", "performance_coefficient", bad]);
        assert!(
            !ok && err.contains(&format!(
                "invalid performance coefficient {bad} for msr `m`: expected a number from 0.001 to 1000000"
            )),
            "{err}"
        );
    }
    let out = msrctl_ok(&c, &["msr", "list"]);
    assert!(out.contains("0.001"), "{out}");

    // --socket that is not a socket; an empty MSRCTL_SOCKET.
    let (code, _, err) = msrctl_env(
        &[],
        &[
            "--socket",
            dir.path().to_str().expect("utf-8"),
            "site",
            "list",
        ],
    );
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("is a directory, not a socket"), "{err}");
    let (code, _, err) = msrctl_env(&[("MSRCTL_SOCKET", "")], &["site", "list"]);
    assert!(
        err.contains("/run/msr-collector/control.sock") && !err.contains("a value is required"),
        "an empty MSRCTL_SOCKET means the default socket: {err}"
    );
    assert_ne!(code, Some(2), "not a usage error: {err}");
    let (code, out, err) = msrctl_env(&[("MSRCTL_SOCKET", sock)], &["site", "list"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("far"), "{out}");
}

/// SPEC §15 through the real binaries: two agents report their `<codec>`
/// elements; `msrctl select --codecs` goes only to an MSR that takes the
/// offer, an offer nobody takes is `no_capable_msr` and `--explain` names
/// what each MSR lacks; a hot reload of one agent's `<codec>` reaches the
/// collector, and the offer is then placed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_goes_only_to_an_msr_that_takes_it_and_a_reload_changes_that() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Collector::start(dir.path(), "core1", &CollectorOpts::default()).await;
    let spec = |msr: &str, codecs: &str| AgentSpec {
        accounts: vec![AccountSpec::new(msr, &c)],
        register_expires: 30,
        codecs: Some(codecs.to_owned()),
        ..AgentSpec::default()
    };
    let audio = Agent::start(
        dir.path(),
        "audio",
        &spec("audio", r#"pcma="1" pcmu="2""#),
        10,
    );
    let _video = Agent::start(
        dir.path(),
        "video",
        &spec("video", r#"pcma="2" h264="1" g729="0""#),
        10,
    );
    c.wait_rows(secs(10), |rows| {
        (rows.iter().filter(|r| r.codecs.is_some()).count() == 2).then_some(())
    })
    .await
    .expect("both MSRs report their codecs");

    let out = msrctl_ok(&c, &["resource", "list"]);
    assert!(
        out.contains("Media") && out.contains("2a ") && out.contains("1a 1v"),
        "{out}"
    );
    let wide = msrctl_ok(&c, &["resource", "list", "--wide"]);
    assert!(
        wide.contains("pcma,pcmu") && wide.contains("pcma,h264"),
        "{wide}"
    );

    for _ in 0..10 {
        let json = c.msrctl_json(&[
            "select",
            "--zone",
            "default",
            "--site",
            "local",
            "--codecs",
            "pcmu,pcma,h264",
        ]);
        assert_eq!(json["msr"], "video", "{json}");
    }
    let (ok, out, err) = c.msrctl(&[
        "select",
        "--zone",
        "default",
        "--site",
        "local",
        "--codecs",
        "g729",
        "--explain",
    ]);
    assert!(!ok, "{out}");
    let text = format!("{out}{err}");
    assert!(
        text.contains("no_capable_msr") && text.contains("audio (g729)"),
        "{text}"
    );
    assert!(text.contains("incapable: audio (g729)"), "{text}");
    let (ok, _, err) = c.msrctl(&[
        "select", "--zone", "default", "--site", "local", "--codecs", "g728",
    ]);
    assert!(!ok && err.contains("unknown codec `g728`"), "{err}");

    // The audio MSR's operator turns G.729 on: the agent reports it at
    // once, and a G.729 offer now goes there.
    audio.rewrite(&spec("audio", r#"pcma="1" pcmu="2" g729="3""#));
    c.wait_rows(secs(10), |rows| {
        rows.iter()
            .any(|r| {
                r.msr == "audio"
                    && r.codecs
                        .as_ref()
                        .is_some_and(|c| c.iter().any(|n| n == "g729"))
            })
            .then_some(())
    })
    .await
    .expect("the reload's codecs reach the collector");
    let json = c.msrctl_json(&[
        "select", "--zone", "default", "--site", "local", "--codecs", "g729",
    ]);
    assert_eq!(json["msr"], "audio", "{json}");
}
