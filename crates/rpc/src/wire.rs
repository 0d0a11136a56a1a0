//! Reading and writing frames on async streams.

use lode_proto::frame::check_len;
use lode_proto::{Frame, FrameError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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

/// Drains encoded frames from `rx` onto `w`, flushing whenever the queue runs dry so
/// that many small replies share one write system call.
pub async fn write_loop<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::UnboundedReceiver<Vec<u8>>) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 << 10);
    while let Some(first) = rx.recv().await {
        buf.clear();
        buf.extend_from_slice(&first);
        while buf.len() < (256 << 10) {
            match rx.try_recv() {
                Ok(more) => buf.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if w.write_all(&buf).await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}
