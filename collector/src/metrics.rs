//! The collector's Prometheus metrics (SPEC §11), served by `GET /metrics`.
//!
//! Two kinds, kept apart so the hot path stays a few atomic increments:
//!
//! * **Counters and the latency histogram** live in [`Metrics`], shared
//!   (`Arc`) between the shell, which increments them as it handles
//!   selections, NOTIFYs and REGISTERs, and the HTTP task, which encodes
//!   them. Nothing is locked on the shell's side beyond the label family's
//!   read lock.
//! * **Per-MSR gauges** (load, calls, health, live legs) are not mirrored:
//!   at each scrape the HTTP task asks the shell for `resource_list` and
//!   `msr_list` through the control protocol's one handler and
//!   [`Metrics::render`] turns those answers into gauges, so the load table
//!   and the leg table stay the only owners of those facts.
//!
//! The text is OpenMetrics 1.0 (`prometheus-client`) for a scraper that
//! asks for it (`Accept: application/openmetrics-text`, as Prometheus
//! does), and otherwise the Prometheus text format 0.0.4
//! ([`to_text_format`]), which `promtool check metrics` and older scrapers
//! read: in OpenMetrics a counter family `x` has samples `x_total`, which
//! a 0.0.4 reader takes for another family with no `HELP`.

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use msr_shared::admin::{HealthState, MsrInfo, ResourceInfo};

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
struct HealthLabels {
    msr: String,
    contact: String,
    state: String,
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
    redirects: Family<StatusLabel, Counter>,
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
            "Time the collector's loop spent on one selection",
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
        let redirects = Family::<StatusLabel, Counter>::default();
        registry.register(
            "msr_collector_redirect_responses",
            "Final responses of the SIP redirect server to INVITEs, by status code",
            redirects.clone(),
        );
        Self {
            registry,
            selections,
            msr_selections,
            selection_seconds,
            notifies,
            registers,
            released_legs,
            redirects,
        }
    }

    /// A selection answered with `msr` (`leg`: `new`, `sticky`,
    /// `reanchored`, or `none` without a call_id), taking `seconds`.
    pub fn selected(&self, msr: &str, leg: &str, seconds: f64) {
        self.selections
            .get_or_create(&OutcomeLabel {
                outcome: "selected".into(),
            })
            .inc();
        self.msr_selections
            .get_or_create(&MsrLegLabels {
                msr: msr.into(),
                leg: leg.into(),
            })
            .inc();
        self.selection_seconds.observe(seconds);
    }

    /// A selection refused with error code `code`, taking `seconds`.
    pub fn refused(&self, code: &str, seconds: f64) {
        self.selections
            .get_or_create(&OutcomeLabel {
                outcome: code.into(),
            })
            .inc();
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

    /// The exposition: the counters, then per contact and per MSR the gauges
    /// made from `resources` and `msrs` (the answers to `resource_list` and
    /// `msr_list`), then `# EOF`.
    pub fn render(&self, resources: &[ResourceInfo], msrs: &[MsrInfo]) -> String {
        let mut gauges = Registry::default();
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
            for state in [
                HealthState::Healthy,
                HealthState::Unreported,
                HealthState::Unreachable,
                HealthState::Stale,
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
        for msr in msrs {
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
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut text, &self.registry);
        let _ = encode_registry(&mut text, &gauges);
        let _ = encode_eof(&mut text);
        text
    }
}

#[cfg(test)]
mod tests;
