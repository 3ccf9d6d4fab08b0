//! The read-only answers: the tables (`msr list`, `resource list`,
//! `subscription list`, `site matrix`, `leg list`) and the wire forms of
//! health and of a selection's explanation.

use super::*;

/// The live legs an operator asks for (SPEC §9), bounded so one reply
/// stays small whatever the table holds.
pub(super) fn leg_list(
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
pub(super) fn leg_name(key: LegKey<'_>) -> String {
    match key.leg {
        Some(leg) => format!("{}/{leg}", key.call_id),
        None => key.call_id.to_owned(),
    }
}

pub(super) fn site_matrix(operator: &OperatorConfig, names: &[String]) -> Response {
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

/// `zone_list`: the default zone, the zones of the load table's contacts
/// and the zones the operator set on contacts (SPEC §6: zones are labels,
/// never declared), each with the contacts in it now.
pub(super) fn zone_list(ctx: &AdminContext<'_>) -> Response {
    let default = ctx.table.placement().zone.as_str();
    let set = ctx
        .operator
        .configured_contacts()
        .filter_map(|(_, settings)| settings.zone.as_ref().map(|zone| zone.as_str()));
    let names: std::collections::BTreeSet<&str> = std::iter::once(default)
        .chain(ctx.table.zone_names())
        .chain(set)
        .collect();
    let zones = names
        .into_iter()
        .map(|name| ZoneInfo {
            name: name.to_owned(),
            contacts: u32::try_from(ctx.table.zone(name).len()).unwrap_or(u32::MAX),
            default: name == default,
        })
        .collect();
    Response::Ok(ResponseData::Zones { zones })
}

pub(super) fn msr_list(ctx: &AdminContext<'_>, now: Instant) -> Response {
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
                engine_calls: None,
                gone_since_unix: None,
                gone_cause: None,
                gone_while_serving: false,
                drain: None,
            },
        );
    }
    for view in ctx.table.msrs(now) {
        msrs.insert(
            view.msr.to_string(),
            MsrInfo {
                name: view.msr.into(),
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
                engine_calls: None,
                gone_since_unix: None,
                gone_cause: None,
                gone_while_serving: false,
                drain: None,
            },
        );
    }
    // SPEC §14: a gone MSR stays listed until it returns or is forgotten.
    let gone: Vec<String> = ctx.absences.iter().map(|(m, _)| m.to_string()).collect();
    let legs_on: Vec<String> = ctx.legs.per_msr().map(|(m, _)| m.to_owned()).collect();
    // A drained MSR with live legs is shown until they end, registered or not.
    for name in gone.iter().chain(legs_on.iter()) {
        let name = name.as_str();
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
                    engine_calls: None,
                    gone_since_unix: None,
                    gone_cause: None,
                    gone_while_serving: false,
                    drain: None,
                },
            );
        }
    }
    // The operator configuration is the source of truth for these; the leg
    // table for the live legs.
    for info in msrs.values_mut() {
        if let Some(absence) = ctx.absences.get(&info.name) {
            info.gone_since_unix = Some(absence.since_unix);
            info.gone_cause = Some(absence.cause.to_string());
            info.gone_while_serving = absence.serving;
        }
        info.performance_coefficient = ctx.operator.performance_coefficient(&info.name);
        info.active = ctx.operator.is_active(&info.name);
        info.load_limit = ctx.operator.load_limit(&info.name);
        info.live_legs = ctx.legs.on_msr(&info.name);
        let (own_drain, calls) = ctx.table.drain_inputs(&info.name).unwrap_or((false, None));
        info.engine_calls = calls;
        info.drain = crate::model::drain::state(
            !info.active || own_drain,
            info.live_legs,
            calls,
            info.registered,
        );
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

pub(super) fn resource_list(ctx: &AdminContext<'_>, now: Instant, active_only: bool) -> Response {
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
            msr: row.msr.into(),
            performance_coefficient: row.performance_coefficient,
            load: row.load.as_ref().map(|r| r.load),
            cpu: row.load.as_ref().map(|r| r.cpu),
            calls: row.load.as_ref().map(|r| r.calls),
            max_calls: row.load.as_ref().map(|r| r.max_calls),
            report_age_secs: row.report_age.map(|age| age.as_secs()),
            stale: row.stale,
            zone: row.zone.into(),
            site: row.site.into(),
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
            contact: row.contact.into(),
            health: wire_health(row.health),
            health_since_unix: row.health_since.map_or(0, |(_, unix)| unix),
            health_secs: row
                .health_since
                .map_or(0, |(at, _)| now.saturating_duration_since(at).as_secs()),
            codecs: row
                .load
                .as_ref()
                .and_then(|r| r.codecs)
                .map(|list| list.iter().map(|c| c.name().to_owned()).collect()),
        })
        .collect();
    Response::Ok(ResponseData::Resources { rows })
}

pub(super) fn subscription_list(ctx: &AdminContext<'_>, now: Instant) -> Response {
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
                    msr: view.msr.into(),
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
                    msr: view.msr.into(),
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
        Health::EngineDown => HealthState::EngineDown,
        Health::Draining => HealthState::Draining,
    }
}

/// The wire form of what became of a contact in a selection.
pub(super) fn wire_outcome(outcome: CandidateOutcome) -> ExplainOutcome {
    match outcome {
        CandidateOutcome::Kept => ExplainOutcome::Kept,
        CandidateOutcome::Full => ExplainOutcome::Full,
        CandidateOutcome::Inactive => ExplainOutcome::Inactive,
        CandidateOutcome::Unregistered => ExplainOutcome::Unregistered,
        CandidateOutcome::Unreported => ExplainOutcome::Unreported,
        CandidateOutcome::Stale => ExplainOutcome::Stale,
        CandidateOutcome::Unreachable => ExplainOutcome::Unreachable,
        CandidateOutcome::EngineDown => ExplainOutcome::EngineDown,
        CandidateOutcome::Draining => ExplainOutcome::Draining,
        CandidateOutcome::Failed => ExplainOutcome::Failed,
        CandidateOutcome::Incapable(_) => ExplainOutcome::Incapable,
        CandidateOutcome::OtherMsr => ExplainOutcome::OtherMsr,
        CandidateOutcome::InfiniteDistance => ExplainOutcome::InfiniteDistance,
        CandidateOutcome::Farther => ExplainOutcome::Farther,
        CandidateOutcome::DuplicateMsr => ExplainOutcome::DuplicateMsr,
        CandidateOutcome::OverLoadLimit => ExplainOutcome::OverLoadLimit,
        CandidateOutcome::OverThreshold => ExplainOutcome::OverThreshold,
        CandidateOutcome::NotPreferred => ExplainOutcome::NotPreferred,
    }
}

pub(super) fn to_wire_explain(query: &Query, explanation: &Explanation) -> Explain {
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
                lacks: match c.outcome {
                    CandidateOutcome::Incapable(lack) => Some(lack.to_string()),
                    _ => None,
                },
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
        codecs: query.needs.iter().map(|c| c.name().to_owned()).collect(),
    }
}

pub(super) fn wire_rule(rule: select::Rule) -> SelectionRule {
    match rule {
        select::Rule::Draw => SelectionRule::Draw,
        select::Rule::ExistingConference => SelectionRule::ExistingConference,
        select::Rule::NewConference => SelectionRule::NewConference,
        select::Rule::Pooled => SelectionRule::Pooled,
    }
}
