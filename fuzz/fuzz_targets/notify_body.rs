//! Fuzz target `notify_body`: see [`msr_fuzz::notify_body`].
fn main() {
    afl::fuzz!(|data: &[u8]| msr_fuzz::notify_body(data));
}
