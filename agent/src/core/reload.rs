//! A new, valid config applied while the agent runs (SPEC §2 hot reload),
//! the part that is state: accounts added, changed (registered again) and
//! removed (unregistered), the engine probe and the notifier
//! reconfigured; what needs a restart (the transport, the engine's ports)
//! is logged and left as it is. The shell reconfigures what does I/O (the
//! sampler, the ng link, the TLS files).

use std::collections::HashMap;

use msr_shared::event_package::EngineState;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{account_key, notifier_config, probe_config, AccountKey, Agent};
use crate::config::{self, Account, AgentConfig};
use crate::engine_probe::EngineProbe;

impl Agent {
    /// A new `<agent engine-probe…>` applies at once (SPEC §14); the same
    /// kind of probe keeps what it saw.
    fn reload_probe(&mut self, now: Instant) {
        let port = self.identity.contact_port;
        match (
            self.probe.as_mut(),
            probe_config(&self.config, self.identity.contact_addr, port),
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

    /// Applies a new, valid config (SPEC §2 hot reload). What was bound
    /// and reported at start (the transport, `<mcc>`, `<agent sip-port>`)
    /// stays until a restart: [`config`](Self::config) keeps it.
    pub fn reconfigure(&mut self, now: Instant, config: AgentConfig) {
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
        if config.warnings != self.config.warnings {
            for warning in &config.warnings {
                warn!("{warning}");
            }
        }
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
        self.reload_probe(now);
        // Names no longer in the config are forgotten; new ones are
        // resolved by the shell, and allowed once they are.
        let names = self.config.subscriber_hosts().names;
        self.resolved.retain(|name, _| names.contains(name));
        self.notifier.reconfigure(
            now,
            notifier_config(&self.config, &self.contact(), &self.resolved),
        );
        self.glue(now);
    }
}
