//! `msr-loadgen`: measures a running `msr-collector` at scale.
//!
//! A benchmark tool, not a test: it prints figures and never asserts on time.
//!
//! * `notify` plays N fake MSRs over a few UDP sockets on 127.0.0.1: each
//!   REGISTERs (answering the digest challenge), answers the collector's
//!   SUBSCRIBE with 200 and then sends `eltex-call-count` NOTIFYs in that
//!   dialog at a target aggregate rate spread evenly over the MSRs. It counts
//!   what was sent, answered, retransmitted (the product's client
//!   transactions: T1 = 500 ms doubling to T2 = 4 s over UDP, given up at
//!   Timer F = 32 s) and lost, samples the
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
//!   two can be set side by side (BALANCING.md). With `--socket` given G
//!   times it spreads the calls over G collectors, as `msr-sim --hosts G`.
//!
//! `notify`'s MSRs speak through the product's SIP layer: its message
//! model, digest (`sip::digest`) and transactions (`sip::transaction`);
//! `flood` writes its datagrams as text.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

mod batched;
mod calls;
mod datagrams;
mod flood;
mod msrs;
mod notify;
mod process;
mod select;
use calls::{calls, parse_msr_file};
use flood::flood;
use notify::notify;
use select::select;

const USER_AGENT: &str = concat!("msr-loadgen/", env!("CARGO_PKG_VERSION"));

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
    /// The measured phase on a thread of its own that costs this host
    /// little: each MSR's NOTIFY pre-encoded, sent in batches with
    /// sendmmsg(2), the answers read with recvmmsg(2) and matched by their
    /// `Via` branch. No retransmission: every NOTIFY the collector leaves
    /// unanswered counts as lost. UDP only. For offering the collector
    /// its ceiling from the same host (pin the two apart with `taskset`).
    #[arg(long, conflicts_with = "one_in_flight")]
    batched: bool,
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
    /// Control socket of a collector. Given G times, for G collectors (core
    /// hosts): each call goes to one of them at random, its release to the
    /// same one.
    #[arg(long = "socket", default_value = "/tmp/msr-collector.sock")]
    sockets: Vec<PathBuf>,
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
    /// The MSRs one call may be given in all, as a core that fails over
    /// does (SPEC §14; at most the collectors' `[selection]
    /// failover_attempts`): a call sent to a full MSR is selected again
    /// with that MSR failed (`load-limit`). 1: a call sent to a full MSR
    /// is lost.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10))]
    failover_attempts: u32,
    /// Select without a `call_id` and release nothing, as a core that
    /// names no call (the `ecss` fallback of `pooled`, SPEC §10): a call's
    /// end only changes the calls file of its MSR (the `--msr` NAME=PATH
    /// its agent reads, `calls-source="file:PATH"`). Refused with
    /// `--failover-attempts` above 1: a selection without a `call_id`
    /// cannot name a failed MSR (SPEC §14).
    #[arg(long)]
    no_call_id: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn calls_args(extra: &[&str]) -> CallsArgs {
        let mut argv = vec!["msr-loadgen", "calls", "--msr", "m=/tmp/m.calls"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv) {
            Ok(Cli {
                command: Command::Calls(a),
            }) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn calls_takes_one_socket_by_default_and_one_per_collector_when_repeated() {
        assert_eq!(
            calls_args(&[]).sockets,
            [PathBuf::from("/tmp/msr-collector.sock")]
        );
        assert_eq!(
            calls_args(&[
                "--socket",
                "/r/a.sock",
                "--socket",
                "/r/b.sock",
                "--socket",
                "/r/c.sock"
            ])
            .sockets,
            ["/r/a.sock", "/r/b.sock", "/r/c.sock"].map(PathBuf::from)
        );
    }
}
