//! `msr-collector`: parses the command line, installs logging, loads the
//! config and runs [`msr_collector::run`] until SIGTERM/SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

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
                  RUST_LOG (e.g. RUST_LOG=msr_collector=debug) overrides -v/-q."
)]
struct Cli {
    /// Config file (TOML).
    #[arg(short, long, value_name = "FILE", default_value = msr_collector::config::DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    /// Validate the config file, print a summary and exit.
    #[arg(long)]
    check_config: bool,
    /// More logging (-v debug, -vv trace).
    #[arg(short, long, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    verbose: u8,
    /// Less logging (-q warnings, -qq errors only).
    #[arg(short, long, action = clap::ArgAction::Count)]
    quiet: u8,
    /// A one-off task instead of running the collector.
    #[command(subcommand)]
    task: Option<Task>,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// The operator store.
    #[command(subcommand)]
    Store(StoreTask),
}

#[derive(Debug, Subcommand)]
enum StoreTask {
    /// Move the file store at [state] path into etcd ([store] endpoints and
    /// prefix of the config), once: a prefix that already holds a
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
enum Target {
    Etcd,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let verbosity = i8::try_from(i16::from(cli.verbose) - i16::from(cli.quiet)).unwrap_or(0);
    let level = msr_shared::logging::filter_directive(verbosity);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let config = msr_collector::config::load(&cli.config)?;
    if let Some(Task::Store(StoreTask::Migrate {
        to: Target::Etcd,
        force,
    })) = cli.task
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let done = runtime.block_on(msr_collector::store::migrate::migrate(&config, force))?;
        let (sites, msrs, contacts) = done.counts;
        println!(
            "migrated {} to etcd {} key {} at revision {} ({sites} site(s), {msrs} msr setting(s), {contacts} contact setting(s))",
            done.from.display(),
            done.endpoints,
            done.key,
            done.revision
        );
        return Ok(());
    }
    if cli.check_config {
        // The error's own text already ends in its cause (no chain to print).
        msr_collector::check_environment(&config).map_err(|e| {
            anyhow::anyhow!(
                "{}: the config is valid, but this host is not ready for it: {e}",
                cli.config.display()
            )
        })?;
        // A collector running on this store is what a check on a live host
        // finds: the config may still be checked, but not started beside it.
        if let Err(e) = msr_collector::store::Store::new(config.state_path.clone()).check_unlocked()
        {
            eprintln!("note: {e}");
        }
        println!(
            "{}: ok (node {}, sip {} {:?}, {} account(s), control socket {}, store {})",
            cli.config.display(),
            config.node,
            config.sip.listen,
            config
                .sip
                .transports
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            config.accounts.len(),
            config.control_socket.display(),
            config.store.name()
        );
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let signals = shutdown.clone();
        tokio::spawn(async move {
            match msr_shared::signals::shutdown_signal(|| {
                "ignored: configuration changes need a restart".to_owned()
            })
            .await
            {
                Ok(signal) => tracing::info!(signal, "signal received, shutting down"),
                Err(e) => {
                    tracing::error!(error = %e, "cannot install signal handlers, shutting down")
                }
            }
            signals.cancel();
        });
        msr_collector::run(config, shutdown).await
    })?;
    Ok(())
}
