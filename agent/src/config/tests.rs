//! Config tests: the examples in `config-examples/`, every rule of SPEC §2,
//! and hot reload.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::validate::{parse_calls_source, parse_realm};
use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config-examples")
}

fn origin() -> &'static Path {
    Path::new("config-examples/bad.xml")
}

/// A minimal valid document with `general`, `agent` and `accounts` bodies
/// substituted.
fn doc(general: &str, extra: &str) -> String {
    format!(
        r#"<?xml version="1.0"?>
<config>
  <general {general} />
  <transport bind-addr="127.0.0.1" port="5070" />
  <media port-start="20000" port-range="1000" />
  {extra}
</config>
"#
    )
}

fn err(text: &str) -> String {
    match parse(text, origin()) {
        Ok(c) => panic!("expected an error, parsed {c:?}"),
        Err(e) => e.to_string(),
    }
}

const GOOD_GENERAL: &str = r#"max-calls="100" load-sensor="calls""#;

#[test]
fn seed_config_parses() -> TestResult {
    let c = load(&examples_dir().join("msr.xml"))?;
    assert_eq!(c.general.log_level, Some(3));
    assert_eq!(c.general.max_calls, 8192);
    assert_eq!(c.general.load_sensor, LoadSensor::Media);
    assert_eq!(c.general.load_delta, 10);
    // The engine's log file is the engine's: the agent logs to stderr.
    assert_eq!(c.agent.log_file, None);
    // The engine keeps 5040; the agent takes the next port.
    assert_eq!(c.agent.sip_port, 5041);
    assert_eq!(c.mcc, Some("192.168.2.21:5700".parse()?));
    assert_eq!(
        c.transport.bind_addr,
        "192.168.2.21".parse::<std::net::IpAddr>()?
    );
    assert_eq!(c.transport.port, 5040);
    assert_eq!(c.transport.transport, Transports::UdpTcp);
    assert_eq!(
        c.media,
        MediaConfig {
            port_start: 12000,
            port_range: 1024,
            video_enc_width: Some(1280),
            video_enc_height: Some(720),
        }
    );
    assert_eq!(c.media.video_enc_size(), "1280x720");
    // The seed's `<codec pcma="1" pcmu="2" … g722="3" … h264="1"
    // h263-1998="2" t38="1" tel-event-pt="0">`: audio by priority, then
    // video, then image (`codec_list`'s tie rule); `tel-event-pt` is not a
    // codec and the codecs set to 0 are off.
    assert_eq!(
        c.codecs.map(|l| l.to_string()).as_deref(),
        Some("pcma,pcmu,g722,h264,h263-1998,t38")
    );
    assert_eq!(c.codecs_shown(), "pcma,pcmu,g722,h264,h263-1998,t38");
    assert_eq!(c.accounts.len(), 2);
    let a = &c.accounts[0];
    assert_eq!(a.msr_name, "msr_1");
    assert_eq!(a.realm.uri, "sip:192.168.2.21:5000");
    assert_eq!(a.realm.host, "192.168.2.21");
    assert_eq!(a.realm.port, Some(5000));
    assert_eq!(a.auth_name, "user");
    assert_eq!(a.auth_password, "password");
    assert_eq!(a.dtmf_mode.as_deref(), Some("rfc+inband+info"));
    assert_eq!(c.accounts[1].realm.host, "192.168.2.22");
    assert_eq!(
        c.agent,
        AgentSettings {
            sip_port: 5041,
            ..AgentSettings::default()
        }
    );
    Ok(())
}

#[test]
fn loopback_configs_parse() -> TestResult {
    for (file, name, port, rtp) in [
        ("msr-loopback.xml", "msr_1", 5070, 20000),
        ("msr-loopback-2.xml", "msr_2", 5072, 21000),
        ("msr-loopback-3.xml", "msr_3", 5074, 22000),
    ] {
        let c = load(&examples_dir().join(file))?;
        assert_eq!(
            c.transport.bind_addr,
            std::net::IpAddr::from([127, 0, 0, 1]),
            "{file}"
        );
        assert_eq!(c.transport.port, port, "{file}");
        assert_eq!(c.transport.transport, Transports::Udp, "{file}");
        assert_eq!(c.media.port_start, rtp, "{file}");
        assert_eq!(c.media.port_range, 1000, "{file}");
        assert_eq!(c.general.load_sensor, LoadSensor::Calls, "{file}");
        assert_eq!(c.general.load_delta, 5, "{file}");
        assert_eq!(c.general.max_calls, 100, "{file}");
        assert_eq!(c.agent.register_expires, 60, "{file}");
        assert_eq!(c.accounts.len(), 1, "{file}");
        let a = &c.accounts[0];
        assert_eq!(a.msr_name, name, "{file}");
        assert_eq!(a.realm.uri, "sip:127.0.0.1:5060", "{file}");
        assert_eq!(a.realm.host_port(), "127.0.0.1:5060", "{file}");
        assert_eq!(
            (a.auth_name.as_str(), a.auth_password.as_str()),
            ("msr", "msr-secret"),
            "{file}"
        );
    }
    Ok(())
}

/// Every `config-examples/*.xml` parses; every `config-examples/invalid/*.xml`
/// fails with a message containing its sibling `.expected`.
#[test]
fn every_example_is_checked() -> TestResult {
    let dir = examples_dir();
    let mut valid = 0;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "xml") {
            load(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            valid += 1;
        }
    }
    assert!(
        valid >= 4,
        "expected at least 4 valid examples, found {valid}"
    );

    let mut invalid = 0;
    for entry in std::fs::read_dir(dir.join("invalid"))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "xml") {
            continue;
        }
        let expected_path = path.with_extension("expected");
        let expected = std::fs::read_to_string(&expected_path)
            .map_err(|e| format!("{}: {e}", expected_path.display()))?;
        let expected = expected.trim_end_matches(['\n', '\r']);
        assert!(!expected.is_empty(), "{} is empty", expected_path.display());
        match load(&path) {
            Ok(_) => panic!("{} parsed but should fail", path.display()),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(expected),
                    "{}: message {msg:?} does not contain {expected:?}",
                    path.display()
                );
                assert!(
                    msg.contains(&path.display().to_string()),
                    "{msg:?} does not name the file"
                );
            }
        }
        invalid += 1;
    }
    assert!(
        invalid >= 9,
        "expected at least 9 invalid examples, found {invalid}"
    );
    Ok(())
}

#[test]
fn truncated_seed_names_line_and_column() -> TestResult {
    let text = std::fs::read_to_string(examples_dir().join("invalid/truncated.xml"))?;
    let e = parse(&text, Path::new("msr.xml"))
        .err()
        .ok_or("truncated config accepted")?;
    match &e {
        ConfigError::Truncated { at, .. } => assert_eq!(
            *at,
            Position {
                line: 21,
                column: 1
            }
        ),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        e.to_string(),
        "msr.xml:21:1: file is truncated: tag `</config` is not closed"
    );
    Ok(())
}

#[test]
fn unclosed_elements_at_eof() {
    let m = err("<config>\n  <general max-calls=\"1\">\n");
    assert!(
        m.starts_with("config-examples/bad.xml:3:1: file is truncated"),
        "{m}"
    );
    assert!(m.contains("element <config> opened at 1:1"), "{m}");
    let m = err("<config>\n  <general max-calls=\"1");
    assert!(
        m.contains(":2:3: file is truncated: tag `<general max-calls=\"1`"),
        "{m}"
    );
    let m = err("<config><!-- comment");
    assert!(m.contains("1:9: file is truncated: comment"), "{m}");
}

#[test]
fn malformed_xml_names_position() {
    let m = err("<config>\n  <general></media>\n</config>\n");
    assert!(m.starts_with("config-examples/bad.xml:2:"), "{m}");
    assert!(m.contains("malformed xml"), "{m}");
    let m = err("<config>\n <general a=\"1\" a=\"2\"/>\n</config>");
    assert!(
        m.starts_with("config-examples/bad.xml:2:2: malformed xml"),
        "{m}"
    );
    let m = err("<config>\n <general a=1/>\n</config>");
    assert!(m.contains("2:2: malformed xml"), "{m}");
    let m = err("<config/>\n<config/>");
    assert!(
        m.contains("2:1: malformed xml: element <config> after the root element"),
        "{m}"
    );
}

#[test]
fn wrong_or_missing_root() {
    let m = err("<?xml version=\"1.0\"?>\n<settings/>");
    assert_eq!(
        m,
        "config-examples/bad.xml:2:1: root element is <settings>, expected <config>"
    );
    assert_eq!(err(""), "config-examples/bad.xml: missing element <config>");
    assert_eq!(
        err("<?xml version=\"1.0\"?>\n"),
        "config-examples/bad.xml: missing element <config>"
    );
}

#[test]
fn missing_elements_and_attributes_are_named() {
    let m = err("<config><transport bind-addr=\"127.0.0.1\" port=\"1\"/><media port-start=\"1\" port-range=\"2\"/></config>");
    assert_eq!(m, "config-examples/bad.xml: missing element <general>");
    let m = err(&format!(
        "<config><general {GOOD_GENERAL}/><media port-start=\"1\" port-range=\"2\"/></config>"
    ));
    assert_eq!(m, "config-examples/bad.xml: missing element <transport>");
    let m = err(&format!(
        "<config><general {GOOD_GENERAL}/><transport bind-addr=\"127.0.0.1\" port=\"1\"/></config>"
    ));
    assert_eq!(m, "config-examples/bad.xml: missing element <media>");
    assert_eq!(
        err(&doc(r#"load-sensor="cpu""#, "")),
        "config-examples/bad.xml: <general>: missing attribute max-calls"
    );
    assert_eq!(
        err(&doc(r#"max-calls="5""#, "")),
        "config-examples/bad.xml: <general>: missing attribute load-sensor"
    );
    assert_eq!(
        err(&doc(
            GOOD_GENERAL,
            r#"<accounts><dynamic msr_name="m" auth_name="a" auth_password="p"/></accounts>"#
        )),
        "config-examples/bad.xml: <dynamic>: missing attribute realm"
    );
    let m = err(&doc(GOOD_GENERAL, "").replace(r#" port="5070""#, ""));
    assert_eq!(
        m,
        "config-examples/bad.xml: <transport>: missing attribute port"
    );
}

#[test]
fn duplicate_section_is_an_error() {
    let m = err(&doc(
        GOOD_GENERAL,
        r#"<general max-calls="1" load-sensor="cpu"/>"#,
    ));
    assert_eq!(
        m,
        "config-examples/bad.xml:6:3: duplicate element <general>"
    );
}

#[test]
fn bad_values_name_element_attribute_value_and_accepted() {
    assert_eq!(
        err(&doc(r#"max-calls="100" load-sensor="gpu""#, "")),
        r#"config-examples/bad.xml: <general load-sensor="gpu">: unknown load-sensor, accepted: cpu, calls, media"#
    );
    assert_eq!(
        err(&doc(r#"max-calls="0" load-sensor="cpu""#, "")),
        r#"config-examples/bad.xml: <general max-calls="0">: max-calls out of range, accepted: an integer 1..=4294967295"#
    );
    assert!(err(&doc(r#"max-calls="-1" load-sensor="cpu""#, ""))
        .contains(r#"<general max-calls="-1">: bad max-calls"#));
    assert!(err(&doc(
        r#"max-calls="1" load-sensor="cpu" load-delta="101""#,
        ""
    ))
    .contains(
        r#"<general load-delta="101">: load-delta out of range, accepted: an integer 1..=100"#
    ));
    // The engine's log attributes are the engine's business.
    assert!(parse(
        &doc(
            r#"max-calls="1" load-sensor="cpu" log-rotate="maybe" log-path="" log-name="x""#,
            ""
        ),
        origin()
    )
    .is_ok());
    assert!(
        err(&doc(GOOD_GENERAL, "").replace("127.0.0.1", "localhost")).contains(
            r#"<transport bind-addr="localhost">: bad bind-addr, accepted: an ipv4 or ipv6 address"#
        )
    );
    let m = err(&doc(GOOD_GENERAL, "").replace(r#"port-range="1000""#, r#"port-range="0""#));
    assert!(
        m.contains(
            r#"<media port-range="0">: port-range out of range, accepted: an integer 1..=45536"#
        ),
        "{m}"
    );
    let m = err(&doc(GOOD_GENERAL, "").replace(
        r#"port-start="20000" port-range="1000""#,
        r#"port-start="65000" port-range="537""#,
    ));
    assert!(m.contains("accepted: an integer 1..=536"), "{m}");
    assert!(err(&doc(GOOD_GENERAL, r#"<accounts><dynamic msr_name="a b" realm="sip:h" auth_name="" auth_password=""/></accounts>"#))
        .contains(r#"<dynamic msr_name="a b">: bad msr_name"#));
    // The collector's registrar refuses longer names (400): refused here first.
    let long = "m".repeat(msr_shared::sip::MAX_MSR_NAME_LEN + 1);
    let m = err(&doc(
        GOOD_GENERAL,
        &format!(
            r#"<accounts><dynamic msr_name="{long}" realm="sip:h" auth_name="" auth_password=""/></accounts>"#
        ),
    ));
    assert!(m.contains("a sip token of 1 to 128 bytes"), "{m}");
}

#[test]
fn media_range_may_reach_the_last_port() -> TestResult {
    let text = doc(GOOD_GENERAL, "").replace(
        r#"port-start="20000" port-range="1000""#,
        r#"port-start="65000" port-range="536""#,
    );
    let c = parse(&text, origin())?;
    assert_eq!(c.media.port_end(), 65536);
    assert!(c.media.contains(65535));
    assert!(!c.media.contains(64999));
    Ok(())
}

#[test]
fn defaults_and_optional_attributes() -> TestResult {
    let c = parse(&doc(GOOD_GENERAL, ""), origin())?;
    assert_eq!(c.general.load_delta, DEFAULT_LOAD_DELTA);
    assert_eq!(c.general.log_level, None);
    assert_eq!(c.transport.transport, Transports::Udp);
    assert!(c.accounts.is_empty());
    assert_eq!(c.agent.register_expires, 300);
    assert_eq!(c.agent.max_subscription_expires, 3600);
    assert_eq!(c.agent.calls_source, CallsSource::ProcNetUdp);
    assert_eq!(c.agent.notify_min_interval_ms, 1000);
    assert_eq!(c.agent.sample_interval_ms, 1000);
    assert_eq!(c.agent.node_name, None);
    assert_eq!(c.agent.sip_port, 5071, "the engine's port + 1");
    assert_eq!(c.agent.log_file, None);
    assert_eq!(c.mcc, None);
    // No `<codec>`: codecs not known, no `codecs:` line (SPEC §4).
    assert_eq!(c.codecs, None);
    assert_eq!(c.codecs_shown(), "not reported");
    assert_eq!(
        (c.media.video_enc_width, c.media.video_enc_height),
        (None, None)
    );
    assert_eq!(c.media.video_enc_size(), "none");
    // Port 0 (tests): the agent's port is ephemeral too.
    let c = parse(
        &doc(GOOD_GENERAL, "").replace(r#"port="5070""#, r#"port="0""#),
        origin(),
    )?;
    assert_eq!(c.transport.port, 0);
    assert_eq!(c.agent.sip_port, 0);
    Ok(())
}

/// SPEC §1: the agent never binds a port of the media engine. A sip-port
/// that is the engine's SIP port, its media-control port or an RTP port is
/// an error naming both.
#[test]
fn a_sip_port_of_the_engine_is_refused_naming_both() -> TestResult {
    let mcc = r#"<pbyte><mcc bind-addr="127.0.0.1" port="5700"/></pbyte>"#;
    let cases = [
        (
            r#"<agent sip-port="5070"/>"#.to_owned(),
            r#"config-examples/bad.xml: <agent sip-port="5070">: collides with the media engine's <transport port="5070">: the agent needs a port of its own (set <agent sip-port> or --sip-port)"#,
        ),
        (
            format!(r#"<agent sip-port="5700"/>{mcc}"#),
            r#"config-examples/bad.xml: <agent sip-port="5700">: collides with the media engine's <pbyte><mcc bind-addr="127.0.0.1" port="5700">: the agent needs a port of its own (set <agent sip-port> or --sip-port)"#,
        ),
        (
            r#"<agent sip-port="20010"/>"#.to_owned(),
            r#"config-examples/bad.xml: <agent sip-port="20010">: collides with the media engine's <media port-start="20000" port-range="1000"> (RTP ports 20000..21000): the agent needs a port of its own (set <agent sip-port> or --sip-port)"#,
        ),
    ];
    for (extra, expected) in cases {
        assert_eq!(err(&doc(GOOD_GENERAL, &extra)), expected);
    }
    // The default (engine port + 1) is checked too.
    let m = err(&doc(GOOD_GENERAL, "").replace(r#"port-start="20000""#, r#"port-start="5071""#));
    assert!(
        m.contains(
            r#"<agent sip-port="5071">: collides with the media engine's <media port-start="5071""#
        ),
        "{m}"
    );
    let m = err(&doc(GOOD_GENERAL, "").replace(r#"port="5070""#, r#"port="65535""#));
    assert!(
        m.contains("no port above it is left for the default"),
        "{m}"
    );
    // An mcc on another address does not collide.
    let c = parse(
        &doc(
            GOOD_GENERAL,
            r#"<agent sip-port="5700"/><pbyte><mcc bind-addr="10.0.0.9" port="5700"/></pbyte>"#,
        ),
        origin(),
    )?;
    assert_eq!(c.agent.sip_port, 5700);
    // --sip-port is checked the same way.
    let c = parse(&doc(GOOD_GENERAL, ""), origin())?;
    let e = c
        .clone()
        .with_sip_port(5070, origin())
        .expect_err("the engine's port");
    assert!(e.to_string().contains(r#"<transport port="5070">"#), "{e}");
    assert_eq!(c.with_sip_port(5090, origin())?.agent.sip_port, 5090);
    Ok(())
}

#[test]
fn bad_mcc_values_are_named() {
    let m = err(&doc(
        GOOD_GENERAL,
        r#"<pbyte><mcc bind-addr="mcc.local" port="5700"/></pbyte>"#,
    ));
    assert_eq!(
        m,
        r#"config-examples/bad.xml: <mcc bind-addr="mcc.local">: bad bind-addr, accepted: an ipv4 or ipv6 address"#
    );
    let m = err(&doc(
        GOOD_GENERAL,
        r#"<pbyte><mcc bind-addr="127.0.0.1" port="0"/></pbyte>"#,
    ));
    assert!(
        m.contains(r#"<mcc port="0">: port out of range, accepted: an integer 1..=65535"#),
        "{m}"
    );
}

#[test]
fn agent_element_is_parsed_strictly() -> TestResult {
    let c = parse(
        &doc(
            GOOD_GENERAL,
            r#"<agent register-expires="60" max-subscription-expires="120" calls-source="fixed:7"
                notify-min-interval-ms="1500" notify-top-interval-ms="200" notify-high-water="90" sample-interval-ms="250" node-name="core1@ecss1"
                sip-port="5090" log-file="/var/log/msr-agent/msr-agent.log"
                allow-subscribers="10.0.0.5, 10.0.0.6 [2001:db8::1] 10.0.0.5"/>"#,
        ),
        origin(),
    )?;
    assert_eq!(
        c.agent,
        AgentSettings {
            register_expires: 60,
            max_subscription_expires: 120,
            calls_source: CallsSource::Fixed(7),
            notify_min_interval_ms: 1500,
            notify_top_interval_ms: 200,
            notify_high_water: 90,
            sample_interval_ms: 250,
            node_name: Some("core1@ecss1".to_owned()),
            sip_port: 5090,
            log_file: Some(PathBuf::from("/var/log/msr-agent/msr-agent.log")),
            allow_subscribers: vec![
                "10.0.0.5".parse()?,
                "10.0.0.6".parse()?,
                "2001:db8::1".parse()?,
            ],
            tls: None,
            engine_probe: EngineProbeMode::Auto,
            engine_probe_interval_ms: DEFAULT_ENGINE_PROBE_INTERVAL_MS,
            engine_probe_timeout_ms: DEFAULT_ENGINE_PROBE_TIMEOUT_MS,
            engine_probe_misses: DEFAULT_ENGINE_PROBE_MISSES,
            time_scale: 1,
        }
    );
    let m = err(&doc(GOOD_GENERAL, r#"<agent expires="60"/>"#));
    assert_eq!(
        m,
        "config-examples/bad.xml:6:3: <agent expires>: unknown attribute, accepted: register-expires, \
         max-subscription-expires, calls-source, notify-min-interval-ms, notify-top-interval-ms, notify-high-water, sample-interval-ms, node-name, \
         sip-port, log-file, allow-subscribers, tls-ca, tls-cert, tls-key, engine-probe, \
         engine-probe-interval-ms, engine-probe-timeout-ms, engine-probe-misses"
    );
    assert!(err(&doc(GOOD_GENERAL, r#"<agent calls-source="socket"/>"#))
        .contains(r#"<agent calls-source="socket">: bad calls-source, accepted: proc, file:/path, fixed:N"#));
    assert!(err(&doc(GOOD_GENERAL, r#"<agent register-expires="0"/>"#))
        .contains("register-expires out of range"));
    assert!(
        err(&doc(GOOD_GENERAL, r#"<agent sample-interval-ms="0"/>"#))
            .contains("sample-interval-ms out of range")
    );
    assert!(err(&doc(GOOD_GENERAL, r#"<agent node-name=""/>"#)).contains("empty node-name"));
    Ok(())
}

#[test]
fn accepted_lists_match_the_enums() {
    assert!(err(&doc(r#"max-calls="1" load-sensor="x""#, ""))
        .ends_with(&LoadSensor::ACCEPTED.join(", ")));
    let m = err(&doc(GOOD_GENERAL, "").replace(
        r#"bind-addr="127.0.0.1" port="5070""#,
        r#"bind-addr="127.0.0.1" port="5070" transport="x""#,
    ));
    assert!(m.ends_with(&Transports::ACCEPTED.join(", ")), "{m}");
}

#[test]
fn calls_source_values() {
    assert_eq!(parse_calls_source("proc"), Some(CallsSource::ProcNetUdp));
    assert_eq!(
        parse_calls_source("file:/run/msr/calls"),
        Some(CallsSource::File("/run/msr/calls".into()))
    );
    assert_eq!(parse_calls_source("fixed:0"), Some(CallsSource::Fixed(0)));
    assert_eq!(
        parse_calls_source("fixed:303"),
        Some(CallsSource::Fixed(303))
    );
    for bad in [
        "",
        "file:",
        "fixed:",
        "fixed:-1",
        "fixed:x",
        "fixed:99999999999",
        "Proc",
        "udp",
    ] {
        assert_eq!(parse_calls_source(bad), None, "{bad}");
    }
    assert_eq!(CallsSource::Fixed(3).to_string(), "fixed:3");
    assert_eq!(
        parse_calls_source("rtpengine"),
        Some(CallsSource::Rtpengine)
    );
    assert_eq!(CallsSource::Rtpengine.to_string(), "rtpengine");
    for bad in ["rtpengine:127.0.0.1:2223", "Rtpengine", "rtpengine:"] {
        assert_eq!(parse_calls_source(bad), None, "{bad}");
    }
}

/// The `rtpengine` source asks rtpengine at `<pbyte><mcc>`, the address the
/// agent reports as the media-control address (SPEC §3, §11); without
/// `<mcc>` the config is refused, naming what is missing.
#[test]
fn the_rtpengine_source_reads_the_mcc_address() -> TestResult {
    let rtpengine = |mcc: &str| {
        doc(
            GOOD_GENERAL,
            &format!(
                r#"<pbyte><mcc bind-addr="{mcc}" port="2223"/></pbyte><agent calls-source="rtpengine"/>"#
            ),
        )
    };
    let c = parse(&rtpengine("127.0.0.2"), origin())?;
    assert_eq!(c.agent.calls_source, CallsSource::Rtpengine);
    assert_eq!(c.ng_address(), Some("127.0.0.2:2223".parse()?));
    assert_eq!(c.mcc, c.ng_address());
    // rtpengine listening on every address is asked on loopback, and the
    // address reported stays as written (the shell reports the contact's).
    let any = parse(&rtpengine("0.0.0.0"), origin())?;
    assert_eq!(any.ng_address(), Some("127.0.0.1:2223".parse()?));
    let any6 = parse(&rtpengine("::"), origin())?;
    assert_eq!(any6.ng_address(), Some("[::1]:2223".parse()?));
    // Another source asks nothing.
    let proc = parse(
        &doc(
            GOOD_GENERAL,
            r#"<pbyte><mcc bind-addr="127.0.0.1" port="2223"/></pbyte>"#,
        ),
        origin(),
    )?;
    assert_eq!(proc.ng_address(), None);
    let m = err(&doc(GOOD_GENERAL, r#"<agent calls-source="rtpengine"/>"#));
    assert!(
        m.starts_with(r#"config-examples/bad.xml: <agent calls-source="rtpengine">: rtpengine is asked at its ng port, <pbyte><mcc bind-addr port>, which this file lacks"#),
        "{m}"
    );
    Ok(())
}

#[test]
fn the_rtpengine_example_reads_its_ng_port() -> TestResult {
    let c = load(&examples_dir().join("msr-rtpengine.xml"))?;
    let ng: std::net::SocketAddr = "127.0.0.1:2223".parse()?;
    assert_eq!(c.agent.calls_source, CallsSource::Rtpengine);
    assert_eq!(c.ng_address(), Some(ng));
    assert_eq!(c.mcc, Some(ng));
    assert_eq!(
        (c.transport.bind_addr, c.transport.port),
        (ng.ip(), ng.port())
    );
    assert_eq!(c.agent.sip_port, 5064);
    assert_eq!((c.media.port_start, c.media.port_end()), (30000, 40001));
    // Sessions, not the whole host's CPU (issue 44): a compile job on the
    // host must not make an idle relay look full.
    assert_eq!(c.general.load_sensor, LoadSensor::Calls);
    Ok(())
}

/// The codecs `<codec …>` (in `doc`'s `extra`) gives, as the `codecs:`
/// line shows them.
fn codecs_of(codec: &str) -> Result<Option<String>, ConfigError> {
    let c = parse(&doc(GOOD_GENERAL, codec), origin())?;
    Ok(c.codecs.map(|l| l.to_string()))
}

/// SPEC §2, §15: `<codec>`'s attributes that name a codec are its
/// priority, 0 = off; within a kind of media the lowest number first, the
/// kinds in the order audio, video, image; ties in `CODECS` order.
#[test]
fn codec_priorities_order_each_kind_of_media() -> TestResult {
    assert_eq!(
        codecs_of(r#"<codec g722="1" pcmu="3" pcma="2"/>"#)?.as_deref(),
        Some("g722,pcma,pcmu")
    );
    // Video and image after audio whatever their numbers.
    assert_eq!(
        codecs_of(r#"<codec t38="1" h264="2" h263-1998="1" pcmu="9"/>"#)?.as_deref(),
        Some("pcmu,h263-1998,h264,t38")
    );
    // Equal numbers: the order of `CODECS` (pcma before pcmu before g729),
    // not the file's.
    assert_eq!(
        codecs_of(r#"<codec g729="1" pcmu="1" pcma="1"/>"#)?.as_deref(),
        Some("pcma,pcmu,g729")
    );
    // Large numbers and spaces around them are priorities like any other.
    assert_eq!(
        codecs_of(r#"<codec pcmu=" 4294967295 " pcma="7"/>"#)?.as_deref(),
        Some("pcma,pcmu")
    );
    // Codecs beyond the seed's attributes are read too.
    assert_eq!(
        codecs_of(r#"<codec opus="1" vp8="1" pcma="2"/>"#)?.as_deref(),
        Some("opus,pcma,vp8")
    );
    Ok(())
}

/// `tel-event-pt` (the telephone-event payload type) and attributes that
/// name no known codec are the engine's: skipped whatever their value.
/// Names are matched as written, as the engine's XML reader does.
#[test]
fn codec_attributes_that_are_not_codecs_are_skipped() -> TestResult {
    assert_eq!(
        codecs_of(r#"<codec pcma="1" tel-event-pt="101" g728="x" PCMU="1" mode="auto"/>"#)?
            .as_deref(),
        Some("pcma")
    );
    // Every codec off, or none named: the element says the MSR takes no
    // media, which the line reports as `none` (not as "not known").
    assert_eq!(
        codecs_of(r#"<codec pcma="0" pcmu="0" h264="0" tel-event-pt="0"/>"#)?.as_deref(),
        Some("none")
    );
    assert_eq!(codecs_of("<codec/>")?.as_deref(), Some("none"));
    // Children of the element are the engine's too.
    assert_eq!(
        codecs_of(r#"<codec pcmu="1"><profile name="x"/></codec>"#)?.as_deref(),
        Some("pcmu")
    );
    // An escaped value is read unescaped.
    assert_eq!(
        codecs_of(r#"<codec pcma="&#49;"/>"#)?.as_deref(),
        Some("pcma")
    );
    Ok(())
}

/// A codec's value that is not a non-negative integer is a config error
/// naming the file, element, attribute and value, and what is accepted
/// (SPEC §2), as every other integer attribute's.
#[test]
fn a_bad_codec_priority_is_named() {
    for (value, problem) in [
        ("yes", "bad h264"),
        ("-1", "bad h264"),
        ("1.5", "bad h264"),
        ("", "bad h264"),
        ("4294967296", "h264 out of range"),
    ] {
        let m = err(&doc(
            GOOD_GENERAL,
            &format!(r#"<codec pcma="1" h264="{value}" t38="1"/>"#),
        ));
        assert_eq!(
            m,
            format!(
                r#"config-examples/bad.xml: <codec h264="{value}">: {problem}, accepted: an integer 0..=4294967295"#
            )
        );
    }
    // A value that is not even good xml is named with its position.
    assert_eq!(
        err(&doc(GOOD_GENERAL, r#"<codec pcma="&bogus;"/>"#)),
        "config-examples/bad.xml:6:3: malformed xml: <codec pcma=\"&bogus;\">: bad value: \
         at 1..6: unrecognized entity `bogus`"
    );
    // A second `<codec>` is ambiguous, as a second `<media>` is.
    assert_eq!(
        err(&doc(GOOD_GENERAL, r#"<codec pcma="1"/><codec pcmu="1"/>"#)),
        "config-examples/bad.xml:6:20: duplicate element <codec>"
    );
}

/// `<media video-enc-width video-enc-height>`: positive integers when
/// present, kept and shown, each on its own.
#[test]
fn video_encoder_size() -> TestResult {
    let media = |attributes: &str| {
        doc(GOOD_GENERAL, "").replace(
            r#"port-range="1000""#,
            &format!(r#"port-range="1000" {attributes}"#),
        )
    };
    let c = parse(
        &media(r#"video-enc-width="1920" video-enc-height="1080""#),
        origin(),
    )?;
    assert_eq!(
        (c.media.video_enc_width, c.media.video_enc_height),
        (Some(1920), Some(1080))
    );
    let c = parse(&media(r#"video-enc-height="576""#), origin())?;
    assert_eq!(c.media.video_enc_size(), "?x576");
    for (attributes, message) in [
        (
            r#"video-enc-width="0""#,
            r#"<media video-enc-width="0">: video-enc-width out of range, accepted: an integer 1..=4294967295"#,
        ),
        (
            r#"video-enc-width="1280" video-enc-height="720p""#,
            r#"<media video-enc-height="720p">: bad video-enc-height, accepted: an integer 1..=4294967295"#,
        ),
    ] {
        assert_eq!(
            err(&media(attributes)),
            format!("config-examples/bad.xml: {message}")
        );
    }
    Ok(())
}

#[test]
fn media_engine_content_is_ignored() -> TestResult {
    let text = doc(
        r#"max-calls="100" load-sensor="media" max-in-group="512" spool-dir-size="100M""#,
        r#"<codec pcma="1"/><pbyte><mcc bind-addr="1.2.3.4" port="5700"/></pbyte>
           <something-new><nested a="b">text</nested></something-new>
           <accounts><dynamic msr_name="m" realm="sip:h" auth_name="" auth_password="" extra="x"/></accounts>"#,
    )
    .replace("<media ", r#"<media mixer-clock-rate="8000" use-vad="no" "#);
    let c = parse(&text, origin())?;
    assert_eq!(c.accounts.len(), 1);
    assert_eq!(c.accounts[0].auth_name, "");
    assert_eq!(c.accounts[0].dtmf_mode, None);
    Ok(())
}

#[test]
fn duplicate_accounts_are_rejected_but_same_name_other_realm_is_fine() -> TestResult {
    let two = r#"<accounts>
        <dynamic msr_name="msr_1" realm="sip:10.0.0.1:5000" auth_name="u" auth_password="p"/>
        <dynamic msr_name="msr_1" realm="sip:10.0.0.2:5000" auth_name="u" auth_password="p"/>
        <dynamic msr_name="msr_2" realm="sip:10.0.0.1:5000" auth_name="u" auth_password="p"/>
      </accounts>"#;
    assert_eq!(parse(&doc(GOOD_GENERAL, two), origin())?.accounts.len(), 3);
    let dup = two.replace("10.0.0.2", "10.0.0.1");
    assert_eq!(
        err(&doc(GOOD_GENERAL, &dup)),
        r#"config-examples/bad.xml: <dynamic msr_name="msr_1" realm="sip:10.0.0.1:5000">: duplicate account"#
    );
    Ok(())
}

#[test]
fn realm_uris() -> TestResult {
    let r = parse_realm("sip:192.168.2.21:5000")?;
    assert_eq!((r.host.as_str(), r.port), ("192.168.2.21", Some(5000)));
    let r = parse_realm("sip:core.example.net")?;
    assert_eq!((r.host.as_str(), r.port), ("core.example.net", None));
    assert_eq!(r.host_port(), "core.example.net");
    let r = parse_realm("sips:[2001:db8::1]:5061;transport=tcp")?;
    assert_eq!((r.host.as_str(), r.port), ("[2001:db8::1]", Some(5061)));
    assert!(r.is_sips());
    assert_eq!(r.host_port(), "[2001:db8::1]:5061");
    assert!(r.is_stream() && !r.is_tcp());
    assert_eq!(r.port_or_default(), 5061);
    let r = parse_realm("SIP:user@10.0.0.1")?;
    assert_eq!((r.host.as_str(), r.port), ("10.0.0.1", None));
    assert_eq!(r.uri, "SIP:user@10.0.0.1");
    assert!(!r.is_stream());
    assert_eq!(r.port_or_default(), 5060);
    let r = parse_realm("sip:10.0.0.1:5070;Transport=TCP")?;
    assert!(r.is_tcp() && r.is_stream() && !r.is_sips());
    assert_eq!(r.port_or_default(), 5070);
    assert!(!parse_realm("sip:10.0.0.1;transport=udp")?.is_stream());
    assert!(parse_realm("sips:10.0.0.1")?.is_stream());
    assert_eq!(parse_realm("sips:10.0.0.1")?.port_or_default(), 5061);
    for (bad, why) in [
        (
            "sip:10.0.0.1;transport=sctp",
            "realm has an unknown transport (udp or tcp)",
        ),
        (
            "sip:10.0.0.1;transport=tls",
            "realm has transport=tls: write a sips: realm for tls",
        ),
        (
            "sips:10.0.0.1;transport=udp",
            "a sips: realm is reached over tls, not transport=udp",
        ),
    ] {
        assert_eq!(parse_realm(bad).err(), Some(why), "{bad}");
    }
    for bad in [
        "",
        "192.168.2.21:5000",
        "http://x",
        "sip:",
        "sip::5060",
        "sip:host:",
        "sip:host:0",
        "sip:host:65536",
        "sip:host:50x",
        "sip:[::1",
        "sip:[zz]",
        "sip:ho st",
        "sip:[::1]5060",
    ] {
        assert!(parse_realm(bad).is_err(), "{bad:?} accepted");
    }
    Ok(())
}

#[test]
fn positions_count_lines_and_characters() {
    let text = "ab\nпривет\n<x";
    assert_eq!(
        Position::from_offset(text, 0),
        Position { line: 1, column: 1 }
    );
    assert_eq!(
        Position::from_offset(text, 3),
        Position { line: 2, column: 1 }
    );
    // "привет" is 12 bytes; offset 15 is the '\n' after it (column 7).
    assert_eq!(
        Position::from_offset(text, 15),
        Position { line: 2, column: 7 }
    );
    assert_eq!(
        Position::from_offset(text, 16),
        Position { line: 3, column: 1 }
    );
    assert_eq!(
        Position::from_offset(text, 1000),
        Position { line: 3, column: 3 }
    );
    // Inside a multi-byte character: no panic.
    assert_eq!(
        Position::from_offset(text, 4),
        Position { line: 2, column: 1 }
    );
}

#[test]
fn io_error_names_the_file() {
    let p = Path::new("/nonexistent/msr.xml");
    match load(p) {
        Err(e @ ConfigError::Io { .. }) => {
            assert!(
                e.to_string()
                    .starts_with("/nonexistent/msr.xml: cannot read config: "),
                "{e}"
            );
            assert_eq!(e.path(), p);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn invalid_utf8_is_reported_with_position() -> TestResult {
    let dir = tempfile::tempdir()?;
    let p = dir.path().join("x.xml");
    std::fs::write(&p, b"<config>\n  \xff</config>")?;
    let m = load(&p).err().ok_or("accepted")?.to_string();
    assert!(m.ends_with(":2:3: malformed xml: invalid utf-8"), "{m}");
    Ok(())
}

async fn next_result(
    rx: &mut tokio::sync::mpsc::Receiver<Result<AgentConfig, ConfigError>>,
) -> Result<AgentConfig, ConfigError> {
    match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
        Ok(Some(r)) => r,
        Ok(None) => panic!("watch channel closed"),
        Err(_) => panic!("no reload within 10 s"),
    }
}

#[tokio::test]
async fn watch_follows_writes_renames_and_reports_bad_config() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("msr.xml");
    let good = std::fs::read_to_string(examples_dir().join("msr-loopback.xml"))?;
    std::fs::write(&path, &good)?;
    let (mut rx, guard) = watch(path.clone());

    // A change of another file in the directory is not reported.
    std::fs::write(dir.path().join("other.xml"), "x")?;

    // In-place write.
    std::fs::write(
        &path,
        good.replace(r#"load-delta="5""#, r#"load-delta="7""#),
    )?;
    let c = next_result(&mut rx).await?;
    assert_eq!(c.general.load_delta, 7);

    // Editor-style replace: write a temp file, rename it over the config.
    let tmp = dir.path().join(".msr.xml.swp");
    std::fs::write(&tmp, good.replace(r#"load-delta="5""#, r#"load-delta="9""#))?;
    std::fs::rename(&tmp, &path)?;
    let c = next_result(&mut rx).await?;
    assert_eq!(c.general.load_delta, 9);

    // The config turns bad: an error is delivered.
    std::fs::write(
        &path,
        good.replace(r#"load-sensor="calls""#, r#"load-sensor="gpu""#),
    )?;
    let e = next_result(&mut rx)
        .await
        .err()
        .ok_or("bad config accepted")?;
    assert!(e.to_string().contains("unknown load-sensor"), "{e}");

    // And good again after a second rename.
    std::fs::write(&tmp, &good)?;
    std::fs::rename(&tmp, &path)?;
    let c = next_result(&mut rx).await?;
    assert_eq!(c.general.load_delta, 5);

    // Quiet: our own re-reads do not trigger further reloads.
    assert!(tokio::time::timeout(Duration::from_millis(800), rx.recv())
        .await
        .is_err());

    drop(guard);
    // The channel closes once the watcher is gone.
    let closed = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await?;
    assert!(closed.is_none());
    Ok(())
}

#[tokio::test]
async fn watch_reports_setup_failure() {
    let (mut rx, _guard) = watch(PathBuf::from("/nonexistent-dir/msr.xml"));
    match rx.recv().await {
        Some(Err(ConfigError::Watch { .. })) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert!(rx.recv().await.is_none());
}

#[test]
fn interleaved_account_elements() {
    let text = doc(
        GOOD_GENERAL,
        r#"<accounts>
        <dynamic msr_name="a" realm="sip:h1" auth_name="" auth_password=""/>
        <static msr_name="s"/>
        <dynamic msr_name="b" realm="sip:h2" auth_name="" auth_password=""/>
      </accounts>"#,
    );
    match parse(&text, origin()) {
        Ok(c) => {
            let names: Vec<&str> = c.accounts.iter().map(|a| a.msr_name.as_str()).collect();
            assert_eq!(names, ["a", "b"]);
        }
        Err(e) => panic!("{e}"),
    }
    for accounts in [
        "<accounts/>",
        "<accounts></accounts>",
        "<accounts>\n  <!-- none yet -->\n</accounts>",
        "<accounts><static><nested a=\"1\">t</nested></static>text</accounts>",
    ] {
        match parse(&doc(GOOD_GENERAL, accounts), origin()) {
            Ok(c) => assert!(c.accounts.is_empty(), "{accounts}"),
            Err(e) => panic!("{accounts}: {e}"),
        }
    }
}

#[test]
fn rate_limits_cannot_be_disabled() {
    // SPEC §4: at most one NOTIFY per second per subscription.
    let m = err(&doc(GOOD_GENERAL, r#"<agent notify-high-water="0"/>"#));
    assert!(m.contains("notify-high-water") && m.contains("101"), "{m}");
    let m = err(&doc(GOOD_GENERAL, r#"<agent notify-min-interval-ms="0"/>"#));
    assert!(
        m.contains("notify-min-interval-ms") && m.contains("1000"),
        "{m}"
    );
    let m = err(&doc(GOOD_GENERAL, r#"<agent sample-interval-ms="1"/>"#));
    assert!(m.contains("sample-interval-ms") && m.contains("100"), "{m}");
    // Near the top the gap goes down to 20 ms, no further (SPEC §4).
    let m = err(&doc(
        GOOD_GENERAL,
        r#"<agent notify-top-interval-ms="19"/>"#,
    ));
    assert!(
        m.contains("notify-top-interval-ms") && m.contains("20"),
        "{m}"
    );
}

#[test]
fn near_the_top_the_gap_is_50_ms_unless_set() -> TestResult {
    let c = parse(&doc(GOOD_GENERAL, "<agent/>"), origin())?;
    assert_eq!(c.agent.notify_top_interval(), Duration::from_millis(50));
    let c = parse(
        &doc(GOOD_GENERAL, r#"<agent notify-top-interval-ms="20"/>"#),
        origin(),
    )?;
    assert_eq!(c.agent.notify_top_interval(), Duration::from_millis(20));
    Ok(())
}

#[test]
fn the_time_scale_divides_the_intervals_and_only_them() -> TestResult {
    // `--time-scale` (benchmarks): the file's floors stay, the durations
    // the agent runs on are divided.
    let text = doc(
        GOOD_GENERAL,
        r#"<agent notify-min-interval-ms="1000" notify-top-interval-ms="250" sample-interval-ms="1000"/>"#,
    );
    let c = parse(&text, origin())?;
    assert_eq!(c.agent.time_scale, 1);
    assert_eq!(c.agent.notify_top_interval(), Duration::from_millis(250));
    let scaled = c.clone().with_time_scale(30);
    assert_eq!(
        scaled.agent.notify_min_interval(),
        Duration::from_nanos(33_333_333)
    );
    assert_eq!(
        scaled.agent.notify_top_interval(),
        Duration::from_nanos(8_333_333)
    );
    assert_eq!(
        scaled.agent.sample_interval(),
        Duration::from_nanos(33_333_333)
    );
    assert_eq!(scaled.agent.notify_top_interval_ms, 250);
    assert_eq!(c.with_time_scale(0).agent.time_scale, 1);
    Ok(())
}

#[test]
fn a_bad_allow_subscribers_entry_is_named() {
    let m = err(&doc(
        GOOD_GENERAL,
        r#"<agent allow-subscribers="10.0.0.5 collector.example"/>"#,
    ));
    assert_eq!(
        m,
        "config-examples/bad.xml: <agent allow-subscribers=\"collector.example\">: not an IP address, \
         accepted: IP addresses separated by spaces or commas, e.g. \"10.0.0.5 10.0.0.6\""
    );
}

/// `<e>` with `<x>` nested `n` deep inside it (engine elements the agent
/// skips).
fn nested(n: usize) -> String {
    format!("<e>{}{}</e>", "<x>".repeat(n), "</x>".repeat(n))
}

#[test]
fn elements_nest_at_most_max_config_depth() {
    // <config> and <e> are two levels.
    let deepest = doc(GOOD_GENERAL, &nested(MAX_CONFIG_DEPTH - 2));
    assert!(parse(&deepest, origin()).is_ok());
    let msg = err(&doc(GOOD_GENERAL, &nested(MAX_CONFIG_DEPTH - 1)));
    assert!(
        msg.starts_with("config-examples/bad.xml:6:")
            && msg
                .ends_with("<x> is nested more than 64 elements deep (accepted: up to 64 levels)"),
        "{msg}"
    );
}

#[test]
fn subscriber_hosts_are_the_realm_hosts_and_the_allow_list() -> TestResult {
    let c = parse(
        &doc(
            GOOD_GENERAL,
            r#"<agent allow-subscribers="10.0.0.9 ::ffff:10.0.0.8"/>
            <accounts>
              <dynamic msr_name="a" realm="sip:192.0.2.1:5060" auth_name="" auth_password=""/>
              <dynamic msr_name="b" realm="sip:[2001:db8::7]" auth_name="" auth_password=""/>
              <dynamic msr_name="c" realm="sip:core.example:5060" auth_name="" auth_password=""/>
              <dynamic msr_name="d" realm="sip:[::ffff:192.0.2.2]:5060" auth_name="" auth_password=""/>
            </accounts>"#,
        ),
        origin(),
    )?;
    let hosts = c.subscriber_hosts();
    let ips: Vec<String> = hosts.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(
        ips,
        [
            "10.0.0.8",
            "10.0.0.9",
            "192.0.2.1",
            "192.0.2.2",
            "2001:db8::7"
        ],
        "v4-mapped addresses are kept as IPv4"
    );
    assert_eq!(
        hosts.names.into_iter().collect::<Vec<_>>(),
        ["core.example"]
    );
    Ok(())
}

#[test]
fn a_file_over_max_config_bytes_is_refused_unread() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("big.xml");
    let filler = format!("<!-- {} -->", "x".repeat(MAX_CONFIG_BYTES));
    std::fs::write(&path, doc(GOOD_GENERAL, &filler))?;
    let msg = load(&path).expect_err("too large").to_string();
    assert_eq!(
        msg,
        format!(
            "{}: the file has more than 1048576 bytes, more than a media server config needs \
             (accepted: up to 1048576 bytes)",
            path.display()
        )
    );
    // Just under the cap is read.
    let text = doc(GOOD_GENERAL, "");
    let filler = format!("<!-- {} -->", "x".repeat(MAX_CONFIG_BYTES - text.len() - 9));
    let text = doc(GOOD_GENERAL, &filler);
    assert_eq!(text.len(), MAX_CONFIG_BYTES);
    std::fs::write(&path, text)?;
    load(&path)?;
    Ok(())
}

#[test]
fn many_skipped_siblings_parse() {
    // 200,000 engine elements (800 kB): the scan computes no position per
    // element (that made it quadratic); RELIABILITY.md has the timings.
    let text = doc(GOOD_GENERAL, &format!("<e>{}</e>", "<x/>".repeat(200_000)));
    assert!(parse(&text, origin()).is_ok());
}

#[test]
fn a_sips_realm_needs_the_ca_of_the_registrars_certificate() -> TestResult {
    let account = r#"<accounts><dynamic msr_name="msr_1" realm="sips:10.0.0.1:5061" auth_name="a" auth_password="p"/></accounts>"#;
    let m = err(&doc(GOOD_GENERAL, account));
    assert!(m.contains("<agent tls-ca> is missing"), "{m}");
    let text = doc(
        GOOD_GENERAL,
        &format!(
            r#"{account}<agent tls-ca="/etc/ca.pem" tls-cert="/etc/c.pem" tls-key="/etc/c.key"/>"#
        ),
    );
    let c = parse(&text, origin())?;
    let tls = c.agent.tls.ok_or("tls settings")?;
    assert_eq!(tls.ca, PathBuf::from("/etc/ca.pem"));
    assert_eq!(
        tls.identity,
        Some((PathBuf::from("/etc/c.pem"), PathBuf::from("/etc/c.key")))
    );
    let m = err(&doc(
        GOOD_GENERAL,
        &format!(r#"{account}<agent tls-ca="/etc/ca.pem" tls-cert="/etc/c.pem"/>"#),
    ));
    assert!(m.contains("tls-key is missing"), "{m}");
    Ok(())
}

/// `<agent engine-probe…>` (SPEC §14): `auto` resolves from the calls
/// source and the engine's port; each value and range is checked, naming
/// the attribute and what is accepted.
#[test]
fn engine_probe_settings() -> TestResult {
    let probe = |agent: &str| parse(&doc(GOOD_GENERAL, agent), origin());
    // <transport port="5070">: auto is the sip probe.
    let c = probe("")?;
    assert_eq!(c.agent.engine_probe, EngineProbeMode::Auto);
    assert_eq!(c.engine_probe(), EngineProbeMode::Sip);
    let c = probe(r#"<agent engine-probe="off"/>"#)?;
    assert_eq!(c.engine_probe(), EngineProbeMode::Off);
    let zero = doc(GOOD_GENERAL, "").replace(r#"port="5070""#, r#"port="0""#);
    assert_eq!(parse(&zero, origin())?.engine_probe(), EngineProbeMode::Off);
    let rtpengine = r#"<pbyte><mcc bind-addr="127.0.0.1" port="2223"/></pbyte>"#;
    let c = probe(&format!(r#"{rtpengine}<agent calls-source="rtpengine"/>"#))?;
    assert_eq!(c.engine_probe(), EngineProbeMode::Ng);
    let c = probe(&format!(
        r#"{rtpengine}<agent calls-source="rtpengine" engine-probe="sip"/>"#
    ))?;
    assert_eq!(c.engine_probe(), EngineProbeMode::Sip);
    let c = probe(
        r#"<agent engine-probe="sip" engine-probe-interval-ms="5000" engine-probe-timeout-ms="5000" engine-probe-misses="3"/>"#,
    )?;
    assert_eq!(
        (
            c.agent.engine_probe_interval_ms,
            c.agent.engine_probe_timeout_ms,
            c.agent.engine_probe_misses
        ),
        (5000, 5000, 3)
    );
    // A short interval shortens the default timeout with it.
    let c = probe(r#"<agent engine-probe-interval-ms="500"/>"#)?;
    assert_eq!(c.agent.engine_probe_timeout_ms, 500);

    assert!(
        err(&doc(GOOD_GENERAL, r#"<agent engine-probe="options"/>"#)).ends_with(
            r#"<agent engine-probe="options">: unknown engine-probe, accepted: auto, sip, ng, off"#
        )
    );
    assert!(err(&doc(GOOD_GENERAL, r#"<agent engine-probe="ng"/>"#))
        .contains("calls-source is not rtpengine"));
    assert!(
        err(&zero.replace("<media", r#"<agent engine-probe="sip"/><media"#))
            .contains("<agent engine-probe=\"sip\">")
    );
    assert!(
        err(&doc(GOOD_GENERAL, r#"<agent engine-probe-interval-ms="100"/>"#)).ends_with(
            r#"<agent engine-probe-interval-ms="100">: engine-probe-interval-ms out of range, accepted: an integer 500..=60000"#
        )
    );
    assert!(err(&doc(
        GOOD_GENERAL,
        r#"<agent engine-probe-timeout-ms="50000"/>"#
    ))
    .contains("accepted: an integer 100..=10000"));
    let m = err(&doc(
        GOOD_GENERAL,
        r#"<agent engine-probe-interval-ms="1000" engine-probe-timeout-ms="1500"/>"#,
    ));
    assert!(
        m.contains(r#"<agent engine-probe-timeout-ms="1500">"#)
            && m.contains("longer than engine-probe-interval-ms"),
        "{m}"
    );
    assert!(
        err(&doc(GOOD_GENERAL, r#"<agent engine-probe-misses="0"/>"#))
            .contains("accepted: an integer 1..=10")
    );
    Ok(())
}

/// An operator's `PCMA="1"` loads (names are matched exactly, as the
/// engine reads them) but is said: the MSR reports it off. Every codec
/// off is said too.
#[test]
fn codec_names_in_another_case_and_every_codec_off_are_warned() -> TestResult {
    let config = parse(
        &doc(
            GOOD_GENERAL,
            &format!(r#"<codec PCMA="1" pcmu="2"/>{ACCOUNT}"#),
        ),
        origin(),
    )?;
    assert_eq!(
        config.codecs.map(|c| c.to_string()).as_deref(),
        Some("pcmu")
    );
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(config.warnings[0]
        .contains(r#"<codec PCMA="1">: not read, codec names are lower case (pcma)"#));
    let off = parse(&doc(GOOD_GENERAL, r#"<codec pcma="0"/>"#), origin())?;
    assert!(off
        .warnings
        .iter()
        .any(|w| w.contains("every codec is off")));
    let fine = parse(
        &doc(
            GOOD_GENERAL,
            &format!(r#"<codec pcma="1" tel-event-pt="0"/>{ACCOUNT}"#),
        ),
        origin(),
    )?;
    assert!(fine.warnings.is_empty(), "{:?}", fine.warnings);
    Ok(())
}

/// A codec name one letter off, or with two letters swapped, is said
/// with the name it resembles; the engine's own attributes and codecs
/// this code does not know at all are not.
#[test]
fn a_codec_typo_is_warned_with_the_name_it_resembles() -> TestResult {
    let config = parse(
        &doc(
            GOOD_GENERAL,
            &format!(r#"<codec opsu="2" pcma="1" tel-event-pt="101" siren="3"/>{ACCOUNT}"#),
        ),
        origin(),
    )?;
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(
        config.warnings[0]
            .starts_with(r#"<codec opsu="2">: not a codec this agent knows (did you mean opus?)"#),
        "{:?}",
        config.warnings
    );
    Ok(())
}

const ACCOUNT: &str = r#"<accounts><dynamic msr_name="msr_1" realm="sip:127.0.0.1:5060" auth_name="a" auth_password="p"/></accounts>"#;

/// An agent without a `<dynamic>` account loads (the engine's config may
/// hold only its own accounts) but registers nowhere: said, with the hint
/// that a misspelt element is skipped as the engine's.
#[test]
fn no_dynamic_account_is_warned() -> TestResult {
    for accounts in [
        "",
        "<accounts/>",
        r#"<accounts><dinamic msr_name="msr_1" realm="sip:127.0.0.1:5060" auth_name="a" auth_password="p"/></accounts>"#,
    ] {
        let config = parse(&doc(GOOD_GENERAL, accounts), origin())?;
        assert!(config.accounts.is_empty());
        assert_eq!(
            config.warnings.len(),
            1,
            "{accounts}: {:?}",
            config.warnings
        );
        assert!(
            config.warnings[0].starts_with("<accounts>: no <dynamic> account"),
            "{:?}",
            config.warnings
        );
    }
    let one = parse(&doc(GOOD_GENERAL, ACCOUNT), origin())?;
    assert_eq!(one.accounts.len(), 1);
    assert!(one.warnings.is_empty(), "{:?}", one.warnings);
    Ok(())
}
