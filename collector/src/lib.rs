//! `msr-collector`: the core-host sidecar of media-server selection.
//!
//! It is the registrar of the MSR accounts (SPEC §3), the subscriber of each
//! registered MSR's `eltex-call-count` load (SPEC §4), keeps the live load
//! table (SPEC §5) and the operator configuration (SPEC §6), and answers
//! selection and admin requests on a Unix socket (SPEC §7, §8).
//!
//! Codemap (ARCHITECTURE.md has the whole map and the invariants):
//! * [`core`] — [`core::Collector`], every fact's one owner, the glue
//!   between them and the control requests' logic ([`core::admin`]),
//!   sans-IO.
//! * [`daemon`] — the shell: start, sockets, the loop, files, host checks;
//!   [`daemon::cli`] is the daemon's command line.
//! * [`config`] — the TOML config file: raw → validated [`config::CollectorConfig`].
//! * [`sip`] — the registrar and the RFC 6665 subscriber, sans-IO.
//! * [`model`] — the load table (the selection index), health, call legs and
//!   the pooled policy's estimate, sans-IO.
//! * [`select`] — selection (SPEC §7, §9, §10), pure.
//! * [`operator`] — the operator configuration, its names and topology, the
//!   cluster view and the stores (file, etcd).
//! * [`api`] — the front ends: control socket, HTTP
//!   and `/metrics`, SIP redirect.
//! * [`msrctl`] — the admin command line.
//!
//! One owner per fact: the registrar owns the bindings, the subscriber the
//! subscriptions, [`operator::OperatorConfig`] the settings, [`model::health`]
//! the health; the load table keeps of them only what selection reads.
pub mod api;
pub mod config;
pub mod core;
pub mod daemon;
pub mod error;
pub mod model;
pub mod msrctl;
pub mod operator;
pub mod select;
pub mod sip;

pub use config::CollectorConfig;
pub use daemon::{check_environment, environment_problems, run, start, CollectorHandle};
pub use error::CollectorError;
