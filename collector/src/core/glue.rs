//! The fan-out between the cores: what one owner's change means for the
//! others (SPEC §3–§5), applied after every input.
//!
//! * a binding added, refreshed, restarted or removed → the health
//!   monitor, the load table, the subscriber (the MSR's contacts), a save
//!   of the bindings;
//! * a subscription's change → the health monitor and the load table; a
//!   load report → both;
//! * a health change → the load table (the selection index reads it);
//! * requests the subscriber and the health monitor want sent → the client
//!   transactions; keepalives the monitor gave up on → stopped there.
//!
//! Each core's event, once applied, is handed on as an [`Event`] (what
//! the shell logs and the harness records), so nothing is copied for it.

use tokio::time::Instant;
use tracing::debug;

use crate::model::health::{Health, HealthEvent};
use crate::model::load_table::Change;
use crate::sip::registrar::RegistrarEvent;
use crate::sip::subscriber::{RetryCause, SubscriberEvent};

use super::{Collector, Count, Event, RequestId};

impl Collector {
    /// Applies what the cores produced until none has anything left.
    pub(super) fn settle(&mut self, now: Instant) {
        let mut bindings_changed = false;
        while let Some(event) = self.registrar.poll_event() {
            bindings_changed = true;
            let msr = match &event {
                RegistrarEvent::BindingAdded(b) | RegistrarEvent::BindingRefreshed(b) => {
                    self.on_binding(now, b);
                    if let Some(absence) = self.absences.returned(&b.msr) {
                        self.events.push_back(Event::MsrBack {
                            msr: b.msr.clone(),
                            after: now.saturating_duration_since(absence.since),
                        });
                    }
                    b.msr.clone()
                }
                RegistrarEvent::BindingRestarted(b) => {
                    self.on_binding(now, b);
                    // SPEC §3: the MSR restarted, subscribe anew at once.
                    self.subscriber.contact_restarted(now, &b.msr, &b.contact);
                    b.msr.clone()
                }
                RegistrarEvent::BindingRemoved { binding, cause } => {
                    // In service: it reported its load, and neither the
                    // operator nor its agent had drained it (an MSR stopped
                    // for maintenance after a drain is not an outage).
                    let (draining, calls) = self
                        .table
                        .drain_inputs(&binding.msr)
                        .unwrap_or((false, None));
                    let serving =
                        calls.is_some() && !draining && self.operator.is_active(&binding.msr);
                    self.health.contact_removed(now, &binding.contact);
                    self.table
                        .apply(&self.operator, Change::BindingRemoved(binding));
                    if !self.registrar.is_registered(&binding.msr) {
                        self.table
                            .apply(&self.operator, Change::MsrUnregistered(&binding.msr));
                        // SPEC §14: nothing vanishes.
                        let absence = crate::model::absent::Absence {
                            since: now,
                            since_unix: self.unix_secs(now),
                            cause: *cause,
                            serving,
                        };
                        self.absences.gone(&binding.msr, absence);
                        self.events.push_back(Event::MsrGone {
                            msr: binding.msr.clone(),
                            cause: *cause,
                            serving,
                        });
                    }
                    binding.msr.clone()
                }
            };
            self.events.push_back(Event::Registrar(event));
            self.subscriber
                .contacts_changed(now, &msr, self.registrar.contacts_of(&msr));
        }
        if bindings_changed {
            self.bindings.changed += 1;
        }
        self.send_subscribes(now);
        while let Some(event) = self.subscriber.poll_event() {
            if let SubscriberEvent::Refreshed { msr, .. } = &event {
                self.refreshes.note(now, msr);
            }
            self.on_subscriber_event(event);
        }
        while let Some(refusal) = self.registrar.poll_refusal() {
            self.events.push_back(Event::Refusal(refusal));
        }
        while let Some(line) = self.selection_refusals.poll() {
            self.events.push_back(Event::SelectionRefused(line));
        }
        // Only the subscriptions that changed: O(changes), not O(MSRs).
        while let Some((msr, view)) = self.subscriber.poll_view_change() {
            self.health
                .subscription_changed(now, &msr, &view.status, view.expires_secs);
            let change = Change::SubscriptionChanged {
                msr: &msr,
                expires_secs: view.expires_secs,
            };
            self.table.apply(&self.operator, change);
        }
        self.apply_health(now);
        // A keepalive or subscribe that failed at once may have queued more.
        self.send_subscribes(now);
        self.request_save(now);
        self.check_drains();
    }

    /// Reports the drains that started, finished or ended (SPEC §14):
    /// nothing to do unless an MSR is being drained.
    fn check_drains(&mut self) {
        if self.drains.is_empty() {
            return;
        }
        let (table, legs, operator, registrar, events) = (
            &self.table,
            &self.legs,
            &self.operator,
            &self.registrar,
            &mut self.events,
        );
        self.drains.check(
            |msr| {
                let (own, calls) = table.drain_inputs(msr).unwrap_or((false, None));
                Some((
                    !operator.is_active(msr) || own,
                    legs.on_msr(msr),
                    calls,
                    registrar.is_registered(msr),
                ))
            },
            |event| events.push_back(Event::Drain(event)),
        );
    }

    /// A binding added, refreshed, or registered anew with a new Call-ID:
    /// to the health monitor and the table.
    fn on_binding(&mut self, now: Instant, b: &crate::sip::registrar::Binding) {
        self.health
            .contact_registered(now, &b.contact, &b.msr, &b.uri);
        self.table.apply(&self.operator, Change::BindingChanged(b));
    }

    fn on_subscriber_event(&mut self, event: SubscriberEvent) {
        if let SubscriberEvent::Load { msr, report, at } = &event {
            self.health
                .report_received(*at, msr, report.engine, report.service);
            let change = Change::LoadReported {
                msr,
                report: report.clone(),
                at: *at,
            };
            self.table.apply(&self.operator, change);
        }
        self.events.push_back(Event::Subscriber(event));
    }

    /// Puts the SUBSCRIBEs the subscriber wants sent into transactions.
    fn send_subscribes(&mut self, now: Instant) {
        while let Some(t) = self.subscriber.poll_transmit() {
            debug!(msr = %t.msr, call_id = %t.call_id, "sending subscribe");
            if let Err(cause) = self.send_request(now, RequestId::Subscribe(t.id), t.request, None)
            {
                self.subscriber
                    .handle_failure(now, t.id, RetryCause::NotSent(cause.clone()));
                self.events.push_back(Event::SubscribeNotSent {
                    msr: t.msr,
                    call_id: t.call_id,
                    cause,
                });
            }
        }
    }

    /// Sends the keepalives the health monitor asks for, stops those it
    /// gave up on, and copies its changes into the load table and the log
    /// (SPEC §5).
    fn apply_health(&mut self, now: Instant) {
        loop {
            while let Some(id) = self.health.poll_abandoned() {
                self.transactions.cancel(&RequestId::Keepalive(id));
            }
            let Some(probe) = self.health.poll_transmit() else {
                break;
            };
            let timeout = Some(self.health.keepalive_timeout());
            if let Err(cause) =
                self.send_request(now, RequestId::Keepalive(probe.id), probe.request, timeout)
            {
                debug!(contact = %probe.contact, %cause, "cannot send keepalive");
                self.health.handle_failure(now, probe.id);
            }
        }
        let unix_now = self.unix_secs(now);
        while let Some(event) = self.health.poll_event() {
            if let HealthEvent::CoreFailure { msr, cause, .. } = &event {
                self.counts.push_back(Count::CoreFailure {
                    msr: msr.clone(),
                    cause: *cause,
                });
            }
            if let HealthEvent::Changed(change) = &event {
                if change.to == Health::Draining || change.from == Some(Health::Draining) {
                    self.drains.watch(&change.msr);
                }
                let age = now.saturating_duration_since(change.at).as_secs();
                let unix = unix_now.saturating_sub(i64::try_from(age).unwrap_or(0));
                let health = Change::HealthChanged {
                    contact: &change.contact,
                    health: change.to,
                    since: (change.at, unix),
                };
                self.table.apply(&self.operator, health);
            }
            self.events.push_back(Event::Health(event));
        }
    }
}
