//! Fuzz target `collector_config`: see [`msr_fuzz::collector_config`].
fn main() {
    afl::fuzz!(|data: &[u8]| msr_fuzz::collector_config(data));
}
