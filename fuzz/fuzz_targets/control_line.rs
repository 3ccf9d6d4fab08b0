//! Fuzz target `control_line`: see [`msr_fuzz::control_line`].
fn main() {
    afl::fuzz!(|data: &[u8]| msr_fuzz::control_line(data));
}
