//! The collector's Prometheus metrics (SPEC §11), served by `GET /metrics`.
//!
//! Two kinds, kept apart so the hot path stays a few atomic increments:
//!
//! * **Counters and the latency histogram** live in [`Metrics`], shared
//!   (`Arc`) between the shell, which adds the core's increments to them
//!   ([`Metrics::count`]: selections, NOTIFYs, REGISTERs, releases, core
//!   failures) and times selections, and the HTTP task, which encodes
//!   them. Nothing is locked on the shell's side beyond the label family's
//!   read lock.
//! * **Per-MSR gauges** (load, calls, health, live legs) are not mirrored:
//!   at each scrape the HTTP task asks the shell for `resource_list` and
//!   `msr_list` through the control protocol, which the core answers, and
//!   [`Metrics::render`] turns those answers into gauges, so the load table
//!   and the leg table stay the only owners of those facts.
//!
//! * **The store, the cluster, the SIP ingest and the process** (SPEC §13)
//!   are read at each scrape too: `cluster_list`'s answer, the ingest's
//!   atomic counters ([`IngestCounts`]) and `/proc/self`
//!   ([`ProcessStats`]).
//!
//! Every series an alert or a dashboard panel uses exists from the first
//! scrape: the selection outcomes, NOTIFY outcomes and ingest drops are
//! written at 0 before anything happened, and per-MSR gauges are written
//! for every MSR the collector knows.
//!
//! The text is OpenMetrics 1.0 (`prometheus-client`) for a scraper that
//! asks for it (`Accept: application/openmetrics-text`, as Prometheus
//! does), and otherwise the Prometheus text format 0.0.4
//! ([`to_text_format`]), which `promtool check metrics` and older scrapers
//! read: in OpenMetrics a counter family `x` has samples `x_total`, which
//! a 0.0.4 reader takes for another family with no `HELP`. The 0.0.4 text
//! is made from the library's OpenMetrics text because `prometheus-client`
//! (0.23, and 0.24) has no encoder for it, only OpenMetrics text and
//! protobuf.

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use msr_shared::admin::{
    ClusterView, DrainState, ErrorCode, HealthState, LegOutcome, MsrInfo, RegistrationStatus,
    ResourceInfo, StoreState,
};

pub use crate::api::process::ProcessStats;
use crate::core::Count;

/// The `Content-Type` of `GET /metrics` in OpenMetrics.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `Content-Type` of `GET /metrics` in the Prometheus text format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether an `Accept` header value asks for OpenMetrics.
pub fn wants_openmetrics(accept: &str) -> bool {
    accept.split(',').any(|range| {
        let mut params = range.split(';');
        let is_om = params.next().is_some_and(|t| {
            t.trim()
                .eq_ignore_ascii_case("application/openmetrics-text")
        });
        // RFC 9110 §12.4.2: q=0 means "not acceptable".
        let refused = params.any(|p| {
            p.trim()
                .strip_prefix("q=")
                .and_then(|q| q.trim().parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        is_om && !refused
    })
}

/// The OpenMetrics exposition `openmetrics` (as [`Metrics::render`] writes
/// it) in the Prometheus text format 0.0.4: a counter family's `HELP` and
/// `TYPE` name its `_total` samples, `_created` samples, `# UNIT` and
/// `# EOF` are left out; gauges and histograms are written alike in both.
pub fn to_text_format(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<(&str, &str)> = None;
    let mut counter: Option<&str> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let exposed = if kind == "counter" {
                counter = Some(name);
                format!("{name}_total")
            } else {
                counter = None;
                name.to_owned()
            };
            if let Some((_, text)) = help.take().filter(|(n, _)| *n == name) {
                out.push_str(&format!("# HELP {exposed} {text}\n"));
            }
            out.push_str(&format!("# TYPE {exposed} {kind}\n"));
            continue;
        }
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if counter.is_some_and(|name| {
            line.strip_prefix(name)
                .is_some_and(|r| r.starts_with("_created"))
        }) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Label of a counter by outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

/// Label of a counter by SIP status code.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

/// Labels of a selection counted per MSR.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MsrLegLabels {
    msr: String,
    leg: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MsrLabel {
    msr: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContactLabels {
    msr: String,
    contact: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlacedLabels {
    msr: String,
    contact: String,
    zone: String,
    site: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    backend: String,
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HealthLabels {
    msr: String,
    contact: String,
    state: String,
}

/// The `outcome` of a selection that found an MSR; a refused one is
/// counted under its error code.
pub const SELECTED: &str = "selected";

/// The refusals a selection can end in (SPEC §7, §9): their counters are
/// written from the start, beside [`SELECTED`]'s.
pub const SELECTION_REFUSALS: &[ErrorCode] = &[
    ErrorCode::MsrNotFound,
    ErrorCode::MsrOverloaded,
    ErrorCode::MsrUnhealthy,
    ErrorCode::LegReleased,
    ErrorCode::MsrUnavailable,
    ErrorCode::NoCapableMsr,
    ErrorCode::UnknownSite,
    ErrorCode::InvalidValue,
    ErrorCode::Unavailable,
];

/// The SIP ingest's drops, as the daemon's ingest counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngestCounts {
    /// Datagrams dropped by admission (a source over its rate).
    pub refused: u64,
    /// Messages dropped because the loop's queue was full.
    pub shed: u64,
    /// Datagrams that were no SIP message.
    pub malformed: u64,
    /// Datagrams larger than a UDP payload can be.
    pub oversized: u64,
}

/// What one scrape asked the collector and read from the system.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    /// The answer to `resource_list`.
    pub resources: &'a [ResourceInfo],
    /// The answer to `msr_list`.
    pub msrs: &'a [MsrInfo],
    /// The answer to `cluster_list`.
    pub cluster: Option<&'a ClusterView>,
    /// The SIP ingest's counters.
    pub ingest: IngestCounts,
    /// This process.
    pub process: ProcessStats,
}

/// The counters and the histogram (module docs).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    selections: Family<OutcomeLabel, Counter>,
    msr_selections: Family<MsrLegLabels, Counter>,
    selection_seconds: Histogram,
    notifies: Family<OutcomeLabel, Counter>,
    registers: Family<StatusLabel, Counter>,
    released_legs: Counter,
    zone_overloads: Counter,
    redirects: Family<StatusLabel, Counter>,
    core_failures: Family<MsrCauseLabels, Counter>,
}

/// Labels of an MSR's drain state.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MsrStateLabels {
    msr: String,
    state: String,
}

/// Labels of a failure a core reported against an MSR (SPEC §14).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MsrCauseLabels {
    msr: String,
    cause: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every counter at zero.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let selections = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "msr_collector_selections",
            "Selections by outcome: selected, or the refusal's error code",
            selections.clone(),
        );
        let msr_selections = Family::<MsrLegLabels, Counter>::default();
        registry.register(
            "msr_collector_msr_selections",
            "Selections answered with this MSR, by leg outcome (none: no call_id)",
            msr_selections.clone(),
        );
        // 1 µs to about 4 ms in 13 doublings: a selection takes microseconds.
        let selection_seconds = Histogram::new(exponential_buckets(1e-6, 2.0, 13));
        registry.register(
            "msr_collector_selection_duration_seconds",
            "Time spent on one selection: by the collector's loop, or by the front end that answered it from the loop's copy",
            selection_seconds.clone(),
        );
        let notifies = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "msr_collector_notifies",
            "eltex-call-count NOTIFYs received, by outcome (accepted, refused)",
            notifies.clone(),
        );
        let registers = Family::<StatusLabel, Counter>::default();
        registry.register(
            "msr_collector_registers",
            "REGISTERs answered, by status code",
            registers.clone(),
        );
        let released_legs = Counter::default();
        registry.register(
            "msr_collector_released_legs",
            "Call legs ended by a release",
            released_legs.clone(),
        );
        let zone_overloads = Counter::default();
        registry.register(
            "msr_collector_zone_overloads",
            "Times a zone entered overload: pooled then keeps a headroom on every MSR for the other core hosts (SPEC 10)",
            zone_overloads.clone(),
        );
        let redirects = Family::<StatusLabel, Counter>::default();
        registry.register(
            "msr_collector_redirect_responses",
            "Final responses of the SIP redirect server to INVITEs, by status code",
            redirects.clone(),
        );
        let core_failures = Family::<MsrCauseLabels, Counter>::default();
        registry.register(
            "msr_collector_core_failures",
            "Failures cores reported for legs placed on this MSR (failover, SPEC §14), by cause: timeout, 5xx, engine_error, load_limit, full_near_top, not_the_msr",
            core_failures.clone(),
        );
        // SPEC §13: the series of the refusal alert and the panels exist
        // before the first selection, NOTIFY or REGISTER.
        let outcomes =
            std::iter::once(SELECTED).chain(SELECTION_REFUSALS.iter().map(|c| c.as_str()));
        for outcome in outcomes {
            selections
                .get_or_create(&OutcomeLabel {
                    outcome: outcome.into(),
                })
                .inc_by(0);
        }
        for outcome in ["accepted", "refused"] {
            notifies
                .get_or_create(&OutcomeLabel {
                    outcome: outcome.into(),
                })
                .inc_by(0);
        }
        for status in ["200", "401"] {
            registers
                .get_or_create(&StatusLabel {
                    status: status.into(),
                })
                .inc_by(0);
        }
        for status in ["302", "480", "503"] {
            redirects
                .get_or_create(&StatusLabel {
                    status: status.into(),
                })
                .inc_by(0);
        }
        Self {
            registry,
            selections,
            msr_selections,
            selection_seconds,
            notifies,
            registers,
            released_legs,
            zone_overloads,
            redirects,
            core_failures,
        }
    }

    /// Adds one of the core's increments ([`Count`]).
    pub fn count(&self, count: &Count) {
        match count {
            Count::Selected { msr, leg } => self.selected(msr, *leg),
            Count::Refused(code) => self.refused(*code),
            Count::Released(legs) => self.released(*legs),
            Count::ZoneOverload => {
                self.zone_overloads.inc();
            }
            Count::Register(status) => self.register(*status),
            Count::Notify { accepted } => self.notify(*accepted),
            Count::CoreFailure { msr, cause } => self.core_failure(msr, cause.label()),
        }
    }

    /// A core reported that `msr` failed a leg, for `cause` (a
    /// [`FailureCause::label`](crate::model::health::FailureCause::label)).
    pub fn core_failure(&self, msr: &str, cause: &str) {
        self.core_failures
            .get_or_create(&MsrCauseLabels {
                msr: msr.into(),
                cause: cause.into(),
            })
            .inc();
    }

    /// A selection answered with `msr`; `leg` is what it did with the
    /// call's leg, labelled `none` without a call_id.
    pub fn selected(&self, msr: &str, leg: Option<LegOutcome>) {
        self.selections
            .get_or_create(&OutcomeLabel {
                outcome: SELECTED.into(),
            })
            .inc();
        self.msr_selections
            .get_or_create(&MsrLegLabels {
                msr: msr.into(),
                leg: leg.map_or("none", LegOutcome::as_str).into(),
            })
            .inc();
    }

    /// A selection refused with error code `code`.
    pub fn refused(&self, code: ErrorCode) {
        self.selections
            .get_or_create(&OutcomeLabel {
                outcome: code.as_str().into(),
            })
            .inc();
    }

    /// The collector spent `seconds` on one selection.
    pub fn selection_duration(&self, seconds: f64) {
        self.selection_seconds.observe(seconds);
    }

    /// A NOTIFY answered 200 (`accepted`) or with an error (`refused`).
    pub fn notify(&self, accepted: bool) {
        let outcome = if accepted { "accepted" } else { "refused" };
        self.notifies
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// A REGISTER answered with `status`.
    pub fn register(&self, status: u16) {
        self.registers
            .get_or_create(&StatusLabel {
                status: status.to_string(),
            })
            .inc();
    }

    /// `count` legs ended by one release.
    pub fn released(&self, count: u32) {
        self.released_legs.inc_by(u64::from(count));
    }

    /// The redirect server answered an INVITE with `status`.
    pub fn redirect(&self, status: u16) {
        self.redirects
            .get_or_create(&StatusLabel {
                status: status.to_string(),
            })
            .inc();
    }

    /// The exposition: the counters, then the gauges made from `snapshot`
    /// (per contact, per MSR, the store and cluster, the ingest, the
    /// process), then `# EOF`.
    pub fn render(&self, snapshot: &Snapshot<'_>) -> String {
        let resources = snapshot.resources;
        let msrs = snapshot.msrs;
        let mut gauges = Registry::default();
        let limits: std::collections::HashMap<&str, u8> = msrs
            .iter()
            .map(|m| (m.name.as_str(), m.load_limit))
            .collect();
        let report_age = Family::<ContactLabels, Gauge>::default();
        let below_limit = Family::<PlacedLabels, Gauge>::default();
        let load = Family::<ContactLabels, Gauge>::default();
        let calls = Family::<ContactLabels, Gauge>::default();
        let max_calls = Family::<ContactLabels, Gauge>::default();
        let health = Family::<HealthLabels, Gauge>::default();
        let contact_legs = Family::<ContactLabels, Gauge>::default();
        for row in resources {
            let labels = ContactLabels {
                msr: row.msr.clone(),
                contact: row.contact.clone(),
            };
            if let Some(value) = row.load {
                load.get_or_create(&labels).set(i64::from(value));
            }
            if let Some(value) = row.calls {
                calls.get_or_create(&labels).set(i64::from(value));
            }
            if let Some(value) = row.max_calls {
                max_calls.get_or_create(&labels).set(i64::from(value));
            }
            contact_legs
                .get_or_create(&labels)
                .set(i64::from(row.live_legs));
            if let Some(age) = row.report_age_secs {
                report_age
                    .get_or_create(&labels)
                    .set(i64::try_from(age).unwrap_or(i64::MAX));
            }
            // Selection could place a new plain leg here (SPEC §5, §9):
            // registered, healthy, active, and below its MSR's load limit.
            let limit = limits.get(row.msr.as_str()).copied().unwrap_or(100);
            let usable = row.status == RegistrationStatus::Registered
                && row.health == HealthState::Healthy
                && row.active
                && row.load.is_some_and(|load| load < limit);
            below_limit
                .get_or_create(&PlacedLabels {
                    msr: row.msr.clone(),
                    contact: row.contact.clone(),
                    zone: row.zone.clone(),
                    site: row.site.clone(),
                })
                .set(i64::from(usable));
            for state in [
                HealthState::Healthy,
                HealthState::Unreported,
                HealthState::Unreachable,
                HealthState::Stale,
                HealthState::EngineDown,
                HealthState::Draining,
            ] {
                health
                    .get_or_create(&HealthLabels {
                        msr: row.msr.clone(),
                        contact: row.contact.clone(),
                        state: state.as_str().into(),
                    })
                    .set(i64::from(row.health == state));
            }
        }
        let live_legs = Family::<MsrLabel, Gauge>::default();
        let active = Family::<MsrLabel, Gauge>::default();
        let healthy = Family::<MsrLabel, Gauge>::default();
        let load_limit = Family::<MsrLabel, Gauge>::default();
        let oldest_leg = Family::<MsrLabel, Gauge>::default();
        let drain = Family::<MsrStateLabels, Gauge>::default();
        let gone = Family::<MsrLabel, Gauge>::default();
        for msr in msrs {
            // The per-MSR selection series exist before the MSR's first
            // selection (module docs).
            self.msr_selections
                .get_or_create(&MsrLegLabels {
                    msr: msr.name.clone(),
                    leg: "new".into(),
                })
                .inc_by(0);
            let labels = MsrLabel {
                msr: msr.name.clone(),
            };
            live_legs
                .get_or_create(&labels)
                .set(i64::from(msr.live_legs));
            active.get_or_create(&labels).set(i64::from(msr.active));
            healthy
                .get_or_create(&labels)
                .set(i64::from(msr.health == Some(HealthState::Healthy)));
            load_limit
                .get_or_create(&labels)
                .set(i64::from(msr.load_limit));
            oldest_leg
                .get_or_create(&labels)
                .set(i64::try_from(msr.oldest_leg_secs.unwrap_or(0)).unwrap_or(i64::MAX));
            gone.get_or_create(&labels)
                .set(i64::from(msr.gone_while_serving));
            for state in [DrainState::Draining, DrainState::Drained] {
                drain
                    .get_or_create(&MsrStateLabels {
                        msr: msr.name.clone(),
                        state: state.as_str().into(),
                    })
                    .set(i64::from(msr.drain == Some(state)));
            }
        }
        gauges.register(
            "msr_collector_msr_load_percent",
            "Last reported load of the contact, percent",
            load,
        );
        gauges.register(
            "msr_collector_msr_calls",
            "Last reported media sessions of the contact",
            calls,
        );
        gauges.register(
            "msr_collector_msr_max_calls",
            "Last reported capacity of the contact in media sessions",
            max_calls,
        );
        gauges.register(
            "msr_collector_msr_health",
            "1 for the contact's current health state, 0 for the others",
            health,
        );
        gauges.register(
            "msr_collector_contact_live_legs",
            "Live call legs placed on the contact",
            contact_legs,
        );
        gauges.register(
            "msr_collector_msr_live_legs",
            "Live call legs placed on the MSR",
            live_legs,
        );
        gauges.register(
            "msr_collector_msr_active",
            "The operator's active flag of the MSR",
            active,
        );
        gauges.register(
            "msr_collector_msr_healthy",
            "1 when at least one registered contact of the MSR is healthy",
            healthy,
        );
        gauges.register(
            "msr_collector_msr_load_limit_percent",
            "The operator's load limit of the MSR, percent",
            load_limit,
        );
        gauges.register(
            "msr_collector_msr_gone",
            "1 for an MSR that was in service (reporting, not drained) when its last registration ended, until it registers again or is forgotten (SPEC §14)",
            gone,
        );
        gauges.register(
            "msr_collector_msr_drain",
            "1 for the MSR's drain state (SPEC §14): draining while legs or engine calls are left, drained once none is",
            drain,
        );
        gauges.register(
            "msr_collector_msr_oldest_leg_age_seconds",
            "Age of the MSR's oldest live call leg (0 without live legs)",
            oldest_leg,
        );
        gauges.register(
            "msr_collector_contact_report_age_seconds",
            "Seconds since the contact's last load report (NOTIFY)",
            report_age,
        );
        gauges.register(
            "msr_collector_contact_below_limit",
            "1 when the contact is registered, healthy, active and below its MSR's load limit",
            below_limit,
        );
        self.register_collector(&mut gauges, snapshot);
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut text, &self.registry);
        let _ = encode_registry(&mut text, &gauges);
        let _ = encode_eof(&mut text);
        text
    }

    /// The store and cluster (SPEC §12), the version, the SIP ingest and
    /// the process (SPEC §13).
    fn register_collector(&self, gauges: &mut Registry, snapshot: &Snapshot<'_>) {
        let build = Family::<VersionLabel, Gauge>::default();
        build
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .set(1);
        gauges.register(
            "msr_collector_build_info",
            "Always 1; the collector's version is the label",
            build,
        );
        if let Some(cluster) = snapshot.cluster {
            let backend = match cluster.store.backend {
                msr_shared::admin::StoreKind::File => "file",
                msr_shared::admin::StoreKind::Etcd => "etcd",
            };
            let state = Family::<StoreLabels, Gauge>::default();
            for candidate in [
                StoreState::Connected,
                StoreState::Unavailable,
                StoreState::Local,
            ] {
                state
                    .get_or_create(&StoreLabels {
                        backend: backend.into(),
                        state: candidate.as_str().into(),
                    })
                    .set(i64::from(cluster.store.status == candidate));
            }
            gauges.register(
                "msr_collector_store_state",
                "1 for the operator store's current state (connected, unavailable, local), 0 for the others",
                state,
            );
            let available = Gauge::<i64>::default();
            available.set(i64::from(cluster.store.status != StoreState::Unavailable));
            gauges.register(
                "msr_collector_store_available",
                "1 while the operator store can be reached (always, with the file store)",
                available,
            );
            let core_hosts = Gauge::<i64>::default();
            core_hosts.set(i64::from(cluster.core_hosts));
            gauges.register(
                "msr_collector_cluster_core_hosts",
                "Core hosts in the cluster (G): etcd's live members, or [cluster] core_hosts",
                core_hosts,
            );
            let members = Gauge::<i64>::default();
            members.set(i64::try_from(cluster.members.len()).unwrap_or(i64::MAX));
            gauges.register(
                "msr_collector_cluster_members",
                "Live collectors this collector sees in the cluster",
                members,
            );
        }
        let ingest = Family::<ReasonLabel, Counter>::default();
        let counts = snapshot.ingest;
        for (reason, value) in [
            ("admission", counts.refused),
            ("shed", counts.shed),
            ("malformed", counts.malformed),
            ("oversized", counts.oversized),
        ] {
            ingest
                .get_or_create(&ReasonLabel {
                    reason: reason.into(),
                })
                .inc_by(value);
        }
        gauges.register(
            "msr_collector_sip_dropped",
            "SIP datagrams the ingest dropped: admission (source over its rate), shed (queue full), malformed, oversized",
            ingest,
        );
        let process = snapshot.process;
        if let Some(seconds) = process.cpu_seconds {
            let cpu = Counter::<f64, std::sync::atomic::AtomicU64>::default();
            cpu.inc_by(seconds);
            gauges.register(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                cpu,
            );
        }
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                process.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                process.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                process.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                process.max_fds,
            ),
        ] {
            if let Some(value) = value {
                let gauge = Gauge::<i64>::default();
                gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
                gauges.register(name, help, gauge);
            }
        }
        if let Some(start) = process.start_time_seconds {
            let gauge = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
            gauge.set(start);
            gauges.register(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                gauge,
            );
        }
    }
}

#[cfg(test)]
mod tests;
