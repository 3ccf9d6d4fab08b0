//! Call legs (SPEC §9): the rows of `leg list` and what a release did.

use serde::{Deserialize, Serialize};

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

impl LegOutcome {
    /// `new`, `sticky` or `reanchored`: the wire's spelling, and the `leg`
    /// label of `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            LegOutcome::New => "new",
            LegOutcome::Sticky => "sticky",
            LegOutcome::Reanchored => "reanchored",
        }
    }
}
