//! The collector's process as `/proc` shows it (CPU ticks, RSS), sampled
//! while a benchmark runs, and the percentile helpers of the reports.

use std::time::{Duration, Instant};

pub(crate) fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(100.0)
}

/// utime + stime of a process, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A `kB` line of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in KiB.
pub(crate) fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// The pid of the `msr-collector` process owning UDP (or TCP, with
/// `tcp`) `port` (via `/proc/net` inodes and `/proc/<pid>/fd`), if any.
pub(crate) fn find_collector_pid(port: u16, tcp: bool) -> Option<u32> {
    let mut inodes = Vec::new();
    let tables = if tcp {
        ["/proc/net/tcp", "/proc/net/tcp6"]
    } else {
        ["/proc/net/udp", "/proc/net/udp6"]
    };
    for table in tables {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let Some(local) = f.get(1) else { continue };
            let Some((_, p)) = local.rsplit_once(':') else {
                continue;
            };
            if u16::from_str_radix(p, 16).ok() == Some(port) {
                if let Some(inode) = f.get(9) {
                    inodes.push(format!("socket:[{inode}]"));
                }
            }
        }
    }
    let procs = std::fs::read_dir("/proc").ok()?;
    for entry in procs.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "msr-collector" {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| target.to_string_lossy() == *i) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

#[derive(Default, Debug, Clone)]
pub(crate) struct ProcSamples {
    /// CPU% per one-second sample (100 = one core).
    pub(crate) cpu: Vec<f64>,
    pub(crate) rss_kib: Vec<u64>,
    pub(crate) hwm_kib: u64,
    /// Total CPU seconds over the sampled span.
    pub(crate) cpu_secs: f64,
    pub(crate) span_secs: f64,
}

impl ProcSamples {
    pub(crate) fn avg_cpu(&self) -> f64 {
        if self.span_secs > 0.0 {
            100.0 * self.cpu_secs / self.span_secs
        } else {
            0.0
        }
    }
    pub(crate) fn max_cpu(&self) -> f64 {
        self.cpu.iter().copied().fold(0.0, f64::max)
    }
    pub(crate) fn rss_first(&self) -> u64 {
        self.rss_kib.first().copied().unwrap_or(0)
    }
    pub(crate) fn rss_last(&self) -> u64 {
        self.rss_kib.last().copied().unwrap_or(0)
    }
    pub(crate) fn rss_max(&self) -> u64 {
        self.rss_kib.iter().copied().max().unwrap_or(0)
    }
}

/// Samples `pid` once a second until `stop` is cancelled.
pub(crate) async fn sample_process(
    pid: u32,
    stop: tokio_util::sync::CancellationToken,
) -> ProcSamples {
    let hz = clock_ticks();
    let mut out = ProcSamples::default();
    let start = Instant::now();
    let first = cpu_ticks(pid).unwrap_or(0);
    let (mut last_t, mut last_ticks) = (start, first);
    if let Some(rss) = status_kib(pid, "VmRSS:") {
        out.rss_kib.push(rss);
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let Some(ticks) = cpu_ticks(pid) else { break };
        let dt = now.duration_since(last_t).as_secs_f64();
        if dt > 0.0 {
            out.cpu
                .push(100.0 * (ticks.saturating_sub(last_ticks)) as f64 / hz / dt);
        }
        last_t = now;
        last_ticks = ticks;
        if let Some(rss) = status_kib(pid, "VmRSS:") {
            out.rss_kib.push(rss);
        }
    }
    let end = Instant::now();
    if let Some(ticks) = cpu_ticks(pid) {
        last_ticks = ticks;
    }
    out.cpu_secs = last_ticks.saturating_sub(first) as f64 / hz;
    out.span_secs = end.duration_since(start).as_secs_f64();
    out.hwm_kib = status_kib(pid, "VmHWM:").unwrap_or(0);
    out
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub(crate) fn fmt_us(us: u64) -> String {
    if us >= 10_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{us} µs")
    }
}
