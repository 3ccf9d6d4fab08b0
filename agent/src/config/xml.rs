//! Raw XML layer: a well-formedness scan with positions, and the raw serde
//! structs (every attribute an `Option<String>`, named `@attr` as quick-xml's
//! serde support expects). Nothing here interprets values; see `validate`.
//!
//! Elements and attributes that belong to the media engine have no field
//! here and are skipped by serde.

use std::path::Path;

use quick_xml::errors::{Error as XmlError, SyntaxError};
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use serde::Deserialize;

use super::{ConfigError, Position, MAX_CONFIG_DEPTH};

/// Section elements under `<config>` that the agent reads; each may appear at
/// most once.
const SECTIONS: &[&str] = &[
    "general",
    "transport",
    "media",
    "accounts",
    "agent",
    "pbyte",
    "codec",
];

/// `<config>`: the document root.
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawConfig {
    pub(super) general: Option<RawGeneral>,
    pub(super) transport: Option<RawTransport>,
    pub(super) media: Option<RawMedia>,
    pub(super) accounts: Option<RawAccounts>,
    pub(super) agent: Option<RawAgent>,
    pub(super) pbyte: Option<RawPbyte>,
}

/// `<pbyte>`: the media engine's control section; only `<mcc>` is read.
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawPbyte {
    pub(super) mcc: Option<RawMcc>,
}

/// `<pbyte>/<mcc>`: the engine's media-control channel.
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawMcc {
    #[serde(rename = "@bind-addr")]
    pub(super) bind_addr: Option<String>,
    #[serde(rename = "@port")]
    pub(super) port: Option<String>,
}

/// `<general>` (`log-path`, `log-name`, `log-rotate` are the engine's log
/// file, which the agent never writes: not read)
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawGeneral {
    #[serde(rename = "@log-level")]
    pub(super) log_level: Option<String>,
    #[serde(rename = "@max-calls")]
    pub(super) max_calls: Option<String>,
    #[serde(rename = "@load-sensor")]
    pub(super) load_sensor: Option<String>,
    #[serde(rename = "@load-delta")]
    pub(super) load_delta: Option<String>,
}

/// `<transport>`
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawTransport {
    #[serde(rename = "@bind-addr")]
    pub(super) bind_addr: Option<String>,
    #[serde(rename = "@port")]
    pub(super) port: Option<String>,
    #[serde(rename = "@transport")]
    pub(super) transport: Option<String>,
}

/// `<media>` (the RTP range and the video encoder's frame size; the
/// engine's other attributes are skipped)
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawMedia {
    #[serde(rename = "@port-start")]
    pub(super) port_start: Option<String>,
    #[serde(rename = "@port-range")]
    pub(super) port_range: Option<String>,
    #[serde(rename = "@video-enc-width")]
    pub(super) video_enc_width: Option<String>,
    #[serde(rename = "@video-enc-height")]
    pub(super) video_enc_height: Option<String>,
}

/// `<accounts>`: its children in document order, so that `<dynamic>`
/// elements may be interleaved with elements of the media engine.
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawAccounts {
    #[serde(rename = "$value", default)]
    children: Vec<RawAccountChild>,
}

impl RawAccounts {
    /// The `<dynamic>` children, in document order.
    pub(super) fn dynamic(&self) -> impl Iterator<Item = &RawDynamic> {
        self.children.iter().filter_map(|c| match c {
            RawAccountChild::Dynamic(d) => Some(d),
            RawAccountChild::Other => None,
        })
    }
}

/// A child of `<accounts>`.
#[derive(Debug, Deserialize)]
enum RawAccountChild {
    #[serde(rename = "dynamic")]
    Dynamic(RawDynamic),
    /// Anything else (skipped).
    #[serde(other)]
    Other,
}

/// `<accounts>/<dynamic>`
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawDynamic {
    #[serde(rename = "@msr_name")]
    pub(super) msr_name: Option<String>,
    #[serde(rename = "@realm")]
    pub(super) realm: Option<String>,
    #[serde(rename = "@auth_name")]
    pub(super) auth_name: Option<String>,
    #[serde(rename = "@auth_password")]
    pub(super) auth_password: Option<String>,
    #[serde(rename = "@dtmf_mode")]
    pub(super) dtmf_mode: Option<String>,
}

/// `<agent>` (strict: unknown attributes are rejected using [`Scan`], since
/// serde's own message would not name the accepted attributes)
#[derive(Debug, Default, Deserialize)]
pub(super) struct RawAgent {
    #[serde(rename = "@register-expires")]
    pub(super) register_expires: Option<String>,
    #[serde(rename = "@max-subscription-expires")]
    pub(super) max_subscription_expires: Option<String>,
    #[serde(rename = "@calls-source")]
    pub(super) calls_source: Option<String>,
    #[serde(rename = "@notify-min-interval-ms")]
    pub(super) notify_min_interval_ms: Option<String>,
    #[serde(rename = "@notify-top-interval-ms")]
    pub(super) notify_top_interval_ms: Option<String>,
    #[serde(rename = "@notify-high-water")]
    pub(super) notify_high_water: Option<String>,
    #[serde(rename = "@sample-interval-ms")]
    pub(super) sample_interval_ms: Option<String>,
    #[serde(rename = "@node-name")]
    pub(super) node_name: Option<String>,
    #[serde(rename = "@sip-port")]
    pub(super) sip_port: Option<String>,
    #[serde(rename = "@log-file")]
    pub(super) log_file: Option<String>,
    #[serde(rename = "@allow-subscribers")]
    pub(super) allow_subscribers: Option<String>,
    #[serde(rename = "@tls-ca")]
    pub(super) tls_ca: Option<String>,
    #[serde(rename = "@tls-cert")]
    pub(super) tls_cert: Option<String>,
    #[serde(rename = "@tls-key")]
    pub(super) tls_key: Option<String>,
    #[serde(rename = "@engine-probe")]
    pub(super) engine_probe: Option<String>,
    #[serde(rename = "@engine-probe-interval-ms")]
    pub(super) engine_probe_interval_ms: Option<String>,
    #[serde(rename = "@engine-probe-timeout-ms")]
    pub(super) engine_probe_timeout_ms: Option<String>,
    #[serde(rename = "@engine-probe-misses")]
    pub(super) engine_probe_misses: Option<String>,
}

/// What the well-formedness scan learned besides "the file is well formed".
#[derive(Debug, Default)]
pub(super) struct Scan {
    /// Attribute names of `<config>/<agent>` with the element's position.
    pub(super) agent_attributes: Vec<(String, Position)>,
    /// The attributes of `<config>/<codec>` as `(name, value)`, values
    /// unescaped, in document order; `None` without the element. Its
    /// attribute names are the engine's codecs, an open set, so they are
    /// read here rather than as serde fields.
    pub(super) codec: Option<Vec<(String, String)>>,
}

/// Checks that `text` is a well-formed document rooted at `<config>` with at
/// most one of each section element and elements nested at most
/// [`MAX_CONFIG_DEPTH`] deep, reporting the first problem with its
/// `line:column`. Linear in the text: a position is computed only for an
/// error.
pub(super) fn scan(text: &str, origin: &Path) -> Result<Scan, ConfigError> {
    let path = origin.to_path_buf();
    let at =
        |offset: u64| Position::from_offset(text, usize::try_from(offset).unwrap_or(usize::MAX));
    let mut reader = Reader::from_str(text);
    let mut out = Scan::default();
    // Open elements: name and start offset.
    let mut stack: Vec<(String, u64)> = Vec::new();
    let mut root_seen = false;
    let mut seen_sections: Vec<&'static str> = Vec::new();

    loop {
        let start = reader.buffer_position();
        let event = match reader.read_event() {
            Ok(ev) => ev,
            Err(e) => {
                let pos = at(reader.error_position());
                return Err(xml_error(e, text, reader.error_position(), pos, origin));
            }
        };
        match event {
            Event::Start(ref e) | Event::Empty(ref e) => {
                let is_empty = matches!(event, Event::Empty(_));
                let name = String::from_utf8_lossy(e.name().as_ref()).into_owned();
                // The position is worked out only for an error: computing it
                // for every element made the scan quadratic in the file size.
                check_attributes(e, &path, || at(start))?;
                match stack.len() {
                    0 => {
                        if root_seen {
                            return Err(ConfigError::Malformed {
                                path,
                                at: at(start),
                                reason: format!("element <{name}> after the root element"),
                            });
                        }
                        root_seen = true;
                        if name != "config" {
                            return Err(ConfigError::WrongRoot {
                                path,
                                at: at(start),
                                found: name,
                            });
                        }
                    }
                    1 => {
                        if let Some(section) = SECTIONS.iter().copied().find(|s| *s == name) {
                            if seen_sections.contains(&section) {
                                return Err(ConfigError::DuplicateElement {
                                    path,
                                    at: at(start),
                                    element: section,
                                });
                            }
                            seen_sections.push(section);
                            if section == "agent" {
                                for attr in e.attributes().flatten() {
                                    let key =
                                        String::from_utf8_lossy(attr.key.as_ref()).into_owned();
                                    out.agent_attributes.push((key, at(start)));
                                }
                            }
                            if section == "codec" {
                                out.codec = Some(attributes(e, &path, || at(start))?);
                            }
                        }
                    }
                    _ => {}
                }
                if stack.len() >= MAX_CONFIG_DEPTH {
                    return Err(ConfigError::TooDeep {
                        path,
                        at: at(start),
                        element: name,
                        limit: MAX_CONFIG_DEPTH,
                    });
                }
                if !is_empty {
                    stack.push((name, start));
                }
            }
            Event::End(_) => {
                // quick-xml has checked that the name matches.
                stack.pop();
            }
            Event::Text(ref t) if stack.is_empty() && !t.iter().all(u8::is_ascii_whitespace) => {
                return Err(ConfigError::Malformed {
                    path,
                    at: at(start),
                    reason: "text outside the root element".to_owned(),
                });
            }
            Event::Eof => break,
            _ => {}
        }
    }

    if let Some((name, opened)) = stack.first() {
        return Err(ConfigError::Truncated {
            path,
            at: at(text.len() as u64),
            what: format!("element <{name}> opened at {}", at(*opened)),
        });
    }
    if !root_seen {
        return Err(ConfigError::MissingElement {
            path,
            element: "config",
        });
    }
    Ok(out)
}

/// Checks every attribute of `e` (quotes, duplicates, `=`).
fn check_attributes(
    e: &BytesStart<'_>,
    path: &Path,
    at: impl FnOnce() -> Position,
) -> Result<(), ConfigError> {
    for attr in e.attributes() {
        if let Err(err) = attr {
            let name = String::from_utf8_lossy(e.name().as_ref()).into_owned();
            return Err(ConfigError::Malformed {
                path: path.to_path_buf(),
                at: at(),
                reason: format!("<{name}>: bad attribute: {err}"),
            });
        }
    }
    Ok(())
}

/// The attributes of `e` as `(name, value)` in document order, values
/// unescaped (`&amp;` and the like); a bad escape is malformed xml at
/// `at`.
fn attributes(
    e: &BytesStart<'_>,
    path: &Path,
    at: impl Fn() -> Position,
) -> Result<Vec<(String, String)>, ConfigError> {
    let element = || String::from_utf8_lossy(e.name().as_ref()).into_owned();
    let mut out = Vec::new();
    // `check_attributes` has run: every attribute parses.
    for attr in e.attributes().flatten() {
        let name = String::from_utf8_lossy(attr.key.as_ref()).into_owned();
        let value = attr
            .unescape_value()
            .map_err(|err| ConfigError::Malformed {
                path: path.to_path_buf(),
                at: at(),
                reason: format!(
                    "<{} {name}=\"{}\">: bad value: {err}",
                    element(),
                    String::from_utf8_lossy(&attr.value)
                ),
            })?;
        out.push((name, value.into_owned()));
    }
    Ok(out)
}

/// Maps a reader error to a [`ConfigError`]. Syntax errors other than bad
/// `<!` markup are all "end of file inside markup".
fn xml_error(e: XmlError, text: &str, offset: u64, at: Position, origin: &Path) -> ConfigError {
    let path = origin.to_path_buf();
    let snippet = || {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(text.len());
        let rest = text.get(start..).unwrap_or("");
        let line = rest.lines().next().unwrap_or("").trim_end();
        line.chars().take(40).collect::<String>()
    };
    match e {
        XmlError::Syntax(SyntaxError::InvalidBangMarkup) => ConfigError::Malformed {
            path,
            at,
            reason: SyntaxError::InvalidBangMarkup.to_string(),
        },
        XmlError::Syntax(kind) => {
            let what = match kind {
                SyntaxError::UnclosedTag => format!("tag `{}`", snippet()),
                SyntaxError::UnclosedComment => "comment".to_owned(),
                SyntaxError::UnclosedCData => "cdata section".to_owned(),
                SyntaxError::UnclosedDoctype => "doctype".to_owned(),
                SyntaxError::UnclosedPIOrXmlDecl => "processing instruction".to_owned(),
                other => other.to_string(),
            };
            ConfigError::Truncated { path, at, what }
        }
        other => ConfigError::Malformed {
            path,
            at,
            reason: other.to_string(),
        },
    }
}

/// Deserializes the raw structs; run after [`scan`], so errors here are about
/// structure, not syntax.
pub(super) fn deserialize(text: &str, origin: &Path) -> Result<RawConfig, ConfigError> {
    quick_xml::de::from_str::<RawConfig>(text).map_err(|e| ConfigError::Structure {
        path: origin.to_path_buf(),
        reason: e.to_string(),
    })
}
