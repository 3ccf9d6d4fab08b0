use msr_shared::admin::{HealthState, MsrInfo, ResourceInfo};

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
        health: Some(HealthState::Healthy),
        health_since_unix: None,
    }
}

#[test]
fn the_exposition_has_the_counters_and_the_gauges_of_each_msr() {
    let metrics = Metrics::new();
    metrics.selected("msr_1", "new", 2e-6);
    metrics.selected("msr_1", "sticky", 2e-6);
    metrics.refused("msr_overloaded", 1e-6);
    metrics.notify(true);
    metrics.notify(false);
    metrics.register(401);
    metrics.register(200);
    metrics.released(2);
    metrics.redirect(302);
    let text = metrics.render(
        &[row("msr_1", 37, HealthState::Healthy, 1)],
        &[msr("msr_1", 1)],
    );
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
    metrics.selected("msr_1", "new", 2e-6);
    metrics.released(1);
    let om = metrics.render(
        &[row("msr_1", 37, HealthState::Healthy, 1)],
        &[msr("msr_1", 1)],
    );
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
