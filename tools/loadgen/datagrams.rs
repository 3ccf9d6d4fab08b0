//! Many UDP datagrams per system call: `recvmmsg(2)` and `sendmmsg(2)`
//! through nix's safe wrappers, for `notify --batched`: the generator
//! must cost the host little so that the collector beside it can be
//! offered its ceiling. (The collector reads and answers one datagram per
//! call: batching its sockets measured no gain, BENCHMARKS.md.)
//!
//! Both are non-blocking and work on any UDP socket's descriptor.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd};

use nix::sys::socket::{
    recvmmsg, sendmmsg, ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage,
};

/// The most datagrams one call moves. Past it a call saves little (the
/// entry and exit are spread over 64 datagrams already) and a reader
/// would hold its other inputs waiting longer.
pub const BATCH_MAX: usize = 64;

/// Buffers for up to `batch` datagrams of up to `max_payload` bytes each,
/// read with one `recvmmsg(2)` ([`RecvBatch::recv`]).
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    /// Each datagram read by the last call: its length and its source
    /// (`None`: not IPv4 or IPv6, skipped).
    got: Vec<(usize, Option<SocketAddr>)>,
}

impl RecvBatch {
    /// Room for `batch` (1..=[`BATCH_MAX`]) datagrams of `max_payload`
    /// bytes. The buffers are zeroed lazily by the allocator, so memory is
    /// touched only as far as datagrams fill it.
    pub fn new(batch: usize, max_payload: usize) -> Self {
        let batch = batch.clamp(1, BATCH_MAX);
        Self {
            bufs: (0..batch).map(|_| vec![0u8; max_payload]).collect(),
            got: Vec::with_capacity(batch),
        }
    }

    /// Reads the datagrams queued on `socket`, up to the batch, without
    /// blocking; how many. `WouldBlock` when none is queued, as
    /// `recv_from` on a non-blocking socket. A datagram without a usable
    /// source address (not IPv4 or IPv6) is skipped.
    ///
    /// # Errors
    /// The system call's; an error after some datagrams were read is
    /// reported by the next call instead (recvmmsg(2)).
    pub fn recv(&mut self, socket: &impl AsFd) -> io::Result<usize> {
        self.got.clear();
        let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(self.bufs.len(), None);
        let mut slices: Vec<[IoSliceMut<'_>; 1]> =
            self.bufs.iter_mut().map(|b| [IoSliceMut::new(b)]).collect();
        let results = recvmmsg(
            socket.as_fd().as_raw_fd(),
            &mut headers,
            slices.iter_mut(),
            MsgFlags::MSG_DONTWAIT,
            None,
        )
        .map_err(io::Error::from)?;
        self.got
            .extend(results.map(|msg| (msg.bytes, msg.address.as_ref().and_then(to_socket_addr))));
        Ok(self.got.len())
    }

    /// The datagrams the last [`RecvBatch::recv`] read, in order, each
    /// with its source.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], SocketAddr)> + '_ {
        self.got
            .iter()
            .zip(&self.bufs)
            .filter_map(|((len, from), buf)| Some((buf.get(..*len).unwrap_or(buf), (*from)?)))
    }
}

fn to_socket_addr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddrV4::from(*v4).into());
    }
    addr.as_sockaddr_in6()
        .map(|v6| SocketAddrV6::from(*v6).into())
}

/// Sends `datagrams` (destination, bytes) on `socket` in order, up to
/// [`BATCH_MAX`] per `sendmmsg(2)`, without blocking. Returns how many
/// were handed to the kernel (`Ok` with fewer than all when the socket's
/// buffer filled; `WouldBlock` when it was full before the first).
///
/// A datagram the kernel refuses for itself (an unreachable destination,
/// say) is skipped and counted in `refused`, so one bad destination does
/// not hold up the rest.
///
/// # Errors
/// `WouldBlock` when nothing could be sent; another error only if the
/// first datagram of the call failed for a reason other than its
/// destination (`refused` is then not advanced for it).
pub fn send_batch(
    socket: &impl AsFd,
    datagrams: &[(SocketAddr, &[u8])],
    refused: &mut u64,
) -> io::Result<usize> {
    let fd = socket.as_fd().as_raw_fd();
    let mut done = 0;
    let mut headers: Option<MultiHeaders<SockaddrStorage>> = None;
    while done < datagrams.len() {
        let chunk = datagrams
            .get(done..datagrams.len().min(done + BATCH_MAX))
            .unwrap_or_default();
        let headers =
            headers.get_or_insert_with(|| MultiHeaders::preallocate(chunk.len().max(1), None));
        let slices: Vec<[IoSlice<'_>; 1]> = chunk.iter().map(|(_, b)| [IoSlice::new(b)]).collect();
        let addrs: Vec<Option<SockaddrStorage>> = chunk
            .iter()
            .map(|(to, _)| Some(SockaddrStorage::from(*to)))
            .collect();
        let no_cmsgs: [ControlMessage<'_>; 0] = [];
        match sendmmsg(
            fd,
            headers,
            slices.iter(),
            &addrs,
            no_cmsgs,
            MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(results) => {
                let sent = results.count();
                done += sent;
                if sent == 0 {
                    break;
                }
            }
            Err(nix::errno::Errno::EAGAIN) if done > 0 => break,
            Err(e @ nix::errno::Errno::EAGAIN) => return Err(e.into()),
            // The first datagram of this call failed: if it is this one's
            // own fault (its destination), skip it and go on.
            Err(e) if refused_for_itself(e) => {
                *refused += 1;
                done += 1;
            }
            Err(_) if done > 0 => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// Errors `sendmsg(2)` gives for one datagram's destination, not for the
/// socket: the next datagram may well go.
fn refused_for_itself(e: nix::errno::Errno) -> bool {
    use nix::errno::Errno;
    matches!(
        e,
        Errno::ECONNREFUSED
            | Errno::EHOSTUNREACH
            | Errno::ENETUNREACH
            | Errno::EINVAL
            | Errno::EPERM
            | Errno::EACCES
            | Errno::EAFNOSUPPORT
            | Errno::EMSGSIZE
            | Errno::EADDRNOTAVAIL
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let b = UdpSocket::bind("127.0.0.1:0").expect("bind");
        a.set_nonblocking(true).expect("nonblocking");
        b.set_nonblocking(true).expect("nonblocking");
        (a, b)
    }

    #[test]
    fn a_batch_goes_out_in_order_and_comes_in_with_its_sources() {
        let (a, b) = pair();
        let to = b.local_addr().expect("addr");
        let texts: Vec<String> = (0..100).map(|i| format!("datagram {i}")).collect();
        let out: Vec<(SocketAddr, &[u8])> = texts.iter().map(|t| (to, t.as_bytes())).collect();
        let mut refused = 0;
        assert_eq!(send_batch(&a, &out, &mut refused).expect("send"), 100);
        assert_eq!(refused, 0);
        let mut batch = RecvBatch::new(64, 2048);
        let mut got = Vec::new();
        loop {
            match batch.recv(&b) {
                Ok(_) => got.extend(batch.iter().map(|(d, from)| {
                    assert_eq!(from, a.local_addr().expect("addr"));
                    String::from_utf8_lossy(d).into_owned()
                })),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("recv: {e}"),
            }
        }
        assert_eq!(got, texts);
    }

    #[test]
    fn an_empty_socket_would_block() {
        let (_, b) = pair();
        let err = RecvBatch::new(8, 64).recv(&b).expect_err("nothing queued");
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn a_datagram_longer_than_its_buffer_is_cut_not_merged() {
        let (a, b) = pair();
        let to = b.local_addr().expect("addr");
        let out: Vec<(SocketAddr, &[u8])> = vec![(to, b"0123456789"), (to, b"ab")];
        assert_eq!(send_batch(&a, &out, &mut 0).expect("send"), 2);
        let mut batch = RecvBatch::new(4, 4);
        assert_eq!(batch.recv(&b).expect("recv"), 2);
        let got: Vec<&[u8]> = batch.iter().map(|(d, _)| d).collect();
        assert_eq!(got, vec![&b"0123"[..], &b"ab"[..]]);
    }

    #[test]
    fn an_unsendable_destination_is_skipped_and_the_rest_go() {
        let (a, b) = pair();
        let to = b.local_addr().expect("addr");
        // Port 0 is refused by the kernel for that datagram alone.
        let bad = SocketAddr::from(([127, 0, 0, 1], 0));
        let out: Vec<(SocketAddr, &[u8])> = vec![(bad, b"x"), (to, b"y"), (bad, b"z"), (to, b"w")];
        let mut refused = 0;
        assert_eq!(send_batch(&a, &out, &mut refused).expect("send"), 4);
        assert_eq!(refused, 2);
        let mut batch = RecvBatch::new(4, 16);
        assert_eq!(batch.recv(&b).expect("recv"), 2);
    }
}
