//! The shipped dashboard and alert rules (SPEC §13) against a real
//! Prometheus (Debian's `prometheus`) scraping a live collector with two
//! agents: Prometheus loads `dist/monitoring/alerts.yml` and evaluates every
//! rule without error, every expression of every panel of
//! `dist/monitoring/grafana-dashboard.json` and every rule's expression
//! (its comparison made a `bool` one) returns at least one series, and a
//! refused selection makes `MsrSelectionsRefused` pending.

use std::path::Path;
use std::time::Duration;

use system_tests::system::{
    free_tcp_port, live_row, AccountSpec, Agent, AgentSpec, Collector, CollectorOpts,
};
use system_tests::{free_udp_port, wait_for, workspace_root, ChildGuard};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One `GET` (`Connection: close`) to 127.0.0.1:`port`: the status and the
/// body, `None` while nothing listens there yet.
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.ok()?;
    let text = String::from_utf8_lossy(&raw);
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    // Prometheus answers with chunked transfer coding for large bodies.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Some((status, body))
}

/// An HTTP/1.1 chunked body (RFC 9112 §7.1), decoded.
fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size + 2..)?;
    }
}

/// `application/x-www-form-urlencoded` of one value (RFC 3986 unreserved
/// characters kept, everything else percent-encoded).
fn form_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus API answer's `data`, when its status is `success`.
async fn api(port: u16, path: &str) -> Option<serde_json::Value> {
    let (status, body) = get(port, path).await?;
    let value: serde_json::Value = serde_json::from_str(&body).ok()?;
    (status == 200 && value["status"] == "success").then(|| value["data"].clone())
}

/// The series an instant query returns.
async fn query(port: u16, expr: &str) -> Vec<serde_json::Value> {
    let path = format!("/api/v1/query?query={}", form_value(expr));
    api(port, &path)
        .await
        .and_then(|data| data["result"].as_array().cloned())
        .unwrap_or_default()
}

/// `expr` with its top-level comparison made a `bool` one, so that it
/// returns its series whatever their values: every rule is written
/// `<vector> <comparison> <number>` (the rules file's header says so).
fn with_bool(expr: &str) -> String {
    let bytes = expr.as_bytes();
    let mut depth = 0i32;
    let mut at = None;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'(' | b'{' | b'[' => depth += 1,
            b')' | b'}' | b']' => depth -= 1,
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += 1;
                }
            }
            b'=' | b'!' | b'>' | b'<' if depth == 0 => {
                let len = if bytes.get(i + 1) == Some(&b'=') {
                    2
                } else {
                    1
                };
                at = Some(i + len);
                i += len;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    let at = at.unwrap_or_else(|| panic!("rule `{expr}` is not `<vector> <comparison> <number>`"));
    format!("{} bool {}", &expr[..at], expr[at..].trim_start())
}

/// Every `expr` of every panel (rows' panels included), with the
/// dashboard's variables set as Grafana would for "All".
fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for panel in panels.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("").to_owned();
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    let expr = expr
                        .replace("$__rate_interval", "15s")
                        .replace("$instance", ".+")
                        .replace("$job", ".+");
                    out.push((title.clone(), expr));
                }
            }
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The metric names an expression uses (`msr_collector_…`, `process_…`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = ["msr_collector_", "process_"]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_and_rule_returns_data_from_a_real_prometheus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let monitoring = workspace_root().join("dist/monitoring");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(monitoring.join("grafana-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");

    let http_port = free_tcp_port();
    let extra = format!("[http]\nlisten = \"127.0.0.1:{http_port}\"\n");
    let collector =
        Collector::start_with(dir.path(), "core1", &CollectorOpts::default(), &extra).await;
    let _agents: Vec<Agent> = [("msr_1", 10), ("msr_2", 40)]
        .iter()
        .map(|(msr, calls)| {
            let spec = AgentSpec {
                accounts: vec![AccountSpec::new(msr, &collector)],
                engine_port: free_udp_port(),
                ..AgentSpec::default()
            };
            Agent::start(dir.path(), msr, &spec, *calls)
        })
        .collect();
    collector
        .wait_rows(Duration::from_secs(15), |rows| {
            (live_row(rows, "msr_1", Some(10)).is_some()
                && live_row(rows, "msr_2", Some(40)).is_some())
            .then_some(())
        })
        .await
        .expect("two MSRs live with their loads");
    // SPEC §13: every series the panels and rules name is in the very
    // first scrape, before any selection, refusal or leg.
    let (status, first) = get(http_port, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200, "{first}");
    let rules_text = std::fs::read_to_string(monitoring.join("alerts.yml")).expect("alerts.yml");
    let mut names: Vec<String> = dashboard_exprs(&dashboard)
        .into_iter()
        .map(|(_, expr)| expr)
        .chain(
            rules_text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("expr: "))
                .map(str::to_owned),
        )
        .flat_map(|expr| metric_names(&expr))
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 15, "{names:?}");
    for name in &names {
        assert!(
            first
                .lines()
                .any(|l| l.starts_with(name.as_str()) && l[name.len()..].starts_with(['{', ' '])),
            "the first scrape has no `{name}`:\n{first}"
        );
    }

    // One live leg, for the legs' panels and rule.
    let (ok, out, err) = collector.msrctl(&[
        "select",
        "--zone",
        "default",
        "--site",
        "local",
        "--call-id",
        "monitoring-1",
    ]);
    assert!(ok, "{out}{err}");

    let prom_port = free_tcp_port();
    let config = dir.path().join("prometheus.yml");
    write(
        &config,
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: msr-collector\n    static_configs:\n      - targets: ['127.0.0.1:{http_port}']\n",
            monitoring.join("alerts.yml").display()
        ),
    );
    let mut prometheus = ChildGuard::spawn(
        std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .arg("--log.level=warn"),
    )
    .unwrap_or_else(|e| panic!("cannot run prometheus (scripts/deps.sh installs it): {e}"));

    // The collector is up for Prometheus, and the rules are loaded.
    let up = wait_for(Duration::from_secs(30), || async {
        let series = query(prom_port, "up{job=\"msr-collector\"} == 1").await;
        (!series.is_empty()).then_some(())
    })
    .await;
    assert!(
        up.is_some(),
        "Prometheus never scraped the collector: {:?}",
        prometheus.child.try_wait()
    );
    let rules = wait_for(Duration::from_secs(10), || async {
        let data = api(prom_port, "/api/v1/rules").await?;
        let rules: Vec<serde_json::Value> = data["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        // Evaluated at least once, without error.
        rules
            .iter()
            .all(|r| {
                r["health"] == "ok"
                    && r["lastEvaluation"]
                        .as_str()
                        .is_some_and(|t| !t.starts_with("0001"))
            })
            .then_some(rules)
            .filter(|r| !r.is_empty())
    })
    .await
    .expect("Prometheus loaded and evaluated the rules without error");
    assert_eq!(rules.len(), 10, "{rules:?}");

    // A refusal: no MSR in zone `nowhere`.
    let (ok, _, _) = collector.msrctl(&["select", "--zone", "nowhere", "--site", "local"]);
    assert!(!ok, "a select in a zone without MSRs is refused");

    let mut exprs: Vec<(String, String)> = dashboard_exprs(&dashboard)
        .into_iter()
        .map(|(title, expr)| (format!("panel `{title}`"), expr))
        .collect();
    assert!(exprs.len() >= 20, "{exprs:?}");
    for rule in &rules {
        let name = rule["name"].as_str().unwrap_or("").to_owned();
        let expr = rule["query"].as_str().expect("a rule's query");
        exprs.push((format!("rule {name}"), with_bool(expr)));
    }
    for (what, expr) in &exprs {
        let series = wait_for(Duration::from_secs(20), || async {
            let series = query(prom_port, expr).await;
            (!series.is_empty()).then_some(series)
        })
        .await;
        assert!(series.is_some(), "{what}: `{expr}` returns no series");
    }

    // The refusal counted shows as a pending (or firing) alert.
    let alert = wait_for(Duration::from_secs(20), || async {
        let data = api(prom_port, "/api/v1/alerts").await?;
        data["alerts"]
            .as_array()?
            .iter()
            .find(|a| a["labels"]["alertname"] == "MsrSelectionsRefused")
            .cloned()
    })
    .await
    .expect("MsrSelectionsRefused pending after a refused selection");
    assert_eq!(alert["labels"]["outcome"], "msr_not_found", "{alert}");
    assert_eq!(alert["state"], "pending", "{alert}");
    // Nothing else is wrong with this healthy system.
    let data = api(prom_port, "/api/v1/alerts").await.expect("alerts");
    let others: Vec<&serde_json::Value> = data["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["labels"]["alertname"] != "MsrSelectionsRefused")
        .collect();
    assert!(others.is_empty(), "unexpected alerts: {others:?}");
    let _ = prometheus.terminate(Duration::from_secs(10));
}

/// `promtool check rules` and `promtool test rules` on the shipped rules,
/// and every alert of the rules file has a unit test.
#[test]
fn the_alert_rules_pass_promtool_and_every_alert_has_a_unit_test() {
    let monitoring = workspace_root().join("dist/monitoring");
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(&monitoring)
            .output()
            .unwrap_or_else(|e| panic!("cannot run promtool (scripts/deps.sh installs it): {e}"));
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let rules = std::fs::read_to_string(monitoring.join("alerts.yml")).expect("alerts.yml");
    let tests =
        std::fs::read_to_string(monitoring.join("alerts.test.yml")).expect("alerts.test.yml");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 10, "{alerts:?}");
    for alert in alerts {
        let fires = tests.contains(&format!(
            "alertname: {alert}\n        exp_alerts:\n          - exp_labels"
        ));
        assert!(fires, "alerts.test.yml has no test in which {alert} fires");
    }
}

/// Every panel of the dashboard queries the dashboard's Prometheus
/// variable and has a place on the grid; ids are unique.
#[test]
fn the_dashboard_panels_use_the_datasource_variable() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("dist/monitoring/grafana-dashboard.json"))
            .expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut ids = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        assert!(ids.insert(panel["id"].as_u64().expect("id")), "{panel}");
        assert!(panel["gridPos"]["w"].as_u64().is_some(), "{panel}");
        if panel["type"] != "row" {
            assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
            assert!(
                !panel["targets"].as_array().expect("targets").is_empty(),
                "{panel}"
            );
        }
    }
}
