use crate::operator::names::{ContactName, MsrName};
use std::time::Duration;

use msr_shared::event_package::LoadReport;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::model::load_table::Change;
use crate::operator::store::Store;
use crate::sip::registrar::Binding;
use crate::sip::subscriber::SubscriberConfig;

/// One control request as the shell carries it out with the file store
/// (`Shell::commit`): [`prepare`], then a change is saved and only then made
/// current (and the load table told); if the save fails the answer is
/// `store_failed` and nothing changed.
fn handle(request: Request, ctx: &mut AdminContext<'_>, store: &Store, now: Instant) -> Response {
    match prepare(request, ctx, now) {
        Outcome::Answer(response) => response,
        Outcome::Change { next, response } => {
            if let Err(error) = store.save(&next) {
                tracing::error!(cause = %error, "operator change not saved");
                return store_failed(&error);
            }
            *ctx.operator = *next;
            ctx.table.apply(ctx.operator, Change::OperatorChanged);
            response
        }
    }
}

struct Harness {
    operator: OperatorConfig,
    table: LoadTable,
    registrar: Registrar,
    subscriber: Subscriber,
    store: Store,
    defaults: Defaults,
    rng: StdRng,
    legs: crate::model::legs::LegTable,
    health: crate::model::health::HealthMonitor,
    absences: crate::model::absent::Absences,
    overload: crate::model::overload::OverloadWatch,
    /// G, as the cluster would give it (1 unless a test sets it).
    core_hosts: u32,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::new(dir.path().join("operator.json"));
        let defaults = Defaults::default();
        let config = crate::config::parse(
            "[sip]\nrealm = \"msr.local\"\n[[accounts]]\nauth_name = \"msr\"\npassword = \"msr-secret\"\n",
            "test",
        )
        .expect("config");
        let local = "sip:collector@127.0.0.1:5060".to_owned();
        Self {
            operator: OperatorConfig::new(),
            table: LoadTable::new("core1@test".into(), crate::operator::Placement::default()),
            registrar: Registrar::new(&config.sip, &config.accounts),
            subscriber: Subscriber::new(SubscriberConfig {
                local_uri: local.clone(),
                contact: local.clone(),
                default_expires: defaults.subscription_expires_secs,
            }),
            health: crate::model::health::HealthMonitor::new(config.health, local),
            absences: crate::model::absent::Absences::default(),
            overload: crate::model::overload::OverloadWatch::default(),
            store,
            defaults,
            rng: StdRng::seed_from_u64(1),
            legs: crate::model::legs::LegTable::new(crate::model::legs::DEFAULT_MAX_DURATION),
            core_hosts: 1,
            _dir: dir,
        }
    }

    fn run(&mut self, request: Request, now: Instant) -> Response {
        let mut ctx = AdminContext {
            operator: &mut self.operator,
            table: &mut self.table,
            registrar: &self.registrar,
            subscriber: &self.subscriber,
            defaults: &self.defaults,
            rng: &mut self.rng,
            legs: &mut self.legs,
            health: &mut self.health,
            absences: &mut self.absences,
            overload: &mut self.overload,
            core_hosts: self.core_hosts,
        };
        handle(request, &mut ctx, &self.store, now)
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

    /// `contact` of `msr` registers (or refreshes its registration).
    fn register(&mut self, contact: &str, msr: &str, now: Instant) {
        let uri = format!("sip:{msr}@127.0.0.1:5040");
        let binding = Binding::test(contact, msr, &uri, now + Duration::from_secs(60));
        // The registrar keeps a first binding (restore leaves a known one
        // alone); the table takes every registration, refreshes included.
        self.registrar.restore(now, vec![binding.clone()]);
        while self.registrar.poll_event().is_some() {}
        self.health
            .contact_registered(now, &ContactName::test(contact), &MsrName::test(msr), &uri);
        self.table
            .apply(&self.operator, Change::BindingChanged(&binding));
    }

    /// A NOTIFY reported `report` for its MSR at `at`.
    fn load(&mut self, report: LoadReport, at: Instant) {
        let msr = report.msr.clone();
        let change = Change::LoadReported {
            msr: &MsrName::test(&msr),
            report,
            at,
        };
        self.table.apply(&self.operator, change);
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
        (change.from, change.to),
        (
            ChangeValue::Distance(Distance::Infinity),
            ChangeValue::Distance(Distance::Finite(64.0))
        )
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
fn hello_answers_the_protocol_version() {
    let now = Instant::now();
    let mut h = Harness::new();
    let ResponseData::Hello(hello) = h.ok(Request::Hello {}, now) else {
        panic!("hello")
    };
    assert_eq!(hello.version, PROTOCOL_VERSION);
    assert!(hello.software.starts_with("msr-collector "), "{hello:?}");
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
                expires_secs: 30
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

    // Unset: the contact takes the default site again, and the site can go.
    let ResponseData::Changed(change) = h.ok(
        Request::ResourceUnset {
            contact: "lo@msr_1".into(),
            property: ContactProperty::Site,
        },
        now,
    ) else {
        panic!("changed")
    };
    assert_eq!(
        (change.from, change.to),
        (
            ChangeValue::Text("remote".into()),
            ChangeValue::Text("local".into())
        )
    );
    let ResponseData::Resources { rows } = h.ok(Request::ResourceList { active_only: false }, now)
    else {
        panic!("resources")
    };
    assert_eq!(rows[0].site, "local");
    h.ok(
        Request::SiteRemove {
            name: "remote".into(),
        },
        now,
    );
    // Unsetting what is not set changes nothing and is not an error.
    h.ok(
        Request::ResourceUnset {
            contact: "lo@msr_1".into(),
            property: ContactProperty::Zone,
        },
        now,
    );
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

/// A report of `msr` at load 50 (1 call of 10).
fn half_loaded(msr: &str) -> LoadReport {
    LoadReport {
        msr: msr.into(),
        load: 50,
        cpu: 10,
        calls: 1,
        max_calls: 10,
        ..LoadReport::default()
    }
}

/// SPEC §15 over the control protocol: an unknown codec name is
/// `invalid_value` naming it; an offer no MSR takes is `no_capable_msr`
/// naming what is missing; the resource list shows what each MSR takes.
#[test]
fn a_select_with_codecs_goes_to_an_msr_that_takes_them() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.register("lo@msr_1", "msr_1", now);
    h.register("lo@msr_2", "msr_2", now);
    h.load(
        LoadReport {
            codecs: Some(msr_shared::media::CodecList::parse_lenient("pcma,pcmu")),
            ..half_loaded("msr_1")
        },
        now,
    );
    h.load(
        LoadReport {
            codecs: Some(msr_shared::media::CodecList::parse_lenient("h264,pcma")),
            ..half_loaded("msr_2")
        },
        now,
    );
    let asking = |codecs: &[&str]| {
        Request::Select(SelectQuery {
            codecs: codecs.iter().map(|c| (*c).to_owned()).collect(),
            ..SelectQuery::new("default", "local")
        })
    };
    for _ in 0..20 {
        let ResponseData::Selected(s) = h.ok(asking(&["pcmu", "pcma", "h264"]), now) else {
            panic!("selected")
        };
        assert_eq!(s.msr, "msr_2");
    }
    match h.run(asking(&["pcma", "g728"]), now) {
        Response::Err(e) => {
            assert_eq!(e.code, ErrorCode::InvalidValue);
            assert!(e.message.contains("unknown codec `g728`"), "{}", e.message);
        }
        Response::Ok(data) => panic!("{data:?}"),
    }
    match h.run(asking(&["pcma", "t38"]), now) {
        Response::Err(e) => {
            assert_eq!(e.code, ErrorCode::NoCapableMsr);
            assert!(e.message.contains("takes t38"), "{}", e.message);
            assert!(
                e.message
                    .ends_with("(offer: pcma,t38; see msrctl select --explain)"),
                "{}",
                e.message
            );
        }
        Response::Ok(data) => panic!("{data:?}"),
    }
    // Asked with --explain, the answer carries the table: the message does
    // not send its asker to the flag they gave.
    let explained = Request::Select(SelectQuery {
        codecs: vec!["pcma".to_owned(), "t38".to_owned()],
        explain: true,
        ..SelectQuery::new("default", "local")
    });
    match h.run(explained, now) {
        Response::Err(e) => {
            assert_eq!(e.code, ErrorCode::NoCapableMsr);
            assert!(e.explain.is_some(), "{e:?}");
            assert!(e.message.ends_with("(offer: pcma,t38)"), "{}", e.message);
            assert!(!e.message.contains("--explain"), "{}", e.message);
        }
        Response::Ok(data) => panic!("{data:?}"),
    }
    let ResponseData::Resources { rows } = h.ok(Request::ResourceList { active_only: false }, now)
    else {
        panic!("resources")
    };
    let codecs: Vec<_> = rows.iter().map(|r| r.codecs.clone()).collect();
    assert_eq!(
        codecs,
        [
            Some(vec!["pcma".to_owned(), "pcmu".to_owned()]),
            Some(vec!["h264".to_owned(), "pcma".to_owned()])
        ]
    );
}

#[test]
fn operator_changes_reach_the_table_and_select() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.register("lo@msr_1", "msr_1", now);
    h.register("lo@msr_2", "msr_2", now);
    h.load(half_loaded("msr_1"), now);
    h.ok(
        Request::MsrSetActive {
            msr: "msr_2".into(),
            active: false,
        },
        now,
    );
    let select = Request::Select(SelectQuery {
        random: Some(10.0),
        explain: true,
        ..SelectQuery::new("default", "local")
    });
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

    let out_of_range = Request::Select(SelectQuery {
        random: Some(50.0),
        ..SelectQuery::new("default", "local")
    });
    assert_eq!(h.err(out_of_range, now), ErrorCode::InvalidValue);
    let unknown = Request::Select(SelectQuery::new("default", "mars"));
    assert_eq!(h.err(unknown, now), ErrorCode::UnknownSite);
    let nothing = Request::Select(SelectQuery {
        explain: true,
        ..SelectQuery::new("rtk", "local")
    });
    match h.run(nothing, now) {
        Response::Err(error) => {
            assert_eq!(error.code, ErrorCode::MsrNotFound);
            assert!(error.explain.is_some());
            assert_eq!(
                error.message,
                "zone `rtk` has no msr contact (zones with contacts: default)"
            );
        }
        Response::Ok(data) => panic!("{data:?}"),
    }
}

/// A selection's zone and other-leg MSR are names: an empty, malformed or
/// over-long one is refused, not read as "no MSR there" or "elsewhere",
/// and nothing is placed.
#[test]
fn select_refuses_malformed_zone_and_msr_names() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.register("lo@msr_1", "msr_1", now);
    h.load(half_loaded("msr_1"), now);
    let select = |zone: &str, msr: Option<&str>| {
        Request::Select(SelectQuery {
            msr: msr.map(Into::into),
            call_id: Some("refused-1".into()),
            ..SelectQuery::new(zone, "local")
        })
    };
    let long = "m".repeat(3000);
    // An empty zone is no name: it is `[defaults] zone`.
    for (zone, msr) in [
        ("a b", None),
        ("\u{1b}[31m", None),
        ("default", Some("")),
        ("default", Some("a\u{0}b")),
        ("default", Some(long.as_str())),
    ] {
        assert_eq!(
            h.err(select(zone, msr), now),
            ErrorCode::InvalidValue,
            "{zone:?} {msr:?}"
        );
    }
    assert_eq!(h.legs.len(), 0, "a refused selection places no leg");
    let ResponseData::Selected(chosen) = h.ok(select("default", Some("msr_1")), now) else {
        panic!("selected")
    };
    assert_eq!(chosen.msr, "msr_1");
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
            expires_secs: 30,
        },
        now,
    );
    let ResponseData::Msrs { msrs } = h.ok(Request::MsrList {}, now) else {
        panic!("msrs")
    };
    let names: Vec<_> = msrs
        .iter()
        .map(|m| (m.name.as_str(), m.registered, m.performance_coefficient))
        .collect();
    assert_eq!(names, [("msr_1", true, 1.0), ("msr_9", false, 2.0)]);
    let ResponseData::Subscriptions { rows } = h.ok(Request::SubscriptionList {}, now) else {
        panic!("subs")
    };
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].expires_secs, rows[0].status.as_ref()), (30, None));
}

#[test]
fn negative_zero_is_taken_as_zero() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    let ResponseData::Changed(change) = h.ok(
        Request::SiteDistance {
            a: "local".into(),
            b: "local".into(),
            distance: Distance::Finite(-0.0),
        },
        now,
    ) else {
        panic!("changed")
    };
    assert!(
        matches!(change.to, ChangeValue::Distance(Distance::Finite(v)) if v == 0.0 && v.is_sign_positive()),
        "{change:?}"
    );
    let stored = h
        .operator
        .topology()
        .distance("local", "local")
        .expect("distance");
    assert!(stored == 0.0 && stored.is_sign_positive(), "{stored}");
    match h.run(
        Request::MsrSetPerformanceCoefficient {
            msr: "m".into(),
            value: -0.0,
        },
        now,
    ) {
        Response::Err(error) => {
            assert_eq!(error.code, ErrorCode::InvalidValue);
            assert!(
                error
                    .message
                    .starts_with("invalid performance coefficient 0 for msr `m`"),
                "{}",
                error.message
            );
        }
        Response::Ok(data) => panic!("{data:?}"),
    }
    h.register("lo@msr_1", "msr_1", now);
    let ResponseData::Selected(selection) = h.ok(
        Request::Select(SelectQuery {
            random: Some(-0.0),
            ..SelectQuery::new("default", "local")
        }),
        now,
    ) else {
        panic!("selected")
    };
    assert!(selection.draw == 0.0 && selection.draw.is_sign_positive());
}

#[test]
fn huge_values_are_shown_compactly() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.ok(declare("remote"), now);
    let ResponseData::Changed(change) = h.ok(
        Request::SiteDistance {
            a: "local".into(),
            b: "remote".into(),
            distance: Distance::Finite(1e308),
        },
        now,
    ) else {
        panic!("changed")
    };
    assert_eq!(
        (change.from, change.to),
        (
            ChangeValue::Distance(Distance::Infinity),
            ChangeValue::Distance(Distance::Finite(1e308))
        )
    );
    let ResponseData::Changed(change) = h.ok(
        Request::SiteDistance {
            a: "local".into(),
            b: "remote".into(),
            distance: Distance::Finite(5e-324),
        },
        now,
    ) else {
        panic!("changed")
    };
    assert_eq!(
        (change.from, change.to),
        (
            ChangeValue::Distance(Distance::Finite(1e308)),
            ChangeValue::Distance(Distance::Finite(5e-324))
        )
    );
    let ResponseData::Changed(change) = h.ok(
        Request::MsrSetPerformanceCoefficient {
            msr: "m".into(),
            value: 0.001,
        },
        now,
    ) else {
        panic!("changed")
    };
    assert_eq!(
        (change.from, change.to),
        (ChangeValue::Number(1.0), ChangeValue::Number(0.001))
    );
    let message = |response: Response| match response {
        Response::Err(error) => error.message,
        Response::Ok(data) => panic!("{data:?}"),
    };
    assert_eq!(
        message(h.run(
            Request::MsrSetPerformanceCoefficient {
                msr: "m".into(),
                value: 1e308,
            },
            now,
        )),
        "invalid performance coefficient 1e308 for msr `m`: expected a number from 0.001 to \
         1000000"
    );
    assert_eq!(
        message(h.run(
            Request::SiteDistance {
                a: "local".into(),
                b: "remote".into(),
                distance: Distance::Finite(-1e308),
            },
            now,
        )),
        "invalid distance -1e308 between `local` and `remote`: expected a non-negative number or \
         infinity"
    );
    h.register("lo@msr_1", "msr_1", now);
    assert_eq!(
        message(h.run(
            Request::Select(SelectQuery {
                random: Some(1e308),
                ..SelectQuery::new("default", "local")
            }),
            now,
        )),
        "draw 1e308 is outside [0, 100)"
    );
}

fn leg_select(call_id: &str, leg: Option<&str>, conference: Option<&str>) -> Request {
    Request::Select(SelectQuery {
        call_id: Some(call_id.into()),
        leg: leg.map(Into::into),
        conference: conference.map(Into::into),
        ..SelectQuery::new("default", "local")
    })
}

fn selected(data: ResponseData) -> Selection {
    match data {
        ResponseData::Selected(s) => s,
        other => panic!("{other:?}"),
    }
}

fn live_legs(h: &mut Harness, now: Instant) -> Vec<(String, u32)> {
    match h.ok(Request::MsrList {}, now) {
        ResponseData::Msrs { msrs } => msrs.into_iter().map(|m| (m.name, m.live_legs)).collect(),
        other => panic!("{other:?}"),
    }
}

/// SPEC §9 stickiness: a live leg gets its MSR and contact again whatever
/// changed (loads, coefficients, the MSR set inactive, other MSRs added);
/// only when its contact is gone is it re-anchored, and the answer says so.
#[test]
fn a_live_leg_keeps_its_msr_until_the_msr_is_gone() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.register("lo@msr_1", "msr_1", now);
    let first = selected(h.ok(leg_select("call-1", None, None), now));
    assert_eq!(
        (first.msr.as_str(), first.leg),
        ("msr_1", Some(LegOutcome::New))
    );

    // Everything changes: another, emptier MSR; msr_1 drained and weighted down.
    h.register("lo@msr_2", "msr_2", now);
    h.ok(
        Request::MsrSetActive {
            msr: "msr_1".into(),
            active: false,
        },
        now,
    );
    h.ok(
        Request::MsrSetPerformanceCoefficient {
            msr: "msr_1".into(),
            value: 0.01,
        },
        now,
    );
    for _ in 0..20 {
        let again = selected(h.ok(leg_select("call-1", None, None), now));
        assert_eq!(
            (
                again.msr.as_str(),
                again.contact.as_str(),
                again.leg,
                again.rule
            ),
            (
                "msr_1",
                "lo@msr_1",
                Some(LegOutcome::Sticky),
                SelectionRule::Sticky
            )
        );
    }
    // Drain: the inactive MSR takes no new leg, keeps its live one.
    let other = selected(h.ok(leg_select("call-2", None, None), now));
    assert_eq!(other.msr, "msr_2");
    assert_eq!(
        live_legs(&mut h, now),
        vec![("msr_1".to_owned(), 1), ("msr_2".to_owned(), 1)]
    );

    // msr_1's registration lapses: the leg is re-anchored, and says so.
    let later = now + Duration::from_secs(61);
    h.register("lo@msr_2", "msr_2", later);
    let moved = selected(h.ok(leg_select("call-1", None, None), later));
    assert_eq!(
        (moved.msr.as_str(), moved.leg),
        ("msr_2", Some(LegOutcome::Reanchored))
    );
    assert_eq!(
        live_legs(&mut h, later),
        vec![("msr_1".to_owned(), 0), ("msr_2".to_owned(), 2)]
    );
}

/// Release is idempotent and says what it did; legs of one Call-ID are told
/// apart by their label.
#[test]
fn release_is_idempotent_and_names_what_it_released() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.register("lo@msr_1", "msr_1", now);
    h.ok(leg_select("call-1", Some("a"), None), now);
    h.ok(leg_select("call-1", Some("b"), None), now);
    let release = |leg: Option<&str>| Request::Release {
        call_id: "call-1".into(),
        leg: leg.map(Into::into),
    };
    let released = |data: ResponseData| match data {
        ResponseData::Released(r) => r.released,
        other => panic!("{other:?}"),
    };
    assert_eq!(released(h.ok(release(Some("a")), now)), 1);
    assert_eq!(
        released(h.ok(release(Some("a")), now)),
        0,
        "again: harmless"
    );
    assert_eq!(live_legs(&mut h, now), vec![("msr_1".to_owned(), 1)]);
    assert_eq!(
        released(h.ok(release(None), now)),
        1,
        "the rest of the call"
    );
    assert_eq!(released(h.ok(release(None), now)), 0);
    assert_eq!(live_legs(&mut h, now), vec![("msr_1".to_owned(), 0)]);
    // A leg label or conference without a Call-ID names no leg.
    let bad = Request::Select(SelectQuery {
        leg: Some("a".into()),
        ..SelectQuery::new("default", "local")
    });
    assert_eq!(h.err(bad, now), ErrorCode::BadRequest);
    // A select without a Call-ID places nothing.
    h.ok(Request::Select(SelectQuery::new("default", "local")), now);
    assert_eq!(live_legs(&mut h, now), vec![("msr_1".to_owned(), 0)]);
}

/// Conference affinity through the control protocol: the second leg of a
/// conference goes where the first went (the existing-conference rule), and
/// `msr set NAME load_limit` is validated and shown.
#[test]
fn conference_legs_follow_their_host_and_load_limits_are_set() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    for m in 1..=3 {
        h.register(&format!("lo@msr_{m}"), &format!("msr_{m}"), now);
    }
    let first = selected(h.ok(leg_select("a", None, Some("room")), now));
    assert_eq!(first.rule, SelectionRule::NewConference);
    for call in ["b", "c", "d"] {
        let next = selected(h.ok(leg_select(call, None, Some("room")), now));
        assert_eq!(
            (next.msr.as_str(), next.rule),
            (first.msr.as_str(), SelectionRule::ExistingConference)
        );
    }
    let set = |value: u32| Request::MsrSetLoadLimit {
        msr: "msr_1".into(),
        value,
    };
    assert_eq!(h.err(set(0), now), ErrorCode::InvalidValue);
    assert_eq!(h.err(set(101), now), ErrorCode::InvalidValue);
    h.ok(set(90), now);
    let ResponseData::Msrs { msrs } = h.ok(Request::MsrList {}, now) else {
        panic!("msr list")
    };
    assert_eq!(
        msrs.iter()
            .find(|m| m.name == "msr_1")
            .map(|m| m.load_limit),
        Some(90)
    );
}

#[test]
fn pooled_applies_to_named_legs_while_the_core_releases_legs() {
    use crate::config::{SelectionConfig, SelectionPolicy};
    let t0 = Instant::now();
    let pooled = SelectionConfig::default();
    let at = |secs| t0 + Duration::from_secs(secs);
    let g3 = select::Policy::Pooled {
        core_hosts: 3,
        headroom: select::Headroom::NONE,
    };
    assert_eq!(effective_policy(&pooled, true, Some(t0), at(10), 3), g3);
    // No release yet (a start), none within the window: ecss.
    assert_eq!(
        effective_policy(&pooled, true, None, t0, 3),
        select::Policy::Ecss
    );
    assert_eq!(
        effective_policy(&pooled, true, Some(t0), at(61), 3),
        select::Policy::Ecss
    );
    // No call_id: the draw, held to its own placements near the top, and
    // to the legs only while the core releases them.
    let unfollowed = |legs| select::Policy::EcssUnfollowed {
        core_hosts: 3,
        headroom: select::Headroom::NONE,
        legs,
    };
    assert_eq!(
        effective_policy(&pooled, false, Some(t0), at(1), 3),
        unfollowed(true)
    );
    assert_eq!(
        effective_policy(&pooled, false, None, t0, 3),
        unfollowed(false)
    );
    assert_eq!(
        effective_policy(&pooled, false, Some(t0), at(61), 3),
        unfollowed(false)
    );
    let ecss = SelectionConfig {
        policy: SelectionPolicy::Ecss,
        ..pooled
    };
    for names_a_leg in [true, false] {
        assert_eq!(
            effective_policy(&ecss, names_a_leg, Some(t0), at(1), 3),
            select::Policy::Ecss
        );
    }
}

#[test]
fn a_release_through_the_control_protocol_enables_pooled_and_counts_down() {
    let mut h = Harness::new();
    let t0 = Instant::now();
    assert_eq!(h.legs.last_release(), None);
    h.legs.bind(
        t0,
        crate::model::legs::LegKey {
            call_id: "c1",
            leg: None,
        },
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    let released = h.legs.release_at(t0, "c1", None, |_| {});
    assert_eq!(released, 1);
    assert_eq!(h.legs.last_release(), Some(t0));
    // A release of nothing live is not a release.
    h.legs
        .release_at(t0 + Duration::from_secs(5), "c1", None, |_| {});
    assert_eq!(h.legs.last_release(), Some(t0));
}

/// Leg keys are bounded and printable: an empty, huge or escape-laden
/// Call-ID, label or conference id is refused, and places nothing.
#[test]
fn hostile_leg_keys_are_refused() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.register("lo@msr_1", "msr_1", now);
    let long = "x".repeat(65_000);
    for (call_id, leg, conference) in [
        ("", None, None),
        (long.as_str(), None, None),
        ("a\u{1b}[31m", None, None),
        ("ok@core", Some(""), None),
        ("ok@core", None, Some("\u{0}")),
    ] {
        assert_eq!(
            h.err(leg_select(call_id, leg, conference), now),
            ErrorCode::InvalidValue,
            "{call_id:?} {leg:?} {conference:?}"
        );
    }
    let release = Request::Release {
        call_id: "a\nb".into(),
        leg: None,
    };
    assert_eq!(h.err(release, now), ErrorCode::InvalidValue);
    assert_eq!(live_legs(&mut h, now), vec![("msr_1".to_owned(), 0)]);
}

/// A release that overtakes its select (another connection, a CANCEL
/// racing its INVITE) is remembered for 32 s: the select places nothing
/// and says why (SPEC §9); after that the Call-ID may be placed again.
#[test]
fn a_select_after_its_release_places_nothing_for_32_s() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.register("lo@msr_1", "msr_1", now);
    let release = Request::Release {
        call_id: "early".into(),
        leg: Some("a".into()),
    };
    h.ok(release, now);
    let later = now + Duration::from_secs(31);
    match h.run(leg_select("early", Some("a"), None), later) {
        Response::Err(body) => {
            assert_eq!(body.code, ErrorCode::LegReleased);
            assert!(body.message.contains("early/a"), "{}", body.message);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(live_legs(&mut h, later), vec![("msr_1".to_owned(), 0)]);
    // The Call-ID's other leg was not released.
    h.ok(leg_select("early", Some("b"), None), later);
    let after = now + Duration::from_secs(32);
    let placed = selected(h.ok(leg_select("early", Some("a"), None), after));
    assert_eq!(placed.leg, Some(LegOutcome::New));
    assert_eq!(live_legs(&mut h, after), vec![("msr_1".to_owned(), 2)]);
}

/// Four clients interleave selects and releases of their own legs, some
/// releases overtaking their selects: at the end exactly the legs never
/// released are live, and every count agrees.
#[test]
fn interleaved_selects_and_releases_leave_exactly_the_unreleased_legs() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.register("lo@msr_1", "msr_1", now);
    h.register("lo@msr_2", "msr_2", now);
    let mut expected = 0;
    for n in 0..200u32 {
        for client in 0..4u32 {
            let call = format!("c{client}-{n}");
            let release = Request::Release {
                call_id: call.clone(),
                leg: None,
            };
            match (n + client) % 4 {
                // Placed, then released.
                0 => {
                    h.ok(leg_select(&call, None, None), now);
                    h.ok(release, now);
                }
                // The release overtakes the select: nothing placed.
                1 => {
                    h.ok(release, now);
                    assert_eq!(
                        h.err(leg_select(&call, None, None), now),
                        ErrorCode::LegReleased
                    );
                }
                // Never released.
                _ => {
                    h.ok(leg_select(&call, None, None), now);
                    expected += 1;
                }
            }
        }
    }
    let live: u32 = live_legs(&mut h, now).iter().map(|(_, n)| n).sum();
    assert_eq!(live, expected);
}

/// `leg_list` answers the live legs with their total, filtered, and
/// refuses a bad limit or MSR name (SPEC §9).
#[test]
fn leg_list_shows_live_legs_filtered_and_bounded() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.register("lo@msr_1", "msr_1", now);
    h.ok(leg_select("old", None, Some("room")), now);
    let later = now + Duration::from_secs(40);
    h.ok(leg_select("new", Some("b"), None), later);
    let list = |msr: Option<&str>, older: Option<u64>, limit: Option<u32>| Request::LegList {
        msr: msr.map(Into::into),
        older_than_secs: older,
        limit,
    };
    let rows = |data: ResponseData| match data {
        ResponseData::Legs(l) => l,
        other => panic!("{other:?}"),
    };
    let all = rows(h.ok(list(None, None, None), later));
    assert_eq!(all.total, 2);
    assert_eq!(
        (
            all.rows[0].call_id.as_str(),
            all.rows[0].age_secs,
            all.rows[0].conference.as_deref()
        ),
        ("old", 40, Some("room"))
    );
    assert_eq!(all.rows[1].leg.as_deref(), Some("b"));
    let old = rows(h.ok(list(Some("msr_1"), Some(20), None), later));
    assert_eq!((old.total, old.rows.len()), (1, 1));
    let one = rows(h.ok(list(None, None, Some(1)), later));
    assert_eq!((one.total, one.rows.len()), (2, 1));
    assert_eq!(rows(h.ok(list(Some("msr_2"), None, None), later)).total, 0);
    assert_eq!(
        h.err(list(None, None, Some(0)), later),
        ErrorCode::InvalidValue
    );
    assert_eq!(
        h.err(list(None, None, Some(10_001)), later),
        ErrorCode::InvalidValue
    );
    assert_eq!(
        h.err(list(Some(""), None, None), later),
        ErrorCode::InvalidValue
    );
}

fn failover_select(call_id: &str, failed: &[&str], failure: Option<&str>) -> Request {
    Request::Select(SelectQuery {
        call_id: Some(call_id.into()),
        failed: failed.iter().map(|m| (*m).to_owned()).collect(),
        failure: failure.map(Into::into),
        ..SelectQuery::new("default", "local")
    })
}

/// Three MSRs, each half loaded, at site `local`.
fn three_msrs(now: Instant) -> Harness {
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    for msr in ["msr_1", "msr_2", "msr_3"] {
        h.register(&format!("lo@{msr}"), msr, now);
        h.load(half_loaded(msr), now);
    }
    h
}

#[test]
fn failover_moves_the_leg_counts_the_failure_once_and_refuses_when_attempts_are_used() {
    let now = Instant::now();
    let mut h = three_msrs(now);
    let first = selected(h.ok(leg_select("c1", None, None), now));
    let moved = selected(h.ok(
        failover_select("c1", &[first.msr.as_str()], Some("503")),
        now,
    ));
    assert_ne!(moved.msr, first.msr);
    assert_eq!(moved.leg, Some(LegOutcome::Reanchored));
    let legs = live_legs(&mut h, now);
    let on = |legs: &[(String, u32)], msr: &str| {
        legs.iter().find(|(m, _)| m == msr).map_or(0, |(_, n)| *n)
    };
    assert_eq!(on(&legs, &first.msr), 0, "{legs:?}");
    assert_eq!(on(&legs, &moved.msr), 1, "{legs:?}");
    // The same request again (a retransmission): the leg stays where it
    // moved, and the failure is not counted twice.
    let again = selected(h.ok(
        failover_select("c1", &[first.msr.as_str()], Some("503")),
        now,
    ));
    assert_eq!(again.msr, moved.msr);
    assert_eq!(again.leg, Some(LegOutcome::Sticky));
    assert_eq!(
        h.health.tripped_until(&first.msr),
        None,
        "one 503 trips nothing"
    );
    // The second MSR times out: the first timeout trips it.
    let third = selected(h.ok(
        failover_select(
            "c1",
            &[first.msr.as_str(), moved.msr.as_str()],
            Some("timeout"),
        ),
        now,
    ));
    assert!(third.msr != first.msr && third.msr != moved.msr);
    assert!(h.health.tripped_until(&moved.msr).is_some());
    // The third fails too: three attempts used, the leg is released.
    let response = h.run(
        failover_select(
            "c1",
            &[first.msr.as_str(), moved.msr.as_str(), third.msr.as_str()],
            Some("500"),
        ),
        now,
    );
    let Response::Err(error) = response else {
        panic!("{response:?}")
    };
    assert_eq!(error.code, ErrorCode::MsrUnavailable);
    assert!(error.message.contains("3 attempts"), "{}", error.message);
    assert!(error.message.contains(&third.msr), "{}", error.message);
    assert!(live_legs(&mut h, now).iter().all(|(_, n)| *n == 0));
}

/// SPEC §14 with several core hosts (SPEC §10): a `load-limit` or `503`
/// from an MSR whose last report put it near the top is the MSR full, as
/// it said, and trips nothing however often it comes; far below the top
/// the same answers count, and three of them trip it.
#[test]
fn a_full_msr_near_the_top_that_says_so_is_not_failing() {
    let now = Instant::now();
    for (calls, failure, trips) in [
        (8, "load-limit", false),
        (9, "503", false),
        (8, "500", true),
        (1, "load-limit", true),
        (7, "503", true),
    ] {
        let mut h = Harness::new();
        h.ok(declare("local"), now);
        h.register("lo@msr_1", "msr_1", now);
        h.load(
            LoadReport {
                calls,
                load: u8::try_from(calls * 10).unwrap_or(100),
                ..half_loaded("msr_1")
            },
            now,
        );
        for i in 0..3 {
            let call_id = format!("c{i}");
            let first = selected(h.ok(leg_select(&call_id, None, None), now));
            assert_eq!(first.msr, "msr_1");
            // No MSR is left: the leg is released, the failure counted.
            let _ = h.run(failover_select(&call_id, &["msr_1"], Some(failure)), now);
        }
        assert_eq!(
            h.health.tripped_until("msr_1").is_some(),
            trips,
            "{calls} of 10 calls, {failure}"
        );
    }
}

#[test]
fn failover_with_no_msr_left_releases_the_leg_and_lists_the_failures() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    for msr in ["msr_1", "msr_2"] {
        h.register(&format!("lo@{msr}"), msr, now);
        h.load(half_loaded(msr), now);
    }
    let first = selected(h.ok(leg_select("c2", None, None), now));
    let other = if first.msr == "msr_1" {
        "msr_2"
    } else {
        "msr_1"
    };
    let response = h.run(
        failover_select("c2", &[first.msr.as_str(), other], Some("486")),
        now,
    );
    let Response::Err(error) = response else {
        panic!("{response:?}")
    };
    assert_eq!(error.code, ErrorCode::MsrUnavailable);
    assert!(error.message.contains("msr_1, msr_2") || error.message.contains("msr_2, msr_1"));
    assert!(live_legs(&mut h, now).iter().all(|(_, n)| *n == 0));
    // A 486 is the callee's, not the MSR's: nothing counted.
    assert_eq!(h.health.tripped_until(&first.msr), None);
}

/// `failure` says why the last of `failed` failed: a leg bound to an
/// earlier one (it moved on another collector, or the core lists an
/// older failure first) does not charge its MSR with that cause.
#[test]
fn a_failure_counts_only_against_the_last_of_failed() {
    let now = Instant::now();
    let mut h = three_msrs(now);
    let first = selected(h.ok(leg_select("c5", None, None), now));
    let other = ["msr_1", "msr_2", "msr_3"]
        .into_iter()
        .find(|m| *m != first.msr)
        .unwrap_or("msr_1");
    h.ok(
        failover_select("c5", &[first.msr.as_str(), other], Some("timeout")),
        now,
    );
    // The first timeout trips the MSR it is charged to: not this one.
    assert_eq!(h.health.tripped_until(&first.msr), None);
}

/// A failover that used the leg's attempts releases it; a late copy of an
/// earlier failover of that leg then places nothing (`leg_released`)
/// rather than a leg no one would release (SPEC §9, §14).
#[test]
fn a_late_failover_after_the_last_attempt_places_nothing() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    for msr in ["msr_1", "msr_2", "msr_3", "msr_4"] {
        h.register(&format!("lo@{msr}"), msr, now);
        h.load(half_loaded(msr), now);
    }
    let a = selected(h.ok(leg_select("c6", None, None), now)).msr;
    let b = selected(h.ok(failover_select("c6", &[a.as_str()], Some("486")), now)).msr;
    let c = selected(h.ok(
        failover_select("c6", &[a.as_str(), b.as_str()], Some("486")),
        now,
    ))
    .msr;
    let last = h.run(
        failover_select("c6", &[a.as_str(), b.as_str(), c.as_str()], Some("486")),
        now,
    );
    assert!(
        matches!(&last, Response::Err(e) if e.code == ErrorCode::MsrUnavailable),
        "{last:?}"
    );
    assert_eq!(
        h.err(
            failover_select("c6", &[a.as_str(), b.as_str()], Some("486")),
            now
        ),
        ErrorCode::LegReleased
    );
    assert!(live_legs(&mut h, now).iter().all(|(_, n)| *n == 0));
}

#[test]
fn failover_requests_that_make_no_sense_get_clear_errors() {
    let now = Instant::now();
    let mut h = three_msrs(now);
    let no_call_id = Request::Select(SelectQuery {
        failed: vec!["msr_1".into()],
        ..SelectQuery::new("default", "local")
    });
    assert_eq!(h.err(no_call_id, now), ErrorCode::BadRequest);
    let no_failed = failover_select("c3", &[], Some("503"));
    assert_eq!(h.err(no_failed, now), ErrorCode::BadRequest);
    let bad_cause = failover_select("c3", &["msr_1"], Some("soon"));
    assert_eq!(h.err(bad_cause, now), ErrorCode::InvalidValue);
    let bad_name = failover_select("c3", &["msr 1"], None);
    assert_eq!(h.err(bad_name, now), ErrorCode::InvalidValue);
    // An unknown MSR, for a leg never placed: placed anew, nothing counted.
    let placed = selected(h.ok(failover_select("c3", &["msr_9", "msr_1"], None), now));
    assert_ne!(placed.msr, "msr_1");
    assert_eq!(placed.leg, Some(LegOutcome::New));
    assert_eq!(h.health.tripped_until("msr_1"), None);
}

/// SPEC §14: `drained` needs the engine's calls at 0. A registered MSR
/// with no report yet (a collector restarted with its bindings and no
/// legs) has calls not known to be 0: it stays `draining` until its
/// report says 0.
#[test]
fn a_registered_msr_without_a_report_is_draining_not_drained() {
    use msr_shared::admin::DrainState;
    let now = Instant::now();
    let mut h = Harness::new();
    h.ok(declare("local"), now);
    h.register("lo@msr_1", "msr_1", now);
    h.ok(
        Request::MsrSetActive {
            msr: "msr_1".into(),
            active: false,
        },
        now,
    );
    let drain_of = |h: &mut Harness| match h.ok(Request::MsrList {}, now) {
        ResponseData::Msrs { msrs } => msrs
            .into_iter()
            .find(|m| m.name == "msr_1")
            .and_then(|m| m.drain),
        other => panic!("{other:?}"),
    };
    assert_eq!(drain_of(&mut h), Some(DrainState::Draining));
    h.load(
        LoadReport {
            calls: 0,
            ..half_loaded("msr_1")
        },
        now,
    );
    assert_eq!(drain_of(&mut h), Some(DrainState::Drained));
}

/// SPEC §14 with §9: a failover that the core's release of the same live
/// leg overtook (two connections, a CANCEL racing the engine's failure)
/// places nothing, or the leg would live until its maximum duration; a
/// release of the whole Call-ID covers each labelled leg.
#[test]
fn a_failover_after_the_release_of_its_live_leg_places_nothing() {
    let now = Instant::now();
    let mut h = three_msrs(now);
    let first = selected(h.ok(leg_select("c1", None, None), now));
    h.ok(
        Request::Release {
            call_id: "c1".into(),
            leg: None,
        },
        now,
    );
    let late = failover_select("c1", &[first.msr.as_str()], Some("503"));
    assert_eq!(h.err(late, now), ErrorCode::LegReleased);
    assert!(live_legs(&mut h, now).iter().all(|(_, n)| *n == 0));

    for label in ["a", "b"] {
        h.ok(leg_select("c2", Some(label), None), now);
    }
    h.ok(
        Request::Release {
            call_id: "c2".into(),
            leg: None,
        },
        now,
    );
    let late = Request::Select(SelectQuery {
        call_id: Some("c2".into()),
        leg: Some("a".into()),
        failed: vec!["msr_1".into()],
        ..SelectQuery::new("default", "local")
    });
    assert_eq!(h.err(late, now), ErrorCode::LegReleased);
    assert!(live_legs(&mut h, now).iter().all(|(_, n)| *n == 0));
    // After the memory, a failover for a Call-ID with no live leg places
    // it anew (SPEC §14: another collector's leg, a restart).
    let later = now + crate::model::legs::EARLY_RELEASE_MEMORY;
    let placed = selected(h.ok(failover_select("c1", &[first.msr.as_str()], None), later));
    assert_eq!(placed.leg, Some(LegOutcome::New));
}

/// Issue 44: zones are labels (SPEC §6), never declared, so `zone_list`
/// names the default zone, the zones contacts are in and the zones set
/// on contacts not known now, each with its contacts.
#[test]
fn zone_list_names_every_zone_with_its_contacts() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.register("lo@msr_1", "msr_1", now);
    h.register("lo@msr_2", "msr_2", now);
    h.ok(
        Request::ResourceSetZone {
            contact: "lo@msr_2".into(),
            zone: "rtk".into(),
        },
        now,
    );
    h.ok(
        Request::ResourceSetZone {
            contact: "eth0@msr_9".into(),
            zone: "spb".into(),
        },
        now,
    );
    let ResponseData::Zones { zones } = h.ok(Request::ZoneList {}, now) else {
        panic!("zones")
    };
    let shown: Vec<(&str, u32, bool)> = zones
        .iter()
        .map(|z| (z.name.as_str(), z.contacts, z.default))
        .collect();
    assert_eq!(
        shown,
        [("default", 1, true), ("rtk", 1, false), ("spb", 0, false)]
    );
}

/// Issue 44: `msr set` for a name no MSR registered with is kept (it
/// applies when the MSR registers), and the answer says it is not
/// registered; for a registered MSR it says it is. The same for a
/// contact's `resource set`.
#[test]
fn a_change_to_an_msr_says_whether_it_is_registered() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.register("lo@msr_1", "msr_1", now);
    let registered = |data: ResponseData| match data {
        ResponseData::Changed(change) => change.msr_registered,
        other => panic!("{other:?}"),
    };
    let set = |msr: &str| Request::MsrSetActive {
        msr: msr.into(),
        active: false,
    };
    assert_eq!(registered(h.ok(set("nosuch"), now)), Some(false));
    assert_eq!(registered(h.ok(set("msr_1"), now)), Some(true));
    let expires = Request::SubscriptionSetExpires {
        msr: "nosuch".into(),
        event: EVENT_PACKAGE.into(),
        expires_secs: 30,
    };
    assert_eq!(registered(h.ok(expires, now)), Some(false));
    // The setting is kept: msr list has it, not registered.
    let ResponseData::Msrs { msrs } = h.ok(Request::MsrList {}, now) else {
        panic!("msrs")
    };
    let nosuch = msrs.iter().find(|m| m.name == "nosuch").expect("kept");
    assert!(!nosuch.registered && !nosuch.active);
    // `resource set` for a contact that is not registered (a mistyped
    // interface or MSR) says so too; for a registered one it says it is.
    let zone = |contact: &str| Request::ResourceSetZone {
        contact: contact.into(),
        zone: "rtk".into(),
    };
    assert_eq!(registered(h.ok(zone("eth0@msr_1"), now)), Some(false));
    assert_eq!(registered(h.ok(zone("lo@msr_1"), now)), Some(true));
}

/// `msr forget` of an MSR nobody knows says so (`msr_not_found`); of a
/// registered one, that it is not gone (`invalid_value`).
#[test]
fn forget_tells_an_unknown_msr_from_a_registered_one() {
    let now = Instant::now();
    let mut h = Harness::new();
    h.register("lo@msr_1", "msr_1", now);
    let forget = |msr: &str| Request::MsrForget { msr: msr.into() };
    assert_eq!(h.err(forget("msr_9"), now), ErrorCode::MsrNotFound);
    assert_eq!(h.err(forget("msr_1"), now), ErrorCode::InvalidValue);
    let Response::Err(unknown) = h.run(forget("msr_9"), now) else {
        panic!("refused")
    };
    assert!(
        unknown.message.starts_with("no msr `msr_9` is known"),
        "{unknown:?}"
    );
}

#[test]
fn a_refusal_in_overload_names_the_headroom() {
    let query = |headroom| Query {
        zone: "z".into(),
        site: "s".into(),
        msr: None,
        admission: select::Admission::Plain,
        policy: select::Policy::Pooled {
            core_hosts: 3,
            headroom: select::Headroom::drawn(headroom, 0),
        },
        now: Instant::now(),
        failed: Vec::new(),
        needs: Default::default(),
    };
    let plain = refusal_message(Refusal::MsrOverloaded, &query(0), false);
    assert!(!plain.contains("headroom"), "{plain}");
    let m = refusal_message(Refusal::MsrOverloaded, &query(1), false);
    assert!(
        m.contains("less the headroom") && m.contains("up to 1 session of"),
        "{m}"
    );
    // A select without a leg says what it counted (SPEC §10).
    let fallback = |headroom| Query {
        policy: select::Policy::EcssUnfollowed {
            core_hosts: 3,
            headroom: select::Headroom::drawn(headroom, 0),
            legs: false,
        },
        ..query(0)
    };
    let m = refusal_message(Refusal::MsrOverloaded, &fallback(0), false);
    assert!(
        m.ends_with(
            "is at or above its load limit by its last report and the selections without a call_id sent to it since"
        ),
        "{m}"
    );
    assert!(!m.contains("overload"), "{m}");
    let m = refusal_message(Refusal::MsrOverloaded, &fallback(2), false);
    assert!(m.contains("up to 2 sessions of each msr"), "{m}");
    // One line of single spaces, as it reaches the log and the HTTP body.
    for m in [fallback(0), fallback(1)].map(|q| refusal_message(Refusal::MsrOverloaded, &q, false))
    {
        assert!(!m.contains("  ") && !m.contains('\n'), "{m:?}");
    }
}

/// A refusal points at `msrctl select --explain` only when its answer
/// does not already carry the explanation (the request asked for it).
#[test]
fn a_refusal_names_the_explain_flag_only_when_not_explained() {
    let query = Query {
        zone: "z".into(),
        site: "s".into(),
        msr: None,
        admission: select::Admission::Plain,
        policy: select::Policy::Pooled {
            core_hosts: 1,
            headroom: select::Headroom::NONE,
        },
        now: Instant::now(),
        failed: Vec::new(),
        needs: Default::default(),
    };
    let plain = refusal_message(Refusal::MsrUnhealthy, &query, false);
    assert!(
        plain.ends_with("are unhealthy (see msrctl select --explain)"),
        "{plain}"
    );
    let explained = refusal_message(Refusal::MsrUnhealthy, &query, true);
    assert!(explained.ends_with("are unhealthy"), "{explained}");
    let together = Refusal::NoCapableMsr {
        lack: None,
        needs: Default::default(),
        conference_host: false,
    };
    let plain = refusal_message(together, &query, false);
    assert!(plain.ends_with(" (see msrctl select --explain)"), "{plain}");
    let explained = refusal_message(together, &query, true);
    assert!(explained.ends_with(" together"), "{explained}");
}

/// `--explain` and `--random` without a call_id place nothing (SPEC §10,
/// interfaces.md "Call legs"): with G > 1 they leave the zone's overload
/// window alone, so an operator asking why cannot put the zone in
/// overload (and a headroom on every core's legs); the same selects
/// without them are placements and are recorded.
#[test]
fn explain_and_random_without_a_leg_record_nothing_in_the_overload_window() {
    let now = Instant::now();
    let mut h = three_msrs(now);
    h.core_hosts = 3;
    for msr in ["msr_1", "msr_2", "msr_3"] {
        h.load(
            LoadReport {
                load: 100,
                calls: 10,
                ..half_loaded(msr)
            },
            now,
        );
    }
    let explain = Request::Select(SelectQuery {
        explain: true,
        ..SelectQuery::new("default", "local")
    });
    let random = Request::Select(SelectQuery {
        random: Some(0.0),
        ..SelectQuery::new("default", "local")
    });
    for _ in 0..40 {
        assert_eq!(h.err(explain.clone(), now), ErrorCode::MsrOverloaded);
        assert_eq!(h.err(random.clone(), now), ErrorCode::MsrOverloaded);
    }
    assert!(!h.overload.is_overloaded("default"));
    assert!(h.overload.take_changes().is_empty());
    // Selects that would send the session are refusals of the zone.
    for _ in 0..40 {
        assert_eq!(
            h.err(Request::Select(SelectQuery::new("default", "local")), now),
            ErrorCode::MsrOverloaded
        );
    }
    assert!(h.overload.is_overloaded("default"));
}

/// The copy the HTTP API draws read-only selections from
/// (`core::snapshot`) answers a select without a leg exactly as the core
/// does with the same draws, and leaves to the core what it must answer.
#[test]
fn a_snapshot_answers_a_select_without_a_leg_as_the_core_does() {
    use crate::core::snapshot::Snapshot;
    use crate::model::estimate::UNFOLLOWED_HORIZON;
    use crate::model::overload::OverloadWatch;
    let now = Instant::now();
    let mut h = three_msrs(now);
    h.load(
        LoadReport {
            calls: 9,
            load: 90,
            ..half_loaded("msr_2")
        },
        now,
    );
    let copy_of = |h: &Harness| {
        Snapshot::new(
            h.table.clone(),
            h.operator.topology().clone(),
            h.defaults.selection,
            (1, OverloadWatch::default(), h.legs.last_release()),
        )
    };
    let plain = SelectQuery::new("default", "local");
    let unnamed = SelectQuery::new("", "");
    let other_leg = SelectQuery {
        msr: Some("msr_3".into()),
        ..SelectQuery::new("default", "local")
    };
    let mut declined = 0;
    for query in [plain, unnamed, other_leg] {
        for seed in 0..64 {
            let snapshot = copy_of(&h);
            h.rng = StdRng::seed_from_u64(seed);
            let core = selected(h.ok(Request::Select(query.clone()), now));
            let copy = snapshot.select(&query, now, &mut StdRng::seed_from_u64(seed));
            // msr_2 reported 9 of 10, near its top: there the fallback
            // counts its session (SPEC §10), so the core draws.
            if core.msr == "msr_2" && copy.is_none() {
                declined += 1;
                h.table.handle_timeout(now + UNFOLLOWED_HORIZON);
                continue;
            }
            assert_eq!(copy.as_ref(), Some(&core), "{query:?}, seed {seed}");
        }
    }
    assert!(declined > 0);
    let snapshot = copy_of(&h);
    // What changes state, needs the core's wording or refuses: the core's.
    let to_the_core = [
        SelectQuery {
            call_id: Some("c1".into()),
            ..SelectQuery::new("default", "local")
        },
        SelectQuery {
            explain: true,
            ..SelectQuery::new("default", "local")
        },
        SelectQuery {
            random: Some(1.0),
            ..SelectQuery::new("default", "local")
        },
        SelectQuery {
            codecs: vec!["pcma".into()],
            ..SelectQuery::new("default", "local")
        },
        SelectQuery {
            failed: vec!["msr_1".into()],
            ..SelectQuery::new("default", "local")
        },
        SelectQuery::new("no such zone", "local"),
        SelectQuery::new("elsewhere", "local"),
        SelectQuery::new("default", "undeclared"),
    ];
    for query in to_the_core {
        assert_eq!(
            snapshot.select(&query, now, &mut StdRng::seed_from_u64(1)),
            None,
            "{query:?}"
        );
    }
}

/// A core that places legs but never releases them (so named legs get the
/// `ecss` draw, SPEC §10): its legs pile up in this collector's count
/// until their maximum duration, long after the calls ended. A select
/// without a call_id must not be held to that count: here every MSR
/// reports 1 call of 10, yet 60 unreleased legs had every select without
/// a call_id refused `msr_overloaded`. Once the core releases, the legs
/// it keeps are live and count again.
#[test]
fn a_select_without_a_leg_ignores_legs_a_core_never_releases() {
    let now = Instant::now();
    let mut h = three_msrs(now);
    for n in 0..60 {
        selected(h.ok(leg_select(&format!("c{n}"), None, None), now));
    }
    let later = now + Duration::from_secs(5);
    for msr in ["msr_1", "msr_2", "msr_3"] {
        h.load(half_loaded(msr), later);
    }
    let unnamed = Request::Select(SelectQuery::new("default", "local"));
    let mut picks = std::collections::BTreeSet::new();
    for n in 0..30 {
        let at = later + Duration::from_millis(100 + n);
        picks.insert(selected(h.ok(unnamed.clone(), at)).msr);
    }
    assert_eq!(picks.len(), 3, "every msr at 1 of 10 takes one: {picks:?}");
    // The core releases one: the 59 left are its live legs, about 20 on
    // each msr (the draw's share), over their 10 sessions.
    let released = later + Duration::from_secs(1);
    h.ok(
        Request::Release {
            call_id: "c0".into(),
            leg: None,
        },
        released,
    );
    assert_eq!(h.err(unnamed, released), ErrorCode::MsrOverloaded);
}
