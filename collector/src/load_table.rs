//! The live load table (SPEC §5): one row per registered MSR contact.
//!
//! The SIP side feeds it — registrations ([`LoadTable::upsert_contact`],
//! [`LoadTable::remove_contact`], [`LoadTable::remove_msr`]), NOTIFY bodies
//! ([`LoadTable::set_load`]) and subscription state
//! ([`LoadTable::set_subscription`]) — and selection reads it
//! ([`LoadTable::candidates_in_zone`]).
//!
//! Load is per MSR (one NOTIFY per MSR) and shown on each of its contacts.
//! Registration status, the admin active flag, the subscription state and
//! staleness are separate fields; staleness and registration status are
//! computed from the `now` a reader passes, never stored.
//!
//! Operator settings (zone, site, performance coefficient, active) are owned by
//! [`OperatorConfig`]; the table keeps a derived copy that
//! [`LoadTable::apply_operator`] refreshes after every operator change.
//!
//! Architecture invariant: no I/O and no clock; times come from the caller as
//! `tokio::time::Instant`. `by_zone` always indexes exactly the contacts in
//! `contacts` under their current zone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

use msr_shared::event_package::LoadReport;
use tokio::time::Instant;

use crate::operator::{MsrSettings, OperatorConfig};

/// SUBSCRIBE `Expires` the collector uses when nothing else is set, seconds
/// (SPEC §4); also the staleness limit of an MSR without subscription state.
pub const DEFAULT_SUBSCRIPTION_EXPIRES_SECS: u32 = 60;

/// One registered contact of an MSR, as the registrar learned it (SPEC §3).
#[derive(Debug, Clone, PartialEq)]
pub struct ContactBinding {
    /// Contact name `{iface}@{msr}`, e.g. `lo@msr_1`.
    pub contact: String,
    /// MSR name.
    pub msr: String,
    /// Contact URI (where SUBSCRIBE goes).
    pub uri: String,
    /// Agent version from `User-Agent`, if any.
    pub version: Option<String>,
    /// When the registration lapses.
    pub expires_at: Instant,
}

/// State of the collector's load subscription to one MSR (RFC 6665).
///
/// ```text
/// None ──SUBSCRIBE──▶ Pending ──2xx/NOTIFY──▶ Active ──NOTIFY terminated──▶ Terminated
///                        └──────error/timeout──────▶ Failed
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriptionStatus {
    /// SUBSCRIBE sent, no answer yet.
    Pending,
    /// Subscribed; NOTIFYs expected.
    Active,
    /// The notifier ended it; the text is the `reason` parameter.
    Terminated(String),
    /// Refused or timed out.
    Failed,
    /// No subscription.
    None,
}

impl fmt::Display for SubscriptionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SubscriptionStatus::Pending => "pending",
            SubscriptionStatus::Active => "active",
            SubscriptionStatus::Terminated(_) => "terminated",
            SubscriptionStatus::Failed => "failed",
            SubscriptionStatus::None => "none",
        })
    }
}

/// What the subscriber reports about its subscription to one MSR.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionView {
    /// Subscription state.
    pub status: SubscriptionStatus,
    /// Granted (or requested, while pending) `Expires`, seconds; a load report
    /// older than this is stale.
    pub expires_secs: u32,
    /// NOTIFYs received on the current subscription.
    pub notify_count: u64,
    /// Unix time of the last NOTIFY, seconds.
    pub last_notify_unix: Option<i64>,
    /// Event id of the subscription (e.g. derived from the dialog).
    pub event_id: String,
}

/// One row of the table as seen at a given `now` (SPEC §5).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceRow {
    /// The collector holding the row.
    pub node: String,
    /// Contact name `{iface}@{msr}`.
    pub contact: String,
    /// MSR name.
    pub msr: String,
    /// Contact URI.
    pub uri: String,
    /// Agent version.
    pub version: Option<String>,
    /// Performance coefficient of the MSR.
    pub performance_coefficient: f64,
    /// Admin active flag of the MSR.
    pub active: bool,
    /// The contact's zone.
    pub zone: String,
    /// The contact's site.
    pub site: String,
    /// `now` is before the registration's expiry.
    pub registered: bool,
    /// Time left until the registration lapses (zero once lapsed).
    pub expires_in: Duration,
    /// The MSR's last load report.
    pub load: Option<LoadReport>,
    /// Age of the last load report.
    pub report_age: Option<Duration>,
    /// The last report is older than the subscription's expiry.
    pub stale: bool,
    /// The MSR's subscription state, if the subscriber reported one.
    pub subscription: Option<SubscriptionView>,
}

/// A contact that selection may use (SPEC §7 step 1), as borrowed from the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate<'a> {
    /// Contact name.
    pub contact: &'a str,
    /// MSR name.
    pub msr: &'a str,
    /// Contact URI.
    pub uri: &'a str,
    /// The contact's site.
    pub site: &'a str,
    /// The MSR's last reported load in percent, if any.
    pub load: Option<u8>,
    /// The last report is stale.
    pub stale: bool,
    /// Performance coefficient of the MSR.
    pub performance_coefficient: f64,
}

/// Per-MSR state about an MSR summary (for `subscription list`, `msr list`).
#[derive(Debug, Clone, PartialEq)]
pub struct MsrView {
    /// MSR name.
    pub msr: String,
    /// At least one contact is registered at `now`.
    pub registered: bool,
    /// Operator settings in effect.
    pub settings: MsrSettings,
    /// Subscription state, if reported.
    pub subscription: Option<SubscriptionView>,
}

#[derive(Debug, Clone)]
struct ContactEntry {
    binding: ContactBinding,
    /// Effective zone (override or default).
    zone: String,
    /// Effective site (override or default).
    site: String,
}

#[derive(Debug, Clone, Default)]
struct MsrEntry {
    /// Contacts of this MSR present in the table.
    contacts: BTreeSet<String>,
    /// Last report and when it arrived.
    load: Option<(LoadReport, Instant)>,
    /// Subscription state from the subscriber.
    subscription: Option<SubscriptionView>,
    /// Operator settings in effect (copied from [`OperatorConfig`]).
    settings: MsrSettings,
}

impl MsrEntry {
    fn is_stale(&self, now: Instant) -> bool {
        let Some((_, at)) = &self.load else {
            return false;
        };
        let limit = self
            .subscription
            .as_ref()
            .map(|s| s.expires_secs)
            .filter(|secs| *secs > 0)
            .unwrap_or(DEFAULT_SUBSCRIPTION_EXPIRES_SECS);
        now.saturating_duration_since(*at) > Duration::from_secs(u64::from(limit))
    }
}

/// The live load table (SPEC §5).
#[derive(Debug, Clone)]
pub struct LoadTable {
    /// This collector's name, shown in the Node column.
    node: String,
    /// Rows by contact name.
    contacts: BTreeMap<String, ContactEntry>,
    /// Zone → contact names in it, so selection reads only the leg's zone.
    by_zone: HashMap<String, BTreeSet<String>>,
    /// Per-MSR state by MSR name.
    msrs: BTreeMap<String, MsrEntry>,
}

impl LoadTable {
    /// An empty table; `node` is this collector's name (Node column).
    pub fn new(node: String) -> Self {
        Self {
            node,
            contacts: BTreeMap::new(),
            by_zone: HashMap::new(),
            msrs: BTreeMap::new(),
        }
    }

    /// This collector's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Number of contacts in the table.
    pub fn len(&self) -> usize {
        self.contacts.len()
    }

    /// Whether the table has no contact.
    pub fn is_empty(&self) -> bool {
        self.contacts.is_empty()
    }

    fn unindex(&mut self, contact: &str, zone: &str) {
        if let Some(set) = self.by_zone.get_mut(zone) {
            set.remove(contact);
            if set.is_empty() {
                self.by_zone.remove(zone);
            }
        }
    }

    /// Adds or refreshes a contact (REGISTER accepted, SPEC §3); zone and site
    /// come from the operator's overrides, else the collector's defaults.
    pub fn upsert_contact(
        &mut self,
        binding: ContactBinding,
        operator: &OperatorConfig,
        default_zone: &str,
        default_site: &str,
    ) {
        let zone = operator
            .contact_zone(&binding.contact, default_zone)
            .to_owned();
        let site = operator
            .contact_site(&binding.contact, default_site)
            .to_owned();
        if let Some(old) = self.contacts.get(&binding.contact) {
            let (old_zone, old_msr) = (old.zone.clone(), old.binding.msr.clone());
            self.unindex(&binding.contact, &old_zone);
            if old_msr != binding.msr {
                if let Some(entry) = self.msrs.get_mut(&old_msr) {
                    entry.contacts.remove(&binding.contact);
                }
            }
        }
        self.by_zone
            .entry(zone.clone())
            .or_default()
            .insert(binding.contact.clone());
        let entry = self.msrs.entry(binding.msr.clone()).or_default();
        entry.settings = operator.msr(&binding.msr);
        entry.contacts.insert(binding.contact.clone());
        self.contacts.insert(
            binding.contact.clone(),
            ContactEntry {
                binding,
                zone,
                site,
            },
        );
    }

    /// Removes a contact (unregistered or lapsed). The MSR's load and
    /// subscription state stay until [`LoadTable::remove_msr`].
    pub fn remove_contact(&mut self, contact: &str) {
        if let Some(old) = self.contacts.remove(contact) {
            self.unindex(contact, &old.zone);
            if let Some(entry) = self.msrs.get_mut(&old.binding.msr) {
                entry.contacts.remove(contact);
            }
        }
    }

    /// Removes an MSR: every contact, its load and its subscription state.
    pub fn remove_msr(&mut self, msr: &str) {
        if let Some(entry) = self.msrs.remove(msr) {
            for contact in &entry.contacts {
                if let Some(old) = self.contacts.remove(contact) {
                    self.unindex(contact, &old.zone);
                }
            }
        }
    }

    /// Records a load report (NOTIFY body, SPEC §4) received at `at`.
    /// `report.load` above 100 is read as 100.
    pub fn set_load(&mut self, msr: &str, report: LoadReport, at: Instant) {
        self.msrs.entry(msr.to_owned()).or_default().load = Some((report, at));
    }

    /// Records the state of the subscription to an MSR.
    pub fn set_subscription(&mut self, msr: &str, view: SubscriptionView) {
        self.msrs.entry(msr.to_owned()).or_default().subscription = Some(view);
    }

    /// Re-reads every operator-owned value (zone, site, coefficient, active)
    /// from `operator`. Call after each operator change.
    pub fn apply_operator(
        &mut self,
        operator: &OperatorConfig,
        default_zone: &str,
        default_site: &str,
    ) {
        self.by_zone.clear();
        for (name, entry) in &mut self.contacts {
            entry.zone = operator.contact_zone(name, default_zone).to_owned();
            entry.site = operator.contact_site(name, default_site).to_owned();
            self.by_zone
                .entry(entry.zone.clone())
                .or_default()
                .insert(name.clone());
        }
        for (name, entry) in &mut self.msrs {
            entry.settings = operator.msr(name);
        }
    }

    /// Whether any contact in the table currently carries `site`.
    pub fn site_in_use(&self, site: &str) -> bool {
        self.contacts.values().any(|c| c.site == site)
    }

    /// Whether the contact is in the table.
    pub fn contains_contact(&self, contact: &str) -> bool {
        self.contacts.contains_key(contact)
    }

    /// The rows as seen at `now`, sorted by MSR then contact.
    pub fn rows(&self, now: Instant) -> Vec<ResourceRow> {
        let mut rows = Vec::with_capacity(self.contacts.len());
        for (msr, entry) in &self.msrs {
            for contact in &entry.contacts {
                let Some(c) = self.contacts.get(contact) else {
                    continue;
                };
                rows.push(ResourceRow {
                    node: self.node.clone(),
                    contact: contact.clone(),
                    msr: msr.clone(),
                    uri: c.binding.uri.clone(),
                    version: c.binding.version.clone(),
                    performance_coefficient: entry.settings.performance_coefficient,
                    active: entry.settings.active,
                    zone: c.zone.clone(),
                    site: c.site.clone(),
                    registered: now < c.binding.expires_at,
                    expires_in: c.binding.expires_at.saturating_duration_since(now),
                    load: entry.load.as_ref().map(|(report, _)| report.clone()),
                    report_age: entry
                        .load
                        .as_ref()
                        .map(|(_, at)| now.saturating_duration_since(*at)),
                    stale: entry.is_stale(now),
                    subscription: entry.subscription.clone(),
                });
            }
        }
        rows
    }

    /// Per-MSR summaries at `now`, sorted by MSR name.
    pub fn msrs(&self, now: Instant) -> Vec<MsrView> {
        self.msrs
            .iter()
            .map(|(msr, entry)| MsrView {
                msr: msr.clone(),
                registered: entry
                    .contacts
                    .iter()
                    .filter_map(|c| self.contacts.get(c))
                    .any(|c| now < c.binding.expires_at),
                settings: entry.settings.clone(),
                subscription: entry.subscription.clone(),
            })
            .collect()
    }

    /// Contacts selection may use (SPEC §7 step 1): in `zone`, registered at
    /// `now`, and of an active MSR; sorted by contact name. Reads only the
    /// zone's index entry.
    pub fn candidates_in_zone<'a>(
        &'a self,
        zone: &str,
        now: Instant,
    ) -> impl Iterator<Item = Candidate<'a>> + 'a {
        self.by_zone
            .get(zone)
            .into_iter()
            .flatten()
            .filter_map(move |name| {
                let c = self.contacts.get(name)?;
                if now >= c.binding.expires_at {
                    return None;
                }
                let msr = self.msrs.get(&c.binding.msr)?;
                if !msr.settings.active {
                    return None;
                }
                Some(Candidate {
                    contact: name,
                    msr: &c.binding.msr,
                    uri: &c.binding.uri,
                    site: &c.site,
                    load: msr.load.as_ref().map(|(report, _)| report.load.min(100)),
                    stale: msr.is_stale(now),
                    performance_coefficient: msr.settings.performance_coefficient,
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(contact: &str, msr: &str, expires_at: Instant) -> ContactBinding {
        ContactBinding {
            contact: contact.into(),
            msr: msr.into(),
            uri: format!("sip:{msr}@127.0.0.1:5040"),
            version: Some("msr-agent 0.1.0".into()),
            expires_at,
        }
    }

    fn report(msr: &str, load: u8) -> LoadReport {
        LoadReport {
            msr: msr.into(),
            load,
            cpu: load,
            calls: 10,
            max_calls: 100,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn rows_show_expiry_age_and_staleness() {
        let now = Instant::now();
        let operator = OperatorConfig::new();
        let mut table = LoadTable::new("core1@ecss1".into());
        table.upsert_contact(
            binding("lo@msr_1", "msr_1", now + Duration::from_secs(60)),
            &operator,
            "default",
            "local",
        );
        table.set_load("msr_1", report("msr_1", 37), now);
        table.set_subscription(
            "msr_1",
            SubscriptionView {
                status: SubscriptionStatus::Active,
                expires_secs: 30,
                notify_count: 1,
                last_notify_unix: Some(1_700_000_000),
                event_id: "abc".into(),
            },
        );
        let rows = table.rows(now + Duration::from_secs(10));
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row.node, "core1@ecss1");
        assert_eq!((row.zone.as_str(), row.site.as_str()), ("default", "local"));
        assert!(row.registered);
        assert_eq!(row.expires_in, Duration::from_secs(50));
        assert_eq!(row.report_age, Some(Duration::from_secs(10)));
        assert!(!row.stale);
        let later = table.rows(now + Duration::from_secs(31));
        assert!(later[0].stale);
        let expired = table.rows(now + Duration::from_secs(61));
        assert!(!expired[0].registered);
        assert_eq!(expired[0].expires_in, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn load_is_per_msr_and_index_follows_operator() {
        let now = Instant::now();
        let mut operator = OperatorConfig::new();
        let mut table = LoadTable::new("n".into());
        let far = now + Duration::from_secs(600);
        table.upsert_contact(
            binding("eth0@msr_1", "msr_1", far),
            &operator,
            "default",
            "local",
        );
        table.upsert_contact(
            binding("eth1@msr_1", "msr_1", far),
            &operator,
            "default",
            "local",
        );
        table.set_load("msr_1", report("msr_1", 55), now);
        let loads: Vec<_> = table
            .candidates_in_zone("default", now)
            .map(|c| c.load)
            .collect();
        assert_eq!(loads, vec![Some(55), Some(55)]);

        operator
            .set_contact_zone("eth1@msr_1", "rtk")
            .expect("zone");
        operator
            .set_performance_coefficient("msr_1", 2.0)
            .expect("coef");
        table.apply_operator(&operator, "default", "local");
        let default: Vec<_> = table
            .candidates_in_zone("default", now)
            .map(|c| c.contact)
            .collect();
        assert_eq!(default, vec!["eth0@msr_1"]);
        let rtk: Vec<_> = table.candidates_in_zone("rtk", now).collect();
        assert_eq!(rtk.len(), 1);
        assert_eq!(rtk[0].performance_coefficient, 2.0);

        operator.set_active("msr_1", false).expect("active");
        table.apply_operator(&operator, "default", "local");
        assert_eq!(table.candidates_in_zone("default", now).count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn remove_contact_and_msr_clean_the_index() {
        let now = Instant::now();
        let operator = OperatorConfig::new();
        let mut table = LoadTable::new("n".into());
        let far = now + Duration::from_secs(600);
        table.upsert_contact(binding("a@msr_1", "msr_1", far), &operator, "z", "s");
        table.upsert_contact(binding("b@msr_1", "msr_1", far), &operator, "z", "s");
        table.upsert_contact(binding("a@msr_2", "msr_2", far), &operator, "z", "s");
        table.remove_contact("a@msr_1");
        assert_eq!(table.len(), 2);
        table.remove_msr("msr_1");
        assert_eq!(table.len(), 1);
        let left: Vec<_> = table
            .candidates_in_zone("z", now)
            .map(|c| c.contact)
            .collect();
        assert_eq!(left, vec!["a@msr_2"]);
        table.remove_msr("msr_2");
        assert!(table.by_zone.is_empty());
        assert!(table.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn expired_contacts_are_not_candidates() {
        let now = Instant::now();
        let operator = OperatorConfig::new();
        let mut table = LoadTable::new("n".into());
        table.upsert_contact(
            binding("a@msr_1", "msr_1", now + Duration::from_secs(5)),
            &operator,
            "z",
            "s",
        );
        assert_eq!(table.candidates_in_zone("z", now).count(), 1);
        assert_eq!(
            table
                .candidates_in_zone("z", now + Duration::from_secs(5))
                .count(),
            0
        );
        assert!(!table.msrs(now + Duration::from_secs(5))[0].registered);
    }

    #[test]
    fn subscription_status_display() {
        let shown: Vec<String> = [
            SubscriptionStatus::Pending,
            SubscriptionStatus::Active,
            SubscriptionStatus::Terminated("timeout".into()),
            SubscriptionStatus::Failed,
            SubscriptionStatus::None,
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(shown, ["pending", "active", "terminated", "failed", "none"]);
    }
}
