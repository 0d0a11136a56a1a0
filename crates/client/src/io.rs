//! Open files and striped I/O: requests are split by component and stripe, cut to the
//! bulk size, and sent concurrently to the OSTs (raid0 components) or the MDT
//! (Data-on-MDT); sizes come from glimpses. A write reaching a component not yet
//! instantiated first asks the MDT to instantiate it (layout intent).

use crate::Client;
use lode_base::layout::{
    file_offset_from_object, file_size_from_object, object_size_for_file, Chunk,
};
use lode_base::limits::FILE_SIZE_MAX;
use lode_base::perm::{FS_APPEND_FL, FS_IMMUTABLE_FL};
use lode_base::{Attr, Cred, Errno, Fid, Layout, Pattern, SetAttr};
use lode_proto::{
    CloseReq, CreateRep, DomPrefetch, DomReadReq, DomSeekReq, DomWriteReq, GetattrReq,
    LayoutIntentReq, MdtBody, ObjAttr, ObjId, ObjsReq, OstReadReq, OstWriteReq, PunchReq, Reply,
    Request, SetattrReq,
};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tracing::debug;

/// Largest piece of one stripe chunk sent in one RPC.
const PIECE: usize = 1 << 20;
/// Times a read is done again because the layout changed under it before giving up
/// (EAGAIN): a file migrated again and again meanwhile.
const LAYOUT_RETRIES: usize = 16;
/// How long a migration's start is asked again while the file is open for writing
/// (a writer's close may still be on its way), and the first pause between asks.
const MIGRATE_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
const MIGRATE_BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// Read-on-open bytes and what keeps them current. The MDT sends them only while the
/// file is not marked as being written, and the open for writing that marks it next
/// calls back every attributes lock on it (as any truncate does). So the bytes answer
/// reads if an attributes lock was held when the MDT read them (one held before the
/// open left, or granted with it), nothing has made this client forget the file's
/// attributes since (a callback, a lock given back unasked, an eviction), and this
/// client wrote nothing since. A newer lock taking the place of that one (a getattr's)
/// is no reason to forget.
#[derive(Clone, Debug)]
pub(crate) struct Prefetch {
    pub(crate) bytes: Arc<DomPrefetch>,
    /// `Client::data_epoch` before the open left.
    pub(crate) epoch: u64,
    /// `Client::inval_seq` before the open left.
    pub(crate) seq: u64,
}

/// What a glimpse finds of a file: size, 512-byte blocks, mtime, ctime.
pub(crate) type Glimpsed = (u64, u64, i64, i64);

/// An open file.
#[derive(Clone, Debug)]
pub struct FileHandle {
    /// The file.
    pub fid: Fid,
    /// The MDT's open handle.
    pub handle: u64,
    /// `O_*` flags it was opened with.
    pub flags: i32,
    /// The layout: as opened, then as this client instantiated or refreshed it (shared
    /// by the handle's clones).
    pub(crate) layout: Arc<RwLock<Option<Layout>>>,
    /// Attributes at open time.
    pub attr: Attr,
    /// Something was (or may have been) written through this handle (shared by its
    /// clones); told to the MDT at close.
    pub wrote: Arc<AtomicBool>,
    /// The file was truncated through this handle (shared by its clones): its close is
    /// not one that changes nothing (see `Client::close_ahead`).
    pub(crate) truncated: Arc<AtomicBool>,
    /// See `Client::open_epoch`: a handle from before an eviction (or an MDT restart)
    /// is gone on the MDT, and its I/O fails with EIO.
    pub(crate) epoch: (u64, u64),
    /// Read-on-open: the file's first bytes as the open found them (see
    /// [`Prefetch`]).
    pub(crate) prefetch: Option<Prefetch>,
    /// The PR LAYOUT lock that keeps `layout` current, by its token (see
    /// `LayoutLocks`; 0: none): granted with the open (released by the MDT at close),
    /// or taken again by this client after a callback (`own_lock`: cancelled at
    /// close).
    pub(crate) layout_lock: Arc<AtomicU64>,
    pub(crate) own_lock: Arc<AtomicBool>,
    /// A read-only open of a Data-on-MDT file with no writer: the MDT's name for the
    /// file's bytes as the open found them (`CreateRep::data_token`; 0: none).
    pub data_token: u64,
    /// The open was asked with a token (`Client::open_cached`) that still names the
    /// file's bytes: the caller's copy is current, and no read-on-open bytes came.
    pub cache_current: bool,
    /// The latest access time a read through this handle gave the file (shared by
    /// its clones; 0: none yet), so its next reads judge `relatime` by it.
    pub(crate) accessed: Arc<std::sync::atomic::AtomicI64>,
}

impl FileHandle {
    /// The file's layout as this handle knows it.
    pub fn layout(&self) -> Option<Layout> {
        self.layout.read().clone()
    }

    /// Keeps `l` if it is newer than the layout known.
    fn newer_layout(&self, l: &Layout) {
        let mut cur = self.layout.write();
        if cur.as_ref().is_none_or(|c| c.gen < l.gen) {
            *cur = Some(l.clone());
        }
    }

    /// True if opened for writing.
    pub fn writable(&self) -> bool {
        let acc = self.flags & libc::O_ACCMODE;
        acc == libc::O_WRONLY || acc == libc::O_RDWR
    }
}

/// The most zeros one write of a fallocate's Data-on-MDT range carries.
const ZERO_WRITE_MAX: u64 = 1 << 20;

fn objects(fid: Fid, layout: &Layout) -> Vec<(usize, u32, u32, ObjId)> {
    let mut out = Vec::new();
    for (ci, c) in layout.components.iter().enumerate() {
        if let Pattern::Raid0 { osts, .. } = &c.pattern {
            for (i, o) in osts.iter().enumerate() {
                out.push((
                    ci,
                    i as u32,
                    *o,
                    ObjId {
                        fid,
                        comp: c.id,
                        stripe: i as u32,
                    },
                ));
            }
        }
    }
    out
}

/// A file this client made, as its writes left its OST objects or its Data-on-MDT
/// bytes: for the close of the handle that made it, whose size, blocks and mtime are
/// then known without a glimpse (Lustre's client sends them from what its locks
/// cover). Only that handle's close uses it. For OST objects, the MDT keeps what the
/// close says only if that handle was the file's only writer since its open (anyone
/// else's writes, or a truncate, make it ignore it). For a file all on the MDT, the
/// close rides ahead with nothing to say (see `Client::close_ahead`). Another writer
/// here, a setattr, a fallocate or a failed write ends it.
pub(crate) struct Known {
    /// The MDT's open handle that made the file.
    handle: u64,
    /// The layout generation then: another (a migration, a new component) ends it.
    gen: u32,
    /// Each object written, as the last answer said: sizes and blocks only grow
    /// without a truncate (which ends this), so the largest seen is the latest.
    objs: HashMap<ObjId, ObjAttr>,
    /// The MDT's size, blocks and mtime as the DOM_WRITE answers left them, the
    /// largest of each (they only grow without a truncate or a setattr, which end
    /// this); `None` before the first answer.
    dom: Option<lode_proto::CloseAttrs>,
    /// The data token of the latest of those answers (by mtime; a wrong pick only
    /// costs a cache miss, as the MDT checks it).
    dom_token: u64,
    /// DOM_WRITEs sent and not answered yet: while any is out, `dom` may miss it.
    dom_out: u32,
    /// OST writes sent and not answered yet: while any is out, `objs` may miss it.
    ost_out: u32,
    /// The attributes lock the create granted (0: none): while the copy kept is
    /// under it, no other client changed the file (a callback would have ended it).
    lock: u64,
    /// The write-back lock the create granted, until the first write uses it or the
    /// handle closes (0: none, or used; see [`crate::writeback`]).
    dom_lock: u64,
}

/// What a DOM_WRITE's answer says it left of the file (`None`: it failed).
fn dom_written(rep: &Result<Reply, Errno>) -> Option<&lode_proto::DomWriteRep> {
    match rep {
        Ok(Reply::DomWrite(r)) => Some(r),
        _ => None,
    }
}

fn raid0_geometry(layout: &Layout, ci: usize) -> Option<(u64, u64, u32, &[u32])> {
    let c = layout.components.get(ci)?;
    match &c.pattern {
        Pattern::Raid0 {
            stripe_size, osts, ..
        } if !osts.is_empty() => Some((c.start, *stripe_size, osts.len() as u32, osts.as_slice())),
        _ => None,
    }
}

impl Client {
    /// Opens `fid`. `O_TRUNC` truncates (MDT size and OST objects).
    pub async fn open(&self, cred: &Cred, fid: Fid, flags: i32) -> Result<FileHandle, Errno> {
        self.open_cached(cred, fid, flags, 0).await
    }

    /// [`Client::open`] by a caller holding the file's bytes as `cached` (a
    /// `data_token` from an earlier open or close; 0: none) named them: if they are
    /// still the file's, the handle says so (`cache_current`) and no read-on-open
    /// bytes are sent.
    ///
    /// A plain read-only open may be served by a handle kept under an OPEN lock (see
    /// [`crate::opencache`]).
    pub async fn open_cached(
        &self,
        cred: &Cred,
        fid: Fid,
        flags: i32,
        cached: u64,
    ) -> Result<FileHandle, Errno> {
        self.open_inner(cred, fid, flags, cached, true, None)
            .await
            .map(|(fh, _)| fh)
    }

    /// Opens a directory for reading, its first readdir page (`plus`: with
    /// attributes; at most about `count` entries, 0: a full page) coming with the
    /// open's reply, taken in as [`Client::readdir_n`] takes a page. None if the reply
    /// came without it (a resent open's): the caller reads it.
    pub async fn open_dir(
        &self,
        cred: &Cred,
        fid: Fid,
        plus: bool,
        count: u32,
    ) -> Result<(FileHandle, Option<lode_proto::ReaddirRep>), Errno> {
        let want = lode_proto::FirstPage { plus, count };
        let (fh, page) = self
            .open_inner(
                cred,
                fid,
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
                false,
                Some(want),
            )
            .await?;
        let page = match page {
            Some(p) => match self.take_page(cred, fid, lode_base::hash::DOT_COOKIE, plus, p) {
                Ok(p) => Some(p),
                Err(e) => {
                    let _ = self.close(&fh).await;
                    return Err(e);
                }
            },
            None => None,
        };
        Ok((fh, page))
    }

    /// An open whose handle is its own (never kept, nor a kept one): one whose close
    /// must reach the MDT (a migration's).
    async fn open_own(&self, cred: &Cred, fid: Fid, flags: i32) -> Result<FileHandle, Errno> {
        self.open_inner(cred, fid, flags, 0, false, None)
            .await
            .map(|(fh, _)| fh)
    }

    async fn open_inner(
        &self,
        cred: &Cred,
        fid: Fid,
        flags: i32,
        cached: u64,
        keep: bool,
        first_page: Option<lode_proto::FirstPage>,
    ) -> Result<(FileHandle, Option<lode_proto::ReaddirRep>), Errno> {
        let plain = keep && lode_base::perm::plain_read(flags);
        if lode_base::perm::wants_write(flags) {
            // Another writer of a file a handle here made: that handle's close cannot
            // vouch for the size alone any more.
            self.forget_made(fid);
        }
        if plain && !self.opencache.is_empty() {
            self.close_expired();
            if let Some(fh) = self.reuse_open(cred, fid, flags, cached) {
                return Ok((fh, None));
            }
        }
        // Taken before the request leaves: a local write or truncate that starts while
        // it is out may postdate the MDT's copy of the data, so the copy must not be
        // taken as current after it.
        let data_epoch = self.data_epoch.load(Ordering::Acquire);
        let seq = self.inval_seq();
        let open_lock = plain && self.callback_channel_up() && self.opencache.wants_lock(fid);
        let attr_lock = self.attr_lock(fid);
        let req = Request::Open(lode_proto::OpenReq {
            cred: cred.clone(),
            fid,
            flags: flags as u32,
            cached,
            open_lock,
            first_page,
        });
        let rep = match self.md(req.clone()).await {
            // Over the MDT's `max_open_files_per_client`: the idle kept handles go
            // first.
            Err(Errno::ENFILE) if self.close_idle_kept().await => self.md(req).await,
            r => r,
        };
        let mut rep = match rep? {
            Reply::Open(r) => r,
            _ => return Err(Errno::EPROTO),
        };
        let dir_page = rep.dir_page.take();
        // The attributes lock that vouches for the reply: one granted with it, or the
        // one held across it.
        let attr_lock = if rep.body.lock != 0 {
            self.remember(&rep.body, None);
            rep.body.lock
        } else {
            attr_lock
        };
        let fh = FileHandle {
            fid,
            handle: rep.handle.ok_or(Errno::EPROTO)?,
            flags,
            layout: Arc::new(RwLock::new(rep.body.layout.clone())),
            attr: rep.body.attr.clone(),
            wrote: Arc::default(),
            truncated: Arc::default(),
            epoch: self.open_epoch(),
            prefetch: rep
                .dom_data
                .filter(|_| {
                    attr_lock != 0
                        && self.attr_lock(fid) != 0
                        && !self.forgotten_since(seq, None, fid)
                })
                .map(|d| Prefetch {
                    bytes: Arc::new(d),
                    epoch: data_epoch,
                    seq,
                }),
            layout_lock: Arc::new(AtomicU64::new(self.keep_layout_lock(rep.layout_lock))),
            own_lock: Arc::default(),
            data_token: rep.data_token,
            cache_current: cached != 0 && rep.cache_current,
            accessed: Arc::default(),
        };
        if rep.open_lock != 0 {
            // The attributes lock held across the open, if the same one still is.
            let attr_lock = if attr_lock != 0 && self.attr_lock(fid) == attr_lock {
                attr_lock
            } else {
                0
            };
            self.keep_open(cred, &fh, rep.open_lock, attr_lock, data_epoch);
        }
        if flags & libc::O_TRUNC != 0 && fh.attr.ftype() == lode_base::FileType::Regular {
            if let Err(e) = self.truncate_open(cred, &fh, 0).await {
                let _ = self.close(&fh).await;
                return Err(e);
            }
        }
        Ok((fh, dir_page))
    }

    /// Creates and opens a regular file in one RPC (open intent); without `O_EXCL` an
    /// existing file is opened instead.
    pub async fn create_open(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        mode: u32,
        flags: i32,
        layout: Option<Layout>,
    ) -> Result<FileHandle, Errno> {
        self.create_open_umask(cred, parent, name, mode, 0, flags, layout)
            .await
    }

    /// [`Client::create_open`] with the caller's umask left to the MDT (see
    /// [`Client::mkdir_umask`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn create_open_umask(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
        layout: Option<Layout>,
    ) -> Result<FileHandle, Errno> {
        let (fid, rep) = self
            .create_rpc(
                cred,
                parent,
                name,
                mode,
                umask,
                flags | libc::O_CREAT,
                layout,
            )
            .await?;
        self.remember(&rep.body, Some((parent, name, cred)));
        // Created or found, the name is in the directory now.
        self.remember_parent(
            rep.parent.as_ref(),
            parent,
            cred,
            crate::locks::DirChange::Add(name),
        );
        let fh = self.created_handle(fid, &rep, flags)?;
        if rep.body.attr.fid != fid && flags & libc::O_TRUNC != 0 {
            // An existing file was opened: O_TRUNC applies to it.
            if let Err(e) = self.truncate_open(cred, &fh, 0).await {
                let _ = self.close(&fh).await;
                return Err(e);
            }
        }
        Ok(fh)
    }

    /// Makes a regular file with no name, open with `flags` (which must ask for
    /// writing), as `open(dir, O_TMPFILE)` does: `parent` lends it permissions, group,
    /// default ACLs and layout. Its last close destroys it unless [`Client::link`]
    /// names it first, which a file made with `O_EXCL` refuses (ENOENT).
    pub async fn tmpfile(
        &self,
        cred: &Cred,
        parent: Fid,
        mode: u32,
        umask: u32,
        flags: i32,
        layout: Option<Layout>,
    ) -> Result<FileHandle, Errno> {
        let flags = flags & !(libc::O_TMPFILE | libc::O_CREAT | libc::O_TRUNC);
        let open = flags | libc::O_CREAT | lode_base::perm::O_TMPFILE_BIT;
        let (fid, rep) = self
            .create_rpc(cred, parent, b"", mode, umask, open, layout)
            .await?;
        if rep.body.attr.fid != fid {
            return Err(Errno::EPROTO);
        }
        self.remember(&rep.body, None);
        self.created_handle(fid, &rep, flags)
    }

    /// An open-create of a regular file `name` (empty with `O_TMPFILE`) in `parent`,
    /// with a FID of this client's: the FID asked for and the MDT's answer.
    #[allow(clippy::too_many_arguments)]
    async fn create_rpc(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        mode: u32,
        umask: u32,
        open_flags: i32,
        layout: Option<Layout>,
    ) -> Result<(Fid, CreateRep), Errno> {
        let fid = self.alloc_fid().await?;
        match self
            .md(Request::Create(lode_proto::CreateReq {
                cred: cred.clone(),
                parent,
                name: name.to_vec(),
                fid,
                mode: libc::S_IFREG | (mode & 0o7777),
                umask,
                rdev: 0,
                target: Vec::new(),
                layout,
                open_flags: Some(open_flags as u32),
                dom_writeback: self.dom_writeback()
                    && lode_base::perm::wants_write(open_flags)
                    && self.callback_channel_up(),
            }))
            .await?
        {
            Reply::Create(r) => Ok((fid, r)),
            _ => Err(Errno::EPROTO),
        }
    }

    /// The handle of an answered open-create that asked for `fid` with `flags`.
    fn created_handle(&self, fid: Fid, rep: &CreateRep, flags: i32) -> Result<FileHandle, Errno> {
        let fh = FileHandle {
            fid: rep.body.attr.fid,
            handle: rep.handle.ok_or(Errno::EPROTO)?,
            flags,
            layout: Arc::new(RwLock::new(rep.body.layout.clone())),
            attr: rep.body.attr.clone(),
            wrote: Arc::default(),
            truncated: Arc::default(),
            epoch: self.open_epoch(),
            prefetch: None,
            layout_lock: Arc::new(AtomicU64::new(self.keep_layout_lock(rep.layout_lock))),
            own_lock: Arc::default(),
            data_token: 0,
            cache_current: false,
            accessed: Arc::default(),
        };
        match &rep.body.layout {
            // Made here: this client sees every write its handles make (anyone else's
            // makes the MDT ignore the close's size, or calls back the attributes
            // lock a close ahead relies on).
            Some(l) if rep.body.attr.fid == fid && fh.writable() => {
                let dom_lock = if self.keep_dom_lock(rep.dom_lock) {
                    rep.dom_lock
                } else {
                    0
                };
                self.known.lock().insert(
                    fid,
                    Known {
                        handle: fh.handle,
                        gen: l.gen,
                        objs: HashMap::new(),
                        dom: None,
                        dom_token: 0,
                        dom_out: 0,
                        ost_out: 0,
                        lock: rep.body.lock,
                        dom_lock,
                    },
                );
            }
            // An existing file opened for writing: another writer here.
            _ if fh.writable() => self.forget_made(fh.fid),
            _ => {}
        }
        if rep.dom_lock != 0 && !self.known.lock().contains_key(&fid) {
            self.give_back(rep.dom_lock);
        }
        Ok(fh)
    }

    /// How often the MDT had forgotten this client, and evicted it, when a handle opened
    /// now was opened.
    pub(crate) fn open_epoch(&self) -> (u64, u64) {
        (self.mdc.forgotten(), self.evictions())
    }

    /// EIO for a handle the MDT no longer has: opened before this client was evicted
    /// (a restart the client recovered from keeps its handles).
    fn check_live(&self, fh: &FileHandle) -> Result<(), Errno> {
        if fh.epoch == self.open_epoch() {
            Ok(())
        } else {
            Err(Errno::EIO)
        }
    }

    /// The access time a read through `fh` gives its file now, if it moves it (see
    /// [`ClientConfig::atime`]), judged from its attributes as held under a lock, or as
    /// it was opened, and the reads through it since.
    fn access_time(&self, fh: &FileHandle) -> Option<i64> {
        let dir = fh.attr.is_dir();
        if dir && !self.cfg.diratime {
            return None;
        }
        let (atime, mtime, ctime) =
            self.cached_times(fh.fid)
                .unwrap_or((fh.attr.atime, fh.attr.mtime, fh.attr.ctime));
        let atime = atime.max(fh.accessed.load(Ordering::Acquire));
        let now = lode_base::attr::now_ns();
        lode_base::attr::atime_due(self.cfg.atime, atime, mtime, ctime, now).then_some(now)
    }

    /// A read through `fh` (of a file, or a directory's listing): moves the file's
    /// access time if [`ClientConfig::atime`]'s rule says so, here at once (what this
    /// client shows) and on the MDT lazily, ahead of the next request (Lustre's client
    /// too tells its MDT at close). FUSE leaves access times to the file system.
    /// True if it moved it.
    pub fn note_access(&self, fh: &FileHandle) -> bool {
        let Some(now) = self.access_time(fh) else {
            return false;
        };
        if fh.accessed.fetch_max(now, Ordering::AcqRel) >= now {
            return false;
        }
        self.cache_atime(fh.fid, now);
        self.mdc.access_ahead(fh.handle, now);
        true
    }

    /// A write or truncate of `fid` through this client is about to go out: moves
    /// [`Client::data_epoch`] and the file's own counter (see `file_epochs`).
    fn data_moved(&self, fid: Fid) {
        self.data_epoch.fetch_add(1, Ordering::AcqRel);
        self.file_epoch(fid).fetch_add(1, Ordering::AcqRel);
    }

    /// The counter of `file_epochs` that `fid` moves.
    fn file_epoch(&self, fid: Fid) -> &std::sync::atomic::AtomicU64 {
        &self.file_epochs[(fid.ino() % self.file_epochs.len() as u64) as usize]
    }

    /// Closes an open file.
    pub async fn close(&self, fh: &FileHandle) -> Result<(), Errno> {
        self.close_token(fh).await.map(|_| ())
    }

    /// [`Client::close`], returning the close's `data_token` (0: none): set when this
    /// was the last writer of a Data-on-MDT file and nobody else wrote or truncated it
    /// since its open (for a close ahead, the one its last DOM_WRITE's answer gave).
    pub async fn close_token(&self, fh: &FileHandle) -> Result<u64, Errno> {
        let failed = self.written_back(fh).await;
        let closed = self.close_token_inner(fh).await;
        failed?;
        closed
    }

    /// Waits for the write kept back through `fh`'s file, if any, and gives back the
    /// write-back lock of a handle about to close that did not use it; how a write
    /// kept back failed, if one did (see [`crate::writeback`]).
    async fn written_back(&self, fh: &FileHandle) -> Result<(), Errno> {
        self.wb.wait(fh.fid).await;
        let unused = {
            let mut known = self.known.lock();
            match known.get_mut(&fh.fid) {
                Some(k) if k.handle == fh.handle => std::mem::take(&mut k.dom_lock),
                _ => 0,
            }
        };
        self.give_back_dom_lock(unused);
        self.wb.take_error(fh.fid)
    }

    /// How a write kept back through `fid` failed, if it did and is known by now
    /// (told once): `close(2)`'s FLUSH says so without waiting for it, as a
    /// write-back cache's close does, and so do the next `fsync` and close.
    pub fn write_back_error(&self, fid: Fid) -> Result<(), Errno> {
        self.wb.take_error(fid)
    }

    /// `llite.*.dom_writeback`: whether the first write of a small Data-on-MDT file
    /// made here is kept back past `write(2)` (see [`crate::writeback`]).
    pub fn dom_writeback(&self) -> bool {
        self.dom_writeback.load(Ordering::Relaxed)
    }

    /// Sets `llite.*.dom_writeback` (for files created from now on).
    pub fn set_dom_writeback(&self, on: bool) {
        self.dom_writeback.store(on, Ordering::Relaxed);
    }

    /// Whether a write to `fid` is kept back (see [`crate::writeback`]): its close
    /// will wait for it.
    pub fn write_back_pending(&self, fid: Fid) -> bool {
        self.wb.pending(fid)
    }

    /// Gives back write-back lock `lock` (0: none) if it is held and unused.
    fn give_back_dom_lock(&self, lock: u64) {
        if lock != 0 && self.wb.unused(lock) {
            self.give_back(lock);
        }
    }

    async fn close_token_inner(&self, fh: &FileHandle) -> Result<u64, Errno> {
        if self.opencache.release(fh) {
            return Ok(0);
        }
        if let Some(token) = self.close_ahead(fh) {
            return Ok(token);
        }
        self.close_on_mdt(fh).await
    }

    /// [`Client::close`], the MDT's answer awaited: the close of a handle nothing was
    /// written through does not ride ahead of a later request, so the file is closed
    /// on the MDT when this returns (e.g. before another client unlinks it: no orphan
    /// is left to clean up).
    pub async fn close_now(&self, fh: &FileHandle) -> Result<(), Errno> {
        let failed = self.written_back(fh).await;
        if self.opencache.release(fh) {
            return failed;
        }
        self.close_on_mdt(fh).await?;
        failed
    }

    /// Closes a handle with no round trip of its own: its close leaves ahead of the
    /// next MDT request (see `Import::close_ahead`). Such a close changes nothing this
    /// client must learn. A read-only handle's answer is about writers' sizes; a
    /// writer that wrote nothing (a `creat` and its `close`, mdtest's create phase,
    /// `touch`) at most lets the MDT take back the "data on OSTs" mark its open set,
    /// and this client, which knows the size from the open, need not hear that. So
    /// does the handle that made a file all on the MDT and was its only writer (a
    /// small file's create, write and close: Lustre's Data-on-MDT fast path): the
    /// answers to its DOM_WRITEs said the size, blocks and mtime they left, and its
    /// attributes lock, granted while no other client wrote the file and called back
    /// by any open for writing since, says nobody else changed them (see
    /// `Client::maker_closed_exact`), and the data token that names its bytes then
    /// (see `Client::close_token`). And the handle that made a file all on OSTs and
    /// alone wrote it (mdtest's hard files, a copy of small files): the answers to its
    /// writes said what the objects hold, which its close ahead tells the MDT (lazy
    /// size on MDT), and the same lock says nobody else changed them. `None` for any
    /// other handle written through or truncated with, which the caller closes by RPC
    /// with the size it knows; else the close's data token (0: none).
    fn close_ahead(&self, fh: &FileHandle) -> Option<u64> {
        if fh.truncated.load(Ordering::Acquire)
            || fh.own_lock.load(Ordering::Acquire)
            || self.check_live(fh).is_err()
        {
            return None;
        }
        let wrote = fh.wrote.load(Ordering::Acquire);
        if wrote && self.cached(fh.fid, |b| b.attr.nlink) == Some(0) {
            // No name left: this close may be its last, which destroys it. By RPC,
            // so that nothing here answers for the file after (its copy held under
            // a lock would, until some request carried the close).
            return None;
        }
        let token = if wrote && fh.layout().is_some_and(|l| l.has_objects()) {
            let (a, lock) = self.ost_known_at_close(fh)?;
            if !self.mdc.close_ahead_written(fh.handle, a) {
                return None;
            }
            self.maker_closed_exact(fh.fid, lock, &a, true);
            0
        } else {
            let written = if wrote {
                Some(self.dom_known_at_close(fh)?)
            } else {
                None
            };
            if !self.mdc.close_ahead(fh.handle) {
                return None;
            }
            // Closed whatever follows: a copy no longer under the create's lock keeps
            // asking the MDT, which is right, only slower.
            match written {
                Some((a, t, lock)) if self.maker_closed_exact(fh.fid, lock, &a, false) => t,
                _ => 0,
            }
        };
        // The MDT gives back the layout lock granted with the open when it closes it.
        self.forget_layout_lock(fh.layout_lock.swap(0, Ordering::AcqRel));
        self.forget_known(fh);
        Some(token)
    }

    /// Closes `fh` on the MDT.
    pub(crate) async fn close_on_mdt(&self, fh: &FileHandle) -> Result<u64, Errno> {
        let known = self.known_at_close(fh);
        self.check_live(fh)?;
        let wrote = fh.wrote.load(Ordering::Acquire);
        // Data written to OST objects: the size as it is now goes with the close, for
        // the MDT to keep if this was the only writer (lazy size on MDT).
        let attrs = match fh.layout() {
            Some(l) if wrote && l.has_objects() => match known {
                Some(a) => Some(a),
                None => self.size_for_close(fh.fid, &l).await,
            },
            _ => None,
        };
        let cached = self.attr_lock(fh.fid);
        let epoch = self.file_epoch(fh.fid).load(Ordering::Acquire);
        let rep = self
            .md(Request::Close(CloseReq {
                handle: fh.handle,
                wrote,
                attrs,
            }))
            .await;
        // Closed (or refused: the MDT has no such handle): not opened again after a
        // restart of the MDT.
        self.mdc.closed(fh.handle);
        let token = fh.layout_lock.swap(0, Ordering::AcqRel);
        if let Some(lock) = self.forget_layout_lock(token) {
            if fh.own_lock.load(Ordering::Acquire) {
                let _ = self.lock_cancel(vec![lock]).await;
            }
        }
        let rep = rep?;
        if fh.wrote.load(Ordering::Acquire) {
            self.check_lost(fh)?;
        }
        if let Reply::Close(r) = rep {
            match r.attr {
                // Attributes from after this client's writes: taken only if it wrote
                // nothing to the file since the close left (writes to other files,
                // from other threads, do not matter).
                Some(a)
                    if r.exact_size && epoch == self.file_epoch(fh.fid).load(Ordering::Acquire) =>
                {
                    self.size_exact_with(fh.fid, cached, Some(a));
                }
                None if r.exact_size => self.size_exact_with(fh.fid, cached, None),
                _ => {}
            }
            return Ok(r.data_token);
        }
        Ok(0)
    }

    /// What the DOM_WRITEs through `fh` left of the file it made, if every byte of it
    /// is on the MDT, the handle wrote nothing anywhere else and nothing else changed
    /// the file here (see [`Known`]); `None` otherwise.
    /// With them, the data token they name the bytes by, and the attributes lock
    /// the create granted.
    fn dom_known_at_close(&self, fh: &FileHandle) -> Option<(lode_proto::CloseAttrs, u64, u64)> {
        let layout = fh.layout()?;
        if layout.dom_end() == 0 || layout.has_objects() {
            return None;
        }
        let known = self.known.lock();
        let k = known.get(&fh.fid)?;
        if k.handle != fh.handle || k.gen != layout.gen || k.dom_out != 0 || k.lock == 0 {
            return None;
        }
        Some((k.dom?, k.dom_token, k.lock))
    }

    /// A DOM_WRITE of `data` at `offset` (an append: at the file's end) through `fh`,
    /// its answer kept for the close of the handle that made the file (see
    /// [`Known::dom`]).
    async fn dom_write(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: Vec<u8>,
        append: bool,
    ) -> Result<Reply, Errno> {
        if let Some(k) = self.known.lock().get_mut(&fh.fid) {
            if k.handle == fh.handle {
                k.dom_out += 1;
            }
        }
        let rep = self
            .md(Request::DomWrite(DomWriteReq {
                fid: fh.fid,
                handle: fh.handle,
                offset,
                data,
                append,
                dom_lock: 0,
            }))
            .await;
        self.dom_write_answered(fh, dom_written(&rep));
        rep
    }

    /// Keeps the first write through the handle that made a file all on the MDT
    /// back past `write(2)`, under the write-back lock its create was granted (see
    /// [`crate::writeback`]): sent in the background, `Some` with its length at once.
    /// `None` (the caller writes now) for any other write: not that handle's first,
    /// not within the DoM component, larger than one RPC, or the lock gone.
    fn write_back(&self, fh: &FileHandle, off: u64, data: &[u8]) -> Option<usize> {
        if data.is_empty() || data.len() > lode_base::limits::BULK_MAX {
            return None;
        }
        let layout = fh.layout()?;
        let end = off.checked_add(data.len() as u64)?;
        if layout.dom_end() == 0 || layout.has_objects() || end > layout.dom_end() {
            return None;
        }
        let me = self.me.upgrade()?;
        let (kept, lock) = {
            let mut known = self.known.lock();
            let k = known.get_mut(&fh.fid)?;
            if k.handle != fh.handle
                || k.gen != layout.gen
                || k.dom_lock == 0
                || k.dom.is_some()
                || k.dom_out != 0
            {
                return None;
            }
            // One write per lock: the MDT lets it go with this write.
            let lock = std::mem::take(&mut k.dom_lock);
            let kept = self.wb.keep(fh.fid, lock)?;
            k.dom_out += 1;
            (kept, lock)
        };
        let (fh, data, n) = (fh.clone(), data.to_vec(), data.len());
        self.rt.spawn(async move {
            let rep = me
                .md(Request::DomWrite(DomWriteReq {
                    fid: fh.fid,
                    handle: fh.handle,
                    offset: off,
                    data,
                    append: false,
                    dom_lock: lock,
                }))
                .await;
            me.dom_write_answered(&fh, dom_written(&rep));
            let err = rep.err();
            if let Some(e) = err {
                tracing::warn!(fid = %fh.fid, "a write kept back failed: {e} (told at the next fsync or close)");
            }
            me.wb.done(kept, err);
        });
        Some(n)
    }

    /// A DOM_WRITE through `fh` was answered (`None`: it failed, or its answer is not
    /// known; see [`Known::dom_out`]): kept for the close of the handle that made the
    /// file, or the file forgotten.
    fn dom_write_answered(&self, fh: &FileHandle, rep: Option<&lode_proto::DomWriteRep>) {
        let mut known = self.known.lock();
        let Some(k) = known.get_mut(&fh.fid) else {
            return;
        };
        if k.handle != fh.handle {
            return;
        }
        k.dom_out = k.dom_out.saturating_sub(1);
        let Some(r) = rep else {
            self.unknow(&mut known, fh.fid);
            return;
        };
        let a = r.attrs;
        if k.dom.is_none_or(|d| a.mtime >= d.mtime) {
            k.dom_token = r.data_token;
        }
        let d = k.dom.get_or_insert(a);
        d.size = d.size.max(a.size);
        d.blocks = d.blocks.max(a.blocks);
        d.mtime = d.mtime.max(a.mtime);
    }

    /// `fid` changed here other than by its maker's writes (another writer, a
    /// setattr, a fallocate): what those writes said is no longer the whole story.
    pub(crate) fn forget_made(&self, fid: Fid) {
        self.unknow(&mut self.known.lock(), fid);
    }

    /// Forgets what `known` holds of `fid`, giving back the write-back lock it kept
    /// unused, if any.
    fn unknow(&self, known: &mut HashMap<Fid, Known>, fid: Fid) {
        if let Some(k) = known.remove(&fid) {
            self.give_back_dom_lock(k.dom_lock);
        }
    }

    /// What the writes through `fh` left known of the file it made (see [`Known`]),
    /// forgotten: that handle is closing.
    fn forget_known(&self, fh: &FileHandle) -> Option<Known> {
        let mut known = self.known.lock();
        match known.get(&fh.fid) {
            Some(k) if k.handle == fh.handle => known.remove(&fh.fid),
            _ => None,
        }
    }

    /// Size, blocks and mtime of a file its handle `fh` made, from what its writes'
    /// answers said (see [`Known`]); `None` if this is not that handle or the layout
    /// changed. Forgets the file either way at that handle's close.
    fn known_at_close(&self, fh: &FileHandle) -> Option<lode_proto::CloseAttrs> {
        let k = self.forget_known(fh)?;
        self.known_attrs(fh, &k.objs, k.gen)
    }

    /// What the writes through `fh` to OST objects left of the file it made, if it is
    /// all on OSTs, its create's attributes lock is known and no write is out: the
    /// size, blocks and mtime for a close ahead, and that lock (see
    /// `Client::close_ahead`). Keeps the file known (the close may not go ahead).
    fn ost_known_at_close(&self, fh: &FileHandle) -> Option<(lode_proto::CloseAttrs, u64)> {
        let (objs, gen, lock) = {
            let known = self.known.lock();
            let k = known.get(&fh.fid)?;
            if k.handle != fh.handle || k.lock == 0 || k.ost_out != 0 || k.dom.is_some() {
                return None;
            }
            (k.objs.clone(), k.gen, k.lock)
        };
        Some((self.known_attrs(fh, &objs, gen)?, lock))
    }

    /// The size, blocks and mtime the answers `objs` to writes through `fh` (under
    /// layout generation `gen`) say, for a file all on OSTs; `None` if the layout
    /// changed or an OST restart lost a write.
    fn known_attrs(
        &self,
        fh: &FileHandle,
        objs_known: &HashMap<ObjId, ObjAttr>,
        gen: u32,
    ) -> Option<lode_proto::CloseAttrs> {
        let layout = fh.layout()?;
        if layout.gen != gen || layout.dom_end() != 0 {
            return None;
        }
        let objs = objects(fh.fid, &layout);
        // A write an OST restart lost still counts in what the answers said.
        let oscs = self.oscs.read();
        if objs
            .iter()
            .any(|(_, _, ost, _)| oscs.get(ost).is_some_and(|i| i.has_lost(fh.fid)))
        {
            return None;
        }
        drop(oscs);
        let (mut size, mut blocks, mut mtime) = (0, 0, fh.attr.mtime);
        for (ci, stripe, _, obj) in objs {
            let Some(a) = objs_known.get(&obj) else {
                // Never written: made with the file, so nothing there.
                continue;
            };
            let (start, ss, count, _) = raid0_geometry(&layout, ci)?;
            size = size.max(lode_base::layout::file_size_from_object(
                start, ss, count, stripe, a.size,
            ));
            blocks += a.blocks;
            if a.size > 0 || a.blocks > 0 {
                mtime = mtime.max(a.mtime);
            }
        }
        Some(lode_proto::CloseAttrs {
            size,
            blocks,
            mtime,
        })
    }

    /// A write's answer for `obj` (`None`: it failed or said nothing): kept for the
    /// close of the handle that made the file, or the file forgotten.
    fn object_written(&self, obj: ObjId, attr: Option<ObjAttr>) {
        let mut known = self.known.lock();
        let Some(k) = known.get_mut(&obj.fid) else {
            return;
        };
        k.ost_out = k.ost_out.saturating_sub(1);
        match attr {
            Some(a) => {
                let e = k.objs.entry(obj).or_default();
                e.size = e.size.max(a.size);
                e.blocks = e.blocks.max(a.blocks);
                e.mtime = e.mtime.max(a.mtime);
            }
            None => self.unknow(&mut known, obj.fid),
        }
    }

    /// Size, blocks and mtime of a file about to be closed by a writer, from a glimpse;
    /// `None` if the glimpse fails (the MDT then keeps asking the OSTs).
    async fn size_for_close(&self, fid: Fid, layout: &Layout) -> Option<lode_proto::CloseAttrs> {
        let (size, blocks, mtime, _) = self.glimpse_now(fid, Some(layout)).await.ok()?;
        Some(lode_proto::CloseAttrs {
            size,
            blocks,
            mtime,
        })
    }

    /// Writes `data` at `off`. Bytes past the end of the layout fail with ENODATA
    /// (nothing before that point is lost).
    pub async fn write(&self, fh: &FileHandle, off: u64, data: &[u8]) -> Result<usize, Errno> {
        if !fh.writable() {
            return Err(Errno::EBADF);
        }
        // A file made immutable after this handle was opened for writing (`chattr +i`
        // on an open file): Linux refuses the write (EPERM), as the MDT refuses such
        // an open. Known from the attributes held under a lock; without them the write
        // goes (the OSTs do not know the flags). Not append-only's rule: a writeback
        // mount's kernel opens without O_APPEND and places appends itself.
        if self
            .cached_iflags(fh.fid)
            .is_some_and(|f| f & lode_base::perm::FS_IMMUTABLE_FL != 0)
        {
            return Err(Errno::EPERM);
        }
        self.check_live(fh)?;
        self.data_moved(fh.fid);
        if !fh.wrote.swap(true, Ordering::AcqRel) {
            // Its size is the OSTs' from now on, also for this client's cached copy.
            self.data_written(fh.fid);
        }
        // After the write kept back, if one is: writes land in the order they came.
        self.wb.wait(fh.fid).await;
        let off = if fh.flags & libc::O_APPEND != 0 {
            if let Some(n) = self.append_on_ost(fh, data).await? {
                return Ok(n);
            }
            if let Some(n) = self.append_on_mdt(fh, data).await? {
                return Ok(n);
            }
            return self.append_locked(fh, data).await;
        } else {
            off
        };
        if let Some(n) = self.write_back(fh, off, data) {
            return Ok(n);
        }
        self.write_at(fh, off, data).await
    }

    /// An append to a file that is one OST object (one component from 0 to EOF, one
    /// stripe, instantiated): the OST writes it at the object's end, which it finds
    /// under the object's lock, so appends by several clients (or threads) each land
    /// whole and none overwrites another, in one RPC. `None` for any other layout (or
    /// a write larger than one RPC): see [`Client::append_locked`].
    async fn append_on_ost(&self, fh: &FileHandle, data: &[u8]) -> Result<Option<usize>, Errno> {
        if data.is_empty() || data.len() > lode_base::limits::BULK_MAX {
            return Ok(None);
        }
        let Some(layout) = fh.layout() else {
            return Ok(None);
        };
        let [comp] = layout.components.as_slice() else {
            return Ok(None);
        };
        let Pattern::Raid0 { osts, .. } = &comp.pattern else {
            return Ok(None);
        };
        let &[ost] = osts.as_slice() else {
            return Ok(None);
        };
        if comp.start != 0 || comp.end != lode_base::layout::EOF {
            return Ok(None);
        }
        let obj = ObjId {
            fid: fh.fid,
            comp: comp.id,
            stripe: 0,
        };
        self.ost_write(ost, obj, 0, data.to_vec(), true).await?;
        Ok(Some(data.len()))
    }

    /// An append the OSTs or the MDT cannot place themselves (a striped or composite
    /// layout, or a write larger than one RPC): the end of file is found and written
    /// to under an exclusive lock on the file's append resource on the MDT, so appends
    /// by several clients each land whole and none overwrites another, as Lustre's do
    /// under their `[0, EOF]` extent locks. The lock is given back at once (appenders
    /// are rare and a held one would need a callback); a busy one is asked for again,
    /// a little later each time. Without client locks (no callback channel: a
    /// `nolocks` mount; or the MDT refusing more) the append is atomic only among this
    /// mount's, as before.
    async fn append_locked(&self, fh: &FileHandle, data: &[u8]) -> Result<usize, Errno> {
        let lock = self.append_lock(fh.fid).await?;
        let r = match self.size_of(fh.fid, fh.layout().as_ref()).await {
            Ok(off) => self.write_at(fh, off, data).await,
            Err(e) => Err(e),
        };
        if let Some(h) = lock {
            if let Err(e) = self.lock_cancel(vec![h]).await {
                // The MDT drops it with this client's other locks if the connection
                // went; until then the next appender waits.
                debug!("append lock {h:#x} of {}: cancel: {e}", fh.fid);
            }
        }
        r
    }

    /// The append lock of `fid`, waited for; `None` if client locks cannot be had.
    async fn append_lock(&self, fid: Fid) -> Result<Option<u64>, Errno> {
        use crate::locks::{BIT_UPDATE, MODE_EX};
        let mut pause = std::time::Duration::from_micros(100);
        loop {
            if !self.callback_channel_up() {
                return Ok(None);
            }
            match self
                .lock_enqueue(fid, lode_base::hash::APPEND_HASH, MODE_EX, BIT_UPDATE)
                .await
            {
                Ok(Some(h)) => return Ok(Some(h)),
                Ok(None) => {}
                Err(Errno::ENOLCK) => return Ok(None),
                Err(e) => return Err(e),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(10));
        }
    }

    /// An append to a file whose every byte is on the MDT (a Data-on-MDT component,
    /// no OST object yet), within that component: the MDT writes it at the end of
    /// file, which it finds under the inode's lock, so appends by several clients each
    /// land whole, in one RPC (and exactly once: a DOM_WRITE has a reply record, and
    /// its replay is rewritten to where the reply said it went). `None` for any other
    /// layout, or when the MDT finds the file has outgrown that (`ERANGE`): the caller
    /// finds the end of file and writes there.
    async fn append_on_mdt(&self, fh: &FileHandle, data: &[u8]) -> Result<Option<usize>, Errno> {
        if data.is_empty() || data.len() > lode_base::limits::BULK_MAX {
            return Ok(None);
        }
        match fh.layout() {
            Some(l) if l.dom_end() > 0 && !l.has_objects() => {}
            _ => return Ok(None),
        }
        match self.dom_write(fh, 0, data.to_vec(), true).await {
            Ok(_) => Ok(Some(data.len())),
            Err(Errno::ERANGE) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Client::write`] at `off` whatever the handle's `O_APPEND`, its caller having
    /// counted the write (`data_epoch`, `wrote`).
    async fn write_at(&self, fh: &FileHandle, off: u64, data: &[u8]) -> Result<usize, Errno> {
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > FILE_SIZE_MAX)
        {
            return Err(Errno::EFBIG);
        }
        let mut layout = fh.layout().ok_or(Errno::EINVAL)?;
        let end = (off + data.len() as u64).min(layout.end());
        if end > off && !layout.uninit_in(off, end - off).is_empty() {
            layout = self.layout_intent(fh, off, end).await?;
        }
        let chunks = layout.map(off, data.len());
        let covered: usize = chunks.iter().map(|c| c.len).sum();
        let mut reqs = Vec::new();
        for c in &chunks {
            for p in pieces(c) {
                let dest = self.dest(fh.fid, &layout, &p)?;
                let data = data[p.buf_off..p.buf_off + p.len].to_vec();
                reqs.push(async move {
                    match dest {
                        Dest::Mdt => self.dom_write(fh, p.obj_off, data, false).await.map(|_| ()),
                        Dest::Ost(ost, obj) => {
                            self.ost_write(ost, obj, p.obj_off, data, false).await
                        }
                        Dest::Hole => Err(Errno::EIO),
                    }
                });
            }
        }
        for r in futures::future::join_all(reqs).await {
            r?;
        }
        if covered < data.len() {
            return if covered == 0 {
                Err(Errno::ENODATA)
            } else {
                Ok(covered)
            };
        }
        Ok(data.len())
    }

    /// fallocate(2) of an open file, as Lustre has it: preallocation (mode 0: the
    /// components the range reaches instantiated as a write would, their objects'
    /// files preallocated), `FALLOC_FL_PUNCH_HOLE` (with `FALLOC_FL_KEEP_SIZE`, as
    /// Linux requires) and `FALLOC_FL_ZERO_RANGE`. Without `KEEP_SIZE` a range past
    /// the end extends the file as a write would, never shrinking it: each OST
    /// extends its objects itself, and the MDT a Data-on-MDT tail (an empty write at
    /// the new end). Data-on-MDT bytes in a punched or zeroed range are written as
    /// zeros. Other modes (collapse, insert, unshare): EOPNOTSUPP, as on Lustre.
    pub async fn fallocate(
        &self,
        fh: &FileHandle,
        mode: i32,
        off: u64,
        len: u64,
    ) -> Result<(), Errno> {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        let zeroes = match mode & !KEEP {
            0 => false,
            libc::FALLOC_FL_PUNCH_HOLE if mode & KEEP != 0 => true,
            libc::FALLOC_FL_ZERO_RANGE => true,
            _ => return Err(Errno::EOPNOTSUPP),
        };
        if !fh.writable() {
            return Err(Errno::EBADF);
        }
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        self.wb.wait(fh.fid).await;
        let end = off
            .checked_add(len)
            .filter(|e| *e <= FILE_SIZE_MAX)
            .ok_or(Errno::EFBIG)?;
        self.check_live(fh)?;
        // vfs_fallocate's rules for `chattr +i` and `+a` (the bytes go to the OSTs,
        // which do not know them): an append-only file may only be preallocated.
        let iflags = self.getattr_md(&Cred::root(), fh.fid).await?.attr.flags;
        if iflags & FS_IMMUTABLE_FL != 0 || iflags & FS_APPEND_FL != 0 && mode & !KEEP != 0 {
            return Err(Errno::EPERM);
        }
        let mut layout = fh.layout().ok_or(Errno::EINVAL)?;
        let grows = mode & KEEP == 0;
        if grows && end > layout.end() {
            // No component would hold the new end: refused before anything changed,
            // as a truncate there is (Lustre's ENODATA).
            return Err(Errno::ENODATA);
        }
        self.data_moved(fh.fid);
        if !fh.wrote.swap(true, Ordering::AcqRel) {
            self.data_written(fh.fid);
        }
        let size = self.size_of(fh.fid, Some(&layout)).await?;
        let stored = end.min(layout.end());
        if (!zeroes || grows) && stored > off && !layout.uninit_in(off, stored - off).is_empty() {
            layout = self.layout_intent(fh, off, stored).await?;
        }
        // Bytes on the MDT: zeros written over those there are (and, without
        // KEEP_SIZE, up to the range's end).
        let dom_end = stored.min(layout.dom_end());
        let dom_end = if grows { dom_end } else { dom_end.min(size) };
        if zeroes && off < dom_end {
            let zeros = vec![0u8; (dom_end - off).min(ZERO_WRITE_MAX) as usize];
            let mut at = off;
            while at < dom_end {
                let n = ((dom_end - at) as usize).min(zeros.len());
                at += self.write_at(fh, at, &zeros[..n]).await? as u64;
            }
        }
        // Object files: each object's bytes in the range are one run of it.
        let mut futs = Vec::new();
        for (ci, stripe, ost, obj) in objects(fh.fid, &layout) {
            let Some((start, ss, count, _)) = raid0_geometry(&layout, ci) else {
                continue;
            };
            let (a, b) = (off.max(start), end.min(layout.components[ci].end));
            if a >= b {
                continue;
            }
            let lo = object_size_for_file(ss, count, stripe, a - start);
            let hi = object_size_for_file(ss, count, stripe, b - start);
            if hi <= lo {
                continue;
            }
            futs.push(async move {
                let osc = self.osc(ost).await?;
                let req = lode_proto::FallocateReq {
                    obj,
                    mode: mode as u32,
                    offset: lo,
                    len: hi - lo,
                };
                osc.call(Request::OstFallocate(req)).await.map(|_| ())
            });
        }
        let done = futures::future::join_all(futs).await;
        // What the objects' writes said of their blocks is no longer so.
        self.forget_made(fh.fid);
        done.into_iter().collect::<Result<(), Errno>>()?;
        if grows && end > size && end <= layout.dom_end() {
            // A tail on the MDT, which sets the size to at least `end` under the
            // inode's lock (another writer may have gone further meanwhile).
            self.dom_write(fh, end, Vec::new(), false).await?;
        }
        Ok(())
    }

    /// `lseek(2)`'s `SEEK_DATA` (`hole` false) and `SEEK_HOLE` from `off`, as Lustre
    /// 2.14 has them (`OST_SEEK`): the components from `off` on are asked in turn, a
    /// striped one's objects together (each object's next data or hole mapped back
    /// into the file; the first wins), a Data-on-MDT one by the MDT, and one not
    /// instantiated yet is all hole. At or past the end: ENXIO; no data after `off`:
    /// ENXIO; the end of the file is a hole. What this client's handles wrote is on
    /// the servers already (writes are not held back here). Not `exact`: the answer
    /// of a file system that finds no holes (all data up to the size), for a caller
    /// whose pages may hold bytes the servers have not seen.
    pub async fn seek(
        &self,
        fh: &FileHandle,
        off: u64,
        hole: bool,
        exact: bool,
    ) -> Result<u64, Errno> {
        self.check_live(fh)?;
        let body = self.getattr_md(&Cred::root(), fh.fid).await?;
        let mine = fh.layout();
        let layout = newer(mine.as_ref(), body.layout.as_ref()).cloned();
        let (size, ..) = self.glimpse(fh.fid, layout.as_ref(), &body.attr).await?;
        if off >= size {
            return Err(Errno::ENXIO);
        }
        let Some(layout) = layout.filter(|_| exact) else {
            return Ok(if hole { size } else { off });
        };
        for (ci, c) in layout.components.iter().enumerate() {
            if c.end <= off {
                continue;
            }
            if c.start >= size {
                break;
            }
            let (a, b) = (off.max(c.start), c.end.min(size));
            let at = if !c.is_init() {
                hole.then_some(a)
            } else if c.pattern == Pattern::Mdt {
                self.dom_seek(fh.fid, a, b, hole).await?
            } else {
                self.objects_seek(fh.fid, &layout, ci, a, hole).await?
            };
            if let Some(at) = at.filter(|at| *at < b) {
                return Ok(at.max(a));
            }
        }
        if hole {
            Ok(size)
        } else {
            Err(Errno::ENXIO)
        }
    }

    /// The next data or hole of `fid`'s Data-on-MDT bytes in `[from, end)`, asking
    /// again where a search stopped at its bound.
    async fn dom_seek(
        &self,
        fid: Fid,
        from: u64,
        end: u64,
        hole: bool,
    ) -> Result<Option<u64>, Errno> {
        let mut offset = from;
        loop {
            let rep = match self
                .md(Request::DomSeek(DomSeekReq { fid, offset, hole }))
                .await?
            {
                Reply::DomSeek(r) => r,
                _ => return Err(Errno::EPROTO),
            };
            if rep.found.is_some() || rep.scanned_to >= end {
                return Ok(rep.found);
            }
            if rep.scanned_to <= offset {
                return Err(Errno::EPROTO);
            }
            offset = rep.scanned_to;
        }
    }

    /// The next data or hole at or after file offset `from` among the objects of
    /// raid0 component `ci`, in the file's terms.
    async fn objects_seek(
        &self,
        fid: Fid,
        layout: &Layout,
        ci: usize,
        from: u64,
        hole: bool,
    ) -> Result<Option<u64>, Errno> {
        let Some((start, ss, count, osts)) = raid0_geometry(layout, ci) else {
            return Ok(hole.then_some(from));
        };
        let comp = layout.components[ci].id;
        let asks = osts.iter().enumerate().map(|(i, &ost)| async move {
            let stripe = i as u32;
            let obj = ObjId { fid, comp, stripe };
            let offset = object_size_for_file(ss, count, stripe, from - start);
            let osc = self.osc(ost).await?;
            let req = lode_proto::SeekReq { obj, offset, hole };
            match osc.call(Request::OstSeek(req)).await?.reply {
                Reply::OstSeek(r) => Ok(r
                    .found
                    .map(|o| file_offset_from_object(start, ss, count, stripe, o))),
                _ => Err(Errno::EPROTO),
            }
        });
        let found: Vec<Option<u64>> = futures::future::join_all(asks)
            .await
            .into_iter()
            .collect::<Result<_, Errno>>()?;
        Ok(found.into_iter().flatten().min())
    }

    /// Writes `data` at `offset` of object `obj` on OST `ost` (creating it).
    async fn ost_write(
        &self,
        ost: u32,
        obj: ObjId,
        offset: u64,
        data: Vec<u8>,
        append: bool,
    ) -> Result<(), Errno> {
        let osc = self.osc(ost).await?;
        if let Some(k) = self.known.lock().get_mut(&obj.fid) {
            // Answered in `object_written`; a call given up on leaves it counted,
            // which only makes the close go by RPC.
            k.ost_out += 1;
        }
        let r = osc
            .call(Request::OstWrite(OstWriteReq {
                obj,
                offset,
                data,
                append,
            }))
            .await;
        let attr = match &r {
            Ok(rep) => match &rep.reply {
                Reply::OstWrite(w) => w.attr.clone(),
                _ => None,
            },
            Err(_) => None,
        };
        self.object_written(obj, attr);
        r.map(|_| ())
    }

    /// Asks the MDT to instantiate the components a write to `[start, end)` reaches;
    /// the handle keeps the new layout.
    async fn layout_intent(&self, fh: &FileHandle, start: u64, end: u64) -> Result<Layout, Errno> {
        let b = match self
            .md(Request::LayoutIntent(LayoutIntentReq {
                fid: fh.fid,
                handle: fh.handle,
                start,
                end,
                layout: None,
            }))
            .await?
        {
            Reply::LayoutIntent(b) => b,
            _ => return Err(Errno::EPROTO),
        };
        let l = b.layout.ok_or(Errno::EPROTO)?;
        fh.newer_layout(&l);
        Ok(fh.layout().unwrap_or(l))
    }

    /// Where a piece's bytes live: the MDT, an OST object, or nowhere yet (a component
    /// nobody has written to).
    fn dest(&self, fid: Fid, layout: &Layout, c: &Chunk) -> Result<Dest, Errno> {
        let comp = &layout.components[c.comp_idx];
        match &comp.pattern {
            Pattern::Raid0 { osts, .. } if osts.is_empty() => Ok(Dest::Hole),
            Pattern::Raid0 { osts, .. } => {
                let ost = *osts.get(c.stripe as usize).ok_or(Errno::EIO)?;
                Ok(Dest::Ost(
                    ost,
                    ObjId {
                        fid,
                        comp: comp.id,
                        stripe: c.stripe,
                    },
                ))
            }
            Pattern::Mdt => Ok(Dest::Mdt),
        }
    }

    /// The whole file as its open found it (read-on-open), if the handle holds all of
    /// it (at least one byte) and nothing was written through this client since: what
    /// a mount may put in the kernel's page cache at open, as Lustre's read-on-open
    /// fills the client's pages.
    pub fn opened_contents(&self, fh: &FileHandle) -> Option<Arc<DomPrefetch>> {
        let p = self.prefetched(fh)?;
        let whole = p.eof && !p.data.is_empty() && p.data.len() as u64 == fh.attr.size;
        whole.then(|| p.clone())
    }

    /// The handle's read-on-open bytes while they are still the file's (see
    /// [`Prefetch`]).
    fn prefetched<'a>(&self, fh: &'a FileHandle) -> Option<&'a Arc<DomPrefetch>> {
        let p = fh.prefetch.as_ref()?;
        (p.epoch == self.data_epoch.load(Ordering::Acquire)
            && !self.forgotten_since(p.seq, None, fh.fid))
        .then_some(&p.bytes)
    }

    /// Reads up to `len` bytes at `off`; short at end of file. The read is done again
    /// with the new layout if the layout changed (a migration swapped it) while it
    /// was under way: the old layout's objects may be gone by the time its replies
    /// arrive. The handle's layout lock tells; without one, the MDT is asked.
    pub async fn read(&self, fh: &FileHandle, off: u64, len: usize) -> Result<Vec<u8>, Errno> {
        self.wb.wait(fh.fid).await;
        self.check_live(fh)?;
        let _ = self.note_access(fh);
        if fh.layout().is_none() {
            return Ok(Vec::new());
        }
        let len = len.min(lode_base::limits::BULK_MAX * 4);
        if let Some(p) = self.prefetched(fh) {
            let have = p.data.len() as u64;
            let end = off.saturating_add(len as u64);
            if end <= have || p.eof {
                let from = off.min(have) as usize;
                return Ok(p.data[from..end.min(have) as usize].to_vec());
            }
        }
        for _ in 0..LAYOUT_RETRIES {
            let lock = self.layout_guard(fh).await;
            let layout = fh.layout().ok_or(Errno::EIO)?;
            let buf = self.read_with(fh, layout.clone(), off, len).await?;
            // The layout the MDT has now, if the lock cannot say it did not change.
            let now = match lock {
                Some(h) if self.layout_lock_held(h) => return Ok(buf),
                _ => self.getattr_fresh(fh.fid).await?.layout,
            };
            let Some(now) = now.filter(|l| l.gen != layout.gen) else {
                if lock.is_none() {
                    return Ok(buf);
                }
                continue;
            };
            debug!(fid = %fh.fid, "layout changed under a read: reading again");
            fh.newer_layout(&now);
        }
        Err(Errno::EAGAIN)
    }

    /// A fresh GETATTR from the MDT (no cached copy).
    async fn getattr_fresh(&self, fid: Fid) -> Result<MdtBody, Errno> {
        match self
            .md(Request::Getattr(GetattrReq {
                cred: Cred::root(),
                fid,
            }))
            .await?
        {
            Reply::Getattr(b) => Ok(b),
            _ => Err(Errno::EPROTO),
        }
    }

    /// The handle's layout lock if it holds one; else one taken again (and the
    /// layout as of its grant), if the MDT grants it now.
    async fn layout_guard(&self, fh: &FileHandle) -> Option<u64> {
        let h = fh.layout_lock.load(Ordering::Acquire);
        if self.layout_lock_held(h) {
            return Some(h);
        }
        let new = self.enqueue_layout_lock(fh.fid).await?;
        match self.getattr_fresh(fh.fid).await {
            Ok(b) => {
                if let Some(l) = &b.layout {
                    fh.newer_layout(l);
                }
            }
            Err(_) => {
                self.drop_layout_lock(new).await;
                return None;
            }
        }
        if fh
            .layout_lock
            .compare_exchange(h, new, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Another reader of this handle took one first.
            self.drop_layout_lock(new).await;
            let theirs = fh.layout_lock.load(Ordering::Acquire);
            return self.layout_lock_held(theirs).then_some(theirs);
        }
        fh.own_lock.store(true, Ordering::Release);
        Some(new)
    }

    /// Gives back a layout lock taken by this client (token `t`).
    async fn drop_layout_lock(&self, t: u64) {
        if let Some(h) = self.forget_layout_lock(t) {
            let _ = self.lock_cancel(vec![h]).await;
        }
    }

    /// One read of `[off, off+len)` through `layout`.
    async fn read_with(
        &self,
        fh: &FileHandle,
        mut layout: Layout,
        off: u64,
        len: usize,
    ) -> Result<Vec<u8>, Errno> {
        if !layout.uninit_in(off, len as u64).is_empty() {
            // Another client may have instantiated it since this handle learnt the
            // layout (a lock held on the attributes keeps the cached copy current).
            let b = self.getattr_md(&Cred::root(), fh.fid).await?;
            if let Some(l) = &b.layout {
                fh.newer_layout(l);
            }
            layout = fh.layout().unwrap_or(layout);
        }
        let mut buf = vec![0u8; len];
        let chunks = layout.map(off, len);
        let mut reqs = Vec::new();
        for c in &chunks {
            for p in pieces(c) {
                let dest = self.dest(fh.fid, &layout, &p)?;
                reqs.push(async move {
                    let data = match dest {
                        Dest::Hole => Vec::new(),
                        Dest::Mdt => match self
                            .md(Request::DomRead(DomReadReq {
                                fid: fh.fid,
                                offset: p.obj_off,
                                len: p.len as u32,
                            }))
                            .await?
                        {
                            Reply::DomRead(d) => d.data,
                            _ => return Err(Errno::EPROTO),
                        },
                        Dest::Ost(ost, obj) => {
                            let osc = self.osc(ost).await?;
                            match osc
                                .call(Request::OstRead(OstReadReq {
                                    obj,
                                    offset: p.obj_off,
                                    len: p.len as u32,
                                }))
                                .await?
                                .reply
                            {
                                Reply::OstRead(d) => d.data,
                                _ => return Err(Errno::EPROTO),
                            }
                        }
                    };
                    if data.len() > p.len {
                        return Err(Errno::EPROTO);
                    }
                    Ok((p, data))
                });
            }
        }
        let mut short = false;
        for r in futures::future::join_all(reqs).await {
            let (p, data) = r?;
            short |= data.len() < p.len;
            buf[p.buf_off..p.buf_off + data.len()].copy_from_slice(&data);
        }
        if short || chunks.iter().map(|c| c.len).sum::<usize>() < len {
            // Some object ended early: a hole or the end of the file. The size decides:
            // the one kept exact under a lock if there is one (no writer anywhere since
            // it was granted, so the bytes just read end where it says), else a glimpse.
            let size = match self.exact_size(fh.fid) {
                Some(s) => s,
                None => self.size_of(fh.fid, Some(&layout)).await?,
            };
            let end = size.saturating_sub(off).min(len as u64) as usize;
            buf.truncate(end);
        }
        Ok(buf)
    }

    /// The file size: the MDT's size or what the OST objects imply, whichever is larger
    /// (every truncate sets both, writes only grow objects).
    pub(crate) async fn size_of(&self, fid: Fid, layout: Option<&Layout>) -> Result<u64, Errno> {
        Ok(self.glimpse_now(fid, layout).await?.0)
    }

    /// Size, blocks, mtime and ctime now: the MDT's attributes and a glimpse of the
    /// objects of the newer of `layout` (a handle's: it may have instantiated more)
    /// and the MDT's (another client may have).
    async fn glimpse_now(&self, fid: Fid, layout: Option<&Layout>) -> Result<Glimpsed, Errno> {
        let body = self.getattr_md(&Cred::root(), fid).await?;
        let layout = newer(layout, body.layout.as_ref());
        self.glimpse(fid, layout, &body.attr).await
    }

    /// Size, blocks, mtime and ctime from the OST objects, merged with the MDT's view.
    pub(crate) async fn glimpse(
        &self,
        fid: Fid,
        layout: Option<&Layout>,
        md: &Attr,
    ) -> Result<Glimpsed, Errno> {
        let Some(layout) = layout else {
            return Ok((md.size, md.blocks, md.mtime, md.ctime));
        };
        self.glimpse_many(&[(fid, layout, md)])
            .await
            .pop()
            .unwrap_or(Err(Errno::EPROTO))
    }

    /// Size, blocks, mtime and ctime of each file from its OST objects and its MDT
    /// attributes: one OST_GETATTR per OST for all the files' objects on it (up to
    /// 4,096 objects each). A file whose objects an OST could not answer gets its error.
    /// A file with Data-on-MDT bytes has its MDT attributes asked afresh (its DoM
    /// writes moved mtime and ctime there); an object written since the MDT's mtime
    /// moves both.
    async fn glimpse_many(&self, files: &[(Fid, &Layout, &Attr)]) -> Vec<Result<Glimpsed, Errno>> {
        const OBJS_PER_GLIMPSE: usize = 4096;
        // Files with Data-on-MDT bytes: their MDT size, blocks and layout asked afresh
        // (a cached copy predates the writes a glimpse is for).
        let fresh: Vec<Option<Result<MdtBody, Errno>>> =
            futures::future::join_all(files.iter().map(|(fid, l, _)| async move {
                if l.dom_end() == 0 {
                    return None;
                }
                // After a write kept back here (see `crate::writeback`).
                self.wb.wait(*fid).await;
                Some(
                    match self
                        .mdc
                        .call(Request::Getattr(GetattrReq {
                            cred: Cred::root(),
                            fid: *fid,
                        }))
                        .await
                        .map(|r| r.reply)
                    {
                        Ok(Reply::Getattr(b)) => Ok(b),
                        Ok(_) => Err(Errno::EPROTO),
                        Err(e) => Err(e),
                    },
                )
            }))
            .await;
        let layouts: Vec<&Layout> = files
            .iter()
            .zip(&fresh)
            .map(|((_, l, _), f)| {
                let fl = f.as_ref().and_then(|b| b.as_ref().ok()?.layout.as_ref());
                newer(fl, Some(*l)).unwrap_or(*l)
            })
            .collect();
        let mut per_ost: std::collections::HashMap<u32, Vec<(usize, usize, u32, ObjId)>> =
            Default::default();
        for (fi, (fid, _, _)) in files.iter().enumerate() {
            for (ci, stripe, ost, obj) in objects(*fid, layouts[fi]) {
                per_ost.entry(ost).or_default().push((fi, ci, stripe, obj));
            }
        }
        let futs = per_ost.into_iter().flat_map(|(ost, objs)| {
            let chunks: Vec<Vec<_>> = objs.chunks(OBJS_PER_GLIMPSE).map(<[_]>::to_vec).collect();
            chunks.into_iter().map(move |objs| async move {
                let r = async {
                    let osc = self.osc(ost).await?;
                    let req = ObjsReq {
                        objs: objs.iter().map(|o| o.3).collect(),
                    };
                    match osc.call(Request::OstGetattr(req)).await?.reply {
                        Reply::OstGetattr(a) if a.attrs.len() == objs.len() => Ok(a.attrs),
                        _ => Err(Errno::EPROTO),
                    }
                }
                .await;
                (objs, r)
            })
        });
        let mut out: Vec<Result<Glimpsed, Errno>> = files
            .iter()
            .zip(&fresh)
            .map(|((_, _, md), f)| match f {
                None => Ok((md.size, 0, md.mtime, md.ctime)),
                Some(Ok(b)) => Ok((b.attr.size, b.attr.blocks, b.attr.mtime, b.attr.ctime)),
                Some(Err(e)) => Err(*e),
            })
            .collect();
        for (objs, r) in futures::future::join_all(futs).await {
            let attrs = match r {
                Ok(a) => a,
                Err(e) => {
                    for (fi, ..) in &objs {
                        out[*fi] = Err(e);
                    }
                    continue;
                }
            };
            for ((fi, ci, stripe, _), a) in objs.iter().zip(attrs) {
                let Ok((size, blocks, mtime, ctime)) = &mut out[*fi] else {
                    continue;
                };
                if let Some((start, ss, count, _)) = raid0_geometry(layouts[*fi], *ci) {
                    *size = (*size).max(file_size_from_object(start, ss, count, *stripe, a.size));
                }
                *blocks += a.blocks;
                if a.size > 0 || a.blocks > 0 {
                    *mtime = (*mtime).max(a.mtime);
                    // A write after the MDT's last word on the times moved the ctime
                    // too (an object's mtime set by utimes is the MDT's, and moves
                    // nothing here).
                    if a.mtime > files[*fi].2.mtime {
                        *ctime = (*ctime).max(a.mtime);
                    }
                }
            }
        }
        out
    }

    /// [`Client::complete`] of many bodies with one glimpse RPC per OST for all of them
    /// (see [`Client::glimpse_many`]), as a readdir+ page wants: a walk of files with
    /// data then costs one OST round trip per page, not per file.
    pub async fn complete_many(&self, bodies: Vec<MdtBody>) -> Vec<Result<MdtBody, Errno>> {
        let wanted: Vec<usize> = (0..bodies.len())
            .filter(|&i| bodies[i].glimpse && bodies[i].layout.is_some())
            .collect();
        let files: Vec<(Fid, &Layout, &Attr)> = wanted
            .iter()
            .filter_map(|&i| {
                let b = &bodies[i];
                Some((b.attr.fid, b.layout.as_ref()?, &b.attr))
            })
            .collect();
        let got = self.glimpse_many(&files).await;
        drop(files);
        let mut out: Vec<Result<MdtBody, Errno>> = bodies.into_iter().map(Ok).collect();
        for (i, r) in wanted.into_iter().zip(got) {
            match r {
                Ok((size, blocks, mtime, ctime)) => {
                    if let Ok(b) = &mut out[i] {
                        (b.attr.size, b.attr.blocks, b.attr.mtime) = (size, blocks, mtime);
                        b.attr.ctime = b.attr.ctime.max(ctime);
                    }
                }
                Err(e) => out[i] = Err(e),
            }
        }
        out
    }

    /// Truncates an open file (ftruncate): the caller's open handle grants the right.
    pub async fn truncate_open(
        &self,
        cred: &Cred,
        fh: &FileHandle,
        size: u64,
    ) -> Result<(), Errno> {
        let sa = SetAttr {
            size: Some(size),
            ..Default::default()
        };
        let opened = fh.writable() || fh.flags & libc::O_TRUNC != 0;
        fh.truncated.store(true, Ordering::Release);
        self.setattr_as(cred, fh.fid, sa, opened, fh.handle)
            .await
            .map(|_| ())
    }

    /// Sets attributes; a size change truncates the OST objects too.
    pub async fn setattr(&self, cred: &Cred, fid: Fid, sa: SetAttr) -> Result<MdtBody, Errno> {
        self.setattr_as(cred, fid, sa, false, 0).await
    }

    /// Sets attributes through an open handle (an `ftruncate`, or the kernel's update
    /// of a writer's times): the MDT learns whether the caller holds the file open
    /// for writing, which lets it truncate without write permission and set the
    /// times of an append-only file, as Linux lets a writer.
    pub async fn setattr_through(
        &self,
        cred: &Cred,
        fh: &FileHandle,
        sa: SetAttr,
    ) -> Result<MdtBody, Errno> {
        self.setattr_as(cred, fh.fid, sa, fh.writable(), fh.handle)
            .await
    }

    /// SETATTR on the MDT, then the OST objects: punched to a new size, given a new
    /// mtime. `handle`: the MDT open handle it comes through (0: none).
    async fn setattr_as(
        &self,
        cred: &Cred,
        fid: Fid,
        sa: SetAttr,
        opened: bool,
        handle: u64,
    ) -> Result<MdtBody, Errno> {
        self.wb.wait(fid).await;
        if sa.size.is_some() {
            self.data_moved(fid);
        }
        self.forget_made(fid);
        let body = match self
            .md(Request::Setattr(SetattrReq {
                cred: cred.clone(),
                fid,
                attr: sa.clone(),
                opened_for_write: opened,
                handle,
            }))
            .await?
        {
            Reply::Setattr(b) => b,
            _ => return Err(Errno::EPROTO),
        };
        // Granted with the change (an intent): the getattr that usually follows is
        // answered here.
        self.remember(&body, None);
        if let Some(size) = sa.size {
            self.punch_objects(fid, body.layout.as_ref(), size).await?;
        }
        if sa.mtime.is_some() && body.glimpse {
            // The objects' times count in a glimpse: give them the new mtime too.
            self.set_object_mtime(fid, body.layout.as_ref(), body.attr.mtime)
                .await?;
        }
        Ok(body)
    }

    async fn set_object_mtime(
        &self,
        fid: Fid,
        layout: Option<&Layout>,
        mtime: i64,
    ) -> Result<(), Errno> {
        // The objects' times are no longer what their writes said.
        self.forget_made(fid);
        let Some(layout) = layout else { return Ok(()) };
        self.on_objects(fid, layout, |objs| {
            Request::OstSetattr(lode_proto::OstSetattrReq { objs, mtime })
        })
        .await
        .into_iter()
        .collect()
    }

    /// Sends `req` of the objects of `layout` to each OST holding some, all at once;
    /// one result per OST.
    async fn on_objects(
        &self,
        fid: Fid,
        layout: &Layout,
        req: impl Fn(Vec<ObjId>) -> Request,
    ) -> Vec<Result<(), Errno>> {
        let mut per_ost: std::collections::HashMap<u32, Vec<ObjId>> = Default::default();
        for (_, _, ost, obj) in objects(fid, layout) {
            per_ost.entry(ost).or_default().push(obj);
        }
        let futs = per_ost.into_iter().map(|(ost, objs)| {
            let r = req(objs);
            async move {
                let osc = self.osc(ost).await?;
                osc.call(r).await.map(|_| ())
            }
        });
        futures::future::join_all(futs).await
    }

    async fn punch_objects(
        &self,
        fid: Fid,
        layout: Option<&Layout>,
        size: u64,
    ) -> Result<(), Errno> {
        // Objects shrink: the largest size a write saw is no longer theirs.
        self.forget_made(fid);
        let Some(layout) = layout else { return Ok(()) };
        let mut futs = Vec::new();
        for (ci, stripe, ost, obj) in objects(fid, layout) {
            let Some((start, ss, count, _)) = raid0_geometry(layout, ci) else {
                continue;
            };
            let end = layout.components[ci].end;
            let rel = size.min(end).saturating_sub(start);
            let osize = object_size_for_file(ss, count, stripe, rel);
            futs.push(async move {
                let osc = self.osc(ost).await?;
                osc.call(Request::Punch(PunchReq { obj, size: osize }))
                    .await
                    .map(|_| ())
            });
        }
        for r in futures::future::join_all(futs).await {
            r?;
        }
        Ok(())
    }

    /// Makes the file's data durable (its OST objects) and the MDT's metadata.
    pub async fn fsync(&self, fh: &FileHandle) -> Result<(), Errno> {
        self.wb.wait(fh.fid).await;
        self.wb.take_error(fh.fid)?;
        self.check_live(fh)?;
        if let Some(layout) = &fh.layout() {
            self.sync_objects(fh.fid, layout).await?;
        }
        self.check_lost(fh)?;
        self.md(Request::Sync(lode_proto::Empty {}))
            .await
            .map(|_| ())
    }

    /// Makes the OST objects of `layout` durable.
    async fn sync_objects(&self, fid: Fid, layout: &Layout) -> Result<(), Errno> {
        self.on_objects(fid, layout, |objs| Request::OstSync(ObjsReq { objs }))
            .await
            .into_iter()
            .collect()
    }

    /// Moves `fid`'s bytes into a new layout (`template`, as `setstripe` gives it)
    /// while the file stays readable, and swaps layouts at the end (Lustre's `lfs
    /// migrate`; the MDT's side is in `lode_mds::migrate`). EBUSY if the file is
    /// opened for writing or truncated meanwhile: the copy is then dropped and the
    /// file keeps its layout, whole. Returns the new layout.
    pub async fn migrate(&self, cred: &Cred, fid: Fid, template: Layout) -> Result<Layout, Errno> {
        let fh = self.open_own(cred, fid, libc::O_RDONLY).await?;
        if fh.attr.ftype() != lode_base::FileType::Regular {
            let _ = self.close(&fh).await;
            return Err(Errno::EINVAL);
        }
        let out = self.migrate_open(cred, &fh, template).await;
        // Before the swap, closing abandons the migration (its copy is destroyed): a
        // close that reaches the MDT before the answer.
        let closed = self.close_on_mdt(&fh).await.map(|_| ());
        let layout = out?;
        closed?;
        Ok(layout)
    }

    async fn migrate_open(
        &self,
        cred: &Cred,
        fh: &FileHandle,
        template: Layout,
    ) -> Result<Layout, Errno> {
        use lode_proto::{MigrateReq, MigrateStep};
        let step = |step| async move {
            match self
                .md(Request::Migrate(MigrateReq {
                    cred: cred.clone(),
                    fid: fh.fid,
                    handle: fh.handle,
                    step,
                }))
                .await?
            {
                Reply::Migrate(r) => Ok(r),
                _ => Err(Errno::EPROTO),
            }
        };
        let old = fh.layout().ok_or(Errno::EINVAL)?;
        // A writer's last close() returns before its mount sends the CLOSE (FUSE
        // releases in the background), so `cp f; lode migrate f` can find the file
        // still open for writing for a moment: the start is asked again for a while
        // before the file is called busy.
        let mut pause = MIGRATE_BUSY_PAUSE;
        let waited_from = std::time::Instant::now();
        let (size, rep) = loop {
            // The size the pending layout is instantiated for.
            let (size, ..) = self.glimpse_now(fh.fid, Some(&old)).await?;
            match step(MigrateStep::Start {
                layout: template.clone(),
                size,
            })
            .await
            {
                Err(Errno::EBUSY) if waited_from.elapsed() < MIGRATE_BUSY_WAIT => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MIGRATE_BUSY_WAIT / 8);
                }
                r => break (size, r?),
            }
        };
        let new = rep.layout.ok_or(Errno::EPROTO)?;
        let copy = async {
            // The pending layout durable before any object of it is written: whatever
            // crashes from here, the MDT knows what to destroy.
            self.md(Request::Sync(lode_proto::Empty {})).await?;
            // What the copy copies, asked once the migration is armed (a write open or
            // truncate from now on refuses the swap): a writer that closed just
            // before the start is in it.
            let (size2, _, mtime, _) = self.glimpse_now(fh.fid, Some(&old)).await?;
            if size2 != size {
                return Err(Errno::EBUSY);
            }
            const COPY: u64 = 4 << 20;
            let mut off = 0;
            while off < size {
                let want = (size - off).min(COPY) as usize;
                let data = self.read(fh, off, want).await?;
                if data.len() < want {
                    // Truncated meanwhile: the swap would be refused.
                    return Err(Errno::EBUSY);
                }
                self.copy_into(fh.fid, &new, rep.dom_from, off, &data, |offset, data| {
                    step(MigrateStep::Dom { offset, data })
                })
                .await?;
                off += want as u64;
            }
            self.sync_objects(fh.fid, &new).await?;
            if self.lost_on(fh.fid, &new) {
                tracing::warn!(fid = %fh.fid, "an OST lost the migration's copy: EIO");
                return Err(Errno::EIO);
            }
            // The copy's objects carry the file's mtime, not the copy's.
            self.set_object_mtime(fh.fid, Some(&new), mtime).await?;
            // The old objects as the copy found them: a truncate whose size change
            // preceded the start but whose punch came since shows here.
            let (size3, _, mtime3, _) = self.glimpse_now(fh.fid, Some(&old)).await?;
            if (size3, mtime3) != (size2, mtime) {
                return Err(Errno::EBUSY);
            }
            Ok(mtime)
        }
        .await;
        let mtime = match copy {
            Ok(m) => m,
            Err(e) => {
                // No swap was asked for: the copy's objects are nobody's. The MDT
                // destroys them too when the handle closes, but not those a write
                // still in flight then made again.
                self.destroy_objects(fh.fid, &new).await;
                return Err(e);
            }
        };
        let done = step(MigrateStep::Commit { size, mtime }).await?;
        done.layout.ok_or(Errno::EPROTO)
    }

    /// Destroys the OST objects of `layout` (a migration's own), as far as the OSTs
    /// answer.
    async fn destroy_objects(&self, fid: Fid, layout: &Layout) {
        let done = self.on_objects(fid, layout, |objs| Request::Destroy(ObjsReq { objs }));
        for r in done.await {
            if let Err(e) = r {
                debug!(%fid, "destroying an abandoned migration's objects: {e}");
            }
        }
    }

    /// Writes `data` at `off` into the objects of `layout` (a pending layout) and,
    /// through `dom`, its Data-on-MDT bytes at or past `dom_from`. Pieces of zeros are
    /// left out: a hole stays a hole.
    async fn copy_into<F, Fut>(
        &self,
        fid: Fid,
        layout: &Layout,
        dom_from: u64,
        off: u64,
        data: &[u8],
        dom: F,
    ) -> Result<(), Errno>
    where
        F: Fn(u64, Vec<u8>) -> Fut,
        Fut: std::future::Future<Output = Result<lode_proto::MigrateRep, Errno>>,
    {
        let chunks = layout.map(off, data.len());
        if chunks.iter().map(|c| c.len).sum::<usize>() < data.len() {
            return Err(Errno::EFBIG);
        }
        let mut reqs = Vec::new();
        for c in &chunks {
            for p in pieces(c) {
                let mut bytes = &data[p.buf_off..p.buf_off + p.len];
                let mut at = p.obj_off;
                if bytes.iter().all(|b| *b == 0) {
                    continue;
                }
                let dest = self.dest(fid, layout, &p)?;
                if let Dest::Mdt = dest {
                    // Below `dom_from` the records are the old layout's, and the same.
                    let skip = dom_from.saturating_sub(at).min(bytes.len() as u64) as usize;
                    bytes = &bytes[skip..];
                    at += skip as u64;
                    if bytes.is_empty() {
                        continue;
                    }
                }
                let bytes = bytes.to_vec();
                let dom = &dom;
                reqs.push(async move {
                    match dest {
                        Dest::Mdt => dom(at, bytes).await.map(|_| ()),
                        Dest::Ost(ost, obj) => self.ost_write(ost, obj, at, bytes, false).await,
                        Dest::Hole => Err(Errno::EIO),
                    }
                });
            }
        }
        for r in futures::future::join_all(reqs).await {
            r?;
        }
        Ok(())
    }

    /// EIO if an OST lost data written to the file that it had answered: it restarted
    /// and ended its recovery without this client, or refused a replay. Said once, to
    /// the next fsync or close, as Lustre reports a failed write-back.
    fn check_lost(&self, fh: &FileHandle) -> Result<(), Errno> {
        let Some(layout) = &fh.layout() else {
            return Ok(());
        };
        if self.lost_on(fh.fid, layout) {
            tracing::warn!(fid = %fh.fid, "data written to this file was lost by an OST restart: EIO");
            return Err(Errno::EIO);
        }
        Ok(())
    }

    /// Whether an OST of `layout` lost data this client wrote to `fid` (said once).
    fn lost_on(&self, fid: Fid, layout: &Layout) -> bool {
        let osts: std::collections::BTreeSet<u32> = objects(fid, layout)
            .into_iter()
            .map(|(_, _, ost, _)| ost)
            .collect();
        let oscs = self.oscs.read();
        let mut lost = false;
        for ost in osts {
            lost |= oscs.get(&ost).is_some_and(|i| i.take_lost(fid));
        }
        lost
    }
}

/// The newer of two layouts of one file (a layout's generation moves on every change;
/// `a` on a tie).
fn newer<'a>(a: Option<&'a Layout>, b: Option<&'a Layout>) -> Option<&'a Layout> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if a.gen >= b.gen { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Where one piece of I/O goes.
#[derive(Clone, Copy)]
enum Dest {
    /// The MDT (Data-on-MDT).
    Mdt,
    /// An OST object.
    Ost(u32, ObjId),
    /// A component not instantiated: nothing written there yet.
    Hole,
}

/// Cuts a chunk into pieces of at most [`PIECE`] bytes.
fn pieces(c: &Chunk) -> impl Iterator<Item = Chunk> + '_ {
    (0..c.len).step_by(PIECE).map(move |o| Chunk {
        obj_off: c.obj_off + o as u64,
        buf_off: c.buf_off + o,
        len: (c.len - o).min(PIECE),
        ..*c
    })
}
