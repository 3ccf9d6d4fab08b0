//! A real rtpengine (Debian's `rtpengine-daemon`, which `scripts/deps.sh`
//! installs) as the media relay of an MSR: started in the foreground on
//! loopback with a free ng port and a port range of its own, relaying in
//! user space (`--table=-1`: no kernel module), asked over its ng protocol
//! what it holds (`statistics`, `list`, `query`), stopped when dropped.
//!
//! The ng datagrams are built and read with the agent's own bencode codec
//! ([`msr_agent::load::rtpengine`]); the figures are rtpengine's.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use msr_agent::load::rtpengine::{answer, bencode::Value, request_with, split_cookie};

use crate::{free_udp_port, wait_for, ChildGuard};

/// A running rtpengine.
pub struct Rtpengine {
    /// Its ng control address (`--listen-ng`).
    pub ng: SocketAddr,
    /// Its RTP port range (`--port-min`, `--port-max`).
    pub ports: (u16, u16),
    /// Its stderr log.
    pub log: PathBuf,
    child: Option<ChildGuard>,
    cookies: AtomicU64,
}

impl Rtpengine {
    /// Starts `rtpengine` named `name` in `dir`, its media on ports
    /// `ports`, and waits until it answers `ping`.
    pub async fn start(dir: &Path, name: &str, ports: (u16, u16)) -> Rtpengine {
        let mut r = Rtpengine {
            ng: SocketAddr::from(([127, 0, 0, 1], free_udp_port())),
            ports,
            log: dir.join(format!("{name}.log")),
            child: None,
            cookies: AtomicU64::new(1),
        };
        r.spawn().await;
        r
    }

    /// Starts the daemon (again, after [`stop`](Self::stop)) on the same
    /// ng port and range; waits until it answers `ping`.
    pub async fn spawn(&mut self) {
        assert!(
            self.child.is_none(),
            "rtpengine {} already running",
            self.ng
        );
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("rtpengine log");
        let err = file.try_clone().expect("clone log");
        let child = Command::new("rtpengine")
            .args([
                // Not /etc/rtpengine/rtpengine.conf: it would add the
                // package's own listen-cli and listen-http ports.
                "--config-file=none",
                "--table=-1",
                "--interface=127.0.0.1",
                &format!("--listen-ng={}", self.ng),
                &format!("--port-min={}", self.ports.0),
                &format!("--port-max={}", self.ports.1),
                // A deleted call goes at once, so that `statistics` and
                // `list` show the calls up, not those of the last 30 s.
                "--delete-delay=0",
                "--foreground",
                "--log-stderr",
            ])
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start rtpengine (scripts/deps.sh installs rtpengine-daemon): {e}")
            });
        self.child = Some(ChildGuard { child });
        let up = wait_for(Duration::from_secs(10), || async {
            self.command("ping", Vec::new()).ok().map(|_| ())
        })
        .await;
        assert!(
            up.is_some(),
            "rtpengine on {} did not answer ping:\n{}",
            self.ng,
            self.log_text()
        );
    }

    /// SIGTERM, and waits for the exit: its ng port goes quiet.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            finish(&mut c);
        }
    }

    /// SIGSTOP: a hung relay. Its ng port stays bound and takes every
    /// datagram, and nothing answers (no ICMP error either), so a client
    /// learns of it only by its timeouts. [`stop`](Self::stop) and the drop
    /// end it still.
    pub fn freeze(&self) {
        if let Some(c) = &self.child {
            c.signal(crate::Signal::SIGSTOP);
        }
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// One ng exchange: `command` with `fields`; the answer's dictionary.
    pub fn command(&self, command: &str, fields: Vec<(Vec<u8>, Value)>) -> anyhow::Result<Value> {
        let cookie = format!("test_{}", self.cookies.fetch_add(1, Ordering::Relaxed));
        let socket = UdpSocket::bind("127.0.0.1:0")?;
        socket.connect(self.ng)?;
        socket.set_read_timeout(Some(Duration::from_millis(500)))?;
        let datagram = request_with(&cookie, command, fields);
        let mut buf = vec![0_u8; 65_535];
        for _ in 0..3 {
            socket.send(&datagram)?;
            let Ok(n) = socket.recv(&mut buf) else {
                continue;
            };
            let Some((got, body)) = split_cookie(&buf[..n]) else {
                continue;
            };
            if got == cookie.as_bytes() {
                return Ok(answer(body)?);
            }
        }
        anyhow::bail!("rtpengine on {} did not answer {command}", self.ng)
    }

    /// `statistics`: `(sessionsown, managedsessions)`, the calls it relays
    /// now and those it relayed and ended since it started.
    pub fn sessions(&self) -> anyhow::Result<(u64, u64)> {
        let v = self.command("statistics", Vec::new())?;
        let stats = v.get("statistics");
        let own = stats
            .and_then(|s| s.get("currentstatistics"))
            .and_then(|c| c.get("sessionsown"))
            .and_then(Value::as_int);
        let managed = stats
            .and_then(|s| s.get("totalstatistics"))
            .and_then(|t| t.get("managedsessions"))
            .and_then(Value::as_int);
        match (own.map(u64::try_from), managed.map(u64::try_from)) {
            (Some(Ok(own)), Some(Ok(managed))) => Ok((own, managed)),
            _ => anyhow::bail!("no session counts in {v:?}"),
        }
    }

    /// `list`: the Call-IDs of its calls.
    pub fn call_ids(&self) -> anyhow::Result<Vec<String>> {
        let v = self.command("list", vec![(b"limit".to_vec(), Value::Int(10_000))])?;
        match v.get("calls") {
            Some(Value::List(calls)) => Ok(calls
                .iter()
                .filter_map(|c| c.as_str().map(str::to_owned))
                .collect()),
            _ => anyhow::bail!("no calls in {v:?}"),
        }
    }

    /// `query` of `call_id`: the RTP packets it received from each
    /// party of the call (one entry per SIP tag).
    pub fn rtp_packets(&self, call_id: &str) -> anyhow::Result<Vec<(String, i64)>> {
        let v = self.command("query", vec![(b"call-id".to_vec(), Value::text(call_id))])?;
        let Some(Value::Dict(tags)) = v.get("tags") else {
            anyhow::bail!("no tags in the query of {call_id}: {v:?}");
        };
        let mut out = Vec::new();
        for (tag, party) in tags {
            let mut packets = 0;
            if let Some(Value::List(medias)) = party.get("medias") {
                for media in medias {
                    if let Some(Value::List(streams)) = media.get("streams") {
                        // The RTP stream (the RTCP one has flag RTCP).
                        packets += streams
                            .iter()
                            .filter(|s| !is_rtcp(s))
                            .filter_map(|s| s.get("stats")?.get("packets")?.as_int())
                            .sum::<i64>();
                    }
                }
            }
            out.push((String::from_utf8_lossy(tag).into_owned(), packets));
        }
        Ok(out)
    }
}

fn is_rtcp(stream: &Value) -> bool {
    matches!(stream.get("flags"), Some(Value::List(flags)) if flags.iter().any(|f| f.as_str() == Some("RTCP")))
}

impl Drop for Rtpengine {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "----- rtpengine {} log (tail) -----\n{}",
                self.ng,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if let Some(mut c) = self.child.take() {
            finish(&mut c);
        }
    }
}

/// SIGCONT (a frozen daemon takes its SIGTERM only once it runs), SIGTERM,
/// and SIGKILL when it has not exited within 5 s.
fn finish(c: &mut ChildGuard) {
    c.signal(crate::Signal::SIGCONT);
    if c.terminate(Duration::from_secs(5)).is_none() {
        c.kill9();
    }
}
