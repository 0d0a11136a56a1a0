//! Shared-key authentication (Lustre's SSK, simplified): a connection proves it holds
//! the file system key with a challenge–response, and every later frame on it carries
//! a MAC under session keys derived from that exchange.
//!
//! The handshake, on a fresh connection to a keyed target:
//! 1. the client sends `AUTH_NONCE` with a random nonce `Nc`; the target answers with its
//!    own `Ns` and keeps both for this connection only;
//! 2. the client's CONNECT (or callback channel registration) carries
//!    `HMAC(K, "lode proof" | Ns | Nc | uuid | target)`; the target checks it once (the
//!    nonces are consumed), so a captured CONNECT is worthless on any other connection;
//! 3. from the reply to that request on, each direction seals every frame: the header
//!    gets [`FLAG_SEALED`] and the frame a 16-byte tag, an HMAC over the frame and its
//!    sequence number under that direction's session key. A frame replayed, reordered,
//!    moved to another connection or altered fails its tag, and the connection closes.
//!
//! The target proves the key too: the client accepts only a sealed CONNECT reply (a
//! refusal may come unsealed; it grants nothing).

use hmac::{Hmac, Mac};
use lode_proto::frame::{check_len, FLAG_SEALED, PREFIX_LEN};
use lode_proto::{FrameError, HEADER_LEN};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of the tag a sealed frame ends with.
pub const TAG_LEN: usize = 16;

/// A fresh random nonce.
pub fn nonce() -> [u8; NONCE_LEN] {
    rand::random()
}

/// The nonces of one handshake, and who it is for.
#[derive(Clone, Copy)]
pub struct Handshake<'a> {
    /// The target's nonce.
    pub server: &'a [u8],
    /// The client's nonce.
    pub client: &'a [u8],
    /// The client's UUID.
    pub uuid: &'a str,
    /// The target's name.
    pub target: &'a str,
}

impl Handshake<'_> {
    fn mac(&self, key: &[u8], label: &[u8]) -> Option<HmacSha256> {
        keyed(
            key,
            &[label, self.server, self.client, self.uuid.as_bytes()],
            self.target.as_bytes(),
        )
    }

    /// The client's proof that it holds `key`; empty without a key.
    pub fn proof(&self, key: &[u8]) -> Vec<u8> {
        if key.is_empty() {
            return Vec::new();
        }
        self.mac(key, b"lode proof")
            .map(|m| m.finalize().into_bytes().to_vec())
            .unwrap_or_default()
    }

    /// Checks a client's proof in constant time.
    pub fn verify(&self, key: &[u8], got: &[u8]) -> bool {
        self.mac(key, b"lode proof")
            .is_some_and(|m| m.verify_slice(got).is_ok())
    }

    fn direction(&self, key: &[u8], label: &[u8]) -> Option<HmacSha256> {
        let k = self.mac(key, label)?.finalize().into_bytes();
        HmacSha256::new_from_slice(&k).ok()
    }

    /// The client's side of the session: what it sends, what it receives.
    pub fn client_session(&self, key: &[u8]) -> Option<(Sealer, Opener)> {
        Some((
            Sealer::new(self.direction(key, b"lode c2s")?),
            Opener::new(self.direction(key, b"lode s2c")?),
        ))
    }

    /// The target's side of the session.
    pub fn server_session(&self, key: &[u8]) -> Option<(Sealer, Opener)> {
        Some((
            Sealer::new(self.direction(key, b"lode s2c")?),
            Opener::new(self.direction(key, b"lode c2s")?),
        ))
    }
}

/// An HMAC under `key` over `parts`, each prefixed by its length, then `last` (the
/// encoding every proof here uses); `None` for a key HMAC refuses.
fn keyed(key: &[u8], parts: &[&[u8]], last: &[u8]) -> Option<HmacSha256> {
    let mut mac = HmacSha256::new_from_slice(key).ok()?;
    for part in parts {
        mac.update(&(part.len() as u32).to_le_bytes());
        mac.update(part);
    }
    mac.update(last);
    Some(mac)
}

fn register_mac(
    secret: &[u8],
    name: &str,
    addr: &str,
    uuid: &str,
    stamp: u64,
) -> Option<HmacSha256> {
    let parts = [
        b"lode register".as_slice(),
        name.as_bytes(),
        addr.as_bytes(),
        uuid.as_bytes(),
    ];
    keyed(secret, &parts, &stamp.to_le_bytes())
}

/// A target's proof, under its own secret, that a registration at the MGS is its own.
pub fn register_proof(secret: &[u8], name: &str, addr: &str, uuid: &str, stamp: u64) -> Vec<u8> {
    register_mac(secret, name, addr, uuid, stamp)
        .map(|m| m.finalize().into_bytes().to_vec())
        .unwrap_or_default()
}

/// Checks a registration's proof in constant time.
pub fn verify_register(
    secret: &[u8],
    name: &str,
    addr: &str,
    uuid: &str,
    stamp: u64,
    got: &[u8],
) -> bool {
    register_mac(secret, name, addr, uuid, stamp).is_some_and(|m| m.verify_slice(got).is_ok())
}

/// Seals the frames one side sends, in the order they go on the stream.
pub struct Sealer {
    mac: HmacSha256,
    seq: u64,
}

impl Sealer {
    fn new(mac: HmacSha256) -> Sealer {
        Sealer { mac, seq: 0 }
    }

    /// Seals every frame in `buf` (whole encoded frames, back to back).
    pub fn seal(&mut self, buf: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(buf.len() + TAG_LEN * 4);
        let mut off = 0;
        while off + PREFIX_LEN + HEADER_LEN <= buf.len() {
            let len =
                u32::from_le_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
            let Some(frame) = buf.get(off + 4..off + 4 + len) else {
                break;
            };
            let start = out.len();
            out.extend_from_slice(&((len + TAG_LEN) as u32).to_le_bytes());
            out.extend_from_slice(frame);
            // The flags field (after the magic, version and opcode), then a new CRC.
            let flags_at = start + PREFIX_LEN + 8;
            let flags = u16::from_le_bytes([out[flags_at], out[flags_at + 1]]) | FLAG_SEALED;
            out[flags_at..flags_at + 2].copy_from_slice(&flags.to_le_bytes());
            let crc = crc32c::crc32c(&out[start + PREFIX_LEN..]);
            out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
            let tag = tag(&self.mac, self.seq, &out[start + 4..]);
            self.seq += 1;
            out.extend_from_slice(&tag);
            off += 4 + len;
        }
        out
    }
}

/// Checks and unwraps the frames one side receives, in stream order.
pub struct Opener {
    mac: HmacSha256,
    seq: u64,
}

impl Opener {
    fn new(mac: HmacSha256) -> Opener {
        Opener { mac, seq: 0 }
    }

    /// Checks a sealed frame as read after its length field (`rest`: CRC, header, body,
    /// tag) and strips the tag.
    pub fn open(&mut self, rest: &mut Vec<u8>) -> Result<(), FrameError> {
        if rest.len() < 4 + HEADER_LEN + TAG_LEN {
            // A whole frame too short to carry a tag: never "more bytes needed".
            return Err(FrameError::Unauthenticated);
        }
        let at = rest.len() - TAG_LEN;
        // Constant time: nothing about the right tag leaks through timing.
        let authentic = tag_mac(&self.mac, self.seq, &rest[..at])
            .verify_truncated_left(&rest[at..])
            .is_ok();
        if !authentic || !says_sealed(rest) {
            return Err(FrameError::Unauthenticated);
        }
        self.seq += 1;
        rest.truncate(at);
        Ok(())
    }

    /// Splits one sealed frame off the front of `buf`: the frame as read after its
    /// length field, tag checked and stripped, and the bytes it took. `Truncated`: more
    /// bytes are needed.
    pub fn take(&mut self, buf: &[u8]) -> Result<(Vec<u8>, usize), FrameError> {
        if buf.len() < 4 {
            return Err(FrameError::Truncated);
        }
        let len = check_len(u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]))?;
        let Some(rest) = buf.get(4..4 + len) else {
            return Err(FrameError::Truncated);
        };
        let mut rest = rest.to_vec();
        self.open(&mut rest)?;
        Ok((rest, 4 + len))
    }
}

/// Whether a frame as read after its length field says it is sealed (unchecked: for
/// telling a sealed CONNECT reply from an unsealed refusal).
pub fn says_sealed(rest: &[u8]) -> bool {
    rest.len() >= 4 + HEADER_LEN
        && u16::from_le_bytes([rest[4 + 8], rest[4 + 9]]) & FLAG_SEALED != 0
}

/// The MAC of a frame's bytes at sequence number `seq`, before finalising.
fn tag_mac(mac: &HmacSha256, seq: u64, bytes: &[u8]) -> HmacSha256 {
    let mut m = mac.clone();
    m.update(&seq.to_le_bytes());
    m.update(bytes);
    m
}

fn tag(mac: &HmacSha256, seq: u64, bytes: &[u8]) -> [u8; TAG_LEN] {
    let full = tag_mac(mac, seq, bytes).finalize().into_bytes();
    let mut t = [0u8; TAG_LEN];
    t.copy_from_slice(&full[..TAG_LEN]);
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use lode_proto::{Frame, Header};

    fn hs<'a>(s: &'a [u8], c: &'a [u8]) -> Handshake<'a> {
        Handshake {
            server: s,
            client: c,
            uuid: "client-1",
            target: "lode-MDT0000",
        }
    }

    #[test]
    fn a_proof_holds_only_for_its_key_nonces_and_target() {
        let p = hs(b"s", b"c").proof(b"k");
        assert!(hs(b"s", b"c").verify(b"k", &p));
        assert!(!hs(b"s", b"c").verify(b"x", &p), "another key");
        assert!(!hs(b"s2", b"c").verify(b"k", &p), "another server nonce");
        assert!(!hs(b"s", b"c2").verify(b"k", &p), "another client nonce");
        let other = Handshake {
            target: "lode-OST0000",
            ..hs(b"s", b"c")
        };
        assert!(!other.verify(b"k", &p), "another target");
        assert!(hs(b"s", b"c").proof(b"").is_empty());
    }

    fn frame(xid: u64, body: &[u8]) -> Vec<u8> {
        let h = Header {
            opcode: 3,
            xid,
            ..Default::default()
        };
        Frame::encode(&h, body)
    }

    #[test]
    fn sealed_frames_open_once_in_order_and_never_altered() {
        let h = hs(b"s", b"c");
        let (mut seal, _) = h.client_session(b"k").expect("session");
        let (_, mut open) = h.server_session(b"k").expect("session");
        let mut two = frame(1, b"one");
        two.extend(frame(2, b"two"));
        let sealed = seal.seal(&two);
        let (a, used) = open.take(&sealed).expect("first opens");
        let f = Frame::decode_rest(a).expect("decodes");
        assert_eq!((f.header.xid, f.body.as_slice()), (1, &b"one"[..]));
        assert!(f.header.flags & FLAG_SEALED != 0);
        // Replayed: the sequence has moved on.
        let (_, mut open2) = h.server_session(b"k").expect("session");
        assert!(open2.take(&sealed).is_ok());
        assert_eq!(
            open2.take(&sealed).map(|_| ()),
            Err(FrameError::Unauthenticated)
        );
        let (b, _) = open.take(&sealed[used..]).expect("second opens");
        assert_eq!(Frame::decode_rest(b).expect("decodes").header.xid, 2);

        // Altered, or from the other direction, or unsealed: refused.
        let (mut seal, _) = h.client_session(b"k").expect("session");
        let mut bad = seal.seal(&frame(3, b"x"));
        let n = bad.len();
        bad[n - TAG_LEN - 1] ^= 1;
        let (_, mut open) = h.server_session(b"k").expect("session");
        assert!(open.take(&bad).is_err());
        let (mut back, _) = h.server_session(b"k").expect("session");
        let (_, mut open) = h.server_session(b"k").expect("session");
        assert!(open.take(&back.seal(&frame(4, b"y"))).is_err());
        let (_, mut open) = h.server_session(b"k").expect("session");
        assert!(open.take(&frame(5, b"plain")).is_err());
        // Shorter than any sealed frame, yet whole: refused, not waited on.
        assert_eq!(
            open.take(&frame(6, b"")).map(|_| ()),
            Err(FrameError::Unauthenticated)
        );
    }
}
