use std::time::Duration;

use msr_shared::event_package::LoadReport;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;
use crate::load_table::ContactBinding;

struct Harness {
    operator: OperatorConfig,
    table: LoadTable,
    store: Store,
    defaults: Defaults,
    rng: StdRng,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path().join("operator.json"));
        Self {
            operator: OperatorConfig::new(),
            table: LoadTable::new("core1@test".into()),
            store,
            defaults: Defaults::default(),
            rng: StdRng::seed_from_u64(1),
            _dir: dir,
        }
    }

    fn run(&mut self, request: Request, now: Instant) -> Response {
        let mut ctx = AdminContext {
            operator: &mut self.operator,
            table: &mut self.table,
            store: &self.store,
            defaults: &self.defaults,
            rng: &mut self.rng,
        };
        handle(request, &mut ctx, now)
    }

    fn ok(&mut self, request: Request, now: Instant) -> ResponseData {
        match self.run(request.clone(), now) {
            Response::Ok(data) => data,
            Response::Err(error) => panic!("{request:?} refused: {error:?}"),
        }
    }

    fn err(&mut self, request: Request, now: Instant) -> ErrorCode {
        match self.run(request.clone(), now) {
            Response::Err(error) => error.code,
            Response::Ok(data) => panic!("{request:?} accepted: {data:?}"),
        }
    }

    fn register(&mut self, contact: &str, msr: &str, now: Instant) {
        let binding = ContactBinding {
            contact: contact.into(),
            msr: msr.into(),
            uri: format!("sip:{msr}@127.0.0.1:5040"),
            version: Some("0.1.0".into()),
            expires_at: now + Duration::from_secs(60),
        };
        self.table.upsert_contact(
            binding,
            &self.operator,
            &self.defaults.zone,
            &self.defaults.site,
        );
    }
}

fn declare(name: &str) -> Request {
    Request::SiteDeclare { name: name.into() }
}

#[test]
fn mutations_are_persisted_before_ok() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.ok(declare("remote"), now);
    let data = h.ok(
        Request::SiteDistance {
            a: "local".into(),
            b: "remote".into(),
            distance: Distance::Finite(64.0),
        },
        now,
    );
    let ResponseData::Changed(change) = data else {
        panic!("{data:?}")
    };
    assert_eq!(
        (change.from.as_str(), change.to.as_str()),
        ("infinity", "64")
    );
    h.ok(
        Request::MsrSetPerformanceCoefficient {
            msr: "msr_1".into(),
            value: 2.0,
        },
        now,
    );
    assert_eq!(h.store.load().expect("load"), h.operator);
}

#[test]
fn failed_save_changes_nothing() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.store = Store::new(h._dir.path().join("missing").join("operator.json"));
    assert_eq!(h.err(declare("local"), now), ErrorCode::StoreFailed);
    assert!(!h.operator.topology().contains("local"));
}

#[test]
fn refusals_carry_codes() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    assert_eq!(h.err(declare("local"), now), ErrorCode::SiteExists);
    assert_eq!(
        h.err(
            Request::SiteRemove {
                name: "nowhere".into()
            },
            now
        ),
        ErrorCode::UnknownSite
    );
    // `local` is the default site: every contact without an override uses it.
    assert_eq!(
        h.err(
            Request::SiteRemove {
                name: "local".into()
            },
            now
        ),
        ErrorCode::SiteInUse
    );
    assert_eq!(
        h.err(
            Request::MsrSetPerformanceCoefficient {
                msr: "m".into(),
                value: 0.0
            },
            now
        ),
        ErrorCode::InvalidValue
    );
    assert_eq!(
        h.err(
            Request::SubscriptionSetExpires {
                msr: "m".into(),
                event: "presence".into(),
                expires: 30
            },
            now
        ),
        ErrorCode::BadEvent
    );
    assert_eq!(
        h.err(
            Request::ResourceSetSite {
                contact: "lo@m".into(),
                site: "mars".into()
            },
            now
        ),
        ErrorCode::UnknownSite
    );
    assert_eq!(
        h.err(
            Request::SiteDistance {
                a: "local".into(),
                b: "local".into(),
                distance: Distance::Finite(-1.0)
            },
            now
        ),
        ErrorCode::InvalidValue
    );
}

#[test]
fn site_in_use_by_live_contact_cannot_be_removed() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.ok(declare("remote"), now);
    h.register("lo@msr_1", "msr_1", now);
    h.ok(
        Request::ResourceSetSite {
            contact: "lo@msr_1".into(),
            site: "remote".into(),
        },
        now,
    );
    assert_eq!(
        h.err(
            Request::SiteRemove {
                name: "remote".into()
            },
            now
        ),
        ErrorCode::SiteInUse
    );
    let ResponseData::Resources { rows } = h.ok(Request::ResourceList { active_only: false }, now)
    else {
        panic!("resources")
    };
    assert_eq!(rows[0].site, "remote");
}

#[test]
fn matrix_rows_all_sites_columns_named() {
    let now = Instant::now();
    let mut h = Harness::new();
    for site in ["local", "remote", "remote_1", "remote_side"] {
        h.ok(declare(site), now);
    }
    h.ok(
        Request::SiteDistance {
            a: "local".into(),
            b: "remote_1".into(),
            distance: Distance::Finite(32.0),
        },
        now,
    );
    let names = vec!["local".into(), "remote".into(), "remote_1".into()];
    let ResponseData::Matrix(matrix) = h.ok(Request::SiteMatrix { names }, now) else {
        panic!("matrix")
    };
    assert_eq!(matrix.sites.len(), 4);
    assert_eq!(matrix.columns, vec![0, 1, 2]);
    assert_eq!(
        matrix.cells[0],
        vec![
            Distance::Finite(0.0),
            Distance::Infinity,
            Distance::Finite(32.0)
        ]
    );
    assert_eq!(
        h.err(
            Request::SiteMatrix {
                names: vec!["nowhere".into()]
            },
            now
        ),
        ErrorCode::UnknownSite
    );
}

#[test]
fn operator_changes_reach_the_table_and_select() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.register("lo@msr_1", "msr_1", now);
    h.register("lo@msr_2", "msr_2", now);
    let report = LoadReport {
        msr: "msr_1".into(),
        load: 50,
        cpu: 10,
        calls: 1,
        max_calls: 10,
    };
    h.table.set_load("msr_1", report, now);
    h.ok(
        Request::MsrSetActive {
            msr: "msr_2".into(),
            active: false,
        },
        now,
    );
    let select = Request::Select {
        zone: "default".into(),
        site: "local".into(),
        msr: None,
        random: Some(10.0),
        explain: true,
    };
    let ResponseData::Selected(selection) = h.ok(select, now) else {
        panic!("selected")
    };
    assert_eq!(selection.msr, "msr_1");
    let explain = selection.explain.expect("explain");
    assert_eq!(explain.intervals.len(), 1);
    assert_eq!(explain.total, 50.0);

    let ResponseData::Resources { rows } = h.ok(Request::ResourceList { active_only: true }, now)
    else {
        panic!("resources")
    };
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].load, Some(50));

    let out_of_range = Request::Select {
        zone: "default".into(),
        site: "local".into(),
        msr: None,
        random: Some(50.0),
        explain: false,
    };
    assert_eq!(h.err(out_of_range, now), ErrorCode::InvalidValue);
    let unknown = Request::Select {
        zone: "default".into(),
        site: "mars".into(),
        msr: None,
        random: None,
        explain: false,
    };
    assert_eq!(h.err(unknown, now), ErrorCode::UnknownSite);
    let nothing = Request::Select {
        zone: "rtk".into(),
        site: "local".into(),
        msr: None,
        random: None,
        explain: true,
    };
    match h.run(nothing, now) {
        Response::Err(error) => {
            assert_eq!(error.code, ErrorCode::MsrNotFound);
            assert!(error.explain.is_some());
        }
        Response::Ok(data) => panic!("{data:?}"),
    }
}

#[test]
fn lists_msrs_and_subscriptions() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.register("lo@msr_1", "msr_1", now);
    h.ok(
        Request::MsrSetPerformanceCoefficient {
            msr: "msr_9".into(),
            value: 2.0,
        },
        now,
    );
    h.ok(
        Request::SubscriptionSetExpires {
            msr: "msr_1".into(),
            event: EVENT_PACKAGE.into(),
            expires: 30,
        },
        now,
    );
    let ResponseData::Msrs { msrs } = h.ok(Request::MsrList, now) else {
        panic!("msrs")
    };
    let names: Vec<_> = msrs
        .iter()
        .map(|m| (m.name.as_str(), m.registered, m.performance_coefficient))
        .collect();
    assert_eq!(names, [("msr_1", true, 1.0), ("msr_9", false, 2.0)]);
    let ResponseData::Subscriptions { rows } = h.ok(Request::SubscriptionList, now) else {
        panic!("subs")
    };
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].expires, rows[0].status.as_str()), (30, "none"));
}

#[tokio::test]
async fn socket_round_trip_and_bad_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("control.sock");
    // A stale socket file from a previous run is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("stale"));
    let listener = bind_control_socket(&path).expect("bind");
    let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, SOCKET_MODE);
    assert_eq!(
        bind_control_socket(&path).expect_err("in use").kind(),
        io::ErrorKind::AddrInUse
    );

    let (tx, mut rx) = mpsc::channel::<AdminCommand>(8);
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(listener, tx, shutdown.clone()));
    // A stand-in main loop: answers every request with the site list.
    let main_loop = tokio::spawn(async move {
        while let Some(command) = rx.recv().await {
            let data = match command.request {
                Request::SiteList => ResponseData::Sites {
                    sites: vec!["local".into()],
                },
                other => ResponseData::Sites {
                    sites: vec![format!("{other:?}")],
                },
            };
            let _ = command.reply.send(Response::Ok(data));
        }
    });

    let stream = UnixStream::connect(&path).await.expect("connect");
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    write
        .write_all(b"not json\n{\"op\":\"reboot\"}\n\n{\"op\":\"site_list\"}\n")
        .await
        .expect("write");
    let mut responses = Vec::new();
    for _ in 0..3 {
        let line = lines.next_line().await.expect("read").expect("line");
        responses.push(serde_json::from_str::<Response>(&line).expect("json"));
    }
    let [first, second, third] = <[Response; 3]>::try_from(responses).expect("three");
    assert!(matches!(
        first,
        Response::Err(ErrorBody {
            code: ErrorCode::BadRequest,
            ..
        })
    ));
    assert!(matches!(
        second,
        Response::Err(ErrorBody {
            code: ErrorCode::BadRequest,
            ..
        })
    ));
    assert_eq!(
        third,
        Response::Ok(ResponseData::Sites {
            sites: vec!["local".into()]
        })
    );

    shutdown.cancel();
    server.await.expect("server");
    main_loop.await.expect("main loop");
}

#[test]
fn bind_refuses_a_regular_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("control.sock");
    std::fs::write(&path, "x").expect("write");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = rt.block_on(async { bind_control_socket(&path).map(drop) });
    assert_eq!(
        result.expect_err("not a socket").kind(),
        io::ErrorKind::AlreadyExists
    );
}

#[tokio::test]
async fn connections_past_the_limit_get_an_error_line_and_are_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("control.sock");
    let listener = bind_control_socket(&path).expect("bind");
    let (tx, _rx) = mpsc::channel::<AdminCommand>(8);
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(listener, tx, shutdown.clone()));
    let mut idle = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        idle.push(UnixStream::connect(&path).await.expect("connect"));
    }
    // The server accepts in order: the first 256 are being served when it
    // accepts this one.
    let extra = UnixStream::connect(&path).await.expect("connect");
    let mut lines = BufReader::new(extra).lines();
    let line = lines
        .next_line()
        .await
        .expect("read")
        .expect("an error line");
    let response: Response = serde_json::from_str(&line).expect("json");
    assert!(
        matches!(
            response,
            Response::Err(ErrorBody {
                code: ErrorCode::Unavailable,
                ..
            })
        ),
        "{line}"
    );
    assert_eq!(lines.next_line().await.expect("read"), None, "then closed");
    drop(idle);
    shutdown.cancel();
    server.await.expect("server");
}
