//! Host CPU utilisation (SPEC §2 `load-sensor="cpu"`): the global usage over
//! the window between two calls to [`CpuSensor::sample`], via `sysinfo`.

use sysinfo::System;

/// Samples the host's global CPU usage. The sampling window is the time
/// between two calls to [`CpuSensor::sample`] (the agent calls it every
/// `sample-interval-ms`; `sysinfo` needs at least
/// [`sysinfo::MINIMUM_CPU_UPDATE_INTERVAL`] for a meaningful figure).
#[derive(Debug)]
pub struct CpuSensor {
    system: System,
}

impl Default for CpuSensor {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuSensor {
    /// Creates the sensor and takes the baseline measurement.
    pub fn new() -> Self {
        let mut system = System::new();
        system.refresh_cpu_usage();
        CpuSensor { system }
    }

    /// CPU utilisation in percent (0..=100) since the previous call (or since
    /// [`CpuSensor::new`]).
    pub fn sample(&mut self) -> u8 {
        self.system.refresh_cpu_usage();
        percent(self.system.global_cpu_usage())
    }
}

/// Rounds a usage figure to an integer percent, clamped to 0..=100 (NaN → 0).
pub fn percent(usage: f32) -> u8 {
    if usage.is_nan() || usage <= 0.0 {
        0
    } else if usage >= 100.0 {
        100
    } else {
        // In (0, 100): the cast cannot truncate.
        usage.round() as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_rounds_and_clamps() {
        assert_eq!(percent(0.0), 0);
        assert_eq!(percent(-3.0), 0);
        assert_eq!(percent(f32::NAN), 0);
        assert_eq!(percent(21.4), 21);
        assert_eq!(percent(21.5), 22);
        assert_eq!(percent(99.6), 100);
        assert_eq!(percent(250.0), 100);
    }

    #[test]
    fn sample_is_a_percentage() {
        let mut s = CpuSensor::new();
        std::thread::sleep(sysinfo::MINIMUM_CPU_UPDATE_INTERVAL);
        assert!(s.sample() <= 100);
    }
}
