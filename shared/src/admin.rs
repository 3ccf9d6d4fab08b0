//! The collector control protocol: `msrctl` ⇄ `msr-collector` (SPEC §8).
//!
//! Transport: a Unix stream socket carrying newline-delimited JSON. The client
//! writes one [`Request`] per line; the collector answers each with exactly one
//! [`Response`] line, in order. A line that is not a valid request gets an
//! error response and the connection stays open.
//!
//! ```text
//! → {"op":"site_distance","a":"local","b":"remote","distance":32}
//! ← {"ok":true,"data":{"kind":"changed","entity":"site","name":"local remote","property":"distance","from":"infinity","to":32.0}}
//! → {"op":"select","zone":"default","site":"local","explain":false}
//! ← {"ok":false,"error":{"code":"msr_not_found","message":"no registered active msr in zone `default` at a finite distance from site `local`"}}
//! ```
//!
//! Distances on the wire are JSON numbers, or the string `"infinity"`
//! (JSON has no infinite number).
//!
//! Architecture invariant: these are the only serde types that cross a
//! process boundary; the collector's store format is private to it.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::present::{format_number, normalize_zero};
use crate::subscription::SubscriptionState;

/// The name of the only event package a subscription can be set for (SPEC §4).
pub const EVENT_PACKAGE: &str = crate::event_package::EVENT;

/// The rows a `leg_list` answers unless it asks for another limit.
pub const DEFAULT_LEG_LIST_LIMIT: u32 = 1_000;

/// The most rows a `leg_list` answers: a reply line stays a few MiB.
pub const MAX_LEG_LIST_LIMIT: u32 = 10_000;

/// The version of this protocol, answered by [`Request::Hello`]. It is
/// raised when a change would break a client written against the previous
/// one (an op, a field or a value removed or changing meaning); additions
/// (new ops, new optional fields, new error codes, which an older client
/// reads as [`ErrorCode::Other`]) keep it.
pub const PROTOCOL_VERSION: u32 = 1;

/// `Display` for the wire enums: their wire name (`as_str`), which msrctl
/// shows as it is.
macro_rules! display_wire_name {
    ($($name:ident),+) => {$(
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )+};
}

display_wire_name!(
    StoreKind,
    StoreState,
    ChangedEntity,
    ChangedProperty,
    HealthState,
    RegistrationStatus,
    ExplainOutcome
);

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
    /// [`DEFAULT_LEG_LIST_LIMIT`], at most [`MAX_LEG_LIST_LIMIT`]).
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
    /// The protocol version the collector speaks ([`PROTOCOL_VERSION`]),
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
    /// The leg's zone.
    pub zone: String,
    /// The leg's site.
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

/// One response line: `{"ok":true,"data":{...}}` or
/// `{"ok":false,"error":{"code":"...","message":"..."}}`.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// The request was carried out (and, if it was a mutation, persisted).
    Ok(ResponseData),
    /// The request was refused; nothing changed.
    Err(ErrorBody),
}

impl Response {
    /// An error response.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Response::Err(ErrorBody {
            code,
            message: message.into(),
            explain: None,
        })
    }
}

#[derive(Serialize, Deserialize)]
struct ResponseRepr {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<ResponseData>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<ErrorBody>,
}

impl Serialize for Response {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let repr = match self {
            Response::Ok(data) => ResponseRepr {
                ok: true,
                data: Some(data.clone()),
                error: None,
            },
            Response::Err(error) => ResponseRepr {
                ok: false,
                data: None,
                error: Some(error.clone()),
            },
        };
        repr.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Response {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let repr = ResponseRepr::deserialize(deserializer)?;
        match (repr.ok, repr.data, repr.error) {
            (true, Some(data), None) => Ok(Response::Ok(data)),
            (false, None, Some(error)) => Ok(Response::Err(error)),
            (true, _, _) => Err(serde::de::Error::custom(
                "`ok: true` needs `data` and no `error`",
            )),
            (false, _, _) => Err(serde::de::Error::custom(
                "`ok: false` needs `error` and no `data`",
            )),
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Machine-readable cause.
    pub code: ErrorCode,
    /// Human-readable text, lowercase, no trailing period.
    pub message: String,
    /// For a refused `select` with `explain`: how the refusal was reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<Explain>,
}

/// Machine-readable error causes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The line is not a valid request (bad JSON, unknown `op`, bad field).
    BadRequest,
    /// A value is out of range (coefficient, distance, expires, draw).
    InvalidValue,
    /// The site is not declared (also the §7 refusal cause `unknown_site`).
    UnknownSite,
    /// The site is already declared.
    SiteExists,
    /// The site is still referenced by a contact.
    SiteInUse,
    /// The event package is not `eltex-call-count`.
    BadEvent,
    /// §7 refusal: no candidate left.
    MsrNotFound,
    /// §7 refusal: every candidate's weight is zero.
    MsrOverloaded,
    /// §7 refusal: no healthy candidate is left, but registered, active
    /// contacts of the zone are, all unhealthy (§5).
    MsrUnhealthy,
    /// The change could not be persisted; nothing changed.
    StoreFailed,
    /// The collector is shutting down or failed internally.
    Unavailable,
    /// The change was made against a revision of the shared operator
    /// configuration that another collector has since replaced (SPEC §12):
    /// nothing changed; look at the new state and try again.
    Conflict,
    /// The shared operator store (etcd) cannot be reached: changes are
    /// refused, selection goes on with the last configuration seen.
    StoreUnavailable,
    /// §9 refusal: the leg was released less than 32 s before this select
    /// (the release overtook it), so nothing is placed.
    LegReleased,
    /// A code this client does not know (sent by a newer collector).
    #[serde(other)]
    Other,
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::InvalidValue => "invalid_value",
            ErrorCode::UnknownSite => "unknown_site",
            ErrorCode::SiteExists => "site_exists",
            ErrorCode::SiteInUse => "site_in_use",
            ErrorCode::BadEvent => "bad_event",
            ErrorCode::MsrNotFound => "msr_not_found",
            ErrorCode::MsrOverloaded => "msr_overloaded",
            ErrorCode::MsrUnhealthy => "msr_unhealthy",
            ErrorCode::StoreFailed => "store_failed",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Conflict => "conflict",
            ErrorCode::StoreUnavailable => "store_unavailable",
            ErrorCode::LegReleased => "leg_released",
            ErrorCode::Other => "other",
        })
    }
}

/// The payload of a successful response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ResponseData {
    /// A site was declared.
    SiteDeclared {
        /// Site name.
        name: String,
    },
    /// A site was removed.
    SiteRemoved {
        /// Site name.
        name: String,
    },
    /// A setting changed (`msr set`, `site distance`, `resource set`,
    /// `subscription set`), seed style: entity, name, property, from, to.
    Changed(Change),
    /// Declared sites, sorted by name.
    Sites {
        /// Site names.
        sites: Vec<String>,
    },
    /// The distance matrix.
    Matrix(SiteMatrix),
    /// MSRs with their operator settings.
    Msrs {
        /// One entry per MSR, sorted by name.
        msrs: Vec<MsrInfo>,
    },
    /// The live load table.
    Resources {
        /// One row per contact, sorted by MSR then contact.
        rows: Vec<ResourceInfo>,
    },
    /// Load subscriptions.
    Subscriptions {
        /// One row per MSR, sorted by MSR.
        rows: Vec<SubscriptionInfo>,
    },
    /// A selection result.
    Selected(Selection),
    /// The core hosts and the operator store's state (`cluster_list`).
    Cluster(ClusterView),
    /// The answer to a release.
    Released(Released),
    /// The live legs asked for (`leg_list`).
    Legs(LegRows),
    /// The answer to `hello`.
    Hello(Hello),
}

/// What a collector says to `hello`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The protocol version it speaks ([`PROTOCOL_VERSION`]).
    pub version: u32,
    /// Its software and version, e.g. `msr-collector 0.1.0`.
    pub software: String,
}

/// The cluster of core hosts as one collector sees it (SPEC §12).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The collector that answered.
    pub node: String,
    /// Where the operator configuration lives and whether it is reachable.
    pub store: StoreView,
    /// The number of core hosts, G (SPEC §10): the live members with etcd,
    /// `[cluster] core_hosts` with the file store.
    pub core_hosts: u32,
    /// With etcd: G is `[cluster] core_hosts`, not a count of live
    /// members, because etcd has not been reached since this collector
    /// started.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub core_hosts_from_config: bool,
    /// The live core hosts, sorted by node name (with the file store: this
    /// collector only).
    pub members: Vec<ClusterMember>,
}

/// The operator store's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreView {
    /// Where the configuration lives.
    pub backend: StoreKind,
    /// Whether it can be reached.
    pub status: StoreState,
    /// With etcd: the endpoints and key prefix; with a file: its path.
    pub location: String,
    /// The etcd revision of the configuration in use (absent for the file
    /// store, and for a collector that started from its cached copy and has
    /// not reached etcd since).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Unix time (seconds) since when etcd has been unreachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_since_unix: Option<i64>,
    /// Why etcd is unreachable (the last error), or where the configuration
    /// in use came from when it is the cached copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Where the operator configuration lives (SPEC §12). On the wire: `file`
/// or `etcd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// The collector's own file.
    File,
    /// etcd, shared by the cluster.
    Etcd,
}

impl StoreKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::File => "file",
            StoreKind::Etcd => "etcd",
        }
    }
}

/// Whether the operator store can be reached (SPEC §12). On the wire:
/// `connected`, `unavailable` or `local`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreState {
    /// etcd answered last.
    Connected,
    /// etcd cannot be reached: changes are refused, selection goes on with
    /// the last configuration seen.
    Unavailable,
    /// The file store: always reachable.
    Local,
}

impl StoreState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreState::Connected => "connected",
            StoreState::Unavailable => "unavailable",
            StoreState::Local => "local",
        }
    }
}

/// One live core host (a collector's membership key in etcd).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterMember {
    /// The collector's `node` name.
    pub node: String,
    /// Its SIP address (`[sip] listen`, as bound).
    pub sip: String,
    /// Unix time (seconds) when it started.
    pub started_unix: i64,
    /// Whether this is the collector that answered.
    pub this: bool,
}

/// The answer to `leg_list` (SPEC §9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegRows {
    /// Live legs that match the filters, all of them (`rows` may hold
    /// fewer: at most the limit).
    pub total: u64,
    /// The oldest of them first.
    pub rows: Vec<LegInfo>,
}

/// One live leg.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegInfo {
    /// The SIP Call-ID.
    pub call_id: String,
    /// The leg label, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leg: Option<String>,
    /// The MSR anchoring it.
    pub msr: String,
    /// The contact it was given.
    pub contact: String,
    /// Seconds since it was placed.
    pub age_secs: u64,
    /// Its conference, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conference: Option<String>,
}

/// What a release ended (SPEC §9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Released {
    /// The Call-ID.
    pub call_id: String,
    /// The leg label, if one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leg: Option<String>,
    /// How many live legs ended; 0: none was live (a repeated or unknown
    /// release, which is harmless).
    pub released: u32,
}

/// What a selection for a leg did with it (SPEC §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LegOutcome {
    /// A new leg, bound to the answer.
    New,
    /// A live leg: the same MSR and contact as before.
    Sticky,
    /// A live leg whose MSR was gone: moved to the answer.
    Reanchored,
}

/// Which rule chose the MSR (SPEC §7, §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectionRule {
    /// The §7 weighted draw.
    Draw,
    /// The MSR hosting the conference, below the existing-conference threshold.
    ExistingConference,
    /// The conference's preferred MSR below the new-conference threshold.
    NewConference,
    /// The leg's MSR again (a live leg).
    Sticky,
    /// The lowest estimated occupancy (SPEC §10, the `pooled` policy).
    Pooled,
}

/// A changed setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ChangeRepr")]
pub struct Change {
    /// What was changed.
    pub entity: ChangedEntity,
    /// The entity's name (`A B` for a distance, `MSR EVENT` for a
    /// subscription).
    pub name: String,
    /// The property set.
    pub property: ChangedProperty,
    /// The previous value.
    pub from: ChangeValue,
    /// The new value.
    pub to: ChangeValue,
}

/// What a [`Change`] changed. On the wire: `site`, `msr`, `contact` or
/// `subscription`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangedEntity {
    /// A site (`site distance`: the name is `A B`).
    Site,
    /// An MSR (`msr set`).
    Msr,
    /// A contact (`resource set`, `resource unset`).
    Contact,
    /// An MSR's subscription (`subscription set`: the name is `MSR EVENT`).
    Subscription,
}

impl ChangedEntity {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangedEntity::Site => "site",
            ChangedEntity::Msr => "msr",
            ChangedEntity::Contact => "contact",
            ChangedEntity::Subscription => "subscription",
        }
    }
}

/// The property a [`Change`] set. On the wire: its snake-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangedProperty {
    /// A site distance ([`ChangeValue::Distance`]).
    Distance,
    /// An MSR's performance coefficient ([`ChangeValue::Number`]).
    PerformanceCoefficient,
    /// An MSR's load limit, percent ([`ChangeValue::Count`]).
    LoadLimit,
    /// An MSR's admin active flag ([`ChangeValue::Flag`]).
    Active,
    /// A contact's zone ([`ChangeValue::Text`]).
    Zone,
    /// A contact's site ([`ChangeValue::Text`]).
    Site,
    /// A subscription's `Expires`, seconds ([`ChangeValue::Count`]).
    Expires,
}

impl ChangedProperty {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangedProperty::Distance => "distance",
            ChangedProperty::PerformanceCoefficient => "performance_coefficient",
            ChangedProperty::LoadLimit => "load_limit",
            ChangedProperty::Active => "active",
            ChangedProperty::Zone => "zone",
            ChangedProperty::Site => "site",
            ChangedProperty::Expires => "expires",
        }
    }
}

impl From<ContactProperty> for ChangedProperty {
    fn from(property: ContactProperty) -> Self {
        match property {
            ContactProperty::Zone => ChangedProperty::Zone,
            ContactProperty::Site => ChangedProperty::Site,
        }
    }
}

/// The value of a changed setting, as JSON has it: a number for a number,
/// `true`/`false` for a flag, a string for a name; a distance is a number
/// or `"infinity"` ([`Distance`]). Which one a change carries follows from
/// its [`ChangedProperty`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ChangeValue {
    /// A site distance.
    Distance(Distance),
    /// A real number (a performance coefficient).
    Number(f64),
    /// A whole number (a load limit, seconds).
    Count(u32),
    /// A flag.
    Flag(bool),
    /// A name (a zone, a site).
    Text(String),
}

/// The wire form [`Change`] is read from: the values are read as JSON
/// gives them, then typed by the property.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangeRepr {
    entity: ChangedEntity,
    name: String,
    property: ChangedProperty,
    from: RawValue,
    to: RawValue,
}

/// A JSON scalar, before its property says what it is.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawValue {
    Flag(bool),
    Count(u32),
    Number(f64),
    Text(String),
}

impl RawValue {
    fn typed(self, property: ChangedProperty) -> Result<ChangeValue, String> {
        use ChangedProperty as P;
        Ok(match (property, self) {
            (P::Distance, RawValue::Count(n)) => ChangeValue::Distance(Distance::Finite(n.into())),
            (P::Distance, RawValue::Number(x)) => ChangeValue::Distance(Distance::from_f64(x)),
            (P::Distance, RawValue::Text(word)) if word == "infinity" => {
                ChangeValue::Distance(Distance::Infinity)
            }
            (P::PerformanceCoefficient, RawValue::Count(n)) => ChangeValue::Number(n.into()),
            (P::PerformanceCoefficient, RawValue::Number(x)) => ChangeValue::Number(x),
            (P::LoadLimit | P::Expires, RawValue::Count(n)) => ChangeValue::Count(n),
            (P::Active, RawValue::Flag(b)) => ChangeValue::Flag(b),
            (P::Zone | P::Site, RawValue::Text(text)) => ChangeValue::Text(text),
            (property, _) => return Err(format!("{property}: a value of the wrong type")),
        })
    }
}

impl TryFrom<ChangeRepr> for Change {
    type Error = String;

    fn try_from(repr: ChangeRepr) -> Result<Self, String> {
        Ok(Change {
            entity: repr.entity,
            name: repr.name,
            property: repr.property,
            from: repr.from.typed(repr.property)?,
            to: repr.to.typed(repr.property)?,
        })
    }
}

/// The site distance matrix (SPEC §6): every declared site is a row; the
/// columns are a subset of the rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteMatrix {
    /// Row sites, sorted by name; row `i` is numbered `i + 1`.
    pub sites: Vec<String>,
    /// For each column, the 0-based index of its site in `sites`.
    pub columns: Vec<usize>,
    /// `cells[row][column]`: the distance from `sites[row]` to
    /// `sites[columns[column]]`.
    pub cells: Vec<Vec<Distance>>,
}

/// An MSR's operator settings and registration state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MsrInfo {
    /// MSR name.
    pub name: String,
    /// Performance coefficient (default 1.0).
    pub performance_coefficient: f64,
    /// Admin active flag (default true).
    pub active: bool,
    /// Whether at least one contact is registered now.
    pub registered: bool,
    /// Load limit, percent (SPEC §9; default 100).
    #[serde(default = "default_load_limit")]
    pub load_limit: u8,
    /// Live legs on the MSR (SPEC §9): a drained MSR is empty at 0.
    #[serde(default)]
    pub live_legs: u32,
    /// Age in seconds of the MSR's oldest live leg (SPEC §13), absent
    /// without live legs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_leg_secs: Option<u64>,
    /// `healthy` when at least one registered contact is (selection can use
    /// the MSR), else the health of its first contact by name; absent when
    /// no contact is registered (SPEC §5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthState>,
    /// Unix time (seconds) since which [`MsrInfo::health`] holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_since_unix: Option<i64>,
}

fn default_load_limit() -> u8 {
    100
}

/// The health of an MSR contact (SPEC §5), a separate axis from the
/// operator's `active` flag and from registration status.
///
/// On the wire: `healthy`, `unreported`, `unreachable` or `stale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Subscribed, reporting and answering the keepalive.
    Healthy,
    /// Registered, but no load report yet past the grace.
    Unreported,
    /// The subscription failed, or the keepalive went unanswered.
    Unreachable,
    /// The last report is older than the subscription's expiry.
    Stale,
}

impl HealthState {
    /// `healthy`, `unreported`, `unreachable` or `stale`.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Unreported => "unreported",
            HealthState::Unreachable => "unreachable",
            HealthState::Stale => "stale",
        }
    }
}

/// One row of the live load table (SPEC §5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceInfo {
    /// The collector that holds the row.
    pub node: String,
    /// MSR name.
    pub msr: String,
    /// Agent version from `User-Agent`, if any.
    pub version: Option<String>,
    /// Performance coefficient.
    pub performance_coefficient: f64,
    /// Last reported load in percent (0–100), if any report arrived.
    pub load: Option<u8>,
    /// Last reported CPU in percent.
    pub cpu: Option<u8>,
    /// Last reported media sessions.
    pub calls: Option<u32>,
    /// Last reported capacity in media sessions.
    pub max_calls: Option<u32>,
    /// Seconds since the last load report.
    pub report_age_secs: Option<u64>,
    /// The last report is older than the subscription's expiry.
    pub stale: bool,
    /// Zone label.
    pub zone: String,
    /// Site name.
    pub site: String,
    /// Admin active flag of the MSR.
    pub active: bool,
    /// Contact name `{iface}@{msr}`.
    pub contact: String,
    /// Contact URI (the agent's, with the engine's parameters).
    pub uri: String,
    /// The media engine's SIP URI, where a core sends the INVITE that parks
    /// a leg on this MSR (SPEC §3); absent when the agent reported none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_uri: Option<String>,
    /// The engine's media-control address `host:port` (the seed's
    /// `Cc-address`), if reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcc: Option<String>,
    /// Whether the contact's registration holds.
    pub status: RegistrationStatus,
    /// Seconds until the registration expires (0 when expired).
    pub expires_secs: u64,
    /// Subscription state of the MSR (`pending`, `active`, `terminated`
    /// or `failed`); `None`, `none` on the wire, when it has none.
    #[serde(with = "subscription_or_none")]
    pub subscription: Option<SubscriptionState>,
    /// Live legs on this contact (SPEC §9).
    #[serde(default)]
    pub live_legs: u32,
    /// The contact's health (SPEC §5).
    pub health: HealthState,
    /// Unix time (seconds) of the last change of `health` (its
    /// registration, when it never changed).
    pub health_since_unix: i64,
    /// Seconds since that change.
    pub health_secs: u64,
}

/// Whether a contact's registration holds (SPEC §5). On the wire:
/// `registered` or `expired`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegistrationStatus {
    /// The binding is live.
    Registered,
    /// The binding lapsed; the row stays until it is forgotten.
    Expired,
}

impl RegistrationStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RegistrationStatus::Registered => "registered",
            RegistrationStatus::Expired => "expired",
        }
    }
}

/// One load subscription (SPEC §8 `subscription list`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubscriptionInfo {
    /// MSR name.
    pub msr: String,
    /// Whether at least one contact of the MSR is registered.
    pub registered: bool,
    /// Event package.
    pub event: String,
    /// Admin active flag of the MSR.
    pub active: bool,
    /// Expires in seconds (granted when subscribed, else configured);
    /// `expires` on the wire.
    #[serde(rename = "expires")]
    pub expires_secs: u32,
    /// NOTIFYs received on the current subscription.
    pub notify_count: u64,
    /// Unix time (seconds) of the last NOTIFY.
    pub last_notify_unix: Option<i64>,
    /// Event id (dialog identifier).
    pub event_id: String,
    /// `pending`, `active`, `terminated` or `failed`; `None`, `none` on
    /// the wire, when the MSR has no subscription.
    #[serde(with = "subscription_or_none")]
    pub status: Option<SubscriptionState>,
}

/// The wire name of a subscription state: its own name, `none` for no
/// subscription (msrctl shows the same word).
pub fn subscription_name(state: Option<&SubscriptionState>) -> &'static str {
    state.map_or("none", SubscriptionState::as_str)
}

/// On the wire a subscription state is its name; a `terminated` one is
/// read back without its reason, which the protocol does not carry.
impl Serialize for SubscriptionState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for SubscriptionState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        subscription_from_name(&name)
            .flatten()
            .ok_or_else(|| serde::de::Error::unknown_variant(&name, SUBSCRIPTION_NAMES))
    }
}

/// What a subscription state's name may be on the wire.
const SUBSCRIPTION_NAMES: &[&str] = &["pending", "active", "terminated", "failed"];

/// `Some(None)` for `none`, `Some(Some(state))` for a state's name, `None`
/// for any other word.
fn subscription_from_name(name: &str) -> Option<Option<SubscriptionState>> {
    Some(match name {
        "none" => None,
        "pending" => Some(SubscriptionState::Pending),
        "active" => Some(SubscriptionState::Active),
        "terminated" => Some(SubscriptionState::Terminated(None)),
        "failed" => Some(SubscriptionState::Failed),
        _ => return None,
    })
}

/// `Option<SubscriptionState>` as one string: the state's name, or `none`.
mod subscription_or_none {
    use super::{subscription_from_name, subscription_name, SubscriptionState};
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        state: &Option<SubscriptionState>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(subscription_name(state.as_ref()))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<SubscriptionState>, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        subscription_from_name(&name).ok_or_else(|| {
            serde::de::Error::unknown_variant(
                &name,
                &["pending", "active", "terminated", "failed", "none"],
            )
        })
    }
}

/// The result of a selection (SPEC §7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    /// The chosen MSR.
    pub msr: String,
    /// The chosen contact `{iface}@{msr}`.
    pub contact: String,
    /// Its contact URI: the agent's address (where the collector
    /// subscribes), not where a leg goes.
    pub uri: String,
    /// The media engine's SIP URI: where the core sends the INVITE that
    /// parks the leg (SPEC §3, §7); absent when the MSR's agent reported
    /// none (then only `uri` is known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_uri: Option<String>,
    /// The engine's media-control address `host:port`, if reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcc: Option<String>,
    /// The given MSR had no candidate: a media bridge between the two MSRs
    /// is needed.
    pub media_bridge: bool,
    /// The distance from the leg's site to the contact's site: finite for
    /// a choice (§7 step 3); `infinity` only for a sticky leg (§9) whose
    /// MSR the operator has since put out of reach.
    pub distance: Distance,
    /// The draw, in `[0, total)`.
    pub draw: f64,
    /// The sum of the weights.
    pub total: f64,
    /// The rule that chose it.
    #[serde(default = "default_rule")]
    pub rule: SelectionRule,
    /// With a `call_id`: what became of the leg.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leg: Option<LegOutcome>,
    /// How the choice was made, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<Explain>,
}

/// How a selection was made: every step of SPEC §7.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explain {
    /// The leg's zone.
    pub zone: String,
    /// The leg's site.
    pub site: String,
    /// The MSR given for the other leg.
    pub msr: Option<String>,
    /// Step 2: the given MSR had no candidate.
    pub media_bridge: bool,
    /// Every contact of the zone, with the step that dropped it or its
    /// weight.
    pub candidates: Vec<ExplainCandidate>,
    /// Step 3: the minimum finite distance, if any.
    pub min_distance: Option<Distance>,
    /// Step 5: the interval table, in order.
    pub intervals: Vec<Interval>,
    /// Step 5: the sum of the weights.
    pub total: f64,
    /// Step 5: the draw, when one was made.
    pub draw: Option<f64>,
    /// The rule that decided (§7 draw or a §9 conference rule).
    #[serde(default = "default_rule")]
    pub rule: SelectionRule,
    /// The threshold that rule held the MSRs to, percent of each one's
    /// load limit (conference rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
}

fn default_rule() -> SelectionRule {
    SelectionRule::Draw
}

/// A candidate contact and the step at which it was dropped, if it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExplainCandidate {
    /// Contact name.
    pub contact: String,
    /// MSR name.
    pub msr: String,
    /// The contact's site.
    pub site: String,
    /// Distance from the leg's site.
    pub distance: Distance,
    /// The contact's health (SPEC §5).
    pub health: HealthState,
    /// What became of it.
    pub outcome: ExplainOutcome,
    /// Step 5 weight, for [`ExplainOutcome::Kept`] (and 0 for
    /// [`ExplainOutcome::Full`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
}

/// What became of one contact of the zone in a selection (SPEC §7).
///
/// On the wire: the snake-case name (`kept`, `full`, `inactive`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExplainOutcome {
    /// In the interval table with a positive weight.
    Kept,
    /// Kept by steps 1–4, but its weight is 0 (load 100 or no capacity
    /// left): no interval.
    Full,
    /// Step 1: the operator set its MSR inactive.
    Inactive,
    /// Step 1: its registration lapsed.
    Unregistered,
    /// Step 1: unhealthy, no load report yet past the grace (§5).
    Unreported,
    /// Step 1: unhealthy, its subscription failed or the keepalive went
    /// unanswered (§5).
    Unreachable,
    /// Step 1: unhealthy, its last report is older than the
    /// subscription's expiry (§5).
    Stale,
    /// Step 2: another MSR was given and has candidates.
    OtherMsr,
    /// Step 3: infinite distance.
    InfiniteDistance,
    /// Step 3: farther than the minimum distance.
    Farther,
    /// Step 4: its MSR already has a contact earlier by name.
    DuplicateMsr,
    /// Admission (§9): at or above its MSR's load limit.
    OverLoadLimit,
    /// Admission (§9): at or above the conference threshold that applied.
    OverThreshold,
    /// Admission (§9): admitted, but the conference rule chose another MSR.
    NotPreferred,
}

impl ExplainOutcome {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ExplainOutcome::Kept => "kept",
            ExplainOutcome::Full => "full",
            ExplainOutcome::Inactive => "inactive",
            ExplainOutcome::Unregistered => "unregistered",
            ExplainOutcome::Unreported => "unreported",
            ExplainOutcome::Unreachable => "unreachable",
            ExplainOutcome::Stale => "stale",
            ExplainOutcome::OtherMsr => "other_msr",
            ExplainOutcome::InfiniteDistance => "infinite_distance",
            ExplainOutcome::OverLoadLimit => "over_load_limit",
            ExplainOutcome::OverThreshold => "over_threshold",
            ExplainOutcome::NotPreferred => "not_preferred",
            ExplainOutcome::Farther => "farther",
            ExplainOutcome::DuplicateMsr => "duplicate_msr",
        }
    }
}

/// One row of the interval table (SPEC §7 step 5): an MSR with a positive
/// weight (a full one is listed among the candidates, not here).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// MSR name.
    pub msr: String,
    /// The contact kept for it.
    pub contact: String,
    /// Load in percent used for the weight (0 when no report yet).
    pub load: u8,
    /// Whether a load report exists.
    pub reported: bool,
    /// The report is stale.
    pub stale: bool,
    /// Performance coefficient.
    pub performance_coefficient: f64,
    /// `(100 − load) × performance_coefficient`.
    pub weight: f64,
    /// Lower bound (inclusive).
    pub bottom: f64,
    /// Upper bound (exclusive), `bottom + weight`.
    pub top: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips_and_uses_op_tag() {
        let request = Request::SiteDistance {
            a: "local".into(),
            b: "remote".into(),
            distance: Distance::Infinity,
        };
        let line = serde_json::to_string(&request).expect("serialize");
        assert_eq!(
            line,
            r#"{"op":"site_distance","a":"local","b":"remote","distance":"infinity"}"#
        );
        let back: Request = serde_json::from_str(&line).expect("deserialize");
        assert_eq!(back, request);
    }

    #[test]
    fn unknown_op_and_unknown_field_are_rejected() {
        assert!(serde_json::from_str::<Request>(r#"{"op":"reboot"}"#).is_err());
        // Misspelt fields of a request with fields are refused, not ignored.
        assert!(serde_json::from_str::<Request>(r#"{"op":"site_declare","nmae":"a"}"#).is_err());
    }

    /// One request of every op. The match is exhaustive: a new op must be
    /// added here, and so is checked to read back and to refuse unknown fields.
    fn every_op() -> Vec<Request> {
        let all = vec![
            Request::SiteDeclare { name: "a".into() },
            Request::SiteRemove { name: "a".into() },
            Request::SiteList {},
            Request::SiteDistance {
                a: "a".into(),
                b: "b".into(),
                distance: Distance::Finite(2.5),
            },
            Request::SiteMatrix {
                names: vec!["a".into()],
            },
            Request::MsrSetPerformanceCoefficient {
                msr: "m".into(),
                value: 0.9,
            },
            Request::MsrSetActive {
                msr: "m".into(),
                active: false,
            },
            Request::MsrList {},
            Request::ResourceList { active_only: true },
            Request::ResourceSetZone {
                contact: "lo@m".into(),
                zone: "z".into(),
            },
            Request::ResourceSetSite {
                contact: "lo@m".into(),
                site: "s".into(),
            },
            Request::ResourceUnset {
                contact: "lo@m".into(),
                property: ContactProperty::Site,
            },
            Request::SubscriptionSetExpires {
                msr: "m".into(),
                event: EVENT_PACKAGE.into(),
                expires_secs: 30,
            },
            Request::SubscriptionList {},
            Request::Select(SelectQuery {
                zone: "z".into(),
                site: "s".into(),
                msr: Some("m".into()),
                random: Some(1.5),
                explain: true,
                call_id: Some("c1@core".into()),
                leg: Some("b".into()),
                conference: Some("room-7".into()),
            }),
            Request::Release {
                call_id: "c1@core".into(),
                leg: None,
            },
            Request::MsrSetLoadLimit {
                msr: "m".into(),
                value: 80,
            },
            Request::ClusterList {},
            Request::Hello {},
            Request::LegList {
                msr: Some("msr_1".into()),
                older_than_secs: Some(60),
                limit: None,
            },
        ];
        for request in &all {
            match request {
                Request::SiteDeclare { .. }
                | Request::SiteRemove { .. }
                | Request::SiteList {}
                | Request::SiteDistance { .. }
                | Request::SiteMatrix { .. }
                | Request::MsrSetPerformanceCoefficient { .. }
                | Request::MsrSetActive { .. }
                | Request::MsrList {}
                | Request::ResourceList { .. }
                | Request::ResourceSetZone { .. }
                | Request::ResourceSetSite { .. }
                | Request::ResourceUnset { .. }
                | Request::SubscriptionSetExpires { .. }
                | Request::SubscriptionList {}
                | Request::Select(_)
                | Request::Release { .. }
                | Request::MsrSetLoadLimit { .. }
                | Request::ClusterList {}
                | Request::LegList { .. }
                | Request::Hello {} => {}
            }
        }
        all
    }

    #[test]
    fn every_op_round_trips() {
        for request in every_op() {
            let line = serde_json::to_string(&request).expect("serialize");
            let back: Request = serde_json::from_str(&line).expect(&line);
            assert_eq!(back, request, "{line}");
        }
        assert_eq!(
            serde_json::to_string(&Request::MsrList {}).expect("serialize"),
            r#"{"op":"msr_list"}"#
        );
    }

    #[test]
    fn unknown_fields_are_rejected_for_every_op() {
        for request in every_op() {
            let mut value = serde_json::to_value(&request).expect("serialize");
            if let Some(map) = value.as_object_mut() {
                map.insert("x".into(), serde_json::json!(1));
            }
            let error = serde_json::from_value::<Request>(value.clone())
                .expect_err(&format!("accepted {value}"));
            assert!(error.to_string().contains("unknown field `x`"), "{error}");
        }
        let error = serde_json::from_str::<Request>(r#"{"op":"msr_list","x":1}"#)
            .expect_err("an op without fields takes no field");
        assert!(error.to_string().contains("unknown field `x`"), "{error}");
    }

    #[test]
    fn optional_fields_default() {
        let request: Request =
            serde_json::from_str(r#"{"op":"select","zone":"z","site":"s"}"#).expect("parse");
        assert_eq!(request, Request::Select(SelectQuery::new("z", "s")));
        let request: Request = serde_json::from_str(r#"{"op":"site_matrix"}"#).expect("parse");
        assert_eq!(request, Request::SiteMatrix { names: vec![] });
    }

    #[test]
    fn distance_accepts_number_or_infinity_only() {
        assert_eq!(
            serde_json::from_str::<Distance>("3.5").expect("num"),
            Distance::Finite(3.5)
        );
        assert_eq!(
            serde_json::from_str::<Distance>("\"infinity\"").expect("inf"),
            Distance::Infinity
        );
        assert!(serde_json::from_str::<Distance>("\"far\"").is_err());
        assert_eq!(Distance::Finite(32.0).to_string(), "32");
        assert_eq!(Distance::Finite(1e308).to_string(), "1e308");
        // Negative numbers are read; the collector's validation refuses them.
        assert_eq!(
            serde_json::from_str::<Distance>("-1").expect("negative"),
            Distance::Finite(-1.0)
        );
    }

    #[test]
    fn distance_errors_say_what_is_expected() {
        for (json, found) in [
            ("null", "null"),
            ("true", "true"),
            ("\"far\"", "\"far\""),
            ("[1]", "a list"),
            ("{}", "an object"),
        ] {
            let error = serde_json::from_str::<Distance>(json).expect_err(json);
            let text = error.to_string();
            assert!(
                text.starts_with(&format!(
                    "distance: expected a number >= 0 or \"infinity\", not {found}"
                )),
                "{json}: {text}"
            );
            // The same inside a request, where serde buffers the fields.
            let line = format!(r#"{{"op":"site_distance","a":"x","b":"y","distance":{json}}}"#);
            let error = serde_json::from_str::<Request>(&line).expect_err(&line);
            assert_eq!(
                error.to_string(),
                format!("distance: expected a number >= 0 or \"infinity\", not {found}"),
                "{line}"
            );
        }
    }

    #[test]
    fn negative_zero_is_read_as_zero() {
        for json in ["-0", "-0.0", "-0e5"] {
            let Distance::Finite(value) = serde_json::from_str::<Distance>(json).expect(json)
            else {
                panic!("{json}: not finite")
            };
            assert!(value == 0.0 && value.is_sign_positive(), "{json}: {value}");
        }
        assert_eq!(Distance::from_f64(-0.0).to_string(), "0");
    }

    #[test]
    fn response_shapes() {
        let ok = Response::Ok(ResponseData::Sites {
            sites: vec!["local".into()],
        });
        let line = serde_json::to_string(&ok).expect("serialize");
        assert_eq!(
            line,
            r#"{"ok":true,"data":{"kind":"sites","sites":["local"]}}"#
        );
        assert_eq!(serde_json::from_str::<Response>(&line).expect("parse"), ok);

        let err = Response::error(ErrorCode::MsrNotFound, "none");
        let line = serde_json::to_string(&err).expect("serialize");
        assert_eq!(
            line,
            r#"{"ok":false,"error":{"code":"msr_not_found","message":"none"}}"#
        );
        assert_eq!(serde_json::from_str::<Response>(&line).expect("parse"), err);

        let unknown: Response =
            serde_json::from_str(r#"{"ok":false,"error":{"code":"new_thing","message":"m"}}"#)
                .expect("parse");
        assert!(matches!(
            unknown,
            Response::Err(ErrorBody {
                code: ErrorCode::Other,
                ..
            })
        ));
        assert!(serde_json::from_str::<Response>(r#"{"ok":true}"#).is_err());
    }

    #[test]
    fn health_and_explain_outcomes_are_strings_on_the_wire() {
        for (health, text) in [
            (HealthState::Healthy, "healthy"),
            (HealthState::Unreported, "unreported"),
            (HealthState::Unreachable, "unreachable"),
            (HealthState::Stale, "stale"),
        ] {
            let json = serde_json::to_string(&health).expect("serialize");
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(health.to_string(), text);
            let back: HealthState = serde_json::from_str(&json).expect("parse");
            assert_eq!(back, health);
        }
        for outcome in [
            ExplainOutcome::Kept,
            ExplainOutcome::Full,
            ExplainOutcome::Inactive,
            ExplainOutcome::Unregistered,
            ExplainOutcome::Unreported,
            ExplainOutcome::Unreachable,
            ExplainOutcome::Stale,
            ExplainOutcome::OtherMsr,
            ExplainOutcome::InfiniteDistance,
            ExplainOutcome::Farther,
            ExplainOutcome::DuplicateMsr,
        ] {
            let json = serde_json::to_string(&outcome).expect("serialize");
            assert_eq!(json, format!("\"{}\"", outcome.as_str()));
            let back: ExplainOutcome = serde_json::from_str(&json).expect("parse");
            assert_eq!(back, outcome);
        }
        assert!(serde_json::from_str::<HealthState>("\"dead\"").is_err());
        assert_eq!(ErrorCode::MsrUnhealthy.to_string(), "msr_unhealthy");
        assert_eq!(
            serde_json::to_string(&ErrorCode::MsrUnhealthy).expect("serialize"),
            "\"msr_unhealthy\""
        );
    }

    #[test]
    fn subscription_states_are_their_names_on_the_wire() {
        let states = [
            Some(SubscriptionState::Pending),
            Some(SubscriptionState::Active),
            Some(SubscriptionState::Terminated(Some(
                crate::sip::TerminationReason::Timeout,
            ))),
            Some(SubscriptionState::Failed),
            None,
        ];
        let shown: Vec<&str> = states
            .iter()
            .map(|s| subscription_name(s.as_ref()))
            .collect();
        assert_eq!(shown, ["pending", "active", "terminated", "failed", "none"]);
        for state in states {
            let info = SubscriptionInfo {
                msr: "m".into(),
                registered: true,
                event: EVENT_PACKAGE.into(),
                active: true,
                expires_secs: 60,
                notify_count: 0,
                last_notify_unix: None,
                event_id: String::new(),
                status: state.clone(),
            };
            let json = serde_json::to_value(&info).expect("serialize");
            assert_eq!(json["status"], subscription_name(state.as_ref()));
            let back: SubscriptionInfo = serde_json::from_value(json).expect("parse");
            // The reason of a `terminated` state does not travel.
            let expected = match state {
                Some(SubscriptionState::Terminated(_)) => Some(SubscriptionState::Terminated(None)),
                other => other,
            };
            assert_eq!(back.status, expected);
        }
        assert!(serde_json::from_str::<SubscriptionState>("\"none\"").is_err());
        assert!(serde_json::from_str::<SubscriptionState>("\"gone\"").is_err());
    }

    /// The closed sets that travel as strings keep their JSON: exact
    /// lines, as a script sees them.
    #[test]
    fn golden_json_of_the_wire_enums() {
        let row = ResourceInfo {
            node: "core1@ecss1".into(),
            msr: "msr_1".into(),
            version: None,
            performance_coefficient: 1.0,
            load: Some(37),
            cpu: None,
            calls: None,
            max_calls: None,
            report_age_secs: None,
            stale: false,
            zone: "default".into(),
            site: "local".into(),
            active: true,
            contact: "lo@msr_1".into(),
            uri: "sip:msr_1@127.0.0.1:5070".into(),
            engine_uri: None,
            mcc: None,
            status: RegistrationStatus::Registered,
            expires_secs: 58,
            subscription: Some(SubscriptionState::Active),
            live_legs: 0,
            health: HealthState::Healthy,
            health_since_unix: 1,
            health_secs: 2,
        };
        let line = serde_json::to_string(&row).expect("serialize");
        assert_eq!(
            line,
            r#"{"node":"core1@ecss1","msr":"msr_1","version":null,"performance_coefficient":1.0,"load":37,"cpu":null,"calls":null,"max_calls":null,"report_age_secs":null,"stale":false,"zone":"default","site":"local","active":true,"contact":"lo@msr_1","uri":"sip:msr_1@127.0.0.1:5070","status":"registered","expires_secs":58,"subscription":"active","live_legs":0,"health":"healthy","health_since_unix":1,"health_secs":2}"#
        );
        assert_eq!(
            serde_json::from_str::<ResourceInfo>(&line).expect("parse"),
            row
        );
        let expired = ResourceInfo {
            status: RegistrationStatus::Expired,
            subscription: None,
            ..row
        };
        let json = serde_json::to_value(&expired).expect("serialize");
        assert_eq!(
            (json["status"].as_str(), json["subscription"].as_str()),
            (Some("expired"), Some("none"))
        );

        let none = SubscriptionInfo {
            msr: "msr_9".into(),
            registered: false,
            event: EVENT_PACKAGE.into(),
            active: true,
            expires_secs: 30,
            notify_count: 0,
            last_notify_unix: None,
            event_id: String::new(),
            status: None,
        };
        let line = serde_json::to_string(&none).expect("serialize");
        assert_eq!(
            line,
            r#"{"msr":"msr_9","registered":false,"event":"eltex-call-count","active":true,"expires":30,"notify_count":0,"last_notify_unix":null,"event_id":"","status":"none"}"#
        );
        assert_eq!(
            serde_json::from_str::<SubscriptionInfo>(&line).expect("parse"),
            none
        );

        for (backend, status, json) in [
            (
                StoreKind::File,
                StoreState::Local,
                r#"{"backend":"file","status":"local","location":"x"}"#,
            ),
            (
                StoreKind::Etcd,
                StoreState::Connected,
                r#"{"backend":"etcd","status":"connected","location":"x"}"#,
            ),
            (
                StoreKind::Etcd,
                StoreState::Unavailable,
                r#"{"backend":"etcd","status":"unavailable","location":"x"}"#,
            ),
        ] {
            let view = StoreView {
                backend,
                status,
                location: "x".into(),
                revision: None,
                unavailable_since_unix: None,
                detail: None,
            };
            assert_eq!(serde_json::to_string(&view).expect("serialize"), json);
            assert_eq!(
                serde_json::from_str::<StoreView>(json).expect("parse"),
                view
            );
        }
    }

    /// A change names its entity and property as before; its values are
    /// JSON numbers, flags and strings as the property says (a distance
    /// with no path stays `"infinity"`).
    #[test]
    fn golden_json_of_changes() {
        let change = |entity, name: &str, property, from, to| {
            ResponseData::Changed(Change {
                entity,
                name: name.into(),
                property,
                from,
                to,
            })
        };
        use ChangeValue as V;
        use ChangedEntity as E;
        use ChangedProperty as P;
        for (data, json) in [
            (
                change(
                    E::Site,
                    "local remote",
                    P::Distance,
                    V::Distance(Distance::Infinity),
                    V::Distance(Distance::Finite(32.0)),
                ),
                r#"{"kind":"changed","entity":"site","name":"local remote","property":"distance","from":"infinity","to":32.0}"#,
            ),
            (
                change(
                    E::Msr,
                    "msr_1",
                    P::PerformanceCoefficient,
                    V::Number(1.0),
                    V::Number(0.9),
                ),
                r#"{"kind":"changed","entity":"msr","name":"msr_1","property":"performance_coefficient","from":1.0,"to":0.9}"#,
            ),
            (
                change(E::Msr, "msr_1", P::LoadLimit, V::Count(100), V::Count(80)),
                r#"{"kind":"changed","entity":"msr","name":"msr_1","property":"load_limit","from":100,"to":80}"#,
            ),
            (
                change(E::Msr, "msr_1", P::Active, V::Flag(true), V::Flag(false)),
                r#"{"kind":"changed","entity":"msr","name":"msr_1","property":"active","from":true,"to":false}"#,
            ),
            (
                change(
                    E::Contact,
                    "lo@msr_1",
                    P::Zone,
                    V::Text("default".into()),
                    V::Text("z2".into()),
                ),
                r#"{"kind":"changed","entity":"contact","name":"lo@msr_1","property":"zone","from":"default","to":"z2"}"#,
            ),
            (
                change(
                    E::Contact,
                    "lo@msr_1",
                    P::Site,
                    V::Text("infinity".into()),
                    V::Text("local".into()),
                ),
                r#"{"kind":"changed","entity":"contact","name":"lo@msr_1","property":"site","from":"infinity","to":"local"}"#,
            ),
            (
                change(
                    E::Subscription,
                    "msr_1 eltex-call-count",
                    P::Expires,
                    V::Count(60),
                    V::Count(30),
                ),
                r#"{"kind":"changed","entity":"subscription","name":"msr_1 eltex-call-count","property":"expires","from":60,"to":30}"#,
            ),
        ] {
            assert_eq!(serde_json::to_string(&data).expect("serialize"), json);
            assert_eq!(
                serde_json::from_str::<ResponseData>(json).expect(json),
                data,
                "{json}"
            );
        }
        // A whole distance or coefficient may come as an integer.
        let read: ResponseData = serde_json::from_str(
            r#"{"kind":"changed","entity":"site","name":"a b","property":"distance","from":1,"to":2}"#,
        )
        .expect("integers");
        assert!(
            matches!(read, ResponseData::Changed(Change { to: V::Distance(Distance::Finite(t)), .. }) if t == 2.0)
        );
        // A value of the wrong type for its property is refused.
        for json in [
            r#"{"kind":"changed","entity":"msr","name":"m","property":"active","from":1,"to":0}"#,
            r#"{"kind":"changed","entity":"site","name":"a b","property":"distance","from":"far","to":1}"#,
            r#"{"kind":"changed","entity":"contact","name":"c","property":"zone","from":1,"to":"z"}"#,
            r#"{"kind":"changed","entity":"msr","name":"m","property":"colour","from":1,"to":2}"#,
        ] {
            assert!(
                serde_json::from_str::<ResponseData>(json).is_err(),
                "{json}"
            );
        }
    }

    #[test]
    fn hello_answers_the_protocol_version() {
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"hello"}"#).expect("parse"),
            Request::Hello {}
        );
        let hello = Response::Ok(ResponseData::Hello(Hello {
            version: PROTOCOL_VERSION,
            software: "msr-collector 0.1.0".into(),
        }));
        let line = serde_json::to_string(&hello).expect("serialize");
        assert_eq!(
            line,
            r#"{"ok":true,"data":{"kind":"hello","version":1,"software":"msr-collector 0.1.0"}}"#
        );
        assert_eq!(
            serde_json::from_str::<Response>(&line).expect("parse"),
            hello
        );
    }

    #[test]
    fn changed_is_flattened_into_data() {
        let data = ResponseData::Changed(Change {
            entity: ChangedEntity::Msr,
            name: "msr_1".into(),
            property: ChangedProperty::PerformanceCoefficient,
            from: ChangeValue::Number(1.0),
            to: ChangeValue::Number(2.5),
        });
        let json = serde_json::to_value(&data).expect("serialize");
        assert_eq!(json["kind"], "changed");
        assert_eq!(json["entity"], "msr");
        let back: ResponseData = serde_json::from_value(json).expect("parse");
        assert_eq!(back, data);
    }
}
