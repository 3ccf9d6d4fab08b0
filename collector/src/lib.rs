//! `msr-collector`: the core-host sidecar of media-server selection.
//!
//! It is the registrar of the MSR accounts (SPEC §3), the subscriber of each
//! registered MSR's `eltex-call-count` load (SPEC §4), keeps the live load
//! table (SPEC §5) and the operator configuration (SPEC §6), and answers
//! selection and admin requests on a Unix socket (SPEC §7, §8).
//!
//! Codemap:
//! * [`daemon_cli`] — the daemon's command line; [`cli`] — msrctl's.
//! * [`config`] — the TOML config file: raw → validated [`config::CollectorConfig`].
//! * [`registrar`] — sans-IO registrar: digest auth, bindings per MSR.
//! * [`subscriber`] — sans-IO RFC 6665 subscriber: one subscription per MSR,
//!   to a contact it takes from the registrar's bindings.
//! * [`health`] — sans-IO health of each MSR contact (SPEC §5): OPTIONS
//!   keepalive, report age, subscription state.
//! * [`shell`] — the async loop: [`start`]/[`run`] own the sockets and feed the cores.
//! * [`cluster`] — the store's reachability and the live core hosts (G).
//! * [`http`] — the HTTP API and `/metrics` (SPEC §11), [`redirect`] — the
//!   SIP redirect server (SPEC §11): both translate onto the control
//!   protocol's one handler; [`metrics`] — the counters and the exposition.
//! * [`load_table`] — the selection index, fed by typed
//!   [`load_table::Change`] events from each fact's owner, and the load
//!   reports.
//! * `operator`, `topology`, `store` (file, `store::etcd`), `select`, `admin`, `cli`
//!   — the operator configuration, selection and the control protocol.
//!
//! One owner per fact: the registrar owns the bindings, the subscriber the
//! subscriptions, [`operator::OperatorConfig`] the settings, [`health`] the
//! health; the load table keeps of them only what selection reads, told by
//! the shell through [`load_table::LoadTable::apply`].
//!
//! Architecture invariant: only [`shell`] (which saves the operator
//! configuration and the bindings through [`store`]), the servers
//! `admin::serve`, `http::serve`, `redirect::serve` and the etcd task
//! (`store::etcd`) perform I/O or read a clock; the cores take `now` as an
//! argument.
pub mod admin;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod daemon_cli;
pub mod error;
pub mod estimate;
pub mod health;
pub mod http;
pub mod legs;
pub mod load_table;
pub mod metrics;
pub mod names;
pub mod operator;
pub mod redirect;
pub mod registrar;
pub mod select;
pub mod shell;
pub mod store;
pub mod subscriber;
pub mod topology;

pub use config::CollectorConfig;
pub use error::CollectorError;
pub use shell::{check_environment, run, start, CollectorHandle};
