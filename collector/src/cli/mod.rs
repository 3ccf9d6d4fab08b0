//! `msrctl`, the admin CLI (SPEC §8): parses a command, sends one
//! [`Request`] line to the collector's control socket, prints the response as
//! a box table (or JSON with `--json`).
//!
//! The seed's ECSS slash paths are accepted as aliases:
//! `msrctl system/media/site/declare NAME` is `msrctl site declare NAME`,
//! `system/media/msr/subscription/list` is `subscription list`.
//!
//! Exit codes: 0 done; 1 the collector refused the request; 2 usage error;
//! 3 cannot reach the collector (connect, send or receive failed).

pub mod render;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use msr_shared::admin::{Distance, Request, Response};

/// Default control socket path.
pub const DEFAULT_SOCKET: &str = "/run/msr-collector/control.sock";

/// Exit code: the collector refused the request.
pub const EXIT_REFUSED: i32 = 1;
/// Exit code: bad command line.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: the collector could not be reached.
pub const EXIT_UNREACHABLE: i32 = 3;

/// How long to wait for the collector's answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Admin CLI of msr-collector: sites, distances, MSR settings, the load table,
/// subscriptions and selection.
#[derive(Debug, Parser)]
#[command(
    name = "msrctl",
    version,
    after_help = "Examples:
  msrctl --socket /tmp/msr-quickstart/control.sock resource list
  msrctl site declare remote_side
  msrctl site distance local remote_side 64
  msrctl msr set msr_1 performance_coefficient 1.5
  msrctl select --zone default --site local --explain

The seed's ECSS paths are aliases: `msrctl system/media/site/declare NAME`
is `msrctl site declare NAME`.

Exit codes: 0 done; 1 the collector refused the request (the reason on
stderr); 2 usage error; 3 the collector could not be reached."
)]
pub struct Cli {
    /// Control socket of the collector.
    #[arg(long, global = true, env = "MSRCTL_SOCKET", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print the response data as JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sites and the site distance matrix.
    #[command(subcommand)]
    Site(SiteCommand),
    /// Per-MSR settings: performance coefficient and admin active flag.
    #[command(subcommand)]
    Msr(MsrCommand),
    /// The live load table (one row per MSR contact) and per-contact zone/site.
    #[command(subcommand)]
    Resource(ResourceCommand),
    /// Load subscriptions (eltex-call-count) to the MSRs.
    #[command(subcommand)]
    Subscription(SubscriptionCommand),
    /// Run a selection for a leg without placing it (SPEC §7).
    Select(SelectArgs),
}

/// `site …`
#[derive(Debug, Subcommand)]
pub enum SiteCommand {
    /// Declare a site.
    Declare {
        /// Site name.
        name: String,
    },
    /// Remove a site (refused while a contact uses it).
    Remove {
        /// Site name.
        name: String,
    },
    /// List declared sites.
    List,
    /// Set the distance between two sites (symmetric), a number ≥ 0 or `infinity`.
    Distance {
        /// First site.
        a: String,
        /// Second site (the same as the first sets a site's own distance).
        b: String,
        /// Distance, or `infinity`.
        #[arg(value_parser = parse_distance, allow_negative_numbers = true)]
        value: Distance,
    },
    /// Show the distance matrix; columns limited to the named sites if given.
    Matrix {
        /// Sites to show as columns.
        names: Vec<String>,
    },
}

/// `msr …`
#[derive(Debug, Subcommand)]
pub enum MsrCommand {
    /// Set a property of an MSR.
    Set {
        /// MSR name.
        name: String,
        /// The property and its value.
        #[command(subcommand)]
        property: MsrProperty,
    },
    /// List MSRs with their coefficient and active flag.
    List,
}

/// `msr set NAME …`
#[derive(Debug, Subcommand)]
pub enum MsrProperty {
    /// Performance coefficient: a positive number (default 1.0).
    #[command(name = "performance_coefficient")]
    PerformanceCoefficient {
        /// The coefficient.
        #[arg(value_parser = parse_finite, allow_negative_numbers = true)]
        value: f64,
    },
    /// Admin active flag: `false` takes the MSR out of selection.
    Active {
        /// `true` or `false`.
        #[arg(action = clap::ArgAction::Set)]
        value: bool,
    },
}

/// `resource …`
#[derive(Debug, Subcommand)]
pub enum ResourceCommand {
    /// List the load table; `active` keeps only rows selection may use.
    List {
        /// `active`
        #[arg(value_parser = ["active"])]
        filter: Option<String>,
    },
    /// Set a contact's zone or site.
    Set {
        /// Contact name, `{iface}@{msr}`.
        contact: String,
        /// The property and its value.
        #[command(subcommand)]
        property: ResourceProperty,
    },
}

/// `resource set CONTACT …`
#[derive(Debug, Subcommand)]
pub enum ResourceProperty {
    /// The contact's zone.
    Zone {
        /// Zone label.
        zone: String,
    },
    /// The contact's site (a declared site).
    Site {
        /// Site name.
        site: String,
    },
}

/// `subscription …`
#[derive(Debug, Subcommand)]
pub enum SubscriptionCommand {
    /// Set a subscription property for one MSR.
    Set {
        /// MSR name.
        msr: String,
        /// Event package (`eltex-call-count`).
        event: String,
        /// The property and its value.
        #[command(subcommand)]
        property: SubscriptionProperty,
    },
    /// List subscriptions, one row per MSR.
    List,
}

/// `subscription set MSR EVENT …`
#[derive(Debug, Subcommand)]
pub enum SubscriptionProperty {
    /// The `Expires` requested in SUBSCRIBE, seconds.
    Expires {
        /// Seconds (at least 1).
        #[arg(value_parser = clap::value_parser!(u32).range(1..=86_400))]
        secs: u32,
    },
}

/// `select …`
#[derive(Debug, Args)]
pub struct SelectArgs {
    /// The leg's zone.
    #[arg(long)]
    pub zone: String,
    /// The leg's site.
    #[arg(long)]
    pub site: String,
    /// The MSR already chosen for the other leg.
    #[arg(long)]
    pub msr: Option<String>,
    /// Fix the draw to R in [0, total) instead of a random one.
    #[arg(long, value_name = "R", value_parser = parse_finite, allow_negative_numbers = true)]
    pub random: Option<f64>,
    /// Show the candidates, distances and interval table.
    #[arg(long)]
    pub explain: bool,
}

/// A finite number (JSON has no NaN or infinity: they would travel as
/// `null` and change the meaning of the request).
fn parse_finite(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() => Ok(value),
        _ => Err(format!("`{text}` is not a finite number")),
    }
}

fn parse_distance(text: &str) -> Result<Distance, String> {
    if text.eq_ignore_ascii_case("infinity") || text.eq_ignore_ascii_case("inf") {
        return Ok(Distance::Infinity);
    }
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => Ok(Distance::Finite(value)),
        _ => Err(format!(
            "`{text}` is not a distance: expected a number >= 0 or `infinity`"
        )),
    }
}

impl Command {
    /// The wire request for this command.
    pub fn to_request(&self) -> Request {
        match self {
            Command::Site(SiteCommand::Declare { name }) => {
                Request::SiteDeclare { name: name.clone() }
            }
            Command::Site(SiteCommand::Remove { name }) => {
                Request::SiteRemove { name: name.clone() }
            }
            Command::Site(SiteCommand::List) => Request::SiteList,
            Command::Site(SiteCommand::Distance { a, b, value }) => Request::SiteDistance {
                a: a.clone(),
                b: b.clone(),
                distance: *value,
            },
            Command::Site(SiteCommand::Matrix { names }) => Request::SiteMatrix {
                names: names.clone(),
            },
            Command::Msr(MsrCommand::Set {
                name,
                property: MsrProperty::PerformanceCoefficient { value },
            }) => Request::MsrSetPerformanceCoefficient {
                msr: name.clone(),
                value: *value,
            },
            Command::Msr(MsrCommand::Set {
                name,
                property: MsrProperty::Active { value },
            }) => Request::MsrSetActive {
                msr: name.clone(),
                active: *value,
            },
            Command::Msr(MsrCommand::List) => Request::MsrList,
            Command::Resource(ResourceCommand::List { filter }) => Request::ResourceList {
                active_only: filter.is_some(),
            },
            Command::Resource(ResourceCommand::Set {
                contact,
                property: ResourceProperty::Zone { zone },
            }) => Request::ResourceSetZone {
                contact: contact.clone(),
                zone: zone.clone(),
            },
            Command::Resource(ResourceCommand::Set {
                contact,
                property: ResourceProperty::Site { site },
            }) => Request::ResourceSetSite {
                contact: contact.clone(),
                site: site.clone(),
            },
            Command::Subscription(SubscriptionCommand::Set {
                msr,
                event,
                property: SubscriptionProperty::Expires { secs },
            }) => Request::SubscriptionSetExpires {
                msr: msr.clone(),
                event: event.clone(),
                expires: *secs,
            },
            Command::Subscription(SubscriptionCommand::List) => Request::SubscriptionList,
            Command::Select(args) => Request::Select {
                zone: args.zone.clone(),
                site: args.site.clone(),
                msr: args.msr.clone(),
                random: args.random,
                explain: args.explain,
            },
        }
    }
}

/// Rewrites a seed-style slash path (`system/media/site/declare`,
/// `/system/media/msr/subscription/set`) in the first command word into
/// separate words; other arguments are left alone.
pub fn rewrite_aliases(args: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len() + 3);
    let mut iter = args.into_iter();
    if let Some(program) = iter.next() {
        out.push(program);
    }
    let mut rewritten = false;
    let mut skip_value = false;
    for arg in iter {
        if rewritten || skip_value {
            skip_value = false;
            out.push(arg);
            continue;
        }
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--socket" {
            skip_value = true;
            out.push(arg);
            continue;
        }
        if text.starts_with('-') {
            out.push(arg);
            continue;
        }
        rewritten = true;
        if !text.contains('/') {
            out.push(arg);
            continue;
        }
        let path = text.trim_start_matches('/');
        let path = path.strip_prefix("system/media/").unwrap_or(path);
        let path = match path.strip_prefix("msr/subscription/") {
            Some(rest) => format!("subscription/{rest}"),
            None => path.to_owned(),
        };
        out.extend(
            path.split('/')
                .filter(|part| !part.is_empty())
                .map(OsString::from),
        );
    }
    out
}

/// Why the collector could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Connecting to the socket failed.
    #[error(
        "cannot connect to {path}: {source} (is msr-collector running? \
         give its [control] socket with --socket PATH or MSRCTL_SOCKET)"
    )]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Sending or receiving failed.
    #[error("lost the collector at {path}: {source}")]
    Io {
        /// Socket path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The answer was not a response line.
    #[error("bad answer from the collector at {path}: {reason}")]
    BadAnswer {
        /// Socket path.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// Sends one request and reads its response.
///
/// # Errors
/// [`TransportError`].
pub fn call(socket: &Path, request: &Request) -> Result<Response, TransportError> {
    let io = |source| TransportError::Io {
        path: socket.to_owned(),
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(|source| TransportError::Connect {
        path: socket.to_owned(),
        source,
    })?;
    stream.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
    let mut line = serde_json::to_string(request).map_err(|e| TransportError::BadAnswer {
        path: socket.to_owned(),
        reason: e.to_string(),
    })?;
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(io)?;
    let mut answer = String::new();
    BufReader::new(&stream).read_line(&mut answer).map_err(io)?;
    if answer.is_empty() {
        return Err(TransportError::BadAnswer {
            path: socket.to_owned(),
            reason: "connection closed without a response".into(),
        });
    }
    serde_json::from_str(&answer).map_err(|e| TransportError::BadAnswer {
        path: socket.to_owned(),
        reason: e.to_string(),
    })
}

/// What `msrctl` prints and its exit code, computed from a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Text for stdout.
    pub stdout: String,
    /// Text for stderr.
    pub stderr: String,
    /// Process exit code.
    pub code: i32,
}

/// Turns a response into output (pure).
pub fn output(command: &Command, json: bool, response: &Response) -> Output {
    match response {
        Response::Ok(data) => {
            let stdout = if json {
                let mut text = serde_json::to_string_pretty(data).unwrap_or_default();
                text.push('\n');
                text
            } else {
                let active_only = matches!(
                    command,
                    Command::Resource(ResourceCommand::List { filter: Some(_) })
                );
                render::response(data, active_only)
            };
            Output {
                stdout,
                stderr: String::new(),
                code: 0,
            }
        }
        Response::Err(body) => {
            let (mut message, explain) = render::error(body);
            if json {
                // The protocol's error object, without the explanation
                // (which goes to stdout).
                message =
                    serde_json::json!({ "code": body.code, "message": body.message }).to_string();
            }
            let stdout = if json {
                body.explain
                    .as_ref()
                    .and_then(|e| serde_json::to_string_pretty(e).ok())
                    .map(|text| text + "\n")
                    .unwrap_or_default()
            } else {
                explain.unwrap_or_default()
            };
            Output {
                stdout,
                stderr: message + "\n",
                code: EXIT_REFUSED,
            }
        }
    }
}

/// Runs `msrctl` with these arguments (program name first); returns the exit
/// code.
pub fn run(args: Vec<OsString>) -> i32 {
    let cli = match Cli::try_parse_from(rewrite_aliases(args)) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() { EXIT_USAGE } else { 0 };
        }
    };
    let request = cli.command.to_request();
    let response = match call(&cli.socket, &request) {
        Ok(response) => response,
        Err(error) => {
            eprintln!("error: {error}");
            return EXIT_UNREACHABLE;
        }
    };
    let out = output(&cli.command, cli.json, &response);
    print!("{}", out.stdout);
    eprint!("{}", out.stderr);
    out.code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        let args: Vec<OsString> = std::iter::once("msrctl")
            .chain(line.split_whitespace())
            .map(Into::into)
            .collect();
        Cli::try_parse_from(rewrite_aliases(args))
    }

    fn request(line: &str) -> Request {
        parse(line)
            .map(|cli| cli.command.to_request())
            .unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    #[test]
    fn commands_map_to_requests() {
        assert_eq!(
            request("site declare local"),
            Request::SiteDeclare {
                name: "local".into()
            }
        );
        assert_eq!(
            request("site distance a b infinity"),
            Request::SiteDistance {
                a: "a".into(),
                b: "b".into(),
                distance: Distance::Infinity
            }
        );
        assert_eq!(
            request("site matrix local remote"),
            Request::SiteMatrix {
                names: vec!["local".into(), "remote".into()]
            }
        );
        assert_eq!(
            request("msr set msr_1 performance_coefficient 2"),
            Request::MsrSetPerformanceCoefficient {
                msr: "msr_1".into(),
                value: 2.0
            }
        );
        assert_eq!(
            request("msr set msr_1 active false"),
            Request::MsrSetActive {
                msr: "msr_1".into(),
                active: false
            }
        );
        assert_eq!(
            request("resource list active"),
            Request::ResourceList { active_only: true }
        );
        assert_eq!(
            request("resource list"),
            Request::ResourceList { active_only: false }
        );
        assert_eq!(
            request("resource set lo@msr_1 site remote"),
            Request::ResourceSetSite {
                contact: "lo@msr_1".into(),
                site: "remote".into()
            }
        );
        assert_eq!(
            request("subscription set msr_1 eltex-call-count expires 30"),
            Request::SubscriptionSetExpires {
                msr: "msr_1".into(),
                event: "eltex-call-count".into(),
                expires: 30
            }
        );
        assert_eq!(
            request("--json select --zone z --site s --msr msr_1 --random 58 --explain"),
            Request::Select {
                zone: "z".into(),
                site: "s".into(),
                msr: Some("msr_1".into()),
                random: Some(58.0),
                explain: true
            }
        );
    }

    #[test]
    fn seed_slash_paths_are_aliases() {
        assert_eq!(
            request("system/media/site/declare remote_side"),
            Request::SiteDeclare {
                name: "remote_side".into()
            }
        );
        assert_eq!(request("/system/media/site/list"), Request::SiteList);
        assert_eq!(
            request("--socket /tmp/x.sock system/media/site/distance remote_1 local 64"),
            Request::SiteDistance {
                a: "remote_1".into(),
                b: "local".into(),
                distance: Distance::Finite(64.0)
            }
        );
        assert_eq!(
            request("system/media/msr/subscription/set msr_1 eltex-call-count expires 30"),
            Request::SubscriptionSetExpires {
                msr: "msr_1".into(),
                event: "eltex-call-count".into(),
                expires: 30
            }
        );
        assert_eq!(
            request("system/media/msr/subscription/list"),
            Request::SubscriptionList
        );
        assert_eq!(
            request("system/media/resource/list active"),
            Request::ResourceList { active_only: true }
        );
        // Only the command word is rewritten; a later argument keeps its slash.
        assert_eq!(
            request("resource set eth0/1@msr_1 zone rtk"),
            Request::ResourceSetZone {
                contact: "eth0/1@msr_1".into(),
                zone: "rtk".into()
            }
        );
    }

    #[test]
    fn usage_errors() {
        for bad in [
            "site distance a b -1",
            "site distance a b far",
            "msr set msr_1 active maybe",
            "msr set msr_1 performance_coefficient x",
            "msr set msr_1 performance_coefficient nan",
            "msr set msr_1 performance_coefficient inf",
            "select --zone z --site s --random nan",
            "select --zone z --site s --random 1e400",
            "subscription set m eltex-call-count expires 0",
            "resource list passive",
            "select --zone z",
            "frobnicate",
        ] {
            let error = parse(bad).expect_err(bad);
            assert!(error.use_stderr(), "{bad}");
        }
    }

    #[test]
    fn socket_default_and_flag() {
        let cli = parse("--socket /tmp/c.sock site list").expect("parse");
        assert_eq!(cli.socket, PathBuf::from("/tmp/c.sock"));
    }

    #[test]
    fn output_codes() {
        let command = Command::Site(SiteCommand::List);
        let ok = Response::Ok(msr_shared::admin::ResponseData::Sites {
            sites: vec!["local".into()],
        });
        let out = output(&command, false, &ok);
        assert_eq!(
            (out.stdout.as_str(), out.code),
            ("List of all sites:\n local\n", 0)
        );
        let out = output(&command, true, &ok);
        let value: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
        assert_eq!(value["sites"][0], "local");
        let refused = Response::error(
            msr_shared::admin::ErrorCode::SiteExists,
            "site `local` is already declared",
        );
        let out = output(&command, false, &refused);
        assert_eq!(out.code, EXIT_REFUSED);
        assert_eq!(
            out.stderr,
            "error: site_exists: site `local` is already declared\n"
        );
        // With --json a script reads the refusal as the protocol's error object.
        let out = output(&command, true, &refused);
        assert_eq!(out.code, EXIT_REFUSED);
        let value: serde_json::Value = serde_json::from_str(&out.stderr).expect("json");
        assert_eq!(
            value,
            serde_json::json!({"code": "site_exists", "message": "site `local` is already declared"})
        );
    }

    #[test]
    fn negative_values_reach_validation() {
        // Not mistaken for flags: the value's own check explains the error.
        let error = parse("site distance a b -5").expect_err("negative distance");
        assert!(
            error.to_string().contains("expected a number >= 0"),
            "{error}"
        );
        assert_eq!(
            request("msr set msr_1 performance_coefficient -1"),
            Request::MsrSetPerformanceCoefficient {
                msr: "msr_1".into(),
                value: -1.0
            }
        );
    }

    #[test]
    fn unreachable_socket_exits_3() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("none.sock");
        let args = [
            "msrctl",
            "--socket",
            socket.to_str().expect("utf-8"),
            "site",
            "list",
        ];
        assert_eq!(
            run(args.iter().map(OsString::from).collect()),
            EXIT_UNREACHABLE
        );
        assert_eq!(
            run(["msrctl", "nonsense"].iter().map(OsString::from).collect()),
            EXIT_USAGE
        );
    }
}
