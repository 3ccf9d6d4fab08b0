//! The `eltex-call-count` event package (SPEC §4).
//!
//! A NOTIFY body is `Content-Type: application/x-eltex-call-count`, UTF-8,
//! one `name: value` per line:
//!
//! ```text
//! msr: msr_1
//! load: 37
//! cpu: 21
//! calls: 303
//! max-calls: 8192
//! engine: up
//! ```
//!
//! Unknown names are ignored by the reader, so the package can grow. Two
//! lines were added that way (SPEC §14): `engine: up|down|unchecked` is
//! what the agent's own probe of the media engine last saw (absent, from
//! an older agent: `unchecked`), and `service: draining` says the MSR asked
//! for no new legs (absent: `active`). `codecs: pcma,pcmu,h264,t38` (SPEC
//! §15) is what the MSR's media can take, in its priority order (`none`:
//! every codec off; absent, from an agent whose config has no `<codec>` or
//! an older agent: not known, and the collector takes it as able to take
//! anything, as before §15). `sample-age-ms: 340` (SPEC §4, §10) is how
//! long before the NOTIFY left the agent sampled what it carries: a
//! duration, not a time, so no clock needs to agree with the collector's,
//! which takes the sample as that much older than the NOTIFY's flight
//! (absent: taken at the NOTIFY's sending).

use std::fmt;

use crate::media::CodecList;

/// The event package name carried in `Event:` and `Allow-Events:`.
pub const EVENT: &str = "eltex-call-count";

/// The MIME type of a NOTIFY body, also sent in the SUBSCRIBE's `Accept:`.
pub const CONTENT_TYPE: &str = "application/x-eltex-call-count";

/// What the agent's probe of its media engine last saw (SPEC §14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EngineState {
    /// The engine answered its last probe.
    Up,
    /// The engine stopped answering its probes.
    Down,
    /// The engine is not probed (probing is off, or an older agent that
    /// does not say): taken as serving.
    #[default]
    Unchecked,
}

impl EngineState {
    /// `up`, `down` or `unchecked`: the body's and the tables' spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineState::Up => "up",
            EngineState::Down => "down",
            EngineState::Unchecked => "unchecked",
        }
    }
}

impl fmt::Display for EngineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the MSR itself takes new legs (SPEC §14, `msr-agent drain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Service {
    /// New legs welcome.
    #[default]
    Active,
    /// No new legs; the live ones stay until they end.
    Draining,
}

impl Service {
    /// `active` or `draining`.
    pub fn as_str(self) -> &'static str {
        match self {
            Service::Active => "active",
            Service::Draining => "draining",
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state of one MSR as the agent reports it in a NOTIFY.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoadReport {
    /// MSR name (`msr_name` of the agent's `<dynamic>` account).
    pub msr: String,
    /// The figure chosen by `load-sensor`, percent, 0–100 (SPEC §2).
    pub load: u8,
    /// Host CPU utilisation over the last sampling window, percent, 0–100.
    pub cpu: u8,
    /// Media sessions in use.
    pub calls: u32,
    /// Capacity in media sessions (`general/@max-calls`).
    pub max_calls: u32,
    /// The media engine's liveness as the agent's probe saw it.
    pub engine: EngineState,
    /// Whether the MSR takes new legs.
    pub service: Service,
    /// What the MSR's media can take (SPEC §15); `None`: not reported.
    pub codecs: Option<CodecList>,
    /// Milliseconds between the agent's sample and the NOTIFY's sending;
    /// `None`: not reported (taken as 0).
    pub sample_age_ms: Option<u32>,
}

/// Why a NOTIFY body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The body is not UTF-8.
    #[error("body is not utf-8")]
    NotUtf8,
    /// A line has no `:` separator.
    #[error("line {line}: expected `name: value`")]
    MalformedLine {
        /// 1-based line number.
        line: usize,
    },
    /// A required field is missing.
    #[error("missing field `{name}`")]
    Missing {
        /// The field name.
        name: &'static str,
    },
    /// A field's value is not acceptable.
    #[error("field `{name}`: invalid value `{value}` ({expected})")]
    Invalid {
        /// The field name.
        name: &'static str,
        /// The value as received.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
}

impl LoadReport {
    /// Encodes the report as a NOTIFY body (trailing newline included).
    pub fn encode(&self) -> String {
        self.to_string()
    }

    /// Decodes a NOTIFY body. Unknown names are ignored; `msr` and `load`
    /// are required, `cpu`, `calls` and `max-calls` default to 0.
    ///
    /// # Errors
    /// [`BodyError`] when the body is not UTF-8, a line is not `name: value`,
    /// a required field is missing, or a number is out of range (`load` and
    /// `cpu` must be 0–100).
    pub fn decode(body: &[u8]) -> Result<Self, BodyError> {
        let text = std::str::from_utf8(body).map_err(|_| BodyError::NotUtf8)?;
        let mut msr = None;
        let mut load = None;
        let mut cpu = 0;
        let mut calls = 0;
        let mut max_calls = 0;
        let mut engine = EngineState::Unchecked;
        let mut service = Service::Active;
        let mut codecs = None;
        let mut sample_age_ms = None;
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            let (name, value) = line
                .split_once(':')
                .ok_or(BodyError::MalformedLine { line: index + 1 })?;
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "msr" => {
                    if value.is_empty() {
                        return Err(BodyError::Invalid {
                            name: "msr",
                            value: value.to_owned(),
                            expected: "a non-empty msr name",
                        });
                    }
                    msr = Some(value.to_owned());
                }
                "load" => load = Some(percent("load", value)?),
                "cpu" => cpu = percent("cpu", value)?,
                "calls" => calls = count("calls", value)?,
                "max-calls" => max_calls = count("max-calls", value)?,
                "engine" => {
                    engine = match value.to_ascii_lowercase().as_str() {
                        "up" => EngineState::Up,
                        "down" => EngineState::Down,
                        "unchecked" => EngineState::Unchecked,
                        _ => {
                            return Err(BodyError::Invalid {
                                name: "engine",
                                value: value.to_owned(),
                                expected: "up, down or unchecked",
                            })
                        }
                    }
                }
                "service" => {
                    service = match value.to_ascii_lowercase().as_str() {
                        "active" => Service::Active,
                        "draining" => Service::Draining,
                        _ => {
                            return Err(BodyError::Invalid {
                                name: "service",
                                value: value.to_owned(),
                                expected: "active or draining",
                            })
                        }
                    }
                }
                "codecs" => codecs = Some(CodecList::parse_lenient(value)),
                "sample-age-ms" => sample_age_ms = Some(count("sample-age-ms", value)?),
                _ => {}
            }
        }
        Ok(Self {
            msr: msr.ok_or(BodyError::Missing { name: "msr" })?,
            load: load.ok_or(BodyError::Missing { name: "load" })?,
            cpu,
            calls,
            max_calls,
            engine,
            service,
            codecs,
            sample_age_ms,
        })
    }
}

fn percent(name: &'static str, value: &str) -> Result<u8, BodyError> {
    match value.parse::<u8>() {
        Ok(v) if v <= 100 => Ok(v),
        _ => Err(BodyError::Invalid {
            name,
            value: value.to_owned(),
            expected: "an integer 0-100",
        }),
    }
}

fn count(name: &'static str, value: &str) -> Result<u32, BodyError> {
    value.parse::<u32>().map_err(|_| BodyError::Invalid {
        name,
        value: value.to_owned(),
        expected: "a non-negative integer",
    })
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "msr: {}", self.msr)?;
        writeln!(f, "load: {}", self.load)?;
        writeln!(f, "cpu: {}", self.cpu)?;
        writeln!(f, "calls: {}", self.calls)?;
        writeln!(f, "max-calls: {}", self.max_calls)?;
        // The defaults are left out, so the spec's example body is what an
        // agent without a probe sends, byte for byte.
        if self.engine != EngineState::Unchecked {
            writeln!(f, "engine: {}", self.engine)?;
        }
        if self.service != Service::Active {
            writeln!(f, "service: {}", self.service)?;
        }
        if let Some(codecs) = &self.codecs {
            writeln!(f, "codecs: {codecs}")?;
        }
        if let Some(age) = self.sample_age_ms {
            writeln!(f, "sample-age-ms: {age}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decodes_the_spec_example() {
        let body = b"msr: msr_1\nload: 37\ncpu: 21\ncalls: 303\nmax-calls: 8192\n";
        let r = LoadReport::decode(body).expect("valid body");
        assert_eq!(
            r,
            LoadReport {
                msr: "msr_1".into(),
                load: 37,
                cpu: 21,
                calls: 303,
                max_calls: 8192,
                ..LoadReport::default()
            }
        );
        assert_eq!(r.encode().as_bytes(), body);
    }

    #[test]
    fn ignores_unknown_names_and_crlf() {
        let r = LoadReport::decode(b"msr: m\r\nload: 5\r\nfuture-field: x\r\n").expect("valid");
        assert_eq!(r.load, 5);
        assert_eq!(r.msr, "m");
    }

    #[test]
    fn reads_the_engine_and_service_lines() {
        let r = LoadReport::decode(b"msr: m\nload: 5\nengine: down\nservice: draining\n")
            .expect("valid");
        assert_eq!(r.engine, EngineState::Down);
        assert_eq!(r.service, Service::Draining);
        let old = LoadReport::decode(b"msr: m\nload: 5\n").expect("valid");
        assert_eq!(old.engine, EngineState::Unchecked);
        assert_eq!(old.service, Service::Active);
        assert!(matches!(
            LoadReport::decode(b"msr: m\nload: 5\nengine: maybe\n"),
            Err(BodyError::Invalid { name: "engine", .. })
        ));
    }

    #[test]
    fn reads_the_sample_age() {
        let r = LoadReport::decode(b"msr: m\nload: 5\nsample-age-ms: 340\n").expect("valid");
        assert_eq!(r.sample_age_ms, Some(340));
        assert!(r.encode().ends_with("sample-age-ms: 340\n"));
        let old = LoadReport::decode(b"msr: m\nload: 5\n").expect("valid");
        assert_eq!(old.sample_age_ms, None);
        assert!(LoadReport::decode(b"msr: m\nload: 5\nsample-age-ms: -1\n").is_err());
    }

    #[test]
    fn reads_the_codecs_line_in_priority_order() {
        let r = LoadReport::decode(b"msr: m\nload: 5\ncodecs: g722, pcma,h264,t38,future\n")
            .expect("valid");
        assert_eq!(
            r.codecs.map(|c| c.to_string()).as_deref(),
            Some("g722,pcma,h264,t38")
        );
        let none = LoadReport::decode(b"msr: m\nload: 5\ncodecs: none\n").expect("valid");
        assert!(none.codecs.is_some_and(|c| c.is_empty()));
        assert!(none.encode().ends_with("codecs: none\n"));
        let old = LoadReport::decode(b"msr: m\nload: 5\n").expect("valid");
        assert_eq!(old.codecs, None);
    }

    #[test]
    fn rejects_bad_bodies() {
        assert_eq!(
            LoadReport::decode(b"msr: m\n"),
            Err(BodyError::Missing { name: "load" })
        );
        assert!(matches!(
            LoadReport::decode(b"msr: m\nload: 101\n"),
            Err(BodyError::Invalid { name: "load", .. })
        ));
        assert_eq!(
            LoadReport::decode(b"garbage"),
            Err(BodyError::MalformedLine { line: 1 })
        );
        assert_eq!(LoadReport::decode(&[0xff, 0xfe]), Err(BodyError::NotUtf8));
    }

    proptest! {
        #[test]
        fn roundtrip(msr in "[a-z_0-9]{1,16}", load in 0u8..=100, cpu in 0u8..=100, calls: u32, max_calls: u32, engine in 0usize..3, draining: bool, codecs in proptest::option::of(proptest::collection::vec(0usize..crate::media::CODECS.len(), 0..8)), sample_age_ms: Option<u32>) {
            let engine = [EngineState::Up, EngineState::Down, EngineState::Unchecked][engine];
            let service = if draining { Service::Draining } else { Service::Active };
            let codecs = codecs.map(|list| crate::media::CodecList::new(list.into_iter().filter_map(|i| crate::media::Codec::from_name(crate::media::CODECS[i].name))));
            let r = LoadReport { msr, load, cpu, calls, max_calls, engine, service, codecs, sample_age_ms };
            prop_assert_eq!(LoadReport::decode(r.encode().as_bytes()), Ok(r));
        }

        #[test]
        fn never_panics(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = LoadReport::decode(&body);
        }
    }
}
