//! Code shared by `msr-agent` and `msr-collector`.
//!
//! * [`event_package`] — the `eltex-call-count` event package: names and the
//!   NOTIFY body codec (SPEC §4).
//! * [`sip`] — helpers over rsipstack's message model (the one SIP message
//!   model in the codebase): header access, RFC 6665 `Subscription-State`,
//!   response construction, the sans-IO transactions, and
//!   [`sip::SipEndpoint`], the async adapter that moves the agent's
//!   messages through them and its sockets.
//! * [`engine`] — the media engine's addresses and their encoding in the
//!   REGISTER's Contact URI (SPEC §3).
//! * [`subscription`] — [`subscription::SubscriptionState`], where an
//!   RFC 6665 subscription stands for its subscriber (one type for the
//!   collector's subscriber, load table and control protocol).
//! * [`backoff`] — capped exponential backoff, pure.
//! * [`refresh`] — when a registration or a subscription is refreshed
//!   (one rule for REGISTER and SUBSCRIBE, sized by Timer F).
//! * [`admin`] — the collector control protocol (the only serde wire types).
//! * [`media`] — codecs: what an MSR takes and what a leg's offer needs
//!   (SPEC §15), and the SDP offer's codecs.
//! * [`present`] — how numbers are shown to people (`format_number`,
//!   `format_coefficient`, `normalize_zero`).
//! * [`logging`] — the daemons' default log filter, the escaping of every
//!   logged value and the rate limit of lines strangers can cause.
//! * [`log_limit`] — the rate limit of log lines, with suppressed counts.
//! * [`signals`] — SIGTERM/SIGINT stop, SIGHUP never does.
//! * [`time`] — Unix times of a `SystemTime` (pure conversions).
//!
//! Architecture invariant: nothing in this crate performs I/O, reads a
//! clock or spawns a task, except [`sip::SipEndpoint`] (the adapter:
//! sockets, connections, its tasks, the transactions' clock), [`signals`] (the signal
//! handlers), [`fs::cannot_create_in`] (the `--check-config` permission
//! check) and [`logging::FloodLimit`] (it reads the clock to rate-limit
//! log lines).
#![warn(missing_docs)]

pub mod admin;
pub mod backoff;
pub mod certificate;
pub mod check;
pub mod engine;
pub mod event_package;
pub mod fs;
pub mod log_limit;
pub mod logging;
pub mod media;
pub mod present;
pub mod refresh;
pub mod signals;
pub mod sip;
pub mod subscription;
pub mod time;
pub mod token_bucket;
