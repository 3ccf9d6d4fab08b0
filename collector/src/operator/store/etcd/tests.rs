use super::*;

#[test]
fn a_refused_connection_reads_as_a_sentence_with_a_hint() {
    let text = plain_parts(vec![
        "the service is currently unavailable".into(),
        "tcp connect error".into(),
        "transport error".into(),
        "tcp connect error".into(),
        "Connection refused (os error 111)".into(),
    ]);
    assert_eq!(
        text,
        "the service is currently unavailable: tcp connect error: Connection refused (os error 111); \
         is etcd running there, and is that its client URL ([store] endpoints)?"
    );
    let io = etcd_client::Error::IoError(std::io::Error::from(std::io::ErrorKind::TimedOut));
    assert_eq!(plain(&io), "timed out");
}

#[test]
fn keys_live_under_the_prefix() {
    let keys = Keys::new("/msr/");
    assert_eq!(keys.operator(), "/msr/operator");
    assert_eq!(keys.members(), "/msr/members/");
    assert_eq!(keys.member("core1@a"), "/msr/members/core1@a");
}

#[test]
fn a_conflict_names_both_revisions() {
    let text = CommitError::Conflict {
        expected: Some(7),
        found: Some(9),
    }
    .to_string();
    assert!(
        text.contains("revision 9") && text.contains("revision 7"),
        "{text}"
    );
    let text = CommitError::Conflict {
        expected: None,
        found: Some(3),
    }
    .to_string();
    assert!(text.contains("none (no configuration yet)"), "{text}");
}
