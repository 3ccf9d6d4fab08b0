//! The media engine's own liveness (SPEC §14): is the engine this agent
//! sits beside still answering its own protocol?
//!
//! Sans-IO, like [`crate::registration`] and [`crate::notifier`]: the
//! shell feeds the outcome of each probe and the time, and reads what to
//! send ([`EngineProbe::poll_transmit`]), when to wake it
//! ([`EngineProbe::poll_timeout`]) and the changes of the engine's state
//! ([`EngineProbe::poll_change`]), which every NOTIFY then carries (SPEC
//! §14, the `engine:` line of §4's body).
//!
//! Two ways to ask ([`ProbeMethod`]):
//!
//! * **SIP** — an out-of-dialog `OPTIONS` (RFC 3261 §11) to the engine's
//!   `<transport>` address. Any final response, a `405` or `503` as much
//!   as a `200`, means a SIP stack is there and answering: alive. No final
//!   response within the probe timeout, or a transport failure, is a miss.
//!   The probe keeps its own timeout: the client transaction under it runs
//!   to Timer F (32 s), and its late answer, a locally generated `408`
//!   included, is ignored because its id is no longer the one in flight.
//! * **ng** — the `rtpengine` calls source's statistics exchange, which
//!   the shell already runs every sampling tick, is the probe: an answer
//!   is alive, no answer ([`EngineSessions::Unavailable`]) a miss. This
//!   core keeps no timer of its own then; the shell reports each outcome
//!   ([`EngineProbe::handle_answer`], [`EngineProbe::handle_miss`]).
//!
//! Timing of the SIP probe (the collector's keepalive in `health.rs` works
//! the same way):
//!
//! ```text
//!   idle ──interval──▶ OPTIONS in flight ──any final response──▶ idle (misses = 0, up)
//!                           │ no answer within timeout, transport failure
//!                           ▼
//!                      miss: misses += 1 ── misses < N ──▶ probe again at once
//!                                         └─ misses ≥ N ──▶ down, probe every interval
//! ```
//!
//! With the defaults (every 2 s, timeout 1 s, 2 misses) an engine that
//! dies is seen `down` within 2 + 2 × 1 = 4 s; one that comes back is `up`
//! at its first answer, within one interval.
//!
//! The state starts [`EngineState::Unchecked`] and becomes `up` at the
//! first answer or `down` after the first N misses: before the first probe
//! ends nothing is known either way.
//!
//! Architecture invariant: no I/O, no clock, no task; `now` is always given.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use msr_shared::event_package::EngineState;
use msr_shared::sip::{self, Method, Request};
use tokio::time::Instant;

#[cfg(doc)]
use crate::load::EngineSessions;

#[cfg(test)]
mod tests;

/// Default time between two probes (`<agent engine-probe-interval-ms>`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);
/// Default time a SIP probe may go unanswered (`<agent
/// engine-probe-timeout-ms>`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default misses in a row that make the engine `down` (`<agent
/// engine-probe-misses>`).
pub const DEFAULT_MISSES: u32 = 2;

/// How the engine is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeMethod {
    /// An `OPTIONS` to the engine's SIP address.
    SipOptions {
        /// The engine's `<transport>` address (an unspecified `bind-addr`
        /// replaced by the agent's contact address).
        target: SocketAddr,
        /// TCP when the engine speaks SIP over TCP only
        /// (`<transport transport="tcp">`), else UDP.
        transport: ProbeTransport,
        /// The agent's own SIP URI: `From` and `Contact` of the OPTIONS.
        local_uri: String,
    },
    /// The `rtpengine` source's ng statistics exchange, at this address.
    NgStatistics {
        /// rtpengine's ng address.
        target: SocketAddr,
    },
}

/// The transport of the SIP probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeTransport {
    /// UDP (`<transport transport="udp">` or `"udp+tcp"`).
    Udp,
    /// TCP (`<transport transport="tcp">`).
    Tcp,
}

impl ProbeMethod {
    /// The engine's address that is asked.
    pub fn target(&self) -> SocketAddr {
        match self {
            ProbeMethod::SipOptions { target, .. } | ProbeMethod::NgStatistics { target } => {
                *target
            }
        }
    }
}

impl fmt::Display for ProbeMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeMethod::SipOptions { .. } => f.write_str("sip OPTIONS"),
            ProbeMethod::NgStatistics { .. } => f.write_str("ng statistics"),
        }
    }
}

/// What the probe needs from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConfig {
    /// How the engine is asked.
    pub method: ProbeMethod,
    /// Time between two probes while the last one was answered (and while
    /// the engine is down). Unused by the ng probe, which goes with the
    /// sampling tick.
    pub interval: Duration,
    /// How long a SIP probe may go unanswered before it is a miss.
    pub timeout: Duration,
    /// Misses in a row that make the engine `down` (≥ 1).
    pub misses: u32,
}

/// Identifies a SIP probe: its final response (or failure) comes back
/// with this id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProbeId(pub u64);

/// An `OPTIONS` to send.
#[derive(Debug)]
pub struct ProbeTransmit {
    /// Pass it back with the response or failure.
    pub id: ProbeId,
    /// The request (without `Via`; the endpoint adds it).
    pub request: Request,
}

/// A change of the engine's state, for the notifier and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineChange {
    /// The state before.
    pub from: EngineState,
    /// The state now.
    pub to: EngineState,
    /// Misses in a row when it went down (0 when it came up).
    pub misses: u32,
    /// Why the last probe missed, when it went down.
    pub reason: Option<String>,
}

/// The sans-IO engine probe (see the module docs).
#[derive(Debug)]
pub struct EngineProbe {
    config: ProbeConfig,
    state: EngineState,
    misses: u32,
    /// The SIP probe in flight and when it counts as missed.
    in_flight: Option<(ProbeId, Instant)>,
    /// When the next SIP probe goes (while none is in flight).
    next_probe: Instant,
    next_id: u64,
    call_id_prefix: String,
    transmit: VecDeque<ProbeTransmit>,
    changes: VecDeque<EngineChange>,
}

impl EngineProbe {
    /// A probe whose first SIP `OPTIONS` goes at `now`.
    pub fn new(config: ProbeConfig, now: Instant) -> Self {
        Self {
            config,
            state: EngineState::Unchecked,
            misses: 0,
            in_flight: None,
            next_probe: now,
            next_id: 1,
            call_id_prefix: sip::random_token(),
            transmit: VecDeque::new(),
            changes: VecDeque::new(),
        }
    }

    /// The config in force.
    pub fn config(&self) -> &ProbeConfig {
        &self.config
    }

    /// Applies a reloaded config. The same method keeps the state and the
    /// misses (the new interval, timeout and count apply from the next
    /// probe); another method starts over, `unchecked`, probing at once.
    pub fn reconfigure(&mut self, now: Instant, config: ProbeConfig) {
        if config.method == self.config.method {
            self.config = config;
            return;
        }
        let from = self.state;
        *self = Self::new(config, now);
        if from != EngineState::Unchecked {
            self.changes.push_back(EngineChange {
                from,
                to: EngineState::Unchecked,
                misses: 0,
                reason: None,
            });
        }
    }

    /// What the last probes say.
    pub fn state(&self) -> EngineState {
        self.state
    }

    /// Misses in a row so far.
    pub fn misses(&self) -> u32 {
        self.misses
    }

    /// When [`handle_timeout`](Self::handle_timeout) must run next: the
    /// probe in flight's timeout, or the next probe. `None` for the ng
    /// probe, which has no timer of its own.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.is_sip() {
            return None;
        }
        Some(match self.in_flight {
            Some((_, deadline)) => deadline,
            None => self.next_probe,
        })
    }

    /// Counts a SIP probe whose timeout passed as missed, and starts the
    /// next one when it is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.is_sip() {
            return;
        }
        if let Some((_, deadline)) = self.in_flight {
            if now >= deadline {
                self.in_flight = None;
                let timeout = self.config.timeout;
                self.miss(
                    now,
                    format!("no response within {} ms", timeout.as_millis()),
                );
            }
        }
        if self.in_flight.is_none() && now >= self.next_probe {
            self.send(now);
        }
    }

    /// The next `OPTIONS` to send.
    pub fn poll_transmit(&mut self) -> Option<ProbeTransmit> {
        self.transmit.pop_front()
    }

    /// The next change of the engine's state.
    pub fn poll_change(&mut self) -> Option<EngineChange> {
        self.changes.pop_front()
    }

    /// A final response (any status) to the SIP probe `id`: the engine
    /// answers. A response to a probe already counted as missed is
    /// ignored.
    pub fn handle_response(&mut self, now: Instant, id: ProbeId) {
        if self.in_flight.is_some_and(|(current, _)| current == id) {
            self.in_flight = None;
            self.handle_answer(now);
        }
    }

    /// The SIP probe `id` failed at the transport (no response will come):
    /// a miss.
    pub fn handle_failure(&mut self, now: Instant, id: ProbeId, reason: &str) {
        if self.in_flight.is_some_and(|(current, _)| current == id) {
            self.in_flight = None;
            self.miss(now, reason.to_owned());
        }
    }

    /// The engine answered a probe (the ng exchange's answer, or a SIP
    /// probe's response).
    pub fn handle_answer(&mut self, now: Instant) {
        self.misses = 0;
        self.next_probe = now + self.config.interval;
        self.set_state(EngineState::Up, None);
    }

    /// The engine did not answer a probe (the ng exchange failed, or a SIP
    /// probe timed out or failed).
    pub fn handle_miss(&mut self, now: Instant, reason: &str) {
        self.miss(now, reason.to_owned());
    }

    fn miss(&mut self, now: Instant, reason: String) {
        self.misses = self.misses.saturating_add(1);
        if self.misses >= self.config.misses.max(1) {
            // Down (or staying down): probe at the normal pace, a dead
            // engine is not hammered.
            self.next_probe = now + self.config.interval;
            self.set_state(EngineState::Down, Some(reason));
        } else {
            // One miss may be one lost datagram: ask again at once, so
            // that a dead engine is known within `misses` timeouts.
            self.next_probe = now;
        }
    }

    fn set_state(&mut self, to: EngineState, reason: Option<String>) {
        if self.state == to {
            return;
        }
        let from = self.state;
        self.state = to;
        self.changes.push_back(EngineChange {
            from,
            to,
            misses: if to == EngineState::Down {
                self.misses
            } else {
                0
            },
            reason,
        });
    }

    fn is_sip(&self) -> bool {
        matches!(self.config.method, ProbeMethod::SipOptions { .. })
    }

    fn send(&mut self, now: Instant) {
        let ProbeMethod::SipOptions {
            target,
            transport,
            local_uri,
        } = &self.config.method
        else {
            return;
        };
        let id = ProbeId(self.next_id);
        self.next_id += 1;
        let uri = match transport {
            ProbeTransport::Udp => format!("sip:{target}"),
            ProbeTransport::Tcp => format!("sip:{target};transport=tcp"),
        };
        let built = sip::request(
            Method::Options,
            &uri,
            vec![
                ("From", format!("<{local_uri}>;tag={}", sip::random_token())),
                ("To", format!("<sip:{target}>")),
                ("Call-ID", format!("{}-{}", self.call_id_prefix, id.0)),
                ("CSeq", "1 OPTIONS".to_owned()),
                ("Contact", format!("<{local_uri}>")),
                ("Content-Length", "0".to_owned()),
            ],
            Vec::new(),
        );
        match built {
            Ok(request) => {
                self.in_flight = Some((id, now + self.config.timeout));
                self.transmit.push_back(ProbeTransmit { id, request });
            }
            // The address came from a validated config, so this is not
            // expected; counted as a miss so that it is seen, not spun on.
            Err(e) => self.miss(now, format!("cannot build the OPTIONS: {e}")),
        }
    }
}
