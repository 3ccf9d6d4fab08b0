use proptest::prelude::*;

use super::*;

fn enc(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode(v, &mut out);
    out
}

fn problem(input: &[u8]) -> (usize, Problem) {
    match decode(input) {
        Ok(v) => panic!("{:?} decoded to {v:?}", String::from_utf8_lossy(input)),
        Err(e) => (e.offset, e.problem),
    }
}

#[test]
fn encodes_the_ng_ping_as_rtpengine_documents_it() {
    let ping = Value::Dict(vec![(b"command".to_vec(), Value::text("ping"))]);
    assert_eq!(enc(&ping), b"d7:command4:pinge");
}

#[test]
fn dictionary_keys_are_written_sorted() {
    let v = Value::Dict(vec![
        (b"zeta".to_vec(), Value::Int(-3)),
        (
            b"alpha".to_vec(),
            Value::List(vec![Value::Int(0), Value::text("")]),
        ),
    ]);
    assert_eq!(enc(&v), b"d5:alphali0e0:e4:zetai-3ee");
}

#[test]
fn decodes_an_rtpengine_statistics_reply_with_unsorted_keys() -> Result<(), DecodeError> {
    let reply = b"d10:statisticsd17:currentstatisticsd11:sessionsowni7e15:sessionsforeigni0e13:sessionstotali7ee15:totalstatisticsd6:uptime2:18ee6:result2:oke";
    let v = decode(reply)?;
    assert_eq!(v.get("result").and_then(Value::as_str), Some("ok"));
    let current = v.get("statistics").and_then(|s| s.get("currentstatistics"));
    assert_eq!(
        current
            .and_then(|c| c.get("sessionsown"))
            .and_then(Value::as_int),
        Some(7)
    );
    assert_eq!(
        v.get("statistics")
            .and_then(|s| s.get("totalstatistics"))
            .and_then(|t| t.get("uptime"))
            .and_then(Value::as_str),
        Some("18")
    );
    Ok(())
}

#[test]
fn the_first_of_two_equal_keys_is_read() -> Result<(), DecodeError> {
    let v = decode(b"d1:ai1e1:ai2ee")?;
    assert_eq!(v.get("a"), Some(&Value::Int(1)));
    assert_eq!(v.get("b"), None);
    assert_eq!(Value::Int(1).get("a"), None);
    Ok(())
}

#[test]
fn integers_must_be_canonical_and_fit_64_bits() -> Result<(), DecodeError> {
    assert_eq!(decode(b"i0e")?, Value::Int(0));
    assert_eq!(decode(b"i-42e")?, Value::Int(-42));
    assert_eq!(decode(b"i9223372036854775807e")?, Value::Int(i64::MAX));
    assert_eq!(decode(b"i-9223372036854775808e")?, Value::Int(i64::MIN));
    for bad in [
        &b"ie"[..],
        b"i-e",
        b"i-0e",
        b"i03e",
        b"i1.5e",
        b"i+1e",
        b"i 1e",
        b"i9223372036854775808e",
    ] {
        assert_eq!(problem(bad), (1, Problem::BadInteger), "{bad:?}");
    }
    Ok(())
}

#[test]
fn bad_input_names_the_problem_and_its_offset() {
    assert_eq!(problem(b""), (0, Problem::Truncated));
    assert_eq!(problem(b"i12"), (3, Problem::Truncated));
    assert_eq!(problem(b"5:abc"), (0, Problem::BadLength));
    assert_eq!(
        problem(b"99999999999999999999999:a"),
        (0, Problem::BadLength)
    );
    assert_eq!(problem(b"4"), (1, Problem::Truncated));
    assert_eq!(problem(b"l"), (1, Problem::Truncated));
    assert_eq!(problem(b"d3:key"), (6, Problem::Truncated));
    assert_eq!(problem(b"di1ei2ee"), (1, Problem::KeyNotString));
    assert_eq!(problem(b"x"), (0, Problem::Unexpected));
    assert_eq!(problem(b"i1ei2e"), (3, Problem::Trailing));
    assert_eq!(problem(b"-1:"), (0, Problem::Unexpected));
}

#[test]
fn nesting_is_bounded() {
    let deep = |n: usize| {
        let mut v = vec![b'l'; n];
        v.extend(std::iter::repeat_n(b'e', n));
        v
    };
    assert!(decode(&deep(MAX_DEPTH)).is_ok());
    assert_eq!(problem(&deep(MAX_DEPTH + 1)), (MAX_DEPTH, Problem::TooDeep));
    // A datagram of opening brackets is refused at the bound, not after
    // recursing through all of it.
    assert_eq!(problem(&[b'l'; 65_536]), (MAX_DEPTH, Problem::TooDeep));
}

#[test]
fn error_messages_say_what_and_where() {
    let e = DecodeError {
        offset: 3,
        problem: Problem::Truncated,
    };
    assert_eq!(
        e.to_string(),
        "bencode: input ends inside a value at byte 3"
    );
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(Value::Int),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(Value::Bytes),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::List),
            proptest::collection::btree_map(
                proptest::collection::vec(any::<u8>(), 0..8),
                inner,
                0..6
            )
            .prop_map(|m| Value::Dict(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn values_round_trip(v in value()) {
        prop_assert_eq!(decode(&enc(&v)), Ok(v));
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn every_truncation_of_a_value_is_refused(v in value(), cut in any::<prop::sample::Index>()) {
        let bytes = enc(&v);
        let at = cut.index(bytes.len());
        prop_assert!(decode(&bytes[..at]).is_err());
    }
}
