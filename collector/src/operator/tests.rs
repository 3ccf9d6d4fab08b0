use super::*;

#[test]
fn defaults() {
    let config = OperatorConfig::new();
    assert_eq!(config.performance_coefficient("msr_1"), 1.0);
    assert!(config.is_active("msr_1"));
    assert_eq!(config.subscription_expires("msr_1"), None);
    assert_eq!(
        config.contact_zone("lo@msr_1", &ZoneName::test("default")),
        "default"
    );
    assert_eq!(
        config.contact_site("lo@msr_1", &SiteName::test("local")),
        "local"
    );
}

#[test]
fn coefficient_must_be_within_its_bounds() {
    let mut config = OperatorConfig::new();
    for bad in [
        0.0,
        -1.0,
        f64::NAN,
        f64::INFINITY,
        1e308,
        MAX_PERFORMANCE_COEFFICIENT * 2.0,
        1e-320,
        MIN_PERFORMANCE_COEFFICIENT / 2.0,
    ] {
        assert!(matches!(
            config.set_performance_coefficient("msr_1", bad),
            Err(OperatorError::InvalidCoefficient { .. })
        ));
    }
    assert_eq!(
        config.set_performance_coefficient("msr_1", MIN_PERFORMANCE_COEFFICIENT),
        Ok(1.0)
    );
    assert_eq!(
        config.set_performance_coefficient("msr_1", 2.0),
        Ok(MIN_PERFORMANCE_COEFFICIENT)
    );
    assert_eq!(config.performance_coefficient("msr_1"), 2.0);
    // Back to the defaults leaves no entry behind.
    assert_eq!(config.set_performance_coefficient("msr_1", 1.0), Ok(2.0));
    assert_eq!(config.configured_msrs().count(), 0);
}

#[test]
fn expires_changes_name_only_the_msrs_that_changed() {
    let mut before = OperatorConfig::new();
    before.set_subscription_expires("msr_1", 30).expect("set");
    before.set_subscription_expires("msr_2", 40).expect("set");
    before
        .set_performance_coefficient("msr_3", 2.0)
        .expect("set");
    let mut after = before.clone();
    assert_eq!(after.subscription_expires_changes(&before).count(), 0);
    after.set_subscription_expires("msr_2", 50).expect("set");
    after.set_subscription_expires("msr_4", 20).expect("set");
    after
        .set_performance_coefficient("msr_1", 3.0)
        .expect("set");
    let changes: Vec<_> = after
        .subscription_expires_changes(&before)
        .map(|(msr, expires)| (msr.as_str(), expires))
        .collect();
    assert_eq!(changes, [("msr_2", Some(50)), ("msr_4", Some(20))]);
    // From an empty configuration (the start): every override.
    let empty = OperatorConfig::new();
    let all: Vec<_> = after
        .subscription_expires_changes(&empty)
        .map(|(msr, expires)| (msr.as_str(), expires))
        .collect();
    assert_eq!(
        all,
        [
            ("msr_1", Some(30)),
            ("msr_2", Some(50)),
            ("msr_4", Some(20))
        ]
    );
    // Back to empty: every override is cleared.
    let cleared: Vec<_> = empty
        .subscription_expires_changes(&after)
        .map(|(msr, expires)| (msr.as_str(), expires))
        .collect();
    assert_eq!(cleared, [("msr_1", None), ("msr_2", None), ("msr_4", None)]);
}

#[test]
fn active_and_expires() {
    let mut config = OperatorConfig::new();
    assert_eq!(config.set_active("msr_1", false), Ok(true));
    assert!(!config.is_active("msr_1"));
    assert_eq!(config.set_subscription_expires("msr_1", 30), Ok(None));
    assert_eq!(config.subscription_expires("msr_1"), Some(30));
    assert!(matches!(
        config.set_subscription_expires("msr_1", 0),
        Err(OperatorError::InvalidExpires { .. })
    ));
    assert!(matches!(
        config.set_active("", true),
        Err(OperatorError::Name(_))
    ));
}

#[test]
fn contact_site_must_be_declared_and_blocks_removal() {
    let mut config = OperatorConfig::new();
    assert!(matches!(
        config.set_contact_site("lo@msr_1", "remote"),
        Err(OperatorError::Topology(TopologyError::UnknownSite { .. }))
    ));
    config.declare_site("remote").expect("declare");
    config.set_contact_site("lo@msr_1", "remote").expect("set");
    config.set_contact_zone("lo@msr_1", "rtk").expect("set");
    assert_eq!(
        config.contact_site("lo@msr_1", &SiteName::test("local")),
        "remote"
    );
    assert_eq!(
        config.contact_zone("lo@msr_1", &ZoneName::test("default")),
        "rtk"
    );
    assert!(matches!(
        config.remove_site("remote", |_| None),
        Err(OperatorError::Topology(TopologyError::SiteInUse { .. }))
    ));
    assert!(matches!(
        config.set_contact_zone("lo@msr_1", "a b"),
        Err(OperatorError::Name(_))
    ));
}

#[test]
fn encode_decode_round_trip() {
    let mut config = OperatorConfig::new();
    for site in ["local", "remote", "remote_1"] {
        config.declare_site(site).expect("declare");
    }
    config.set_distance("local", "remote_1", 32.0).expect("set");
    config
        .set_distance("remote", "remote", f64::INFINITY)
        .expect("set");
    config.set_distance("local", "local", 2.5).expect("set");
    config
        .set_performance_coefficient("msr_1", 2.0)
        .expect("set");
    config.set_active("msr_2", false).expect("set");
    config.set_subscription_expires("msr_2", 30).expect("set");
    config
        .set_contact_site("bond1.2@msr_1", "remote")
        .expect("set");
    config
        .set_contact_zone("bond1.2@msr_2", "rtk")
        .expect("set");
    let text = config.encode();
    assert_eq!(OperatorConfig::decode(&text), Ok(config));
}

#[test]
fn decode_rejects_invalid_values_and_unknown_fields() {
    let bad_coefficient =
        r#"{"version":1,"msrs":{"m":{"performance_coefficient":0.0,"active":true}}}"#;
    assert!(matches!(
        OperatorConfig::decode(bad_coefficient),
        Err(DecodeError::Invalid(_))
    ));
    assert!(matches!(
        OperatorConfig::decode(r#"{"version":1,"sitez":[]}"#),
        Err(DecodeError::Syntax(_))
    ));
    assert!(matches!(
        OperatorConfig::decode(r#"{"version":9}"#),
        Err(DecodeError::Version { .. })
    ));
    let bad_distance =
        r#"{"version":1,"sites":["a"],"distances":[{"a":"a","b":"b","distance":1}]}"#;
    assert!(matches!(
        OperatorConfig::decode(bad_distance),
        Err(DecodeError::Invalid(_))
    ));
}

/// Every name the registrar accepts can be set by the operator, and the
/// names the adversarial tester registered are refused by both.
#[test]
fn operator_commands_use_the_name_rules() {
    let mut config = OperatorConfig::new();
    config.declare_site("remote_side").expect("declare");
    for msr in ["msr_1", "m"] {
        config.set_active(msr, false).expect("valid msr");
        config
            .set_performance_coefficient(msr, 2.0)
            .expect("valid msr");
    }
    for contact in ["lo@msr_1", "bond1.2@msr_1", "127.0.0.1:5070@msr_1"] {
        config.set_contact_zone(contact, "rtk").expect("valid");
        config
            .set_contact_site(contact, "remote_side")
            .expect("valid");
    }
    let long = "m".repeat(140);
    for msr in [long.as_str(), "a@b", "a/b", "a\u{200B}b", "a b"] {
        assert!(
            matches!(config.set_active(msr, false), Err(OperatorError::Name(_))),
            "{msr:?}"
        );
        assert!(matches!(
            config.set_subscription_expires(msr, 30),
            Err(OperatorError::Name(_))
        ));
    }
    for contact in ["a b@evil4", "x@y@evil5", "lo@a/b"] {
        assert!(matches!(
            config.set_contact_zone(contact, "rtk"),
            Err(OperatorError::Name(_))
        ));
    }
    for zone in ["\u{200B}", "\u{202E}x", "\u{FEFF}", "a/b", ""] {
        let err = config
            .set_contact_zone("lo@msr_1", zone)
            .expect_err("invisible zone");
        assert!(err.to_string().contains("invalid zone name"), "{err}");
    }
    assert_eq!(
        config.contact_zone("lo@msr_1", &ZoneName::test("default")),
        "rtk"
    );
    let err = config
        .set_contact_site("lo@msr_1", "\u{200B}")
        .expect_err("invisible site");
    assert!(err.to_string().contains("U+200B"), "{err}");
}

#[test]
fn decode_refuses_entries_listed_twice() {
    let msr_twice = r#"{"version":1,"msrs":{
        "m":{"performance_coefficient":-5,"active":true},
        "m":{"performance_coefficient":2,"active":true}}}"#;
    let err = OperatorConfig::decode(msr_twice).expect_err("msr twice");
    assert_eq!(
        err,
        DecodeError::Duplicate {
            section: "msrs",
            name: "m".into()
        }
    );
    assert_eq!(err.to_string(), "`msrs` lists `m` twice; keep one");
    let contact_twice = r#"{"version":1,"contacts":{
        "lo@m":{"zone":"a"},"lo@m":{"zone":"b"}}}"#;
    assert_eq!(
        OperatorConfig::decode(contact_twice),
        Err(DecodeError::Duplicate {
            section: "contacts",
            name: "lo@m".into()
        })
    );
    let site_twice = r#"{"version":1,"sites":["local","local"]}"#;
    assert_eq!(
        OperatorConfig::decode(site_twice),
        Err(DecodeError::Duplicate {
            section: "sites",
            name: "local".into()
        })
    );
}

#[test]
fn decode_refuses_a_pair_of_sites_with_two_distances() {
    let conflicting = r#"{"version":1,"sites":["local","r"],"distances":[
        {"a":"local","b":"r","distance":1},{"a":"r","b":"local","distance":2}]}"#;
    let err = OperatorConfig::decode(conflicting).expect_err("conflict");
    assert_eq!(
        err,
        DecodeError::DuplicateDistance {
            first: Box::new(DistanceEntry {
                index: 0,
                a: "local".into(),
                b: "r".into(),
                distance: 1.0
            }),
            second: Box::new(DistanceEntry {
                index: 1,
                a: "r".into(),
                b: "local".into(),
                distance: 2.0
            }),
        }
    );
    assert_eq!(
        err.to_string(),
        "`distances[0]` (`local`/`r` 1) and `distances[1]` (`r`/`local` 2) \
         set the distance between the same two sites; keep one"
    );
    let same_twice = r#"{"version":1,"sites":["a"],"distances":[
        {"a":"a","b":"a","distance":null},{"a":"a","b":"a","distance":null}]}"#;
    assert!(matches!(
        OperatorConfig::decode(same_twice),
        Err(DecodeError::DuplicateDistance { .. })
    ));
}

#[test]
fn a_store_with_more_sites_than_the_cap_loads_but_takes_no_more() {
    let sites: Vec<String> = (0..MAX_SITES + 10).map(|i| format!("s{i}")).collect();
    let text = serde_json::json!({"version": 1, "sites": sites}).to_string();
    let mut config = OperatorConfig::decode(&text).expect("loads");
    assert_eq!(config.topology().len(), MAX_SITES + 10);
    assert!(matches!(
        config.declare_site("one_more"),
        Err(OperatorError::Topology(TopologyError::TooManySites { .. }))
    ));
    // What is there still works, and round-trips.
    config.set_distance("s0", "s1", 3.0).expect("distance");
    assert_eq!(OperatorConfig::decode(&config.encode()), Ok(config));
}

#[test]
fn decode_refuses_names_the_operator_would_refuse() {
    for text in [
        r#"{"version":1,"msrs":{"a@b":{"performance_coefficient":2,"active":true}}}"#,
        r#"{"version":1,"contacts":{"x@y@z":{"zone":"a"}}}"#,
        r#"{"version":1,"contacts":{"lo@m":{"zone":"\u200b"}}}"#,
        r#"{"version":1,"sites":["a\u202eb"]}"#,
    ] {
        assert!(
            matches!(OperatorConfig::decode(text), Err(DecodeError::Invalid(_))),
            "{text}"
        );
    }
}

/// A fuzzing find: a distance of 17 or more significant digits came
/// back from a save and a load as another number (serde_json's fast
/// float parsing is not correctly rounded without `float_roundtrip`),
/// so a restart changed the operator's matrix.
#[test]
fn every_number_survives_a_save_and_a_load() {
    let text = r#"{"version":1,"sites":["local","remote"],"distances":[{"a":"local","b":"local","distance":211111111111111135},{"a":"local","b":"remote","distance":0.30000000000000004}],"msrs":{"msr_1":{"performance_coefficient":1.0000000000000002,"active":true}},"contacts":{}}"#;
    let loaded = OperatorConfig::decode(text).expect("a valid store");
    assert_eq!(OperatorConfig::decode(&loaded.encode()), Ok(loaded));
}

#[test]
fn the_default_site_is_declared_once_by_the_one_rule() {
    let site = SiteName::test("local");
    let next = OperatorConfig::new()
        .with_default_site(&site)
        .expect("declared");
    assert!(next.topology().contains("local"));
    assert_eq!(next.with_default_site(&site), None, "declared already");
}
