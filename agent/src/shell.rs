//! The agent's async shell: the one task that owns the [`SipEndpoint`],
//! the sockets, the timers, the files and the tasks, and drives the
//! sans-IO [`Agent`] (which holds the cores and their glue).
//!
//! One `tokio::select!` loop over a closed set of events ([`Step`]):
//!
//! * a SIP event (incoming request, final response or failure of a
//!   request sent, a closed connection) → the agent;
//! * the earliest deadline (`sleep_until(min(poll_timeout))`) of the
//!   agent and of the ng client;
//! * the sampling tick (the [`LoadSampler`] runs in `spawn_blocking`, it reads
//!   `/proc`); with the `rtpengine` calls source the tick first asks
//!   rtpengine over its ng port ([`NgClient`](crate::load::rtpengine::NgClient)) and the sample is taken
//!   when the exchange ends, with its answer (the exchange's outcome is the
//!   ng engine probe's, SPEC §14);
//! * a datagram from rtpengine's ng port (a connected UDP socket of the
//!   agent's own, so only that address is heard);
//! * a config reload from [`crate::config::watch()`];
//! * a request on the control socket (`msr-agent drain`, [`crate::control`]);
//! * the end of a resolution of the registrars' host names (below);
//! * shutdown (the `CancellationToken`).
//!
//! The clock is read once per step, after the event and before the agent
//! is given it; after every step the agent's requests are handed to the
//! endpoint and its events acted on: [`Event::ExitWhenDrained`] ends the
//! loop as SIGTERM does (then the agent exits 0), and the shutdown runs
//! until [`Event::Stopped`] (its two phases are the agent's, see
//! [`crate::core`]).
//!
//! Who may SUBSCRIBE (SPEC §4): the realm hosts written as IP addresses and
//! `<agent allow-subscribers>` are known at once; realm hosts written as
//! names are resolved at start and after each config reload, in a task (at
//! most [`RESOLVE_TIMEOUT`] per name), never per request. Until a name is
//! resolved its registrar cannot subscribe; a name that fails to resolve
//! keeps the addresses it had (logged at warn).
//!
//! Architecture Invariant: only this module (and `lib.rs`) touches the
//! clock, sockets and tasks; `Instant::now()` is read once per step, and
//! the agent receives `now` as an argument.

mod control;
mod ng;
mod reload;
mod resolve;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use msr_shared::sip::{SipEndpoint, SipEvent};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::{sleep_until, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::{self, AgentConfig, ConfigError};
use crate::core::{Agent, Event, Identity, Resolution};
use crate::error::AgentError;
use crate::load::rtpengine::{Answer, AskOutcome};
use crate::load::{EngineSessions, LoadSampler, Sample};
use control::ControlCommand;
use ng::{NgLink, NG_MAX_DATAGRAM};

/// The longest a registrar's host name may take to resolve.
pub(crate) const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The name of the interface owning `addr` (`lo` on loopback): the one
/// that has it, else the one whose network holds it (a loopback alias such
/// as 127.0.0.62, which Linux serves from `lo`'s 127.0.0.0/8 without an
/// address of its own); `None` when none does (or `addr` is unspecified).
pub fn interface_name(addr: IpAddr) -> Option<String> {
    let interfaces = match if_addrs::get_if_addrs() {
        Ok(i) => i,
        Err(e) => {
            warn!(error = %e, "cannot list network interfaces");
            return None;
        }
    };
    if let Some(exact) = interfaces.iter().find(|i| i.ip() == addr) {
        return Some(exact.name.clone());
    }
    interfaces
        .into_iter()
        .find(|i| network_holds(&i.addr, addr))
        .map(|i| i.name)
}

/// Whether the network of the interface address `on` (its address and
/// netmask) holds `addr`.
fn network_holds(on: &if_addrs::IfAddr, addr: IpAddr) -> bool {
    match (on, addr) {
        (if_addrs::IfAddr::V4(v4), IpAddr::V4(a)) => {
            let mask = u32::from(v4.netmask);
            mask != 0 && u32::from(v4.ip) & mask == u32::from(a) & mask
        }
        (if_addrs::IfAddr::V6(v6), IpAddr::V6(a)) => {
            let mask = u128::from(v6.netmask);
            mask != 0 && u128::from(v6.ip) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// The address put in Contacts: `bind-addr`, or for an unspecified
/// `bind-addr` the first non-loopback address of the host of the same
/// family (falling back to loopback).
fn contact_addr(bind: IpAddr) -> IpAddr {
    if !bind.is_unspecified() {
        return bind;
    }
    let found = if_addrs::get_if_addrs().ok().and_then(|list| {
        list.into_iter()
            .find(|i| !i.is_loopback() && i.ip().is_ipv4() == bind.is_ipv4())
            .map(|i| i.ip())
    });
    found.unwrap_or(match bind {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
    })
}

/// What woke the loop: the closed set of the module docs.
enum Step {
    Shutdown,
    Sip(Option<SipEvent>),
    Timeout,
    Tick,
    Ng(std::io::Result<usize>),
    Sampled(Result<(LoadSampler, Sample), JoinError>),
    Resolved(Result<Resolution, JoinError>),
    Reload(Option<Result<AgentConfig, ConfigError>>),
    Control(Option<ControlCommand>),
}

/// The shell's state.
pub(crate) struct Shell {
    endpoint: SipEndpoint,
    agent: Agent,
    sampler: Option<LoadSampler>,
    /// The `rtpengine` calls source's link, `None` for the other sources.
    ng: Option<NgLink>,
    /// The engine's answer for a sample that is to be taken now: set when
    /// an ng exchange started by a tick ends, or at a tick inside the
    /// exchange's backoff.
    engine_ready: Option<EngineSessions>,
}

impl Shell {
    /// Builds the shell around a bound endpoint and takes the first sample.
    pub(crate) async fn new(endpoint: SipEndpoint, config: AgentConfig) -> Self {
        let contact_addr = contact_addr(config.transport.bind_addr);
        let iface = interface_name(contact_addr).unwrap_or_else(|| {
            warn!(addr = %contact_addr, "no interface owns the contact address, using iface=unknown");
            "unknown".to_owned()
        });
        let mut sampler = LoadSampler::new(&config.media, &config.general, &config.agent);
        let mut ng = NgLink::for_config(&config);
        let mut first_answer = None;
        if let Some(link) = ng.as_mut() {
            // The first report carries rtpengine's answer too, not "full"
            // for want of one.
            let answer = link.exchange().await;
            first_answer = Some(answer);
            sampler.set_engine_sessions(answer);
        }
        let (sampler, initial) = match tokio::task::spawn_blocking(move || {
            let s = sampler.sample();
            (sampler, s)
        })
        .await
        {
            Ok((sampler, s)) => (Some(sampler), s),
            Err(e) => {
                warn!(error = %e, "first load sample failed");
                let fresh = LoadSampler::new(&config.media, &config.general, &config.agent);
                (
                    Some(fresh),
                    Sample {
                        load: 0,
                        cpu: 0,
                        calls: 0,
                        max_calls: config.general.max_calls,
                    },
                )
            }
        };
        let identity = Identity {
            contact_addr,
            contact_port: endpoint.local_addr().port(),
            iface,
        };
        let now = Instant::now();
        let mut agent = Agent::new(now, config, identity, initial);
        match first_answer {
            Some(EngineSessions::Known(_)) => agent.handle_ng_answer(now),
            Some(EngineSessions::Unavailable) => {
                agent.handle_ng_miss(now, "no answer to the ng statistics")
            }
            None => {}
        }
        Self {
            endpoint,
            agent,
            sampler,
            ng,
            engine_ready: None,
        }
    }

    /// Runs until `shutdown` is cancelled (then the graceful shutdown) or
    /// the endpoint stops.
    pub(crate) async fn run(
        mut self,
        config_path: Option<PathBuf>,
        control_socket: Option<PathBuf>,
        shutdown: CancellationToken,
    ) -> Result<(), AgentError> {
        let (mut reloads, _watch_guard) = match config_path {
            Some(path) => {
                let (rx, guard) = config::watch(path);
                (Some(rx), Some(guard))
            }
            None => (None, None),
        };
        let mut now = Instant::now();
        let mut ticker_period = self.agent.sample_interval();
        let mut ticker = new_ticker(now, ticker_period);
        let mut sampling: Option<JoinHandle<(LoadSampler, Sample)>> = None;
        let mut resolving = self.start_resolving();
        let mut ng_buf = vec![0_u8; NG_MAX_DATAGRAM];
        let (mut commands, control_guard) =
            match control_socket.as_deref().and_then(control::listen) {
                Some((rx, guard)) => (Some(rx), Some(guard)),
                None => (None, None),
            };

        let result = loop {
            self.flush(now);
            if self.exit_asked() {
                break Ok(());
            }
            // Near the top the agent samples as often as it may notify
            // (SPEC §4, `notify-top-interval-ms`); a reload may change
            // either interval.
            let period = self.agent.sample_interval();
            if period != ticker_period {
                ticker_period = period;
                ticker = new_ticker(now, period);
            }
            if sampling.is_none() {
                if let Some(engine) = self.engine_ready.take() {
                    sampling = self.spawn_sample(Some(engine));
                }
            }
            let deadline = self.poll_timeout();
            let step = tokio::select! {
                () = shutdown.cancelled() => Step::Shutdown,
                event = self.endpoint.recv() => Step::Sip(event),
                () = sleep_until(deadline.unwrap_or(now + FAR)), if deadline.is_some() => Step::Timeout,
                _ = ticker.tick(), if sampling.is_none() && self.engine_ready.is_none() => Step::Tick,
                received = async { match self.ng.as_ref() { Some(link) => link.socket.recv(&mut ng_buf).await, None => std::future::pending().await } }, if self.ng.is_some() => Step::Ng(received),
                joined = async { match sampling.as_mut() { Some(h) => h.await, None => std::future::pending().await } }, if sampling.is_some() => Step::Sampled(joined),
                found = async { match resolving.as_mut() { Some(h) => h.await, None => std::future::pending().await } }, if resolving.is_some() => Step::Resolved(found),
                reload = async { match reloads.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } }, if reloads.is_some() => Step::Reload(reload),
                command = async { match commands.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } }, if commands.is_some() => Step::Control(command),
            };
            now = Instant::now();
            match step {
                Step::Shutdown => break Ok(()),
                Step::Sip(Some(event)) => self.on_sip_event(now, event).await,
                Step::Sip(None) => {
                    break Err(AgentError::EndpointClosed {
                        addr: self.endpoint.local_addr(),
                    })
                }
                Step::Timeout => self.handle_timeout(now),
                Step::Tick => match self.ng.as_mut() {
                    None => sampling = self.spawn_sample(None),
                    // The previous exchange is still going (its
                    // retransmissions outlast a short interval): this
                    // tick is skipped, its answer will be the sample.
                    Some(link) if link.client.in_flight() => {}
                    Some(link) => match link.client.ask(now) {
                        AskOutcome::Asking => {}
                        AskOutcome::Backoff => {
                            self.engine_ready = Some(EngineSessions::Unavailable);
                            // Not asked (backing off after failures):
                            // still no answer, for the probe too.
                            self.agent
                                .handle_ng_miss(now, "rtpengine did not answer (backing off)");
                        }
                    },
                },
                Step::Ng(received) => {
                    if let Some(link) = self.ng.as_mut() {
                        let answer = match received {
                            Ok(n) => link
                                .client
                                .handle_datagram(now, ng_buf.get(..n).unwrap_or_default()),
                            // ICMP port unreachable, reported on the
                            // connected socket: nothing listens there.
                            Err(e) => link.client.handle_send_error(now, &e.to_string()),
                        };
                        self.ng_answered(now, answer);
                    }
                }
                Step::Sampled(joined) => {
                    sampling = None;
                    match joined {
                        Ok((sampler, sample)) => {
                            self.sampler = Some(sampler);
                            debug!(
                                load = sample.load,
                                cpu = sample.cpu,
                                calls = sample.calls,
                                "load sample"
                            );
                            self.agent.handle_sample(now, sample);
                        }
                        Err(e) => {
                            error!(error = %e, "load sampler failed, restarting it");
                            let config = self.agent.config();
                            self.sampler = Some(LoadSampler::new(
                                &config.media,
                                &config.general,
                                &config.agent,
                            ));
                        }
                    }
                }
                Step::Resolved(found) => {
                    resolving = None;
                    match found {
                        Ok(found) => self.agent.handle_resolved(found),
                        Err(e) => warn!(error = %e, "registrar host resolution failed"),
                    }
                }
                Step::Reload(Some(Ok(config))) => {
                    self.reload(now, config);
                    if self.ng.is_none() {
                        self.engine_ready = None;
                    }
                    if let Some(old) = resolving.take() {
                        old.abort();
                    }
                    resolving = self.start_resolving();
                }
                Step::Reload(Some(Err(e))) => report_bad_config(&e),
                Step::Reload(None) => reloads = None,
                Step::Control(Some(command)) => {
                    let answer = self.agent.handle_control(now, command.request);
                    let _ = command.reply.send(answer.to_string());
                }
                Step::Control(None) => commands = None,
            }
        };
        // Requests during the shutdown are answered `error shutting down`;
        // the socket itself goes once the agent is done (`--wait` sees it
        // go).
        drop(commands);
        if let Some(task) = resolving {
            task.abort();
        }
        self.graceful_shutdown().await;
        drop(control_guard);
        result
    }

    /// Whether the agent asked to stop (drained with `exit-when-empty`).
    fn exit_asked(&mut self) -> bool {
        let mut exit = false;
        while let Some(event) = self.agent.poll_event() {
            exit |= event == Event::ExitWhenDrained;
        }
        exit
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.agent
            .poll_timeout()
            .into_iter()
            .chain(self.ng.as_ref().and_then(|l| l.client.poll_timeout()))
            .min()
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.agent.handle_timeout(now);
        let answer = self.ng.as_mut().and_then(|l| l.client.handle_timeout(now));
        self.ng_answered(now, answer);
    }

    /// The ng exchange of a tick ended: its answer is the next sample's.
    /// With the ng probe, the exchange's outcome is the probe's (SPEC §14).
    fn ng_answered(&mut self, now: Instant, answer: Option<Answer>) {
        match answer {
            Some(Answer::Sessions(n)) => {
                self.engine_ready = Some(EngineSessions::Known(n));
                self.agent.handle_ng_answer(now);
            }
            Some(Answer::Failed(reason)) => {
                self.engine_ready = Some(EngineSessions::Unavailable);
                self.agent.handle_ng_miss(now, &reason.to_string());
            }
            None => {}
        }
    }

    /// Takes a sample off the loop (the sampler reads `/proc`), with
    /// `engine` as the `rtpengine` source's count; `None` when the
    /// sampler is away.
    fn spawn_sample(
        &mut self,
        engine: Option<EngineSessions>,
    ) -> Option<JoinHandle<(LoadSampler, Sample)>> {
        let mut sampler = self.sampler.take()?;
        if let Some(engine) = engine {
            sampler.set_engine_sessions(engine);
        }
        Some(tokio::task::spawn_blocking(move || {
            let s = sampler.sample();
            (sampler, s)
        }))
    }

    async fn on_sip_event(&mut self, now: Instant, event: SipEvent) {
        match event {
            SipEvent::Request(tx) => {
                let response = self.agent.handle_request(now, tx.source(), tx.request());
                if let Some(response) = response {
                    tx.respond(response).await;
                }
            }
            SipEvent::Response { id, response } => self.agent.handle_response(now, id, &response),
            SipEvent::Failed { id, reason } => self.agent.handle_failure(now, id, &reason),
            SipEvent::Closed { remote } => self.agent.handle_closed(now, remote),
        }
    }

    /// Hands every queued request to the endpoint, and the ng client's
    /// datagram to its socket.
    fn flush(&mut self, now: Instant) {
        if let Some(link) = self.ng.as_mut() {
            let mut answer = None;
            while let Some(datagram) = link.client.poll_transmit() {
                // A datagram of tens of bytes on an idle socket: the send
                // buffer has room, so this never waits.
                if let Err(e) = link.socket.try_send(&datagram) {
                    answer = link.client.handle_send_error(now, &e.to_string());
                }
            }
            self.ng_answered(now, answer);
        }
        while let Some(transmit) = self.agent.poll_transmit() {
            if let Err(e) = self.endpoint.send_request(transmit.id, transmit.request) {
                warn!(error = %e, "cannot send request");
                self.agent.handle_failure(now, transmit.id, &e.to_string());
            }
        }
    }

    /// The shutdown of [`crate::core`]: the agent says when each phase is
    /// over; the endpoint stops after it, or when it stops on its own.
    async fn graceful_shutdown(&mut self) {
        let mut now = Instant::now();
        self.agent.shutdown(now);
        loop {
            self.flush(now);
            let mut stopped = false;
            while let Some(event) = self.agent.poll_event() {
                stopped |= event == Event::Stopped;
            }
            if stopped {
                break;
            }
            let deadline = self.agent.poll_timeout();
            let step = tokio::select! {
                () = sleep_until(deadline.unwrap_or(now + FAR)), if deadline.is_some() => None,
                event = self.endpoint.recv() => match event {
                    Some(event) => Some(event),
                    None => break,
                },
            };
            now = Instant::now();
            match step {
                None => self.agent.handle_timeout(now),
                Some(event) => self.on_sip_event(now, event).await,
            }
        }
        self.endpoint.shutdown();
        info!("stopped");
    }
}

/// A deadline beyond any of the loop's, for a disabled sleep.
const FAR: Duration = Duration::from_secs(86_400);

fn report_bad_config(e: &ConfigError) {
    error!(error = %e, "config reload failed, keeping the last good config");
}

fn new_ticker(now: Instant, period: Duration) -> tokio::time::Interval {
    let period = period.max(Duration::from_millis(1));
    let mut t = tokio::time::interval_at(now + period, period);
    t.set_missed_tick_behavior(MissedTickBehavior::Delay);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lo` owns 127.0.0.1 and, through its 127.0.0.0/8, every loopback
    /// alias (a contact on 127.0.0.62 is `lo@msr_1`, as the guides name
    /// it).
    #[test]
    fn a_loopback_alias_is_los() {
        let lo = interface_name(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)).expect("lo");
        assert_eq!(
            interface_name("127.0.0.62".parse().expect("ip")).as_deref(),
            Some(lo.as_str())
        );
    }

    #[test]
    fn a_network_holds_the_addresses_of_its_prefix_only() {
        let on = if_addrs::IfAddr::V4(if_addrs::Ifv4Addr {
            ip: "10.1.2.3".parse().expect("ip"),
            netmask: "255.255.255.0".parse().expect("mask"),
            prefixlen: 24,
            broadcast: None,
        });
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert!(network_holds(&on, ip("10.1.2.200")));
        assert!(!network_holds(&on, ip("10.1.3.1")));
        assert!(!network_holds(&on, ip("::1")));
    }
}
