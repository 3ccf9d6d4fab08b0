//! The media engine's liveness and the MSR-side drain (SPEC §14), seen by
//! a subscriber: the agent's `engine:` line follows a real engine process
//! that starts and stops answering OPTIONS, and `msr-agent drain
//! --exit-when-empty` makes the NOTIFYs say `service: draining` and the
//! agent exit 0 once its engine has no session.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use msr_shared::event_package::{EngineState, Service};
use msr_shared::sip::{SubState, TerminationReason};
use system_tests::system::{AccountSpec, Agent as AgentProcess, AgentSpec};
use system_tests::{free_udp_port, wait_for};
use tokio::task::JoinHandle;

use crate::agent::{Agent, Subscriber};

/// A stand-in SIP media engine on `127.0.0.1:port`: it answers every
/// request `405 Method Not Allowed` (SPEC §14: any final response means
/// alive), built from the request as RFC 3261 §8.2.6.2 says. Stopping it
/// closes its socket.
pub(crate) struct Engine {
    task: JoinHandle<()>,
}

impl Engine {
    pub(crate) async fn start(port: u16) -> Engine {
        // The port of a stopped engine is bound again at once.
        let socket = wait_for(Duration::from_secs(5), || async move {
            tokio::net::UdpSocket::bind(("127.0.0.1", port)).await.ok()
        })
        .await
        .unwrap_or_else(|| panic!("cannot bind the engine's port {port}"));
        let task = tokio::spawn(async move {
            let mut buf = vec![0_u8; 65_535];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                let text = String::from_utf8_lossy(buf.get(..n).unwrap_or_default()).into_owned();
                if let Some(answer) = answer_405(&text) {
                    let _ = socket.send_to(answer.as_bytes(), from).await;
                }
            }
        });
        Engine { task }
    }

    pub(crate) fn stop(self) {
        self.task.abort();
    }
}

/// `405` to a request's text: its `Via`, `From`, `To` (tagged), `Call-ID`
/// and `CSeq`; `None` for a response.
fn answer_405(request: &str) -> Option<String> {
    if request.starts_with("SIP/2.0") {
        return None;
    }
    let mut out = String::from("SIP/2.0 405 Method Not Allowed\r\n");
    for line in request.lines() {
        let name = line
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match name.as_str() {
            "via" | "v" | "from" | "f" | "call-id" | "i" | "cseq" => {
                out.push_str(line);
                out.push_str("\r\n");
            }
            "to" | "t" if !line.contains("tag=") => {
                out.push_str(line);
                out.push_str(";tag=engine\r\n");
            }
            "to" | "t" => {
                out.push_str(line);
                out.push_str("\r\n");
            }
            _ => {}
        }
    }
    out.push_str("Allow: INVITE, ACK, BYE, CANCEL\r\nContent-Length: 0\r\n\r\n");
    Some(out)
}

fn config(engine_port: u16) -> String {
    format!(
        r#"<?xml version="1.0" encoding="utf-8"?>
<config date="00:00:00 01.01.2026">
    <general max-calls="100" load-sensor="calls" load-delta="5"/>
    <transport bind-addr="127.0.0.1" port="{engine_port}" transport="udp"/>
    <media port-start="20000" port-range="1000"/>
    <accounts><dynamic msr_name="msr_1" realm="sip:127.0.0.1:{realm}" auth_name="msr" auth_password="msr-secret"/></accounts>
    <agent engine-probe="sip" sip-port="0" register-expires="60" calls-source="fixed:7" sample-interval-ms="200"/>
</config>
"#,
        realm = free_udp_port(),
    )
}

/// An engine that stops answering is `engine: down` in a NOTIFY within
/// 5 s (the defaults: every 2 s, timeout 1 s, 2 misses), and `up` again
/// once it answers; the subscription stays active all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_line_follows_an_engine_that_stops_and_starts_answering() {
    let port = free_udp_port();
    let engine = Engine::start(port).await;
    let agent = Agent::start(&config(port)).await;
    let mut sub = Subscriber::new().await;
    sub.subscribe(agent.addr(), 600).await;
    let (_, up) = sub
        .notify_where(Duration::from_secs(5), |_, r| r.engine == EngineState::Up)
        .await
        .expect("engine: up once the engine answers its first OPTIONS");
    assert_eq!(up.service, Service::Active);

    engine.stop();
    let stopped = Instant::now();
    let (state, down) = sub
        .notify_where(Duration::from_secs(5), |_, r| r.engine == EngineState::Down)
        .await
        .expect("engine: down within 5 s of the engine's end");
    assert_eq!(state.state, SubState::Active, "the subscription goes on");
    assert_eq!((down.msr.as_str(), down.calls), ("msr_1", 7));
    eprintln!("engine seen down after {:?}", stopped.elapsed());

    let engine = Engine::start(port).await;
    sub.notify_where(Duration::from_secs(5), |_, r| r.engine == EngineState::Up)
        .await
        .expect("engine: up again once it answers");
    engine.stop();
    agent.stop().await;
}

/// `msr-agent drain --exit-when-empty` on a running agent: every NOTIFY
/// says `service: draining`; `drain --wait` follows it; once the engine's
/// sessions are 0 for a while the agent ends its subscriptions
/// (`deactivated`) and exits 0, and the waiting command returns 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_with_exit_when_empty_exits_0_once_the_engine_is_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sip_port = free_udp_port();
    let spec = AgentSpec {
        accounts: vec![AccountSpec {
            msr: "msr_1".into(),
            realm: format!("sip:127.0.0.1:{}", free_udp_port()),
        }],
        sip_port,
        ..AgentSpec::default()
    };
    let mut agent = AgentProcess::start(dir.path(), "msr", &spec, 3);
    let socket = agent.control_socket();
    let listening = wait_for(Duration::from_secs(10), || {
        let socket = socket.clone();
        async move { socket.exists().then_some(()) }
    })
    .await;
    assert!(
        listening.is_some(),
        "no control socket at {}",
        socket.display()
    );
    let addr: SocketAddr = ([127, 0, 0, 1], sip_port).into();
    let mut sub = Subscriber::new().await;
    sub.subscribe(addr, 600).await;
    sub.notify_where(Duration::from_secs(5), |_, r| {
        r.service == Service::Active && r.calls == 3
    })
    .await
    .expect("a first notify, active, 3 calls");

    let (code, out, err) = agent.command(&["status"]);
    assert_eq!(code, Some(0), "status: {out}{err}");
    assert!(
        out.contains("service: active") && out.contains("sessions: 3"),
        "{out}"
    );

    let (code, out, err) = agent.command(&["drain", "--exit-when-empty"]);
    assert_eq!(code, Some(0), "drain: {out}{err}");
    assert!(out.contains("service: draining"), "{out}");
    let (state, report) = sub
        .notify_where(Duration::from_secs(2), |_, r| {
            r.service == Service::Draining
        })
        .await
        .expect("service: draining at once");
    assert_eq!(state.state, SubState::Active);
    assert_eq!(report.calls, 3);

    // `drain --wait` in the background: it returns once the agent is gone.
    let waiter = {
        let bin = system_tests::bin_path("msr-agent");
        let socket = socket.clone();
        std::thread::spawn(move || {
            std::process::Command::new(bin)
                .args(["drain", "--exit-when-empty", "--wait", "--timeout", "30"])
                .arg("--control-socket")
                .arg(socket)
                .output()
        })
    };
    agent.set_calls(0);
    let (state, _) = sub
        .notify_where(Duration::from_secs(10), |s, _| {
            s.state == SubState::Terminated
        })
        .await
        .expect("the final notify once drained");
    assert_eq!(state.reason, Some(TerminationReason::Deactivated));
    let status = wait_for(Duration::from_secs(10), || {
        let exited = agent
            .child
            .as_mut()
            .and_then(|c| c.child.try_wait().ok().flatten());
        async move { exited }
    })
    .await
    .expect("the agent exits once drained");
    assert_eq!(status.code(), Some(0), "{}", agent.log_text());
    assert!(agent
        .log_text()
        .contains("drained: the media engine has had no session"));
    let waited = waiter
        .join()
        .expect("waiter thread")
        .expect("msr-agent drain --wait ran");
    let out = String::from_utf8_lossy(&waited.stdout);
    assert_eq!(
        waited.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&waited.stderr)
    );
    assert!(out.contains("drained: the agent has exited"), "{out}");
    agent.child = None;
}

/// `msr-agent drain --exit-when-empty --wait` whose agent dies with
/// sessions left (kill -9, an operator's stop): the agent's exit is not
/// the drain's end, so the command fails and says how many were left (a
/// script that restarts the engine next must not run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_wait_fails_when_the_agent_dies_with_sessions_left() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = AgentSpec {
        accounts: vec![AccountSpec {
            msr: "msr_1".into(),
            realm: format!("sip:127.0.0.1:{}", free_udp_port()),
        }],
        ..AgentSpec::default()
    };
    let mut agent = AgentProcess::start(dir.path(), "msr", &spec, 3);
    let socket = agent.control_socket();
    let answering = wait_for(Duration::from_secs(10), || {
        let ok = agent.command(&["status"]).0 == Some(0);
        async move { ok.then_some(()) }
    })
    .await;
    assert!(answering.is_some(), "no agent at {}", socket.display());
    // A reader that goes away before the answer is printed
    // (`msr-agent status | head -1`) makes no panic.
    let piped = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "(sleep 0.5; '{}' status --control-socket '{}') | true",
            system_tests::bin_path("msr-agent").display(),
            socket.display()
        ))
        .output()
        .expect("sh");
    let err = String::from_utf8_lossy(&piped.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let waiter = std::process::Command::new(system_tests::bin_path("msr-agent"))
        .args(["drain", "--exit-when-empty", "--wait", "--timeout", "30"])
        .arg("--control-socket")
        .arg(&socket)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("msr-agent drain --wait");
    let draining = wait_for(Duration::from_secs(5), || {
        let (_, out, _) = agent.command(&["status"]);
        async move { out.contains("service: draining").then_some(()) }
    })
    .await;
    assert!(draining.is_some(), "the drain started");
    agent.kill9();
    let waited = waiter.wait_with_output().expect("drain --wait ended");
    let (out, err) = (
        String::from_utf8_lossy(&waited.stdout),
        String::from_utf8_lossy(&waited.stderr),
    );
    assert_eq!(waited.status.code(), Some(1), "{out}{err}");
    assert!(!out.contains("drained"), "{out}");
    // Killed between two questions: the next finds no agent; killed
    // during one: its connection breaks. Either way an error, no success.
    assert!(
        err.contains("stopped before it was drained (3 sessions left")
            || err.contains("control socket"),
        "{err}"
    );
}
