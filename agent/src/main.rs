//! `msr-agent`: parses the command line, sets up logging, runs
//! [`msr_agent::run`] until SIGTERM/SIGINT and maps errors to exit code 1.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use msr_agent::cli::{Cli, Command};
use msr_agent::control::{self, ControlAnswer, ControlError, ControlRequest};
use msr_agent::drain::WhenDrained;
use msr_agent::log_file::{LogFile, ReopeningFile};
use msr_shared::event_package::Service;
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
    if let Some(command) = &cli.command {
        return Ok(control_command(command, &cli.control_socket));
    }
    if cli.check_config {
        return Ok(ExitCode::from(check_config(&cli)));
    }
    let mut config = msr_agent::config::load(&cli.config)?.with_time_scale(cli.time_scale);
    if let Some(port) = cli.sip_port {
        config = config.with_sip_port(port, &cli.config)?;
    }
    let log_file = match &cli.log_file {
        Some(path) => Some(LogFile::new(path)),
        None => LogFile::from_config(&config.agent).filter(|_| !cli.log_stderr),
    };
    let flood = msr_shared::logging::FloodLimit::default();
    // Kept to the end: dropping it flushes the log file, counts included.
    let (_guard, reopening) = init_tracing(&cli, log_file, &flood)?;
    msr_shared::logging::abort_on_panic("msr-agent");
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
            Some(cli.control_socket.clone()),
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

/// Prints a line of a control command's output. A reader that went away
/// (`msr-agent status | head -1`) is no reason to panic: the line is
/// dropped, and the command's exit status still says how it went.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// [`say!`] for stderr.
macro_rules! esay {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// How often `drain --wait` asks the agent.
const WAIT_POLL: Duration = Duration::from_millis(250);

/// `msr-agent drain|undrain|status`: one request to the running agent
/// (SPEC §14); messages to stdout, errors to stderr, exit 1 on failure.
fn control_command(command: &Command, socket: &std::path::Path) -> ExitCode {
    let request = match command {
        Command::Drain {
            exit_when_empty, ..
        } => ControlRequest::Drain(if *exit_when_empty {
            WhenDrained::Exit
        } else {
            WhenDrained::Stay
        }),
        Command::Undrain => ControlRequest::Undrain,
        Command::Status => ControlRequest::Status,
    };
    let answer = match control::ask(socket, request) {
        Ok(answer) => answer,
        Err(e) => {
            esay!("msr-agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    say!("{}", describe(&answer));
    match command {
        Command::Drain {
            wait: true,
            timeout,
            exit_when_empty,
        } => wait_drained(
            socket,
            *exit_when_empty,
            timeout.map(Duration::from_secs),
            answer,
        ),
        _ => ExitCode::SUCCESS,
    }
}

fn describe(answer: &ControlAnswer) -> String {
    let drained = if answer.drained { ", drained" } else { "" };
    let exit = if answer.when_drained == WhenDrained::Exit {
        ", exits when empty"
    } else {
        ""
    };
    format!(
        "service: {}{drained}{exit}\nengine: {}\nsessions: {}",
        answer.service, answer.engine, answer.calls
    )
}

/// `drain --wait`: until drained (and gone, with `--exit-when-empty`).
/// `first` is the agent's answer to the drain request.
fn wait_drained(
    socket: &std::path::Path,
    exit: bool,
    timeout: Option<Duration>,
    first: ControlAnswer,
) -> ExitCode {
    let start = std::time::Instant::now();
    let mut last_print = start;
    let mut left = Some(first.calls);
    // With --exit-when-empty the agent's exit is the success, but only
    // once its engine was seen empty: an agent killed or stopped with
    // sessions left did not drain, and a script that restarts the engine
    // next (SPEC §14) must not run.
    let mut seen_empty = first.drained || first.calls == 0;
    loop {
        match control::ask(socket, ControlRequest::Status) {
            Ok(answer) if answer.service != Service::Draining => {
                esay!("msr-agent: the drain was ended (undrain)");
                return ExitCode::FAILURE;
            }
            Ok(answer) if answer.drained && !exit => {
                say!("drained: the engine has no session");
                return ExitCode::SUCCESS;
            }
            Ok(answer) => {
                left = Some(answer.calls);
                seen_empty = answer.drained || answer.calls == 0;
                if last_print.elapsed() >= Duration::from_secs(1) {
                    last_print = std::time::Instant::now();
                    if answer.drained {
                        say!("drained: waiting for the agent to exit");
                    } else {
                        say!("draining: {} sessions left", answer.calls);
                    }
                }
            }
            // Shutting down after the drain: wait for it to be gone.
            Err(ControlError::Refused(_)) if exit => {}
            Err(e) if exit && e.is_not_running() && seen_empty => {
                say!("drained: the agent has exited");
                return ExitCode::SUCCESS;
            }
            Err(e) if exit && e.is_not_running() => {
                let left = left.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
                esay!(
                    "msr-agent: the agent stopped before it was drained ({left} sessions left at its last answer): {e}"
                );
                return ExitCode::FAILURE;
            }
            Err(e) => {
                esay!("msr-agent: {e}");
                return ExitCode::FAILURE;
            }
        }
        if let Some(limit) = timeout {
            if start.elapsed() >= limit {
                let left = left.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
                esay!(
                    "msr-agent: not drained within {} s ({left} sessions left); the drain goes on (msr-agent undrain ends it)",
                    limit.as_secs()
                );
                return ExitCode::FAILURE;
            }
        }
        std::thread::sleep(WAIT_POLL);
    }
}

/// `--check-config` (SPEC §13): 0 when the agent would start on this host
/// with its config, 1 when not, each reason and every warning named
/// ([`msr_shared::check`], the collector's rules).
fn check_config(cli: &Cli) -> u8 {
    use msr_shared::check::{is_local_address, listen_address, CheckReport, Proto};
    let mut report = CheckReport::default();
    let loaded = msr_agent::config::load(&cli.config).and_then(|config| match cli.sip_port {
        Some(port) => config.with_sip_port(port, &cli.config),
        None => Ok(config),
    });
    let config = match loaded {
        Ok(config) => config,
        Err(e) => {
            report.reason(e.to_string());
            return report.print(&cli.config, "msr-agent", "");
        }
    };
    let log_file = match &cli.log_file {
        Some(path) => Some(LogFile::new(path)),
        None => LogFile::from_config(&config.agent).filter(|_| !cli.log_stderr),
    };
    if let Some(Err(e)) = log_file.as_ref().map(LogFile::check) {
        report.reason(e.to_string());
    }
    for warning in &config.warnings {
        report.warning(warning.clone());
    }
    if let Some(tls) = &config.agent.tls {
        match tls.read() {
            Err(e) => report.reason(format!("<agent {}> {e}", tls.attribute_of(&e.path))),
            Ok(_) => {
                for warning in tls.warnings(config.tls_msrs(), std::time::SystemTime::now()) {
                    report.warning(warning);
                }
            }
        }
    }
    // The agent binds its own SIP port on bind-addr and puts that address
    // in its Contacts (SPEC §3): it must be this host's. The engine's own
    // port is the engine's, never bound by the agent.
    let bind = config.transport.bind_addr;
    match is_local_address(bind) {
        Err(e) => report.reason(format!("<transport bind-addr=\"{bind}\">: {e}")),
        Ok(()) => listen_address(
            &mut report,
            "the agent's sip port (<agent sip-port>, --sip-port)",
            std::net::SocketAddr::new(bind, config.agent.sip_port),
            Proto::Udp,
        ),
    }
    report.print(
        &cli.config,
        "msr-agent",
        &summary(&config, log_file.as_ref()),
    )
}

/// What the agent would run with, one fact a line.
fn summary(config: &msr_agent::AgentConfig, log_file: Option<&LogFile>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    match log_file {
        Some(file) => {
            let _ = write!(out, "log: {}", file.path().display());
        }
        None => out.push_str("log: stderr"),
    }
    let _ = write!(
        out,
        "\nengine: sip {} {} mcc {}",
        config.transport.transport,
        std::net::SocketAddr::new(config.transport.bind_addr, config.transport.port),
        config
            .mcc
            .map_or_else(|| "none".to_owned(), |m| m.to_string())
    );
    let _ = write!(
        out,
        "\nagent: sip udp {}",
        std::net::SocketAddr::new(config.transport.bind_addr, config.agent.sip_port)
    );
    // A TCP or TLS registrar reaches the agent only over the connection
    // the agent opens (SPEC §4): the UDP port is not how it is reached.
    if config.accounts.iter().any(|a| a.realm.is_stream()) {
        out.push_str(" (tcp and tls registrars: over the connection the agent opens)");
    }
    let _ = write!(
        out,
        "\nload: sensor={} delta={} max-calls={} calls-source={}",
        config.general.load_sensor,
        config.general.load_delta,
        config.general.max_calls,
        config.agent.calls_source
    );
    let _ = write!(
        out,
        "\nengine probe: {} (engine-probe={})",
        config.engine_probe(),
        config.agent.engine_probe
    );
    let _ = write!(
        out,
        "\nmedia: ports {}..{} video-enc {}",
        config.media.port_start,
        config.media.port_end(),
        config.media.video_enc_size()
    );
    // The video size is shown only: the core selects by codecs (SPEC §15).
    let _ = write!(out, "\ncodecs: {}", config.codecs_shown());
    let _ = write!(out, "\naccounts: {}", config.accounts.len());
    for a in &config.accounts {
        let over = if a.realm.is_sips() {
            "tls"
        } else if a.realm.is_tcp() {
            "tcp"
        } else {
            "udp"
        };
        let _ = write!(
            out,
            "\n  {} -> {} over {over} (auth {})",
            a.msr_name, a.realm, a.auth_name
        );
    }
    out
}

/// What SIGHUP does: reopen the agent's own log file (after logrotate moved
/// it); the text is logged. The config needs no signal: the agent watches
/// the file.
fn reopen_log(file: Option<&ReopeningFile>) -> Result<String, String> {
    match file {
        Some(file) => match file.reopen() {
            Ok(()) => Ok(format!("log file {} reopened", file.path().display())),
            Err(e) => Err(format!("{e}; still writing to the file opened before")),
        },
        None => Ok("logging to stderr, nothing to reopen; the agent reloads its config when the file changes".to_owned()),
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
