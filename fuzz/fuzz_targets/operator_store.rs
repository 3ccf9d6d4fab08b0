//! Fuzz target `operator_store`: see [`msr_fuzz::operator_store`].
fn main() {
    afl::fuzz!(|data: &[u8]| msr_fuzz::operator_store(data));
}
