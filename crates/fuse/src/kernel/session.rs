//! A FUSE session: the INIT handshake, the file system's operations, the threads that
//! take the kernel's requests (over `/dev/fuse`, or over io_uring when the kernel
//! offers it), and the notifications the file system sends the kernel.

use super::abi::{self, init, op, Fields, IN_HEADER_LEN};
use super::mount::{Mount, MountOption};
use super::op::{parse, LkIn, Op, Request, SetattrIn};
use super::reply::*;
use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The largest write (and read) the kernel sends in one request.
pub const MAX_WRITE: u32 = 1 << 20;
/// Pages per request (`MAX_WRITE` in 4 KiB pages).
const MAX_PAGES: u16 = (MAX_WRITE / 4096) as u16;
/// A `/dev/fuse` read buffer: the largest request (a write of `MAX_WRITE` and its
/// headers).
pub const BUF_LEN: usize = MAX_WRITE as usize + 4096;

/// The operations of a file system, as the kernel asks for them. Every method answers
/// through its reply object, at once or later from any thread; the default answers
/// `ENOSYS`.
#[allow(unused_variables, clippy::too_many_arguments)]
pub trait Filesystem: Send + Sync + 'static {
    /// The session ends (the file system was unmounted).
    fn destroy(&self) {}
    /// Looks a name up.
    fn lookup(&self, req: &Request, parent: INodeNo, name: &[u8], reply: ReplyEntry) {
        reply.error(libc::ENOSYS);
    }
    /// The kernel dropped `nlookup` references to an inode.
    fn forget(&self, ino: INodeNo, nlookup: u64) {}
    /// Attributes.
    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.error(libc::ENOSYS);
    }
    /// Changes attributes.
    fn setattr(&self, req: &Request, ino: INodeNo, set: SetattrIn, reply: ReplyAttr) {
        reply.error(libc::ENOSYS);
    }
    /// A symlink's target.
    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        reply.error(libc::ENOSYS);
    }
    /// Makes a node.
    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Makes a directory.
    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &[u8],
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Removes a name.
    fn unlink(&self, req: &Request, parent: INodeNo, name: &[u8], reply: ReplyEmpty) {
        reply.error(libc::ENOSYS);
    }
    /// Removes a directory.
    fn rmdir(&self, req: &Request, parent: INodeNo, name: &[u8], reply: ReplyEmpty) {
        reply.error(libc::ENOSYS);
    }
    /// Makes a symbolic link.
    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &[u8],
        target: &[u8],
        reply: ReplyEntry,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Renames (`flags`: `RENAME_NOREPLACE`, `RENAME_EXCHANGE`, `RENAME_WHITEOUT`).
    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &[u8],
        newparent: INodeNo,
        newname: &[u8],
        flags: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Makes a hard link.
    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &[u8],
        reply: ReplyEntry,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Opens a file.
    fn open(&self, req: &Request, ino: INodeNo, flags: i32, reply: ReplyOpen) {
        reply.error(libc::ENOSYS);
    }
    /// Makes and opens a file.
    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Makes and opens a file with no name (`O_TMPFILE`) in directory `parent`.
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Reads.
    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        reply: ReplyData,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Writes; `kill_suidgid`: the writer lacks CAP_FSETID, so the file's set-user-ID
    /// bit, and its set-group-ID bit if group-executable, go (`FUSE_HANDLE_KILLPRIV_V2`).
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
        reply: ReplyWrite,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// A descriptor of an open file was closed by the process owning `lock_owner`.
    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: u64,
        reply: ReplyEmpty,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// The last descriptor of an open file was closed (`lock_owner`: its flock locks end).
    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: i32,
        lock_owner: Option<u64>,
        flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }
    /// Makes a file's data durable.
    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Opens a directory.
    fn opendir(&self, req: &Request, ino: INodeNo, flags: i32, reply: ReplyOpen) {
        reply.error(libc::ENOSYS);
    }
    /// Lists a directory from `offset`.
    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Lists a directory from `offset`, with attributes.
    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Closes a directory.
    fn releasedir(&self, req: &Request, ino: INodeNo, fh: FileHandle, reply: ReplyEmpty) {
        reply.ok();
    }
    /// Makes a directory durable.
    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// File system statistics.
    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, 512, 255, 0);
    }
    /// Sets an xattr.
    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &[u8],
        value: &[u8],
        flags: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// Reads an xattr (`size` 0: its size).
    fn getxattr(&self, req: &Request, ino: INodeNo, name: &[u8], size: u32, reply: ReplyXattr) {
        reply.error(libc::ENOSYS);
    }
    /// Lists xattr names (`size` 0: the list's size).
    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply.error(libc::ENOSYS);
    }
    /// Removes an xattr.
    fn removexattr(&self, req: &Request, ino: INodeNo, name: &[u8], reply: ReplyEmpty) {
        reply.error(libc::ENOSYS);
    }
    /// Checks access (`mask`: `R_OK`, `W_OK`, `X_OK`).
    fn access(&self, req: &Request, ino: INodeNo, mask: u32, reply: ReplyEmpty) {
        reply.error(libc::ENOSYS);
    }
    /// Tests for a conflicting lock.
    fn getlk(&self, req: &Request, ino: INodeNo, lk: LkIn, reply: ReplyLock) {
        reply.error(libc::ENOSYS);
    }
    /// Takes or drops a lock (`sleep`: wait for it).
    fn setlk(&self, req: &Request, ino: INodeNo, lk: LkIn, sleep: bool, reply: ReplyEmpty) {
        reply.error(libc::ENOSYS);
    }
    /// An ioctl: `data` is its argument's bytes passed in; the answer carries
    /// `out_size` bytes back.
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        cmd: u32,
        data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(libc::ENOTTY);
    }
    /// Preallocates or punches.
    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(libc::ENOSYS);
    }
    /// The attributes with the birth time (`reply` answers with a `fuse_statx_out`):
    /// the kernel asks only when a caller wants what GETATTR lacks. ENOSYS makes it
    /// answer every later one itself, without a birth time.
    fn statx(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.error(libc::ENOSYS);
    }
    /// `SEEK_DATA` (3) or `SEEK_HOLE` (4) from `offset`. ENOSYS makes the kernel
    /// answer every later one itself (all data up to the size).
    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        whence: u32,
        reply: ReplyLseek,
    ) {
        reply.error(libc::ENOSYS);
    }
}

/// What the file system asks of the kernel at INIT.
#[derive(Clone, Debug)]
pub struct Config {
    /// `FUSE_INIT` flags wanted (those the kernel lacks are left out).
    pub flags: u64,
    /// Threads taking requests.
    pub threads: usize,
    /// Take requests over io_uring when the kernel offers it
    /// (`/sys/module/fuse/parameters/enable_uring`).
    pub io_uring: bool,
    /// Largest readahead.
    pub max_readahead: u32,
}

/// Dispatches one request (header `req`, the opcode's fixed header `h`, the rest `p`)
/// to `fs`; the reply goes to `sink`.
pub fn dispatch<FS: Filesystem>(fs: &FS, req: &Request, h: &[u8], p: &[u8], sink: Arc<dyn Sink>) {
    let raw = || ReplyRaw::new(req.unique, sink.clone());
    let Some(o) = parse(req.opcode, h, p) else {
        tracing::warn!(opcode = req.opcode, "malformed FUSE request");
        raw().error(libc::EIO);
        return;
    };
    let ino = INodeNo(req.nodeid);
    match o {
        Op::Lookup { name } => fs.lookup(req, ino, name, ReplyEntry(raw())),
        Op::Forget { nlookup } => fs.forget(ino, nlookup),
        Op::BatchForget { forgets } => {
            for (n, k) in forgets {
                fs.forget(INodeNo(n), k);
            }
        }
        Op::Getattr { fh } => fs.getattr(req, ino, fh.map(FileHandle), ReplyAttr(raw(), false)),
        Op::Statx { fh } => fs.statx(req, ino, fh.map(FileHandle), ReplyAttr(raw(), true)),
        Op::Setattr(s) => fs.setattr(req, ino, s, ReplyAttr(raw(), false)),
        Op::Readlink => fs.readlink(req, ino, ReplyData(raw())),
        Op::Symlink { name, target } => fs.symlink(req, ino, name, target, ReplyEntry(raw())),
        Op::Mknod {
            name,
            mode,
            rdev,
            umask,
        } => fs.mknod(req, ino, name, mode, umask, rdev, ReplyEntry(raw())),
        Op::Mkdir { name, mode, umask } => fs.mkdir(req, ino, name, mode, umask, ReplyEntry(raw())),
        Op::Unlink { name } => fs.unlink(req, ino, name, ReplyEmpty(raw())),
        Op::Rmdir { name } => fs.rmdir(req, ino, name, ReplyEmpty(raw())),
        Op::Rename {
            name,
            newdir,
            newname,
            flags,
        } => fs.rename(
            req,
            ino,
            name,
            INodeNo(newdir),
            newname,
            flags,
            ReplyEmpty(raw()),
        ),
        Op::Link { oldnodeid, newname } => {
            fs.link(req, INodeNo(oldnodeid), ino, newname, ReplyEntry(raw()))
        }
        Op::Open { flags } => fs.open(req, ino, flags, ReplyOpen(raw())),
        Op::Read { fh, offset, size } => {
            fs.read(req, ino, FileHandle(fh), offset, size, ReplyData(raw()))
        }
        Op::Write {
            fh,
            offset,
            data,
            kill_suidgid,
        } => fs.write(
            req,
            ino,
            FileHandle(fh),
            offset,
            data,
            kill_suidgid,
            ReplyWrite(raw()),
        ),
        Op::Statfs => fs.statfs(req, ino, ReplyStatfs(raw())),
        Op::Release {
            fh,
            flags,
            lock_owner,
            flush,
        } => fs.release(
            req,
            ino,
            FileHandle(fh),
            flags,
            lock_owner,
            flush,
            ReplyEmpty(raw()),
        ),
        Op::Fsync { fh, datasync } => {
            fs.fsync(req, ino, FileHandle(fh), datasync, ReplyEmpty(raw()))
        }
        Op::Setxattr { name, value, flags } => {
            fs.setxattr(req, ino, name, value, flags, ReplyEmpty(raw()))
        }
        Op::Getxattr { name, size } => fs.getxattr(req, ino, name, size, ReplyXattr(raw())),
        Op::Listxattr { size } => fs.listxattr(req, ino, size, ReplyXattr(raw())),
        Op::Removexattr { name } => fs.removexattr(req, ino, name, ReplyEmpty(raw())),
        Op::Flush { fh, lock_owner } => {
            fs.flush(req, ino, FileHandle(fh), lock_owner, ReplyEmpty(raw()))
        }
        Op::Opendir { flags } => fs.opendir(req, ino, flags, ReplyOpen(raw())),
        Op::Readdir { fh, offset, size } => fs.readdir(
            req,
            ino,
            FileHandle(fh),
            offset,
            ReplyDirectory::new(raw(), size as usize),
        ),
        Op::Readdirplus { fh, offset, size } => fs.readdirplus(
            req,
            ino,
            FileHandle(fh),
            offset,
            ReplyDirectoryPlus::new(raw(), size as usize),
        ),
        Op::Releasedir { fh } => fs.releasedir(req, ino, FileHandle(fh), ReplyEmpty(raw())),
        Op::Fsyncdir { fh, datasync } => {
            fs.fsyncdir(req, ino, FileHandle(fh), datasync, ReplyEmpty(raw()))
        }
        Op::Getlk(lk) => fs.getlk(req, ino, lk, ReplyLock(raw())),
        Op::Setlk { lk, sleep } => fs.setlk(req, ino, lk, sleep, ReplyEmpty(raw())),
        Op::Access { mask } => fs.access(req, ino, mask, ReplyEmpty(raw())),
        Op::Create {
            name,
            flags,
            mode,
            umask,
        } => fs.create(req, ino, name, mode, umask, flags, ReplyCreate(raw())),
        Op::Tmpfile { flags, mode, umask } => {
            fs.tmpfile(req, ino, mode, umask, flags, ReplyCreate(raw()))
        }
        // The file system's waits watch their callers' signals themselves (an
        // interrupted request is still answered, EINTR or not).
        Op::Interrupt => {}
        Op::Destroy => raw().ok(&[]),
        Op::Ioctl {
            cmd,
            data,
            out_size,
        } => fs.ioctl(req, ino, cmd, data, out_size, ReplyIoctl(raw())),
        Op::Fallocate {
            fh,
            offset,
            length,
            mode,
        } => fs.fallocate(
            req,
            ino,
            FileHandle(fh),
            offset,
            length,
            mode,
            ReplyEmpty(raw()),
        ),
        Op::Lseek { fh, offset, whence } => {
            fs.lseek(req, ino, FileHandle(fh), offset, whence, ReplyLseek(raw()))
        }
        Op::Unsupported => raw().error(libc::ENOSYS),
    }
}

/// Threads that take the same requests (one ring queue's, or the `/dev/fuse`
/// readers), and how many of them run one now.
pub(crate) struct Group {
    busy: AtomicUsize,
    size: AtomicUsize,
}

impl Group {
    pub(crate) fn new(size: usize) -> Arc<Group> {
        Arc::new(Group {
            busy: AtomicUsize::new(0),
            size: AtomicUsize::new(size),
        })
    }

    /// One more thread; returns how many there were.
    pub(crate) fn grow(&self) -> usize {
        self.size.fetch_add(1, Ordering::AcqRel)
    }

    /// One thread fewer (it could not start).
    pub(crate) fn shrink(&self) {
        self.size.fetch_sub(1, Ordering::AcqRel);
    }

    /// The group's threads.
    pub(crate) fn size(&self) -> usize {
        self.size.load(Ordering::Acquire)
    }

    /// A thread takes a request; true if no other is free now.
    pub(crate) fn take(&self) -> bool {
        self.busy.fetch_add(1, Ordering::AcqRel) + 1 >= self.size()
    }

    /// A thread is done with its request.
    pub(crate) fn done(&self) {
        self.busy.fetch_sub(1, Ordering::AcqRel);
    }

    /// Runs `f` as one of the group's requests.
    pub(crate) fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        self.take();
        let r = f();
        self.done();
        r
    }
}

std::thread_local! {
    static GROUP: RefCell<Option<Arc<Group>>> = const { RefCell::new(None) };
}

/// Makes the calling thread one of `g`'s.
pub(crate) fn join_group(g: Arc<Group>) {
    GROUP.with(|x| *x.borrow_mut() = Some(g));
}

/// Whether, while this thread runs a request, another thread is free to take the next
/// one that could come to it: a request that waits on the kernel (which may wait on
/// another request, as storing pages waits for a READ that holds one) must not take
/// the last. False off the FUSE threads.
pub fn peer_free() -> bool {
    GROUP.with(|g| {
        g.borrow()
            .as_ref()
            .is_some_and(|g| g.busy.load(Ordering::Acquire) < g.size())
    })
}

/// Whether an opcode is answered at all (FORGET, BATCH_FORGET and INTERRUPT are not).
pub fn expects_reply(opcode: u32) -> bool {
    !matches!(opcode, op::FORGET | op::BATCH_FORGET | op::INTERRUPT)
}

/// A `/dev/fuse` descriptor of the connection.
pub struct Dev(pub OwnedFd);

impl Dev {
    /// Writes one message (a reply or a notification) in one `writev`.
    pub fn write(&self, parts: &[&[u8]]) -> io::Result<()> {
        let iov: Vec<libc::iovec> = parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            })
            .collect();
        loop {
            // SAFETY: the iovecs point into `parts`, alive for the call.
            let n = unsafe { libc::writev(self.0.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
            if n >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Reads one request into `buf`; `Ok(None)` once the file system is unmounted.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: buf is valid for writes of its length.
            let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(Some(n as usize));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // ENOENT: the request was interrupted before it was read.
                Some(libc::ENOENT) | Some(libc::EINTR) | Some(libc::EAGAIN) => continue,
                Some(libc::ENODEV) => return Ok(None),
                _ => return Err(e),
            }
        }
    }

    /// A new descriptor of the same connection with its own request queue
    /// (`FUSE_DEV_IOC_CLONE`), so threads reading each their own do not wake each
    /// other.
    pub fn clone_fd(&self) -> io::Result<Dev> {
        // SAFETY: a constant C string; the descriptor returned is ours.
        let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened.
        let dev = Dev(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut src = self.0.as_raw_fd() as u32;
        // FUSE_DEV_IOC_CLONE = _IOR(229, 0, uint32_t)
        const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;
        // SAFETY: the ioctl reads one u32 from a valid pointer.
        if unsafe { libc::ioctl(fd, FUSE_DEV_IOC_CLONE, &mut src) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(dev)
    }
}

/// Replies written to the `/dev/fuse` descriptor the request was read from.
struct DevSink(Arc<Dev>);

impl Sink for DevSink {
    fn send(&self, unique: u64, error: i32, body: &[&[u8]]) {
        let len = if error == 0 {
            body.iter().map(|b| b.len()).sum()
        } else {
            0
        };
        let h = abi::out_header(len, error, unique);
        let mut parts = Vec::with_capacity(body.len() + 1);
        parts.push(&h[..]);
        if error == 0 {
            parts.extend_from_slice(body);
        }
        if let Err(e) = self.0.write(&parts) {
            // ENOENT: the request was interrupted and is gone; ENODEV: unmounted.
            if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENODEV)) {
                tracing::warn!(unique, "writing a FUSE reply: {e}");
            }
        }
    }
}

/// Sends the kernel notifications: forget a name, an inode's attributes or pages;
/// take data into an inode's pages.
#[derive(Clone)]
pub struct Notifier(Arc<Dev>);

impl Notifier {
    fn notify(&self, code: i32, parts: &[&[u8]]) -> io::Result<()> {
        let len = parts.iter().map(|p| p.len()).sum();
        let h = abi::out_header(len, code, 0);
        let mut all = vec![&h[..]];
        all.extend_from_slice(parts);
        self.0.write(&all)
    }

    /// The kernel forgets an inode's attributes and its pages from `off` for `len`
    /// bytes (`len` 0: to the end; `off` -1: attributes only).
    pub fn inval_inode(&self, ino: INodeNo, off: i64, len: i64) -> io::Result<()> {
        let b = abi::Put::<24>::new()
            .u64(ino.0)
            .u64(off as u64)
            .u64(len as u64)
            .done();
        self.notify(abi::notify::INVAL_INODE, &[&b])
    }

    /// The kernel forgets name `name` in directory `parent`.
    pub fn inval_entry(&self, parent: INodeNo, name: &[u8]) -> io::Result<()> {
        let b = abi::Put::<16>::new()
            .u64(parent.0)
            .u32(name.len() as u32)
            .u32(0)
            .done();
        self.notify(abi::notify::INVAL_ENTRY, &[&b, name, b"\0"])
    }

    /// The kernel takes `data` into inode `ino`'s pages at `offset`.
    pub fn store(&self, ino: INodeNo, offset: u64, data: &[u8]) -> io::Result<()> {
        let b = abi::Put::<24>::new()
            .u64(ino.0)
            .u64(offset)
            .u32(data.len() as u32)
            .u32(0)
            .done();
        self.notify(abi::notify::STORE, &[&b, data])
    }
}

/// A mounted FUSE file system, past INIT.
pub struct Session<FS: Filesystem> {
    fs: Arc<FS>,
    dev: Arc<Dev>,
    mount: Mount,
    config: Config,
    /// The kernel took requests over io_uring at INIT.
    uring: bool,
}

impl<FS: Filesystem> Session<FS> {
    /// Mounts `fs` on `mountpoint` and answers the kernel's INIT.
    pub fn new(
        fs: FS,
        mountpoint: &Path,
        options: &[MountOption],
        config: Config,
    ) -> io::Result<Session<FS>> {
        let (fd, mount) = Mount::new(mountpoint, options)?;
        let dev = Arc::new(Dev(fd));
        let uring = match handshake(&dev, &config) {
            Ok(u) => u,
            Err(e) => {
                let _ = mount.unmount();
                return Err(e);
            }
        };
        Ok(Session {
            fs: Arc::new(fs),
            dev,
            mount,
            config,
            uring,
        })
    }

    /// Whether requests come over io_uring.
    pub fn io_uring(&self) -> bool {
        self.uring
    }

    /// The session's notifier.
    pub fn notifier(&self) -> Notifier {
        Notifier(self.dev.clone())
    }

    /// Takes requests until the file system is unmounted, then calls `destroy`.
    pub fn run(self) -> io::Result<()> {
        let Session {
            fs,
            dev,
            mount,
            config,
            uring,
        } = self;
        let mut threads = Vec::new();
        let mut result = Ok(());
        let mut ring_threads = None;
        if uring {
            match super::uring::start(
                fs.clone(),
                dev.clone(),
                mount.mountpoint.clone(),
                config.threads,
            ) {
                Ok(t) => ring_threads = Some(t),
                // Unmounted before every queue had its entry (`lode down` at once
                // after `lode up`): the session's end, not a failure; the readers
                // below find the connection gone and stop.
                Err(e) if e.kind() == io::ErrorKind::NotConnected => {}
                Err(e) => {
                    // The kernel holds every request until the ring is ready: without
                    // one, nothing can be served.
                    let _ = mount.unmount();
                    result = Err(e);
                }
            }
        }
        // /dev/fuse readers: all requests without io_uring; FORGETs and INTERRUPTs
        // with it (and what the kernel queued before the ring was ready).
        let readers = if uring { 1 } else { config.threads.max(1) };
        let group = Group::new(readers);
        for i in 0..readers {
            let d = if i == 0 {
                dev.clone()
            } else {
                Arc::new(dev.clone_fd()?)
            };
            let (fs, group) = (fs.clone(), group.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("fuse-{i}"))
                    .spawn(move || {
                        join_group(group);
                        dev_loop(&*fs, d)
                    })?,
            );
        }
        // Ring threads are added while the session runs: joined until none is left.
        let more = || ring_threads.as_ref().and_then(|t| t.lock().pop());
        while let Some(t) = threads.pop().or_else(more) {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
                Err(_) => {
                    if result.is_ok() {
                        result = Err(io::Error::other("a FUSE thread panicked"));
                    }
                }
            }
        }
        fs.destroy();
        drop(mount);
        result
    }
}

/// Reads the kernel's INIT and answers it; true if requests then come over io_uring.
fn handshake(dev: &Dev, config: &Config) -> io::Result<bool> {
    let mut buf = vec![0u8; BUF_LEN];
    loop {
        let n = dev
            .read(&mut buf)?
            .ok_or_else(|| io::Error::other("unmounted during INIT"))?;
        let b = &buf[..n];
        let req = Request::parse(b).ok_or_else(|| io::Error::other("short FUSE request"))?;
        let reply = |error: i32, body: &[u8]| {
            dev.write(&[&abi::out_header(body.len(), error, req.unique), body])
        };
        if req.opcode != op::INIT {
            reply(-libc::EIO, &[])?;
            return Err(io::Error::other(format!(
                "FUSE request {} before INIT",
                req.opcode
            )));
        }
        let mut f = Fields(&b[IN_HEADER_LEN..]);
        let (major, minor) = (f.u32().unwrap_or_default(), f.u32().unwrap_or_default());
        let max_readahead = f.u32().unwrap_or_default();
        let mut kflags = u64::from(f.u32().unwrap_or_default());
        if kflags & init::INIT_EXT != 0 {
            kflags |= u64::from(f.u32().unwrap_or_default()) << 32;
        }
        if major > abi::KERNEL_VERSION {
            // The kernel asks again with our major version.
            let body = abi::Put::<8>::new()
                .u32(abi::KERNEL_VERSION)
                .u32(abi::KERNEL_MINOR_VERSION)
                .done();
            reply(0, &body)?;
            continue;
        }
        if major < abi::KERNEL_VERSION || minor < abi::MIN_MINOR_VERSION {
            reply(-libc::EPROTO, &[])?;
            return Err(io::Error::other(format!(
                "the kernel's FUSE protocol {major}.{minor} is older than 7.{}",
                abi::MIN_MINOR_VERSION
            )));
        }
        let mut want = config.flags | init::ASYNC_READ | init::BIG_WRITES | init::MAX_PAGES;
        if config.io_uring {
            want |= init::OVER_IO_URING;
        }
        let flags = (want & kflags) | init::INIT_EXT;
        let out = abi::InitOut {
            minor: minor.min(abi::KERNEL_MINOR_VERSION),
            max_readahead: config.max_readahead.min(max_readahead),
            flags,
            max_background: 16,
            congestion_threshold: 12,
            max_write: MAX_WRITE,
            time_gran: 1,
            max_pages: MAX_PAGES,
        };
        reply(0, &out.bytes())?;
        return Ok(flags & init::OVER_IO_URING != 0);
    }
}

/// A `/dev/fuse` reader: reads a request, runs it, and reads the next.
fn dev_loop<FS: Filesystem>(fs: &FS, dev: Arc<Dev>) -> io::Result<()> {
    let mut buf = vec![0u8; BUF_LEN];
    let sink: Arc<dyn Sink> = Arc::new(DevSink(dev.clone()));
    while let Some(n) = dev.read(&mut buf)? {
        let b = &buf[..n];
        let Some(req) = Request::parse(b) else {
            tracing::warn!(len = n, "short FUSE request");
            continue;
        };
        let body = &b[IN_HEADER_LEN..];
        let hl = abi::op_header_len(req.opcode).unwrap_or(0).min(body.len());
        let (h, p) = body.split_at(hl);
        GROUP.with(|g| match g.borrow().as_ref() {
            Some(g) => g.run(|| dispatch(fs, &req, h, p, sink.clone())),
            None => dispatch(fs, &req, h, p, sink.clone()),
        });
    }
    Ok(())
}
