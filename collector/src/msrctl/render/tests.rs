use super::*;
use msr_shared::subscription::SubscriptionState;

fn f(value: f64) -> Distance {
    Distance::Finite(value)
}

const INF: Distance = Distance::Infinity;

#[test]
fn legs_are_a_table_with_the_total() {
    let leg = |call_id: &str, age_secs| msr_shared::admin::LegInfo {
        call_id: call_id.into(),
        leg: Some("a".into()),
        msr: "msr_1".into(),
        contact: "lo@msr_1".into(),
        age_secs,
        conference: None,
    };
    let data = LegRows {
        total: 3,
        rows: vec![leg("c1", 120), leg("c2", 5)],
    };
    let text = legs(&data);
    for needle in [
        "Call-ID",
        "Conference",
        "│ c1 ",
        "120",
        "2 of 3 live legs shown",
    ] {
        assert!(text.contains(needle), "{needle}:\n{text}");
    }
    let all = LegRows {
        total: 2,
        rows: data.rows.clone(),
    };
    assert!(legs(&all).ends_with(" 2 live legs.\n"), "{}", legs(&all));
}

#[test]
fn seed_matrix_first_example() {
    let data = SiteMatrix {
        sites: vec![
            "local".into(),
            "site_102".into(),
            "site_103".into(),
            "site_104".into(),
        ],
        columns: vec![0, 1, 2, 3],
        cells: vec![
            vec![f(0.0), f(10.0), f(20.0), INF],
            vec![f(10.0), INF, INF, INF],
            vec![f(20.0), INF, INF, INF],
            vec![INF, INF, INF, f(0.0)],
        ],
    };
    let expected = "\
┌───────────┬───┬────┬────┬────┬───┐
│ Site-name │ # │ 1  │ 2  │ 3  │ 4 │
├───────────┼───┼────┼────┼────┼───┤
│ local     │ 1 │  0 │ 10 │ 20 │   │
│ site_102  │ 2 │ 10 │    │    │   │
│ site_103  │ 3 │ 20 │    │    │   │
│ site_104  │ 4 │    │    │    │ 0 │
└───────────┴───┴────┴────┴────┴───┘

Legend:
 empty distance - infinity distance between sites.
";
    assert_eq!(matrix(&data), expected);
}

#[test]
fn seed_matrix_second_example_with_named_columns() {
    let data = SiteMatrix {
        sites: vec![
            "local".into(),
            "remote".into(),
            "remote_1".into(),
            "remote_side".into(),
        ],
        columns: vec![0, 1, 2],
        cells: vec![
            vec![f(0.0), INF, f(32.0)],
            vec![INF, f(0.0), INF],
            vec![f(32.0), INF, f(0.0)],
            vec![INF, INF, INF],
        ],
    };
    let expected = "\
┌─────────────┬───┬────┬───┬────┐
│  Site-name  │ # │ 1  │ 2 │ 3  │
├─────────────┼───┼────┼───┼────┤
│ local       │ 1 │  0 │   │ 32 │
│ remote      │ 2 │    │ 0 │    │
│ remote_1    │ 3 │ 32 │   │  0 │
│ remote_side │ 4 │    │   │    │
└─────────────┴───┴────┴───┴────┘

Legend:
 empty distance - infinity distance between sites.
";
    assert_eq!(matrix(&data), expected);
}

#[test]
fn seed_msr_set_and_subscription_set() {
    let msr = Change {
        entity: ChangedEntity::Msr,
        name: "msr_1".into(),
        property: ChangedProperty::PerformanceCoefficient,
        from: ChangeValue::Number(1.0),
        to: ChangeValue::Number(2.0),
        msr_registered: None,
    };
    assert_eq!(
        change(&msr),
        " msr   msr_1\n set   performance_coefficient\n from  1.0\n to    2.0\n"
    );
    let contact = Change {
        entity: ChangedEntity::Contact,
        name: "lo@msr_1".into(),
        property: ChangedProperty::Site,
        from: ChangeValue::Text("local".into()),
        to: ChangeValue::Text("remote_side".into()),
        msr_registered: None,
    };
    // The keys line up under the longest.
    assert_eq!(
        change(&contact),
        " contact lo@msr_1\n set     site\n from    local\n to      remote_side\n"
    );
    let sub = Change {
        entity: ChangedEntity::Subscription,
        name: "msr_1 eltex-call-count".into(),
        property: ChangedProperty::Expires,
        from: ChangeValue::Count(60),
        to: ChangeValue::Count(30),
        msr_registered: None,
    };
    assert_eq!(
        change(&sub),
        " msr   msr_1\n event eltex-call-count\n set   expires\n from  60\n to    30\n"
    );
    let site = Change {
        entity: ChangedEntity::Site,
        name: "remote_1 local".into(),
        property: ChangedProperty::Distance,
        from: ChangeValue::Distance(Distance::Infinity),
        to: ChangeValue::Distance(Distance::Finite(64.0)),
        msr_registered: None,
    };
    assert_eq!(
        change(&site),
        "Distance between remote_1 and local changed to: 64.\n"
    );
}

#[test]
fn seed_msr_list_layout() {
    let list = [
        MsrInfo {
            name: "msr_1".into(),
            performance_coefficient: 2.0,
            active: true,
            registered: true,
            load_limit: 100,
            live_legs: 0,
            oldest_leg_secs: None,
            health: None,
            health_since_unix: None,
            engine_calls: None,
            gone_since_unix: None,
            gone_cause: None,
            gone_while_serving: false,
            drain: None,
        },
        MsrInfo {
            name: "msr_2".into(),
            performance_coefficient: 1.0,
            active: true,
            registered: true,
            load_limit: 100,
            live_legs: 0,
            oldest_leg_secs: None,
            health: None,
            health_since_unix: None,
            engine_calls: None,
            gone_since_unix: None,
            gone_cause: None,
            gone_while_serving: false,
            drain: None,
        },
    ];
    let out = msrs(&list);
    assert!(
        out.contains("│ Name  │ Performance │ Active │ Registered │"),
        "{out}"
    );
    assert!(
        out.contains("│       │ coefficient │        │            │"),
        "{out}"
    );
    assert!(
        out.contains("│ msr_1 │         2.0 │ true   │ true       │"),
        "{out}"
    );
}

#[test]
fn subscription_list_columns_and_timestamp() {
    // Issue 44: a time says its zone.
    assert_eq!(timestamp(1_557_875_794), "2019/05/14 23:16:34 UTC");
    assert_eq!(timestamp(0), "1970/01/01 00:00:00 UTC");
    let rows = [SubscriptionInfo {
        msr: "msr_1".into(),
        registered: true,
        event: "eltex-call-count".into(),
        active: true,
        expires_secs: 30,
        notify_count: 0,
        last_notify_unix: Some(1_557_875_794),
        event_id: "0615cfa9332fdbbd".into(),
        status: Some(SubscriptionState::Active),
    }];
    let out = subscriptions(&rows);
    let expected_row =
        "│ msr_1 │ true        │ eltex-call-count │ true   │      30 │      0 │ 2019/05/14 23:16:34 UTC │ 0615cfa9332fdbbd │ active │";
    assert!(out.contains(expected_row), "{out}");
    // The title names what is listed (the seed's read "Subscriptions on msr").
    assert!(
        out.starts_with(" Load subscriptions to the MSRs:\n┌"),
        "{out}"
    );
    assert!(
        out.contains("│  MSR  │   Is MSR    │      Event       │ Active │ Expires │ Notify │"),
        "{out}"
    );
}

#[test]
fn resource_rows_show_node_once() {
    let row = |msr: &str| ResourceInfo {
        node: "core1@ecss1".into(),
        msr: msr.into(),
        version: Some("3.14.0.156".into()),
        performance_coefficient: 2.0,
        load: Some(0),
        cpu: Some(0),
        calls: Some(0),
        max_calls: Some(8192),
        report_age_secs: Some(3),
        stale: false,
        zone: "default".into(),
        site: "local".into(),
        active: true,
        contact: format!("bond1.2@{msr}"),
        uri: String::new(),
        engine_uri: Some("sip:192.168.2.21:5040".into()),
        mcc: Some("192.168.2.21:5700".into()),
        status: msr_shared::admin::RegistrationStatus::Registered,
        expires_secs: 58,
        subscription: Some(SubscriptionState::Active),
        live_legs: 0,
        health: msr_shared::admin::HealthState::Healthy,
        health_since_unix: 0,
        health_secs: 3,
        codecs: None,
    };
    let out = resources(&[row("msr_1"), row("msr_2")], true);
    assert!(out.starts_with("  Active media resource list:\n┌"), "{out}");
    assert_eq!(out.matches("core1@ecss1").count(), 1, "{out}");
    assert!(
        out.contains("│ 192.168.2.21:5700 │ sip:192.168.2.21:5040 │ true "),
        "{out}"
    );
    assert!(
        out.contains("│ bond1.2@msr_2 │ registered │      58 │"),
        "{out}"
    );
}

#[test]
fn the_default_resource_list_fits_120_columns_and_wide_has_every_column() {
    let row = |msr: &str, contact: &str| ResourceInfo {
        node: "core1@ecss1.example.net".into(),
        msr: msr.into(),
        version: Some("msr-agent/0.2.0".into()),
        performance_coefficient: 1.0,
        load: Some(100),
        cpu: Some(40),
        calls: Some(10),
        max_calls: Some(100),
        report_age_secs: Some(12345),
        stale: false,
        zone: "zone-east".into(),
        site: "msk-2".into(),
        active: true,
        contact: contact.into(),
        uri: "sip:msr_10@192.168.200.210:5070".into(),
        engine_uri: Some("sip:192.168.200.210:5040".into()),
        mcc: Some("192.168.200.210:5700".into()),
        status: msr_shared::admin::RegistrationStatus::Registered,
        expires_secs: 3600,
        subscription: Some(SubscriptionState::Terminated(None)),
        live_legs: 12345,
        health: msr_shared::admin::HealthState::Unreachable,
        health_since_unix: 0,
        health_secs: 86400,
        // The seed's `<codec>` (SPEC §2), in its priority order.
        codecs: Some(
            ["pcma", "h264", "t38", "pcmu", "h263-1998", "g722"]
                .map(String::from)
                .to_vec(),
        ),
    };
    let rows = [
        row("msr_10", "bond1.200@msr_10"),
        row("msr_11", "eth0@msr_11"),
    ];
    let data = ResponseData::Resources {
        rows: rows.to_vec(),
    };
    let narrow = response(&data, ResourceView::default());
    let widest = narrow.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(widest <= 120, "{widest} columns:\n{narrow}");
    assert!(
        narrow.starts_with(
            "  Media resource list (core1@ecss1.example.net, zone zone-east; --wide for every column):\n"
        ),
        "{narrow}"
    );
    assert!(
        narrow.contains(
            "│ bond1.200@msr_10 │  100 │  40 │ 10/100 │ 3a 2v t38 │ true   │ msk-2 │ registered │  12345 │"
        ),
        "{narrow}"
    );
    let wide = response(
        &data,
        ResourceView {
            active_only: false,
            wide: true,
        },
    );
    for column in ["Cc-address", "Engine", "Expires", "Stale"] {
        assert!(
            wide.contains(column) && !narrow.contains(column),
            "{column}:\n{wide}"
        );
    }
    // The load's companions stay: --wide is every column.
    for column in ["│ CPU │", "Calls"] {
        assert!(wide.contains(column), "{column}:\n{wide}");
    }
    // The registration's countdown says so (the seed's header read
    // "Expired"; issue 44).
    assert!(!wide.contains("Expired"), "{wide}");
    assert!(
        wide.contains("│ Expires │") && wide.contains("│  in, s  │"),
        "{wide}"
    );
    assert!(wide.contains("sip:192.168.200.210:5040"), "{wide}");
}

#[test]
fn huge_and_tiny_numbers_are_compact() {
    // `{}` of 1e308 is a 309-digit number, which made a one-cell matrix
    // 300 characters wide.
    let data = SiteMatrix {
        sites: vec!["a".into(), "b".into()],
        columns: vec![0, 1],
        cells: vec![vec![f(-0.0), f(1e308)], vec![f(1e308), f(5e-324)]],
    };
    let out = matrix(&data);
    assert!(out.contains("│ a         │ 1 │     0 │  1e308 │"), "{out}");
    assert!(out.contains("│ b         │ 2 │ 1e308 │ 5e-324 │"), "{out}");
    assert!(out.lines().all(|l| l.chars().count() < 60), "{out}");
    let list = [MsrInfo {
        name: "m".into(),
        performance_coefficient: 1e300,
        active: true,
        registered: false,
        load_limit: 100,
        live_legs: 0,
        oldest_leg_secs: None,
        health: None,
        health_since_unix: None,
        engine_calls: None,
        gone_since_unix: None,
        gone_cause: None,
        gone_while_serving: false,
        drain: None,
    }];
    let out = msrs(&list);
    assert!(out.contains("│ m    │       1e300 │"), "{out}");
    let selected = Selection {
        msr: "m".into(),
        contact: "lo@m".into(),
        uri: "sip:m@127.0.0.1".into(),
        engine_uri: None,
        mcc: None,
        media_bridge: false,
        distance: Distance::Finite(1e20),
        draw: 5e-324,
        total: 1e17,
        explain: None,
        rule: msr_shared::admin::SelectionRule::Draw,
        leg: None,
    };
    let out = selection(&selected);
    assert!(out.contains(" distance     1e20\n"), "{out}");
    assert!(out.contains(" draw         5e-324 of 1e17\n"), "{out}");
}

#[test]
fn explain_lists_every_contact_with_health_and_outcome() {
    use msr_shared::admin::{ExplainCandidate, ExplainOutcome, HealthState};
    let candidate = |contact: &str, health, outcome, weight| ExplainCandidate {
        contact: contact.into(),
        msr: contact.split_once('@').map_or("", |(_, m)| m).into(),
        site: "local".into(),
        distance: Distance::Finite(0.0),
        health,
        outcome,
        weight,
        lacks: None,
    };
    let e = Explain {
        zone: "default".into(),
        site: "local".into(),
        msr: None,
        media_bridge: false,
        candidates: vec![
            candidate(
                "lo@msr_1",
                HealthState::Healthy,
                ExplainOutcome::Kept,
                Some(60.0),
            ),
            candidate(
                "lo@msr_2",
                HealthState::Healthy,
                ExplainOutcome::Full,
                Some(0.0),
            ),
            candidate(
                "lo@msr_3",
                HealthState::Unreachable,
                ExplainOutcome::Unreachable,
                None,
            ),
        ],
        min_distance: Some(Distance::Finite(0.0)),
        intervals: vec![],
        total: 60.0,
        draw: None,
        rule: SelectionRule::Draw,
        threshold: None,
        codecs: Vec::new(),
    };
    let out = explain(&e);
    assert!(
        out.contains(
            "│ lo@msr_1 │ msr_1 │ local │        0 │ healthy     │ kept        │     60 │"
        ),
        "{out}"
    );
    assert!(out.contains("│ full        │      0 │"), "{out}");
    assert!(
        out.contains("│ unreachable │ unreachable │        │"),
        "{out}"
    );
}

#[test]
fn explain_shows_intervals() {
    let e = Explain {
        zone: "default".into(),
        site: "local".into(),
        msr: None,
        media_bridge: false,
        candidates: vec![],
        min_distance: Some(Distance::Finite(0.0)),
        intervals: vec![msr_shared::admin::Interval {
            msr: "msr_2".into(),
            contact: "con_1@msr_2".into(),
            load: 40,
            reported: true,
            stale: false,
            performance_coefficient: 0.9,
            weight: 54.00000000000001,
            bottom: 45.0,
            top: 99.00000000000001,
        }],
        total: 147.0,
        draw: Some(58.0),
        rule: msr_shared::admin::SelectionRule::Draw,
        threshold: None,
        codecs: Vec::new(),
    };
    let out = explain(&e);
    assert!(
        out.contains("│ msr_2 │ con_1@msr_2 │   40 │  0.9 │     54 │ [45, 99) │"),
        "{out}"
    );
    assert!(out.contains("Draw 58 in [0, 147)"), "{out}");
}

/// Issue 44: `zone list`, shaped as `site list`, with each zone's contacts.
#[test]
fn zone_list_is_a_table_with_the_default_marked() {
    let out = response(
        &ResponseData::Zones {
            zones: vec![
                msr_shared::admin::ZoneInfo {
                    name: "default".into(),
                    contacts: 2,
                    default: true,
                },
                msr_shared::admin::ZoneInfo {
                    name: "rtk".into(),
                    contacts: 0,
                    default: false,
                },
            ],
        },
        ResourceView::default(),
    );
    assert!(out.starts_with("List of all zones:\n┌"), "{out}");
    assert!(out.contains("│ default │        2 │ true    │"), "{out}");
    assert!(out.contains("│ rtk     │        0 │ false   │"), "{out}");
}

/// Issue 44: `msr set` for a name no MSR has registered with is kept, and
/// the answer says so; `msr list` shows such settings apart, not as a
/// media server.
#[test]
fn a_setting_for_an_unregistered_msr_is_said_and_listed_apart() {
    let set = Change {
        entity: ChangedEntity::Msr,
        name: "nosuch".into(),
        property: ChangedProperty::Active,
        from: ChangeValue::Flag(true),
        to: ChangeValue::Flag(false),
        msr_registered: Some(false),
    };
    assert_eq!(
        change(&set),
        " msr   nosuch\n set   active\n from  true\n to    false\n note  no msr nosuch is \
         registered: the setting is kept and applies when it registers (msrctl msr list shows \
         the registered msrs)\n"
    );
    let registered = Change {
        msr_registered: Some(true),
        ..set.clone()
    };
    assert!(!change(&registered).contains("note"));
    let contact = Change {
        entity: ChangedEntity::Contact,
        name: "eth0@msr_1".into(),
        property: ChangedProperty::Zone,
        from: ChangeValue::Text("default".into()),
        to: ChangeValue::Text("rtk".into()),
        msr_registered: Some(false),
    };
    assert!(
        change(&contact)
            .contains(" note    no contact eth0@msr_1 is registered: the setting is kept"),
        "{}",
        change(&contact)
    );
    let sub = Change {
        entity: ChangedEntity::Subscription,
        name: "nosuch eltex-call-count".into(),
        property: ChangedProperty::Expires,
        from: ChangeValue::Count(60),
        to: ChangeValue::Count(30),
        msr_registered: Some(false),
    };
    assert!(change(&sub).ends_with(" note  no msr nosuch is registered: the setting is kept and applies when it registers (msrctl msr list shows the registered msrs)\n"));

    let row = |name: &str, registered: bool| MsrInfo {
        name: name.into(),
        performance_coefficient: 1.0,
        active: registered,
        registered,
        load_limit: 100,
        live_legs: 0,
        oldest_leg_secs: None,
        health: registered.then_some(HealthState::Healthy),
        health_since_unix: None,
        engine_calls: None,
        gone_since_unix: None,
        gone_cause: None,
        gone_while_serving: false,
        drain: None,
    };
    let out = msrs(&[row("msr_1", true), row("nosuch", false)]);
    let (servers, waiting) = out
        .split_once(" Settings kept for msrs that are not registered (each applies when its msr registers):\n")
        .expect("a section of their own");
    assert!(
        servers.contains("│ msr_1 │") && !servers.contains("nosuch"),
        "{out}"
    );
    assert!(
        waiting.contains("│ nosuch │         1.0 │ false  │   100 │"),
        "{out}"
    );
    // Without such settings, no such section.
    assert!(!msrs(&[row("msr_1", true)]).contains("Settings kept"));
    // A kept `active false` has a drain state; it is still only a setting.
    let drained = MsrInfo {
        drain: Some(DrainState::Drained),
        ..row("nosuch", false)
    };
    let out = msrs(&[row("msr_1", true), drained]);
    let (servers, _) = out
        .split_once(" Settings kept for msrs that are not registered")
        .expect("a section of their own");
    assert!(!servers.contains("nosuch"), "{out}");
}
