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
//! ```
//!
//! Unknown names are ignored by the reader, so the package can grow.

use std::fmt;

/// The event package name carried in `Event:` and `Allow-Events:`.
pub const EVENT: &str = "eltex-call-count";

/// The MIME type of a NOTIFY body, also sent in the SUBSCRIBE's `Accept:`.
pub const CONTENT_TYPE: &str = "application/x-eltex-call-count";

/// The state of one MSR as the agent reports it in a NOTIFY.
#[derive(Debug, Clone, PartialEq, Eq)]
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
                _ => {}
            }
        }
        Ok(Self {
            msr: msr.ok_or(BodyError::Missing { name: "msr" })?,
            load: load.ok_or(BodyError::Missing { name: "load" })?,
            cpu,
            calls,
            max_calls,
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
        writeln!(f, "max-calls: {}", self.max_calls)
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
                max_calls: 8192
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
        fn roundtrip(msr in "[a-z_0-9]{1,16}", load in 0u8..=100, cpu in 0u8..=100, calls: u32, max_calls: u32) {
            let r = LoadReport { msr, load, cpu, calls, max_calls };
            prop_assert_eq!(LoadReport::decode(r.encode().as_bytes()), Ok(r));
        }

        #[test]
        fn never_panics(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = LoadReport::decode(&body);
        }
    }
}
