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
        status: "registered".into(),
        expires_secs: 60,
        subscription: "active".into(),
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
