//! Media-session counting (SPEC §2): by default the number of UDP sockets
//! bound on even ports inside `[port-start, port-start + port-range)`, read
//! from Linux `/proc/net/udp` and `/proc/net/udp6`. Even ports only, because
//! each session has an RTP socket on an even port and its RTCP socket on the
//! next odd one.
//!
//! The parsers are pure (`&str` in, number out) so they can be tested with
//! literal `/proc` text; the readers are thin wrappers.

use std::io;
use std::path::Path;

/// `/proc/net/udp` (IPv4 sockets).
pub const PROC_NET_UDP: &str = "/proc/net/udp";
/// `/proc/net/udp6` (IPv6 sockets, absent when IPv6 is disabled).
pub const PROC_NET_UDP6: &str = "/proc/net/udp6";

/// Counts the sockets in `proc_net_udp` (the text of `/proc/net/udp` or
/// `/proc/net/udp6`) whose local port is even and inside
/// `[port_start, port_start + port_range)`.
///
/// The `local_address` column is `HEXADDR:HEXPORT` (8 hex digits of address
/// for IPv4, 32 for IPv6). The header line and malformed lines are ignored.
pub fn count_rtp_sockets(proc_net_udp: &str, port_start: u16, port_range: u16) -> u32 {
    let start = u32::from(port_start);
    let end = start + u32::from(port_range);
    let mut count: u32 = 0;
    for line in proc_net_udp.lines() {
        let Some(port) = local_port(line) else {
            continue;
        };
        let port = u32::from(port);
        if port % 2 == 0 && port >= start && port < end {
            count = count.saturating_add(1);
        }
    }
    count
}

/// The local port of one socket line, `None` for the header and malformed
/// lines.
fn local_port(line: &str) -> Option<u16> {
    let mut cols = line.split_whitespace();
    let slot = cols.next()?;
    // "sl" column: a decimal slot number followed by ':'.
    let slot = slot.strip_suffix(':')?;
    if slot.is_empty() || !slot.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let local = cols.next()?;
    let (addr, port) = local.split_once(':')?;
    if !(addr.len() == 8 || addr.len() == 32) || !addr.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if port.len() != 4 {
        return None;
    }
    u16::from_str_radix(port, 16).ok()
}

/// Parses a calls file (`<agent calls-source="file:…">`): one non-negative
/// integer, surrounding whitespace allowed. `None` if it holds anything else.
pub fn parse_calls_file(text: &str) -> Option<u32> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// Reads `/proc/net/udp` and `/proc/net/udp6` and counts RTP sockets in both.
/// A missing `udp6` (IPv6 disabled) counts as none; a missing `udp` is an
/// error.
pub fn read_proc_calls(port_start: u16, port_range: u16) -> io::Result<u32> {
    read_proc_calls_from(
        Path::new(PROC_NET_UDP),
        Path::new(PROC_NET_UDP6),
        port_start,
        port_range,
    )
}

/// [`read_proc_calls`] with the file locations given (tests).
pub fn read_proc_calls_from(
    udp: &Path,
    udp6: &Path,
    port_start: u16,
    port_range: u16,
) -> io::Result<u32> {
    let v4 = std::fs::read_to_string(udp)?;
    let mut n = count_rtp_sockets(&v4, port_start, port_range);
    match std::fs::read_to_string(udp6) {
        Ok(v6) => n = n.saturating_add(count_rtp_sockets(&v6, port_start, port_range)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(n)
}

/// Reads a calls file (see [`parse_calls_file`]).
pub fn read_calls_file(path: &Path) -> io::Result<u32> {
    let text = std::fs::read_to_string(path)?;
    parse_calls_file(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "calls file does not hold one non-negative integer",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UDP: &str = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  123: 0100007F:4E20 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 31337 2 0000000000000000 0
  124: 0100007F:4E21 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 31338 2 0000000000000000 0
  125: 00000000:4E22 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 31339 2 0000000000000000 0
  126: 00000000:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 11111 2 0000000000000000 0
  127: 0100007F:5208 0100007F:13C4 01 00000000:00000000 00:00000000 00000000  1000        0 31340 2 0000000000000000 0
  128: 0100007F:5206 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 31341 2 0000000000000000 0
";

    const UDP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  300: 00000000000000000000000001000000:4E24 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 41000 2 0000000000000000 0
  301: 00000000000000000000000000000000:4E25 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 41001 2 0000000000000000 0
  302: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 41002 2 0000000000000000 0
";

    #[test]
    fn counts_even_ports_in_range_ipv4() {
        // 0x4E20 = 20000, 0x4E22 = 20002 in; 0x4E21 odd; 0x0035 = 53 out;
        // 0x5208 = 21000 = end (exclusive); 0x5206 = 20998 in.
        assert_eq!(count_rtp_sockets(UDP, 20000, 1000), 3);
    }

    #[test]
    fn counts_even_ports_in_range_ipv6() {
        // 0x4E24 = 20004 in; 0x4E25 odd; 0x1F90 = 8080 out.
        assert_eq!(count_rtp_sockets(UDP6, 20000, 1000), 1);
    }

    #[test]
    fn range_bounds() {
        assert_eq!(count_rtp_sockets(UDP, 20002, 1), 1);
        assert_eq!(count_rtp_sockets(UDP, 20001, 1), 0);
        assert_eq!(count_rtp_sockets(UDP, 0, 0), 0);
        // The whole port space: 53 is odd, so 20000, 20002, 21000, 20998.
        assert_eq!(count_rtp_sockets(UDP, 0, u16::MAX), 4);
        let top = "  1: 00000000:FFFE 00000000:0000 07 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(count_rtp_sockets(top, 65534, 2), 1);
    }

    #[test]
    fn ignores_malformed_lines() {
        let text = "garbage\n\n  1: zz:4E20 x\n  2: 0100007F:4E2 x\n  x: 0100007F:4E20 x\n  3: 0100007F x\n  4:\n  5: 0100007F:4E20 00000000:0000 07\n";
        assert_eq!(count_rtp_sockets(text, 20000, 1000), 1);
        assert_eq!(count_rtp_sockets("", 20000, 1000), 0);
    }

    #[test]
    fn calls_file() {
        assert_eq!(parse_calls_file("303\n"), Some(303));
        assert_eq!(parse_calls_file("  7 "), Some(7));
        assert_eq!(parse_calls_file(""), None);
        assert_eq!(parse_calls_file("-1"), None);
        assert_eq!(parse_calls_file("1 2"), None);
        assert_eq!(parse_calls_file("99999999999"), None);
    }

    #[test]
    fn reads_files_and_tolerates_missing_udp6() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let udp = dir.path().join("udp");
        let udp6 = dir.path().join("udp6");
        std::fs::write(&udp, UDP)?;
        assert_eq!(read_proc_calls_from(&udp, &udp6, 20000, 1000)?, 3);
        std::fs::write(&udp6, UDP6)?;
        assert_eq!(read_proc_calls_from(&udp, &udp6, 20000, 1000)?, 4);
        assert!(read_proc_calls_from(&dir.path().join("none"), &udp6, 20000, 1000).is_err());
        Ok(())
    }

    #[test]
    fn real_proc_sees_a_bound_socket() -> Result<(), Box<dyn std::error::Error>> {
        if !Path::new(PROC_NET_UDP).exists() {
            return Ok(());
        }
        // Bind an even ephemeral-range port and find it.
        let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
        let port = sock.local_addr()?.port();
        let before = read_proc_calls(port, 1)?;
        assert_eq!(before, u32::from(port % 2 == 0));
        Ok(())
    }
}
