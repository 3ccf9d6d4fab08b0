//! The MSR-side drain (SPEC §14): an operator on the MSR host asks the
//! running agent (`msr-agent drain`) to take no new legs; every NOTIFY
//! then says `service: draining` and the collector selects no new leg
//! here, while the live ones stay. The drain is over — `drained` — once
//! the engine's own session count (the `calls` the agent samples) has
//! been 0 for [`EMPTY_FOR`]; with `--exit-when-empty` the agent then
//! exits (its normal clean shutdown), so maintenance can be scripted.
//!
//! ```text
//!   active ──drain──▶ draining ──calls = 0 for EMPTY_FOR──▶ drained ──(exit-when-empty)──▶ exit
//!     ▲                  │  calls > 0: the wait starts over      │
//!     └──── undrain ─────┴───────────────────────────────────────┘
//! ```
//!
//! The state lives in the shell for the agent's whole run: a config
//! reload leaves it as it is (it is not in the config).
//!
//! Architecture invariant: no I/O, no clock, no task; `now` is always given.

use std::time::Duration;

use msr_shared::event_package::Service;
use tokio::time::Instant;

/// How long the engine must have had no session before a drain is over:
/// one sample of 0 may be a moment between two calls' sessions.
pub const EMPTY_FOR: Duration = Duration::from_secs(2);

/// What to do once drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenDrained {
    /// Keep running, still `draining`, until `undrain`.
    Stay,
    /// Exit (final NOTIFYs `deactivated`, unregister), status 0.
    Exit,
}

/// A view of the drain for `msr-agent status` and `drain --wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainStatus {
    /// `active` or `draining`.
    pub service: Service,
    /// The engine's sessions at the last sample.
    pub calls: u32,
    /// The engine has had no session for [`EMPTY_FOR`] while draining.
    pub drained: bool,
    /// What happens once drained.
    pub when_drained: WhenDrained,
}

/// The sans-IO drain state (see the module docs).
#[derive(Debug)]
pub struct Drain {
    service: Service,
    when_drained: WhenDrained,
    calls: u32,
    /// Since when `calls` has been 0 (whatever the service).
    empty_since: Option<Instant>,
    /// `drained` was reached and logged.
    drained_seen: bool,
}

impl Drain {
    /// Active, with `calls` sessions at `now`.
    pub fn new(now: Instant, calls: u32) -> Self {
        Self {
            service: Service::Active,
            when_drained: WhenDrained::Stay,
            calls,
            empty_since: (calls == 0).then_some(now),
            drained_seen: false,
        }
    }

    /// `active` or `draining`: what every NOTIFY says.
    pub fn service(&self) -> Service {
        self.service
    }

    /// Starts (or continues) a drain; `when` replaces the last one's.
    pub fn drain(&mut self, when: WhenDrained) {
        self.service = Service::Draining;
        self.when_drained = when;
    }

    /// Ends a drain: new legs welcome again, no exit.
    pub fn undrain(&mut self) {
        self.service = Service::Active;
        self.when_drained = WhenDrained::Stay;
        self.drained_seen = false;
    }

    /// The engine's session count of a new sample.
    pub fn on_calls(&mut self, now: Instant, calls: u32) {
        self.calls = calls;
        match (calls, self.empty_since) {
            (0, None) => self.empty_since = Some(now),
            (0, Some(_)) => {}
            (_, _) => {
                self.empty_since = None;
                self.drained_seen = false;
            }
        }
    }

    /// Whether the drain is over at `now`: draining, and no session for
    /// [`EMPTY_FOR`].
    pub fn is_drained(&self, now: Instant) -> bool {
        self.service == Service::Draining
            && self
                .empty_since
                .is_some_and(|since| now.saturating_duration_since(since) >= EMPTY_FOR)
    }

    /// When [`is_drained`](Self::is_drained) turns true, if it will
    /// without a new sample: the shell wakes then.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.service != Service::Draining || self.drained_seen {
            return None;
        }
        self.empty_since.map(|since| since + EMPTY_FOR)
    }

    /// Whether the drain became `drained` at `now` for the first time (to
    /// log it once).
    pub fn take_newly_drained(&mut self, now: Instant) -> bool {
        if self.drained_seen || !self.is_drained(now) {
            return false;
        }
        self.drained_seen = true;
        true
    }

    /// Whether the agent should exit now: drained with `--exit-when-empty`.
    pub fn should_exit(&self, now: Instant) -> bool {
        self.when_drained == WhenDrained::Exit && self.is_drained(now)
    }

    /// The view for the control socket.
    pub fn status(&self, now: Instant) -> DrainStatus {
        DrainStatus {
            service: self.service,
            calls: self.calls,
            drained: self.is_drained(now),
            when_drained: self.when_drained,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_is_over_once_the_engine_has_been_empty_for_a_while() {
        let t0 = Instant::now();
        let mut drain = Drain::new(t0, 3);
        assert_eq!(drain.service(), Service::Active);
        drain.drain(WhenDrained::Exit);
        assert_eq!(drain.service(), Service::Draining);
        assert_eq!(drain.poll_timeout(), None, "sessions left: no deadline");
        drain.on_calls(t0 + Duration::from_secs(1), 0);
        assert_eq!(
            drain.poll_timeout(),
            Some(t0 + Duration::from_secs(1) + EMPTY_FOR)
        );
        assert!(!drain.should_exit(t0 + Duration::from_secs(2)));
        // A call in between starts the wait over.
        drain.on_calls(t0 + Duration::from_secs(2), 1);
        drain.on_calls(t0 + Duration::from_secs(3), 0);
        assert!(!drain.is_drained(t0 + Duration::from_secs(4)));
        let over = t0 + Duration::from_secs(3) + EMPTY_FOR;
        assert!(drain.is_drained(over));
        assert!(drain.should_exit(over));
        assert!(drain.take_newly_drained(over));
        assert!(!drain.take_newly_drained(over), "logged once");
        assert_eq!(drain.poll_timeout(), None);
    }

    #[test]
    fn an_idle_engine_drains_after_the_wait_and_undrain_cancels_the_exit() {
        let t0 = Instant::now();
        let mut drain = Drain::new(t0, 0);
        // Not draining: never drained, whatever the count.
        assert!(!drain.is_drained(t0 + EMPTY_FOR));
        drain.drain(WhenDrained::Stay);
        // Empty since before the drain: over at once.
        assert!(drain.is_drained(t0 + EMPTY_FOR));
        assert!(!drain.should_exit(t0 + EMPTY_FOR));
        drain.drain(WhenDrained::Exit);
        assert!(drain.should_exit(t0 + EMPTY_FOR));
        drain.undrain();
        assert_eq!(drain.service(), Service::Active);
        assert!(!drain.should_exit(t0 + EMPTY_FOR));
        let status = drain.status(t0 + EMPTY_FOR);
        assert_eq!(
            (
                status.service,
                status.calls,
                status.drained,
                status.when_drained
            ),
            (Service::Active, 0, false, WhenDrained::Stay)
        );
    }
}
