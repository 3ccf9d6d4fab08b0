//! What `--check-config` says, the same way for both daemons (SPEC §13):
//! the reasons the daemon would not start on this host (exit 1), else that
//! it would (exit 0), and in both cases the warnings that remain.
//!
//! A reason is something only a change of the config or the host fixes (a
//! listen address that is not this host's, a directory that is missing, a
//! file the daemon's user cannot read). A warning is true now but need not
//! stop a start: a port another process holds (a running daemon with this
//! config holds its own; it is free again when that one stops), an
//! example's placeholder password.

use std::fmt::Write as _;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::Path;

/// The findings of one check.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// Why the daemon would not start here; empty when it would.
    pub reasons: Vec<String>,
    /// What remains to look at.
    pub warnings: Vec<String>,
}

impl CheckReport {
    /// A reason the daemon would not start here.
    pub fn reason(&mut self, text: impl Into<String>) {
        self.reasons.push(text.into());
    }

    /// A warning.
    pub fn warning(&mut self, text: impl Into<String>) {
        self.warnings.push(text.into());
    }

    /// Whether the daemon would start.
    pub fn starts(&self) -> bool {
        self.reasons.is_empty()
    }

    /// The report for a person: `path`: the verdict for `daemon`, each
    /// reason, each warning (or that none remains), and `summary` when it
    /// would start.
    pub fn render(&self, path: &Path, daemon: &str, summary: &str) -> String {
        let mut out = String::new();
        if self.starts() {
            let _ = writeln!(
                out,
                "{}: ok, {daemon} would start on this host",
                path.display()
            );
            if !summary.is_empty() {
                let _ = writeln!(out, "{summary}");
            }
        } else {
            let n = self.reasons.len();
            let _ = writeln!(
                out,
                "{}: {daemon} would not start on this host ({n} reason{}):",
                path.display(),
                if n == 1 { "" } else { "s" }
            );
            for reason in &self.reasons {
                let _ = writeln!(out, "  error: {reason}");
            }
        }
        if self.warnings.is_empty() {
            let _ = writeln!(out, "warnings: none");
        } else {
            let _ = writeln!(out, "warnings: {}", self.warnings.len());
            for warning in &self.warnings {
                let _ = writeln!(out, "  warning: {warning}");
            }
        }
        out
    }

    /// Prints [`CheckReport::render`]: to stdout when the daemon would
    /// start, else to stderr (SPEC §8: errors go to stderr); the warnings
    /// go to stderr either way, so a script that keeps stdout still sees
    /// them. Returns the exit code: [`CheckReport::exit_code`], or 1 when
    /// the verdict could not be written (a closed pipe, a full disk): a
    /// script must not read a success it never saw.
    pub fn print(&self, path: &Path, daemon: &str, summary: &str) -> u8 {
        use std::io::Write as _;
        let text = self.render(path, daemon, summary);
        let (verdict, warnings) = match text.find("warnings: ") {
            Some(at) => text.split_at(at),
            None => (text.as_str(), ""),
        };
        let written = if self.starts() {
            let mut out = std::io::stdout().lock();
            out.write_all(verdict.as_bytes()).and_then(|()| out.flush())
        } else {
            std::io::stderr().lock().write_all(verdict.as_bytes())
        };
        let _ = std::io::stderr().lock().write_all(warnings.as_bytes());
        match written {
            Ok(()) => self.exit_code(),
            Err(_) => 1,
        }
    }

    /// The exit code: 0 when the daemon would start, 1 when not.
    pub fn exit_code(&self) -> u8 {
        u8::from(!self.starts())
    }
}

/// Whether `ip` is an address of this host: the unspecified address (all
/// of them), or one a socket can be bound to (the kernel refuses any other
/// with `EADDRNOTAVAIL`).
pub fn is_local_address(ip: IpAddr) -> Result<(), String> {
    if ip.is_unspecified() {
        return Ok(());
    }
    match UdpSocket::bind(SocketAddr::new(ip, 0)) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AddrNotAvailable => {
            Err(format!("{ip} is not an address of this host"))
        }
        // Another error (e.g. no IPv6 on this host) says the same to a person.
        Err(e) => Err(format!("{ip} cannot be used on this host ({e})")),
    }
}

/// The checks of one listen address: `what` (e.g. `[sip] listen`) at
/// `addr`. Not this host's: a reason. Its port held now (`udp` or `tcp`):
/// a warning.
pub fn listen_address(report: &mut CheckReport, what: &str, addr: SocketAddr, proto: Proto) {
    if let Err(e) = is_local_address(addr.ip()) {
        report.reason(format!("{what} = \"{addr}\": {e}"));
        return;
    }
    if addr.port() == 0 {
        return;
    }
    let held = match proto {
        Proto::Udp => UdpSocket::bind(addr).err(),
        Proto::Tcp => std::net::TcpListener::bind(addr).err(),
    };
    if let Some(e) = held {
        report.warning(format!(
            "{what} = \"{addr}\": {proto} port {} cannot be bound now ({e}); another process holds it \
             (a running daemon with this config holds its own, and frees it when it stops)",
            addr.port()
        ));
    }
}

/// A transport for [`listen_address`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// UDP.
    Udp,
    /// TCP.
    Tcp,
}

impl std::fmt::Display for Proto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Proto::Udp => "udp",
            Proto::Tcp => "tcp",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_unspecified_are_this_hosts_a_documentation_address_is_not() {
        assert!(
            is_local_address("127.0.0.1".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))).is_ok()
        );
        assert!(is_local_address(IpAddr::from([0, 0, 0, 0])).is_ok());
        // RFC 5737 TEST-NET-1: never assigned to a host.
        let err = is_local_address(IpAddr::from([192, 0, 2, 10])).err();
        assert_eq!(
            err.as_deref(),
            Some("192.0.2.10 is not an address of this host")
        );
    }

    #[test]
    fn a_held_port_is_a_warning_a_foreign_address_a_reason() {
        let holder = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let addr = holder.local_addr().expect("addr");
        let mut report = CheckReport::default();
        listen_address(&mut report, "[sip] listen", addr, Proto::Udp);
        assert!(report.starts(), "{report:?}");
        assert_eq!(report.warnings.len(), 1, "{report:?}");
        listen_address(
            &mut report,
            "[http] listen",
            SocketAddr::from(([192, 0, 2, 10], 8080)),
            Proto::Tcp,
        );
        assert_eq!(
            report.reasons,
            ["[http] listen = \"192.0.2.10:8080\": 192.0.2.10 is not an address of this host"]
        );
        assert_eq!(report.exit_code(), 1);
        let text = report.render(Path::new("c.toml"), "msr-collector", "");
        assert!(
            text.starts_with(
                "c.toml: msr-collector would not start on this host (1 reason):\n  error: "
            ),
            "{text}"
        );
        assert!(
            text.contains("warnings: 1\n  warning: [sip] listen"),
            "{text}"
        );
    }

    #[test]
    fn a_clean_report_says_it_would_start_and_that_no_warning_remains() {
        let report = CheckReport::default();
        assert_eq!(report.exit_code(), 0);
        assert_eq!(
            report.render(Path::new("a.xml"), "msr-agent", "summary line"),
            "a.xml: ok, msr-agent would start on this host\nsummary line\nwarnings: none\n"
        );
    }
}
