//! Where recent appends to an object went, kept with the object itself (the
//! `user.lode.appends` xattr of its file): an append is not idempotent, so a resend of
//! one whose reply was lost must be answered with where it went, not appended again,
//! also when the OSS was killed in between and lost its memory of it.
//!
//! A mark is written before the bytes, and believed only if the object holds the
//! resend's very bytes where it says: killed between the two, or after a power cut
//! that dropped the bytes (an fsync of the object covers its xattrs, so the mark never
//! outlives a sync the bytes missed, but a journal may keep it without them), the
//! resend is appended again, which is right since nothing of it is there.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// The xattr's name.
const NAME: &std::ffi::CStr = c"user.lode.appends";
/// One mark: the client's UUID hashed, the request's xid, the offset; little-endian.
const ENTRY: usize = 24;
/// Marks kept per object, newest last: more than the appends all clients can have in
/// flight to one object while its OSS restarts (their resends come before any new
/// append).
pub(crate) const KEPT: usize = 128;

/// A mark's key: who sent the append, and its xid.
pub(crate) fn key(uuid: &str, xid: u64) -> (u64, u64) {
    (lode_base::hash::name_hash(uuid.as_bytes()), xid)
}

/// The object's marks as stored (empty if none).
fn read_raw(f: &File) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; KEPT * ENTRY];
    // SAFETY: `buf` is live and `buf.len()` bytes long; the name is NUL-terminated.
    let n = unsafe {
        nix::libc::fgetxattr(
            f.as_raw_fd(),
            NAME.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(nix::libc::ENODATA) => Ok(Vec::new()),
            _ => Err(e),
        };
    }
    buf.truncate(n as usize / ENTRY * ENTRY);
    Ok(buf)
}

/// Records that the append `key` goes at `offset` of the object open as `f`, the
/// oldest mark dropped past [`KEPT`]. The caller holds the object's lock.
pub(crate) fn record(f: &File, key: (u64, u64), offset: u64) -> io::Result<()> {
    let mut buf = read_raw(f)?;
    if buf.len() >= KEPT * ENTRY {
        buf.drain(..buf.len() - (KEPT - 1) * ENTRY);
    }
    buf.extend_from_slice(&key.0.to_le_bytes());
    buf.extend_from_slice(&key.1.to_le_bytes());
    buf.extend_from_slice(&offset.to_le_bytes());
    // SAFETY: `buf` is live and `buf.len()` bytes long; the name is NUL-terminated.
    let r = unsafe {
        nix::libc::fsetxattr(
            f.as_raw_fd(),
            NAME.as_ptr(),
            buf.as_ptr().cast(),
            buf.len(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Where the append `key` of `data` went in the object open as `f`, if a mark says so
/// and the object holds `data` there. The caller holds the object's lock.
pub(crate) fn find(f: &File, key: (u64, u64), data: &[u8]) -> io::Result<Option<u64>> {
    let buf = read_raw(f)?;
    let Some(offset) = buf.chunks_exact(ENTRY).rev().find_map(|e| {
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&e[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        (word(0) == key.0 && word(1) == key.1).then(|| word(2))
    }) else {
        return Ok(None);
    };
    let mut there = vec![0u8; data.len()];
    match f.read_exact_at(&mut there, offset) {
        Ok(()) if there == data => Ok(Some(offset)),
        Ok(()) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_found_only_with_its_bytes_and_the_oldest_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("obj"))
            .unwrap();
        let k = key("client-a", 7);
        assert_eq!(find(&f, k, b"abc").unwrap(), None, "no marks yet");
        record(&f, k, 0).unwrap();
        assert_eq!(
            find(&f, k, b"abc").unwrap(),
            None,
            "marked, bytes not written"
        );
        f.write_all_at(b"abc", 0).unwrap();
        assert_eq!(find(&f, k, b"abc").unwrap(), Some(0));
        assert_eq!(find(&f, k, b"abd").unwrap(), None, "other bytes");
        assert_eq!(find(&f, key("client-b", 7), b"abc").unwrap(), None);
        // Past KEPT marks, the oldest is forgotten.
        for i in 0..KEPT as u64 {
            record(&f, key("client-b", i), 3).unwrap();
        }
        assert_eq!(find(&f, k, b"abc").unwrap(), None, "forgotten");
        f.write_all_at(b"xyz", 3).unwrap();
        assert_eq!(find(&f, key("client-b", 1), b"xyz").unwrap(), Some(3));
        assert_eq!(read_raw(&f).unwrap().len(), KEPT * ENTRY);
    }
}
