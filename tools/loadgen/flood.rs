//! `flood`: what a stranger's flood sends (SPEC §3–§5): unauthenticated
//! REGISTER, OPTIONS and INVITE with a new branch and Call-ID each, and
//! garbage, from up to 250 loopback source addresses at a set rate.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::process::sample_process;

use crate::FloodArgs;
use anyhow::Context;

/// The `n`th datagram of the flood from `from` to `to`: REGISTER without
/// credentials, OPTIONS, INVITE or garbage in turn, each with a new branch
/// and Call-ID.
pub(crate) fn flood_datagram(n: u64, from: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let method = match n % 4 {
        0 => "REGISTER",
        1 => "OPTIONS",
        2 => "INVITE",
        _ => return format!("\u{1}garbage {n} \r\n\r\n").into_bytes(),
    };
    format!(
        "{method} sip:msr_flood@{to} SIP/2.0\r\nVia: SIP/2.0/UDP {from};branch=z9hG4bKflood{n};rport\r\n\
         From: <sip:msr_flood@{to}>;tag=f{n}\r\nTo: <sip:msr_flood@{to}>\r\nCall-ID: flood-{n}@{from}\r\n\
         CSeq: 1 {method}\r\nMax-Forwards: 70\r\nContact: <sip:msr_flood@{from}>;iface=lo\r\n\
         Expires: 60\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

pub(crate) async fn flood(args: FloodArgs) -> anyhow::Result<()> {
    let sources = usize::from(args.sources.clamp(1, 250));
    let mut sockets = Vec::with_capacity(sources);
    for i in 0..sources {
        let ip = std::net::Ipv4Addr::new(127, 0, 1, u8::try_from(i + 1).unwrap_or(250));
        let socket = std::net::UdpSocket::bind((ip, 0))
            .with_context(|| format!("bind a flood source on {ip}"))?;
        socket.set_nonblocking(true)?;
        sockets.push(socket);
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = args
        .collector_pid
        .map(|pid| tokio::spawn(sample_process(pid, stop.clone())));
    let start = Instant::now();
    let end = start + Duration::from_secs(args.duration);
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(1.0));
    let (mut sent, mut failed, mut to_redirect) = (0u64, 0u64, 0u64);
    let mut next = start;
    while Instant::now() < end {
        // Sends what is due in bursts of up to 1 ms, then sleeps.
        let now = Instant::now();
        while next <= now {
            let socket = &sockets[usize::try_from(sent).unwrap_or(0) % sources];
            let from = socket.local_addr()?;
            let mut to = args.collector;
            if let Some(redirect) = args.redirect {
                if sent % 4 == 2 && (sent / 4) % 2 == 1 {
                    to = redirect;
                    to_redirect += 1;
                }
            }
            match socket.send_to(&flood_datagram(sent, from, to), to) {
                Ok(_) => {}
                Err(_) => failed += 1,
            }
            sent += 1;
            next += interval;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    stop.cancel();
    println!(
        "flood: {sent} datagrams in {elapsed:.1} s ({:.0}/s) from {sources} sources, {to_redirect} INVITEs to the redirect server, {failed} send errors",
        sent as f64 / elapsed
    );
    if let Some(sampler) = sampler {
        let samples = sampler.await?;
        println!(
            "collector: cpu {:.1} % of one core, rss first {} MiB, max {} MiB, last {} MiB",
            samples.avg_cpu(),
            samples.rss_first() / 1024,
            samples.rss_max() / 1024,
            samples.rss_last() / 1024
        );
    }
    Ok(())
}
