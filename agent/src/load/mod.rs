//! Load sensing (SPEC §2, §4): host CPU, media sessions ("calls") and the
//! `load` figure chosen by `<general load-sensor>` that goes into NOTIFY
//! bodies.
//!
//! [`LoadSampler::sample`] never fails: when the `proc` or `file:` source
//! cannot be read the last known count is kept and a warning is logged (once
//! per failure streak), so a transient `/proc` or file problem does not stop
//! NOTIFYs. The `rtpengine` source is the engine itself: its count comes
//! with each sample from the shell's ng exchange ([`rtpengine`]); an
//! engine that does not answer keeps its last count while that exchange is
//! the engine probe (the NOTIFY says `engine: down` instead, SPEC §14), and
//! is reported full when the probe is off ([`EngineSessions`]).

pub mod cpu;
pub mod rtpengine;
pub mod sessions;

use crate::config::{
    AgentSettings, CallsSource, EngineProbeMode, General, LoadSensor, MediaConfig,
};

pub use cpu::CpuSensor;
pub use sessions::{count_rtp_sockets, parse_calls_file};

/// One load sample, as carried in a NOTIFY body (SPEC §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// `load`: 0..=100, chosen by `load-sensor` (see [`compute_load`]).
    pub load: u8,
    /// `cpu`: host CPU utilisation in percent over the last sampling window.
    pub cpu: u8,
    /// `calls`: media sessions in use.
    pub calls: u32,
    /// `max-calls`: configured capacity in media sessions.
    pub max_calls: u32,
}

/// The `load` figure (percent, 0..=100) for `sensor` (SPEC §2):
///
/// * `cpu` → `cpu` (clamped to 100);
/// * `calls` → `100 × calls / max_calls`, rounded down, clamped to 100
///   (`max_calls == 0` counts as full if there is any call, else 0);
/// * `media` → the larger of the two.
pub fn compute_load(sensor: LoadSensor, cpu: u8, calls: u32, max_calls: u32) -> u8 {
    let cpu = cpu.min(100);
    let calls_load = calls_load(calls, max_calls);
    match sensor {
        LoadSensor::Cpu => cpu,
        LoadSensor::Calls => calls_load,
        LoadSensor::Media => cpu.max(calls_load),
    }
}

fn calls_load(calls: u32, max_calls: u32) -> u8 {
    if max_calls == 0 {
        return if calls > 0 { 100 } else { 0 };
    }
    let pct = (100 * u64::from(calls)) / u64::from(max_calls);
    u8::try_from(pct.min(100)).unwrap_or(100)
}

/// What the media engine said of its sessions for one sample (the
/// `rtpengine` source, [`LoadSampler::set_engine_sessions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineSessions {
    /// The engine's own count, answered for this sample.
    Known(u32),
    /// The engine did not answer; what is reported then is
    /// [`SilentEngine`]'s choice.
    Unavailable,
}

/// What a sample of the `rtpengine` source says when the engine did not
/// answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SilentEngine {
    /// The exchange is the engine probe (`<agent engine-probe>` `auto` or
    /// `ng`): the last count the engine answered (0 before any) is kept,
    /// and the NOTIFY says `engine: down` once the probe's misses are
    /// reached (SPEC §14). The collector takes a `down` engine out of
    /// selection and keeps its live legs; a fake "full" would instead
    /// read as a real load figure.
    KeepLastCount,
    /// No probe says so (`engine-probe="off"`): the MSR is reported full,
    /// `load` 100 and `calls` = `max-calls`, whatever the sensor, since a
    /// leg sent to a relay that does not answer its control port fails
    /// and selection takes no full MSR (SPEC §4, §7, §9).
    ReportFull,
}

impl SilentEngine {
    /// The choice for `agent`'s settings.
    pub fn for_settings(agent: &AgentSettings) -> Self {
        match agent.engine_probe {
            EngineProbeMode::Auto | EngineProbeMode::Ng => SilentEngine::KeepLastCount,
            EngineProbeMode::Sip | EngineProbeMode::Off => SilentEngine::ReportFull,
        }
    }
}

/// Samples CPU and media sessions and computes `load` (SPEC §2).
#[derive(Debug)]
pub struct LoadSampler {
    sensor: LoadSensor,
    max_calls: u32,
    media: MediaConfig,
    source: CallsSource,
    cpu: CpuSensor,
    last_calls: u32,
    failing: bool,
    engine: EngineSessions,
    silent: SilentEngine,
}

impl LoadSampler {
    /// Creates a sampler for the given config sections. The CPU window of the
    /// first [`LoadSampler::sample`] starts now.
    pub fn new(media: &MediaConfig, general: &General, agent: &AgentSettings) -> Self {
        LoadSampler {
            sensor: general.load_sensor,
            max_calls: general.max_calls,
            media: *media,
            source: agent.calls_source.clone(),
            cpu: CpuSensor::new(),
            last_calls: 0,
            failing: false,
            engine: EngineSessions::Unavailable,
            silent: SilentEngine::for_settings(agent),
        }
    }

    /// Applies a reloaded config, keeping the CPU baseline and the last
    /// calls count.
    pub fn reconfigure(&mut self, media: &MediaConfig, general: &General, agent: &AgentSettings) {
        self.sensor = general.load_sensor;
        self.max_calls = general.max_calls;
        self.media = *media;
        self.source = agent.calls_source.clone();
        self.silent = SilentEngine::for_settings(agent);
    }

    /// What the engine answered for the next sample (the `rtpengine`
    /// source; ignored by the others).
    pub fn set_engine_sessions(&mut self, engine: EngineSessions) {
        self.engine = engine;
    }

    /// Takes a sample: CPU over the window since the previous call, the
    /// current calls count (the last known one if the source cannot be read)
    /// and the resulting `load`.
    pub fn sample(&mut self) -> Sample {
        let cpu = self.cpu.sample();
        if self.source == CallsSource::Rtpengine {
            let calls = match (self.engine, self.silent) {
                (EngineSessions::Known(n), _) => {
                    self.last_calls = n;
                    n
                }
                (EngineSessions::Unavailable, SilentEngine::KeepLastCount) => self.last_calls,
                (EngineSessions::Unavailable, SilentEngine::ReportFull) => {
                    return Sample {
                        load: 100,
                        cpu,
                        calls: self.max_calls,
                        max_calls: self.max_calls,
                    };
                }
            };
            return Sample {
                load: compute_load(self.sensor, cpu, calls, self.max_calls),
                cpu,
                calls,
                max_calls: self.max_calls,
            };
        }
        let calls = self.read_calls();
        Sample {
            load: compute_load(self.sensor, cpu, calls, self.max_calls),
            cpu,
            calls,
            max_calls: self.max_calls,
        }
    }

    fn read_calls(&mut self) -> u32 {
        let result = match &self.source {
            CallsSource::Fixed(n) => Ok(*n),
            CallsSource::ProcNetUdp => {
                sessions::read_proc_calls(self.media.port_start, self.media.port_range)
            }
            CallsSource::File(path) => sessions::read_calls_file(path),
            CallsSource::Rtpengine => return self.last_calls,
        };
        match result {
            Ok(n) => {
                if self.failing {
                    tracing::info!(source = %self.source, calls = n, "calls source readable again");
                    self.failing = false;
                }
                self.last_calls = n;
            }
            Err(e) => {
                if !self.failing {
                    tracing::warn!(
                        source = %self.source,
                        error = %e,
                        calls = self.last_calls,
                        "cannot read calls source, keeping last count"
                    );
                    self.failing = true;
                }
            }
        }
        self.last_calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CallsSource, General};

    #[test]
    fn compute_load_by_sensor() {
        assert_eq!(compute_load(LoadSensor::Cpu, 21, 303, 8192), 21);
        // 100 * 303 / 8192 = 3.69 → 3
        assert_eq!(compute_load(LoadSensor::Calls, 21, 303, 8192), 3);
        assert_eq!(compute_load(LoadSensor::Media, 21, 303, 8192), 21);
        assert_eq!(compute_load(LoadSensor::Media, 10, 50, 100), 50);
        assert_eq!(compute_load(LoadSensor::Calls, 0, 0, 100), 0);
        assert_eq!(compute_load(LoadSensor::Calls, 0, 99, 100), 99);
        assert_eq!(compute_load(LoadSensor::Calls, 0, 100, 100), 100);
        assert_eq!(compute_load(LoadSensor::Calls, 0, 250, 100), 100);
        assert_eq!(compute_load(LoadSensor::Calls, 0, u32::MAX, 1), 100);
        assert_eq!(compute_load(LoadSensor::Cpu, 200, 0, 100), 100);
        assert_eq!(compute_load(LoadSensor::Calls, 0, 1, 0), 100);
        assert_eq!(compute_load(LoadSensor::Calls, 0, 0, 0), 0);
        // 100 * 1 / 3 = 33
        assert_eq!(compute_load(LoadSensor::Calls, 0, 1, 3), 33);
    }

    fn general(sensor: LoadSensor) -> General {
        General {
            log_level: None,
            max_calls: 100,
            load_sensor: sensor,
            load_delta: 5,
        }
    }

    #[test]
    fn sampler_fixed_source() {
        let media = MediaConfig {
            port_start: 20000,
            port_range: 1000,
            video_enc_width: None,
            video_enc_height: None,
        };
        let agent = AgentSettings {
            calls_source: CallsSource::Fixed(42),
            ..AgentSettings::default()
        };
        let mut s = LoadSampler::new(&media, &general(LoadSensor::Calls), &agent);
        let sample = s.sample();
        assert_eq!(sample.calls, 42);
        assert_eq!(sample.max_calls, 100);
        assert_eq!(sample.load, 42);
        assert!(sample.cpu <= 100);
    }

    #[test]
    fn sampler_file_source_keeps_last_value_on_error() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("calls");
        std::fs::write(&file, "7\n")?;
        let media = MediaConfig {
            port_start: 20000,
            port_range: 1000,
            video_enc_width: None,
            video_enc_height: None,
        };
        let agent = AgentSettings {
            calls_source: CallsSource::File(file.clone()),
            ..AgentSettings::default()
        };
        let mut s = LoadSampler::new(&media, &general(LoadSensor::Calls), &agent);
        assert_eq!(s.sample().calls, 7);
        std::fs::write(&file, "not a number")?;
        assert_eq!(s.sample().calls, 7);
        std::fs::remove_file(&file)?;
        assert_eq!(s.sample().calls, 7);
        std::fs::write(&file, "12")?;
        assert_eq!(s.sample().calls, 12);
        Ok(())
    }

    #[test]
    fn sampler_rtpengine_source_reports_the_answer_or_full() {
        let media = MediaConfig {
            port_start: 20000,
            port_range: 1000,
            video_enc_width: None,
            video_enc_height: None,
        };
        let agent = AgentSettings {
            calls_source: CallsSource::Rtpengine,
            engine_probe: EngineProbeMode::Off,
            ..AgentSettings::default()
        };
        let mut s = LoadSampler::new(&media, &general(LoadSensor::Calls), &agent);
        // Before the first answer the engine is not known to relay anything.
        let first = s.sample();
        assert_eq!((first.load, first.calls, first.max_calls), (100, 100, 100));
        s.set_engine_sessions(EngineSessions::Known(37));
        let known = s.sample();
        assert_eq!((known.load, known.calls), (37, 37));
        // No answer: full again, not the last good 37.
        s.set_engine_sessions(EngineSessions::Unavailable);
        let gone = s.sample();
        assert_eq!((gone.load, gone.calls), (100, 100));
        // Whatever the sensor.
        let mut cpu = LoadSampler::new(&media, &general(LoadSensor::Cpu), &agent);
        assert_eq!(cpu.sample().load, 100);
        cpu.set_engine_sessions(EngineSessions::Known(99));
        let sample = cpu.sample();
        assert_eq!(sample.calls, 99);
        assert!(sample.load <= 100);
    }

    #[test]
    fn sampler_rtpengine_source_keeps_the_last_count_while_the_exchange_is_the_probe() {
        let media = MediaConfig {
            port_start: 20000,
            port_range: 1000,
            video_enc_width: None,
            video_enc_height: None,
        };
        let agent = AgentSettings {
            calls_source: CallsSource::Rtpengine,
            ..AgentSettings::default()
        };
        let mut s = LoadSampler::new(&media, &general(LoadSensor::Calls), &agent);
        // Nothing answered yet: 0 calls, not full.
        assert_eq!(s.sample().calls, 0);
        s.set_engine_sessions(EngineSessions::Known(37));
        assert_eq!(s.sample().calls, 37);
        // The probe says `engine: down`; the count stays the last answered.
        s.set_engine_sessions(EngineSessions::Unavailable);
        let gone = s.sample();
        assert_eq!((gone.load, gone.calls, gone.max_calls), (37, 37, 100));
    }

    #[test]
    fn sampler_proc_source_counts_bound_sockets() -> Result<(), Box<dyn std::error::Error>> {
        if !std::path::Path::new(sessions::PROC_NET_UDP).exists() {
            return Ok(());
        }
        // Find a free even port pair region by binding an even port.
        let mut held = Vec::new();
        let mut even = None;
        for _ in 0..20 {
            let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
            let port = s.local_addr()?.port();
            held.push(s);
            if port % 2 == 0 {
                even = Some(port);
                break;
            }
        }
        let Some(port) = even else { return Ok(()) };
        let media = MediaConfig {
            port_start: port,
            port_range: 1,
            video_enc_width: None,
            video_enc_height: None,
        };
        let mut s = LoadSampler::new(
            &media,
            &general(LoadSensor::Calls),
            &AgentSettings::default(),
        );
        assert_eq!(s.sample().calls, 1);
        Ok(())
    }
}
