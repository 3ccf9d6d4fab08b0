//! The command line of the `msr-collector` daemon (msrctl's is [`crate::msrctl`]),
//! in the library so that the packaging generator (`msr-dist`) builds the
//! man page and the shell completions from this one definition.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// Core-host sidecar of media-server selection: registrar for MSR accounts,
/// subscriber of their eltex-call-count load, live load table, selection and
/// the msrctl control socket.
#[derive(Debug, Parser)]
#[command(
    name = "msr-collector",
    version,
    after_help = "Examples:\n  msr-collector --config config-examples/collector.toml --check-config\n  \
                  msr-collector --config /etc/msr-collector/collector.toml -v\n  \
                  msr-collector --config /etc/msr-collector/collector.toml store migrate --to etcd\n\n\
                  Signals: SIGHUP (systemctl reload) reads the config file again: what can change \
                  live does, what needs a restart is named in a warning, a bad file changes nothing. \
                  SIGTERM or SIGINT stops it cleanly (subscriptions ended, bindings saved).\n\n\
                  RUST_LOG (e.g. RUST_LOG=msr_collector=debug) overrides -v/-q."
)]
pub struct Cli {
    /// Config file (TOML).
    #[arg(short, long, value_name = "FILE", default_value = crate::config::DEFAULT_CONFIG_PATH)]
    pub config: PathBuf,
    /// Validate the config file, print a summary and exit.
    #[arg(long)]
    pub check_config: bool,
    /// More logging (-v debug, -vv trace).
    #[arg(short, long, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Less logging (-q warnings, -qq errors only).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub quiet: u8,
    /// A one-off task instead of running the collector.
    #[command(subcommand)]
    pub task: Option<Task>,
}

#[derive(Debug, Subcommand)]
pub enum Task {
    /// The operator store.
    #[command(subcommand)]
    Store(StoreTask),
}

#[derive(Debug, Subcommand)]
pub enum StoreTask {
    /// Move the file store (the config's state path) into etcd (its store
    /// endpoints and prefix), once: a prefix that already holds a
    /// configuration is left alone unless --force is given.
    Migrate {
        /// The backend to move to.
        #[arg(long, value_enum)]
        to: Target,
        /// Overwrite a configuration already in etcd.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Target {
    /// etcd (`[store] endpoints` and `prefix`).
    Etcd,
}
