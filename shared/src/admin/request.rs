//! The requests: one op per JSON line (SPEC §8).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::present::{format_number, normalize_zero};

/// One control request (one JSON line).
///
/// Unknown fields are refused for every op, including the ops without
/// fields (`{"op":"msr_list","x":1}` is a `bad_request`): those are empty
/// struct variants (`MsrList {}`), because serde ignores extra fields of a
/// unit variant of an internally tagged enum even with
/// `deny_unknown_fields`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Declare a site (SPEC §6). Declaring an existing site is refused.
    SiteDeclare {
        /// Site name.
        name: String,
    },
    /// Remove a site and its distances. Refused while a contact refers to it.
    SiteRemove {
        /// Site name.
        name: String,
    },
    /// List declared sites, sorted by name.
    SiteList {},
    /// List the zones, sorted by name (SPEC §6: a zone is a label, never
    /// declared): the collector's default zone and every zone a contact is
    /// in or set to.
    ZoneList {},
    /// Set the distance between two declared sites (symmetric; `a == b`
    /// sets the site's own distance).
    SiteDistance {
        /// First site.
        a: String,
        /// Second site.
        b: String,
        /// The new distance, non-negative or infinity.
        distance: Distance,
    },
    /// Show the distance matrix: every site is a row; the columns are the
    /// named sites (all sites when `names` is empty).
    SiteMatrix {
        /// Sites to show as columns; empty = all (optional on the wire).
        #[serde(default)]
        names: Vec<String>,
    },
    /// Set an MSR's performance coefficient (SPEC §6; positive, finite).
    MsrSetPerformanceCoefficient {
        /// MSR name.
        msr: String,
        /// The new coefficient.
        value: f64,
    },
    /// Set an MSR's admin active flag (SPEC §6).
    MsrSetActive {
        /// MSR name.
        msr: String,
        /// `false` takes every contact of the MSR out of selection.
        active: bool,
    },
    /// List MSRs (known from registration or from operator configuration).
    MsrList {},
    /// Forget an MSR that is gone (SPEC §14 "nothing vanishes": it stays
    /// listed until it registers again or the operator forgets it);
    /// answered with the MSR list.
    MsrForget {
        /// MSR name.
        msr: String,
    },
    /// List the live load table (SPEC §5).
    ResourceList {
        /// Only rows that selection may use (registered and active); optional
        /// on the wire, default `false`.
        #[serde(default)]
        active_only: bool,
    },
    /// Set the zone of one contact (`{iface}@{msr}`).
    ResourceSetZone {
        /// Contact name, e.g. `bond1.2@msr_1`.
        contact: String,
        /// Zone label.
        zone: String,
    },
    /// Set the site of one contact (`{iface}@{msr}`); the site must be declared.
    ResourceSetSite {
        /// Contact name, e.g. `bond1.2@msr_1`.
        contact: String,
        /// Site name.
        site: String,
    },
    /// Remove the operator's zone or site of one contact: it falls back to
    /// the collector's `[defaults]`.
    ResourceUnset {
        /// Contact name, e.g. `bond1.2@msr_1`.
        contact: String,
        /// `zone` or `site`.
        property: ContactProperty,
    },
    /// Set the `Expires` the collector requests in SUBSCRIBE for one MSR (SPEC §4).
    SubscriptionSetExpires {
        /// MSR name.
        msr: String,
        /// Event package; only `eltex-call-count` is accepted.
        event: String,
        /// Seconds, at least 1; `expires` on the wire.
        #[serde(rename = "expires")]
        expires_secs: u32,
    },
    /// List the load subscriptions, one row per MSR.
    SubscriptionList {},
    /// Set an MSR's load limit, percent (SPEC §9): it takes no new leg at
    /// or above it; the conference thresholds are fractions of it.
    MsrSetLoadLimit {
        /// MSR name.
        msr: String,
        /// 1–100.
        value: u32,
    },
    /// Run a selection (SPEC §7); with `call_id`, for that leg (SPEC §9):
    /// a live leg gets its MSR again, a new one is bound to the choice.
    Select(SelectQuery),
    /// End a leg (SPEC §9): `leg` given, that leg of the Call-ID; absent,
    /// every leg of it. Idempotent: what is not live is left alone.
    Release {
        /// The SIP Call-ID.
        call_id: String,
        /// The leg label (optional on the wire).
        leg: Option<String>,
    },
    /// The live legs (SPEC §9), oldest first, so an operator can find
    /// and release leaked ones: those on `msr` only, those at least
    /// `older_than_secs` old only, at most `limit` rows (default
    /// [`DEFAULT_LEG_LIST_LIMIT`](super::DEFAULT_LEG_LIST_LIMIT), at most
    /// [`MAX_LEG_LIST_LIMIT`](super::MAX_LEG_LIST_LIMIT)).
    LegList {
        /// Only legs on this MSR (optional).
        #[serde(default)]
        msr: Option<String>,
        /// Only legs at least this many seconds old (optional).
        #[serde(default)]
        older_than_secs: Option<u64>,
        /// The most rows answered (optional).
        #[serde(default)]
        limit: Option<u32>,
    },
    /// The core hosts of the cluster and the state of the operator store
    /// (SPEC §12): one row per live collector (lease-backed membership in
    /// etcd; this collector alone with the file store).
    ClusterList {},
    /// The protocol version the collector speaks ([`PROTOCOL_VERSION`](super::PROTOCOL_VERSION)),
    /// so that a client can check it before anything else.
    Hello {},
}

impl Request {
    /// Whether the request changes the operator configuration (and is
    /// therefore persisted before it is acknowledged).
    pub fn is_mutation(&self) -> bool {
        matches!(
            self,
            Request::SiteDeclare { .. }
                | Request::SiteRemove { .. }
                | Request::SiteDistance { .. }
                | Request::MsrSetPerformanceCoefficient { .. }
                | Request::MsrSetActive { .. }
                | Request::ResourceSetZone { .. }
                | Request::ResourceSetSite { .. }
                | Request::ResourceUnset { .. }
                | Request::SubscriptionSetExpires { .. }
                | Request::MsrSetLoadLimit { .. }
        )
    }
}

/// What a [`Request::Select`] asks: the leg's zone and site, and what
/// else the caller knows of it. `SelectQuery::new(zone, site)` is a plain
/// selection; set the rest with struct update syntax:
///
/// ```
/// use msr_shared::admin::SelectQuery;
/// let leg = SelectQuery {
///     call_id: Some("a84b4c76e66710@core".into()),
///     ..SelectQuery::new("default", "local")
/// };
/// assert_eq!(leg.zone, "default");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectQuery {
    /// The leg's zone; empty or absent on the wire: the collector's
    /// `[defaults] zone`, as it is at the moment of the selection.
    #[serde(default)]
    pub zone: String,
    /// The leg's site; empty or absent on the wire: the collector's
    /// `[defaults] site`.
    #[serde(default)]
    pub site: String,
    /// The MSR already chosen for the other leg, if any (optional on the
    /// wire).
    pub msr: Option<String>,
    /// A fixed draw in `[0, total)` instead of a random one (optional on
    /// the wire).
    pub random: Option<f64>,
    /// Return the candidates and the interval table (optional on the wire,
    /// default `false`).
    #[serde(default)]
    pub explain: bool,
    /// The SIP Call-ID of the leg: the selection creates (or finds) a
    /// leg (optional on the wire).
    pub call_id: Option<String>,
    /// Tells two legs of one Call-ID apart (optional; needs `call_id`).
    pub leg: Option<String>,
    /// The conference or space the leg joins (optional; needs
    /// `call_id`): admission thresholds and affinity (SPEC §9).
    pub conference: Option<String>,
    /// Failover (SPEC §14): the MSRs that failed this leg, in the order
    /// they were tried (optional; needs `call_id`). None of them is chosen
    /// again; the leg moves from the one it is bound to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
    /// Why the last of `failed` failed: `timeout`, a SIP status (`503`),
    /// `error` or `load-limit` (rtpengine's answers). A timeout, a 5xx
    /// and rtpengine's answers count against the MSR's health (a
    /// `load-limit` or `503` of an MSR that reported itself near the top
    /// does not: it is full); another status (486, 603) counts nothing.
    /// Optional (default `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The codecs the leg's offer carries (SPEC §15), by name
    /// (`crate::media::CODECS`: `pcma`, `g729`, `h264`, `t38`, …): only an
    /// MSR that takes one of each offered kind (audio, video, image) is a
    /// candidate. Optional (empty: no need).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codecs: Vec<String>,
}

impl SelectQuery {
    /// A selection for a leg in `zone` at `site`, nothing else known.
    pub fn new(zone: impl Into<String>, site: impl Into<String>) -> Self {
        Self {
            zone: zone.into(),
            site: site.into(),
            msr: None,
            random: None,
            explain: false,
            call_id: None,
            leg: None,
            conference: None,
            failed: Vec::new(),
            failure: None,
            codecs: Vec::new(),
        }
    }
}

/// A per-contact operator setting (SPEC §6): the contact's zone or site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContactProperty {
    /// The contact's zone.
    Zone,
    /// The contact's site.
    Site,
}

impl ContactProperty {
    /// `zone` or `site`.
    pub fn as_str(self) -> &'static str {
        match self {
            ContactProperty::Zone => "zone",
            ContactProperty::Site => "site",
        }
    }
}

/// A distance between two sites in the operator's units (SPEC §6):
/// non-negative and finite, or infinity ("may never serve").
///
/// On the wire: a JSON number, or the string `"infinity"`.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub enum Distance {
    /// A finite, non-negative distance.
    Finite(f64),
    /// No path: that site's MSRs never serve the other's subscribers.
    Infinity,
}

impl Distance {
    /// The distance as `f64` (`f64::INFINITY` for [`Distance::Infinity`]).
    pub fn as_f64(self) -> f64 {
        match self {
            Distance::Finite(value) => value,
            Distance::Infinity => f64::INFINITY,
        }
    }

    /// From `f64`: any infinite value becomes [`Distance::Infinity`]; `-0`
    /// becomes `0`.
    pub fn from_f64(value: f64) -> Self {
        if value.is_infinite() {
            Distance::Infinity
        } else {
            Distance::Finite(normalize_zero(value))
        }
    }
}

impl fmt::Display for Distance {
    /// `infinity`, or the number as [`format_number`] writes it (e.g. `32`,
    /// `2.5`, `1e308`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Distance::Finite(value) => f.write_str(&format_number(*value)),
            Distance::Infinity => f.write_str("infinity"),
        }
    }
}

impl Serialize for Distance {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Distance::Finite(value) => serializer.serialize_f64(*value),
            Distance::Infinity => serializer.serialize_str("infinity"),
        }
    }
}

/// What a distance on the wire must be, for error messages.
const DISTANCE_EXPECTED: &str = "a number >= 0 or \"infinity\"";

struct DistanceVisitor;

impl DistanceVisitor {
    fn refuse<E: serde::de::Error>(found: &str) -> E {
        E::custom(format_args!(
            "distance: expected {DISTANCE_EXPECTED}, not {found}"
        ))
    }
}

impl<'de> serde::de::Visitor<'de> for DistanceVisitor {
    type Value = Distance;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "distance: {DISTANCE_EXPECTED}")
    }

    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<Distance, E> {
        // JSON has no infinite number; a parser that produced one means
        // "infinity" all the same.
        Ok(Distance::from_f64(value))
    }

    fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<Distance, E> {
        // A distance is a float; huge integers are rounded like any number.
        #[allow(clippy::cast_precision_loss)]
        Ok(Distance::Finite(value as f64))
    }

    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Distance, E> {
        #[allow(clippy::cast_precision_loss)]
        Ok(Distance::Finite(value as f64))
    }

    fn visit_str<E: serde::de::Error>(self, word: &str) -> Result<Distance, E> {
        if word == "infinity" {
            Ok(Distance::Infinity)
        } else {
            Err(Self::refuse(&format!("{word:?}")))
        }
    }

    fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<Distance, E> {
        Err(Self::refuse(&value.to_string()))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Distance, E> {
        Err(Self::refuse("null"))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Distance, E> {
        Err(Self::refuse("null"))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<Distance, A::Error> {
        Err(Self::refuse("a list"))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<Distance, A::Error> {
        Err(Self::refuse("an object"))
    }
}

impl<'de> Deserialize<'de> for Distance {
    /// A JSON number (`-0` read as `0`) or the string `"infinity"`; anything
    /// else is refused with `distance: expected a number >= 0 or "infinity"`.
    /// A negative number is read, and refused by the collector's validation.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DistanceVisitor)
    }
}
