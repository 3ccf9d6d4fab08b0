//! `msr-agent`: parses the command line, sets up logging, runs
//! [`msr_agent::run`] until SIGTERM/SIGINT and maps errors to exit code 1.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use msr_agent::cli::Cli;
use msr_agent::log_file::{LogFile, ReopeningFile};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
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
    let mut config = msr_agent::config::load(&cli.config)?;
    if let Some(port) = cli.sip_port {
        config = config.with_sip_port(port, &cli.config)?;
    }
    let log_file = match &cli.log_file {
        Some(path) => Some(LogFile::new(path)),
        None => LogFile::from_config(&config.agent).filter(|_| !cli.log_stderr),
    };
    if cli.check_config {
        if let Some(file) = &log_file {
            file.check()?;
        }
        print_summary(&cli.config, &config, log_file.as_ref());
        host_notes(&config);
        return Ok(ExitCode::SUCCESS);
    }
    let flood = msr_shared::logging::FloodLimit::default();
    // Kept to the end: dropping it flushes the log file, counts included.
    let (_guard, reopening) = init_tracing(&cli, log_file, &flood)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let outcome = run_agent(&runtime, cli, config, reopening.as_ref(), &flood);
    // What the rate limit of network-caused lines still holds back.
    flood.finish();
    outcome
}

/// Runs the agent on `runtime` until it ends or a signal stops it.
fn run_agent(
    runtime: &tokio::runtime::Runtime,
    cli: Cli,
    config: msr_agent::AgentConfig,
    reopening: Option<&ReopeningFile>,
    flood: &msr_shared::logging::FloodLimit,
) -> anyhow::Result<ExitCode> {
    runtime.block_on(async {
        tokio::spawn(flood.clone().flush_periodically());
        let shutdown = CancellationToken::new();
        let agent = tokio::spawn(msr_agent::run(
            config,
            Some(cli.config.clone()),
            shutdown.clone(),
        ));
        tokio::pin!(agent);
        tokio::select! {
            result = &mut agent => return result?.map(|()| ExitCode::SUCCESS).map_err(Into::into),
            signal = msr_shared::signals::shutdown_signal(|| reopen_log(reopening)) => {
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

/// What this host lacks for the config (it is valid; these are notes, as
/// the check may run on a build host): `bind-addr` not an address of this
/// host, or the agent's SIP port already taken.
fn host_notes(config: &msr_agent::AgentConfig) {
    let bind = config.transport.bind_addr;
    if !bind.is_unspecified() && msr_agent::interface_name(bind).is_none() {
        eprintln!(
            "note: <transport bind-addr=\"{bind}\"> is not an address of this host: \
             the agent cannot start here"
        );
        return;
    }
    let port = config.agent.sip_port;
    if port != 0 {
        if let Err(e) = std::net::UdpSocket::bind(std::net::SocketAddr::new(bind, port)) {
            eprintln!(
                "note: the agent's sip port {bind}:{port} cannot be bound now ({e}): \
                 set <agent sip-port> or --sip-port to a free port"
            );
        }
    }
}

fn print_summary(path: &Path, config: &msr_agent::AgentConfig, log_file: Option<&LogFile>) {
    println!("{}: ok", path.display());
    match log_file {
        Some(file) => println!("log: {}", file.path().display()),
        None => println!("log: stderr"),
    }
    println!(
        "engine: sip {} {} mcc {}",
        config.transport.transport,
        std::net::SocketAddr::new(config.transport.bind_addr, config.transport.port),
        config
            .mcc
            .map_or_else(|| "none".to_owned(), |m| m.to_string())
    );
    println!(
        "agent: sip udp {}",
        std::net::SocketAddr::new(config.transport.bind_addr, config.agent.sip_port)
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

/// What SIGHUP does: reopen the agent's own log file (after logrotate moved
/// it); the text is logged. The config needs no signal: the agent watches
/// the file.
fn reopen_log(file: Option<&ReopeningFile>) -> String {
    match file {
        Some(file) => match file.reopen() {
            Ok(()) => format!("log file {} reopened", file.path().display()),
            Err(e) => format!("{e}; still writing to the file opened before"),
        },
        None => "logging to stderr, nothing to reopen; the agent reloads its config when the file changes".to_owned(),
    }
}

/// Installs the tracing subscriber: stderr, or `log_file` (the agent's own,
/// unless `--log-stderr`). Returns the appender guard that flushes the file
/// on drop and the writer SIGHUP reopens.
fn init_tracing(
    cli: &Cli,
    log_file: Option<LogFile>,
    flood: &msr_shared::logging::FloodLimit,
) -> anyhow::Result<(
    Option<tracing_appender::non_blocking::WorkerGuard>,
    Option<ReopeningFile>,
)> {
    let verbosity = i8::try_from(i16::from(cli.verbose) - i16::from(cli.quiet)).unwrap_or(0);
    let level = msr_shared::logging::filter_directive(verbosity);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    if let Some(file) = log_file {
        let reopening = file.open_reopening()?;
        let (writer, guard) = tracing_appender::non_blocking(reopening.clone());
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer)
            .with_ansi(false)
            .fmt_fields(msr_shared::logging::EscapingFields)
            .finish()
            .with(flood.clone())
            .init();
        Ok((Some(guard), Some(reopening)))
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .fmt_fields(msr_shared::logging::EscapingFields)
            .finish()
            .with(flood.clone())
            .init();
        Ok((None, None))
    }
}
