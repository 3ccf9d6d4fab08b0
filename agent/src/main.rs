//! `msr-agent`: parses the command line, sets up logging, runs
//! [`msr_agent::run`] until SIGTERM/SIGINT and maps errors to exit code 1.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// The config file read when `--config` is not given.
const DEFAULT_CONFIG: &str = "/etc/ecss/ecss-media-server/config.xml";

/// How long after SIGTERM/SIGINT the process exits even if the graceful
/// shutdown has not finished.
const EXIT_DEADLINE: Duration = Duration::from_secs(5);

/// MSR host agent: registers the media server's accounts with the core and
/// reports its load (SIP event package eltex-call-count).
#[derive(Debug, Parser)]
#[command(
    name = "msr-agent",
    version,
    long_about = "\
MSR host agent.

Reads the media server's XML config unchanged (general, transport, media,
accounts/dynamic and the optional <agent .../> element), registers every
<dynamic> account with its realm (the core host's collector) with digest
authentication, and answers SUBSCRIBE for the eltex-call-count event with
NOTIFYs carrying the host's load (msr, load, cpu, calls, max-calls).

The config file is watched: accounts added or removed, a new load-delta and
other agent settings apply without a restart; a broken file is reported and
the last good config stays in force. SIGTERM or SIGINT ends every
subscription (reason=deactivated), unregisters every account (Expires: 0)
and exits 0.

Logs go to stderr, or to <general log-path>/<log-name> when both are set and
--log-stderr is not given. RUST_LOG overrides the level.",
    after_help = "\
Examples:
  msr-agent --config /etc/ecss/ecss-media-server/config.xml
  msr-agent --config config-examples/msr-loopback.xml --log-stderr -v
  msr-agent --config config.xml --check-config"
)]
struct Cli {
    /// The media server's XML config.
    #[arg(short, long, value_name = "FILE", default_value = DEFAULT_CONFIG)]
    config: PathBuf,

    /// Validate the config, print a summary and exit (0 valid, 1 invalid).
    #[arg(long)]
    check_config: bool,

    /// More log output (-v debug, -vv trace).
    #[arg(short, long, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    verbose: u8,

    /// Less log output (-q warnings, -qq errors only).
    #[arg(short, long, action = clap::ArgAction::Count)]
    quiet: u8,

    /// Log to stderr even when the config names a log file.
    #[arg(long)]
    log_stderr: bool,
}

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
    if cli.check_config {
        print_summary(&cli.config, &config);
        return Ok(ExitCode::SUCCESS);
    }
    let _guard = init_tracing(&cli, &config)?;
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

fn print_summary(path: &Path, config: &msr_agent::AgentConfig) {
    println!("{}: ok", path.display());
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

/// Installs the tracing subscriber: stderr, or the config's log file.
/// Returns the appender guard that flushes the file on drop.
fn init_tracing(
    cli: &Cli,
    config: &msr_agent::AgentConfig,
) -> anyhow::Result<Option<tracing_appender::non_blocking::WorkerGuard>> {
    let verbosity = i8::try_from(i16::from(cli.verbose) - i16::from(cli.quiet)).unwrap_or(0);
    let level = msr_shared::logging::filter_directive(verbosity);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let file = match (
        &config.general.log_path,
        &config.general.log_name,
        cli.log_stderr,
    ) {
        (Some(dir), Some(name), false) => Some((dir.clone(), name.clone())),
        _ => None,
    };
    if let Some((dir, name)) = file {
        let path = dir.join(&name);
        // Fail early with a clear message instead of losing every log line.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| anyhow::anyhow!("{}: cannot open log file: {e}", path.display()))?;
        let appender = if config.general.log_rotate {
            tracing_appender::rolling::daily(&dir, &name)
        } else {
            tracing_appender::rolling::never(&dir, &name)
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
