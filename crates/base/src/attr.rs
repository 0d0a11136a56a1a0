//! Inode attributes, attribute changes and caller credentials.

use crate::Fid;
use serde::{Deserialize, Serialize};

/// The type of an inode, from the `S_IFMT` bits of its mode.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum FileType {
    /// Regular file.
    Regular,
    /// Directory.
    Directory,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
    /// Character device.
    CharDev,
    /// Block device.
    BlockDev,
}

impl FileType {
    /// The type encoded in a full `st_mode`, if it is one.
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::Regular,
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            libc::S_IFCHR => FileType::CharDev,
            libc::S_IFBLK => FileType::BlockDev,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            FileType::Fifo => libc::S_IFIFO,
            FileType::Socket => libc::S_IFSOCK,
            FileType::CharDev => libc::S_IFCHR,
            FileType::BlockDev => libc::S_IFBLK,
        }
    }

    /// The `d_type` value readdir reports.
    pub fn dtype(self) -> u8 {
        match self {
            FileType::Regular => libc::DT_REG,
            FileType::Directory => libc::DT_DIR,
            FileType::Symlink => libc::DT_LNK,
            FileType::Fifo => libc::DT_FIFO,
            FileType::Socket => libc::DT_SOCK,
            FileType::CharDev => libc::DT_CHR,
            FileType::BlockDev => libc::DT_BLK,
        }
    }
}

/// What `stat(2)` reports about an inode, as the MDT keeps it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Attr {
    /// The inode's FID.
    pub fid: Fid,
    /// Full `st_mode`: type and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links (directories: 2 + subdirectories).
    pub nlink: u32,
    /// Size in bytes (for striped files: the MDT's lazy size until a glimpse).
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Access time, ns since the epoch.
    pub atime: i64,
    /// Modification time, ns since the epoch.
    pub mtime: i64,
    /// Change time, ns since the epoch.
    pub ctime: i64,
    /// Creation ("birth") time, ns since the epoch; 0: unknown.
    pub btime: i64,
    /// Device number for char/block nodes.
    pub rdev: u64,
    /// Inode flags as `FS_IOC_GETFLAGS` reports them: those of
    /// [`crate::perm::FS_FLAGS_KEPT`] that are set (`chattr +i`, `+a`).
    pub flags: u32,
}

impl Attr {
    /// The inode's type.
    pub fn ftype(&self) -> FileType {
        FileType::from_mode(self.mode).unwrap_or(FileType::Regular)
    }

    /// Permission bits only (07777).
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }

    /// True for directories.
    pub fn is_dir(&self) -> bool {
        self.ftype() == FileType::Directory
    }
}

/// A time to set with setattr: the server's now, or a given instant.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum TimeSet {
    /// The server's current time (UTIME_NOW).
    Now,
    /// This instant, ns since the epoch.
    At(i64),
}

/// An attribute change; `None` fields are left alone (UTIME_OMIT).
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct SetAttr {
    /// New permission bits (07777); the type bits are ignored.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
    /// New inode flags (`FS_IOC_SETFLAGS`, `chattr`): root only, and only those of
    /// [`crate::perm::FS_FLAGS_KEPT`].
    pub flags: Option<u32>,
}

/// Who is asking: the caller's identity, carried in every MDT request.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default, Serialize, Deserialize)]
pub struct Cred {
    /// Effective (fs) uid.
    pub uid: u32,
    /// Effective (fs) gid.
    pub gid: u32,
    /// Supplementary groups, at most [`crate::limits::GROUPS_MAX`].
    pub groups: Vec<u32>,
}

impl Cred {
    /// The superuser.
    pub fn root() -> Cred {
        Cred {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
    }

    /// True if the caller is in `gid` (primary or supplementary).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// When a read moves a file's access time: mount(8)'s `noatime`, `relatime` (Linux's
/// default, and lode's) and `strictatime`. FUSE leaves access times to the file system
/// (the kernel marks its inodes `S_NOATIME`), so the client applies the rule itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    /// Never (`noatime`).
    Never,
    /// When the access time is not after the last modification or change, or is a
    /// day old (`relatime`).
    #[default]
    Relative,
    /// At every read (`strictatime`).
    Strict,
}

/// This machine's time, ns since the epoch (0 before 1970).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// How old an access time may get before a read moves it under `relatime` (Linux's
/// `relatime_need_update`: a day).
pub const RELATIME_MAX_AGE_NS: i64 = 24 * 3600 * 1_000_000_000;

/// Whether a read at `now` moves an access time `atime` of a file last modified at
/// `mtime` and changed at `ctime` (ns since the epoch), as Linux's `touch_atime`
/// decides.
pub fn atime_due(mode: AtimeMode, atime: i64, mtime: i64, ctime: i64, now: i64) -> bool {
    match mode {
        AtimeMode::Never => false,
        AtimeMode::Strict => atime != now,
        AtimeMode::Relative => {
            atime <= mtime || atime <= ctime || now.saturating_sub(atime) >= RELATIME_MAX_AGE_NS
        }
    }
}

#[cfg(test)]
mod atime_tests {
    use super::*;

    #[test]
    fn relatime_moves_an_access_time_not_after_a_change_or_a_day_old_only() {
        let s = 1_000_000_000;
        let r = AtimeMode::Relative;
        // Written and not read since (atime = mtime = ctime at creation).
        assert!(atime_due(r, 10 * s, 10 * s, 10 * s, 11 * s));
        // Read after the last change: not again the same day.
        assert!(!atime_due(r, 12 * s, 10 * s, 10 * s, 13 * s));
        // Changed (chmod) since the last read.
        assert!(atime_due(r, 12 * s, 10 * s, 14 * s, 15 * s));
        // A day old.
        assert!(atime_due(
            r,
            12 * s,
            10 * s,
            10 * s,
            12 * s + RELATIME_MAX_AGE_NS
        ));
        assert!(!atime_due(
            r,
            12 * s,
            10 * s,
            10 * s,
            12 * s + RELATIME_MAX_AGE_NS - 1
        ));
        // strictatime: every read that finds another time; noatime: never.
        assert!(atime_due(AtimeMode::Strict, 12 * s, 10 * s, 10 * s, 13 * s));
        assert!(!atime_due(
            AtimeMode::Strict,
            13 * s,
            10 * s,
            10 * s,
            13 * s
        ));
        assert!(!atime_due(AtimeMode::Never, 10 * s, 10 * s, 10 * s, 11 * s));
    }
}
