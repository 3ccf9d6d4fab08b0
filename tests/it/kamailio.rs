//! Interop with a standard registrar: a real Kamailio (registrar + usrloc,
//! `tests/kamailio/registrar.cfg`) stores the agent's REGISTER unchanged,
//! the media engine's addresses included (SPEC §3: Contact URI parameters),
//! and `ul.dump` shows them; the agent's shutdown unregisters.

use std::time::Duration;

use system_tests::kamailio::Kamailio;
use system_tests::system::{AccountSpec, Agent, AgentSpec};
use system_tests::wait_for;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kamailio_stores_the_engines_addresses_with_the_binding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kamailio = Kamailio::start(dir.path(), "registrar.cfg").await;
    let spec = AgentSpec {
        accounts: vec![AccountSpec {
            msr: "msr_1".into(),
            realm: kamailio.realm(),
        }],
        register_expires: 60,
        engine_port: 5090,
        ..AgentSpec::default()
    };
    let mut agent = Agent::start(dir.path(), "msr_1", &spec, 10);
    let dump = wait_for(Duration::from_secs(10), || async {
        kamailio
            .rpc(&["ul.dump"])
            .filter(|d| d.contains("AoR: msr_1"))
    })
    .await
    .unwrap_or_else(|| panic!("no msr_1 in kamailio's ul.dump:\n{}", agent.log_text()));
    let address = dump
        .lines()
        .find_map(|l| l.trim().strip_prefix("Address: "))
        .unwrap_or_else(|| panic!("no Address in {dump}"));
    assert!(
        address.starts_with("sip:msr_1@127.0.0.1:")
            && address.ends_with(";engine=127.0.0.1:5090;engine-transport=udp;mcc=127.0.0.1:5091"),
        "{dump}"
    );
    assert!(dump.contains("User-Agent: msr-agent/"), "{dump}");

    assert!(agent.terminate().is_some_and(|s| s.success()));
    let gone = wait_for(Duration::from_secs(10), || async {
        kamailio
            .rpc(&["ul.dump"])
            .filter(|d| !d.contains("AoR: msr_1"))
    })
    .await;
    assert!(gone.is_some(), "the agent's shutdown unregisters");
}

/// The shipped Kamailio configuration (SPEC §11) is valid for the
/// installed Kamailio: `kamailio -c` loads every module it names
/// (http_client, dialog, uac_redirect…) and parses every route.
#[test]
fn the_shipped_kamailio_config_passes_kamailio_c() {
    let cfg = system_tests::example("kamailio/kamailio.cfg");
    let out = std::process::Command::new("kamailio")
        .arg("-c")
        .arg("-f")
        .arg(&cfg)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kamailio (is it installed?): {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("config file ok"),
        "kamailio -c -f {}:\n{text}",
        cfg.display()
    );
}
