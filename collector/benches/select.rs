//! One selection (SPEC §7) over 1,000 MSRs × 4 contacts spread over 20 zones
//! and 50 sites; and the worst case for steps 1–4: 1,000 and 10,000 MSRs ×
//! 1 contact, all in one zone and one site (every contact is a candidate at
//! the minimum distance). Both policies, with and without a leg's Call-ID
//! (bound and released on a table of 100,000 live legs). Each table is
//! told G = 3, the `pooled` queries' (SPEC §12). Every MSR reports codecs as the seed's does (SPEC §15: PCMA,
//! PCMU, G.722; every third also H.264 and T.38), and each case runs with
//! and without a leg's offer (`needs`), which step 1 checks per candidate.

use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use msr_collector::model::legs::{LegKey, LegTable, DEFAULT_MAX_DURATION};
use msr_collector::model::load_table::{Change, LoadTable, Placement};
use msr_collector::operator::names::{ContactName, MsrName};
use msr_collector::operator::OperatorConfig;
use msr_collector::select::{select, Admission, Headroom, Policy, Query};
use msr_collector::sip::registrar::Binding;
use msr_shared::event_package::LoadReport;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

const MSRS: usize = 1_000;
const CONTACTS_PER_MSR: usize = 4;
const ZONES: usize = 20;
const SITES: usize = 50;

fn world() -> (OperatorConfig, LoadTable, Instant) {
    let mut rng = StdRng::seed_from_u64(42);
    let mut operator = OperatorConfig::new();
    for s in 0..SITES {
        operator
            .declare_site(&format!("site_{s}"))
            .expect("declare");
    }
    // Each site is 10 from its two neighbours and 20 from the next ones.
    for s in 0..SITES {
        for (step, distance) in [(1, 10.0), (2, 20.0)] {
            let t = (s + step) % SITES;
            operator
                .set_distance(&format!("site_{s}"), &format!("site_{t}"), distance)
                .expect("distance");
        }
    }
    let now = Instant::now();
    let mut table = LoadTable::new("bench".into(), place("zone_0", "site_0"));
    for m in 0..MSRS {
        let msr = format!("msr_{m}");
        operator
            .set_performance_coefficient(&msr, rng.gen_range(0.5..2.0))
            .expect("coefficient");
        for c in 0..CONTACTS_PER_MSR {
            let contact = format!("eth{c}@{msr}");
            operator
                .set_contact_zone(&contact, &format!("zone_{}", (m + c) % ZONES))
                .expect("zone");
            operator
                .set_contact_site(&contact, &format!("site_{}", rng.gen_range(0..SITES)))
                .expect("site");
            let binding = binding(contact, &msr, now);
            table.apply(&operator, Change::BindingChanged(&binding));
        }
        report_random_load(&mut table, &operator, &msr, &mut rng, now);
    }
    table.apply(&operator, Change::OperatorChanged);
    table.set_core_hosts(3);
    (operator, table, now)
}

/// A leg table of 100,000 live legs over 1,000 MSRs, bound at `now`.
fn live_legs(now: Instant) -> LegTable {
    let mut legs = LegTable::new(DEFAULT_MAX_DURATION);
    for i in 0..100_000u32 {
        let call_id = format!("{i:08x}-background@core1");
        let key = LegKey {
            call_id: &call_id,
            leg: None,
        };
        let msr = MsrName::new(&format!("msr_{}", i % 1000)).expect("a bench's msr name");
        let contact = ContactName::of("eth0", &msr).expect("a bench's contact name");
        legs.bind(now, key, &msr, &contact, None);
    }
    legs
}

/// SPEC §9: a leg's select (bound to its choice) and its release, on a
/// table that already holds 100,000 live legs; each iteration a new
/// Call-ID, as a core's calls are.
fn bench_with_call_id(
    c: &mut Criterion,
    name: &str,
    (operator, table, now): (&OperatorConfig, &LoadTable, Instant),
    query: &Query,
) {
    let mut legs = live_legs(now);
    let call_ids: Vec<String> = (0..4096u32)
        .map(|i| format!("{i:08x}-bench@core1"))
        .collect();
    let mut next = 0usize;
    let mut rng = StdRng::seed_from_u64(1);
    c.bench_function(name, |b| {
        b.iter(|| {
            let call_id = &call_ids[next % call_ids.len()];
            next += 1;
            let key = LegKey { call_id, leg: None };
            if let Ok(choice) = select(
                black_box(table),
                operator.topology(),
                black_box(query),
                &mut rng,
            ) {
                legs.bind(now, key, &choice.msr, &choice.contact, None);
            }
            black_box(legs.release(call_id, None))
        })
    });
}

fn bench_select(c: &mut Criterion) {
    let (operator, table, now) = world();
    let query = Query {
        zone: "zone_7".into(),
        site: "site_13".into(),
        msr: Some("msr_7".into()),
        admission: Admission::Plain,
        policy: Policy::Ecss,
        failed: Vec::new(),
        needs: msr_shared::media::CodecSet::EMPTY,
        now,
    };
    let no_preference = Query {
        msr: None,
        ..query.clone()
    };
    let mut rng = StdRng::seed_from_u64(1);
    c.bench_function("select 1000 msr x 4 contacts, 20 zones, 50 sites", |b| {
        b.iter(|| {
            select(
                black_box(&table),
                operator.topology(),
                black_box(&no_preference),
                &mut rng,
            )
        })
    });
    bench_with_call_id(
        c,
        "select with call_id + release, 1000 msr x 4, 100k live legs",
        (&operator, &table, now),
        &no_preference,
    );
    let pooled = Query {
        policy: Policy::Pooled {
            core_hosts: 3,
            headroom: Headroom::NONE,
        },
        ..no_preference.clone()
    };
    bench_with_call_id(
        c,
        "select pooled with call_id + release, 1000 msr x 4, 100k live legs",
        (&operator, &table, now),
        &pooled,
    );
    c.bench_function(
        "select pooled 1000 msr x 4 contacts, 20 zones, 50 sites",
        |b| {
            b.iter(|| {
                select(
                    black_box(&table),
                    operator.topology(),
                    black_box(&pooled),
                    &mut rng,
                )
            })
        },
    );
    // SPEC §15: an offer of G.711 and H.264, which a third of the MSRs take.
    let video = Query {
        needs: "pcma,pcmu,h264".parse().expect("known codecs"),
        ..no_preference.clone()
    };
    c.bench_function(
        "select with needs 1000 msr x 4 contacts, 20 zones, 50 sites",
        |b| {
            b.iter(|| {
                select(
                    black_box(&table),
                    operator.topology(),
                    black_box(&video),
                    &mut rng,
                )
            })
        },
    );
    let pooled_video = Query {
        policy: Policy::Pooled {
            core_hosts: 3,
            headroom: Headroom::NONE,
        },
        ..video
    };
    c.bench_function(
        "select pooled with needs 1000 msr x 4 contacts, 20 zones, 50 sites",
        |b| {
            b.iter(|| {
                select(
                    black_box(&table),
                    operator.topology(),
                    black_box(&pooled_video),
                    &mut rng,
                )
            })
        },
    );
    c.bench_function("select with msr preference", |b| {
        b.iter(|| {
            select(
                black_box(&table),
                operator.topology(),
                black_box(&query),
                &mut rng,
            )
        })
    });
}

/// The collector's `[defaults]` of a bench table.
fn place(zone: &str, site: &str) -> Placement {
    Placement::new(zone, site).expect("a bench's placement")
}

/// A binding of `contact` of `msr`, registered for an hour from `now`.
fn binding(contact: String, msr: &str, now: Instant) -> Binding {
    Binding {
        msr: MsrName::new(msr).expect("a bench's msr name"),
        contact: ContactName::new(&contact).expect("a bench's contact name"),
        uri: format!("sip:{msr}@10.0.0.1:5040"),
        engine: None,
        version: None,
        expires_at: now + Duration::from_secs(3600),
        call_id: "bench".into(),
        cseq: 1,
        branch: None,
        source: None,
    }
}

/// Gives `msr` a load report with a random load (0–100 %).
fn report_random_load(
    table: &mut LoadTable,
    operator: &OperatorConfig,
    msr: &str,
    rng: &mut StdRng,
    now: Instant,
) {
    let load = rng.gen_range(0..=100);
    let video = msr
        .trim_start_matches("msr_")
        .parse::<usize>()
        .is_ok_and(|m| m % 3 == 0);
    let codecs = if video {
        "pcma,pcmu,g722,h264,t38"
    } else {
        "pcma,pcmu,g722"
    };
    let report = LoadReport {
        msr: msr.to_owned(),
        load,
        cpu: load,
        calls: 0,
        max_calls: 8192,
        codecs: Some(msr_shared::media::CodecList::parse_lenient(codecs)),
        ..LoadReport::default()
    };
    let change = Change::LoadReported {
        msr: &MsrName::new(msr).expect("a bench's msr name"),
        report,
        at: now,
    };
    table.apply(operator, change);
}

/// `msrs` MSRs × 1 contact, all in zone "default" and site "local".
fn one_zone_world(msrs: usize) -> (OperatorConfig, LoadTable, Instant) {
    let mut rng = StdRng::seed_from_u64(42);
    let mut operator = OperatorConfig::new();
    operator.declare_site("local").expect("declare");
    let now = Instant::now();
    let mut table = LoadTable::new("bench".into(), place("default", "local"));
    for m in 0..msrs {
        let msr = format!("msr_{m}");
        let binding = binding(format!("eth0@{msr}"), &msr, now);
        table.apply(&operator, Change::BindingChanged(&binding));
        report_random_load(&mut table, &operator, &msr, &mut rng, now);
    }
    table.apply(&operator, Change::OperatorChanged);
    table.set_core_hosts(3);
    (operator, table, now)
}

/// Resident memory of this process, KiB (`VmRSS` in `/proc/self/status`).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Memory per live leg (SPEC §9: a million live legs must fit): RSS before
/// and after binding 1,000,000 legs with realistic Call-IDs (36 bytes, like
/// a UUID@host), over 1,000 MSRs; printed, not timed.
fn memory_per_leg(_c: &mut Criterion) {
    let now = Instant::now();
    let before = rss_kib();
    let mut legs = LegTable::new(DEFAULT_MAX_DURATION);
    for i in 0..1_000_000u32 {
        let call_id = format!("{i:08x}-4c2e-9a1f-7d03@core1.example");
        let msr = MsrName::new(&format!("msr_{}", i % 1000)).expect("a bench's msr name");
        let contact = ContactName::of("eth0", &msr).expect("a bench's contact name");
        legs.bind(
            now,
            LegKey {
                call_id: &call_id,
                leg: None,
            },
            &msr,
            &contact,
            None,
        );
    }
    let after = rss_kib();
    println!(
        "legs: {} live, RSS {} KiB -> {} KiB: {:.0} bytes per leg (heap estimate {:.0})",
        legs.len(),
        before,
        after,
        (after.saturating_sub(before) * 1024) as f64 / legs.len() as f64,
        legs.heap_bytes() as f64 / legs.len() as f64
    );
    black_box(&legs);
}

fn bench_select_one_zone(c: &mut Criterion) {
    let (operator, table, now) = one_zone_world(MSRS);
    let query = Query {
        zone: "default".into(),
        site: "local".into(),
        msr: None,
        admission: Admission::Plain,
        policy: Policy::Ecss,
        failed: Vec::new(),
        needs: msr_shared::media::CodecSet::EMPTY,
        now,
    };
    let mut rng = StdRng::seed_from_u64(1);
    c.bench_function("select 1000 msr x 1 contact, 1 zone, 1 site", |b| {
        b.iter(|| {
            select(
                black_box(&table),
                operator.topology(),
                black_box(&query),
                &mut rng,
            )
        })
    });
    // SPEC §15: the same with an offer a third of them take.
    let video = Query {
        needs: "pcma,pcmu,h264".parse().expect("known codecs"),
        ..query.clone()
    };
    c.bench_function(
        "select with needs 1000 msr x 1 contact, 1 zone, 1 site",
        |b| {
            b.iter(|| {
                select(
                    black_box(&table),
                    operator.topology(),
                    black_box(&video),
                    &mut rng,
                )
            })
        },
    );
    // SPEC §10: the `pooled` estimate over the same 1,000 candidates.
    let pooled = Query {
        policy: Policy::Pooled {
            core_hosts: 3,
            headroom: Headroom::NONE,
        },
        ..query.clone()
    };
    c.bench_function("select pooled 1000 msr x 1 contact, 1 zone, 1 site", |b| {
        b.iter(|| {
            select(
                black_box(&table),
                operator.topology(),
                black_box(&pooled),
                &mut rng,
            )
        })
    });
    bench_with_call_id(
        c,
        "select with call_id + release, 1000 msr x 1 contact, 1 zone, 1 site",
        (&operator, &table, now),
        &query,
    );
    bench_with_call_id(
        c,
        "select pooled with call_id + release, 1000 msr x 1 contact, 1 zone, 1 site",
        (&operator, &table, now),
        &pooled,
    );
    // 10,000 equally near MSRs.
    let (operator, table, now) = one_zone_world(10 * MSRS);
    let query = Query { now, ..query };
    let pooled = Query { now, ..pooled };
    for (name, query) in [
        ("select 10000 msr x 1 contact, 1 zone, 1 site", &query),
        (
            "select pooled 10000 msr x 1 contact, 1 zone, 1 site",
            &pooled,
        ),
    ] {
        c.bench_function(name, |b| {
            b.iter(|| {
                select(
                    black_box(&table),
                    operator.topology(),
                    black_box(query),
                    &mut rng,
                )
            })
        });
    }
}

/// What a snapshot for the read-only selections costs the core: the load
/// table and the topology copied, 1,000 and 10,000 MSRs.
fn bench_snapshot(c: &mut Criterion) {
    for msrs in [1_000, 10_000] {
        let (operator, table, _) = one_zone_world(msrs);
        c.bench_function(&format!("snapshot {msrs} msr x 1 contact"), |b| {
            b.iter(|| black_box((table.clone(), operator.topology().clone())))
        });
    }
    let (operator, table, _) = world();
    c.bench_function("snapshot 1000 msr x 4 contacts, 20 zones, 50 sites", |b| {
        b.iter(|| black_box((table.clone(), operator.topology().clone())))
    });
}

criterion_group!(
    benches,
    bench_select,
    bench_select_one_zone,
    bench_snapshot,
    memory_per_leg
);
criterion_main!(benches);
