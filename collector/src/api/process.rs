//! The collector's own process, read from `/proc/self` at each scrape of
//! `GET /metrics` (SPEC §13): CPU time, resident memory, open and allowed
//! file descriptors and the start time, under the names every Prometheus
//! client library uses (`process_*`), so the usual dashboards work.
//!
//! Nothing is sampled in the background: a scrape reads five small files.
//! A file that cannot be read (not Linux, a hardened `/proc`) leaves its
//! series out; the scrape still answers.

use std::fs;
use std::path::Path;

/// What one scrape read; `None` where `/proc` did not tell.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStats {
    /// User and system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, bytes.
    pub resident_bytes: Option<u64>,
    /// Virtual memory size, bytes.
    pub virtual_bytes: Option<u64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit on open file descriptors (`RLIMIT_NOFILE`).
    pub max_fds: Option<u64>,
    /// Start time, Unix seconds.
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// This process, now.
    pub fn read() -> Self {
        let ticks = rustix::param::clock_ticks_per_second();
        let boot = fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        let mut stats = fs::read_to_string("/proc/self/stat")
            .ok()
            .map(|s| from_stat(&s, ticks, boot))
            .unwrap_or_default();
        stats.resident_bytes = fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| status_kib(&s, "VmRSS:"))
            .map(|kib| kib * 1024);
        stats.open_fds = count_entries(Path::new("/proc/self/fd"));
        stats.max_fds = fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|s| max_open_files(&s));
        stats
    }
}

/// CPU time, virtual size and start time from `/proc/self/stat` (proc(5)):
/// fields after the parenthesised command name, which may hold spaces.
fn from_stat(stat: &str, ticks_per_second: u64, boot_unix: Option<u64>) -> ProcessStats {
    let Some((_, after)) = stat.rsplit_once(')') else {
        return ProcessStats::default();
    };
    // `after` starts at field 3 (state); proc(5) numbers fields from 1.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let ticks = ticks_per_second.max(1) as f64;
    let cpu = match (field(14), field(15)) {
        (Some(utime), Some(stime)) => Some((utime + stime) as f64 / ticks),
        _ => None,
    };
    let start = match (field(22), boot_unix) {
        (Some(since_boot), Some(boot)) => Some(boot as f64 + since_boot as f64 / ticks),
        _ => None,
    };
    ProcessStats {
        cpu_seconds: cpu,
        virtual_bytes: field(23),
        start_time_seconds: start,
        ..ProcessStats::default()
    }
}

/// The `btime` line of `/proc/stat`: the boot time, Unix seconds.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// A `kB` line of `/proc/self/status`, e.g. `VmRSS:     1234 kB`.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The soft limit of the `Max open files` line of `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn count_entries(dir: &Path) -> Option<u64> {
    fs::read_dir(dir).ok().map(|entries| entries.count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_gives_cpu_time_virtual_size_and_start_even_with_spaces_in_the_name() {
        let stat = "4242 (msr collector) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 9 0 1000 123456789 2000 18446744073709551615";
        let stats = from_stat(stat, 100, Some(1_700_000_000));
        assert_eq!(stats.cpu_seconds, Some(3.0));
        assert_eq!(stats.virtual_bytes, Some(123_456_789));
        assert_eq!(stats.start_time_seconds, Some(1_700_000_010.0));
    }

    #[test]
    fn status_limits_and_proc_stat_are_read_by_their_keys() {
        assert_eq!(
            status_kib("Name:\tx\nVmRSS:\t  2048 kB\n", "VmRSS:"),
            Some(2048)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(
            boot_time("cpu 1 2 3\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let stats = ProcessStats::read();
        assert!(stats.resident_bytes.is_some_and(|b| b > 0), "{stats:?}");
        assert!(stats.open_fds.is_some_and(|n| n >= 3), "{stats:?}");
        assert!(stats.max_fds.is_some(), "{stats:?}");
        assert!(stats.cpu_seconds.is_some(), "{stats:?}");
        assert!(
            stats.start_time_seconds.is_some_and(|t| t > 1.0e9),
            "{stats:?}"
        );
    }
}
