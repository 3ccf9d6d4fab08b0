use super::*;

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config-examples")
}

#[test]
fn empty_file_gets_the_documented_defaults() {
    let c = parse("", "<string>").expect("empty config is valid");
    assert_eq!(c.node, "core1@localhost");
    assert_eq!(
        c.sip.listen,
        "127.0.0.1:5060".parse::<SocketAddr>().expect("addr")
    );
    assert_eq!(c.sip.transports, vec![Transport::Udp]);
    assert_eq!(c.sip.nonce_ttl, Duration::from_secs(300));
    assert_eq!((c.sip.min_expires, c.sip.max_expires), (10, 3600));
    assert_eq!(
        c.sip.digest_algorithms,
        vec![DigestAlgorithm::Sha256, DigestAlgorithm::Md5]
    );
    assert_eq!(c.defaults, crate::operator::Placement::default());
    assert_eq!(
        c.subscription,
        SubscriptionDefaults {
            event: "eltex-call-count".into(),
            expires: 60
        }
    );
    assert_eq!(
        c.control_socket,
        PathBuf::from("/run/msr-collector/control.sock")
    );
    assert!(c.accounts.is_empty());
    // SPEC §11: HTTP on loopback by default, without a token.
    assert_eq!(
        c.http,
        Some(HttpConfig {
            listen: "127.0.0.1:8080".parse().expect("addr"),
            token: None,
        })
    );
    assert_eq!(c.redirect, None);
    assert_eq!(c.health, HealthConfig::default());
    assert_eq!(
        c.health,
        HealthConfig {
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(2),
            keepalive_misses: 2,
            unreported_grace: Duration::from_secs(2),
            failures: FailureLimits {
                timeouts: 1,
                errors: 3,
                window: Duration::from_secs(10),
                hold: Duration::from_secs(10),
            },
        }
    );
    assert_eq!(c.selection.failover_attempts, 3);
}

#[test]
fn failure_limits_and_failover_attempts_are_read_and_checked() {
    let c = parse(
        "[health]\nfailure_timeouts = 2\nfailure_errors = 5\nfailure_window_secs = 30\nfailure_hold_secs = 20\n[selection]\nfailover_attempts = 4\n",
        "f.toml",
    )
    .expect("valid");
    assert_eq!(c.health.failures.timeouts, 2);
    assert_eq!(c.health.failures.errors, 5);
    assert_eq!(c.health.failures.window, Duration::from_secs(30));
    assert_eq!(c.health.failures.hold, Duration::from_secs(20));
    assert_eq!(c.selection.failover_attempts, 4);
    for (text, key) in [
        ("[health]\nfailure_errors = 0\n", "health.failure_errors"),
        (
            "[health]\nfailure_window_secs = 0\n",
            "health.failure_window_secs",
        ),
        (
            "[selection]\nfailover_attempts = 11\n",
            "selection.failover_attempts",
        ),
    ] {
        let err = parse(text, "f.toml").expect_err(text).to_string();
        assert!(err.contains(key), "{err}");
    }
}

#[test]
fn http_can_be_turned_off_and_off_takes_no_token() {
    let c = parse("[http]\nlisten = \"off\"\n", "f.toml").expect("off");
    assert_eq!(c.http, None);
    let err = parse(
        "[http]\nlisten = \"off\"\ntoken = \"0123456789abcdef0123\"\n",
        "f.toml",
    )
    .expect_err("off with a token");
    assert!(err.to_string().contains("http.token"), "{err}");
    let err = parse("[http]\nlisten = \"of\"\n", "f.toml").expect_err("typo");
    assert!(err.to_string().contains("\"off\""), "{err}");
}

#[test]
fn health_values_are_checked() {
    for (text, key) in [
        (
            "[health]\nkeepalive_interval_secs = 0",
            "health.keepalive_interval_secs",
        ),
        (
            "[health]\nkeepalive_interval_secs = 3601",
            "health.keepalive_interval_secs",
        ),
        (
            "[health]\nkeepalive_timeout_ms = 99",
            "health.keepalive_timeout_ms",
        ),
        (
            "[health]\nkeepalive_misses = 101",
            "health.keepalive_misses",
        ),
        (
            "[health]\nunreported_grace_ms = 600001",
            "health.unreported_grace_ms",
        ),
        (
            "[health]\nkeepalive_interval_secs = -1",
            "h.toml:2:27: `health.keepalive_interval_secs` = -1: expected seconds, 1 to 3600",
        ),
    ] {
        let err = parse(text, "h.toml").expect_err(text);
        assert!(err.to_string().contains(key), "{text}: {err}");
    }
    let c = parse(
        "[health]\nkeepalive_interval_secs = 1\nkeepalive_timeout_ms = 1000\nkeepalive_misses = 1\nunreported_grace_ms = 0",
        "h.toml",
    )
    .expect("edges are valid");
    assert_eq!(c.health.keepalive_timeout, Duration::from_secs(1));
    assert_eq!(c.health.unreported_grace, Duration::ZERO);
}

#[test]
fn the_example_parses_and_matches_the_loopback_agent() {
    let c = load(&examples_dir().join("collector.toml")).expect("example is valid");
    assert_eq!(c.sip.listen.port(), 5060);
    assert_eq!(
        c.accounts,
        vec![Account {
            auth_name: "msr".into(),
            password: "msr-secret".into(),
            msrs: vec![]
        }]
    );
    assert_eq!(c.control_socket, PathBuf::from("/tmp/msr-collector.sock"));
    assert_eq!(c.state_path, PathBuf::from("/tmp/msr-collector-state.json"));
}

#[test]
fn every_valid_example_parses() {
    let mut n = 0;
    for entry in std::fs::read_dir(examples_dir()).expect("config-examples") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 1);
}

#[test]
fn every_invalid_example_fails_with_its_expected_error() {
    let dir = examples_dir().join("invalid-collector");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("invalid-collector") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let expected = std::fs::read_to_string(path.with_extension("expected"))
            .unwrap_or_else(|e| panic!("{}: no .expected: {e}", path.display()));
        let err = load(&path).expect_err(&format!("{} must be rejected", path.display()));
        let text = err.to_string();
        assert!(
            text.contains(expected.trim()),
            "{}: `{text}` lacks `{}`",
            path.display(),
            expected.trim()
        );
        assert!(
            text.contains(&path.display().to_string()),
            "error names the file: {text}"
        );
        n += 1;
    }
    assert!(n >= 10);
}

#[test]
fn a_spurious_key_in_any_table_is_rejected() {
    let text = std::fs::read_to_string(examples_dir().join("collector.toml")).expect("example");
    for table in [
        "[sip]",
        "[[accounts]]",
        "[defaults]",
        "[subscription]",
        "[health]",
        "[control]",
        "[state]",
        "[store]",
        "[cluster]",
    ] {
        let injected = text.replacen(table, &format!("{table}\nbogus_key = 1"), 1);
        let err = parse(&injected, "x.toml").expect_err(table);
        assert!(err.to_string().contains("bogus_key"), "{table}: {err}");
    }
    let err = parse("bogus_top = 1\n", "x.toml").expect_err("top level");
    assert!(err.to_string().contains("bogus_top"));
}

#[test]
fn syntax_errors_carry_line_and_column() {
    let err = parse("node = \"a\"\n[sip]\nmin_expires = = 1\n", "f.toml").expect_err("syntax");
    match err {
        ConfigError::Syntax { line, origin, .. } => {
            assert_eq!(line, 3);
            assert_eq!(origin, "f.toml");
        }
        other => panic!("unexpected {other:?}"),
    }
    // A wrong type is a value error, at the value.
    let err = parse("node = \"a\"\n[sip]\nmin_expires = \"ten\"\n", "f.toml").expect_err("type");
    match err {
        ConfigError::Invalid { position, key, .. } => {
            assert_eq!(position, Some((3, 15)));
            assert_eq!(key, "sip.min_expires");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_validation_error_points_at_the_value_it_names() {
    let text = "node = \"a\"\n[[accounts]]\nauth_name = \"msr\"\npassword = \"x\"\n\
                [[accounts]]\n# the second\n  auth_name   =  \"msr\"\npassword = \"y\"\n";
    let err = parse(text, "f.toml").expect_err("duplicate");
    assert!(
        err.to_string()
            .starts_with("f.toml:7:18: `accounts[1].auth_name` = \"msr\""),
        "{err}"
    );
    assert_eq!(locate(text, "accounts[0].password"), Some((4, 12)));
    assert_eq!(locate(text, "node"), Some((1, 8)));
    assert_eq!(locate(text, "accounts[2].auth_name"), None);
    assert_eq!(locate(text, "store.tls"), None);
    let text = "[store]\nendpoints = [\"127.0.0.1:2379\"]\n";
    // The element itself, not the array.
    assert_eq!(locate(text, "store.endpoints[0]"), Some((2, 14)));
}

#[test]
fn a_number_outside_its_type_names_the_key_and_its_own_range() {
    let err = parse("[health]\nkeepalive_misses = 4294967296\n", "f.toml").expect_err("u32");
    assert_eq!(
        err.to_string(),
        "f.toml:2:20: `health.keepalive_misses` = 4294967296: expected 1 to 100"
    );
    // A negative number: the key's range, not the type's 0..=4294967295.
    let err = parse("[subscription]\nexpires = -5\n", "f.toml").expect_err("negative");
    let shown = err.to_string();
    assert!(
        shown.starts_with("f.toml:2:11: `subscription.expires` = -5: expected "),
        "{shown}"
    );
    assert!(!shown.contains("4294967295"), "{shown}");
    // When the key's range cannot be found (here another error comes
    // first), the error still says it must not be negative.
    let err = parse("node = \" \"\n[sip]\nnonce_ttl_secs = -1\n", "f.toml").expect_err("negative");
    assert_eq!(
        err.to_string(),
        "f.toml:3:18: `sip.nonce_ttl_secs` = -1: expected a number that is not negative, 0 to 9223372036854775807"
    );
    // A top-level key has no table to name.
    let err = parse("max_rows = -1\n", "f.toml").expect_err("unknown or negative");
    assert!(err.to_string().starts_with("f.toml:1:"), "{err}");
}

/// A number beyond TOML's 64 bits is refused by the TOML parser itself,
/// before any field's type is known; it still names the key, the value as
/// written and the key's own range, at the value's line and column.
#[test]
fn a_number_beyond_64_bits_names_the_key_and_its_own_range() {
    let err = parse(
        "[subscription]\nexpires = 99999999999999999999\n",
        "c6.toml",
    )
    .expect_err("beyond i64");
    assert_eq!(
        err.to_string(),
        "c6.toml:2:11: `subscription.expires` = 99999999999999999999: expected seconds, 1 to 86400"
    );
    // Below TOML's smallest, with separators and a comment after it.
    let err = parse(
        "[health]\nkeepalive_misses = -99_999_999_999_999_999_999 # no\n",
        "f.toml",
    )
    .expect_err("beyond i64, negative");
    assert_eq!(
        err.to_string(),
        "f.toml:2:20: `health.keepalive_misses` = -99_999_999_999_999_999_999: expected 1 to 100"
    );
    // A 64-bit key: its own range, which names another key's value.
    let err = parse(
        "[health]\nkeepalive_timeout_ms = 0x1_0000_0000_0000_0000\n",
        "f.toml",
    )
    .expect_err("beyond i64, hex");
    assert_eq!(
        err.to_string(),
        "f.toml:2:24: `health.keepalive_timeout_ms` = 0x1_0000_0000_0000_0000: \
         expected milliseconds, 100 to 5000 (health.keepalive_interval_secs × 1000)"
    );
    // When the key's range cannot be found (another error comes first),
    // its type's.
    let err = parse(
        "node = \" \"\n[subscription]\nexpires = 99999999999999999999\n",
        "f.toml",
    )
    .expect_err("beyond i64");
    assert_eq!(
        err.to_string(),
        "f.toml:3:11: `subscription.expires` = 99999999999999999999: expected 0 to 4294967295"
    );
    // An unknown key has no range of its own: what TOML can write.
    let err = parse("max_rows = 99999999999999999999\n", "f.toml").expect_err("beyond i64");
    assert_eq!(
        err.to_string(),
        "f.toml:1:12: `max_rows` = 99999999999999999999: expected a whole number, \
         -9223372036854775808 to 9223372036854775807 (a TOML integer is 64-bit)"
    );
}

/// A value of the wrong type names its key, as written, and what the
/// key takes in an operator's words (its own range for a number), not a
/// Rust type.
#[test]
fn a_value_of_the_wrong_type_names_the_key_and_what_it_takes() {
    let err = parse("[health]\nkeepalive_misses = \"3\"  # three\n", "f.toml").expect_err("string");
    assert_eq!(
        err.to_string(),
        "f.toml:2:20: `health.keepalive_misses` = \"3\": expected a whole number, 1 to 100"
    );
    let err = parse("node = 5\n", "f.toml").expect_err("integer");
    assert_eq!(
        err.to_string(),
        "f.toml:1:8: `node` = 5: expected a string, in double quotes"
    );
    let err = parse("[selection]\nfailover_attempts = true\n", "f.toml").expect_err("bool");
    assert!(
        err.to_string().starts_with(
            "f.toml:2:21: `selection.failover_attempts` = true: expected a whole number, "
        ),
        "{err}"
    );
    assert!(!err.to_string().contains("u32"), "{err}");
}

#[test]
fn invalid_utf8_gives_the_line_and_column_of_the_first_bad_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.toml");
    std::fs::write(&path, b"node = \"a\"\n# \xc3\xa9t\xc3\xa9 caf\xe9\n").expect("write");
    let err = load(&path).expect_err("latin-1");
    assert_eq!(
        err.to_string(),
        format!(
            "{}:2:10: byte 0xe9 is not valid utf-8 (the file must be utf-8 text)",
            path.display()
        )
    );
}

#[test]
fn tcp_is_optional_and_algorithms_dedupe() {
    let c = parse(
        "[sip]\ntransports = [\"tcp\", \"udp\"]\ndigest_algorithms = [\"md5\", \"MD5\"]\n",
        "s",
    )
    .expect("valid");
    assert!(c.sip.tcp());
    assert_eq!(c.sip.digest_algorithms, vec![DigestAlgorithm::Md5]);
}

#[test]
fn tls_listens_on_5061_beside_the_sip_address_unless_told_and_needs_its_table() {
    let tls = "[sip.tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n";
    let c = parse(
        &format!("[sip]\nlisten = \"10.0.0.1:5060\"\ntransports = [\"udp\", \"tls\"]\n{tls}"),
        "s",
    )
    .expect("valid");
    let t = c.sip.tls.expect("tls");
    assert_eq!(t.listen, "10.0.0.1:5061".parse().expect("addr"));
    assert_eq!((t.client_ca, t.require), (None, false));
    // Port 0 for SIP (tests, the quickstart): a free port for TLS too.
    let c = parse(
        &format!("[sip]\nlisten = \"127.0.0.1:0\"\ntransports = [\"udp\", \"tls\"]\n{tls}"),
        "s",
    )
    .expect("valid");
    assert_eq!(c.sip.tls.expect("tls").listen.port(), 0);
    // A [sip.tls] table without "tls" among the transports is a mistake.
    let e = parse(&format!("[sip]\ntransports = [\"udp\"]\n{tls}"), "s")
        .expect_err("tls table without the transport");
    assert!(
        e.to_string().contains("\"tls\" when [sip.tls] is set"),
        "{e}"
    );
    let e = parse(
        &format!("[sip]\ntransports = [\"udp\", \"tls\"]\n{tls}listen = \"0.0.0.0:5061\"\n"),
        "s",
    )
    .expect_err("unspecified tls address");
    assert!(e.to_string().contains("sip.tls.listen"), "{e}");
}

#[test]
fn the_redirect_server_takes_tcp_and_tls_beside_udp_only() {
    let redirect = |transports: &str| {
        parse(
            &format!("[redirect]\nlisten = \"127.0.0.1:5062\"\ntransports = {transports}\n"),
            "s",
        )
    };
    let c = redirect("[\"udp\", \"tcp\"]").expect("valid");
    assert!(c.redirect.expect("redirect").tcp);
    let c = redirect("[\"udp\"]").expect("valid");
    assert!(!c.redirect.expect("redirect").tcp);
    for bad in ["[\"tcp\"]", "[\"udp\", \"sctp\"]", "[\"udp\", \"tls\"]"] {
        let e = redirect(bad).expect_err(bad);
        assert!(e.to_string().contains("redirect."), "{e}");
    }
    // "tls" needs its listener and [sip.tls]'s certificate.
    let e = parse(
        "[redirect]\nlisten = \"127.0.0.1:5062\"\ntransports = [\"udp\", \"tls\"]\ntls_listen = \"127.0.0.1:5063\"\n",
        "s",
    )
    .expect_err("no [sip.tls]");
    assert!(e.to_string().contains("[sip.tls]"), "{e}");
    let c = parse(
        "[sip]\ntransports = [\"udp\", \"tls\"]\n[sip.tls]\ncert = \"c\"\nkey = \"k\"\n\
         [redirect]\nlisten = \"127.0.0.1:5062\"\ntransports = [\"udp\", \"tls\"]\ntls_listen = \"127.0.0.1:5063\"\n",
        "s",
    )
    .expect("valid");
    assert_eq!(
        c.redirect.expect("redirect").tls_listen,
        Some("127.0.0.1:5063".parse().expect("addr"))
    );
}

#[test]
fn the_password_is_not_printed_in_debug() {
    let a = Account {
        auth_name: "msr".into(),
        password: "msr-secret".into(),
        msrs: vec![],
    };
    assert!(!format!("{a:?}").contains("msr-secret"));
}

#[test]
fn the_etcd_example_parses_with_its_documented_values() {
    let c = load(&examples_dir().join("collector-etcd.toml")).expect("etcd example is valid");
    let StoreBackend::Etcd(etcd) = &c.store else {
        panic!("{:?}", c.store)
    };
    assert_eq!(etcd.endpoints, vec!["http://127.0.0.1:2379".to_owned()]);
    assert_eq!(etcd.prefix, DEFAULT_ETCD_PREFIX);
    assert_eq!(etcd.lease_ttl, Duration::from_secs(10));
    assert_eq!(etcd.request_timeout, Duration::from_millis(2000));
    assert_eq!((etcd.user.clone(), etcd.tls.clone()), (None, None));
    assert_eq!(c.cluster.core_hosts, 1);
    let injected = std::fs::read_to_string(examples_dir().join("collector-etcd.toml"))
        .expect("example")
        .replacen("[store]", "[store]\nbogus_key = 1", 1);
    assert!(parse(&injected, "x.toml").is_err());
}

#[test]
fn the_file_store_is_the_default() {
    let c = parse("", "<string>").expect("valid");
    assert_eq!(c.store, StoreBackend::File);
    assert_eq!(c.cluster.core_hosts, 1);
}

#[test]
fn etcd_with_tls_and_a_user() {
    let c = parse(
        "[store]\nbackend = \"etcd\"\nendpoints = [\"https://etcd1:2379\", \"https://10.0.0.2:2379\"]\n\
         user = \"msr\"\npassword = \"s3cret\"\n[store.tls]\nca = \"/ca.pem\"\ncert = \"/c.pem\"\nkey = \"/k.pem\"\n",
        "s",
    )
    .expect("valid");
    let StoreBackend::Etcd(etcd) = &c.store else {
        panic!("{:?}", c.store)
    };
    assert_eq!(etcd.user, Some(("msr".into(), "s3cret".into())));
    let tls = etcd.tls.as_ref().expect("tls");
    assert_eq!(tls.ca, PathBuf::from("/ca.pem"));
    assert!(tls.identity.is_some());
    assert!(
        !format!("{etcd:?}").contains("s3cret"),
        "the password is redacted"
    );
    let mixed = parse(
        "[store]\nbackend = \"etcd\"\nendpoints = [\"https://a:2379\", \"http://b:2379\"]\n[store.tls]\nca = \"/ca\"\n",
        "s",
    )
    .expect_err("mixed schemes");
    assert!(mixed.to_string().contains("store.endpoints[1]"), "{mixed}");
    let key_only = parse(
        "[store]\nbackend = \"etcd\"\nendpoints = [\"https://a:2379\"]\n[store.tls]\nca = \"/ca\"\nkey = \"/k\"\n",
        "s",
    )
    .expect_err("key without cert");
    assert!(key_only.to_string().contains("store.tls.key"), "{key_only}");
}

/// SPEC §16: a reload logs each value it changed under its file key, with
/// the file's units, and never a password.
#[test]
fn reload_changes_name_each_key_as_the_file_does() {
    let text = |extra: &str| {
        format!(
            "node = \"n\"\n[sip]\nlisten = \"127.0.0.1:0\"\n[[accounts]]\nauth_name = \"msr\"\npassword = \"p1\"\n{extra}"
        )
    };
    let running = parse(&text(""), "a").expect("valid");
    let new = parse(
        &text("[health]\nfailure_hold_secs = 30\nkeepalive_timeout_ms = 700\n[legs]\nnew_conference_threshold = 40\n"),
        "b",
    )
    .expect("valid");
    let changes = reload_changes(&running, &new);
    let keys: Vec<String> = changes
        .iter()
        .map(|(k, from, to)| format!("{k} {from} -> {to}"))
        .collect();
    assert_eq!(
        keys,
        [
            "health.keepalive_timeout_ms 2000 -> 700",
            "health.failure_hold_secs 10 -> 30",
            "legs.new_conference_threshold 50 -> 40"
        ]
    );
    let other_password = parse(&text("").replace("p1", "p2"), "c").expect("valid");
    let changes = reload_changes(&running, &other_password);
    assert_eq!(changes.len(), 1);
    assert!(!format!("{changes:?}").contains("p2"), "{changes:?}");
}

/// Issue 44: the table is found under a header with a comment too.
#[test]
fn a_negative_number_under_a_commented_header_names_its_key() {
    let err = parse("[health] # probes\nkeepalive_misses = -3\n", "f.toml").expect_err("negative");
    assert_eq!(
        err.to_string(),
        "f.toml:2:20: `health.keepalive_misses` = -3: expected 1 to 100"
    );
}

/// Two listeners of one protocol on one port of overlapping addresses
/// cannot both bind: the file is refused, naming both keys; different
/// protocols, different addresses or port 0 are fine.
#[test]
fn listeners_that_would_share_a_port_are_refused() {
    let base = "[sip]\nlisten = \"127.0.0.1:5060\"\nrealm = \"r\"\n[[accounts]]\nauth_name = \"a\"\npassword = \"p\"\n";
    let err = parse(
        &format!("{base}[http]\nlisten = \"127.0.0.1:5062\"\n[redirect]\nlisten = \"127.0.0.1:5062\"\ntransports = [\"udp\", \"tcp\"]\n"),
        "f.toml",
    )
    .expect_err("http and the redirect's tcp on one port");
    assert!(
        err.to_string().contains("`redirect.listen` = \"127.0.0.1:5062\": expected a tcp port no other listener of this file takes (http.listen = \"127.0.0.1:5062\" has it)"),
        "{err}"
    );
    // An unspecified address takes the port on every address.
    let err = parse(
        &format!("{base}[http]\nlisten = \"0.0.0.0:5062\"\ntoken = \"0123456789abcdefXYZ\"\n[redirect]\nlisten = \"127.0.0.1:5062\"\ntransports = [\"udp\", \"tcp\"]\n"),
        "f.toml",
    )
    .expect_err("a wildcard and a specific address on one port");
    assert!(err.to_string().contains("no other listener"), "{err}");
    // The redirect on udp beside http on tcp, the same port: fine.
    assert!(parse(
        &format!(
            "{base}[http]\nlisten = \"127.0.0.1:5062\"\n[redirect]\nlisten = \"127.0.0.1:5062\"\n"
        ),
        "f.toml",
    )
    .is_ok());
    // Port 0 is the system's to pick.
    assert!(parse(
        &format!("{base}[http]\nlisten = \"127.0.0.1:0\"\n[redirect]\nlisten = \"127.0.0.1:0\"\ntransports = [\"udp\", \"tcp\"]\n"),
        "f.toml",
    )
    .is_ok());
}

/// A path that is not a config (a device, a huge file) is refused after
/// reading at most the limit, not read for ever.
#[test]
fn a_file_larger_than_any_config_is_refused_unread() {
    let err = load(Path::new("/dev/zero")).expect_err("/dev/zero");
    assert!(
        matches!(err, ConfigError::TooLarge { limit, .. } if limit == MAX_CONFIG_BYTES),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("/dev/zero: the file has more than 4194304 bytes"),
        "{err}"
    );
}
