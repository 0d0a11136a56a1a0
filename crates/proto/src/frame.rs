//! Frame and header encoding. Decoding never panics and never allocates more than the
//! frame it was given.

use lode_base::limits::{LOCKS_PER_RPC_MAX, RPC_SIZE_MAX};

/// Frame magic, `LODE` in ASCII.
pub const MAGIC: u32 = 0x4c4f_4445;
/// Wire format version; bumped whenever a golden test has to change.
pub const PROTO_VERSION: u16 = 13;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 80;
/// Size of the length and CRC fields before the header.
pub const PREFIX_LEN: usize = 8;

/// Request flag: this is a resend of a request that may have been executed.
pub const FLAG_RESENT: u16 = 0x2;
/// Request flag: this is a replay of a request whose reply was received.
pub const FLAG_REPLAY: u16 = 0x4;
/// Request flag (on a PING): this client has sent every replay it has; the reply comes
/// when the target's recovery is over.
pub const FLAG_REPLAY_DONE: u16 = 0x10;
/// Request flag: grant the locks that cover what the reply says, if they can be
/// granted at once (Lustre's intent), so the client may cache it.
pub const FLAG_INTENT: u16 = 0x8;
/// Request flag, with `FLAG_INTENT` on a create or unlink: no lock on the directory's
/// attributes with the reply. Another change of the client's in that directory is on
/// its way to the MDT, and it would have to call such a lock back from the client
/// that asked for it (threads of one native client creating in one directory).
pub const FLAG_NO_DIR_ATTRS: u16 = 0x20;
/// Request flag: the body starts with the client's early lock cancels (see
/// [`with_cancels`]), which the target applies before the request, as Lustre packs
/// the cancels a change makes into that change's request: one frame, not two. Only a
/// request's first send carries them (a lost cancel costs a callback, nothing more).
pub const FLAG_CANCELS: u16 = 0x40;
/// Header flag: the frame ends with a tag under the connection's session key (see
/// `lode_rpc::auth`); set on every frame of a keyed connection after its handshake.
pub const FLAG_SEALED: u16 = 0x400;
/// Header flag: this frame is a reply.
pub const FLAG_REPLY: u16 = 0x100;
/// Header flag: a request from the server to the client (a lock callback), sent on the
/// client's callback channel.
pub const FLAG_CALLBACK: u16 = 0x200;

/// The fixed header of every request and reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Header {
    /// Message opcode.
    pub opcode: u16,
    /// `FLAG_*` bits.
    pub flags: u16,
    /// Modify slot (1..=max_mod_rpcs); 0 for requests that modify nothing.
    pub tag: u16,
    /// Reply status: 0 or a negative errno.
    pub status: i32,
    /// Request id, unique and increasing per import; the reply echoes it.
    pub xid: u64,
    /// Connection handle granted at CONNECT.
    pub handle: u64,
    /// Requests: every xid at or below this was replied to (reply records may go).
    /// A replay (`FLAG_REPLAY`) carries instead the open handle its client holds from
    /// it (0 if none), so the restarted target registers the open under it again.
    pub last_xid: u64,
    /// Replies: transaction number of the change (0 if none or on error).
    pub transno: u64,
    /// Replies: highest transno known durable on the target.
    pub last_committed: u64,
    /// Replies: microseconds the server spent on the request.
    pub service_us: u32,
    /// Connection generation, bumped on every reconnect.
    pub conn_cnt: u32,
    /// Replies to changes: a digest of the objects the change found and their
    /// versions (0: none). Its replay carries it back, so that a target recovering past
    /// a lost change can tell whether the objects are still as they were
    /// (version-based recovery).
    pub pre_version: u64,
    /// Replies to changes: the time the target gave the change (ns since the epoch; 0:
    /// none). Its replay carries it back, so that a change replayed after a restart
    /// stamps the times it stamped the first time (Lustre sends the client's time in
    /// every reint record for the same reason).
    pub op_time: i64,
}

/// Why a frame was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The length field is below the minimum or above `rpc_size_max`.
    #[error("frame length {0} out of bounds")]
    Length(usize),
    /// The CRC does not match the bytes.
    #[error("frame checksum mismatch")]
    Checksum,
    /// The header magic is wrong: not a lode peer.
    #[error("bad magic {0:#x}")]
    Magic(u32),
    /// The peer speaks another wire version.
    #[error("protocol version {0} not supported (this is {PROTO_VERSION})")]
    Version(u16),
    /// Fewer bytes than the frame claims.
    #[error("truncated frame")]
    Truncated,
    /// A keyed connection's frame whose tag is missing or wrong: forged, altered,
    /// replayed or out of order.
    #[error("frame not authenticated")]
    Unauthenticated,
}

impl Header {
    /// Writes the 80 header bytes.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&PROTO_VERSION.to_le_bytes());
        out.extend_from_slice(&self.opcode.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.tag.to_le_bytes());
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&self.xid.to_le_bytes());
        out.extend_from_slice(&self.handle.to_le_bytes());
        out.extend_from_slice(&self.last_xid.to_le_bytes());
        out.extend_from_slice(&self.transno.to_le_bytes());
        out.extend_from_slice(&self.last_committed.to_le_bytes());
        out.extend_from_slice(&self.service_us.to_le_bytes());
        out.extend_from_slice(&self.conn_cnt.to_le_bytes());
        out.extend_from_slice(&self.pre_version.to_le_bytes());
        out.extend_from_slice(&self.op_time.to_le_bytes());
    }

    /// Parses a header from at least [`HEADER_LEN`] bytes.
    pub fn read(b: &[u8]) -> Result<Header, FrameError> {
        if b.len() < HEADER_LEN {
            return Err(FrameError::Truncated);
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64_le(&b[o..o + 8]);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(FrameError::Magic(magic));
        }
        let version = u16_at(4);
        if version != PROTO_VERSION {
            return Err(FrameError::Version(version));
        }
        Ok(Header {
            opcode: u16_at(6),
            flags: u16_at(8),
            tag: u16_at(10),
            status: u32_at(12) as i32,
            xid: u64_at(16),
            handle: u64_at(24),
            last_xid: u64_at(32),
            transno: u64_at(40),
            last_committed: u64_at(48),
            service_us: u32_at(56),
            conn_cnt: u32_at(60),
            pre_version: u64_at(64),
            op_time: u64_at(72) as i64,
        })
    }
}

/// The little-endian u64 of 8 bytes (callers pass exactly 8).
fn u64_le(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

// The count of a body's early cancels is a u16.
const _: () = assert!(LOCKS_PER_RPC_MAX <= u16::MAX as usize);

/// A request body led by early lock cancels ([`FLAG_CANCELS`]): their count (u16) and
/// the handles (u64 each), little-endian, then `body`. At most
/// [`LOCKS_PER_RPC_MAX`] handles: the caller's bound (more are left out).
pub fn with_cancels(cancels: &[u64], body: &[u8]) -> Vec<u8> {
    let n = cancels.len().min(LOCKS_PER_RPC_MAX);
    let mut out = Vec::with_capacity(2 + 8 * n + body.len());
    out.extend_from_slice(&(n as u16).to_le_bytes());
    for h in &cancels[..n] {
        out.extend_from_slice(&h.to_le_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// The cancels and the request body of a body made by [`with_cancels`]; `None` if it
/// is shorter than its count says or names more than [`LOCKS_PER_RPC_MAX`] locks.
pub fn split_cancels(body: &[u8]) -> Option<(Vec<u64>, &[u8])> {
    let n = usize::from(u16::from_le_bytes([*body.first()?, *body.get(1)?]));
    if n > LOCKS_PER_RPC_MAX {
        return None;
    }
    let handles = body.get(2..2 + 8 * n)?;
    let cancels = handles.chunks_exact(8).map(u64_le).collect();
    Some((cancels, &body[2 + 8 * n..]))
}

/// A decoded frame: header plus body bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The header.
    pub header: Header,
    /// The postcard body.
    pub body: Vec<u8>,
}

/// Checks the length field of a frame before anything is allocated for it.
pub fn check_len(len: u32) -> Result<usize, FrameError> {
    let len = len as usize;
    if !(4 + HEADER_LEN..=RPC_SIZE_MAX).contains(&len) {
        return Err(FrameError::Length(len));
    }
    Ok(len)
}

/// Checks what follows the length field (CRC, header, body) and parses the header.
fn check_rest(rest: &[u8]) -> Result<Header, FrameError> {
    if rest.len() < 4 + HEADER_LEN {
        return Err(FrameError::Truncated);
    }
    let crc = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
    if crc32c::crc32c(&rest[4..]) != crc {
        return Err(FrameError::Checksum);
    }
    Header::read(&rest[4..])
}

impl Frame {
    /// Encodes a whole frame (length, CRC, header, body) into one buffer.
    pub fn encode(header: &Header, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(PREFIX_LEN + HEADER_LEN + body.len());
        out.extend_from_slice(&[0u8; PREFIX_LEN]);
        header.write(&mut out);
        out.extend_from_slice(body);
        let len = (out.len() - 4) as u32;
        let crc = crc32c::crc32c(&out[PREFIX_LEN..]);
        out[..4].copy_from_slice(&len.to_le_bytes());
        out[4..8].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes what follows the length field (`rest` = CRC, header, body), as read off a
    /// stream after [`check_len`].
    pub fn decode_rest(mut rest: Vec<u8>) -> Result<Frame, FrameError> {
        let header = check_rest(&rest)?;
        rest.drain(..4 + HEADER_LEN);
        Ok(Frame { header, body: rest })
    }

    /// Decodes one frame from the start of `buf`, copying only its body; returns the
    /// frame and the bytes it took. `Truncated` means more bytes are needed.
    pub fn decode(buf: &[u8]) -> Result<(Frame, usize), FrameError> {
        if buf.len() < 4 {
            return Err(FrameError::Truncated);
        }
        let len = check_len(u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]))?;
        if buf.len() < 4 + len {
            return Err(FrameError::Truncated);
        }
        let rest = &buf[4..4 + len];
        let header = check_rest(rest)?;
        let body = rest[4 + HEADER_LEN..].to_vec();
        Ok((Frame { header, body }, 4 + len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancels_lead_a_body_and_come_off_it_whole() {
        let b = with_cancels(&[7, u64::MAX], b"request");
        let (c, rest) = split_cancels(&b).expect("split");
        assert_eq!((c, rest), (vec![7, u64::MAX], &b"request"[..]));
        let none = with_cancels(&[], b"r");
        let (c, rest) = split_cancels(&none).expect("none");
        assert!(c.is_empty() && rest == b"r");
        // Shorter than the count says, no count at all, or over the bound: refused.
        assert!(split_cancels(&b[..10]).is_none());
        assert!(split_cancels(&[1]).is_none());
        let over = (LOCKS_PER_RPC_MAX as u16 + 1).to_le_bytes();
        assert!(split_cancels(&[over.to_vec(), vec![0; 8 * 4100]].concat()).is_none());
        // The bound holds when making one too.
        let many = vec![1u64; LOCKS_PER_RPC_MAX + 5];
        let (c, _) = split_cancels(&with_cancels(&many, b"")).expect("bounded");
        assert_eq!(c.len(), LOCKS_PER_RPC_MAX);
    }
}
