//! The command line of `msr-agent`, in the library so that the packaging
//! generator (`msr-dist`) builds the man page and the shell completions from
//! this one definition.

use std::path::PathBuf;

use clap::Parser;

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

Logs go to stderr, or to <general log-path>/<log-name> when both are set and
--log-stderr is not given. RUST_LOG overrides the level.",
    after_help = "\
Examples:
  msr-agent --config /etc/ecss/ecss-media-server/config.xml
  msr-agent --config config-examples/msr-loopback.xml --log-stderr -v
  msr-agent --config config.xml --check-config"
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

    /// Log to stderr even when the config names a log file.
    #[arg(long)]
    pub log_stderr: bool,
}
