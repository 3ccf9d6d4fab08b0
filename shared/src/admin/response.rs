//! The answer to each request: `ok` with its data, or an error with its code.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::*;

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
    /// §14 refusal: every MSR this leg may go to failed it, or it used up
    /// its attempts; the message lists the failures.
    MsrUnavailable,
    /// No MSR of the zone takes the leg's offer (SPEC §15): the redirect
    /// server answers 488.
    NoCapableMsr,
    /// A code this client does not know (sent by a newer collector).
    #[serde(other)]
    Other,
}

impl ErrorCode {
    /// The code as the control protocol, the HTTP API, the redirect's
    /// `Reason` and the `outcome` label of `/metrics` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
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
            ErrorCode::MsrUnavailable => "msr_unavailable",
            ErrorCode::NoCapableMsr => "no_capable_msr",
            ErrorCode::Other => "other",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
    /// The zones (`zone_list`), sorted by name.
    Zones {
        /// One entry per zone.
        zones: Vec<ZoneInfo>,
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
