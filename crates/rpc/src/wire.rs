//! Reading and writing frames on async streams.

use lode_proto::frame::check_len;
use lode_proto::{Frame, FrameError};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

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
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = check_len(u32::from_le_bytes(len))?;
    let mut rest = vec![0u8; len];
    r.read_exact(&mut rest).await?;
    Ok(Frame::decode_rest(rest)?)
}

/// The sending side of a connection, shared by every thread that replies or sends on
/// it. A frame is written straight from the caller's thread when nothing is queued (no
/// task hand-off on the fast path); when the socket would block, it and every later
/// frame go through a writer task, in order, until the queue drains.
pub struct FrameSink {
    wr: std::sync::Arc<tokio::net::tcp::OwnedWriteHalf>,
    /// True while frames are queued for the writer task.
    backlogged: parking_lot::Mutex<bool>,
    tx: mpsc::UnboundedSender<Vec<u8>>,
}

impl FrameSink {
    /// Wraps a write half; must be called inside a tokio runtime.
    pub fn new(wr: tokio::net::tcp::OwnedWriteHalf) -> std::sync::Arc<FrameSink> {
        let (tx, rx) = mpsc::unbounded_channel();
        let sink = std::sync::Arc::new(FrameSink {
            wr: std::sync::Arc::new(wr),
            backlogged: parking_lot::Mutex::new(false),
            tx,
        });
        tokio::spawn(Self::drain(
            std::sync::Arc::downgrade(&sink),
            sink.wr.clone(),
            rx,
        ));
        sink
    }

    /// Sends one encoded frame; false if the connection is gone.
    pub fn send(&self, frame: Vec<u8>) -> bool {
        let mut backlogged = self.backlogged.lock();
        if !*backlogged {
            let mut off = 0;
            while off < frame.len() {
                match self.wr.try_write(&frame[off..]) {
                    Ok(n) => off += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => return false,
                }
            }
            if off == frame.len() {
                return true;
            }
            *backlogged = true;
            return self.tx.send(frame[off..].to_vec()).is_ok();
        }
        self.tx.send(frame).is_ok()
    }

    async fn drain(
        sink: std::sync::Weak<FrameSink>,
        wr: std::sync::Arc<tokio::net::tcp::OwnedWriteHalf>,
        mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    ) {
        while let Some(buf) = rx.recv().await {
            let mut off = 0;
            while off < buf.len() {
                if wr.writable().await.is_err() {
                    return;
                }
                match wr.try_write(&buf[off..]) {
                    Ok(n) => off += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
            if rx.is_empty() {
                let Some(s) = sink.upgrade() else { return };
                let mut backlogged = s.backlogged.lock();
                // Checked again under the lock: senders queue only while holding it.
                if rx.is_empty() {
                    *backlogged = false;
                }
            }
        }
    }
}
