//! A new, valid config applied while the agent runs (SPEC §2 hot reload):
//! accounts added, changed (registered again) and removed (unregistered),
//! the sampler, the ng link and the notifier reconfigured, the TLS files
//! read again; what needs a restart (the transport, the engine's ports) is
//! logged and left as it is.

use std::collections::HashMap;

use tokio::time::Instant;
use tracing::{info, warn};

use super::{account_key, host_port, notifier_config, probe_config, AccountKey, NgLink, Shell};
use crate::config::{self, Account, AgentConfig};
use crate::engine_probe::EngineProbe;
use msr_shared::event_package::EngineState;

impl Shell {
    /// Reads the `<agent tls-…>` files of `config` again: connections
    /// opened from now on use them; files that cannot be used leave the
    /// running ones (and the reload's other changes go on).
    fn reload_tls(&mut self, config: &AgentConfig) {
        let Some(tls) = &config.agent.tls else {
            warn!("<agent tls-ca> removed: tls connections keep the files read before");
            return;
        };
        match tls.read() {
            Ok(client) => {
                self.endpoint.set_tls_client(&client);
                info!("<agent tls-…> files read again: new tls connections use them");
                for warning in tls.warnings(config.tls_msrs()) {
                    warn!("{warning}");
                }
            }
            Err(error) => warn!(
                attribute = tls.attribute_of(&error.path),
                %error,
                "<agent tls-…> files not reloaded; the running ones stay"
            ),
        }
    }

    /// A new `<agent engine-probe…>` applies at once (SPEC §14); the same
    /// kind of probe keeps what it saw.
    fn reload_probe(&mut self, now: Instant) {
        let port = self.endpoint.local_addr().port();
        match (
            self.probe.as_mut(),
            probe_config(&self.config, self.contact_addr, port),
        ) {
            (Some(probe), Some(config)) => {
                if probe.config() != &config {
                    info!(method = %config.method, engine = %config.method.target(), "engine probe reconfigured");
                    probe.reconfigure(now, config);
                }
            }
            (None, Some(config)) => {
                info!(method = %config.method, engine = %config.method.target(), "engine probe on");
                self.probe = Some(EngineProbe::new(config, now));
            }
            (Some(_), None) => {
                info!("engine probe off: notifies say engine: unchecked");
                self.probe = None;
                self.notifier.set_engine(now, EngineState::Unchecked);
            }
            (None, None) => {}
        }
    }

    /// Applies a new, valid config (SPEC §2 hot reload).
    pub(super) fn reload(&mut self, now: Instant, config: AgentConfig) {
        if config.transport != self.config.transport {
            let show =
                |t: &config::TransportConfig| format!("{} {}:{}", t.transport, t.bind_addr, t.port);
            warn!(
                old = %show(&self.config.transport),
                new = %show(&config.transport),
                "transport change ignored until restart"
            );
        }
        let old: HashMap<AccountKey, Account> = self
            .config
            .accounts
            .iter()
            .map(|a| (account_key(a), a.clone()))
            .collect();
        let new: HashMap<AccountKey, Account> = config
            .accounts
            .iter()
            .map(|a| (account_key(a), a.clone()))
            .collect();
        if config.mcc != self.config.mcc || config.agent.sip_port != self.config.agent.sip_port {
            warn!("<pbyte><mcc> or <agent sip-port> change ignored until restart");
        }
        if config.agent.tls != self.config.agent.tls {
            self.reload_tls(&config);
        }
        if config.warnings != self.config.warnings {
            for warning in &config.warnings {
                warn!("{warning}");
            }
        }
        // What was bound and reported at start stays until a restart.
        let mut config = config;
        config.transport = self.config.transport.clone();
        config.mcc = self.config.mcc;
        config.agent.sip_port = self.config.agent.sip_port;
        self.config = config;
        for (key, account) in &old {
            match new.get(key) {
                None => {
                    if let Some(mut reg) = self.registrations.remove(key) {
                        info!(msr = %account.msr_name, realm = %account.realm, "account removed, unregistering");
                        reg.unregister(now);
                        self.retiring.push(reg);
                    }
                }
                Some(updated) if updated != account => {
                    info!(msr = %account.msr_name, realm = %account.realm, "account changed, registering again");
                    self.add_account(now, updated);
                }
                Some(_) => {}
            }
        }
        for (key, account) in &new {
            if !old.contains_key(key) {
                info!(msr = %account.msr_name, realm = %account.realm, "account added");
                self.add_account(now, account);
            }
        }
        let expires = self.config.agent.register_expires;
        for reg in self.registrations.values_mut() {
            reg.set_expires(expires);
        }
        if let Some(sampler) = self.sampler.as_mut() {
            sampler.reconfigure(&self.config.media, &self.config.general, &self.config.agent);
        }
        let target = self.config.ng_address();
        if self.ng.as_ref().map(|l| l.client.target()) != target {
            self.ng = NgLink::for_config(&self.config);
        }
        self.reload_probe(now);
        // Names no longer in the config are forgotten; new ones are
        // resolved by the caller, and allowed once they are.
        let names = self.config.subscriber_hosts().names;
        self.resolved.retain(|name, _| names.contains(name));
        let contact = host_port(self.contact_addr, self.endpoint.local_addr().port());
        self.notifier
            .reconfigure(now, notifier_config(&self.config, &contact, &self.resolved));
        info!(
            accounts = self.config.accounts.len(),
            load_delta = self.config.general.load_delta,
            codecs = %self.config.codecs_shown(),
            video_enc = %self.config.media.video_enc_size(),
            "config reloaded"
        );
    }
}
