//! What an operator change changed (SPEC §16: every change on record): the
//! difference between two operator configurations, one line per value,
//! for the log. Computed from the configurations themselves, so a change
//! made here, one made by another collector (etcd) and one that arrived
//! after a restart are all told the same way.

use std::collections::{BTreeMap, BTreeSet};

use msr_shared::present::format_number;

use super::{MsrSettings, OperatorConfig};

/// One value that changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueChange {
    /// What: `site east`, `distance east-west`, `msr msr_1 active`,
    /// `contact lo@msr_1 site`.
    pub what: String,
    /// The value before (`-`: none).
    pub from: String,
    /// The value after (`-`: none).
    pub to: String,
}

fn change(what: String, from: impl Into<String>, to: impl Into<String>) -> ValueChange {
    ValueChange {
        what,
        from: from.into(),
        to: to.into(),
    }
}

fn distance(value: Option<f64>) -> String {
    value.map_or_else(|| "infinity".to_owned(), format_number)
}

/// Every value that differs between `before` and `after`, sites first,
/// then distances, MSRs and contacts, each by name.
pub fn diff(before: &OperatorConfig, after: &OperatorConfig) -> Vec<ValueChange> {
    let mut out = Vec::new();
    let sites_before: BTreeSet<&str> = before.topology().sites().collect();
    let sites_after: BTreeSet<&str> = after.topology().sites().collect();
    for site in sites_after.difference(&sites_before) {
        out.push(change(format!("site {site}"), "-", "declared"));
    }
    for site in sites_before.difference(&sites_after) {
        out.push(change(format!("site {site}"), "declared", "-"));
    }
    let pairs = |c: &OperatorConfig| -> BTreeMap<(String, String), f64> {
        c.topology()
            .explicit_distances()
            .map(|(a, b, d)| ((a.to_owned(), b.to_owned()), d))
            .collect()
    };
    let (d_before, d_after) = (pairs(before), pairs(after));
    let keys: BTreeSet<&(String, String)> = d_before.keys().chain(d_after.keys()).collect();
    for key in keys {
        // An unset pair is infinite, but a site's distance to itself is 0
        // until set (SPEC §6).
        let unset = (key.0 == key.1).then_some(0.0);
        let (from, to) = (
            d_before.get(key).copied().or(unset),
            d_after.get(key).copied().or(unset),
        );
        if from != to {
            out.push(change(
                format!("distance {}-{}", key.0, key.1),
                distance(from),
                distance(to),
            ));
        }
    }
    let msrs: BTreeSet<&str> = before
        .configured_msrs()
        .chain(after.configured_msrs())
        .map(|(name, _)| name)
        .collect();
    for msr in msrs {
        let (a, b) = (before.msr(msr), after.msr(msr));
        msr_changes(msr, &a, &b, &mut out);
    }
    let contacts: BTreeSet<&str> = before
        .configured_contacts()
        .chain(after.configured_contacts())
        .map(|(name, _)| name)
        .collect();
    let contact_of = |c: &OperatorConfig, name: &str| {
        c.configured_contacts()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    };
    for contact in contacts {
        let (a, b) = (contact_of(before, contact), contact_of(after, contact));
        let show = |v: Option<&str>| v.unwrap_or("(no override)").to_owned();
        if a.zone != b.zone {
            out.push(change(
                format!("contact {contact} zone"),
                show(a.zone.as_deref()),
                show(b.zone.as_deref()),
            ));
        }
        if a.site != b.site {
            out.push(change(
                format!("contact {contact} site"),
                show(a.site.as_deref()),
                show(b.site.as_deref()),
            ));
        }
    }
    out
}

fn msr_changes(msr: &str, a: &MsrSettings, b: &MsrSettings, out: &mut Vec<ValueChange>) {
    if a.performance_coefficient != b.performance_coefficient {
        out.push(change(
            format!("msr {msr} performance_coefficient"),
            format_number(a.performance_coefficient),
            format_number(b.performance_coefficient),
        ));
    }
    if a.active != b.active {
        out.push(change(
            format!("msr {msr} active"),
            a.active.to_string(),
            b.active.to_string(),
        ));
    }
    if a.load_limit != b.load_limit {
        out.push(change(
            format!("msr {msr} load_limit"),
            a.load_limit.to_string(),
            b.load_limit.to_string(),
        ));
    }
    if a.subscription_expires != b.subscription_expires {
        let show = |v: Option<u32>| v.map_or_else(|| "(no override)".to_owned(), |s| s.to_string());
        out.push(change(
            format!("msr {msr} subscription_expires"),
            show(a.subscription_expires),
            show(b.subscription_expires),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_change_is_one_line_with_from_and_to() {
        let mut before = OperatorConfig::new();
        before.declare_site("east").expect("site");
        before.declare_site("west").expect("site");
        let mut after = before.clone();
        after.declare_site("north").expect("site");
        after.set_distance("east", "west", 64.0).expect("distance");
        after.set_active("msr_1", false).expect("active");
        after.set_load_limit("msr_1", 80).expect("limit");
        after.set_contact_site("lo@msr_1", "west").expect("contact");
        let lines: Vec<String> = diff(&before, &after)
            .into_iter()
            .map(|c| format!("{}: {} -> {}", c.what, c.from, c.to))
            .collect();
        assert_eq!(
            lines,
            [
                "site north: - -> declared",
                "distance east-west: infinity -> 64",
                "msr msr_1 active: true -> false",
                "msr msr_1 load_limit: 100 -> 80",
                "contact lo@msr_1 site: (no override) -> west",
            ]
        );
        assert!(diff(&after, &after).is_empty());
        let back: Vec<String> = diff(&after, &before).into_iter().map(|c| c.what).collect();
        assert!(back.contains(&"site north".to_owned()), "{back:?}");
    }
}
