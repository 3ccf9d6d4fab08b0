use super::*;

fn key<'a>(call_id: &'a str, leg: Option<&'a str>) -> LegKey<'a> {
    LegKey { call_id, leg }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn table() -> LegTable {
    LegTable::new(DEFAULT_MAX_DURATION)
}

#[test]
fn a_bound_leg_is_found_again_and_counted() {
    let mut t = table();
    let now = Instant::now();
    assert_eq!(
        t.bind(
            now,
            key("c1", None),
            &MsrName::test("msr_1"),
            &ContactName::test("lo@msr_1"),
            None
        ),
        Bound::New
    );
    let leg = t.get(now, key("c1", None)).expect("live");
    assert_eq!((leg.msr, leg.contact), ("msr_1", "lo@msr_1"));
    assert_eq!(leg.expires_at, now + DEFAULT_MAX_DURATION);
    assert_eq!(
        t.bind(
            now,
            key("c1", None),
            &MsrName::test("msr_1"),
            &ContactName::test("lo@msr_1"),
            None
        ),
        Bound::Unchanged
    );
    assert_eq!(
        (t.len(), t.on_msr("msr_1"), t.on_contact("lo@msr_1")),
        (1, 1, 1)
    );
    assert!(
        t.get(now, key("c1", Some("b"))).is_none(),
        "another leg of the call"
    );
    assert!(t.get(now, key("c2", None)).is_none());
}

#[test]
fn release_is_idempotent_and_never_goes_below_zero() {
    let mut t = table();
    let now = Instant::now();
    t.bind(
        now,
        key("c1", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    assert_eq!(t.release("c1", None), 1);
    assert_eq!(t.release("c1", None), 0, "a repeated release is harmless");
    assert_eq!(t.release("never", Some("a")), 0, "an unknown one too");
    assert_eq!(
        (t.len(), t.on_msr("msr_1"), t.on_contact("lo@msr_1")),
        (0, 0, 0)
    );
    assert_eq!(t.per_msr().count(), 0, "nothing kept of released legs");
}

#[test]
fn two_legs_of_one_call_id_are_told_apart_and_a_bye_ends_both() {
    let mut t = table();
    let now = Instant::now();
    t.bind(
        now,
        key("c1", Some("a")),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    t.bind(
        now,
        key("c1", Some("b")),
        &MsrName::test("msr_2"),
        &ContactName::test("lo@msr_2"),
        None,
    );
    t.bind(
        now,
        key("c1", None),
        &MsrName::test("msr_2"),
        &ContactName::test("lo@msr_2"),
        None,
    );
    t.bind(
        now,
        key("c2", Some("a")),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    assert_eq!(
        t.get(now, key("c1", Some("a"))).map(|l| l.msr),
        Some("msr_1")
    );
    assert_eq!(
        t.get(now, key("c1", Some("b"))).map(|l| l.msr),
        Some("msr_2")
    );
    assert_eq!(t.release("c1", Some("b")), 1);
    assert!(t.get(now, key("c1", Some("b"))).is_none());
    assert!(
        t.get(now, key("c1", Some("a"))).is_some(),
        "the other leg stays"
    );
    assert!(t.get(now, key("c1", None)).is_some());
    // Without a label: every leg of the Call-ID, and no other.
    assert_eq!(t.release("c1", None), 2);
    assert_eq!(t.len(), 1);
    assert_eq!((t.on_msr("msr_1"), t.on_msr("msr_2")), (1, 0));
}

#[test]
fn a_leg_moved_to_another_msr_keeps_its_expiry_and_moves_its_counts() {
    let mut t = table();
    let t0 = Instant::now();
    t.bind(
        t0,
        key("c1", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        Some("conf"),
    );
    let t1 = t0 + secs(60);
    assert_eq!(
        t.bind(
            t1,
            key("c1", None),
            &MsrName::test("msr_2"),
            &ContactName::test("lo@msr_2"),
            Some("conf")
        ),
        Bound::Reanchored
    );
    let leg = t.get(t1, key("c1", None)).expect("live");
    assert_eq!(
        (leg.msr, leg.expires_at),
        ("msr_2", t0 + DEFAULT_MAX_DURATION)
    );
    assert_eq!((t.on_msr("msr_1"), t.on_msr("msr_2")), (0, 1));
    assert_eq!(t.conference_host("conf"), Some("msr_2"));
}

#[test]
fn legs_expire_at_the_maximum_duration_so_a_lost_release_cannot_leak() {
    let mut t = LegTable::new(secs(100));
    let t0 = Instant::now();
    t.bind(
        t0,
        key("c1", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    t.bind(
        t0 + secs(10),
        key("c2", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    assert_eq!(t.poll_timeout(), Some(t0 + secs(100)));
    assert_eq!(t.handle_timeout(t0 + secs(99)), 0);
    // At its expiry it no longer counts, even before the timeout runs.
    assert!(t.get(t0 + secs(100), key("c1", None)).is_none());
    assert_eq!(t.handle_timeout(t0 + secs(100)), 1);
    assert_eq!((t.len(), t.on_msr("msr_1")), (1, 1));
    // A release after the expiry is harmless.
    assert_eq!(t.release("c1", None), 0);
    assert_eq!(t.poll_timeout(), Some(t0 + secs(110)));
    assert_eq!(t.handle_timeout(t0 + secs(200)), 1);
    assert!(t.is_empty() && t.poll_timeout().is_none());
}

/// The race of Kamailio's call-load counters: the release arrives while
/// the leg's select answer is still in flight, or twice, or after the
/// expiry. The count ends at zero every time, never below, never stuck.
#[test]
fn release_races_leave_every_count_at_zero() {
    let mut t = LegTable::new(secs(100));
    let t0 = Instant::now();
    // Released before the select's answer was used: select, then release.
    t.bind(
        t0,
        key("c1", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    assert_eq!(t.release("c1", None), 1);
    // Double release.
    t.bind(
        t0,
        key("c2", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    assert_eq!(t.release("c2", None) + t.release("c2", None), 1);
    // Released after the expiry.
    t.bind(
        t0,
        key("c3", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    t.handle_timeout(t0 + secs(100));
    assert_eq!(t.release("c3", None), 0);
    // A release that overtook its select is remembered (the handler then
    // refuses the select); a leg bound anyway lives until its expiry.
    assert_eq!(t.release("c4", None), 0);
    t.bind(
        t0 + secs(1),
        key("c4", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    assert_eq!(t.on_msr("msr_1"), 1);
    t.handle_timeout(t0 + secs(101));
    assert_eq!(
        (t.len(), t.on_msr("msr_1"), t.on_contact("lo@msr_1")),
        (0, 0, 0)
    );
    // Stale FIFO entries of released legs are dropped without effect.
    assert!(t.poll_timeout().is_none());
}

/// A slot freed and reused by another leg keeps the FIFO honest: the old
/// leg's entry does not end the new one.
#[test]
fn a_reused_slot_is_not_expired_by_its_previous_legs_entry() {
    let mut t = LegTable::new(secs(100));
    let t0 = Instant::now();
    t.bind(
        t0,
        key("old", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    t.release("old", None);
    t.bind(
        t0 + secs(50),
        key("new", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    assert_eq!(
        t.handle_timeout(t0 + secs(100)),
        0,
        "the old entry is stale"
    );
    assert!(t.get(t0 + secs(100), key("new", None)).is_some());
    assert_eq!(t.handle_timeout(t0 + secs(150)), 1);
}

#[test]
fn the_conference_host_is_the_msr_with_most_of_its_legs() {
    let mut t = table();
    let now = Instant::now();
    assert_eq!(t.conference_host("k"), None, "a new conference");
    t.bind(
        now,
        key("a", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        Some("k"),
    );
    t.bind(
        now,
        key("b", None),
        &MsrName::test("msr_2"),
        &ContactName::test("lo@msr_2"),
        Some("k"),
    );
    assert_eq!(t.conference_host("k"), Some("msr_1"), "first on a tie");
    t.bind(
        now,
        key("c", None),
        &MsrName::test("msr_2"),
        &ContactName::test("lo@msr_2"),
        Some("k"),
    );
    assert_eq!(t.conference_host("k"), Some("msr_2"));
    for c in ["a", "b", "c"] {
        t.release(c, None);
    }
    assert_eq!(t.conference_host("k"), None, "forgotten with its last leg");
}

proptest::proptest! {
    /// Any sequence of binds, releases and expiries: the per-MSR counts are
    /// the live legs, never negative, and an empty table holds nothing.
    #[test]
    fn counts_match_the_live_legs(ops in proptest::collection::vec((0u8..4, 0u8..6, 0u8..3, 0u8..3), 1..200)) {
        let mut t = LegTable::new(secs(50));
        let t0 = Instant::now();
        let mut clock = 0u64;
        let mut model: HashMap<(u8, Option<u8>), u8> = HashMap::new();
        let mut born: HashMap<(u8, Option<u8>), u64> = HashMap::new();
        for (op, call, leg, msr) in ops {
            let label = (leg > 0).then_some(leg);
            let label_text = label.map(|l| l.to_string());
            let call_text = call.to_string();
            let k = LegKey { call_id: &call_text, leg: label_text.as_deref() };
            let now = t0 + secs(clock);
            match op {
                0 | 1 => {
                    let name = format!("msr_{msr}");
                    t.bind(
                        now,
                        k,
                        &MsrName::test(&name),
                        &ContactName::test(&format!("lo@{name}")),
                        None,
                    );
                    let live = born.get(&(call, label)).is_some_and(|b| clock < b + 50);
                    if !live { born.insert((call, label), clock); }
                    model.insert((call, label), msr);
                }
                2 => {
                    t.release(&call_text, label_text.as_deref());
                    // Without a label: every leg of the Call-ID.
                    let ends = |k: &(u8, Option<u8>)| k.0 == call && (label.is_none() || k.1 == label);
                    model.retain(|k, _| !ends(k));
                    born.retain(|k, _| !ends(k));
                }
                _ => {
                    clock += 7;
                    let now = t0 + secs(clock);
                    t.handle_timeout(now);
                    model.retain(|k, _| born.get(k).is_some_and(|b| clock < b + 50));
                    born.retain(|_, b| clock < *b + 50);
                }
            }
        }
        let now = t0 + secs(clock);
        t.handle_timeout(now);
        model.retain(|k, _| born.get(k).is_some_and(|b| clock < b + 50));
        proptest::prop_assert_eq!(t.len(), model.len());
        for m in 0u8..3 {
            let expected = model.values().filter(|&&v| v == m).count() as u32;
            proptest::prop_assert_eq!(t.on_msr(&format!("msr_{m}")), expected);
        }
        for ((call, label), msr) in &model {
            let label_text = label.map(|l| l.to_string());
            let call_text = call.to_string();
            let got = t.get(now, LegKey { call_id: &call_text, leg: label_text.as_deref() }).map(|l| l.msr.to_owned());
            proptest::prop_assert_eq!(got, Some(format!("msr_{msr}")));
        }
    }
}

/// Legs selected and released at a high rate leave nothing behind: the
/// expiry FIFO stays proportional to the live legs, not to the leg rate.
#[test]
fn released_legs_do_not_pile_up_in_the_expiry_queue() {
    let mut t = table();
    let now = Instant::now();
    t.bind(
        now,
        key("long-lived", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    for n in 0..100_000u32 {
        let call = format!("c{n}");
        t.bind(
            now,
            key(&call, None),
            &MsrName::test("msr_1"),
            &ContactName::test("lo@msr_1"),
            None,
        );
        t.release(&call, None);
    }
    assert_eq!(t.len(), 1);
    assert!(
        t.queued_expiries() <= 2 * t.len() + 1024,
        "{}",
        t.queued_expiries()
    );
    assert!(t.get(now, key("long-lived", None)).is_some());
    assert_eq!(t.poll_timeout(), Some(now + DEFAULT_MAX_DURATION));
}

#[test]
fn leg_keys_are_checked() {
    assert_eq!(key_problem("a84b4c76e66710@core1", MAX_CALL_ID_LEN), None);
    assert_eq!(
        key_problem("", MAX_CALL_ID_LEN).as_deref(),
        Some("is empty")
    );
    assert!(key_problem(&"x".repeat(257), MAX_CALL_ID_LEN).is_some_and(|p| p.contains("257 bytes")));
    assert!(key_problem("a\u{1b}[31m", MAX_LABEL_LEN).is_some_and(|p| p.contains("U+001B")));
    assert!(key_problem("a b", MAX_CALL_ID_LEN).is_some_and(|p| p.contains("U+0020")));
}

#[test]
fn the_oldest_leg_of_each_msr_is_aged_from_its_bind() {
    let mut t = table();
    let start = Instant::now();
    t.bind(
        start,
        key("old", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    t.bind(
        start + secs(60),
        key("young", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    t.bind(
        start + secs(90),
        key("other", None),
        &MsrName::test("msr_2"),
        &ContactName::test("lo@msr_2"),
        None,
    );
    let now = start + secs(100);
    let oldest = t.oldest_per_msr(now);
    assert_eq!(oldest.get("msr_1"), Some(&secs(100)));
    assert_eq!(oldest.get("msr_2"), Some(&secs(10)));
    t.release("old", None);
    assert_eq!(t.oldest_per_msr(now).get("msr_1"), Some(&secs(40)));
    t.release("young", None);
    assert_eq!(t.oldest_per_msr(now).get("msr_1"), None);
}

#[test]
fn a_release_before_its_select_is_remembered_for_32_s() {
    let mut t = table();
    let t0 = Instant::now();
    assert_eq!(t.release_at(t0, "c1", Some("a"), |_| {}), 0);
    assert_eq!(t.release_at(t0, "c2", None, |_| {}), 0);
    let c1a = key("c1", Some("a"));
    assert_eq!(t.released_early(t0 + secs(31), c1a), Some(t0));
    // Another leg of c1 was not released; a release without a label
    // covers every leg of its Call-ID.
    assert_eq!(t.released_early(t0, key("c1", Some("b"))), None);
    assert_eq!(t.released_early(t0, key("c1", None)), None);
    assert_eq!(t.released_early(t0, key("c2", Some("x"))), Some(t0));
    assert_eq!(t.released_early(t0, key("c2", None)), Some(t0));
    // A repeated release keeps the first time.
    t.release_at(t0 + secs(10), "c1", Some("a"), |_| {});
    assert_eq!(t.early_releases(), 2);
    assert_eq!(t.released_early(t0 + secs(32), c1a), None);
    t.handle_timeout(t0 + secs(32));
    assert_eq!(t.early_releases(), 0);
    // A release that ended a live leg is not remembered: the Call-ID may
    // be selected again.
    t.bind(
        t0,
        key("c3", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    assert_eq!(t.release_at(t0 + secs(40), "c3", None, |_| {}), 1);
    assert_eq!(t.released_early(t0 + secs(40), key("c3", None)), None);
}

#[test]
fn early_releases_are_capped_oldest_first() {
    let mut t = table();
    let t0 = Instant::now();
    for n in 0..MAX_EARLY_RELEASES + 10 {
        t.release_at(t0, &format!("c{n}"), None, |_| {});
    }
    assert_eq!(t.early_releases(), MAX_EARLY_RELEASES);
    assert_eq!(t.released_early(t0, key("c0", None)), None);
    assert_eq!(t.released_early(t0, key("c9", None)), None);
    assert_eq!(t.released_early(t0, key("c10", None)), Some(t0));
    let last = format!("c{}", MAX_EARLY_RELEASES + 9);
    assert_eq!(t.released_early(t0, key(&last, None)), Some(t0));
    assert!(t.early_order.len() == MAX_EARLY_RELEASES);
}

/// Expiries are reported at once, then at most once per interval with the
/// count of all expired since, so a core that never releases writes one
/// line a minute, not one per leg.
#[test]
fn expiries_are_reported_at_most_once_per_interval_with_a_count() {
    let mut t = LegTable::new(secs(100));
    let t0 = Instant::now();
    for n in 0..5u64 {
        t.bind(
            t0 + secs(n),
            key(&format!("c{n}"), None),
            &MsrName::test("msr_1"),
            &ContactName::test("lo@msr_1"),
            None,
        );
    }
    assert_eq!(t.poll_expiry_report(t0), None);
    t.handle_timeout(t0 + secs(100));
    let first = t.poll_expiry_report(t0 + secs(100));
    assert_eq!(
        first,
        Some(ExpiryReport {
            count: 1,
            sample_call_id: "c0".into()
        })
    );
    for n in 1..5 {
        t.handle_timeout(t0 + secs(100 + n));
        assert_eq!(t.poll_expiry_report(t0 + secs(100 + n)), None);
    }
    // The held-back report is due a minute after the first.
    assert_eq!(t.poll_timeout(), Some(t0 + secs(160)));
    t.handle_timeout(t0 + secs(160));
    assert_eq!(
        t.poll_expiry_report(t0 + secs(160)),
        Some(ExpiryReport {
            count: 4,
            sample_call_id: "c1".into()
        })
    );
    assert_eq!(t.poll_timeout(), None);
}

#[test]
fn live_legs_are_listed_oldest_first_filtered_and_bounded() {
    let mut t = table();
    let t0 = Instant::now();
    t.bind(
        t0,
        key("c1", Some("a")),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        Some("room"),
    );
    t.bind(
        t0 + secs(10),
        key("c2", None),
        &MsrName::test("msr_2"),
        &ContactName::test("lo@msr_2"),
        None,
    );
    t.bind(
        t0 + secs(20),
        key("c3", None),
        &MsrName::test("msr_1"),
        &ContactName::test("lo@msr_1"),
        None,
    );
    let now = t0 + secs(30);
    let (total, rows) = t.list(now, None, Duration::ZERO, 10);
    assert_eq!(total, 3);
    let calls: Vec<_> = rows.iter().map(|r| (r.call_id, r.age)).collect();
    assert_eq!(
        calls,
        vec![("c1", secs(30)), ("c2", secs(20)), ("c3", secs(10))]
    );
    assert_eq!(
        (
            rows[0].leg,
            rows[0].msr,
            rows[0].contact,
            rows[0].conference
        ),
        (Some("a"), "msr_1", "lo@msr_1", Some("room"))
    );
    let (total, rows) = t.list(now, Some("msr_1"), secs(15), 10);
    assert_eq!((total, rows.len(), rows[0].call_id), (1, 1, "c1"));
    let (total, rows) = t.list(now, None, Duration::ZERO, 1);
    assert_eq!((total, rows.len()), (3, 1));
    assert_eq!(t.list(now, Some("msr_9"), Duration::ZERO, 10).0, 0);
    t.release("c2", None);
    assert_eq!(t.list(now, None, Duration::ZERO, 10).0, 2);
}
