//! The command line of `msr-agent`, in the library so that the packaging
//! generator (`msr-dist`) builds the man page and the shell completions from
//! this one definition.

// The doc comments are clap's help texts and name the XML's elements
// (`<agent log-file>`) as an operator reads them, not as HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use crate::control::DEFAULT_CONTROL_SOCKET;

/// The config file read when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/ecss/ecss-media-server/config.xml";

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

The agent lives beside the media engine and never takes anything of it:
<transport> is the engine's SIP address, which the agent reports to the core
(the core sends its INVITEs there) together with <pbyte><mcc>; the agent
listens on the same bind-addr on its own port, <agent sip-port> or
--sip-port (default: the <transport> port + 1).

Logs go to stderr (the journal under systemd), or to the agent's own file
(<agent log-file> or --log-file), which SIGHUP reopens after logrotate has
moved it. The engine's <general log-path log-name> is never written.
RUST_LOG overrides the level.",
    after_help = "\
Examples:
  msr-agent --config /etc/ecss/ecss-media-server/config.xml
  msr-agent --config config-examples/msr-loopback.xml -v
  msr-agent --config config.xml --sip-port 5090 --log-file /var/log/msr-agent/msr-agent.log
  msr-agent --config config.xml --check-config
  msr-agent drain --exit-when-empty --wait && systemctl restart rtpengine
  msr-agent status"
)]
pub struct Cli {
    /// The media server's XML config.
    #[arg(short, long, value_name = "FILE", default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,

    /// Validate the config and check that the log file can be opened
    /// (without creating it), print a summary and exit (0 ok, 1 not).
    #[arg(long)]
    pub check_config: bool,

    /// More log output (-v debug, -vv trace).
    #[arg(short, long, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,

    /// Less log output (-q warnings, -qq errors only).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub quiet: u8,

    /// Log to stderr even when <agent log-file> names a file.
    #[arg(long, conflicts_with = "log_file")]
    pub log_stderr: bool,

    /// The agent's own log file (overrides <agent log-file>); SIGHUP
    /// reopens it.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,

    /// The agent's own SIP port on <transport bind-addr> (overrides <agent
    /// sip-port>; default: the <transport> port + 1). Never the engine's.
    #[arg(long, value_name = "PORT")]
    pub sip_port: Option<u16>,

    /// Benchmarks only: divide the NOTIFY and sampling intervals
    /// (`notify-min-interval-ms`, `notify-top-interval-ms`,
    /// `sample-interval-ms`) by N, so that a run whose calls are held N
    /// times shorter is reported on as the real system is
    /// (scripts/bench-balancing-e2e.sh). Never in production: it multiplies
    /// the NOTIFYs by N.
    #[arg(long, value_name = "N", default_value_t = 1, hide = true,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub time_scale: u32,

    /// The running agent's control socket: where the daemon listens, and
    /// where drain, undrain and status ask it.
    #[arg(long, global = true, value_name = "PATH", default_value = DEFAULT_CONTROL_SOCKET)]
    pub control_socket: PathBuf,

    /// Without a command, run the agent.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Commands to the running agent, over its control socket (SPEC §14).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Take no new legs on this MSR (every NOTIFY says `service: draining`,
    /// and the collectors select it no more); the live legs stay.
    ///
    /// The drain lasts until `msr-agent undrain` or the agent's restart;
    /// a config reload keeps it. It is over ("drained") once the media
    /// engine's own session count has been 0 for 2 s.
    #[command(after_help = "\
Examples:
  msr-agent drain
  msr-agent drain --exit-when-empty --wait && systemctl restart rtpengine
  msr-agent drain --wait --timeout 600 || echo 'sessions still live'

Exit status: 0 when asked (with --wait: once drained, and with
--exit-when-empty once the agent has exited); 1 when no agent answers on
the control socket or --timeout expires (the drain goes on).")]
    Drain {
        /// Once drained, the agent exits 0 (final NOTIFYs `deactivated`,
        /// unregister), so that the engine can be stopped.
        #[arg(long)]
        exit_when_empty: bool,
        /// Wait until drained (and with --exit-when-empty until the agent
        /// has exited), printing the sessions left at most once a second.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds (exit 1).
        #[arg(long, value_name = "SECONDS", requires = "wait")]
        timeout: Option<u64>,
    },
    /// End a drain: new legs welcome again (and no exit when empty).
    Undrain,
    /// Print the running agent's service (active, draining), the engine's
    /// state as its probe sees it, and the engine's sessions.
    Status,
}
