//! The operator configuration (SPEC §6): sites and distances, per-MSR
//! performance coefficient, admin active flag and subscription expiry, and
//! per-contact zone and site overrides.
//!
//! This is the single source of truth for everything the operator sets; the
//! load table ([`crate::model::load_table::LoadTable`]) keeps in its selection
//! index what selection reads of it, refiled at every change
//! ([`crate::model::load_table::Change::OperatorChanged`]); the subscriber gets the
//! expires overrides a change touched
//! ([`OperatorConfig::subscription_expires_changes`]). Persisted by [`crate::operator::store`]; the file format is private to
//! this module (`OperatorConfig::encode`, `OperatorConfig::decode`).
//!
//! Architecture invariant: every value held here has been validated (names
//! by the rules of [`crate::operator::names`]); a stored file is re-validated value by
//! value when it is decoded, and an entry listed twice is refused.

pub mod cluster;
pub mod diff;
pub mod names;
pub mod store;
pub mod topology;

use std::collections::BTreeMap;

use msr_shared::admin::ContactProperty;
use msr_shared::present::format_number;
use serde::{Deserialize, Serialize};

use crate::operator::names::{ContactName, MsrName, NameError, SiteName, ZoneName};
use crate::operator::topology::{Topology, TopologyError, MAX_SITES};

/// Default performance coefficient of an MSR (SPEC §6).
pub const DEFAULT_PERFORMANCE_COEFFICIENT: f64 = 1.0;

/// The largest performance coefficient accepted (SPEC §6 says "any positive
/// number"; the bound keeps every weight, (100 − load) × coefficient, and
/// the sum of thousands of them far from overflowing an `f64`).
pub const MAX_PERFORMANCE_COEFFICIENT: f64 = 1_000_000.0;

/// The smallest performance coefficient accepted: a subnormal one (1e-320)
/// would make every weight of that MSR round to nothing against its
/// peers' and the pooled estimate divide by almost zero; a thousandth of
/// the default is far below any real server's relative capacity.
pub const MIN_PERFORMANCE_COEFFICIENT: f64 = 0.001;

/// The longest per-MSR subscription expiry, seconds (as `[subscription]
/// expires` of the collector config).
pub const MAX_SUBSCRIPTION_EXPIRES: u32 = 86_400;

/// An MSR's load limit when the operator set none (SPEC §9): 100 %, the
/// same bound §7's weights already imply.
pub const DEFAULT_LOAD_LIMIT: u8 = 100;

/// Why an operator change was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    /// A site or distance change was refused.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The coefficient is below [`MIN_PERFORMANCE_COEFFICIENT`], above
    /// [`MAX_PERFORMANCE_COEFFICIENT`], or NaN.
    #[error(
        "invalid performance coefficient {} for msr `{msr}`: expected a number from {} to {}",
        format_number(*value),
        format_number(MIN_PERFORMANCE_COEFFICIENT),
        format_number(MAX_PERFORMANCE_COEFFICIENT)
    )]
    InvalidCoefficient {
        /// MSR name.
        msr: String,
        /// The rejected value.
        value: f64,
    },
    /// The subscription expiry is 0 or above [`MAX_SUBSCRIPTION_EXPIRES`].
    #[error("invalid subscription expires {value} for msr `{msr}`: expected 1 to {MAX_SUBSCRIPTION_EXPIRES} seconds")]
    InvalidExpires {
        /// MSR name.
        msr: String,
        /// The rejected value, seconds.
        value: u32,
    },
    /// The load limit is outside 1–100 %.
    #[error("invalid load limit {value} for msr `{msr}`: expected 1 to 100 (percent)")]
    InvalidLoadLimit {
        /// MSR name.
        msr: String,
        /// The rejected value.
        value: u32,
    },
    /// An MSR, contact, zone or site name breaks the rules of
    /// [`crate::operator::names`].
    #[error(transparent)]
    Name(#[from] NameError),
}

/// What the operator set for one MSR.
#[derive(Debug, Clone, PartialEq)]
pub struct MsrSettings {
    /// Scales the MSR's weight in selection (SPEC §7 step 5); positive, finite.
    pub performance_coefficient: f64,
    /// Admin flag: `false` keeps every contact of the MSR out of selection.
    pub active: bool,
    /// `Expires` to request in SUBSCRIBE, seconds; `None` = collector default.
    pub subscription_expires: Option<u32>,
    /// The load at and above which the MSR takes no new leg, percent
    /// (SPEC §9); the conference thresholds are fractions of it. 1–100.
    pub load_limit: u8,
}

impl Default for MsrSettings {
    fn default() -> Self {
        Self {
            performance_coefficient: DEFAULT_PERFORMANCE_COEFFICIENT,
            active: true,
            subscription_expires: None,
            load_limit: DEFAULT_LOAD_LIMIT,
        }
    }
}

/// Where a contact is filed when the operator set no zone or site for it:
/// the collector's `[defaults]` (SPEC §6). The one record of the default
/// zone and site: the config's `[defaults]`, the load table, the control
/// handler and the redirect read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Zone of a contact without an override.
    pub zone: ZoneName,
    /// Site of a contact without an override.
    pub site: SiteName,
}

/// The zone of a contact when neither the operator nor `[defaults]` names one.
pub const DEFAULT_ZONE: &str = "default";
/// The site of a contact when neither the operator nor `[defaults]` names one.
pub const DEFAULT_SITE: &str = "local";

impl Default for Placement {
    /// [`DEFAULT_ZONE`] and [`DEFAULT_SITE`].
    fn default() -> Self {
        // Both are valid names (a unit test checks it), so this never
        // falls back.
        Self::new(DEFAULT_ZONE, DEFAULT_SITE).unwrap_or_else(|e| unreachable!("{e}"))
    }
}

impl Placement {
    /// The placement in `zone` at `site`.
    ///
    /// # Errors
    /// [`NameError`] when either name breaks its rules.
    pub fn new(zone: &str, site: &str) -> Result<Self, NameError> {
        Ok(Self {
            zone: ZoneName::new(zone)?,
            site: SiteName::new(site)?,
        })
    }
}

/// What the operator set for one contact; `None` = collector default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContactSettings {
    /// Zone label override.
    pub zone: Option<ZoneName>,
    /// Site override (a declared site).
    pub site: Option<SiteName>,
}

/// The operator configuration (SPEC §6).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperatorConfig {
    /// Sites and distances.
    topology: Topology,
    /// Settings of MSRs that differ from the defaults, by MSR name.
    msrs: BTreeMap<MsrName, MsrSettings>,
    /// Zone/site overrides by contact name (`{iface}@{msr}`).
    contacts: BTreeMap<ContactName, ContactSettings>,
}

impl OperatorConfig {
    /// An empty configuration: no sites, every MSR at its defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sites and distances.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Declares a site.
    ///
    /// # Errors
    /// [`TopologyError::Name`], [`TopologyError::SiteExists`],
    /// [`TopologyError::TooManySites`].
    pub fn declare_site(&mut self, name: &str) -> Result<(), OperatorError> {
        Ok(self.topology.declare(name)?)
    }

    /// This configuration with `site`, the collector's `[defaults] site`,
    /// declared: the site new contacts get must exist, or every leg at it
    /// is refused `unknown_site` until an operator declares it (SPEC §6).
    /// The one rule of both stores: the file store's at start, etcd's
    /// whenever the shared configuration lacks it (SPEC §12). `None` when
    /// it is declared already, or cannot be (only the site cap refuses it:
    /// the config checked the name), which is logged.
    pub fn with_default_site(&self, site: &SiteName) -> Option<Self> {
        if self.topology.contains(site) {
            return None;
        }
        let mut next = self.clone();
        match next.declare_site(site) {
            Ok(()) => {
                tracing::info!(%site, "declared the default site");
                Some(next)
            }
            Err(error) => {
                tracing::warn!(
                    %site,
                    %error,
                    "cannot declare the default site; new contacts' legs get unknown_site until it is"
                );
                None
            }
        }
    }

    /// Removes a site. Refused while a contact override names it or
    /// `live_referenced(name)` is true (the caller knows which live contacts
    /// use the site, e.g. through the default site).
    ///
    /// # Errors
    /// [`TopologyError::UnknownSite`], [`TopologyError::SiteInUse`].
    pub fn remove_site(
        &mut self,
        name: &str,
        live_referenced: impl Fn(&str) -> Option<String>,
    ) -> Result<(), OperatorError> {
        let contacts = &self.contacts;
        let referenced = |site: &str| {
            live_referenced(site).or_else(|| {
                contacts
                    .iter()
                    .find(|(_, settings)| settings.site.as_deref() == Some(site))
                    .map(|(contact, _)| {
                        format!("contact `{contact}` (msrctl resource set {contact} site …)")
                    })
            })
        };
        Ok(self.topology.remove(name, referenced)?)
    }

    /// Sets the symmetric distance between two declared sites; returns the
    /// previous one.
    ///
    /// # Errors
    /// [`TopologyError::UnknownSite`], [`TopologyError::InvalidDistance`].
    pub fn set_distance(&mut self, a: &str, b: &str, value: f64) -> Result<f64, OperatorError> {
        Ok(self.topology.set_distance(a, b, value)?)
    }

    /// The settings of an MSR (defaults when never set).
    pub fn msr(&self, msr: &str) -> MsrSettings {
        self.msrs.get(msr).cloned().unwrap_or_default()
    }

    /// MSRs with non-default settings, sorted by name.
    pub fn configured_msrs(&self) -> impl Iterator<Item = (&str, &MsrSettings)> + '_ {
        self.msrs
            .iter()
            .map(|(name, settings)| (name.as_str(), settings))
    }

    /// The MSR's performance coefficient (default 1.0).
    pub fn performance_coefficient(&self, msr: &str) -> f64 {
        self.msrs
            .get(msr)
            .map_or(DEFAULT_PERFORMANCE_COEFFICIENT, |s| {
                s.performance_coefficient
            })
    }

    /// The MSR's admin active flag (default true).
    pub fn is_active(&self, msr: &str) -> bool {
        self.msrs.get(msr).is_none_or(|s| s.active)
    }

    /// The `Expires` to request in SUBSCRIBE to this MSR, seconds, if the
    /// operator set one (SPEC §4, §8).
    pub fn subscription_expires(&self, msr: &str) -> Option<u32> {
        self.msrs.get(msr).and_then(|s| s.subscription_expires)
    }

    /// The MSRs whose SUBSCRIBE `Expires` differs between `previous` and
    /// this configuration, each with its value here: what a change of the
    /// configuration has to tell the subscriber, and nothing else.
    pub fn subscription_expires_changes<'a>(
        &'a self,
        previous: &'a OperatorConfig,
    ) -> impl Iterator<Item = (&'a MsrName, Option<u32>)> + 'a {
        let dropped = previous
            .msrs
            .iter()
            .filter(|(name, s)| s.subscription_expires.is_some() && !self.msrs.contains_key(*name))
            .map(|(name, _)| (name, None));
        let changed = self
            .msrs
            .iter()
            .filter(|(name, s)| previous.subscription_expires(name) != s.subscription_expires)
            .map(|(name, s)| (name, s.subscription_expires));
        dropped.chain(changed)
    }

    /// The MSR's load limit in percent (default [`DEFAULT_LOAD_LIMIT`]).
    pub fn load_limit(&self, msr: &str) -> u8 {
        self.msrs
            .get(msr)
            .map_or(DEFAULT_LOAD_LIMIT, |s| s.load_limit)
    }

    /// Sets the load limit (percent, 1–100); returns the previous one.
    ///
    /// # Errors
    /// [`OperatorError::InvalidLoadLimit`]; [`OperatorError::Name`].
    pub fn set_load_limit(&mut self, msr: &str, value: u32) -> Result<u8, OperatorError> {
        let msr = MsrName::new(msr)?;
        let limit = u8::try_from(value)
            .ok()
            .filter(|v| (1..=100).contains(v))
            .ok_or_else(|| OperatorError::InvalidLoadLimit {
                msr: msr.to_string(),
                value,
            })?;
        let previous = self.load_limit(&msr);
        self.update_msr(msr, |s| s.load_limit = limit);
        Ok(previous)
    }

    fn update_msr(&mut self, msr: MsrName, change: impl FnOnce(&mut MsrSettings)) {
        let mut settings = self.msr(&msr);
        change(&mut settings);
        if settings == MsrSettings::default() {
            self.msrs.remove(&msr);
        } else {
            self.msrs.insert(msr, settings);
        }
    }

    /// Sets the performance coefficient; returns the previous one.
    ///
    /// # Errors
    /// [`OperatorError::InvalidCoefficient`] unless from
    /// [`MIN_PERFORMANCE_COEFFICIENT`] to [`MAX_PERFORMANCE_COEFFICIENT`];
    /// [`OperatorError::Name`].
    pub fn set_performance_coefficient(
        &mut self,
        msr: &str,
        value: f64,
    ) -> Result<f64, OperatorError> {
        let msr = MsrName::new(msr)?;
        if !(MIN_PERFORMANCE_COEFFICIENT..=MAX_PERFORMANCE_COEFFICIENT).contains(&value) {
            return Err(OperatorError::InvalidCoefficient {
                msr: msr.to_string(),
                value,
            });
        }
        let previous = self.performance_coefficient(&msr);
        self.update_msr(msr, |s| s.performance_coefficient = value);
        Ok(previous)
    }

    /// Sets the admin active flag; returns the previous one.
    ///
    /// # Errors
    /// [`OperatorError::Name`].
    pub fn set_active(&mut self, msr: &str, active: bool) -> Result<bool, OperatorError> {
        let msr = MsrName::new(msr)?;
        let previous = self.is_active(&msr);
        self.update_msr(msr, |s| s.active = active);
        Ok(previous)
    }

    /// Sets the SUBSCRIBE `Expires` for one MSR, seconds; returns the
    /// previous override.
    ///
    /// # Errors
    /// [`OperatorError::InvalidExpires`] for 0; [`OperatorError::Name`].
    pub fn set_subscription_expires(
        &mut self,
        msr: &str,
        secs: u32,
    ) -> Result<Option<u32>, OperatorError> {
        let msr = MsrName::new(msr)?;
        if !(1..=MAX_SUBSCRIPTION_EXPIRES).contains(&secs) {
            return Err(OperatorError::InvalidExpires {
                msr: msr.to_string(),
                value: secs,
            });
        }
        let previous = self.subscription_expires(&msr);
        self.update_msr(msr, |s| s.subscription_expires = Some(secs));
        Ok(previous)
    }

    /// The contact's zone: the override, else `default_zone`.
    pub fn contact_zone<'a>(&'a self, contact: &str, default_zone: &'a ZoneName) -> &'a ZoneName {
        self.contacts
            .get(contact)
            .and_then(|c| c.zone.as_ref())
            .unwrap_or(default_zone)
    }

    /// The contact's site: the override, else `default_site`.
    pub fn contact_site<'a>(&'a self, contact: &str, default_site: &'a SiteName) -> &'a SiteName {
        self.contacts
            .get(contact)
            .and_then(|c| c.site.as_ref())
            .unwrap_or(default_site)
    }

    /// Contacts with overrides, sorted by name.
    pub fn configured_contacts(&self) -> impl Iterator<Item = (&str, &ContactSettings)> + '_ {
        self.contacts
            .iter()
            .map(|(name, settings)| (name.as_str(), settings))
    }

    /// Sets the contact's zone.
    ///
    /// # Errors
    /// [`OperatorError::Name`].
    pub fn set_contact_zone(&mut self, contact: &str, zone: &str) -> Result<(), OperatorError> {
        let contact = ContactName::new(contact)?;
        let zone = ZoneName::new(zone)?;
        self.contacts.entry(contact).or_default().zone = Some(zone);
        Ok(())
    }

    /// Sets the contact's site, which must be declared.
    ///
    /// # Errors
    /// [`OperatorError::Name`] for the contact, [`TopologyError::Name`]
    /// for the site, [`TopologyError::UnknownSite`].
    pub fn set_contact_site(&mut self, contact: &str, site: &str) -> Result<(), OperatorError> {
        let contact = ContactName::new(contact)?;
        let site = SiteName::new(site).map_err(TopologyError::from)?;
        if !self.topology.contains(&site) {
            return Err(TopologyError::UnknownSite {
                name: site.to_string(),
            }
            .into());
        }
        self.contacts.entry(contact).or_default().site = Some(site);
        Ok(())
    }

    /// Removes the contact's zone or site override (`property`); the
    /// contact then takes the collector's default. Returns
    /// whether there was one. A contact left without overrides is
    /// forgotten.
    ///
    /// # Errors
    /// [`OperatorError::Name`] for a contact name that breaks the rules.
    pub fn unset_contact(
        &mut self,
        contact: &str,
        property: ContactProperty,
    ) -> Result<bool, OperatorError> {
        ContactName::new(contact)?;
        let Some(settings) = self.contacts.get_mut(contact) else {
            return Ok(false);
        };
        let had = match property {
            ContactProperty::Site => settings.site.take().is_some(),
            ContactProperty::Zone => settings.zone.take().is_some(),
        };
        if settings.zone.is_none() && settings.site.is_none() {
            self.contacts.remove(contact);
        }
        Ok(had)
    }

    /// Encodes the configuration in the store's private format (JSON).
    /// Public (hidden) only for the fuzz target `operator_store` (fuzz/).
    #[doc(hidden)]
    pub fn encode(&self) -> String {
        let stored = StoredConfig {
            version: STORE_VERSION,
            sites: self.topology.sites().map(str::to_owned).collect(),
            distances: self
                .topology
                .explicit_distances()
                .map(|(a, b, value)| StoredDistance {
                    a: a.to_owned(),
                    b: b.to_owned(),
                    distance: value.is_finite().then_some(value),
                })
                .collect(),
            msrs: Entries(
                self.msrs
                    .iter()
                    .map(|(name, s)| {
                        let stored = StoredMsr {
                            performance_coefficient: s.performance_coefficient,
                            active: s.active,
                            subscription_expires: s.subscription_expires,
                            load_limit: (s.load_limit != DEFAULT_LOAD_LIMIT)
                                .then_some(s.load_limit),
                        };
                        (name.to_string(), stored)
                    })
                    .collect(),
            ),
            contacts: Entries(
                self.contacts
                    .iter()
                    .map(|(name, c)| {
                        (
                            name.to_string(),
                            StoredContact {
                                zone: c.zone.as_ref().map(ToString::to_string),
                                site: c.site.as_ref().map(ToString::to_string),
                            },
                        )
                    })
                    .collect(),
            ),
        };
        // Serializing plain structs of strings, numbers and maps with string
        // keys cannot fail; the fallback keeps this path panic-free.
        serde_json::to_string_pretty(&stored).unwrap_or_default()
    }

    /// Decodes and validates the store's private format.
    ///
    /// A hand-edited file is read strictly: a site, MSR or contact listed
    /// twice, or two `distances` entries for the same pair of sites (in
    /// either order), are refused rather than letting the last one win. A
    /// file with more than [`MAX_SITES`] sites (written before the cap)
    /// loads, with a warning: the operator's state is kept, and
    /// `site declare` is refused until sites are removed.
    ///
    /// # Errors
    /// [`DecodeError`] when the text is not the format, an entry is listed
    /// twice or a value is invalid.
    #[doc(hidden)]
    pub fn decode(text: &str) -> Result<Self, DecodeError> {
        let stored: StoredConfig =
            serde_json::from_str(text).map_err(|e| DecodeError::Syntax(e.to_string()))?;
        if stored.version != STORE_VERSION {
            return Err(DecodeError::Version {
                found: stored.version,
                expected: STORE_VERSION,
            });
        }
        let mut config = OperatorConfig::new();
        for site in &stored.sites {
            if config.topology.contains(site) {
                return Err(DecodeError::Duplicate {
                    section: "sites",
                    name: site.clone(),
                });
            }
            config
                .topology
                .declare_uncapped(site)
                .map_err(OperatorError::from)?;
        }
        if stored.sites.len() > MAX_SITES {
            tracing::warn!(
                sites = stored.sites.len(),
                max = MAX_SITES,
                "the operator store holds more sites than allowed; they are kept, \
                 but site declare is refused until sites are removed (msrctl site remove)"
            );
        }
        let mut pairs: BTreeMap<(&str, &str), DistanceEntry> = BTreeMap::new();
        for (index, d) in stored.distances.iter().enumerate() {
            let entry = DistanceEntry {
                index,
                a: d.a.clone(),
                b: d.b.clone(),
                distance: d.distance.unwrap_or(f64::INFINITY),
            };
            let pair = if d.a <= d.b {
                (d.a.as_str(), d.b.as_str())
            } else {
                (d.b.as_str(), d.a.as_str())
            };
            if let Some(first) = pairs.get(&pair) {
                return Err(DecodeError::DuplicateDistance {
                    first: Box::new(first.clone()),
                    second: Box::new(entry),
                });
            }
            config.set_distance(&d.a, &d.b, entry.distance)?;
            pairs.insert(pair, entry);
        }
        for (section, entries) in [
            ("msrs", stored.msrs.names()),
            ("contacts", stored.contacts.names()),
        ] {
            let mut seen = std::collections::BTreeSet::new();
            if let Some(name) = entries.into_iter().find(|name| !seen.insert(*name)) {
                return Err(DecodeError::Duplicate {
                    section,
                    name: name.to_owned(),
                });
            }
        }
        for (name, msr) in &stored.msrs.0 {
            config.set_performance_coefficient(name, msr.performance_coefficient)?;
            config.set_active(name, msr.active)?;
            if let Some(secs) = msr.subscription_expires {
                config.set_subscription_expires(name, secs)?;
            }
            if let Some(limit) = msr.load_limit {
                config.set_load_limit(name, u32::from(limit))?;
            }
        }
        for (name, contact) in &stored.contacts.0 {
            if let Some(zone) = &contact.zone {
                config.set_contact_zone(name, zone)?;
            }
            if let Some(site) = &contact.site {
                config.set_contact_site(name, site)?;
            }
        }
        Ok(config)
    }
}

/// Why a stored configuration could not be decoded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not JSON of the expected shape.
    #[error("{0}")]
    Syntax(String),
    /// Written by an incompatible version.
    #[error("format version {found}, expected {expected}")]
    Version {
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        expected: u32,
    },
    /// A value is invalid.
    #[error(transparent)]
    Invalid(#[from] OperatorError),
    /// A site, MSR or contact is listed twice.
    #[error("`{section}` lists `{name}` twice; keep one")]
    Duplicate {
        /// `sites`, `msrs` or `contacts`.
        section: &'static str,
        /// The name listed twice.
        name: String,
    },
    /// Two `distances` entries set the distance between the same two sites
    /// (in the same or the other order).
    #[error("{first} and {second} set the distance between the same two sites; keep one")]
    DuplicateDistance {
        /// The earlier entry.
        first: Box<DistanceEntry>,
        /// The later entry.
        second: Box<DistanceEntry>,
    },
}

/// One entry of the stored `distances` list, as a [`DecodeError`] names it.
#[derive(Debug, Clone, PartialEq)]
pub struct DistanceEntry {
    /// Its position in the list, from 0.
    pub index: usize,
    /// First site.
    pub a: String,
    /// Second site.
    pub b: String,
    /// The distance (infinite for `null`).
    pub distance: f64,
}

impl std::fmt::Display for DistanceEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`distances[{}]` (`{}`/`{}` ", self.index, self.a, self.b)?;
        if self.distance.is_finite() {
            write!(f, "{})", self.distance)
        } else {
            f.write_str("infinity)")
        }
    }
}

/// Version of the store format written by this build.
const STORE_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredConfig {
    version: u32,
    #[serde(default)]
    sites: Vec<String>,
    #[serde(default)]
    distances: Vec<StoredDistance>,
    #[serde(default)]
    msrs: Entries<StoredMsr>,
    #[serde(default)]
    contacts: Entries<StoredContact>,
}

/// A JSON object's entries in file order, duplicate keys kept (serde's maps
/// keep the last of them silently; `decode` refuses them).
struct Entries<T>(Vec<(String, T)>);

impl<T> Default for Entries<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T> Entries<T> {
    fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_str()).collect()
    }
}

impl<T: Serialize> Serialize for Entries<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Entries<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visitor<T> {
            type Value = Entries<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(Visitor(std::marker::PhantomData))
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredDistance {
    a: String,
    b: String,
    /// `None` = infinity.
    distance: Option<f64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredMsr {
    performance_coefficient: f64,
    active: bool,
    #[serde(default)]
    subscription_expires: Option<u32>,
    /// Absent: the default (stores written before load limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    load_limit: Option<u8>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredContact {
    #[serde(default)]
    zone: Option<String>,
    #[serde(default)]
    site: Option<String>,
}

#[cfg(test)]
mod tests;
