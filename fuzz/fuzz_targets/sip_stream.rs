//! Fuzz target `sip_stream`: see [`msr_fuzz::sip_stream`].
fn main() {
    afl::fuzz!(|data: &[u8]| msr_fuzz::sip_stream(data));
}
