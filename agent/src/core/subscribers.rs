//! Who may SUBSCRIBE (SPEC §4), as the notifier is told it: the realm
//! hosts written as IP addresses and `<agent allow-subscribers>` at once,
//! the realm hosts written as names once the shell's resolution has found
//! them ([`Agent::handle_resolved`]); a name that fails to resolve keeps
//! the addresses it had.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use tracing::{info, warn};

use super::{host_port, Agent};
use crate::config::{Account, AgentConfig};
use crate::notifier::NotifierConfig;

/// What one resolution of the registrars' host names found: per name, its
/// addresses or why there are none.
pub type Resolution = Vec<(String, Result<BTreeSet<IpAddr>, String>)>;

pub(super) fn notifier_config(
    config: &AgentConfig,
    contact: &str,
    resolved: &BTreeMap<String, BTreeSet<IpAddr>>,
) -> NotifierConfig {
    NotifierConfig {
        subscribers: subscribers(config, resolved),
        registrars: config
            .accounts
            .iter()
            .flat_map(|a| registrar_addrs(a, resolved))
            .collect(),
        load_delta: config.general.load_delta,
        high_water: config.agent.notify_high_water,
        notify_min_interval: config.agent.notify_min_interval(),
        notify_top_interval: config.agent.notify_top_interval(),
        max_expires: config.agent.max_subscription_expires,
        contact_host_port: contact.to_owned(),
        accounts: config
            .accounts
            .iter()
            .map(|a| a.msr_name.clone())
            .collect::<BTreeSet<_>>(),
        codecs: config.codecs,
    }
}

/// The subscriber hosts of `config`: its addresses, and the addresses
/// `resolved` holds for its names.
fn subscribers(
    config: &AgentConfig,
    resolved: &BTreeMap<String, BTreeSet<IpAddr>>,
) -> BTreeSet<IpAddr> {
    let hosts = config.subscriber_hosts();
    let mut all = hosts.addresses;
    for name in &hosts.names {
        all.extend(resolved.get(name).into_iter().flatten());
    }
    all
}

/// The SIP addresses of `account`'s registrar: its realm URI's address (or
/// the addresses its host name resolved to) at the URI's port, 5060 when
/// it has none (RFC 3263 §4.2 for a URI without port).
pub(super) fn registrar_addrs(
    account: &Account,
    resolved: &BTreeMap<String, BTreeSet<IpAddr>>,
) -> Vec<std::net::SocketAddr> {
    let realm = &account.realm;
    let port = realm.port_or_default();
    let bare = realm
        .host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&realm.host);
    let ips: Vec<IpAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![ip.to_canonical()],
        Err(_) => resolved
            .get(&realm.host)
            .into_iter()
            .flatten()
            .copied()
            .collect(),
    };
    ips.into_iter()
        .map(|ip| std::net::SocketAddr::new(ip, port))
        .collect()
}

impl Agent {
    /// The registrars' host names to resolve (the shell resolves them at
    /// start and after each reload).
    pub fn names_to_resolve(&self) -> BTreeSet<String> {
        self.config.subscriber_hosts().names
    }

    /// Takes in what a resolution found and tells the notifier.
    pub fn handle_resolved(&mut self, found: Resolution) {
        for (name, addrs) in found {
            match addrs {
                Ok(addrs) => {
                    info!(registrar = %name, addresses = ?addrs, "registrar host resolved");
                    self.resolved.insert(name, addrs);
                }
                Err(e) => {
                    let kept = self.resolved.get(&name).map_or(0, BTreeSet::len);
                    warn!(registrar = %name, error = %e, kept, "cannot resolve registrar host, keeping its last addresses");
                }
            }
        }
        let config = notifier_config(&self.config, &self.contact(), &self.resolved);
        self.notifier.set_subscribers(config.subscribers);
        self.notifier.set_registrars(config.registrars);
    }

    /// The agent's `host:port` in Contacts.
    pub(super) fn contact(&self) -> String {
        host_port(self.identity.contact_addr, self.identity.contact_port)
    }
}
