//! `msr-quickstart`: the whole system on 127.0.0.1 in one command.
//!
//! Starts one `msr-collector` and three `msr-agent`s from `config-examples/`,
//! holds UDP sockets open in each agent's RTP range so that their loads are
//! real readings (10 %, 40 %, 70 % of `max-calls`), waits until every MSR is
//! registered and subscribed, prints the resource and subscription tables,
//! runs selections and compares each MSR's share with the share its weight
//! predicts, then keeps showing load changes until Ctrl-C (`--once` exits
//! after the report). Every child gets SIGTERM on the way out.

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use msr_shared::admin::{ErrorCode, Request, ResourceInfo, Response, ResponseData};
use system_tests::{bin_path, example, workspace_root, AdminClient, ChildGuard};

/// Run a local collector with three agents on 127.0.0.1 and show selection at work.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Exit after the report instead of watching for changes.
    #[arg(long)]
    once: bool,
    /// Number of selections to run for the share report.
    #[arg(long, default_value_t = 10_000)]
    selections: u32,
    /// Simulated media sessions per agent (max-calls is 100 in the examples).
    #[arg(long, value_delimiter = ',', default_value = "10,40,70")]
    calls: Vec<u16>,
    /// Where the children's logs go.
    #[arg(long, default_value = "/tmp/msr-quickstart")]
    log_dir: PathBuf,
}

/// One simulated MSR: its agent config and RTP range.
struct Msr {
    name: &'static str,
    config: &'static str,
    rtp_start: u16,
}

const MSRS: [Msr; 3] = [
    Msr { name: "msr_1", config: "msr-loopback.xml", rtp_start: 20000 },
    Msr { name: "msr_2", config: "msr-loopback-2.xml", rtp_start: 21000 },
    Msr { name: "msr_3", config: "msr-loopback-3.xml", rtp_start: 22000 },
];

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli).await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn step(text: impl AsRef<str>) {
    println!("==> {}", text.as_ref());
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.calls.len() != MSRS.len() {
        bail!("--calls needs {} numbers, got {}", MSRS.len(), cli.calls.len());
    }
    std::fs::create_dir_all(&cli.log_dir)
        .with_context(|| format!("cannot create {}", cli.log_dir.display()))?;
    let collector_config = example("collector.toml");
    let socket = control_socket(&collector_config)?;
    for bin in ["msr-collector", "msr-agent", "msrctl"] {
        if !bin_path(bin).exists() {
            bail!("{} not found: build the workspace first (cargo build --release)", bin_path(bin).display());
        }
    }

    // Simulated media sessions: UDP sockets on even ports of each RTP range.
    let mut held: Vec<UdpSocket> = Vec::new();
    for (msr, &calls) in MSRS.iter().zip(&cli.calls) {
        for i in 0..calls {
            let port = msr.rtp_start + 2 * i;
            let s = UdpSocket::bind(("127.0.0.1", port))
                .with_context(|| format!("cannot hold rtp port {port} for {}", msr.name))?;
            held.push(s);
        }
        step(format!("{}: holding {calls} media sessions on even ports from {}", msr.name, msr.rtp_start));
    }

    step(format!("starting msr-collector --config {}", rel(&collector_config)));
    let mut children = Vec::new();
    children.push(("msr-collector".to_owned(), spawn(
        "msr-collector",
        &["--config", &collector_config.to_string_lossy()],
        &cli.log_dir.join("collector.log"),
    )?));
    let mut admin = AdminClient::connect_retry(&socket, Duration::from_secs(10))
        .await
        .with_context(|| format!("collector control socket {} did not appear (see {})", socket.display(), cli.log_dir.join("collector.log").display()))?;
    step(format!("collector is up, control socket {}", socket.display()));

    for msr in &MSRS {
        let cfg = example(msr.config);
        step(format!("starting msr-agent --config {}", rel(&cfg)));
        let log = cli.log_dir.join(format!("{}.log", msr.name));
        children.push((msr.name.to_owned(), spawn("msr-agent", &["--config", &cfg.to_string_lossy(), "--log-stderr"], &log)?));
    }

    // The operator configuration the share report relies on.
    match admin.call(&Request::SiteDeclare { name: "local".into() }).await? {
        Response::Ok(_) => step("declared site local"),
        Response::Err(e) if e.code == ErrorCode::SiteExists => {}
        Response::Err(e) => bail!("site declare local: {}", e.message),
    }

    step("waiting for every MSR to register, subscribe and report its load");
    let expected: BTreeMap<&str, u8> = MSRS.iter().zip(&cli.calls).map(|(m, &c)| (m.name, c.min(100) as u8)).collect();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let rows = resources(&mut admin).await?;
        for r in &rows {
            let state = format!("{} {}, subscription {}, load {}", r.contact, r.status, r.subscription, r.load.map_or("-".into(), |l| format!("{l}%")));
            if seen.get(&r.msr) != Some(&state) {
                println!("    {state}");
                seen.insert(r.msr.clone(), state);
            }
        }
        let ready = expected.iter().all(|(name, load)| {
            rows.iter().any(|r| r.msr == *name && r.status == "registered" && r.subscription == "active" && r.load == Some(*load))
        });
        if ready {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("not every MSR reported its load within 60 s; logs in {}", cli.log_dir.display());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for msr in &MSRS {
        let _ = admin.call(&Request::MsrSetPerformanceCoefficient { msr: msr.name.into(), value: 1.0 }).await?;
        let _ = admin.call(&Request::MsrSetActive { msr: msr.name.into(), active: true }).await?;
    }

    println!();
    msrctl(&socket, &["resource", "list"])?;
    msrctl(&socket, &["subscription", "list"])?;

    let rows = resources(&mut admin).await?;
    let (zone, site) = rows.first().map(|r| (r.zone.clone(), r.site.clone())).unwrap_or_else(|| ("default".into(), "local".into()));
    step(format!("{} selections for a leg in zone {zone}, site {site}", cli.selections));
    let mut picks: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..cli.selections {
        let req = Request::Select { zone: zone.clone(), site: site.clone(), msr: None, random: None, explain: false };
        match admin.call(&req).await? {
            Response::Ok(ResponseData::Selected(s)) => *picks.entry(s.msr).or_default() += 1,
            Response::Ok(other) => bail!("unexpected reply to select: {other:?}"),
            Response::Err(e) => bail!("select refused: {} ({})", e.message, e.code),
        }
    }
    let weights: BTreeMap<String, f64> = rows.iter().map(|r| (r.msr.clone(), (100.0 - f64::from(r.load.unwrap_or(0))) * r.performance_coefficient)).collect();
    let total: f64 = weights.values().sum();
    println!();
    println!("  {:<8} {:>6} {:>6} {:>8} {:>10} {:>10}", "MSR", "load", "coef", "weight", "predicted", "observed");
    for (msr, w) in &weights {
        let row = rows.iter().find(|r| &r.msr == msr);
        let load = row.and_then(|r| r.load).unwrap_or(0);
        let coef = row.map_or(1.0, |r| r.performance_coefficient);
        let n = picks.get(msr).copied().unwrap_or(0);
        println!(
            "  {:<8} {:>5}% {:>6.1} {:>8.1} {:>9.1}% {:>9.1}%",
            msr, load, coef, w, 100.0 * w / total, 100.0 * f64::from(n) / f64::from(cli.selections.max(1))
        );
    }
    println!();

    if !cli.once {
        step("watching load changes; Ctrl-C stops everything");
        step(format!("try: {} --socket {} select --zone {zone} --site {site} --explain", bin_path("msrctl").display(), socket.display()));
        let mut last: BTreeMap<String, (Option<u8>, String)> = rows.iter().map(|r| (r.contact.clone(), (r.load, r.status.clone()))).collect();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = tick.tick() => {
                    for r in resources(&mut admin).await? {
                        let now = (r.load, r.status.clone());
                        if last.get(&r.contact) != Some(&now) {
                            println!("    {} load {} {}", r.contact, r.load.map_or("-".into(), |l| format!("{l}%")), r.status);
                            last.insert(r.contact.clone(), now);
                        }
                    }
                }
            }
        }
    }

    step("stopping agents and collector (SIGTERM)");
    for (name, mut child) in children.into_iter().rev() {
        match child.terminate(Duration::from_secs(6)) {
            Some(status) if status.success() => println!("    {name} exited cleanly"),
            Some(status) => println!("    {name} exited with {status}"),
            None => println!("    {name} did not stop within 6 s; killed"),
        }
    }
    drop(held);
    Ok(())
}

async fn resources(admin: &mut AdminClient) -> anyhow::Result<Vec<ResourceInfo>> {
    match admin.call(&Request::ResourceList { active_only: false }).await? {
        Response::Ok(ResponseData::Resources { rows }) => Ok(rows),
        Response::Ok(other) => bail!("unexpected reply to resource list: {other:?}"),
        Response::Err(e) => bail!("resource list: {}", e.message),
    }
}

fn spawn(bin: &str, args: &[&str], log: &Path) -> anyhow::Result<ChildGuard> {
    let file = std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut cmd = Command::new(bin_path(bin));
    cmd.args(args).stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file);
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

fn control_socket(config: &Path) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(config).with_context(|| format!("cannot read {}", config.display()))?;
    let value: toml::Value = text.parse().with_context(|| format!("{} is not valid TOML", config.display()))?;
    value
        .get("control")
        .and_then(|c| c.get("socket"))
        .and_then(|s| s.as_str())
        .map(PathBuf::from)
        .with_context(|| format!("{}: no [control] socket", config.display()))
}

fn rel(path: &Path) -> String {
    path.strip_prefix(workspace_root()).unwrap_or(path).display().to_string()
}
