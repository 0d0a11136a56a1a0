//! Replies to the kernel. Each request gets one reply object, which is answered exactly
//! once: a reply dropped unanswered (a handler that panicked or forgot) answers `EIO`,
//! so the caller in the kernel never waits forever and a ring entry is never lost.

use super::abi::{self, FileAttr, FileType};
use std::sync::Arc;
use std::time::Duration;

/// Where a reply goes: the `/dev/fuse` descriptor the request came from, or the ring
/// entry that holds it.
pub trait Sink: Send + Sync {
    /// Sends the reply to request `unique`: `error` (0, or a negative errno) and, on
    /// success, the body in parts.
    fn send(&self, unique: u64, error: i32, body: &[&[u8]]);
}

/// The open file handle the file system chose (`fh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileHandle(pub u64);

/// An inode number as the kernel knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct INodeNo(pub u64);

/// An inode generation (with the inode number, unique over the file system's life).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation(pub u64);

/// `fuse_open_out.open_flags`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FopenFlags(pub u32);

impl FopenFlags {
    /// No flags.
    pub const fn empty() -> Self {
        FopenFlags(0)
    }
    /// Bypass the page cache for this open file.
    pub const FOPEN_DIRECT_IO: Self = FopenFlags(abi::fopen::DIRECT_IO);
    /// Keep the file's cached pages at this open.
    pub const FOPEN_KEEP_CACHE: Self = FopenFlags(abi::fopen::KEEP_CACHE);
    /// Let the kernel cache the directory's listing.
    pub const FOPEN_CACHE_DIR: Self = FopenFlags(abi::fopen::CACHE_DIR);
}

impl std::ops::BitOr for FopenFlags {
    type Output = FopenFlags;
    fn bitor(self, o: FopenFlags) -> FopenFlags {
        FopenFlags(self.0 | o.0)
    }
}

impl std::ops::BitOrAssign for FopenFlags {
    fn bitor_assign(&mut self, o: FopenFlags) {
        self.0 |= o.0;
    }
}

/// A reply not yet given.
pub struct ReplyRaw {
    unique: u64,
    sink: Option<Arc<dyn Sink>>,
}

impl ReplyRaw {
    /// The reply to request `unique`, through `sink`.
    pub fn new(unique: u64, sink: Arc<dyn Sink>) -> ReplyRaw {
        ReplyRaw {
            unique,
            sink: Some(sink),
        }
    }

    fn send(mut self, error: i32, body: &[&[u8]]) {
        if let Some(s) = self.sink.take() {
            s.send(self.unique, error, body);
        }
    }

    /// Success with `body`.
    pub fn ok(self, body: &[&[u8]]) {
        self.send(0, body);
    }

    /// Failure with errno `e` (positive).
    pub fn error(self, e: i32) {
        // The kernel refuses 0 and values beyond its errno range with EINVAL.
        let e = if e <= 0 || e >= 512 { libc::EIO } else { e };
        self.send(-e, &[]);
    }
}

impl Drop for ReplyRaw {
    fn drop(&mut self) {
        if let Some(s) = self.sink.take() {
            s.send(self.unique, -libc::EIO, &[]);
        }
    }
}

macro_rules! reply_type {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        pub struct $name(pub(crate) ReplyRaw);
        impl $name {
            /// Failure with errno `e` (positive).
            pub fn error(self, e: i32) {
                self.0.error(e)
            }
        }
    };
}

reply_type!(
    /// The reply to LOOKUP, MKNOD, MKDIR, SYMLINK, LINK.
    ReplyEntry
);
/// The reply to GETATTR, SETATTR, and STATX (`.1`: with the birth time, in a
/// `fuse_statx_out`).
pub struct ReplyAttr(pub(crate) ReplyRaw, pub(crate) bool);
reply_type!(
    /// The reply to READ, READLINK.
    ReplyData
);
reply_type!(
    /// The reply to OPEN, OPENDIR.
    ReplyOpen
);
reply_type!(
    /// The reply to CREATE.
    ReplyCreate
);
reply_type!(
    /// The reply to WRITE.
    ReplyWrite
);
reply_type!(
    /// A reply with no body.
    ReplyEmpty
);
reply_type!(
    /// The reply to LSEEK.
    ReplyLseek
);
reply_type!(
    /// The reply to IOCTL.
    ReplyIoctl
);
reply_type!(
    /// The reply to STATFS.
    ReplyStatfs
);
reply_type!(
    /// The reply to GETXATTR, LISTXATTR.
    ReplyXattr
);
reply_type!(
    /// The reply to GETLK.
    ReplyLock
);

impl ReplyEntry {
    /// The entry, with one timeout for its name and attributes.
    pub fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        self.entry_with_ttls(ttl, ttl, attr, generation);
    }
    /// The entry; the kernel keeps its attributes for `attr_ttl`, its name for
    /// `entry_ttl`.
    pub fn entry_with_ttls(
        self,
        attr_ttl: &Duration,
        entry_ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) {
        let e = abi::entry_out(attr.ino, generation.0, *entry_ttl, *attr_ttl, attr);
        self.0.ok(&[&e]);
    }
}

impl ReplyAttr {
    /// The attributes, kept for `ttl`.
    pub fn attr(self, ttl: &Duration, attr: &FileAttr) {
        if self.1 {
            self.0.ok(&[&abi::statx_out(*ttl, attr)]);
        } else {
            self.0.ok(&[&abi::attr_out(*ttl, attr)]);
        }
    }

    /// Failure with errno `e` (positive).
    pub fn error(self, e: i32) {
        self.0.error(e)
    }
}

impl ReplyData {
    /// The bytes.
    pub fn data(self, data: &[u8]) {
        self.0.ok(&[data]);
    }
}

impl ReplyOpen {
    /// The file is open as `fh`.
    pub fn opened(self, fh: FileHandle, flags: FopenFlags) {
        self.0.ok(&[&abi::open_out(fh.0, flags.0)]);
    }
}

impl ReplyCreate {
    /// The file was made and is open as `fh`.
    pub fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        let e = abi::entry_out(attr.ino, generation.0, *ttl, *ttl, attr);
        self.0.ok(&[&e, &abi::open_out(fh.0, flags.0)]);
    }
}

impl ReplyWrite {
    /// `size` bytes were written.
    pub fn written(self, size: u32) {
        self.0.ok(&[&abi::write_out(size)]);
    }
}

impl ReplyIoctl {
    /// The ioctl returns `result` (0 or more) with `data`, exactly the bytes the
    /// kernel asked back.
    pub fn ioctl(self, result: i32, data: &[u8]) {
        self.0.ok(&[&abi::ioctl_out(result), data]);
    }
}

impl ReplyLseek {
    /// The file position is now `offset`.
    pub fn offset(self, offset: u64) {
        self.0.ok(&[&abi::lseek_out(offset)]);
    }
}

impl ReplyEmpty {
    /// Success.
    pub fn ok(self) {
        self.0.ok(&[]);
    }
}

impl ReplyStatfs {
    /// The file system's numbers.
    #[allow(clippy::too_many_arguments)]
    pub fn statfs(
        self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    ) {
        let s = abi::statfs_out(blocks, bfree, bavail, files, ffree, bsize, namelen, frsize);
        self.0.ok(&[&s]);
    }
}

impl ReplyXattr {
    /// The size the value (or list) needs: the answer to a call with size 0.
    pub fn size(self, size: u32) {
        self.0.ok(&[&abi::xattr_size_out(size)]);
    }
    /// The value (or list).
    pub fn data(self, data: &[u8]) {
        self.0.ok(&[data]);
    }
}

impl ReplyLock {
    /// The lock that conflicts (or, with `F_UNLCK`, none).
    pub fn locked(self, start: u64, end: u64, typ: i32, pid: u32) {
        self.0.ok(&[&abi::lk_out(start, end, typ, pid)]);
    }
}

/// The reply to READDIR: entries added until the kernel's buffer is full.
pub struct ReplyDirectory {
    raw: ReplyRaw,
    buf: Vec<u8>,
    max: usize,
}

impl ReplyDirectory {
    pub(crate) fn new(raw: ReplyRaw, max: usize) -> Self {
        ReplyDirectory {
            raw,
            buf: Vec::with_capacity(max.min(1 << 16)),
            max,
        }
    }
    /// Adds an entry; true if it did not fit (the buffer is full).
    pub fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &[u8]) -> bool {
        if self.buf.len() + abi::dirent_len(name.len()) > self.max {
            return true;
        }
        abi::push_dirent(&mut self.buf, ino.0, offset, kind.dtype(), name);
        false
    }
    /// Sends the entries added.
    pub fn ok(self) {
        self.raw.ok(&[&self.buf]);
    }
    /// Failure with errno `e`.
    pub fn error(self, e: i32) {
        self.raw.error(e);
    }
}

/// The reply to READDIRPLUS: entries with their attributes.
pub struct ReplyDirectoryPlus {
    raw: ReplyRaw,
    buf: Vec<u8>,
    max: usize,
}

impl ReplyDirectoryPlus {
    pub(crate) fn new(raw: ReplyRaw, max: usize) -> Self {
        ReplyDirectoryPlus {
            raw,
            buf: Vec::with_capacity(max.min(1 << 16)),
            max,
        }
    }
    /// Adds an entry; true if it did not fit (the buffer is full).
    pub fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &[u8],
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        let e = abi::entry_out(ino.0, generation.0, *ttl, *ttl, attr);
        self.push(&e, ino, offset, attr.kind, name)
    }
    /// Adds a name without attributes (node id 0): the kernel lists it and looks it up
    /// when asked, as after a plain READDIR. True if it did not fit.
    pub fn add_name(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &[u8]) -> bool {
        self.push(&[0; 128], ino, offset, kind, name)
    }
    /// Appends a `fuse_direntplus` (`entry` and the dirent); true if it did not fit.
    fn push(
        &mut self,
        entry: &[u8; 128],
        ino: INodeNo,
        offset: u64,
        kind: FileType,
        name: &[u8],
    ) -> bool {
        if self.buf.len() + entry.len() + abi::dirent_len(name.len()) > self.max {
            return true;
        }
        self.buf.extend_from_slice(entry);
        abi::push_dirent(&mut self.buf, ino.0, offset, kind.dtype(), name);
        false
    }
    /// Sends the entries added.
    pub fn ok(self) {
        self.raw.ok(&[&self.buf]);
    }
    /// Failure with errno `e`.
    pub fn error(self, e: i32) {
        self.raw.error(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Capture(Mutex<Vec<(u64, i32, Vec<u8>)>>);
    impl Sink for Capture {
        fn send(&self, unique: u64, error: i32, body: &[&[u8]]) {
            self.0.lock().push((unique, error, body.concat()));
        }
    }

    #[test]
    fn a_reply_dropped_unanswered_answers_eio_and_an_answer_goes_once() {
        let c = Arc::new(Capture::default());
        drop(ReplyEmpty(ReplyRaw::new(4, c.clone())));
        ReplyEmpty(ReplyRaw::new(6, c.clone())).ok();
        ReplyEmpty(ReplyRaw::new(8, c.clone())).error(libc::ENOENT);
        ReplyEmpty(ReplyRaw::new(10, c.clone())).error(0);
        let got = c.0.lock().clone();
        assert_eq!(
            got,
            vec![
                (4, -libc::EIO, vec![]),
                (6, 0, vec![]),
                (8, -libc::ENOENT, vec![]),
                (10, -libc::EIO, vec![])
            ]
        );
    }

    #[test]
    fn a_name_without_attributes_has_node_id_zero_and_its_dirent() {
        let c = Arc::new(Capture::default());
        let mut d = ReplyDirectoryPlus::new(ReplyRaw::new(2, c.clone()), 4096);
        assert!(!d.add_name(INodeNo(9), 3, FileType::Directory, b"sub"));
        d.ok();
        let got = c.0.lock().clone();
        let b = &got[0].2;
        assert_eq!(b.len(), 128 + abi::dirent_len(3));
        assert!(b[..128].iter().all(|x| *x == 0), "entry_out all zero");
        assert_eq!(&b[128..136], &9u64.to_le_bytes());
        assert_eq!(&b[136..144], &3u64.to_le_bytes());
        assert_eq!(&b[148..152], &(libc::S_IFDIR >> 12).to_le_bytes());
        assert_eq!(&b[152..155], b"sub");
    }

    #[test]
    fn a_directory_reply_stops_at_the_kernels_buffer_size() {
        let c = Arc::new(Capture::default());
        let mut d = ReplyDirectory::new(ReplyRaw::new(2, c.clone()), 64);
        assert!(!d.add(INodeNo(5), 1, FileType::RegularFile, b"a"));
        assert!(!d.add(INodeNo(6), 2, FileType::Directory, b"b"));
        assert!(d.add(INodeNo(7), 3, FileType::Directory, b"c"));
        d.ok();
        let got = c.0.lock().clone();
        assert_eq!(got[0].2.len(), 64);
        assert_eq!(&got[0].2[16..20], &1u32.to_le_bytes());
        assert_eq!(&got[0].2[20..24], &(libc::S_IFREG >> 12).to_le_bytes());
    }
}
