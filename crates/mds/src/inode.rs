//! Reading and writing inode and dirent records; name and time helpers.

use crate::{Namespace, OpResult};
use lode_base::hash::name_hash;
use lode_base::limits::NAME_MAX;
use lode_base::{Errno, Fid};
use lode_store::records::{self, dirent_key, DirentRec, InodeRec};
use lode_store::{Batch, Cf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in ns since the epoch.
pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// Checks a name for a new or looked-up entry: 1..=255 bytes, no `/` or NUL.
pub(crate) fn check_name(name: &[u8]) -> Result<(), Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

impl Namespace {
    /// The inode record of `fid`, or ENOENT.
    pub(crate) fn inode(&self, fid: Fid) -> OpResult<InodeRec> {
        match self.store.inode(&fid.to_bytes())? {
            Some(b) => Ok(records::decode("inode", &b)?),
            None => Err(Errno::ENOENT.into()),
        }
    }

    /// The inode record of a directory, or ENOENT/ENOTDIR.
    pub(crate) fn dir_inode(&self, fid: Fid) -> OpResult<InodeRec> {
        let d = self.inode(fid)?;
        if d.mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(Errno::ENOTDIR.into());
        }
        Ok(d)
    }

    /// The entry `name` of `parent`, if present.
    pub(crate) fn dirent(&self, parent: Fid, name: &[u8]) -> OpResult<Option<DirentRec>> {
        let k = dirent_key(parent, name_hash(name), name);
        match self.store.engine().get(Cf::Dirent, &k)? {
            Some(b) => Ok(Some(decode_dirent(&b)?)),
            None => Ok(None),
        }
    }

    /// True if directory `fid` has no entries.
    pub(crate) fn dir_is_empty(&self, fid: Fid) -> OpResult<bool> {
        let mut empty = true;
        self.store
            .engine()
            .scan(Cf::Dirent, &fid.to_bytes(), b"", &mut |_, _| {
                empty = false;
                false
            })?;
        Ok(empty)
    }
}

/// Dirent values are fixed: 16 bytes of FID and a `d_type` byte.
pub(crate) fn encode_dirent(d: &DirentRec) -> Vec<u8> {
    let mut v = d.fid.to_bytes().to_vec();
    v.push(d.dtype);
    v
}

/// Decodes a dirent value.
pub(crate) fn decode_dirent(b: &[u8]) -> Result<DirentRec, lode_store::StoreError> {
    match (Fid::from_bytes(b), b.get(16)) {
        (Some(fid), Some(&dtype)) if b.len() == 17 => Ok(DirentRec { fid, dtype }),
        _ => Err(lode_store::StoreError::Corrupt(
            "dirent",
            format!("{} bytes", b.len()),
        )),
    }
}

/// Adds an inode put to a batch.
pub(crate) fn put_inode(b: &mut Batch, fid: Fid, rec: &InodeRec) {
    b.put(Cf::Inode, fid.to_bytes().to_vec(), records::encode(rec));
}

/// Adds a dirent put to a batch.
pub(crate) fn put_dirent(b: &mut Batch, parent: Fid, name: &[u8], child: Fid, dtype: u8) {
    b.put(
        Cf::Dirent,
        dirent_key(parent, name_hash(name), name),
        encode_dirent(&DirentRec { fid: child, dtype }),
    );
}

/// Adds a dirent delete to a batch.
pub(crate) fn del_dirent(b: &mut Batch, parent: Fid, name: &[u8]) {
    b.delete(Cf::Dirent, dirent_key(parent, name_hash(name), name));
}

/// `d_type` of a mode.
pub(crate) fn dtype_of(mode: u32) -> u8 {
    lode_base::FileType::from_mode(mode).map_or(libc::DT_UNKNOWN, |t| t.dtype())
}

/// True for directory modes.
pub(crate) fn is_dir(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFDIR
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_like_linux() {
        assert!(check_name(b"a").is_ok());
        assert_eq!(check_name(&[b'a'; 256]), Err(Errno::ENAMETOOLONG));
        assert!(check_name(&[b'a'; 255]).is_ok());
        assert_eq!(check_name(b"a/b"), Err(Errno::EINVAL));
        assert_eq!(check_name(b""), Err(Errno::EINVAL));
        assert_eq!(check_name(b"a\0"), Err(Errno::EINVAL));
    }
}
