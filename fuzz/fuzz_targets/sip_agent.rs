//! Fuzz target `sip_agent`: see [`msr_fuzz::sip_agent`].
fn main() {
    afl::fuzz!(|data: &[u8]| msr_fuzz::sip_agent(data));
}
