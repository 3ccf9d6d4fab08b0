//! SPEC §15 in virtual time, the agent's core and the collector's core
//! together: what the MSR takes travels in its NOTIFYs, a changed `<codec>`
//! reaches the core at once, and the core's selection follows it.

use std::time::Duration;

use msr_shared::admin::{ErrorCode, Request, Response, ResponseData, SelectQuery};
use system_tests::pair::{Pair, PairConfig};

/// The answer to a select for a leg offering `codecs`: the chosen MSR, or
/// the refusal's code.
fn select(p: &mut Pair, codecs: &[&str]) -> Result<String, ErrorCode> {
    let request = Request::Select(SelectQuery {
        codecs: codecs.iter().map(|c| (*c).to_owned()).collect(),
        ..SelectQuery::new("default", "local")
    });
    match p.ask(request) {
        Response::Ok(ResponseData::Selected(s)) => Ok(s.msr),
        Response::Err(e) => Err(e.code),
        Response::Ok(other) => panic!("{other:?}"),
    }
}

#[test]
fn a_codec_change_reaches_the_core_at_once_and_selection_follows_it() {
    let mut p = Pair::new(PairConfig::default(), 10);
    let live = p.run_until(Duration::from_secs(1), |p| p.last_load().map(|_| ()));
    assert!(live.is_some(), "not live:\n{}", p.dump());
    // An agent that says nothing of its codecs: its MSR takes any offer.
    assert_eq!(select(&mut p, &["h264"]), Ok("msr_1".into()));

    // `<codec pcma="1" pcmu="2"/>` reloaded: one NOTIFY carries it at
    // once (the rate limit does not hold it), and the core refuses video.
    let before = p.loads().len();
    p.reconfigure_agent(|c| c.codecs = Some(r#"pcma="1" pcmu="2""#.into()));
    let seen = p.run_until(Duration::from_millis(100), |p| {
        p.loads()
            .get(before..)
            .and_then(|new| new.iter().find(|(_, r)| r.codecs.is_some()).map(|_| ()))
    });
    assert!(
        seen.is_some(),
        "the codecs did not reach the core:\n{}",
        p.dump()
    );
    assert_eq!(
        select(&mut p, &["pcmu", "h264"]),
        Err(ErrorCode::NoCapableMsr)
    );
    assert_eq!(select(&mut p, &["g729", "pcmu"]), Ok("msr_1".into()));
}
