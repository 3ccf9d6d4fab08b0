//! Connection reuse: an MSR that registered over a stream connection (TCP
//! or TLS) is sent the collector's own requests — SUBSCRIBE, OPTIONS —
//! over that same connection (RFC 5923 §5; RFC 5626 §5.3 for the
//! registrar's side), and its NOTIFYs come back over it.
//!
//! Why: an agent behind a firewall or NAT can open a connection but not
//! accept one, and with TLS (SPEC §4) the agent needs no certificate of
//! its own for the collector to reach it — the connection it opened is
//! already authenticated both ways when mutual TLS is on.
//!
//! A flow is learnt from a REGISTER answered `200` over a connection and
//! is keyed by the address of the Contact URI it registered: requests to
//! that contact take the newest such connection. A request to a `sips:`
//! contact, or one with `transport=tls`, never falls back to UDP: with no
//! connection to send it on, it fails at once (the MSR's next REGISTER
//! brings a new one).
//!
//! Architecture invariant: no I/O; the shell tells which connection a
//! message came on ([`Route::Stream`]).

use std::collections::HashMap;
use std::net::SocketAddr;

use msr_shared::sip::transaction::{Link, StreamTransport};
use msr_shared::sip::{self, Request};

use super::{Route, StreamId};
use crate::sip::not_sent::NotSent;

/// At most this many flows are remembered; past it the oldest learnt is
/// forgotten (authenticated registrations only create them).
const MAX_FLOWS: usize = 65_536;

/// The stream connections the collector's requests can go over.
#[derive(Debug, Default)]
pub(super) struct Flows {
    by_contact: HashMap<SocketAddr, (StreamId, StreamTransport)>,
    /// The contact address each connection last registered.
    by_stream: HashMap<StreamId, SocketAddr>,
    /// The bound TCP listener, the `Via` sent-by of requests over TCP.
    tcp: Option<SocketAddr>,
    /// The bound TLS listener: the `sips:` Contact and `Via` of requests
    /// over TLS.
    tls: Option<SocketAddr>,
}

impl Flows {
    /// Records the listeners the shell bound.
    pub(super) fn set_listeners(&mut self, tcp: Option<SocketAddr>, tls: Option<SocketAddr>) {
        self.tcp = tcp;
        self.tls = tls;
    }

    /// A REGISTER that came on `route` was answered `200`: its contacts
    /// are reached over that connection from now on.
    pub(super) fn registered(&mut self, route: Route, request: &Request) {
        let Route::Stream(id, transport) = route else {
            return;
        };
        for value in request
            .headers
            .iter()
            .filter(|h| h.name().eq_ignore_ascii_case("Contact"))
            .map(|h| h.value().to_owned())
        {
            for contact in sip::split_outside_quotes(&value, ',') {
                let Some(addr) = sip::uri_socket_addr(sip::addr_uri(contact)) else {
                    continue;
                };
                if self.by_contact.len() >= MAX_FLOWS && !self.by_contact.contains_key(&addr) {
                    // Keep the table bounded: drop any one (the newest
                    // registrations refresh theirs within their expiry).
                    if let Some(old) = self.by_contact.keys().next().copied() {
                        if let Some((stream, _)) = self.by_contact.remove(&old) {
                            self.by_stream.remove(&stream);
                        }
                    }
                }
                if let Some((previous, _)) = self.by_contact.insert(addr, (id, transport)) {
                    if previous != id {
                        self.by_stream.remove(&previous);
                    }
                }
                self.by_stream.insert(id, addr);
            }
        }
    }

    /// The connection `id` is gone.
    pub(super) fn closed(&mut self, id: StreamId) {
        if let Some(addr) = self.by_stream.remove(&id) {
            if self
                .by_contact
                .get(&addr)
                .is_some_and(|(flow, _)| *flow == id)
            {
                self.by_contact.remove(&addr);
            }
        }
    }

    /// Who a request that came on `route` from `source` is from, as the
    /// subscriber checks a NOTIFY's sender (SPEC §4): over a connection
    /// that registered a contact, that contact's address — the agent's
    /// requests leave from an ephemeral port of the connection, not from
    /// its Contact — else the source.
    pub(super) fn sender(&self, route: Route, source: SocketAddr) -> SocketAddr {
        match route {
            Route::Stream(id, _) => self.by_stream.get(&id).copied().unwrap_or(source),
            Route::Udp(_) => source,
        }
    }

    /// How a request to `target` (its URI) at `to` travels, and the
    /// Contact it carries on that link.
    ///
    /// # Errors
    /// [`NotSent::NoTlsConnection`], [`NotSent::NoTcpConnection`]: it must
    /// go over a connection and there is none.
    pub(super) fn link(&self, target: &str, to: SocketAddr) -> Result<(Link, String), NotSent> {
        // A `sips:` target goes over TLS or not at all (RFC 3261 §26.2.2):
        // a TCP connection from its address is no way to it; a
        // `transport=tcp` one over TCP (§19.1.1), not over UDP.
        let only = sip::stream_transport(target).map(|t| match t {
            rsipstack::sip::Transport::Tcp => StreamTransport::Tcp,
            _ => StreamTransport::Tls,
        });
        let flow = self
            .by_contact
            .get(&to)
            .filter(|(_, transport)| only.is_none_or(|only| *transport == only));
        if let Some(&(_, transport)) = flow {
            let sent_by = match transport {
                StreamTransport::Tcp => self.tcp,
                StreamTransport::Tls => self.tls,
            };
            if let Some(sent_by) = sent_by {
                let contact = match transport {
                    StreamTransport::Tcp => format!("sip:collector@{sent_by};transport=tcp"),
                    StreamTransport::Tls => format!("sips:collector@{sent_by}"),
                };
                return Ok((Link::Stream { transport, sent_by }, contact));
            }
        }
        match only {
            Some(StreamTransport::Tls) => Err(NotSent::NoTlsConnection { to }),
            Some(StreamTransport::Tcp) => Err(NotSent::NoTcpConnection { to }),
            None => Ok((Link::Udp, String::new())),
        }
    }

    /// The connection a message for `to` over a stream goes on.
    pub(super) fn route(&self, to: SocketAddr) -> Option<Route> {
        self.by_contact
            .get(&to)
            .map(|&(id, transport)| Route::Stream(id, transport))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msr_shared::sip::Method;

    fn register(contact: &str) -> Request {
        sip::request(
            Method::Register,
            "sips:127.0.0.1:5061",
            vec![
                ("Contact", format!("<{contact}>;expires=60")),
                ("CSeq", "1 REGISTER".to_owned()),
            ],
            Vec::new(),
        )
        .expect("request")
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    #[test]
    fn a_contact_registered_over_tls_is_reached_over_that_connection_and_never_over_udp() {
        let mut flows = Flows::default();
        flows.set_listeners(None, Some(addr("127.0.0.1:5061")));
        let target = "sips:msr_1@127.0.0.2:5071";
        let to = addr("127.0.0.2:5071");
        // Before any registration over TLS: refused, not sent in clear.
        assert_eq!(flows.link(target, to), Err(NotSent::NoTlsConnection { to }));
        // Over UDP, a plain contact stays on UDP.
        assert_eq!(
            flows
                .link("sip:msr_2@127.0.0.2:5072", addr("127.0.0.2:5072"))
                .map(|(l, _)| l),
            Ok(Link::Udp)
        );
        let route = Route::Stream(StreamId(7), StreamTransport::Tls);
        flows.registered(route, &register(target));
        let (link, contact) = flows.link(target, to).expect("a flow");
        assert_eq!(
            link,
            Link::Stream {
                transport: StreamTransport::Tls,
                sent_by: addr("127.0.0.1:5061")
            }
        );
        assert_eq!(contact, "sips:collector@127.0.0.1:5061");
        assert_eq!(flows.route(to), Some(route));
        // Its NOTIFYs, from an ephemeral port, are from the contact.
        assert_eq!(flows.sender(route, addr("127.0.0.2:40000")), to);
        let other = Route::Stream(StreamId(8), StreamTransport::Tls);
        let stranger = addr("127.0.0.3:40000");
        assert_eq!(flows.sender(other, stranger), stranger);
        // The connection closes: back to refusing.
        flows.closed(StreamId(7));
        assert!(flows.link(target, to).is_err());
        assert_eq!(flows.route(to), None);
        // A sips: contact registered over plain TCP is no TLS flow.
        flows.set_listeners(Some(addr("127.0.0.1:5060")), Some(addr("127.0.0.1:5061")));
        flows.registered(
            Route::Stream(StreamId(9), StreamTransport::Tcp),
            &register(target),
        );
        assert!(
            flows.link(target, to).is_err(),
            "never a sips: target over tcp"
        );
    }

    #[test]
    fn a_transport_tcp_contact_is_reached_over_its_tcp_connection_only() {
        let mut flows = Flows::default();
        flows.set_listeners(Some(addr("127.0.0.1:5060")), Some(addr("127.0.0.1:5061")));
        let target = "sip:msr_1@127.0.0.2:5071;transport=tcp;engine=127.0.0.2:5070";
        let to = addr("127.0.0.2:5071");
        assert_eq!(
            flows.link(target, to),
            Err(NotSent::NoTcpConnection { to }),
            "not over udp"
        );
        flows.registered(
            Route::Stream(StreamId(3), StreamTransport::Tls),
            &register(target),
        );
        assert!(flows.link(target, to).is_err(), "not over tls either");
        flows.registered(
            Route::Stream(StreamId(4), StreamTransport::Tcp),
            &register(target),
        );
        let (link, contact) = flows.link(target, to).expect("a flow");
        assert_eq!(
            link,
            Link::Stream {
                transport: StreamTransport::Tcp,
                sent_by: addr("127.0.0.1:5060")
            }
        );
        assert_eq!(contact, "sip:collector@127.0.0.1:5060;transport=tcp");
        flows.closed(StreamId(4));
        assert!(flows.link(target, to).is_err());
    }

    #[test]
    fn a_registration_over_udp_learns_no_flow() {
        let mut flows = Flows::default();
        flows.set_listeners(Some(addr("127.0.0.1:5060")), None);
        let contact = "sip:msr_1@127.0.0.2:5071";
        flows.registered(Route::Udp(addr("127.0.0.2:5071")), &register(contact));
        assert_eq!(flows.route(addr("127.0.0.2:5071")), None);
        flows.registered(
            Route::Stream(StreamId(1), StreamTransport::Tcp),
            &register(contact),
        );
        let (link, contact) = flows.link(contact, addr("127.0.0.2:5071")).expect("a flow");
        assert!(matches!(
            link,
            Link::Stream {
                transport: StreamTransport::Tcp,
                ..
            }
        ));
        assert_eq!(contact, "sip:collector@127.0.0.1:5060;transport=tcp");
    }
}
