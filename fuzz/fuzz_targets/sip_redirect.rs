//! Fuzz target `sip_redirect`: see [`msr_fuzz::sip_redirect`].
fn main() {
    afl::fuzz!(|data: &[u8]| msr_fuzz::sip_redirect(data));
}
