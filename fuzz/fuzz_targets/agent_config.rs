//! Fuzz target `agent_config`: see [`msr_fuzz::agent_config`].
fn main() {
    afl::fuzz!(|data: &[u8]| msr_fuzz::agent_config(data));
}
