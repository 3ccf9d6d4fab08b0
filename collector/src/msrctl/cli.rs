//! The command line of `msrctl` (SPEC §8): the clap definitions of every
//! command and argument, what each command asks the collector
//! ([`Command::to_request`]), and the seed's ECSS slash paths rewritten to
//! the words they stand for ([`rewrite_aliases`]) before clap sees them.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use msr_shared::admin::{ContactProperty, Distance, Request, SelectQuery};
use msr_shared::present::normalize_zero;

/// Admin CLI of msr-collector: sites, distances, MSR settings, the load table,
/// subscriptions and selection.
#[derive(Debug, Parser)]
#[command(
    name = "msrctl",
    version,
    after_help = "Examples:
  msrctl --socket /tmp/msr-collector.sock resource list
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
    /// Control socket of the collector [default: $MSRCTL_SOCKET, or
    /// /run/msr-collector/control.sock when that is unset or empty].
    #[arg(long, global = true, value_name = "PATH")]
    pub socket: Option<PathBuf>,
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
    /// Zones: the labels contacts and legs carry (set with `resource set CONTACT zone Z`).
    #[command(subcommand)]
    Zone(ZoneCommand),
    /// The MSRs: list, per-MSR settings (performance coefficient, admin active flag, load limit), drain and undrain, forget a gone one.
    #[command(subcommand)]
    Msr(MsrCommand),
    /// The live load table (one row per MSR contact) and per-contact zone/site.
    #[command(subcommand)]
    Resource(ResourceCommand),
    /// Load subscriptions (eltex-call-count) to the MSRs.
    #[command(subcommand)]
    Subscription(SubscriptionCommand),
    /// Run a selection for a leg (SPEC §7); with --call-id, place the leg
    /// (SPEC §9): selected again, it keeps its MSR until released.
    Select(SelectArgs),
    /// End a leg placed with `select --call-id` (SPEC §9); idempotent.
    Release {
        /// The leg's SIP Call-ID.
        #[arg(long)]
        call_id: String,
        /// The leg label; without it, every leg of the Call-ID ends.
        #[arg(long)]
        leg: Option<String>,
    },
    /// Live call legs (SPEC §9), to find and release leaked ones.
    #[command(subcommand)]
    Leg(LegCommand),
    /// The core hosts sharing the operator configuration, and the store's state (SPEC §12).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// The control protocol version the collector speaks, and its software version.
    Hello,
}

/// `leg …`
#[derive(Debug, Subcommand)]
pub enum LegCommand {
    /// List live legs, oldest first: Call-ID, leg, MSR, contact, age, conference.
    List {
        /// Only the legs on this MSR.
        #[arg(long)]
        msr: Option<String>,
        /// Only the legs at least this many seconds old.
        #[arg(long, value_name = "SECS")]
        older_than: Option<u64>,
        /// The most rows shown (the total is always given).
        #[arg(long, default_value_t = msr_shared::admin::DEFAULT_LEG_LIST_LIMIT,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(msr_shared::admin::MAX_LEG_LIST_LIMIT)))]
        limit: u32,
    },
}

/// `zone …`
#[derive(Debug, Subcommand)]
pub enum ZoneCommand {
    /// List the zones: the default zone and every zone a contact is in or
    /// set to, with the contacts in each.
    List,
}

/// `cluster …`
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// List the live core hosts (collectors) and the operator store's state.
    List,
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
    /// List MSRs with their coefficient, active flag, load limit, live legs and health.
    List,
    /// Drain an MSR for maintenance (SPEC §14): no new legs, the live ones
    /// stay (it sets `active false`). With --wait, show its progress (live
    /// legs, the engine's own calls, the oldest leg's age) and return once
    /// both are 0: `msrctl msr drain msr_1 --wait && <stop the MSR>`.
    Drain {
        /// MSR name (as `msr list` shows it).
        name: String,
        /// Wait until no leg and no engine call is left (exit 0), printing
        /// the progress to stderr.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds (exit 1).
        #[arg(long, value_name = "SECS", requires = "wait")]
        timeout: Option<u64>,
    },
    /// Return a drained MSR to service (`active true`).
    Undrain {
        /// MSR name.
        name: String,
    },
    /// Forget an MSR that is gone (its registration lapsed or ended): it
    /// stays listed, and alerted on, until it registers again or this.
    Forget {
        /// MSR name.
        name: String,
    },
}

/// `msr set NAME …`
#[derive(Debug, Subcommand)]
pub enum MsrProperty {
    /// Performance coefficient: a number from 0.001 to 1,000,000 (default 1.0).
    #[command(name = "performance_coefficient")]
    PerformanceCoefficient {
        /// The coefficient.
        #[arg(value_parser = parse_finite, allow_negative_numbers = true)]
        value: f64,
    },
    /// Admin active flag: `false` takes the MSR out of selection (its live
    /// legs stay: a drain).
    Active {
        /// `true` or `false`.
        #[arg(action = clap::ArgAction::Set)]
        value: bool,
    },
    /// Load limit in percent (default 100): no new leg at or above it; the
    /// conference thresholds are fractions of it (SPEC §9).
    #[command(name = "load_limit")]
    LoadLimit {
        /// 1 to 100.
        #[arg(allow_negative_numbers = true)]
        value: i64,
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
        /// Every column (version, coefficient, Cc-address, engine URI,
        /// expiry, staleness, health age); by default the table fits 120
        /// columns.
        #[arg(long)]
        wide: bool,
    },
    /// Set a contact's zone or site.
    Set {
        /// Contact name, `{iface}@{msr}`.
        contact: String,
        /// The property and its value.
        #[command(subcommand)]
        property: ResourceProperty,
    },
    /// Remove a contact's zone or site setting: it takes the collector's
    /// `[defaults]` again.
    Unset {
        /// Contact name, `{iface}@{msr}`.
        contact: String,
        /// `zone` or `site`.
        #[arg(value_parser = ["zone", "site"])]
        property: String,
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
    /// The leg's zone [default: the collector's `[defaults] zone`].
    #[arg(long, default_value = "", hide_default_value = true)]
    pub zone: String,
    /// The leg's site [default: the collector's `[defaults] site`].
    #[arg(long, default_value = "", hide_default_value = true)]
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
    /// Place the leg with this SIP Call-ID (SPEC §9): a live leg gets its
    /// MSR again; `release --call-id` ends it.
    #[arg(long)]
    pub call_id: Option<String>,
    /// Tells two legs of one Call-ID apart (needs --call-id).
    #[arg(long, requires = "call_id")]
    pub leg: Option<String>,
    /// The conference or space the leg joins: admission thresholds and
    /// affinity (needs --call-id).
    #[arg(long, requires = "call_id")]
    pub conference: Option<String>,
    /// Failover (SPEC §14): an MSR that failed this leg (repeat for each,
    /// in the order tried; needs --call-id). The leg moves to the next
    /// choice; the failure counts against the MSR it was on.
    #[arg(long, value_name = "MSR", requires = "call_id")]
    pub failed: Vec<String>,
    /// Why the last --failed MSR failed: timeout, a SIP status (503),
    /// error or load-limit (default error).
    #[arg(long, value_name = "CAUSE", requires = "failed")]
    pub failure: Option<String>,
    /// The codecs the leg's offer carries, comma-separated (SPEC §15):
    /// `pcma,g729` (audio: any one of them), `h264` (video), `t38` (fax).
    /// Only an MSR that takes one codec of each offered kind is a
    /// candidate; `no_capable_msr` when none is.
    #[arg(long, value_name = "CODECS", value_delimiter = ',')]
    pub codecs: Vec<String>,
}

/// A finite number (JSON has no NaN or infinity: they would travel as
/// `null` and change the meaning of the request); `-0` is read as `0`.
fn parse_finite(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() => Ok(normalize_zero(value)),
        _ => Err(format!("`{text}` is not a finite number")),
    }
}

/// A number >= 0 (`-0` read as `0`) or `infinity`.
fn parse_distance(text: &str) -> Result<Distance, String> {
    if text.eq_ignore_ascii_case("infinity") || text.eq_ignore_ascii_case("inf") {
        return Ok(Distance::Infinity);
    }
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => {
            Ok(Distance::Finite(normalize_zero(value)))
        }
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
            Command::Site(SiteCommand::List) => Request::SiteList {},
            Command::Zone(ZoneCommand::List) => Request::ZoneList {},
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
            Command::Msr(MsrCommand::Set {
                name,
                property: MsrProperty::LoadLimit { value },
            }) => Request::MsrSetLoadLimit {
                msr: name.clone(),
                // Out of range stays out of range: the collector names it.
                value: u32::try_from(*value).unwrap_or(u32::MAX),
            },
            Command::Msr(MsrCommand::List) => Request::MsrList {},
            Command::Msr(MsrCommand::Drain { name, .. }) => Request::MsrSetActive {
                msr: name.clone(),
                active: false,
            },
            Command::Msr(MsrCommand::Undrain { name }) => Request::MsrSetActive {
                msr: name.clone(),
                active: true,
            },
            Command::Msr(MsrCommand::Forget { name }) => Request::MsrForget { msr: name.clone() },
            Command::Resource(ResourceCommand::List { filter, .. }) => Request::ResourceList {
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
            Command::Resource(ResourceCommand::Unset { contact, property }) => {
                Request::ResourceUnset {
                    contact: contact.clone(),
                    property: if property == "site" {
                        ContactProperty::Site
                    } else {
                        ContactProperty::Zone
                    },
                }
            }
            Command::Subscription(SubscriptionCommand::Set {
                msr,
                event,
                property: SubscriptionProperty::Expires { secs },
            }) => Request::SubscriptionSetExpires {
                msr: msr.clone(),
                event: event.clone(),
                expires_secs: *secs,
            },
            Command::Subscription(SubscriptionCommand::List) => Request::SubscriptionList {},
            Command::Select(args) => Request::Select(SelectQuery {
                zone: args.zone.clone(),
                site: args.site.clone(),
                msr: args.msr.clone(),
                random: args.random,
                explain: args.explain,
                call_id: args.call_id.clone(),
                leg: args.leg.clone(),
                conference: args.conference.clone(),
                failed: args.failed.clone(),
                failure: args.failure.clone(),
                codecs: args.codecs.clone(),
            }),
            Command::Release { call_id, leg } => Request::Release {
                call_id: call_id.clone(),
                leg: leg.clone(),
            },
            Command::Cluster(ClusterCommand::List) => Request::ClusterList {},
            Command::Leg(LegCommand::List {
                msr,
                older_than,
                limit,
            }) => Request::LegList {
                msr: msr.clone(),
                older_than_secs: *older_than,
                limit: Some(*limit),
            },
            Command::Hello => Request::Hello {},
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
