//! The etcd backend of the operator store (SPEC §12): one task owns the
//! etcd client and talks to the shell over two channels of typed messages.
//!
//! Keys, under `[store] prefix` (`P`):
//!
//! * `P operator`: the whole operator configuration (SPEC §6), in the store's
//!   private JSON format ([`OperatorConfig::encode`]). Its `mod_revision` is
//!   the revision a change is made against: a change is a transaction that
//!   writes the key only if its `mod_revision` is still the one the change
//!   was computed from (compare-and-swap), so two collectors changing the
//!   configuration at the same time cannot lose one of the changes: the
//!   later one is refused ([`CommitError::Conflict`]).
//! * `P members/NODE`: one per live collector, attached to a lease the task
//!   keeps alive; a collector that stops without revoking it (kill -9, host
//!   down) leaves the list when the lease expires (`[store] lease_ttl_secs`).
//!
//! The task, in a loop: connect, read both (one range read: the revision it
//! returns is where the watch starts, so nothing in between is missed), send
//! [`EtcdEvent::Config`] and [`EtcdEvent::Members`], put the membership key,
//! then watch the prefix and answer [`EtcdCommand::Commit`]s until an
//! error; then [`EtcdEvent::Unavailable`], a capped backoff
//! ([`RECONNECT_BASE`] to [`RECONNECT_CAP`]) and again. Each reconnection
//! reads the configuration anew, so changes made elsewhere meanwhile are
//! caught up. Every configuration read from etcd is also written to the
//! local cache (`[state] path`), which a collector starts from when etcd is
//! unreachable at its start.
//!
//! Architecture invariant: the shell never waits on etcd; the task never
//! touches the shell's state. Outage logs are rate-limited: one line when
//! etcd becomes unreachable, then at most one per [`OUTAGE_LOG_INTERVAL`].

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use msr_shared::backoff::Backoff;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::EtcdConfig;
use crate::operator::store::Store;
use crate::operator::{DecodeError, OperatorConfig};

/// First wait before reconnecting after etcd failed.
pub const RECONNECT_BASE: Duration = Duration::from_millis(200);
/// Longest wait between two connection attempts.
pub const RECONNECT_CAP: Duration = Duration::from_secs(5);
/// At most one "still unreachable" log line per this interval.
pub const OUTAGE_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// The name of the configuration key under the prefix.
pub const OPERATOR_KEY: &str = "operator";
/// The folder of the membership keys under the prefix.
pub const MEMBERS_DIR: &str = "members/";

/// The keys under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The keys under `prefix` (ends in `/`, as the config checks).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `P operator`.
    pub fn operator(&self) -> String {
        format!("{}{OPERATOR_KEY}", self.prefix)
    }

    /// `P members/`.
    pub fn members(&self) -> String {
        format!("{}{MEMBERS_DIR}", self.prefix)
    }

    /// `P members/NODE`.
    pub fn member(&self, node: &str) -> String {
        format!("{}{node}", self.members())
    }
}

/// A live collector as its membership key holds it (private format of this
/// module, like the configuration's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// `node` of its config.
    pub node: String,
    /// Its bound SIP address.
    pub sip: String,
    /// Unix time (seconds) of its start.
    pub started_unix: i64,
}

/// From the shell to the etcd task.
#[derive(Debug)]
pub enum EtcdCommand {
    /// Write `config` if the configuration key's `mod_revision` is still
    /// `expected` (`None`: the key must not exist).
    Commit {
        /// Given back in the answer.
        ticket: u64,
        /// The configuration to write.
        config: Box<OperatorConfig>,
        /// The revision the change was made against.
        expected: Option<i64>,
    },
}

/// From the etcd task to the shell, in the order things happened.
#[derive(Debug)]
pub enum EtcdEvent {
    /// etcd answered: changes are accepted again.
    Connected,
    /// etcd cannot be reached: changes are refused until [`EtcdEvent::Connected`].
    Unavailable {
        /// The last error.
        reason: String,
        /// Since when (the first failure of this outage).
        since: SystemTime,
    },
    /// The configuration stored in etcd, at start, after a reconnection and
    /// after every change (ours included).
    Config {
        /// The decoded configuration (empty when the key does not exist).
        config: Box<OperatorConfig>,
        /// The key's `mod_revision`; `None` when it does not exist.
        mod_revision: Option<i64>,
        /// The etcd revision this state is as of (orders the events).
        revision: i64,
    },
    /// The live collectors, after every change of the list.
    Members(Vec<Member>),
    /// A [`EtcdCommand::Commit`] was written at `revision`.
    Committed {
        /// The command's ticket.
        ticket: u64,
        /// The new `mod_revision` of the configuration key.
        revision: i64,
    },
    /// A [`EtcdCommand::Commit`] was not written.
    Refused {
        /// The command's ticket.
        ticket: u64,
        /// Why.
        error: CommitError,
    },
}

/// Why a change was not written to etcd.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// Another collector changed the configuration first.
    #[error(
        "conflict: the operator configuration changed on another collector \
         (revision {}, this change was made against revision {}); nothing changed: \
         look at the new state and run the command again",
        describe(*found),
        describe(*expected)
    )]
    Conflict {
        /// The revision the change was made against.
        expected: Option<i64>,
        /// The revision etcd holds now.
        found: Option<i64>,
    },
    /// etcd did not answer.
    #[error(
        "etcd is unreachable ({reason}): changes are refused; \
         selection goes on with the last configuration seen"
    )]
    Unavailable {
        /// The client's error.
        reason: String,
    },
}

fn describe(revision: Option<i64>) -> String {
    revision.map_or_else(
        || "none (no configuration yet)".to_owned(),
        |r| r.to_string(),
    )
}

/// Why the etcd client failed (one connection attempt, or a session).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// The client reported an error (connection, timeout, refusal),
    /// written for a person ([`plain`]), not as the gRPC stack's debug text.
    #[error("etcd {endpoints}: {}", plain(source))]
    Client {
        /// The configured endpoints, comma-separated.
        endpoints: String,
        /// The client's error.
        source: etcd_client::Error,
    },
    /// A TLS file could not be read.
    #[error("[store.tls] {path}: {source}")]
    TlsFile {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The watch or the lease keep-alive stream ended.
    #[error("etcd {endpoints}: {what}")]
    Stream {
        /// The configured endpoints, comma-separated.
        endpoints: String,
        /// What ended.
        what: &'static str,
    },
    /// The configuration stored in etcd is not valid.
    #[error("etcd key {key} is not a valid operator configuration: {source}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong with it.
        source: DecodeError,
    },
    /// A request took longer than `[store] request_timeout_ms`.
    #[error("etcd {endpoints}: no answer within {} ms", timeout.as_millis())]
    Timeout {
        /// The configured endpoints, comma-separated.
        endpoints: String,
        /// The limit.
        timeout: Duration,
    },
}

/// `error` for a person: the gRPC status's meaning and message and the
/// innermost causes (e.g. `the service is currently unavailable: tcp
/// connect error: Connection refused (os error 111)`), without the
/// transport's debug dump, and a hint for the usual causes.
pub fn plain(error: &etcd_client::Error) -> String {
    use std::error::Error as _;
    let mut parts: Vec<String> = Vec::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = match error {
        etcd_client::Error::GRpcStatus(status) => {
            let meaning = status.code().description();
            let mut chars = meaning.chars();
            let meaning = match chars.next() {
                Some(first) => first.to_lowercase().chain(chars).collect(),
                None => String::new(),
            };
            parts.push(meaning);
            parts.push(status.message().to_owned());
            status.source()
        }
        etcd_client::Error::TransportError(e) => Some(e),
        etcd_client::Error::IoError(e) => Some(e),
        other => return other.to_string(),
    };
    while let Some(cause) = source {
        parts.push(cause.to_string());
        source = cause.source();
    }
    plain_parts(parts)
}

/// The parts of [`plain`], joined: empty, generic ("transport error") and
/// repeated ones left out, a hint added for a refused connection, a failed
/// name lookup or a refused login.
fn plain_parts(parts: Vec<String>) -> String {
    let mut kept: Vec<String> = Vec::new();
    for part in parts {
        let part = part.trim().to_owned();
        if part.is_empty() || part == "transport error" || kept.contains(&part) {
            continue;
        }
        kept.push(part);
    }
    let text = kept.join(": ");
    let lower = text.to_ascii_lowercase();
    let hint = if lower.contains("connection refused") {
        "; is etcd running there, and is that its client URL ([store] endpoints)?"
    } else if lower.contains("dns error") || lower.contains("failed to lookup address") {
        "; the host name of [store] endpoints does not resolve"
    } else if lower.contains("authentication failed") || lower.contains("invalid auth token") {
        "; check [store] user and password"
    } else {
        ""
    };
    format!("{text}{hint}")
}

/// Connects to etcd as `[store]` says (endpoints, user, TLS, timeouts).
///
/// # Errors
/// [`EtcdError::TlsFile`], [`EtcdError::Client`], [`EtcdError::Timeout`].
pub async fn connect(config: &EtcdConfig) -> Result<Client, EtcdError> {
    let mut options = ConnectOptions::new()
        .with_timeout(config.request_timeout)
        .with_connect_timeout(config.request_timeout)
        // HTTP/2 pings find a dead etcd on an idle watch stream.
        .with_keep_alive(Duration::from_secs(1), config.request_timeout)
        .with_keep_alive_while_idle(true);
    if let Some((user, password)) = &config.user {
        options = options.with_user(user.clone(), password.clone());
    }
    if let Some(tls) = &config.tls {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|source| EtcdError::TlsFile {
                path: path.to_owned(),
                source,
            })
        };
        let mut tls_options =
            TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
        if let Some((cert, key)) = &tls.identity {
            tls_options = tls_options.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        options = options.with_tls(tls_options);
    }
    let endpoints = config.endpoints.join(",");
    match tokio::time::timeout(
        config.request_timeout,
        Client::connect(&config.endpoints, Some(options)),
    )
    .await
    {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(source)) => Err(EtcdError::Client { endpoints, source }),
        Err(_) => Err(EtcdError::Timeout {
            endpoints,
            timeout: config.request_timeout,
        }),
    }
}

/// What one range read of the prefix found.
#[derive(Debug)]
pub struct Snapshot {
    /// The configuration (empty when the key does not exist).
    pub config: OperatorConfig,
    /// The configuration key's `mod_revision`.
    pub mod_revision: Option<i64>,
    /// The number of keys under the prefix besides the membership keys.
    pub other_keys: usize,
    /// The live members.
    pub members: BTreeMap<String, Member>,
    /// The etcd revision of the read.
    pub revision: i64,
}

/// Reads everything under the prefix at one revision.
///
/// # Errors
/// [`EtcdError::Client`]; [`EtcdError::Corrupt`] when the configuration key
/// does not decode.
pub async fn read_snapshot(
    client: &mut Client,
    keys: &Keys,
    endpoints: &str,
) -> Result<Snapshot, EtcdError> {
    let response = client
        .get(keys.prefix(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|source| EtcdError::Client {
            endpoints: endpoints.to_owned(),
            source,
        })?;
    let revision = response.header().map_or(0, |h| h.revision());
    let operator_key = keys.operator();
    let members_dir = keys.members();
    let mut snapshot = Snapshot {
        config: OperatorConfig::new(),
        mod_revision: None,
        other_keys: 0,
        members: BTreeMap::new(),
        revision,
    };
    for kv in response.kvs() {
        let key = String::from_utf8_lossy(kv.key());
        if key == operator_key {
            snapshot.config = decode_config(&operator_key, kv.value())?;
            snapshot.mod_revision = Some(kv.mod_revision());
            snapshot.other_keys += 1;
        } else if let Some(node) = key.strip_prefix(members_dir.as_str()) {
            if let Some(member) = decode_member(node, kv.value()) {
                snapshot.members.insert(node.to_owned(), member);
            }
        } else {
            snapshot.other_keys += 1;
        }
    }
    Ok(snapshot)
}

fn decode_config(key: &str, value: &[u8]) -> Result<OperatorConfig, EtcdError> {
    let text = String::from_utf8_lossy(value);
    OperatorConfig::decode(&text).map_err(|source| EtcdError::Corrupt {
        key: key.to_owned(),
        source,
    })
}

fn decode_member(node: &str, value: &[u8]) -> Option<Member> {
    match serde_json::from_slice::<Member>(value) {
        Ok(member) => Some(member),
        Err(error) => {
            warn!(node, %error, "unreadable membership key ignored");
            None
        }
    }
}

/// Writes `config` if the configuration key's `mod_revision` is `expected`
/// (`None`: absent; with `force`, whatever it holds). Returns the new
/// `mod_revision`, or the one found when the compare failed.
///
/// # Errors
/// [`EtcdError::Client`].
pub async fn write_config(
    client: &mut Client,
    keys: &Keys,
    endpoints: &str,
    config: &OperatorConfig,
    expected: Option<i64>,
) -> Result<Result<i64, Option<i64>>, EtcdError> {
    let key = keys.operator();
    let compare = match expected {
        Some(revision) => Compare::mod_revision(key.clone(), CompareOp::Equal, revision),
        None => Compare::version(key.clone(), CompareOp::Equal, 0),
    };
    let txn = Txn::new()
        .when([compare])
        .and_then([TxnOp::put(key.clone(), config.encode(), None)])
        .or_else([TxnOp::get(key, None)]);
    let response = client.txn(txn).await.map_err(|source| EtcdError::Client {
        endpoints: endpoints.to_owned(),
        source,
    })?;
    if response.succeeded() {
        return Ok(Ok(response.header().map_or(0, |h| h.revision())));
    }
    let found = response.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => Some(get.kvs().first().map(|kv| kv.mod_revision())),
        _ => None,
    });
    Ok(Err(found.flatten()))
}

/// Writes `config` whatever the key holds (`store migrate --force`).
///
/// # Errors
/// [`EtcdError::Client`].
pub async fn overwrite_config(
    client: &mut Client,
    keys: &Keys,
    endpoints: &str,
    config: &OperatorConfig,
) -> Result<i64, EtcdError> {
    let response = client
        .put(keys.operator(), config.encode(), None)
        .await
        .map_err(|source| EtcdError::Client {
            endpoints: endpoints.to_owned(),
            source,
        })?;
    Ok(response.header().map_or(0, |h| h.revision()))
}

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

#[cfg(test)]
mod tests;
