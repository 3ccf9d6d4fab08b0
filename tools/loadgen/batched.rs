//! `notify --batched`: the measured phase (and its drain) on a thread of
//! its own, costing the collector's host little, so the collector's
//! two-core ceiling can be offered from the same machine. Each MSR's
//! NOTIFY is pre-encoded once (its dialog's fixed headers) and only its
//! numbers are written per message; batches go out with `sendmmsg(2)`
//! and the answers come in with `recvmmsg(2)` (`datagrams`), matched
//! by the `Via` branch this module gave each NOTIFY, without parsing.
//!
//! No retransmission: a NOTIFY the collector does not answer within the
//! drain is lost, so "0 lost" here means the collector dropped none. What
//! is not an answer to a measured NOTIFY (a SUBSCRIBE refresh, an OPTIONS
//! keepalive) goes to the MSRs' own state machine, as before.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::datagrams::{send_batch, RecvBatch, BATCH_MAX};
use msr_shared::event_package::{CONTENT_TYPE, EVENT};
use tokio::net::UdpSocket;
use tokio::time::Instant;

use crate::msrs::{load_for, report, NotifyCounters, Out, State};
use crate::USER_AGENT;

/// The branch prefix of a measured NOTIFY: `z9hG4bK` (RFC 3261 §8.1.1.7),
/// then `lg`, the MSR's index, `x` and its NOTIFY count.
const BRANCH: &str = "z9hG4bKlg";

/// How often a round sends what is due and reads what came.
const TICK: Duration = Duration::from_millis(1);

/// One MSR's NOTIFY, pre-encoded around the numbers that change.
struct Template {
    msr: usize,
    sock: usize,
    /// Up to the branch's MSR index and `x`.
    head: String,
    /// From the end of the branch to `CSeq: `.
    mid: String,
    name: String,
    cseq: u32,
    seq: u64,
    /// When the subscription's granted `Expires` runs out.
    expires_at: Instant,
    last_load: Option<u8>,
}

/// The messages built for one socket and not yet handed to the kernel.
struct Queue {
    bufs: Vec<Vec<u8>>,
    queued: usize,
}

pub(crate) struct Times {
    pub(crate) measured: Instant,
    pub(crate) drained_from: Instant,
    pub(crate) end: Instant,
}

/// Runs the measured phase for `window` at `rate` NOTIFYs a second, then
/// waits up to `drain` for the last answers; blocking (a thread of its
/// own). The counters and each MSR's last load end up in `state`, as the
/// unbatched run leaves them.
pub(crate) fn run(
    state: &Arc<Mutex<State>>,
    socks: &[Arc<UdpSocket>],
    rate: f64,
    window: Duration,
    drain: Duration,
) -> Times {
    let (collector, mut templates) = templates(state);
    let mut by_msr = positions(&templates, State::lock(state).msrs.len());
    let nsock = socks.len();
    let mut queues: Vec<Queue> = (0..nsock)
        .map(|_| Queue {
            bufs: (0..BATCH_MAX).map(|_| Vec::with_capacity(1024)).collect(),
            queued: 0,
        })
        .collect();
    let mut readers: Vec<RecvBatch> = (0..nsock)
        .map(|_| RecvBatch::new(BATCH_MAX, 65_535))
        .collect();
    let mut counters = NotifyCounters::default();
    let mut outstanding: HashMap<(usize, u64), Instant> = HashMap::new();
    let mut body = Vec::with_capacity(256);
    let mut refused = 0u64;
    let mut cursor = 0usize;
    let t0 = Instant::now();
    let mut next_report = t0 + Duration::from_secs(5);
    let mut drained_from = None;
    loop {
        let now = Instant::now();
        let elapsed = now.duration_since(t0);
        if elapsed < window && !templates.is_empty() {
            let due = (elapsed.as_secs_f64() * rate) as u64;
            let n = templates.len();
            while counters.sent < due {
                let t = &mut templates[cursor];
                let q = &mut queues[t.sock];
                if q.queued == BATCH_MAX {
                    break;
                }
                cursor = (cursor + 1) % n;
                encode(t, now, &mut q.bufs[q.queued], &mut body);
                q.queued += 1;
                outstanding.insert((t.msr, t.seq), now);
                counters.sent += 1;
            }
        } else if drained_from.is_none() {
            drained_from = Some(now);
        }
        for (sock, q) in queues.iter_mut().enumerate() {
            if q.queued == 0 {
                continue;
            }
            let out: Vec<(SocketAddr, &[u8])> = q.bufs[..q.queued]
                .iter()
                .map(|b| (collector, b.as_slice()))
                .collect();
            // A full send buffer keeps the rest for the next round.
            let sent = send_batch(&*socks[sock], &out, &mut refused).unwrap_or(0);
            q.bufs[..q.queued].rotate_left(sent);
            q.queued -= sent;
        }
        let mut slow = Vec::new();
        for (sock, reader) in readers.iter_mut().enumerate() {
            while let Ok(n) = reader.recv(&*socks[sock]) {
                let now = Instant::now();
                for (datagram, from) in reader.iter() {
                    match answer(datagram) {
                        Some((code, key)) => {
                            if code < 200 {
                                continue;
                            }
                            let Some(sent_at) = outstanding.remove(&key) else {
                                counters.late_answers += 1;
                                continue;
                            };
                            if code == 200 {
                                counters.ok += 1;
                            } else {
                                *counters.non_ok.entry(code).or_default() += 1;
                            }
                            counters
                                .latency_us
                                .push(now.duration_since(sent_at).as_micros() as u64);
                            counters.last_answer = Some(now);
                        }
                        None => {
                            let mut st = State::lock(state);
                            to_state_machine(
                                &mut st,
                                &mut templates,
                                &mut by_msr,
                                (datagram, from, sock),
                                &mut slow,
                            );
                        }
                    }
                }
                if n < BATCH_MAX {
                    break;
                }
            }
        }
        for (sock, to, bytes) in slow {
            let _ = send_batch(&*socks[sock], &[(to, &bytes[..])], &mut refused);
        }
        let now = Instant::now();
        if now >= next_report && drained_from.is_none() {
            next_report += Duration::from_secs(5);
            println!(
                "  t={:>4.1}s sent {} ok {} non-200 {} pending {} (batched)",
                now.duration_since(t0).as_secs_f64(),
                counters.sent,
                counters.ok,
                counters.non_ok.values().sum::<u64>(),
                outstanding.len()
            );
        }
        if let Some(from) = drained_from {
            if outstanding.is_empty() || now.duration_since(from) >= drain {
                break;
            }
        }
        // One round a millisecond, as the unbatched generator's tick: at
        // 90,000/s that is some 20 NOTIFYs per socket per system call,
        // and the collector too reads them in batches.
        std::thread::sleep((now + TICK).saturating_duration_since(Instant::now()));
    }
    let end = Instant::now();
    counters.lost = outstanding.len() as u64;
    let mut st = State::lock(state);
    for t in &templates {
        hand_back(t, &mut st);
    }
    st.measured = counters;
    Times {
        measured: t0,
        drained_from: drained_from.unwrap_or(end),
        end,
    }
}

/// The collector's address and each subscribed MSR's template.
fn templates(state: &Arc<Mutex<State>>) -> (SocketAddr, Vec<Template>) {
    let st = State::lock(state);
    let templates = (0..st.msrs.len())
        .filter_map(|i| template(&st, i))
        .collect();
    (st.collector, templates)
}

/// MSR `i`'s template, from its dialog as the state machine holds it.
fn template(st: &State, i: usize) -> Option<Template> {
    let m = st.msrs.get(i)?;
    let d = m.dialog.as_ref()?;
    let local = st.local_addrs[m.sock];
    Some(Template {
        msr: i,
        sock: m.sock,
        head: format!(
            "NOTIFY {} SIP/2.0\r\nVia: SIP/2.0/UDP {local};rport;branch={BRANCH}{i}x",
            d.remote_target
        ),
        mid: format!(
            "\r\nMax-Forwards: 70\r\nFrom: {}\r\nTo: {}\r\nCall-ID: {}\r\n\
             Contact: {}\r\nEvent: {EVENT}\r\nUser-Agent: {USER_AGENT}\r\n\
             Content-Type: {CONTENT_TYPE}\r\nCSeq: ",
            d.from, d.remote_from, d.call_id, m.contact
        ),
        name: m.name.clone(),
        cseq: d.cseq,
        seq: m.notify_seq,
        expires_at: d.granted_at + Duration::from_secs(u64::from(d.expires)),
        last_load: None,
    })
}

/// Each MSR's position in `templates` (`None`: no dialog at the start).
fn positions(templates: &[Template], msrs: usize) -> Vec<Option<usize>> {
    let mut by_msr = vec![None; msrs];
    for (k, t) in templates.iter().enumerate() {
        by_msr[t.msr] = Some(k);
    }
    by_msr
}

/// What template `t` sent, written back to its MSR in the state machine.
fn hand_back(t: &Template, st: &mut State) {
    let m = &mut st.msrs[t.msr];
    m.notify_seq = t.seq;
    m.last_load_sent = t.last_load.or(m.last_load_sent);
    if let Some(d) = m.dialog.as_mut() {
        d.cseq = t.cseq;
    }
}

/// Hands a datagram that answers no measured NOTIFY to the MSRs' state
/// machine. A SUBSCRIBE refreshes an MSR's subscription (a new expiry)
/// or starts a new dialog: its template is handed back first and rebuilt
/// from the dialog after, so that its NOTIFYs go on carrying the expiry
/// and the dialog the collector holds (a template left at the first
/// grant counts down to `expires=0`, and the collector then ends that
/// subscription and starts another, which the old template's NOTIFYs
/// don't belong to).
fn to_state_machine(
    st: &mut State,
    templates: &mut Vec<Template>,
    by_msr: &mut [Option<usize>],
    (datagram, from, sock): (&[u8], SocketAddr, usize),
    out: &mut Out,
) {
    let msr = subscribed_msr(datagram).filter(|&i| i < by_msr.len());
    let slot = msr.and_then(|i| by_msr[i]);
    if let Some(k) = slot {
        hand_back(&templates[k], st);
    }
    st.on_datagram(datagram, from, sock, out);
    let Some(i) = msr else { return };
    // Without a dialog now (unsubscribed), the template stays as it was.
    let Some(fresh) = template(st, i) else { return };
    match slot {
        Some(k) => templates[k] = fresh,
        None => {
            by_msr[i] = Some(templates.len());
            templates.push(fresh);
        }
    }
}

/// The MSR a SUBSCRIBE is for, by its Request-URI (`sip:msr_lg_N@…`).
fn subscribed_msr(datagram: &[u8]) -> Option<usize> {
    let line = datagram.get(..find(datagram, b"\r\n")?)?;
    let uri = line.strip_prefix(b"SUBSCRIBE ")?;
    let at = find(uri, b"msr_lg_")? + b"msr_lg_".len();
    let (i, rest) = number(uri.get(at..)?)?;
    if !rest.starts_with(b"@") {
        return None;
    }
    usize::try_from(i).ok()
}

/// Writes MSR `t`'s next NOTIFY into `buf` (`body` is scratch).
fn encode(t: &mut Template, now: Instant, buf: &mut Vec<u8>, body: &mut Vec<u8>) {
    t.seq += 1;
    t.cseq = t.cseq.wrapping_add(1);
    let load = load_for(t.msr, t.seq);
    t.last_load = Some(load);
    body.clear();
    let _ = write!(body, "{}", report(&t.name, load));
    let remaining = t.expires_at.saturating_duration_since(now).as_secs();
    buf.clear();
    let mut text = String::with_capacity(64);
    let _ = write!(
        text,
        "{}{}{} NOTIFY\r\nSubscription-State: active;expires={remaining}\r\nContent-Length: {}\r\n\r\n",
        t.seq,
        t.mid,
        t.cseq,
        body.len()
    );
    buf.extend_from_slice(t.head.as_bytes());
    buf.extend_from_slice(text.as_bytes());
    buf.extend_from_slice(body);
}

/// A response's status code and the measured NOTIFY it answers (MSR index,
/// NOTIFY count), read from the status line and this module's `Via`
/// branch; `None` for anything else.
fn answer(datagram: &[u8]) -> Option<(u16, (usize, u64))> {
    let rest = datagram.strip_prefix(b"SIP/2.0 ")?;
    let code = std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()?;
    let at = find(datagram, BRANCH.as_bytes())? + BRANCH.len();
    let tail = datagram.get(at..)?;
    let (msr, tail) = number(tail)?;
    let (seq, _) = number(tail.strip_prefix(b"x")?)?;
    Some((code, (usize::try_from(msr).ok()?, seq)))
}

fn number(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let end = bytes
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(bytes.len());
    let n = std::str::from_utf8(bytes.get(..end)?).ok()?.parse().ok()?;
    Some((n, bytes.get(end..)?))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        let mut msr = crate::msrs::Msr::new(
            "msr_lg_0".to_owned(),
            0,
            "<sip:msr_lg_0@127.0.0.1:5070>".to_owned(),
            3600,
        );
        msr.registered = true;
        State::new(
            "127.0.0.1:5060".parse().expect("addr"),
            crate::Transport::Udp,
            vec!["127.0.0.1:5070".parse().expect("addr")],
            "msr".to_owned(),
            "msr-secret".to_owned(),
            crate::DigestChoice::First,
            3600,
            vec![msr],
        )
    }

    /// The collector's SUBSCRIBE to `msr_lg_0` (`to_tag`: in a dialog).
    fn subscribe(call_id: &str, to_tag: Option<&str>, cseq: u32, expires: u32) -> Vec<u8> {
        let tag = to_tag.map(|t| format!(";tag={t}")).unwrap_or_default();
        format!(
            "SUBSCRIBE sip:msr_lg_0@127.0.0.1:5070 SIP/2.0\r\n\
             Via: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKsub{call_id}{cseq}\r\n\
             Max-Forwards: 70\r\nFrom: <sip:collector@127.0.0.1>;tag=c\r\n\
             To: <sip:msr_lg_0@127.0.0.1:5070>{tag}\r\nCall-ID: {call_id}\r\n\
             CSeq: {cseq} SUBSCRIBE\r\nContact: <sip:127.0.0.1:5060>\r\n\
             Event: {EVENT}\r\nExpires: {expires}\r\nContent-Length: 0\r\n\r\n"
        )
        .into_bytes()
    }

    #[test]
    fn a_template_follows_a_refresh_and_a_new_dialog() {
        let mut st = state();
        let from: SocketAddr = "127.0.0.1:5060".parse().expect("addr");
        let mut out = Vec::new();
        st.on_datagram(&subscribe("d1", None, 1, 10), from, 0, &mut out);
        let mut templates: Vec<Template> = template(&st, 0).into_iter().collect();
        let mut by_msr = positions(&templates, 1);
        let first = templates[0].expires_at;
        for _ in 0..3 {
            encode(
                &mut templates[0],
                Instant::now(),
                &mut Vec::new(),
                &mut Vec::new(),
            );
        }
        let tag = st.msrs[0]
            .dialog
            .as_ref()
            .expect("dialog")
            .local_tag
            .clone();
        let refresh = subscribe("d1", Some(&tag), 2, 600);
        to_state_machine(
            &mut st,
            &mut templates,
            &mut by_msr,
            (&refresh, from, 0),
            &mut out,
        );
        let t = &templates[0];
        assert!(
            t.expires_at >= first + Duration::from_secs(590),
            "the refresh's expiry"
        );
        // The first NOTIFY (CSeq 1) and the three encoded go on from there.
        assert_eq!((t.cseq, t.seq), (4, 4));

        let new = subscribe("d2", None, 1, 600);
        to_state_machine(
            &mut st,
            &mut templates,
            &mut by_msr,
            (&new, from, 0),
            &mut out,
        );
        let t = &templates[0];
        assert!(t.mid.contains("Call-ID: d2\r\n"), "{}", t.mid);
        // The new dialog's first NOTIFY went from the state machine.
        assert_eq!((t.cseq, t.seq), (1, 5));
        assert_eq!(templates.len(), 1);
    }

    #[test]
    fn a_subscribe_names_its_msr() {
        assert_eq!(subscribed_msr(&subscribe("d", None, 1, 10)), Some(0));
        let other = b"SUBSCRIBE sip:msr_lg_12@127.0.0.1:5 SIP/2.0\r\nVia: x\r\n\r\n";
        assert_eq!(subscribed_msr(other), Some(12));
        assert_eq!(
            subscribed_msr(b"OPTIONS sip:msr_lg_1@h SIP/2.0\r\n\r\n"),
            None
        );
        assert_eq!(
            subscribed_msr(b"SUBSCRIBE sip:msr_lg_x@h SIP/2.0\r\n\r\n"),
            None
        );
    }

    #[test]
    fn an_answer_is_told_by_its_branch() {
        let ok = b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:5;rport=5;branch=z9hG4bKlg12x345\r\nCSeq: 3 NOTIFY\r\n\r\n";
        assert_eq!(answer(ok), Some((200, (12, 345))));
        let other = b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:5;branch=z9hG4bKabc\r\n\r\n";
        assert_eq!(answer(other), None);
        assert_eq!(answer(b"OPTIONS sip:x SIP/2.0\r\n\r\n"), None);
        assert_eq!(answer(b"SIP/2.0 2"), None);
    }
}
