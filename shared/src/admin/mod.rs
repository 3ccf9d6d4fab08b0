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

mod change;
mod legs;
mod request;
mod response;
mod rows;
mod selection;
mod status;

pub use change::*;
pub use legs::*;
pub use request::*;
pub use response::*;
pub use rows::*;
pub use selection::*;
pub use status::*;

#[cfg(test)]
mod tests;
