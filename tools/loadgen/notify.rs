//! `notify`: N fake MSRs (msrs.rs) register, are subscribed to and report
//! load at an aggregate rate; the figures (sent, answered, retransmitted,
//! lost, the collector's CPU and RSS, latency) and the check through the
//! control socket that every row shows the last load sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::batched;
use crate::msrs::{
    connect_all, spawn_connection, Counters, Links, Msr, NotifyCounters, Phase, State,
};

use crate::process::{find_collector_pid, fmt_us, percentile, sample_process, ProcSamples};
use crate::{NotifyArgs, Transport};
use anyhow::{bail, Context};
use msr_shared::admin::{Request, Response, ResponseData};
use system_tests::AdminClient;
use tokio::time::Instant;

pub(crate) async fn notify(args: NotifyArgs) -> anyhow::Result<()> {
    // `--rate nan` parses as a float, but no NOTIFY is ever due at it.
    if args.msrs == 0 || args.sockets == 0 || args.rate.is_nan() || args.rate <= 0.0 {
        bail!("--msrs, --sockets and --rate must be positive");
    }
    let planned = args.setup_timeout * 2 + args.duration + args.drain_timeout;
    if u64::from(args.register_expires) < planned {
        eprintln!(
            "warning: --register-expires {} is shorter than the longest run ({planned} s); \
             registrations are not refreshed",
            args.register_expires
        );
    }
    if args.batched && args.transport != Transport::Udp {
        bail!("--batched sends over UDP only");
    }
    if args.transport == Transport::Tls && args.tls_ca.is_none() {
        bail!("--transport tls needs --tls-ca (the CA of the collector's certificate)");
    }
    let mut socks = Vec::new();
    let mut local_addrs = Vec::new();
    let mut connections = Vec::new();
    if args.transport.is_stream() {
        let t = Instant::now();
        connections = connect_all(
            args.collector,
            args.msrs,
            args.tls_ca
                .as_deref()
                .filter(|_| args.transport == Transport::Tls),
        )
        .await?;
        local_addrs = connections.iter().map(|(local, _)| *local).collect();
        println!(
            "phase 0 connect: {} {} connections in {:.1} s",
            connections.len(),
            args.transport.via(),
            t.elapsed().as_secs_f64()
        );
    } else {
        for _ in 0..args.sockets.min(args.msrs) {
            // The daemons' own socket setup (a 4 MiB receive buffer): at
            // tens of thousands of answers a second the kernel's default
            // would drop some here, and the figures would be the tool's,
            // not the collector's.
            let s =
                msr_shared::sip::udp_socket("127.0.0.1:0".parse()?).context("bind udp socket")?;
            local_addrs.push(s.local_addr()?);
            socks.push(Arc::new(s));
        }
    }
    let nsock = local_addrs.len();
    let msrs = (0..args.msrs)
        .map(|i| {
            let name = format!("msr_lg_{i}");
            let contact = format!(
                "<{}>",
                args.transport.uri(Some(&name), local_addrs[i % nsock])
            );
            Msr::new(name, i % nsock, contact, args.register_expires)
        })
        .collect();
    let state = Arc::new(Mutex::new(State::new(
        args.collector,
        args.transport,
        local_addrs.clone(),
        args.auth_name.clone(),
        args.password.clone(),
        args.digest,
        args.max_subscribe_expires,
        msrs,
    )));
    let pid = args
        .collector_pid
        .or_else(|| find_collector_pid(args.collector.port(), args.transport.is_stream()));
    println!(
        "msr-loadgen notify: {} MSRs on {nsock} {} {} → collector {} (pid {})",
        args.msrs,
        args.transport.via(),
        if args.transport.is_stream() {
            "connection(s)".to_owned()
        } else {
            format!("socket(s) {local_addrs:?}")
        },
        args.collector,
        pid.map_or("unknown: no CPU/RSS figures".into(), |p| p.to_string())
    );

    // Receivers: one task per socket, or a reader and a writer per connection.
    let stop = tokio_util::sync::CancellationToken::new();
    // The UDP sockets' readers, which hand over to `batched` for the
    // measured phase.
    let readers = stop.child_token();
    let mut reader_tasks = Vec::new();
    let udp = socks.clone();
    let socks = if args.transport.is_stream() {
        let (queues, receivers): (Vec<_>, Vec<_>) = (0..connections.len())
            .map(|_| tokio::sync::mpsc::unbounded_channel())
            .unzip();
        let links = Arc::new(Links::Stream(queues));
        for (idx, ((_, stream), queue)) in connections.into_iter().zip(receivers).enumerate() {
            spawn_connection(
                idx,
                args.collector,
                stream,
                queue,
                state.clone(),
                links.clone(),
                stop.clone(),
            );
        }
        links
    } else {
        let links = Arc::new(Links::Udp(socks.clone()));
        for (idx, sock) in socks.iter().enumerate() {
            let (sock, state, links, stop) =
                (sock.clone(), state.clone(), links.clone(), readers.clone());
            reader_tasks.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 65_536];
                loop {
                    let (n, from) = tokio::select! {
                        () = stop.cancelled() => break,
                        r = sock.recv_from(&mut buf) => match r { Ok(v) => v, Err(_) => continue },
                    };
                    let mut out = Vec::new();
                    State::lock(&state).on_datagram(&buf[..n], from, idx, &mut out);
                    links.flush(out).await;
                }
            }));
        }
        links
    };
    // The transactions' timers. Other tasks start transactions, whose
    // first deadline is T1 (or Timer F) away, so a tick checks the
    // earliest deadlines and is at most 20 ms late.
    {
        let (state, socks, stop) = (state.clone(), socks.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let mut out = Vec::new();
                State::lock(&state).handle_timeout(Instant::now(), &mut out);
                socks.flush(out).await;
            }
        });
    }
    let sampler_stop = tokio_util::sync::CancellationToken::new();

    // Phase 1: register.
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(args.setup_timeout);
    let mut started = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    loop {
        tick.tick().await;
        let now = Instant::now();
        let due = ((now.duration_since(t0).as_secs_f64() * args.register_rate) as usize + 1)
            .min(args.msrs);
        let mut out = Vec::new();
        let (done, failed) = {
            let mut st = State::lock(&state);
            while started < due {
                st.send_register(started, None, now, &mut out);
                started += 1;
            }
            (
                st.msrs.iter().filter(|m| m.registered).count(),
                st.msrs.iter().filter(|m| m.reg_failed.is_some()).count(),
            )
        };
        socks.flush(out).await;
        if done + failed == args.msrs || now >= deadline {
            println!(
                "phase 1 register: {done}/{} registered, {failed} failed in {:.1} s",
                args.msrs,
                now.duration_since(t0).as_secs_f64()
            );
            break;
        }
    }

    // Phase 2: wait for the subscriptions and their first NOTIFY's answer.
    let t1 = Instant::now();
    let deadline = t1 + Duration::from_secs(args.setup_timeout);
    let registered = State::lock(&state)
        .msrs
        .iter()
        .filter(|m| m.registered)
        .count();
    if registered == 0 {
        bail!(
            "no MSR registered: is the collector at {} running, with these credentials?",
            args.collector
        );
    }
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let confirmed = State::lock(&state)
            .msrs
            .iter()
            .filter(|m| m.dialog.as_ref().is_some_and(|d| d.confirmed))
            .count();
        let now = Instant::now();
        if confirmed >= registered || now >= deadline {
            println!(
                "phase 2 subscribe: {confirmed}/{registered} subscriptions confirmed (first NOTIFY answered 200) in {:.1} s",
                now.duration_since(t1).as_secs_f64()
            );
            break;
        }
    }

    // Phase 3: the measured NOTIFY load.
    let sampler = pid.map(|p| tokio::spawn(sample_process(p, sampler_stop.clone())));
    let self_sampler = tokio::spawn(sample_process(std::process::id(), sampler_stop.clone()));
    let window = Duration::from_secs(args.duration);
    State::lock(&state).phase = Phase::Measured;
    let (t2, t3, t4) = if args.batched {
        readers.cancel();
        for task in reader_tasks {
            let _ = task.await;
        }
        let state = state.clone();
        let (rate, drain) = (args.rate, Duration::from_secs(args.drain_timeout));
        let times =
            tokio::task::spawn_blocking(move || batched::run(&state, &udp, rate, window, drain))
                .await?;
        (times.measured, times.drained_from, times.end)
    } else {
        measure(&args, &state, &socks, window).await
    };
    sampler_stop.cancel();
    let collector_samples = match sampler {
        Some(h) => Some(h.await?),
        None => None,
    };
    let self_samples = self_sampler.await?;
    State::lock(&state).give_up(t4);
    // Late answers may still come; stop listening.
    stop.cancel();

    let st = {
        let g = State::lock(&state);
        Snapshot {
            c: g.c.clone(),
            setup: g.setup.clone(),
            measured: g.measured.clone(),
            registered: g.msrs.iter().filter(|m| m.registered).count(),
            reg_failed: g.msrs.iter().filter(|m| m.reg_failed.is_some()).count(),
            subscribed: g.msrs.iter().filter(|m| m.dialog.is_some()).count(),
            multi_dialog: g.msrs.iter().filter(|m| m.dialogs > 1).count(),
            last: g
                .msrs
                .iter()
                .map(|m| (m.name.clone(), m.last_load_sent))
                .collect(),
        }
    };
    report_notify(
        &args,
        &st,
        t2,
        t3,
        t4,
        collector_samples.as_ref(),
        &self_samples,
    );

    let rows_match = match &args.socket {
        Some(path) => verify_loads(path, &st.last, Duration::from_secs(args.verify_wait)).await?,
        None => true,
    };
    if args.check {
        let m = &st.measured;
        let mut failed = Vec::new();
        if st.registered < args.msrs {
            failed.push(format!(
                "{} of {} MSRs registered",
                st.registered, args.msrs
            ));
        }
        if st.subscribed < st.registered {
            failed.push(format!("{} of {} subscribed", st.subscribed, st.registered));
        }
        if m.sent == 0 || m.ok < m.sent {
            failed.push(format!("{} of {} NOTIFYs answered 200", m.ok, m.sent));
        }
        if !rows_match {
            failed.push("rows differ from the last loads sent".to_owned());
        }
        if !failed.is_empty() {
            bail!("--check: {}", failed.join("; "));
        }
        println!("check: passed");
    }
    Ok(())
}

/// The measured phase and its drain through the MSRs' own transactions
/// (retransmitted as RFC 3261 §17.1.2 says): when it began, ended and the
/// drain ended.
async fn measure(
    args: &NotifyArgs,
    state: &Arc<Mutex<State>>,
    socks: &Links,
    window: Duration,
) -> (Instant, Instant, Instant) {
    let t2 = Instant::now();
    let mut cursor = 0usize;
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let burst_cap = ((args.rate / 50.0).ceil() as u64).max(1);
    let mut next_report = t2 + Duration::from_secs(5);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let elapsed = now.duration_since(t2);
        if elapsed >= window {
            break;
        }
        let due = (elapsed.as_secs_f64() * args.rate) as u64;
        let mut out = Vec::new();
        {
            let mut st = State::lock(state);
            let n = st.msrs.len();
            let mut budget = due.saturating_sub(sent).min(burst_cap);
            let mut scanned = 0usize;
            while budget > 0 && scanned < n {
                let i = cursor;
                cursor = (cursor + 1) % n;
                scanned += 1;
                if st.msrs[i].dialog.is_none() {
                    continue;
                }
                scanned = 0;
                budget -= 1;
                sent += 1;
                if args.one_in_flight && st.msrs[i].in_flight > 0 {
                    st.measured.coalesced += 1;
                    continue;
                }
                st.send_notify(i, now, &mut out);
            }
            if now >= next_report {
                next_report += Duration::from_secs(5);
                let m = &st.measured;
                println!(
                    "  t={:>4.1}s sent {} ok {} non-200 {} retransmitted {} pending {}",
                    elapsed.as_secs_f64(),
                    m.sent,
                    m.ok,
                    m.non_ok.values().sum::<u64>(),
                    m.retransmitted,
                    st.notifies_in_flight()
                );
            }
        }
        socks.flush(out).await;
    }
    let t3 = Instant::now();
    State::lock(state).phase = Phase::Drain;

    // Phase 4: drain.
    let deadline = t3 + Duration::from_secs(args.drain_timeout);
    loop {
        let pending = State::lock(state).notifies_in_flight();
        if pending == 0 || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (t2, t3, Instant::now())
}

pub(crate) struct Snapshot {
    pub(crate) c: Counters,
    pub(crate) setup: NotifyCounters,
    pub(crate) measured: NotifyCounters,
    pub(crate) registered: usize,
    pub(crate) reg_failed: usize,
    pub(crate) subscribed: usize,
    pub(crate) multi_dialog: usize,
    pub(crate) last: Vec<(String, Option<u8>)>,
}

pub(crate) fn report_notify(
    args: &NotifyArgs,
    s: &Snapshot,
    t2: Instant,
    t3: Instant,
    t4: Instant,
    collector: Option<&ProcSamples>,
    own: &ProcSamples,
) {
    let window = t3.duration_since(t2).as_secs_f64();
    let m = &s.measured;
    let mut lat = m.latency_us.clone();
    lat.sort_unstable();
    let answered = m.ok + m.non_ok.values().sum::<u64>();
    let ok_span = m
        .last_answer
        .map_or(window, |t| t.duration_since(t2).as_secs_f64())
        .max(window);
    println!();
    println!("═══ msr-loadgen notify summary ═══");
    println!("MSRs                        {}", args.msrs);
    println!(
        "registered                  {} (failed {})",
        s.registered, s.reg_failed
    );
    println!(
        "  REGISTER sent {} (401 challenges {}, 423 {}, 200 {}, retransmissions {}, other {:?})",
        s.c.register_sent,
        s.c.register_401,
        s.c.register_423,
        s.c.register_ok,
        s.c.register_retx,
        s.c.register_other
    );
    println!("subscribed (dialog at end)  {}", s.subscribed);
    println!(
        "OPTIONS keepalives answered {} (from the first REGISTER to the end)",
        s.c.options_answered
    );
    println!(
        "  SUBSCRIBE initial {} refresh {} unsubscribe {} retransmitted {} rejected {}; MSRs re-subscribed (>1 dialog) {}",
        s.c.subscribe_initial,
        s.c.subscribe_refresh,
        s.c.subscribe_unsubscribe,
        s.c.subscribe_retransmitted,
        s.c.subscribe_rejected,
        s.multi_dialog
    );
    println!(
        "setup NOTIFYs (first in each dialog): sent {} ok {} non-200 {:?} retransmitted {} lost {}",
        s.setup.sent, s.setup.ok, s.setup.non_ok, s.setup.retransmitted, s.setup.lost
    );
    println!(
        "measured window             {window:.1} s at target {} NOTIFY/s",
        args.rate
    );
    println!(
        "  NOTIFY sent               {} ({:.0}/s)",
        m.sent,
        m.sent as f64 / window
    );
    println!(
        "  answered 200              {} ({:.0}/s over {:.1} s)",
        m.ok,
        m.ok as f64 / ok_span,
        ok_span
    );
    println!(
        "  answered non-200          {} {:?}",
        answered - m.ok,
        m.non_ok
    );
    println!(
        "  retransmitted (≥1 resend) {} ({} retransmissions)",
        m.retransmitted, m.retransmissions
    );
    println!("  lost (no answer)          {}", m.lost);
    if args.batched {
        println!("  (--batched: no retransmission, so every NOTIFY the collector dropped is lost)");
    }
    if args.one_in_flight {
        println!("  coalesced (slot skipped)  {}", m.coalesced);
    }
    println!(
        "  latency send→final       median {} p90 {} p99 {} max {}",
        fmt_us(percentile(&lat, 50.0)),
        fmt_us(percentile(&lat, 90.0)),
        fmt_us(percentile(&lat, 99.0)),
        fmt_us(lat.last().copied().unwrap_or(0))
    );
    if args.batched {
        // `batched` reads its sockets once a round (`TICK`), so an answer
        // that came while it slept is timed when the round wakes.
        println!("  (--batched: answers are read once a millisecond, so each latency may read up to 1 ms too long)");
    }
    println!(
        "  drain                     {:.1} s",
        t4.duration_since(t3).as_secs_f64()
    );
    println!(
        "  stray/late responses      {}  parse errors {}",
        s.c.stray_responses, s.c.parse_errors
    );
    match collector {
        Some(p) => println!(
            "collector CPU               avg {:.0}% max {:.0}% (100% = one core; {:.1} s, window + drain)\n\
             collector RSS               start {} MiB, max {} MiB, end {} MiB, VmHWM {} MiB",
            p.avg_cpu(),
            p.max_cpu(),
            p.span_secs,
            p.rss_first() / 1024,
            p.rss_max() / 1024,
            p.rss_last() / 1024,
            p.hwm_kib / 1024
        ),
        None => println!("collector CPU/RSS           not sampled (no pid)"),
    }
    if let Some(p) = collector.filter(|_| answered > 0) {
        // The samples span the window and the drain: every answer of the
        // measured phase was given inside it.
        let busy_us = p.cpu_secs * 1e6;
        println!(
            "collector CPU per NOTIFY    {:.1} µs ({} answered, {})",
            busy_us / answered as f64,
            answered,
            args.transport.via()
        );
    }
    println!(
        "msr-loadgen CPU             avg {:.0}% max {:.0}%, RSS max {} MiB",
        own.avg_cpu(),
        own.max_cpu(),
        own.rss_max() / 1024
    );
    if let Some(p) = collector {
        let cpu: Vec<String> = p.cpu.iter().map(|c| format!("{c:.0}")).collect();
        println!("collector CPU% per second   {}", cpu.join(" "));
    }
}

/// Whether every row came to show the last load its MSR sent within `wait`.
pub(crate) async fn verify_loads(
    path: &std::path::Path,
    last: &[(String, Option<u8>)],
    wait: Duration,
) -> anyhow::Result<bool> {
    let mut client = AdminClient::connect_retry(path, Duration::from_secs(5))
        .await
        .with_context(|| format!("connect to {}", path.display()))?;
    let start = Instant::now();
    println!();
    println!("═══ verification via control socket ═══");
    loop {
        let t = Instant::now();
        let rows = match client
            .call(&Request::ResourceList { active_only: false })
            .await
        {
            Ok(Response::Ok(ResponseData::Resources { rows })) => rows,
            Ok(other) => bail!("resource list: unexpected answer {other:?}"),
            Err(e) => {
                println!(
                    "  t=+{:>4.1}s resource list failed: {e:#}",
                    start.elapsed().as_secs_f64()
                );
                if start.elapsed() >= wait {
                    return Ok(false);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let rtt = t.elapsed();
        let by_msr: HashMap<&str, (Option<u8>, Option<u64>)> = rows
            .iter()
            .map(|r| (r.msr.as_str(), (r.load, r.report_age_secs)))
            .collect();
        let (mut matched, mut mismatched, mut missing, mut never_sent) = (0, 0, 0, 0);
        let mut examples = Vec::new();
        for (name, sent) in last {
            let Some(sent) = sent else {
                never_sent += 1;
                continue;
            };
            match by_msr.get(name.as_str()) {
                Some((Some(shown), _)) if shown == sent => matched += 1,
                Some((shown, age)) => {
                    mismatched += 1;
                    if examples.len() < 3 {
                        examples.push(format!(
                            "{name}: last sent {sent}, row shows {shown:?} (report age {age:?} s)"
                        ));
                    }
                }
                None => missing += 1,
            }
        }
        println!(
            "  t=+{:>4.1}s {} rows (resource list took {}): last load matches {matched}/{} \
             (mismatched {mismatched}, no row {missing}, never sent {never_sent})",
            start.elapsed().as_secs_f64(),
            rows.len(),
            fmt_us(rtt.as_micros() as u64),
            last.len()
        );
        let done = mismatched == 0 && missing == 0;
        if done || start.elapsed() >= wait {
            for e in examples {
                println!("    e.g. {e}");
            }
            return Ok(done);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
