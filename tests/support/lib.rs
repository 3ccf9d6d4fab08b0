//! Support for the system tests in `tests/it/`: process management for the
//! real binaries, a control-socket client, SIPp, and bounded waiting.
//!
//! Every wait here is bounded; nothing sleeps longer than it must.

pub use nix::sys::signal::Signal;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

pub use msr_shared::admin;

/// Installs a tracing subscriber that writes through the test harness's
/// capture (once per test binary). `RUST_LOG` filters; default `info`.
pub fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// The workspace root (the folder holding `config-examples/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// A file under `config-examples/`.
pub fn example(name: &str) -> PathBuf {
    workspace_root().join("config-examples").join(name)
}

/// The text of `config-examples/collector.toml` with its control socket
/// and state file moved into `dir` (a test's own directory), for a test
/// that checks or starts a variant of the example.
pub fn example_collector_in(dir: &Path) -> String {
    let text = std::fs::read_to_string(example("collector.toml")).expect("the collector example");
    let in_dir = |name: &str| dir.join(name).to_str().expect("utf-8 path").to_owned();
    text.replace("/tmp/msr-collector.sock", &in_dir("control.sock"))
        .replace("/tmp/msr-collector-state.json", &in_dir("state.json"))
}

/// Path of a workspace binary (`msr-agent`, `msr-collector`, `msrctl`, the
/// tools' `msr-loadgen`) built beside this test executable: `cargo test`
/// builds only the test's own package, so `scripts/test.sh` runs `cargo
/// build --workspace --bins` first.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("."));
    // A test runs from target/<profile>/deps/it-<hash>, a binary such as
    // msr-quickstart from target/<profile>/: both resolve to target/<profile>/<name>.
    let mut profile_dir = exe
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    if profile_dir.file_name().is_some_and(|n| n == "deps") {
        profile_dir.pop();
    }
    profile_dir.join(name)
}

/// A child process killed (SIGKILL) when dropped, so a failing test leaves
/// nothing running.
pub struct ChildGuard {
    /// The process.
    pub child: Child,
}

impl ChildGuard {
    /// Spawns `cmd` with stdout/stderr inherited-to-null unless `RUST_LOG` is set.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Self> {
        if std::env::var_os("TEST_CHILD_OUTPUT").is_none() {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
        Ok(Self {
            child: cmd.spawn()?,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (kill(2)); whether it was sent. Not by a `kill`
    /// process: one spawned in the caller's process group dies with the
    /// rest of it of the Ctrl-C (or `timeout`'s SIGINT) that stops a run,
    /// sometimes before it has signalled anything.
    pub fn signal(&self, signal: Signal) -> bool {
        i32::try_from(self.child.id()).is_ok_and(|pid| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).is_ok()
        })
    }

    /// Sends SIGTERM and waits up to `limit` for the exit status.
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        self.signal(Signal::SIGTERM);
        self.wait_exit(limit)
    }

    /// Waits up to `limit` for the process to exit (blocking, for tests
    /// that run no runtime); its exit status, or `None` while it runs.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL now (the `kill -9` of a crash test).
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port on 127.0.0.1, free for UDP and TCP when chosen, for a program
/// that can't bind port 0 and announce what it got (SIPp, Kamailio,
/// rtpengine, an agent's engine port). It comes from 10000..20000: below
/// the kernel's ephemeral range (`ip_local_port_range`), where no socket
/// bound to port 0 lands, so the port can't be taken between this call and
/// the program's bind by some other client socket; and below 20000, where
/// the tests' media engines keep their RTP ports, which an agent refuses to
/// share. This process never hands a port out twice.
pub fn free_udp_port() -> u16 {
    const FIRST: u32 = 10_000;
    const SPAN: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Test binaries that run one after the other start at different places.
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(FIRST + (start + n) % SPAN).unwrap_or(0);
        if UdpSocket::bind(("127.0.0.1", port)).is_ok()
            && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    0
}

/// Polls `check` every 20 ms until it returns `Some`, for at most `limit`.
pub async fn wait_for<T, F, Fut>(limit: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until something (a SIPp started in the background) has bound
/// UDP port `port` on 127.0.0.1, for at most `limit`. Read from the
/// kernel's socket table (`/proc/net/udp`), not by trying to bind the port:
/// a probe holding it, even briefly, could make the real bind fail.
pub async fn wait_udp_bound(port: u16, limit: Duration) -> bool {
    let local = format!("0100007F:{port:04X}");
    wait_for(limit, || {
        let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
        let bound = table
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some(local.as_str()));
        async move { bound.then_some(()) }
    })
    .await
    .is_some()
}

/// One control-socket connection speaking [`admin`] (newline-delimited JSON).
pub struct AdminClient {
    reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: tokio::net::unix::OwnedWriteHalf,
}

impl AdminClient {
    /// Connects to the collector's control socket.
    pub async fn connect(path: &Path) -> std::io::Result<Self> {
        let stream = UnixStream::connect(path).await?;
        let (r, w) = stream.into_split();
        Ok(Self {
            reader: BufReader::new(r),
            writer: w,
        })
    }

    /// Connects, retrying for up to `limit` while the collector starts.
    pub async fn connect_retry(path: &Path, limit: Duration) -> std::io::Result<Self> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match Self::connect(path).await {
                Ok(c) => return Ok(c),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Sends one request and reads its response.
    pub async fn call(&mut self, request: &admin::Request) -> anyhow::Result<admin::Response> {
        let line = serde_json::to_string(request)?;
        self.call_raw(&line).await
    }

    /// Sends one raw line and reads the response line.
    pub async fn call_raw(&mut self, line: &str) -> anyhow::Result<admin::Response> {
        self.writer.write_all(line.as_bytes()).await?;
        self.writer.write_all(b"\n").await?;
        let mut reply = String::new();
        let n = tokio::time::timeout(Duration::from_secs(5), self.reader.read_line(&mut reply))
            .await??;
        anyhow::ensure!(n > 0, "control socket closed");
        Ok(serde_json::from_str(&reply)?)
    }
}

/// Runs SIPp with `args` (scenario, ports …) to completion, bounded by
/// `limit`; returns (exit code, stdout+stderr). SIPp's own `-timeout`
/// should be set below `limit`.
pub async fn run_sipp(args: &[String], limit: Duration) -> anyhow::Result<(i32, String)> {
    run_sipp_in(Path::new("."), args, limit).await
}

/// [`run_sipp`] in the working directory `dir` (where a scenario's
/// `rtp_stream` finds its audio file).
pub async fn run_sipp_in(
    dir: &Path,
    args: &[String],
    limit: Duration,
) -> anyhow::Result<(i32, String)> {
    let mut cmd = tokio::process::Command::new("sipp");
    cmd.current_dir(dir)
        .args(args)
        .arg("-nostdin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn()?;
    let out = tokio::time::timeout(limit, child.wait_with_output()).await??;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code().unwrap_or(-1), text))
}

/// A SIPp running in the background (e.g. a UAS standing in for a media
/// engine), its output in a file; killed when dropped.
pub struct SippBackground {
    /// Its stdout + stderr.
    pub log: PathBuf,
    child: Option<ChildGuard>,
}

impl SippBackground {
    /// Starts `sipp ARGS -nostdin`, writing its output to `log`.
    pub fn start(args: &[String], log: &Path) -> anyhow::Result<Self> {
        Self::start_in(Path::new("."), args, log)
    }

    /// [`start`](Self::start) in the working directory `dir`.
    pub fn start_in(dir: &Path, args: &[String], log: &Path) -> anyhow::Result<Self> {
        let file = std::fs::File::create(log)?;
        let err = file.try_clone()?;
        let child = Command::new("sipp")
            .current_dir(dir)
            .args(args)
            .arg("-nostdin")
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()?;
        Ok(Self {
            log: log.to_owned(),
            child: Some(ChildGuard { child }),
        })
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.child.try_wait(), Ok(None)))
    }

    /// SIGKILL: a media engine that dies mid-call (SPEC §14), answering
    /// nothing from now on. Returns its output so far (no final screen).
    pub fn kill9(&mut self) -> String {
        if let Some(mut c) = self.child.take() {
            c.kill9();
        }
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGUSR1 (SIPp's soft exit: ongoing calls finish, no new one), then
    /// waits up to `limit` for the exit (SIGKILL after that); returns the
    /// final statistics screen SIPp prints on exit.
    pub fn finish(&mut self, limit: Duration) -> String {
        if let Some(mut c) = self.child.take() {
            let deadline = std::time::Instant::now() + limit;
            let mut signalled = std::time::Instant::now() - Duration::from_secs(1);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = c.child.try_wait() {
                    break;
                }
                // SIPp may miss a signal while it starts a screen; repeat.
                if signalled.elapsed() >= Duration::from_millis(500) {
                    c.signal(Signal::SIGUSR1);
                    signalled = std::time::Instant::now();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The cumulative count of a row (e.g. `Successful call`) of SIPp's final
/// statistics screen.
pub fn sipp_total(screen: &str, row: &str) -> Option<u64> {
    screen
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with(row))
        .and_then(|l| l.rsplit('|').next())
        .and_then(|v| v.trim().parse().ok())
}

/// Path of a SIPp scenario under `tests/sipp/`.
pub fn sipp_scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sipp")
        .join(name)
}

/// Parses `127.0.0.1:5060`-style text.
pub fn addr(text: &str) -> SocketAddr {
    text.parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
}
pub mod kamailio;
pub mod pair;
pub mod pki;
pub mod rtpengine;
pub mod system;
