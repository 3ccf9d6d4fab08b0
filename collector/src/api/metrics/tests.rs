use msr_shared::admin::{
    ClusterMember, ClusterView, ErrorCode, HealthState, LegOutcome, MsrInfo, ResourceInfo,
    StoreKind, StoreState, StoreView,
};

use super::*;

fn row(msr: &str, load: u8, health: HealthState, live_legs: u32) -> ResourceInfo {
    ResourceInfo {
        node: "core1".into(),
        msr: msr.into(),
        version: None,
        performance_coefficient: 1.0,
        load: Some(load),
        cpu: Some(1),
        calls: Some(u32::from(load)),
        max_calls: Some(100),
        report_age_secs: Some(0),
        stale: false,
        zone: "default".into(),
        site: "local".into(),
        active: true,
        contact: format!("lo@{msr}"),
        uri: format!("sip:{msr}@127.0.0.1:5041"),
        engine_uri: None,
        mcc: None,
        status: msr_shared::admin::RegistrationStatus::Registered,
        expires_secs: 60,
        subscription: Some(msr_shared::subscription::SubscriptionState::Active),
        live_legs,
        health,
        health_since_unix: 0,
        health_secs: 0,
        codecs: None,
    }
}

fn msr(name: &str, live_legs: u32) -> MsrInfo {
    MsrInfo {
        name: name.into(),
        performance_coefficient: 1.0,
        active: true,
        registered: true,
        load_limit: 100,
        live_legs,
        oldest_leg_secs: None,
        health: Some(HealthState::Healthy),
        health_since_unix: None,
        engine_calls: None,
        gone_since_unix: None,
        gone_cause: None,
        gone_while_serving: false,
        drain: None,
    }
}

fn snapshot<'a>(
    resources: &'a [ResourceInfo],
    msrs: &'a [MsrInfo],
    cluster: Option<&'a ClusterView>,
) -> Snapshot<'a> {
    Snapshot {
        resources,
        msrs,
        cluster,
        ingest: IngestCounts::default(),
        process: ProcessStats::default(),
    }
}

fn etcd_cluster(status: StoreState, members: usize) -> ClusterView {
    ClusterView {
        node: "core1".into(),
        store: StoreView {
            backend: StoreKind::Etcd,
            status,
            location: "http://127.0.0.1:2379 /msr".into(),
            revision: None,
            unavailable_since_unix: None,
            detail: None,
        },
        core_hosts: u32::try_from(members).unwrap_or(u32::MAX),
        core_hosts_from_config: false,
        members: (0..members)
            .map(|i| ClusterMember {
                node: format!("core{}", i + 1),
                sip: "127.0.0.1:5060".into(),
                started_unix: 0,
                this: i == 0,
            })
            .collect(),
    }
}

fn has(text: &str, line: &str) {
    assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
}

#[test]
fn the_series_of_alerts_and_panels_exist_before_anything_happened() {
    let metrics = Metrics::new();
    let text = to_text_format(&metrics.render(&snapshot(&[], &[], None)));
    // The alert rules and the dashboard name these labels (dist/monitoring).
    let outcomes = [
        "selected",
        "msr_not_found",
        "msr_overloaded",
        "msr_unhealthy",
        "leg_released",
        "unknown_site",
        "invalid_value",
        "unavailable",
    ];
    for outcome in outcomes {
        has(
            &text,
            &format!("msr_collector_selections_total{{outcome=\"{outcome}\"}} 0"),
        );
    }
    has(&text, "msr_collector_notifies_total{outcome=\"refused\"} 0");
    for reason in ["admission", "shed", "malformed", "oversized"] {
        has(
            &text,
            &format!("msr_collector_sip_dropped_total{{reason=\"{reason}\"}} 0"),
        );
    }
    has(
        &text,
        &format!(
            "msr_collector_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        ),
    );
}

#[test]
fn the_store_state_cluster_size_ingest_and_process_are_exposed() {
    let metrics = Metrics::new();
    let cluster = etcd_cluster(StoreState::Unavailable, 2);
    let mut snap = snapshot(&[], &[], Some(&cluster));
    snap.ingest = IngestCounts {
        refused: 3,
        shed: 1,
        malformed: 2,
        oversized: 0,
    };
    snap.process = ProcessStats {
        cpu_seconds: Some(1.5),
        resident_bytes: Some(4096),
        virtual_bytes: Some(8192),
        open_fds: Some(12),
        max_fds: Some(1024),
        start_time_seconds: Some(1_700_000_000.0),
    };
    let text = to_text_format(&metrics.render(&snap));
    for line in [
        "msr_collector_store_state{backend=\"etcd\",state=\"unavailable\"} 1",
        "msr_collector_store_state{backend=\"etcd\",state=\"connected\"} 0",
        "msr_collector_store_available 0",
        "msr_collector_cluster_core_hosts 2",
        "msr_collector_cluster_members 2",
        "msr_collector_sip_dropped_total{reason=\"admission\"} 3",
        "msr_collector_sip_dropped_total{reason=\"shed\"} 1",
        "msr_collector_sip_dropped_total{reason=\"malformed\"} 2",
        "process_cpu_seconds_total 1.5",
        "process_resident_memory_bytes 4096",
        "process_open_fds 12",
        "process_max_fds 1024",
        "# TYPE process_cpu_seconds_total counter",
    ] {
        has(&text, line);
    }
    let connected = etcd_cluster(StoreState::Connected, 3);
    let text = to_text_format(&metrics.render(&snapshot(&[], &[], Some(&connected))));
    has(&text, "msr_collector_store_available 1");
    has(&text, "msr_collector_cluster_core_hosts 3");
}

#[test]
fn a_contact_is_below_its_limit_only_when_healthy_active_and_under_the_msr_limit() {
    let metrics = Metrics::new();
    let mut limited = msr("msr_2", 0);
    limited.load_limit = 30;
    limited.oldest_leg_secs = None;
    let mut leggy = msr("msr_1", 2);
    leggy.oldest_leg_secs = Some(7300);
    let rows = [
        row("msr_1", 37, HealthState::Healthy, 2),
        row("msr_2", 37, HealthState::Healthy, 0),
        row("msr_3", 10, HealthState::Stale, 0),
    ];
    let text = to_text_format(&metrics.render(&snapshot(&rows, &[leggy, limited], None)));
    for line in [
        "msr_collector_contact_below_limit{msr=\"msr_1\",contact=\"lo@msr_1\",zone=\"default\",site=\"local\"} 1",
        "msr_collector_contact_below_limit{msr=\"msr_2\",contact=\"lo@msr_2\",zone=\"default\",site=\"local\"} 0",
        "msr_collector_contact_below_limit{msr=\"msr_3\",contact=\"lo@msr_3\",zone=\"default\",site=\"local\"} 0",
        "msr_collector_msr_load_limit_percent{msr=\"msr_2\"} 30",
        "msr_collector_msr_oldest_leg_age_seconds{msr=\"msr_1\"} 7300",
        "msr_collector_msr_oldest_leg_age_seconds{msr=\"msr_2\"} 0",
        "msr_collector_contact_report_age_seconds{msr=\"msr_1\",contact=\"lo@msr_1\"} 0",
    ] {
        has(&text, line);
    }
}

#[test]
fn the_exposition_has_the_counters_and_the_gauges_of_each_msr() {
    let metrics = Metrics::new();
    metrics.selected("msr_1", Some(LegOutcome::New));
    metrics.selected("msr_1", Some(LegOutcome::Sticky));
    metrics.refused(ErrorCode::MsrOverloaded);
    for seconds in [2e-6, 2e-6, 1e-6] {
        metrics.selection_duration(seconds);
    }
    metrics.notify(true);
    metrics.notify(false);
    metrics.register(401);
    metrics.register(200);
    metrics.released(2);
    metrics.redirect(302);
    let text = metrics.render(&snapshot(
        &[row("msr_1", 37, HealthState::Healthy, 1)],
        &[msr("msr_1", 1)],
        None,
    ));
    for line in [
        "msr_collector_selections_total{outcome=\"selected\"} 2",
        "msr_collector_selections_total{outcome=\"msr_overloaded\"} 1",
        "msr_collector_msr_selections_total{msr=\"msr_1\",leg=\"new\"} 1",
        "msr_collector_msr_selections_total{msr=\"msr_1\",leg=\"sticky\"} 1",
        "msr_collector_selection_duration_seconds_count 3",
        "msr_collector_notifies_total{outcome=\"accepted\"} 1",
        "msr_collector_notifies_total{outcome=\"refused\"} 1",
        "msr_collector_registers_total{status=\"401\"} 1",
        "msr_collector_released_legs_total 2",
        "msr_collector_redirect_responses_total{status=\"302\"} 1",
        "msr_collector_msr_load_percent{msr=\"msr_1\",contact=\"lo@msr_1\"} 37",
        "msr_collector_msr_calls{msr=\"msr_1\",contact=\"lo@msr_1\"} 37",
        "msr_collector_msr_health{msr=\"msr_1\",contact=\"lo@msr_1\",state=\"healthy\"} 1",
        "msr_collector_msr_health{msr=\"msr_1\",contact=\"lo@msr_1\",state=\"stale\"} 0",
        "msr_collector_msr_live_legs{msr=\"msr_1\"} 1",
        "msr_collector_msr_healthy{msr=\"msr_1\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert_eq!(text.matches("# EOF").count(), 1);
}

#[test]
fn the_text_format_names_counters_by_their_samples_and_has_no_eof() {
    let metrics = Metrics::new();
    metrics.selected("msr_1", Some(LegOutcome::New));
    metrics.selection_duration(2e-6);
    metrics.released(1);
    let om = metrics.render(&snapshot(
        &[row("msr_1", 37, HealthState::Healthy, 1)],
        &[msr("msr_1", 1)],
        None,
    ));
    let text = to_text_format(&om);
    for line in [
        "# TYPE msr_collector_selections_total counter",
        "# TYPE msr_collector_released_legs_total counter",
        "msr_collector_released_legs_total 1",
        "# TYPE msr_collector_selection_duration_seconds histogram",
        "msr_collector_selection_duration_seconds_count 1",
        "# TYPE msr_collector_msr_load_percent gauge",
        "msr_collector_msr_load_percent{msr=\"msr_1\",contact=\"lo@msr_1\"} 37",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
    assert!(text
        .lines()
        .any(|l| l.starts_with("# HELP msr_collector_selections_total ")));
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    // Every sample line is in the text format too, unchanged.
    let samples = |t: &str| t.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(samples(&om), samples(&text));
}

#[test]
fn openmetrics_is_served_only_when_the_scraper_asks_for_it() {
    // Prometheus 2.x's Accept header.
    assert!(wants_openmetrics(
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    ));
    assert!(wants_openmetrics("Application/OpenMetrics-Text"));
    assert!(!wants_openmetrics("text/plain;version=0.0.4"));
    assert!(!wants_openmetrics("*/*"));
    assert!(!wants_openmetrics("application/openmetrics-text;q=0"));
    assert!(!wants_openmetrics(""));
}
