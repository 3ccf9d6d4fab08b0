//! The collector's SIP roles: registrar of the MSR accounts (SPEC §3) and
//! subscriber of each MSR's `eltex-call-count` load (SPEC §4).
pub mod admission;
pub mod not_sent;
pub mod registrar;
pub mod subscriber;
