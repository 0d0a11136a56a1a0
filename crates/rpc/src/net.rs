//! Transports. Every server listens on TCP; one whose address is reachable on this
//! host's loopback also listens on an abstract Unix socket named after that address,
//! and a client connecting to a loopback address uses it when it is there. This is
//! Lustre's `lo` LND (`0@lo`): a client on the server's own node skips the TCP stack,
//! which on loopback costs both ends' protocol work on every send (about a third of a
//! metadata RPC's CPU here). Frames, sealing and every limit are the same on both.
//!
//! A reader about to sleep waiting for its peer spins a little first ([`Spin`]).
//!
//! Abstract socket names live in the network namespace, so a client in another
//! namespace never finds a server's local socket and uses TCP. `LODE_LOCAL_TRANSPORT=off`
//! in a server's or a client's environment turns the Unix socket off for that process.

use lode_base::limits;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tracing::debug;

/// Whether this process uses local (Unix socket) transport: on unless
/// `LODE_LOCAL_TRANSPORT` is `off`, `0` or `no`.
pub fn local_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("LODE_LOCAL_TRANSPORT").as_deref(),
            Ok("off" | "0" | "no")
        )
    })
}

/// How long a reader spins before it sleeps: [`limits::SPIN_US`], or `LODE_SPIN_US`.
fn spin_budget() -> Duration {
    static US: OnceLock<u64> = OnceLock::new();
    Duration::from_micros(*US.get_or_init(|| {
        std::env::var("LODE_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(limits::SPIN_US)
    }))
}

/// Whether a reader about to wait for its peer spins first, from how its last spins
/// went: it spins while spinning finds bytes, and after [`limits::SPIN_MISSES`] empty
/// spins in a row sleeps at once for [`limits::SPIN_REST`] waits before it tries
/// again. Between checks the spinner yields the CPU to any thread that wants it, so
/// on a busy machine spinning costs little; on an idle one it saves each wake-up.
#[derive(Default)]
pub struct Spin {
    misses: u32,
    rest: u32,
}

impl Spin {
    /// How long to spin before this wait (zero: sleep at once).
    pub fn budget(&mut self) -> Duration {
        if self.rest > 0 {
            self.rest -= 1;
            return Duration::ZERO;
        }
        spin_budget()
    }

    /// Whether the spin found bytes.
    pub fn record(&mut self, hit: bool) {
        if hit {
            self.misses = 0;
        } else {
            self.misses += 1;
            if self.misses >= limits::SPIN_MISSES {
                self.misses = 0;
                self.rest = limits::SPIN_REST;
            }
        }
    }
}

/// The abstract socket name of a server listening on `addr`, if clients on this host
/// can reach it through loopback: its own address for a loopback one, a wildcard for
/// an unspecified one (it takes loopback connections on every address).
fn listen_name(addr: SocketAddr) -> Option<String> {
    let ip = addr.ip();
    if ip.is_unspecified() {
        Some(format!("lode:*:{}", addr.port()))
    } else if ip.is_loopback() {
        Some(format!("lode:{}", addr))
    } else {
        None
    }
}

/// The names a client connecting to `addr` tries, in order: the exact address, then a
/// server on every address at that port. None for an address off this host.
fn connect_names(addr: SocketAddr) -> Vec<String> {
    if !addr.ip().is_loopback() {
        return Vec::new();
    }
    vec![format!("lode:{}", addr), format!("lode:*:{}", addr.port())]
}

/// The peer address a local connection is logged and squashed as.
pub fn local_peer() -> SocketAddr {
    SocketAddr::new(IpAddr::from([127, 0, 0, 1]), 0)
}

/// A connected stream on either transport, for the runtime's async reads and writes
/// (connection set-up: handshake, CONNECT, replay).
pub enum Stream {
    /// TCP.
    Tcp(tokio::net::TcpStream),
    /// A Unix socket to a server on this host.
    Local(tokio::net::UnixStream),
}

impl Stream {
    /// The plain socket, still non-blocking, for callers that poll it themselves.
    pub fn into_std(self) -> std::io::Result<StdStream> {
        Ok(match self {
            Stream::Tcp(s) => StdStream::Tcp(s.into_std()?),
            Stream::Local(s) => StdStream::Local(s.into_std()?),
        })
    }

    /// True for the local transport.
    pub fn is_local(&self) -> bool {
        matches!(self, Stream::Local(_))
    }
}

/// Connects to a server at `addr` (`host:port`): its local socket when it is on this
/// host and has one, TCP otherwise.
pub async fn connect(addr: &str) -> std::io::Result<Stream> {
    if local_enabled() {
        if let Ok(sa) = addr.parse::<SocketAddr>() {
            for name in connect_names(sa) {
                match connect_abstract(&name) {
                    Ok(s) => return Ok(Stream::Local(s)),
                    // Nobody there (ECONNREFUSED), or its backlog is full (EAGAIN): TCP.
                    Err(e) => debug!(%addr, "no local socket {name}: {e}"),
                }
            }
        }
    }
    let s = tokio::net::TcpStream::connect(addr).await?;
    let _ = s.set_nodelay(true);
    Ok(Stream::Tcp(s))
}

/// A non-blocking connect to an abstract Unix socket: it completes at once or fails,
/// so it never holds the runtime's thread.
fn connect_abstract(name: &str) -> std::io::Result<tokio::net::UnixStream> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let fd: OwnedFd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let ua = UnixAddr::new_abstract(name.as_bytes())?;
    connect(fd.as_raw_fd(), &ua)?;
    tokio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
}

/// Binds the local socket of a server listening on `addr`; `None` when the address is
/// not reachable through loopback, local transport is off, or another server holds
/// the name (logged: that server's clients keep TCP).
pub fn bind_local(addr: SocketAddr) -> Option<tokio::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    if !local_enabled() {
        return None;
    }
    let name = listen_name(addr)?;
    let bound = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
        .and_then(|l| {
            l.set_nonblocking(true)?;
            tokio::net::UnixListener::from_std(l)
        });
    match bound {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(%addr, "no local socket {name}: {e}; clients on this host use TCP");
            None
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Local(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Local(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Local(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Local(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A connected, non-blocking socket on either transport, read and written with plain
/// system calls by whoever holds it (a service thread, a waiting caller).
pub enum StdStream {
    /// TCP.
    Tcp(std::net::TcpStream),
    /// A Unix socket on this host.
    Local(std::os::unix::net::UnixStream),
}

impl StdStream {
    /// True for the local transport.
    pub fn is_local(&self) -> bool {
        matches!(self, StdStream::Local(_))
    }

    /// Reads what is there into `buf`'s spare room (growing it by up to `room`),
    /// without zeroing it first.
    pub fn read_append(&self, buf: &mut Vec<u8>, room: usize) -> std::io::Result<usize> {
        buf.reserve(room);
        let spare = buf.spare_capacity_mut();
        // SAFETY: read(2) writes at most `spare.len()` bytes into the spare capacity,
        // which `reserve` made valid to write; only the `n` bytes it reports written
        // become part of the vector.
        let n = unsafe {
            nix::libc::read(
                self.as_raw_fd(),
                spare.as_mut_ptr().cast::<nix::libc::c_void>(),
                spare.len(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = n as usize;
        // SAFETY: the first `n` bytes of the spare capacity were just written.
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
    }
}

impl Read for &StdStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            StdStream::Tcp(s) => (&*s).read(buf),
            StdStream::Local(s) => (&*s).read(buf),
        }
    }
}

impl Write for &StdStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            StdStream::Tcp(s) => (&*s).write(buf),
            StdStream::Local(s) => (&*s).write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for StdStream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            StdStream::Tcp(s) => s.as_raw_fd(),
            StdStream::Local(s) => s.as_raw_fd(),
        }
    }
}

impl AsFd for StdStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            StdStream::Tcp(s) => s.as_fd(),
            StdStream::Local(s) => s.as_fd(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_rests_after_misses_and_resumes() {
        let mut s = Spin::default();
        for _ in 0..limits::SPIN_MISSES {
            assert_eq!(s.budget(), spin_budget());
            s.record(false);
        }
        for _ in 0..limits::SPIN_REST {
            assert_eq!(s.budget(), Duration::ZERO);
        }
        assert_eq!(s.budget(), spin_budget());
        // A hit forgets the misses before it.
        s.record(false);
        s.record(true);
        for _ in 0..limits::SPIN_MISSES - 1 {
            s.record(false);
        }
        assert_eq!(s.budget(), spin_budget());
    }

    #[test]
    fn local_names_only_for_addresses_loopback_reaches() {
        let a = |s: &str| s.parse::<SocketAddr>().expect("address");
        assert_eq!(
            listen_name(a("127.0.0.1:9880")).as_deref(),
            Some("lode:127.0.0.1:9880")
        );
        assert_eq!(
            listen_name(a("0.0.0.0:9880")).as_deref(),
            Some("lode:*:9880")
        );
        assert_eq!(listen_name(a("10.1.2.3:9880")), None);
        assert_eq!(
            connect_names(a("127.0.0.1:9880")),
            ["lode:127.0.0.1:9880", "lode:*:9880"]
        );
        assert!(connect_names(a("10.1.2.3:9880")).is_empty());
    }

    #[tokio::test]
    async fn a_client_on_this_host_connects_through_the_local_socket() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let local = bind_local(addr).expect("local socket");
        let s = connect(&addr.to_string()).await.expect("connect");
        assert!(s.is_local());
        let (mut peer, _) = local.accept().await.expect("accept");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = s;
        s.write_all(b"ping").await.expect("write");
        let mut b = [0u8; 4];
        peer.read_exact(&mut b).await.expect("read");
        assert_eq!(&b, b"ping");
        drop(local);
        // Gone: the next connection falls back to TCP.
        let s = connect(&addr.to_string()).await.expect("connect");
        assert!(!s.is_local());
    }
}
