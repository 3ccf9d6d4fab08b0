//! One operator configuration for a cluster of core hosts, in a real etcd
//! (SPEC §12): three collectors on one etcd, changes through each seen by
//! all, conflicting changes, an etcd outage, kill -9 of a collector, and
//! the migration of a file store.

use std::path::Path;
use std::time::{Duration, Instant};

use msr_shared::admin::{
    ClusterView, ErrorCode, MsrInfo, Request, Response, ResponseData, SelectQuery,
};
use msr_shared::admin::{StoreKind, StoreState};
use system_tests::system::{
    live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts, Etcd,
};
use system_tests::{bin_path, wait_for, AdminClient};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn opts(node: &str) -> CollectorOpts {
    CollectorOpts {
        node: node.into(),
        ..CollectorOpts::default()
    }
}

async fn cluster(c: &Collector) -> Option<ClusterView> {
    match c.call(&Request::ClusterList {}).await.ok()? {
        Response::Ok(ResponseData::Cluster(view)) => Some(view),
        _ => None,
    }
}

async fn wait_cluster(
    c: &Collector,
    limit: Duration,
    check: impl Fn(&ClusterView) -> bool,
) -> ClusterView {
    let found = wait_for(limit, || async { cluster(c).await.filter(|v| check(v)) }).await;
    match found {
        Some(view) => view,
        None => panic!(
            "{}: cluster condition not met within {limit:?}: {:?}",
            c.name,
            cluster(c).await
        ),
    }
}

async fn sites(client: &mut AdminClient) -> Vec<String> {
    match client.call(&Request::SiteList {}).await {
        Ok(Response::Ok(ResponseData::Sites { sites })) => sites,
        other => panic!("site list: {other:?}"),
    }
}

async fn msrs(c: &Collector) -> Vec<MsrInfo> {
    match c.ok(&Request::MsrList {}).await {
        ResponseData::Msrs { msrs } => msrs,
        other => panic!("msr list: {other:?}"),
    }
}

fn coefficient(list: &[MsrInfo], msr: &str) -> Option<f64> {
    list.iter()
        .find(|m| m.name == msr)
        .map(|m| m.performance_coefficient)
}

fn declare(name: &str) -> Request {
    Request::SiteDeclare { name: name.into() }
}

fn set_coefficient(msr: &str, value: f64) -> Request {
    Request::MsrSetPerformanceCoefficient {
        msr: msr.into(),
        value,
    }
}

/// Three collectors on one etcd: each sees the others as members, a change
/// through any of them reaches all three (the propagation is measured and
/// printed), and the membership shrinks when one is killed with -9 (its
/// lease expires) or stopped (its lease is revoked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_collectors_share_one_configuration() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut etcd = Etcd::start_in(dir.path()).await;
    let store = etcd.store_toml("/t1/", 2);
    let mut cs = Vec::new();
    for node in ["core-a", "core-b", "core-c"] {
        cs.push(Collector::start_with(dir.path(), node, &opts(node), &store).await);
    }
    for c in &cs {
        let view = wait_cluster(c, secs(10), |v| v.members.len() == 3).await;
        assert_eq!(view.core_hosts, 3);
        assert_eq!(view.store.backend, StoreKind::Etcd);
        assert_eq!(view.store.status, StoreState::Connected);
        assert!(view.members.iter().any(|m| m.this && m.node == c.name));
    }
    let (ok, out, _) = cs[0].msrctl(&["cluster", "list"]);
    assert!(
        ok && out.contains("core-b") && out.contains("Core hosts: 3"),
        "{out}"
    );
    let json = cs[0].msrctl_json(&["cluster", "list"]);
    assert_eq!(json["members"].as_array().map(Vec::len), Some(3), "{json}");

    // A change through each collector is seen by all three.
    let mut clients = Vec::new();
    for c in &cs {
        clients.push(AdminClient::connect(&c.socket).await.expect("connect"));
    }
    for (i, c) in cs.iter().enumerate() {
        let site = format!("site_{i}");
        c.ok(&declare(&site)).await;
        for other in &cs {
            let seen = wait_for(secs(5), || {
                let site = site.clone();
                async move {
                    let mut client = AdminClient::connect(&other.socket).await.ok()?;
                    sites(&mut client).await.contains(&site).then_some(())
                }
            })
            .await;
            assert!(
                seen.is_some(),
                "{} never saw {site} declared on {}",
                other.name,
                c.name
            );
        }
    }
    cs[1].ok(&set_coefficient("msr_7", 2.5)).await;
    for c in &cs {
        let seen = wait_for(secs(5), || async {
            (coefficient(&msrs(c).await, "msr_7") == Some(2.5)).then_some(())
        })
        .await;
        assert!(seen.is_some(), "{} never saw msr_7's coefficient", c.name);
    }

    // Propagation: a change acknowledged by one collector, polled on the
    // other two until both show it.
    let mut delays = Vec::new();
    for round in 0..60u32 {
        let from = (round % 3) as usize;
        let value = f64::from(round) + 1.5;
        let started = Instant::now();
        match clients[from]
            .call(&set_coefficient("msr_p", value))
            .await
            .expect("call")
        {
            Response::Ok(_) => {}
            other => panic!("round {round}: {other:?}"),
        }
        let acked = Instant::now();
        for (i, client) in clients.iter_mut().enumerate() {
            if i == from {
                continue;
            }
            loop {
                let Ok(Response::Ok(ResponseData::Msrs { msrs })) =
                    client.call(&Request::MsrList {}).await
                else {
                    panic!("msr list");
                };
                if coefficient(&msrs, "msr_p") == Some(value) {
                    break;
                }
                assert!(
                    acked.elapsed() < secs(5),
                    "round {round}: not propagated in 5 s"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let _ = started;
        delays.push(acked.elapsed());
    }
    delays.sort();
    let pick = |q: f64| delays[((delays.len() as f64 - 1.0) * q).round() as usize];
    let (p50, p99, max) = (pick(0.5), pick(0.99), delays[delays.len() - 1]);
    println!(
        "propagation to both other collectors after the acknowledgement, {} changes: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        delays.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
    assert!(
        max < secs(1),
        "a change took {max:?} to reach every collector (SPEC §12: within 1 s)"
    );

    // kill -9: the lease expires (TTL 2 s), the membership shrinks.
    drop(clients);
    cs[2].kill9();
    let view = wait_cluster(&cs[0], secs(10), |v| v.members.len() == 2).await;
    assert_eq!(view.core_hosts, 2);
    assert!(view.members.iter().all(|m| m.node != "core-c"), "{view:?}");
    // SIGTERM: the lease is revoked at once.
    assert!(cs[1].terminate().is_some_and(|s| s.success()));
    let view = wait_cluster(&cs[0], secs(3), |v| v.members.len() == 1).await;
    assert_eq!(view.core_hosts, 1);
    etcd.kill9();
}

/// Two operators change the same setting at the same moment on two
/// collectors: each round, either both changes were made one after the
/// other, or one wins and the other gets `conflict`; every collector ends
/// on the winner's value (nothing lost silently).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_conflict_instead_of_losing_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut etcd = Etcd::start_in(dir.path()).await;
    let store = etcd.store_toml("/t2/", 5);
    let a = Collector::start_with(dir.path(), "core-a", &opts("core-a"), &store).await;
    let b = Collector::start_with(dir.path(), "core-b", &opts("core-b"), &store).await;
    wait_cluster(&a, secs(10), |v| v.members.len() == 2).await;
    let mut ca = AdminClient::connect(&a.socket).await.expect("connect");
    let mut cb = AdminClient::connect(&b.socket).await.expect("connect");
    let mut conflicts = 0;
    for round in 0..40u32 {
        let (va, vb) = (f64::from(round) * 2.0 + 1.0, f64::from(round) * 2.0 + 2.0);
        let (qa, qb) = (set_coefficient("msr_1", va), set_coefficient("msr_1", vb));
        let (ra, rb) = tokio::join!(ca.call(&qa), cb.call(&qb));
        let (ra, rb) = (ra.expect("a"), rb.expect("b"));
        let winner = match (&ra, &rb) {
            (Response::Ok(_), Response::Ok(_)) => None,
            (Response::Ok(_), Response::Err(e)) => {
                assert_eq!(e.code, ErrorCode::Conflict, "{e:?}");
                assert!(
                    e.message.contains("changed on another collector"),
                    "{}",
                    e.message
                );
                Some(va)
            }
            (Response::Err(e), Response::Ok(_)) => {
                assert_eq!(e.code, ErrorCode::Conflict, "{e:?}");
                Some(vb)
            }
            other => panic!("round {round}: both refused: {other:?}"),
        };
        let Some(expected) = winner else { continue };
        conflicts += 1;
        for c in [&a, &b] {
            let seen = wait_for(secs(5), || async {
                (coefficient(&msrs(c).await, "msr_1") == Some(expected)).then_some(())
            })
            .await;
            assert!(
                seen.is_some(),
                "round {round}: {} does not show the winner's {expected}",
                c.name
            );
        }
        if conflicts >= 3 {
            break;
        }
    }
    assert!(conflicts > 0, "40 simultaneous pairs never conflicted");
    etcd.kill9();
}

/// etcd goes down mid-run: selection goes on with the last configuration,
/// `cluster list` says so, changes are refused (`store_unavailable`, exit
/// 1), and once etcd is back changes are accepted again. A collector that
/// starts while etcd is down starts from its cached copy, and catches up
/// with a change made elsewhere while it was away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_keeps_selection_and_refuses_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut etcd = Etcd::start_in(dir.path()).await;
    let store = etcd.store_toml("/t3/", 5);
    let mut a = Collector::start_with(dir.path(), "core-a", &opts("core-a"), &store).await;
    let b = Collector::start_with(dir.path(), "core-b", &opts("core-b"), &store).await;
    let spec = AgentSpec {
        accounts: vec![AccountSpec::new("msr_1", &a)],
        register_expires: 30,
        ..AgentSpec::default()
    };
    let _agent = Agent::start(dir.path(), "msr_1", &spec, 10);
    a.wait_rows(secs(10), |rows| {
        live_row(rows, "msr_1", Some(10)).map(|_| ())
    })
    .await
    .expect("msr_1 reporting");
    a.ok(&set_coefficient("msr_1", 3.0)).await;

    let select = Request::Select(SelectQuery::new("default", "local"));
    etcd.kill9();
    wait_cluster(&a, secs(10), |v| v.store.status == StoreState::Unavailable).await;
    let (ok, out, _) = a.msrctl(&["cluster", "list"]);
    assert!(
        ok && out.contains("unavailable") && out.contains("last configuration seen"),
        "{out}"
    );
    let mut client = AdminClient::connect(&a.socket).await.expect("connect");
    for _ in 0..200 {
        match client.call(&select).await.expect("select") {
            Response::Ok(ResponseData::Selected(s)) => assert_eq!(s.msr, "msr_1"),
            other => panic!("selection interrupted by the outage: {other:?}"),
        }
    }
    assert_eq!(
        coefficient(&msrs(&a).await, "msr_1"),
        Some(3.0),
        "the last configuration stays"
    );
    let (ok, _, err) = a.msrctl(&["site", "declare", "during_outage"]);
    assert!(!ok && err.contains("etcd is unreachable"), "{err}");
    let status = std::process::Command::new(bin_path("msrctl"))
        .args([
            "--socket",
            &a.socket.display().to_string(),
            "--json",
            "site",
            "declare",
            "x",
        ])
        .output()
        .expect("msrctl");
    assert_eq!(status.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&status.stderr).contains("store_unavailable"));
    assert!(a.log_text().contains("etcd unreachable"), "logged");

    // etcd back: changes accepted again, through both collectors.
    etcd.start().await;
    wait_cluster(&a, secs(15), |v| v.store.status == StoreState::Connected).await;
    wait_cluster(&b, secs(15), |v| v.store.status == StoreState::Connected).await;
    for _ in 0..50 {
        match client.call(&select).await.expect("select") {
            Response::Ok(ResponseData::Selected(_)) => {}
            other => panic!("selection after the outage: {other:?}"),
        }
    }
    a.ok(&declare("after_outage")).await;
    let seen = wait_for(secs(5), || async {
        let mut c = AdminClient::connect(&b.socket).await.ok()?;
        sites(&mut c)
            .await
            .contains(&"after_outage".to_owned())
            .then_some(())
    })
    .await;
    assert!(seen.is_some(), "b did not see a's change after the outage");

    // a stops; b changes something; etcd goes down; a starts from its cache.
    drop(client);
    assert!(a.terminate().is_some_and(|s| s.success()));
    b.ok(&set_coefficient("msr_1", 4.0)).await;
    etcd.kill9();
    a.spawn().await;
    let view = wait_cluster(&a, secs(5), |v| v.store.status == StoreState::Unavailable).await;
    assert!(
        view.store
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("cached copy")),
        "{view:?}"
    );
    let mut client = AdminClient::connect(&a.socket).await.expect("connect");
    assert!(
        sites(&mut client)
            .await
            .contains(&"after_outage".to_owned()),
        "from the cache"
    );
    assert_eq!(
        coefficient(&msrs(&a).await, "msr_1"),
        Some(3.0),
        "the cache predates b's change"
    );
    assert!(a.log_text().contains("starting from the local cached copy"));
    etcd.start().await;
    let seen = wait_for(secs(15), || async {
        (coefficient(&msrs(&a).await, "msr_1") == Some(4.0)).then_some(())
    })
    .await;
    assert!(seen.is_some(), "a did not catch up with b's change");
    let view = wait_cluster(&a, secs(5), |v| v.store.status == StoreState::Connected).await;
    assert!(view.store.detail.is_none(), "{view:?}");
    etcd.kill9();
}

fn migrate(config: &Path, force: bool) -> (bool, String, String) {
    let mut args = vec![
        "--config".to_owned(),
        config.display().to_string(),
        "store".into(),
        "migrate".into(),
        "--to".into(),
        "etcd".into(),
    ];
    if force {
        args.push("--force".into());
    }
    let out = std::process::Command::new(bin_path("msr-collector"))
        .args(&args)
        .output()
        .expect("msr-collector");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A file store moves into etcd with one command, once: a second run finds
/// the prefix holding a configuration and refuses without `--force`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_store_migrates_into_etcd_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut etcd = Etcd::start_in(dir.path()).await;
    let mut file = Collector::start(dir.path(), "single", &opts("single")).await;
    file.ok(&declare("remote")).await;
    file.ok(&set_coefficient("msr_1", 2.0)).await;
    assert!(file.terminate().is_some_and(|s| s.success()));
    // The same collector, now configured for etcd.
    let text = std::fs::read_to_string(&file.config).expect("config");
    std::fs::write(
        &file.config,
        format!("{text}\n{}", etcd.store_toml("/t4/", 5)),
    )
    .expect("write");

    let (ok, out, err) = migrate(&file.config, false);
    assert!(
        ok && out.contains("migrated") && out.contains("2 site(s)"),
        "{out}{err}"
    );
    let (ok, _, err) = migrate(&file.config, false);
    assert!(
        !ok && err.contains("is not empty") && err.contains("--force"),
        "{err}"
    );
    let (ok, out, err) = migrate(&file.config, true);
    assert!(ok, "{out}{err}");

    file.spawn().await;
    let view = wait_cluster(&file, secs(10), |v| v.store.status == StoreState::Connected).await;
    assert_eq!(view.store.backend, StoreKind::Etcd);
    let mut client = AdminClient::connect(&file.socket).await.expect("connect");
    assert_eq!(
        sites(&mut client).await,
        vec!["local".to_owned(), "remote".to_owned()]
    );
    assert_eq!(coefficient(&msrs(&file).await, "msr_1"), Some(2.0));
    etcd.kill9();
}
