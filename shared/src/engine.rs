//! The media engine's addresses, as the agent reports them to the core in
//! each REGISTER (SPEC §3) and the collector answers them in a selection
//! (SPEC §7): where the core sends the INVITE that parks a leg on the MSR,
//! and the engine's media-control channel.
//!
//! Encoding: parameters of the Contact **URI** (RFC 3261 §19.1.1
//! `uri-parameters`), inside the angle brackets, so that any registrar
//! stores them unchanged as part of the contact address (a registrar keeps
//! the URI; header parameters beyond `expires`/`q` it may drop):
//!
//! ```text
//! Contact: <sip:msr_1@192.168.2.21:5041;engine=192.168.2.21:5040;engine-transport=udp+tcp;mcc=192.168.2.21:5700>;iface=bond1.2
//! ```
//!
//! * `engine` — the engine's SIP `host:port` (`<transport bind-addr port>`;
//!   an IPv6 host in brackets);
//! * `engine-transport` — `udp`, `tcp` or `udp+tcp` (`<transport transport>`);
//! * `mcc` — the media-control `host:port` (`<pbyte><mcc>`), absent when the
//!   engine has none.
//!
//! Each value is made of `param-unreserved` and `unreserved` characters
//! (`[`, `]`, `:`, `+`, `.`, digits, hex letters), so nothing is escaped.

use std::fmt;
use std::net::SocketAddr;

/// URI parameter carrying the engine's SIP address.
pub const ENGINE_PARAM: &str = "engine";
/// URI parameter carrying the engine's SIP transports.
pub const ENGINE_TRANSPORT_PARAM: &str = "engine-transport";
/// URI parameter carrying the engine's media-control address.
pub const MCC_PARAM: &str = "mcc";

/// The transports the engine's SIP socket takes (`<transport transport>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineTransport {
    /// `udp`
    Udp,
    /// `tcp`
    Tcp,
    /// `udp+tcp`
    UdpTcp,
}

impl EngineTransport {
    /// The parameter value.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineTransport::Udp => "udp",
            EngineTransport::Tcp => "tcp",
            EngineTransport::UdpTcp => "udp+tcp",
        }
    }

    fn parse(value: &str) -> Option<EngineTransport> {
        match value.to_ascii_lowercase().as_str() {
            "udp" => Some(EngineTransport::Udp),
            "tcp" => Some(EngineTransport::Tcp),
            "udp+tcp" => Some(EngineTransport::UdpTcp),
            _ => None,
        }
    }
}

impl fmt::Display for EngineTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The media engine's addresses (SPEC §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EngineAddresses {
    /// The engine's SIP socket.
    pub sip: SocketAddr,
    /// Its transports.
    pub transport: EngineTransport,
    /// Its media-control channel, if it has one.
    pub mcc: Option<SocketAddr>,
}

/// Why the engine parameters of a Contact URI could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineParamError {
    /// A parameter is not a `host:port` with an IP address host.
    #[error("contact uri parameter {param}={value:?} is not an ip address and port")]
    BadAddress {
        /// The parameter.
        param: &'static str,
        /// Its value as sent.
        value: String,
    },
    /// `engine-transport` is not one of the accepted values.
    #[error("contact uri parameter engine-transport={value:?} is not udp, tcp or udp+tcp")]
    BadTransport {
        /// Its value as sent.
        value: String,
    },
    /// A parameter given twice.
    #[error("contact uri parameter {param} given twice")]
    Duplicate {
        /// The parameter.
        param: &'static str,
    },
    /// `engine-transport` or `mcc` without `engine`.
    #[error("contact uri parameter {param} without engine")]
    MissingEngine {
        /// The parameter present without `engine`.
        param: &'static str,
    },
}

impl EngineAddresses {
    /// The parameters to append to the Contact URI, each with its leading
    /// `;`.
    pub fn uri_params(&self) -> String {
        let mut out = format!(
            ";{ENGINE_PARAM}={};{ENGINE_TRANSPORT_PARAM}={}",
            self.sip, self.transport
        );
        if let Some(mcc) = self.mcc {
            out.push_str(&format!(";{MCC_PARAM}={mcc}"));
        }
        out
    }

    /// Reads the engine parameters of a contact URI (`sip:u@h:p;engine=…`).
    /// `Ok(None)`: the URI carries none (an agent that reports no engine).
    /// `engine-transport` defaults to `udp`.
    ///
    /// # Errors
    /// [`EngineParamError`] for a value that is present but wrong.
    pub fn from_uri(uri: &str) -> Result<Option<EngineAddresses>, EngineParamError> {
        let (mut sip, mut transport, mut mcc) = (None, None, None);
        // URI parameters come after the host part; headers (`?…`) end them.
        let params = uri.split('?').next().unwrap_or(uri);
        for param in params.split(';').skip(1) {
            let (name, value) = param.split_once('=').unwrap_or((param, ""));
            // Each parameter once: another parser could take the first of
            // two where this one took the last.
            let once = |seen: bool, param: &'static str| {
                if seen {
                    Err(EngineParamError::Duplicate { param })
                } else {
                    Ok(())
                }
            };
            if name.eq_ignore_ascii_case(ENGINE_PARAM) {
                once(sip.is_some(), ENGINE_PARAM)?;
                sip = Some(address(ENGINE_PARAM, value)?);
            } else if name.eq_ignore_ascii_case(ENGINE_TRANSPORT_PARAM) {
                once(transport.is_some(), ENGINE_TRANSPORT_PARAM)?;
                transport = Some(EngineTransport::parse(value).ok_or_else(|| {
                    EngineParamError::BadTransport {
                        value: value.to_owned(),
                    }
                })?);
            } else if name.eq_ignore_ascii_case(MCC_PARAM) {
                once(mcc.is_some(), MCC_PARAM)?;
                mcc = Some(address(MCC_PARAM, value)?);
            }
        }
        match sip {
            Some(sip) => Ok(Some(EngineAddresses {
                sip,
                transport: transport.unwrap_or(EngineTransport::Udp),
                mcc,
            })),
            None if transport.is_some() => Err(EngineParamError::MissingEngine {
                param: ENGINE_TRANSPORT_PARAM,
            }),
            None if mcc.is_some() => Err(EngineParamError::MissingEngine { param: MCC_PARAM }),
            None => Ok(None),
        }
    }

    /// The SIP URI a core sends the INVITE to: `sip:host:port`, with
    /// `;transport=tcp` when the engine takes TCP only (UDP is the default
    /// transport of a `sip:` URI, RFC 3261 §19.1.2).
    pub fn sip_uri(&self) -> String {
        match self.transport {
            EngineTransport::Tcp => format!("sip:{};transport=tcp", self.sip),
            EngineTransport::Udp | EngineTransport::UdpTcp => format!("sip:{}", self.sip),
        }
    }
}

/// A unicast `ip:port` a core can send to (no spaces, no port 0, not
/// unspecified, broadcast or multicast).
fn address(param: &'static str, value: &str) -> Result<SocketAddr, EngineParamError> {
    let unicast = |a: &SocketAddr| match a.ip() {
        std::net::IpAddr::V4(v4) => !v4.is_broadcast() && !v4.is_multicast(),
        std::net::IpAddr::V6(v6) => !v6.is_multicast(),
    };
    value
        .parse::<SocketAddr>()
        .ok()
        .filter(|a| a.port() != 0 && !a.ip().is_unspecified() && unicast(a))
        .ok_or_else(|| EngineParamError::BadAddress {
            param,
            value: value.to_owned(),
        })
}

/// The URI without its engine parameters (what the agent listens on, for
/// comparisons and display).
pub fn strip_engine_params(uri: &str) -> String {
    let (head, headers) = match uri.split_once('?') {
        Some((h, rest)) => (h, Some(rest)),
        None => (uri, None),
    };
    let mut parts = head.split(';');
    let mut out = parts.next().unwrap_or(head).to_owned();
    for p in parts {
        let name = p.split('=').next().unwrap_or(p).trim();
        if ![ENGINE_PARAM, ENGINE_TRANSPORT_PARAM, MCC_PARAM]
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
        {
            out.push(';');
            out.push_str(p);
        }
    }
    if let Some(h) = headers {
        out.push('?');
        out.push_str(h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed() -> EngineAddresses {
        EngineAddresses {
            sip: "192.168.2.21:5040".parse().expect("addr"),
            transport: EngineTransport::UdpTcp,
            mcc: Some("192.168.2.21:5700".parse().expect("addr")),
        }
    }

    #[test]
    fn the_seed_engine_round_trips_through_a_contact_uri() {
        let uri = format!("sip:msr_1@192.168.2.21:5041{}", seed().uri_params());
        assert_eq!(
            uri,
            "sip:msr_1@192.168.2.21:5041;engine=192.168.2.21:5040;engine-transport=udp+tcp;mcc=192.168.2.21:5700"
        );
        assert_eq!(EngineAddresses::from_uri(&uri), Ok(Some(seed())));
        assert_eq!(seed().sip_uri(), "sip:192.168.2.21:5040");
        assert_eq!(strip_engine_params(&uri), "sip:msr_1@192.168.2.21:5041");
    }

    #[test]
    fn ipv6_tcp_only_and_no_mcc() {
        let e = EngineAddresses {
            sip: "[2001:db8::5]:5040".parse().expect("addr"),
            transport: EngineTransport::Tcp,
            mcc: None,
        };
        let uri = format!("sip:m@[2001:db8::5]:5041;lr{}", e.uri_params());
        assert_eq!(EngineAddresses::from_uri(&uri), Ok(Some(e)));
        assert_eq!(e.sip_uri(), "sip:[2001:db8::5]:5040;transport=tcp");
        assert_eq!(strip_engine_params(&uri), "sip:m@[2001:db8::5]:5041;lr");
    }

    #[test]
    fn a_contact_without_engine_params_has_none() {
        assert_eq!(EngineAddresses::from_uri("sip:m@127.0.0.1:5070"), Ok(None));
        assert_eq!(
            EngineAddresses::from_uri("sip:m@127.0.0.1:5070;transport=udp"),
            Ok(None)
        );
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            (
                "sip:m@h;engine=localhost:5040",
                "contact uri parameter engine=\"localhost:5040\" is not an ip address and port",
            ),
            (
                "sip:m@h;engine=0.0.0.0:5040",
                "contact uri parameter engine=\"0.0.0.0:5040\" is not an ip address and port",
            ),
            (
                "sip:m@h;engine=1.2.3.4:0",
                "contact uri parameter engine=\"1.2.3.4:0\" is not an ip address and port",
            ),
            (
                "sip:m@h;engine=1.2.3.4:5040;engine-transport=sctp",
                "contact uri parameter engine-transport=\"sctp\" is not udp, tcp or udp+tcp",
            ),
            (
                "sip:m@h;mcc=1.2.3.4:5700",
                "contact uri parameter mcc without engine",
            ),
            (
                "sip:m@h;engine=1.1.1.1:1111;engine=2.2.2.2:2222",
                "contact uri parameter engine given twice",
            ),
            (
                "sip:m@h;engine= 1.2.3.4:5",
                "contact uri parameter engine=\" 1.2.3.4:5\" is not an ip address and port",
            ),
            (
                "sip:m@h;engine=255.255.255.255:5",
                "contact uri parameter engine=\"255.255.255.255:5\" is not an ip address and port",
            ),
            (
                "sip:m@h;engine=1.2.3.4:5;mcc=224.0.0.1:9",
                "contact uri parameter mcc=\"224.0.0.1:9\" is not an ip address and port",
            ),
        ];
        for (uri, text) in cases {
            let err = EngineAddresses::from_uri(uri).expect_err(uri);
            assert_eq!(err.to_string(), text);
        }
    }
}
