//! Sites and the site distance matrix (SPEC §6).
//!
//! Sites are declared and removed by name (the rules of [`crate::operator::names`]), at
//! most [`MAX_SITES`] of them. The distance between two sites is
//! a non-negative finite number or infinity; distances are symmetric. A site's
//! distance to itself defaults to 0 and can be changed (raising it drains the
//! site); an unset pair is infinite: that site's MSRs never serve the other's
//! subscribers.
//!
//! Architecture invariant: no I/O, no clock. Stored as a set of names plus the
//! pairs that differ from the default, in both directions; `set_distance`
//! writes both, so symmetry holds by construction. Only declared sites appear
//! in the stored pairs (`set_distance` checks, `remove` drops them), so a
//! site absent from a declared site's row is either undeclared or unset:
//! infinite either way, unless it is the site itself (0).
//!
//! Selection reads distances from one leg site to many contact sites:
//! [`Topology::distances_from`] resolves that site's row once per query.

use std::collections::{BTreeMap, BTreeSet};

use msr_shared::present::format_number;

use crate::operator::names::{NameError, SiteName};

/// Why a topology change was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// The site is not declared.
    #[error("site `{name}` is not declared")]
    UnknownSite {
        /// Site name.
        name: String,
    },
    /// The site is already declared.
    #[error("site `{name}` is already declared")]
    SiteExists {
        /// Site name.
        name: String,
    },
    /// The name breaks the site name rules ([`crate::operator::names`]).
    #[error(transparent)]
    Name(#[from] NameError),
    /// [`MAX_SITES`] sites are declared already.
    #[error("cannot declare site `{name}`: {declared} sites are declared and at most {max} are allowed; remove one first (msrctl site remove)")]
    TooManySites {
        /// The site that was to be declared.
        name: String,
        /// How many sites are declared.
        declared: usize,
        /// The cap, [`MAX_SITES`].
        max: usize,
    },
    /// The distance is negative or NaN.
    #[error(
        "invalid distance {} between `{a}` and `{b}`: expected a non-negative number or infinity",
        format_number(*value)
    )]
    InvalidDistance {
        /// First site.
        a: String,
        /// Second site.
        b: String,
        /// The rejected value.
        value: f64,
    },
    /// A contact still refers to the site.
    #[error("site `{name}` is still used by {by}")]
    SiteInUse {
        /// What uses it, e.g. "contact `lo@msr_1`".
        by: String,
        /// Site name.
        name: String,
    },
}

/// The most sites [`Topology::declare`] accepts.
///
/// The distance matrix grows with the square of the sites, and the
/// collector's main loop builds `site matrix` and saves the store between
/// SIP events. With 256 sites, every pair set, `site matrix` is 65,536
/// cells (about 330 KB of JSON, some 40 ms) and the store about 3 MB (some
/// 15 ms to encode); twice the sites would be four times that. A store that
/// holds more sites (written before the cap) still loads, with a warning,
/// so no operator setting is lost; `site declare` is then refused until
/// sites are removed below the cap.
pub const MAX_SITES: usize = 256;

/// Declared sites and their distances (SPEC §6).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Topology {
    /// Declared site names.
    sites: BTreeSet<SiteName>,
    /// Distances that differ from the default, stored in both directions
    /// (`distances[a][b] == distances[b][a]`) so a lookup needs no
    /// allocation. Absent: 0 for a site to itself, infinity otherwise.
    /// Values are non-negative, possibly infinite (only for a site to itself).
    distances: BTreeMap<SiteName, BTreeMap<SiteName, f64>>,
}

impl Topology {
    /// An empty topology.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares a site.
    ///
    /// # Errors
    /// [`TopologyError::Name`], [`TopologyError::SiteExists`],
    /// [`TopologyError::TooManySites`] when [`MAX_SITES`] are declared.
    pub fn declare(&mut self, name: &str) -> Result<(), TopologyError> {
        let name = SiteName::new(name)?;
        if self.sites.len() >= MAX_SITES && !self.sites.contains(&name) {
            return Err(TopologyError::TooManySites {
                name: name.to_string(),
                declared: self.sites.len(),
                max: MAX_SITES,
            });
        }
        self.insert(name)
    }

    /// Declares a site without the [`MAX_SITES`] cap: for a stored
    /// configuration written before the cap, which must not be lost.
    ///
    /// # Errors
    /// [`TopologyError::Name`], [`TopologyError::SiteExists`].
    pub(crate) fn declare_uncapped(&mut self, name: &str) -> Result<(), TopologyError> {
        self.insert(SiteName::new(name)?)
    }

    fn insert(&mut self, name: SiteName) -> Result<(), TopologyError> {
        if self.sites.contains(&name) {
            return Err(TopologyError::SiteExists {
                name: name.to_string(),
            });
        }
        self.sites.insert(name);
        Ok(())
    }

    /// Removes a site and every distance that involves it. Refused while
    /// `referenced_by(name)` names a user of the site (a contact still
    /// carries it).
    ///
    /// # Errors
    /// [`TopologyError::UnknownSite`], [`TopologyError::SiteInUse`].
    pub fn remove(
        &mut self,
        name: &str,
        referenced_by: impl Fn(&str) -> Option<String>,
    ) -> Result<(), TopologyError> {
        if !self.sites.contains(name) {
            return Err(TopologyError::UnknownSite {
                name: name.to_owned(),
            });
        }
        if let Some(by) = referenced_by(name) {
            return Err(TopologyError::SiteInUse {
                name: name.to_owned(),
                by,
            });
        }
        self.sites.remove(name);
        self.distances.remove(name);
        for row in self.distances.values_mut() {
            row.remove(name);
        }
        self.distances.retain(|_, row| !row.is_empty());
        Ok(())
    }

    /// Whether the site is declared.
    pub fn contains(&self, name: &str) -> bool {
        self.sites.contains(name)
    }

    /// Declared sites, sorted by name.
    pub fn sites(&self) -> impl Iterator<Item = &str> + '_ {
        self.sites.iter().map(SiteName::as_str)
    }

    /// Number of declared sites.
    pub fn len(&self) -> usize {
        self.sites.len()
    }

    /// Whether no site is declared.
    pub fn is_empty(&self) -> bool {
        self.sites.is_empty()
    }

    /// Sets the distance between two declared sites (both directions);
    /// `f64::INFINITY` unsets a pair. Returns the previous distance.
    ///
    /// # Errors
    /// [`TopologyError::UnknownSite`], [`TopologyError::InvalidDistance`]
    /// (negative or NaN).
    pub fn set_distance(&mut self, a: &str, b: &str, value: f64) -> Result<f64, TopologyError> {
        let declared = |name: &str| match self.sites.get(name) {
            Some(site) => Ok(site.clone()),
            None => Err(TopologyError::UnknownSite {
                name: name.to_owned(),
            }),
        };
        let (site_a, site_b) = (declared(a)?, declared(b)?);
        if value.is_nan() || value < 0.0 {
            return Err(TopologyError::InvalidDistance {
                a: a.to_owned(),
                b: b.to_owned(),
                value,
            });
        }
        let previous = self.distance_unchecked(a, b);
        let default = if a == b { 0.0 } else { f64::INFINITY };
        if value == default {
            for (x, y) in [(a, b), (b, a)] {
                if let Some(row) = self.distances.get_mut(x) {
                    row.remove(y);
                    if row.is_empty() {
                        self.distances.remove(x);
                    }
                }
            }
        } else {
            for (x, y) in [(&site_a, &site_b), (&site_b, &site_a)] {
                self.distances
                    .entry(x.clone())
                    .or_default()
                    .insert(y.clone(), value);
            }
        }
        Ok(previous)
    }

    /// The distance between two sites; `None` if either is not declared.
    pub fn distance(&self, a: &str, b: &str) -> Option<f64> {
        if self.sites.contains(b) {
            self.distances_from(a).map(|row| row.to(b))
        } else {
            None
        }
    }

    /// The distances from a declared site to every other, resolved once for
    /// many lookups; `None` if `site` is not declared.
    pub fn distances_from<'a>(&'a self, site: &'a str) -> Option<SiteDistances<'a>> {
        if self.sites.contains(site) {
            Some(self.distances_from_unchecked(site))
        } else {
            None
        }
    }

    /// Like [`Topology::distances_from`] without checking that `site` is
    /// declared (an undeclared pair reads as its default).
    fn distances_from_unchecked<'a>(&'a self, site: &'a str) -> SiteDistances<'a> {
        SiteDistances {
            site,
            row: self.distances.get(site),
        }
    }

    /// The distance between two declared sites, without checking that they
    /// are declared (an undeclared pair reads as its default).
    fn distance_unchecked(&self, a: &str, b: &str) -> f64 {
        self.distances_from_unchecked(a).to(b)
    }

    /// Every stored distance that differs from its default, as
    /// `(a, b, distance)` with `a <= b`.
    pub fn explicit_distances(&self) -> impl Iterator<Item = (&str, &str, f64)> + '_ {
        self.distances.iter().flat_map(|(a, row)| {
            row.iter()
                .filter(move |(b, _)| a <= *b)
                .map(move |(b, value)| (a.as_str(), b.as_str(), *value))
        })
    }
}

/// The distances from one declared site (see [`Topology::distances_from`]).
#[derive(Debug, Clone, Copy)]
pub struct SiteDistances<'a> {
    /// The site the distances are from.
    site: &'a str,
    /// Its stored distances that differ from the default, if any.
    row: Option<&'a BTreeMap<SiteName, f64>>,
}

impl SiteDistances<'_> {
    /// The distance to `other`: the stored value, else 0 to the site itself,
    /// else infinity (an unset pair or an undeclared `other`).
    pub fn to(&self, other: &str) -> f64 {
        match self.row.and_then(|row| row.get(other)) {
            Some(value) => *value,
            None if other == self.site => 0.0,
            None => f64::INFINITY,
        }
    }

    /// Every site at a finite distance, each once, with that distance; every
    /// other site (declared or not) is at infinity.
    pub fn finite(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        // The row's own values: every selection reads them, and a second
        // lookup per site would compare its name again.
        let others = self
            .row
            .into_iter()
            .flat_map(|row| row.iter())
            .map(|(site, distance)| (site.as_str(), *distance))
            .filter(move |(site, _)| *site != self.site);
        std::iter::once((self.site, self.to(self.site)))
            .chain(others)
            .filter(|(_, distance)| distance.is_finite())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sites(names: &[&str]) -> Topology {
        let mut topology = Topology::new();
        for name in names {
            topology.declare(name).expect("declare");
        }
        topology
    }

    #[test]
    fn defaults_own_zero_other_infinite() {
        let topology = sites(&["local", "remote"]);
        assert_eq!(topology.distance("local", "local"), Some(0.0));
        assert_eq!(topology.distance("local", "remote"), Some(f64::INFINITY));
        assert_eq!(topology.distance("local", "nowhere"), None);
    }

    #[test]
    fn distance_is_symmetric_and_resettable() {
        let mut topology = sites(&["local", "remote"]);
        assert_eq!(
            topology.set_distance("remote", "local", 32.0),
            Ok(f64::INFINITY)
        );
        assert_eq!(topology.distance("local", "remote"), Some(32.0));
        assert_eq!(topology.distance("remote", "local"), Some(32.0));
        assert_eq!(
            topology.set_distance("local", "remote", f64::INFINITY),
            Ok(32.0)
        );
        assert_eq!(topology.explicit_distances().count(), 0);
    }

    #[test]
    fn own_distance_can_be_raised_to_drain() {
        let mut topology = sites(&["local"]);
        topology.set_distance("local", "local", 100.0).expect("set");
        assert_eq!(topology.distance("local", "local"), Some(100.0));
        topology
            .set_distance("local", "local", f64::INFINITY)
            .expect("set");
        assert_eq!(topology.distance("local", "local"), Some(f64::INFINITY));
        topology.set_distance("local", "local", 0.0).expect("set");
        assert_eq!(topology.explicit_distances().count(), 0);
    }

    #[test]
    fn invalid_distances_are_refused() {
        let mut topology = sites(&["a", "b"]);
        for value in [-1.0, f64::NAN, f64::NEG_INFINITY] {
            assert!(matches!(
                topology.set_distance("a", "b", value),
                Err(TopologyError::InvalidDistance { .. })
            ));
        }
        assert_eq!(
            topology.set_distance("a", "c", 1.0),
            Err(TopologyError::UnknownSite { name: "c".into() })
        );
    }

    #[test]
    fn declare_twice_and_bad_names_are_refused() {
        let mut topology = sites(&["a"]);
        assert_eq!(
            topology.declare("a"),
            Err(TopologyError::SiteExists { name: "a".into() })
        );
        for bad in [
            "",
            "a b",
            "a/b",
            &"x".repeat(65),
            "\u{200B}",
            "a\u{202E}b",
            "\u{FEFF}x",
        ] {
            assert!(matches!(topology.declare(bad), Err(TopologyError::Name(_))));
        }
    }

    #[test]
    fn declaring_beyond_the_cap_is_refused() {
        let mut topology = Topology::new();
        for i in 0..MAX_SITES {
            topology.declare(&format!("s{i}")).expect("declare");
        }
        let err = topology.declare("one_more").expect_err("over the cap");
        assert_eq!(
            err,
            TopologyError::TooManySites {
                name: "one_more".into(),
                declared: MAX_SITES,
                max: MAX_SITES,
            }
        );
        assert!(
            err.to_string()
                .contains(&format!("at most {MAX_SITES} are allowed")),
            "{err}"
        );
        // A site already declared is still reported as such.
        assert_eq!(
            topology.declare("s0"),
            Err(TopologyError::SiteExists { name: "s0".into() })
        );
        // Removing one makes room again.
        topology.remove("s0", |_| None).expect("remove");
        topology.declare("one_more").expect("declare");
    }

    #[test]
    fn remove_drops_distances_and_respects_references() {
        let mut topology = sites(&["a", "b", "c"]);
        topology.set_distance("a", "b", 1.0).expect("set");
        topology.set_distance("b", "c", 2.0).expect("set");
        assert_eq!(
            topology.remove("b", |s| (s == "b").then(|| "contact `x@m`".to_owned())),
            Err(TopologyError::SiteInUse {
                name: "b".into(),
                by: "contact `x@m`".into()
            })
        );
        assert_eq!(topology.distance("a", "b"), Some(1.0));
        topology.remove("b", |_| None).expect("remove");
        assert!(!topology.contains("b"));
        assert_eq!(topology.explicit_distances().count(), 0);
        // Declaring it again starts from the defaults.
        topology.declare("b").expect("declare");
        assert_eq!(topology.distance("a", "b"), Some(f64::INFINITY));
        assert_eq!(
            topology.remove("zz", |_| None),
            Err(TopologyError::UnknownSite { name: "zz".into() })
        );
    }
}
