//! `msr-quickstart`: the whole system on 127.0.0.1 in one command.
//!
//! Starts one `msr-collector` and three `msr-agent`s from `config-examples/`,
//! holds UDP sockets open in each agent's RTP range so that their loads are
//! real readings (10 %, 40 %, 70 % of `max-calls`), waits until every MSR is
//! registered and subscribed, prints the resource and subscription tables,
//! runs selections and compares each MSR's share with the share its weight
//! predicts, then keeps showing load changes until Ctrl-C (`--once` exits
//! after the report). Every child gets SIGTERM on the way out.
//!
//! Each run has a private run folder (mode 0700, printed first: the configs
//! it ran with, the logs, the control socket and a fresh operator store),
//! under `$XDG_RUNTIME_DIR` or else the system's temporary directory, so two
//! users (or two runs) never share one; `--run-dir` names one. Every port
//! (the collector's SIP and HTTP ports, each agent's engine and SIP ports,
//! the RTP ranges) is one that is free at start, unless `--sip-port`,
//! `--http-port` or `--rtp-base` chooses it.

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use msr_shared::admin::{
    subscription_name, Request, ResourceInfo, Response, ResponseData, SelectQuery,
};
use msr_shared::admin::{HealthState, RegistrationStatus};
use msr_shared::subscription::SubscriptionState;
use system_tests::{bin_path, example, workspace_root, AdminClient, ChildGuard};
use tokio_util::sync::CancellationToken;

/// Run a local collector with three agents on 127.0.0.1 and show selection at work.
#[derive(Parser, Debug)]
#[command(
    name = "msr-quickstart",
    version,
    after_help = "Run by scripts/quickstart.sh (which builds the release binaries first).\n\
                  While it watches, try the msrctl command it prints (its --socket is in the run folder)."
)]
struct Cli {
    /// Exit after the report instead of watching for changes.
    #[arg(long)]
    once: bool,
    /// Number of selections to run for the share report (at least 1: the
    /// report is each MSR's share of them).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    selections: u32,
    /// Simulated media sessions per agent, one number for each of the three,
    /// each 0 to 100 (the examples' max-calls: 100 is a full MSR, and the
    /// agent reports more as 100 too).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10,40,70",
        value_parser = clap::value_parser!(u16).range(0..=100)
    )]
    calls: Vec<u16>,
    /// The run folder: the configs, the children's logs, the collector's
    /// control socket (`control.sock`) and its fresh operator store
    /// (default: a new private folder under $XDG_RUNTIME_DIR or the system's
    /// temporary directory).
    #[arg(long, alias = "log-dir")]
    run_dir: Option<PathBuf>,
    /// The collector's SIP port on 127.0.0.1 (default: one free at start).
    #[arg(long)]
    sip_port: Option<u16>,
    /// The collector's HTTP port on 127.0.0.1 (default: one free at start).
    #[arg(long)]
    http_port: Option<u16>,
    /// The collector's SIP redirect port on 127.0.0.1, where an INVITE gets
    /// a 302 to the chosen MSR (default: one free at start).
    #[arg(long)]
    redirect_port: Option<u16>,
    /// The first MSR's RTP range starts here, the others 1000 and 2000
    /// higher (default: the first base from 20000 on, in steps of 3000,
    /// whose session ports are free).
    #[arg(long)]
    rtp_base: Option<u16>,
}

/// One simulated MSR: its agent config.
struct Msr {
    name: &'static str,
    config: &'static str,
}

const MSRS: [Msr; 3] = [
    Msr {
        name: "msr_1",
        config: "msr-loopback.xml",
    },
    Msr {
        name: "msr_2",
        config: "msr-loopback-2.xml",
    },
    Msr {
        name: "msr_3",
        config: "msr-loopback-3.xml",
    },
];

/// Each MSR's RTP range (`<media port-range>` of the examples).
const RTP_RANGE: u16 = 1000;

/// A UDP port on 127.0.0.1 that is free now, and the one after it
/// (an agent listens on its engine's port + 1).
fn free_udp_pair() -> anyhow::Result<u16> {
    for _ in 0..200 {
        let first = UdpSocket::bind("127.0.0.1:0")?;
        let port = first.local_addr()?.port();
        if port < u16::MAX && UdpSocket::bind(("127.0.0.1", port + 1)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no two adjacent free udp ports on 127.0.0.1")
}

fn free_tcp_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("cannot find a free tcp port")?
        .port())
}

/// The run folder: `chosen`, or a new one; either is private (0700) when
/// made here: the collector's config in it holds the accounts' passwords.
fn run_folder(chosen: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = chosen {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        return Ok(dir.to_path_buf());
    }
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new()
        .prefix("msr-quickstart-")
        .tempdir_in(&base)
        .with_context(|| format!("cannot create a run folder in {}", base.display()))?;
    let dir = dir.keep();
    // Only this user: the folder holds the collector's control socket.
    std::fs::set_permissions(
        &dir,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700),
    )
    .with_context(|| format!("cannot make {} private", dir.display()))?;
    Ok(dir)
}

/// `text` with attribute `attr` of the first `<element …>` tag set to
/// `value`.
fn set_attr(text: &str, element: &str, attr: &str, value: &str) -> anyhow::Result<String> {
    let open = format!("<{element} ");
    let start = text
        .find(&open)
        .with_context(|| format!("no <{element}> in the example"))?;
    let end = start + text[start..].find('>').context("an unclosed tag")?;
    let tag = &text[start..end];
    let key = format!(" {attr}=\"");
    let at = tag
        .find(&key)
        .with_context(|| format!("no {attr} in <{element}>"))?
        + key.len();
    let close = at + tag[at..].find('"').context("an unclosed attribute")?;
    Ok(format!(
        "{}{value}{}",
        &text[..start + at],
        &text[start + close..]
    ))
}

/// The example agent config with this run's ports: the engine's SIP port
/// (the agent listens on it + 1), its media-control port, the collector's
/// address in the realm and the RTP range.
fn agent_config(
    example: &Path,
    engine: u16,
    mcc: u16,
    collector: u16,
    rtp: u16,
) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(example)
        .with_context(|| format!("cannot read {}", example.display()))?;
    let text = set_attr(&text, "transport", "port", &engine.to_string())?;
    let text = set_attr(&text, "mcc", "port", &mcc.to_string())?;
    let text = set_attr(&text, "media", "port-start", &rtp.to_string())?;
    let text = set_attr(
        &text,
        "dynamic",
        "realm",
        &format!("sip:127.0.0.1:{collector}"),
    )?;
    Ok(text)
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let stop = CancellationToken::new();
    let result = match stop_on_signals(stop.clone()) {
        Ok(()) => tokio::select! {
            result = run(cli, stop.clone()) => result,
            // A signal before the watch: the run goes on to it and stops
            // its daemons in order there; one that never gets there is
            // dropped, which kills them (the guards).
            () = async {
                stop.cancelled().await;
                tokio::time::sleep(SETUP_STOP_LIMIT).await;
            } => Err(anyhow::anyhow!("stopped by a signal during the set-up; the daemons were killed")),
        },
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// How long a run stopped by a signal before its watch has to reach it.
const SETUP_STOP_LIMIT: Duration = Duration::from_secs(20);

/// Cancels `stop` at the first SIGINT (Ctrl-C), SIGTERM (`timeout`, a
/// service manager) or SIGHUP (the terminal closed): each stops the
/// daemons this run started, as Ctrl-C does, rather than ending the
/// quickstart and leaving them running (their own process groups keep
/// the terminal's signals from them).
fn stop_on_signals(stop: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let handler = |kind| signal(kind).context("cannot install a signal handler");
    let mut interrupt = handler(SignalKind::interrupt())?;
    let mut terminate = handler(SignalKind::terminate())?;
    let mut hangup = handler(SignalKind::hangup())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
            _ = hangup.recv() => {}
        }
        stop.cancel();
    });
    Ok(())
}

fn step(text: impl AsRef<str>) {
    println!("==> {}", text.as_ref());
}

async fn run(cli: Cli, stop: CancellationToken) -> anyhow::Result<()> {
    if cli.calls.len() != MSRS.len() {
        bail!(
            "--calls needs {} numbers, got {}",
            MSRS.len(),
            cli.calls.len()
        );
    }
    let run_dir = run_folder(cli.run_dir.as_deref())?;
    step(format!(
        "run folder {} (configs, logs, control socket, operator store)",
        run_dir.display()
    ));
    // The example config as it is, except for the control socket, the
    // operator store (a fresh one in the run folder, so that settings made
    // elsewhere on this machine don't change the report) and the ports.
    let socket = run_dir.join("control.sock");
    let sip_port = match cli.sip_port {
        Some(port) => port,
        None => free_udp_pair()?,
    };
    let http_port = match cli.http_port {
        Some(port) => port,
        None => free_tcp_port()?,
    };
    let redirect_port = match cli.redirect_port {
        Some(port) => port,
        None => free_udp_pair()?,
    };
    let collector_config = run_config(
        &example("collector.toml"),
        &socket,
        &run_dir.join("operator.json"),
        Ports {
            sip: sip_port,
            http: http_port,
            redirect: redirect_port,
        },
        &run_dir.join("collector.toml"),
    )?;
    for bin in ["msr-collector", "msr-agent", "msrctl"] {
        if !bin_path(bin).exists() {
            bail!(
                "{} not found: build the workspace first (cargo build --release)",
                bin_path(bin).display()
            );
        }
    }

    // Simulated media sessions: UDP sockets on even ports of each RTP range.
    let (rtp_base, held) = hold_sessions(cli.rtp_base, &cli.calls)?;
    for (i, (msr, calls)) in MSRS.iter().zip(&cli.calls).enumerate() {
        step(format!(
            "{}: holding {calls} media sessions on even ports from {}",
            msr.name,
            rtp_base + RTP_RANGE * i as u16
        ));
    }

    step(format!(
        "starting msr-collector --config {} (config-examples/collector.toml with its socket and store in the run folder, sip 127.0.0.1:{sip_port})",
        collector_config.display()
    ));
    let mut children = Vec::new();
    // Whatever ends the run — Ctrl-C, a refusal, an error, a daemon that
    // exited — the daemons still running are stopped in order.
    let outcome: anyhow::Result<Option<String>> = async {
        children.push((
            "msr-collector".to_owned(),
            run_dir.join("collector.log"),
            spawn(
                "msr-collector",
                &["--config", &collector_config.to_string_lossy()],
                &run_dir.join("collector.log"),
            )?,
        ));
        let mut admin = match AdminClient::connect_retry(&socket, Duration::from_secs(10)).await {
            Ok(admin) => admin,
            // A collector that could not start (its SIP port taken, say) says
            // why in its log: show it here, not only its path.
            Err(e) => match exited_child(&mut children) {
                Some(report) => bail!("{report}"),
                None => {
                    return Err(e).with_context(|| {
                        format!(
                            "collector control socket {} did not appear (see {})",
                            socket.display(),
                            run_dir.join("collector.log").display()
                        )
                    })
                }
            },
        };
        step(format!(
            "collector is up, control socket {}, http api http://127.0.0.1:{http_port}/health (and /metrics, /v1/resources, /v1/select), \
             sip redirect 127.0.0.1:{redirect_port} (an INVITE there gets a 302 to the chosen MSR: \
             sipp -sf {} -i 127.0.0.1 -m 20 127.0.0.1:{redirect_port}; each call's 302 binds a live \
             leg until released: msrctl leg list, msrctl release --call-id ID)",
            socket.display(),
            workspace_root().join("tests/sipp/redirect_uac.xml").display()
        ));

        for (i, msr) in MSRS.iter().enumerate() {
            let engine = free_udp_pair()?;
            let mcc = free_tcp_port()?;
            let rtp = rtp_base + RTP_RANGE * i as u16;
            let cfg = run_dir.join(format!("{}.xml", msr.name));
            std::fs::write(
                &cfg,
                agent_config(&example(msr.config), engine, mcc, sip_port, rtp)?,
            )
            .with_context(|| format!("cannot write {}", cfg.display()))?;
            step(format!(
                "starting msr-agent --config {} ({} with this run's ports: engine {engine}, agent {})",
                cfg.display(),
                rel(&example(msr.config)),
                engine + 1
            ));
            let log = run_dir.join(format!("{}.log", msr.name));
            // Each agent's control socket (`msr-agent drain`) in the run
            // folder, not the system's /run/msr-agent.
            let control = run_dir.join(format!("{}.sock", msr.name));
            children.push((
                msr.name.to_owned(),
                log.clone(),
                spawn(
                    "msr-agent",
                    &[
                        "--config",
                        &cfg.to_string_lossy(),
                        "--log-stderr",
                        "--control-socket",
                        &control.to_string_lossy(),
                    ],
                    &log,
                )?,
            ));
        }

        step("waiting for every MSR to register, subscribe and report its load");
        let expected: BTreeMap<&str, u8> = MSRS
            .iter()
            .zip(&cli.calls)
            .map(|(m, &c)| (m.name, c.min(100) as u8))
            .collect();
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(report) = exited_child(&mut children) {
                bail!("{report}");
            }
            let rows = resources(&mut admin).await?;
            for r in &rows {
                let state = format!(
                    "{} {}, subscription {}, load {}",
                    r.contact,
                    r.status,
                    subscription_name(r.subscription.as_ref()),
                    r.load.map_or("-".into(), |l| format!("{l}%"))
                );
                if seen.get(&r.msr) != Some(&state) {
                    println!("    {state}");
                    seen.insert(r.msr.clone(), state);
                }
            }
            let ready = expected.iter().all(|(name, load)| {
                rows.iter().any(|r| {
                    r.msr == *name
                        && r.status == RegistrationStatus::Registered
                        && r.subscription == Some(SubscriptionState::Active)
                        && r.load == Some(*load)
                })
            });
            if ready {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "not every MSR reported its load within 60 s; logs in {}",
                    run_dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        println!();
        msrctl(&socket, &["resource", "list"])?;
        msrctl(&socket, &["subscription", "list"])?;

        let rows = resources(&mut admin).await?;
        let (zone, site) = ("default".to_owned(), "local".to_owned());
        step(format!(
            "{} selections for a leg in zone {zone}, site {site}",
            cli.selections
        ));
        let mut picks: BTreeMap<String, u32> = BTreeMap::new();
        let mut example = None;
        // A refusal (every MSR full, `--calls` near 100) ends the report, not
        // the run: the daemons still stop in order below, then the run fails.
        let mut refused = None;
        for _ in 0..cli.selections {
            let req = Request::Select(SelectQuery::new(zone.clone(), site.clone()));
            match admin.call(&req).await? {
                Response::Ok(ResponseData::Selected(s)) => {
                    *picks.entry(s.msr.clone()).or_default() += 1;
                    example.get_or_insert(s);
                }
                Response::Ok(other) => bail!("unexpected reply to select: {other:?}"),
                Response::Err(e) => {
                    refused = Some(format!(
                        "select refused after {} selections: {} ({})",
                        picks.values().sum::<u32>(),
                        e.message,
                        e.code
                    ));
                    break;
                }
            }
        }
        if let Some(why) = &refused {
            println!("  {why}");
            return Ok(refused);
        }
        let weights: BTreeMap<String, f64> = rows
            .iter()
            .map(|r| {
                (
                    r.msr.clone(),
                    (100.0 - f64::from(r.load.unwrap_or(0))) * r.performance_coefficient,
                )
            })
            .collect();
        let total: f64 = weights.values().sum();
        println!();
        println!(
            "  {:<8} {:>6} {:>6} {:>8} {:>10} {:>10}",
            "MSR", "load", "coef", "weight", "predicted", "observed"
        );
        for (msr, w) in &weights {
            let row = rows.iter().find(|r| &r.msr == msr);
            let load = row.and_then(|r| r.load).unwrap_or(0);
            let coef = row.map_or(1.0, |r| r.performance_coefficient);
            let n = picks.get(msr).copied().unwrap_or(0);
            println!(
                "  {:<8} {:>5}% {:>6.1} {:>8.1} {:>9.1}% {:>9.1}%",
                msr,
                load,
                coef,
                w,
                100.0 * w / total,
                100.0 * f64::from(n) / f64::from(cli.selections.max(1))
            );
        }
        println!();
        if let Some(s) = example {
            // What a core does with an answer (SPEC §3, §7).
            println!(
                "  The first selection chose {} ({}): a core sends the leg's INVITE to {}",
                s.msr,
                s.contact,
                s.engine_uri
                    .as_deref()
                    .unwrap_or("(no engine address reported)")
            );
            if let Some(mcc) = &s.mcc {
                println!("  and drives the media engine through its media-control channel at {mcc}.");
            }
            println!(
                "  ({} is the agent's own address, where the collector subscribes.)",
                s.uri
            );
            println!();
        }

        if !cli.once {
            step(
                "watching load changes; the agents' loads are held fixed, so nothing prints until a \
                 registration, a load or a health changes (msrctl changes to coefficients or flags do not); \
                 Ctrl-C stops everything",
            );
            step(format!(
                "try: {} --socket {} select --zone {zone} --site {site} --explain",
                bin_path("msrctl").display(),
                socket.display()
            ));
            let mut last: BTreeMap<String, (Option<u8>, RegistrationStatus, HealthState)> = rows
                .iter()
                .map(|r| (r.contact.clone(), (r.load, r.status, r.health)))
                .collect();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => {
                        // A daemon that died is reported at once, with its log,
                        // rather than as a stale table or a socket error.
                        if let Some(report) = exited_child(&mut children) {
                            bail!("{report}");
                        }
                        for r in resources(&mut admin).await? {
                            let now = (r.load, r.status, r.health);
                            if last.get(&r.contact) != Some(&now) {
                                println!("    {} load {} {}, health {}", r.contact, r.load.map_or("-".into(), |l| format!("{l}%")), r.status, r.health);
                                last.insert(r.contact.clone(), now);
                            }
                        }
                    }
                }
            }
        }

        Ok(None)
    }
    .await;
    let failure = match outcome {
        Ok(refused) => refused,
        Err(e) => Some(format!("{e:#}")),
    };
    stop_all(children, held, &run_dir, failure)
}

/// Stops the daemons, agents first so that their unregisters and final
/// NOTIFYs reach a running collector, then the collector; names the run
/// folder, and fails with `failure` if the run had one.
fn stop_all(
    children: Vec<(String, PathBuf, ChildGuard)>,
    held: Vec<UdpSocket>,
    run_dir: &Path,
    failure: Option<String>,
) -> anyhow::Result<()> {
    step("stopping agents, then the collector (SIGTERM)");
    for (name, _, mut child) in children.into_iter().rev() {
        match child.terminate(Duration::from_secs(6)) {
            Some(status) if status.success() => println!("    {name} exited cleanly"),
            Some(status) => println!("    {name} exited with {status}"),
            None => println!("    {name} did not stop within 6 s; killed"),
        }
    }
    drop(held);
    step(format!(
        "the run folder {} stays with the logs and configs (remove it when done)",
        run_dir.display()
    ));
    match failure {
        Some(why) => Err(anyhow::anyhow!(why)),
        None => Ok(()),
    }
}

/// The first child that has exited, as a line naming it, its status and
/// the end of its log.
fn exited_child(children: &mut [(String, PathBuf, ChildGuard)]) -> Option<String> {
    for (name, log, guard) in children.iter_mut() {
        if let Ok(Some(status)) = guard.child.try_wait() {
            let tail = std::fs::read_to_string(&log)
                .map(|t| {
                    let lines: Vec<&str> = t.lines().collect();
                    lines[lines.len().saturating_sub(10)..].join("\n")
                })
                .unwrap_or_default();
            return Some(format!(
                "{name} exited unexpectedly ({status}); the end of {}:\n{tail}",
                log.display()
            ));
        }
    }
    None
}

async fn resources(admin: &mut AdminClient) -> anyhow::Result<Vec<ResourceInfo>> {
    match admin
        .call(&Request::ResourceList { active_only: false })
        .await?
    {
        Response::Ok(ResponseData::Resources { rows }) => Ok(rows),
        Response::Ok(other) => bail!("unexpected reply to resource list: {other:?}"),
        Response::Err(e) => bail!("resource list: {}", e.message),
    }
}

fn spawn(bin: &str, args: &[&str], log: &Path) -> anyhow::Result<ChildGuard> {
    let file =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut cmd = Command::new(bin_path(bin));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    // A process group of its own: Ctrl-C in the terminal reaches only the
    // quickstart, which then stops the children in order.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let child = cmd.spawn().with_context(|| format!("cannot start {bin}"))?;
    Ok(ChildGuard { child })
}

fn msrctl(socket: &Path, args: &[&str]) -> anyhow::Result<()> {
    println!("$ msrctl {}", args.join(" "));
    let status = Command::new(bin_path("msrctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .status()
        .context("cannot run msrctl")?;
    if !status.success() {
        bail!("msrctl {} failed: {status}", args.join(" "));
    }
    println!();
    Ok(())
}

/// The collector's ports on 127.0.0.1 in the quickstart.
struct Ports {
    sip: u16,
    http: u16,
    redirect: u16,
}

/// Writes `example` to `out` with `[control] socket`, `[state] path`,
/// `[sip] listen`, `[http] listen` and `[redirect] listen` (on 127.0.0.1,
/// `ports`) replaced, starting from an empty operator store.
fn run_config(
    example: &Path,
    socket: &Path,
    state: &Path,
    ports: Ports,
    out: &Path,
) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(example)
        .with_context(|| format!("cannot read {}", example.display()))?;
    let mut value: toml::Table = text
        .parse()
        .with_context(|| format!("{} is not valid TOML", example.display()))?;
    let mut set = |table: &str, key: &str, path: &Path| {
        let entry = value
            .entry(table)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let Some(t) = entry.as_table_mut() {
            t.insert(
                key.to_owned(),
                toml::Value::String(path.to_string_lossy().into_owned()),
            );
        }
    };
    set("control", "socket", socket);
    set("state", "path", state);
    set(
        "http",
        "listen",
        Path::new(&format!("127.0.0.1:{}", ports.http)),
    );
    set(
        "sip",
        "listen",
        Path::new(&format!("127.0.0.1:{}", ports.sip)),
    );
    set(
        "redirect",
        "listen",
        Path::new(&format!("127.0.0.1:{}", ports.redirect)),
    );
    for stale in [state.to_path_buf(), state.with_extension("json.tmp")] {
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => bail!("cannot remove {}: {e}", stale.display()),
        }
    }
    std::fs::write(out, toml::to_string(&value)?)
        .with_context(|| format!("cannot write {}", out.display()))?;
    Ok(out.to_path_buf())
}

/// Binds `calls[i]` UDP sockets on even ports from `base + i * 1000` for
/// each MSR: at `chosen`, or the first base from 20000 on (steps of 3000)
/// where every port of the three ranges is free (an agent counts every
/// socket in its range as a media session).
fn hold_sessions(chosen: Option<u16>, calls: &[u16]) -> anyhow::Result<(u16, Vec<UdpSocket>)> {
    let bind_all = |base: u16| -> std::io::Result<Vec<UdpSocket>> {
        let mut held = Vec::new();
        for (i, &n) in calls.iter().enumerate() {
            let start = u32::from(base) + u32::from(RTP_RANGE) * i as u32;
            for k in 0..u32::from(n) {
                let port =
                    u16::try_from(start + 2 * k).map_err(|_| std::io::ErrorKind::InvalidInput)?;
                held.push(UdpSocket::bind(("127.0.0.1", port))?);
            }
        }
        Ok(held)
    };
    if let Some(base) = chosen {
        let held = bind_all(base).with_context(|| {
            format!("cannot hold the media sessions' ports from --rtp-base {base}")
        })?;
        return Ok((base, held));
    }
    let mut base: u16 = 20000;
    while base <= 59000 {
        if let Ok(held) = bind_all(base) {
            return Ok((base, held));
        }
        base += 3 * RTP_RANGE;
    }
    bail!("no free rtp ranges between 20000 and 62000 on 127.0.0.1: choose one with --rtp-base")
}

fn rel(path: &Path) -> String {
    path.strip_prefix(workspace_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("msr-quickstart").chain(args.iter().copied()))
    }

    /// A report of no selections has nothing to share out, and calls above
    /// max-calls read as 100 % (the agent clamps its load): clap refuses
    /// both, naming the value.
    #[test]
    fn selections_and_calls_are_refused_outside_their_range() {
        let cli = parse(&[]).expect("the defaults");
        assert_eq!((cli.selections, cli.calls), (10_000, vec![10, 40, 70]));
        let cli = parse(&["--selections", "1", "--calls", "0,100,100"]).expect("the bounds");
        assert_eq!((cli.selections, cli.calls), (1, vec![0, 100, 100]));
        for (args, value) in [
            (&["--selections", "0"][..], "'0'"),
            (&["--calls", "10,40,150"][..], "'150'"),
            (&["--calls", "10,-1,70"][..], "'-1'"),
        ] {
            let err = parse(args).map(|_| ()).expect_err("out of range");
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{err}");
            assert!(err.to_string().contains(value), "{err}");
        }
    }

    /// `--calls`' bound is the examples' max-calls: each agent config the
    /// quickstart runs says 100.
    #[test]
    fn the_calls_bound_is_the_examples_max_calls() {
        for msr in &MSRS {
            let path = example(msr.config);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                text.contains("max-calls=\"100\""),
                "{}: the --calls bound (0 to 100) is its max-calls",
                path.display()
            );
        }
    }
}
