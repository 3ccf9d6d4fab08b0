//! Digest authentication of REGISTERs (RFC 3261 §22, RFC 7616): the
//! nonces the registrar issued and their use, the `401` challenge with one
//! `WWW-Authenticate` per configured algorithm, and the checks a REGISTER's
//! `Authorization` must pass (the parent module's docs give the rules,
//! replay protection included). Kept apart from the bindings: it decides
//! only whether a REGISTER may change them.

use msr_shared::sip::digest::{self, Credentials};
use msr_shared::sip::transaction::server::TIMER_J;
use msr_shared::sip::{self, Request, Response, StatusCode, Uri};
use tokio::time::Instant;

use super::{RefusalReason, Registrar};

/// Upper bound on outstanding nonces (older ones are forgotten first).
pub(super) const MAX_NONCES: usize = 10_000;

/// What the registrar remembers of a nonce it issued.
#[derive(Debug, Clone)]
pub(super) struct NonceUse {
    issued: Instant,
    /// The highest nonce count accepted with it; `u32::MAX` once it was
    /// used without `qop` (such a use cannot be told from a replay).
    last_nc: Option<u32>,
    /// The challenged REGISTER's [`challenge_key`], forgotten with the
    /// nonce.
    request: String,
}

/// A challenged REGISTER's identity: its Call-ID, CSeq number and top `Via`
/// branch, the same in each of its retransmissions, as their SHA-256. The
/// registrar keeps it twice for each of up to [`MAX_NONCES`] nonces, for
/// twice the nonce TTL, and strangers choose it: kept as written, a
/// Call-ID or branch of 60 KB in each challenged REGISTER held over a
/// gigabyte.
pub(super) fn challenge_key(call_id: &str, cseq: u32, branch: Option<&str>) -> String {
    digest::Algorithm::Sha256.hash(&format!("{call_id}\n{cseq}\n{}", branch.unwrap_or("")))
}

impl Registrar {
    /// The digest username of `req`: from the `Authorization` for our
    /// realm, else from the first one.
    pub(super) fn auth_username(&self, req: &Request) -> Option<String> {
        let all = sip::header_all(&req.headers, "Authorization");
        let ours = all
            .iter()
            .find(|v| digest::digest_param(v, "realm").as_deref() == Some(self.realm.as_str()));
        ours.or(all.first())
            .and_then(|v| digest::digest_param(v, "username"))
    }

    pub(super) fn authenticate(&mut self, now: Instant, req: &Request, msr: &str) -> AuthOutcome {
        let Some(raw) = sip::header_all(&req.headers, "Authorization")
            .into_iter()
            .find(|v| digest::digest_param(v, "realm").as_deref() == Some(self.realm.as_str()))
        else {
            return AuthOutcome::Challenge { stale: false };
        };
        let Some(credentials) = Credentials::parse(raw) else {
            return AuthOutcome::Malformed("malformed authorization header");
        };
        // An algorithm we did not offer: challenge again with the ones we do.
        let Some(algorithm) = credentials
            .digest_algorithm()
            .filter(|a| self.algorithms.contains(a))
        else {
            return AuthOutcome::Challenge { stale: false };
        };
        if !same_uri(&credentials.uri, &req.uri) {
            return AuthOutcome::Malformed("digest uri does not match the request-uri");
        }
        let Some(account) = self.credentials.get(&credentials.username) else {
            return AuthOutcome::Forbidden(RefusalReason::UnknownAuthName);
        };
        if !credentials.verify(algorithm, &account.password, "REGISTER") {
            return AuthOutcome::Forbidden(RefusalReason::WrongPassword);
        }
        if !account.msrs.is_empty() && !account.msrs.iter().any(|m| m == msr) {
            return AuthOutcome::Forbidden(RefusalReason::MsrNotAllowed);
        }
        let Some(nonce) = self.nonces.get_mut(&credentials.nonce) else {
            return AuthOutcome::Challenge { stale: true };
        };
        if now >= nonce.issued + self.nonce_ttl {
            return AuthOutcome::Challenge { stale: true };
        }
        let count = match (&credentials.qop, credentials.nonce_count()) {
            (Some(_), Some(count)) => count,
            (Some(_), None) => return AuthOutcome::Malformed("qop without a valid nc"),
            (None, _) => u32::MAX,
        };
        if nonce.last_nc.is_some_and(|last| count <= last) {
            // A replayed (or reordered) use of the nonce.
            return AuthOutcome::Challenge { stale: true };
        }
        nonce.last_nc = Some(count);
        AuthOutcome::Ok
    }

    /// The `401` to `req`. A retransmission of a REGISTER challenged within
    /// its transaction's lifetime (Timer J, RFC 3261 §17.2.2) gets the
    /// nonce the first got: a stateless answer to the same request is the
    /// same answer (§8.2.7), so a client that takes the second 401 after
    /// answering the first does not hold a nonce the registrar replaced.
    pub(super) fn challenge(
        &mut self,
        now: Instant,
        req: &Request,
        to_tag: &str,
        key: String,
        stale: bool,
    ) -> Response {
        let earlier = self.challenged.get(&key).filter(|n| {
            self.nonces
                .get(n.as_str())
                .is_some_and(|u| now < u.issued + TIMER_J)
        });
        let nonce = match earlier {
            Some(nonce) => nonce.clone(),
            None => self.issue_nonce(now, key),
        };
        let mut resp = sip::response(req, StatusCode::Unauthorized, Some(to_tag));
        for alg in &self.algorithms {
            let mut value = format!(
                "Digest realm=\"{}\", nonce=\"{nonce}\", algorithm={}, qop=\"auth\"",
                self.realm,
                alg.token()
            );
            if stale {
                value.push_str(", stale=true");
            }
            sip::push_header(&mut resp.headers, "WWW-Authenticate", value);
        }
        resp
    }

    /// A fresh nonce for the REGISTER `key`, the oldest forgotten past
    /// [`MAX_NONCES`].
    fn issue_nonce(&mut self, now: Instant, key: String) -> String {
        self.nonce_counter += 1;
        let nonce = format!("{}{:08x}", sip::random_token(), self.nonce_counter);
        while self.nonces.len() >= MAX_NONCES {
            match self.nonce_order.pop_front() {
                Some((_, oldest)) => self.forget_nonce(&oldest),
                None => break,
            }
        }
        // The same REGISTER challenged again after Timer J gets a new
        // nonce; the old one stays good until its TTL.
        self.challenged.insert(key.clone(), nonce.clone());
        self.nonces.insert(
            nonce.clone(),
            NonceUse {
                issued: now,
                last_nc: None,
                request: key,
            },
        );
        self.nonce_order.push_back((now, nonce.clone()));
        nonce
    }

    /// Forgets `nonce` and which REGISTER it challenged.
    fn forget_nonce(&mut self, nonce: &str) {
        if let Some(used) = self.nonces.remove(nonce) {
            if self
                .challenged
                .get(&used.request)
                .is_some_and(|n| n == nonce)
            {
                self.challenged.remove(&used.request);
            }
        }
    }

    /// Forgets nonces one TTL past their expiry (until then a late use is
    /// answered `stale=true` rather than as unknown; both get `stale=true`).
    pub(super) fn purge_nonces(&mut self, now: Instant) {
        let keep = self.nonce_ttl * 2;
        while let Some((issued, _)) = self.nonce_order.front() {
            if now < *issued + keep {
                break;
            }
            if let Some((_, nonce)) = self.nonce_order.pop_front() {
                self.forget_nonce(&nonce);
            }
        }
    }
}

pub(super) enum AuthOutcome {
    Ok,
    Challenge { stale: bool },
    Forbidden(RefusalReason),
    Malformed(&'static str),
}

/// Whether the digest `uri` names the Request-URI (RFC 3261 §22.4: they
/// must be equal; compared as parsed URIs, so case and parameter order in
/// the scheme, host or transport do not matter).
fn same_uri(digest_uri: &str, request_uri: &Uri) -> bool {
    match Uri::try_from(digest_uri) {
        Ok(uri) => uri == *request_uri,
        Err(_) => digest_uri == request_uri.to_string(),
    }
}
