//! The collector side of the control protocol ([`msr_shared::admin`], SPEC §8).
//!
//! * [`prepare`] carries out one [`Request`] against the collector's state. A
//!   request that changes the operator configuration is applied to a copy,
//!   which the shell saves (the file store or etcd) and only then makes
//!   current and answers `ok`: an acknowledged change is durable, and a
//!   failed save changes nothing.
//! * [`serve`] is the Unix-socket server: one task per connection, one JSON
//!   request per line, one JSON response per line. It owns no state; each
//!   request goes to the collector's main loop as an [`AdminCommand`]. At
//!   most [`MAX_CONNECTIONS`] connections are served at once, at most
//!   [`MAX_CONNECTIONS_PER_CLIENT`] per user id of the connecting process
//!   (peer credentials) with [`RESERVED_CONNECTIONS`] kept for root and the
//!   collector's user ([`quota`]), and one that sends no complete request
//!   line for [`IDLE_TIMEOUT`] is closed.
//!
//! Architecture invariant: [`prepare`] reads no clock (the caller passes `now`)
//! and uses only the RNG in [`AdminContext`].

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use msr_shared::admin::{
    Change, ChangeValue, ChangedEntity, ChangedProperty, ContactProperty, Distance, ErrorBody,
    ErrorCode, Explain, ExplainCandidate, ExplainOutcome, HealthState, Hello, Interval, LegInfo,
    LegOutcome, LegRows, MsrInfo, RegistrationStatus, Released, Request, ResourceInfo, Response,
    ResponseData, SelectQuery, Selection, SelectionRule, SiteMatrix, SubscriptionInfo,
    DEFAULT_LEG_LIST_LIMIT, EVENT_PACKAGE, MAX_LEG_LIST_LIMIT, PROTOCOL_VERSION,
};
use msr_shared::present::{format_number, normalize_zero};
use rand::RngCore;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::DEFAULT_SUBSCRIPTION_EXPIRES_SECS;
use crate::config::{SelectionConfig, SelectionPolicy};
use crate::model::health::Health;
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
use quota::{Client, ConnectionQuota, QuotaPolicy};

/// Longest accepted request line, in bytes, not counting its newline: a
/// line of exactly this many bytes is read; one byte more is refused and
/// the connection closed.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Mode of the control socket: owner and group may connect.
pub const SOCKET_MODE: u32 = 0o660;

/// Collector-wide defaults the admin handler needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    /// Zone of a contact without an override (collector config).
    pub zone: String,
    /// Site of a contact without an override (collector config).
    pub site: String,
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
            zone: "default".into(),
            site: "local".into(),
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
/// draw it replaces, which is what SPEC §10 rules out.
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
    /// G, the number of core hosts (SPEC §10, [`crate::operator::cluster::Cluster::core_hosts`]).
    pub core_hosts: u32,
}

/// One request from a control connection, with the channel for its answer.
#[derive(Debug)]
pub struct AdminCommand {
    /// The parsed request.
    pub request: Request,
    /// Where the main loop sends the response.
    pub reply: oneshot::Sender<Response>,
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
    }))
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
        let response = mutate(request, &mut next, ctx.table, ctx.defaults);
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
                if site == defaults.site {
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
            let previous = operator.contact_zone(&contact, &defaults.zone).to_owned();
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
            let previous = operator.contact_site(&contact, &defaults.site).to_owned();
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
                    operator.contact_zone(&contact, &defaults.zone),
                    &defaults.zone,
                ),
                ContactProperty::Site => (
                    operator.contact_site(&contact, &defaults.site),
                    &defaults.site,
                ),
            };
            let (previous, default) = (previous.to_owned(), default.clone());
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
        Request::SiteMatrix { names } => site_matrix(ctx.operator, &names),
        Request::MsrList {} => msr_list(ctx, now),
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
        }) => {
            // The names a selection reads are held to the rules they were
            // stored under (SPEC §6): an empty or malformed `msr` would
            // otherwise read as "the other leg is elsewhere", a malformed
            // zone as "no MSR in it".
            let checked = [
                (NameKind::Zone, Some(zone.as_str())),
                (NameKind::Msr, msr.as_deref()),
            ];
            for (kind, name) in checked {
                if let Some(Err(error)) = name.map(|n| names::check(kind, n)) {
                    return Response::error(ErrorCode::InvalidValue, error.to_string());
                }
            }
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
                            "leg {} was released {ago} s ago, before its select: nothing placed",
                            leg_name(key)
                        ),
                    );
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
            );
            run_select(
                ctx,
                Query {
                    zone,
                    site,
                    msr,
                    admission: select::Admission::Plain,
                    policy,
                    now,
                },
                random.map(normalize_zero),
                explain,
                leg,
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
            Response::Ok(ResponseData::Released(Released {
                call_id,
                leg,
                released: u32::try_from(released).unwrap_or(u32::MAX),
            }))
        }
        other => Response::error(ErrorCode::BadRequest, format!("not a query: {other:?}")),
    }
}

/// The live legs an operator asks for (SPEC §9), bounded so one reply
/// stays small whatever the table holds.
fn leg_list(
    ctx: &AdminContext<'_>,
    now: Instant,
    msr: Option<&str>,
    older_than_secs: Option<u64>,
    limit: Option<u32>,
) -> Response {
    if let Some(Err(error)) = msr.map(|n| names::check(NameKind::Msr, n)) {
        return Response::error(ErrorCode::InvalidValue, error.to_string());
    }
    let limit = limit.unwrap_or(DEFAULT_LEG_LIST_LIMIT);
    if limit == 0 || limit > MAX_LEG_LIST_LIMIT {
        return Response::error(
            ErrorCode::InvalidValue,
            format!("limit {limit}: expected 1 to {MAX_LEG_LIST_LIMIT}"),
        );
    }
    let min_age = Duration::from_secs(older_than_secs.unwrap_or(0));
    let (total, rows) = ctx.legs.list(now, msr, min_age, limit as usize);
    let rows = rows
        .into_iter()
        .map(|l| LegInfo {
            call_id: l.call_id.to_owned(),
            leg: l.leg.map(str::to_owned),
            msr: l.msr.to_owned(),
            contact: l.contact.to_owned(),
            age_secs: l.age.as_secs(),
            conference: l.conference.map(str::to_owned),
        })
        .collect();
    Response::Ok(ResponseData::Legs(LegRows { total, rows }))
}

/// `call_id` or `call_id/leg`, as a refusal names a leg.
fn leg_name(key: LegKey<'_>) -> String {
    match key.leg {
        Some(leg) => format!("{}/{leg}", key.call_id),
        None => key.call_id.to_owned(),
    }
}

fn site_matrix(operator: &OperatorConfig, names: &[String]) -> Response {
    let topology = operator.topology();
    let sites: Vec<String> = topology.sites().map(str::to_owned).collect();
    let mut columns = Vec::new();
    if names.is_empty() {
        columns.extend(0..sites.len());
    } else {
        for name in names {
            match sites.iter().position(|s| s == name) {
                Some(index) if !columns.contains(&index) => columns.push(index),
                Some(_) => {}
                None => {
                    return Response::error(
                        ErrorCode::UnknownSite,
                        format!("site `{name}` is not declared"),
                    );
                }
            }
        }
        columns.sort_unstable();
    }
    let cells = sites
        .iter()
        .map(|row| {
            columns
                .iter()
                .map(|&column| {
                    let value = topology
                        .distance(row, &sites[column])
                        .unwrap_or(f64::INFINITY);
                    Distance::from_f64(value)
                })
                .collect()
        })
        .collect();
    Response::Ok(ResponseData::Matrix(SiteMatrix {
        sites,
        columns,
        cells,
    }))
}

fn msr_list(ctx: &AdminContext<'_>, now: Instant) -> Response {
    let mut msrs: std::collections::BTreeMap<String, MsrInfo> = std::collections::BTreeMap::new();
    for (name, settings) in ctx.operator.configured_msrs() {
        msrs.insert(
            name.to_owned(),
            MsrInfo {
                name: name.to_owned(),
                performance_coefficient: settings.performance_coefficient,
                active: settings.active,
                registered: false,
                load_limit: settings.load_limit,
                live_legs: 0,
                oldest_leg_secs: None,
                health: None,
                health_since_unix: None,
            },
        );
    }
    for view in ctx.table.msrs(now) {
        msrs.insert(
            view.msr.clone(),
            MsrInfo {
                name: view.msr,
                performance_coefficient: view.settings.performance_coefficient,
                active: view.settings.active,
                registered: view.registered,
                load_limit: view.settings.load_limit,
                live_legs: 0,
                oldest_leg_secs: None,
                health: view.health.map(|(health, _)| wire_health(health)),
                health_since_unix: view
                    .health
                    .and_then(|(_, since)| since.map(|(_, unix)| unix)),
            },
        );
    }
    // A drained MSR with live legs is shown until they end, registered or not.
    for (name, _) in ctx.legs.per_msr() {
        if !msrs.contains_key(name) {
            msrs.insert(
                name.to_owned(),
                MsrInfo {
                    name: name.to_owned(),
                    performance_coefficient: 1.0,
                    active: true,
                    registered: false,
                    load_limit: 100,
                    live_legs: 0,
                    oldest_leg_secs: None,
                    health: None,
                    health_since_unix: None,
                },
            );
        }
    }
    // The operator configuration is the source of truth for these; the leg
    // table for the live legs.
    for info in msrs.values_mut() {
        info.performance_coefficient = ctx.operator.performance_coefficient(&info.name);
        info.active = ctx.operator.is_active(&info.name);
        info.load_limit = ctx.operator.load_limit(&info.name);
        info.live_legs = ctx.legs.on_msr(&info.name);
    }
    for (name, age) in ctx.legs.oldest_per_msr(now) {
        if let Some(info) = msrs.get_mut(name) {
            info.oldest_leg_secs = Some(age.as_secs());
        }
    }
    Response::Ok(ResponseData::Msrs {
        msrs: msrs.into_values().collect(),
    })
}

fn resource_list(ctx: &AdminContext<'_>, now: Instant, active_only: bool) -> Response {
    let rows = ctx
        .table
        .rows(now)
        .into_iter()
        .filter(|row| !active_only || (row.registered && row.active))
        .map(|row| ResourceInfo {
            // The binding and the subscription are their owners' records.
            version: ctx
                .registrar
                .binding(&row.msr, &row.contact)
                .and_then(|b| b.version.clone()),
            subscription: ctx.subscriber.view(&row.msr).map(|s| s.status),
            node: row.node,
            msr: row.msr,
            performance_coefficient: row.performance_coefficient,
            load: row.load.as_ref().map(|r| r.load),
            cpu: row.load.as_ref().map(|r| r.cpu),
            calls: row.load.as_ref().map(|r| r.calls),
            max_calls: row.load.as_ref().map(|r| r.max_calls),
            report_age_secs: row.report_age.map(|age| age.as_secs()),
            stale: row.stale,
            zone: row.zone,
            site: row.site,
            active: row.active,
            uri: row.uri,
            engine_uri: row.engine.map(|e| e.sip_uri()),
            mcc: row.engine.and_then(|e| e.mcc).map(|m| m.to_string()),
            status: if row.registered {
                RegistrationStatus::Registered
            } else {
                RegistrationStatus::Expired
            },
            expires_secs: row.expires_in.as_secs(),
            live_legs: ctx.legs.on_contact(&row.contact),
            contact: row.contact,
            health: wire_health(row.health),
            health_since_unix: row.health_since.map_or(0, |(_, unix)| unix),
            health_secs: row
                .health_since
                .map_or(0, |(at, _)| now.saturating_duration_since(at).as_secs()),
        })
        .collect();
    Response::Ok(ResponseData::Resources { rows })
}

fn subscription_list(ctx: &AdminContext<'_>, now: Instant) -> Response {
    let rows = ctx
        .table
        .msrs(now)
        .into_iter()
        .map(|view| {
            let configured = ctx
                .operator
                .subscription_expires(&view.msr)
                .unwrap_or(ctx.defaults.subscription_expires_secs);
            let active = ctx.operator.is_active(&view.msr);
            match ctx.subscriber.view(&view.msr) {
                Some(s) => SubscriptionInfo {
                    msr: view.msr,
                    registered: view.registered,
                    event: EVENT_PACKAGE.into(),
                    active,
                    expires_secs: s.expires_secs,
                    notify_count: s.notify_count,
                    last_notify_unix: s.last_notify_unix,
                    event_id: s.event_id,
                    status: Some(s.status),
                },
                None => SubscriptionInfo {
                    msr: view.msr,
                    registered: view.registered,
                    event: EVENT_PACKAGE.into(),
                    active,
                    expires_secs: configured,
                    notify_count: 0,
                    last_notify_unix: None,
                    event_id: String::new(),
                    status: None,
                },
            }
        })
        .collect();
    Response::Ok(ResponseData::Subscriptions { rows })
}

/// The wire form of a contact's health.
pub(crate) fn wire_health(health: Health) -> HealthState {
    match health {
        Health::Healthy => HealthState::Healthy,
        Health::Unreported => HealthState::Unreported,
        Health::Unreachable => HealthState::Unreachable,
        Health::Stale => HealthState::Stale,
    }
}

/// The wire form of what became of a contact in a selection.
fn wire_outcome(outcome: CandidateOutcome) -> ExplainOutcome {
    match outcome {
        CandidateOutcome::Kept => ExplainOutcome::Kept,
        CandidateOutcome::Full => ExplainOutcome::Full,
        CandidateOutcome::Inactive => ExplainOutcome::Inactive,
        CandidateOutcome::Unregistered => ExplainOutcome::Unregistered,
        CandidateOutcome::Unhealthy(Health::Unreported) => ExplainOutcome::Unreported,
        CandidateOutcome::Unhealthy(Health::Stale) => ExplainOutcome::Stale,
        // `Healthy` is never a reason to drop a contact; read as the
        // closest reason rather than lose the row.
        CandidateOutcome::Unhealthy(Health::Unreachable | Health::Healthy) => {
            ExplainOutcome::Unreachable
        }
        CandidateOutcome::OtherMsr => ExplainOutcome::OtherMsr,
        CandidateOutcome::InfiniteDistance => ExplainOutcome::InfiniteDistance,
        CandidateOutcome::Farther => ExplainOutcome::Farther,
        CandidateOutcome::DuplicateMsr => ExplainOutcome::DuplicateMsr,
        CandidateOutcome::OverLoadLimit => ExplainOutcome::OverLoadLimit,
        CandidateOutcome::OverThreshold => ExplainOutcome::OverThreshold,
        CandidateOutcome::NotPreferred => ExplainOutcome::NotPreferred,
    }
}

fn to_wire_explain(query: &Query, explanation: &Explanation) -> Explain {
    Explain {
        zone: query.zone.clone(),
        site: query.site.clone(),
        msr: query.msr.clone(),
        media_bridge: explanation.media_bridge,
        candidates: explanation
            .candidates
            .iter()
            .map(|c| ExplainCandidate {
                contact: c.contact.clone(),
                msr: c.msr.clone(),
                site: c.site.clone(),
                distance: Distance::from_f64(c.distance),
                health: wire_health(c.health),
                outcome: wire_outcome(c.outcome),
                weight: c.weight,
            })
            .collect(),
        min_distance: explanation.min_distance.map(Distance::from_f64),
        intervals: explanation
            .intervals
            .iter()
            .map(|row| Interval {
                msr: row.msr.clone(),
                contact: row.contact.clone(),
                load: row.load,
                reported: row.reported,
                stale: row.stale,
                performance_coefficient: row.performance_coefficient,
                weight: row.weight,
                bottom: row.bottom,
                top: row.top,
            })
            .collect(),
        total: explanation.total,
        draw: explanation.draw,
        rule: wire_rule(explanation.rule),
        threshold: explanation.threshold,
    }
}

fn wire_rule(rule: select::Rule) -> SelectionRule {
    match rule {
        select::Rule::Draw => SelectionRule::Draw,
        select::Rule::ExistingConference => SelectionRule::ExistingConference,
        select::Rule::NewConference => SelectionRule::NewConference,
        select::Rule::Pooled => SelectionRule::Pooled,
    }
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

fn refusal_message(refusal: Refusal, query: &Query) -> String {
    match refusal {
        Refusal::MsrNotFound => format!(
            "no registered active msr in zone `{}` at a finite distance from site `{}`",
            query.zone, query.site
        ),
        Refusal::MsrOverloaded => match &query.admission {
            select::Admission::Plain => format!(
                "every msr in zone `{}` nearest to site `{}` is at or above its load limit",
                query.zone, query.site
            ),
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
            "no healthy msr in zone `{}` at a finite distance from site `{}`: the registered active ones are unhealthy (see msrctl select --explain)",
            query.zone, query.site
        ),
    }
}

fn run_select(
    ctx: &mut AdminContext<'_>,
    mut query: Query,
    random: Option<f64>,
    want_explain: bool,
    leg: Option<LegRequest>,
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
    match outcome {
        Ok(choice) => {
            let leg_outcome = key.map(|key| {
                let conference = leg.as_ref().and_then(|l| l.conference.as_deref());
                let bound = ctx
                    .legs
                    .bind(query.now, key, &choice.msr, &choice.contact, conference);
                // A leg new on its MSR counts in its estimate until a report
                // covers it (SPEC §10).
                if bound != Bound::Unchanged {
                    ctx.table.note_placed(&choice.msr, query.now);
                }
                match bound {
                    Bound::New => LegOutcome::New,
                    Bound::Reanchored => LegOutcome::Reanchored,
                    Bound::Unchanged => LegOutcome::Sticky,
                }
            });
            Response::Ok(ResponseData::Selected(Selection {
                msr: choice.msr,
                contact: choice.contact,
                uri: choice.uri,
                engine_uri: choice.engine.map(|e| e.sip_uri()),
                mcc: choice.engine.and_then(|e| e.mcc).map(|m| m.to_string()),
                media_bridge: choice.media_bridge,
                distance: Distance::from_f64(choice.distance),
                draw: choice.draw,
                total: choice.total,
                rule: wire_rule(choice.rule),
                leg: leg_outcome,
                explain,
            }))
        }
        Err(refusal) => {
            let code = match refusal {
                Refusal::MsrNotFound => ErrorCode::MsrNotFound,
                Refusal::MsrOverloaded => ErrorCode::MsrOverloaded,
                Refusal::UnknownSite => ErrorCode::UnknownSite,
                Refusal::MsrUnhealthy => ErrorCode::MsrUnhealthy,
            };
            Response::Err(ErrorBody {
                code,
                message: refusal_message(refusal, &query),
                explain,
            })
        }
    }
}

/// The answer for a live leg whose contact is still registered: its MSR and
/// contact again (SPEC §9), without a draw; `None` when the leg is not live
/// or its contact is gone (then it is re-anchored by a new selection).
fn sticky(ctx: &AdminContext<'_>, query: &Query, key: LegKey<'_>) -> Option<Response> {
    let leg = ctx.legs.get(query.now, key)?;
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

/// Binds the control socket at `path` and sets its mode to 0660. A stale
/// socket file (nobody listening) is removed first; a live one, or a path
/// that is not a socket, is an error.
///
/// # Errors
/// `AddrInUse` when another collector listens there; `AlreadyExists` when
/// the path is not a socket; other I/O errors from bind/chmod.
pub fn bind_control_socket(path: &Path) -> io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "control socket {} is in use by a running collector",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))?;
    tracing::debug!(path = %path.display(), "control socket listening");
    Ok(listener)
}

/// The most control connections served at once; one more is answered
/// with an `unavailable` error line and closed, so idle clients cannot use
/// up the collector's file descriptors. Only live connections count: a
/// connection's slot is free again as soon as it is closed.
pub const MAX_CONNECTIONS: usize = 256;

/// The most control connections one user id holds at once (the client's
/// peer credentials): a local client holding them all cannot lock msrctl
/// out.
pub const MAX_CONNECTIONS_PER_CLIENT: usize = 64;

/// Of [`MAX_CONNECTIONS`], the places only root and the collector's own
/// user (the socket's owner) may take: msrctl run by them is served however
/// many other users hold connections.
pub const RESERVED_CONNECTIONS: usize = 16;

/// How long a control connection may go without sending a complete request
/// line: 60 s. The timer starts when the connection is accepted and again
/// after each response; when it runs out the connection gets an
/// `unavailable` error line and is closed. Writing one response is bounded
/// by the same time (a client that does not read its answers is closed).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The limits [`serve_with`] applies; [`serve`] uses the default
/// ([`MAX_CONNECTIONS`], [`MAX_CONNECTIONS_PER_CLIENT`],
/// [`RESERVED_CONNECTIONS`], [`IDLE_TIMEOUT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections served at once per user id.
    pub per_client: usize,
    /// Places kept for root and the socket's owner.
    pub reserved: usize,
    /// Longest wait for a complete request line, and for writing one
    /// response line.
    pub idle_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            per_client: MAX_CONNECTIONS_PER_CLIENT,
            reserved: RESERVED_CONNECTIONS,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// Serves control connections until `shutdown` is cancelled: one task per
/// connection; each request line becomes an [`AdminCommand`] on `tx`.
/// Applies the default [`ServeLimits`].
pub async fn serve(
    listener: UnixListener,
    tx: mpsc::Sender<AdminCommand>,
    shutdown: CancellationToken,
) {
    serve_with(listener, tx, shutdown, ServeLimits::default()).await;
}

/// [`serve`] with the given limits.
pub async fn serve_with(
    listener: UnixListener,
    tx: mpsc::Sender<AdminCommand>,
    shutdown: CancellationToken,
    limits: ServeLimits,
) {
    // Each connection task holds its place until it ends, so the count is
    // of live connections whether or not its task has been reaped yet.
    let places = Places::new(
        QuotaPolicy {
            total: limits.max_connections,
            per_client: limits.per_client,
            reserved: limits.reserved,
        },
        socket_owner(&listener),
    );
    let mut connections = JoinSet::new();
    loop {
        // The set keeps finished tasks until they are joined.
        while connections.try_join_next().is_some() {}
        tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let peer = stream.peer_cred().ok();
                    match places.admit(peer.map(|p| p.uid())).await {
                        Ok(place) => {
                            let task = connection(stream, tx.clone(), shutdown.clone(), limits.idle_timeout);
                            connections.spawn(async move {
                                task.await;
                                drop(place);
                            });
                        }
                        Err(refusal) => refuse(stream, peer, refusal, limits),
                    }
                }
                Err(error) => {
                    tracing::warn!(cause = %error, "control socket accept failed");
                    // Avoids a hot loop on persistent errors such as EMFILE.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    connections.shutdown().await;
}

/// How long a connection past the limit waits for a place before it is
/// refused: 100 ms. Connections whose clients have closed them keep their
/// place until their task has seen the end of the stream; under a flood of
/// connect(); close() those tasks may not have run yet.
const ADMIT_GRACE: Duration = Duration::from_millis(100);

/// A place for a new connection: at once if one is free, else the first
/// freed within [`ADMIT_GRACE`].
pub(crate) async fn admit(permits: &Arc<Semaphore>) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if let Ok(permit) = Arc::clone(permits).try_acquire_owned() {
        return Some(permit);
    }
    tokio::time::timeout(ADMIT_GRACE, Arc::clone(permits).acquire_owned())
        .await
        .ok()?
        .ok()
}

/// The user id owning the control socket (the collector's user: it bound
/// it), if it can be read.
fn socket_owner(listener: &UnixListener) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let addr = listener.local_addr().ok()?;
    Some(std::fs::metadata(addr.as_pathname()?).ok()?.uid())
}

/// The places of the control connections ([`ConnectionQuota`]), shared by
/// the accept loop and the connection tasks that give them back.
#[derive(Debug, Clone)]
struct Places {
    quota: Arc<Mutex<ConnectionQuota>>,
    /// Woken whenever a place is given back.
    freed: Arc<Notify>,
}

/// A connection's place, given back when dropped.
#[derive(Debug)]
struct Place {
    places: Places,
    client: Client,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.places.lock().release(self.client);
        self.places.freed.notify_waiters();
    }
}

impl Places {
    fn new(policy: QuotaPolicy, owner: Option<u32>) -> Self {
        Self {
            quota: Arc::new(Mutex::new(ConnectionQuota::new(policy, owner))),
            freed: Arc::new(Notify::new()),
        }
    }

    /// The quota. Its methods do not panic, so a poisoned lock (a panic
    /// elsewhere while it was held) still guards consistent counts.
    fn lock(&self) -> std::sync::MutexGuard<'_, ConnectionQuota> {
        self.quota
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn try_admit(&self, client: Client) -> Result<Place, quota::Refusal> {
        self.lock().admit(client)?;
        Ok(Place {
            places: self.clone(),
            client,
        })
    }

    /// A place for a connection of `client`: at once if the quota allows,
    /// else when a place given back within [`ADMIT_GRACE`] makes it allow.
    /// The accept loop waits here, so a client refused after a wait is
    /// refused without one for a while ([`ConnectionQuota::may_wait`]): a
    /// client connecting in a loop past its share cannot hold the loop up.
    async fn admit(&self, client: Client) -> Result<Place, quota::Refusal> {
        let deadline = tokio::time::Instant::now() + ADMIT_GRACE;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a place given back between
            // the check and the wait is not missed.
            freed.as_mut().enable();
            let now = tokio::time::Instant::now();
            match self.try_admit(client) {
                Ok(place) => return Ok(place),
                Err(refusal) if now >= deadline || !self.may_wait(client, now) => {
                    self.waited_in_vain(client, now);
                    return Err(refusal);
                }
                Err(_) => {}
            }
            let _ = tokio::time::timeout_at(deadline, freed).await;
        }
    }

    fn may_wait(&self, client: Client, now: tokio::time::Instant) -> bool {
        self.lock().may_wait(client, now)
    }

    fn waited_in_vain(&self, client: Client, now: tokio::time::Instant) {
        self.lock().waited_in_vain(client, now);
    }
}

/// Answers a connection the quota refused with an `unavailable` line and
/// closes it. The warning is rate limited (target
/// [`msr_shared::logging::NETWORK`]): a client may connect in a loop.
fn refuse(
    stream: UnixStream,
    peer: Option<tokio::net::unix::UCred>,
    refusal: quota::Refusal,
    limits: ServeLimits,
) {
    tracing::warn!(
        target: msr_shared::logging::NETWORK,
        uid = peer.map(|p| p.uid()),
        pid = peer.and_then(|p| p.pid()),
        reason = %refusal,
        "control connection refused"
    );
    let line = response_line(&Response::error(
        ErrorCode::Unavailable,
        refusal.to_string(),
    ));
    tokio::spawn(async move {
        let mut stream = stream;
        let _ = tokio::time::timeout(limits.idle_timeout, stream.write_all(line.as_bytes())).await;
    });
}

fn response_line(response: &Response) -> String {
    let mut line = serde_json::to_string(response).unwrap_or_else(|_| {
        r#"{"ok":false,"error":{"code":"unavailable","message":"response could not be encoded"}}"#.to_owned()
    });
    line.push('\n');
    line
}

/// What a path that should be the control socket is instead, for error
/// messages: `None` for a socket, else `a directory`, `a regular file`,
/// `a symbolic link` or `a special file`.
pub(crate) fn not_a_socket(kind: std::fs::FileType) -> Option<&'static str> {
    if kind.is_socket() {
        None
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_file() {
        Some("a regular file")
    } else if kind.is_symlink() {
        Some("a symbolic link")
    } else {
        Some("a special file")
    }
}

/// `60 s`, or `250 ms` for a duration that is not whole seconds.
pub(crate) fn describe_duration(duration: Duration) -> String {
    if duration.subsec_nanos() == 0 {
        format!("{} s", duration.as_secs())
    } else {
        format!("{} ms", duration.as_millis())
    }
}

/// Writes one response line, within `limit`; `false` when the connection
/// should be closed (write failed or timed out).
async fn send(write: &mut OwnedWriteHalf, response: &Response, limit: Duration) -> bool {
    let line = response_line(response);
    matches!(
        tokio::time::timeout(limit, write.write_all(line.as_bytes())).await,
        Ok(Ok(()))
    )
}

/// What one read of a request line gave.
enum Line<'a> {
    /// The line's content, without its newline.
    Request(&'a [u8]),
    /// More than [`MAX_LINE_BYTES`] without a newline.
    TooLong,
}

/// Splits what `read_until` gave, reading at most `MAX_LINE_BYTES + 1`
/// bytes: the content of a line ends before its newline; a last line may
/// end at end of file instead.
fn split_line(buf: &[u8]) -> Line<'_> {
    match buf.strip_suffix(b"\n") {
        Some(content) => Line::Request(content),
        None if buf.len() > MAX_LINE_BYTES => Line::TooLong,
        None => Line::Request(buf),
    }
}

async fn connection(
    stream: UnixStream,
    tx: mpsc::Sender<AdminCommand>,
    shutdown: CancellationToken,
    idle_timeout: Duration,
) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut buf = Vec::new();
    // The content of a line plus its newline.
    let limit = u64::try_from(MAX_LINE_BYTES).unwrap_or(u64::MAX) + 1;
    loop {
        buf.clear();
        let mut limited = (&mut reader).take(limit);
        let read = tokio::select! {
            () = shutdown.cancelled() => return,
            read = tokio::time::timeout(idle_timeout, limited.read_until(b'\n', &mut buf)) => read,
        };
        match read {
            Err(_) => {
                tracing::debug!(
                    idle_timeout = %describe_duration(idle_timeout),
                    "control connection idle, closing"
                );
                let response = Response::error(
                    ErrorCode::Unavailable,
                    format!(
                        "no complete request line within {}: connection closed",
                        describe_duration(idle_timeout)
                    ),
                );
                send(&mut write, &response, idle_timeout).await;
                return;
            }
            Ok(Ok(0)) => return,
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::debug!(cause = %error, "control connection read failed");
                return;
            }
        }
        let content = match split_line(&buf) {
            Line::Request(content) => content,
            Line::TooLong => {
                let response = Response::error(
                    ErrorCode::BadRequest,
                    format!("request line longer than {MAX_LINE_BYTES} bytes"),
                );
                send(&mut write, &response, idle_timeout).await;
                return;
            }
        };
        let response = match std::str::from_utf8(content) {
            Err(error) => Response::error(
                ErrorCode::BadRequest,
                format!(
                    "invalid request: not valid utf-8 (at byte {})",
                    error.valid_up_to()
                ),
            ),
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => match serde_json::from_str::<Request>(text.trim()) {
                Err(error) => {
                    Response::error(ErrorCode::BadRequest, format!("invalid request: {error}"))
                }
                Ok(request) => {
                    let (reply, answer) = oneshot::channel();
                    if tx.send(AdminCommand { request, reply }).await.is_err() {
                        Response::error(ErrorCode::Unavailable, "collector is shutting down")
                    } else {
                        answer.await.unwrap_or_else(|_| {
                            Response::error(ErrorCode::Unavailable, "collector dropped the request")
                        })
                    }
                }
            },
        };
        if !send(&mut write, &response, idle_timeout).await {
            return;
        }
    }
}

pub mod quota;

#[cfg(test)]
mod tests;
