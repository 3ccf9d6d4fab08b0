//! `msr-collector`: parses the command line, installs logging, loads the
//! config and runs [`msr_collector::run`] until SIGTERM/SIGINT.

use std::process::ExitCode;

use clap::Parser;
use msr_collector::daemon_cli::{Cli, StoreTask, Target, Task};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// Every SIP message and selection allocates a few dozen small strings;
/// mimalloc's per-thread free lists serve them at about half the cost of
/// glibc's malloc (BENCHMARKS.md, redirect throughput).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let verbosity = i8::try_from(i16::from(cli.verbose) - i16::from(cli.quiet)).unwrap_or(0);
    let level = msr_shared::logging::filter_directive(verbosity);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let flood = msr_shared::logging::FloodLimit::default();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .fmt_fields(msr_shared::logging::EscapingFields)
        .finish()
        .with(flood.clone())
        .init();

    let outcome = run(cli, &flood);
    // What the rate limit of network-caused lines still holds back.
    flood.finish();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli, flood: &msr_shared::logging::FloodLimit) -> anyhow::Result<()> {
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
        // The shipped production config's placeholder: valid, but no MSR
        // configured with its own credentials will authenticate.
        for account in config.accounts.iter().filter(|a| a.password == "change-me") {
            eprintln!(
                "note: [[accounts]] auth_name {:?} still has the example's password \"change-me\": \
                 set it to the auth_password of the MSRs' <dynamic> accounts",
                account.auth_name
            );
        }
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        tokio::spawn(flood.clone().flush_periodically());
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
