//! What a collector knows of its cluster of core hosts (SPEC §12): where
//! the operator configuration lives and whether it can be reached, the
//! revision of the configuration in use, and the live members.
//!
//! [`Cluster::core_hosts`] is G, the number of core hosts a balancing
//! policy divides by (SPEC §10): the live members with etcd, `[cluster]
//! core_hosts` with the file store (or before etcd gave a member list).
//!
//! Architecture invariant: plain state, no I/O and no clock: the shell
//! updates it from the etcd task's events and reads it for `cluster list`
//! and for whether a change may be made.

use std::time::SystemTime;

use msr_shared::admin::{ClusterMember, ClusterView, StoreKind, StoreState, StoreView};

use crate::operator::store::etcd::Member;
use msr_shared::time::unix_secs;

/// Whether changes can be committed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreStatus {
    /// The file store: always.
    Local,
    /// etcd answered last.
    Connected,
    /// etcd cannot be reached: changes are refused.
    Unavailable {
        /// Since when.
        since: SystemTime,
        /// The last error.
        reason: String,
    },
}

/// Where the operator configuration lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The file store at this path.
    File(String),
    /// etcd: endpoints (comma-separated) and the key prefix.
    Etcd {
        /// Comma-separated endpoints.
        endpoints: String,
        /// The key prefix.
        prefix: String,
    },
}

/// The cluster as this collector sees it (see the module docs).
#[derive(Debug, Clone)]
pub struct Cluster {
    /// This collector.
    this: Member,
    location: Location,
    status: StoreStatus,
    /// `[cluster] core_hosts`.
    fallback_core_hosts: u32,
    /// The live members from etcd; `None` before the first list.
    members: Option<Vec<Member>>,
    /// The configuration key's `mod_revision` in use: what a change is
    /// made against (`None`: the key does not exist, or not known yet).
    mod_revision: Option<i64>,
    /// The etcd revision of the newest state applied (orders the events).
    seen: i64,
    /// The configuration in use is the local cached copy at this path,
    /// read at start while etcd was unreachable.
    from_cache: Option<String>,
}

impl Cluster {
    /// `[cluster] core_hosts`, reloaded: G while the store names no members.
    pub fn set_fallback_core_hosts(&mut self, core_hosts: u32) {
        self.fallback_core_hosts = core_hosts;
    }

    /// A collector on the file store.
    pub fn file(this: Member, path: String, core_hosts: u32) -> Self {
        Self::new(this, Location::File(path), StoreStatus::Local, core_hosts)
    }

    /// A collector on etcd, before etcd answered: unavailable since `now`
    /// (the wall clock, which the shell reads).
    pub fn etcd(
        this: Member,
        endpoints: String,
        prefix: String,
        core_hosts: u32,
        now: SystemTime,
    ) -> Self {
        let status = StoreStatus::Unavailable {
            since: now,
            reason: "not connected yet".into(),
        };
        Self::new(
            this,
            Location::Etcd { endpoints, prefix },
            status,
            core_hosts,
        )
    }

    fn new(this: Member, location: Location, status: StoreStatus, core_hosts: u32) -> Self {
        Self {
            this,
            location,
            status,
            fallback_core_hosts: core_hosts,
            members: None,
            mod_revision: None,
            seen: 0,
            from_cache: None,
        }
    }

    /// G: the number of live core hosts (SPEC §10, §12), at least 1.
    pub fn core_hosts(&self) -> u32 {
        match &self.members {
            Some(members) => u32::try_from(members.len()).unwrap_or(u32::MAX).max(1),
            None => self.fallback_core_hosts,
        }
    }

    /// Whether the store accepts changes now.
    pub fn status(&self) -> &StoreStatus {
        &self.status
    }

    /// The revision a change is made against.
    pub fn mod_revision(&self) -> Option<i64> {
        self.mod_revision
    }

    /// etcd answered.
    pub fn connected(&mut self) {
        self.status = StoreStatus::Connected;
    }

    /// etcd cannot be reached.
    pub fn unavailable(&mut self, since: SystemTime, reason: String) {
        self.status = StoreStatus::Unavailable { since, reason };
    }

    /// The configuration in use was read from the local cache at `path`.
    pub fn started_from_cache(&mut self, path: String) {
        self.from_cache = Some(path);
    }

    /// A state of the configuration from etcd as of `revision`: `true` when
    /// it is newer than the one in use (then it becomes the one in use).
    pub fn observe(&mut self, revision: i64, mod_revision: Option<i64>) -> bool {
        if revision <= self.seen && self.from_cache.is_none() {
            return false;
        }
        self.seen = revision;
        self.mod_revision = mod_revision;
        self.from_cache = None;
        true
    }

    /// The revision of the newest state applied.
    pub fn seen(&self) -> i64 {
        self.seen
    }

    /// The live members from etcd.
    pub fn set_members(&mut self, members: Vec<Member>) {
        self.members = Some(members);
    }

    /// The wire form of `cluster list`.
    pub fn view(&self) -> ClusterView {
        let (backend, location) = match &self.location {
            Location::File(path) => (StoreKind::File, path.clone()),
            Location::Etcd { endpoints, prefix } => {
                (StoreKind::Etcd, format!("{endpoints} prefix {prefix}"))
            }
        };
        let (status, since, mut detail) = match &self.status {
            StoreStatus::Local => (StoreState::Local, None, None),
            StoreStatus::Connected => (StoreState::Connected, None, None),
            StoreStatus::Unavailable { since, reason } => (
                StoreState::Unavailable,
                Some(unix_secs(*since)),
                Some(format!(
                    "{reason}; changes are refused, selection goes on with the last configuration seen"
                )),
            ),
        };
        if let Some(path) = &self.from_cache {
            let cached = format!("started from the local cached copy {path}");
            detail = Some(match detail {
                Some(d) => format!("{cached}; {d}"),
                None => cached,
            });
        }
        let revision = match self.location {
            Location::File(_) => None,
            Location::Etcd { .. } if self.from_cache.is_some() => None,
            Location::Etcd { .. } => Some(self.seen),
        };
        let to_wire = |m: &Member| ClusterMember {
            node: m.node.clone(),
            sip: m.sip.clone(),
            started_unix: m.started_unix,
            this: m.node == self.this.node,
        };
        let mut members: Vec<ClusterMember> = match &self.members {
            Some(members) => members.iter().map(to_wire).collect(),
            None => vec![to_wire(&self.this)],
        };
        members.sort_by(|a, b| a.node.cmp(&b.node));
        ClusterView {
            node: self.this.node.clone(),
            store: StoreView {
                backend,
                status,
                location,
                revision,
                unavailable_since_unix: since,
                detail,
            },
            core_hosts: self.core_hosts(),
            core_hosts_from_config: matches!(self.location, Location::Etcd { .. })
                && self.members.is_none(),
            members,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(node: &str) -> Member {
        Member {
            node: node.into(),
            sip: "127.0.0.1:5060".into(),
            started_unix: 1,
        }
    }

    #[test]
    fn g_follows_the_member_list_and_falls_back_to_the_config() {
        let mut cluster = Cluster::etcd(
            member("a"),
            "http://e:2379".into(),
            "/p/".into(),
            3,
            SystemTime::now(),
        );
        assert_eq!(cluster.core_hosts(), 3, "no list yet: [cluster] core_hosts");
        cluster.set_members(vec![member("a"), member("b")]);
        assert_eq!(cluster.core_hosts(), 2);
        cluster.set_members(vec![]);
        assert_eq!(cluster.core_hosts(), 1, "this collector at least");
        assert_eq!(Cluster::file(member("a"), "/s".into(), 4).core_hosts(), 4);
    }

    #[test]
    fn older_states_are_ignored_except_over_the_cached_copy() {
        let mut cluster =
            Cluster::etcd(member("a"), "e".into(), "/p/".into(), 1, SystemTime::now());
        cluster.started_from_cache("/var/lib/x.json".into());
        assert!(cluster
            .view()
            .store
            .detail
            .is_some_and(|d| d.contains("cached copy")));
        assert!(cluster.observe(5, Some(5)));
        assert!(!cluster.observe(5, Some(5)), "the echo of our own commit");
        assert!(!cluster.observe(4, Some(4)));
        assert!(cluster.observe(9, None), "deleted at 9");
        assert_eq!(cluster.mod_revision(), None);
        assert_eq!(cluster.view().store.revision, Some(9));
    }
}
