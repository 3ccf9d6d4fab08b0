//! Durability of the bindings (SPEC §3; the module docs of [`super`]): a
//! `200` to a REGISTER leaves only once every binding change made so far
//! is on disk. Changes are counted in generations; one save is in flight at
//! a time and changes that arrive meanwhile share the next; the REGISTERs
//! whose `200`s waited for a save that fails are answered `500`, so that
//! the MSRs try again.

use std::collections::VecDeque;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Collector, Effect, Transmit};
use crate::operator::store::StoreError;
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
    pub(super) held: VecDeque<(u64, HeldAnswer)>,
    /// Bindings read from the disk are being applied: nothing to save.
    pub(super) restoring: bool,
}

/// A `200` to a REGISTER waiting for its binding's save, with the
/// REGISTER: a save that fails answers a `500` built from the request
/// (RFC 3261 §8.2.6), not the `200` edited.
#[derive(Debug)]
pub(super) struct HeldAnswer {
    /// Where it goes.
    pub(super) route: super::Route,
    /// The REGISTER it answers.
    pub(super) request: msr_shared::sip::Request,
    /// The `200`, with the bindings as `Contact`s.
    pub(super) response: msr_shared::sip::Response,
}

impl HeldAnswer {
    /// The `200` as it was built.
    fn saved(self) -> Transmit {
        Transmit {
            route: self.route,
            bytes: msr_shared::sip::wire::encode_response(self.response, super::USER_AGENT),
        }
    }

    /// RFC 3261 §21.5.1: `500 Server Internal Error` with `Retry-After`
    /// (§20.33), so that the MSR registers again. It is built from the
    /// REGISTER with the To tag the `200` has (§8.2.7), and lists no
    /// `Contact`: the bindings are not on disk.
    fn unsaved(self) -> Transmit {
        let tag = msr_shared::sip::stateless_tag(&self.request.headers);
        let mut response = msr_shared::sip::response(
            &self.request,
            msr_shared::sip::StatusCode::ServerInternalError,
            Some(&tag),
        );
        msr_shared::sip::push_header(&mut response.headers, "Retry-After", "5");
        msr_shared::sip::push_header(
            &mut response.headers,
            "Warning",
            "399 msr-collector \"the binding could not be saved\"",
        );
        Transmit {
            route: self.route,
            bytes: msr_shared::sip::wire::encode_response(response, super::USER_AGENT),
        }
    }
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
    /// be written (`Err`): the `200`s that waited for them leave, or — not
    /// saved — are answered `500` instead, so that the MSRs try again
    /// (their binding stays in memory: subscriptions go on).
    pub fn handle_bindings_saved(
        &mut self,
        now: Instant,
        generation: u64,
        result: Result<(), StoreError>,
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
            let Some((_, held)) = self.bindings.held.pop_front() else {
                break;
            };
            if self.bindings.saved >= generation {
                self.transmits.push_back(held.saved());
            } else {
                debug!("register answered 500: its binding was not saved");
                self.transmits.push_back(held.unsaved());
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
