use super::*;
use crate::subscription::SubscriptionState;

#[test]
fn request_round_trips_and_uses_op_tag() {
    let request = Request::SiteDistance {
        a: "local".into(),
        b: "remote".into(),
        distance: Distance::Infinity,
    };
    let line = serde_json::to_string(&request).expect("serialize");
    assert_eq!(
        line,
        r#"{"op":"site_distance","a":"local","b":"remote","distance":"infinity"}"#
    );
    let back: Request = serde_json::from_str(&line).expect("deserialize");
    assert_eq!(back, request);
}

#[test]
fn unknown_op_and_unknown_field_are_rejected() {
    assert!(serde_json::from_str::<Request>(r#"{"op":"reboot"}"#).is_err());
    // Misspelt fields of a request with fields are refused, not ignored.
    assert!(serde_json::from_str::<Request>(r#"{"op":"site_declare","nmae":"a"}"#).is_err());
}

/// One request of every op. The match is exhaustive: a new op must be
/// added here, and so is checked to read back and to refuse unknown fields.
fn every_op() -> Vec<Request> {
    let all = vec![
        Request::SiteDeclare { name: "a".into() },
        Request::SiteRemove { name: "a".into() },
        Request::SiteList {},
        Request::ZoneList {},
        Request::SiteDistance {
            a: "a".into(),
            b: "b".into(),
            distance: Distance::Finite(2.5),
        },
        Request::SiteMatrix {
            names: vec!["a".into()],
        },
        Request::MsrSetPerformanceCoefficient {
            msr: "m".into(),
            value: 0.9,
        },
        Request::MsrSetActive {
            msr: "m".into(),
            active: false,
        },
        Request::MsrList {},
        Request::ResourceList { active_only: true },
        Request::ResourceSetZone {
            contact: "lo@m".into(),
            zone: "z".into(),
        },
        Request::ResourceSetSite {
            contact: "lo@m".into(),
            site: "s".into(),
        },
        Request::ResourceUnset {
            contact: "lo@m".into(),
            property: ContactProperty::Site,
        },
        Request::SubscriptionSetExpires {
            msr: "m".into(),
            event: EVENT_PACKAGE.into(),
            expires_secs: 30,
        },
        Request::SubscriptionList {},
        Request::Select(SelectQuery {
            zone: "z".into(),
            site: "s".into(),
            msr: Some("m".into()),
            random: Some(1.5),
            explain: true,
            call_id: Some("c1@core".into()),
            leg: Some("b".into()),
            conference: Some("room-7".into()),
            failed: vec!["m2".into()],
            failure: Some("503".into()),
            codecs: vec!["pcma".into(), "h264".into()],
        }),
        Request::Release {
            call_id: "c1@core".into(),
            leg: None,
        },
        Request::MsrSetLoadLimit {
            msr: "m".into(),
            value: 80,
        },
        Request::ClusterList {},
        Request::Hello {},
        Request::MsrForget { msr: "m".into() },
        Request::LegList {
            msr: Some("msr_1".into()),
            older_than_secs: Some(60),
            limit: None,
        },
    ];
    for request in &all {
        match request {
            Request::SiteDeclare { .. }
            | Request::SiteRemove { .. }
            | Request::SiteList {}
            | Request::ZoneList {}
            | Request::SiteDistance { .. }
            | Request::SiteMatrix { .. }
            | Request::MsrSetPerformanceCoefficient { .. }
            | Request::MsrSetActive { .. }
            | Request::MsrList {}
            | Request::MsrForget { .. }
            | Request::ResourceList { .. }
            | Request::ResourceSetZone { .. }
            | Request::ResourceSetSite { .. }
            | Request::ResourceUnset { .. }
            | Request::SubscriptionSetExpires { .. }
            | Request::SubscriptionList {}
            | Request::Select(_)
            | Request::Release { .. }
            | Request::MsrSetLoadLimit { .. }
            | Request::ClusterList {}
            | Request::LegList { .. }
            | Request::Hello {} => {}
        }
    }
    all
}

#[test]
fn every_op_round_trips() {
    for request in every_op() {
        let line = serde_json::to_string(&request).expect("serialize");
        let back: Request = serde_json::from_str(&line).expect(&line);
        assert_eq!(back, request, "{line}");
    }
    assert_eq!(
        serde_json::to_string(&Request::MsrList {}).expect("serialize"),
        r#"{"op":"msr_list"}"#
    );
}

#[test]
fn unknown_fields_are_rejected_for_every_op() {
    for request in every_op() {
        let mut value = serde_json::to_value(&request).expect("serialize");
        if let Some(map) = value.as_object_mut() {
            map.insert("x".into(), serde_json::json!(1));
        }
        let error = serde_json::from_value::<Request>(value.clone())
            .expect_err(&format!("accepted {value}"));
        assert!(error.to_string().contains("unknown field `x`"), "{error}");
    }
    let error = serde_json::from_str::<Request>(r#"{"op":"msr_list","x":1}"#)
        .expect_err("an op without fields takes no field");
    assert!(error.to_string().contains("unknown field `x`"), "{error}");
}

#[test]
fn optional_fields_default() {
    let request: Request =
        serde_json::from_str(r#"{"op":"select","zone":"z","site":"s"}"#).expect("parse");
    assert_eq!(request, Request::Select(SelectQuery::new("z", "s")));
    let request: Request = serde_json::from_str(r#"{"op":"site_matrix"}"#).expect("parse");
    assert_eq!(request, Request::SiteMatrix { names: vec![] });
}

#[test]
fn distance_accepts_number_or_infinity_only() {
    assert_eq!(
        serde_json::from_str::<Distance>("3.5").expect("num"),
        Distance::Finite(3.5)
    );
    assert_eq!(
        serde_json::from_str::<Distance>("\"infinity\"").expect("inf"),
        Distance::Infinity
    );
    assert!(serde_json::from_str::<Distance>("\"far\"").is_err());
    assert_eq!(Distance::Finite(32.0).to_string(), "32");
    assert_eq!(Distance::Finite(1e308).to_string(), "1e308");
    // Negative numbers are read; the collector's validation refuses them.
    assert_eq!(
        serde_json::from_str::<Distance>("-1").expect("negative"),
        Distance::Finite(-1.0)
    );
}

#[test]
fn distance_errors_say_what_is_expected() {
    for (json, found) in [
        ("null", "null"),
        ("true", "true"),
        ("\"far\"", "\"far\""),
        ("[1]", "a list"),
        ("{}", "an object"),
    ] {
        let error = serde_json::from_str::<Distance>(json).expect_err(json);
        let text = error.to_string();
        assert!(
            text.starts_with(&format!(
                "distance: expected a number >= 0 or \"infinity\", not {found}"
            )),
            "{json}: {text}"
        );
        // The same inside a request, where serde buffers the fields.
        let line = format!(r#"{{"op":"site_distance","a":"x","b":"y","distance":{json}}}"#);
        let error = serde_json::from_str::<Request>(&line).expect_err(&line);
        assert_eq!(
            error.to_string(),
            format!("distance: expected a number >= 0 or \"infinity\", not {found}"),
            "{line}"
        );
    }
}

#[test]
fn negative_zero_is_read_as_zero() {
    for json in ["-0", "-0.0", "-0e5"] {
        let Distance::Finite(value) = serde_json::from_str::<Distance>(json).expect(json) else {
            panic!("{json}: not finite")
        };
        assert!(value == 0.0 && value.is_sign_positive(), "{json}: {value}");
    }
    assert_eq!(Distance::from_f64(-0.0).to_string(), "0");
}

#[test]
fn response_shapes() {
    let ok = Response::Ok(ResponseData::Sites {
        sites: vec!["local".into()],
    });
    let line = serde_json::to_string(&ok).expect("serialize");
    assert_eq!(
        line,
        r#"{"ok":true,"data":{"kind":"sites","sites":["local"]}}"#
    );
    assert_eq!(serde_json::from_str::<Response>(&line).expect("parse"), ok);

    let err = Response::error(ErrorCode::MsrNotFound, "none");
    let line = serde_json::to_string(&err).expect("serialize");
    assert_eq!(
        line,
        r#"{"ok":false,"error":{"code":"msr_not_found","message":"none"}}"#
    );
    assert_eq!(serde_json::from_str::<Response>(&line).expect("parse"), err);

    let unknown: Response =
        serde_json::from_str(r#"{"ok":false,"error":{"code":"new_thing","message":"m"}}"#)
            .expect("parse");
    assert!(matches!(
        unknown,
        Response::Err(ErrorBody {
            code: ErrorCode::Other,
            ..
        })
    ));
    assert!(serde_json::from_str::<Response>(r#"{"ok":true}"#).is_err());
}

#[test]
fn health_and_explain_outcomes_are_strings_on_the_wire() {
    for (health, text) in [
        (HealthState::Healthy, "healthy"),
        (HealthState::Unreported, "unreported"),
        (HealthState::Unreachable, "unreachable"),
        (HealthState::Stale, "stale"),
    ] {
        let json = serde_json::to_string(&health).expect("serialize");
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(health.to_string(), text);
        let back: HealthState = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, health);
    }
    for outcome in [
        ExplainOutcome::Kept,
        ExplainOutcome::Full,
        ExplainOutcome::Inactive,
        ExplainOutcome::Unregistered,
        ExplainOutcome::Unreported,
        ExplainOutcome::Unreachable,
        ExplainOutcome::Stale,
        ExplainOutcome::OtherMsr,
        ExplainOutcome::InfiniteDistance,
        ExplainOutcome::Farther,
        ExplainOutcome::DuplicateMsr,
    ] {
        let json = serde_json::to_string(&outcome).expect("serialize");
        assert_eq!(json, format!("\"{}\"", outcome.as_str()));
        let back: ExplainOutcome = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, outcome);
    }
    assert!(serde_json::from_str::<HealthState>("\"dead\"").is_err());
    assert_eq!(ErrorCode::MsrUnhealthy.to_string(), "msr_unhealthy");
    assert_eq!(
        serde_json::to_string(&ErrorCode::MsrUnhealthy).expect("serialize"),
        "\"msr_unhealthy\""
    );
}

#[test]
fn subscription_states_are_their_names_on_the_wire() {
    let states = [
        Some(SubscriptionState::Pending),
        Some(SubscriptionState::Active),
        Some(SubscriptionState::Terminated(Some(
            crate::sip::TerminationReason::Timeout,
        ))),
        Some(SubscriptionState::Failed),
        None,
    ];
    let shown: Vec<&str> = states
        .iter()
        .map(|s| subscription_name(s.as_ref()))
        .collect();
    assert_eq!(shown, ["pending", "active", "terminated", "failed", "none"]);
    for state in states {
        let info = SubscriptionInfo {
            msr: "m".into(),
            registered: true,
            event: EVENT_PACKAGE.into(),
            active: true,
            expires_secs: 60,
            notify_count: 0,
            last_notify_unix: None,
            event_id: String::new(),
            status: state.clone(),
        };
        let json = serde_json::to_value(&info).expect("serialize");
        assert_eq!(json["status"], subscription_name(state.as_ref()));
        let back: SubscriptionInfo = serde_json::from_value(json).expect("parse");
        // The reason of a `terminated` state does not travel.
        let expected = match state {
            Some(SubscriptionState::Terminated(_)) => Some(SubscriptionState::Terminated(None)),
            other => other,
        };
        assert_eq!(back.status, expected);
    }
    assert!(serde_json::from_str::<SubscriptionState>("\"none\"").is_err());
    assert!(serde_json::from_str::<SubscriptionState>("\"gone\"").is_err());
}

/// The closed sets that travel as strings keep their JSON: exact
/// lines, as a script sees them.
#[test]
fn golden_json_of_the_wire_enums() {
    let row = ResourceInfo {
        node: "core1@ecss1".into(),
        msr: "msr_1".into(),
        version: None,
        performance_coefficient: 1.0,
        load: Some(37),
        cpu: None,
        calls: None,
        max_calls: None,
        report_age_secs: None,
        stale: false,
        zone: "default".into(),
        site: "local".into(),
        active: true,
        contact: "lo@msr_1".into(),
        uri: "sip:msr_1@127.0.0.1:5070".into(),
        engine_uri: None,
        mcc: None,
        status: RegistrationStatus::Registered,
        expires_secs: 58,
        subscription: Some(SubscriptionState::Active),
        live_legs: 0,
        health: HealthState::Healthy,
        health_since_unix: 1,
        health_secs: 2,
        codecs: None,
    };
    let line = serde_json::to_string(&row).expect("serialize");
    assert_eq!(
        line,
        r#"{"node":"core1@ecss1","msr":"msr_1","version":null,"performance_coefficient":1.0,"load":37,"cpu":null,"calls":null,"max_calls":null,"report_age_secs":null,"stale":false,"zone":"default","site":"local","active":true,"contact":"lo@msr_1","uri":"sip:msr_1@127.0.0.1:5070","status":"registered","expires_secs":58,"subscription":"active","live_legs":0,"health":"healthy","health_since_unix":1,"health_secs":2}"#
    );
    assert_eq!(
        serde_json::from_str::<ResourceInfo>(&line).expect("parse"),
        row
    );
    let expired = ResourceInfo {
        status: RegistrationStatus::Expired,
        subscription: None,
        ..row
    };
    let json = serde_json::to_value(&expired).expect("serialize");
    assert_eq!(
        (json["status"].as_str(), json["subscription"].as_str()),
        (Some("expired"), Some("none"))
    );

    let none = SubscriptionInfo {
        msr: "msr_9".into(),
        registered: false,
        event: EVENT_PACKAGE.into(),
        active: true,
        expires_secs: 30,
        notify_count: 0,
        last_notify_unix: None,
        event_id: String::new(),
        status: None,
    };
    let line = serde_json::to_string(&none).expect("serialize");
    assert_eq!(
        line,
        r#"{"msr":"msr_9","registered":false,"event":"eltex-call-count","active":true,"expires":30,"notify_count":0,"last_notify_unix":null,"event_id":"","status":"none"}"#
    );
    assert_eq!(
        serde_json::from_str::<SubscriptionInfo>(&line).expect("parse"),
        none
    );

    for (backend, status, json) in [
        (
            StoreKind::File,
            StoreState::Local,
            r#"{"backend":"file","status":"local","location":"x"}"#,
        ),
        (
            StoreKind::Etcd,
            StoreState::Connected,
            r#"{"backend":"etcd","status":"connected","location":"x"}"#,
        ),
        (
            StoreKind::Etcd,
            StoreState::Unavailable,
            r#"{"backend":"etcd","status":"unavailable","location":"x"}"#,
        ),
    ] {
        let view = StoreView {
            backend,
            status,
            location: "x".into(),
            revision: None,
            unavailable_since_unix: None,
            detail: None,
        };
        assert_eq!(serde_json::to_string(&view).expect("serialize"), json);
        assert_eq!(
            serde_json::from_str::<StoreView>(json).expect("parse"),
            view
        );
    }
}

/// A change names its entity and property as before; its values are
/// JSON numbers, flags and strings as the property says (a distance
/// with no path stays `"infinity"`).
#[test]
fn golden_json_of_changes() {
    let change = |entity, name: &str, property, from, to| {
        ResponseData::Changed(Change {
            entity,
            name: name.into(),
            property,
            from,
            to,
            msr_registered: None,
        })
    };
    use ChangeValue as V;
    use ChangedEntity as E;
    use ChangedProperty as P;
    for (data, json) in [
        (
            change(
                E::Site,
                "local remote",
                P::Distance,
                V::Distance(Distance::Infinity),
                V::Distance(Distance::Finite(32.0)),
            ),
            r#"{"kind":"changed","entity":"site","name":"local remote","property":"distance","from":"infinity","to":32.0}"#,
        ),
        (
            change(
                E::Msr,
                "msr_1",
                P::PerformanceCoefficient,
                V::Number(1.0),
                V::Number(0.9),
            ),
            r#"{"kind":"changed","entity":"msr","name":"msr_1","property":"performance_coefficient","from":1.0,"to":0.9}"#,
        ),
        (
            change(E::Msr, "msr_1", P::LoadLimit, V::Count(100), V::Count(80)),
            r#"{"kind":"changed","entity":"msr","name":"msr_1","property":"load_limit","from":100,"to":80}"#,
        ),
        (
            change(E::Msr, "msr_1", P::Active, V::Flag(true), V::Flag(false)),
            r#"{"kind":"changed","entity":"msr","name":"msr_1","property":"active","from":true,"to":false}"#,
        ),
        (
            change(
                E::Contact,
                "lo@msr_1",
                P::Zone,
                V::Text("default".into()),
                V::Text("z2".into()),
            ),
            r#"{"kind":"changed","entity":"contact","name":"lo@msr_1","property":"zone","from":"default","to":"z2"}"#,
        ),
        (
            change(
                E::Contact,
                "lo@msr_1",
                P::Site,
                V::Text("infinity".into()),
                V::Text("local".into()),
            ),
            r#"{"kind":"changed","entity":"contact","name":"lo@msr_1","property":"site","from":"infinity","to":"local"}"#,
        ),
        (
            change(
                E::Subscription,
                "msr_1 eltex-call-count",
                P::Expires,
                V::Count(60),
                V::Count(30),
            ),
            r#"{"kind":"changed","entity":"subscription","name":"msr_1 eltex-call-count","property":"expires","from":60,"to":30}"#,
        ),
    ] {
        assert_eq!(serde_json::to_string(&data).expect("serialize"), json);
        assert_eq!(
            serde_json::from_str::<ResponseData>(json).expect(json),
            data,
            "{json}"
        );
    }
    // A whole distance or coefficient may come as an integer.
    let read: ResponseData = serde_json::from_str(
        r#"{"kind":"changed","entity":"site","name":"a b","property":"distance","from":1,"to":2}"#,
    )
    .expect("integers");
    assert!(
        matches!(read, ResponseData::Changed(Change { to: V::Distance(Distance::Finite(t)), .. }) if t == 2.0)
    );
    // A value of the wrong type for its property is refused.
    for json in [
        r#"{"kind":"changed","entity":"msr","name":"m","property":"active","from":1,"to":0}"#,
        r#"{"kind":"changed","entity":"site","name":"a b","property":"distance","from":"far","to":1}"#,
        r#"{"kind":"changed","entity":"contact","name":"c","property":"zone","from":1,"to":"z"}"#,
        r#"{"kind":"changed","entity":"msr","name":"m","property":"colour","from":1,"to":2}"#,
    ] {
        assert!(
            serde_json::from_str::<ResponseData>(json).is_err(),
            "{json}"
        );
    }
}

#[test]
fn hello_answers_the_protocol_version() {
    assert_eq!(
        serde_json::from_str::<Request>(r#"{"op":"hello"}"#).expect("parse"),
        Request::Hello {}
    );
    let hello = Response::Ok(ResponseData::Hello(Hello {
        version: PROTOCOL_VERSION,
        software: "msr-collector 0.1.0".into(),
    }));
    let line = serde_json::to_string(&hello).expect("serialize");
    assert_eq!(
        line,
        r#"{"ok":true,"data":{"kind":"hello","version":1,"software":"msr-collector 0.1.0"}}"#
    );
    assert_eq!(
        serde_json::from_str::<Response>(&line).expect("parse"),
        hello
    );
}

#[test]
fn changed_is_flattened_into_data() {
    let data = ResponseData::Changed(Change {
        entity: ChangedEntity::Msr,
        name: "msr_1".into(),
        property: ChangedProperty::PerformanceCoefficient,
        from: ChangeValue::Number(1.0),
        to: ChangeValue::Number(2.5),
        msr_registered: Some(false),
    });
    let json = serde_json::to_value(&data).expect("serialize");
    assert_eq!(json["kind"], "changed");
    assert_eq!(json["entity"], "msr");
    let back: ResponseData = serde_json::from_value(json).expect("parse");
    assert_eq!(back, data);
}

#[test]
fn error_codes_and_leg_outcomes_are_spelled_as_on_the_wire() {
    let codes = [
        ErrorCode::BadRequest,
        ErrorCode::InvalidValue,
        ErrorCode::UnknownSite,
        ErrorCode::SiteExists,
        ErrorCode::SiteInUse,
        ErrorCode::BadEvent,
        ErrorCode::MsrNotFound,
        ErrorCode::MsrOverloaded,
        ErrorCode::MsrUnhealthy,
        ErrorCode::StoreFailed,
        ErrorCode::Unavailable,
        ErrorCode::Conflict,
        ErrorCode::StoreUnavailable,
        ErrorCode::LegReleased,
        ErrorCode::MsrUnavailable,
        ErrorCode::Other,
    ];
    for code in codes {
        let json = serde_json::to_string(&code).expect("serialize");
        assert_eq!(json, format!("\"{}\"", code.as_str()));
    }
    for leg in [LegOutcome::New, LegOutcome::Sticky, LegOutcome::Reanchored] {
        let json = serde_json::to_string(&leg).expect("serialize");
        assert_eq!(json, format!("\"{}\"", leg.as_str()));
    }
}
