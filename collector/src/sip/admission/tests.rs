use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::*;

const REGISTER: &[u8] =
    b"REGISTER sip:10.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.9\r\nCSeq: 1 REGISTER\r\n\r\n";
const REGISTER_AUTH: &[u8] = b"REGISTER sip:10.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.9\r\nauthorization: Digest username=\"a\"\r\n\r\n";
const NOTIFY: &[u8] = b"NOTIFY sip:collector@10.0.0.1 SIP/2.0\r\n\r\n";

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("addr")
}

fn config() -> AdmissionConfig {
    AdmissionConfig {
        per_source_rate: 10.0,
        per_source_burst: 20.0,
        total_rate: 100.0,
        total_burst: 100.0,
        max_sources: 8,
    }
}

fn count(a: &mut Admission, now: Instant, from: SocketAddr, n: usize, class: Class) -> usize {
    (0..n)
        .filter(|_| a.classify(now, from, NOTIFY) == class)
        .count()
}

#[test]
fn a_known_contact_is_never_limited_but_its_unauthenticated_register_is() {
    let t0 = Instant::now();
    let mut a = Admission::new(config());
    let msr = addr("10.0.0.2:5070");
    a.set_known(HashSet::from([msr]));
    assert_eq!(count(&mut a, t0, msr, 10_000, Class::Known), 10_000);
    assert_eq!(a.classify(t0, msr, REGISTER_AUTH), Class::Known);
    assert_eq!(a.classify(t0, msr, REGISTER), Class::Admitted);
    // Another port of the same host is not the contact.
    assert_eq!(
        a.classify(t0, addr("10.0.0.2:5071"), NOTIFY),
        Class::Admitted
    );
}

#[test]
fn one_source_gets_its_burst_then_its_rate() {
    let t0 = Instant::now();
    let mut a = Admission::new(config());
    let flood = addr("192.0.2.1:5060");
    assert_eq!(count(&mut a, t0, flood, 1_000, Class::Admitted), 20);
    // One second later: the rate's worth.
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(count(&mut a, t1, flood, 1_000, Class::Admitted), 10);
    // Another source is not held back by this one.
    assert_eq!(
        count(&mut a, t1, addr("192.0.2.2:5060"), 5, Class::Admitted),
        5
    );
}

#[test]
fn many_sources_share_the_total() {
    let t0 = Instant::now();
    let mut a = Admission::new(config());
    let mut admitted = 0;
    for i in 0..200u32 {
        let from: SocketAddr = format!("127.0.1.{}:5060", i % 250 + 1)
            .parse()
            .expect("addr");
        admitted += count(&mut a, t0, from, 10, Class::Admitted);
    }
    assert_eq!(admitted, 100, "the total burst");
    assert!(a.tracked_sources() <= 8, "{}", a.tracked_sources());
}

/// Forged sources cannot grow the table: beyond its size they share one
/// bucket until a tracked source has been idle for a refill.
#[test]
fn the_source_table_is_bounded_and_forgets_idle_sources() {
    let t0 = Instant::now();
    let mut a = Admission::new(AdmissionConfig {
        total_rate: 1e9,
        total_burst: 1e9,
        ..config()
    });
    for i in 0..8u32 {
        let from: SocketAddr = format!("198.51.100.{i}:1").parse().expect("addr");
        assert_eq!(a.classify(t0, from, NOTIFY), Class::Admitted);
    }
    // The 9th and later share the overflow bucket (burst 20).
    let mut shared = 0;
    for i in 8..100u32 {
        let from: SocketAddr = format!("198.51.100.{i}:1").parse().expect("addr");
        shared += usize::from(a.classify(t0, from, NOTIFY) == Class::Admitted);
    }
    assert_eq!(shared, 20);
    assert_eq!(a.tracked_sources(), 8);
    // After a full refill the oldest is forgotten for a newcomer.
    let later = t0 + Duration::from_secs(3);
    assert_eq!(
        a.classify(later, addr("203.0.113.1:1"), NOTIFY),
        Class::Admitted
    );
    assert_eq!(a.tracked_sources(), 8);
}

#[test]
fn a_register_is_told_by_its_authorization_header() {
    assert!(is_register_without_credentials(REGISTER));
    assert!(!is_register_without_credentials(REGISTER_AUTH));
    assert!(!is_register_without_credentials(NOTIFY));
    // A header in the body does not count.
    let body = b"REGISTER sip:x SIP/2.0\r\nCSeq: 1 REGISTER\r\n\r\nAuthorization: x";
    assert!(is_register_without_credentials(body));
}
