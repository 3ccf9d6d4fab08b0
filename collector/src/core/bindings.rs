//! Durability of the bindings (SPEC §3; the module docs of [`super`]): a
//! `200` to a REGISTER leaves only once every binding change made so far
//! is on disk. Changes are counted in generations; one save is in flight at
//! a time and changes that arrive meanwhile share the next; a save that
//! fails turns the `200`s that waited for it into `500`s, so that the MSRs
//! try again.

use std::collections::VecDeque;

use bytes::Bytes;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Collector, Effect, Transmit};
use crate::sip::registrar::saved;

/// The bindings' way to the disk (module docs, "Durability").
#[derive(Debug, Default)]
pub(super) struct BindingSaves {
    /// Bumped by every binding change; what a save covers.
    pub(super) changed: u64,
    /// The newest generation on disk.
    pub(super) saved: u64,
    /// The generation being written, if a save is in flight.
    pub(super) writing: Option<u64>,
    /// `200`s to REGISTERs, each waiting for this generation.
    pub(super) held: VecDeque<(u64, Transmit)>,
    /// Bindings read from the disk are being applied: nothing to save.
    pub(super) restoring: bool,
}

impl BindingSaves {
    pub(super) fn dirty(&self) -> bool {
        self.changed > self.saved
    }
}

impl Collector {
    /// Takes back the bindings a previous run saved (SPEC §3: resume every
    /// subscription at once). Text that this build cannot read is logged
    /// and ignored: the MSRs register again at their next refresh.
    pub fn restore_bindings(&mut self, now: Instant, text: &str) {
        match saved::decode(text, now, self.unix_ms(now)) {
            Ok(bindings) => {
                info!(bindings = bindings.len(), "bindings restored");
                self.registrar.restore(now, bindings);
                // What was read needs no save.
                self.bindings.restoring = true;
                self.settle(now);
                self.bindings.restoring = false;
                self.bindings.saved = self.bindings.changed;
            }
            Err(error) => warn!(%error, "saved bindings ignored, the msrs register again"),
        }
    }

    /// The bindings of save `generation` are on disk (`Ok`), or could not
    /// be written (`Err`, the reason): the `200`s that waited for them
    /// leave, or — not saved — become `500`s, so that the MSRs try again
    /// (their binding stays in memory: subscriptions go on).
    pub fn handle_bindings_saved(
        &mut self,
        now: Instant,
        generation: u64,
        result: Result<(), String>,
    ) {
        if self.bindings.writing == Some(generation) {
            self.bindings.writing = None;
        }
        match result {
            Ok(()) => self.bindings.saved = self.bindings.saved.max(generation),
            Err(error) => {
                tracing::error!(%error, "cannot save the bindings");
            }
        }
        while let Some((waits_for, _)) = self.bindings.held.front() {
            if *waits_for > generation {
                break;
            }
            let Some((_, transmit)) = self.bindings.held.pop_front() else {
                break;
            };
            if self.bindings.saved >= generation {
                self.transmits.push_back(transmit);
            } else {
                debug!("register answered 500: its binding was not saved");
                self.transmits.push_back(unsaved(transmit));
            }
        }
        self.request_save(now);
    }

    /// Asks for a save of the bindings when some are unsaved and none is
    /// being written.
    pub(super) fn request_save(&mut self, now: Instant) {
        if !self.bindings.dirty() || self.bindings.writing.is_some() || self.bindings.restoring {
            return;
        }
        let generation = self.bindings.changed;
        self.bindings.writing = Some(generation);
        let text = saved::encode(self.registrar.bindings(), now, self.unix_ms(now));
        self.effects
            .push_back(Effect::SaveBindings { generation, text });
    }

    /// The bindings now, for the final save at shutdown.
    pub fn bindings_text(&self, now: Instant) -> String {
        saved::encode(self.registrar.bindings(), now, self.unix_ms(now))
    }

    /// Bumped by every change of the bindings: when the known sources
    /// ([`known_sources`](Self::known_sources)) may have changed.
    pub fn bindings_generation(&self) -> u64 {
        self.bindings.changed
    }
}

/// A held `200` turned into `500 Server Internal Error` with
/// `Retry-After`, for a binding that could not be saved (the status line
/// is rewritten; every header stays).
fn unsaved(transmit: Transmit) -> Transmit {
    let text = String::from_utf8_lossy(&transmit.bytes);
    let Some(rest) = text.split_once("\r\n").map(|(_, rest)| rest) else {
        return transmit;
    };
    let rest = rest.replacen("\r\n\r\n", "\r\nRetry-After: 5\r\n\r\n", 1);
    Transmit {
        route: transmit.route,
        bytes: Bytes::from(format!("SIP/2.0 500 Bindings Not Saved\r\n{rest}")),
    }
}
