//! Reading and writing frames on async streams.

use lode_proto::frame::check_len;
use lode_proto::{Frame, FrameError};
use std::future::Future;
use std::io::Write;
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

/// The write side of a socket as [`FrameSink`] uses it: a write that never blocks, and
/// one that waits for room.
pub trait SinkWriter: Send + Sync + 'static {
    /// Writes what fits now; `WouldBlock` when nothing does.
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize>;
    /// Waits until the socket takes some bytes, then writes them.
    fn write_ready<'a>(
        &'a self,
        buf: &'a [u8],
    ) -> impl Future<Output = std::io::Result<usize>> + Send + 'a;
}

impl SinkWriter for tokio::net::tcp::OwnedWriteHalf {
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
        tokio::net::tcp::OwnedWriteHalf::try_write(self, buf)
    }

    async fn write_ready(&self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            self.writable().await?;
            match tokio::net::tcp::OwnedWriteHalf::try_write(self, buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    }
}

/// A socket registered with the runtime for writability only, so that arriving bytes
/// never wake the runtime: whoever reads it (a waiting caller) polls it itself.
impl SinkWriter for AsyncFd<std::net::TcpStream> {
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
        self.get_ref().write(buf)
    }

    async fn write_ready(&self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            let mut ready = self.writable().await?;
            if let Ok(r) = ready.try_io(|s| s.get_ref().write(buf)) {
                return r;
            }
        }
    }
}

/// Why a connection's reader stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed or the socket failed.
    #[error("connection lost: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent a malformed frame; the connection must be closed.
    #[error("malformed frame: {0}")]
    Frame(#[from] FrameError),
}

/// Reads one frame; the length is checked against `rpc_size_max` before allocating.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Frame, ReadError> {
    read_sealed(r, None).await
}

/// Reads one frame as it was sent after the length field (CRC, header, body and any
/// tag), unchecked.
pub async fn read_raw<R: AsyncRead + Unpin>(r: &mut R) -> Result<Vec<u8>, ReadError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = check_len(u32::from_le_bytes(len))?;
    let mut rest = vec![0u8; len];
    r.read_exact(&mut rest).await?;
    Ok(rest)
}

/// Reads one frame of a connection that is sealed (`Some`: its tag is checked and
/// stripped) or not (a sealed frame is then refused).
pub async fn read_sealed<R: AsyncRead + Unpin>(
    r: &mut R,
    opener: Option<&mut crate::auth::Opener>,
) -> Result<Frame, ReadError> {
    let mut rest = read_raw(r).await?;
    Ok(open_rest(&mut rest, opener).and_then(|()| Frame::decode_rest(rest))?)
}

/// Checks a frame read after its length field against the connection's state: sealed
/// and authentic when there is an opener, not sealed when there is none.
pub fn open_rest(
    rest: &mut Vec<u8>,
    opener: Option<&mut crate::auth::Opener>,
) -> Result<(), FrameError> {
    match opener {
        Some(o) => o.open(rest),
        None if crate::auth::says_sealed(rest) => Err(FrameError::Unauthenticated),
        None => Ok(()),
    }
}

/// The sending side of a connection, shared by every thread that replies or sends on
/// it. The first sender writes straight from its own thread (no task hand-off); frames
/// sent while it writes are appended to a buffer that it writes next, so under load many
/// frames share one system call. When the socket would block, the rest goes through a
/// writer task, in order, until that queue drains.
pub struct FrameSink<W: SinkWriter = tokio::net::tcp::OwnedWriteHalf> {
    wr: Arc<W>,
    state: parking_lot::Mutex<SinkState>,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    /// Signalled when a backlog has drained (or the socket broke).
    drained: tokio::sync::Notify,
    /// Signalled when the sink is dropped, so a writer task blocked on a peer that
    /// never reads lets go of the socket (and the descriptor closes).
    closed: std::sync::Arc<tokio::sync::Notify>,
}

impl<W: SinkWriter> Drop for FrameSink<W> {
    fn drop(&mut self) {
        self.closed.notify_one();
    }
}

#[derive(Default)]
struct SinkState {
    /// Seals every frame sent from now on (a keyed connection after its handshake).
    sealer: Option<crate::auth::Sealer>,
    /// Frames waiting for the thread that is writing now.
    pending: Vec<u8>,
    /// A thread is writing.
    flushing: bool,
    /// Frames are queued for the writer task.
    backlogged: bool,
    /// The socket failed.
    broken: bool,
}

impl FrameSink {
    /// Wraps a write half; must be called inside a tokio runtime.
    pub fn new(wr: tokio::net::tcp::OwnedWriteHalf) -> Arc<FrameSink> {
        FrameSink::with_writer(Arc::new(wr))
    }
}

impl<W: SinkWriter> FrameSink<W> {
    /// Wraps a shared writer; must be called inside a tokio runtime.
    pub fn with_writer(wr: Arc<W>) -> Arc<FrameSink<W>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let closed = std::sync::Arc::new(tokio::sync::Notify::new());
        let sink = Arc::new(FrameSink {
            wr,
            state: parking_lot::Mutex::new(SinkState::default()),
            tx,
            drained: tokio::sync::Notify::new(),
            closed: closed.clone(),
        });
        tokio::spawn(Self::drain(
            std::sync::Arc::downgrade(&sink),
            sink.wr.clone(),
            rx,
            closed,
        ));
        sink
    }

    /// Seals every frame sent after this call. Frames are sealed in the order they
    /// go on the stream (under the same lock), as the peer's opener expects them.
    pub fn set_sealer(&self, sealer: crate::auth::Sealer) {
        self.state.lock().sealer = Some(sealer);
    }

    /// Sends encoded frames (one, or several back to back); false if the connection
    /// is gone.
    pub fn send(&self, frame: Vec<u8>) -> bool {
        let mut frame = frame;
        {
            let mut st = self.state.lock();
            if st.broken {
                return false;
            }
            if let Some(s) = st.sealer.as_mut() {
                frame = s.seal(&frame);
            }
            if st.backlogged {
                return self.tx.send(frame).is_ok();
            }
            if st.flushing {
                st.pending.extend_from_slice(&frame);
                return true;
            }
            st.flushing = true;
        }
        let mut buf = frame;
        loop {
            let mut off = 0;
            let mut blocked = false;
            while off < buf.len() {
                match self.wr.try_write(&buf[off..]) {
                    Ok(n) => off += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        blocked = true;
                        break;
                    }
                    Err(_) => {
                        let mut st = self.state.lock();
                        st.broken = true;
                        st.flushing = false;
                        drop(st);
                        self.drained.notify_waiters();
                        return false;
                    }
                }
            }
            let mut st = self.state.lock();
            if blocked {
                // The rest, then whatever arrived meanwhile, in order, via the writer task.
                let mut rest = buf[off..].to_vec();
                rest.extend_from_slice(&st.pending);
                st.pending.clear();
                st.backlogged = true;
                st.flushing = false;
                return self.tx.send(rest).is_ok();
            }
            if st.pending.is_empty() {
                st.flushing = false;
                return true;
            }
            buf = std::mem::take(&mut st.pending);
        }
    }

    /// True while frames wait for the socket to accept them.
    pub fn backlogged(&self) -> bool {
        self.state.lock().backlogged
    }

    /// True once the socket has failed.
    pub fn broken(&self) -> bool {
        self.state.lock().broken
    }

    /// Waits until no frame waits for the socket, or the socket fails.
    pub async fn wait_drained(&self) {
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.state.lock();
                if !st.backlogged || st.broken {
                    return;
                }
            }
            notified.await;
        }
    }

    fn mark_broken(&self) {
        self.state.lock().broken = true;
        self.drained.notify_waiters();
    }

    async fn drain(
        sink: std::sync::Weak<FrameSink<W>>,
        wr: Arc<W>,
        mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
        closed: std::sync::Arc<tokio::sync::Notify>,
    ) {
        while let Some(buf) = rx.recv().await {
            let mut off = 0;
            while off < buf.len() {
                let written = tokio::select! {
                    r = wr.write_ready(&buf[off..]) => r,
                    // The sink is gone: nobody will send more; drop the socket.
                    () = closed.notified() => return,
                };
                let failed = match written {
                    Ok(n) => {
                        off += n;
                        false
                    }
                    Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                };
                if failed {
                    if let Some(s) = sink.upgrade() {
                        s.mark_broken();
                    }
                    return;
                }
            }
            if rx.is_empty() {
                let Some(s) = sink.upgrade() else { return };
                let mut st = s.state.lock();
                // Checked again under the lock: senders queue only while holding it.
                if rx.is_empty() {
                    st.backlogged = false;
                    drop(st);
                    s.drained.notify_waiters();
                }
            }
        }
    }
}
