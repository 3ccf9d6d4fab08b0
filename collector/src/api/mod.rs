//! The ways a softswitch and an operator ask the collector (SPEC §8, §11):
//! the one request [`handler`], the control socket, HTTP with `/metrics`,
//! and the SIP redirect server. Each front end translates onto the
//! handler's [`msr_shared::admin::Request`].
pub mod handler;
pub mod http;
pub mod metrics;
pub mod process;
pub mod redirect;
