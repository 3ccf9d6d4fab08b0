use super::*;

#[test]
fn error_codes_map_to_fitting_statuses() {
    for (code, status) in [
        (ErrorCode::BadRequest, 400),
        (ErrorCode::InvalidValue, 400),
        (ErrorCode::UnknownSite, 400),
        (ErrorCode::Conflict, 409),
        (ErrorCode::SiteInUse, 409),
        (ErrorCode::MsrNotFound, 503),
        (ErrorCode::MsrOverloaded, 503),
        (ErrorCode::MsrUnhealthy, 503),
        (ErrorCode::Unavailable, 503),
        (ErrorCode::StoreUnavailable, 503),
        (ErrorCode::StoreFailed, 500),
    ] {
        assert_eq!(status_of(code).as_u16(), status, "{code}");
    }
}

#[test]
fn a_select_query_becomes_the_select_op() {
    let request = select_request(Some(
        "zone=default&site=local&msr=msr_2&call_id=a%40b&leg=1&conference=room&random=5&explain=true",
    ))
    .expect("valid");
    assert_eq!(
        request,
        Request::Select {
            zone: "default".into(),
            site: "local".into(),
            msr: Some("msr_2".into()),
            random: Some(5.0),
            explain: true,
            call_id: Some("a@b".into()),
            leg: Some("1".into()),
            conference: Some("room".into()),
        }
    );
}

#[test]
fn bad_select_queries_are_refused_with_the_reason() {
    for (query, needle) in [
        (None, "missing field `zone`"),
        (Some("zone=a"), "missing field `site`"),
        (Some("zone=a&site=b&colour=red"), "unknown field `colour`"),
        (Some("zone=a&site=b&zone=c"), "duplicate field `zone`"),
        (Some("zone=a&site=b&random=x"), "invalid query string"),
        (Some("zone=a&site=b&explain=maybe"), "invalid query string"),
        (Some("zone=a&site=b&leg=1"), "need call_id"),
        (Some("%zz=%%&&"), "invalid query string"),
    ] {
        let message = select_request(query).expect_err("refused");
        assert!(message.contains(needle), "{query:?}: {message}");
    }
}

#[test]
fn tokens_compare_whole() {
    assert!(constant_time_eq(b"abcdefgh", b"abcdefgh"));
    assert!(!constant_time_eq(b"abcdefgh", b"abcdefgx"));
    assert!(!constant_time_eq(b"abc", b"abcd"));
}
