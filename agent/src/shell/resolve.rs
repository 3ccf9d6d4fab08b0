//! The resolution of the registrars' host names (SPEC §4, who may
//! SUBSCRIBE): in a task, at most [`RESOLVE_TIMEOUT`] per name, at start
//! and after each reload; what it found goes to
//! [`Agent::handle_resolved`](crate::core::Agent::handle_resolved).

use std::collections::BTreeSet;

use tokio::task::JoinHandle;

use super::{Shell, RESOLVE_TIMEOUT};
use crate::core::Resolution;

/// Resolves `names`, each within [`RESOLVE_TIMEOUT`].
async fn resolve(names: BTreeSet<String>) -> Resolution {
    let mut out = Vec::new();
    for name in names {
        let lookup = tokio::net::lookup_host((name.as_str(), 5060));
        let found = match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
            Ok(Ok(addrs)) => Ok(addrs.map(|a| a.ip().to_canonical()).collect()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer in {} s", RESOLVE_TIMEOUT.as_secs())),
        };
        out.push((name, found));
    }
    out
}

impl Shell {
    /// Starts resolving the registrars' host names; `None` when the config
    /// names none.
    pub(super) fn start_resolving(&self) -> Option<JoinHandle<Resolution>> {
        let names = self.agent.names_to_resolve();
        (!names.is_empty()).then(|| tokio::spawn(resolve(names)))
    }
}
