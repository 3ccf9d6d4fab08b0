use std::time::Duration;

use msr_shared::sip::Method;
use system_tests::pair::{Pair, PairConfig, Party};

#[test]
fn registers_subscribes_and_reports() {
    let mut p = Pair::new(PairConfig::default(), 10);
    let load = p.run_until(Duration::from_secs(1), |p| p.last_load());
    assert_eq!(load, Some(10), "{}", p.dump());
    assert_eq!(p.requests(Party::Agent, Method::Register).len(), 2);
    eprintln!("{}", p.dump());
}
