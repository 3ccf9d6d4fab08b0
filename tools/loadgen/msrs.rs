//! The fake MSRs of `notify` and `flood`'s peers: each MSR's REGISTER with
//! its digest answer, its subscription dialog, its NOTIFYs with their own
//! UDP timers (RFC 3261 §17.1.2: T1, T2, Timer F) and the counters; and the
//! links they send on (UDP sockets, or held TCP/TLS connections).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{DigestChoice, Transport, T1, T2, TIMER_F, USER_AGENT};
use anyhow::Context;
use msr_shared::event_package::{LoadReport, CONTENT_TYPE, EVENT};
use msr_shared::sip::{self, Method, SipMessage, StatusCode};
use rsipstack::dialog::authenticate::compute_digest;
use rsipstack::sip::headers::auth::{Algorithm, AuthQop};
use tokio::net::UdpSocket;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Register,
    Notify,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Setup,
    Measured,
    Drain,
}

pub(crate) struct Pending {
    pub(crate) kind: Kind,
    pub(crate) msr: usize,
    pub(crate) sock: usize,
    pub(crate) bytes: Arc<[u8]>,
    pub(crate) first_sent: Instant,
    pub(crate) next_retx: Instant,
    pub(crate) interval: Duration,
    pub(crate) retx: u32,
    pub(crate) measured: bool,
}

pub(crate) struct Dialog {
    pub(crate) call_id: String,
    /// Our tag (the To-tag of our 200).
    pub(crate) local_tag: String,
    /// The SUBSCRIBE's `From` value (URI and the collector's tag): our NOTIFY's `To`.
    pub(crate) remote_from: String,
    /// The SUBSCRIBE's `To` URI: our NOTIFY's `From`.
    pub(crate) local_uri: String,
    /// Where NOTIFYs go (the SUBSCRIBE's Contact).
    pub(crate) remote_target: String,
    pub(crate) cseq: u32,
    pub(crate) expires: u32,
    pub(crate) granted_at: Instant,
    /// The first NOTIFY of the dialog was answered 200.
    pub(crate) confirmed: bool,
}

pub(crate) struct Msr {
    pub(crate) name: String,
    pub(crate) sock: usize,
    pub(crate) reg_call_id: String,
    pub(crate) reg_from_tag: String,
    pub(crate) reg_cseq: u32,
    pub(crate) reg_expires: u32,
    pub(crate) registered: bool,
    pub(crate) reg_failed: Option<u16>,
    pub(crate) dialog: Option<Dialog>,
    /// Dialogs the collector created for this MSR.
    pub(crate) dialogs: u32,
    pub(crate) notify_seq: u64,
    pub(crate) last_load_sent: Option<u8>,
    /// NOTIFYs of this MSR without a final answer yet.
    pub(crate) in_flight: u32,
}

#[derive(Default, Debug, Clone)]
pub(crate) struct Counters {
    pub(crate) register_sent: u64,
    pub(crate) register_retx: u64,
    pub(crate) register_401: u64,
    pub(crate) register_423: u64,
    pub(crate) register_ok: u64,
    pub(crate) register_other: BTreeMap<u16, u64>,
    pub(crate) subscribe_initial: u64,
    pub(crate) subscribe_refresh: u64,
    pub(crate) subscribe_unsubscribe: u64,
    pub(crate) subscribe_retransmitted: u64,
    pub(crate) subscribe_rejected: u64,
    pub(crate) other_requests: u64,
    /// OPTIONS keepalives from the collector (SPEC §5), answered 200.
    pub(crate) options_answered: u64,
    pub(crate) parse_errors: u64,
    pub(crate) stray_responses: u64,
}

#[derive(Default, Debug, Clone)]
pub(crate) struct NotifyCounters {
    pub(crate) sent: u64,
    pub(crate) ok: u64,
    pub(crate) non_ok: BTreeMap<u16, u64>,
    /// NOTIFYs retransmitted at least once.
    pub(crate) retransmitted: u64,
    /// Retransmissions in all.
    pub(crate) retransmissions: u64,
    /// Given up at Timer F, or unanswered when the run ended.
    pub(crate) lost: u64,
    /// Answers to a transaction already answered or given up (late).
    pub(crate) late_answers: u64,
    pub(crate) coalesced: u64,
    /// Send time → final answer, µs.
    pub(crate) latency_us: Vec<u64>,
    pub(crate) last_answer: Option<Instant>,
}

pub(crate) struct State {
    pub(crate) collector: SocketAddr,
    pub(crate) transport: Transport,
    pub(crate) local_addrs: Vec<SocketAddr>,
    pub(crate) auth_name: String,
    pub(crate) password: String,
    pub(crate) digest: DigestChoice,
    pub(crate) max_sub_expires: u32,
    pub(crate) msrs: Vec<Msr>,
    pub(crate) pending: HashMap<String, Pending>,
    pub(crate) phase: Phase,
    pub(crate) c: Counters,
    pub(crate) setup: NotifyCounters,
    pub(crate) measured: NotifyCounters,
}

pub(crate) type Out = Vec<(usize, SocketAddr, Arc<[u8]>)>;

pub(crate) fn key(call_id: &str, cseq: u32) -> String {
    format!("{cseq} {call_id}")
}

pub(crate) fn branch() -> String {
    format!("z9hG4bK{}", sip::random_token())
}

/// The load MSR `i` reports in its `seq`-th NOTIFY: varies every time.
pub(crate) fn load_for(i: usize, seq: u64) -> u8 {
    ((seq.wrapping_mul(37) + (i as u64).wrapping_mul(11)) % 101) as u8
}

impl State {
    pub(crate) fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn counters(&mut self, measured: bool) -> &mut NotifyCounters {
        if measured {
            &mut self.measured
        } else {
            &mut self.setup
        }
    }

    pub(crate) fn register_request(
        &mut self,
        i: usize,
        authorization: Option<String>,
    ) -> Arc<[u8]> {
        let collector = self.collector;
        let local = self.local_addrs[self.msrs[i].sock];
        let m = &mut self.msrs[i];
        m.reg_cseq += 1;
        let ruri = self.transport.uri(None, collector);
        let contact = self.transport.uri(Some(&m.name), local);
        let via = self.transport.via();
        let mut text = format!(
            "REGISTER {ruri} SIP/2.0\r\n\
             Via: SIP/2.0/{via} {local};branch={};rport\r\n\
             Max-Forwards: 70\r\n\
             From: <sip:{name}@{collector}>;tag={tag}\r\n\
             To: <sip:{name}@{collector}>\r\n\
             Call-ID: {cid}\r\n\
             CSeq: {cseq} REGISTER\r\n\
             Contact: <{contact}>;iface=lo\r\n\
             Expires: {exp}\r\n\
             User-Agent: {USER_AGENT}\r\n",
            branch(),
            name = m.name,
            tag = m.reg_from_tag,
            cid = m.reg_call_id,
            cseq = m.reg_cseq,
            exp = m.reg_expires,
        );
        if let Some(a) = authorization {
            text.push_str(&format!("Authorization: {a}\r\n"));
        }
        text.push_str("Content-Length: 0\r\n\r\n");
        Arc::from(text.into_bytes())
    }

    /// Queues REGISTER for MSR `i` (first attempt or retry) and records it.
    pub(crate) fn send_register(
        &mut self,
        i: usize,
        authorization: Option<String>,
        now: Instant,
        out: &mut Out,
    ) {
        let bytes = self.register_request(i, authorization);
        let m = &self.msrs[i];
        let k = key(&m.reg_call_id, m.reg_cseq);
        let sock = m.sock;
        self.pending.insert(
            k,
            Pending {
                kind: Kind::Register,
                msr: i,
                sock,
                bytes: bytes.clone(),
                first_sent: now,
                next_retx: now + T1,
                interval: T1,
                retx: 0,
                measured: false,
            },
        );
        self.c.register_sent += 1;
        out.push((sock, self.collector, bytes));
    }

    /// Builds the next NOTIFY of MSR `i`'s dialog; `None` without a dialog.
    pub(crate) fn send_notify(&mut self, i: usize, now: Instant, out: &mut Out) -> bool {
        let measured = self.phase == Phase::Measured;
        let local = self.local_addrs[self.msrs[i].sock];
        let collector = self.collector;
        let via = self.transport.via();
        let m = &mut self.msrs[i];
        let contact = self.transport.uri(Some(&m.name), local);
        let Some(d) = m.dialog.as_mut() else {
            return false;
        };
        m.notify_seq += 1;
        let load = load_for(i, m.notify_seq);
        d.cseq += 1;
        let remaining =
            u64::from(d.expires).saturating_sub(now.duration_since(d.granted_at).as_secs());
        let body = LoadReport {
            msr: m.name.clone(),
            load,
            cpu: load / 2,
            calls: u32::from(load) * 80,
            max_calls: 8192,
            ..LoadReport::default()
        }
        .encode();
        let text = format!(
            "NOTIFY {target} SIP/2.0\r\n\
             Via: SIP/2.0/{via} {local};branch={};rport\r\n\
             Max-Forwards: 70\r\n\
             From: <{luri}>;tag={ltag}\r\n\
             To: {rfrom}\r\n\
             Call-ID: {cid}\r\n\
             CSeq: {cseq} NOTIFY\r\n\
             Contact: <{contact}>\r\n\
             Event: {EVENT}\r\n\
             Subscription-State: active;expires={remaining}\r\n\
             User-Agent: {USER_AGENT}\r\n\
             Content-Type: {CONTENT_TYPE}\r\n\
             Content-Length: {len}\r\n\r\n{body}",
            branch(),
            target = d.remote_target,
            luri = d.local_uri,
            ltag = d.local_tag,
            rfrom = d.remote_from,
            cid = d.call_id,
            cseq = d.cseq,
            len = body.len(),
        );
        let bytes: Arc<[u8]> = Arc::from(text.into_bytes());
        let k = key(&d.call_id, d.cseq);
        m.last_load_sent = Some(load);
        m.in_flight += 1;
        let sock = m.sock;
        self.pending.insert(
            k,
            Pending {
                kind: Kind::Notify,
                msr: i,
                sock,
                bytes: bytes.clone(),
                first_sent: now,
                next_retx: now + T1,
                interval: T1,
                retx: 0,
                measured,
            },
        );
        self.counters(measured).sent += 1;
        out.push((sock, collector, bytes));
        true
    }

    pub(crate) fn on_datagram(
        &mut self,
        data: &[u8],
        from: SocketAddr,
        sock: usize,
        out: &mut Out,
    ) {
        let now = Instant::now();
        match SipMessage::try_from(data) {
            Ok(SipMessage::Response(r)) => self.on_response(&r, now, out),
            Ok(SipMessage::Request(r)) => self.on_request(&r, from, sock, now, out),
            Err(_) => self.c.parse_errors += 1,
        }
    }

    pub(crate) fn on_response(&mut self, r: &sip::Response, now: Instant, out: &mut Out) {
        let code = r.status_code.code();
        if code < 200 {
            return;
        }
        let (Some(call_id), Some((cseq, _))) = (sip::call_id(&r.headers), sip::cseq(&r.headers))
        else {
            self.c.parse_errors += 1;
            return;
        };
        let Some(p) = self.pending.remove(&key(call_id, cseq)) else {
            // A retransmitted request answered twice, or answered after Timer F.
            self.c.stray_responses += 1;
            self.setup.late_answers += 1;
            return;
        };
        match p.kind {
            Kind::Notify => {
                let m = &mut self.msrs[p.msr];
                m.in_flight = m.in_flight.saturating_sub(1);
                if code == 200 {
                    if let Some(d) = m.dialog.as_mut().filter(|d| d.call_id == call_id) {
                        d.confirmed = true;
                    }
                }
                let c = self.counters(p.measured);
                if code == 200 {
                    c.ok += 1;
                } else {
                    *c.non_ok.entry(code).or_default() += 1;
                }
                c.latency_us
                    .push(now.duration_since(p.first_sent).as_micros() as u64);
                c.last_answer = Some(now);
            }
            Kind::Register => self.on_register_response(p.msr, r, code, now, out),
        }
    }

    pub(crate) fn on_register_response(
        &mut self,
        i: usize,
        r: &sip::Response,
        code: u16,
        now: Instant,
        out: &mut Out,
    ) {
        match code {
            200..=299 => {
                self.c.register_ok += 1;
                self.msrs[i].registered = true;
            }
            401 | 407 if self.msrs[i].reg_cseq < 6 => {
                self.c.register_401 += 1;
                let name = if code == 401 {
                    "WWW-Authenticate"
                } else {
                    "Proxy-Authenticate"
                };
                let challenges = sip::header_all(&r.headers, name);
                match self.authorization(&challenges) {
                    Some(auth) => self.send_register(i, Some(auth), now, out),
                    None => self.msrs[i].reg_failed = Some(code),
                }
            }
            423 if self.msrs[i].reg_cseq < 6 => {
                self.c.register_423 += 1;
                match sip::header(&r.headers, "Min-Expires").and_then(|v| v.parse::<u32>().ok()) {
                    Some(min) => {
                        self.msrs[i].reg_expires = min;
                        self.send_register(i, None, now, out);
                    }
                    None => self.msrs[i].reg_failed = Some(code),
                }
            }
            _ => {
                *self.c.register_other.entry(code).or_default() += 1;
                self.msrs[i].reg_failed = Some(code);
            }
        }
    }

    /// The `Authorization` value answering one of `challenges`.
    pub(crate) fn authorization(&self, challenges: &[&str]) -> Option<String> {
        let ruri = self.transport.uri(None, self.collector);
        for ch in challenges {
            let get = |k: &str| auth_param(ch, k);
            let token = get("algorithm").unwrap_or_else(|| "MD5".into());
            let algorithm = match token.to_ascii_uppercase().as_str() {
                "MD5" => Algorithm::Md5,
                "SHA-256" | "SHA256" => Algorithm::Sha256,
                _ => continue,
            };
            let wanted = match self.digest {
                DigestChoice::First => true,
                DigestChoice::Md5 => algorithm == Algorithm::Md5,
                DigestChoice::Sha256 => algorithm == Algorithm::Sha256,
            };
            if !wanted {
                continue;
            }
            let (Some(realm), Some(nonce)) = (get("realm"), get("nonce")) else {
                continue;
            };
            let qop_auth = get("qop").is_some_and(|q| q.split(',').any(|t| t.trim() == "auth"));
            let cnonce = sip::random_token();
            let qop = qop_auth.then(|| AuthQop::Auth {
                cnonce: cnonce.clone(),
                nc: 1,
            });
            let response = compute_digest(
                &self.auth_name,
                &self.password,
                &realm,
                &nonce,
                &Method::Register,
                &ruri,
                algorithm,
                qop.as_ref(),
            );
            let mut v = format!(
                "Digest username=\"{}\", realm=\"{realm}\", nonce=\"{nonce}\", uri=\"{ruri}\", \
                 response=\"{response}\", algorithm={token}",
                self.auth_name
            );
            if qop_auth {
                v.push_str(&format!(", qop=auth, nc=00000001, cnonce=\"{cnonce}\""));
            }
            if let Some(opaque) = get("opaque") {
                v.push_str(&format!(", opaque=\"{opaque}\""));
            }
            return Some(v);
        }
        None
    }

    pub(crate) fn on_request(
        &mut self,
        r: &sip::Request,
        from: SocketAddr,
        sock: usize,
        now: Instant,
        out: &mut Out,
    ) {
        let local = self.local_addrs[sock];
        let tag_for_new = sip::random_token();
        let respond = |status: StatusCode, to_tag: Option<&str>| sip::response(r, status, to_tag);
        if r.method != Method::Subscribe {
            if r.method == Method::Ack {
                return;
            }
            self.c.other_requests += 1;
            let status = if r.method == Method::Options {
                self.c.options_answered += 1;
                StatusCode::OK
            } else {
                StatusCode::MethodNotAllowed
            };
            out.push((
                sock,
                from,
                Arc::from(respond(status, Some(&tag_for_new)).to_bytes()),
            ));
            return;
        }
        let user = sip::uri_user(&r.uri.to_string())
            .map(str::to_owned)
            .unwrap_or_default();
        let index = user
            .strip_prefix("msr_lg_")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|i| *i < self.msrs.len());
        let Some(i) = index else {
            self.c.subscribe_rejected += 1;
            out.push((
                sock,
                from,
                Arc::from(respond(StatusCode::NotFound, Some(&tag_for_new)).to_bytes()),
            ));
            return;
        };
        if sip::event_package(&r.headers).as_deref() != Some(EVENT) {
            self.c.subscribe_rejected += 1;
            let mut resp = respond(StatusCode::BadEvent, Some(&tag_for_new));
            sip::push_header(&mut resp.headers, "Allow-Events", EVENT);
            out.push((sock, from, Arc::from(resp.to_bytes())));
            return;
        }
        let call_id = sip::call_id(&r.headers).unwrap_or_default().to_owned();
        let to = sip::header(&r.headers, "To").unwrap_or_default().to_owned();
        let requested = sip::expires(&r.headers).unwrap_or(60);
        let granted = requested.min(self.max_sub_expires);
        let contact = format!("<{}>", self.transport.uri(Some(&self.msrs[i].name), local));
        let m = &mut self.msrs[i];
        let to_tag = sip::tag(&to);
        let same_dialog = m.dialog.as_ref().is_some_and(|d| d.call_id == call_id);
        let mut send_first_notify = false;
        let our_tag = match (to_tag, same_dialog) {
            // A retransmitted initial SUBSCRIBE: the same answer again.
            (None, true) => {
                self.c.subscribe_retransmitted += 1;
                m.dialog
                    .as_ref()
                    .map(|d| d.local_tag.clone())
                    .unwrap_or_default()
            }
            (None, false) => {
                self.c.subscribe_initial += 1;
                m.dialogs += 1;
                let remote_target = sip::header(&r.headers, "Contact")
                    .map(|c| sip::addr_uri(c).to_owned())
                    .unwrap_or_else(|| format!("sip:{}", self.collector));
                m.dialog = Some(Dialog {
                    call_id: call_id.clone(),
                    local_tag: tag_for_new.clone(),
                    remote_from: sip::header(&r.headers, "From")
                        .unwrap_or_default()
                        .to_owned(),
                    local_uri: sip::addr_uri(&to).to_owned(),
                    remote_target,
                    cseq: 0,
                    expires: granted,
                    granted_at: now,
                    confirmed: false,
                });
                send_first_notify = granted > 0;
                tag_for_new
            }
            (Some(t), true) => {
                let d = m.dialog.as_mut().filter(|d| d.local_tag == t);
                match d {
                    Some(d) if granted == 0 => {
                        self.c.subscribe_unsubscribe += 1;
                        let tag = d.local_tag.clone();
                        m.dialog = None;
                        tag
                    }
                    Some(d) => {
                        self.c.subscribe_refresh += 1;
                        d.expires = granted;
                        d.granted_at = now;
                        d.local_tag.clone()
                    }
                    None => {
                        self.c.subscribe_rejected += 1;
                        let resp = respond(StatusCode::CallTransactionDoesNotExist, None);
                        out.push((sock, from, Arc::from(resp.to_bytes())));
                        return;
                    }
                }
            }
            (Some(_), false) => {
                self.c.subscribe_rejected += 1;
                let resp = respond(StatusCode::CallTransactionDoesNotExist, None);
                out.push((sock, from, Arc::from(resp.to_bytes())));
                return;
            }
        };
        let mut resp = respond(StatusCode::OK, Some(&our_tag));
        sip::push_header(&mut resp.headers, "Expires", granted.to_string());
        sip::push_header(&mut resp.headers, "Contact", contact);
        sip::push_header(&mut resp.headers, "Server", USER_AGENT);
        sip::push_header(&mut resp.headers, "Content-Length", "0");
        out.push((sock, from, Arc::from(resp.to_bytes())));
        if send_first_notify {
            self.send_notify(i, now, out);
        }
    }

    /// Retransmits what is due; gives up at Timer F (or at once when `end`).
    pub(crate) fn retransmit(&mut self, now: Instant, end: bool, out: &mut Out) {
        let mut lost = Vec::new();
        for (k, p) in self.pending.iter_mut() {
            if end || now.duration_since(p.first_sent) >= TIMER_F {
                lost.push(k.clone());
                continue;
            }
            // Over a stream the transport retransmits (RFC 3261 §17.1.2.2:
            // no Timer E); Timer F still ends the transaction.
            if p.next_retx <= now && self.transport == Transport::Udp {
                p.retx += 1;
                p.interval = (p.interval * 2).min(T2);
                p.next_retx = now + p.interval;
                out.push((p.sock, self.collector, p.bytes.clone()));
                match p.kind {
                    Kind::Register => self.c.register_retx += 1,
                    Kind::Notify => {
                        let c = if p.measured {
                            &mut self.measured
                        } else {
                            &mut self.setup
                        };
                        c.retransmissions += 1;
                        if p.retx == 1 {
                            c.retransmitted += 1;
                        }
                    }
                }
            }
        }
        for k in lost {
            if let Some(p) = self.pending.remove(&k) {
                match p.kind {
                    Kind::Register => self.msrs[p.msr].reg_failed = Some(408),
                    Kind::Notify => {
                        self.msrs[p.msr].in_flight = self.msrs[p.msr].in_flight.saturating_sub(1);
                        self.counters(p.measured).lost += 1;
                    }
                }
            }
        }
    }

    pub(crate) fn pending_of(&self, kind: Kind) -> usize {
        self.pending.values().filter(|p| p.kind == kind).count()
    }
}

/// A parameter of a `Digest …` challenge (quotes removed).
pub(crate) fn auth_param(value: &str, name: &str) -> Option<String> {
    let rest = value.trim();
    let rest = rest
        .strip_prefix("Digest")
        .or_else(|| rest.strip_prefix("digest"))?;
    let mut parts = Vec::new();
    let (mut quoted, mut start) = (false, 0);
    for (i, ch) in rest.char_indices() {
        match ch {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&rest[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&rest[start..]);
    parts.into_iter().find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// Where the MSRs' messages leave: UDP sockets shared by the MSRs, or one
/// connection per MSR (its writer task's queue).
pub(crate) enum Links {
    Udp(Vec<Arc<UdpSocket>>),
    Stream(Vec<tokio::sync::mpsc::UnboundedSender<Arc<[u8]>>>),
}

impl Links {
    pub(crate) async fn flush(&self, out: Out) {
        for (sock, to, bytes) in out {
            match self {
                // A full socket buffer shows up as a retransmission later.
                Links::Udp(socks) => {
                    let _ = socks[sock].send_to(&bytes, to).await;
                }
                // A closed connection shows up as a NOTIFY lost at Timer F.
                Links::Stream(queues) => {
                    let _ = queues[sock].send(bytes);
                }
            }
        }
    }
}

/// A connection to the collector: plain TCP, or TLS over it.
pub(crate) trait Connection:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static
{
}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// Opens `n` connections to `collector` (TLS verified by `ca` when given),
/// at most 32 handshakes at a time: the collector bounds its own
/// concurrent handshakes, and a flood of them is not what is measured.
pub(crate) async fn connect_all(
    collector: SocketAddr,
    n: usize,
    ca: Option<&std::path::Path>,
) -> anyhow::Result<Vec<(SocketAddr, Box<dyn Connection>)>> {
    let connector = ca.map(system_tests::pki::connector).transpose()?;
    let name = rustls::pki_types::ServerName::IpAddress(collector.ip().into());
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (gate, connector, name) = (gate.clone(), connector.clone(), name.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            let tcp = tokio::net::TcpStream::connect(collector)
                .await
                .with_context(|| format!("connect to {collector}"))?;
            tcp.set_nodelay(true)?;
            let local = tcp.local_addr()?;
            let stream: Box<dyn Connection> = match connector {
                Some(c) => Box::new(
                    c.connect(name, tcp)
                        .await
                        .with_context(|| format!("tls handshake with {collector}"))?,
                ),
                None => Box::new(tcp),
            };
            anyhow::Ok((i, local, stream))
        });
    }
    let mut out: Vec<Option<(SocketAddr, Box<dyn Connection>)>> = (0..n).map(|_| None).collect();
    while let Some(done) = tasks.join_next().await {
        let (i, local, stream) = done??;
        out[i] = Some((local, stream));
    }
    Ok(out.into_iter().flatten().collect())
}

/// Runs connection `idx`: writes what its queue gets, splits what it reads
/// into messages (RFC 3261 §18.3) and feeds them to the state; answers a
/// keepalive ping with a pong (RFC 5626 §3.5.1).
pub(crate) fn spawn_connection(
    idx: usize,
    peer: SocketAddr,
    stream: Box<dyn Connection>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<Arc<[u8]>>,
    state: Arc<Mutex<State>>,
    links: Arc<Links>,
    stop: tokio_util::sync::CancellationToken,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut reader, mut writer) = tokio::io::split(stream);
    let writer_stop = stop.clone();
    tokio::spawn(async move {
        loop {
            let bytes = tokio::select! {
                () = writer_stop.cancelled() => break,
                b = queue.recv() => match b { Some(b) => b, None => break },
            };
            if writer.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        let mut framer = sip::wire::StreamFramer::new();
        let mut buf = vec![0u8; 65_536];
        loop {
            let n = tokio::select! {
                () = stop.cancelled() => break,
                r = reader.read(&mut buf) => match r { Ok(0) | Err(_) => break, Ok(n) => n },
            };
            framer.push(&buf[..n]);
            let mut out = Vec::new();
            loop {
                match framer.next_frame() {
                    Ok(Some(sip::wire::Frame::Message(m))) => {
                        State::lock(&state).on_datagram(&m, peer, idx, &mut out);
                    }
                    Ok(Some(sip::wire::Frame::Ping)) => {
                        out.push((idx, peer, Arc::from(&b"\r\n"[..])));
                    }
                    Ok(None) => break,
                    Err(e) => {
                        eprintln!("connection {idx}: {e}; closing it");
                        return;
                    }
                }
            }
            links.flush(out).await;
        }
    });
}
