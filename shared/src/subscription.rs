//! The state of an RFC 6665 subscription as its subscriber sees it.
//!
//! One type for the collector's subscriber (which moves it), its load table
//! (which shows it and derives health from it, SPEC §5) and the control
//! protocol (`subscription list`, `resource list`, SPEC §8), whose wire form
//! is in [`crate::admin`]. The `Subscription-State` *header* a NOTIFY
//! carries is another thing, [`crate::sip::SubscriptionStateHeader`]: its
//! `pending` means "accepted, pending authorisation" (RFC 6665 §4.1.2), this
//! one's "asked, no answer yet".

use std::fmt;

use crate::sip::TerminationReason;

/// Where the subscriber's subscription to one MSR stands.
///
/// ```text
/// ──SUBSCRIBE──▶ Pending ──2xx / NOTIFY──▶ Active ──NOTIFY terminated──▶ Terminated(reason)
///                   └──────error / timeout──────▶ Failed
/// ```
///
/// Having no subscription at all is `Option::None` where one may be absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriptionState {
    /// SUBSCRIBE sent, no answer yet.
    Pending,
    /// Subscribed; NOTIFYs expected.
    Active,
    /// The notifier ended it with a `terminated` NOTIFY; its `reason`
    /// parameter, if it had one (RFC 6665 §4.1.3: none means "may retry").
    Terminated(Option<TerminationReason>),
    /// Refused or timed out.
    Failed,
}

impl SubscriptionState {
    /// `pending`, `active`, `terminated` or `failed` (the reason is not
    /// part of the name).
    pub fn as_str(&self) -> &'static str {
        match self {
            SubscriptionState::Pending => "pending",
            SubscriptionState::Active => "active",
            SubscriptionState::Terminated(_) => "terminated",
            SubscriptionState::Failed => "failed",
        }
    }
}

impl fmt::Display for SubscriptionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
