//! `msr-collector`: parses the command line, installs logging, loads the
//! config and runs [`msr_collector::run`] until SIGTERM/SIGINT.

use std::process::ExitCode;

use clap::Parser;
use msr_collector::daemon::cli::{Cli, StoreTask, Target, Task};
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
    msr_shared::logging::abort_on_panic("msr-collector");

    if cli.check_config && cli.task.is_none() {
        return ExitCode::from(check_config(&cli.config));
    }
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
        let done = runtime.block_on(msr_collector::operator::store::migrate::migrate(
            &config, force,
        ))?;
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
    // A worker per core: the SIP readers and writer run beside the loop
    // that owns the state, and HTTP beside both (daemon module docs).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        tokio::spawn(flood.clone().flush_periodically());
        let shutdown = CancellationToken::new();
        let signals = shutdown.clone();
        let handle = msr_collector::start(config, shutdown.clone()).await?;
        let reload = handle.reload.clone();
        let path = cli.config.clone();
        tokio::spawn(async move {
            // SPEC §13: SIGHUP re-reads the TOML; a bad file changes nothing.
            let on_hup = move || match msr_collector::config::load(&path) {
                Ok(config) => {
                    // Said before the loop gets it, which then says what changed.
                    tracing::info!("SIGHUP: reloading {}", path.display());
                    let _ = reload.send(config);
                    Ok(String::new())
                }
                Err(e) => Err(format!(
                    "config reload failed, the collector runs on with the last good configuration: {e}"
                )),
            };
            match msr_shared::signals::shutdown_signal(on_hup).await {
                Ok(signal) => tracing::info!(signal, "signal received, shutting down"),
                Err(e) => {
                    tracing::error!(error = %e, "cannot install signal handlers, shutting down")
                }
            }
            signals.cancel();
        });
        handle.join.await.map_err(|e| msr_collector::CollectorError::Task {
            reason: e.to_string(),
        })?
    })?;
    Ok(())
}

/// `--check-config` (SPEC §13): 0 when the collector would start on this
/// host with `path`, 1 when not, each reason and every warning named
/// ([`msr_shared::check`]).
fn check_config(path: &std::path::Path) -> u8 {
    use msr_shared::check::{listen_address, CheckReport, Proto};
    let mut report = CheckReport::default();
    let config = match msr_collector::config::load(path) {
        Ok(config) => config,
        Err(e) => {
            report.reason(e.to_string());
            return report.print(path, "msr-collector", "");
        }
    };
    // The shipped production config's placeholder: valid, but no MSR
    // configured with its own credentials will authenticate.
    for account in config.accounts.iter().filter(|a| a.password == "change-me") {
        report.warning(format!(
            "[[accounts]] auth_name {:?} still has the example's password \"change-me\": \
             set it to the auth_password of the MSRs' <dynamic> accounts",
            account.auth_name
        ));
    }
    let problems = msr_collector::environment_problems(&config);
    let tls_usable = !problems
        .iter()
        .any(|e| matches!(e, msr_collector::CollectorError::SipTls(_)));
    for problem in problems {
        report.reason(problem.to_string());
    }
    if tls_usable {
        if let Some(tls) = &config.sip.tls {
            // SPEC §13: a certificate agents refuse at every handshake
            // would start, and register nobody.
            for problem in msr_collector::daemon::tls::validity(tls) {
                if problem.refused {
                    report.reason(problem.text);
                } else {
                    report.warning(problem.text);
                }
            }
            if let Some(unnamed) = msr_collector::daemon::tls::listen_address_unnamed(tls) {
                report.warning(unnamed);
            }
        }
    }
    listen_address(&mut report, "[sip] listen", config.sip.listen, Proto::Udp);
    if config.sip.tcp() {
        listen_address(
            &mut report,
            "[sip] listen (tcp)",
            config.sip.listen,
            Proto::Tcp,
        );
    }
    if let Some(http) = &config.http {
        listen_address(&mut report, "[http] listen", http.listen, Proto::Tcp);
    }
    if let Some(redirect) = &config.redirect {
        listen_address(
            &mut report,
            "[redirect] listen",
            redirect.listen,
            Proto::Udp,
        );
    }
    // SPEC §16: a `[defaults] site` the operator store does not declare
    // puts every new contact where no leg reaches it; a reload refuses it,
    // so the check does too. An empty store is a first start, which
    // declares it.
    if config.store == msr_collector::config::StoreBackend::File {
        if let Ok(operator) =
            msr_collector::operator::store::Store::new(config.state_path.clone()).load()
        {
            let topology = operator.topology();
            if topology.sites().next().is_some() && !topology.contains(&config.defaults.site) {
                report.reason(format!(
                    "[defaults] site {:?} is not declared in the operator store {} (declared: {}):                      a reload would be refused and every new contact would get a site no leg reaches;                      declare it first (msrctl site declare {}) or fix the name",
                    config.defaults.site.as_str(),
                    config.state_path.display(),
                    topology.sites().collect::<Vec<_>>().join(", "),
                    config.defaults.site.as_str(),
                ));
            }
        }
    }
    // A collector running on this store is what a check on a live host
    // finds: the config may still be checked, but not started beside it.
    if let Err(e) =
        msr_collector::operator::store::Store::new(config.state_path.clone()).check_unlocked()
    {
        report.warning(e.to_string());
    }
    let mut summary = format!(
        "node {}, sip {} {:?}, {} account(s), control socket {}, store {}",
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
    if let Some(tls) = &config.sip.tls {
        summary.push_str(&format!(", sip tls {}", tls.listen));
    }
    summary.push_str(&match &config.http {
        Some(http) => format!(", http {}", http.listen),
        None => ", http off".to_owned(),
    });
    if let Some(redirect) = &config.redirect {
        summary.push_str(&format!(", redirect {}", redirect.listen));
    }
    report.print(path, "msr-collector", &summary)
}
