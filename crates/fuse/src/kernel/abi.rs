//! The kernel's FUSE protocol (`include/uapi/linux/fuse.h`, 7.x): opcodes, flags, and
//! the byte layout of the structures lode reads and writes. Structures are encoded and
//! decoded field by field in little-endian order (the kernel's, on every architecture
//! lode builds for), never by casting memory, so a short or odd buffer is an error,
//! not undefined behaviour.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The protocol's major version.
pub const KERNEL_VERSION: u32 = 7;
/// The highest minor version lode speaks: 7.45 (kernel 6.18). Replies use the kernel's
/// minor when it is lower.
pub const KERNEL_MINOR_VERSION: u32 = 45;
/// The oldest minor version lode accepts: the structure sizes below are those of 7.23
/// and later (`fuse_init_out` of 64 bytes, `fuse_write_in` with `lock_owner`).
pub const MIN_MINOR_VERSION: u32 = 23;

/// `struct fuse_in_header`.
pub const IN_HEADER_LEN: usize = 40;
/// `struct fuse_out_header`.
pub const OUT_HEADER_LEN: usize = 16;

/// Request opcodes (`enum fuse_opcode`).
#[allow(missing_docs)]
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;
}

/// The size of the fixed header (`in_args[0]`) each opcode's request carries after
/// `fuse_in_header`, for protocol 7.23 and later: what `/dev/fuse` delivers as one
/// buffer is split there into that header and the rest (names, data). `None`: an
/// opcode lode does not parse (answered `ENOSYS`).
pub fn op_header_len(opcode: u32) -> Option<usize> {
    Some(match opcode {
        op::LOOKUP | op::READLINK | op::SYMLINK | op::UNLINK | op::RMDIR | op::STATFS => 0,
        op::REMOVEXATTR | op::DESTROY | op::SYNCFS => 0,
        op::FORGET | op::INTERRUPT => 8,
        op::GETATTR => 16,
        op::SETATTR => 88,
        op::MKNOD => 16,
        op::MKDIR => 8,
        op::RENAME => 8,
        op::RENAME2 => 16,
        op::LINK => 8,
        op::OPEN | op::OPENDIR => 8,
        op::READ | op::READDIR | op::READDIRPLUS => 40,
        op::WRITE => 40,
        op::RELEASE | op::RELEASEDIR => 24,
        op::FSYNC | op::FSYNCDIR => 16,
        // Without FUSE_SETXATTR_EXT, which lode does not ask for.
        op::SETXATTR => 8,
        op::GETXATTR | op::LISTXATTR => 8,
        op::FLUSH => 24,
        op::INIT => 16,
        op::GETLK | op::SETLK | op::SETLKW => 48,
        op::ACCESS => 8,
        op::CREATE | op::TMPFILE => 16,
        op::IOCTL => 32,
        op::BATCH_FORGET => 8,
        op::FALLOCATE => 32,
        op::LSEEK => 24,
        op::STATX => 24,
        _ => return None,
    })
}

/// `FUSE_INIT` flags (`flags` | `flags2 << 32`).
#[allow(missing_docs)]
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_open_out.open_flags`.
#[allow(missing_docs)]
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const CACHE_DIR: u32 = 1 << 3;
}

/// `fuse_setattr_in.valid`.
#[allow(missing_docs)]
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
}

/// `fuse_release_in.release_flags`: the last close of an open file that took flocks.
pub const RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
/// `fuse_lk_in.lk_flags`: the lock is a `flock(2)` lock, not a record lock.
pub const LK_FLOCK: u32 = 1 << 0;
/// `fuse_read_in.read_flags` / `fuse_write_in.write_flags`: `lock_owner` is valid.
pub const READ_LOCKOWNER: u32 = 1 << 1;
/// `fuse_write_in.write_flags` (with `FUSE_HANDLE_KILLPRIV_V2`): the writer lacks
/// CAP_FSETID, so the write drops the file's set-user-ID bit, and its set-group-ID bit
/// if it is group-executable.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_flush_in`/`fuse_read_in` etc.: bit set in an INTERRUPT's `unique`.
pub const INT_REQ_BIT: u64 = 1;

/// Notification codes (`enum fuse_notify_code`), sent with `unique` 0.
#[allow(missing_docs)]
pub mod notify {
    pub const INVAL_INODE: i32 = 2;
    pub const INVAL_ENTRY: i32 = 3;
    pub const STORE: i32 = 4;
}

/// Reads little-endian fields off a byte slice, front to back.
#[derive(Clone, Copy)]
pub struct Fields<'a>(pub &'a [u8]);

impl<'a> Fields<'a> {
    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    /// The next `u32`.
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }
    /// The next `u64`.
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
    /// The next `i32`.
    pub fn i32(&mut self) -> Option<i32> {
        Some(self.u32()? as i32)
    }
    /// The next NUL-terminated string, without its NUL.
    pub fn cstr(&mut self) -> Option<&'a [u8]> {
        let n = self.0.iter().position(|&b| b == 0)?;
        let s = &self.0[..n];
        self.0 = &self.0[n + 1..];
        Some(s)
    }
    /// What is left.
    pub fn rest(self) -> &'a [u8] {
        self.0
    }
}

/// Writes little-endian fields into a fixed-size buffer.
pub struct Put<const N: usize> {
    buf: [u8; N],
    at: usize,
}

impl<const N: usize> Default for Put<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Put<N> {
    /// An empty buffer of `N` bytes (all zero).
    pub fn new() -> Self {
        Put { buf: [0; N], at: 0 }
    }
    /// Appends a `u64`.
    pub fn u64(mut self, v: u64) -> Self {
        self.buf[self.at..self.at + 8].copy_from_slice(&v.to_le_bytes());
        self.at += 8;
        self
    }
    /// Appends a `u32`.
    pub fn u32(mut self, v: u32) -> Self {
        self.buf[self.at..self.at + 4].copy_from_slice(&v.to_le_bytes());
        self.at += 4;
        self
    }
    /// Appends a `u16`.
    pub fn u16(mut self, v: u16) -> Self {
        self.buf[self.at..self.at + 2].copy_from_slice(&v.to_le_bytes());
        self.at += 2;
        self
    }
    /// Appends raw bytes.
    pub fn raw(mut self, v: &[u8]) -> Self {
        self.buf[self.at..self.at + v.len()].copy_from_slice(v);
        self.at += v.len();
        self
    }
    /// Skips `n` zero bytes.
    pub fn skip(mut self, n: usize) -> Self {
        self.at += n;
        self
    }
    /// The whole buffer.
    pub fn done(self) -> [u8; N] {
        debug_assert_eq!(self.at, N, "a structure encoded short");
        self.buf
    }
}

/// The kind of an inode, as `st_mode`'s type bits say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    /// `S_IFIFO`
    NamedPipe,
    /// `S_IFCHR`
    CharDevice,
    /// `S_IFBLK`
    BlockDevice,
    /// `S_IFDIR`
    Directory,
    /// `S_IFREG`
    RegularFile,
    /// `S_IFLNK`
    Symlink,
    /// `S_IFSOCK`
    Socket,
}

impl FileType {
    /// The `S_IFMT` bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::NamedPipe => libc::S_IFIFO,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::Directory => libc::S_IFDIR,
            FileType::RegularFile => libc::S_IFREG,
            FileType::Symlink => libc::S_IFLNK,
            FileType::Socket => libc::S_IFSOCK,
        }
    }
    /// The `d_type` of a directory entry.
    pub fn dtype(self) -> u32 {
        self.mode_bits() >> 12
    }
}

/// The attributes of an inode as the kernel takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileAttr {
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Last access.
    pub atime: SystemTime,
    /// Last data change.
    pub mtime: SystemTime,
    /// Last status change.
    pub ctime: SystemTime,
    /// Kind of inode.
    pub kind: FileType,
    /// Permission bits (with set-ID and sticky bits).
    pub perm: u16,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a device node.
    pub rdev: u32,
    /// Preferred I/O size.
    pub blksize: u32,
    /// Creation, if known (only a STATX reply carries it).
    pub btime: Option<SystemTime>,
}

/// Seconds and nanoseconds of a time, as `fuse_attr` keeps them (before the epoch: a
/// negative second count and a positive nanosecond part).
fn secs_nsecs(t: SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                ((-s) as u64, 0)
            } else {
                ((-s - 1) as u64, 1_000_000_000 - n)
            }
        }
    }
}

/// `struct fuse_attr` (88 bytes).
pub fn attr_bytes(a: &FileAttr) -> [u8; 88] {
    let (at, atn) = secs_nsecs(a.atime);
    let (mt, mtn) = secs_nsecs(a.mtime);
    let (ct, ctn) = secs_nsecs(a.ctime);
    Put::<88>::new()
        .u64(a.ino)
        .u64(a.size)
        .u64(a.blocks)
        .u64(at)
        .u64(mt)
        .u64(ct)
        .u32(atn)
        .u32(mtn)
        .u32(ctn)
        .u32(a.kind.mode_bits() | u32::from(a.perm))
        .u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u32(a.rdev)
        .u32(a.blksize)
        .u32(0)
        .done()
}

/// A timeout as `fuse_entry_out`/`fuse_attr_out` keep it.
fn valid(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

/// `struct fuse_entry_out` (128 bytes).
pub fn entry_out(
    nodeid: u64,
    generation: u64,
    entry_ttl: Duration,
    attr_ttl: Duration,
    attr: &FileAttr,
) -> [u8; 128] {
    let (es, en) = valid(entry_ttl);
    let (as_, an) = valid(attr_ttl);
    Put::<128>::new()
        .u64(nodeid)
        .u64(generation)
        .u64(es)
        .u64(as_)
        .u32(en)
        .u32(an)
        .raw(&attr_bytes(attr))
        .done()
}

/// `struct fuse_attr_out` (104 bytes).
pub fn attr_out(ttl: Duration, attr: &FileAttr) -> [u8; 104] {
    let (s, n) = valid(ttl);
    Put::<104>::new()
        .u64(s)
        .u32(n)
        .u32(0)
        .raw(&attr_bytes(attr))
        .done()
}

/// `struct fuse_statx_out` (288 bytes): a `fuse_statx` after the attributes' timeout,
/// with the birth time where known.
pub fn statx_out(ttl: Duration, a: &FileAttr) -> [u8; 288] {
    const BASIC: u32 = libc::STATX_BASIC_STATS;
    let (s, n) = valid(ttl);
    let time = |p: Put<288>, t: SystemTime| {
        let (s, n) = secs_nsecs(t);
        p.u64(s).u32(n).u32(0)
    };
    let mask = if a.btime.is_some() {
        BASIC | libc::STATX_BTIME
    } else {
        BASIC
    };
    // `new_decode_dev` of the 32-bit number `fuse_attr` carries.
    let (major, minor) = (
        (a.rdev & 0xfff00) >> 8,
        (a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00),
    );
    let p = Put::<288>::new()
        .u64(s)
        .u32(n)
        .u32(0)
        .u64(0)
        .u64(0)
        .u32(mask)
        .u32(a.blksize)
        .u64(0)
        .u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u16((a.kind.mode_bits() | u32::from(a.perm)) as u16)
        .u16(0)
        .u64(a.ino)
        .u64(a.size)
        .u64(a.blocks)
        .u64(0);
    let p = time(p, a.atime);
    let p = time(p, a.btime.unwrap_or(UNIX_EPOCH));
    let p = time(p, a.ctime);
    let p = time(p, a.mtime);
    // The file system's device numbers (the kernel knows them) and the spare space:
    // zero.
    p.u32(major).u32(minor).raw(&[0; 120]).done()
}

/// `struct fuse_open_out` (16 bytes).
pub fn open_out(fh: u64, open_flags: u32) -> [u8; 16] {
    Put::<16>::new().u64(fh).u32(open_flags).u32(0).done()
}

/// `struct fuse_out_header` (16 bytes) of a message whose body is `body_len` bytes:
/// a reply to request `unique` with `error` (0 or a negative errno), or a
/// notification (`unique` 0, `error` the notification code).
pub fn out_header(body_len: usize, error: i32, unique: u64) -> [u8; OUT_HEADER_LEN] {
    Put::<16>::new()
        .u32((OUT_HEADER_LEN + body_len) as u32)
        .u32(error as u32)
        .u64(unique)
        .done()
}

/// `struct fuse_write_out` (8 bytes).
pub fn write_out(size: u32) -> [u8; 8] {
    Put::<8>::new().u32(size).u32(0).done()
}

/// `struct fuse_ioctl_out` (16 bytes) of an ioctl that returns `result` (no retry,
/// no iovecs: lode serves only ioctls whose argument the kernel passes whole).
pub fn ioctl_out(result: i32) -> [u8; 16] {
    Put::<16>::new()
        .u32(result as u32)
        .u32(0)
        .u32(0)
        .u32(0)
        .done()
}

/// `struct fuse_lseek_out` (8 bytes): where the file position goes.
pub fn lseek_out(offset: u64) -> [u8; 8] {
    Put::<8>::new().u64(offset).done()
}

/// `struct fuse_getxattr_out` (8 bytes): the size a value or list needs.
pub fn xattr_size_out(size: u32) -> [u8; 8] {
    Put::<8>::new().u32(size).u32(0).done()
}

/// `struct fuse_statfs_out` (80 bytes).
#[allow(clippy::too_many_arguments)]
pub fn statfs_out(
    blocks: u64,
    bfree: u64,
    bavail: u64,
    files: u64,
    ffree: u64,
    bsize: u32,
    namelen: u32,
    frsize: u32,
) -> [u8; 80] {
    Put::<80>::new()
        .u64(blocks)
        .u64(bfree)
        .u64(bavail)
        .u64(files)
        .u64(ffree)
        .u32(bsize)
        .u32(namelen)
        .u32(frsize)
        .skip(4 + 24)
        .done()
}

/// `struct fuse_lk_out` (24 bytes).
pub fn lk_out(start: u64, end: u64, typ: i32, pid: u32) -> [u8; 24] {
    Put::<24>::new()
        .u64(start)
        .u64(end)
        .u32(typ as u32)
        .u32(pid)
        .done()
}

/// `struct fuse_init_out` (64 bytes).
pub struct InitOut {
    /// Minor version spoken.
    pub minor: u32,
    /// Largest readahead.
    pub max_readahead: u32,
    /// Flags taken (both words).
    pub flags: u64,
    /// Background requests in flight.
    pub max_background: u16,
    /// Background requests before the kernel calls the file system congested.
    pub congestion_threshold: u16,
    /// Largest write.
    pub max_write: u32,
    /// Time granularity in nanoseconds.
    pub time_gran: u32,
    /// Pages per request.
    pub max_pages: u16,
}

impl InitOut {
    /// The reply body.
    pub fn bytes(&self) -> [u8; 64] {
        Put::<64>::new()
            .u32(KERNEL_VERSION)
            .u32(self.minor)
            .u32(self.max_readahead)
            .u32(self.flags as u32)
            .u16(self.max_background)
            .u16(self.congestion_threshold)
            .u32(self.max_write)
            .u32(self.time_gran)
            .u16(self.max_pages)
            .u16(0)
            .u32((self.flags >> 32) as u32)
            .skip(28)
            .done()
    }
}

/// The length of a `fuse_dirent` (24 bytes and the name, padded to 8).
pub fn dirent_len(name_len: usize) -> usize {
    (24 + name_len).next_multiple_of(8)
}

/// Appends a `fuse_dirent` to `buf`.
pub fn push_dirent(buf: &mut Vec<u8>, ino: u64, off: u64, dtype: u32, name: &[u8]) {
    let start = buf.len();
    buf.extend_from_slice(&ino.to_le_bytes());
    buf.extend_from_slice(&off.to_le_bytes());
    buf.extend_from_slice(&(name.len() as u32).to_le_bytes());
    buf.extend_from_slice(&dtype.to_le_bytes());
    buf.extend_from_slice(name);
    buf.resize(start + dirent_len(name.len()), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr() -> FileAttr {
        FileAttr {
            ino: 7,
            size: 4096,
            blocks: 8,
            atime: UNIX_EPOCH + Duration::new(1_700_000_000, 5),
            mtime: UNIX_EPOCH + Duration::new(1_700_000_001, 6),
            ctime: UNIX_EPOCH - Duration::new(1, 250_000_000),
            kind: FileType::Directory,
            perm: 0o1755,
            nlink: 2,
            uid: 1000,
            gid: 100,
            rdev: 0,
            blksize: 4096,
            btime: None,
        }
    }

    #[test]
    fn fuse_attr_has_the_kernels_layout() {
        let b = attr_bytes(&attr());
        let mut f = Fields(&b);
        assert_eq!(f.u64(), Some(7));
        assert_eq!(f.u64(), Some(4096));
        assert_eq!(f.u64(), Some(8));
        assert_eq!(f.u64(), Some(1_700_000_000));
        assert_eq!(f.u64(), Some(1_700_000_001));
        // 1.25 s before the epoch: -2 s + 0.75 s.
        assert_eq!(f.u64(), Some((-2i64) as u64));
        assert_eq!(f.u32(), Some(5));
        assert_eq!(f.u32(), Some(6));
        assert_eq!(f.u32(), Some(750_000_000));
        assert_eq!(f.u32(), Some(libc::S_IFDIR | 0o1755));
        assert_eq!(f.u32(), Some(2));
        assert_eq!(f.u32(), Some(1000));
        assert_eq!(f.u32(), Some(100));
        assert_eq!(f.u32(), Some(0));
        assert_eq!(f.u32(), Some(4096));
        assert_eq!(f.u32(), Some(0));
        assert!(f.rest().is_empty());
    }

    #[test]
    fn entry_and_attr_replies_carry_their_timeouts() {
        let e = entry_out(9, 0, Duration::new(3, 4), Duration::new(5, 6), &attr());
        let mut f = Fields(&e);
        assert_eq!(
            (f.u64(), f.u64(), f.u64(), f.u64(), f.u32(), f.u32()),
            (Some(9), Some(0), Some(3), Some(5), Some(4), Some(6))
        );
        assert_eq!(f.rest(), &attr_bytes(&attr()));
        let a = attr_out(Duration::new(1, 2), &attr());
        assert_eq!(&a[..16], &Put::<16>::new().u64(1).u32(2).u32(0).done());
    }

    #[test]
    fn fuse_statx_has_the_kernels_layout() {
        let mut a = attr();
        a.kind = FileType::CharDevice;
        a.rdev = (4 << 8) | 65 | (0x123 << 20); // major 4, minor 65 + (0x123 << 8)
        a.btime = Some(UNIX_EPOCH + Duration::new(1_600_000_000, 7));
        let b = statx_out(Duration::new(1, 2), &a);
        let mut f = Fields(&b);
        assert_eq!((f.u64(), f.u32(), f.u32()), (Some(1), Some(2), Some(0)));
        assert_eq!((f.u64(), f.u64()), (Some(0), Some(0)));
        let mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
        assert_eq!(
            (f.u32(), f.u32(), f.u64()),
            (Some(mask), Some(4096), Some(0))
        );
        assert_eq!(
            (f.u32(), f.u32(), f.u32()),
            (Some(2), Some(1000), Some(100))
        );
        let mode = f.u32().unwrap();
        assert_eq!(mode & 0xffff, libc::S_IFCHR | 0o1755);
        assert_eq!(
            (f.u64(), f.u64(), f.u64(), f.u64()),
            (Some(7), Some(4096), Some(8), Some(0))
        );
        let mut time = || (f.u64(), f.u32(), f.u32());
        assert_eq!(time(), (Some(1_700_000_000), Some(5), Some(0)), "atime");
        assert_eq!(time(), (Some(1_600_000_000), Some(7), Some(0)), "btime");
        assert_eq!(
            time(),
            (Some((-2i64) as u64), Some(750_000_000), Some(0)),
            "ctime"
        );
        assert_eq!(time(), (Some(1_700_000_001), Some(6), Some(0)), "mtime");
        assert_eq!((f.u32(), f.u32()), (Some(4), Some(65 | (0x123 << 8))));
        assert!(f.rest().iter().all(|&x| x == 0));
        assert_eq!(f.rest().len(), 120);
        // No birth time known: the mask says so.
        a.btime = None;
        assert_eq!(
            Fields(&statx_out(Duration::ZERO, &a)[32..]).u32(),
            Some(libc::STATX_BASIC_STATS)
        );
    }

    #[test]
    fn dirents_are_padded_to_eight_bytes() {
        let mut b = Vec::new();
        push_dirent(&mut b, 1, 2, 4, b"abc");
        assert_eq!(b.len(), 32);
        push_dirent(&mut b, 1, 2, 4, b"abcdefgh");
        assert_eq!(b.len(), 32 + 32);
        assert_eq!(dirent_len(0), 24);
        assert_eq!(&b[24..27], b"abc");
        assert!(b[27..32].iter().all(|&x| x == 0));
    }

    #[test]
    fn init_out_puts_the_high_flags_in_flags2() {
        let o = InitOut {
            minor: 45,
            max_readahead: 1 << 20,
            flags: init::OVER_IO_URING | init::INIT_EXT | init::ASYNC_READ,
            max_background: 16,
            congestion_threshold: 12,
            max_write: 1 << 20,
            time_gran: 1,
            max_pages: 256,
        }
        .bytes();
        let mut f = Fields(&o);
        assert_eq!(f.u32(), Some(7));
        assert_eq!(f.u32(), Some(45));
        assert_eq!(f.u32(), Some(1 << 20));
        assert_eq!(f.u32(), Some((1 << 30) | 1));
        f.bytes(16);
        assert_eq!(f.u32(), Some(1 << 9));
    }

    #[test]
    fn fields_refuse_to_read_past_the_end() {
        let mut f = Fields(&[1, 0, 0]);
        assert_eq!(f.u32(), None);
        let mut f = Fields(b"ab\0cd");
        assert_eq!(f.cstr(), Some(&b"ab"[..]));
        assert_eq!(f.cstr(), None);
    }
}
