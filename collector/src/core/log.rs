//! The log lines of the core's [`Event`]s: the one place they are worded.
//! The shell calls [`log`] for each event it takes from the core.

use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::model::drain::DrainEvent;
use crate::model::health::{Health, HealthEvent, LOG_WINDOW};
use crate::sip::registrar::{RefusalLog, RegistrarEvent, RemovalCause, REFUSAL_WINDOW};
use crate::sip::subscriber::SubscriberEvent;
use msr_shared::log_limit::LimitedLine;

use super::Event;

/// Logs `event`, which happened at or before `now`.
pub fn log(now: Instant, event: &Event) {
    match event {
        Event::Registrar(e) => registrar(e),
        Event::Subscriber(e) => subscriber(now, e),
        Event::Health(e) => health(e),
        Event::Refusal(r) => refusal(r),
        Event::SubscribeNotSent {
            msr,
            call_id,
            cause,
        } => warn!(%msr, %call_id, %cause, "cannot send subscribe"),
        Event::LegsExpired {
            count,
            sample_call_id,
            live,
        } => {
            // The Call-ID passed the key rules (no whitespace or control
            // characters) when the leg was placed.
            info!(
                legs = count,
                sample_call_id = %sample_call_id,
                live,
                "legs expired without a release"
            )
        }
        Event::Drain(e) => drain(e),
        Event::SubscriptionsRefreshed(s) => info!(
            refreshes = s.refreshes,
            msrs = s.msrs,
            window_secs = s.window_secs,
            "subscriptions refreshed"
        ),
        Event::SelectionRefused(LimitedLine::Line(r)) => warn!(
            code = r.code.as_str(),
            reason = %r.message,
            suppressed = r.suppressed,
            "selection refused"
        ),
        Event::SelectionRefused(LimitedLine::Unlogged { count }) => warn!(
            count,
            window_secs = super::refusals::WINDOW.as_secs(),
            "selection refusals not logged individually"
        ),
        Event::ZoneOverload {
            zone,
            change: crate::model::overload::Change::Entered,
            headroom,
        } => warn!(
            %zone,
            headroom,
            "zone in overload: pooled selection (and its fallback for selects without a call_id) keeps sessions free on every msr for the other core hosts"
        ),
        Event::ZoneOverload {
            zone,
            change: crate::model::overload::Change::Left,
            ..
        } => info!(%zone, "zone out of overload"),
        Event::MsrGone {
            msr,
            cause,
            serving,
        } => warn!(
            %msr,
            %cause,
            serving,
            "msr gone: its last registration ended; it stays listed until it registers again or `msrctl msr forget`"
        ),
        Event::MsrBack { msr, after } => {
            info!(%msr, after_secs = after.as_secs(), "msr registered again")
        }
        // Names and values passed the name rules or are numbers: nothing
        // a peer could forge into the line.
        Event::OperatorChanged { by, changes } => {
            for c in changes {
                info!(by = %by, what = %c.what, from = %c.from, to = %c.to, "operator change");
            }
        }
    }
}

fn drain(event: &DrainEvent) {
    match event {
        DrainEvent::Started {
            msr,
            live_legs,
            engine_calls,
        } => info!(
            %msr,
            live_legs,
            engine_calls = engine_calls.map(tracing::field::display),
            "msr draining: no new legs, the live ones stay"
        ),
        DrainEvent::Drained { msr } => {
            info!(%msr, "msr drained: no leg and no engine call left")
        }
        DrainEvent::Ended { msr } => info!(%msr, "msr takes new legs again"),
    }
}

fn registrar(event: &RegistrarEvent) {
    match event {
        RegistrarEvent::BindingAdded(b) => info!(
            msr = %b.msr,
            contact = %b.contact,
            uri = %b.uri,
            engine = b.engine.map(|e| e.sip_uri()).as_deref().map(tracing::field::display),
            mcc = b.engine.and_then(|e| e.mcc).map(tracing::field::display),
            version = b.version.as_deref().unwrap_or("unknown"),
            "binding added"
        ),
        RegistrarEvent::BindingRefreshed(b) => {
            debug!(msr = %b.msr, contact = %b.contact, "binding refreshed")
        }
        RegistrarEvent::BindingRestarted(b) => info!(
            msr = %b.msr,
            contact = %b.contact,
            call_id = %b.call_id,
            "binding restarted (new call-id), subscribing anew"
        ),
        RegistrarEvent::BindingRemoved { binding, cause } => match cause {
            RemovalCause::Lapsed => {
                info!(msr = %binding.msr, contact = %binding.contact, "binding lapsed")
            }
            RemovalCause::Unregistered => {
                info!(msr = %binding.msr, contact = %binding.contact, "binding removed")
            }
        },
    }
}

fn subscriber(now: Instant, event: &SubscriberEvent) {
    match event {
        SubscriberEvent::Active {
            msr,
            call_id,
            contact,
            expires,
        } => info!(%msr, %contact, %call_id, expires, "subscription active"),
        SubscriberEvent::Refreshed {
            msr,
            call_id,
            expires,
            // Routine: every MSR's subscription is refreshed every
            // `expires`/4 s, so at info it would be most of the log.
        } => debug!(%msr, %call_id, expires, "subscription refreshed"),
        SubscriberEvent::Load { msr, report, .. } => {
            debug!(%msr, load = report.load, cpu = report.cpu, calls = report.calls, "load report")
        }
        SubscriberEvent::Terminated {
            msr,
            call_id,
            reason,
            retry_at,
        } => {
            let reason = reason.as_ref().map(tracing::field::display);
            match retry_at.map(|t| t.saturating_duration_since(now)) {
                Some(wait) => info!(
                    %msr,
                    %call_id,
                    reason,
                    retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                    "subscription terminated"
                ),
                None => info!(%msr, %call_id, reason, "subscription terminated, not retrying"),
            }
        }
        SubscriberEvent::Retrying {
            msr,
            call_id,
            cause,
            delay,
        } => info!(%msr, %call_id, %cause, ?delay, "subscription retrying"),
        SubscriberEvent::Ended { msr, call_id } => {
            // No `call_id` field when no dialog was open.
            info!(%msr, call_id = call_id.as_deref().map(tracing::field::display), "subscription ended")
        }
    }
}

fn health(event: &HealthEvent) {
    match event {
        // A loss of health is what an operator scans for: warn; a
        // recovery is info.
        HealthEvent::Changed(change) => match change.from {
            Some(from) if change.log && change.to != Health::Healthy => warn!(
                msr = %change.msr,
                contact = %change.contact,
                from = %from,
                to = %change.to,
                cause = %change.cause,
                "health changed"
            ),
            Some(from) if change.log => info!(
                msr = %change.msr,
                contact = %change.contact,
                from = %from,
                to = %change.to,
                cause = %change.cause,
                "health changed"
            ),
            _ => debug!(
                msr = %change.msr,
                contact = %change.contact,
                to = %change.to,
                cause = %change.cause,
                "health set"
            ),
        },
        HealthEvent::Suppressed {
            contact,
            count,
            health,
        } => info!(
            %contact,
            count,
            %health,
            window_secs = LOG_WINDOW.as_secs(),
            "health changes not logged individually"
        ),
        // A trip is logged as the health change it makes; each failure
        // is counted in /metrics (`msr_collector_core_failures_total`).
        HealthEvent::CoreFailure {
            msr,
            cause,
            tripped,
        } => debug!(%msr, %cause, tripped, "a core reported a failure"),
    }
}

fn refusal(log: &RefusalLog) {
    match log {
        RefusalLog::Line(r) => warn!(
            msr = r.msr.as_deref().map(tracing::field::display),
            auth_name = r.auth_name.as_deref().map(tracing::field::display),
            reason = %r.reason,
            detail = r.reason.detail(),
            status = %r.status,
            source = r.source.map(tracing::field::display),
            suppressed = r.suppressed,
            "registration refused"
        ),
        // Over MAX_REFUSAL_LINES_PER_WINDOW lines in the window.
        RefusalLog::Unlogged { count } => warn!(
            count,
            window_secs = REFUSAL_WINDOW.as_secs(),
            "registration refusals not logged individually"
        ),
    }
}
