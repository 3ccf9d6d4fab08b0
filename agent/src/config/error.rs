//! Why a config could not be loaded (SPEC §2), as [`ConfigError`]: every
//! message names the file, the `line:column` of broken XML ([`Position`])
//! or the element and attribute whose value is wrong, and what is accepted,
//! so that an operator can fix the file from the log line alone.

use std::path::{Path, PathBuf};

/// A position in the config file, 1-based; `column` counts characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// 1-based line.
    pub line: usize,
    /// 1-based column in characters.
    pub column: usize,
}

impl Position {
    /// The line and column of byte `offset` in `text` (clamped to the end of
    /// the text; an offset inside a multi-byte character counts that
    /// character).
    pub fn from_offset(text: &str, offset: usize) -> Position {
        let mut end = offset.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let before = &text[..end];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        Position { line, column }
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Why a config could not be loaded (SPEC §2). Messages name the file, the
/// `line:column` of broken XML or the element and attribute whose value is
/// wrong, and the accepted values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read config: {source}", path.display())]
    Io {
        /// The config file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_CONFIG_BYTES`](super::MAX_CONFIG_BYTES).
    #[error(
        "{}: the file has more than {limit} bytes, more than a media server config needs \
         (accepted: up to {limit} bytes)",
        path.display()
    )]
    TooLarge {
        /// The config file.
        path: PathBuf,
        /// [`MAX_CONFIG_BYTES`](super::MAX_CONFIG_BYTES).
        limit: usize,
    },
    /// Elements are nested deeper than [`MAX_CONFIG_DEPTH`](super::MAX_CONFIG_DEPTH).
    #[error(
        "{}:{at}: <{element}> is nested more than {limit} elements deep \
         (accepted: up to {limit} levels)",
        path.display()
    )]
    TooDeep {
        /// The config file.
        path: PathBuf,
        /// Where the element that goes too deep starts.
        at: Position,
        /// Its name.
        element: String,
        /// [`MAX_CONFIG_DEPTH`](super::MAX_CONFIG_DEPTH).
        limit: usize,
    },
    /// The file ends inside markup or before every element is closed.
    #[error("{}:{at}: file is truncated: {what} is not closed", path.display())]
    Truncated {
        /// The config file.
        path: PathBuf,
        /// Where the unclosed markup starts.
        at: Position,
        /// What is left open, e.g. ``tag `</config` `` or `element <config>`.
        what: String,
    },
    /// The XML is not well formed.
    #[error("{}:{at}: malformed xml: {reason}", path.display())]
    Malformed {
        /// The config file.
        path: PathBuf,
        /// Where the problem was detected.
        at: Position,
        /// The parser's description.
        reason: String,
    },
    /// The root element is not `<config>` (or there is none).
    #[error("{}:{at}: root element is <{found}>, expected <config>", path.display())]
    WrongRoot {
        /// The config file.
        path: PathBuf,
        /// Where the root element starts (end of file if none).
        at: Position,
        /// The root element found (empty if none).
        found: String,
    },
    /// A section element appears twice under `<config>`.
    #[error("{}:{at}: duplicate element <{element}>", path.display())]
    DuplicateElement {
        /// The config file.
        path: PathBuf,
        /// Where the second occurrence starts.
        at: Position,
        /// The element name.
        element: &'static str,
    },
    /// A required element is missing.
    #[error("{}: missing element <{element}>", path.display())]
    MissingElement {
        /// The config file.
        path: PathBuf,
        /// The element name.
        element: &'static str,
    },
    /// A required attribute is missing.
    #[error("{}: <{element}>: missing attribute {attribute}", path.display())]
    MissingAttribute {
        /// The config file.
        path: PathBuf,
        /// The element name.
        element: &'static str,
        /// The attribute name.
        attribute: &'static str,
    },
    /// An attribute has a value outside its accepted set.
    #[error(
        "{}: <{element} {attribute}=\"{value}\">: {}, accepted: {accepted}",
        path.display(),
        .problem.describe(attribute)
    )]
    InvalidValue {
        /// The config file.
        path: PathBuf,
        /// The element name.
        element: &'static str,
        /// The attribute name.
        attribute: &'static str,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        problem: ValueProblem,
        /// The accepted values, e.g. `cpu, calls, media`.
        accepted: &'static str,
    },
    /// An integer attribute is not a decimal integer in `min..=max`.
    #[error(
        "{}: <{element} {attribute}=\"{value}\">: {}, accepted: an integer {min}..={max}",
        path.display(),
        int_problem(value, attribute)
    )]
    BadInteger {
        /// The config file.
        path: PathBuf,
        /// The element name.
        element: &'static str,
        /// The attribute name.
        attribute: &'static str,
        /// The value as written.
        value: String,
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
    },
    /// `<agent>` carries an attribute the agent does not know.
    #[error("{}:{at}: <agent {attribute}>: unknown attribute, accepted: {accepted}", path.display())]
    UnknownAttribute {
        /// The config file.
        path: PathBuf,
        /// Where the element starts.
        at: Position,
        /// The unknown attribute.
        attribute: String,
        /// The accepted attributes.
        accepted: String,
    },
    /// Two `<dynamic>` accounts have the same `msr_name` and `realm`.
    #[error(
        "{}: <dynamic msr_name=\"{msr_name}\" realm=\"{realm}\">: duplicate account",
        path.display()
    )]
    DuplicateAccount {
        /// The config file.
        path: PathBuf,
        /// The account's MSR name.
        msr_name: String,
        /// The account's realm URI.
        realm: String,
    },
    /// The agent's SIP port is a port of the media engine: the engine's SIP
    /// port, its media-control port or a port of its RTP range (SPEC §1:
    /// the agent never binds a port of the media engine).
    #[error(
        "{}: {}: collides with the media engine's {engine}: \
         the agent needs a port of its own (set <agent sip-port> or --sip-port)",
        path.display(),
        setting.describe(*sip_port)
    )]
    PortCollision {
        /// The config file.
        path: PathBuf,
        /// Where the port came from.
        setting: PortSetting,
        /// The agent's SIP port (given, or the default).
        sip_port: u16,
        /// What of the engine's it collides with, as written in the file,
        /// e.g. `<transport port="5040">`.
        engine: String,
    },
    /// The document does not have the expected structure (reported by the
    /// deserializer).
    #[error("{}: unexpected structure: {reason}", path.display())]
    Structure {
        /// The config file.
        path: PathBuf,
        /// The deserializer's description.
        reason: String,
    },
    /// The file watcher for hot reload could not be set up (see [`watch()`](super::watch())).
    #[error("{}: cannot watch config: {reason}", path.display())]
    Watch {
        /// The config file.
        path: PathBuf,
        /// The watcher's description.
        reason: String,
    },
}

impl ConfigError {
    /// The config file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            ConfigError::Io { path, .. }
            | ConfigError::TooLarge { path, .. }
            | ConfigError::TooDeep { path, .. }
            | ConfigError::Truncated { path, .. }
            | ConfigError::Malformed { path, .. }
            | ConfigError::WrongRoot { path, .. }
            | ConfigError::DuplicateElement { path, .. }
            | ConfigError::MissingElement { path, .. }
            | ConfigError::MissingAttribute { path, .. }
            | ConfigError::InvalidValue { path, .. }
            | ConfigError::BadInteger { path, .. }
            | ConfigError::UnknownAttribute { path, .. }
            | ConfigError::DuplicateAccount { path, .. }
            | ConfigError::PortCollision { path, .. }
            | ConfigError::Structure { path, .. }
            | ConfigError::Watch { path, .. } => path,
        }
    }
}

/// Where the agent's SIP port came from ([`ConfigError::PortCollision`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSetting {
    /// `<agent sip-port>`, or its default (the `<transport>` port + 1).
    Config,
    /// The `--sip-port` flag.
    Flag,
}

impl PortSetting {
    /// How messages name the setting with `port`.
    pub fn describe(self, port: u16) -> String {
        match self {
            PortSetting::Config => format!("<agent sip-port=\"{port}\">"),
            PortSetting::Flag => format!("--sip-port {port}"),
        }
    }
}

/// What is wrong with an attribute value ([`ConfigError::InvalidValue`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueProblem {
    /// Not one of an enumerated set: "unknown {attribute}".
    Unknown,
    /// Does not have the expected form: "bad {attribute}".
    Bad,
    /// Empty where a value is required: "empty {attribute}".
    Empty,
    /// A specific problem, e.g. "realm is not a sip uri".
    Detail(&'static str),
}

impl ValueProblem {
    /// The problem as shown in messages, for `attribute`.
    pub fn describe(&self, attribute: &str) -> String {
        match self {
            ValueProblem::Unknown => format!("unknown {attribute}"),
            ValueProblem::Bad => format!("bad {attribute}"),
            ValueProblem::Empty => format!("empty {attribute}"),
            ValueProblem::Detail(d) => (*d).to_owned(),
        }
    }
}

/// "bad X" for a value that is not a decimal integer, "X out of range" for
/// one that is.
fn int_problem(value: &str, attribute: &str) -> String {
    let t = value.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        format!("{attribute} out of range")
    } else {
        format!("bad {attribute}")
    }
}
