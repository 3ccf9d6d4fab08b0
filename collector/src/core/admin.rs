//! The control protocol's requests carried out against the collector's
//! state ([`msr_shared::admin`], SPEC §8): every front end's request — the
//! control socket, HTTP, the SIP redirect server — ends here, through
//! [`Collector::handle_admin_from`](super::Collector::handle_admin_from).
//!
//! [`prepare`] carries out one [`Request`]. A request that changes the
//! operator configuration is applied to a copy, which the core hands to the
//! store and only then makes current and answers `ok`
//! ([`super::commits`]): an acknowledged change is durable, and a failed
//! save changes nothing. A query — the lists, a leg's selection with its
//! stickiness, admission and failover (SPEC §7, §9, §14), a release — is
//! answered at once; its tables are built in `views.rs`.
//!
//! Architecture invariant: [`prepare`] reads no clock (the caller passes `now`)
//! and uses only the RNG in [`AdminContext`].

use std::time::Duration;

use msr_shared::admin::{
    Change, ChangeValue, ChangedEntity, ChangedProperty, ContactProperty, Distance, ErrorBody,
    ErrorCode, Explain, ExplainCandidate, ExplainOutcome, HealthState, Hello, Interval, LegInfo,
    LegOutcome, LegRows, MsrInfo, RegistrationStatus, Released, Request, ResourceInfo, Response,
    ResponseData, SelectQuery, Selection, SelectionRule, SiteMatrix, SubscriptionInfo, ZoneInfo,
    DEFAULT_LEG_LIST_LIMIT, EVENT_PACKAGE, MAX_LEG_LIST_LIMIT, PROTOCOL_VERSION,
};
use msr_shared::present::{format_number, normalize_zero};
use rand::RngCore;
use tokio::time::Instant;

use crate::config::DEFAULT_SUBSCRIPTION_EXPIRES_SECS;
use crate::config::{SelectionConfig, SelectionPolicy};
use crate::model::health::{Health, HealthMonitor};
use crate::model::legs::{
    key_problem, Bound, LegKey, LegTable, MAX_CALL_ID_LEN, MAX_LABEL_LEN, MAX_LIVE_LEGS,
};
use crate::model::load_table::LoadTable;
use crate::operator::names::{self, NameKind};
use crate::operator::topology::TopologyError;
use crate::operator::{OperatorConfig, OperatorError};
use crate::select::{self, CandidateOutcome, Draw, Explanation, Query, Refusal};
use crate::sip::registrar::Registrar;
use crate::sip::subscriber::Subscriber;

/// Collector-wide defaults the control requests need.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    /// SUBSCRIBE `Expires` without a per-MSR override, seconds (SPEC §4: 60).
    pub subscription_expires_secs: u32,
    /// A conference's host takes its legs below this fraction of its load
    /// limit (SPEC §9: 0.8).
    pub existing_conference_threshold: f64,
    /// An MSR takes a new conference below this fraction (SPEC §9: 0.5).
    pub new_conference_threshold: f64,
    /// `[selection]`: the configured policy and when it falls back (SPEC §10).
    pub selection: SelectionConfig,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            subscription_expires_secs: DEFAULT_SUBSCRIPTION_EXPIRES_SECS,
            existing_conference_threshold: 0.8,
            new_conference_threshold: 0.5,
            selection: SelectionConfig::default(),
        }
    }
}

/// The policy a selection uses (SPEC §10): `pooled` when configured, for a
/// leg the collector can follow to its end (it has a `call_id`), while the
/// core releases legs (one seen within the release window); otherwise the
/// `ecss` draw. The estimate counts this collector's placements minus its
/// releases: without releases it could only grow, and a leg without a
/// Call-ID is never released, so both would make `pooled` worse than the
/// draw it replaces, which is what SPEC §10 rules out. A selection without
/// a leg under `pooled` is the draw held to the estimate of its own
/// placements since the last report ([`select::Policy::EcssUnfollowed`]:
/// they count only until a report covers them, so they cannot grow), and
/// of the legs only while the core releases them.
pub fn effective_policy(
    selection: &SelectionConfig,
    names_a_leg: bool,
    last_release: Option<Instant>,
    now: Instant,
    core_hosts: u32,
) -> select::Policy {
    let releasing = last_release
        .is_some_and(|at| now.saturating_duration_since(at) <= selection.release_window);
    match selection.policy {
        SelectionPolicy::Pooled if names_a_leg && releasing => select::Policy::Pooled {
            core_hosts: core_hosts.max(1),
            headroom: select::Headroom::NONE,
        },
        SelectionPolicy::Pooled if !names_a_leg => select::Policy::EcssUnfollowed {
            core_hosts: core_hosts.max(1),
            headroom: select::Headroom::NONE,
            legs: releasing,
        },
        _ => select::Policy::Ecss,
    }
}

/// What [`prepare`] may read and change; owned by the collector's main loop.
pub struct AdminContext<'a> {
    /// The operator configuration (source of truth, SPEC §6).
    pub operator: &'a mut OperatorConfig,
    /// The live load table (the selection index); told of every operator
    /// change.
    pub table: &'a mut LoadTable,
    /// The bindings (SPEC §3), which the lists show.
    pub registrar: &'a Registrar,
    /// The subscriptions (SPEC §4), which the lists show.
    pub subscriber: &'a Subscriber,
    /// Default zone, site and subscription expiry.
    pub defaults: &'a Defaults,
    /// The RNG for `select` draws.
    pub rng: &'a mut dyn RngCore,
    /// The live call legs (SPEC §9).
    pub legs: &'a mut LegTable,
    /// The MSRs' health, which counts the failures cores report (SPEC §14).
    pub health: &'a mut HealthMonitor,
    /// The MSRs that are gone (SPEC §14), which `msr list` shows.
    pub absences: &'a mut crate::model::absent::Absences,
    /// Which zones are in overload (SPEC §10), which `pooled` selections
    /// read and record.
    pub overload: &'a mut crate::model::overload::OverloadWatch,
    /// G, the number of core hosts (SPEC §10, [`crate::operator::cluster::Cluster::core_hosts`]).
    pub core_hosts: u32,
}

/// Who made a request, or an operator change (SPEC §16: every change on
/// record, with who made it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A control-socket client, with its user id (peer credentials).
    Control {
        /// The client's uid, when the kernel told it.
        uid: Option<u32>,
    },
    /// The HTTP API (loopback, or holding `[http] token`).
    Http,
    /// The SIP redirect server.
    Redirect,
    /// The collector itself (declaring its default site).
    Collector,
    /// Another collector, through the shared store (etcd, SPEC §12).
    Store,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Control { uid: Some(uid) } => write!(f, "control socket uid {uid}"),
            Origin::Control { uid: None } => f.write_str("control socket"),
            Origin::Http => f.write_str("http api"),
            Origin::Redirect => f.write_str("redirect server"),
            Origin::Collector => f.write_str("this collector"),
            Origin::Store => f.write_str("another collector (etcd)"),
        }
    }
}

fn changed(
    entity: ChangedEntity,
    name: &str,
    property: ChangedProperty,
    from: ChangeValue,
    to: ChangeValue,
) -> Response {
    Response::Ok(ResponseData::Changed(Change {
        entity,
        name: name.into(),
        property,
        from,
        to,
        msr_registered: None,
    }))
}

/// The MSR a change names (`msr set`, `subscription set`), whose
/// registration its answer states ([`Change::msr_registered`]).
fn msr_of(request: &Request) -> Option<String> {
    match request {
        Request::MsrSetPerformanceCoefficient { msr, .. }
        | Request::MsrSetActive { msr, .. }
        | Request::MsrSetLoadLimit { msr, .. }
        | Request::SubscriptionSetExpires { msr, .. } => Some(msr.clone()),
        _ => None,
    }
}

/// The contact a change names (`resource set`, `resource unset`), whose
/// registration its answer states ([`Change::msr_registered`]).
fn contact_of(request: &Request) -> Option<&str> {
    match request {
        Request::ResourceSetZone { contact, .. }
        | Request::ResourceSetSite { contact, .. }
        | Request::ResourceUnset { contact, .. } => Some(contact),
        _ => None,
    }
}

fn operator_error(error: &OperatorError) -> Response {
    let code = match error {
        OperatorError::Topology(TopologyError::UnknownSite { .. }) => ErrorCode::UnknownSite,
        OperatorError::Topology(TopologyError::SiteExists { .. }) => ErrorCode::SiteExists,
        OperatorError::Topology(TopologyError::SiteInUse { .. }) => ErrorCode::SiteInUse,
        _ => ErrorCode::InvalidValue,
    };
    // The error's text shows numbers as msrctl does (`1e308`, not 309 digits).
    let message = error.to_string();
    Response::error(code, message)
}

/// What [`prepare`] made of a request.
#[derive(Debug)]
pub enum Outcome {
    /// Answer this now (a query, a refusal, or a change that changes nothing).
    Answer(Response),
    /// A change: once the store has `next`, make it current and answer
    /// `response`; if the store refuses it, nothing changed.
    Change {
        /// The operator configuration with the change applied.
        next: Box<OperatorConfig>,
        /// The answer once it is stored.
        response: Response,
    },
}

/// Carries out one control request at `now` (SPEC §8), except for storing a
/// change: a mutation is applied to a copy of the operator configuration,
/// which is returned for the caller to store ([`Outcome::Change`]); the
/// current configuration is left alone.
pub fn prepare(request: Request, ctx: &mut AdminContext<'_>, now: Instant) -> Outcome {
    if request.is_mutation() {
        let mut next = ctx.operator.clone();
        let msr = msr_of(&request);
        let contact = contact_of(&request).map(str::to_owned);
        let mut response = mutate(request, &mut next, ctx.table, ctx.defaults);
        // A setting for an MSR that is not registered is kept: it applies
        // when the MSR registers (SPEC §6), which may be later or through
        // another collector of the cluster (SPEC §12). A typo would go
        // unseen, so the answer says whether the MSR is known here
        // (issue 44).
        if let (Some(msr), Response::Ok(ResponseData::Changed(change))) = (msr, &mut response) {
            change.msr_registered = Some(ctx.table.has_contacts(&msr));
        }
        // The same for a contact's zone or site: the contact names the MSR
        // and the interface, and either may be mistyped.
        if let (Some(contact), Response::Ok(ResponseData::Changed(change))) =
            (contact, &mut response)
        {
            change.msr_registered = Some(ctx.table.has_contact(&contact));
        }
        if matches!(response, Response::Ok(_)) && next != *ctx.operator {
            return Outcome::Change {
                next: Box::new(next),
                response,
            };
        }
        return Outcome::Answer(response);
    }
    Outcome::Answer(query(request, ctx, now))
}

/// The answer to a change the file store could not save.
pub fn store_failed(error: &crate::operator::store::StoreError) -> Response {
    Response::error(ErrorCode::StoreFailed, error.to_string())
}

fn mutate(
    request: Request,
    operator: &mut OperatorConfig,
    table: &LoadTable,
    defaults: &Defaults,
) -> Response {
    match request {
        Request::SiteDeclare { name } => match operator.declare_site(&name) {
            Ok(()) => Response::Ok(ResponseData::SiteDeclared { name }),
            Err(e) => operator_error(&e),
        },
        Request::SiteRemove { name } => {
            // The default site is referenced by every future contact.
            let live = |site: &str| {
                if site == table.placement().site {
                    Some("the collector's default site ([defaults] site)".to_owned())
                } else if table.site_in_use(site) {
                    Some("a registered contact (see msrctl resource list)".to_owned())
                } else {
                    None
                }
            };
            match operator.remove_site(&name, live) {
                Ok(()) => Response::Ok(ResponseData::SiteRemoved { name }),
                Err(e) => operator_error(&e),
            }
        }
        Request::SiteDistance { a, b, distance } => {
            // `-0` is stored, and shown, as `0`.
            let value = normalize_zero(distance.as_f64());
            match operator.set_distance(&a, &b, value) {
                Ok(previous) => changed(
                    ChangedEntity::Site,
                    &format!("{a} {b}"),
                    ChangedProperty::Distance,
                    ChangeValue::Distance(Distance::from_f64(previous)),
                    ChangeValue::Distance(Distance::from_f64(value)),
                ),
                Err(e) => operator_error(&e),
            }
        }
        Request::MsrSetPerformanceCoefficient { msr, value } => {
            let value = normalize_zero(value);
            match operator.set_performance_coefficient(&msr, value) {
                Ok(previous) => changed(
                    ChangedEntity::Msr,
                    &msr,
                    ChangedProperty::PerformanceCoefficient,
                    ChangeValue::Number(previous),
                    ChangeValue::Number(value),
                ),
                Err(e) => operator_error(&e),
            }
        }
        Request::MsrSetLoadLimit { msr, value } => match operator.set_load_limit(&msr, value) {
            Ok(previous) => changed(
                ChangedEntity::Msr,
                &msr,
                ChangedProperty::LoadLimit,
                ChangeValue::Count(previous.into()),
                ChangeValue::Count(value),
            ),
            Err(e) => operator_error(&e),
        },
        Request::MsrSetActive { msr, active } => match operator.set_active(&msr, active) {
            Ok(previous) => changed(
                ChangedEntity::Msr,
                &msr,
                ChangedProperty::Active,
                ChangeValue::Flag(previous),
                ChangeValue::Flag(active),
            ),
            Err(e) => operator_error(&e),
        },
        Request::ResourceSetZone { contact, zone } => {
            let previous = operator
                .contact_zone(&contact, &table.placement().zone)
                .to_string();
            match operator.set_contact_zone(&contact, &zone) {
                Ok(()) => changed(
                    ChangedEntity::Contact,
                    &contact,
                    ChangedProperty::Zone,
                    ChangeValue::Text(previous),
                    ChangeValue::Text(zone),
                ),
                Err(e) => operator_error(&e),
            }
        }
        Request::ResourceSetSite { contact, site } => {
            let previous = operator
                .contact_site(&contact, &table.placement().site)
                .to_string();
            match operator.set_contact_site(&contact, &site) {
                Ok(()) => changed(
                    ChangedEntity::Contact,
                    &contact,
                    ChangedProperty::Site,
                    ChangeValue::Text(previous),
                    ChangeValue::Text(site),
                ),
                Err(e) => operator_error(&e),
            }
        }
        Request::ResourceUnset { contact, property } => {
            let (previous, default) = match property {
                ContactProperty::Zone => (
                    operator
                        .contact_zone(&contact, &table.placement().zone)
                        .as_str(),
                    table.placement().zone.as_str(),
                ),
                ContactProperty::Site => (
                    operator
                        .contact_site(&contact, &table.placement().site)
                        .as_str(),
                    table.placement().site.as_str(),
                ),
            };
            let (previous, default) = (previous.to_owned(), default.to_owned());
            match operator.unset_contact(&contact, property) {
                Ok(_) => changed(
                    ChangedEntity::Contact,
                    &contact,
                    property.into(),
                    ChangeValue::Text(previous),
                    ChangeValue::Text(default),
                ),
                Err(e) => operator_error(&e),
            }
        }
        Request::SubscriptionSetExpires {
            msr,
            event,
            expires_secs,
        } => {
            if event != EVENT_PACKAGE {
                return Response::error(
                    ErrorCode::BadEvent,
                    format!("unknown event package `{event}`, expected `{EVENT_PACKAGE}`"),
                );
            }
            match operator.set_subscription_expires(&msr, expires_secs) {
                Ok(previous) => changed(
                    ChangedEntity::Subscription,
                    &format!("{msr} {event}"),
                    ChangedProperty::Expires,
                    ChangeValue::Count(previous.unwrap_or(defaults.subscription_expires_secs)),
                    ChangeValue::Count(expires_secs),
                ),
                Err(e) => operator_error(&e),
            }
        }
        other => Response::error(ErrorCode::BadRequest, format!("not a mutation: {other:?}")),
    }
}

fn query(request: Request, ctx: &mut AdminContext<'_>, now: Instant) -> Response {
    match request {
        Request::SiteList {} => Response::Ok(ResponseData::Sites {
            sites: ctx.operator.topology().sites().map(str::to_owned).collect(),
        }),
        Request::ZoneList {} => zone_list(ctx),
        Request::SiteMatrix { names } => site_matrix(ctx.operator, &names),
        Request::MsrList {} => msr_list(ctx, now),
        Request::MsrForget { msr } => {
            if ctx.absences.forget(&msr) {
                msr_list(ctx, now)
            } else if !ctx.registrar.is_registered(&msr) {
                Response::error(
                    ErrorCode::MsrNotFound,
                    format!(
                        "no msr `{}` is known: nothing to forget (see msrctl msr list)",
                        msr_shared::logging::printable(&msr, 64)
                    ),
                )
            } else {
                Response::error(
                    ErrorCode::InvalidValue,
                    format!(
                        "msr `{}` is not gone: only an msr whose registration ended can be forgotten (see msrctl msr list)",
                        msr_shared::logging::printable(&msr, 64)
                    ),
                )
            }
        }
        Request::ResourceList { active_only } => resource_list(ctx, now, active_only),
        Request::SubscriptionList {} => subscription_list(ctx, now),
        Request::LegList {
            msr,
            older_than_secs,
            limit,
        } => leg_list(ctx, now, msr.as_deref(), older_than_secs, limit),
        Request::Hello {} => Response::Ok(ResponseData::Hello(Hello {
            version: PROTOCOL_VERSION,
            software: concat!("msr-collector ", env!("CARGO_PKG_VERSION")).to_owned(),
        })),
        Request::Select(SelectQuery {
            zone,
            site,
            msr,
            random,
            explain,
            call_id,
            leg,
            conference,
            failed,
            failure,
            codecs,
        }) => {
            let (zone, site) = match leg_place(ctx.table, zone, site, msr.as_deref()) {
                Ok(place) => place,
                Err(error) => return Response::error(ErrorCode::InvalidValue, error.to_string()),
            };
            // The offer's codecs (SPEC §15): an unknown name is refused, so
            // a leg is never placed on an MSR that was not checked for it.
            // Empty items are skipped, as HTTP's `codecs=pcma,,h264` is.
            let needs = match codecs
                .iter()
                .filter(|name| !name.trim().is_empty())
                .map(|name| name.parse::<msr_shared::media::Codec>())
                .collect::<Result<msr_shared::media::CodecSet, _>>()
            {
                Ok(needs) => needs,
                Err(error) => {
                    return Response::error(
                        ErrorCode::InvalidValue,
                        format!(
                            "codecs: {}",
                            msr_shared::logging::printable(&error.to_string(), 400)
                        ),
                    )
                }
            };
            let failover = match failover::check(failed, failure.as_deref(), call_id.is_some()) {
                Ok(failover) => failover,
                Err((code, message)) => return Response::error(code, message),
            };
            let leg = match (call_id, leg, conference) {
                (Some(call_id), leg, conference) => Some(LegRequest {
                    call_id,
                    leg,
                    conference,
                }),
                (None, None, None) => None,
                (None, _, _) => {
                    return Response::error(
                        ErrorCode::BadRequest,
                        "leg and conference name a leg: they need call_id",
                    )
                }
            };
            if let Some(l) = &leg {
                if let Some(refusal) =
                    leg_key_refusal(&l.call_id, l.leg.as_deref(), l.conference.as_deref())
                {
                    return refusal;
                }
                let key = LegKey {
                    call_id: &l.call_id,
                    leg: l.leg.as_deref(),
                };
                // A release overtook this select (another connection, a
                // CANCEL racing its INVITE): placing the leg now would leak
                // it until its maximum duration (SPEC §9).
                if let Some(at) = ctx.legs.released_early(now, key) {
                    let ago = now.saturating_duration_since(at).as_secs();
                    return Response::error(
                        ErrorCode::LegReleased,
                        format!(
                            "leg {} was released {ago} s ago and was not live then: a select within {} s of such a release places nothing",
                            leg_name(key),
                            crate::model::legs::EARLY_RELEASE_MEMORY.as_secs()
                        ),
                    );
                }
                // The core released this live leg before its failover
                // came (another connection, a CANCEL racing the engine's
                // failure): placing it anew would leak it (SPEC §9, §14).
                if failover.is_some() && ctx.legs.get(now, key).is_none() {
                    if let Some(at) = ctx.legs.released_by_core(now, key) {
                        let ago = now.saturating_duration_since(at).as_secs();
                        return Response::error(
                            ErrorCode::LegReleased,
                            format!(
                                "leg {} was released {ago} s ago: a failover for it within {} s of its release places nothing",
                                leg_name(key),
                                crate::model::legs::EARLY_RELEASE_MEMORY.as_secs()
                            ),
                        );
                    }
                }
                if let Some(f) = &failover {
                    let attempts = ctx.defaults.selection.failover_attempts;
                    let refused =
                        failover::apply(f, key, attempts, ctx.legs, ctx.table, ctx.health, now);
                    if let Some(refusal) = refused {
                        return refusal;
                    }
                }
                if ctx.legs.len() >= MAX_LIVE_LEGS && ctx.legs.get(now, key).is_none() {
                    return Response::error(
                        ErrorCode::Unavailable,
                        format!(
                            "{MAX_LIVE_LEGS} legs are live: release legs (or wait for their maximum duration) before placing more"
                        ),
                    );
                }
            }
            let policy = effective_policy(
                &ctx.defaults.selection,
                leg.is_some(),
                ctx.legs.last_release(),
                now,
                ctx.core_hosts,
            )
            .in_zone(&zone, ctx.overload, &mut *ctx.rng);
            run_select(
                ctx,
                Query {
                    zone,
                    site,
                    msr,
                    admission: select::Admission::Plain,
                    policy,
                    now,
                    failed: failover
                        .as_ref()
                        .map(|f| f.failed.clone())
                        .unwrap_or_default(),
                    needs,
                },
                random.map(normalize_zero),
                explain,
                leg,
                failover.as_ref(),
            )
        }
        Request::Release { call_id, leg } => {
            if let Some(refusal) = leg_key_refusal(&call_id, leg.as_deref(), None) {
                return refusal;
            }
            // Each ended leg leaves its MSR's estimate (SPEC §10).
            let table = &mut *ctx.table;
            let released = ctx.legs.release_at(now, &call_id, leg.as_deref(), |msr| {
                table.note_ended(msr, now)
            });
            if released > 0 {
                ctx.legs.note_core_release(now, &call_id, leg.as_deref());
            }
            Response::Ok(ResponseData::Released(Released {
                call_id,
                leg,
                released: u32::try_from(released).unwrap_or(u32::MAX),
            }))
        }
        other => Response::error(ErrorCode::BadRequest, format!("not a query: {other:?}")),
    }
}

/// A select's zone and site: an unnamed one is the collector's
/// `[defaults]` as they are now, so every front end (the redirect server
/// too) follows a reload. The names a selection reads are held to the
/// rules they were stored under (SPEC §6): an empty or malformed `msr`
/// would otherwise read as "the other leg is elsewhere", a malformed zone
/// as "no MSR in it"; such a name is refused (`invalid_value`).
pub(super) fn leg_place(
    table: &LoadTable,
    zone: String,
    site: String,
    msr: Option<&str>,
) -> Result<(String, String), names::NameError> {
    let zone = if zone.is_empty() {
        table.placement().zone.to_string()
    } else {
        zone
    };
    let site = if site.is_empty() {
        table.placement().site.to_string()
    } else {
        site
    };
    let checked = [(NameKind::Zone, Some(zone.as_str())), (NameKind::Msr, msr)];
    for (kind, name) in checked {
        if let Some(name) = name {
            names::check(kind, name)?;
        }
    }
    Ok((zone, site))
}

/// An `invalid_value` answer for a Call-ID, leg label or conference id
/// that [`key_problem`] refuses; `None` when all are acceptable.
fn leg_key_refusal(call_id: &str, leg: Option<&str>, conference: Option<&str>) -> Option<Response> {
    let checks = [
        ("call_id", Some(call_id), MAX_CALL_ID_LEN),
        ("leg", leg, MAX_LABEL_LEN),
        ("conference", conference, MAX_LABEL_LEN),
    ];
    checks.into_iter().find_map(|(field, value, max)| {
        let problem = key_problem(value?, max)?;
        Some(Response::error(
            ErrorCode::InvalidValue,
            format!("{field} {problem}"),
        ))
    })
}

/// The leg a selection is for (SPEC §9).
#[derive(Debug)]
struct LegRequest {
    call_id: String,
    leg: Option<String>,
    conference: Option<String>,
}

/// Where a refusal's reason is told in full: the table of `msrctl select
/// --explain`.
const SEE_EXPLAIN: &str = "see msrctl select --explain";

/// [`SEE_EXPLAIN`] in parentheses, after a space; nothing when the request
/// asked for the explanation (`explained`): its answer already carries the
/// table, and naming the flag the asker gave reads as if it were ignored.
fn see_explain(explained: bool) -> String {
    if explained {
        String::new()
    } else {
        format!(" ({SEE_EXPLAIN})")
    }
}

/// The reason for `refusal` in words; `explained` when the answer carries
/// the explanation (the request asked for it), so no hint points at it.
fn refusal_message(refusal: Refusal, query: &Query, explained: bool) -> String {
    match refusal {
        Refusal::MsrNotFound => format!(
            "no registered active msr in zone `{}` at a finite distance from site `{}`",
            query.zone, query.site
        ),
        Refusal::MsrOverloaded => match &query.admission {
            select::Admission::Plain => match query.policy {
                // SPEC §10: in overload the headroom, not the limit, refused.
                select::Policy::Pooled { headroom, .. } if headroom.keeps() => format!(
                    "every msr in zone `{}` nearest to site `{}` is at or above its load limit \
                     less the headroom kept for the other core hosts (zone in overload: up to {} \
                     session{} of each msr)",
                    query.zone,
                    query.site,
                    headroom.sessions,
                    if headroom.sessions == 1 { "" } else { "s" }
                ),
                // SPEC §10: a select without a leg counts what it sent
                // near the top until the next report.
                select::Policy::EcssUnfollowed { headroom, .. } => format!(
                    "every msr in zone `{}` nearest to site `{}` is at or above its load limit \
                     by its last report and the selections without a call_id sent to it since{}",
                    query.zone,
                    query.site,
                    if headroom.keeps() {
                        format!(
                            " (zone in overload: up to {} session{} of each msr kept for the other core hosts)",
                            headroom.sessions,
                            if headroom.sessions == 1 { "" } else { "s" }
                        )
                    } else {
                        String::new()
                    }
                ),
                _ => format!(
                    "every msr in zone `{}` nearest to site `{}` is at or above its load limit",
                    query.zone, query.site
                ),
            },
            select::Admission::Conference(c) => format!(
                "every msr in zone `{}` nearest to site `{}` is at or above the {}conference threshold \
                 ({}% of its load limit) for conference `{}`",
                query.zone,
                query.site,
                if c.host.is_some() { "" } else { "new-" },
                format_number(c.new_threshold * 100.0),
                c.id
            ),
        },
        Refusal::UnknownSite => format!("site `{}` is not declared", query.site),
        Refusal::MsrUnhealthy => format!(
            "no healthy msr in zone `{}` at a finite distance from site `{}`: the registered active ones are unhealthy{}",
            query.zone,
            query.site,
            see_explain(explained)
        ),
        Refusal::NoCapableMsr {
            lack,
            needs,
            conference_host,
        } => no_capable_message(query, lack, needs, conference_host, explained),
    }
}

/// Why no MSR takes the offer (SPEC §15), naming what is missing;
/// `explained` as for [`refusal_message`].
fn no_capable_message(
    query: &Query,
    lack: Option<msr_shared::media::Lack>,
    needs: msr_shared::media::CodecSet,
    conference_host: bool,
    explained: bool,
) -> String {
    let conference = match &query.admission {
        select::Admission::Conference(c) if conference_host => c,
        _ => {
            return match lack {
                Some(lack) => format!(
                    "no msr in zone `{}` at a finite distance from site `{}` takes {lack} (offer: {needs}{})",
                    query.zone,
                    query.site,
                    if explained {
                        String::new()
                    } else {
                        format!("; {SEE_EXPLAIN}")
                    }
                ),
                None => format!(
                    "no msr in zone `{}` at a finite distance from site `{}` takes every kind of media of the offer {needs} together{}",
                    query.zone,
                    query.site,
                    see_explain(explained)
                ),
            }
        }
    };
    format!(
        "msr `{}` hosts conference `{}` and does not take {}: the leg is refused rather than split from its conference",
        conference.host.as_deref().unwrap_or("-"),
        conference.id,
        lack.map_or_else(|| needs.to_string(), |l| l.to_string())
    )
}

fn run_select(
    ctx: &mut AdminContext<'_>,
    mut query: Query,
    random: Option<f64>,
    want_explain: bool,
    leg: Option<LegRequest>,
    failover: Option<&failover::Failover>,
) -> Response {
    let key = leg.as_ref().map(|l| LegKey {
        call_id: &l.call_id,
        leg: l.leg.as_deref(),
    });
    // SPEC §9 stickiness: a live leg keeps its MSR and contact, whatever
    // changed, while that contact is registered.
    if let Some(key) = key {
        if let Some(answer) = sticky(ctx, &query, key) {
            return answer;
        }
        if let Some(conference) = leg.as_ref().and_then(|l| l.conference.as_deref()) {
            query.admission = select::Admission::Conference(select::ConferenceAdmission {
                id: conference.to_owned(),
                host: ctx.legs.conference_host(conference).map(str::to_owned),
                existing_threshold: ctx.defaults.existing_conference_threshold,
                new_threshold: ctx.defaults.new_conference_threshold,
            });
        }
    }
    // The hot path (a random draw, no explanation) records nothing; the
    // explanation is built only when asked for or for a fixed draw.
    let (outcome, explain) = if random.is_none() && !want_explain {
        // The selection index keeps its `pooled` keys for the G queries
        // use (SPEC §10, §12); a change of G re-keys it once, here.
        ctx.table.set_core_hosts(ctx.core_hosts);
        let outcome = select::select(ctx.table, ctx.operator.topology(), &query, &mut *ctx.rng);
        (outcome, None)
    } else {
        let draw = match random {
            Some(value) => Draw::Fixed(value),
            None => Draw::Random(&mut *ctx.rng),
        };
        let explanation = match select::explain(ctx.table, ctx.operator.topology(), &query, draw) {
            Ok(explanation) => explanation,
            Err(error) => return Response::error(ErrorCode::InvalidValue, error.to_string()),
        };
        let explain = want_explain.then(|| to_wire_explain(&query, &explanation));
        (explanation.outcome, explain)
    };
    // A select that names no leg sends a session to its MSR, unless it only
    // asked why (`explain`) or replayed a draw (`random`): then it placed
    // nothing, so it is neither counted nor an outcome of the zone's
    // overload window (an operator asking why must not put the zone in
    // overload). With a leg both place it.
    if key.is_some() || (random.is_none() && !want_explain) {
        select::note_outcome(ctx.overload, &query, &outcome);
        select::note_unfollowed(ctx.table, &query, &outcome);
    }
    match outcome {
        Ok(choice) => {
            let leg_outcome = key.map(|key| {
                let conference = leg.as_ref().and_then(|l| l.conference.as_deref());
                let previous = ctx.legs.get(query.now, key).map(|l| l.msr.to_owned());
                let bound = ctx
                    .legs
                    .bind(query.now, key, &choice.msr, &choice.contact, conference);
                // A leg new on its MSR counts in its estimate until a report
                // covers it (SPEC §10); a re-anchored one leaves the MSR it
                // was on, whose capacity it no longer takes.
                if bound != Bound::Unchanged {
                    ctx.table.note_placed(&choice.msr, query.now);
                }
                if let (Bound::Reanchored, Some(old)) = (bound, previous.as_deref()) {
                    if old != choice.msr.as_str() {
                        ctx.table.note_ended(old, query.now);
                    }
                }
                match bound {
                    Bound::New => LegOutcome::New,
                    Bound::Reanchored => LegOutcome::Reanchored,
                    Bound::Unchanged => LegOutcome::Sticky,
                }
            });
            Response::Ok(ResponseData::Selected(selection_of(
                choice,
                leg_outcome,
                explain,
            )))
        }
        Err(refusal) => match (failover, key) {
            // Failover found no MSR left: the leg has nowhere to be.
            (Some(f), Some(key)) => {
                failover::release(ctx.legs, ctx.table, key, query.now);
                // The select's own reason speaks of the zone as a whole;
                // here the failed MSRs were left out first.
                let why = match refusal {
                    Refusal::MsrOverloaded | Refusal::UnknownSite => {
                        refusal_message(refusal, &query, explain.is_some())
                    }
                    // The failed MSRs may take the offer; the others don't.
                    Refusal::NoCapableMsr { lack, needs, .. } => format!(
                        "no other msr of the zone takes {}",
                        lack.map_or_else(
                            || format!("the offer {needs} together"),
                            |l| l.to_string()
                        )
                    ),
                    Refusal::MsrNotFound | Refusal::MsrUnhealthy => format!(
                        "no other msr of the zone at a finite distance can take it{}",
                        see_explain(explain.is_some())
                    ),
                };
                let mut response = failover::refusal(f, key, &why);
                if let Response::Err(body) = &mut response {
                    body.explain = explain;
                }
                response
            }
            _ => {
                let mut message = refusal_message(refusal, &query, explain.is_some());
                // A zone no contact is in is most often a typo in the
                // request: say so, with the zones there are.
                if refusal == Refusal::MsrNotFound && ctx.table.zone(&query.zone).is_empty() {
                    let zones = ctx.table.zone_names();
                    message = format!(
                        "zone `{}` has no msr contact (zones with contacts: {})",
                        msr_shared::logging::printable(&query.zone, 64),
                        if zones.is_empty() {
                            "none".to_owned()
                        } else {
                            zones.join(", ")
                        }
                    );
                }
                Response::Err(ErrorBody {
                    code: refusal.code(),
                    message,
                    explain,
                })
            }
        },
    }
}

/// The wire answer of a selection that chose `choice` (SPEC §7): what the
/// core needs to park the leg, and what was done with the leg.
pub(super) fn selection_of(
    choice: select::Choice,
    leg: Option<LegOutcome>,
    explain: Option<Explain>,
) -> Selection {
    Selection {
        msr: choice.msr.into(),
        contact: choice.contact.into(),
        uri: choice.uri,
        engine_uri: choice.engine.map(|e| e.sip_uri()),
        mcc: choice.engine.and_then(|e| e.mcc).map(|m| m.to_string()),
        media_bridge: choice.media_bridge,
        distance: Distance::from_f64(choice.distance),
        draw: choice.draw,
        total: choice.total,
        rule: wire_rule(choice.rule),
        leg,
        explain: explain.map(Box::new),
    }
}

/// The answer for a live leg whose contact is still registered: its MSR and
/// contact again (SPEC §9), without a draw; `None` when the leg is not live
/// or its contact is gone (then it is re-anchored by a new selection).
fn sticky(ctx: &AdminContext<'_>, query: &Query, key: LegKey<'_>) -> Option<Response> {
    let leg = ctx.legs.get(query.now, key)?;
    // The core reported that this MSR failed the leg: it moves (SPEC §14).
    if query.has_failed(leg.msr) {
        return None;
    }
    let contact = ctx.table.live_contact(leg.contact, query.now)?;
    let distance = ctx
        .operator
        .topology()
        .distances_from(&query.site)
        .map_or(f64::INFINITY, |from| from.to(contact.site));
    Some(Response::Ok(ResponseData::Selected(Selection {
        msr: leg.msr.to_owned(),
        contact: leg.contact.to_owned(),
        uri: contact.uri.to_owned(),
        engine_uri: contact.engine.map(|e| e.sip_uri()),
        mcc: contact.engine.and_then(|e| e.mcc).map(|m| m.to_string()),
        media_bridge: query.msr.as_deref().is_some_and(|m| m != leg.msr),
        distance: Distance::from_f64(distance),
        draw: 0.0,
        total: 0.0,
        rule: SelectionRule::Sticky,
        leg: Some(LegOutcome::Sticky),
        explain: None,
    })))
}

mod failover;
mod views;
use views::*;

#[cfg(test)]
mod tests;
