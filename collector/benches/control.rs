//! Criterion benchmark of one `select` round trip over the control socket
//! (issue: ≤ 100 µs median): a collector and three agents run in-process on
//! 127.0.0.1; the bench writes one JSON request line and reads the reply.
//!
//! Throughput from several concurrent clients is measured by
//! `msr-loadgen select` (see BENCHMARKS.md).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use tokio_util::sync::CancellationToken;

const SELECT: &str = r#"{"op":"select","zone":"default","site":"local"}"#;

fn agent_xml(realm: std::net::SocketAddr, n: u16, calls: u32) -> String {
    format!(
        r#"<config>
  <general max-calls="100" load-sensor="calls" load-delta="5"/>
  <transport bind-addr="127.0.0.1" port="0" transport="udp"/>
  <media port-start="{rtp}" port-range="100"/>
  <accounts><dynamic msr_name="msr_{n}" realm="sip:{realm}" auth_name="msr" auth_password="pw"/></accounts>
  <agent register-expires="300" calls-source="fixed:{calls}"/>
</config>"#,
        rtp = 30000 + 200 * n
    )
}

fn call(reader: &mut BufReader<UnixStream>, line: &str) -> String {
    let stream = reader.get_mut();
    stream.write_all(line.as_bytes()).expect("write");
    stream.write_all(b"\n").expect("write");
    let mut reply = String::new();
    reader.read_line(&mut reply).expect("read");
    reply
}

fn bench_control(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("control.sock");
    let text = format!(
        "node = \"bench\"\n[sip]\nlisten = \"127.0.0.1:0\"\nrealm = \"bench\"\nmin_expires = 1\n\
         [[accounts]]\nauth_name = \"msr\"\npassword = \"pw\"\n\
         [control]\nsocket = \"{}\"\n[state]\npath = \"{}\"\n[http]\nlisten = \"off\"\n",
        socket.display(),
        dir.path().join("state.json").display()
    );
    let config = msr_collector::config::parse(&text, "<bench>").expect("collector config");
    let shutdown = CancellationToken::new();
    let collector = rt
        .block_on(msr_collector::start(config, shutdown.clone()))
        .expect("collector starts");
    for (n, calls) in [(1, 10), (2, 40), (3, 70)] {
        let xml = agent_xml(collector.sip_addr, n, calls);
        let config =
            msr_agent::config::parse(&xml, std::path::Path::new("<bench>")).expect("agent config");
        rt.block_on(msr_agent::start(config, None, shutdown.clone()))
            .expect("agent starts");
    }

    let stream = UnixStream::connect(&socket).expect("control socket");
    let mut reader = BufReader::new(stream);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = call(&mut reader, r#"{"op":"resource_list"}"#);
        if rows.matches("\"load\":").count() == 3 && !rows.contains("\"load\":null") {
            break;
        }
        assert!(Instant::now() < deadline, "agents did not report: {rows}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let reply = call(&mut reader, SELECT);
    assert!(reply.contains("\"ok\":true"), "select failed: {reply}");

    c.bench_function("control socket select round trip (3 msrs)", |b| {
        b.iter(|| call(&mut reader, SELECT))
    });
    shutdown.cancel();
}

criterion_group!(benches, bench_control);
criterion_main!(benches);
