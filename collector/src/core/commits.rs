//! Control requests and the operator configuration's commit queue (SPEC
//! §6, §8, §12).
//!
//! A query is answered at once. A change is applied to a copy of the
//! configuration ([`admin::prepare`]), which goes to the store as an
//! [`Effect::Commit`]; only once the store has it does it become current
//! ([`Collector::install`]) and is its request answered `ok`, so an
//! acknowledged change is durable and a refused one changes nothing.
//!
//! One change is in flight at a time; changes that arrive meanwhile wait
//! in order (queries do not). With etcd, a change is refused at once while
//! etcd is unreachable, and a configuration another collector committed
//! arrives as [`EtcdEvent::Config`] and is installed the same way as one
//! made here. With etcd the collector also declares `[defaults] site` when
//! the shared configuration lacks it, once per revision.

use std::collections::VecDeque;

use msr_shared::admin::{ErrorCode, Request, Response, ResponseData};
use tokio::time::Instant;
use tracing::info;

use super::admin::{self, AdminContext, Origin, Outcome};
use crate::model::load_table::Change;
use crate::operator::cluster::StoreStatus;
use crate::operator::store::etcd::{CommitError, EtcdEvent};
use crate::operator::store::StoreError;
use crate::operator::OperatorConfig;

use super::counts::Counted;
use super::{AdminId, Collector, Effect, Event};

/// Identifies a commit ([`Effect::Commit`]); its outcome comes back with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// Where changes are committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The file store: the shell saves (and fsyncs) it.
    File,
    /// etcd, through the shell's etcd task.
    Etcd,
}

/// Why a commit did not take.
#[derive(Debug)]
pub enum CommitFailure {
    /// The file store could not write it.
    File(StoreError),
    /// etcd did not take it.
    Etcd(CommitError),
}

/// A change waiting for the store.
#[derive(Debug)]
struct Pending {
    ticket: Ticket,
    next: OperatorConfig,
    /// The answer and who asked; `None` for the collector's own change
    /// (declaring the default site).
    answer: Option<(Response, AdminId)>,
    /// Who made the change, for its log line.
    by: Origin,
}

/// The commit queue (module docs).
#[derive(Debug)]
pub(super) struct Commits {
    backend: Backend,
    next_ticket: u64,
    in_flight: Option<Pending>,
    queued: VecDeque<(AdminId, Request, Origin)>,
    /// The revision at which the default site was last declared (or tried).
    default_site_tried: Option<i64>,
}

impl Commits {
    pub(super) fn new(backend: Backend) -> Self {
        Self {
            backend,
            next_ticket: 0,
            in_flight: None,
            queued: VecDeque::new(),
            default_site_tried: None,
        }
    }
}

/// The answer to a change etcd did not take.
fn commit_refusal(error: &CommitError) -> Response {
    let code = match error {
        CommitError::Conflict { .. } => ErrorCode::Conflict,
        _ => ErrorCode::StoreUnavailable,
    };
    Response::error(code, error.to_string())
}

impl Collector {
    pub(super) fn on_admin(&mut self, now: Instant, id: AdminId, request: Request, origin: Origin) {
        if matches!(request, Request::ClusterList {}) {
            self.answer(id, Response::Ok(ResponseData::Cluster(self.cluster.view())));
            return;
        }
        if request.is_mutation() {
            if self.commits.in_flight.is_some() {
                self.commits.queued.push_back((id, request, origin));
                return;
            }
            if let StoreStatus::Unavailable { reason, .. } = self.cluster.status() {
                let error = CommitError::Unavailable {
                    reason: reason.clone(),
                };
                self.answer(id, commit_refusal(&error));
                return;
            }
        }
        let kind = match &request {
            Request::Select(_) => Counted::Selection,
            Request::Release { .. } => Counted::Release,
            _ => Counted::Not,
        };
        // Forgetting a gone MSR changes no stored setting, but it is an
        // operator's change all the same (SPEC §16).
        let forgets = match &request {
            Request::MsrForget { msr } => Some(msr.clone()),
            _ => None,
        };
        let mut ctx = AdminContext {
            operator: &mut self.operator,
            table: &mut self.table,
            registrar: &self.registrar,
            subscriber: &self.subscriber,
            defaults: &self.defaults,
            rng: &mut self.rng,
            legs: &mut self.legs,
            health: &mut self.health,
            absences: &mut self.absences,
            overload: &mut self.overload,
            core_hosts: self.cluster.core_hosts(),
        };
        let outcome = admin::prepare(request, &mut ctx, now);
        for (zone, change) in self.overload.take_changes() {
            if change == crate::model::overload::Change::Entered {
                self.counts.push_back(super::Count::ZoneOverload);
            }
            let headroom = crate::model::overload::headroom(self.cluster.core_hosts());
            self.events.push_back(Event::ZoneOverload {
                zone,
                change,
                headroom,
            });
        }
        match outcome {
            Outcome::Answer(response) => {
                self.count_answer(kind, &response);
                if let (Counted::Selection, Response::Err(body)) = (kind, &response) {
                    let line = super::refusals::SelectionRefusal::new(body);
                    self.selection_refusals.record(now, line);
                }
                if let (Some(msr), Response::Ok(_)) = (forgets, &response) {
                    let change = crate::operator::diff::ValueChange {
                        what: format!("msr {msr}"),
                        from: "gone".into(),
                        to: "forgotten".into(),
                    };
                    self.events.push_back(Event::OperatorChanged {
                        by: origin,
                        changes: vec![change],
                    });
                }
                self.answer(id, response);
            }
            Outcome::Change { next, response } => self.commit(*next, Some((response, id)), origin),
        }
    }

    fn answer(&mut self, id: AdminId, response: Response) {
        self.effects.push_back(Effect::Answer {
            id,
            response: Box::new(response),
        });
    }

    /// Hands `next` to the store; it becomes current with the store's
    /// acknowledgement ([`handle_committed`](Self::handle_committed),
    /// [`handle_etcd`](Self::handle_etcd)).
    fn commit(&mut self, next: OperatorConfig, answer: Option<(Response, AdminId)>, by: Origin) {
        self.commits.next_ticket += 1;
        let ticket = Ticket(self.commits.next_ticket);
        self.effects.push_back(Effect::Commit {
            ticket,
            config: Box::new(next.clone()),
            expected: self.cluster.mod_revision(),
        });
        self.commits.in_flight = Some(Pending {
            ticket,
            next,
            answer,
            by,
        });
    }

    /// Makes `next` the current operator configuration: the one path for a
    /// change made here and one made on another collector (SPEC §12). An
    /// `Expires` override reaches the subscriber only for the MSRs whose
    /// setting the change touched.
    fn install(&mut self, next: OperatorConfig, by: Origin) {
        let previous = std::mem::replace(&mut self.operator, next);
        let changes = crate::operator::diff::diff(&previous, &self.operator);
        if !changes.is_empty() {
            self.events
                .push_back(Event::OperatorChanged { by, changes });
        }
        self.table.apply(&self.operator, Change::OperatorChanged);
        // An MSR set inactive drains (SPEC §14); one set active again is
        // still watched, and its return reported.
        for (msr, settings) in self.operator.configured_msrs() {
            if !settings.active || !previous.is_active(msr) {
                if let Ok(name) = crate::operator::names::MsrName::new(msr) {
                    self.drains.watch(&name);
                }
            }
        }
        for (msr, expires) in self.operator.subscription_expires_changes(&previous) {
            self.subscriber.set_expires_override(msr, expires);
        }
    }

    /// The file store's answer to commit `ticket`: written (`Ok`) or not.
    pub fn handle_committed(
        &mut self,
        now: Instant,
        ticket: Ticket,
        result: Result<(), CommitFailure>,
    ) {
        if let Some(pending) = self.take_pending(ticket) {
            match result {
                Ok(()) => {
                    self.install(pending.next, pending.by);
                    if let Some((response, id)) = pending.answer {
                        self.answer(id, response);
                    }
                }
                Err(failure) => self.refused(pending, &failure),
            }
        }
        self.run_queued(now);
        self.settle(now);
    }

    fn refused(&mut self, pending: Pending, failure: &CommitFailure) {
        let response = match failure {
            CommitFailure::File(error) => {
                tracing::error!(cause = %error, "operator change not saved");
                admin::store_failed(error)
            }
            CommitFailure::Etcd(error) => {
                // The collector's own change (the default site) loses a
                // race when collectors start together: another one wrote
                // first, and the newer configuration is checked again.
                if pending.answer.is_none() && matches!(error, CommitError::Conflict { .. }) {
                    info!(
                        site = %self.table.placement().site,
                        "another collector changed the operator configuration first; \
                         the default site is declared in the new one if it still lacks it"
                    );
                } else {
                    info!(%error, "operator change refused by etcd");
                }
                commit_refusal(error)
            }
        };
        if let Some((_, id)) = pending.answer {
            self.answer(id, response);
        }
    }

    /// What the etcd task reports (SPEC §12).
    pub fn handle_etcd(&mut self, now: Instant, event: EtcdEvent) {
        match event {
            EtcdEvent::Connected => {
                self.cluster.connected();
                self.declare_default_site();
            }
            EtcdEvent::Unavailable { reason, since } => self.cluster.unavailable(since, reason),
            EtcdEvent::Config {
                config,
                mod_revision,
                revision,
            } => {
                if self.cluster.observe(revision, mod_revision) && *config != self.operator {
                    info!(revision, "operator configuration changed in etcd");
                    // Our own change, seen through the watch before its
                    // commit's answer, is still ours.
                    let by = match &self.commits.in_flight {
                        Some(pending) if pending.next == *config => pending.by,
                        _ => Origin::Store,
                    };
                    self.install(*config, by);
                }
                self.declare_default_site();
            }
            EtcdEvent::Members(members) => {
                let before = self.cluster.core_hosts();
                self.cluster.set_members(members);
                let after = self.cluster.core_hosts();
                if before != after {
                    info!(core_hosts = after, "cluster membership changed");
                }
            }
            EtcdEvent::Committed { ticket, revision } => {
                if let Some(pending) = self.take_pending(Ticket(ticket)) {
                    // Newer than what the watch already gave: ours is current.
                    if self.cluster.observe(revision, Some(revision)) {
                        self.install(pending.next, pending.by);
                    }
                    if let Some((response, id)) = pending.answer {
                        self.answer(id, response);
                    }
                }
                self.run_queued(now);
            }
            EtcdEvent::Refused { ticket, error } => {
                if let Some(pending) = self.take_pending(Ticket(ticket)) {
                    self.refused(pending, &CommitFailure::Etcd(error));
                }
                self.run_queued(now);
            }
        }
        self.settle(now);
    }

    fn take_pending(&mut self, ticket: Ticket) -> Option<Pending> {
        match &self.commits.in_flight {
            Some(pending) if pending.ticket == ticket => self.commits.in_flight.take(),
            _ => None,
        }
    }

    /// Carries out the changes that waited for the one in flight, in order,
    /// until one is in flight again.
    fn run_queued(&mut self, now: Instant) {
        while self.commits.in_flight.is_none() {
            let Some((id, request, origin)) = self.commits.queued.pop_front() else {
                self.declare_default_site();
                return;
            };
            self.on_admin(now, id, request, origin);
        }
    }

    /// With etcd: declares `[defaults] site` when the shared configuration
    /// lacks it ([`OperatorConfig::with_default_site`]), once per revision
    /// (a conflict brings a newer revision, which may have it). With the
    /// file store the shell declares it at start, by the same rule, before
    /// anything is served.
    fn declare_default_site(&mut self) {
        let seen = self.cluster.seen();
        if self.commits.backend != Backend::Etcd
            || self.commits.in_flight.is_some()
            || !self.commits.queued.is_empty()
            || *self.cluster.status() != StoreStatus::Connected
            || self.commits.default_site_tried == Some(seen)
        {
            return;
        }
        self.commits.default_site_tried = Some(seen);
        if let Some(next) = self
            .operator
            .with_default_site(&self.table.placement().site)
        {
            self.commit(next, None, Origin::Collector);
        }
    }
}
