use std::collections::BTreeMap;
use std::time::Duration;

use msr_shared::event_package::LoadReport;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::time::Instant;

use super::*;
use crate::model::estimate::DEFAULT_NOTIFY_FLIGHT_TIME;
use crate::model::health::Health;
use crate::model::load_table::{Candidate, Change, Placement};
use crate::operator::names::{ContactName, MsrName};
use crate::operator::OperatorConfig;
use crate::sip::registrar::Binding;

/// The collector's `[defaults]` of a test table.
fn place(zone: &str, site: &str) -> Placement {
    Placement::new(zone, site).expect("a test's placement")
}

/// A contact to put in a test table.
struct Spec {
    contact: &'static str,
    zone: &'static str,
    site: &'static str,
}

/// Builds an operator config and load table: sites `local`, `near`, `far`,
/// `isolated`; local–near 10, local–far 20, isolated unset.
struct World {
    operator: OperatorConfig,
    table: LoadTable,
    now: Instant,
}

impl World {
    fn new() -> Self {
        let mut operator = OperatorConfig::new();
        for site in ["local", "near", "far", "isolated"] {
            operator.declare_site(site).expect("declare");
        }
        operator
            .set_distance("local", "near", 10.0)
            .expect("distance");
        operator
            .set_distance("local", "far", 20.0)
            .expect("distance");
        Self {
            operator,
            table: LoadTable::new("test".into(), place("default", "local")),
            now: Instant::now(),
        }
    }

    fn contact(&mut self, spec: Spec) -> &mut Self {
        let msr = spec
            .contact
            .split_once('@')
            .map_or(spec.contact, |(_, msr)| msr);
        self.operator
            .set_contact_zone(spec.contact, spec.zone)
            .expect("zone");
        self.operator
            .set_contact_site(spec.contact, spec.site)
            .expect("site");
        let binding = Binding::test(
            spec.contact,
            msr,
            &format!("sip:{msr}@10.0.0.1:5040"),
            self.now + Duration::from_secs(3600),
        );
        self.table
            .apply(&self.operator, Change::BindingChanged(&binding));
        self
    }

    fn load(&mut self, msr: &str, load: u8) -> &mut Self {
        self.takes(msr, load, None)
    }

    /// The health monitor set `contact`'s health.
    fn health(&mut self, contact: &str, health: Health) -> &mut Self {
        let since = (self.now, 0);
        let change = Change::HealthChanged {
            contact: &ContactName::test(contact),
            health,
            since,
        };
        self.table.apply(&self.operator, change);
        self
    }

    /// The operator configuration changed.
    fn operator_changed(&mut self) -> &mut Self {
        self.table.apply(&self.operator, Change::OperatorChanged);
        self
    }

    fn coefficient(&mut self, msr: &str, value: f64) -> &mut Self {
        self.operator
            .set_performance_coefficient(msr, value)
            .expect("coefficient");
        self.operator_changed();
        self
    }

    fn query(&self, zone: &str, site: &str, msr: Option<&str>) -> Query {
        Query {
            zone: zone.into(),
            site: site.into(),
            msr: msr.map(Into::into),
            now: self.now,
            admission: Admission::Plain,
            policy: Policy::Ecss,
            failed: Vec::new(),
            needs: msr_shared::media::CodecSet::EMPTY,
        }
    }

    fn fixed(&self, query: &Query, draw: f64) -> Explanation {
        explain::<StdRng>(
            &self.table,
            self.operator.topology(),
            query,
            Draw::Fixed(draw),
        )
        .expect("draw in range")
    }

    fn pick(&self, query: &Query) -> Result<Choice, Refusal> {
        let mut rng = StdRng::seed_from_u64(7);
        select(&self.table, self.operator.topology(), query, &mut rng)
    }
}

impl World {
    fn load_limit(&mut self, msr: &str, limit: u32) -> &mut Self {
        self.operator.set_load_limit(msr, limit).expect("limit");
        self.operator_changed();
        self
    }

    /// Three bridges at `local`: `cms_1`, `cms_2`, `cms_3`.
    fn bridges(loads: [u8; 3]) -> World {
        let mut world = World::new();
        for (i, load) in loads.into_iter().enumerate() {
            let msr = ["cms_1", "cms_2", "cms_3"][i];
            let contact: &'static str = ["lo@cms_1", "lo@cms_2", "lo@cms_3"][i];
            world
                .contact(c(contact, "default", "local"))
                .load(msr, load);
        }
        world
    }

    fn conference(&self, id: &str, host: Option<&str>) -> Query {
        Query {
            admission: Admission::Conference(ConferenceAdmission {
                id: id.into(),
                host: host.map(Into::into),
                existing_threshold: 0.8,
                new_threshold: 0.5,
            }),
            ..self.query("default", "local", None)
        }
    }
}

/// The order a conference prefers among bridges (highest score first).
fn preference(conference: &str, msrs: &[&str]) -> Vec<String> {
    let mut order: Vec<&str> = msrs.to_vec();
    order.sort_by_key(|m| std::cmp::Reverse(rendezvous_score(conference, m)));
    order.into_iter().map(str::to_owned).collect()
}

/// Seed 001 (Cisco Meeting Server): a call for a running conference goes to
/// the bridge hosting it while that bridge is below 80 % of its load
/// limit: at 70 % it does, without a draw.
#[test]
fn a_conference_stays_on_its_bridge_below_the_existing_threshold() {
    let world = World::bridges([70, 10, 10]);
    let e = world.fixed(&world.conference("room-1", Some("cms_1")), 0.0);
    assert_eq!(e.rule, Rule::ExistingConference);
    assert_eq!(e.threshold, Some(80.0));
    let choice = e.outcome.expect("chosen");
    assert_eq!(
        (choice.msr.as_str(), choice.rule),
        ("cms_1", Rule::ExistingConference)
    );
    assert_eq!(e.draw, None, "no draw");
    let outcome = |contact: &str| {
        e.candidates
            .iter()
            .find(|c| c.contact == contact)
            .map(|c| c.outcome)
    };
    assert_eq!(outcome("lo@cms_1"), Some(CandidateOutcome::Kept));
    assert_eq!(outcome("lo@cms_2"), Some(CandidateOutcome::NotPreferred));
    // Issue 44: only the candidate that stays shows a weight; the ones the
    // rule left out show why, not the weight they would have had.
    let weight = |contact: &str| e.candidates.iter().find(|c| c.contact == contact)?.weight;
    assert_eq!(weight("lo@cms_1"), Some(30.0));
    assert_eq!(weight("lo@cms_2"), None);
}

/// At 85 % (over 80 % of its limit) the host takes no more: the leg goes
/// to another bridge as a new conference would (below 50 %), the first in
/// the conference's preference order.
#[test]
fn a_conference_over_the_existing_threshold_spills_to_the_preferred_bridge_below_half() {
    let world = World::bridges([85, 20, 30]);
    let e = world.fixed(&world.conference("room-1", Some("cms_1")), 0.0);
    assert_eq!(e.rule, Rule::NewConference);
    let first_free = preference("room-1", &["cms_2", "cms_3"])[0].clone();
    assert_eq!(e.outcome.expect("chosen").msr, first_free);
    let host = e
        .candidates
        .iter()
        .find(|c| c.msr == "cms_1")
        .expect("cms_1");
    assert_eq!(host.outcome, CandidateOutcome::OverThreshold);
    assert_eq!(host.weight, None, "a dropped contact shows no weight");
    // A load limit moves the thresholds: with a limit of 50 the 30 % and
    // 20 % bridges are over the new-conference threshold (25 %) or not.
    let mut world = World::bridges([85, 20, 30]);
    world.load_limit("cms_2", 50).load_limit("cms_3", 50);
    let e = world.fixed(&world.conference("room-1", Some("cms_1")), 0.0);
    assert_eq!(e.outcome.expect("chosen").msr, "cms_2", "20 < 25, 30 ≥ 25");
}

/// A new conference with every bridge at 60 % (over 50 %) is refused with
/// a clear cause; a plain leg is still admitted (only its load limit).
#[test]
fn a_new_conference_is_refused_when_every_bridge_is_over_half() {
    let world = World::bridges([60, 60, 60]);
    let e = world.fixed(&world.conference("room-9", None), 0.0);
    assert_eq!(e.outcome, Err(Refusal::MsrOverloaded));
    assert_eq!((e.rule, e.threshold), (Rule::NewConference, Some(50.0)));
    assert!(e
        .candidates
        .iter()
        .all(|c| c.outcome == CandidateOutcome::OverThreshold));
    let plain = world.pick(&world.query("default", "local", None));
    assert!(plain.is_ok(), "{plain:?}");
}

/// "Among equal choices a stable per-conference preference order decides,
/// so one conference lands on one MSR": every leg of a new conference picks
/// the same bridge; different conferences spread over the bridges.
#[test]
fn new_conferences_follow_a_stable_preference_and_spread() {
    let world = World::bridges([10, 10, 10]);
    let mut hosts = BTreeMap::new();
    for n in 0..300 {
        let id = format!("conf-{n}");
        let first = world.pick(&world.conference(&id, None)).expect("chosen");
        for _ in 0..3 {
            let again = world.pick(&world.conference(&id, None)).expect("chosen");
            assert_eq!(again.msr, first.msr, "{id}");
            assert_eq!(again.rule, Rule::NewConference);
        }
        *hosts.entry(first.msr).or_insert(0) += 1;
    }
    assert_eq!(hosts.len(), 3, "{hosts:?}");
    assert!(
        hosts.values().all(|&n| (70..=130).contains(&n)),
        "{hosts:?}"
    );
    // The score is specified (FNV-1a, then a mix), not a build's hasher.
    assert_eq!(
        rendezvous_score("room-1", "cms_1"),
        rendezvous_score("room-1", "cms_1")
    );
    assert_ne!(
        rendezvous_score("room-1", "cms_1"),
        rendezvous_score("room-1", "cms_2")
    );
}

/// A plain leg is held to each MSR's load limit: at or above it, an MSR
/// takes no leg and is shown as such (not as an empty interval).
#[test]
fn a_plain_leg_is_held_to_each_load_limit() {
    let mut world = World::bridges([70, 100, 10]);
    world.load_limit("cms_3", 10);
    let e = world.fixed(&world.query("default", "local", None), 0.0);
    let choice = e.outcome.expect("chosen");
    assert_eq!((choice.msr.as_str(), choice.rule), ("cms_1", Rule::Draw));
    let outcome = |msr: &str| {
        e.candidates
            .iter()
            .find(|c| c.msr == msr)
            .map(|c| c.outcome)
    };
    assert_eq!(
        outcome("cms_2"),
        Some(CandidateOutcome::Full),
        "full at 100"
    );
    assert_eq!(
        outcome("cms_3"),
        Some(CandidateOutcome::OverLoadLimit),
        "10 ≥ limit 10"
    );
    // Issue 44: the weights are the kept candidate's only; cms_3 would
    // have weighed 90 had its limit not left it out.
    let weights: Vec<(&str, Option<f64>)> = e
        .candidates
        .iter()
        .map(|c| (c.msr.as_str(), c.weight))
        .collect();
    assert_eq!(
        weights,
        [("cms_1", Some(30.0)), ("cms_2", None), ("cms_3", None)]
    );
    assert_eq!(e.intervals.len(), 1);
    world.load("cms_1", 100);
    assert_eq!(
        world.pick(&world.query("default", "local", None)),
        Err(Refusal::MsrOverloaded)
    );
}

fn c(contact: &'static str, zone: &'static str, site: &'static str) -> Spec {
    Spec {
        contact,
        zone,
        site,
    }
}

/// Seed 000's worked example as restated in SPEC §7.
fn worked_example() -> World {
    let mut world = World::new();
    world
        .contact(c("con_1@msr_1", "default", "local"))
        .contact(c("con_2@msr_1", "default", "local"))
        .contact(c("con_1@msr_2", "default", "local"))
        .contact(c("con_1@msr_3", "default", "local"))
        .load("msr_1", 55)
        .load("msr_2", 40)
        .load("msr_3", 60)
        .coefficient("msr_2", 0.9)
        .coefficient("msr_3", 1.2);
    world
}

fn bounds(explanation: &Explanation) -> Vec<(String, f64, f64)> {
    explanation
        .intervals
        .iter()
        .map(|row| (row.msr.clone(), row.bottom, row.top))
        .collect()
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn worked_example_intervals_and_draw() {
    let world = worked_example();
    let query = world.query("default", "local", None);
    let explanation = world.fixed(&query, 58.0);
    let expected = [
        ("msr_1", 0.0, 45.0),
        ("msr_2", 45.0, 99.0),
        ("msr_3", 99.0, 147.0),
    ];
    let got = bounds(&explanation);
    assert_eq!(got.len(), 3);
    for ((msr, bottom, top), (want_msr, want_bottom, want_top)) in got.iter().zip(expected) {
        assert_eq!(msr, want_msr);
        assert!(
            approx(*bottom, want_bottom) && approx(*top, want_top),
            "{got:?}"
        );
    }
    assert!(approx(explanation.total, 147.0));
    let choice = explanation.outcome.expect("choice");
    assert_eq!(choice.msr, "msr_2");
    assert_eq!(choice.contact, "con_1@msr_2");
    assert!(!choice.media_bridge);
    // Step 4 kept the first contact of msr_1 by name.
    assert_eq!(explanation.intervals[0].contact, "con_1@msr_1");
    let dup = explanation
        .candidates
        .iter()
        .find(|c| c.contact == "con_2@msr_1")
        .expect("candidate");
    assert_eq!(dup.outcome, CandidateOutcome::DuplicateMsr);
}

#[test]
fn interval_edges() {
    let world = worked_example();
    let query = world.query("default", "local", None);
    let msr_at = |draw: f64| world.fixed(&query, draw).outcome.expect("choice").msr;
    assert_eq!(msr_at(0.0), "msr_1");
    assert_eq!(msr_at(44.999), "msr_1");
    assert_eq!(msr_at(45.0), "msr_2");
    assert_eq!(msr_at(99.0), "msr_3");
    assert_eq!(msr_at(146.999), "msr_3");
    let out = explain::<StdRng>(
        &world.table,
        world.operator.topology(),
        &query,
        Draw::Fixed(147.0),
    );
    assert!(matches!(out, Err(DrawOutOfRange { .. })));
    let out = explain::<StdRng>(
        &world.table,
        world.operator.topology(),
        &query,
        Draw::Fixed(-1.0),
    );
    assert!(matches!(out, Err(DrawOutOfRange { .. })));
}

#[test]
fn filter_zone() {
    let mut world = World::new();
    world
        .contact(c("a@msr_1", "default", "local"))
        .contact(c("a@msr_2", "rtk", "local"));
    let choice = world
        .pick(&world.query("rtk", "local", None))
        .expect("choice");
    assert_eq!(choice.msr, "msr_2");
    assert_eq!(
        world.pick(&world.query("nowhere", "local", None)),
        Err(Refusal::MsrNotFound)
    );
}

#[test]
fn filter_registered() {
    let mut world = World::new();
    world.contact(c("a@msr_1", "default", "local"));
    let mut query = world.query("default", "local", None);
    assert!(world.pick(&query).is_ok());
    query.now = world.now + Duration::from_secs(3600);
    assert_eq!(world.pick(&query), Err(Refusal::MsrNotFound));
}

#[test]
fn filter_active() {
    let mut world = World::new();
    world
        .contact(c("a@msr_1", "default", "local"))
        .contact(c("a@msr_2", "default", "local"));
    world.operator.set_active("msr_1", false).expect("active");
    world.operator_changed();
    for draw in [0.0, 50.0, 99.0] {
        let choice = world
            .fixed(&world.query("default", "local", None), draw)
            .outcome
            .expect("choice");
        assert_eq!(choice.msr, "msr_2");
    }
}

#[test]
fn only_min_distance_is_kept_and_ties_share() {
    let mut world = World::new();
    world
        .contact(c("a@msr_1", "default", "near"))
        .contact(c("a@msr_2", "default", "far"))
        .contact(c("a@msr_3", "default", "near"))
        .contact(c("a@msr_4", "default", "isolated"));
    let explanation = world.fixed(&world.query("default", "local", None), 150.0);
    assert_eq!(explanation.min_distance, Some(10.0));
    let kept: Vec<_> = explanation
        .intervals
        .iter()
        .map(|row| row.msr.as_str())
        .collect();
    assert_eq!(kept, ["msr_1", "msr_3"]);
    let outcome_of = |contact: &str| {
        explanation
            .candidates
            .iter()
            .find(|c| c.contact == contact)
            .map(|c| c.outcome)
    };
    assert_eq!(outcome_of("a@msr_2"), Some(CandidateOutcome::Farther));
    assert_eq!(
        outcome_of("a@msr_4"),
        Some(CandidateOutcome::InfiniteDistance)
    );
    assert_eq!(explanation.outcome.expect("choice").msr, "msr_3");
}

#[test]
fn own_site_drained_moves_traffic() {
    let mut world = World::new();
    world
        .contact(c("a@msr_1", "default", "local"))
        .contact(c("a@msr_2", "default", "near"));
    assert_eq!(
        world
            .pick(&world.query("default", "local", None))
            .expect("choice")
            .msr,
        "msr_1"
    );
    world
        .operator
        .set_distance("local", "local", 100.0)
        .expect("drain");
    assert_eq!(
        world
            .pick(&world.query("default", "local", None))
            .expect("choice")
            .msr,
        "msr_2"
    );
}

#[test]
fn msr_preference_kept() {
    let mut world = World::new();
    world
        .contact(c("a@msr_1", "default", "local"))
        .contact(c("a@msr_2", "default", "near"))
        .contact(c("b@msr_2", "default", "far"));
    // msr_2 is farther than msr_1, but preference (step 2) comes first.
    let explanation = world.fixed(&world.query("default", "local", Some("msr_2")), 0.0);
    let choice = explanation.outcome.expect("choice");
    assert_eq!(choice.msr, "msr_2");
    assert_eq!(choice.contact, "a@msr_2");
    assert!(!choice.media_bridge);
    assert!(!explanation.media_bridge);
    let other = explanation
        .candidates
        .iter()
        .find(|c| c.msr == "msr_1")
        .expect("candidate");
    assert_eq!(other.outcome, CandidateOutcome::OtherMsr);
}

#[test]
fn msr_preference_lost_needs_media_bridge() {
    let mut world = World::new();
    world
        .contact(c("a@msr_1", "default", "local"))
        .contact(c("a@msr_2", "rtk", "local"));
    let choice = world
        .pick(&world.query("default", "local", Some("msr_2")))
        .expect("choice");
    assert_eq!(choice.msr, "msr_1");
    assert!(choice.media_bridge);
    // An unknown MSR is lost the same way.
    let choice = world
        .pick(&world.query("default", "local", Some("msr_9")))
        .expect("choice");
    assert!(choice.media_bridge);
}

#[test]
fn all_infinite_is_msr_not_found() {
    let mut world = World::new();
    world
        .contact(c("a@msr_1", "default", "isolated"))
        .contact(c("a@msr_2", "default", "isolated"));
    let explanation = world.fixed(&world.query("default", "local", None), 0.0);
    assert_eq!(explanation.outcome, Err(Refusal::MsrNotFound));
    assert_eq!(explanation.min_distance, None);
    assert_eq!(Refusal::MsrNotFound.code().as_str(), "msr_not_found");
}

#[test]
fn all_full_is_msr_overloaded() {
    let mut world = World::new();
    world
        .contact(c("a@msr_1", "default", "local"))
        .contact(c("a@msr_2", "default", "local"))
        .load("msr_1", 100)
        .load("msr_2", 100);
    assert_eq!(
        world.pick(&world.query("default", "local", None)),
        Err(Refusal::MsrOverloaded)
    );
    assert_eq!(Refusal::MsrOverloaded.code().as_str(), "msr_overloaded");
    // One with room left takes every draw.
    world.load("msr_2", 99);
    let explanation = world.fixed(&world.query("default", "local", None), 0.5);
    assert_eq!(explanation.outcome.expect("choice").msr, "msr_2");
}

#[test]
fn undeclared_leg_site_is_unknown_site() {
    let mut world = World::new();
    world.contact(c("a@msr_1", "default", "local"));
    assert_eq!(
        world.pick(&world.query("default", "atlantis", None)),
        Err(Refusal::UnknownSite)
    );
    assert_eq!(Refusal::UnknownSite.code().as_str(), "unknown_site");
}

#[test]
fn missing_report_counts_as_idle_and_stale_is_used_as_is() {
    let mut world = World::new();
    world
        .contact(c("a@msr_1", "default", "local"))
        .contact(c("a@msr_2", "default", "local"))
        .load("msr_2", 50);
    let mut query = world.query("default", "local", None);
    query.now = world.now + Duration::from_secs(600);
    let explanation = world.fixed(&query, 0.0);
    let first = &explanation.intervals[0];
    assert_eq!(
        (first.load, first.reported, first.weight),
        (0, false, 100.0)
    );
    let second = &explanation.intervals[1];
    assert!(second.stale);
    assert_eq!(second.weight, 50.0);
}

/// Draws `n` times and returns the observed share of each MSR in the table.
fn shares(world: &World, query: &Query, seed: u64, n: u32) -> BTreeMap<String, f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..n {
        let choice =
            select(&world.table, world.operator.topology(), query, &mut rng).expect("choice");
        *counts.entry(choice.msr.to_string()).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(msr, count)| (msr, f64::from(count) / f64::from(n)))
        .collect()
}

#[test]
fn worked_example_draws_follow_weights() {
    let world = worked_example();
    let query = world.query("default", "local", None);
    let observed = shares(&world, &query, 2017, 100_000);
    for (msr, weight) in [("msr_1", 45.0), ("msr_2", 54.0), ("msr_3", 48.0)] {
        let expected = weight / 147.0;
        let got = observed.get(msr).copied().unwrap_or(0.0);
        assert!((got - expected).abs() < 0.01, "{msr}: {got} vs {expected}");
    }
}

/// One random contact: (msr index, contact index, zone, site, active, registered).
type ContactGen = (usize, usize, usize, usize, bool, bool);

/// The health of contact `if{i}@msr_{m}` in an arbitrary world: about one
/// contact in three is unhealthy, of each kind.
fn health_of(m: usize, i: usize) -> Health {
    match (m * 3 + i) % 9 {
        2 => Health::Unreachable,
        5 => Health::Stale,
        7 => Health::Unreported,
        _ => Health::Healthy,
    }
}

const ZONES: [&str; 2] = ["z0", "z1"];
const SITES: [&str; 4] = ["s0", "s1", "s2", "s3"];

fn arbitrary_world(
    distances: &[Option<u8>],
    contacts: &[ContactGen],
    loads: &[u8],
    coefficients: &[f64],
) -> World {
    let mut operator = OperatorConfig::new();
    for site in SITES {
        operator.declare_site(site).expect("declare");
    }
    let mut k = 0;
    for (i, a) in SITES.iter().enumerate() {
        for b in &SITES[i..] {
            let value = distances
                .get(k)
                .copied()
                .flatten()
                .map_or(f64::INFINITY, f64::from);
            operator.set_distance(a, b, value).expect("distance");
            k += 1;
        }
    }
    let now = Instant::now();
    let mut table = LoadTable::new("prop".into(), place("z0", "s0"));
    for &(m, i, zone, site, active, registered) in contacts {
        let msr = format!("msr_{m}");
        let contact = format!("if{i}@{msr}");
        operator
            .set_contact_zone(&contact, ZONES[zone])
            .expect("zone");
        operator
            .set_contact_site(&contact, SITES[site])
            .expect("site");
        operator.set_active(&msr, active).expect("active");
        let expires_at = if registered {
            now + Duration::from_secs(60)
        } else {
            now
        };
        let binding = Binding::test(&contact, &msr, "", expires_at);
        let health = health_of(m, i);
        table.apply(&operator, Change::BindingChanged(&binding));
        let since = (now, 0);
        table.apply(
            &operator,
            Change::HealthChanged {
                contact: &ContactName::test(&contact),
                health,
                since,
            },
        );
    }
    for (m, load) in loads.iter().enumerate() {
        let msr = format!("msr_{m}");
        let report = LoadReport {
            msr: msr.clone(),
            load: *load,
            cpu: 0,
            calls: 0,
            max_calls: 0,
            ..LoadReport::default()
        };
        let change = Change::LoadReported {
            msr: &MsrName::test(&msr),
            report,
            at: now,
        };
        table.apply(&operator, change);
    }
    for (m, coefficient) in coefficients.iter().enumerate() {
        operator
            .set_performance_coefficient(&format!("msr_{m}"), *coefficient)
            .expect("coefficient");
    }
    table.apply(&operator, Change::OperatorChanged);
    World {
        operator,
        table,
        now,
    }
}

proptest! {
    #[test]
    fn pick_is_in_zone_registered_active_at_min_distance(
        distances in proptest::collection::vec(proptest::option::of(0u8..30), 10),
        contacts in proptest::collection::vec((0usize..5, 0usize..3, 0usize..2, 0usize..4, any::<bool>(), any::<bool>()), 0..15),
        loads in proptest::collection::vec(0u8..=100, 5),
        coefficients in proptest::collection::vec(0.1f64..3.0, 5),
        zone in 0usize..2,
        site in 0usize..4,
        seed in any::<u64>(),
    ) {
        let world = arbitrary_world(&distances, &contacts, &loads, &coefficients);
        let query = world.query(ZONES[zone], SITES[site], None);
        let topology = world.operator.topology();
        let eligible: Vec<_> = world.table.rows(world.now).into_iter()
            .filter(|row| row.zone == ZONES[zone] && row.registered && row.active && row.health == Health::Healthy)
            .collect();
        let unhealthy_near = world.table.rows(world.now).into_iter()
            .filter(|row| row.zone == ZONES[zone] && row.registered && row.active && row.health != Health::Healthy)
            .any(|row| topology.distance(SITES[site], &row.site).is_some_and(f64::is_finite));
        let min = eligible.iter()
            .filter_map(|row| topology.distance(SITES[site], &row.site))
            .filter(|d| d.is_finite())
            .reduce(f64::min);
        let mut rng = StdRng::seed_from_u64(seed);
        match select(&world.table, topology, &query, &mut rng) {
            Ok(choice) => {
                let row = eligible.iter().find(|row| row.contact == choice.contact);
                prop_assert!(row.is_some(), "picked {} not eligible", choice.contact);
                let row = row.expect("checked");
                prop_assert_eq!(&row.msr, &choice.msr);
                prop_assert_eq!(topology.distance(SITES[site], &row.site), min);
                prop_assert!(row.load.as_ref().is_none_or(|r| r.load < 100));
            }
            Err(Refusal::MsrNotFound) => prop_assert!(min.is_none() && !unhealthy_near),
            Err(Refusal::MsrUnhealthy) => prop_assert!(min.is_none() && unhealthy_near),
            Err(Refusal::MsrOverloaded) => {
                prop_assert!(min.is_some());
                for row in &eligible {
                    if topology.distance(SITES[site], &row.site) == min {
                        prop_assert_eq!(row.load.as_ref().map(|r| r.load), Some(100));
                    }
                }
            }
            Err(Refusal::UnknownSite) => prop_assert!(false, "all sites are declared"),
            Err(Refusal::NoCapableMsr { .. }) => prop_assert!(false, "the query names no codec"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]
    #[test]
    fn draws_land_in_proportion_to_weight(
        loads in proptest::collection::vec(0u8..=95, 4),
        coefficients in proptest::collection::vec(0.2f64..3.0, 4),
        seed in any::<u64>(),
    ) {
        let contacts: Vec<ContactGen> = (0..4).map(|m| (m, 0, 0, 0, true, true)).collect();
        let world = arbitrary_world(&[Some(0)], &contacts, &loads, &coefficients);
        let query = world.query("z0", "s0", None);
        let weights: Vec<f64> = loads.iter().zip(&coefficients)
            .map(|(load, coefficient)| f64::from(100 - load) * coefficient)
            .collect();
        let total: f64 = weights.iter().sum();
        let observed = shares(&world, &query, seed, 100_000);
        for (m, weight) in weights.iter().enumerate() {
            let got = observed.get(&format!("msr_{m}")).copied().unwrap_or(0.0);
            let expected = weight / total;
            prop_assert!((got - expected).abs() < 0.01, "msr_{}: {} vs {}", m, got, expected);
        }
    }
}

/// The selection as first written (a direct transcription of SPEC §7, with a
/// lookup per candidate and owned strings throughout): the model the
/// optimised [`run`] must match exactly.
#[allow(clippy::too_many_lines)]
fn reference_run<R: rand::Rng + ?Sized>(
    table: &LoadTable,
    topology: &Topology,
    query: &Query,
    draw: Draw<'_, R>,
    detail: Detail,
) -> Result<Explanation, DrawOutOfRange> {
    let mut explanation = Explanation {
        media_bridge: false,
        candidates: Vec::new(),
        min_distance: None,
        intervals: Vec::new(),
        total: 0.0,
        draw: None,
        outcome: Err(Refusal::UnknownSite),
        rule: Rule::Draw,
        threshold: None,
    };
    if !topology.contains(&query.site) {
        return Ok(explanation);
    }

    // Step 1, by contact name (the index yields them by MSR, then contact);
    // every other contact of the zone is dropped there, for the first of
    // its reasons.
    let rows: Vec<_> = table
        .rows(query.now)
        .into_iter()
        .filter(|row| row.zone == query.zone)
        .collect();
    let mut dropped: Vec<ExplainedCandidate> = rows
        .iter()
        .filter_map(|row| {
            let outcome = if !row.active {
                CandidateOutcome::Inactive
            } else if !row.registered {
                CandidateOutcome::Unregistered
            } else {
                CandidateOutcome::unhealthy(row.health)?
            };
            Some(ExplainedCandidate {
                contact: row.contact.to_string(),
                msr: row.msr.to_string(),
                site: row.site.to_string(),
                distance: topology
                    .distance(&query.site, &row.site)
                    .unwrap_or(f64::INFINITY),
                health: row.health,
                outcome,
                weight: None,
            })
        })
        .collect();
    let mut candidates: Vec<Candidate<'_>> =
        table.candidates_in_zone(&query.zone, query.now).collect();
    candidates.sort_by(|a, b| a.contact.cmp(b.contact));
    let mut outcomes = vec![CandidateOutcome::Kept; candidates.len()];

    // Step 2.
    if let Some(preferred) = query.msr.as_deref() {
        if candidates.iter().any(|c| c.msr == preferred) {
            for (c, outcome) in candidates.iter().zip(&mut outcomes) {
                if c.msr != preferred {
                    *outcome = CandidateOutcome::OtherMsr;
                }
            }
        } else {
            explanation.media_bridge = true;
        }
    }

    // Step 3.
    let distances: Vec<f64> = candidates
        .iter()
        .map(|c| {
            topology
                .distance(&query.site, c.site)
                .unwrap_or(f64::INFINITY)
        })
        .collect();
    let min_distance = candidates
        .iter()
        .zip(&outcomes)
        .zip(&distances)
        .filter(|((_, outcome), d)| **outcome == CandidateOutcome::Kept && d.is_finite())
        .map(|(_, d)| *d)
        .reduce(f64::min);
    for (outcome, d) in outcomes.iter_mut().zip(&distances) {
        if *outcome != CandidateOutcome::Kept {
            continue;
        }
        if d.is_infinite() {
            *outcome = CandidateOutcome::InfiniteDistance;
        } else if Some(*d) != min_distance {
            *outcome = CandidateOutcome::Farther;
        }
    }

    // Step 4: candidates come sorted by contact name, so the first seen wins;
    // the map orders the interval table by MSR name.
    let mut per_msr: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, (c, outcome)) in candidates.iter().zip(&mut outcomes).enumerate() {
        if *outcome != CandidateOutcome::Kept {
            continue;
        }
        if per_msr.contains_key(c.msr.as_str()) {
            *outcome = CandidateOutcome::DuplicateMsr;
        } else {
            per_msr.insert(c.msr.as_str(), index);
        }
    }

    // Admission of a plain leg (SPEC §9): an MSR at or above its load
    // limit takes no leg (with the default limit of 100 its weight is 0).
    let mut nearest = false;
    per_msr.retain(|_, index| {
        nearest = true;
        let c = &candidates[*index];
        let load = c.load.unwrap_or(0).min(100);
        let full = load >= c.load_limit;
        if full {
            outcomes[*index] = if load >= 100 {
                CandidateOutcome::Full
            } else {
                CandidateOutcome::OverLoadLimit
            };
        }
        !full
    });

    // Step 5.
    let mut total = 0.0_f64;
    let mut intervals = Vec::with_capacity(per_msr.len());
    for index in per_msr.values() {
        let c = &candidates[*index];
        let load = c.load.unwrap_or(0).min(100);
        let weight = f64::from(100 - load) * c.performance_coefficient;
        intervals.push(IntervalRow {
            msr: c.msr.to_string(),
            contact: c.contact.to_string(),
            uri: c.uri.to_owned(),
            load,
            reported: c.load.is_some(),
            stale: c.stale,
            performance_coefficient: c.performance_coefficient,
            weight,
            bottom: total,
            top: total + weight,
        });
        total += weight;
    }
    explanation.min_distance = min_distance;
    explanation.total = total;
    if detail == Detail::Explanation {
        let weights: BTreeMap<&str, f64> = intervals
            .iter()
            .map(|row| (row.contact.as_str(), row.weight))
            .collect();
        let mut all: Vec<ExplainedCandidate> = candidates
            .iter()
            .zip(&outcomes)
            .zip(&distances)
            .map(|((c, outcome), d)| {
                let weight = weights.get(c.contact.as_str()).copied();
                let outcome = match (outcome, weight) {
                    (CandidateOutcome::Kept, Some(w)) if w <= 0.0 => CandidateOutcome::Full,
                    _ => *outcome,
                };
                // Only a contact that stays a candidate has a weight; a
                // dropped one (admission's too) shows why (issue 44).
                let weight = weight.filter(|_| outcome == CandidateOutcome::Kept);
                ExplainedCandidate {
                    contact: c.contact.to_string(),
                    msr: c.msr.to_string(),
                    site: c.site.to_owned(),
                    distance: *d,
                    health: Health::Healthy,
                    outcome,
                    weight,
                }
            })
            .collect();
        all.append(&mut dropped);
        all.sort_by(|a, b| a.contact.cmp(&b.contact));
        explanation.candidates = all;
    }
    let unhealthy_near = rows.iter().any(|row| {
        row.active
            && row.registered
            && row.health != Health::Healthy
            && topology
                .distance(&query.site, &row.site)
                .is_some_and(f64::is_finite)
    });

    // Step 6, then the draw.
    explanation.outcome = if intervals.is_empty() && !nearest && unhealthy_near {
        Err(Refusal::MsrUnhealthy)
    } else if intervals.is_empty() && !nearest {
        Err(Refusal::MsrNotFound)
    } else if intervals.is_empty() || total <= 0.0 {
        Err(Refusal::MsrOverloaded)
    } else {
        let value = match draw {
            Draw::Random(rng) => rng.gen_range(0.0..total),
            Draw::Fixed(value) if (0.0..total).contains(&value) => value,
            Draw::Fixed(value) => return Err(DrawOutOfRange { draw: value, total }),
        };
        explanation.draw = Some(value);
        let picked = intervals
            .iter()
            .find(|row| row.weight > 0.0 && value >= row.bottom && value < row.top)
            // Rounding can leave `value` a hair above the last top.
            .or_else(|| intervals.iter().rev().find(|row| row.weight > 0.0));
        match picked {
            Some(row) => Ok(Choice {
                engine: None,
                msr: MsrName::test(&row.msr),
                contact: ContactName::test(&row.contact),
                uri: row.uri.clone(),
                media_bridge: explanation.media_bridge,
                distance: min_distance.unwrap_or(0.0),
                draw: value,
                total,
                rule: Rule::Draw,
            }),
            None => Err(Refusal::MsrOverloaded),
        }
    };
    if detail == Detail::Explanation {
        // A full MSR has no interval (it is `full` among the candidates).
        intervals.retain(|row| row.weight > 0.0);
        explanation.intervals = intervals;
    }
    Ok(explanation)
}

proptest! {
    #[test]
    fn run_matches_the_reference(
        distances in proptest::collection::vec(proptest::option::of(0u8..4), 10),
        contacts in proptest::collection::vec((0usize..5, 0usize..3, 0usize..2, 0usize..4, any::<bool>(), any::<bool>()), 0..20),
        loads in proptest::collection::vec(prop_oneof![Just(100u8), 0u8..=100], 5),
        coefficients in proptest::collection::vec(0.1f64..3.0, 5),
        zone in 0usize..2,
        site in 0usize..5,
        msr in proptest::option::of(0usize..6),
        fraction in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let world = arbitrary_world(&distances, &contacts, &loads, &coefficients);
        // Site index 4 is undeclared.
        let leg_site = SITES.get(site).copied().unwrap_or("nowhere");
        let mut query = world.query(ZONES[zone], leg_site, None);
        query.msr = msr.map(|m| format!("msr_{m}"));
        let topology = world.operator.topology();
        let table = &world.table;

        // Explanations with a fixed draw.
        let probe = reference_run::<StdRng>(table, topology, &query, Draw::Fixed(0.0), Detail::Explanation);
        let total = probe.map_or_else(|e| e.total, |e| e.total);
        let value = total * fraction;
        let want = reference_run::<StdRng>(table, topology, &query, Draw::Fixed(value), Detail::Explanation);
        let got = run::<StdRng>(table, topology, &query, Draw::Fixed(value), Detail::Explanation);
        prop_assert_eq!(&got, &want);
        // The choice only: same outcome.
        let got = run::<StdRng>(table, topology, &query, Draw::Fixed(value), Detail::Choice);
        prop_assert_eq!(got.map(|e| e.outcome), want.map(|e| e.outcome));
        // Random draws: same generator state, same choice.
        let mut a = StdRng::seed_from_u64(seed);
        let mut b = StdRng::seed_from_u64(seed);
        for _ in 0..3 {
            let want = reference_run(table, topology, &query, Draw::Random(&mut a), Detail::Choice)
                .map(|e| e.outcome);
            prop_assert_eq!(
                run(table, topology, &query, Draw::Random(&mut b), Detail::Choice).map(|e| e.outcome),
                want
            );
        }
    }
}

/// SPEC §5 and §7 step 1: only healthy contacts are candidates; explain
/// lists every contact of the zone with its reason; a full MSR is `full`.
#[test]
fn unhealthy_contacts_are_dropped_and_every_contact_is_explained() {
    let mut world = World::new();
    world
        .contact(c("a@msr_1", "default", "local"))
        .contact(c("a@msr_2", "default", "local"))
        .contact(c("a@msr_3", "default", "local"))
        .contact(c("a@msr_4", "default", "local"))
        .contact(c("a@msr_5", "default", "local"))
        .contact(c("a@msr_6", "default", "local"))
        .load("msr_1", 40)
        .load("msr_2", 100);
    world.health("a@msr_3", Health::Unreachable);
    world.health("a@msr_4", Health::Stale);
    world.health("a@msr_5", Health::Unreported);
    world.operator.set_active("msr_6", false).expect("active");
    world.operator_changed();
    let query = world.query("default", "local", None);
    for _ in 0..50 {
        assert_eq!(
            world.pick(&query).map(|c| c.msr.to_string()),
            Ok("msr_1".to_owned())
        );
    }
    let explanation = world.fixed(&query, 0.0);
    let outcomes: Vec<(&str, &str, Option<f64>)> = explanation
        .candidates
        .iter()
        .map(|c| (c.contact.as_str(), c.outcome.as_str(), c.weight))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("a@msr_1", "kept", Some(60.0)),
            ("a@msr_2", "full", None),
            ("a@msr_3", "unreachable", None),
            ("a@msr_4", "stale", None),
            ("a@msr_5", "unreported", None),
            ("a@msr_6", "inactive", None),
        ]
    );
    assert_eq!(bounds(&explanation), [("msr_1".to_owned(), 0.0, 60.0)]);
}

/// The SPEC §5 fallback: with no healthy candidate left but unhealthy
/// ones at a finite distance, the leg is refused with `msr_unhealthy`
/// (never placed on an unhealthy MSR); with none at all, `msr_not_found`.
#[test]
fn nothing_healthy_left_is_refused_as_msr_unhealthy() {
    let mut world = World::new();
    world
        .contact(c("a@msr_1", "default", "local"))
        .contact(c("a@msr_2", "default", "isolated"))
        .load("msr_1", 10)
        .load("msr_2", 10);
    world.health("a@msr_1", Health::Unreachable);
    let query = world.query("default", "local", None);
    assert_eq!(world.pick(&query), Err(Refusal::MsrUnhealthy));
    let explanation = world.fixed(&query, 0.0);
    assert_eq!(explanation.outcome, Err(Refusal::MsrUnhealthy));
    assert_eq!(Refusal::MsrUnhealthy.code().as_str(), "msr_unhealthy");
    // An unhealthy MSR at infinite distance is no alternative.
    world.health("a@msr_1", Health::Healthy);
    world.health("a@msr_2", Health::Stale);
    world.operator.set_active("msr_1", false).expect("active");
    world.operator_changed();
    assert_eq!(world.pick(&query), Err(Refusal::MsrNotFound));
    // Back to healthy: selected again.
    world.operator.set_active("msr_1", true).expect("active");
    world.operator_changed();
    assert_eq!(
        world.pick(&query).map(|c| c.msr.to_string()),
        Ok("msr_1".to_owned())
    );
}

impl World {
    /// A report of `calls` of `max_calls` sessions for `msr` at `at`.
    fn report(&mut self, msr: &str, calls: u32, max_calls: u32, at: Instant) -> &mut Self {
        self.report_aged(msr, calls, max_calls, at, None)
    }

    /// [`World::report`] of a sample `sample_age_ms` old when it left.
    fn report_aged(
        &mut self,
        msr: &str,
        calls: u32,
        max_calls: u32,
        at: Instant,
        sample_age_ms: Option<u32>,
    ) -> &mut Self {
        let load = u8::try_from(calls * 100 / max_calls.max(1)).unwrap_or(100);
        let report = LoadReport {
            msr: msr.into(),
            load,
            cpu: 0,
            calls,
            max_calls,
            sample_age_ms,
            ..LoadReport::default()
        };
        self.table.apply(
            &self.operator,
            Change::LoadReported {
                msr: &MsrName::test(msr),
                report,
                at,
            },
        );
        self
    }

    fn pooled(&self, core_hosts: u32) -> Query {
        Query {
            policy: Policy::Pooled {
                core_hosts,
                headroom: Headroom::NONE,
            },
            ..self.query("default", "local", None)
        }
    }
}

/// Three MSRs at `local` reporting 50, 40 and 60 calls of 100.
fn three_reported() -> World {
    let mut w = World::new();
    let t = w.now;
    for (contact, msr, calls) in [
        ("lo@msr_1", "msr_1", 50),
        ("lo@msr_2", "msr_2", 40),
        ("lo@msr_3", "msr_3", 60),
    ] {
        w.contact(c(contact, "default", "local"))
            .report(msr, calls, 100, t);
    }
    w
}

#[test]
fn pooled_takes_the_lowest_reported_occupancy() {
    let w = three_reported();
    let choice = w.pick(&w.pooled(1)).expect("choice");
    assert_eq!((choice.msr.as_str(), choice.rule), ("msr_2", Rule::Pooled));
}

#[test]
fn pooled_counts_placements_since_the_report_times_the_core_hosts() {
    let mut w = three_reported();
    let t = w.now;
    // Four legs on msr_2 since its report: 40 + 4 = 44 < 50 with G = 1,
    // 40 + 3 x 4 = 52 > 50 with G = 3.
    for i in 1..=4 {
        w.table
            .note_placed("msr_2", t + Duration::from_millis(100 * i));
    }
    assert_eq!(w.pick(&w.pooled(1)).expect("choice").msr, "msr_2");
    assert_eq!(w.pick(&w.pooled(3)).expect("choice").msr, "msr_1");
    // Releases of legs this collector never placed (its own count is 0)
    // change nothing: no count goes below zero (SPEC §9).
    for i in 5..=9 {
        w.table
            .note_ended("msr_1", t + Duration::from_millis(100 * i));
    }
    assert_eq!(w.pick(&w.pooled(3)).expect("choice").msr, "msr_1");
}

#[test]
fn pooled_in_overload_keeps_the_headroom_free_on_every_msr() {
    // msr_1 at 98 of 100 and msr_2 (200 sessions) at 197: with G = 3 in
    // overload, one session of each is kept for the other hosts.
    let mut w = World::new();
    let t = w.now;
    w.contact(c("lo@msr_1", "default", "local"))
        .report("msr_1", 98, 100, t);
    w.contact(c("lo@msr_2", "default", "local"))
        .report("msr_2", 197, 200, t);
    let headroom = |h| Query {
        policy: Policy::Pooled {
            core_hosts: 3,
            headroom: Headroom::drawn(h, 0),
        },
        ..w.query("default", "local", None)
    };
    let scan = |q: &Query| w.fixed(q, 0.0).outcome;
    // Without a headroom the least occupied (98 %) takes it.
    assert_eq!(w.pick(&headroom(0)).expect("choice").msr, "msr_1");
    // 98 + 1 < 100 and 197 + 1 < 200: both still admitted, msr_1 least.
    assert_eq!(w.pick(&headroom(1)).expect("choice").msr, "msr_1");
    // 98 + 2 = 100: msr_1 is full with the headroom, msr_2 (199) is not.
    // The index finds msr_1 the least occupied, and leaves it to the scan.
    assert_eq!(w.pick(&headroom(2)).expect("choice").msr, "msr_2");
    assert_eq!(scan(&headroom(2)).expect("choice").msr, "msr_2");
    // 197 + 3 = 200: none left.
    assert_eq!(w.pick(&headroom(3)), Err(Refusal::MsrOverloaded));
    assert_eq!(scan(&headroom(3)), Err(Refusal::MsrOverloaded));
    // The explanation does not call them full: they have sessions free,
    // which the headroom keeps for the other hosts.
    let e = w.fixed(&headroom(3), 0.0);
    for c in &e.candidates {
        assert_eq!(c.outcome, CandidateOutcome::OverLoadLimit, "{}", c.msr);
    }
}

#[test]
fn a_small_msr_in_overload_keeps_its_last_session_for_some_selections() {
    // 20 sessions, 19 taken, G = 3 in overload: the headroom (one
    // session) is more than one in 40 of the MSR, so each selection's
    // draw keeps its last session with the probability 20 / 40
    // (`Headroom::of`), and the index and the scan read the draw alike.
    let mut w = World::new();
    let t = w.now;
    w.contact(c("lo@msr_1", "default", "local"))
        .report("msr_1", 19, 20, t);
    let mut refused = 0;
    let selections = 400;
    for draw in 0..selections {
        let q = Query {
            policy: Policy::Pooled {
                core_hosts: 3,
                headroom: Headroom::drawn(1, draw),
            },
            ..w.query("default", "local", None)
        };
        let picked = w.pick(&q).map(|choice| choice.msr);
        assert_eq!(picked, w.fixed(&q, 0.0).outcome.map(|choice| choice.msr));
        if picked == Err(Refusal::MsrOverloaded) {
            refused += 1;
        }
    }
    assert!(
        (140..=260).contains(&refused),
        "{refused} of {selections} refused, about half expected"
    );
    // Outside overload nothing is kept.
    let q = Query {
        policy: Policy::Pooled {
            core_hosts: 3,
            headroom: Headroom::NONE,
        },
        ..w.query("default", "local", None)
    };
    assert_eq!(w.pick(&q).expect("choice").msr, "msr_1");
}

#[test]
fn an_idle_msr_is_admitted_in_overload_whatever_its_size() {
    // An MSR of one session, idle: a headroom that keeps its only session
    // refuses every leg, and those refusals hold the zone in overload for
    // good, whatever the load.
    let mut w = World::new();
    let t = w.now;
    w.contact(c("lo@msr_1", "default", "local"))
        .report("msr_1", 0, 1, t);
    let q = Query {
        policy: Policy::Pooled {
            core_hosts: 3,
            headroom: Headroom::drawn(1, 0),
        },
        ..w.query("default", "local", None)
    };
    assert_eq!(w.pick(&q).expect("choice").msr, "msr_1");
    assert_eq!(w.fixed(&q, 0.0).outcome.expect("choice").msr, "msr_1");
}

#[test]
fn the_overload_watch_sets_the_headroom_and_counts_only_pooled_plain_outcomes() {
    use crate::model::overload::{OverloadWatch, ENTER};
    let w = three_reported();
    let mut watch = OverloadWatch::default();
    let pooled = w.pooled(3);
    let refused: Result<Choice, Refusal> = Err(Refusal::MsrOverloaded);
    // `ecss` outcomes, other refusals and the refusals of a leg held to
    // its other leg's MSR say nothing of overload.
    let ecss = w.query("default", "local", None);
    let pinned = Query {
        msr: Some("msr_1".into()),
        ..pooled.clone()
    };
    for _ in 0..ENTER {
        note_outcome(&mut watch, &pinned, &refused);
        note_outcome(&mut watch, &ecss, &refused);
        note_outcome(&mut watch, &pooled, &Err(Refusal::MsrNotFound));
    }
    let mut rng = StdRng::seed_from_u64(7);
    assert_eq!(
        pooled.policy.in_zone("default", &watch, &mut rng),
        pooled.policy
    );
    for _ in 0..ENTER {
        note_outcome(&mut watch, &pooled, &refused);
    }
    assert!(
        matches!(
            pooled.policy.in_zone("default", &watch, &mut rng),
            Policy::Pooled {
                core_hosts: 3,
                headroom: Headroom { sessions: 1, .. },
            }
        ),
        "one session kept at G = 3"
    );
    assert_eq!(
        Policy::Ecss.in_zone("default", &watch, &mut rng),
        Policy::Ecss
    );
    // One core host records nothing: no log line, no count, no headroom.
    let mut single = OverloadWatch::default();
    for _ in 0..ENTER {
        note_outcome(&mut single, &w.pooled(1), &refused);
    }
    assert!(single.take_changes().is_empty());
}

impl World {
    fn unfollowed(&self, core_hosts: u32, headroom: u32) -> Query {
        Query {
            policy: Policy::EcssUnfollowed {
                core_hosts,
                headroom: Headroom::drawn(headroom, 0),
                legs: true,
            },
            ..self.query("default", "local", None)
        }
    }
}

/// SPEC §10, "A selection without a leg" (module docs): the fallback's
/// sessions near the top count G times until a report covers them, and
/// admission holds each MSR to them; the draw's weights stay §7's.
#[test]
fn the_fallback_counts_its_own_placements_near_the_top_until_a_report() {
    let mut w = World::new();
    let t = w.now;
    // msr_1 at 97 of 100 (near the top), msr_2 at 50 (far below).
    w.contact(c("lo@msr_1", "default", "local"))
        .report("msr_1", 97, 100, t);
    w.contact(c("lo@msr_2", "default", "local"))
        .report("msr_2", 50, 100, t);
    let q = w.unfollowed(3, 0);
    let at = |ms| t + Duration::from_millis(ms);
    // Far below the top nothing is counted.
    let last = w.fixed(&q, 52.0).outcome.expect("choice");
    assert_eq!(last.msr, "msr_2");
    assert!(!w.table.note_unfollowed("msr_2", at(10)));
    // One session on msr_1 counts 3 (G): 97 + 3 = 100, full.
    let first = w.fixed(&q, 0.0).outcome;
    assert_eq!(first.as_ref().map(|c| c.msr.as_str()), Ok("msr_1"));
    assert!(note_unfollowed(
        &mut w.table,
        &Query {
            now: at(10),
            ..q.clone()
        },
        &first
    ));
    for seed in 0..32 {
        let mut rng = StdRng::seed_from_u64(seed);
        let choice = select(&w.table, w.operator.topology(), &q, &mut rng).expect("choice");
        assert_eq!(
            choice.msr, "msr_2",
            "the index leaves a full msr_1 to the scan"
        );
    }
    let e = w.fixed(&q, 0.0);
    let fate = |m: &str| e.candidates.iter().find(|c| c.msr == m).map(|c| c.outcome);
    assert_eq!(fate("msr_1"), Some(CandidateOutcome::Full));
    // Configured `ecss` is the seed's draw: it counts nothing.
    assert_eq!(
        w.fixed(&w.query("default", "local", None), 0.0)
            .outcome
            .map(|c| c.msr.to_string()),
        Ok("msr_1".to_owned())
    );
    // With one core host the same session counts once: 98 < 100.
    assert_eq!(
        w.fixed(&w.unfollowed(1, 0), 0.0)
            .outcome
            .map(|c| c.msr.to_string()),
        Ok("msr_1".to_owned())
    );
    // A report sampled after it covers it: 98 of 100, room again.
    w.report("msr_1", 98, 100, at(40) + DEFAULT_NOTIFY_FLIGHT_TIME);
    assert_eq!(
        w.fixed(&q, 0.0).outcome.map(|c| c.msr.to_string()),
        Ok("msr_1".to_owned())
    );
    // One that no report covers is forgotten after the horizon.
    assert!(w.table.note_unfollowed("msr_1", at(50)));
    assert_eq!(
        w.fixed(&q, 0.0).outcome.map(|c| c.msr.to_string()),
        Ok("msr_2".to_owned())
    );
    // The first, which the report covered, leaves nothing to forget.
    let horizon = crate::model::estimate::UNFOLLOWED_HORIZON;
    assert_eq!(w.table.poll_timeout(), Some(at(10) + horizon));
    w.table.handle_timeout(at(10) + horizon);
    assert_eq!(
        w.fixed(&q, 0.0).outcome.map(|c| c.msr.to_string()),
        Ok("msr_2".to_owned())
    );
    let due = w.table.poll_timeout().expect("a horizon");
    assert_eq!(due, at(50) + horizon);
    w.table.handle_timeout(due - Duration::from_millis(1));
    assert_eq!(
        w.fixed(&q, 0.0).outcome.map(|c| c.msr.to_string()),
        Ok("msr_2".to_owned())
    );
    w.table.handle_timeout(due);
    assert_eq!(w.table.poll_timeout(), None);
    assert_eq!(
        w.fixed(&q, 0.0).outcome.map(|c| c.msr.to_string()),
        Ok("msr_1".to_owned())
    );
    // Both full by the estimate: refused, and the refusal is an overload
    // outcome of the zone (with G > 1).
    w.report("msr_2", 99, 100, at(2000));
    assert!(w.table.note_unfollowed("msr_1", at(2001)));
    assert!(w.table.note_unfollowed("msr_2", at(2001)));
    let refused = w.pick(&Query {
        now: at(2002),
        ..q.clone()
    });
    assert_eq!(refused, Err(Refusal::MsrOverloaded));
    let mut watch = crate::model::overload::OverloadWatch::default();
    for _ in 0..crate::model::overload::ENTER {
        note_outcome(&mut watch, &q, &refused);
    }
    assert!(matches!(
        q.policy
            .in_zone("default", &watch, &mut StdRng::seed_from_u64(7)),
        Policy::EcssUnfollowed {
            core_hosts: 3,
            headroom: Headroom { sessions: 1, .. },
            legs: true,
        }
    ));
}

#[test]
fn one_core_host_never_puts_a_zone_in_overload() {
    use crate::model::overload::{Change, OverloadWatch, ENTER};
    let w = three_reported();
    let mut watch = OverloadWatch::default();
    let refused: Result<Choice, Refusal> = Err(Refusal::MsrOverloaded);
    // G = 1 keeps no headroom: no entry, no `zone in overload` line.
    for _ in 0..2 * ENTER {
        note_outcome(&mut watch, &w.pooled(1), &refused);
    }
    assert!(!watch.is_overloaded("default"));
    assert_eq!(watch.take_changes(), vec![]);
    // In with G = 3; G back to 1: out (and logged so) at once.
    for _ in 0..ENTER {
        note_outcome(&mut watch, &w.pooled(3), &refused);
    }
    assert!(watch.is_overloaded("default"));
    note_outcome(&mut watch, &w.pooled(1), &refused);
    assert!(!watch.is_overloaded("default"));
    assert_eq!(
        watch.take_changes(),
        vec![
            ("default".into(), Change::Entered),
            ("default".into(), Change::Left)
        ]
    );
}

#[test]
fn pooled_forgets_events_a_newer_report_covers_but_not_those_in_flight() {
    let mut w = three_reported();
    let t = w.now;
    for i in 1..=20 {
        w.table.note_placed("msr_2", t + Duration::from_millis(i));
    }
    assert_eq!(w.pick(&w.pooled(1)).expect("choice").msr, "msr_1");
    // A report sent at +30 ms (arriving at +50 ms, flight 20 ms) covers
    // them: msr_2 reports 45, the lowest again.
    w.report("msr_2", 45, 100, t + Duration::from_millis(50));
    assert_eq!(w.pick(&w.pooled(1)).expect("choice").msr, "msr_2");
    // A placement 10 ms before the next report's arrival is in flight: kept.
    w.table.note_placed("msr_2", t + Duration::from_millis(90));
    w.table.note_placed("msr_2", t + Duration::from_millis(91));
    w.table.note_placed("msr_2", t + Duration::from_millis(92));
    w.table.note_placed("msr_2", t + Duration::from_millis(93));
    w.table.note_placed("msr_2", t + Duration::from_millis(94));
    w.table.note_placed("msr_2", t + Duration::from_millis(95));
    w.report("msr_2", 45, 100, t + Duration::from_millis(100));
    assert_eq!(
        w.pick(&w.pooled(1)).expect("choice").msr,
        "msr_1",
        "45 + 6 > 50"
    );
}

/// SPEC §10: a report's `calls` is the MSR at its sample, `sample-age-ms`
/// and one flight before it arrived; this collector's placements after
/// that sample are not in it.
#[test]
fn pooled_dates_a_report_by_its_sample_age() {
    let picked = |age: Option<u32>| {
        let mut w = three_reported();
        let t = w.now;
        for i in 1..=4 {
            w.table
                .note_placed("msr_2", t + Duration::from_millis(100 + i));
        }
        w.report_aged("msr_2", 40, 100, t + Duration::from_millis(200), age);
        w.pick(&w.pooled(3)).expect("choice").msr
    };
    // Arrived at +200 ms: sent at +180 ms. Without an age the four
    // placements are in its 40 calls: msr_2 is the lowest with G = 3.
    assert_eq!(picked(None), "msr_2");
    // Its sample 150 ms old (taken at +30 ms): they are not, and with
    // G = 3 the others placed about as many: 40 + 4 + 2 x 4 = 52 > 50.
    assert_eq!(picked(Some(150)), "msr_1");
}

#[test]
fn pooled_divides_by_max_calls_not_by_the_coefficient_again() {
    let mut w = World::new();
    let t = w.now;
    w.contact(c("lo@small", "default", "local"))
        .report("small", 30, 100, t);
    w.contact(c("lo@big", "default", "local"))
        .report("big", 100, 200, t);
    // 30 / 100 < 100 / 200.
    assert_eq!(w.pick(&w.pooled(1)).expect("choice").msr, "small");
    // A coefficient of 2 on big (its size, already in max-calls) changes
    // nothing: a full big MSR must never look emptier than a small one.
    w.coefficient("big", 2.0);
    assert_eq!(w.pick(&w.pooled(1)).expect("choice").msr, "small");
}

#[test]
fn pooled_breaks_ties_at_random_and_ranks_unreported_last() {
    let mut w = World::new();
    let t = w.now;
    for (contact, msr) in [("lo@a", "a"), ("lo@b", "b"), ("lo@c", "c")] {
        w.contact(c(contact, "default", "local"))
            .report(msr, 10, 100, t);
    }
    w.contact(c("lo@fresh", "default", "local"));
    let mut rng = StdRng::seed_from_u64(3);
    let mut seen = BTreeMap::new();
    for _ in 0..300 {
        let choice =
            select(&w.table, w.operator.topology(), &w.pooled(1), &mut rng).expect("choice");
        *seen.entry(choice.msr).or_insert(0) += 1;
    }
    assert_eq!(
        seen.keys().map(MsrName::as_str).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    assert!(seen.values().all(|n| *n > 70), "{seen:?}");
}

#[test]
fn pooled_refuses_when_every_msr_is_full_by_the_estimate() {
    let mut w = World::new();
    let t = w.now;
    w.contact(c("lo@a", "default", "local"))
        .report("a", 99, 100, t);
    w.contact(c("lo@b", "default", "local"))
        .report("b", 100, 100, t);
    assert_eq!(w.pick(&w.pooled(1)).expect("choice").msr, "a");
    // One more leg on a: 100 of 100 by the estimate, though a last
    // reported 99 %: refused rather than sent to an MSR believed full
    // (SPEC §10).
    w.table.note_placed("a", t + Duration::from_millis(1));
    assert_eq!(w.pick(&w.pooled(1)), Err(Refusal::MsrOverloaded));
    assert_eq!(w.pick(&w.pooled(3)), Err(Refusal::MsrOverloaded));
}

#[test]
fn pooled_admits_an_msr_reported_full_once_own_legs_on_it_ended() {
    let mut w = World::new();
    let t = w.now;
    w.contact(c("lo@a", "default", "local"));
    for i in 0..100 {
        w.table.note_placed("a", t + Duration::from_millis(i));
    }
    w.report("a", 100, 100, t + Duration::from_millis(200));
    assert_eq!(w.pick(&w.pooled(1)), Err(Refusal::MsrOverloaded));
    // This collector released one of its legs there since the report.
    w.table.note_ended("a", t + Duration::from_millis(300));
    assert_eq!(w.pick(&w.pooled(1)).expect("choice").msr, "a");
    assert_eq!(w.pick(&w.pooled(3)).expect("choice").msr, "a");
}

/// Issue 24, defect a, in virtual time: the placement that triggers a
/// NOTIFY is in that NOTIFY's `calls`; counting it again as well made the
/// estimate one leg (G legs) high until the next report.
#[test]
fn pooled_counts_the_trigger_of_a_report_once() {
    let mut w = World::new();
    let t = w.now;
    w.contact(c("lo@a", "default", "local"))
        .report("a", 0, 2, t);
    w.contact(c("lo@b", "default", "local"))
        .report("b", 1, 2, t);
    // A leg on a at +100 ms triggers a NOTIFY (calls 1) sent at once that
    // arrives one flight (the default 20 ms) later.
    let placed = t + Duration::from_millis(100);
    w.table.note_placed("a", placed);
    w.report("a", 1, 2, placed + DEFAULT_NOTIFY_FLIGHT_TIME);
    // a holds 1 of 2, not 2 of 2: admitted, and level with b.
    let mut rng = StdRng::seed_from_u64(5);
    let mut seen = BTreeMap::new();
    for _ in 0..100 {
        let choice =
            select(&w.table, w.operator.topology(), &w.pooled(3), &mut rng).expect("choice");
        *seen.entry(choice.msr).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[test]
fn ecss_ignores_the_estimate() {
    let mut w = three_reported();
    let t = w.now;
    for i in 1..=50 {
        w.table.note_placed("msr_2", t + Duration::from_millis(i));
    }
    let e = w.fixed(&w.query("default", "local", None), 58.0);
    assert_eq!(e.rule, Rule::Draw);
    assert_eq!(e.intervals.len(), 3);
}

/// SPEC §15: what each MSR of a capability test takes.
impl World {
    /// A report of `load` for `msr` (no calls of 100), with `codecs` when
    /// it says what it takes (SPEC §15).
    fn takes(&mut self, msr: &str, load: u8, codecs: Option<&str>) -> &mut Self {
        let report = LoadReport {
            msr: msr.into(),
            load,
            cpu: load,
            max_calls: 100,
            codecs: codecs.map(msr_shared::media::CodecList::parse_lenient),
            ..LoadReport::default()
        };
        let at = self.now;
        self.table.apply(
            &self.operator,
            Change::LoadReported {
                msr: &MsrName::test(msr),
                report,
                at,
            },
        );
        self
    }

    /// `audio` takes PCMA and PCMU, `video` also H.264, `fax` PCMA and
    /// T.38, `old` did not say; all at `local`, equally loaded.
    fn media_pool() -> World {
        let mut world = World::new();
        world
            .contact(c("lo@audio", "default", "local"))
            .takes("audio", 10, Some("pcma,pcmu"))
            .contact(c("lo@video", "default", "local"))
            .takes("video", 10, Some("pcma,pcmu,h264"))
            .contact(c("lo@fax", "default", "local"))
            .takes("fax", 10, Some("pcma,t38"));
        world
    }

    fn needing(&self, codecs: &str) -> Query {
        Query {
            needs: codecs.parse().expect("known codecs"),
            ..self.query("default", "local", None)
        }
    }
}

/// SPEC §15: only MSRs that take one offered codec of each offered kind
/// are candidates; every draw lands on one of them.
#[test]
fn a_leg_with_needs_goes_only_to_an_msr_that_takes_them() {
    let world = World::media_pool();
    for (offer, only) in [
        ("pcmu,h264", vec!["video"]),
        ("g729,pcma,t38", vec!["fax"]),
        ("pcmu", vec!["audio", "video"]),
        ("", vec!["audio", "fax", "video"]),
    ] {
        let query = world.needing(offer);
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..50 {
            let choice = select(&world.table, world.operator.topology(), &query, &mut rng)
                .expect("a capable msr");
            assert!(
                only.contains(&choice.msr.as_str()),
                "{offer}: {}",
                choice.msr
            );
        }
    }
}

/// SPEC §15: an offer no MSR takes is refused `no_capable_msr`, naming the
/// kind none takes, and explain names what each MSR lacks.
#[test]
fn an_offer_nobody_takes_is_refused_with_what_is_missing() {
    let world = World::media_pool();
    let query = world.needing("pcma,vp8");
    let refusal = world.pick(&query).expect_err("nobody takes vp8");
    assert_eq!(refusal.code(), ErrorCode::NoCapableMsr);
    let Refusal::NoCapableMsr { lack, .. } = refusal else {
        panic!("{refusal:?}");
    };
    assert_eq!(lack.map(|l| l.to_string()).as_deref(), Some("video (vp8)"));
    // Video and T.38 exist, but not on one MSR.
    let both = world
        .pick(&world.needing("pcma,h264,t38"))
        .expect_err("split");
    assert!(
        matches!(both, Refusal::NoCapableMsr { lack: None, .. }),
        "{both:?}"
    );
    let explanation = world.fixed(&world.needing("h264"), 0.0);
    let outcome = |contact: &str| {
        explanation
            .candidates
            .iter()
            .find(|c| c.contact == contact)
            .map(|c| c.outcome)
    };
    assert_eq!(
        outcome("lo@audio").map(|o| o.to_string()),
        Some("incapable".into())
    );
    assert!(matches!(
        outcome("lo@fax"),
        Some(CandidateOutcome::Incapable(lack)) if lack.to_string() == "video (h264)"
    ));
    assert_eq!(outcome("lo@video"), Some(CandidateOutcome::Kept));
}

/// An MSR that did not report its codecs (an older agent, a config
/// without `<codec>`) takes anything, as before SPEC §15; with no MSR at
/// all the refusal stays `msr_not_found`.
#[test]
fn an_msr_that_did_not_say_takes_anything() {
    let mut world = World::media_pool();
    world
        .contact(c("lo@old", "default", "local"))
        .takes("old", 10, None);
    let choice = world.pick(&world.needing("vp8")).expect("old takes it");
    assert_eq!(choice.msr.as_str(), "old");
    let empty = World::new();
    assert_eq!(
        empty.pick(&empty.needing("pcma")),
        Err(Refusal::MsrNotFound)
    );
}

/// The other leg's MSR that does not take this leg's offer is passed over
/// as one without a candidate (SPEC §7 step 2: a media bridge).
#[test]
fn the_other_legs_msr_without_the_codec_means_a_media_bridge() {
    let world = World::media_pool();
    let query = Query {
        msr: Some("audio".into()),
        ..world.needing("h264")
    };
    let choice = world.pick(&query).expect("video takes it");
    assert_eq!(choice.msr.as_str(), "video");
    assert!(choice.media_bridge);
}

/// SPEC §15 item 4: a conference's new leg whose needs its host does not
/// take is refused, not split onto another bridge.
#[test]
fn a_conference_leg_its_host_cannot_take_is_refused_not_split() {
    let world = World::media_pool();
    let query = Query {
        needs: "h264".parse().expect("known"),
        ..world.conference("room", Some("audio"))
    };
    let refusal = world.pick(&query).expect_err("host lacks h264");
    assert!(
        matches!(
            refusal,
            Refusal::NoCapableMsr {
                conference_host: true,
                ..
            }
        ),
        "{refusal:?}"
    );
    // Explain says the same: the existing conference's rule, its host
    // incapable, no other MSR kept and no interval table.
    let explanation = world.fixed(&query, 0.0);
    assert_eq!(explanation.rule, Rule::ExistingConference);
    assert!(explanation.intervals.is_empty());
    assert!(explanation
        .candidates
        .iter()
        .all(|c| !matches!(c.outcome, CandidateOutcome::Kept | CandidateOutcome::Full)));
    assert!(explanation
        .candidates
        .iter()
        .any(|c| c.msr == "audio" && matches!(c.outcome, CandidateOutcome::Incapable(_))));
    // A leg it can take stays on its host.
    let query = Query {
        needs: "pcmu".parse().expect("known"),
        ..world.conference("room", Some("audio"))
    };
    assert_eq!(
        world.pick(&query).map(|c| c.msr.to_string()),
        Ok("audio".into())
    );
}

/// SPEC §15 with `pooled`: an audio call goes to an MSR that takes no
/// video while one has room, however empty the video MSR is, so video
/// calls find room there; only when the audio-only MSRs are full does it
/// spill over. A leg without an offer is ranked by occupancy alone.
#[test]
fn pooled_keeps_the_video_msrs_for_video_calls() {
    let pool = |audio_calls: u32| {
        let mut w = World::new();
        let t = w.now;
        for (msr, calls, codecs) in [
            ("audio", audio_calls, "pcma,pcmu"),
            ("video", 10, "pcma,pcmu,h264"),
        ] {
            let report = LoadReport {
                msr: msr.into(),
                load: u8::try_from(calls).unwrap_or(100),
                calls,
                max_calls: 100,
                codecs: Some(msr_shared::media::CodecList::parse_lenient(codecs)),
                ..LoadReport::default()
            };
            w.contact(c(
                if msr == "audio" {
                    "lo@audio"
                } else {
                    "lo@video"
                },
                "default",
                "local",
            ));
            w.table.apply(
                &w.operator,
                Change::LoadReported {
                    msr: &MsrName::test(msr),
                    report,
                    at: t,
                },
            );
        }
        w
    };
    let w = pool(80);
    let audio_call = Query {
        needs: "pcma".parse().expect("known"),
        ..w.pooled(1)
    };
    assert_eq!(
        w.pick(&audio_call).map(|c| c.msr.to_string()),
        Ok("audio".into())
    );
    assert_eq!(
        w.pick(&w.pooled(1)).map(|c| c.msr.to_string()),
        Ok("video".into())
    );
    let video_call = Query {
        needs: "pcma,h264".parse().expect("known"),
        ..w.pooled(1)
    };
    assert_eq!(
        w.pick(&video_call).map(|c| c.msr.to_string()),
        Ok("video".into())
    );
    let full = pool(100);
    let audio_call = Query {
        needs: "pcma".parse().expect("known"),
        ..full.pooled(1)
    };
    assert_eq!(
        full.pick(&audio_call).map(|c| c.msr.to_string()),
        Ok("video".into())
    );
}

/// `world` with the MSRs' reports (`calls`: calls and `max-calls` of
/// `msr_{m}`, at `loads[m]`), load limits, this collector's placements and
/// G, as the index properties below draw them.
fn reported_world(
    mut world: World,
    loads: &[u8],
    calls: &[Option<(u32, u32)>],
    limits: &[u32],
    placed: &[usize],
    core_hosts: u32,
) -> World {
    let now = world.now;
    for (m, c) in calls.iter().enumerate() {
        let Some((calls, max_calls)) = *c else {
            continue;
        };
        let msr = format!("msr_{m}");
        let report = LoadReport {
            msr: msr.clone(),
            load: loads[m],
            calls,
            max_calls,
            ..LoadReport::default()
        };
        let change = Change::LoadReported {
            msr: &MsrName::test(&msr),
            report,
            at: now,
        };
        world.table.apply(&world.operator, change);
    }
    for (m, limit) in limits.iter().enumerate() {
        world
            .operator
            .set_load_limit(&format!("msr_{m}"), *limit)
            .expect("limit");
    }
    world.table.apply(&world.operator, Change::OperatorChanged);
    for m in placed {
        world.table.note_placed(&format!("msr_{m}"), now);
    }
    world.table.set_core_hosts(core_hosts);
    world
}

proptest! {
    // The index declines about 3 queries in 4 of these small worlds (a
    // named MSR with a candidate, several nearest sites, no candidate at
    // all): more cases for those it answers.
    #![proptest_config(ProptestConfig::with_cases(1024))]
    /// The index (`indexed.rs`) answers as the scan does: the same
    /// refusals, and for a choice the same contacts kept — under `ecss`
    /// each with its interval's weight, under `pooled` the admitted ones
    /// with their estimated occupancy — so its one draw over them has the
    /// scan's distribution, and the choice is one of them (under `pooled`
    /// one of the least occupied).
    #[test]
    fn the_index_keeps_what_the_scan_keeps(
        distances in proptest::collection::vec(proptest::option::of(0u8..4), 10),
        // Mostly registered: the index answers only while every indexed
        // contact of the zone is.
        contacts in proptest::collection::vec(
            (0usize..5, 0usize..3, 0usize..2, 0usize..4, any::<bool>(), proptest::bool::weighted(0.95)),
            0..20,
        ),
        loads in proptest::collection::vec(prop_oneof![Just(100u8), 0u8..=100], 5),
        coefficients in proptest::collection::vec(0.1f64..3.0, 5),
        calls in proptest::collection::vec(proptest::option::of((0u32..6, 0u32..6)), 5),
        limits in proptest::collection::vec(prop_oneof![Just(100u32), 1u32..=100], 5),
        placed in proptest::collection::vec(0usize..5, 0..6),
        zone in 0usize..2,
        site in 0usize..5,
        msr in proptest::option::weighted(0.2, 0usize..6),
        core_hosts in 1u32..4,
        seed in any::<u64>(),
    ) {
        let world = reported_world(
            arbitrary_world(&distances, &contacts, &loads, &coefficients),
            &loads,
            &calls,
            &limits,
            &placed,
            core_hosts,
        );
        let now = world.now;
        let leg_site = SITES.get(site).copied().unwrap_or("nowhere");
        let topology = world.operator.topology();
        let table = &world.table;
        for policy in [
            Policy::Ecss,
            Policy::Pooled {
                core_hosts,
                headroom: Headroom::NONE,
            },
        ] {
            let mut query = world.query(ZONES[zone], leg_site, None);
            query.msr = msr.map(|m| format!("msr_{m}"));
            query.policy = policy;
            let mut rng = StdRng::seed_from_u64(seed);
            let Some(indexed) = select_indexed(table, topology, &query, &mut rng) else {
                continue;
            };
            let scan = run::<StdRng>(table, topology, &query, Draw::Fixed(0.0), Detail::Choice)
                .expect("a draw of 0 is in range");
            let choice = match (indexed, scan.outcome) {
                (Err(got), Err(want)) => {
                    prop_assert_eq!(got, want);
                    continue;
                }
                (Ok(choice), Ok(want)) => {
                    prop_assert_eq!(choice.media_bridge, want.media_bridge);
                    prop_assert_eq!(choice.distance, want.distance);
                    prop_assert_eq!(choice.rule, want.rule);
                    choice
                }
                (got, want) => {
                    prop_assert!(false, "index {:?}, scan {:?}", got, want);
                    continue;
                }
            };
            // What the scan keeps, by position in the zone's view.
            let view = table.zone(&query.zone);
            let from = topology.distances_from(leg_site).expect("declared");
            let column = view.distances(&from);
            let steps = steps_1_to_4(&view, &column, &query);
            let kept = admit(&view, &query, steps.kept).kept;
            let nearest = table
                .indexed_zone(&query.zone, query.msr.as_deref(), now)
                .and_then(|zone| zone.nearest(&from))
                .expect("answered");
            let units = nearest.units();
            let chosen = units
                .iter()
                .map(|u| u.0)
                .find(|p| view.candidate(*p, now).is_some_and(|c| *c.contact == *choice.contact));
            prop_assert!(chosen.is_some_and(|p| kept.contains(&p)), "{} not kept", choice.contact);
            match policy {
                Policy::Ecss | Policy::EcssUnfollowed { .. } => {
                    let want: Vec<(usize, f64)> = kept
                        .iter()
                        .map(|&p| (p, weight(view.weight_inputs(p)).1))
                        .filter(|(_, w)| *w > 0.0)
                        .collect();
                    let got: Vec<(usize, f64)> =
                        units.iter().filter(|u| u.1 > 0.0).map(|u| (u.0, u.1)).collect();
                    prop_assert_eq!(got, want);
                }
                Policy::Pooled { core_hosts, .. } => {
                    let want: Vec<(usize, f64)> = kept
                        .iter()
                        .map(|&p| (p, estimated_occupancy(&view, p, core_hosts)))
                        .collect();
                    let got: Vec<(usize, f64)> =
                        units.iter().filter_map(|u| Some((u.0, u.2?))).collect();
                    prop_assert_eq!(&got, &want);
                    let least = want.iter().map(|w| w.1).fold(f64::INFINITY, f64::min);
                    let key = got.iter().find(|u| Some(u.0) == chosen).map(|u| u.1);
                    prop_assert!(key == Some(least) || (least.is_infinite() && key.is_some_and(f64::is_infinite)));
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]
    /// In overload (`pooled` with a headroom) the index answers as the
    /// scan does: the same refusal, or a choice the scan admits with the
    /// headroom and that is one of its least occupied.
    #[test]
    fn with_a_headroom_the_index_answers_as_the_scan(
        distances in proptest::collection::vec(proptest::option::of(0u8..4), 10),
        contacts in proptest::collection::vec(
            (0usize..5, 0usize..3, 0usize..2, 0usize..4, any::<bool>(), proptest::bool::weighted(0.95)),
            0..20,
        ),
        loads in proptest::collection::vec(prop_oneof![Just(100u8), 0u8..=100], 5),
        coefficients in proptest::collection::vec(0.1f64..3.0, 5),
        // Large MSRs too, whose headroom is more than one session.
        calls in proptest::collection::vec(proptest::option::of(prop_oneof![
            (0u32..6, 0u32..6),
            (150u32..=400, 150u32..=400),
        ]), 5),
        limits in proptest::collection::vec(prop_oneof![Just(100u32), 80u32..=100], 5),
        placed in proptest::collection::vec(0usize..5, 0..6),
        zone in 0usize..2,
        site in 0usize..5,
        core_hosts in 2u32..12,
        seed in any::<u64>(),
    ) {
        let world = reported_world(
            arbitrary_world(&distances, &contacts, &loads, &coefficients),
            &loads,
            &calls,
            &limits,
            &placed,
            core_hosts,
        );
        let now = world.now;
        let leg_site = SITES.get(site).copied().unwrap_or("nowhere");
        let topology = world.operator.topology();
        let table = &world.table;
        let headroom = crate::model::overload::headroom(core_hosts);
        let mut query = world.query(ZONES[zone], leg_site, None);
        query.policy = Policy::Pooled {
            core_hosts,
            headroom: Headroom::drawn(headroom, seed),
        };
        let mut rng = StdRng::seed_from_u64(seed);
        let Some(indexed) = select_indexed(table, topology, &query, &mut rng) else {
            return Ok(());
        };
        let scan = run::<StdRng>(table, topology, &query, Draw::Fixed(0.0), Detail::Choice)
            .expect("a draw of 0 is in range");
        let choice = match (indexed, scan.outcome) {
            (Err(got), Err(want)) => {
                prop_assert_eq!(got, want);
                return Ok(());
            }
            (Ok(choice), Ok(want)) => {
                prop_assert_eq!(choice.media_bridge, want.media_bridge);
                prop_assert_eq!(choice.distance, want.distance);
                prop_assert_eq!(choice.rule, want.rule);
                choice
            }
            (got, want) => {
                prop_assert!(false, "index {:?}, scan {:?}", got, want);
                return Ok(());
            }
        };
        let view = table.zone(&query.zone);
        let from = topology.distances_from(leg_site).expect("declared");
        let column = view.distances(&from);
        let steps = steps_1_to_4(&view, &column, &query);
        let kept = admit(&view, &query, steps.kept).kept;
        let chosen = kept
            .iter()
            .copied()
            .find(|p| view.candidate(*p, now).is_some_and(|c| *c.contact == *choice.contact));
        prop_assert!(chosen.is_some(), "{} not admitted with the headroom", choice.contact);
        let least = kept
            .iter()
            .map(|&p| estimated_occupancy(&view, p, core_hosts))
            .fold(f64::INFINITY, f64::min);
        let key = chosen.map(|p| estimated_occupancy(&view, p, core_hosts));
        prop_assert!(key == Some(least) || (least.is_infinite() && key.is_some_and(f64::is_infinite)));
    }
}
