//! `msr-agent`: parses the command line, sets up logging, runs
//! [`msr_agent::run`] until SIGTERM/SIGINT and maps errors to exit code 1.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use msr_agent::cli::Cli;
use msr_agent::log_file::LogFile;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// How long after SIGTERM/SIGINT the process exits even if the graceful
/// shutdown has not finished.
const EXIT_DEADLINE: Duration = Duration::from_secs(5);

// The graceful shutdown (final NOTIFYs answered, then unregisters answered)
// must fit in the exit deadline.
const _: () = assert!(
    msr_agent::notifier::FINAL_NOTIFY_GRACE.as_millis() + msr_agent::SHUTDOWN_GRACE.as_millis()
        < EXIT_DEADLINE.as_millis()
);

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = msr_agent::config::load(&cli.config)?;
    let log_file = LogFile::from_config(&config.general).filter(|_| !cli.log_stderr);
    if cli.check_config {
        if let Some(file) = &log_file {
            file.check()?;
        }
        print_summary(&cli.config, &config, log_file.as_ref());
        return Ok(ExitCode::SUCCESS);
    }
    let _guard = init_tracing(&cli, &config, log_file)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let agent = tokio::spawn(msr_agent::run(config, Some(cli.config.clone()), shutdown.clone()));
        tokio::pin!(agent);
        tokio::select! {
            result = &mut agent => return result?.map(|()| ExitCode::SUCCESS).map_err(Into::into),
            signal = msr_shared::signals::shutdown_signal("the agent reloads its config when the file changes") => {
                tracing::info!(signal = signal?, "signal received, stopping");
            }
        }
        shutdown.cancel();
        match tokio::time::timeout(EXIT_DEADLINE, agent).await {
            Ok(result) => result?.map(|()| ExitCode::SUCCESS).map_err(Into::into),
            Err(_) => {
                tracing::warn!("graceful shutdown took too long, exiting");
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}

fn print_summary(path: &Path, config: &msr_agent::AgentConfig, log_file: Option<&LogFile>) {
    println!("{}: ok", path.display());
    match log_file {
        Some(file) => println!("log: {}", file.path().display()),
        None => println!("log: stderr"),
    }
    println!(
        "transport: {} {}:{}",
        config.transport.transport, config.transport.bind_addr, config.transport.port
    );
    println!(
        "load: sensor={} delta={} max-calls={} calls-source={}",
        config.general.load_sensor,
        config.general.load_delta,
        config.general.max_calls,
        config.agent.calls_source
    );
    println!(
        "media: ports {}..{}",
        config.media.port_start,
        config.media.port_end()
    );
    println!("accounts: {}", config.accounts.len());
    for a in &config.accounts {
        println!("  {} -> {} (auth {})", a.msr_name, a.realm, a.auth_name);
    }
}

/// Installs the tracing subscriber: stderr, or `log_file` (the config's,
/// unless `--log-stderr`). Returns the appender guard that flushes the file
/// on drop.
fn init_tracing(
    cli: &Cli,
    config: &msr_agent::AgentConfig,
    log_file: Option<LogFile>,
) -> anyhow::Result<Option<tracing_appender::non_blocking::WorkerGuard>> {
    let verbosity = i8::try_from(i16::from(cli.verbose) - i16::from(cli.quiet)).unwrap_or(0);
    let level = msr_shared::logging::filter_directive(verbosity);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    if let Some(file) = log_file {
        file.open()?;
        let appender = if config.general.log_rotate {
            tracing_appender::rolling::daily(&file.dir, &file.name)
        } else {
            tracing_appender::rolling::never(&file.dir, &file.name)
        };
        let (writer, guard) = tracing_appender::non_blocking(appender);
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer)
            .with_ansi(false)
            .init();
        Ok(Some(guard))
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
        Ok(None)
    }
}
