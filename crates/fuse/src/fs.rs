//! The file system the kernel sees: [`kernel::Filesystem`](crate::kernel::Filesystem)
//! over the lode client.

use crate::attr::{file_attr, kind, ns};
use crate::caller::{caller, Caller};
use crate::cred::Groups;
use crate::kernel::abi::init;
use crate::kernel::{
    FileHandle as Fh, Filesystem, FopenFlags, Generation, INodeNo, LkIn, Notifier, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, SetattrIn,
    TimeOrNow,
};
use foldhash::{HashMap, HashMapExt};
use lode_base::acl;
use lode_base::perm::map_bits;
use lode_base::perm::{MAY_EXEC, MAY_READ, MAY_WRITE};
use lode_base::{Cred, Errno, Fid, SetAttr, TimeSet};
use lode_client::{Client, DirEntry, FileHandle, FlockArgs, Inval, MdtBody};
use parking_lot::{Mutex, RwLock};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// Open flags of regular files. FLUSH stays on (`FOPEN_NOFLUSH` would skip it): with
/// fcntl locks kept by the MDT, the FLUSH of each close(2) is how the kernel says a
/// process's record locks on the file end (POSIX: closing any descriptor of a file
/// drops the process's locks on it).
const FILE_OPEN_FLAGS: FopenFlags = FopenFlags::empty();

/// The kernel's page size, as far as which writes leave whole pages in its cache goes
/// (a larger one only makes fewer writes count as whole).
const PAGE_SIZE: usize = 4096;

/// How long the kernel may keep a name or attributes the client holds a lock on: until
/// the lock goes (then the client tells it to forget), so as long as the kernel allows.
const LOCKED_TTL: Duration = Duration::from_secs(86_400);

/// Virtual xattr answered by the client with the inode's FID (`lode path2fid`).
pub const FID_XATTR: &[u8] = b"lustre.fid";
/// The virtual xattr holding every target's statfs (see `Client::statfs_report`).
pub const STATFS_XATTR: &[u8] = b"lustre.statfs";
/// The prefix of the virtual xattr naming a FID (`lustre.fid2path.[0x..:0x..:0x..]`)
/// whose value is its paths, one per line (root only).
pub const FID2PATH_XATTR: &[u8] = b"lustre.fid2path.";
/// Setting this virtual xattr to a layout (the `lustre.lov` encoding) migrates the
/// file's data into it, online (`lode migrate`, through the mount's own client).
pub const MIGRATE_XATTR: &[u8] = b"lustre.migrate";

/// Mount settings.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// How long the kernel may cache attributes (`attr_timeout`).
    pub attr_timeout: Duration,
    /// How long the kernel may cache names (`entry_timeout`).
    pub entry_timeout: Duration,
    /// Use the kernel's writeback cache.
    pub writeback: bool,
    /// FUSE threads reading requests (`-o threads=N`).
    pub threads: usize,
    /// Every directory page the kernel reads carries attributes (`readdirplus=always`),
    /// so a listing followed by a stat of each entry (`ls -l`, `du`, rsync) needs no
    /// lookup per entry, as long as the entries' locks fit the lock LRU; otherwise
    /// (`auto`, the default) the kernel asks for attributes with the first page only,
    /// a listing of names alone (`ls -f`, `find -name`) costs less, and statahead
    /// answers the lookups of a stat walk.
    pub readdirplus_always: bool,
    /// `fcntl` and `flock(2)` locks held for the whole cluster by the MDT (Lustre's
    /// `flock`, the default), or only by this machine's kernel (`localflock`).
    pub cluster_locks: bool,
    /// SELinux labels (`security.selinux`) are stored and read as any xattr: by
    /// default only where this machine runs SELinux ([`SELINUX_FS`] exists), or with
    /// `-o seclabel`. Otherwise that one name is refused with `EOPNOTSUPP`, as NFS
    /// without labels does: `ls -l` asks for it on every file, one kernel round trip
    /// each, until a file system answers "not supported", then no more on that one.
    pub seclabel: bool,
    /// POSIX ACLs (`acl`, the default, as on Lustre): the kernel checks them from
    /// `system.posix_acl_access`, which it reads and caches, and leaves the umask to
    /// the MDT, which applies a directory's default ACL instead where there is one.
    /// With `noacl` the ACL xattrs are refused with `EOPNOTSUPP`.
    pub acl: bool,
    /// Birth times (`btime`, the default, as Lustre 2.14 reports them): a `statx(2)`
    /// asking for one is answered from the client's attributes, but the kernel sends
    /// that request once per inode it has not asked before, which a plain `stat(2)`
    /// never pays. With `nobtime` the kernel is told once that there are none and
    /// answers every `statx` from its own cache.
    pub btime: bool,
}

/// Where the kernel shows SELinux when it runs it.
pub const SELINUX_FS: &str = "/sys/fs/selinux";

/// The xattr that holds an inode's SELinux label.
const SELINUX_XATTR: &[u8] = b"security.selinux";

struct DirHandle {
    fid: Fid,
    /// The directory's open on the MDT: while it lasts, a removed directory stays
    /// there (an orphan, as a removed open file does), so this handle still stats
    /// and lists it, as on Linux, until `releasedir` closes it.
    open: Option<FileHandle>,
    /// The last page read: entries (shared with the calls that hand them out, which
    /// each take a few), the cookie after it, and whether it carries attributes.
    page: Arc<Vec<DirEntry>>,
    next: u64,
    plus: bool,
    /// The client's invalidation count before the page was asked for: a lock that
    /// went since may have covered what the page says.
    seq: u64,
    /// The next page, asked for while the kernel takes this one, so that the MDT
    /// reads it while the kernel and the client work.
    ahead: Option<Ahead>,
    /// Opened with the kernel keeping the pages it reads (under the directory's lock),
    /// at this invalidation count.
    kept_since: Option<u64>,
    /// The page came with the open, when the directory's mtime and ctime were these:
    /// the first read from the start takes it only if they still are (files made
    /// between the opendir and the first readdir must be listed). Cleared once read
    /// from the start, so a `rewinddir` reads the directory again, as POSIX wants.
    opened_at: Option<(i64, i64)>,
}

/// A directory page being read ahead: its cookie, whether with attributes, the
/// invalidation count before it was asked for, and the request.
struct Ahead {
    cookie: u64,
    plus: bool,
    seq: u64,
    page: tokio::task::JoinHandle<Result<lode_client::ReaddirRep, Errno>>,
}

impl Drop for DirHandle {
    fn drop(&mut self) {
        if let Some(a) = self.ahead.take() {
            a.page.abort();
        }
    }
}

struct Inner {
    client: Arc<Client>,
    opts: MountOptions,
    /// Inode number → (FID, kernel lookup count); an entry goes when the kernel
    /// forgets the inode, so memory follows what the kernel caches.
    inodes: RwLock<HashMap<u64, (Fid, u64)>>,
    files: Mutex<OpenFiles>,
    dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<DirHandle>>>>,
    /// Directories the kernel read to their end keeping the pages, and the
    /// invalidation count then (see `kernel_lists`); bounded by `LISTED_MAX`.
    listed: Mutex<HashMap<Fid, u64>>,
    next_fh: AtomicU64,
    groups: Groups,
    /// Where the kernel is told what to forget, once the session is up.
    invals: Mutex<Option<std::sync::mpsc::Sender<InvalJob>>>,
    /// The session's notifier, for filling the page cache at open (see
    /// [`Inner::fill_pages`]); set with `invals`.
    pages: Mutex<Option<Notifier>>,
    /// Open files holding flock locks; see [`Inner::after_closes`].
    flock_files: FlockFiles,
}

std::thread_local! {
    /// This FUSE thread runs a request inline (see [`LodeFs::spawn`]): another FUSE
    /// thread is free to read the kernel's next request, and the runtime is not
    /// blocked by what this one waits for.
    static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The mount's open files, by FUSE handle, and how many of them each file has open
/// for writing.
#[derive(Default)]
struct OpenFiles {
    by_fh: HashMap<u64, Arc<FileHandle>>,
    writers: HashMap<Fid, u32>,
    /// Per file opened through this mount: its handles and what the kernel's pages of
    /// it hold (see [`Pages`]).
    pages: HashMap<Fid, Pages>,
    /// Handles that were their file's only one in this mount when opened, with the
    /// open's number then (`next_open`).
    alone: HashMap<u64, u64>,
    /// Handles that wrote part of a page: the kernel keeps such a page only if it was
    /// whole already, so their file's pages may lack bytes, and a read-on-open fills
    /// them better than a data token keeps them.
    partial: std::collections::HashSet<u64>,
    /// Numbers every open.
    next_open: u64,
}

/// A file's handles in this mount, and the MDT's name (`data_token`) for the bytes
/// the kernel's pages of it hold, if this mount knows it. The kernel keeps a file's
/// pages across opens only when an open finds the token still current on the MDT
/// (NFS's close-to-open check, by version instead of mtime). A token is known only
/// where no other handle of this mount could have put other bytes in those pages:
/// after a read-only open stored the whole file there with no other handle open, or
/// after the close of a writer that wrote whole pages only, was the file's only
/// handle here for its whole life and, the MDT says, its only writer anywhere. It is
/// forgotten at any open for writing, any truncate through this mount and when the
/// kernel forgets the inode. Every other change of the bytes moves the file's
/// version on the MDT, which then no longer answers to the token.
///
/// A file with no Data-on-MDT component also keeps its pages across opens by lock
/// (`lock`): while the attributes lock a read-only open found vouching for them is
/// still the one held, no other client has opened the file for writing, truncated it
/// or changed its layout since (each calls that lock back first, and the callback
/// drops the pages), so the kernel's pages hold the file's bytes still (Lustre's
/// client keeps its pages under the OST extent locks it holds). A loss of the lock in
/// between shows twice: as another lock (an MDT life never grants a handle twice) and
/// in the client's invalidation log since then (which also covers a restarted MDT
/// granting an old handle number again); either makes that open drop the pages.
#[derive(Default)]
struct Pages {
    open: u32,
    /// The number of the last open.
    last_open: u64,
    token: u64,
    /// The attributes lock a read-only open of the file found vouching for its pages
    /// (0: none), and the client's invalidation count read before it: see above.
    /// Forgotten with the token.
    lock: u64,
    lock_seq: u64,
}

impl OpenFiles {
    fn get(&self, fh: &u64) -> Option<&Arc<FileHandle>> {
        self.by_fh.get(fh)
    }

    fn insert(&mut self, fh: u64, h: Arc<FileHandle>) {
        self.insert_keeping(fh, h, false);
    }

    /// Inserts handle `h`; `kept`: the kernel keeps its file's pages at this open
    /// (still current, or just filled with the whole file). They are then named by
    /// the handle's token if it was found current, or if no other handle of this
    /// mount is open (whose bytes could meet them there); otherwise unknown.
    fn insert_keeping(&mut self, fh: u64, h: Arc<FileHandle>, kept: bool) {
        if h.writable() {
            *self.writers.entry(h.fid).or_insert(0) += 1;
        }
        self.next_open += 1;
        let p = self.pages.entry(h.fid).or_default();
        let alone = p.open == 0;
        if alone {
            self.alone.insert(fh, self.next_open);
        }
        p.open += 1;
        p.last_open = self.next_open;
        p.token = if kept && !h.writable() && (alone || h.cache_current) {
            h.data_token
        } else {
            0
        };
        if h.writable() {
            p.lock = 0;
            p.lock_seq = 0;
        }
        if let Some(old) = self.by_fh.insert(fh, h) {
            self.forget_writer(&old);
        }
    }

    /// Removes a handle; with it, for a writer, the number of its open if it was its
    /// file's only handle in this mount from its open until now (for `closed_with`).
    fn remove_alone(&mut self, fh: &u64) -> Option<(Arc<FileHandle>, Option<u64>)> {
        let h = self.by_fh.remove(fh)?;
        self.forget_writer(&h);
        let whole_pages = !self.partial.remove(fh);
        let opened = self
            .alone
            .remove(fh)
            .filter(|_| h.writable() && whole_pages);
        let mut alone = None;
        if let Some(p) = self.pages.get_mut(&h.fid) {
            p.open = p.open.saturating_sub(1);
            alone = opened.filter(|n| p.last_open == *n);
        }
        // Kept for `closed_with` while the close of a writer alone is out.
        if alone.is_none() {
            self.drop_unused(h.fid);
        }
        Some((h, alone))
    }

    /// The token of the bytes the kernel's pages of `fid` hold (0: unknown).
    fn token(&self, fid: Fid) -> u64 {
        self.pages.get(&fid).map_or(0, |p| p.token)
    }

    /// The attributes lock that vouched for the kernel's pages of `fid` at its last
    /// read-only open (0: none; see [`Pages`]), with the invalidation count then.
    fn pages_lock(&self, fid: Fid) -> (u64, u64) {
        self.pages
            .get(&fid)
            .map_or((0, 0), |p| (p.lock, p.lock_seq))
    }

    /// A read-only open of `fid`, which has a handle here, found `lock` vouching for
    /// its pages, the invalidation count `seq` read before; none writes it through
    /// this mount now.
    fn note_pages_lock(&mut self, fid: Fid, lock: u64, seq: u64) {
        if self.writing(fid) {
            return;
        }
        if let Some(p) = self.pages.get_mut(&fid) {
            p.lock = lock;
            p.lock_seq = seq;
        }
    }

    /// After the close of a handle opened as number `n`, alone throughout: the pages
    /// hold what `token` names, if no handle opened since.
    fn closed_with(&mut self, fid: Fid, n: u64, token: u64) {
        if let Some(p) = self.pages.get_mut(&fid) {
            if p.last_open == n && p.open == 0 {
                p.token = token;
            }
        }
        self.drop_unused(fid);
    }

    /// The bytes of `fid` changed through this mount other than by a handle's writes
    /// (a truncate), or the kernel forgot the file: its pages hold nothing known.
    fn forget_pages(&mut self, fid: Fid) {
        if let Some(p) = self.pages.get_mut(&fid) {
            p.token = 0;
            p.lock = 0;
            p.lock_seq = 0;
        }
        self.drop_unused(fid);
    }

    /// Forgets `fid`'s entry once it has no handle and names no bytes.
    fn drop_unused(&mut self, fid: Fid) {
        if self
            .pages
            .get(&fid)
            .is_some_and(|p| p.open == 0 && p.token == 0 && p.lock == 0)
        {
            self.pages.remove(&fid);
        }
    }

    fn forget_writer(&mut self, h: &FileHandle) {
        if !h.writable() {
            return;
        }
        if let Some(n) = self.writers.get_mut(&h.fid) {
            *n -= 1;
            if *n == 0 {
                self.writers.remove(&h.fid);
            }
        }
    }

    fn drain(&mut self) -> Vec<Arc<FileHandle>> {
        self.writers.clear();
        self.pages.clear();
        self.alone.clear();
        self.partial.clear();
        self.by_fh.drain().map(|(_, f)| f).collect()
    }

    /// Whether some handle has `fid` open for writing.
    fn writing(&self, fid: Fid) -> bool {
        self.writers.contains_key(&fid)
    }
}

/// Open files (by FUSE handle) that took file locks. The last close of an open file
/// drops its flock locks in a RELEASE that the kernel does not wait for, so a lock call
/// that follows `close(2)` on this mount may reach the MDT first; it learns from here
/// that it should wait for that RELEASE.
#[derive(Default)]
struct FlockFiles {
    by_fh: Mutex<HashMap<u64, FlockFile>>,
    /// How many have gone since the mount.
    went: AtomicU64,
    /// Told when one goes.
    gone: tokio::sync::Notify,
}

struct FlockFile {
    fid: Fid,
    /// The owners of its locks (a few): the open file's own for a flock (or an OFD
    /// lock), a process's for an fcntl lock.
    owners: Vec<u64>,
    /// When a descriptor of it was last closed by a process that is not one of those
    /// owners: the last one, if a RELEASE follows at once; a forked child's, if not.
    closed: Option<Instant>,
    /// Its RELEASE came and is dropping its locks: a refused lock call waits for it
    /// however long the MDT takes (on a loaded machine, longer than [`RELEASE_WAIT`]).
    releasing: bool,
}

/// Owners remembered per open file: beyond them a close always counts (see
/// [`FlockFile::closed`]).
const FLOCK_OWNERS_MAX: usize = 8;

/// How long after such a close a refused lock call still waits for a RELEASE: one
/// follows within a round trip, or not at all (the closed descriptor was not the last).
const CLOSE_RECENT: Duration = Duration::from_secs(1);

/// How long a refused lock call waits for the RELEASE of a file a `close(2)` may have
/// ended: one comes within a round trip, unless the closed descriptor was not the last.
const RELEASE_WAIT: Duration = Duration::from_millis(500);

/// The bound on waiting for a RELEASE that came and is dropping its locks on the MDT.
const RELEASING_WAIT: Duration = Duration::from_secs(60);

/// Entries for the kernel to forget, and what to call once it has.
type InvalJob = (Vec<Inval>, Box<dyn FnOnce() + Send>);

/// Starts telling the kernel what to forget; see [`LodeFs::invalidation`].
pub struct Invalidation(Arc<Inner>);

impl Invalidation {
    /// Runs the thread that passes the client's invalidations to the kernel through
    /// `notifier` (the session's). Until then, the kernel is given no long timeouts.
    pub fn start(self, notifier: Notifier) -> std::io::Result<()> {
        let (tx, rx) = std::sync::mpsc::channel::<InvalJob>();
        *self.0.pages.lock() = Some(notifier.clone());
        let inner = self.0.clone();
        std::thread::Builder::new()
            .name("lode-inval".into())
            .spawn(move || {
                // The kernel may block a notification until a directory operation in
                // progress ends; the client does not wait for it forever (its cancel
                // goes after a short wait), so this thread may block, alone.
                for (what, done) in rx {
                    for w in what {
                        inner.notify(&notifier, &w);
                    }
                    done();
                }
            })?;
        *self.0.invals.lock() = Some(tx);
        Ok(())
    }
}

/// A lode file system as FUSE sees it.
pub struct LodeFs {
    inner: Arc<Inner>,
    rt: Handle,
}

fn ferr(e: Errno) -> i32 {
    e.raw()
}

impl LodeFs {
    /// A file system over a connected client; requests run on `rt`.
    pub fn new(client: Arc<Client>, opts: MountOptions, rt: Handle) -> LodeFs {
        let mut inodes = HashMap::new();
        inodes.insert(1, (Fid::ROOT, 1));
        LodeFs {
            inner: Arc::new(Inner {
                client,
                opts,
                inodes: RwLock::new(inodes),
                files: Mutex::new(OpenFiles::default()),
                dirs: Mutex::new(HashMap::new()),
                listed: Mutex::new(HashMap::new()),
                next_fh: AtomicU64::new(1),
                groups: Groups::default(),
                invals: Mutex::new(None),
                pages: Mutex::new(None),
                flock_files: FlockFiles::default(),
            }),
            rt,
        }
    }

    /// The handle that starts passing lock invalidations to the kernel, given the
    /// session's notifier (which exists only once this file system is in a session).
    pub fn invalidation(&self) -> Invalidation {
        let weak = Arc::downgrade(&self.inner);
        self.inner
            .client
            .set_invalidator(Arc::new(move |what, done| match weak.upgrade() {
                Some(i) => i.invalidate(what, done),
                None => done(),
            }));
        Invalidation(self.inner.clone())
    }

    /// The mode and umask a create sends: with ACLs on, the kernel leaves the umask
    /// to the file system (the MDT applies it, or the directory's default ACL).
    fn new_mode(&self, mode: u32, umask: u32) -> (u32, u32) {
        if self.inner.opts.acl {
            (mode, umask & 0o777)
        } else {
            (mode & !(umask & 0o777), 0)
        }
    }

    fn cred(&self, req: &Request) -> Cred {
        self.inner.groups.cred(req.uid(), req.gid(), req.pid())
    }

    /// Runs `f` to completion on this FUSE thread: it sends its requests itself and is
    /// woken once, by its reply, with no hand-off to another thread; the kernel gets
    /// its answer from the thread that read the request. While all the threads that
    /// take this thread's requests but this one are busy (a slow or dead server), it
    /// goes to the client runtime instead, so one thread always keeps taking the
    /// kernel's requests: with io_uring that is per queue (per CPU), since a request
    /// waits for a thread of its own CPU's queue. A request the servers need not
    /// answer (a FLUSH) must never wait behind calls to a server that is down: the
    /// server's own restart may be what sends it (an `exec` closing an inherited
    /// descriptor of a file on the mount).
    fn spawn<F>(&self, f: impl FnOnce(Arc<Inner>) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let fut = f(self.inner.clone());
        if crate::kernel::peer_free() {
            let was = INLINE.replace(true);
            lode_client::blocking_caller(|| self.rt.block_on(fut));
            INLINE.set(was);
        } else {
            self.rt.spawn(fut);
        }
    }

    /// Runs `f` (see [`LodeFs::spawn`]) and answers an entry request for `name` in
    /// `parent` with its result.
    fn reply_entry<F>(
        &self,
        reply: ReplyEntry,
        parent: INodeNo,
        name: Vec<u8>,
        f: impl FnOnce(Arc<Inner>) -> F + Send + 'static,
    ) where
        F: Future<Output = Result<MdtBody, Errno>> + Send + 'static,
    {
        self.spawn(move |i| async move {
            let seq = i.client.inval_seq();
            match f(i.clone()).await {
                Ok(b) => i.entry(&b, reply, i.fid(parent).ok().map(|p| (p, &name[..])), seq),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    /// Runs `f` (see [`LodeFs::spawn`]) and answers with success or its errno.
    fn reply_empty<F>(&self, reply: ReplyEmpty, f: impl FnOnce(Arc<Inner>) -> F + Send + 'static)
    where
        F: Future<Output = Result<(), Errno>> + Send + 'static,
    {
        self.spawn(move |i| async move {
            match f(i).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    /// Runs `f` (see [`LodeFs::spawn`]) and answers an attribute request with its result.
    fn reply_attr<F>(&self, reply: ReplyAttr, f: impl FnOnce(Arc<Inner>) -> F + Send + 'static)
    where
        F: Future<Output = Result<lode_base::Attr, Errno>> + Send + 'static,
    {
        self.spawn(move |i| async move {
            let seq = i.client.inval_seq();
            match f(i.clone()).await {
                Ok(a) => {
                    let (_, ttl) = i.ttls(None, a.fid);
                    reply.attr(&ttl, &file_attr(&a));
                    i.recheck(seq, ttl, None, a.fid, a.is_dir());
                }
                Err(e) => reply.error(ferr(e)),
            }
        });
    }
}

impl Inner {
    fn fid(&self, ino: INodeNo) -> Result<Fid, Errno> {
        self.inodes
            .read()
            .get(&ino.0)
            .map(|e| e.0)
            .ok_or(Errno::ESTALE)
    }

    /// Takes a file an open-create made (CREATE, TMPFILE): its entry reply is a
    /// kernel lookup, and the handle the kernel gets with its open flags.
    fn created(&self, h: FileHandle) -> (u64, FopenFlags) {
        self.track_writes(&h);
        self.remember(h.fid);
        let open_flags = self.open_flags(&h);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(fh, Arc::new(h));
        (fh, open_flags)
    }

    /// Records one kernel lookup of `fid` (every entry reply is one).
    fn remember(&self, fid: Fid) -> INodeNo {
        let ino = fid.ino();
        let mut m = self.inodes.write();
        let e = m.entry(ino).or_insert((fid, 0));
        e.0 = fid;
        e.1 += 1;
        INodeNo(ino)
    }

    /// The kernel dropped `n` lookups of `ino`.
    fn forget(&self, ino: u64, n: u64) {
        if ino == 1 {
            return;
        }
        let mut m = self.inodes.write();
        let Some(e) = m.get_mut(&ino) else {
            return;
        };
        e.1 = e.1.saturating_sub(n);
        if e.1 > 0 {
            return;
        }
        let fid = e.0;
        m.remove(&ino);
        drop(m);
        // The kernel's inode goes, and its pages with it.
        self.files.lock().forget_pages(fid);
    }

    fn file(&self, fh: Fh) -> Result<Arc<FileHandle>, Errno> {
        self.files.lock().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    /// The open flags the client keeps for a handle the MDT opened with the caller's.
    /// O_APPEND stays (the client then writes at the end of file the OSTs know, as a
    /// native client does) unless the writeback cache is on (the kernel then owns the
    /// file's end): the kernel's own idea of the end of file may be stale when another
    /// client appended meanwhile. (The MDT still sees it: an append-only file opens
    /// for appending only.)
    fn own_append(&self, mut h: FileHandle) -> FileHandle {
        if self.opts.writeback {
            h.flags &= !libc::O_APPEND;
        }
        h
    }

    /// FUSE open flags for a handle: an appending handle bypasses the page cache, whose
    /// offsets would not be where the client put the data.
    fn open_flags(&self, h: &FileHandle) -> FopenFlags {
        if h.flags & libc::O_APPEND != 0 {
            FILE_OPEN_FLAGS | FopenFlags::FOPEN_DIRECT_IO
        } else {
            FILE_OPEN_FLAGS
        }
    }

    /// Whether the kernel may keep its pages of a file at this open (see [`Pages`]):
    /// the MDT says the bytes they were recorded with are the file's still, and the
    /// kernel's size is the MDT's (this client holds the attributes lock, whose loss
    /// makes the kernel forget them).
    fn pages_current(&self, h: &FileHandle) -> bool {
        h.cache_current && h.flags & libc::O_APPEND == 0 && self.may_keep_pages(h.fid)
    }

    /// Whether an open's pages are kept by lock (see [`Pages`]): a plain read-only open
    /// of a file with no Data-on-MDT component (whose pages the data token keeps).
    fn by_lock(h: &FileHandle) -> bool {
        lode_base::perm::plain_read(h.flags) && h.layout().is_some_and(|l| l.dom_end() == 0)
    }

    /// Whether the kernel's pages of the file a [`Inner::by_lock`] open `h` is of are
    /// still its bytes: the attributes lock an earlier such open found vouching for
    /// them is still held and vouches still.
    fn pages_held(&self, h: &FileHandle) -> bool {
        let (lock, seq) = self.files.lock().pages_lock(h.fid);
        lock != 0
            && lock == self.client.attr_lock(h.fid)
            && !self.client.forgotten_since(seq, None, h.fid)
            && self.may_keep_pages(h.fid)
    }

    /// After a [`Inner::by_lock`] open: the lock that vouches for the file's pages now,
    /// if one does, is the one the next open checks (the pages this open keeps, or
    /// the reads through it fill, are the bytes as of under it).
    fn note_pages_lock(&self, h: &FileHandle) {
        let seq = self.client.inval_seq();
        let lock = self.client.attr_lock(h.fid);
        if lock != 0 && self.may_keep_pages(h.fid) {
            self.files.lock().note_pages_lock(h.fid, lock, seq);
        }
    }

    /// No handle of this mount writes `fid` (a shared writable mapping's pages may
    /// hold bytes not written yet), and the kernel's size of it is current.
    fn may_keep_pages(&self, fid: Fid) -> bool {
        !self.opts.writeback && !self.files.lock().writing(fid) && self.client.keeps_pages(fid)
    }

    /// Read-on-open into the kernel's page cache (Lustre's `ll_dom_finish_open`): a
    /// read-only open that brought the whole file stores it in the file's pages, so
    /// the read that follows is served by the kernel, not by a FUSE round trip. True
    /// if the kernel may keep its cache at this open (`FOPEN_KEEP_CACHE`, which every
    /// other open goes without): every byte of the file was just replaced, the
    /// kernel's size is the MDT's (this client holds the attributes lock, whose loss
    /// makes the kernel forget them) and that lock vouches for the pages, no handle of
    /// this mount has the file open for writing, and nothing was written through this
    /// mount meanwhile, checked again after the store (a local write racing it leaves
    /// the open to drop the pages, as any open does).
    ///
    /// Only on a FUSE thread running the OPEN inline, with another thread of its kind
    /// (its ring queue's, or a `/dev/fuse` reader) free: the store waits for any
    /// locked page of the file, which a READ in flight holds until it is answered, so
    /// the thread that waits must leave another FUSE thread, and the runtime, free to
    /// answer it.
    fn fill_pages(&self, ino: INodeNo, h: &FileHandle) -> bool {
        if self.opts.writeback
            || h.flags & libc::O_APPEND != 0
            || !INLINE.get()
            || !crate::kernel::peer_free()
        {
            return false;
        }
        let Some(p) = self.client.opened_contents(h) else {
            return false;
        };
        // A handle open for writing may have dirty pages (a shared writable mapping)
        // that the store would overwrite.
        if self.files.lock().writing(h.fid) {
            return false;
        }
        if !self.client.keeps_pages(h.fid) {
            return false;
        }
        let Some(n) = self.pages.lock().clone() else {
            return false;
        };
        if let Err(e) = n.store(ino, 0, &p.data) {
            tracing::debug!(fid = %h.fid, "storing read-on-open data in the page cache: {e}");
            return false;
        }
        // Still current: no local write since, and the lock (which another client's
        // change calls back) still held.
        self.client.opened_contents(h).is_some() && self.client.keeps_pages(h.fid)
    }

    /// Has the kernel write back, and forget, a file's pages: a handle of this mount
    /// open for writing may have left some the servers have not seen (a shared
    /// writable mapping's, written back only later). Told to drop them, the kernel
    /// writes dirty ones first (`launder_folio`), as WRITEs that another FUSE thread
    /// must be free to answer: false (nothing done) on a thread that cannot leave
    /// one free, or if the kernel refused.
    fn write_back_pages(&self, ino: INodeNo) -> bool {
        if !INLINE.get() || !crate::kernel::peer_free() {
            return false;
        }
        let Some(n) = self.pages.lock().clone() else {
            return false;
        };
        n.inval_inode(ino, 0, 0).is_ok()
    }

    /// Tells the kernel to ask for the attributes of `ino` again (its pages stay).
    fn forget_attrs(&self, ino: INodeNo) {
        if let Some(n) = self.pages.lock().clone() {
            let _ = n.inval_inode(ino, -1, 0);
        }
    }

    /// With the writeback cache, the kernel writes a file's pages through whichever
    /// handle it likes, even after the one they were written with is closed: no
    /// handle can then say it wrote nothing.
    fn track_writes(&self, h: &FileHandle) {
        if self.opts.writeback {
            h.wrote.store(true, Ordering::Release);
        }
    }

    /// Drops the file's set-user-ID bit, and its set-group-ID bit if it is
    /// group-executable, for a change of its bytes by a caller without CAP_FSETID:
    /// what the kernel's `file_remove_privs` did itself before the mount asked for
    /// `FUSE_HANDLE_KILLPRIV_V2`, which in exchange stops asking for
    /// `security.capability` before every write. The mode is the one the client holds
    /// under a lock, else the one the file was opened with, as stale as the kernel's
    /// own copy would be. (The MDT also drops set-group-ID for a caller outside the
    /// file's group, as Linux does.)
    async fn kill_suidgid(&self, cred: &Cred, h: &FileHandle) -> Result<(), Errno> {
        let mode = self.client.cached_mode(h.fid).unwrap_or(h.attr.mode);
        let kept = lode_base::perm::drop_setid(mode);
        if kept == mode {
            return Ok(());
        }
        let sa = SetAttr {
            mode: Some(kept & 0o7777),
            ..Default::default()
        };
        self.client.setattr(cred, h.fid, sa).await.map(drop)
    }

    /// Answers an entry request: `b`, found as `at` (directory, name).
    fn entry(&self, b: &MdtBody, reply: ReplyEntry, at: Option<(Fid, &[u8])>, seq: u64) {
        let fid = b.attr.fid;
        self.remember(fid);
        let (entry_ttl, attr_ttl) = self.ttls(at, fid);
        reply.entry_with_ttls(&attr_ttl, &entry_ttl, &file_attr(&b.attr), Generation(0));
        self.recheck(seq, entry_ttl.max(attr_ttl), at, fid, b.attr.is_dir());
    }

    /// The kernel's timeouts for a name (at `at`) and an object's attributes: as long
    /// as it likes for what the client holds locks on (it is told to forget when they
    /// go), none for the rest. `attr_timeout=0` / `entry_timeout=0` keep the kernel
    /// asking every time.
    fn ttls(&self, at: Option<(Fid, &[u8])>, fid: Fid) -> (Duration, Duration) {
        let started = self.invals.lock().is_some();
        let (name_ok, attr_ok) = if started {
            self.client.covered(at, fid)
        } else {
            (false, false)
        };
        // With the callback channel up, other clients' changes are seen at once, so
        // what no lock covers is not kept at all; without it (no locks to be had),
        // the mount's short timeouts apply.
        let coherent = started && self.client.callback_channel_up();
        let pick = |locked: bool, short: Duration| {
            if short.is_zero() || (coherent && !locked) {
                Duration::ZERO
            } else if locked {
                LOCKED_TTL
            } else {
                short
            }
        };
        (
            pick(name_ok, self.opts.entry_timeout),
            pick(attr_ok, self.opts.attr_timeout),
        )
    }

    /// After an answer with a long timeout: if what it gave was forgotten while it was
    /// being made, the kernel may have just taken something stale, so it forgets it
    /// again.
    fn recheck(&self, seq: u64, ttl: Duration, at: Option<(Fid, &[u8])>, fid: Fid, dir: bool) {
        if ttl != LOCKED_TTL || !self.client.forgotten_since(seq, at, fid) {
            return;
        }
        let mut what = vec![Inval::Attr { fid, dir }];
        if let Some((d, n)) = at {
            what.push(Inval::Name(d, n.to_vec()));
        }
        self.invalidate(what, Box::new(|| {}));
    }

    /// Whether the kernel likely lists `fid` from the pages it kept: it read them to
    /// the end under the directory's lock, which this client has not lost since. An
    /// opendir then asks for no first page (the kernel would not ask for it).
    fn kernel_lists(&self, fid: Fid) -> bool {
        let mut l = self.listed.lock();
        match l.get(&fid) {
            Some(&s) if !self.client.forgotten_since(s, None, fid) => true,
            Some(_) => {
                l.remove(&fid);
                false
            }
            None => false,
        }
    }

    /// Notes that the kernel read `fid` to its end keeping the pages, its lock held
    /// since invalidation count `seq`.
    fn listed(&self, fid: Fid, seq: u64) {
        let mut l = self.listed.lock();
        if l.len() >= LISTED_MAX {
            l.clear();
        }
        l.insert(fid, seq);
    }

    /// Queues `what` for the kernel to forget; `done` runs once it has (at once if
    /// there is no session yet).
    fn invalidate(&self, what: Vec<Inval>, done: Box<dyn FnOnce() + Send>) {
        let tx = self.invals.lock().clone();
        match tx {
            Some(tx) => {
                if let Err(e) = tx.send((what, done)) {
                    (e.0 .1)();
                }
            }
            None => done(),
        }
    }

    /// Drops the pages of `[offset, offset + len)` of `fid` that the kernel is being
    /// given, unless a lock vouches for them now.
    fn drop_unvouched(&self, fid: Fid, offset: u64, len: u64) {
        if !self.client.pages_vouched(fid) {
            self.drop_pages(fid, offset, len);
        }
    }

    /// Drops the pages of `[offset, offset + len)` of `fid` once the kernel has them:
    /// no lock vouched for them, so another client may change those bytes with
    /// nothing to tell this mount (there are no extent locks), and a reader holding
    /// the file open must read them again. By the notifier, because over io_uring an
    /// answer reaches the kernel only at its thread's next submission. A writeback
    /// mount's dirty pages would be written back by it, and a mount without locks
    /// keeps pages until the next open (its timeouts say how stale it may be): both
    /// keep what they cache.
    fn drop_pages(&self, fid: Fid, offset: u64, len: u64) {
        if len > 0 && !self.opts.writeback && self.client.callback_channel_up() {
            self.invalidate(vec![Inval::Pages { fid, offset, len }], Box::new(|| {}));
        }
    }

    /// Tells the kernel to forget one thing, if it knows it.
    fn notify(&self, n: &Notifier, w: &Inval) {
        let known = |f: &Fid| self.inodes.read().contains_key(&f.ino());
        let r = match w {
            // A directory's listing goes with its attributes.
            Inval::Attr { fid, dir } if known(fid) => {
                n.inval_inode(INodeNo(fid.ino()), if *dir { 0 } else { -1 }, 0)
            }
            // Else a file held open would keep reading the pages it had cached before
            // another client's write.
            Inval::Data(fid) if known(fid) => n.inval_inode(INodeNo(fid.ino()), 0, 0),
            Inval::Pages { fid, offset, len } if known(fid) => n.inval_inode(
                INodeNo(fid.ino()),
                i64::try_from(*offset).unwrap_or(i64::MAX),
                i64::try_from(*len).unwrap_or(0),
            ),
            Inval::Name(d, name) if known(d) => n.inval_entry(INodeNo(d.ino()), name),
            _ => return,
        };
        if let Err(e) = r {
            // ENOENT: the kernel had already let it go.
            if e.raw_os_error() != Some(libc::ENOENT) {
                tracing::debug!("kernel invalidation of {w:?}: {e}");
            }
        }
    }

    async fn complete(&self, b: MdtBody) -> Result<MdtBody, Errno> {
        self.client.complete(b).await
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(s) => TimeSet::At(ns(s)),
    }
}

/// Entries of a readdir+ reply whose glimpses go in one batch (about what a kernel
/// buffer holds).
const GLIMPSE_BATCH: usize = 32;

/// Entries of the first readdir+ page of a directory: a 100-entry directory is still
/// listed, attributes included, in one RPC.
const FIRST_PLUS_ENTRIES: u32 = 128;

/// Directories remembered as listed by the kernel from its own pages (see
/// `kernel_lists`); forgotten all at once past this (the cost: a first page asked for
/// again).
const LISTED_MAX: usize = 65_536;

impl LodeFs {
    /// The `FUSE_INIT` flags this file system asks the kernel for.
    pub fn init_flags(&self) -> u64 {
        // EXPORT_SUPPORT: the kernel looks an inode it no longer holds up by number
        // (`open_by_handle_at`, NFS export), as a LOOKUP of `.` in it (see `lookup`).
        let mut want = init::PARALLEL_DIROPS
            | init::DO_READDIRPLUS
            | init::ATOMIC_O_TRUNC
            | init::EXPORT_SUPPORT;
        if !self.inner.opts.readdirplus_always {
            want |= init::READDIRPLUS_AUTO;
        }
        if self.inner.opts.cluster_locks {
            // fcntl and flock(2) locks go to the MDT, so they hold across clients.
            // The kernel sends a flock as a whole-file lock owned by the open file
            // description; the two kinds share one lock space, as on Lustre and NFS:
            // a flock and an fcntl lock on the same file conflict, where a local file
            // system keeps them apart.
            want |= init::POSIX_LOCKS | init::FLOCK_LOCKS;
        }
        if self.inner.opts.writeback {
            want |= init::WRITEBACK_CACHE;
        }
        if self.inner.opts.acl {
            want |= init::POSIX_ACL | init::DONT_MASK;
        }
        // Set-ID bits dropped on write by the mount (see `Inner::kill_suidgid`): the
        // kernel then asks for `security.capability` once per inode, not per write.
        want |= init::HANDLE_KILLPRIV_V2;
        want
    }
}

impl Filesystem for LodeFs {
    fn destroy(&self) {
        let client = self.inner.client.clone();
        let files: Vec<Arc<FileHandle>> = self.inner.files.lock().drain();
        let _ = self.rt.block_on(async move {
            for f in files {
                let _ = client.close(&f).await;
            }
            client.disconnect().await;
            Ok::<(), Errno>(())
        });
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &[u8], reply: ReplyEntry) {
        let cred = self.cred(req);
        let name = name.to_vec();
        if name == b"." || name == b".." {
            // Never a path walk's (the VFS resolves those names itself): the kernel's
            // export operations, looking up an inode named by a file handle (`.`) or
            // the parent of a directory (`..`), which this mount may have forgotten;
            // its number gives its FID back. Gone from the MDT: ESTALE, as Linux
            // answers a handle to a removed file.
            self.spawn(|i| async move {
                let seq = i.client.inval_seq();
                let r = async {
                    let f = i
                        .fid(parent)
                        .ok()
                        .or_else(|| Fid::from_ino(parent.0))
                        .ok_or(Errno::ESTALE)?;
                    let b = if name == b"." {
                        i.client.getattr_md(&cred, f).await?
                    } else {
                        i.client.lookup(&cred, f, b"..").await?
                    };
                    i.complete(b).await
                };
                match r.await {
                    Ok(b) => i.entry(&b, reply, None, seq),
                    Err(Errno::ENOENT) => reply.error(libc::ESTALE),
                    Err(e) => reply.error(ferr(e)),
                }
            });
            return;
        }
        self.spawn(|i| async move {
            let seq = i.client.inval_seq();
            let r = async {
                let p = i.fid(parent)?;
                let b = i.client.lookup(&cred, p, &name).await?;
                Ok::<_, Errno>((p, i.complete(b).await?))
            };
            match r.await {
                Ok((p, b)) => i.entry(&b, reply, Some((p, &name)), seq),
                // A negative entry (inode 0): the kernel remembers "no such name" for
                // entry_timeout, as it remembers names that exist; 0 keeps it strict.
                // No lock covers a name that does not exist, so with the callback
                // channel up (other clients' creates are seen at once) it is not kept.
                Err(Errno::ENOENT)
                    if !i.opts.entry_timeout.is_zero() && !i.client.callback_channel_up() =>
                {
                    reply.entry(
                        &i.opts.entry_timeout,
                        &crate::attr::negative(),
                        Generation(0),
                    )
                }
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn forget(&self, ino: INodeNo, nlookup: u64) {
        self.inner.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<Fh>, reply: ReplyAttr) {
        let cred = self.cred(req);
        self.reply_attr(reply, move |i| async move {
            let f = i.fid(ino)?;
            i.client.getattr(&cred, f).await
        });
    }

    fn setattr(&self, req: &Request, ino: INodeNo, set: SetattrIn, reply: ReplyAttr) {
        let cred = self.cred(req);
        let SetattrIn {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh,
        } = set;
        let fh = fh.map(Fh);
        self.reply_attr(reply, move |i| async move {
            let f = i.fid(ino)?;
            if let Some(size) = size {
                i.files.lock().forget_pages(f);
                match fh.map(|h| i.file(h)) {
                    Some(Ok(h)) => i.client.truncate_open(&cred, &h, size).await?,
                    _ => {
                        let sa = SetAttr {
                            size: Some(size),
                            ..Default::default()
                        };
                        i.client.setattr(&cred, f, sa).await?;
                    }
                }
            }
            let sa = SetAttr {
                mode,
                uid,
                gid,
                size: None,
                atime: atime.map(time_set),
                mtime: mtime.map(time_set),
                flags: None,
            };
            if sa != SetAttr::default() {
                // Through a handle: the kernel's own update of a writer's times (with
                // the writeback cache), which an append-only file takes.
                match fh.map(|h| i.file(h)) {
                    Some(Ok(h)) => i.client.setattr_through(&cred, &h, sa).await?,
                    _ => i.client.setattr(&cred, f, sa).await?,
                };
            }
            i.client.getattr(&cred, f).await
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let cred = self.cred(req);
        self.spawn(|i| async move {
            let r = async { i.client.readlink(&cred, i.fid(ino)?).await };
            match r.await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

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
        let cred = self.cred(req);
        let name = name.to_vec();
        let n = name.clone();
        let (mode, umask) = self.new_mode(mode, umask);
        let mode = if mode & libc::S_IFMT == 0 {
            mode | libc::S_IFREG
        } else {
            mode
        };
        self.reply_entry(reply, parent, n, move |i| async move {
            let p = i.fid(parent)?;
            i.client
                .mknod_umask(&cred, p, &name, mode, umask, u64::from(rdev))
                .await
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &[u8],
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let cred = self.cred(req);
        let name = name.to_vec();
        let n = name.clone();
        let (mode, umask) = self.new_mode(mode, umask);
        self.reply_entry(reply, parent, n, move |i| async move {
            let p = i.fid(parent)?;
            i.client
                .mkdir_umask(&cred, p, &name, mode, umask, None)
                .await
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &[u8], reply: ReplyEmpty) {
        let cred = self.cred(req);
        let name = name.to_vec();
        self.reply_empty(reply, move |i| async move {
            i.client.unlink(&cred, i.fid(parent)?, &name).await
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &[u8], reply: ReplyEmpty) {
        let cred = self.cred(req);
        let name = name.to_vec();
        self.reply_empty(reply, move |i| async move {
            i.client.rmdir(&cred, i.fid(parent)?, &name).await
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &[u8],
        target: &[u8],
        reply: ReplyEntry,
    ) {
        let cred = self.cred(req);
        let name = link_name.to_vec();
        let target = target.to_vec();
        let n = name.clone();
        self.reply_entry(reply, parent, n, move |i| async move {
            i.client
                .symlink(&cred, i.fid(parent)?, &name, &target)
                .await
        });
    }

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
        let cred = self.cred(req);
        let (name, newname) = (name.to_vec(), newname.to_vec());
        self.reply_empty(reply, move |i| async move {
            if flags & libc::RENAME_WHITEOUT != 0 {
                return Err(Errno::EINVAL);
            }
            let (sp, dp) = (i.fid(parent)?, i.fid(newparent)?);
            i.client.rename(&cred, sp, &name, dp, &newname, flags).await
        });
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &[u8],
        reply: ReplyEntry,
    ) {
        let cred = self.cred(req);
        let name = newname.to_vec();
        let n = name.clone();
        self.reply_entry(reply, newparent, n, move |i| async move {
            let b = i
                .client
                .link(&cred, i.fid(ino)?, i.fid(newparent)?, &name)
                .await?;
            i.complete(b).await
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: i32, reply: ReplyOpen) {
        let cred = self.cred(req);
        self.spawn(|i| async move {
            let r = async {
                let f = i.fid(ino)?;
                let flags = flags & !(libc::O_CREAT | libc::O_EXCL);
                // Asked only if the pages could be kept: a current answer brings no
                // bytes, so the reads would all go to the MDT.
                let cached = if lode_base::perm::plain_read(flags) {
                    let t = i.files.lock().token(f);
                    if t != 0 && i.may_keep_pages(f) {
                        t
                    } else {
                        0
                    }
                } else {
                    0
                };
                i.client
                    .open_cached(&cred, f, flags, cached)
                    .await
                    .map(|h| i.own_append(h))
            };
            match r.await {
                Ok(h) => {
                    i.track_writes(&h);
                    let mut open_flags = i.open_flags(&h);
                    // Pages still current (by data token, or under the same lock),
                    // or the whole file stored in them now.
                    let by_lock = Inner::by_lock(&h);
                    let keep =
                        i.pages_current(&h) || by_lock && i.pages_held(&h) || i.fill_pages(ino, &h);
                    if keep {
                        open_flags |= FopenFlags::FOPEN_KEEP_CACHE;
                        // The kernel answers the reads from its pages, so they never
                        // reach the mount: a readable open is taken as the read, for
                        // the access time (dropping the pages instead would read the
                        // file again from the servers), and the kernel, which forgets
                        // its copy of the time only after reads that reach here, is
                        // told to ask for the attributes again.
                        if flags & libc::O_ACCMODE != libc::O_WRONLY && i.client.note_access(&h) {
                            i.forget_attrs(ino);
                        }
                    }
                    let fh = i.next_fh.fetch_add(1, Ordering::Relaxed);
                    let h = Arc::new(h);
                    i.files.lock().insert_keeping(fh, h.clone(), keep);
                    if by_lock {
                        i.note_pages_lock(&h);
                    }
                    reply.opened(Fh(fh), open_flags);
                }
                // The inode the kernel holds is gone from the MDT: a stale handle (the VFS
                // walks the path again; `open_by_handle_at` says ESTALE, as Linux).
                Err(Errno::ENOENT) => reply.error(libc::ESTALE),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

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
        let cred = self.cred(req);
        let name = name.to_vec();
        let (mode, umask) = self.new_mode(mode, umask);
        self.spawn(move |i| async move {
            let seq = i.client.inval_seq();
            let r = async {
                let p = i.fid(parent)?;
                let h = i
                    .client
                    .create_open_umask(&cred, p, &name, mode, umask, flags, None)
                    .await
                    .map(|h| i.own_append(h))?;
                let a = if h.attr.size > 0 || h.flags & libc::O_TRUNC != 0 {
                    i.client.getattr(&cred, h.fid).await?
                } else {
                    h.attr.clone()
                };
                Ok::<_, Errno>((p, h, a))
            };
            match r.await {
                Ok((p, h, a)) => {
                    let fid = h.fid;
                    let (fh, open_flags) = i.created(h);
                    let (et, at) = i.ttls(Some((p, &name)), fid);
                    let ttl = et.min(at);
                    reply.created(&ttl, &file_attr(&a), Generation(0), Fh(fh), open_flags);
                    i.recheck(seq, ttl, Some((p, &name)), fid, false);
                }
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let cred = self.cred(req);
        let (mode, umask) = self.new_mode(mode, umask);
        self.spawn(move |i| async move {
            let r = async {
                let p = i.fid(parent)?;
                i.client.tmpfile(&cred, p, mode, umask, flags, None).await
            };
            match r.await {
                Ok(h) => {
                    let (fid, a) = (h.fid, h.attr.clone());
                    let (fh, open_flags) = i.created(h);
                    // No name to cache; its attributes as any file's without a lock.
                    let (_, ttl) = i.ttls(None, fid);
                    reply.created(&ttl, &file_attr(&a), Generation(0), Fh(fh), open_flags);
                }
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: Fh,
        offset: u64,
        size: u32,
        reply: ReplyData,
    ) {
        self.spawn(|i| async move {
            let seq = i.client.inval_seq();
            let mut vouched = false;
            let r = async {
                let h = i.file(fh)?;
                vouched = i.client.pages_vouched(h.fid);
                i.client
                    .read(&h, offset, size as usize)
                    .await
                    .map(|d| (h.fid, d))
            };
            match r.await {
                Ok((fid, d)) => {
                    reply.data(&d);
                    if !vouched || i.client.forgotten_since(seq, None, fid) {
                        i.drop_pages(fid, offset, d.len() as u64);
                    }
                }
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: Fh,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
        reply: ReplyWrite,
    ) {
        let cred = self.cred(req);
        let data = data.to_vec();
        let page = PAGE_SIZE as u64;
        if !offset.is_multiple_of(page) || !(data.len() as u64).is_multiple_of(page) {
            self.inner.files.lock().partial.insert(fh.0);
        }
        self.spawn(|i| async move {
            let r = async {
                let h = i.file(fh)?;
                if kill_suidgid {
                    i.kill_suidgid(&cred, &h).await?;
                }
                // An O_APPEND handle (see `own_append`) appends at the end the OSTs
                // know; otherwise write exactly where the kernel says.
                let mut h2 = (*h).clone();
                if h2.flags & libc::O_ACCMODE == libc::O_RDONLY {
                    // Writeback cache flushes through any handle of the file.
                    h2.flags = (h2.flags & !libc::O_ACCMODE) | libc::O_RDWR;
                }
                i.client.write(&h2, offset, &data).await.map(|n| (h.fid, n))
            };
            match r.await {
                Ok((fid, n)) => {
                    reply.written(n as u32);
                    // The kernel keeps the pages it wrote through; while another
                    // client may write them too (no lock vouches for them), they go
                    // like the pages a read brings (see `read`).
                    i.drop_unvouched(fid, offset, n as u64);
                }
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn flush(&self, _req: &Request, ino: INodeNo, fh: Fh, lock_owner: u64, reply: ReplyEmpty) {
        // Writes are sent as they come, but for a small Data-on-MDT file's first (sent
        // in the background, see `lode_client`'s write-back). What a close ends is the
        // closing process's record locks on the file, if it has any.
        let fid = self.inner.fid(ino).ok();
        {
            let mut by_fh = self.inner.flock_files.by_fh.lock();
            if let Some(f) = by_fh.get_mut(&fh.0) {
                // The close of a descriptor by a process that does not own all of the
                // file's locks: a flock's open file may be going (its RELEASE follows).
                if f.owners.len() >= FLOCK_OWNERS_MAX || f.owners.iter().any(|&o| o != lock_owner) {
                    f.closed = Some(Instant::now());
                }
            }
            // A process's fcntl locks on the file end here, whichever descriptor they
            // were taken through: no RELEASE is to drop them again (see `release`), nor
            // a lock the process takes later.
            for f in by_fh.values_mut().filter(|f| Some(f.fid) == fid) {
                f.owners.retain(|&o| o != lock_owner);
            }
        }
        let Some(fid) = fid else {
            reply.ok();
            return;
        };
        // A first write kept back that failed already (see `lode_client`'s
        // write-back): told here, not waited for, once the locks are dropped.
        let failed = self.inner.client.write_back_error(fid);
        if !self.inner.client.flock_may_hold(fid, lock_owner) {
            match failed {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(ferr(e)),
            }
            return;
        }
        self.reply_empty(reply, move |i| async move {
            let a = flock_args(fid, lock_owner, (0, u64::MAX), libc::F_UNLCK, 0, false)?;
            i.client.flock(&a).await?;
            failed
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: Fh,
        _flags: i32,
        lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let Some((h, alone)) = self.inner.files.lock().remove_alone(&fh.0) else {
            reply.error(libc::EBADF);
            return;
        };
        // The last close of an open file description ends its flock locks, and its
        // OFD locks (`F_OFD_SETLK`, owned by the open file description, which the
        // kernel names in no RELEASE): the owners that took locks through it and
        // closed no descriptor of the file since (a process's fcntl locks end at
        // its FLUSH, which takes it off the list).
        let owners: Vec<u64> = self
            .inner
            .flock_files
            .by_fh
            .lock()
            .get_mut(&fh.0)
            .map(|f| {
                f.releasing = true;
                f.owners.clone()
            })
            .unwrap_or_default();
        let others = owners
            .into_iter()
            .filter(|&o| Some(o) != lock_owner && self.inner.client.flock_may_hold(h.fid, o));
        let unlocks = lock_owner
            .into_iter()
            .chain(others)
            .filter_map(|o| flock_args(h.fid, o, (0, u64::MAX), libc::F_UNLCK, 0, false).ok())
            .collect::<Vec<_>>();
        // close(2) does not wait for RELEASE (the kernel sends it in the background):
        // the answer comes once the MDT closed the file, from this thread (like any
        // call, on the runtime when the threads are busy). Its errors could not reach
        // the application anyway. Answering first would leave a ring entry, to which
        // the kernel sends its next request, behind this thread's call to the MDT.
        // A close that must wait for a write kept back (see `lode_client`'s
        // write-back) waits on the runtime, not on this ring thread, to which the
        // kernel may send the application's next request meanwhile.
        let pending = self.inner.client.write_back_pending(h.fid);
        let fut = |i: Arc<Inner>| async move {
            for a in unlocks {
                if let Err(e) = i.client.flock(&a).await {
                    tracing::warn!(fid = %h.fid, "dropping flock locks at close failed: {e}");
                }
            }
            i.flock_file_gone(fh.0);
            let token = match i.client.close_token(&h).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(fid = %h.fid, "close on the MDT failed: {e}");
                    0
                }
            };
            if let Some(n) = alone {
                // A writer's pages hold what it wrote over what the file held at its
                // open (the kernel dropped the pages then); the MDT's token says that
                // nobody else changed the file meanwhile. With the writeback cache
                // the pages may hold more, not yet written.
                let token = if i.opts.writeback { 0 } else { token };
                i.files.lock().closed_with(h.fid, n, token);
            }
            reply.ok();
        };
        if pending {
            self.rt.spawn(fut(self.inner.clone()));
        } else {
            self.spawn(fut);
        }
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: Fh, _datasync: bool, reply: ReplyEmpty) {
        self.reply_empty(reply, move |i| async move {
            let h = i.file(fh)?;
            i.client.fsync(&h).await
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, flags: i32, reply: ReplyOpen) {
        let cred = self.cred(req);
        self.spawn(|i| async move {
            let seq = i.client.inval_seq();
            let r = async {
                let f = i.fid(ino)?;
                if flags & libc::O_ACCMODE != libc::O_RDONLY {
                    return Err(Errno::EISDIR);
                }
                // The MDT checks type and read permission (ACLs included). Its first
                // page comes with the open, as the kernel's first readdir asks for it
                // (with attributes unless statahead is off), unless the kernel keeps
                // the listing it read last time.
                if i.kernel_lists(f) {
                    let open = i
                        .client
                        .open(&cred, f, libc::O_RDONLY | libc::O_DIRECTORY)
                        .await?;
                    return Ok((f, open, None, false));
                }
                let plus = i.client.statahead_max() != 0;
                let count = if plus { FIRST_PLUS_ENTRIES } else { 0 };
                let (open, page) = i.client.open_dir(&cred, f, plus, count).await?;
                Ok((f, open, page, plus))
            };
            match r.await {
                Ok((f, open, page, plus)) => {
                    let fh = i.next_fh.fetch_add(1, Ordering::Relaxed);
                    let times = (open.attr.mtime, open.attr.ctime);
                    let mut d = DirHandle {
                        fid: f,
                        open: Some(open),
                        page: Arc::default(),
                        next: 0,
                        plus: false,
                        seq: 0,
                        ahead: None,
                        kept_since: None,
                        opened_at: None,
                    };
                    if let Some(page) = page {
                        d.opened_at = Some(times);
                        i.take_dir_page(&cred, &mut d, page, seq, plus, 0);
                    }
                    // Under the directory's lock the kernel may keep its pages (and
                    // read them again without asking): the lock's callback drops them.
                    // Its listings then never reach the mount: the open is taken as
                    // one, for the access time.
                    let (_, locked) = i.ttls(None, f);
                    if locked == LOCKED_TTL {
                        d.kept_since = Some(seq);
                        if d.open.as_ref().is_some_and(|o| i.client.note_access(o)) {
                            i.forget_attrs(ino);
                        }
                    }
                    i.dirs
                        .lock()
                        .insert(fh, Arc::new(tokio::sync::Mutex::new(d)));
                    if locked == LOCKED_TTL {
                        reply.opened(
                            Fh(fh),
                            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
                        );
                        i.recheck(seq, locked, None, f, true);
                    } else {
                        reply.opened(Fh(fh), FopenFlags::empty());
                    }
                }
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        cmd: u32,
        data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        // chattr and lsattr: the kernel passes the flags as an int
        // (`FS_IOC_GETFLAGS`), or in a `struct fsxattr` (`FS_IOC_FSGETXATTR`, which its
        // `fileattr_set` asks first), having checked CAP_LINUX_IMMUTABLE.
        let set = match cmd {
            c if c == libc::FS_IOC_GETFLAGS as u32 && out_size == 4 => None,
            FS_IOC_FSGETXATTR if out_size == FSXATTR_LEN => None,
            c if c == libc::FS_IOC_SETFLAGS as u32 => match <[u8; 4]>::try_from(data) {
                Ok(b) => Some(u32::from_ne_bytes(b)),
                Err(_) => return reply.error(libc::EINVAL),
            },
            FS_IOC_FSSETXATTR => match fsxattr_flags(data) {
                Ok(f) => Some(f),
                Err(e) => return reply.error(e),
            },
            _ => {
                // Programs probe files with ioctls (Python asks TCGETS of every file
                // it opens): "not a terminal / no such control" is the right answer,
                // and one log line per command number is enough.
                if self.inner.client.note_unsupported_ioctl(cmd) {
                    tracing::info!(cmd = format_args!("{cmd:#010x}"), "ioctl not supported (ENOTTY); counted in llite.*.unsupported_ioctls, not logged again");
                }
                return reply.error(libc::ENOTTY);
            }
        };
        let x = cmd == FS_IOC_FSGETXATTR || cmd == FS_IOC_FSSETXATTR;
        let cred = self.cred(req);
        self.spawn(move |i| async move {
            let r = async {
                let fid = i.fid(ino)?;
                match set {
                    None => i.client.getattr(&cred, fid).await.map(|a| Some(a.flags)),
                    Some(f) => {
                        let sa = SetAttr {
                            flags: Some(f),
                            ..Default::default()
                        };
                        i.client.setattr(&cred, fid, sa).await?;
                        // Its change time moved: the kernel asks again.
                        i.forget_attrs(ino);
                        Ok(None)
                    }
                }
            };
            match r.await {
                Ok(Some(flags)) if x => reply.ioctl(0, &fsxattr_of(flags)),
                Ok(Some(flags)) => reply.ioctl(0, &flags.to_ne_bytes()),
                Ok(None) => reply.ioctl(0, &[]),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn readdir(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: Fh,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let cred = self.cred(req);
        self.spawn(|i| async move {
            let r = i.dir_entries(&cred, fh, offset, false).await;
            match r {
                Ok((page, start, _)) => {
                    for e in &page[start..] {
                        // Plain readdir entries are not lookups: nothing to remember.
                        let ino = e.fid.ino();
                        if reply.add(INodeNo(ino), e.cookie + 1, dtype_kind(e.dtype), &e.name) {
                            break;
                        }
                    }
                    reply.ok();
                }
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: Fh,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let cred = self.cred(req);
        self.spawn(|i| async move {
            let r = i.dir_entries(&cred, fh, offset, true).await;
            let dir = i.fid(ino).ok();
            let mut long = Vec::new();
            match r {
                Ok((page, start, seq)) => {
                    // A kernel buffer holds a few dozen entries: their glimpses go
                    // together, one RPC per OST, a batch at a time.
                    'batches: for chunk in page[start..].chunks(GLIMPSE_BATCH) {
                        // Only a batch with a size to glimpse needs its bodies copied.
                        let glimpse = chunk.iter().any(|e| {
                            e.body
                                .as_ref()
                                .is_some_and(|b| b.glimpse && b.layout.is_some())
                        });
                        let mut done = if glimpse {
                            let bodies: Vec<MdtBody> = chunk
                                .iter()
                                .filter_map(|e| e.body.as_deref().cloned())
                                .collect();
                            Some(i.client.complete_many(bodies).await.into_iter())
                        } else {
                            None
                        };
                        for e in chunk {
                            let Some(b) = e.body.as_ref() else {
                                // Without attributes (statahead off): the kernel looks
                                // the name up when it is stat'ed.
                                let k = dtype_kind(e.dtype);
                                if reply.add_name(INodeNo(e.fid.ino()), e.cookie + 1, k, &e.name) {
                                    break 'batches;
                                }
                                continue;
                            };
                            let completed;
                            let body = match done.as_mut() {
                                Some(d) => match d.next() {
                                    Some(Ok(c)) => {
                                        completed = c;
                                        &completed
                                    }
                                    _ => continue,
                                },
                                None => b,
                            };
                            let dots = e.name == b"." || e.name == b"..";
                            let ino = if dots {
                                e.fid.ino()
                            } else {
                                i.remember(e.fid).0
                            };
                            let mut attr = file_attr(&body.attr);
                            attr.ino = ino;
                            let ttl = if dots {
                                Duration::ZERO
                            } else {
                                let (et, at) = i.ttls(dir.map(|d| (d, &e.name[..])), e.fid);
                                let ttl = et.min(at);
                                if ttl == LOCKED_TTL {
                                    long.push((e.name.clone(), e.fid, body.attr.is_dir()));
                                }
                                ttl
                            };
                            if reply.add(
                                INodeNo(ino),
                                e.cookie + 1,
                                &e.name,
                                &ttl,
                                &attr,
                                Generation(0),
                            ) {
                                break 'batches;
                            }
                        }
                    }
                    reply.ok();
                    for (name, fid, is_dir) in long {
                        i.recheck(seq, LOCKED_TTL, dir.map(|d| (d, &name[..])), fid, is_dir);
                    }
                }
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: Fh, reply: ReplyEmpty) {
        let Some(d) = self.inner.dirs.lock().remove(&fh.0) else {
            reply.ok();
            return;
        };
        // Answered once the MDT closed it, as RELEASE is (see `release`).
        self.spawn(|i| async move {
            let open = {
                let mut d = d.lock().await;
                // Listed to its end with the kernel keeping the pages: the next opendir
                // needs no first page while the lock that vouches for them lasts.
                if let Some(seq) = d
                    .kept_since
                    .filter(|_| d.next == lode_base::hash::END_COOKIE)
                {
                    i.listed(d.fid, seq);
                }
                d.open.take()
            };
            if let Some(h) = open {
                if let Err(e) = i.client.close(&h).await {
                    tracing::warn!(fid = %h.fid, "closing a directory on the MDT failed: {e}");
                }
            }
            reply.ok();
        });
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: Fh, _datasync: bool, reply: ReplyEmpty) {
        self.spawn(|i| async move {
            match i.client.sync().await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(|i| async move {
            match i.client.statfs().await {
                Ok(s) => reply.statfs(
                    s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
                ),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &[u8],
        value: &[u8],
        flags: i32,
        reply: ReplyEmpty,
    ) {
        let cred = self.cred(req);
        let (name, value) = (name.to_vec(), value.to_vec());
        if refused(&self.inner.opts, &name) {
            reply.error(libc::EOPNOTSUPP);
            return;
        }
        if name == MIGRATE_XATTR {
            self.reply_empty(reply, move |i| async move {
                let layout = lode_base::layout::decode_xattr(&value).ok_or(Errno::EINVAL)?;
                i.client
                    .migrate(&cred, i.fid(ino)?, layout)
                    .await
                    .map(|_| ())
            });
            return;
        }
        self.reply_empty(reply, move |i| async move {
            i.client
                .setxattr(&cred, i.fid(ino)?, &name, Some(&value), flags as u32)
                .await
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &[u8], size: u32, reply: ReplyXattr) {
        let cred = self.cred(req);
        let name = name.to_vec();
        if refused(&self.inner.opts, &name) {
            reply.error(libc::EOPNOTSUPP);
            return;
        }
        if name == FID_XATTR {
            // Answered here: the client knows every inode's FID (path2fid).
            match self.inner.fid(ino) {
                Ok(f) => {
                    let v = f.to_string().into_bytes();
                    if size == 0 {
                        reply.size(v.len() as u32);
                    } else if (size as usize) < v.len() {
                        reply.error(libc::ERANGE);
                    } else {
                        reply.data(&v);
                    }
                }
                Err(e) => reply.error(ferr(e)),
            }
            return;
        }
        if name == STATFS_XATTR || name.starts_with(FID2PATH_XATTR) {
            // Answered by this mount for `lode df` and `lode fid2path`, which then
            // need no connection (nor key, nor client slot) of their own.
            let fid2path = name.get(FID2PATH_XATTR.len()..).map(<[u8]>::to_vec);
            let uid = req.uid();
            self.spawn(move |i| async move {
                let v: Result<Vec<u8>, Errno> = async {
                    if name == STATFS_XATTR {
                        return Ok(i.client.statfs_report().await);
                    }
                    // Any path of any FID: an administrator's tool, as Lustre's
                    // fid2path (CAP_DAC_READ_SEARCH).
                    if uid != 0 {
                        return Err(Errno::EPERM);
                    }
                    let fid: Fid = std::str::from_utf8(fid2path.as_deref().unwrap_or_default())
                        .ok()
                        .and_then(|f| f.parse().ok())
                        .ok_or(Errno::EINVAL)?;
                    Ok(i.client.paths_of(fid).await?.join(&b'\n'))
                }
                .await;
                match v {
                    Ok(v) if size == 0 => reply.size(v.len() as u32),
                    Ok(v) if (size as usize) < v.len() => reply.error(libc::ERANGE),
                    Ok(v) => reply.data(&v),
                    Err(e) => reply.error(ferr(e)),
                }
            });
            return;
        }
        self.spawn(|i| async move {
            let fid = i.fid(ino);
            let r = async { i.client.getxattr(&cred, fid?, &name, size).await };
            let r = r.await;
            // The kernel keeps an ACL it is given with no timeout, until it is told to
            // forget the inode: one given while no lock covers the attributes would
            // outlive another client's chmod or setfacl, which calls back nothing
            // here. Told now, the kernel keeps none (it caches only an answer that no
            // invalidation met since it asked). Without the callback channel the
            // mount's timeouts are the contract, as for everything else.
            if let Ok(f) = fid {
                if lode_base::acl::is_acl_name(&name)
                    && i.client.callback_channel_up()
                    && !i.client.perm_covered(f)
                {
                    i.forget_attrs(ino);
                }
            }
            match r {
                Ok((_, n)) if size == 0 => reply.size(n),
                Ok((v, _)) => reply.data(&v),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let cred = self.cred(req);
        self.spawn(move |i| async move {
            let r = async {
                // The whole list in one call (the MDT bounds it), so that a label this
                // mount refuses is left out of what is measured as well as what is sent.
                let (v, _) = i.client.listxattr(&cred, i.fid(ino)?, u32::MAX).await?;
                Ok::<_, Errno>(without_refused(&i.opts, &v))
            };
            match r.await {
                Ok(v) if size == 0 => reply.size(v.len() as u32),
                Ok(v) if v.len() > size as usize => reply.error(libc::ERANGE),
                Ok(v) => reply.data(&v),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &[u8], reply: ReplyEmpty) {
        let cred = self.cred(req);
        let name = name.to_vec();
        if refused(&self.inner.opts, &name) {
            reply.error(libc::EOPNOTSUPP);
            return;
        }
        self.reply_empty(reply, move |i| async move {
            i.client.setxattr(&cred, i.fid(ino)?, &name, None, 0).await
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: u32, reply: ReplyEmpty) {
        let cred = self.cred(req);
        self.reply_empty(reply, move |i| async move {
            let b = i.client.getattr_md(&cred, i.fid(ino)?).await?;
            let mut want = 0;
            if mask & libc::R_OK as u32 != 0 {
                want |= MAY_READ;
            }
            if mask & libc::W_OK as u32 != 0 {
                want |= MAY_WRITE;
            }
            if mask & libc::X_OK as u32 != 0 {
                want |= MAY_EXEC;
            }
            if want == 0 || i.client.may_access(&cred, &b, want).await? {
                Ok(())
            } else {
                Err(Errno::EACCES)
            }
        });
    }

    fn getlk(&self, _req: &Request, ino: INodeNo, lk: LkIn, reply: ReplyLock) {
        self.spawn(move |i| async move {
            let r = async {
                let (range, fid) = ((lk.start, lk.end), i.fid(ino)?);
                let a = flock_args(fid, lk.owner, range, lk.typ, lk.pid, false)?;
                let refused = |r: &Result<Option<_>, _>| matches!(r, Ok(Some(_)));
                i.after_closes(a.fid, lk.fh, || i.client.flock_test(&a), refused)
                    .await
            };
            match r.await {
                Ok(Some(c)) => reply.locked(c.start, c.end, c.typ as i32, c.pid),
                Ok(None) => reply.locked(lk.start, lk.end, libc::F_UNLCK, 0),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn setlk(&self, req: &Request, ino: INodeNo, lk: LkIn, sleep: bool, reply: ReplyEmpty) {
        let LkIn {
            fh,
            owner: lock_owner,
            start,
            end,
            typ,
            pid,
            ..
        } = lk;
        let fh = Fh(fh);
        // The thread that asked: a signal it takes ends its wait (the kernel's
        // FUSE_INTERRUPT says the same, later).
        let tid = req.pid();
        let f = move |i: Arc<Inner>| async move {
            let r = async {
                let a = flock_args(i.fid(ino)?, lock_owner, (start, end), typ, pid, sleep)?;
                let interrupted = || caller(tid) != Caller::Waiting;
                let call = || i.client.flock_interruptible(&a, &interrupted);
                let r = i
                    .after_closes(a.fid, fh.0, call, |r| r == &Err(Errno::EAGAIN))
                    .await;
                if r.is_ok() && typ != libc::F_UNLCK {
                    let mut by_fh = i.flock_files.by_fh.lock();
                    let f = by_fh.entry(fh.0).or_insert_with(|| FlockFile {
                        fid: a.fid,
                        owners: Vec::new(),
                        closed: None,
                        releasing: false,
                    });
                    if !f.owners.contains(&lock_owner) && f.owners.len() < FLOCK_OWNERS_MAX {
                        f.owners.push(lock_owner);
                    }
                }
                if r.is_ok() && a.wait && caller(tid) == Caller::Gone {
                    // Granted as its caller was killed: nobody takes the answer, and
                    // the lock would outlive its owner. Dropped again, and never
                    // answered as held.
                    let un = flock_args(a.fid, lock_owner, (start, end), libc::F_UNLCK, 0, false)?;
                    i.client.flock(&un).await?;
                    return Err(Errno::ENOLCK);
                }
                r
            };
            match r.await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(ferr(e)),
            }
        };
        if sleep {
            // A wait may be long: it holds no FUSE thread.
            self.rt.spawn(f(self.inner.clone()));
        } else {
            self.spawn(f);
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: Fh,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let cred = self.cred(req);
        // The kernel writes back and drops its own pages of a punched or zeroed range,
        // and learns a new size from the answer (see `Client::fallocate`).
        self.reply_empty(reply, move |i| async move {
            let h = i.file(fh)?;
            // A change of the file's bytes, as a write is (`file_modified`), but the
            // kernel sends no FUSE_WRITE_KILL_SUIDGID with it: root stands for
            // CAP_FSETID, as on the MDT.
            if cred.uid != 0 {
                i.kill_suidgid(&cred, &h).await?;
            }
            i.client.fallocate(&h, mode, offset, length).await
        });
    }

    fn statx(&self, req: &Request, ino: INodeNo, fh: Option<Fh>, reply: ReplyAttr) {
        if !self.inner.opts.btime {
            // Every later statx the kernel answers itself, without a birth time.
            return reply.error(libc::ENOSYS);
        }
        self.getattr(req, ino, fh, reply)
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: Fh,
        offset: u64,
        whence: u32,
        reply: ReplyLseek,
    ) {
        let hole = match whence as i32 {
            libc::SEEK_DATA => false,
            libc::SEEK_HOLE => true,
            _ => return reply.error(libc::EINVAL),
        };
        if self.inner.opts.writeback {
            // The kernel's dirty pages are data the servers have not seen, and its
            // size may be past theirs: it answers itself (all data up to its size).
            return reply.error(libc::ENOSYS);
        }
        self.spawn(move |i| async move {
            let r = async {
                let h = i.file(fh)?;
                let writing = i.files.lock().writing(h.fid);
                let exact = !writing || i.write_back_pages(ino);
                i.client.seek(&h, offset, hole, exact).await
            };
            match r.await {
                Ok(at) => reply.offset(at),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }
}

/// `FS_IOC_FSGETXATTR`: `_IOR('X', 31, struct fsxattr)`.
const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
/// `FS_IOC_FSSETXATTR`: `_IOW('X', 32, struct fsxattr)`.
const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
/// `sizeof(struct fsxattr)`.
const FSXATTR_LEN: u32 = 28;
/// `struct fsxattr`'s flags for the `FS_*_FL` flags lode keeps.
const XFLAGS: [(u32, u32); 2] = [
    (0x8, lode_base::perm::FS_IMMUTABLE_FL),
    (0x10, lode_base::perm::FS_APPEND_FL),
];

/// A `struct fsxattr` saying `flags` (`FS_*_FL`), the rest zero.
fn fsxattr_of(flags: u32) -> [u8; FSXATTR_LEN as usize] {
    let x = map_bits(flags, XFLAGS.map(|(x, f)| (f, x)));
    let mut b = [0u8; FSXATTR_LEN as usize];
    b[..4].copy_from_slice(&x.to_ne_bytes());
    b
}

/// The `FS_*_FL` flags a `struct fsxattr` sets: EOPNOTSUPP for a flag, extent size or
/// project lode does not keep, EINVAL for a short one.
fn fsxattr_flags(b: &[u8]) -> Result<u32, i32> {
    let word = |i: usize| {
        b.get(i * 4..i * 4 + 4)
            .and_then(|w| <[u8; 4]>::try_from(w).ok())
            .map(u32::from_ne_bytes)
            .ok_or(libc::EINVAL)
    };
    let (xflags, extsize, projid, cowextsize) = (word(0)?, word(1)?, word(3)?, word(4)?);
    let known = map_bits(u32::MAX, XFLAGS.map(|(x, _)| (x, x)));
    if xflags & !known != 0 || extsize != 0 || projid != 0 || cowextsize != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(map_bits(xflags, XFLAGS))
}

/// A kernel lock request (bytes `start..=end`) as the client's.
fn flock_args(
    fid: Fid,
    owner: u64,
    (start, end): (u64, u64),
    typ: i32,
    pid: u32,
    wait: bool,
) -> Result<FlockArgs, Errno> {
    if !matches!(typ, libc::F_RDLCK | libc::F_WRLCK | libc::F_UNLCK) {
        return Err(Errno::EINVAL);
    }
    Ok(FlockArgs {
        fid,
        owner,
        pid,
        typ: typ as u32,
        start,
        end,
        wait,
        test: false,
    })
}

/// A NUL-separated list of xattr names without those this mount refuses (see
/// [`refused`]).
fn without_refused(opts: &MountOptions, list: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len());
    for name in list.split_inclusive(|&b| b == 0) {
        if !refused(opts, name.strip_suffix(&[0]).unwrap_or(name)) {
            out.extend_from_slice(name);
        }
    }
    out
}

/// Whether this mount refuses xattr `name` (EOPNOTSUPP) and leaves it out of
/// listings: the SELinux label without `seclabel`, ACLs with `noacl`.
fn refused(opts: &MountOptions, name: &[u8]) -> bool {
    name == SELINUX_XATTR && !opts.seclabel || !opts.acl && acl::is_acl_name(name)
}

/// The kernel's file type for a directory entry's `d_type`.
fn dtype_kind(d: u8) -> crate::kernel::FileType {
    lode_base::FileType::from_mode(dtype_mode(d)).map_or(crate::kernel::FileType::RegularFile, kind)
}

/// The `S_IFMT` bits for a `d_type`.
fn dtype_mode(d: u8) -> u32 {
    match d {
        libc::DT_DIR => libc::S_IFDIR,
        libc::DT_LNK => libc::S_IFLNK,
        libc::DT_FIFO => libc::S_IFIFO,
        libc::DT_SOCK => libc::S_IFSOCK,
        libc::DT_CHR => libc::S_IFCHR,
        libc::DT_BLK => libc::S_IFBLK,
        _ => libc::S_IFREG,
    }
}

impl Inner {
    /// Runs the lock call `call` on `fid` from open file `fh`; if it is `refused`, waits
    /// for the RELEASEs of this mount's other open files of `fid` that took locks: to
    /// its end for one that came, at most [`RELEASE_WAIT`] for one that had a
    /// descriptor closed and may have one to come. If any RELEASE ended
    /// since the call began, runs it again: a lock that `close(2)` ended on this mount
    /// is free to the next call.
    async fn after_closes<T, F>(
        &self,
        fid: Fid,
        fh: u64,
        call: impl Fn() -> F,
        refused: impl Fn(&T) -> bool,
    ) -> T
    where
        F: Future<Output = T>,
    {
        let went = self.flock_files.went.load(Ordering::Acquire);
        let r = call().await;
        if !refused(&r) {
            return r;
        }
        // This mount's other open files of `fid` that may be dropping locks: whether
        // one's RELEASE came (it is waited for to its end), and whether one only had a
        // descriptor closed (its RELEASE may follow, or not: waited for a while).
        let closing = || {
            let by_fh = self.flock_files.by_fh.lock();
            let others = || by_fh.iter().filter(|&(&k, f)| k != fh && f.fid == fid);
            (
                others().any(|(_, f)| f.releasing),
                others().any(|(_, f)| f.closed.is_some_and(|t| t.elapsed() < CLOSE_RECENT)),
            )
        };
        let deadline = tokio::time::Instant::now() + RELEASE_WAIT;
        let released = async {
            loop {
                // Made before the check, so a RELEASE ending in between still wakes it.
                let gone = self.flock_files.gone.notified();
                match closing() {
                    (true, _) => gone.await,
                    (false, true) => {
                        if tokio::time::timeout_at(deadline, gone).await.is_err() {
                            return;
                        }
                    }
                    (false, false) => return,
                }
            }
        };
        // A RELEASE under way ends with the MDT's answer, or the client's timeout.
        let _ = tokio::time::timeout(RELEASING_WAIT, released).await;
        // Refused by a lock that a RELEASE dropped since the call began (the call may
        // have passed it on the way to the MDT): asked again.
        if self.flock_files.went.load(Ordering::Acquire) == went {
            return r;
        }
        call().await
    }

    /// Open file `fh` was released, its flock locks dropped.
    fn flock_file_gone(&self, fh: u64) {
        if self.flock_files.by_fh.lock().remove(&fh).is_some() {
            self.flock_files.went.fetch_add(1, Ordering::AcqRel);
            self.flock_files.gone.notify_waiters();
        }
    }

    /// The entries of the directory open as `fh` from FUSE offset `offset` (the cookie
    /// of the entry wanted) on: the handle's last page when it covers the offset (else
    /// the page read from there), and where in it they start. The kernel takes a few per call (a 4 KiB buffer), so
    /// the page is shared, never copied per call.
    async fn dir_entries(
        &self,
        cred: &Cred,
        fh: Fh,
        offset: u64,
        plus: bool,
    ) -> Result<(Arc<Vec<DirEntry>>, usize, u64), Errno> {
        let d = self.dirs.lock().get(&fh.0).cloned().ok_or(Errno::EBADF)?;
        let mut d = d.lock().await;
        // A listing read through the daemon moves the directory's access time (the
        // kernel forgets its copy of it after each READDIR that reaches here).
        if let Some(open) = &d.open {
            self.client.note_access(open);
        }
        // Attributes with the names are statahead's delivery: `statahead_max=0` turns
        // them off, and each stat is then an RPC of its own, as in Lustre.
        let plus = plus && self.client.statahead_max() != 0;
        // From the start: only the open's page, and only while the directory is as it
        // was then (a rewind, or files made since the opendir, read it again).
        let from_start = offset == lode_base::hash::DOT_COOKIE;
        let current = !from_start
            || d.opened_at
                .take()
                .is_some_and(|t| self.client.cached_dir_times(d.fid) == Some(t));
        let cached = current
            && !d.page.is_empty()
            && d.page.first().is_some_and(|e| e.cookie <= offset)
            && (offset < d.next || d.next == lode_base::hash::END_COOKIE)
            && (!plus || d.plus);
        if !cached {
            if offset >= lode_base::hash::END_COOKIE {
                return Ok((Arc::default(), 0, self.client.inval_seq()));
            }
            // A page read ahead for another call is not waited for; one that failed
            // is asked for again now.
            let mut ahead = None;
            if let Some(a) = d.ahead.take() {
                if a.cookie == offset && a.plus == plus {
                    if let Ok(Ok(page)) = a.page.await {
                        ahead = Some((page, a.seq));
                    }
                } else {
                    a.page.abort();
                }
            }
            let (page, seq) = match ahead {
                Some(got) => got,
                None => {
                    // The first page with attributes is a small one: the kernel takes
                    // a few dozen entries per call, and a small directory is then
                    // listed in one RPC.
                    let count = if plus && offset == 0 {
                        FIRST_PLUS_ENTRIES
                    } else {
                        0
                    };
                    let seq = self.client.inval_seq();
                    let page = self
                        .client
                        .readdir_n(cred, d.fid, offset, plus, count)
                        .await?;
                    (page, seq)
                }
            };
            self.take_dir_page(cred, &mut d, page, seq, plus, offset);
        }
        // Cookies increase through a page.
        let start = d.page.partition_point(|e| e.cookie < offset);
        Ok((d.page.clone(), start, d.seq))
    }

    /// Makes `page` (read at `offset`, `plus` if attributes were asked for, after
    /// invalidation count `seq`) the handle's page, and reads the next one ahead.
    fn take_dir_page(
        &self,
        cred: &Cred,
        d: &mut DirHandle,
        page: lode_client::ReaddirRep,
        seq: u64,
        plus: bool,
        offset: u64,
    ) {
        d.plus = page.entries.iter().all(|e| e.body.is_some());
        d.page = Arc::new(page.entries);
        d.next = page.next;
        d.seq = seq;
        if page.next != lode_base::hash::END_COOKIE {
            // In `auto` mode the kernel asks for attributes with the first page
            // always, and with a later one only if stats followed the page before
            // it (`ls -l`, not `ls` or `find`): the page after a later one is read
            // ahead as that one was asked for, the page after the first with names
            // only (unless every page carries attributes).
            let plus = plus && (self.opts.readdirplus_always || offset != 0);
            let (client, cred, fid, cookie) = (self.client.clone(), cred.clone(), d.fid, page.next);
            let seq = client.inval_seq();
            let page =
                tokio::spawn(async move { client.readdir_n(&cred, fid, cookie, plus, 0).await });
            d.ahead = Some(Ahead {
                cookie,
                plus,
                seq,
                page,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{without_refused, MountOptions};
    use std::time::Duration;

    fn opts(seclabel: bool, acl: bool) -> MountOptions {
        MountOptions {
            attr_timeout: Duration::ZERO,
            entry_timeout: Duration::ZERO,
            writeback: false,
            threads: 1,
            readdirplus_always: false,
            cluster_locks: true,
            seclabel,
            acl,
            btime: true,
        }
    }

    #[test]
    fn fsxattr_carries_the_immutable_and_append_flags_and_refuses_the_rest() {
        use super::{fsxattr_flags, fsxattr_of};
        use lode_base::perm::{FS_APPEND_FL, FS_IMMUTABLE_FL};
        let both = FS_IMMUTABLE_FL | FS_APPEND_FL;
        let b = fsxattr_of(both);
        assert_eq!(&b[..4], &0x18u32.to_ne_bytes());
        assert!(b[4..].iter().all(|&x| x == 0));
        assert_eq!(fsxattr_flags(&b), Ok(both));
        assert_eq!(fsxattr_flags(&fsxattr_of(0)), Ok(0));
        let mut sync = fsxattr_of(0);
        sync[0] = 0x20; // FS_XFLAG_SYNC
        assert_eq!(fsxattr_flags(&sync), Err(libc::EOPNOTSUPP));
        let mut project = fsxattr_of(0);
        project[12] = 7;
        assert_eq!(fsxattr_flags(&project), Err(libc::EOPNOTSUPP));
        assert_eq!(fsxattr_flags(&b[..10]), Err(libc::EINVAL));
    }

    #[test]
    fn the_selinux_label_is_taken_out_of_an_xattr_list_and_nothing_else() {
        let cases: [(&[u8], &[u8]); 5] = [
            (b"", b""),
            (b"security.selinux\0", b""),
            (b"user.a\0security.selinux\0user.b\0", b"user.a\0user.b\0"),
            (
                b"security.selinuxx\0security.capability\0",
                b"security.selinuxx\0security.capability\0",
            ),
            (b"user.a\0security.selinux", b"user.a\0"),
        ];
        for (list, want) in cases {
            assert_eq!(
                without_refused(&opts(false, true), list),
                want,
                "{:?}",
                String::from_utf8_lossy(list)
            );
        }
    }

    #[test]
    fn acls_are_left_out_of_a_noacl_mounts_lists_only() {
        let list = b"system.posix_acl_access\0user.a\0system.posix_acl_default\0";
        assert_eq!(without_refused(&opts(true, false), list), b"user.a\0");
        assert_eq!(without_refused(&opts(true, true), list), list);
    }
}
