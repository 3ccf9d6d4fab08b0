use super::*;

fn binding(contact: &str, msr: &str, expires_at: Instant) -> Binding {
    Binding::test(
        contact,
        msr,
        &format!("sip:{msr}@127.0.0.1:5040"),
        expires_at,
    )
}

fn place(zone: &str, site: &str) -> Placement {
    Placement::new(zone, site).expect("a test's placement")
}

fn report(msr: &str, load: u8) -> LoadReport {
    LoadReport {
        msr: msr.into(),
        load,
        cpu: load,
        calls: 10,
        max_calls: 100,
        ..LoadReport::default()
    }
}

#[tokio::test(start_paused = true)]
async fn rows_show_expiry_age_and_staleness() {
    let now = Instant::now();
    let operator = OperatorConfig::new();
    let mut table = LoadTable::new("core1@ecss1".into(), place("default", "local"));
    table.upsert_contact(
        &binding("lo@msr_1", "msr_1", now + Duration::from_secs(60)),
        &operator,
    );
    table.set_load(&MsrName::test("msr_1"), report("msr_1", 37), now);
    table.set_subscription(&MsrName::test("msr_1"), 30);
    let rows = table.rows(now + Duration::from_secs(10));
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.node, "core1@ecss1");
    assert_eq!((row.zone.as_str(), row.site.as_str()), ("default", "local"));
    assert!(row.registered);
    assert_eq!(row.expires_in, Duration::from_secs(50));
    assert_eq!(row.report_age, Some(Duration::from_secs(10)));
    assert!(!row.stale);
    let later = table.rows(now + Duration::from_secs(31));
    assert!(later[0].stale);
    let expired = table.rows(now + Duration::from_secs(61));
    assert!(!expired[0].registered);
    assert_eq!(expired[0].expires_in, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn load_is_per_msr_and_index_follows_operator() {
    let now = Instant::now();
    let mut operator = OperatorConfig::new();
    let mut table = LoadTable::new("n".into(), place("default", "local"));
    let far = now + Duration::from_secs(600);
    table.upsert_contact(&binding("eth0@msr_1", "msr_1", far), &operator);
    table.upsert_contact(&binding("eth1@msr_1", "msr_1", far), &operator);
    table.set_load(&MsrName::test("msr_1"), report("msr_1", 55), now);
    let loads: Vec<_> = table
        .candidates_in_zone("default", now)
        .map(|c| c.load)
        .collect();
    assert_eq!(loads, vec![Some(55), Some(55)]);

    operator
        .set_contact_zone("eth1@msr_1", "rtk")
        .expect("zone");
    operator
        .set_performance_coefficient("msr_1", 2.0)
        .expect("coef");
    table.apply_operator(&operator);
    let default: Vec<_> = table
        .candidates_in_zone("default", now)
        .map(|c| c.contact)
        .collect();
    assert_eq!(default, vec!["eth0@msr_1"]);
    let rtk: Vec<_> = table.candidates_in_zone("rtk", now).collect();
    assert_eq!(rtk.len(), 1);
    assert_eq!(rtk[0].performance_coefficient, 2.0);

    operator.set_active("msr_1", false).expect("active");
    table.apply_operator(&operator);
    assert_eq!(table.candidates_in_zone("default", now).count(), 0);
}

#[tokio::test(start_paused = true)]
async fn remove_contact_and_msr_clean_the_index() {
    let now = Instant::now();
    let operator = OperatorConfig::new();
    let mut table = LoadTable::new("n".into(), place("z", "s"));
    let far = now + Duration::from_secs(600);
    table.upsert_contact(&binding("a@msr_1", "msr_1", far), &operator);
    table.upsert_contact(&binding("b@msr_1", "msr_1", far), &operator);
    table.upsert_contact(&binding("a@msr_2", "msr_2", far), &operator);
    table.remove_contact("a@msr_1");
    assert_eq!(table.len(), 2);
    table.remove_msr("msr_1");
    assert_eq!(table.len(), 1);
    let left: Vec<_> = table
        .candidates_in_zone("z", now)
        .map(|c| c.contact)
        .collect();
    assert_eq!(left, vec!["a@msr_2"]);
    table.remove_msr("msr_2");
    assert!(table.by_zone.is_empty());
    assert!(table.is_empty());
}

#[tokio::test(start_paused = true)]
async fn expired_contacts_are_not_candidates() {
    let now = Instant::now();
    let operator = OperatorConfig::new();
    let mut table = LoadTable::new("n".into(), place("z", "s"));
    table.upsert_contact(
        &binding("a@msr_1", "msr_1", now + Duration::from_secs(5)),
        &operator,
    );
    assert_eq!(table.candidates_in_zone("z", now).count(), 1);
    assert_eq!(
        table
            .candidates_in_zone("z", now + Duration::from_secs(5))
            .count(),
        0
    );
    assert!(!table.msrs(now + Duration::from_secs(5))[0].registered);
}

#[tokio::test(start_paused = true)]
async fn zone_index_follows_every_change() {
    let now = Instant::now();
    let far = now + Duration::from_secs(600);
    let mut operator = OperatorConfig::new();
    let mut table = LoadTable::new("n".into(), place("z", "s"));
    for (contact, msr) in [
        ("b@msr_1", "msr_1"),
        ("a@msr_1", "msr_1"),
        ("a@msr_2", "msr_2"),
        ("c@msr_3", "msr_3"),
    ] {
        table.upsert_contact(&binding(contact, msr, far), &operator);
        table.check_index();
    }
    table.set_load(&MsrName::test("msr_1"), report("msr_1", 120), now);
    table.check_index();
    table.set_load(&MsrName::test("msr_9"), report("msr_9", 10), now);
    table.check_index();
    table.set_subscription(&MsrName::test("msr_1"), 5);
    table.check_index();
    let first = table
        .candidates_in_zone("z", now)
        .next()
        .expect("candidate");
    assert_eq!((first.contact.as_str(), first.load), ("a@msr_1", Some(100)));
    assert!(table
        .candidates_in_zone("z", now + Duration::from_secs(6))
        .next()
        .is_some_and(|c| c.stale));

    // A refresh in place, a move to another zone, a move to another MSR.
    table.upsert_contact(&binding("a@msr_2", "msr_2", now), &operator);
    table.check_index();
    operator.set_contact_zone("b@msr_1", "y").expect("zone");
    operator.declare_site("t").expect("declare");
    operator.set_contact_site("b@msr_1", "t").expect("site");
    table.upsert_contact(&binding("b@msr_1", "msr_1", far), &operator);
    table.check_index();
    operator
        .set_performance_coefficient("msr_3", 0.5)
        .expect("coef");
    table.upsert_contact(&binding("c@msr_3", "msr_2", far), &operator);
    table.check_index();
    operator.set_active("msr_2", false).expect("active");
    table.apply_operator(&operator);
    table.check_index();
    let z: Vec<_> = table
        .candidates_in_zone("z", now)
        .map(|c| c.contact)
        .collect();
    assert_eq!(z, ["a@msr_1"]);
    let y: Vec<_> = table.candidates_in_zone("y", now).map(|c| c.site).collect();
    assert_eq!(y, ["t"]);

    table.remove_contact("a@msr_1");
    table.check_index();
    table.remove_msr("msr_2");
    table.check_index();
    table.remove_msr("msr_1");
    table.check_index();
    assert!(table.by_zone.is_empty());
}

#[tokio::test(start_paused = true)]
async fn subscription_updates_touch_the_index_only_when_the_expiry_changes() {
    let now = Instant::now();
    let operator = OperatorConfig::new();
    let mut table = LoadTable::new("n".into(), place("z", "s"));
    let far = now + Duration::from_secs(600);
    table.upsert_contact(&binding("a@msr_1", "msr_1", far), &operator);
    table.set_load(&MsrName::test("msr_1"), report("msr_1", 30), now);
    // The subscriber reports a change with every NOTIFY (its counters
    // move); the same expiry leaves the index as it is.
    for _ in 1..=3 {
        table.set_subscription(&MsrName::test("msr_1"), 60);
        table.check_index();
    }
    let stale_at = |t: &LoadTable, secs| {
        t.candidates_in_zone("z", now + Duration::from_secs(secs))
            .all(|c| c.stale)
    };
    assert!(!stale_at(&table, 31));
    // A shorter grant makes the report stale sooner: selection sees it.
    table.set_subscription(&MsrName::test("msr_1"), 30);
    table.check_index();
    assert!(stale_at(&table, 31));
}

/// One change to the table, for the index property test.
#[derive(Debug, Clone)]
enum Op {
    /// Register contact `if{i}@msr_{m}` under MSR `msr_{n}` in zone `z{zone}`.
    Upsert(u8, u8, u8, u8),
    Remove(u8, u8),
    RemoveMsr(u8),
    Load(u8, u8),
    /// The operator moves contact `if{i}@msr_{m}` to zone `z{zone}`.
    Rezone(u8, u8, u8),
    /// The operator moves contact `if{i}@msr_{m}` to site `s{site}`.
    Resite(u8, u8, u8),
    /// The operator sets MSR `msr_{n}`'s coefficient to `c` / 4.
    Coefficient(u8, u8),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0u8..4, 0u8..3, 0u8..4, 0u8..2).prop_map(|(m, i, n, z)| Op::Upsert(m, i, n, z)),
        2 => (0u8..4, 0u8..3).prop_map(|(m, i)| Op::Remove(m, i)),
        1 => (0u8..4).prop_map(Op::RemoveMsr),
        1 => (0u8..4, 0u8..=100).prop_map(|(m, load)| Op::Load(m, load)),
        1 => (0u8..4, 0u8..3, 0u8..2).prop_map(|(m, i, z)| Op::Rezone(m, i, z)),
        1 => (0u8..4, 0u8..3, 0u8..3).prop_map(|(m, i, s)| Op::Resite(m, i, s)),
        1 => (0u8..4, 1u8..8).prop_map(|(n, c)| Op::Coefficient(n, c)),
    ]
}

/// The zone index with site names for numbers: what two tables built
/// along different paths must agree on.
fn named(table: &LoadTable) -> BTreeMap<String, Vec<(ZoneMember, String)>> {
    table
        .by_zone
        .iter()
        .map(|(zone, members)| {
            let members = members
                .iter()
                .map(|m| {
                    let site = table.sites.name(m.site).to_owned();
                    (
                        ZoneMember {
                            site: 0,
                            ..m.clone()
                        },
                        site,
                    )
                })
                .collect();
            (zone.to_string(), members)
        })
        .collect()
}

proptest::proptest! {
    /// Every change, operator changes included, keeps the zone index's
    /// invariant and leaves it equal to the index of a table fed only
    /// the end state (the bindings, the loads, the operator
    /// configuration), and a scan's MSR groups tell exactly the MSRs
    /// apart.
    #[test]
    fn index_survives_any_change_sequence(ops in proptest::collection::vec(op(), 0..40)) {
        let now = Instant::now();
        let far = now + Duration::from_secs(600);
        let mut operator = OperatorConfig::new();
        for site in ["s0", "s1", "s2"] {
            operator.declare_site(site).expect("declare");
        }
        let mut table = LoadTable::new("n".into(), place("z0", "s"));
        // What the owners hold at the end: the registrar's bindings
        // and the reports of the MSRs still in the table.
        let mut bindings: BTreeMap<String, Binding> = BTreeMap::new();
        let mut loads: BTreeMap<String, LoadReport> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Upsert(m, i, n, z) => {
                    let contact = format!("if{i}@msr_{m}");
                    operator.set_contact_zone(&contact, &format!("z{z}")).expect("zone");
                    let b = binding(&contact, &format!("msr_{n}"), far);
                    table.apply(&operator, Change::BindingChanged(&b));
                    bindings.insert(contact, b);
                }
                Op::Remove(m, i) => {
                    if let Some(b) = bindings.remove(&format!("if{i}@msr_{m}")) {
                        table.apply(&operator, Change::BindingRemoved(&b));
                    }
                }
                Op::RemoveMsr(m) => {
                    let msr = format!("msr_{m}");
                    bindings.retain(|_, b| b.msr != msr);
                    loads.remove(&msr);
                    table.apply(&operator, Change::MsrUnregistered(&MsrName::test(&msr)));
                }
                Op::Load(m, load) => {
                    let msr = format!("msr_{m}");
                    loads.insert(msr.clone(), report(&msr, load));
                    let change = Change::LoadReported { msr: &MsrName::test(&msr), report: report(&msr, load), at: now };
                    table.apply(&operator, change);
                }
                Op::Rezone(m, i, z) => {
                    operator.set_contact_zone(&format!("if{i}@msr_{m}"), &format!("z{z}")).expect("zone");
                    table.apply(&operator, Change::OperatorChanged);
                }
                Op::Resite(m, i, site) => {
                    operator.set_contact_site(&format!("if{i}@msr_{m}"), &format!("s{site}")).expect("site");
                    table.apply(&operator, Change::OperatorChanged);
                }
                Op::Coefficient(n, c) => {
                    operator.set_performance_coefficient(&format!("msr_{n}"), f64::from(c) / 4.0).expect("coefficient");
                    table.apply(&operator, Change::OperatorChanged);
                }
            }
            table.check_index();
            // An MSR whose last contact was removed keeps its report
            // until it is unregistered: the fresh table gets it too.
            let mut fresh = LoadTable::new("n".into(), place("z0", "s"));
            for b in bindings.values() {
                fresh.apply(&operator, Change::BindingChanged(b));
            }
            for (msr, report) in &loads {
                let change = Change::LoadReported { msr: &MsrName::test(msr), report: report.clone(), at: now };
                fresh.apply(&operator, change);
            }
            proptest::prop_assert_eq!(named(&table), named(&fresh));
            for zone in ["z0", "z1"] {
                let view = table.zone(zone);
                let column = DistanceColumn(Vec::new());
                let scanned: Vec<_> = view.scan(0..view.len(), now, &column).collect();
                for pair in scanned.windows(2) {
                    let a = view.candidate(pair[0].position, now).expect("candidate");
                    let b = view.candidate(pair[1].position, now).expect("candidate");
                    proptest::prop_assert_eq!(a.msr == b.msr, pair[0].msr_group == pair[1].msr_group);
                }
            }
        }
    }
}

/// One change to the table for the selection index's property test: the
/// ops above and what moves an MSR's keys or units.
#[derive(Debug, Clone)]
enum IndexOp {
    Table(Op),
    /// Contact `if{i}@msr_{m}`'s health: healthy, unreachable, draining.
    Health(u8, u8, u8),
    /// A report of `calls` of `max-calls` for `msr_{m}`.
    Calls(u8, u8, u8),
    Placed(u8),
    Ended(u8),
    /// The operator sets `msr_{n}` active or not.
    Active(u8, bool),
    /// The operator sets `msr_{n}`'s load limit.
    LoadLimit(u8, u8),
    CoreHosts(u8),
}

fn index_op() -> impl proptest::strategy::Strategy<Value = IndexOp> {
    use proptest::prelude::*;
    prop_oneof![
        6 => op().prop_map(IndexOp::Table),
        2 => (0u8..4, 0u8..3, 0u8..3).prop_map(|(m, i, h)| IndexOp::Health(m, i, h)),
        2 => (0u8..4, 0u8..12, 0u8..12).prop_map(|(m, c, x)| IndexOp::Calls(m, c, x)),
        2 => (0u8..4).prop_map(IndexOp::Placed),
        1 => (0u8..4).prop_map(IndexOp::Ended),
        1 => (0u8..4, any::<bool>()).prop_map(|(n, a)| IndexOp::Active(n, a)),
        1 => (0u8..4, 1u8..=100).prop_map(|(n, l)| IndexOp::LoadLimit(n, l)),
        1 => (1u8..4).prop_map(IndexOp::CoreHosts),
    ]
}

proptest::proptest! {
    /// The selection index (`index.rs`) after any sequence of changes is
    /// what a rebuild from the zone index gives (`check_index`).
    #[test]
    fn the_selection_index_survives_any_change_sequence(
        ops in proptest::collection::vec(index_op(), 0..50),
    ) {
        let now = Instant::now();
        let mut operator = OperatorConfig::new();
        for site in ["s0", "s1", "s2"] {
            operator.declare_site(site).expect("declare");
        }
        let mut table = LoadTable::new("n".into(), place("z0", "s0"));
        for (k, op) in ops.into_iter().enumerate() {
            let at = now + Duration::from_millis(k as u64 * 100);
            match op {
                IndexOp::Table(Op::Upsert(m, i, n, z)) => {
                    let contact = format!("if{i}@msr_{m}");
                    operator.set_contact_zone(&contact, &format!("z{z}")).expect("zone");
                    // Expiries differ, so the zones' earliest one moves.
                    let b = binding(&contact, &format!("msr_{n}"), at + Duration::from_secs(600));
                    table.apply(&operator, Change::BindingChanged(&b));
                }
                IndexOp::Table(Op::Remove(m, i)) => {
                    let b = binding(&format!("if{i}@msr_{m}"), "msr_0", at);
                    table.apply(&operator, Change::BindingRemoved(&b));
                }
                IndexOp::Table(Op::RemoveMsr(m)) => {
                    table.apply(&operator, Change::MsrUnregistered(&MsrName::test(&format!("msr_{m}"))));
                }
                IndexOp::Table(Op::Load(m, load)) => {
                    let msr = format!("msr_{m}");
                    let change = Change::LoadReported { msr: &MsrName::test(&msr), report: report(&msr, load), at };
                    table.apply(&operator, change);
                }
                IndexOp::Table(Op::Rezone(m, i, z)) => {
                    operator.set_contact_zone(&format!("if{i}@msr_{m}"), &format!("z{z}")).expect("zone");
                    table.apply(&operator, Change::OperatorChanged);
                }
                IndexOp::Table(Op::Resite(m, i, site)) => {
                    operator.set_contact_site(&format!("if{i}@msr_{m}"), &format!("s{site}")).expect("site");
                    table.apply(&operator, Change::OperatorChanged);
                }
                IndexOp::Table(Op::Coefficient(n, c)) => {
                    operator.set_performance_coefficient(&format!("msr_{n}"), f64::from(c) / 4.0).expect("coefficient");
                    table.apply(&operator, Change::OperatorChanged);
                }
                IndexOp::Health(m, i, h) => {
                    let health = [Health::Healthy, Health::Unreachable, Health::Draining][usize::from(h)];
                    let contact = ContactName::test(&format!("if{i}@msr_{m}"));
                    table.apply(&operator, Change::HealthChanged { contact: &contact, health, since: (at, 0) });
                }
                IndexOp::Calls(m, calls, max_calls) => {
                    let msr = format!("msr_{m}");
                    let report = LoadReport {
                        calls: u32::from(calls),
                        max_calls: u32::from(max_calls),
                        ..report(&msr, calls.saturating_mul(8).min(100))
                    };
                    table.apply(&operator, Change::LoadReported { msr: &MsrName::test(&msr), report, at });
                }
                IndexOp::Placed(m) => table.note_placed(&format!("msr_{m}"), at),
                IndexOp::Ended(m) => table.note_ended(&format!("msr_{m}"), at),
                IndexOp::Active(n, active) => {
                    operator.set_active(&format!("msr_{n}"), active).expect("active");
                    table.apply(&operator, Change::OperatorChanged);
                }
                IndexOp::LoadLimit(n, limit) => {
                    operator.set_load_limit(&format!("msr_{n}"), u32::from(limit)).expect("limit");
                    table.apply(&operator, Change::OperatorChanged);
                }
                IndexOp::CoreHosts(g) => table.set_core_hosts(u32::from(g)),
            }
            table.check_index();
        }
    }
}
