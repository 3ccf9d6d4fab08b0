//! A new, valid config applied while the agent runs (SPEC §2 hot reload),
//! the part that does I/O: the TLS files read again, the sampler and the
//! ng link reconfigured. The rest is the agent's
//! ([`Agent::reconfigure`](crate::core::Agent::reconfigure)).

use tokio::time::Instant;
use tracing::{info, warn};

use super::{NgLink, Shell};
use crate::config::AgentConfig;

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
                for warning in tls.warnings(config.tls_msrs(), std::time::SystemTime::now()) {
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

    /// Applies a new, valid config (SPEC §2 hot reload).
    pub(super) fn reload(&mut self, now: Instant, config: AgentConfig) {
        // `--time-scale` is the command line's, not the file's.
        let config = config.with_time_scale(self.agent.config().agent.time_scale);
        if config.agent.tls != self.agent.config().agent.tls {
            self.reload_tls(&config);
        }
        self.agent.reconfigure(now, config);
        let config = self.agent.config();
        if let Some(sampler) = self.sampler.as_mut() {
            sampler.reconfigure(&config.media, &config.general, &config.agent);
        }
        let target = config.ng_address();
        if self.ng.as_ref().map(|l| l.client.target()) != target {
            self.ng = NgLink::for_config(config);
        }
        let config = self.agent.config();
        info!(
            accounts = config.accounts.len(),
            load_delta = config.general.load_delta,
            codecs = %config.codecs_shown(),
            video_enc = %config.media.video_enc_size(),
            "config reloaded"
        );
    }
}
