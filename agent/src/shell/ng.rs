//! The `rtpengine` calls source's I/O: a UDP socket of the agent's own,
//! connected to rtpengine's ng port so that only that address is heard,
//! driven by the sans-IO [`NgClient`] (the shell's tick starts an exchange,
//! its answer or its end gives the engine's sessions to the sample).

use std::net::SocketAddr;

use tokio::time::{sleep_until, Instant};
use tracing::{error, info};

use crate::config::AgentConfig;
use crate::load::rtpengine::{Answer, NgClient};
use crate::load::EngineSessions;

/// The `rtpengine` calls source's I/O: its sans-IO client and the UDP
/// socket, connected to the ng address, it talks through.
pub(super) struct NgLink {
    pub(super) client: NgClient,
    pub(super) socket: tokio::net::UdpSocket,
}

/// The largest ng answer read: rtpengine's `statistics` answer is about
/// 8 KB (it grows by a few hundred bytes per proxy that talks to it).
pub(super) const NG_MAX_DATAGRAM: usize = 65_535;

impl NgLink {
    /// A link to the ng address of `config`'s `rtpengine` source; `None`
    /// for another source, or (logged) when no socket can be had.
    pub(super) fn for_config(config: &AgentConfig) -> Option<NgLink> {
        let target = config.ng_address()?;
        let local: SocketAddr = match target {
            SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let socket = std::net::UdpSocket::bind(local)
            .and_then(|s| s.connect(target).map(|()| s))
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .and_then(tokio::net::UdpSocket::from_std);
        match socket {
            Ok(socket) => {
                info!(ng = %target, "calls from rtpengine's ng port {target}");
                let prefix = format!("msr-agent-{:08x}", rand::random::<u32>());
                Some(NgLink {
                    client: NgClient::new(target, prefix),
                    socket,
                })
            }
            Err(e) => {
                error!(ng = %target, error = %e, "cannot open a socket to rtpengine's ng port: the msr is reported full");
                None
            }
        }
    }

    /// One whole exchange, outside the loop (before the first sample):
    /// at most [`TRIES`](crate::load::rtpengine::TRIES) sends
    /// [`RETRANSMIT_AFTER`](crate::load::rtpengine::RETRANSMIT_AFTER)
    /// apart.
    pub(super) async fn exchange(&mut self) -> EngineSessions {
        let mut buf = vec![0_u8; NG_MAX_DATAGRAM];
        self.client.ask(Instant::now());
        loop {
            let mut answer = None;
            while let Some(datagram) = self.client.poll_transmit() {
                if let Err(e) = self.socket.send(&datagram).await {
                    answer = self
                        .client
                        .handle_send_error(Instant::now(), &e.to_string());
                }
            }
            if answer.is_none() {
                let Some(deadline) = self.client.poll_timeout() else {
                    return EngineSessions::Unavailable;
                };
                answer = tokio::select! {
                    received = self.socket.recv(&mut buf) => match received {
                        Ok(n) => self.client.handle_datagram(Instant::now(), buf.get(..n).unwrap_or_default()),
                        Err(e) => self.client.handle_send_error(Instant::now(), &e.to_string()),
                    },
                    () = sleep_until(deadline) => self.client.handle_timeout(Instant::now()),
                };
            }
            match answer {
                Some(Answer::Sessions(n)) => return EngineSessions::Known(n),
                Some(Answer::Failed(_)) => return EngineSessions::Unavailable,
                None => {}
            }
        }
    }
}
