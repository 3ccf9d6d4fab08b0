//! The log filter both daemons start from (their `-v`/`-q` flags).
//!
//! rsipstack logs every datagram it sends or receives at `info`, raw message
//! included; at our `info` that would drown the lines an operator reads, so
//! the stack is held one level below ours until `-vv`.

/// The `tracing_subscriber::EnvFilter` directive for a verbosity:
/// `-2` errors only, `-1` warnings, `0` info (default), `1` debug, `2+` trace.
/// `RUST_LOG`, when set, replaces it.
pub fn filter_directive(verbosity: i8) -> &'static str {
    match verbosity {
        i8::MIN..=-2 => "error",
        -1 => "warn",
        0 => "info,rsipstack=warn",
        1 => "debug,rsipstack=info",
        // notify (the agent's config watcher) traces every inotify event,
        // including writes to a log file next to the config: a feedback loop.
        _ => "trace,notify=info",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn default_keeps_the_stack_quiet() {
        assert_eq!(super::filter_directive(0), "info,rsipstack=warn");
        assert_eq!(super::filter_directive(-5), "error");
        assert_eq!(super::filter_directive(9), "trace,notify=info");
    }
}
