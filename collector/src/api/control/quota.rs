//! Who may hold how many control connections: the bound on all of them
//! ([`QuotaPolicy::total`]) split by client, the client named by the
//! connecting process's user id (the socket's peer credentials,
//! `SO_PEERCRED`).
//!
//! * one user id holds at most [`QuotaPolicy::per_client`] connections, so
//!   one local client cannot take every place and lock msrctl out;
//! * [`QuotaPolicy::reserved`] places are kept for root and the collector's
//!   own user (the socket's owner, who run msrctl): other users together
//!   hold at most `total − reserved`.
//!
//! Sans-IO: the server asks [`ConnectionQuota::admit`] for each accepted
//! connection and calls [`ConnectionQuota::release`] when it ends. A
//! connection refused may wait a moment for a place (a client's closed
//! connections keep theirs until the server has seen them end); a client
//! that waited in vain gets no wait for [`NO_WAIT_AFTER_REFUSAL`]
//! ([`ConnectionQuota::may_wait`]), so its refused connections cost the
//! server no time.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// How long a client that waited for a place in vain is refused without
/// a wait.
pub const NO_WAIT_AFTER_REFUSAL: Duration = Duration::from_secs(1);

/// The bounds of a [`ConnectionQuota`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaPolicy {
    /// Connections open at once, over all clients.
    pub total: usize,
    /// Connections open at once per user id.
    pub per_client: usize,
    /// Places only root and the socket's owner may take.
    pub reserved: usize,
}

/// Which client a connection is from: its peer's user id, `None` when the
/// credentials could not be read (all such connections are one client).
pub type Client = Option<u32>;

/// Why a connection gets no place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every place is taken.
    Full {
        /// [`QuotaPolicy::total`].
        total: usize,
    },
    /// This client holds its share.
    ClientShare {
        /// The client.
        client: Client,
        /// [`QuotaPolicy::per_client`].
        per_client: usize,
    },
    /// The places left are kept for root and the socket's owner.
    Reserved {
        /// [`QuotaPolicy::reserved`].
        reserved: usize,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Full { total } => write!(f, "too many control connections (at most {total})"),
            Refusal::ClientShare {
                client: Some(uid),
                per_client,
            } => write!(
                f,
                "too many control connections from uid {uid} (at most {per_client} per user)"
            ),
            Refusal::ClientShare {
                client: None,
                per_client,
            } => write!(
                f,
                "too many control connections without peer credentials (at most {per_client})"
            ),
            Refusal::Reserved { reserved } => write!(
                f,
                "too many control connections: the last {reserved} are kept for root and the collector's user"
            ),
        }
    }
}

/// The connections open per client (module doc).
#[derive(Debug)]
pub struct ConnectionQuota {
    policy: QuotaPolicy,
    /// The socket's owner (the collector's user), privileged like root.
    owner: Option<u32>,
    open: HashMap<Client, usize>,
    total_open: usize,
    /// Of `total_open`, those of clients that are neither root nor owner.
    unprivileged_open: usize,
    /// When each client last waited for a place in vain (pruned as they
    /// expire).
    waited: HashMap<Client, Instant>,
}

impl ConnectionQuota {
    /// Nothing open; `owner` is the socket owner's user id.
    pub fn new(policy: QuotaPolicy, owner: Option<u32>) -> Self {
        Self {
            policy,
            owner,
            open: HashMap::new(),
            total_open: 0,
            unprivileged_open: 0,
            waited: HashMap::new(),
        }
    }

    /// Whether a refused connection of `client` may wait for a place: not
    /// within [`NO_WAIT_AFTER_REFUSAL`] of one that waited in vain.
    pub fn may_wait(&self, client: Client, now: Instant) -> bool {
        self.waited
            .get(&client)
            .is_none_or(|&at| now >= at + NO_WAIT_AFTER_REFUSAL)
    }

    /// Notes that a connection of `client` was refused after waiting (or
    /// without, while it may not wait).
    pub fn waited_in_vain(&mut self, client: Client, now: Instant) {
        if self.may_wait(client, now) {
            self.waited
                .retain(|_, &mut at| now < at + NO_WAIT_AFTER_REFUSAL);
            self.waited.insert(client, now);
        }
    }

    /// Whether `client` is root or the socket's owner.
    fn privileged(&self, client: Client) -> bool {
        client.is_some_and(|uid| uid == 0 || Some(uid) == self.owner)
    }

    /// Takes a place for a connection of `client`, or says why not.
    pub fn admit(&mut self, client: Client) -> Result<(), Refusal> {
        if self.total_open >= self.policy.total {
            return Err(Refusal::Full {
                total: self.policy.total,
            });
        }
        let held = self.open.get(&client).copied().unwrap_or(0);
        if held >= self.policy.per_client {
            return Err(Refusal::ClientShare {
                client,
                per_client: self.policy.per_client,
            });
        }
        let privileged = self.privileged(client);
        if !privileged
            && self.unprivileged_open >= self.policy.total.saturating_sub(self.policy.reserved)
        {
            return Err(Refusal::Reserved {
                reserved: self.policy.reserved,
            });
        }
        *self.open.entry(client).or_insert(0) += 1;
        self.total_open += 1;
        if !privileged {
            self.unprivileged_open += 1;
        }
        Ok(())
    }

    /// Gives back a place [`admit`](Self::admit) gave `client`.
    pub fn release(&mut self, client: Client) {
        let Some(held) = self.open.get_mut(&client) else {
            return;
        };
        *held -= 1;
        if *held == 0 {
            self.open.remove(&client);
        }
        self.total_open -= 1;
        if !self.privileged(client) {
            self.unprivileged_open -= 1;
        }
    }

    /// Connections open.
    pub fn open(&self) -> usize {
        self.total_open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: QuotaPolicy = QuotaPolicy {
        total: 256,
        per_client: 64,
        reserved: 16,
    };
    const OWNER: u32 = 998;

    fn fill(q: &mut ConnectionQuota, client: Client, n: usize) {
        for i in 0..n {
            assert_eq!(q.admit(client), Ok(()), "{client:?} #{i}");
        }
    }

    #[test]
    fn one_user_holding_its_share_does_not_stop_another() {
        let mut q = ConnectionQuota::new(POLICY, Some(OWNER));
        fill(&mut q, Some(1000), 64);
        assert_eq!(
            q.admit(Some(1000)),
            Err(Refusal::ClientShare {
                client: Some(1000),
                per_client: 64
            })
        );
        // msrctl, as root, as the collector's user or as another user.
        assert_eq!(q.admit(Some(0)), Ok(()));
        assert_eq!(q.admit(Some(OWNER)), Ok(()));
        assert_eq!(q.admit(Some(1001)), Ok(()));
        // A place given back can be taken again.
        q.release(Some(1000));
        assert_eq!(q.admit(Some(1000)), Ok(()));
        assert_eq!(q.open(), 67);
    }

    #[test]
    fn many_users_together_leave_the_reserve_to_root_and_the_owner() {
        let mut q = ConnectionQuota::new(POLICY, Some(OWNER));
        // 240 places for users other than root and the owner.
        for uid in 1000..1003 {
            fill(&mut q, Some(uid), 64);
        }
        fill(&mut q, Some(1003), 48);
        assert_eq!(q.admit(Some(1004)), Err(Refusal::Reserved { reserved: 16 }));
        assert_eq!(q.admit(None), Err(Refusal::Reserved { reserved: 16 }));
        fill(&mut q, Some(0), 8);
        fill(&mut q, Some(OWNER), 8);
        assert_eq!(q.admit(Some(0)), Err(Refusal::Full { total: 256 }));
        // One of the others leaves: its place goes to anyone.
        q.release(Some(1001));
        assert_eq!(q.admit(Some(1004)), Ok(()));
        assert_eq!(q.open(), 256);
    }

    #[test]
    fn a_client_that_waited_in_vain_waits_no_more_for_a_while() {
        let mut q = ConnectionQuota::new(POLICY, None);
        let t0 = Instant::now();
        assert!(q.may_wait(Some(1000), t0));
        q.waited_in_vain(Some(1000), t0);
        assert!(!q.may_wait(Some(1000), t0 + Duration::from_millis(999)));
        // Refusals meanwhile do not extend it.
        q.waited_in_vain(Some(1000), t0 + Duration::from_millis(500));
        assert!(q.may_wait(Some(1000), t0 + NO_WAIT_AFTER_REFUSAL));
        // Others wait as before.
        assert!(q.may_wait(Some(1001), t0));
        assert!(q.may_wait(None, t0));
    }

    #[test]
    fn root_too_holds_at_most_its_share_and_unknown_peers_are_one_client() {
        let mut q = ConnectionQuota::new(POLICY, None);
        fill(&mut q, Some(0), 64);
        assert!(matches!(q.admit(Some(0)), Err(Refusal::ClientShare { .. })));
        fill(&mut q, None, 64);
        let refusal = q.admit(None).expect_err("share");
        assert_eq!(
            refusal.to_string(),
            "too many control connections without peer credentials (at most 64)"
        );
        for _ in 0..64 {
            q.release(Some(0));
            q.release(None);
        }
        assert_eq!(q.open(), 0);
        // Releasing what was never admitted changes nothing.
        q.release(Some(5));
        assert_eq!(q.open(), 0);
    }
}
