//! Admission of SIP datagrams before any work is done on them (SPEC §3–§5:
//! a flood must not starve the MSRs' own traffic).
//!
//! Every datagram is classed by its source address, and for a request by
//! its first bytes, before it is parsed:
//!
//! * **Known**: from the address of a registered contact (its REGISTERs'
//!   source, or the contact URI's address: where its NOTIFYs and keepalive
//!   answers come from), except a REGISTER without credentials. Served
//!   first, never limited.
//! * **Limited**: everything else — strangers, and any REGISTER without an
//!   `Authorization` header. Each source address (IP and port: MSRs behind
//!   one NAT, or a load generator, share an IP) has a token bucket
//!   ([`AdmissionConfig::per_source_rate`], burst
//!   [`AdmissionConfig::per_source_burst`]), and all of them share one
//!   ([`AdmissionConfig::total_rate`]); a datagram that finds either bucket
//!   empty is dropped before it is parsed: no transaction, no digest, no
//!   answer (an answer to a flood is itself a flood).
//!
//! A legitimate newcomer — an MSR that registers for the first time sends
//! two REGISTERs, the challenge's and the answer's — fits the per-source
//! burst easily; a flood from one source is held to its rate, and one
//! spread over many sources to the total. At most
//! [`AdmissionConfig::max_sources`] sources are tracked (the ones idle
//! longest are forgotten first: their buckets were full anyway); sources
//! beyond that share one bucket, so the table's memory is bounded whatever
//! the flood forges.
//!
//! A drop is counted once, by the ingest that drops it
//! (`IngestStats::refused` in `daemon/ingest.rs`), which `/metrics` shows
//! and a rate-limited log line reports.
//!
//! Architecture invariant: no I/O, no clock; `now` is always given.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use msr_shared::token_bucket::TokenBucket;
use tokio::time::Instant;

/// The limits (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmissionConfig {
    /// Datagrams a second from one unknown source.
    pub per_source_rate: f64,
    /// The burst one unknown source may send at once.
    pub per_source_burst: f64,
    /// Datagrams a second from all unknown sources together.
    pub total_rate: f64,
    /// The burst of all unknown sources together.
    pub total_burst: f64,
    /// Sources with a bucket of their own.
    pub max_sources: usize,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            per_source_rate: 50.0,
            per_source_burst: 100.0,
            total_rate: 5_000.0,
            total_burst: 10_000.0,
            max_sources: 4_096,
        }
    }
}

/// How a datagram is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// From a registered contact: first, unlimited.
    Known,
    /// Within the limits: after the known ones.
    Admitted,
    /// Over a limit: dropped unparsed.
    Dropped,
}

/// The admission state of one ingest (module docs).
#[derive(Debug)]
pub struct Admission {
    config: AdmissionConfig,
    known: HashSet<SocketAddr>,
    sources: HashMap<SocketAddr, (TokenBucket, u64)>,
    /// `(sequence of last use, source)`, oldest first: who to forget.
    by_use: BTreeSet<(u64, SocketAddr)>,
    sequence: u64,
    overflow: TokenBucket,
    total: TokenBucket,
}

impl Admission {
    /// No known source yet.
    pub fn new(config: AdmissionConfig) -> Self {
        Self {
            config,
            known: HashSet::new(),
            sources: HashMap::new(),
            by_use: BTreeSet::new(),
            sequence: 0,
            overflow: TokenBucket::full(config.per_source_burst),
            total: TokenBucket::full(config.total_burst),
        }
    }

    /// The addresses of the registered contacts now.
    pub fn set_known(&mut self, known: HashSet<SocketAddr>) {
        self.known = known;
    }

    /// Classes one datagram from `source` whose bytes are `datagram`.
    pub fn classify(&mut self, now: Instant, source: SocketAddr, datagram: &[u8]) -> Class {
        if self.known.contains(&source) && !is_register_without_credentials(datagram) {
            return Class::Known;
        }
        let c = self.config;
        let key = SocketAddr::new(source.ip().to_canonical(), source.port());
        let own = self.source_bucket(now, key);
        let admitted = match own {
            Some(bucket) => bucket.take(now, c.per_source_rate, c.per_source_burst),
            None => self
                .overflow
                .take(now, c.per_source_rate, c.per_source_burst),
        } && self.total.take(now, c.total_rate, c.total_burst);
        if admitted {
            Class::Admitted
        } else {
            Class::Dropped
        }
    }

    /// The bucket of `ip`, made (and a stale one forgotten) when there is
    /// room; `None` when the table is full of sources active since.
    fn source_bucket(&mut self, now: Instant, ip: SocketAddr) -> Option<&mut TokenBucket> {
        self.sequence += 1;
        let sequence = self.sequence;
        if let Some((_, used)) = self.sources.get(&ip) {
            self.by_use.remove(&(*used, ip));
        } else {
            if self.sources.len() >= self.config.max_sources {
                let idle = self.idle_after();
                let oldest = self.by_use.first().copied()?;
                let (bucket, _) = self.sources.get(&oldest.1)?;
                if bucket
                    .last_used()
                    .is_some_and(|at| now.saturating_duration_since(at) < idle)
                {
                    return None;
                }
                self.by_use.remove(&oldest);
                self.sources.remove(&oldest.1);
            }
            self.sources
                .insert(ip, (TokenBucket::full(self.config.per_source_burst), 0));
        }
        self.by_use.insert((sequence, ip));
        let entry = self.sources.get_mut(&ip)?;
        entry.1 = sequence;
        Some(&mut entry.0)
    }

    /// How long a bucket takes to refill from empty: a source idle that
    /// long is no different from a new one.
    fn idle_after(&self) -> Duration {
        let c = self.config;
        Duration::from_secs_f64((c.per_source_burst / c.per_source_rate.max(1e-9)).min(3600.0))
    }

    /// Sources with a bucket of their own.
    pub fn tracked_sources(&self) -> usize {
        self.sources.len()
    }
}

/// Whether `datagram` is a REGISTER with no `Authorization` header: one
/// that costs a challenge and proves nothing (a look at its bytes, no
/// parse; compact forms do not exist for `Authorization`, RFC 3261 §7.3.3).
pub fn is_register_without_credentials(datagram: &[u8]) -> bool {
    if !datagram.starts_with(b"REGISTER ") {
        return false;
    }
    let head_end = find(datagram, b"\r\n\r\n").unwrap_or(datagram.len());
    let head = &datagram[..head_end];
    !head
        .split(|b| *b == b'\n')
        .any(|line| line.len() >= 14 && line[..14].eq_ignore_ascii_case(b"authorization:"))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests;
