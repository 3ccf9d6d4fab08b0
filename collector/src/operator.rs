//! The operator configuration (SPEC §6): sites and distances, per-MSR
//! performance coefficient, admin active flag and subscription expiry, and
//! per-contact zone and site overrides.
//!
//! This is the single source of truth for everything the operator sets; the
//! load table ([`crate::load_table::LoadTable`]) holds a derived copy that is
//! refreshed with [`crate::load_table::LoadTable::apply_operator`] after
//! every change. Persisted by [`crate::store`]; the file format is private to
//! this module ([`OperatorConfig::encode`], [`OperatorConfig::decode`]).
//!
//! Architecture invariant: every value held here has been validated; a stored
//! file is re-validated value by value when it is decoded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::topology::{Topology, TopologyError};

/// Default performance coefficient of an MSR (SPEC §6).
pub const DEFAULT_PERFORMANCE_COEFFICIENT: f64 = 1.0;

/// Longest accepted MSR or contact name, in bytes.
pub const MAX_ENTITY_NAME_LEN: usize = 128;

/// The largest performance coefficient accepted (SPEC §6 says "any positive
/// number"; the bound keeps every weight, (100 − load) × coefficient, and
/// the sum of thousands of them far from overflowing an `f64`).
pub const MAX_PERFORMANCE_COEFFICIENT: f64 = 1_000_000.0;

/// The longest per-MSR subscription expiry, seconds (as `[subscription]
/// expires` of the collector config).
pub const MAX_SUBSCRIPTION_EXPIRES: u32 = 86_400;

/// Why an operator change was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    /// A site or distance change was refused.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The coefficient is zero, negative, NaN or infinite.
    #[error("invalid performance coefficient {value} for msr `{msr}`: expected a number above 0 and at most {MAX_PERFORMANCE_COEFFICIENT}")]
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
    /// An MSR or contact name is empty, too long or contains whitespace.
    #[error("invalid {what} name `{name}`: use 1 to 128 characters without whitespace")]
    InvalidName {
        /// `msr` or `contact`.
        what: &'static str,
        /// The rejected name.
        name: String,
    },
    /// A contact name is not `{iface}@{msr}` (SPEC §3), e.g. `bond1.2@msr_1`.
    #[error("invalid contact name `{name}`: expected IFACE@MSR, e.g. `bond1.2@msr_1` (see `msrctl resource list`)")]
    InvalidContact {
        /// The rejected name.
        name: String,
    },
    /// A zone label is empty, too long or contains whitespace or `/`.
    #[error("invalid zone `{name}`: use 1 to 64 characters without whitespace or `/`")]
    InvalidZone {
        /// The rejected zone.
        name: String,
    },
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
}

impl Default for MsrSettings {
    fn default() -> Self {
        Self {
            performance_coefficient: DEFAULT_PERFORMANCE_COEFFICIENT,
            active: true,
            subscription_expires: None,
        }
    }
}

/// What the operator set for one contact; `None` = collector default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContactSettings {
    /// Zone label override.
    pub zone: Option<String>,
    /// Site override (a declared site).
    pub site: Option<String>,
}

/// The operator configuration (SPEC §6).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperatorConfig {
    /// Sites and distances.
    topology: Topology,
    /// Settings of MSRs that differ from the defaults, by MSR name.
    msrs: BTreeMap<String, MsrSettings>,
    /// Zone/site overrides by contact name (`{iface}@{msr}`).
    contacts: BTreeMap<String, ContactSettings>,
}

fn check_entity_name(what: &'static str, name: &str) -> Result<(), OperatorError> {
    if name.is_empty()
        || name.len() > MAX_ENTITY_NAME_LEN
        || name.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(OperatorError::InvalidName {
            what,
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// Checks a contact name: a valid entity name of the form `{iface}@{msr}`.
fn check_contact_name(contact: &str) -> Result<(), OperatorError> {
    check_entity_name("contact", contact)?;
    match contact.split_once('@') {
        Some((iface, msr)) if !iface.is_empty() && !msr.is_empty() && !msr.contains('@') => Ok(()),
        _ => Err(OperatorError::InvalidContact {
            name: contact.to_owned(),
        }),
    }
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
    /// [`TopologyError::InvalidName`], [`TopologyError::SiteExists`].
    pub fn declare_site(&mut self, name: &str) -> Result<(), OperatorError> {
        Ok(self.topology.declare(name)?)
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

    fn update_msr(&mut self, msr: &str, change: impl FnOnce(&mut MsrSettings)) {
        let mut settings = self.msr(msr);
        change(&mut settings);
        if settings == MsrSettings::default() {
            self.msrs.remove(msr);
        } else {
            self.msrs.insert(msr.to_owned(), settings);
        }
    }

    /// Sets the performance coefficient; returns the previous one.
    ///
    /// # Errors
    /// [`OperatorError::InvalidCoefficient`] unless above 0 and at most
    /// [`MAX_PERFORMANCE_COEFFICIENT`];
    /// [`OperatorError::InvalidName`].
    pub fn set_performance_coefficient(
        &mut self,
        msr: &str,
        value: f64,
    ) -> Result<f64, OperatorError> {
        check_entity_name("msr", msr)?;
        if !(value > 0.0 && value <= MAX_PERFORMANCE_COEFFICIENT) {
            return Err(OperatorError::InvalidCoefficient {
                msr: msr.to_owned(),
                value,
            });
        }
        let previous = self.performance_coefficient(msr);
        self.update_msr(msr, |s| s.performance_coefficient = value);
        Ok(previous)
    }

    /// Sets the admin active flag; returns the previous one.
    ///
    /// # Errors
    /// [`OperatorError::InvalidName`].
    pub fn set_active(&mut self, msr: &str, active: bool) -> Result<bool, OperatorError> {
        check_entity_name("msr", msr)?;
        let previous = self.is_active(msr);
        self.update_msr(msr, |s| s.active = active);
        Ok(previous)
    }

    /// Sets the SUBSCRIBE `Expires` for one MSR, seconds; returns the
    /// previous override.
    ///
    /// # Errors
    /// [`OperatorError::InvalidExpires`] for 0; [`OperatorError::InvalidName`].
    pub fn set_subscription_expires(
        &mut self,
        msr: &str,
        secs: u32,
    ) -> Result<Option<u32>, OperatorError> {
        check_entity_name("msr", msr)?;
        if !(1..=MAX_SUBSCRIPTION_EXPIRES).contains(&secs) {
            return Err(OperatorError::InvalidExpires {
                msr: msr.to_owned(),
                value: secs,
            });
        }
        let previous = self.subscription_expires(msr);
        self.update_msr(msr, |s| s.subscription_expires = Some(secs));
        Ok(previous)
    }

    /// The contact's zone: the override, else `default_zone`.
    pub fn contact_zone<'a>(&'a self, contact: &str, default_zone: &'a str) -> &'a str {
        self.contacts
            .get(contact)
            .and_then(|c| c.zone.as_deref())
            .unwrap_or(default_zone)
    }

    /// The contact's site: the override, else `default_site`.
    pub fn contact_site<'a>(&'a self, contact: &str, default_site: &'a str) -> &'a str {
        self.contacts
            .get(contact)
            .and_then(|c| c.site.as_deref())
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
    /// [`OperatorError::InvalidName`], [`OperatorError::InvalidZone`].
    pub fn set_contact_zone(&mut self, contact: &str, zone: &str) -> Result<(), OperatorError> {
        check_contact_name(contact)?;
        if !crate::topology::is_valid_name(zone) {
            return Err(OperatorError::InvalidZone {
                name: zone.to_owned(),
            });
        }
        self.contacts.entry(contact.to_owned()).or_default().zone = Some(zone.to_owned());
        Ok(())
    }

    /// Sets the contact's site, which must be declared.
    ///
    /// # Errors
    /// [`OperatorError::InvalidName`], [`TopologyError::UnknownSite`].
    pub fn set_contact_site(&mut self, contact: &str, site: &str) -> Result<(), OperatorError> {
        check_contact_name(contact)?;
        if !self.topology.contains(site) {
            return Err(TopologyError::UnknownSite {
                name: site.to_owned(),
            }
            .into());
        }
        self.contacts.entry(contact.to_owned()).or_default().site = Some(site.to_owned());
        Ok(())
    }

    /// Encodes the configuration in the store's private format (JSON).
    pub(crate) fn encode(&self) -> String {
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
            msrs: self
                .msrs
                .iter()
                .map(|(name, s)| {
                    let stored = StoredMsr {
                        performance_coefficient: s.performance_coefficient,
                        active: s.active,
                        subscription_expires: s.subscription_expires,
                    };
                    (name.clone(), stored)
                })
                .collect(),
            contacts: self
                .contacts
                .iter()
                .map(|(name, c)| {
                    (
                        name.clone(),
                        StoredContact {
                            zone: c.zone.clone(),
                            site: c.site.clone(),
                        },
                    )
                })
                .collect(),
        };
        // Serializing plain structs of strings, numbers and maps with string
        // keys cannot fail; the fallback keeps this path panic-free.
        serde_json::to_string_pretty(&stored).unwrap_or_default()
    }

    /// Decodes and validates the store's private format.
    ///
    /// # Errors
    /// [`DecodeError`] when the text is not the format or a value is invalid.
    pub(crate) fn decode(text: &str) -> Result<Self, DecodeError> {
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
            config.declare_site(site)?;
        }
        for d in &stored.distances {
            config.set_distance(&d.a, &d.b, d.distance.unwrap_or(f64::INFINITY))?;
        }
        for (name, msr) in &stored.msrs {
            config.set_performance_coefficient(name, msr.performance_coefficient)?;
            config.set_active(name, msr.active)?;
            if let Some(secs) = msr.subscription_expires {
                config.set_subscription_expires(name, secs)?;
            }
        }
        for (name, contact) in &stored.contacts {
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
    msrs: BTreeMap<String, StoredMsr>,
    #[serde(default)]
    contacts: BTreeMap<String, StoredContact>,
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
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let config = OperatorConfig::new();
        assert_eq!(config.performance_coefficient("msr_1"), 1.0);
        assert!(config.is_active("msr_1"));
        assert_eq!(config.subscription_expires("msr_1"), None);
        assert_eq!(config.contact_zone("lo@msr_1", "default"), "default");
        assert_eq!(config.contact_site("lo@msr_1", "local"), "local");
    }

    #[test]
    fn coefficient_must_be_positive_and_bounded() {
        let mut config = OperatorConfig::new();
        for bad in [
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            1e308,
            MAX_PERFORMANCE_COEFFICIENT * 2.0,
        ] {
            assert!(matches!(
                config.set_performance_coefficient("msr_1", bad),
                Err(OperatorError::InvalidCoefficient { .. })
            ));
        }
        assert_eq!(config.set_performance_coefficient("msr_1", 2.0), Ok(1.0));
        assert_eq!(config.performance_coefficient("msr_1"), 2.0);
        // Back to the defaults leaves no entry behind.
        assert_eq!(config.set_performance_coefficient("msr_1", 1.0), Ok(2.0));
        assert_eq!(config.configured_msrs().count(), 0);
    }

    #[test]
    fn active_and_expires() {
        let mut config = OperatorConfig::new();
        assert_eq!(config.set_active("msr_1", false), Ok(true));
        assert!(!config.is_active("msr_1"));
        assert_eq!(config.set_subscription_expires("msr_1", 30), Ok(None));
        assert_eq!(config.subscription_expires("msr_1"), Some(30));
        assert!(matches!(
            config.set_subscription_expires("msr_1", 0),
            Err(OperatorError::InvalidExpires { .. })
        ));
        assert!(matches!(
            config.set_active("", true),
            Err(OperatorError::InvalidName { .. })
        ));
    }

    #[test]
    fn contact_site_must_be_declared_and_blocks_removal() {
        let mut config = OperatorConfig::new();
        assert!(matches!(
            config.set_contact_site("lo@msr_1", "remote"),
            Err(OperatorError::Topology(TopologyError::UnknownSite { .. }))
        ));
        config.declare_site("remote").expect("declare");
        config.set_contact_site("lo@msr_1", "remote").expect("set");
        config.set_contact_zone("lo@msr_1", "rtk").expect("set");
        assert_eq!(config.contact_site("lo@msr_1", "local"), "remote");
        assert_eq!(config.contact_zone("lo@msr_1", "default"), "rtk");
        assert!(matches!(
            config.remove_site("remote", |_| None),
            Err(OperatorError::Topology(TopologyError::SiteInUse { .. }))
        ));
        assert!(matches!(
            config.set_contact_zone("lo@msr_1", "a b"),
            Err(OperatorError::InvalidZone { .. })
        ));
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut config = OperatorConfig::new();
        for site in ["local", "remote", "remote_1"] {
            config.declare_site(site).expect("declare");
        }
        config.set_distance("local", "remote_1", 32.0).expect("set");
        config
            .set_distance("remote", "remote", f64::INFINITY)
            .expect("set");
        config.set_distance("local", "local", 2.5).expect("set");
        config
            .set_performance_coefficient("msr_1", 2.0)
            .expect("set");
        config.set_active("msr_2", false).expect("set");
        config.set_subscription_expires("msr_2", 30).expect("set");
        config
            .set_contact_site("bond1.2@msr_1", "remote")
            .expect("set");
        config
            .set_contact_zone("bond1.2@msr_2", "rtk")
            .expect("set");
        let text = config.encode();
        assert_eq!(OperatorConfig::decode(&text), Ok(config));
    }

    #[test]
    fn decode_rejects_invalid_values_and_unknown_fields() {
        let bad_coefficient =
            r#"{"version":1,"msrs":{"m":{"performance_coefficient":0.0,"active":true}}}"#;
        assert!(matches!(
            OperatorConfig::decode(bad_coefficient),
            Err(DecodeError::Invalid(_))
        ));
        assert!(matches!(
            OperatorConfig::decode(r#"{"version":1,"sitez":[]}"#),
            Err(DecodeError::Syntax(_))
        ));
        assert!(matches!(
            OperatorConfig::decode(r#"{"version":9}"#),
            Err(DecodeError::Version { .. })
        ));
        let bad_distance =
            r#"{"version":1,"sites":["a"],"distances":[{"a":"a","b":"b","distance":1}]}"#;
        assert!(matches!(
            OperatorConfig::decode(bad_distance),
            Err(DecodeError::Invalid(_))
        ));
    }
}
