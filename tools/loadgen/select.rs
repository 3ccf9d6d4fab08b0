//! `select`: N concurrent control-socket clients issuing `select`; the
//! round-trip latency and the aggregate selections/s.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::calls::declare_site;

use crate::process::{fmt_us, percentile};
use crate::SelectArgs;
use anyhow::{bail, Context};
use msr_shared::admin::{Request, Response, ResponseData, SelectQuery};
use system_tests::AdminClient;

pub(crate) async fn select(args: SelectArgs) -> anyhow::Result<()> {
    if args.clients == 0 {
        bail!("--clients must be positive");
    }
    let mut admin = AdminClient::connect_retry(&args.socket, Duration::from_secs(5))
        .await
        .with_context(|| format!("connect to {}", args.socket.display()))?;
    if args.place.declare_site {
        declare_site(&mut admin, &args.place.site).await?;
    }
    let rows = match admin
        .call(&Request::ResourceList { active_only: true })
        .await?
    {
        Response::Ok(ResponseData::Resources { rows }) => rows.len(),
        _ => 0,
    };
    let line = serde_json::to_string(&Request::Select(SelectQuery {
        explain: args.explain,
        ..SelectQuery::new(args.place.zone.clone(), args.place.site.clone())
    }))?;
    println!(
        "msr-loadgen select: {} clients × {} requests on {} ({} active contacts)",
        args.clients,
        args.requests / args.clients as u64,
        args.socket.display(),
        rows
    );
    let per_client = args.requests / args.clients as u64;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let (path, line) = (args.socket.clone(), line.clone());
        let (legs, zone, site) = (args.legs, args.place.zone.clone(), args.place.site.clone());
        let client_no = tasks.len();
        tasks.push(tokio::spawn(async move {
            let mut client = AdminClient::connect(&path).await?;
            let mut lat = Vec::with_capacity(per_client as usize);
            let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
            let mut picks: BTreeMap<String, u64> = BTreeMap::new();
            for n in 0..per_client {
                let t = Instant::now();
                let resp = if legs {
                    let call_id = format!("lg-{client_no}-{n}@loadgen");
                    let select = serde_json::to_string(&Request::Select(SelectQuery {
                        call_id: Some(call_id.clone()),
                        ..SelectQuery::new(zone.clone(), site.clone())
                    }))?;
                    let resp = client.call_raw(&select).await?;
                    let release = serde_json::to_string(&Request::Release { call_id, leg: None })?;
                    match client.call_raw(&release).await? {
                        Response::Ok(ResponseData::Released(r)) if r.released == 1 => {}
                        other => *outcomes.entry(format!("release: {other:?}")).or_default() += 1,
                    }
                    resp
                } else {
                    client.call_raw(&line).await?
                };
                lat.push(t.elapsed().as_micros() as u64);
                match resp {
                    Response::Ok(ResponseData::Selected(s)) => {
                        *outcomes.entry("ok".into()).or_default() += 1;
                        *picks.entry(s.msr).or_default() += 1;
                    }
                    Response::Ok(_) => {
                        *outcomes.entry("ok (unexpected data)".into()).or_default() += 1
                    }
                    Response::Err(e) => *outcomes.entry(e.code.to_string()).or_default() += 1,
                }
            }
            anyhow::Ok((lat, outcomes, picks))
        }));
    }
    let mut lat = Vec::new();
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut picks: BTreeMap<String, u64> = BTreeMap::new();
    for t in tasks {
        let (l, o, p) = t.await??;
        lat.extend(l);
        for (k, v) in o {
            *outcomes.entry(k).or_default() += v;
        }
        for (k, v) in p {
            *picks.entry(k).or_default() += v;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    println!();
    println!("═══ msr-loadgen select summary ═══");
    println!("requests        {} in {elapsed:.2} s", lat.len());
    println!(
        "throughput      {:.0} {}/s (all clients)",
        lat.len() as f64 / elapsed,
        if args.legs {
            "select+release pairs"
        } else {
            "selections"
        }
    );
    println!(
        "round trip      median {} p90 {} p99 {} max {}",
        fmt_us(percentile(&lat, 50.0)),
        fmt_us(percentile(&lat, 90.0)),
        fmt_us(percentile(&lat, 99.0)),
        fmt_us(lat.last().copied().unwrap_or(0))
    );
    println!("outcomes        {outcomes:?}");
    println!("distinct MSRs   {} picked", picks.len());
    Ok(())
}
