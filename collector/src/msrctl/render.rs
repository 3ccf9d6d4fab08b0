//! Human output of `msrctl`: box-drawn tables laid out like the seed's ECSS
//! CLI (SPEC §8). Every function here is pure: response data in, text out.

use comfy_table::{Cell, CellAlignment, Table};
use msr_shared::admin::{
    subscription_name, Change, ChangeValue, ChangedEntity, ChangedProperty, ClusterView, Distance,
    DrainState, ErrorBody, Explain, HealthState, LegOutcome, LegRows, MsrInfo, Released,
    ResourceInfo, ResponseData, Selection, SelectionRule, SiteMatrix, SubscriptionInfo, ZoneInfo,
    PROTOCOL_VERSION,
};
use msr_shared::present::{format_coefficient, format_number};

/// The seed's box style: `┌─┬┐ │ ├┼┤ └┴┘`, one line under the header, no
/// lines between rows. (comfy-table's `UTF8_FULL` uses `╞═╪╡` under the
/// header and `├╌┼┤` between rows, which the seed does not.)
pub const SEED_STYLE: &str = "││──├─┼┤│    ┬┴┌┐└┘";

/// The legend printed under a site matrix.
pub const MATRIX_LEGEND: &str = "Legend:\n empty distance - infinity distance between sites.";

/// Alignment of a data column; headers are always centred.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// Builds a seed-style table. Header cells may contain `\n` for two-line
/// headers; they are centred with any odd space on the right, as in the seed
/// (comfy-table would put it on the left).
pub fn table(headers: &[&str], aligns: &[Align], rows: Vec<Vec<String>>) -> String {
    // Cells carry what peers sent (a version, a URI, a Call-ID): a control
    // character would move the terminal's cursor or forge a row, so each is
    // shown escaped (`\u{1b}`); the line breaks of multi-line cells are ours.
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|row| row.into_iter().map(|cell| printable(&cell)).collect())
        .collect();
    let width = |text: &str| {
        text.lines()
            .map(|line| line.chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, header)| {
            rows.iter()
                .filter_map(|row| row.get(i))
                .map(|cell| width(cell))
                .fold(width(header), usize::max)
        })
        .collect();
    let mut table = Table::new();
    table.load_preset(SEED_STYLE);
    table.force_no_tty();
    table.set_header(headers.iter().zip(&widths).map(|(header, &column)| {
        let centred: Vec<String> = header
            .lines()
            .map(|line| {
                let left = (column - line.chars().count()) / 2;
                format!("{}{line}", " ".repeat(left))
            })
            .collect();
        Cell::new(centred.join("\n")).set_alignment(CellAlignment::Left)
    }));
    for row in rows {
        table.add_row(row.into_iter().enumerate().map(|(i, text)| {
            let alignment = match aligns.get(i) {
                Some(Align::Right) => CellAlignment::Right,
                _ => CellAlignment::Left,
            };
            Cell::new(text).set_alignment(alignment)
        }));
    }
    table.to_string()
}

/// A distance cell: empty for infinity (SPEC §6), else the number as
/// [`format_number`] writes it.
pub fn distance_cell(distance: Distance) -> String {
    match distance {
        Distance::Infinity => String::new(),
        Distance::Finite(value) => format_number(value),
    }
}

/// A coefficient seed-style: `1.0`, `2.0`, `0.9` ([`format_coefficient`]).
pub fn coefficient(value: f64) -> String {
    format_coefficient(value)
}

/// The site matrix: `Site-name`, `#`, then one column per shown site,
/// numbered by that site's row; infinite cells empty; legend below.
pub fn matrix(matrix: &SiteMatrix) -> String {
    let mut headers = vec!["Site-name".to_owned(), "#".to_owned()];
    headers.extend(matrix.columns.iter().map(|c| (c + 1).to_string()));
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut aligns = vec![Align::Left, Align::Right];
    aligns.extend(matrix.columns.iter().map(|_| Align::Right));
    let rows = matrix
        .sites
        .iter()
        .enumerate()
        .map(|(i, site)| {
            let mut row = vec![site.clone(), (i + 1).to_string()];
            let cells = matrix.cells.get(i).map(Vec::as_slice).unwrap_or_default();
            row.extend(
                (0..matrix.columns.len())
                    .map(|c| cells.get(c).copied().map(distance_cell).unwrap_or_default()),
            );
            row
        })
        .collect();
    format!("{}\n\n{MATRIX_LEGEND}\n", table(&headers, &aligns, rows))
}

/// The answer to a setting change, seed-style (`msr set`, `subscription set`).
pub fn change(change: &Change) -> String {
    let (from, to) = (
        change_value(change.property, &change.from),
        change_value(change.property, &change.to),
    );
    match change.entity {
        ChangedEntity::Site => {
            let (a, b) = change
                .name
                .split_once(' ')
                .unwrap_or((&change.name, &change.name));
            format!("Distance between {a} and {b} changed to: {to}.\n")
        }
        ChangedEntity::Subscription => {
            let (msr, event) = change.name.split_once(' ').unwrap_or((&change.name, ""));
            format!(
                " msr   {msr}\n event {event}\n set   {}\n from  {from}\n to    {to}\n{}",
                change.property,
                not_registered(change, msr, 5)
            )
        }
        entity @ (ChangedEntity::Msr | ChangedEntity::Contact) => {
            // The keys line up under the longest (`contact`); `msr`'s answer
            // keeps the seed's five columns.
            let entity = entity.as_str();
            let w = entity.len().max(5);
            format!(
                " {entity:<w$} {}\n {:<w$} {}\n {:<w$} {from}\n {:<w$} {to}\n{}",
                change.name,
                "set",
                change.property,
                "from",
                "to",
                not_registered(change, &change.name, w)
            )
        }
    }
}

/// The line under a change to an MSR that is not registered (issue 44):
/// the setting is kept for it, and a typo shows; keyed as the lines
/// above it, `width` wide.
fn not_registered(change: &Change, msr: &str, width: usize) -> String {
    if change.msr_registered != Some(false) {
        return String::new();
    }
    if change.entity == ChangedEntity::Contact {
        format!(
            " {:<width$} no contact {msr} is registered: the setting is kept and applies when it \
             registers (msrctl resource list shows the registered contacts)\n",
            "note"
        )
    } else {
        format!(
            " {:<width$} no msr {msr} is registered: the setting is kept and applies when it \
             registers (msrctl msr list shows the registered msrs)\n",
            "note"
        )
    }
}

/// A changed value as msrctl shows it: a coefficient seed-style (`1.0`),
/// other numbers compactly (`32`, `1e308`), a distance with no path as
/// `infinity`.
fn change_value(property: ChangedProperty, value: &ChangeValue) -> String {
    match value {
        ChangeValue::Distance(distance) => distance.to_string(),
        ChangeValue::Number(x) if property == ChangedProperty::PerformanceCoefficient => {
            format_coefficient(*x)
        }
        ChangeValue::Number(x) => format_number(*x),
        ChangeValue::Count(n) => n.to_string(),
        ChangeValue::Flag(flag) => flag.to_string(),
        ChangeValue::Text(text) => text.clone(),
    }
}

/// `site list`.
pub fn sites(sites: &[String]) -> String {
    let mut out = String::from("List of all sites:\n");
    for site in sites {
        out.push(' ');
        out.push_str(site);
        out.push('\n');
    }
    out
}

/// `zone list`: each zone with its contacts; the default zone marked.
pub fn zones(zones: &[ZoneInfo]) -> String {
    let rows = zones
        .iter()
        .map(|z| {
            vec![
                z.name.clone(),
                z.contacts.to_string(),
                z.default.to_string(),
            ]
        })
        .collect();
    format!(
        "List of all zones:\n{}\n",
        table(
            &["Zone", "Contacts", "Default"],
            &[Align::Left, Align::Right, Align::Left],
            rows
        )
    )
}

/// Whether `m` is only the operator's settings for a name: never
/// registered with this collector (or not since it started), not gone,
/// nothing placed on it. `msr set` keeps such settings for when the MSR
/// registers; `msr list` shows them apart, not as a media server, a kept
/// `active false` (its drain state) included.
pub(super) fn settings_only(m: &MsrInfo) -> bool {
    !m.registered
        && m.health.is_none()
        && m.gone_since_unix.is_none()
        && m.live_legs == 0
        && m.engine_calls.is_none()
}

/// `msr list`: the media servers, then the settings kept for MSR names
/// that are not registered (issue 44: a typo in `msr set` is not shown as
/// a server).
pub fn msrs(msrs: &[MsrInfo]) -> String {
    let (waiting, servers): (Vec<&MsrInfo>, Vec<&MsrInfo>) =
        msrs.iter().partition(|m| settings_only(m));
    let rows = servers
        .into_iter()
        .map(|m| {
            vec![
                m.name.clone(),
                coefficient(m.performance_coefficient),
                m.active.to_string(),
                m.registered.to_string(),
                m.load_limit.to_string(),
                m.live_legs.to_string(),
                optional(m.engine_calls),
                // A gone MSR (SPEC §14) has no health: why and since when
                // it went take the two columns.
                match (&m.health, &m.gone_cause) {
                    (None, Some(cause)) => format!("gone ({cause})"),
                    _ => optional(m.health.map(HealthState::as_str)),
                },
                optional(m.health_since_unix.or(m.gone_since_unix).map(timestamp)),
                optional(m.drain.map(DrainState::as_str)),
            ]
        })
        .collect();
    let headers = [
        "Name",
        "Performance\ncoefficient",
        "Active",
        "Registered",
        "Load\nlimit",
        "Live\nlegs",
        "Engine\ncalls",
        "Health",
        "Health since",
        "Drain",
    ];
    let aligns = [
        Align::Left,
        Align::Right,
        Align::Left,
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Left,
        Align::Left,
        Align::Left,
    ];
    let mut out = format!(" Media server list:\n{}\n", table(&headers, &aligns, rows));
    if !waiting.is_empty() {
        let rows = waiting
            .into_iter()
            .map(|m| {
                vec![
                    m.name.clone(),
                    coefficient(m.performance_coefficient),
                    m.active.to_string(),
                    m.load_limit.to_string(),
                ]
            })
            .collect();
        out.push_str(&format!(
            " Settings kept for msrs that are not registered (each applies when its msr registers):\n{}\n",
            table(
                &["Name", "Performance\ncoefficient", "Active", "Load\nlimit"],
                &[Align::Left, Align::Right, Align::Left, Align::Right],
                rows
            )
        ));
    }
    out
}

fn optional<T: ToString>(value: Option<T>) -> String {
    value.map(|v| v.to_string()).unwrap_or_default()
}

/// `resource list [active]` by default: the columns an operator reads at a
/// glance, in 120 columns for usual names (the `--wide` table,
/// [`resources`], has all of them). The contact names its MSR
/// (`{iface}@{msr}`), so the MSR has no column of its own. The node is in
/// the title when every row is from one collector, else a column.
pub fn resources_narrow(rows: &[ResourceInfo], active_only: bool) -> String {
    let one_node = rows
        .first()
        .map(|r| r.node.as_str())
        .filter(|first| rows.iter().all(|r| r.node == *first));
    // Most clusters have one zone: then it is in the title, like the node.
    let one_zone = rows
        .first()
        .map(|r| r.zone.as_str())
        .filter(|first| rows.iter().all(|r| r.zone == *first));
    // CPU and calls beside the load: `load-sensor` picks one of them (or
    // the larger), and a load of 100 with 0 calls is a busy host, not a
    // full engine. The subscription's state is in `--wide`: a failed one
    // shows as the health `unreachable` here.
    let columns: [(&str, Align, Option<bool>); 12] = [
        ("Node", Align::Left, Some(one_node.is_none())),
        ("Contact", Align::Left, None),
        ("Load", Align::Right, None),
        ("CPU", Align::Right, None),
        ("Calls", Align::Right, None),
        ("Media", Align::Left, None),
        ("Active", Align::Left, None),
        ("Zone", Align::Left, Some(one_zone.is_none())),
        ("Site", Align::Left, None),
        ("Status", Align::Left, None),
        ("Report\nage", Align::Right, None),
        ("Live\nlegs", Align::Right, None),
    ];
    let shown = |i: usize| columns[i].2.unwrap_or(true);
    let mut headers: Vec<&str> = (0..columns.len())
        .filter(|&i| shown(i))
        .map(|i| columns[i].0)
        .collect();
    let mut aligns: Vec<Align> = (0..columns.len())
        .filter(|&i| shown(i))
        .map(|i| columns[i].1)
        .collect();
    headers.push("Health");
    aligns.push(Align::Left);
    let body = rows
        .iter()
        .map(|r| {
            let cells = [
                r.node.clone(),
                r.contact.clone(),
                optional(r.load),
                optional(r.cpu),
                calls(r),
                media_summary(r.codecs.as_deref()),
                r.active.to_string(),
                r.zone.clone(),
                r.site.clone(),
                r.status.to_string(),
                optional(r.report_age_secs),
                r.live_legs.to_string(),
            ];
            let mut cells: Vec<String> = cells
                .into_iter()
                .enumerate()
                .filter(|(i, _)| shown(*i))
                .map(|(_, cell)| cell)
                .collect();
            cells.push(r.health.to_string());
            cells
        })
        .collect();
    let title = if active_only {
        "  Active media resource list"
    } else {
        "  Media resource list"
    };
    let scope = [
        one_node.map(str::to_owned),
        one_zone.map(|zone| format!("zone {zone}")),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ");
    let title = if scope.is_empty() {
        format!("{title} (--wide for every column):")
    } else {
        format!("{title} ({scope}; --wide for every column):")
    };
    format!("{title}\n{}\n", table(&headers, &aligns, body))
}

/// The `Media` column (SPEC §15): how many audio and video codecs the MSR
/// takes and whether it takes T.38 (`3a 2v t38`; `--wide` names them), `-`
/// when it did not say (it is then taken as able to take anything).
fn media_summary(codecs: Option<&[String]>) -> String {
    use msr_shared::media::{Codec, Kind};
    let Some(codecs) = codecs else {
        return "-".to_owned();
    };
    let known: Vec<Codec> = codecs.iter().filter_map(|c| Codec::from_name(c)).collect();
    let count = |kind| known.iter().filter(|c| c.kind() == kind).count();
    let mut parts = Vec::new();
    for (kind, suffix) in [(Kind::Audio, "a"), (Kind::Video, "v")] {
        let n = count(kind);
        if n > 0 {
            parts.push(format!("{n}{suffix}"));
        }
    }
    parts.extend(
        known
            .iter()
            .filter(|c| c.kind() == Kind::Image)
            .map(|c| c.name().to_owned()),
    );
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(" ")
    }
}

/// `resource list [active]`: one row per contact (SPEC §5).
/// The `Calls` cell: `calls/max-calls` of the last report.
fn calls(r: &ResourceInfo) -> String {
    match (r.calls, r.max_calls) {
        (Some(calls), Some(max)) => format!("{calls}/{max}"),
        (calls, _) => optional(calls),
    }
}

pub fn resources(rows: &[ResourceInfo], active_only: bool) -> String {
    let headers = [
        "Node",
        "MSR",
        "MSR\nversion",
        "MSR\nperf coef",
        "MSR\nload",
        "CPU",
        "Calls",
        "Cc-address",
        "Engine",
        "Active",
        "Zone",
        "Site",
        "Contact",
        "Status",
        // Seconds left of the registration: a countdown, not a past event
        // (the seed's `Expired` read as when it had lapsed; issue 44).
        "Expires\nin, s",
        "Subscription",
        "Report\nage",
        "Stale",
        "Live\nlegs",
        "Health",
        "Health\nfor",
        "Codecs",
    ];
    let aligns = [
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Right,
        Align::Left,
        Align::Right,
        Align::Left,
        Align::Right,
    ];
    let mut previous_node: Option<&str> = None;
    let body = rows
        .iter()
        .map(|r| {
            // The seed shows each node once, on its first row.
            let node = if previous_node == Some(r.node.as_str()) {
                String::new()
            } else {
                r.node.clone()
            };
            previous_node = Some(&r.node);
            vec![
                node,
                r.msr.clone(),
                optional(r.version.as_deref()),
                coefficient(r.performance_coefficient),
                optional(r.load),
                optional(r.cpu),
                calls(r),
                optional(r.mcc.as_deref()),
                optional(r.engine_uri.as_deref()),
                r.active.to_string(),
                r.zone.clone(),
                r.site.clone(),
                r.contact.clone(),
                r.status.to_string(),
                r.expires_secs.to_string(),
                subscription_name(r.subscription.as_ref()).to_owned(),
                optional(r.report_age_secs),
                if r.stale {
                    "stale".to_owned()
                } else {
                    String::new()
                },
                r.live_legs.to_string(),
                r.health.to_string(),
                r.health_secs.to_string(),
                r.codecs
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |c| c.join(",")),
            ]
        })
        .collect();
    let title = if active_only {
        "  Active media resource list:"
    } else {
        "  Media resource list:"
    };
    format!("{title}\n{}\n", table(&headers, &aligns, body))
}

/// `cluster list`: the store's state on top, then one row per core host.
pub fn cluster(view: &ClusterView) -> String {
    let store = &view.store;
    let mut out = format!(
        " Operator store: {} {} ({})",
        store.backend, store.status, store.location
    );
    if let Some(revision) = store.revision {
        out.push_str(&format!(", revision {revision}"));
    }
    out.push('\n');
    if let Some(since) = store.unavailable_since_unix {
        out.push_str(&format!(" Unavailable since: {}\n", timestamp(since)));
    }
    if let Some(detail) = &store.detail {
        out.push_str(&format!(" Note: {detail}\n"));
    }
    let headers = ["Node", "SIP address", "Started", "This"];
    let aligns = [Align::Left, Align::Left, Align::Left, Align::Left];
    let rows = view
        .members
        .iter()
        .map(|m| {
            vec![
                m.node.clone(),
                m.sip.clone(),
                timestamp(m.started_unix),
                if m.this { "*".into() } else { String::new() },
            ]
        })
        .collect();
    let source = if view.core_hosts_from_config {
        " (from [cluster] core_hosts: etcd has not been reached since this collector \
         started, so the other live collectors are not known yet)"
    } else {
        ""
    };
    out.push_str(&format!(
        " Core hosts: {}{source}\n{}\n",
        view.core_hosts,
        table(&headers, &aligns, rows)
    ));
    out
}

/// Formats Unix seconds as `YYYY/MM/DD hh:mm:ss UTC`: the seed's form,
/// with its zone said (issue 44: a time without one reads as local time).
pub fn timestamp(unix: i64) -> String {
    let t = msr_shared::time::UtcDateTime::from_unix(unix);
    format!(
        "{:04}/{:02}/{:02} {:02}:{:02}:{:02} UTC",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// `subscription list` (columns as in the seed).
pub fn subscriptions(rows: &[SubscriptionInfo]) -> String {
    let headers = [
        "MSR",
        "Is MSR\nregistered?",
        "Event",
        "Active",
        "Expires",
        "Notify",
        "Timestamp",
        "Event id",
        "Status",
    ];
    let aligns = [
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Left,
        Align::Left,
        Align::Left,
    ];
    let body = rows
        .iter()
        .map(|s| {
            vec![
                s.msr.clone(),
                s.registered.to_string(),
                s.event.clone(),
                s.active.to_string(),
                s.expires_secs.to_string(),
                s.notify_count.to_string(),
                s.last_notify_unix.map(timestamp).unwrap_or_default(),
                s.event_id.clone(),
                subscription_name(s.status.as_ref()).to_owned(),
            ]
        })
        .collect();
    format!(
        " Load subscriptions to the MSRs:\n{}\n",
        table(&headers, &aligns, body)
    )
}

/// `leg list`: the live legs, oldest first, and how many matched when
/// the limit cut the rows short (SPEC §9).
pub fn legs(data: &LegRows) -> String {
    let headers = ["Call-ID", "Leg", "MSR", "Contact", "Age, s", "Conference"];
    let aligns = [
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Right,
        Align::Left,
    ];
    let body = data
        .rows
        .iter()
        .map(|l| {
            vec![
                l.call_id.clone(),
                l.leg.clone().unwrap_or_default(),
                l.msr.clone(),
                l.contact.clone(),
                l.age_secs.to_string(),
                l.conference.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let shown = data.rows.len() as u64;
    let footer = if shown < data.total {
        format!(
            " {shown} of {} live legs shown (--limit).
",
            data.total
        )
    } else {
        format!(
            " {} live {}.
",
            data.total,
            if data.total == 1 { "leg" } else { "legs" }
        )
    };
    format!(
        " Live legs
{}
{footer}",
        table(&headers, &aligns, body)
    )
}

/// Every other number: [`format_number`] (binary noise such as
/// `99.00000000000001` rounded away, exponent form for huge and tiny values).
fn number(value: f64) -> String {
    format_number(value)
}

/// The steps of a selection: candidates with their fate, then the interval
/// table and the draw.
pub fn explain(explain: &Explain) -> String {
    let mut out = format!(
        "Leg: zone {}, site {}, other leg's msr {}{}\n",
        explain.zone,
        explain.site,
        explain.msr.as_deref().unwrap_or("-"),
        if explain.codecs.is_empty() {
            String::new()
        } else {
            format!(", offer {}", explain.codecs.join(","))
        }
    );
    if explain.media_bridge {
        out.push_str("The other leg's msr has no candidate: media bridge needed.\n");
    }
    let candidates = explain
        .candidates
        .iter()
        .map(|c| {
            let distance = c.distance.to_string();
            vec![
                c.contact.clone(),
                c.msr.clone(),
                c.site.clone(),
                distance,
                c.health.to_string(),
                // `incapable: video (h264)` (SPEC §15): what it lacks.
                match &c.lacks {
                    Some(lacks) => format!("{}: {lacks}", c.outcome),
                    None => c.outcome.to_string(),
                },
                optional(c.weight.map(number)),
            ]
        })
        .collect();
    out.push_str(&format!("Contacts of zone {}:\n", explain.zone));
    out.push_str(&table(
        &[
            "Contact", "MSR", "Site", "Distance", "Health", "Outcome", "Weight",
        ],
        &[
            Align::Left,
            Align::Left,
            Align::Left,
            Align::Right,
            Align::Left,
            Align::Left,
            Align::Right,
        ],
        candidates,
    ));
    out.push('\n');
    let intervals: Vec<Vec<String>> = explain
        .intervals
        .iter()
        .map(|i| {
            let load = if i.reported {
                i.load.to_string()
            } else {
                "-".to_owned()
            };
            let load = if i.stale {
                format!("{load} (stale)")
            } else {
                load
            };
            vec![
                i.msr.clone(),
                i.contact.clone(),
                load,
                coefficient(i.performance_coefficient),
                number(i.weight),
                format!("[{}, {})", number(i.bottom), number(i.top)),
            ]
        })
        .collect();
    // A refusal, or a rule that draws nothing, has no interval table: a
    // line says so rather than an empty box.
    if intervals.is_empty() {
        out.push_str("Intervals: none\n");
    } else {
        out.push_str("Intervals:\n");
        out.push_str(&table(
            &["MSR", "Contact", "Load", "Perf\ncoef", "Weight", "Interval"],
            &[
                Align::Left,
                Align::Left,
                Align::Right,
                Align::Right,
                Align::Right,
                Align::Left,
            ],
            intervals,
        ));
        out.push('\n');
    }
    match (explain.rule, explain.draw) {
        (SelectionRule::Draw, Some(draw)) => out.push_str(&format!(
            "Draw {} in [0, {})\n",
            number(draw),
            number(explain.total)
        )),
        (SelectionRule::Draw | SelectionRule::Sticky, _) => {
            out.push_str(&format!("No draw (total {})\n", number(explain.total)))
        }
        (SelectionRule::ExistingConference, _) => match explain.threshold {
            Some(threshold) => out.push_str(&format!(
                "Rule existing_conference: the conference's msr, below {}% of its load limit (no draw)\n",
                number(threshold)
            )),
            // Its host does not take the leg's offer (SPEC §15).
            None => out.push_str("Rule existing_conference: the conference's msr or none (no draw)\n"),
        },
        (SelectionRule::NewConference, _) => out.push_str(&format!(
            "Rule new_conference: the conference's first msr by preference below {}% of its load limit (no draw)\n",
            number(explain.threshold.unwrap_or(0.0))
        )),
        (SelectionRule::Pooled, _) => out.push_str(
            "Rule pooled: the lowest estimated occupancy, calls + G x (placed - released since the report) over max-calls x coefficient (no draw)\n",
        ),
    }
    out
}

/// The answer to `release`.
pub fn released(r: &Released) -> String {
    let leg = r
        .leg
        .as_deref()
        .map_or(String::new(), |l| format!(" leg {l}"));
    match r.released {
        0 => format!(
            " call-id {}{leg}: no live leg (nothing to release)\n",
            r.call_id
        ),
        1 => format!(" call-id {}{leg}: 1 leg released\n", r.call_id),
        n => format!(" call-id {}{leg}: {n} legs released\n", r.call_id),
    }
}

/// `text` with every control character but `\n` escaped.
fn printable(text: &str) -> String {
    if !text.chars().any(|c| c.is_control() && c != '\n') {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The result of `select`.
pub fn selection(selection: &Selection) -> String {
    let mut out = String::new();
    if let Some(e) = &selection.explain {
        out.push_str(&explain(e));
    }
    if let Some(leg) = selection.leg {
        let leg = match leg {
            LegOutcome::New => "new",
            LegOutcome::Sticky => "sticky (its msr again)",
            LegOutcome::Reanchored => {
                "re-anchored (moved from an msr that is unreachable, unregistered or failed it)"
            }
        };
        out.push_str(&format!(" leg          {leg}\n"));
    }
    if selection.rule != SelectionRule::Draw {
        let rule = match selection.rule {
            SelectionRule::Draw | SelectionRule::Sticky => "sticky",
            SelectionRule::ExistingConference => "existing_conference",
            SelectionRule::NewConference => "new_conference",
            SelectionRule::Pooled => "pooled",
        };
        out.push_str(&format!(" rule         {rule}\n"));
    }
    // Only the §7 rule draws; the others name their rule instead.
    let draw = if selection.rule == SelectionRule::Draw {
        format!("{} of {}", number(selection.draw), number(selection.total))
    } else {
        "none".to_owned()
    };
    out.push_str(&format!(
        " msr          {}\n contact      {}\n engine       {}\n mcc          {}\n uri          {}\n distance     {}\n media bridge {}\n draw         {draw}\n",
        selection.msr,
        selection.contact,
        optional(selection.engine_uri.as_deref()),
        optional(selection.mcc.as_deref()),
        selection.uri,
        selection.distance,
        if selection.media_bridge { "needed" } else { "no" },
    ));
    out
}

/// How `resource list` is shown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceView {
    /// `resource list active`: the title says so.
    pub active_only: bool,
    /// `--wide`: every column.
    pub wide: bool,
}

/// Any successful response; `view` says how a resource list is shown.
pub fn response(data: &ResponseData, view: ResourceView) -> String {
    match data {
        ResponseData::SiteDeclared { name } => format!("Site: {name}.\n Created successfully.\n"),
        ResponseData::SiteRemoved { name } => format!("Site: {name}.\n Removed successfully.\n"),
        ResponseData::Changed(c) => change(c),
        ResponseData::Sites { sites: list } => sites(list),
        ResponseData::Zones { zones: list } => zones(list),
        ResponseData::Matrix(m) => matrix(m),
        ResponseData::Msrs { msrs: list } => msrs(list),
        ResponseData::Resources { rows } if view.wide => resources(rows, view.active_only),
        ResponseData::Resources { rows } => resources_narrow(rows, view.active_only),
        ResponseData::Subscriptions { rows } => subscriptions(rows),
        ResponseData::Selected(s) => selection(s),
        ResponseData::Released(r) => released(r),
        ResponseData::Legs(l) => legs(l),
        ResponseData::Cluster(c) => cluster(c),
        ResponseData::Hello(h) => format!(
            "{}, control protocol version {} (msrctl speaks {PROTOCOL_VERSION}).\n",
            h.software, h.version
        ),
    }
}

/// An error for stderr: `error: <code>: <message>`; a refused `select
/// --explain` also gets its steps (returned as the second value, for stdout).
pub fn error(body: &ErrorBody) -> (String, Option<String>) {
    (
        format!("error: {}: {}", body.code, body.message),
        body.explain.as_ref().map(explain),
    )
}

#[cfg(test)]
mod tests;
