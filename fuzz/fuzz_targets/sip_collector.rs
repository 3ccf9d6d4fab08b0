//! Fuzz target `sip_collector`: see [`msr_fuzz::sip_collector`].
fn main() {
    afl::fuzz!(|data: &[u8]| msr_fuzz::sip_collector(data));
}
