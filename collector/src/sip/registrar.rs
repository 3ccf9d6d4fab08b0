//! The registrar for MSR accounts (SPEC §3; RFC 3261 §10.3, §22; RFC 7616).
//!
//! [`Registrar`] is sans-IO: the shell hands it each REGISTER with the
//! current time ([`Registrar::handle_register`]) and sends the response it
//! returns; it wakes the registrar at [`Registrar::poll_timeout`] to let
//! bindings lapse ([`Registrar::handle_timeout`]); and it drains
//! [`RegistrarEvent`]s ([`Registrar::poll_event`]) to update the load table
//! and the subscriber.
//!
//! Bindings are kept per AOR — the MSR name, the user part of the `To`
//! URI — with one contact per interface: the contact `<sip:msr_1@10.0.0.1:5040>;iface=bond1.2`
//! is named `bond1.2@msr_1`. A contact without `iface` is named after its
//! `host:port`. The MSR name and the interface name must follow the name
//! rules of [`crate::operator::names`] — the ones `msrctl` applies, so every MSR and
//! contact that registers can be drained and moved — or the REGISTER gets
//! `400` with the rule broken in the reason phrase.
//!
//! Authentication: a REGISTER without valid credentials is challenged with
//! `401` and one `WWW-Authenticate` per configured algorithm (SHA-256 first
//! by default, RFC 8760 §2.4), `qop="auth"`. Nonces are accepted for
//! `nonce_ttl`; a correct response computed with an expired (or unknown)
//! nonce gets a new challenge with `stale=true` (RFC 7616 §3.3). A wrong
//! password or an unknown user gets `403` and registers nothing, and so does
//! an account that registers an MSR name its `[[accounts]] msrs` list does
//! not allow. Against replay (RFC 7616 §5.3, §5.5): the nonce count must
//! grow with every use of a nonce (a nonce used without `qop` is good once),
//! and the digest `uri` must be the Request-URI (`400` otherwise). Nonces
//! are kept in issue order, so purging and evicting them costs O(1) each.
//!
//! Refused REGISTERs — `403` for credentials or an MSR name the account
//! may not register, `400` for a malformed request — are reported as
//! [`RefusalLog`]s ([`Registrar::poll_refusal`]) for the shell to log at
//! warn. They are rate-limited on the `now` given: one line per username
//! (else MSR name) per [`REFUSAL_WINDOW`], with the count of those held
//! back; at most [`MAX_REFUSAL_KEYS`] keys tracked; at most
//! [`MAX_REFUSAL_LINES_PER_WINDOW`] lines per window in all, the rest
//! counted. Challenges, stale nonces included, are the normal course of
//! digest authentication and are not reported.
//!
//! Expiries are kept in an ordered set of `(instant, msr, contact)`, in step
//! with the bindings, so [`Registrar::poll_timeout`] is O(1) and
//! [`Registrar::handle_timeout`] visits only the bindings that are due.
//!
//! Architecture invariant: no I/O, no clock, no task; `now` is always given.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use msr_shared::engine::EngineAddresses;
use msr_shared::sip::{self, Request, Response, StatusCode};
use tokio::time::Instant;

mod auth;
mod refusals;
mod request;
pub mod saved;
use auth::{challenge_key, AuthOutcome, NonceUse};
use refusals::RefusalLimiter;
pub use refusals::{
    Refusal, RefusalLog, RefusalReason, MAX_FIELD_CHARS, MAX_KEYS as MAX_REFUSAL_KEYS,
    MAX_LINES_PER_WINDOW as MAX_REFUSAL_LINES_PER_WINDOW, WINDOW as REFUSAL_WINDOW,
};
use request::{
    agent_version, bad_request, parse_contacts, warning, ContactSpec, ContactsSpec, Malformed,
};
pub use request::{MAX_CONTACTS_PER_MSR, MAX_CONTACT_URI_LEN};

use crate::config::{Account, DigestAlgorithm, SipConfig};
use crate::operator::names::{ContactName, MsrName};

/// One registered contact of an MSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The MSR name (AOR user part).
    pub msr: MsrName,
    /// Contact name `{iface}@{msr}` (SPEC §3).
    pub contact: ContactName,
    /// The contact URI, e.g. `sip:msr_1@127.0.0.1:5071;engine=…`: the
    /// agent's address (where SUBSCRIBE goes) with the engine's parameters.
    pub uri: String,
    /// The media engine's addresses, from the contact URI's parameters
    /// (SPEC §3, [`msr_shared::engine`]); `None` when the agent sent none.
    pub engine: Option<EngineAddresses>,
    /// The agent version from `User-Agent` (`msr-agent/0.1.0` → `0.1.0`).
    pub version: Option<String>,
    /// When the binding lapses unless refreshed.
    pub expires_at: Instant,
    /// The registration's Call-ID (RFC 3261 §10.2: constant per account;
    /// a new one means the MSR restarted).
    pub call_id: String,
    /// The CSeq number of the REGISTER that last changed the binding
    /// (RFC 3261 §10.3 step 7).
    pub cseq: u32,
    /// The top `Via` branch of that REGISTER: a retransmission of it
    /// (same Call-ID, CSeq and branch) is answered again, unchanged
    /// (module docs).
    pub branch: Option<String>,
    /// Where the REGISTER came from, when the shell knows it.
    pub source: Option<SocketAddr>,
}

#[cfg(test)]
impl Binding {
    /// A binding of `contact` of `msr` at `uri` until `expires_at`, for the
    /// tests of the cores that borrow bindings (the registration's own
    /// fields are placeholders).
    pub(crate) fn test(contact: &str, msr: &str, uri: &str, expires_at: Instant) -> Self {
        Self {
            msr: MsrName::new(msr).expect("a test's msr name"),
            contact: ContactName::new(contact).expect("a test's contact name"),
            uri: uri.into(),
            engine: None,
            version: Some("0.1.0".into()),
            expires_at,
            call_id: format!("reg-{contact}"),
            cseq: 1,
            branch: None,
            source: None,
        }
    }
}

/// Why a binding went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovalCause {
    /// `Expires: 0` for this contact or `Contact: *`.
    Unregistered,
    /// Not refreshed before it expired.
    Lapsed,
}

impl std::fmt::Display for RemovalCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RemovalCause::Unregistered => "unregistered",
            RemovalCause::Lapsed => "lapsed",
        })
    }
}

/// A change of the bindings, for the load table and the subscriber.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrarEvent {
    /// A contact registered that was not registered before.
    BindingAdded(Binding),
    /// A registered contact was refreshed (its URI or version may have changed).
    BindingRefreshed(Binding),
    /// A registered contact registered again with a new Call-ID: the MSR
    /// restarted (RFC 3261 §10.2, SPEC §3), so a subscription to it is
    /// dead and must start anew at once.
    BindingRestarted(Binding),
    /// A contact went away.
    BindingRemoved {
        /// The binding as it was.
        binding: Binding,
        /// Why.
        cause: RemovalCause,
    },
}

/// The registrar: credentials, outstanding nonces and bindings.
#[derive(Debug)]
pub struct Registrar {
    realm: String,
    nonce_ttl: Duration,
    min_expires: u32,
    max_expires: u32,
    algorithms: Vec<DigestAlgorithm>,
    /// auth_name → the account (password and the MSR names it may register).
    credentials: HashMap<String, Account>,
    /// Outstanding nonces and their use.
    nonces: HashMap<String, NonceUse>,
    /// The nonces in issue order (issue times never decrease).
    nonce_order: VecDeque<(Instant, String)>,
    nonce_counter: u64,
    /// The nonce each challenged REGISTER got, by its Call-ID, CSeq and
    /// top `Via` branch: its retransmission gets the same (`auth.rs`).
    challenged: HashMap<String, String>,
    /// msr → contact name → binding.
    aors: BTreeMap<MsrName, BTreeMap<ContactName, Binding>>,
    /// `(expires_at, msr, contact)` of every binding in `aors`.
    expiries: BTreeSet<(Instant, MsrName, ContactName)>,
    events: VecDeque<RegistrarEvent>,
    /// Refused REGISTERs, rate-limited for the log.
    refusals: RefusalLimiter,
}

/// The `expiries` key of a binding.
fn expiry_key(b: &Binding) -> (Instant, MsrName, ContactName) {
    (b.expires_at, b.msr.clone(), b.contact.clone())
}

/// Where a REGISTER's bindings come from: its dialog-less identity
/// (RFC 3261 §10.2) and its sender.
struct Origin<'a> {
    call_id: &'a str,
    cseq: u32,
    branch: Option<&'a str>,
    version: Option<String>,
    source: Option<SocketAddr>,
}

impl Registrar {
    /// A registrar with the `[sip]` settings and `[[accounts]]` credentials.
    pub fn new(sip: &SipConfig, accounts: &[Account]) -> Self {
        Self {
            realm: sip.realm.clone(),
            nonce_ttl: sip.nonce_ttl,
            min_expires: sip.min_expires,
            max_expires: sip.max_expires,
            algorithms: sip.digest_algorithms.clone(),
            credentials: accounts
                .iter()
                .map(|a| (a.auth_name.clone(), a.clone()))
                .collect(),
            nonces: HashMap::new(),
            nonce_order: VecDeque::new(),
            nonce_counter: 0,
            challenged: HashMap::new(),
            aors: BTreeMap::new(),
            expiries: BTreeSet::new(),
            events: VecDeque::new(),
            refusals: RefusalLimiter::new(refusals::POLICY),
        }
    }

    /// Takes a reloaded `[sip]` and `[[accounts]]` (SPEC §13): realm, nonce
    /// lifetime, expiry bounds, algorithms and credentials apply from the
    /// next REGISTER on; bindings stay (one whose account is gone is
    /// refused at its next REGISTER and lapses).
    pub fn reconfigure(&mut self, sip: &SipConfig, accounts: &[Account]) {
        self.realm = sip.realm.clone();
        self.nonce_ttl = sip.nonce_ttl;
        self.min_expires = sip.min_expires;
        self.max_expires = sip.max_expires;
        self.algorithms = sip.digest_algorithms.clone();
        self.credentials = accounts
            .iter()
            .map(|a| (a.auth_name.clone(), a.clone()))
            .collect();
    }

    /// Handles one REGISTER received at `now` and returns the final response
    /// to send: `200` (listing every current contact with `;expires=N`),
    /// `401` (challenge), `403` (bad credentials), `423` (too brief, with
    /// `Min-Expires`) or `400` (malformed). Changes are reported as
    /// [`RegistrarEvent`]s, `403`s and `400`s as [`RefusalLog`]s.
    pub fn handle_register(
        &mut self,
        now: Instant,
        req: &Request,
        source: Option<SocketAddr>,
    ) -> Response {
        self.purge_nonces(now);
        // RFC 3261 §8.2.7: a retransmission is answered with the same tag.
        let to_tag = sip::stateless_tag(&req.headers);
        let (msr, call_id, cseq) = match self.check_structure(req) {
            Ok(v) => v,
            Err(e) => return self.bad_request(now, req, source, &to_tag, &e),
        };
        let branch = sip::header(&req.headers, "Via").and_then(|v| sip::param(v, "branch"));
        if self.is_retransmission(&msr, &call_id, cseq, branch.as_deref()) {
            return self.ok_response(now, req, &msr, &to_tag);
        }
        match self.authenticate(now, req, &msr) {
            AuthOutcome::Ok => {}
            AuthOutcome::Challenge { stale } => {
                let key = challenge_key(&call_id, cseq, branch.as_deref());
                return self.challenge(now, req, &to_tag, key, stale);
            }
            AuthOutcome::Forbidden(reason) => {
                let mut resp = sip::response(req, StatusCode::Forbidden, Some(&to_tag));
                // The agent logs this Warning (RFC 3261 §20.43; SPEC §13:
                // refusals say why). A wrong password and an unknown name
                // read alike, so the answer does not tell a stranger which
                // names exist; the collector's log names which it was.
                let why = match &reason {
                    RefusalReason::MsrNotAllowed => format!(
                        "this account may not register msr {msr} ([[accounts]] msrs)"
                    ),
                    _ => "credentials refused: check auth_name and auth_password against the collector's [[accounts]]".to_owned(),
                };
                sip::push_header(&mut resp.headers, "Warning", warning(&why));
                self.refuse(now, req, source, reason, &resp);
                return resp;
            }
            AuthOutcome::Malformed(why) => {
                return self.bad_request(now, req, source, &to_tag, &why)
            }
        }
        // RFC 3261 §10.2.3, §10.3 step 6: without a Contact the REGISTER
        // asks for the bindings, once authenticated like any other (RFC
        // 4475 §3.3.7: an unknown scheme gets the challenge, not a 400).
        if sip::header_all(&req.headers, "Contact").is_empty() {
            return self.ok_response(now, req, &msr, &to_tag);
        }
        let contacts = match parse_contacts(req, &msr) {
            Ok(c) => c,
            Err(e) => return self.bad_request(now, req, source, &to_tag, &e),
        };
        if let Err(e) = self.check_cseq(&msr, &call_id, cseq, &contacts) {
            return self.bad_request(now, req, source, &to_tag, &e);
        }
        match contacts {
            ContactsSpec::Wildcard => {
                if let Some(bindings) = self.aors.remove(&msr) {
                    for binding in bindings.into_values() {
                        self.expiries.remove(&expiry_key(&binding));
                        self.events.push_back(RegistrarEvent::BindingRemoved {
                            binding,
                            cause: RemovalCause::Unregistered,
                        });
                    }
                }
            }
            ContactsSpec::List(list) => {
                if list
                    .iter()
                    .any(|c| c.expires != 0 && c.expires < self.min_expires)
                {
                    let mut resp = sip::response(req, StatusCode::IntervalTooBrief, Some(&to_tag));
                    sip::push_header(
                        &mut resp.headers,
                        "Min-Expires",
                        self.min_expires.to_string(),
                    );
                    return resp;
                }
                let version = sip::header(&req.headers, "User-Agent").and_then(agent_version);
                for c in list {
                    let origin = Origin {
                        call_id: &call_id,
                        cseq,
                        branch: branch.as_deref(),
                        version: version.clone(),
                        source,
                    };
                    self.apply(now, &msr, origin, c);
                }
            }
        }
        self.ok_response(now, req, &msr, &to_tag)
    }

    /// Whether a REGISTER is a retransmission of the one that last changed
    /// a binding of `msr`: the same Call-ID, CSeq and top `Via` branch
    /// (RFC 3261 §17.2.3). The collector answers statelessly (RFC 3261
    /// §8.2.7), so it answers that one again, as its server transaction
    /// would have, and changes nothing; a lost `200` is then not read as a
    /// failed registration. The branch is saved with the binding, so this
    /// holds across a restart too.
    fn is_retransmission(&self, msr: &str, call_id: &str, cseq: u32, branch: Option<&str>) -> bool {
        let Some(branch) = branch else {
            return false;
        };
        self.aors.get(msr).is_some_and(|aor| {
            aor.values().any(|b| {
                b.call_id == call_id && b.cseq == cseq && b.branch.as_deref() == Some(branch)
            })
        })
    }

    /// RFC 3261 §10.3 step 7: a REGISTER with a binding's Call-ID and a
    /// CSeq not above the binding's changes nothing (a replay, or a request
    /// overtaken by a later one); a new Call-ID is always taken.
    fn check_cseq(
        &self,
        msr: &str,
        call_id: &str,
        cseq: u32,
        contacts: &ContactsSpec,
    ) -> Result<(), Malformed> {
        let Some(aor) = self.aors.get(msr) else {
            return Ok(());
        };
        let affected = |b: &Binding| match contacts {
            ContactsSpec::Wildcard => true,
            ContactsSpec::List(list) => list.iter().any(|c| c.name == b.contact || c.uri == b.uri),
        };
        match aor
            .values()
            .find(|b| b.call_id == call_id && b.cseq >= cseq && affected(b))
        {
            Some(b) => Err(Malformed::OldCSeq {
                got: cseq,
                last: b.cseq,
            }),
            None => Ok(()),
        }
    }

    fn apply(&mut self, now: Instant, msr: &MsrName, origin: Origin<'_>, c: ContactSpec) {
        let Origin {
            call_id,
            cseq,
            branch,
            version,
            source,
        } = origin;
        let aor = self.aors.entry(msr.clone()).or_default();
        // A contact is matched by name, or by URI when its interface name changed.
        let existing = if aor.contains_key(&c.name) {
            Some(c.name.clone())
        } else {
            aor.iter()
                .find(|(_, b)| b.uri == c.uri)
                .map(|(k, _)| k.clone())
        };
        if c.expires == 0 {
            if let Some(binding) = existing.and_then(|k| aor.remove(&k)) {
                self.expiries.remove(&expiry_key(&binding));
                self.events.push_back(RegistrarEvent::BindingRemoved {
                    binding,
                    cause: RemovalCause::Unregistered,
                });
            }
        } else {
            let binding = Binding {
                msr: msr.clone(),
                contact: c.name.clone(),
                uri: c.uri,
                engine: c.engine,
                version,
                expires_at: now + Duration::from_secs(u64::from(c.expires.min(self.max_expires))),
                call_id: call_id.to_owned(),
                cseq,
                branch: branch.map(str::to_owned),
                source,
            };
            self.expiries.insert(expiry_key(&binding));
            match existing {
                Some(old_name) if old_name == c.name => {
                    let restarted = match aor.insert(c.name, binding.clone()) {
                        Some(old) => {
                            if old.expires_at != binding.expires_at {
                                self.expiries.remove(&expiry_key(&old));
                            }
                            old.call_id != binding.call_id
                        }
                        None => false,
                    };
                    self.events.push_back(if restarted {
                        RegistrarEvent::BindingRestarted(binding)
                    } else {
                        RegistrarEvent::BindingRefreshed(binding)
                    });
                }
                Some(old_name) => {
                    if let Some(old) = aor.remove(&old_name) {
                        self.expiries.remove(&expiry_key(&old));
                        self.events.push_back(RegistrarEvent::BindingRemoved {
                            binding: old,
                            cause: RemovalCause::Unregistered,
                        });
                    }
                    aor.insert(c.name, binding.clone());
                    self.events.push_back(RegistrarEvent::BindingAdded(binding));
                }
                None => {
                    aor.insert(c.name, binding.clone());
                    self.events.push_back(RegistrarEvent::BindingAdded(binding));
                }
            }
        }
        if aor.is_empty() {
            self.aors.remove(msr);
        }
    }

    fn ok_response(&self, now: Instant, req: &Request, msr: &str, to_tag: &str) -> Response {
        let mut resp = sip::response(req, StatusCode::OK, Some(to_tag));
        if let Some(aor) = self.aors.get(msr) {
            for b in aor.values() {
                let secs = b.expires_at.saturating_duration_since(now).as_secs();
                let iface = b
                    .contact
                    .rsplit_once('@')
                    .map_or(b.contact.as_str(), |(i, _)| i);
                sip::push_header(
                    &mut resp.headers,
                    "Contact",
                    format!("<{}>;iface={iface};expires={secs}", b.uri),
                );
            }
        }
        resp
    }

    /// Answers `400` to `req` and reports the refusal.
    fn bad_request(
        &mut self,
        now: Instant,
        req: &Request,
        source: Option<SocketAddr>,
        to_tag: &str,
        why: &dyn std::fmt::Display,
    ) -> Response {
        let resp = bad_request(req, to_tag, why);
        self.refuse(
            now,
            req,
            source,
            RefusalReason::Malformed(why.to_string()),
            &resp,
        );
        resp
    }

    /// Reports a refused REGISTER (answered with `resp`) to the rate limit.
    fn refuse(
        &mut self,
        now: Instant,
        req: &Request,
        source: Option<SocketAddr>,
        reason: RefusalReason,
        resp: &Response,
    ) {
        let msr = sip::header(&req.headers, "To").and_then(|to| sip::uri_user(sip::addr_uri(to)));
        let auth_name = self.auth_username(req);
        let refusal = Refusal::new(
            msr,
            auth_name.as_deref(),
            reason,
            resp.status_code.clone(),
            source,
        );
        self.refusals.record(now, refusal);
    }

    /// The next refused REGISTER (or count of refusals) to log, as the
    /// rate limit lets them through.
    pub fn poll_refusal(&mut self) -> Option<RefusalLog> {
        self.refusals.poll()
    }

    /// Releases the refusals the rate limit holds back (at shutdown), for
    /// [`poll_refusal`](Self::poll_refusal); still within the line budget.
    pub fn flush_refusals(&mut self, now: Instant) {
        self.refusals.finish(now);
    }

    /// Lets every binding whose expiry is at or before `now` lapse, and
    /// ends the refusal rate-limit windows that are over.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.purge_nonces(now);
        self.refusals.advance(now);
        while self.expiries.first().is_some_and(|(at, _, _)| *at <= now) {
            let Some((_, msr, contact)) = self.expiries.pop_first() else {
                break;
            };
            let Some(aor) = self.aors.get_mut(&msr) else {
                continue;
            };
            if let Some(binding) = aor.remove(&contact) {
                if aor.is_empty() {
                    self.aors.remove(&msr);
                }
                self.events.push_back(RegistrarEvent::BindingRemoved {
                    binding,
                    cause: RemovalCause::Lapsed,
                });
            }
        }
    }

    /// The next instant [`handle_timeout`](Self::handle_timeout) has work:
    /// the earliest binding expiry or end of a refusal rate-limit window, O(1).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let expiry = self.expiries.first().map(|(at, _, _)| *at);
        expiry.into_iter().chain(self.refusals.poll_timeout()).min()
    }

    /// Panics unless `expiries` holds exactly one entry per binding.
    #[cfg(test)]
    fn check_expiries(&self) {
        let expected: BTreeSet<_> = self.bindings().map(expiry_key).collect();
        assert_eq!(self.expiries, expected, "expiry index out of date");
    }

    /// Takes back bindings saved before a restart ([`saved::decode`]), each
    /// reported as [`RegistrarEvent::BindingAdded`] so it is subscribed to
    /// at once (SPEC §3). An expiry beyond `max_expires` from `now` is cut
    /// to it; a binding already known is left as it is.
    pub fn restore(&mut self, now: Instant, bindings: Vec<Binding>) {
        let longest = now + Duration::from_secs(u64::from(self.max_expires));
        for mut binding in bindings {
            binding.expires_at = binding.expires_at.min(longest);
            let aor = self.aors.entry(binding.msr.clone()).or_default();
            if aor.contains_key(&binding.contact) {
                continue;
            }
            self.expiries.insert(expiry_key(&binding));
            aor.insert(binding.contact.clone(), binding.clone());
            self.events.push_back(RegistrarEvent::BindingAdded(binding));
        }
    }

    /// The next change since the last call.
    pub fn poll_event(&mut self) -> Option<RegistrarEvent> {
        self.events.pop_front()
    }

    /// Whether a change waits for [`poll_event`](Self::poll_event): right
    /// after [`handle_register`](Self::handle_register), whether that
    /// REGISTER changed a binding.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Every binding, by MSR then contact name.
    pub fn bindings(&self) -> impl Iterator<Item = &Binding> + '_ {
        self.aors.values().flat_map(|aor| aor.values())
    }

    /// The bindings of one MSR, by contact name.
    pub fn contacts_of(&self, msr: &str) -> Vec<&Binding> {
        self.aors
            .get(msr)
            .map(|aor| aor.values().collect())
            .unwrap_or_default()
    }

    /// The binding of `contact` of `msr`, if registered.
    pub fn binding(&self, msr: &str, contact: &str) -> Option<&Binding> {
        self.aors.get(msr)?.get(contact)
    }

    /// Whether at least one contact of `msr` is registered.
    pub fn is_registered(&self, msr: &str) -> bool {
        self.aors.contains_key(msr)
    }
}

#[cfg(test)]
mod tests;
