//! The ways a softswitch and an operator ask the collector (SPEC §8, §11):
//! the control socket ([`control`]), HTTP with `/metrics`, and the SIP
//! redirect server. Each front end translates onto a
//! [`msr_shared::admin::Request`] that the core answers
//! ([`crate::core::admin`]); none decides anything itself, but for the
//! selections that change nothing ([`read_only`]).
pub mod control;
pub mod http;
pub mod metrics;
pub mod process;
pub mod read_only;
pub mod redirect;
