//! The registrar's bindings as they are saved across a restart of the
//! collector (SPEC §3: a restarted collector resumes every subscription at
//! once, without waiting for the MSRs' next REGISTER).
//!
//! The text is JSON, versioned ([`FORMAT`], [`VERSION`]); expiries are Unix
//! times in milliseconds, so that a binding read back lapses when it would
//! have lapsed had the collector kept running. Reading is strict and never
//! panics: a torn file, another format or version, or an entry that breaks
//! a rule the registrar applies to a REGISTER (names, URI, engine
//! parameters) is a [`SavedBindingsError`], and the caller starts without
//! bindings (the MSRs register again at their next refresh).
//!
//! Pure: the caller gives `now` and the Unix time; the file I/O is
//! [`crate::operator::store::Store`]'s.

use std::net::SocketAddr;
use std::time::Duration;

use msr_shared::engine::EngineAddresses;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::Binding;
use crate::operator::names::{ContactName, MsrName};

/// The `format` field of the file: what the file is.
pub const FORMAT: &str = "msr-collector bindings";
/// The `version` field this build writes. Version 1 (no `branch`) is
/// read too: an upgrade keeps every binding (SPEC §13).
pub const VERSION: u32 = 2;

/// The oldest `version` this build reads.
pub const OLDEST_VERSION: u32 = 1;

/// Why saved bindings could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SavedBindingsError {
    /// Not JSON of the expected shape (a torn write, or another file).
    #[error("not a bindings file: {0}")]
    Syntax(#[from] serde_json::Error),
    /// Another format or version (written by another build).
    #[error(
        "format {format:?} version {version}, this collector reads {FORMAT:?} versions {OLDEST_VERSION} to {VERSION}"
    )]
    Version {
        /// The file's `format`.
        format: String,
        /// The file's `version`.
        version: u32,
    },
    /// An entry breaks a rule a REGISTER is held to.
    #[error("binding {index} ({contact:?}): {problem}")]
    Entry {
        /// 0-based position in the file.
        index: usize,
        /// The entry's contact name, as written.
        contact: String,
        /// What is wrong.
        problem: String,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: String,
    version: u32,
    bindings: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    msr: String,
    contact: String,
    uri: String,
    version: Option<String>,
    expires_unix_ms: i64,
    call_id: String,
    cseq: u32,
    /// Since version 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    branch: Option<String>,
    source: Option<SocketAddr>,
}

/// The bindings as text, their expiries as Unix times (`unix_now_ms` is
/// the Unix time of `now`).
pub fn encode<'a>(
    bindings: impl Iterator<Item = &'a Binding>,
    now: Instant,
    unix_now_ms: i64,
) -> String {
    let bindings = bindings
        .map(|b| {
            let left = b.expires_at.saturating_duration_since(now);
            Entry {
                msr: b.msr.to_string(),
                contact: b.contact.to_string(),
                uri: b.uri.clone(),
                version: b.version.clone(),
                expires_unix_ms: unix_now_ms
                    .saturating_add(i64::try_from(left.as_millis()).unwrap_or(i64::MAX)),
                call_id: b.call_id.clone(),
                cseq: b.cseq,
                branch: b.branch.clone(),
                source: b.source,
            }
        })
        .collect();
    let file = File {
        format: FORMAT.to_owned(),
        version: VERSION,
        bindings,
    };
    // Serialising plain strings and numbers cannot fail.
    serde_json::to_string(&file).unwrap_or_default()
}

/// The unexpired bindings of `text`, their expiries as instants (`unix_now_ms`
/// is the Unix time of `now`); bindings already lapsed are left out.
///
/// # Errors
/// [`SavedBindingsError`] for anything but a file this build wrote.
pub fn decode(
    text: &str,
    now: Instant,
    unix_now_ms: i64,
) -> Result<Vec<Binding>, SavedBindingsError> {
    let file: File = serde_json::from_str(text)?;
    if file.format != FORMAT || !(OLDEST_VERSION..=VERSION).contains(&file.version) {
        return Err(SavedBindingsError::Version {
            format: file.format,
            version: file.version,
        });
    }
    let mut out = Vec::with_capacity(file.bindings.len());
    for (index, e) in file.bindings.into_iter().enumerate() {
        let bad = |problem: String| SavedBindingsError::Entry {
            index,
            contact: e.contact.clone(),
            problem,
        };
        let msr = MsrName::new(&e.msr).map_err(|err| match err.problem() {
            Some(p) => bad(format!("bad msr name: {p}")),
            None => bad(err.to_string()),
        })?;
        let contact = ContactName::new(&e.contact).map_err(|err| bad(err.to_string()))?;
        if contact.msr() != msr.as_str() {
            return Err(bad(format!("contact of another msr than {:?}", e.msr)));
        }
        let valid_uri = (e.uri.starts_with("sip:") || e.uri.starts_with("sips:"))
            && e.uri.len() <= super::MAX_CONTACT_URI_LEN
            && !e.uri.chars().any(|c| c.is_control() || c.is_whitespace())
            && rsipstack::sip::Uri::try_from(e.uri.as_str()).is_ok();
        if !valid_uri {
            return Err(bad(format!("bad contact uri {:?}", e.uri)));
        }
        // What a REGISTER could have set, nothing more (these are shown in
        // tables and logs).
        if let Some(problem) =
            crate::model::legs::key_problem(&e.call_id, crate::model::legs::MAX_CALL_ID_LEN)
        {
            return Err(bad(format!("call_id {problem}")));
        }
        if let Some(version) = &e.version {
            if super::agent_version(&format!("agent/{version}")).as_deref() != Some(version) {
                return Err(bad(format!("bad agent version {version:?}")));
            }
        }
        if e.source.is_some_and(|s| s.port() == 0) {
            return Err(bad("source with port 0".to_owned()));
        }
        let engine = EngineAddresses::from_uri(&e.uri).map_err(|err| bad(err.to_string()))?;
        let left_ms = e.expires_unix_ms.saturating_sub(unix_now_ms);
        let Ok(left_ms) = u64::try_from(left_ms) else {
            continue;
        };
        if left_ms == 0 {
            continue;
        }
        let Some(expires_at) = now.checked_add(Duration::from_millis(left_ms)) else {
            return Err(bad(format!("expiry {} out of range", e.expires_unix_ms)));
        };
        out.push(Binding {
            msr,
            contact,
            uri: e.uri,
            engine,
            version: e.version,
            expires_at,
            call_id: e.call_id,
            cseq: e.cseq,
            branch: e.branch,
            source: e.source,
        });
    }
    Ok(out)
}
