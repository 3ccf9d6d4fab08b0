//! `msr-loadgen`: measures a running `msr-collector` at scale.
//!
//! A benchmark tool, not a test: it prints figures and never asserts on time.
//!
//! * `notify` plays N fake MSRs over a few UDP sockets on 127.0.0.1: each
//!   REGISTERs (answering the digest challenge), answers the collector's
//!   SUBSCRIBE with 200 and then sends `eltex-call-count` NOTIFYs in that
//!   dialog at a target aggregate rate spread evenly over the MSRs. It counts
//!   what was sent, answered, retransmitted (own UDP timers: T1 = 500 ms,
//!   doubling to T2 = 4 s, given up at Timer F = 32 s) and lost, samples the
//!   collector's CPU and RSS from `/proc`, and finally checks through the
//!   control socket that every MSR's row shows the last load it sent.
//!   The MSRs answer the collector's OPTIONS keepalives (SPEC §5) with 200
//!   and count them.
//! * `select` runs N concurrent control-socket clients issuing `select`
//!   requests and reports round-trip latency and aggregate selections/s.
//! * `calls` is the core of a balancing check end to end (SPEC §10): it
//!   places calls through the control socket at offered load A (Poisson
//!   arrivals, exponential holding times, seeded), each a `select` with a
//!   fresh Call-ID, keeps every MSR's `file:` calls source (SPEC §2) equal
//!   to the calls it holds, and at call end lowers the count and sends
//!   `release` (SPEC §9). It measures blocking, the time-average spread of
//!   occupancy between MSRs and NOTIFY/s as `msr-sim` defines them, so the
//!   two can be set side by side (BALANCING.md).
//!
//! Messages are written as text for throughput (this is a test tool);
//! everything received is parsed with rsipstack.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use msr_shared::admin::RegistrationStatus;
use msr_shared::admin::{ErrorCode, Request, Response, ResponseData, SelectQuery};
use msr_shared::event_package::{LoadReport, CONTENT_TYPE, EVENT};
use msr_shared::sip::{self, Method, SipMessage, StatusCode};
use msr_shared::subscription::SubscriptionState;
use rsipstack::dialog::authenticate::compute_digest;
use rsipstack::sip::headers::auth::{Algorithm, AuthQop};
use system_tests::system::try_write_atomic;
use system_tests::AdminClient;
use tokio::net::UdpSocket;

const USER_AGENT: &str = concat!("msr-loadgen/", env!("CARGO_PKG_VERSION"));
/// RFC 3261 T1: first retransmission interval of a non-INVITE request over UDP.
const T1: Duration = Duration::from_millis(500);
/// RFC 3261 T2: cap of the retransmission interval.
const T2: Duration = Duration::from_secs(4);
/// RFC 3261 Timer F: a non-INVITE client transaction gives up after 64 × T1.
const TIMER_F: Duration = Duration::from_secs(32);

/// Load generator for msr-collector: NOTIFY throughput and selection latency.
///
/// Benchmarks only; every figure is printed, nothing is asserted.
#[derive(Parser, Debug)]
#[command(
    name = "msr-loadgen",
    version,
    after_help = "Examples:\n  \
    msr-loadgen notify --collector 127.0.0.1:5060 --msrs 1000 --rate 5000 --duration 30 --socket /tmp/msr-collector.sock\n  \
    msr-loadgen select --socket /tmp/msr-collector.sock --clients 4 --requests 100000 --declare-site\n  \
    msr-loadgen calls --socket /tmp/msr-collector.sock --msr msr_1=/run/msr_1.calls --msr msr_2=/run/msr_2.calls --offered 90 --holding-ms 5000 --duration 300"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Play N fake MSRs: REGISTER, accept SUBSCRIBE, send NOTIFYs at a target rate.
    ///
    /// Phases: (1) register every MSR (digest auth), (2) wait until the
    /// collector has subscribed to every MSR and answered the first NOTIFY of
    /// each dialog, (3) send NOTIFYs at --rate for --duration seconds,
    /// round-robin over the MSRs, (4) drain: wait for the answers still
    /// outstanding (retransmitting as RFC 3261 does, up to Timer F), (5) with
    /// --socket, compare each MSR's row in `resource list` with the last load
    /// it sent.
    Notify(NotifyArgs),
    /// Run `select` over the control socket from N concurrent clients.
    Select(SelectArgs),
    /// Place and release calls at an offered load, driving the agents'
    /// `file:` calls sources: blocking, occupancy spread, NOTIFY/s.
    ///
    /// Every MSR given with --msr must be registered, subscribed and
    /// reporting 0 calls (the files are set to 0 first). A call placed on
    /// an MSR that already holds `max-calls` is counted lost (its INVITE
    /// would fail) and released at once; a call still up when the
    /// measured phase ends is released then.
    Calls(CallsArgs),
    /// Flood the collector as a stranger would: unauthenticated REGISTERs,
    /// OPTIONS, INVITEs and garbage, each with a new branch and Call-ID,
    /// from --sources loopback addresses (127.0.1.x), at --rate datagrams/s
    /// for --duration seconds; INVITEs go to --redirect as well when given.
    /// Prints what it sent and, with --collector-pid, the collector's CPU
    /// and RSS.
    Flood(FloodArgs),
    /// Write a test PKI (a CA and a collector certificate for 127.0.0.1)
    /// and print the collector's `[sip.tls]` table for it.
    Pki(PkiArgs),
}

#[derive(Args, Debug)]
struct FloodArgs {
    /// The collector's SIP UDP address.
    #[arg(long, default_value = "127.0.0.1:5060")]
    collector: SocketAddr,
    /// The redirect server's address: a share of the INVITEs goes there.
    #[arg(long)]
    redirect: Option<SocketAddr>,
    /// Datagrams per second, over all sources.
    #[arg(long, default_value_t = 50_000.0)]
    rate: f64,
    /// Seconds.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Source addresses (127.0.1.1, 127.0.1.2, …; at most 250).
    #[arg(long, default_value_t = 200)]
    sources: u8,
    /// PID of the collector to sample.
    #[arg(long)]
    collector_pid: Option<u32>,
}

#[derive(Args, Debug)]
struct NotifyArgs {
    /// The collector's SIP UDP address.
    #[arg(long, default_value = "127.0.0.1:5060")]
    collector: SocketAddr,
    /// Number of fake MSRs (`msr_lg_0` …).
    #[arg(long, default_value_t = 1000)]
    msrs: usize,
    /// Target aggregate NOTIFY rate, per second, over all MSRs.
    #[arg(long, default_value_t = 5000.0)]
    rate: f64,
    /// Length of the measured NOTIFY phase, seconds.
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// Number of local UDP sockets the MSRs are spread over.
    #[arg(long, default_value_t = 4)]
    sockets: usize,
    /// Digest user name.
    #[arg(long, default_value = "msr")]
    auth_name: String,
    /// Digest password.
    #[arg(long, default_value = "msr-secret")]
    password: String,
    /// Digest algorithm to answer with: the first one offered, or a given one.
    #[arg(long, value_enum, default_value_t = DigestChoice::First)]
    digest: DigestChoice,
    /// `Expires` of the REGISTERs (never refreshed: keep it above the run time).
    #[arg(long, default_value_t = 3600)]
    register_expires: u32,
    /// REGISTER transactions started per second in phase 1.
    #[arg(long, default_value_t = 500.0)]
    register_rate: f64,
    /// Longest wait for phases 1 and 2 each, seconds.
    #[arg(long, default_value_t = 90)]
    setup_timeout: u64,
    /// Longest wait for outstanding answers after the measured phase, seconds.
    #[arg(long, default_value_t = 40)]
    drain_timeout: u64,
    /// Largest `Expires` granted to a SUBSCRIBE.
    #[arg(long, default_value_t = 3600)]
    max_subscribe_expires: u32,
    /// Keep at most one NOTIFY in flight per dialog: a slot whose previous
    /// NOTIFY is unanswered is skipped (counted as "coalesced") instead of
    /// sending another one (default: open loop, send regardless).
    #[arg(long)]
    one_in_flight: bool,
    /// PID of the collector to sample (default: the `msr-collector` process
    /// that owns the UDP port of --collector).
    #[arg(long)]
    collector_pid: Option<u32>,
    /// Control socket of the collector: verify the last loads at the end.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// After the drain, keep re-reading `resource list` once a second for up
    /// to this many seconds while rows still differ from the last load sent
    /// (shows how far the collector's table lags behind).
    #[arg(long, default_value_t = 30)]
    verify_wait: u64,
    /// Tokio worker threads of the load generator (1 = current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// How the MSRs reach the collector: over UDP (spread over --sockets),
    /// or each MSR on a connection of its own held for the whole run (TCP,
    /// or TLS to the collector's `[sip.tls]` listener, given as
    /// --collector), as agents with `transport=tcp` and `sips:` realms do
    /// (SPEC §4).
    #[arg(long, value_enum, default_value_t = Transport::Udp)]
    transport: Transport,
    /// The CA that signed the collector's certificate, for --transport tls
    /// (`msr-loadgen pki` writes one); the certificate must name the
    /// collector's IP address.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Exit 1 unless every MSR registered and was subscribed, every
    /// NOTIFY was answered 200 and, with --socket, every row shows the
    /// last load sent (a check for tests; figures are printed either way).
    #[arg(long)]
    check: bool,
}

/// The transport of `msr-loadgen notify`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Transport {
    Udp,
    Tcp,
    Tls,
}

impl Transport {
    /// The `Via` transport token (RFC 3261 §20.42).
    fn via(self) -> &'static str {
        match self {
            Transport::Udp => "UDP",
            Transport::Tcp => "TCP",
            Transport::Tls => "TLS",
        }
    }

    /// A SIP URI for `user@host` on this transport (RFC 3261 §19.1, §26.2).
    fn uri(self, user: Option<&str>, host: SocketAddr) -> String {
        let user = user.map(|u| format!("{u}@")).unwrap_or_default();
        match self {
            Transport::Udp => format!("sip:{user}{host}"),
            Transport::Tcp => format!("sip:{user}{host};transport=tcp"),
            Transport::Tls => format!("sips:{user}{host}"),
        }
    }

    fn is_stream(self) -> bool {
        self != Transport::Udp
    }
}

/// Writes test certificates for a TLS run.
#[derive(Args, Debug)]
struct PkiArgs {
    /// Folder for `ca.pem` and the collector's `collector.pem` and
    /// `collector.key` (for IP 127.0.0.1), among others.
    #[arg(long)]
    dir: PathBuf,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum DigestChoice {
    /// The first challenge the collector offers that we support.
    First,
    /// MD5.
    Md5,
    /// SHA-256.
    Sha256,
}

#[derive(Args, Debug)]
struct SelectArgs {
    /// Control socket of the collector.
    #[arg(long, default_value = "/tmp/msr-collector.sock")]
    socket: PathBuf,
    /// Concurrent clients (one connection each).
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Total selections over all clients.
    #[arg(long, default_value_t = 100_000)]
    requests: u64,
    #[command(flatten)]
    place: PlaceArgs,
    /// Ask for the explanation too (bigger answers).
    #[arg(long)]
    explain: bool,
    /// Tokio worker threads of the load generator (1 = current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Each request is a call leg (SPEC §9): a select with a new Call-ID,
    /// then its release; figures are per select+release pair.
    #[arg(long)]
    legs: bool,
}

/// Where the selected legs are (`select` and `calls`).
#[derive(Args, Debug)]
struct PlaceArgs {
    /// The legs' zone.
    #[arg(long, default_value = "default")]
    zone: String,
    /// The legs' site.
    #[arg(long, default_value = "local")]
    site: String,
    /// Declare --site first (an existing site is fine).
    #[arg(long)]
    declare_site: bool,
}

#[derive(Args, Debug)]
struct CallsArgs {
    /// Control socket of the collector.
    #[arg(long, default_value = "/tmp/msr-collector.sock")]
    socket: PathBuf,
    /// An MSR and the file its agent reads its sessions from
    /// (`calls-source="file:PATH"`), as NAME=PATH; once per MSR.
    #[arg(long = "msr", value_parser = parse_msr_file, required = true)]
    msrs: Vec<(String, PathBuf)>,
    /// Offered load, percent of the summed `max-calls` the MSRs report.
    #[arg(long, default_value_t = 90.0)]
    offered: f64,
    /// Offered load in Erlangs (instead of --offered).
    #[arg(long)]
    erlangs: Option<f64>,
    /// Mean holding time (exponential), milliseconds.
    #[arg(long, default_value_t = 5000)]
    holding_ms: u64,
    /// Warm-up, seconds: calls placed, not measured.
    #[arg(long, default_value_t = 30)]
    warmup: u64,
    /// Measured phase, seconds.
    #[arg(long, default_value_t = 300)]
    duration: u64,
    /// End the measured phase after this many calls (or --duration, whichever first).
    #[arg(long)]
    calls: Option<u64>,
    /// Seed of the arrivals and holding times.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    place: PlaceArgs,
    /// Longest wait for every MSR to be live at 0 calls, seconds.
    #[arg(long, default_value_t = 60)]
    setup_timeout: u64,
    /// Also write the summary here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() {
    let cli = Cli::parse();
    let threads = match &cli.command {
        Command::Notify(a) => a.threads,
        Command::Select(a) => a.threads,
        Command::Calls(_) | Command::Flood(_) | Command::Pki(_) => 1,
    };
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    let result = runtime.map_err(anyhow::Error::from).and_then(|rt| {
        rt.block_on(async {
            match cli.command {
                Command::Notify(a) => notify(a).await,
                Command::Select(a) => select(a).await,
                Command::Calls(a) => calls(a).await,
                Command::Flood(a) => flood(a).await,
                Command::Pki(a) => pki(&a),
            }
        })
    });
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

// ───────────────────────────── /proc sampling ─────────────────────────────

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(100.0)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A `kB` line of /proc/<pid>/status (`VmRSS`, `VmHWM`), in KiB.
fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// The pid of the `msr-collector` process owning UDP (or TCP, with
/// `tcp`) `port` (via /proc/net inodes and /proc/<pid>/fd), if any.
fn find_collector_pid(port: u16, tcp: bool) -> Option<u32> {
    let mut inodes = Vec::new();
    let tables = if tcp {
        ["/proc/net/tcp", "/proc/net/tcp6"]
    } else {
        ["/proc/net/udp", "/proc/net/udp6"]
    };
    for table in tables {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let Some(local) = f.get(1) else { continue };
            let Some((_, p)) = local.rsplit_once(':') else {
                continue;
            };
            if u16::from_str_radix(p, 16).ok() == Some(port) {
                if let Some(inode) = f.get(9) {
                    inodes.push(format!("socket:[{inode}]"));
                }
            }
        }
    }
    let procs = std::fs::read_dir("/proc").ok()?;
    for entry in procs.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "msr-collector" {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| target.to_string_lossy() == *i) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

#[derive(Default, Debug, Clone)]
struct ProcSamples {
    /// CPU% per one-second sample (100 = one core).
    cpu: Vec<f64>,
    rss_kib: Vec<u64>,
    hwm_kib: u64,
    /// Total CPU seconds over the sampled span.
    cpu_secs: f64,
    span_secs: f64,
}

impl ProcSamples {
    fn avg_cpu(&self) -> f64 {
        if self.span_secs > 0.0 {
            100.0 * self.cpu_secs / self.span_secs
        } else {
            0.0
        }
    }
    fn max_cpu(&self) -> f64 {
        self.cpu.iter().copied().fold(0.0, f64::max)
    }
    fn rss_first(&self) -> u64 {
        self.rss_kib.first().copied().unwrap_or(0)
    }
    fn rss_last(&self) -> u64 {
        self.rss_kib.last().copied().unwrap_or(0)
    }
    fn rss_max(&self) -> u64 {
        self.rss_kib.iter().copied().max().unwrap_or(0)
    }
}

/// Samples `pid` once a second until `stop` is cancelled.
async fn sample_process(pid: u32, stop: tokio_util::sync::CancellationToken) -> ProcSamples {
    let hz = clock_ticks();
    let mut out = ProcSamples::default();
    let start = Instant::now();
    let first = cpu_ticks(pid).unwrap_or(0);
    let (mut last_t, mut last_ticks) = (start, first);
    if let Some(rss) = status_kib(pid, "VmRSS:") {
        out.rss_kib.push(rss);
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let Some(ticks) = cpu_ticks(pid) else { break };
        let dt = now.duration_since(last_t).as_secs_f64();
        if dt > 0.0 {
            out.cpu
                .push(100.0 * (ticks.saturating_sub(last_ticks)) as f64 / hz / dt);
        }
        last_t = now;
        last_ticks = ticks;
        if let Some(rss) = status_kib(pid, "VmRSS:") {
            out.rss_kib.push(rss);
        }
    }
    let end = Instant::now();
    if let Some(ticks) = cpu_ticks(pid) {
        last_ticks = ticks;
    }
    out.cpu_secs = last_ticks.saturating_sub(first) as f64 / hz;
    out.span_secs = end.duration_since(start).as_secs_f64();
    out.hwm_kib = status_kib(pid, "VmHWM:").unwrap_or(0);
    out
}

// ───────────────────────────── statistics ─────────────────────────────

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn fmt_us(us: u64) -> String {
    if us >= 10_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{us} µs")
    }
}

// ───────────────────────────── notify: state ─────────────────────────────

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Register,
    Notify,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Setup,
    Measured,
    Drain,
}

struct Pending {
    kind: Kind,
    msr: usize,
    sock: usize,
    bytes: Arc<[u8]>,
    first_sent: Instant,
    next_retx: Instant,
    interval: Duration,
    retx: u32,
    measured: bool,
}

struct Dialog {
    call_id: String,
    /// Our tag (the To-tag of our 200).
    local_tag: String,
    /// The SUBSCRIBE's `From` value (URI and the collector's tag): our NOTIFY's `To`.
    remote_from: String,
    /// The SUBSCRIBE's `To` URI: our NOTIFY's `From`.
    local_uri: String,
    /// Where NOTIFYs go (the SUBSCRIBE's Contact).
    remote_target: String,
    cseq: u32,
    expires: u32,
    granted_at: Instant,
    /// The first NOTIFY of the dialog was answered 200.
    confirmed: bool,
}

struct Msr {
    name: String,
    sock: usize,
    reg_call_id: String,
    reg_from_tag: String,
    reg_cseq: u32,
    reg_expires: u32,
    registered: bool,
    reg_failed: Option<u16>,
    dialog: Option<Dialog>,
    /// Dialogs the collector created for this MSR.
    dialogs: u32,
    notify_seq: u64,
    last_load_sent: Option<u8>,
    /// NOTIFYs of this MSR without a final answer yet.
    in_flight: u32,
}

#[derive(Default, Debug, Clone)]
struct Counters {
    register_sent: u64,
    register_retx: u64,
    register_401: u64,
    register_423: u64,
    register_ok: u64,
    register_other: BTreeMap<u16, u64>,
    subscribe_initial: u64,
    subscribe_refresh: u64,
    subscribe_unsubscribe: u64,
    subscribe_retransmitted: u64,
    subscribe_rejected: u64,
    other_requests: u64,
    /// OPTIONS keepalives from the collector (SPEC §5), answered 200.
    options_answered: u64,
    parse_errors: u64,
    stray_responses: u64,
}

#[derive(Default, Debug, Clone)]
struct NotifyCounters {
    sent: u64,
    ok: u64,
    non_ok: BTreeMap<u16, u64>,
    /// NOTIFYs retransmitted at least once.
    retransmitted: u64,
    /// Retransmissions in all.
    retransmissions: u64,
    /// Given up at Timer F, or unanswered when the run ended.
    lost: u64,
    /// Answers to a transaction already answered or given up (late).
    late_answers: u64,
    coalesced: u64,
    /// Send time → final answer, µs.
    latency_us: Vec<u64>,
    last_answer: Option<Instant>,
}

struct State {
    collector: SocketAddr,
    transport: Transport,
    local_addrs: Vec<SocketAddr>,
    auth_name: String,
    password: String,
    digest: DigestChoice,
    max_sub_expires: u32,
    msrs: Vec<Msr>,
    pending: HashMap<String, Pending>,
    phase: Phase,
    c: Counters,
    setup: NotifyCounters,
    measured: NotifyCounters,
}

type Out = Vec<(usize, SocketAddr, Arc<[u8]>)>;

fn key(call_id: &str, cseq: u32) -> String {
    format!("{cseq} {call_id}")
}

fn branch() -> String {
    format!("z9hG4bK{}", sip::random_token())
}

/// The load MSR `i` reports in its `seq`-th NOTIFY: varies every time.
fn load_for(i: usize, seq: u64) -> u8 {
    ((seq.wrapping_mul(37) + (i as u64).wrapping_mul(11)) % 101) as u8
}

impl State {
    fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn counters(&mut self, measured: bool) -> &mut NotifyCounters {
        if measured {
            &mut self.measured
        } else {
            &mut self.setup
        }
    }

    fn register_request(&mut self, i: usize, authorization: Option<String>) -> Arc<[u8]> {
        let collector = self.collector;
        let local = self.local_addrs[self.msrs[i].sock];
        let m = &mut self.msrs[i];
        m.reg_cseq += 1;
        let ruri = self.transport.uri(None, collector);
        let contact = self.transport.uri(Some(&m.name), local);
        let via = self.transport.via();
        let mut text = format!(
            "REGISTER {ruri} SIP/2.0\r\n\
             Via: SIP/2.0/{via} {local};branch={};rport\r\n\
             Max-Forwards: 70\r\n\
             From: <sip:{name}@{collector}>;tag={tag}\r\n\
             To: <sip:{name}@{collector}>\r\n\
             Call-ID: {cid}\r\n\
             CSeq: {cseq} REGISTER\r\n\
             Contact: <{contact}>;iface=lo\r\n\
             Expires: {exp}\r\n\
             User-Agent: {USER_AGENT}\r\n",
            branch(),
            name = m.name,
            tag = m.reg_from_tag,
            cid = m.reg_call_id,
            cseq = m.reg_cseq,
            exp = m.reg_expires,
        );
        if let Some(a) = authorization {
            text.push_str(&format!("Authorization: {a}\r\n"));
        }
        text.push_str("Content-Length: 0\r\n\r\n");
        Arc::from(text.into_bytes())
    }

    /// Queues REGISTER for MSR `i` (first attempt or retry) and records it.
    fn send_register(
        &mut self,
        i: usize,
        authorization: Option<String>,
        now: Instant,
        out: &mut Out,
    ) {
        let bytes = self.register_request(i, authorization);
        let m = &self.msrs[i];
        let k = key(&m.reg_call_id, m.reg_cseq);
        let sock = m.sock;
        self.pending.insert(
            k,
            Pending {
                kind: Kind::Register,
                msr: i,
                sock,
                bytes: bytes.clone(),
                first_sent: now,
                next_retx: now + T1,
                interval: T1,
                retx: 0,
                measured: false,
            },
        );
        self.c.register_sent += 1;
        out.push((sock, self.collector, bytes));
    }

    /// Builds the next NOTIFY of MSR `i`'s dialog; `None` without a dialog.
    fn send_notify(&mut self, i: usize, now: Instant, out: &mut Out) -> bool {
        let measured = self.phase == Phase::Measured;
        let local = self.local_addrs[self.msrs[i].sock];
        let collector = self.collector;
        let via = self.transport.via();
        let m = &mut self.msrs[i];
        let contact = self.transport.uri(Some(&m.name), local);
        let Some(d) = m.dialog.as_mut() else {
            return false;
        };
        m.notify_seq += 1;
        let load = load_for(i, m.notify_seq);
        d.cseq += 1;
        let remaining =
            u64::from(d.expires).saturating_sub(now.duration_since(d.granted_at).as_secs());
        let body = LoadReport {
            msr: m.name.clone(),
            load,
            cpu: load / 2,
            calls: u32::from(load) * 80,
            max_calls: 8192,
        }
        .encode();
        let text = format!(
            "NOTIFY {target} SIP/2.0\r\n\
             Via: SIP/2.0/{via} {local};branch={};rport\r\n\
             Max-Forwards: 70\r\n\
             From: <{luri}>;tag={ltag}\r\n\
             To: {rfrom}\r\n\
             Call-ID: {cid}\r\n\
             CSeq: {cseq} NOTIFY\r\n\
             Contact: <{contact}>\r\n\
             Event: {EVENT}\r\n\
             Subscription-State: active;expires={remaining}\r\n\
             User-Agent: {USER_AGENT}\r\n\
             Content-Type: {CONTENT_TYPE}\r\n\
             Content-Length: {len}\r\n\r\n{body}",
            branch(),
            target = d.remote_target,
            luri = d.local_uri,
            ltag = d.local_tag,
            rfrom = d.remote_from,
            cid = d.call_id,
            cseq = d.cseq,
            len = body.len(),
        );
        let bytes: Arc<[u8]> = Arc::from(text.into_bytes());
        let k = key(&d.call_id, d.cseq);
        m.last_load_sent = Some(load);
        m.in_flight += 1;
        let sock = m.sock;
        self.pending.insert(
            k,
            Pending {
                kind: Kind::Notify,
                msr: i,
                sock,
                bytes: bytes.clone(),
                first_sent: now,
                next_retx: now + T1,
                interval: T1,
                retx: 0,
                measured,
            },
        );
        self.counters(measured).sent += 1;
        out.push((sock, collector, bytes));
        true
    }

    fn on_datagram(&mut self, data: &[u8], from: SocketAddr, sock: usize, out: &mut Out) {
        let now = Instant::now();
        match SipMessage::try_from(data) {
            Ok(SipMessage::Response(r)) => self.on_response(&r, now, out),
            Ok(SipMessage::Request(r)) => self.on_request(&r, from, sock, now, out),
            Err(_) => self.c.parse_errors += 1,
        }
    }

    fn on_response(&mut self, r: &sip::Response, now: Instant, out: &mut Out) {
        let code = r.status_code.code();
        if code < 200 {
            return;
        }
        let (Some(call_id), Some((cseq, _))) = (sip::call_id(&r.headers), sip::cseq(&r.headers))
        else {
            self.c.parse_errors += 1;
            return;
        };
        let Some(p) = self.pending.remove(&key(call_id, cseq)) else {
            // A retransmitted request answered twice, or answered after Timer F.
            self.c.stray_responses += 1;
            self.setup.late_answers += 1;
            return;
        };
        match p.kind {
            Kind::Notify => {
                let m = &mut self.msrs[p.msr];
                m.in_flight = m.in_flight.saturating_sub(1);
                if code == 200 {
                    if let Some(d) = m.dialog.as_mut().filter(|d| d.call_id == call_id) {
                        d.confirmed = true;
                    }
                }
                let c = self.counters(p.measured);
                if code == 200 {
                    c.ok += 1;
                } else {
                    *c.non_ok.entry(code).or_default() += 1;
                }
                c.latency_us
                    .push(now.duration_since(p.first_sent).as_micros() as u64);
                c.last_answer = Some(now);
            }
            Kind::Register => self.on_register_response(p.msr, r, code, now, out),
        }
    }

    fn on_register_response(
        &mut self,
        i: usize,
        r: &sip::Response,
        code: u16,
        now: Instant,
        out: &mut Out,
    ) {
        match code {
            200..=299 => {
                self.c.register_ok += 1;
                self.msrs[i].registered = true;
            }
            401 | 407 if self.msrs[i].reg_cseq < 6 => {
                self.c.register_401 += 1;
                let name = if code == 401 {
                    "WWW-Authenticate"
                } else {
                    "Proxy-Authenticate"
                };
                let challenges = sip::header_all(&r.headers, name);
                match self.authorization(&challenges) {
                    Some(auth) => self.send_register(i, Some(auth), now, out),
                    None => self.msrs[i].reg_failed = Some(code),
                }
            }
            423 if self.msrs[i].reg_cseq < 6 => {
                self.c.register_423 += 1;
                match sip::header(&r.headers, "Min-Expires").and_then(|v| v.parse::<u32>().ok()) {
                    Some(min) => {
                        self.msrs[i].reg_expires = min;
                        self.send_register(i, None, now, out);
                    }
                    None => self.msrs[i].reg_failed = Some(code),
                }
            }
            _ => {
                *self.c.register_other.entry(code).or_default() += 1;
                self.msrs[i].reg_failed = Some(code);
            }
        }
    }

    /// The `Authorization` value answering one of `challenges`.
    fn authorization(&self, challenges: &[&str]) -> Option<String> {
        let ruri = self.transport.uri(None, self.collector);
        for ch in challenges {
            let get = |k: &str| auth_param(ch, k);
            let token = get("algorithm").unwrap_or_else(|| "MD5".into());
            let algorithm = match token.to_ascii_uppercase().as_str() {
                "MD5" => Algorithm::Md5,
                "SHA-256" | "SHA256" => Algorithm::Sha256,
                _ => continue,
            };
            let wanted = match self.digest {
                DigestChoice::First => true,
                DigestChoice::Md5 => algorithm == Algorithm::Md5,
                DigestChoice::Sha256 => algorithm == Algorithm::Sha256,
            };
            if !wanted {
                continue;
            }
            let (Some(realm), Some(nonce)) = (get("realm"), get("nonce")) else {
                continue;
            };
            let qop_auth = get("qop").is_some_and(|q| q.split(',').any(|t| t.trim() == "auth"));
            let cnonce = sip::random_token();
            let qop = qop_auth.then(|| AuthQop::Auth {
                cnonce: cnonce.clone(),
                nc: 1,
            });
            let response = compute_digest(
                &self.auth_name,
                &self.password,
                &realm,
                &nonce,
                &Method::Register,
                &ruri,
                algorithm,
                qop.as_ref(),
            );
            let mut v = format!(
                "Digest username=\"{}\", realm=\"{realm}\", nonce=\"{nonce}\", uri=\"{ruri}\", \
                 response=\"{response}\", algorithm={token}",
                self.auth_name
            );
            if qop_auth {
                v.push_str(&format!(", qop=auth, nc=00000001, cnonce=\"{cnonce}\""));
            }
            if let Some(opaque) = get("opaque") {
                v.push_str(&format!(", opaque=\"{opaque}\""));
            }
            return Some(v);
        }
        None
    }

    fn on_request(
        &mut self,
        r: &sip::Request,
        from: SocketAddr,
        sock: usize,
        now: Instant,
        out: &mut Out,
    ) {
        let local = self.local_addrs[sock];
        let tag_for_new = sip::random_token();
        let respond = |status: StatusCode, to_tag: Option<&str>| sip::response(r, status, to_tag);
        if r.method != Method::Subscribe {
            if r.method == Method::Ack {
                return;
            }
            self.c.other_requests += 1;
            let status = if r.method == Method::Options {
                self.c.options_answered += 1;
                StatusCode::OK
            } else {
                StatusCode::MethodNotAllowed
            };
            out.push((
                sock,
                from,
                Arc::from(respond(status, Some(&tag_for_new)).to_bytes()),
            ));
            return;
        }
        let user = sip::uri_user(&r.uri.to_string())
            .map(str::to_owned)
            .unwrap_or_default();
        let index = user
            .strip_prefix("msr_lg_")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|i| *i < self.msrs.len());
        let Some(i) = index else {
            self.c.subscribe_rejected += 1;
            out.push((
                sock,
                from,
                Arc::from(respond(StatusCode::NotFound, Some(&tag_for_new)).to_bytes()),
            ));
            return;
        };
        if sip::event_package(&r.headers).as_deref() != Some(EVENT) {
            self.c.subscribe_rejected += 1;
            let mut resp = respond(StatusCode::BadEvent, Some(&tag_for_new));
            sip::push_header(&mut resp.headers, "Allow-Events", EVENT);
            out.push((sock, from, Arc::from(resp.to_bytes())));
            return;
        }
        let call_id = sip::call_id(&r.headers).unwrap_or_default().to_owned();
        let to = sip::header(&r.headers, "To").unwrap_or_default().to_owned();
        let requested = sip::expires(&r.headers).unwrap_or(60);
        let granted = requested.min(self.max_sub_expires);
        let contact = format!("<{}>", self.transport.uri(Some(&self.msrs[i].name), local));
        let m = &mut self.msrs[i];
        let to_tag = sip::tag(&to);
        let same_dialog = m.dialog.as_ref().is_some_and(|d| d.call_id == call_id);
        let mut send_first_notify = false;
        let our_tag = match (to_tag, same_dialog) {
            // A retransmitted initial SUBSCRIBE: the same answer again.
            (None, true) => {
                self.c.subscribe_retransmitted += 1;
                m.dialog
                    .as_ref()
                    .map(|d| d.local_tag.clone())
                    .unwrap_or_default()
            }
            (None, false) => {
                self.c.subscribe_initial += 1;
                m.dialogs += 1;
                let remote_target = sip::header(&r.headers, "Contact")
                    .map(|c| sip::addr_uri(c).to_owned())
                    .unwrap_or_else(|| format!("sip:{}", self.collector));
                m.dialog = Some(Dialog {
                    call_id: call_id.clone(),
                    local_tag: tag_for_new.clone(),
                    remote_from: sip::header(&r.headers, "From")
                        .unwrap_or_default()
                        .to_owned(),
                    local_uri: sip::addr_uri(&to).to_owned(),
                    remote_target,
                    cseq: 0,
                    expires: granted,
                    granted_at: now,
                    confirmed: false,
                });
                send_first_notify = granted > 0;
                tag_for_new
            }
            (Some(t), true) => {
                let d = m.dialog.as_mut().filter(|d| d.local_tag == t);
                match d {
                    Some(d) if granted == 0 => {
                        self.c.subscribe_unsubscribe += 1;
                        let tag = d.local_tag.clone();
                        m.dialog = None;
                        tag
                    }
                    Some(d) => {
                        self.c.subscribe_refresh += 1;
                        d.expires = granted;
                        d.granted_at = now;
                        d.local_tag.clone()
                    }
                    None => {
                        self.c.subscribe_rejected += 1;
                        let resp = respond(StatusCode::CallTransactionDoesNotExist, None);
                        out.push((sock, from, Arc::from(resp.to_bytes())));
                        return;
                    }
                }
            }
            (Some(_), false) => {
                self.c.subscribe_rejected += 1;
                let resp = respond(StatusCode::CallTransactionDoesNotExist, None);
                out.push((sock, from, Arc::from(resp.to_bytes())));
                return;
            }
        };
        let mut resp = respond(StatusCode::OK, Some(&our_tag));
        sip::push_header(&mut resp.headers, "Expires", granted.to_string());
        sip::push_header(&mut resp.headers, "Contact", contact);
        sip::push_header(&mut resp.headers, "Server", USER_AGENT);
        sip::push_header(&mut resp.headers, "Content-Length", "0");
        out.push((sock, from, Arc::from(resp.to_bytes())));
        if send_first_notify {
            self.send_notify(i, now, out);
        }
    }

    /// Retransmits what is due; gives up at Timer F (or at once when `end`).
    fn retransmit(&mut self, now: Instant, end: bool, out: &mut Out) {
        let mut lost = Vec::new();
        for (k, p) in self.pending.iter_mut() {
            if end || now.duration_since(p.first_sent) >= TIMER_F {
                lost.push(k.clone());
                continue;
            }
            // Over a stream the transport retransmits (RFC 3261 §17.1.2.2:
            // no Timer E); Timer F still ends the transaction.
            if p.next_retx <= now && self.transport == Transport::Udp {
                p.retx += 1;
                p.interval = (p.interval * 2).min(T2);
                p.next_retx = now + p.interval;
                out.push((p.sock, self.collector, p.bytes.clone()));
                match p.kind {
                    Kind::Register => self.c.register_retx += 1,
                    Kind::Notify => {
                        let c = if p.measured {
                            &mut self.measured
                        } else {
                            &mut self.setup
                        };
                        c.retransmissions += 1;
                        if p.retx == 1 {
                            c.retransmitted += 1;
                        }
                    }
                }
            }
        }
        for k in lost {
            if let Some(p) = self.pending.remove(&k) {
                match p.kind {
                    Kind::Register => self.msrs[p.msr].reg_failed = Some(408),
                    Kind::Notify => {
                        self.msrs[p.msr].in_flight = self.msrs[p.msr].in_flight.saturating_sub(1);
                        self.counters(p.measured).lost += 1;
                    }
                }
            }
        }
    }

    fn pending_of(&self, kind: Kind) -> usize {
        self.pending.values().filter(|p| p.kind == kind).count()
    }
}

/// A parameter of a `Digest …` challenge (quotes removed).
fn auth_param(value: &str, name: &str) -> Option<String> {
    let rest = value.trim();
    let rest = rest
        .strip_prefix("Digest")
        .or_else(|| rest.strip_prefix("digest"))?;
    let mut parts = Vec::new();
    let (mut quoted, mut start) = (false, 0);
    for (i, ch) in rest.char_indices() {
        match ch {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&rest[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&rest[start..]);
    parts.into_iter().find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// Where the MSRs' messages leave: UDP sockets shared by the MSRs, or one
/// connection per MSR (its writer task's queue).
enum Links {
    Udp(Vec<Arc<UdpSocket>>),
    Stream(Vec<tokio::sync::mpsc::UnboundedSender<Arc<[u8]>>>),
}

impl Links {
    async fn flush(&self, out: Out) {
        for (sock, to, bytes) in out {
            match self {
                // A full socket buffer shows up as a retransmission later.
                Links::Udp(socks) => {
                    let _ = socks[sock].send_to(&bytes, to).await;
                }
                // A closed connection shows up as a NOTIFY lost at Timer F.
                Links::Stream(queues) => {
                    let _ = queues[sock].send(bytes);
                }
            }
        }
    }
}

/// A connection to the collector: plain TCP, or TLS over it.
trait Connection: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// Opens `n` connections to `collector` (TLS verified by `ca` when given),
/// at most 32 handshakes at a time: the collector bounds its own
/// concurrent handshakes, and a flood of them is not what is measured.
async fn connect_all(
    collector: SocketAddr,
    n: usize,
    ca: Option<&std::path::Path>,
) -> anyhow::Result<Vec<(SocketAddr, Box<dyn Connection>)>> {
    let connector = ca.map(system_tests::pki::connector).transpose()?;
    let name = rustls::pki_types::ServerName::IpAddress(collector.ip().into());
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (gate, connector, name) = (gate.clone(), connector.clone(), name.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            let tcp = tokio::net::TcpStream::connect(collector)
                .await
                .with_context(|| format!("connect to {collector}"))?;
            tcp.set_nodelay(true)?;
            let local = tcp.local_addr()?;
            let stream: Box<dyn Connection> = match connector {
                Some(c) => Box::new(
                    c.connect(name, tcp)
                        .await
                        .with_context(|| format!("tls handshake with {collector}"))?,
                ),
                None => Box::new(tcp),
            };
            anyhow::Ok((i, local, stream))
        });
    }
    let mut out: Vec<Option<(SocketAddr, Box<dyn Connection>)>> = (0..n).map(|_| None).collect();
    while let Some(done) = tasks.join_next().await {
        let (i, local, stream) = done??;
        out[i] = Some((local, stream));
    }
    Ok(out.into_iter().flatten().collect())
}

/// Runs connection `idx`: writes what its queue gets, splits what it reads
/// into messages (RFC 3261 §18.3) and feeds them to the state; answers a
/// keepalive ping with a pong (RFC 5626 §3.5.1).
fn spawn_connection(
    idx: usize,
    peer: SocketAddr,
    stream: Box<dyn Connection>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<Arc<[u8]>>,
    state: Arc<Mutex<State>>,
    links: Arc<Links>,
    stop: tokio_util::sync::CancellationToken,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut reader, mut writer) = tokio::io::split(stream);
    let writer_stop = stop.clone();
    tokio::spawn(async move {
        loop {
            let bytes = tokio::select! {
                () = writer_stop.cancelled() => break,
                b = queue.recv() => match b { Some(b) => b, None => break },
            };
            if writer.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        let mut framer = sip::wire::StreamFramer::new();
        let mut buf = vec![0u8; 65_536];
        loop {
            let n = tokio::select! {
                () = stop.cancelled() => break,
                r = reader.read(&mut buf) => match r { Ok(0) | Err(_) => break, Ok(n) => n },
            };
            framer.push(&buf[..n]);
            let mut out = Vec::new();
            loop {
                match framer.next_frame() {
                    Ok(Some(sip::wire::Frame::Message(m))) => {
                        State::lock(&state).on_datagram(&m, peer, idx, &mut out);
                    }
                    Ok(Some(sip::wire::Frame::Ping)) => {
                        out.push((idx, peer, Arc::from(&b"\r\n"[..])));
                    }
                    Ok(None) => break,
                    Err(e) => {
                        eprintln!("connection {idx}: {e}; closing it");
                        return;
                    }
                }
            }
            links.flush(out).await;
        }
    });
}

// ───────────────────────────── notify: driver ─────────────────────────────

/// The `n`th datagram of the flood from `from` to `to`: REGISTER without
/// credentials, OPTIONS, INVITE or garbage in turn, each with a new branch
/// and Call-ID.
fn flood_datagram(n: u64, from: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let method = match n % 4 {
        0 => "REGISTER",
        1 => "OPTIONS",
        2 => "INVITE",
        _ => return format!("\u{1}garbage {n} \r\n\r\n").into_bytes(),
    };
    format!(
        "{method} sip:msr_flood@{to} SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bKflood{n};rport\r\n\
         From: <sip:msr_flood@{to}>;tag=f{n}\r\nTo: <sip:msr_flood@{to}>\r\nCall-ID: flood-{n}@{from}\r\n\
         CSeq: 1 {method}\r\nMax-Forwards: 70\r\nContact: <sip:msr_flood@{from}>;iface=lo\r\n\
         Expires: 60\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

async fn flood(args: FloodArgs) -> anyhow::Result<()> {
    let sources = usize::from(args.sources.clamp(1, 250));
    let mut sockets = Vec::with_capacity(sources);
    for i in 0..sources {
        let ip = std::net::Ipv4Addr::new(127, 0, 1, u8::try_from(i + 1).unwrap_or(250));
        let socket = std::net::UdpSocket::bind((ip, 0))
            .with_context(|| format!("bind a flood source on {ip}"))?;
        socket.set_nonblocking(true)?;
        sockets.push(socket);
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = args
        .collector_pid
        .map(|pid| tokio::spawn(sample_process(pid, stop.clone())));
    let start = Instant::now();
    let end = start + Duration::from_secs(args.duration);
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(1.0));
    let (mut sent, mut failed, mut to_redirect) = (0u64, 0u64, 0u64);
    let mut next = start;
    while Instant::now() < end {
        // Sends what is due in bursts of up to 1 ms, then sleeps.
        let now = Instant::now();
        while next <= now {
            let socket = &sockets[usize::try_from(sent).unwrap_or(0) % sources];
            let from = socket.local_addr()?;
            let mut to = args.collector;
            if let Some(redirect) = args.redirect {
                if sent % 4 == 2 && (sent / 4) % 2 == 1 {
                    to = redirect;
                    to_redirect += 1;
                }
            }
            match socket.send_to(&flood_datagram(sent, from, to), to) {
                Ok(_) => {}
                Err(_) => failed += 1,
            }
            sent += 1;
            next += interval;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    stop.cancel();
    println!(
        "flood: {sent} datagrams in {elapsed:.1} s ({:.0}/s) from {sources} sources, {to_redirect} INVITEs to the redirect server, {failed} send errors",
        sent as f64 / elapsed
    );
    if let Some(sampler) = sampler {
        let samples = sampler.await?;
        println!(
            "collector: cpu {:.1} % of one core, rss first {} MiB, max {} MiB, last {} MiB",
            samples.avg_cpu(),
            samples.rss_first() / 1024,
            samples.rss_max() / 1024,
            samples.rss_last() / 1024
        );
    }
    Ok(())
}

async fn notify(args: NotifyArgs) -> anyhow::Result<()> {
    if args.msrs == 0 || args.sockets == 0 || args.rate <= 0.0 {
        bail!("--msrs, --sockets and --rate must be positive");
    }
    let planned = args.setup_timeout * 2 + args.duration + args.drain_timeout;
    if u64::from(args.register_expires) < planned {
        eprintln!(
            "warning: --register-expires {} is shorter than the longest run ({planned} s); \
             registrations are not refreshed",
            args.register_expires
        );
    }
    if args.transport == Transport::Tls && args.tls_ca.is_none() {
        bail!("--transport tls needs --tls-ca (the CA of the collector's certificate)");
    }
    let mut socks = Vec::new();
    let mut local_addrs = Vec::new();
    let mut connections = Vec::new();
    if args.transport.is_stream() {
        let t = Instant::now();
        connections = connect_all(
            args.collector,
            args.msrs,
            args.tls_ca
                .as_deref()
                .filter(|_| args.transport == Transport::Tls),
        )
        .await?;
        local_addrs = connections.iter().map(|(local, _)| *local).collect();
        println!(
            "phase 0 connect: {} {} connections in {:.1} s",
            connections.len(),
            args.transport.via(),
            t.elapsed().as_secs_f64()
        );
    } else {
        for _ in 0..args.sockets.min(args.msrs) {
            // The daemons' own socket setup (a 4 MiB receive buffer): at
            // tens of thousands of answers a second the kernel's default
            // would drop some here, and the figures would be the tool's,
            // not the collector's.
            let s =
                msr_shared::sip::udp_socket("127.0.0.1:0".parse()?).context("bind udp socket")?;
            local_addrs.push(s.local_addr()?);
            socks.push(Arc::new(s));
        }
    }
    let nsock = local_addrs.len();
    let msrs = (0..args.msrs)
        .map(|i| Msr {
            name: format!("msr_lg_{i}"),
            sock: i % nsock,
            reg_call_id: format!("{}@msr-loadgen", sip::random_token()),
            reg_from_tag: sip::random_token(),
            reg_cseq: 0,
            reg_expires: args.register_expires,
            registered: false,
            reg_failed: None,
            dialog: None,
            dialogs: 0,
            notify_seq: 0,
            last_load_sent: None,
            in_flight: 0,
        })
        .collect();
    let state = Arc::new(Mutex::new(State {
        collector: args.collector,
        transport: args.transport,
        local_addrs: local_addrs.clone(),
        auth_name: args.auth_name.clone(),
        password: args.password.clone(),
        digest: args.digest,
        max_sub_expires: args.max_subscribe_expires,
        msrs,
        pending: HashMap::new(),
        phase: Phase::Setup,
        c: Counters::default(),
        setup: NotifyCounters::default(),
        measured: NotifyCounters::default(),
    }));
    let pid = args
        .collector_pid
        .or_else(|| find_collector_pid(args.collector.port(), args.transport.is_stream()));
    println!(
        "msr-loadgen notify: {} MSRs on {nsock} {} {} → collector {} (pid {})",
        args.msrs,
        args.transport.via(),
        if args.transport.is_stream() {
            "connection(s)".to_owned()
        } else {
            format!("socket(s) {local_addrs:?}")
        },
        args.collector,
        pid.map_or("unknown: no CPU/RSS figures".into(), |p| p.to_string())
    );

    // Receivers: one task per socket, or a reader and a writer per connection.
    let stop = tokio_util::sync::CancellationToken::new();
    let socks = if args.transport.is_stream() {
        let (queues, receivers): (Vec<_>, Vec<_>) = (0..connections.len())
            .map(|_| tokio::sync::mpsc::unbounded_channel())
            .unzip();
        let links = Arc::new(Links::Stream(queues));
        for (idx, ((_, stream), queue)) in connections.into_iter().zip(receivers).enumerate() {
            spawn_connection(
                idx,
                args.collector,
                stream,
                queue,
                state.clone(),
                links.clone(),
                stop.clone(),
            );
        }
        links
    } else {
        let links = Arc::new(Links::Udp(socks.clone()));
        for (idx, sock) in socks.iter().enumerate() {
            let (sock, state, links, stop) =
                (sock.clone(), state.clone(), links.clone(), stop.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65_536];
                loop {
                    let (n, from) = tokio::select! {
                        () = stop.cancelled() => break,
                        r = sock.recv_from(&mut buf) => match r { Ok(v) => v, Err(_) => continue },
                    };
                    let mut out = Vec::new();
                    State::lock(&state).on_datagram(&buf[..n], from, idx, &mut out);
                    links.flush(out).await;
                }
            });
        }
        links
    };
    // Retransmission timer.
    {
        let (state, socks, stop) = (state.clone(), socks.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let mut out = Vec::new();
                State::lock(&state).retransmit(Instant::now(), false, &mut out);
                socks.flush(out).await;
            }
        });
    }
    let sampler_stop = tokio_util::sync::CancellationToken::new();

    // Phase 1: register.
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(args.setup_timeout);
    let mut started = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    loop {
        tick.tick().await;
        let now = Instant::now();
        let due = ((now.duration_since(t0).as_secs_f64() * args.register_rate) as usize + 1)
            .min(args.msrs);
        let mut out = Vec::new();
        let (done, failed) = {
            let mut st = State::lock(&state);
            while started < due {
                st.send_register(started, None, now, &mut out);
                started += 1;
            }
            (
                st.msrs.iter().filter(|m| m.registered).count(),
                st.msrs.iter().filter(|m| m.reg_failed.is_some()).count(),
            )
        };
        socks.flush(out).await;
        if done + failed == args.msrs || now >= deadline {
            println!(
                "phase 1 register: {done}/{} registered, {failed} failed in {:.1} s",
                args.msrs,
                now.duration_since(t0).as_secs_f64()
            );
            break;
        }
    }

    // Phase 2: wait for the subscriptions and their first NOTIFY's answer.
    let t1 = Instant::now();
    let deadline = t1 + Duration::from_secs(args.setup_timeout);
    let registered = State::lock(&state)
        .msrs
        .iter()
        .filter(|m| m.registered)
        .count();
    if registered == 0 {
        bail!(
            "no MSR registered: is the collector at {} running, with these credentials?",
            args.collector
        );
    }
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let confirmed = State::lock(&state)
            .msrs
            .iter()
            .filter(|m| m.dialog.as_ref().is_some_and(|d| d.confirmed))
            .count();
        let now = Instant::now();
        if confirmed >= registered || now >= deadline {
            println!(
                "phase 2 subscribe: {confirmed}/{registered} subscriptions confirmed (first NOTIFY answered 200) in {:.1} s",
                now.duration_since(t1).as_secs_f64()
            );
            break;
        }
    }

    // Phase 3: the measured NOTIFY load.
    let sampler = pid.map(|p| tokio::spawn(sample_process(p, sampler_stop.clone())));
    let self_sampler = tokio::spawn(sample_process(std::process::id(), sampler_stop.clone()));
    let window = Duration::from_secs(args.duration);
    let t2 = Instant::now();
    State::lock(&state).phase = Phase::Measured;
    let mut cursor = 0usize;
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let burst_cap = ((args.rate / 50.0).ceil() as u64).max(1);
    let mut next_report = t2 + Duration::from_secs(5);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let elapsed = now.duration_since(t2);
        if elapsed >= window {
            break;
        }
        let due = (elapsed.as_secs_f64() * args.rate) as u64;
        let mut out = Vec::new();
        {
            let mut st = State::lock(&state);
            let n = st.msrs.len();
            let mut budget = due.saturating_sub(sent).min(burst_cap);
            let mut scanned = 0usize;
            while budget > 0 && scanned < n {
                let i = cursor;
                cursor = (cursor + 1) % n;
                scanned += 1;
                if st.msrs[i].dialog.is_none() {
                    continue;
                }
                scanned = 0;
                budget -= 1;
                sent += 1;
                if args.one_in_flight && st.msrs[i].in_flight > 0 {
                    st.measured.coalesced += 1;
                    continue;
                }
                st.send_notify(i, now, &mut out);
            }
            if now >= next_report {
                next_report += Duration::from_secs(5);
                let m = &st.measured;
                println!(
                    "  t={:>4.1}s sent {} ok {} non-200 {} retransmitted {} pending {}",
                    elapsed.as_secs_f64(),
                    m.sent,
                    m.ok,
                    m.non_ok.values().sum::<u64>(),
                    m.retransmitted,
                    st.pending_of(Kind::Notify)
                );
            }
        }
        socks.flush(out).await;
    }
    let t3 = Instant::now();
    State::lock(&state).phase = Phase::Drain;

    // Phase 4: drain.
    let deadline = t3 + Duration::from_secs(args.drain_timeout);
    loop {
        let pending = State::lock(&state).pending_of(Kind::Notify);
        if pending == 0 || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t4 = Instant::now();
    sampler_stop.cancel();
    let collector_samples = match sampler {
        Some(h) => Some(h.await?),
        None => None,
    };
    let self_samples = self_sampler.await?;
    {
        let mut out = Vec::new();
        State::lock(&state).retransmit(t4, true, &mut out);
    }
    // Late answers may still come; stop listening.
    stop.cancel();

    let st = {
        let g = State::lock(&state);
        Snapshot {
            c: g.c.clone(),
            setup: g.setup.clone(),
            measured: g.measured.clone(),
            registered: g.msrs.iter().filter(|m| m.registered).count(),
            reg_failed: g.msrs.iter().filter(|m| m.reg_failed.is_some()).count(),
            subscribed: g.msrs.iter().filter(|m| m.dialog.is_some()).count(),
            multi_dialog: g.msrs.iter().filter(|m| m.dialogs > 1).count(),
            last: g
                .msrs
                .iter()
                .map(|m| (m.name.clone(), m.last_load_sent))
                .collect(),
        }
    };
    report_notify(
        &args,
        &st,
        t2,
        t3,
        t4,
        collector_samples.as_ref(),
        &self_samples,
    );

    let rows_match = match &args.socket {
        Some(path) => verify_loads(path, &st.last, Duration::from_secs(args.verify_wait)).await?,
        None => true,
    };
    if args.check {
        let m = &st.measured;
        let mut failed = Vec::new();
        if st.registered < args.msrs {
            failed.push(format!(
                "{} of {} MSRs registered",
                st.registered, args.msrs
            ));
        }
        if st.subscribed < st.registered {
            failed.push(format!("{} of {} subscribed", st.subscribed, st.registered));
        }
        if m.sent == 0 || m.ok < m.sent {
            failed.push(format!("{} of {} NOTIFYs answered 200", m.ok, m.sent));
        }
        if !rows_match {
            failed.push("rows differ from the last loads sent".to_owned());
        }
        if !failed.is_empty() {
            bail!("--check: {}", failed.join("; "));
        }
        println!("check: passed");
    }
    Ok(())
}

fn pki(args: &PkiArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir).with_context(|| format!("create {}", args.dir.display()))?;
    let pki = system_tests::pki::Pki::create(&args.dir);
    println!("# CA for msr-loadgen --tls-ca: {}", pki.ca.display());
    print!(
        "{}",
        pki.collector_toml(system_tests::pki::ServerCert::Valid, false, false)
    );
    Ok(())
}

struct Snapshot {
    c: Counters,
    setup: NotifyCounters,
    measured: NotifyCounters,
    registered: usize,
    reg_failed: usize,
    subscribed: usize,
    multi_dialog: usize,
    last: Vec<(String, Option<u8>)>,
}

fn report_notify(
    args: &NotifyArgs,
    s: &Snapshot,
    t2: Instant,
    t3: Instant,
    t4: Instant,
    collector: Option<&ProcSamples>,
    own: &ProcSamples,
) {
    let window = t3.duration_since(t2).as_secs_f64();
    let m = &s.measured;
    let mut lat = m.latency_us.clone();
    lat.sort_unstable();
    let answered = m.ok + m.non_ok.values().sum::<u64>();
    let ok_span = m
        .last_answer
        .map_or(window, |t| t.duration_since(t2).as_secs_f64())
        .max(window);
    println!();
    println!("═══ msr-loadgen notify summary ═══");
    println!("MSRs                        {}", args.msrs);
    println!(
        "registered                  {} (failed {})",
        s.registered, s.reg_failed
    );
    println!(
        "  REGISTER sent {} (401 challenges {}, 423 {}, 200 {}, retransmissions {}, other {:?})",
        s.c.register_sent,
        s.c.register_401,
        s.c.register_423,
        s.c.register_ok,
        s.c.register_retx,
        s.c.register_other
    );
    println!("subscribed (dialog at end)  {}", s.subscribed);
    println!(
        "OPTIONS keepalives answered {} (from the first REGISTER to the end)",
        s.c.options_answered
    );
    println!(
        "  SUBSCRIBE initial {} refresh {} unsubscribe {} retransmitted {} rejected {}; MSRs re-subscribed (>1 dialog) {}",
        s.c.subscribe_initial,
        s.c.subscribe_refresh,
        s.c.subscribe_unsubscribe,
        s.c.subscribe_retransmitted,
        s.c.subscribe_rejected,
        s.multi_dialog
    );
    println!(
        "setup NOTIFYs (first in each dialog): sent {} ok {} non-200 {:?} retransmitted {} lost {}",
        s.setup.sent, s.setup.ok, s.setup.non_ok, s.setup.retransmitted, s.setup.lost
    );
    println!(
        "measured window             {window:.1} s at target {} NOTIFY/s",
        args.rate
    );
    println!(
        "  NOTIFY sent               {} ({:.0}/s)",
        m.sent,
        m.sent as f64 / window
    );
    println!(
        "  answered 200              {} ({:.0}/s over {:.1} s)",
        m.ok,
        m.ok as f64 / ok_span,
        ok_span
    );
    println!(
        "  answered non-200          {} {:?}",
        answered - m.ok,
        m.non_ok
    );
    println!(
        "  retransmitted (≥1 resend) {} ({} retransmissions)",
        m.retransmitted, m.retransmissions
    );
    println!("  lost (no answer)          {}", m.lost);
    if args.one_in_flight {
        println!("  coalesced (slot skipped)  {}", m.coalesced);
    }
    println!(
        "  latency send→final       median {} p90 {} p99 {} max {}",
        fmt_us(percentile(&lat, 50.0)),
        fmt_us(percentile(&lat, 90.0)),
        fmt_us(percentile(&lat, 99.0)),
        fmt_us(lat.last().copied().unwrap_or(0))
    );
    println!(
        "  drain                     {:.1} s",
        t4.duration_since(t3).as_secs_f64()
    );
    println!(
        "  stray/late responses      {}  parse errors {}",
        s.c.stray_responses, s.c.parse_errors
    );
    match collector {
        Some(p) => println!(
            "collector CPU               avg {:.0}% max {:.0}% (100% = one core; {:.1} s, window + drain)\n\
             collector RSS               start {} MiB, max {} MiB, end {} MiB, VmHWM {} MiB",
            p.avg_cpu(),
            p.max_cpu(),
            p.span_secs,
            p.rss_first() / 1024,
            p.rss_max() / 1024,
            p.rss_last() / 1024,
            p.hwm_kib / 1024
        ),
        None => println!("collector CPU/RSS           not sampled (no pid)"),
    }
    if let Some(p) = collector.filter(|_| answered > 0) {
        // The samples span the window and the drain: every answer of the
        // measured phase was given inside it.
        let busy_us = p.cpu_secs * 1e6;
        println!(
            "collector CPU per NOTIFY    {:.1} µs ({} answered, {})",
            busy_us / answered as f64,
            answered,
            args.transport.via()
        );
    }
    println!(
        "msr-loadgen CPU             avg {:.0}% max {:.0}%, RSS max {} MiB",
        own.avg_cpu(),
        own.max_cpu(),
        own.rss_max() / 1024
    );
    if let Some(p) = collector {
        let cpu: Vec<String> = p.cpu.iter().map(|c| format!("{c:.0}")).collect();
        println!("collector CPU% per second   {}", cpu.join(" "));
    }
}

/// Whether every row came to show the last load its MSR sent within `wait`.
async fn verify_loads(
    path: &std::path::Path,
    last: &[(String, Option<u8>)],
    wait: Duration,
) -> anyhow::Result<bool> {
    let mut client = AdminClient::connect_retry(path, Duration::from_secs(5))
        .await
        .with_context(|| format!("connect to {}", path.display()))?;
    let start = Instant::now();
    println!();
    println!("═══ verification via control socket ═══");
    loop {
        let t = Instant::now();
        let rows = match client
            .call(&Request::ResourceList { active_only: false })
            .await
        {
            Ok(Response::Ok(ResponseData::Resources { rows })) => rows,
            Ok(other) => bail!("resource list: unexpected answer {other:?}"),
            Err(e) => {
                println!(
                    "  t=+{:>4.1}s resource list failed: {e:#}",
                    start.elapsed().as_secs_f64()
                );
                if start.elapsed() >= wait {
                    return Ok(false);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let rtt = t.elapsed();
        let by_msr: HashMap<&str, (Option<u8>, Option<u64>)> = rows
            .iter()
            .map(|r| (r.msr.as_str(), (r.load, r.report_age_secs)))
            .collect();
        let (mut matched, mut mismatched, mut missing, mut never_sent) = (0, 0, 0, 0);
        let mut examples = Vec::new();
        for (name, sent) in last {
            let Some(sent) = sent else {
                never_sent += 1;
                continue;
            };
            match by_msr.get(name.as_str()) {
                Some((Some(shown), _)) if shown == sent => matched += 1,
                Some((shown, age)) => {
                    mismatched += 1;
                    if examples.len() < 3 {
                        examples.push(format!(
                            "{name}: last sent {sent}, row shows {shown:?} (report age {age:?} s)"
                        ));
                    }
                }
                None => missing += 1,
            }
        }
        println!(
            "  t=+{:>4.1}s {} rows (resource list took {}): last load matches {matched}/{} \
             (mismatched {mismatched}, no row {missing}, never sent {never_sent})",
            start.elapsed().as_secs_f64(),
            rows.len(),
            fmt_us(rtt.as_micros() as u64),
            last.len()
        );
        let done = mismatched == 0 && missing == 0;
        if done || start.elapsed() >= wait {
            for e in examples {
                println!("    e.g. {e}");
            }
            return Ok(done);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

// ───────────────────────────── select ─────────────────────────────

async fn select(args: SelectArgs) -> anyhow::Result<()> {
    if args.clients == 0 {
        bail!("--clients must be positive");
    }
    let mut admin = AdminClient::connect_retry(&args.socket, Duration::from_secs(5))
        .await
        .with_context(|| format!("connect to {}", args.socket.display()))?;
    if args.place.declare_site {
        declare_site(&mut admin, &args.place.site).await?;
    }
    let rows = match admin
        .call(&Request::ResourceList { active_only: true })
        .await?
    {
        Response::Ok(ResponseData::Resources { rows }) => rows.len(),
        _ => 0,
    };
    let line = serde_json::to_string(&Request::Select(SelectQuery {
        explain: args.explain,
        ..SelectQuery::new(args.place.zone.clone(), args.place.site.clone())
    }))?;
    println!(
        "msr-loadgen select: {} clients × {} requests on {} ({} active contacts)",
        args.clients,
        args.requests / args.clients as u64,
        args.socket.display(),
        rows
    );
    let per_client = args.requests / args.clients as u64;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let (path, line) = (args.socket.clone(), line.clone());
        let (legs, zone, site) = (args.legs, args.place.zone.clone(), args.place.site.clone());
        let client_no = tasks.len();
        tasks.push(tokio::spawn(async move {
            let mut client = AdminClient::connect(&path).await?;
            let mut lat = Vec::with_capacity(per_client as usize);
            let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
            let mut picks: BTreeMap<String, u64> = BTreeMap::new();
            for n in 0..per_client {
                let t = Instant::now();
                let resp = if legs {
                    let call_id = format!("lg-{client_no}-{n}@loadgen");
                    let select = serde_json::to_string(&Request::Select(SelectQuery {
                        call_id: Some(call_id.clone()),
                        ..SelectQuery::new(zone.clone(), site.clone())
                    }))?;
                    let resp = client.call_raw(&select).await?;
                    let release = serde_json::to_string(&Request::Release { call_id, leg: None })?;
                    match client.call_raw(&release).await? {
                        Response::Ok(ResponseData::Released(r)) if r.released == 1 => {}
                        other => *outcomes.entry(format!("release: {other:?}")).or_default() += 1,
                    }
                    resp
                } else {
                    client.call_raw(&line).await?
                };
                lat.push(t.elapsed().as_micros() as u64);
                match resp {
                    Response::Ok(ResponseData::Selected(s)) => {
                        *outcomes.entry("ok".into()).or_default() += 1;
                        *picks.entry(s.msr).or_default() += 1;
                    }
                    Response::Ok(_) => {
                        *outcomes.entry("ok (unexpected data)".into()).or_default() += 1
                    }
                    Response::Err(e) => *outcomes.entry(e.code.to_string()).or_default() += 1,
                }
            }
            anyhow::Ok((lat, outcomes, picks))
        }));
    }
    let mut lat = Vec::new();
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut picks: BTreeMap<String, u64> = BTreeMap::new();
    for t in tasks {
        let (l, o, p) = t.await??;
        lat.extend(l);
        for (k, v) in o {
            *outcomes.entry(k).or_default() += v;
        }
        for (k, v) in p {
            *picks.entry(k).or_default() += v;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    println!();
    println!("═══ msr-loadgen select summary ═══");
    println!("requests        {} in {elapsed:.2} s", lat.len());
    println!(
        "throughput      {:.0} {}/s (all clients)",
        lat.len() as f64 / elapsed,
        if args.legs {
            "select+release pairs"
        } else {
            "selections"
        }
    );
    println!(
        "round trip      median {} p90 {} p99 {} max {}",
        fmt_us(percentile(&lat, 50.0)),
        fmt_us(percentile(&lat, 90.0)),
        fmt_us(percentile(&lat, 99.0)),
        fmt_us(lat.last().copied().unwrap_or(0))
    );
    println!("outcomes        {outcomes:?}");
    println!("distinct MSRs   {} picked", picks.len());
    Ok(())
}

// ───────────────────────────── calls ─────────────────────────────

/// `NAME=PATH` of `--msr`.
fn parse_msr_file(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_owned(), PathBuf::from(path)))
        }
        _ => Err(format!("expected NAME=PATH, got `{text}`")),
    }
}

/// A call in progress: when it ends, which MSR holds it, its Call-ID.
type Live = Reverse<(Instant, u64, usize)>;

/// What `calls` measured (printed, and written as JSON with `--json`).
#[derive(Debug, Default, serde::Serialize)]
struct CallsSummary {
    msrs: usize,
    sessions: u32,
    erlangs: f64,
    holding_mean_secs: f64,
    seed: u64,
    measured_secs: f64,
    /// Calls arriving in the measured phase.
    offered: u64,
    /// Of those, placed on an MSR with a free session.
    accepted: u64,
    /// Refused by selection, by error code.
    refused: BTreeMap<String, u64>,
    /// Refusals (warm-up included) while every MSR was in fact full.
    refused_when_full: u64,
    /// Refusals (warm-up included) while some MSR had a free session.
    refused_with_room: u64,
    /// Sent to an MSR that was in fact full (its INVITE would fail).
    sent_to_full: u64,
    /// Selections naming an MSR not given with --msr.
    unknown_msr: u64,
    blocking: f64,
    blocking_half_width: f64,
    pooled_erlang_b: f64,
    times_pooled: f64,
    /// Time average of max − min occupancy between the MSRs, points.
    spread_pp: f64,
    notify_per_sec: f64,
    max_notify_per_sec_per_subscription: f64,
    /// Calls placed on each MSR (warm-up included).
    placed: BTreeMap<String, u64>,
    /// Releases that did not end exactly one live leg.
    release_anomalies: u64,
    /// Live legs `msr list` shows on these MSRs after every release.
    live_legs_after: u64,
    /// How late events (arrivals and call ends) were handled after their
    /// scheduled time, ms: median, 99th percentile, most.
    lag_p50_ms: f64,
    lag_p99_ms: f64,
    max_lag_ms: f64,
}

fn exponential_secs(rng: &mut rand::rngs::StdRng, rate: f64) -> f64 {
    use rand::Rng;
    // 1 − U is in (0, 1]: never ln 0.
    -(1.0 - rng.gen::<f64>()).ln() / rate
}

/// Declares `site` (an existing one is fine).
async fn declare_site(admin: &mut AdminClient, site: &str) -> anyhow::Result<()> {
    match admin
        .call(&Request::SiteDeclare {
            name: site.to_owned(),
        })
        .await?
    {
        Response::Ok(_) => println!("declared site `{site}`"),
        Response::Err(e) if e.code == ErrorCode::SiteExists => {
            println!("site `{site}` already declared")
        }
        Response::Err(e) => bail!("site declare: {}: {}", e.code, e.message),
    }
    Ok(())
}

/// NOTIFYs each of `names` has sent on its current subscription.
async fn notify_counts(admin: &mut AdminClient, names: &[String]) -> anyhow::Result<Vec<u64>> {
    let rows = match admin.call(&Request::SubscriptionList {}).await? {
        Response::Ok(ResponseData::Subscriptions { rows }) => rows,
        other => bail!("subscription list: unexpected answer {other:?}"),
    };
    Ok(names
        .iter()
        .map(|n| {
            rows.iter()
                .filter(|r| &r.msr == n)
                .map(|r| r.notify_count)
                .sum()
        })
        .collect())
}

/// The MSRs' `max-calls`, once every one is live and reports 0 calls.
async fn wait_idle_pool(
    admin: &mut AdminClient,
    names: &[String],
    limit: Duration,
) -> anyhow::Result<Vec<u32>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Response::Ok(ResponseData::Resources { rows }) = admin
            .call(&Request::ResourceList { active_only: false })
            .await?
        {
            let capacities: Option<Vec<u32>> = names
                .iter()
                .map(|n| {
                    rows.iter()
                        .find(|r| {
                            &r.msr == n
                                && r.status == RegistrationStatus::Registered
                                && r.subscription == Some(SubscriptionState::Active)
                                && r.calls == Some(0)
                        })
                        .and_then(|r| r.max_calls)
                        .filter(|&c| c > 0)
                })
                .collect();
            if let Some(c) = capacities {
                return Ok(c);
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "not every MSR of {names:?} was registered, subscribed and reporting 0 calls within {} s",
                limit.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Places and releases calls as a core would (SPEC §9), at offered load A
/// with Poisson arrivals and exponential holding times, keeping each
/// MSR's `file:` calls source equal to the calls it holds.
async fn calls(args: CallsArgs) -> anyhow::Result<()> {
    use rand::SeedableRng;
    let names: Vec<String> = args.msrs.iter().map(|(n, _)| n.clone()).collect();
    let files: Vec<PathBuf> = args.msrs.iter().map(|(_, p)| p.clone()).collect();
    let index: HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    if index.len() != names.len() {
        bail!("an MSR is named twice in --msr");
    }
    if args.holding_ms == 0 {
        bail!("--holding-ms must be positive");
    }
    let mut admin = AdminClient::connect_retry(&args.socket, Duration::from_secs(5))
        .await
        .with_context(|| format!("connect to {}", args.socket.display()))?;
    if args.place.declare_site {
        declare_site(&mut admin, &args.place.site).await?;
    }
    for file in &files {
        try_write_atomic(file, "0\n")?;
    }
    let capacities =
        wait_idle_pool(&mut admin, &names, Duration::from_secs(args.setup_timeout)).await?;
    let total: u32 = capacities.iter().sum();
    let erlangs = args
        .erlangs
        .unwrap_or(args.offered / 100.0 * f64::from(total));
    let holding = args.holding_ms as f64 / 1000.0;
    let lambda = erlangs / holding;
    if !(lambda.is_finite() && lambda > 0.0) {
        bail!("the offered load must be positive");
    }
    println!(
        "msr-loadgen calls: {} MSRs, {total} sessions (max-calls {capacities:?}), offered {erlangs:.1} E \
         ({:.0} % of them), holding mean {holding:.2} s, {:.1} calls/s, warm-up {} s, measured {} s{}",
        names.len(),
        100.0 * erlangs / f64::from(total),
        lambda,
        args.warmup,
        args.duration,
        args.calls
            .map(|c| format!(" or {c} calls"))
            .unwrap_or_default()
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let select = |call_id: &str| {
        Request::Select(SelectQuery {
            call_id: Some(call_id.to_owned()),
            ..SelectQuery::new(args.place.zone.clone(), args.place.site.clone())
        })
    };
    let release = |call_id: String| Request::Release { call_id, leg: None };
    let call_id = |n: u64| format!("e2e-{}-{n}@loadgen", args.seed);

    let n = names.len();
    let mut s = CallsSummary {
        msrs: n,
        sessions: total,
        erlangs,
        holding_mean_secs: holding,
        seed: args.seed,
        ..CallsSummary::default()
    };
    let mut busy = vec![0_u32; n];
    let mut placed = vec![0_u64; n];
    let mut live: BinaryHeap<Live> = BinaryHeap::new();
    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warmup);
    let arrivals_end = measure_from + Duration::from_secs(args.duration);
    const BATCHES: usize = 10;
    let (mut batch_blocked, mut batch_offered) = (vec![0_u64; BATCHES], vec![0_u64; BATCHES]);
    let mut notify_before: Option<(Instant, Vec<u64>)> = None;
    // The spread integral over [measure_from, end of arrivals].
    let (mut spread_integral, mut last_change) = (0.0_f64, start);
    let measured_end: Instant;
    let mut advance = |busy: &[u32], now: Instant, integral: &mut f64| {
        let from = last_change.max(measure_from);
        let to = now.min(arrivals_end);
        if to > from {
            *integral +=
                to.duration_since(from).as_secs_f64() * msr_sim::spread_pp(busy, &capacities);
        }
        last_change = now;
    };
    let mut next_arrival = start + Duration::from_secs_f64(exponential_secs(&mut rng, lambda));
    let mut arrivals = 0_u64;
    let mut lags_us: Vec<u64> = Vec::new();
    loop {
        let limit_reached = args.calls.is_some_and(|c| s.offered >= c);
        let arriving = next_arrival < arrivals_end && !limit_reached;
        if !arriving {
            measured_end = Instant::now().min(arrivals_end);
            break;
        }
        let departure = live.peek().map(|Reverse((at, _, _))| *at);
        let is_arrival = departure.is_none_or(|d| next_arrival <= d);
        let due = if is_arrival {
            next_arrival
        } else {
            departure.unwrap_or(next_arrival)
        };
        tokio::time::sleep_until(due.into()).await;
        let now = Instant::now();
        lags_us.push(now.duration_since(due).as_micros() as u64);
        if notify_before.is_none() && now >= measure_from {
            notify_before = Some((now, notify_counts(&mut admin, &names).await?));
        }
        if !is_arrival {
            let Some(Reverse((_, no, m))) = live.pop() else {
                continue;
            };
            advance(&busy, now, &mut spread_integral);
            busy[m] -= 1;
            try_write_atomic(&files[m], &format!("{}\n", busy[m]))?;
            match admin.call(&release(call_id(no))).await? {
                Response::Ok(ResponseData::Released(r)) if r.released == 1 => {}
                _ => s.release_anomalies += 1,
            }
            continue;
        }
        arrivals += 1;
        next_arrival += Duration::from_secs_f64(exponential_secs(&mut rng, lambda));
        let measured = due >= measure_from;
        let batch = ((due.saturating_duration_since(measure_from).as_secs_f64()
            / args.duration.max(1) as f64
            * BATCHES as f64) as usize)
            .min(BATCHES - 1);
        if measured {
            s.offered += 1;
            batch_offered[batch] += 1;
        }
        let id = call_id(arrivals);
        match admin.call(&select(&id)).await? {
            Response::Ok(ResponseData::Selected(sel)) => {
                let Some(&m) = index.get(sel.msr.as_str()) else {
                    s.unknown_msr += 1;
                    admin.call(&release(id)).await?;
                    continue;
                };
                if busy[m] >= capacities[m] {
                    // The MSR refuses the INVITE; the core releases the leg.
                    if measured {
                        s.sent_to_full += 1;
                        batch_blocked[batch] += 1;
                    }
                    admin.call(&release(id)).await?;
                    continue;
                }
                advance(&busy, now, &mut spread_integral);
                busy[m] += 1;
                placed[m] += 1;
                try_write_atomic(&files[m], &format!("{}\n", busy[m]))?;
                if measured {
                    s.accepted += 1;
                }
                let hold = Duration::from_secs_f64(exponential_secs(&mut rng, 1.0 / holding));
                live.push(Reverse((now + hold, arrivals, m)));
            }
            Response::Ok(other) => bail!("select: unexpected answer {other:?}"),
            Response::Err(e) => {
                if busy.iter().zip(&capacities).all(|(b, c)| b >= c) {
                    s.refused_when_full += 1;
                } else {
                    s.refused_with_room += 1;
                }
                if measured {
                    *s.refused.entry(e.code.to_string()).or_default() += 1;
                    batch_blocked[batch] += 1;
                }
            }
        }
    }
    advance(&busy, measured_end, &mut spread_integral);
    let notify_after = notify_counts(&mut admin, &names).await?;
    // End every call still up at once: the run is bounded.
    while let Some(Reverse((_, no, m))) = live.pop() {
        busy[m] -= 1;
        try_write_atomic(&files[m], &format!("{}\n", busy[m]))?;
        match admin.call(&release(call_id(no))).await? {
            Response::Ok(ResponseData::Released(r)) if r.released == 1 => {}
            _ => s.release_anomalies += 1,
        }
    }
    s.live_legs_after = match admin.call(&Request::MsrList {}).await? {
        Response::Ok(ResponseData::Msrs { msrs }) => msrs
            .iter()
            .filter(|m| index.contains_key(m.name.as_str()))
            .map(|m| u64::from(m.live_legs))
            .sum(),
        other => bail!("msr list: unexpected answer {other:?}"),
    };
    let measured_secs = measured_end
        .saturating_duration_since(measure_from)
        .as_secs_f64();
    s.measured_secs = measured_secs;
    (s.blocking, s.blocking_half_width) = msr_sim::batch_means(&batch_blocked, &batch_offered);
    s.pooled_erlang_b = msr_sim::erlang_b(erlangs, total);
    s.times_pooled = s.blocking / s.pooled_erlang_b;
    if measured_secs > 0.0 {
        s.spread_pp = spread_integral / measured_secs;
        if let Some((at, before)) = &notify_before {
            let secs = measured_end.saturating_duration_since(*at).as_secs_f64();
            let deltas: Vec<u64> = notify_after
                .iter()
                .zip(before)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect();
            if secs > 0.0 {
                s.notify_per_sec = deltas.iter().sum::<u64>() as f64 / secs;
                s.max_notify_per_sec_per_subscription =
                    deltas.iter().copied().max().unwrap_or(0) as f64 / secs;
            }
        }
    }
    s.placed = names.iter().cloned().zip(placed).collect();
    lags_us.sort_unstable();
    let ms = |us: u64| us as f64 / 1000.0;
    s.lag_p50_ms = ms(percentile(&lags_us, 50.0));
    s.lag_p99_ms = ms(percentile(&lags_us, 99.0));
    s.max_lag_ms = ms(lags_us.last().copied().unwrap_or(0));
    print_calls_summary(&s);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&s)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

fn print_calls_summary(s: &CallsSummary) {
    let refused: u64 = s.refused.values().sum();
    println!();
    println!("═══ msr-loadgen calls summary ═══");
    println!(
        "measured        {:.0} s, {} calls offered, {} accepted",
        s.measured_secs, s.offered, s.accepted
    );
    println!(
        "blocking        {:.2e} ± {:.1e} (99 % CI, 10 batch means): refused by selection {refused} {:?}, \
         sent to a full MSR {}",
        s.blocking, s.blocking_half_width, s.refused, s.sent_to_full
    );
    println!(
        "pooled limit    Erlang-B({:.1}, {}) = {:.2e}, × pooled {:.2}",
        s.erlangs, s.sessions, s.pooled_erlang_b, s.times_pooled
    );
    println!(
        "refusals        {} while every MSR was full, {} while one had room (warm-up included)",
        s.refused_when_full, s.refused_with_room
    );
    println!(
        "spread          {:.1} pp (time average of max − min occupancy, msr-sim's definition)",
        s.spread_pp
    );
    println!(
        "NOTIFY/s        {:.2} in all, {:.2} on the busiest subscription",
        s.notify_per_sec, s.max_notify_per_sec_per_subscription
    );
    println!("placed          {:?}", s.placed);
    println!(
        "after release   {} live legs, {} release anomalies, {} selections of an unknown MSR",
        s.live_legs_after, s.release_anomalies, s.unknown_msr
    );
    println!(
        "driver lag      median {:.1} ms, p99 {:.1} ms, max {:.1} ms (event handled after its time)",
        s.lag_p50_ms, s.lag_p99_ms, s.max_lag_ms
    );
}
