//! Conversions between lode attributes and FUSE's.

use crate::kernel::{FileAttr, FileType};
use lode_base::Attr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the epoch as a `SystemTime`.
pub(crate) fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// A `SystemTime` as nanoseconds since the epoch.
pub(crate) fn ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

/// FUSE file type of a lode type.
pub(crate) fn kind(t: lode_base::FileType) -> FileType {
    match t {
        lode_base::FileType::Regular => FileType::RegularFile,
        lode_base::FileType::Directory => FileType::Directory,
        lode_base::FileType::Symlink => FileType::Symlink,
        lode_base::FileType::Fifo => FileType::NamedPipe,
        lode_base::FileType::Socket => FileType::Socket,
        lode_base::FileType::CharDev => FileType::CharDevice,
        lode_base::FileType::BlockDev => FileType::BlockDevice,
    }
}

/// FUSE attributes of a lode inode.
pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: a.fid.ino(),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        kind: kind(a.ftype()),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: 4096,
        btime: (a.btime != 0).then(|| time(a.btime)),
    }
}

/// The attributes of a negative entry (inode number 0).
pub(crate) fn negative() -> FileAttr {
    FileAttr {
        ino: 0,
        size: 0,
        blocks: 0,
        atime: time(0),
        mtime: time(0),
        ctime: time(0),
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        btime: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        for n in [0i64, 1, 1_700_000_000_123_456_789, -5_000_000_000] {
            assert_eq!(ns(time(n)), n);
        }
    }
}
