//! The tables: MSRs, resources (contacts) with their health, subscriptions, the site matrix.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::*;
use crate::subscription::SubscriptionState;

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

/// A zone (SPEC §6) as `zone list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneInfo {
    /// Zone name.
    pub name: String,
    /// The MSR contacts in the zone now (the load table's, registered or
    /// not yet expired); 0 for a zone only set on contacts that are not
    /// known now, or the default zone without any.
    pub contacts: u32,
    /// Whether it is the collector's `[defaults] zone`, the zone of every
    /// contact not set to another.
    pub default: bool,
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
    /// The calls the MSR's engine reported last (SPEC §4 `calls`), absent
    /// without a report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_calls: Option<u32>,
    /// For an MSR that was registered and is not any more (SPEC §14
    /// "nothing vanishes"): since when (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gone_since_unix: Option<i64>,
    /// Why it is gone: `lapsed` (not refreshed) or `unregistered`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gone_cause: Option<String>,
    /// Whether it was in service when it went (it had reported its load
    /// and was not drained): the `MsrGone` alert's case.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gone_while_serving: bool,
    /// For an MSR that takes no new legs (inactive, or draining by its
    /// agent's report): `draining` while legs or engine calls are left,
    /// `drained` once both are 0 (SPEC §14); absent in service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainState>,
}

/// How far an MSR's drain is (SPEC §14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainState {
    /// Legs or engine calls are left.
    Draining,
    /// Nothing is left: the MSR can be stopped.
    Drained,
}

impl DrainState {
    /// `draining` or `drained`.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainState::Draining => "draining",
            DrainState::Drained => "drained",
        }
    }
}

fn default_load_limit() -> u8 {
    100
}

/// The health of an MSR contact (SPEC §5), a separate axis from the
/// operator's `active` flag and from registration status.
///
/// On the wire: `healthy`, `unreported`, `unreachable`, `stale`,
/// `engine_down` or `draining`.
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
    /// The agent answers but its media engine does not, or the failures
    /// cores reported took the MSR out (SPEC §14).
    EngineDown,
    /// The MSR asked for no new legs (SPEC §14).
    Draining,
}

impl HealthState {
    /// `healthy`, `unreported`, `unreachable`, `stale`, `engine_down` or
    /// `draining`.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Unreported => "unreported",
            HealthState::Unreachable => "unreachable",
            HealthState::Stale => "stale",
            HealthState::EngineDown => "engine_down",
            HealthState::Draining => "draining",
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
    /// The codecs its MSR takes, in the MSR's priority order (SPEC §15);
    /// absent when the agent did not report them (taken as able to take
    /// anything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codecs: Option<Vec<String>>,
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
