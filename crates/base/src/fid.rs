//! File identifiers (Lustre FIDs).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A file identifier: `(sequence, object id, version)`, unique in the file system for
/// ever. Clients allocate FIDs from sequences granted by an MDT, so a replayed create
/// recreates the same FID.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct Fid {
    /// Sequence, granted to one client (or the MDT itself) at a time.
    pub seq: u64,
    /// Object id within the sequence.
    pub oid: u32,
    /// Version; always 0 for now.
    pub ver: u32,
}

/// Sequence of the root directory and other well-known MDT objects.
pub const ROOT_SEQ: u64 = 0x2_0000_0007;
/// The first sequence handed out for normal files.
pub const FIRST_NORMAL_SEQ: u64 = 0x2_0000_0400;
/// Width of a sequence grant: object ids per sequence (Lustre's `LUSTRE_METADATA_SEQ_MAX_WIDTH`).
pub const SEQ_WIDTH: u32 = 0x20000;

impl Fid {
    /// The root directory of every lode file system.
    pub const ROOT: Fid = Fid {
        seq: ROOT_SEQ,
        oid: 1,
        ver: 0,
    };
    /// The zero FID, never a real object.
    pub const ZERO: Fid = Fid {
        seq: 0,
        oid: 0,
        ver: 0,
    };

    /// Builds a FID.
    pub const fn new(seq: u64, oid: u32, ver: u32) -> Fid {
        Fid { seq, oid, ver }
    }

    /// Big-endian bytes, so keys sort by (seq, oid, ver).
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.seq.to_be_bytes());
        b[8..12].copy_from_slice(&self.oid.to_be_bytes());
        b[12..].copy_from_slice(&self.ver.to_be_bytes());
        b
    }

    /// Parses the first 16 bytes of `b` as written by [`Fid::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Option<Fid> {
        if b.len() < 16 {
            return None;
        }
        Some(Fid {
            seq: u64::from_be_bytes(b[..8].try_into().ok()?),
            oid: u32::from_be_bytes(b[8..12].try_into().ok()?),
            ver: u32::from_be_bytes(b[12..16].try_into().ok()?),
        })
    }

    /// A stable 64-bit inode number (Lustre's `fid_flatten`): the root is 1.
    pub fn ino(&self) -> u64 {
        if *self == Fid::ROOT {
            return 1;
        }
        let ino = (self.seq << 24).wrapping_add(self.seq >> 24 & 0xff_ffff) ^ u64::from(self.oid);
        if ino <= 1 {
            ino.wrapping_add(2)
        } else {
            ino
        }
    }

    /// The FID whose [`Fid::ino`] is `ino`, for FIDs whose oid fits in 24 bits and
    /// whose sequence fits in 40 (every FID lode hands out: sequences are granted
    /// 131,072 oids wide) and whose version is 0; `None` for any other number. A file
    /// handle names an inode by its number only (`open_by_handle_at` through FUSE),
    /// after the mount may have forgotten it.
    pub fn from_ino(ino: u64) -> Option<Fid> {
        if ino == 1 {
            return Some(Fid::ROOT);
        }
        let seq = ino >> 24;
        let oid = ((ino & 0xff_ffff) ^ (seq >> 24 & 0xff_ffff)) as u32;
        let f = Fid { seq, oid, ver: 0 };
        (f.ino() == ino && f.is_normal()).then_some(f)
    }

    /// True for FIDs a client may create in: a normal sequence, a non-zero oid.
    pub fn is_normal(&self) -> bool {
        self.seq >= FIRST_NORMAL_SEQ && self.oid != 0
    }
}

impl fmt::Display for Fid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}:{:#x}:{:#x}]", self.seq, self.oid, self.ver)
    }
}

impl fmt::Debug for Fid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Error for a string that is not a FID in `[0xSEQ:0xOID:0xVER]` form.
#[derive(Debug, thiserror::Error)]
#[error("not a FID: {0:?} (expected [0xSEQ:0xOID:0xVER])")]
pub struct ParseFidError(String);

impl FromStr for Fid {
    type Err = ParseFidError;
    fn from_str(s: &str) -> Result<Fid, ParseFidError> {
        let err = || ParseFidError(s.to_string());
        let t = s.trim();
        let t = t.strip_prefix('[').unwrap_or(t);
        let t = t.strip_suffix(']').unwrap_or(t);
        let mut parts = t.split(':');
        let mut num = |max: u64| -> Result<u64, ParseFidError> {
            let p = parts.next().ok_or_else(err)?;
            let p = p.strip_prefix("0x").unwrap_or(p);
            let v = u64::from_str_radix(p, 16).map_err(|_| err())?;
            if v > max {
                return Err(err());
            }
            Ok(v)
        };
        let seq = num(u64::MAX)?;
        let oid = num(u64::from(u32::MAX))? as u32;
        let ver = num(u64::from(u32::MAX))? as u32;
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(Fid { seq, oid, ver })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inode_number_gives_its_fid_back() {
        assert_eq!(Fid::from_ino(1), Some(Fid::ROOT));
        for seq in [
            FIRST_NORMAL_SEQ,
            FIRST_NORMAL_SEQ + 1,
            FIRST_NORMAL_SEQ << 6,
        ] {
            for oid in [1, 2, 0x1_0000, 0x2_0000, 0xff_ffff] {
                let f = Fid::new(seq, oid, 0);
                assert_eq!(Fid::from_ino(f.ino()), Some(f), "{f}");
            }
        }
        // Numbers below the first normal sequence's: none (the MDT answers for any
        // other, ENOENT if no such inode).
        assert_eq!(Fid::from_ino(0), None);
        assert_eq!(Fid::from_ino(2), None);
        assert_eq!(Fid::from_ino((FIRST_NORMAL_SEQ - 1) << 24 | 5), None);
    }

    #[test]
    fn root_prints_like_lustre() {
        assert_eq!(Fid::ROOT.to_string(), "[0x200000007:0x1:0x0]");
        assert_eq!("[0x200000007:0x1:0x0]".parse::<Fid>().unwrap(), Fid::ROOT);
        assert_eq!(Fid::ROOT.ino(), 1);
    }

    #[test]
    fn bytes_round_trip_and_sort() {
        let a = Fid::new(FIRST_NORMAL_SEQ, 1, 0);
        let b = Fid::new(FIRST_NORMAL_SEQ, 2, 0);
        assert_eq!(Fid::from_bytes(&a.to_bytes()), Some(a));
        assert!(a.to_bytes() < b.to_bytes());
        assert!(Fid::from_bytes(&[1, 2]).is_none());
    }

    #[test]
    fn bad_fid_strings_are_refused() {
        for s in [
            "",
            "[0x1:0x2]",
            "[zz:0x1:0x0]",
            "[0x1:0x1ffffffff:0x0]",
            "[0x1:0x1:0x0:0x0]",
        ] {
            assert!(s.parse::<Fid>().is_err(), "{s}");
        }
    }
}
