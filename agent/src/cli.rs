//! The command line of `msr-agent`, in the library so that the packaging
//! generator (`msr-dist`) builds the man page and the shell completions from
//! this one definition.

// The doc comments are clap's help texts and name the XML's elements
// (`<agent log-file>`) as an operator reads them, not as HTML.
#![allow(rustdoc::invalid_html_tags)]

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
}
