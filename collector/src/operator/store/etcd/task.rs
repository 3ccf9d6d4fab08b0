//! The etcd task (SPEC §12): the one owner of the client, looping through
//! sessions (connect, read, announce the member, watch and commit) until
//! shutdown, with a capped backoff between them and the rate-limited
//! outage log the module docs of [`super`] describe.

use std::time::SystemTime;

use etcd_client::{EventType, PutOptions, WatchOptions};
use msr_shared::backoff::Backoff;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::*;
use crate::config::EtcdConfig;
use crate::operator::store::Store;

/// The etcd task (see the module docs); [`spawn`] starts it.
struct Task {
    config: EtcdConfig,
    keys: Keys,
    endpoints: String,
    member: Member,
    cache: Store,
    commands: mpsc::Receiver<EtcdCommand>,
    events: mpsc::Sender<EtcdEvent>,
    shutdown: CancellationToken,
}

/// The shell's ends of the task's channels.
#[derive(Debug)]
pub struct EtcdLink {
    /// Commands to the task.
    pub commands: mpsc::Sender<EtcdCommand>,
    /// Events from the task.
    pub events: mpsc::Receiver<EtcdEvent>,
}

/// Starts the etcd task; it runs until `shutdown` is cancelled (then it
/// revokes its membership lease) or the shell drops its [`EtcdLink`].
pub fn spawn(
    config: EtcdConfig,
    member: Member,
    cache: Store,
    shutdown: CancellationToken,
) -> (EtcdLink, tokio::task::JoinHandle<()>) {
    let (command_tx, commands) = mpsc::channel(64);
    let (events, event_rx) = mpsc::channel(256);
    let task = Task {
        keys: Keys::new(&config.prefix),
        endpoints: config.endpoints.join(","),
        config,
        member,
        cache,
        commands,
        events,
        shutdown,
    };
    let join = tokio::spawn(task.run());
    (
        EtcdLink {
            commands: command_tx,
            events: event_rx,
        },
        join,
    )
}

/// How a session ended.
enum End {
    /// Shutdown, or the shell went away.
    Stop,
    /// etcd failed; reconnect.
    Failed(EtcdError),
}

/// The current outage, for the rate-limited log.
struct Outage {
    since: SystemTime,
    started: Instant,
    attempts: u32,
    logged: Instant,
}

impl Task {
    async fn run(mut self) {
        let mut backoff = Backoff::new(RECONNECT_BASE, RECONNECT_CAP);
        let mut outage: Option<Outage> = None;
        loop {
            let end = self.session(&mut outage, &mut backoff).await;
            let error = match end {
                End::Stop => return,
                End::Failed(error) => error,
            };
            let now = Instant::now();
            let reason = error.to_string();
            match &mut outage {
                None => {
                    warn!(
                        %error,
                        "etcd unreachable: changes are refused, selection goes on with the last configuration seen"
                    );
                    outage = Some(Outage {
                        since: SystemTime::now(),
                        started: now,
                        attempts: 1,
                        logged: now,
                    });
                }
                Some(o) => {
                    o.attempts += 1;
                    if now.duration_since(o.logged) >= OUTAGE_LOG_INTERVAL {
                        o.logged = now;
                        warn!(
                            %error,
                            attempts = o.attempts,
                            down_secs = now.duration_since(o.started).as_secs(),
                            "etcd still unreachable"
                        );
                    }
                }
            }
            let since = outage.as_ref().map_or_else(SystemTime::now, |o| o.since);
            if self
                .events
                .send(EtcdEvent::Unavailable {
                    reason: reason.clone(),
                    since,
                })
                .await
                .is_err()
            {
                return;
            }
            let until = now + backoff.next_delay();
            loop {
                tokio::select! {
                    () = self.shutdown.cancelled() => return,
                    () = tokio::time::sleep_until(until) => break,
                    command = self.commands.recv() => match command {
                        None => return,
                        Some(EtcdCommand::Commit { ticket, .. }) => {
                            let error = CommitError::Unavailable { reason: reason.clone() };
                            if self.events.send(EtcdEvent::Refused { ticket, error }).await.is_err() {
                                return;
                            }
                        }
                    },
                }
            }
        }
    }

    fn client_error(&self, source: etcd_client::Error) -> EtcdError {
        EtcdError::Client {
            endpoints: self.endpoints.clone(),
            source,
        }
    }

    fn stream_end(&self, what: &'static str) -> EtcdError {
        EtcdError::Stream {
            endpoints: self.endpoints.clone(),
            what,
        }
    }

    async fn send(&self, event: EtcdEvent) -> Result<(), End> {
        self.events.send(event).await.map_err(|_| End::Stop)
    }

    /// Writes a configuration read from etcd to the local cache (off the
    /// runtime's threads: a save fsyncs).
    async fn cache(&self, config: &OperatorConfig) {
        let store = self.cache.clone();
        let config = config.clone();
        match tokio::task::spawn_blocking(move || store.save(&config)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                warn!(%error, "cannot write the local copy of the etcd configuration")
            }
            Err(error) => warn!(%error, "cannot write the local copy of the etcd configuration"),
        }
    }

    async fn session(&mut self, outage: &mut Option<Outage>, backoff: &mut Backoff) -> End {
        match self.session_inner(outage, backoff).await {
            Ok(never) => match never {},
            Err(end) => end,
        }
    }

    async fn session_inner(
        &mut self,
        outage: &mut Option<Outage>,
        backoff: &mut Backoff,
    ) -> Result<std::convert::Infallible, End> {
        let mut client = tokio::select! {
            () = self.shutdown.cancelled() => return Err(End::Stop),
            client = connect(&self.config) => client.map_err(End::Failed)?,
        };
        let snapshot = read_snapshot(&mut client, &self.keys, &self.endpoints)
            .await
            .map_err(End::Failed)?;
        // A session starts: every later failure begins a new outage.
        backoff.reset();
        if let Some(o) = outage.take() {
            info!(
                revision = snapshot.revision,
                down_secs = o.started.elapsed().as_secs(),
                attempts = o.attempts,
                "etcd reachable again, configuration caught up"
            );
        } else {
            info!(
                endpoints = %self.endpoints,
                prefix = %self.keys.prefix(),
                revision = snapshot.revision,
                "etcd connected"
            );
        }
        self.cache(&snapshot.config).await;
        let mut members = snapshot.members;
        self.send(EtcdEvent::Config {
            config: Box::new(snapshot.config),
            mod_revision: snapshot.mod_revision,
            revision: snapshot.revision,
        })
        .await?;
        self.send(EtcdEvent::Connected).await?;

        // Membership: a lease, the key on it, keep-alives at a third of the TTL.
        let ttl = i64::try_from(self.config.lease_ttl.as_secs()).unwrap_or(i64::MAX);
        let lease = client
            .lease_grant(ttl, None)
            .await
            .map_err(|e| End::Failed(self.client_error(e)))?
            .id();
        let member_key = self.keys.member(&self.member.node);
        let value = serde_json::to_string(&self.member).unwrap_or_default();
        client
            .put(
                member_key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(|e| End::Failed(self.client_error(e)))?;
        members.insert(self.member.node.clone(), self.member.clone());
        self.send(EtcdEvent::Members(members.values().cloned().collect()))
            .await?;
        let (mut keeper, mut keep_alives) = client
            .lease_keep_alive(lease)
            .await
            .map_err(|e| End::Failed(self.client_error(e)))?;
        let mut keep_alive_tick = tokio::time::interval(self.config.lease_ttl / 3);

        let mut watch = client
            .watch(
                self.keys.prefix(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(snapshot.revision + 1),
                ),
            )
            .await
            .map_err(|e| End::Failed(self.client_error(e)))?;
        let operator_key = self.keys.operator();
        let members_dir = self.keys.members();
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => {
                    // The member list shrinks at once rather than after the TTL.
                    let revoke = client.lease_revoke(lease);
                    if tokio::time::timeout(Duration::from_millis(500), revoke).await.is_err() {
                        debug!("membership lease not revoked in time; it expires");
                    }
                    return Err(End::Stop);
                }
                command = self.commands.recv() => {
                    let Some(EtcdCommand::Commit { ticket, config, expected }) = command else {
                        return Err(End::Stop);
                    };
                    let written = tokio::time::timeout(
                        self.config.request_timeout,
                        write_config(&mut client, &self.keys, &self.endpoints, &config, expected),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(EtcdError::Timeout {
                            endpoints: self.endpoints.clone(),
                            timeout: self.config.request_timeout,
                        })
                    });
                    match written {
                        Ok(Ok(revision)) => {
                            self.cache(&config).await;
                            self.send(EtcdEvent::Committed { ticket, revision }).await?;
                        }
                        Ok(Err(found)) => {
                            let error = CommitError::Conflict { expected, found };
                            self.send(EtcdEvent::Refused { ticket, error }).await?;
                        }
                        Err(error) => {
                            let refusal = CommitError::Unavailable { reason: error.to_string() };
                            self.send(EtcdEvent::Refused { ticket, error: refusal }).await?;
                            return Err(End::Failed(error));
                        }
                    }
                }
                _ = keep_alive_tick.tick() => {
                    keeper.keep_alive().await.map_err(|e| End::Failed(self.client_error(e)))?;
                }
                message = keep_alives.message() => {
                    match message.map_err(|e| End::Failed(self.client_error(e)))? {
                        Some(response) if response.ttl() > 0 => {}
                        // The lease expired (etcd lost us for a whole TTL):
                        // reconnect, which registers anew.
                        Some(_) => return Err(End::Failed(self.stream_end("membership lease expired"))),
                        None => return Err(End::Failed(self.stream_end("lease keep-alive stream ended"))),
                    }
                }
                message = watch.message() => {
                    let Some(response) = message.map_err(|e| End::Failed(self.client_error(e)))? else {
                        return Err(End::Failed(self.stream_end("watch stream ended")));
                    };
                    if response.canceled() {
                        // Compacted past our revision, or cancelled by etcd:
                        // a new session reads everything again.
                        return Err(End::Failed(self.stream_end("watch cancelled by etcd")));
                    }
                    let header = response.header().map_or(0, |h| h.revision());
                    let mut members_changed = false;
                    for event in response.events() {
                        let Some(kv) = event.kv() else { continue };
                        let key = String::from_utf8_lossy(kv.key());
                        let revision = if kv.mod_revision() > 0 { kv.mod_revision() } else { header };
                        if key == operator_key {
                            let (config, mod_revision) = match event.event_type() {
                                EventType::Put => match decode_config(&operator_key, kv.value()) {
                                    Ok(config) => (config, Some(kv.mod_revision())),
                                    Err(error) => {
                                        warn!(%error, revision, "configuration in etcd ignored, keeping the last good one");
                                        continue;
                                    }
                                },
                                EventType::Delete => (OperatorConfig::new(), None),
                            };
                            self.cache(&config).await;
                            self.send(EtcdEvent::Config { config: Box::new(config), mod_revision, revision }).await?;
                        } else if let Some(node) = key.strip_prefix(members_dir.as_str()) {
                            members_changed = true;
                            match event.event_type() {
                                EventType::Put => {
                                    if let Some(member) = decode_member(node, kv.value()) {
                                        members.insert(node.to_owned(), member);
                                    }
                                }
                                EventType::Delete => {
                                    members.remove(node);
                                }
                            }
                        }
                    }
                    if members_changed {
                        self.send(EtcdEvent::Members(members.values().cloned().collect())).await?;
                    }
                }
            }
        }
    }
}
