//! `msrctl`: the admin CLI of msr-collector (SPEC §8). See
//! [`msr_collector::msrctl`] for commands and exit codes.

fn main() {
    std::process::exit(msr_collector::msrctl::run(std::env::args_os().collect()));
}
