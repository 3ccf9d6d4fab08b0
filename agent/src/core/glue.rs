//! What one core's outcome means for the others: the 481 and closed
//! connection rules (SPEC §3, RFC 5626 §4.4), the engine's state told to
//! every subscription and the drain's end (SPEC §14), the shutdown's
//! phases (the module docs).

use std::net::SocketAddr;

use msr_shared::event_package::EngineState;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{registrar_addrs, Agent, Event, Phase, SHUTDOWN_GRACE};
use crate::registration::RegistrationState;

impl Agent {
    /// Runs after every input, so that no outcome waits for another event.
    pub(super) fn glue(&mut self, now: Instant) {
        self.reregister_forgotten(now);
        self.apply_probe_changes(now);
        self.check_drained(now);
        if self.phase == Phase::Running && !self.exit_asked && self.drain.should_exit(now) {
            info!("drained with exit-when-empty: the engine has no session, stopping");
            self.exit_asked = true;
            self.events.push_back(Event::ExitWhenDrained);
        }
        self.advance_shutdown(now);
    }

    /// SPEC §3: a registrar that answered a NOTIFY `481` may have lost the
    /// binding: that account REGISTERs again at once.
    fn reregister_forgotten(&mut self, now: Instant) {
        while let Some((msr, registrar)) = self.notifier.poll_forgotten() {
            let resolved = &self.resolved;
            for reg in self.registrations.values_mut() {
                let account = &reg.config().account;
                if account.msr_name == msr
                    && registrar_addrs(account, resolved).contains(&registrar)
                {
                    info!(%msr, %registrar, "the registrar forgot a subscription: registering again");
                    reg.register_now(now);
                }
            }
        }
    }

    /// A connection to `remote` closed: a registrar reached over it (a
    /// `sips:` realm, or `;transport=tcp`) can't reach this agent back — its SUBSCRIBEs and
    /// keepalives go over the connection the REGISTER came on — so those
    /// accounts REGISTER again at once, over a new connection (RFC 5626
    /// §4.4: a restarted collector gets every MSR back without waiting
    /// for the refresh).
    ///
    /// A REGISTER in flight over it fails at once rather than at Timer F
    /// (32 s): a TLS 1.3 server that refuses the client certificate (a
    /// collector with mutual TLS, none or the wrong one presented) does so
    /// after the client's handshake is over, by closing the connection.
    pub(super) fn reregister_over(&mut self, now: Instant, remote: SocketAddr) {
        let resolved = &self.resolved;
        for reg in self.registrations.values_mut() {
            let account = &reg.config().account;
            if !account.realm.is_stream() || !registrar_addrs(account, resolved).contains(&remote) {
                continue;
            }
            if reg.in_flight() {
                let reason = if account.realm.is_sips() {
                    "the registrar closed the tls connection before answering \
                     (a registrar with mutual TLS does so when it takes no client \
                     certificate of this agent: see tls-cert and tls-key)"
                } else {
                    "the registrar closed the connection before answering"
                };
                reg.handle_failure(now, reason);
            } else if reg.state() == RegistrationState::Registered {
                info!(
                    msr = %account.msr_name,
                    registrar = %remote,
                    "the connection to the registrar closed: registering again"
                );
                reg.register_now(now);
            }
        }
    }

    /// Logs the drain's end once.
    fn check_drained(&mut self, now: Instant) {
        if self.drain.take_newly_drained(now) {
            info!(
                empty_for_ms = crate::drain::EMPTY_FOR.as_millis(),
                "drained: the media engine has had no session for {} s",
                crate::drain::EMPTY_FOR.as_secs()
            );
        }
    }

    /// Hands the engine probe's changes to the notifier, logged once each
    /// (SPEC §14).
    fn apply_probe_changes(&mut self, now: Instant) {
        let Some(probe) = self.probe.as_mut() else {
            return;
        };
        let method = probe.config().method.clone();
        let target = method.target();
        while let Some(change) = probe.poll_change() {
            match change.to {
                EngineState::Down => warn!(
                    engine = %target,
                    misses = change.misses,
                    reason = change.reason.as_deref().unwrap_or(""),
                    "media engine at {target} stopped answering its probe ({method}, {} misses)",
                    change.misses
                ),
                EngineState::Up if change.from == EngineState::Down => info!(
                    engine = %target,
                    "media engine at {target} answers its probe again ({method})"
                ),
                EngineState::Up => info!(
                    engine = %target,
                    "media engine at {target} answers its probe ({method})"
                ),
                EngineState::Unchecked => info!(
                    engine = %target,
                    "media engine at {target}: its probe starts over ({method})"
                ),
            }
            self.notifier.set_engine(now, change.to);
        }
    }

    /// The shutdown's next phase, once the last one's wait is over.
    fn advance_shutdown(&mut self, now: Instant) {
        if self.phase == Phase::FinalNotifies
            && (self.notifier.finals_in_flight() == 0 || self.notifier.poll_timeout().is_none())
        {
            for reg in self.registrations.values_mut() {
                reg.unregister(now);
            }
            self.phase = Phase::Unregistering {
                deadline: now + SHUTDOWN_GRACE,
            };
        }
        if matches!(self.phase, Phase::Unregistering { .. })
            && self
                .registrations
                .values()
                .chain(self.retiring.iter())
                .all(|r| r.is_finished())
        {
            self.stop();
        }
    }
}
