//! Criterion benchmark of the collector core's NOTIFY path, with nothing
//! else running: 1,000 MSRs subscribed (restored bindings, each SUBSCRIBE
//! answered 200), then one NOTIFY after another — decoded as the reader
//! decodes it, handed to `Collector::handle_message`, its `200` taken
//! with `poll_transmit` and its events with `poll_event`. What is left of
//! the per-NOTIFY cost in the daemon is the two system calls and the
//! hand-offs between threads (BENCHMARKS.md, NOTIFY ingest).

use std::net::SocketAddr;

use criterion::{criterion_group, criterion_main, Criterion};
use msr_collector::core::{Backend, Collector, Inbound, Route, Start};
use msr_collector::operator::cluster::Cluster;
use msr_collector::operator::store::etcd::Member;
use msr_collector::operator::OperatorConfig;
use msr_shared::sip::wire;
use msr_shared::sip::{self, SipMessage, StatusCode};
use tokio::time::Instant;

const MSRS: usize = 1000;

fn agent(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 20_000 + u16::try_from(i).unwrap_or(0)))
}

/// A collector with `MSRS` live dialogs; each dialog's Call-ID and tags.
fn subscribed() -> (Collector, Instant, Vec<(String, String)>) {
    let text = "node = \"bench\"\n[sip]\nlisten = \"127.0.0.1:5060\"\nrealm = \"bench\"\n\
         [[accounts]]\nauth_name = \"msr\"\npassword = \"pw\"\n[subscription]\nexpires = 3600\n\
         [http]\nlisten = \"off\"\n";
    let config = msr_collector::config::parse(text, "<bench>").expect("config");
    let now = Instant::now();
    let local = SocketAddr::from(([127, 0, 0, 1], 5060));
    let mut operator = OperatorConfig::new();
    operator.declare_site("local").expect("site");
    let this = Member {
        node: "bench".into(),
        sip: local.to_string(),
        started_unix: 1_700_000_000,
    };
    let mut core = Collector::new(
        &config,
        Start {
            local,
            operator,
            cluster: Cluster::file(this, "bench.json".into(), 1),
            backend: Backend::File,
            seed: 1,
            now,
            unix_ms: 1_700_000_000_000,
        },
    );
    let bindings: Vec<String> = (0..MSRS)
        .map(|i| {
            format!(
                r#"{{"msr":"msr_{i}","contact":"lo@msr_{i}","uri":"sip:msr_{i}@{a}","version":null,"expires_unix_ms":1700003600000,"call_id":"r{i}","cseq":1,"source":"{a}"}}"#,
                a = agent(i)
            )
        })
        .collect();
    let saved = format!(
        r#"{{"format":"msr-collector bindings","version":2,"bindings":[{}]}}"#,
        bindings.join(",")
    );
    core.restore_bindings(now, &saved);
    let mut dialogs = vec![(String::new(), String::new()); MSRS];
    let mut answers = Vec::new();
    while let Some(t) = core.poll_transmit() {
        let Ok(SipMessage::Request(r)) = SipMessage::try_from(t.bytes.as_ref()) else {
            continue;
        };
        if r.method != sip::Method::Subscribe {
            continue;
        }
        let msr = sip::uri_user(&r.uri.to_string())
            .unwrap_or_default()
            .to_owned();
        let i: usize = msr.trim_start_matches("msr_").parse().expect("index");
        let call_id = sip::call_id(&r.headers).expect("call-id").to_owned();
        let tag = sip::header(&r.headers, "From")
            .and_then(sip::tag)
            .expect("tag");
        dialogs[i] = (call_id, tag);
        let mut ok = sip::response(&r, StatusCode::OK, Some("agent"));
        sip::push_header(&mut ok.headers, "Expires", "3600");
        answers.push((
            i,
            wire::encode_response(ok, msr_collector::core::USER_AGENT),
        ));
    }
    for (i, bytes) in answers {
        let message = wire::decode(&bytes, agent(i)).expect("decode");
        core.handle_message(
            now,
            Inbound {
                route: Route::Udp(agent(i)),
                source: agent(i),
                message,
                peer_certificate: None,
            },
        );
    }
    while core.poll_transmit().is_some() {}
    while core.poll_event().is_some() {}
    while core.poll_count().is_some() {}
    while core.poll_effect().is_some() {}
    (core, now, dialogs)
}

fn notify(i: usize, cseq: u32, dialog: &(String, String), load: u32) -> Vec<u8> {
    let body = format!("msr: msr_{i}\nload: {load}\ncpu: 21\ncalls: {load}\nmax-calls: 100\n");
    format!(
        "NOTIFY sip:collector@127.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP {a};branch=z9hG4bK{i}x{cseq};rport\r\n\
         Max-Forwards: 70\r\nFrom: <sip:msr_{i}@{a}>;tag=agent\r\nTo: <sip:collector@127.0.0.1:5060>;tag={tag}\r\n\
         Call-ID: {call_id}\r\nCSeq: {cseq} NOTIFY\r\nContact: <sip:msr_{i}@{a}>\r\nEvent: eltex-call-count\r\n\
         Subscription-State: active;expires=3000\r\nContent-Type: application/x-eltex-call-count\r\n\
         User-Agent: msr-agent/0.1.0\r\nContent-Length: {len}\r\n\r\n{body}",
        a = agent(i),
        tag = dialog.1,
        call_id = dialog.0,
        len = body.len()
    )
    .into_bytes()
}

fn bench_ingest(c: &mut Criterion) {
    let (mut core, now, dialogs) = subscribed();
    let mut n: usize = 0;
    let mut group = c.benchmark_group("ingest");
    group.bench_function("notify 1000 msrs: decode + core + 200", |b| {
        b.iter(|| {
            let i = n % MSRS;
            let cseq = u32::try_from(n / MSRS + 2).unwrap_or(u32::MAX);
            let bytes = notify(i, cseq, &dialogs[i], u32::try_from(n % 90).unwrap_or(0));
            n += 1;
            let message = wire::decode(&bytes, agent(i)).expect("decode");
            core.handle_message(
                now,
                Inbound {
                    route: Route::Udp(agent(i)),
                    source: agent(i),
                    message,
                    peer_certificate: None,
                },
            );
            let sent = core.poll_transmit().expect("a 200");
            while core.poll_event().is_some() {}
            while core.poll_count().is_some() {}
            sent
        })
    });
    group.finish();
}

criterion_group!(benches, bench_ingest);
criterion_main!(benches);
