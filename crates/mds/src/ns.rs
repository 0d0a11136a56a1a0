//! Namespace reads (getattr, lookup, readdir) and create / open / close.

use crate::inode::{
    all_here, check_name, check_new_name, del_dirent, dtype_of, is_dir, now_ns, put_dirent,
    put_inode, put_inode_unversioned,
};
use crate::pdo::Mode;
use crate::{Ctx, Namespace, OpError, OpResult, OpenHandle};
use lode_base::hash::{name_hash, DOTDOT_COOKIE, DOT_COOKIE, END_COOKIE};
use lode_base::limits::{
    READDIR_GROUP_BYTES_MAX, READDIR_PAGE_BYTES, READDIR_PAGE_ENTRIES, SYMLINK_MAX,
};
use lode_base::perm::{MAY_EXEC, MAY_READ, MAY_WRITE};
use lode_base::{Cred, Errno, Fid, FileType};
use lode_proto::{CloseRep, CreateRep, CreateReq, DirEntry, MdtBody, ReaddirRep, Reply};
use lode_store::records::{
    self, destroy_key, parse_dirent_key, DestroyRec, InodeRec, INODE_ACL, INODE_DATA,
    INODE_NO_XATTRS,
};
use lode_store::{Batch, Cf};
use tracing::{info, warn};

/// What an open does to the "data on OSTs" mark (see `Opens::clean`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum DataMark {
    /// This open set the mark.
    Marked,
    /// Another writer: nobody may take the mark back.
    Writer,
    /// Read only.
    Reader,
}

/// Size reported for directories (ldiskfs reports block multiples too).
const DIR_SIZE: u64 = 4096;

impl Namespace {
    pub(crate) fn body(&self, fid: Fid, rec: &InodeRec) -> MdtBody {
        // Data on OSTs, or on this MDT: while the file is (or was) open for writing,
        // its size is asked for afresh (of the OSTs, or of the MDT for DoM bytes).
        let has_objects = rec
            .layout
            .as_ref()
            .is_some_and(|l| l.has_objects() || l.dom_end() > 0);
        MdtBody {
            attr: rec.attr(fid),
            layout: rec.layout.clone(),
            glimpse: !is_dir(rec.mode) && rec.flags & INODE_DATA != 0 && has_objects,
            // Set where a lock is granted with it (`Mdt::own_writes`): it matters only
            // for what a lock covers, and depends on who asks.
            written: false,
            symlink: rec.symlink.clone(),
            lock: 0,
            name_lock: 0,
            dir_lock: 0,
            no_xattrs: rec.flags & INODE_NO_XATTRS != 0,
            acl: rec.flags & INODE_ACL != 0,
        }
    }

    /// Creates the root directory on a new MDT.
    pub(crate) fn format_root(&self) -> OpResult<()> {
        if self
            .store
            .engine()
            .get(Cf::Inode, &Fid::ROOT.to_bytes())?
            .is_some()
        {
            return Ok(());
        }
        let now = now_ns();
        let root = InodeRec {
            mode: libc::S_IFDIR | 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            size: DIR_SIZE,
            blocks: 8,
            atime: now,
            mtime: now,
            ctime: now,
            rdev: 0,
            flags: INODE_NO_XATTRS,
            version: 0,
            parent: Fid::ROOT,
            layout: None,
            symlink: Vec::new(),
            links: Vec::new(),
            btime: now,
        };
        let mut b = Batch::new();
        put_inode(&mut b, Fid::ROOT, &root);
        self.store.apply(b, None)?;
        self.store.sync()?;
        info!("formatted root directory {}", Fid::ROOT);
        Ok(())
    }

    /// Open-unlinked files of a previous life that no client opened again in recovery
    /// are destroyed, and migrations no client took up again abandoned.
    pub(crate) fn clean_orphans(&self) -> OpResult<()> {
        let mut fids = self.fids_in(Cf::Orphan)?;
        fids.retain(|f| !self.is_open(*f));
        for fid in fids {
            let mut b = Batch::new();
            b.delete(Cf::Orphan, fid.to_bytes().to_vec());
            if let Ok(rec) = self.inode(fid) {
                self.drop_inode(&mut b, fid, &rec)?;
            }
            self.store.apply(b, None)?;
            info!(%fid, "removed orphan left by a restart");
        }
        self.clean_migrations()
    }

    /// The FIDs keying a keyspace of per-file records (orphans, migrations).
    pub(crate) fn fids_in(&self, cf: Cf) -> OpResult<Vec<Fid>> {
        let mut fids = Vec::new();
        self.store.engine().scan(cf, b"", b"", &mut |k, _| {
            if let Some(f) = Fid::from_bytes(k) {
                fids.push(f);
            }
            true
        })?;
        Ok(fids)
    }

    /// Adds to `b` the removal of inode `fid` (its last link is gone and nobody has it
    /// open): inode, xattrs, and a destroy record for its OST objects.
    pub(crate) fn drop_inode(&self, b: &mut Batch, fid: Fid, rec: &InodeRec) -> OpResult<()> {
        b.delete(Cf::Inode, fid.to_bytes().to_vec());
        let mut keys = Vec::new();
        // An inode that never stored an xattr has none to remove: no iterator (a
        // tenth of an unlink's time on the MDT).
        if rec.flags & INODE_NO_XATTRS == 0 {
            self.store
                .engine()
                .scan(Cf::Xattr, &fid.to_bytes(), b"", &mut |k, _| {
                    keys.push(k.to_vec());
                    keys.len() < 100_000
                })?;
        }
        for k in keys {
            b.delete(Cf::Xattr, k);
        }
        self.xattr_sizes.lock().remove(&fid);
        if rec.layout.as_ref().is_some_and(|l| l.dom_end() > 0) {
            self.dom_delete_from(b, fid, 0)?;
        }
        if rec.flags & (INODE_DATA | records::INODE_OBJECTS) != 0 {
            if let Some(layout) = rec.layout.as_ref().filter(|l| l.has_objects()) {
                b.put(
                    Cf::Destroy,
                    destroy_key(fid),
                    records::encode(&DestroyRec {
                        layout: layout.clone(),
                    }),
                );
            }
        }
        Ok(())
    }

    pub(crate) fn getattr(&self, fid: Fid) -> OpResult<MdtBody> {
        let rec = self.inode(fid)?;
        Ok(self.body(fid, &rec))
    }

    /// [`Namespace::getattr`] of many FIDs (a readdir+ page), read together. Each
    /// answer stands alone: if reading them together fails, each is read by itself.
    pub(crate) fn getattr_many(&self, fids: &[Fid]) -> Vec<OpResult<MdtBody>> {
        match self.inodes(fids) {
            Ok(recs) => recs
                .into_iter()
                .zip(fids)
                .map(|(rec, f)| rec.map(|rec| self.body(*f, &rec)))
                .collect(),
            Err(_) => fids.iter().map(|f| self.getattr(*f)).collect(),
        }
    }

    pub(crate) fn lookup(&self, cred: &Cred, parent: Fid, name: &[u8]) -> OpResult<MdtBody> {
        self.getattr(self.lookup_fid(cred, parent, name)?)
    }

    /// What `name` in `parent` points to, if the caller may search `parent`.
    pub(crate) fn lookup_fid(&self, cred: &Cred, parent: Fid, name: &[u8]) -> OpResult<Fid> {
        let dir = self.dir_inode(parent)?;
        if !self.may(parent, &dir, cred, MAY_EXEC) {
            return Err(Errno::EACCES.into());
        }
        let child = match name {
            b"." => parent,
            b".." => dir.parent,
            _ => {
                check_name(name)?;
                self.dirent(parent, name)?.ok_or(Errno::ENOENT)?.fid
            }
        };
        Ok(child)
    }

    pub(crate) fn readdir(
        &self,
        cred: &Cred,
        fid: Fid,
        cookie: u64,
        plus: bool,
        count: usize,
    ) -> OpResult<ReaddirRep> {
        let dir = self.dir_inode(fid)?;
        let page_max = if count == 0 {
            READDIR_PAGE_ENTRIES
        } else {
            count.min(READDIR_PAGE_ENTRIES)
        };
        if !self.may(fid, &dir, cred, MAY_READ) {
            return Err(Errno::EACCES.into());
        }
        if dir.nlink == 0 {
            // Removed while open (an orphan): nothing, not even `.` and `..`, as Linux
            // lists a removed directory (and Lustre, a dead one).
            return Ok(ReaddirRep {
                entries: Vec::new(),
                next: END_COOKIE,
            });
        }
        let mut entries = Vec::new();
        let body = |f: Fid| {
            if plus {
                self.getattr(f).ok().map(Box::new)
            } else {
                None
            }
        };
        if cookie == DOT_COOKIE {
            entries.push(DirEntry {
                name: b".".to_vec(),
                fid,
                dtype: libc::DT_DIR,
                cookie: DOT_COOKIE,
                body: body(fid),
            });
        }
        if cookie <= DOTDOT_COOKIE {
            let p = dir.parent;
            entries.push(DirEntry {
                name: b"..".to_vec(),
                fid: p,
                dtype: libc::DT_DIR,
                cookie: DOTDOT_COOKIE,
                body: body(p),
            });
        }
        if cookie >= END_COOKIE {
            return Ok(ReaddirRep {
                entries: Vec::new(),
                next: END_COOKIE,
            });
        }
        let prefix = fid.to_bytes();
        let mut start = prefix.to_vec();
        start.extend_from_slice(&cookie.max(2).to_be_bytes());
        let mut bytes = 0usize;
        let mut last_hash = None;
        // The hash of the first entry left for the next page.
        let mut cut = None;
        let mut bad = None;
        self.store
            .engine()
            .scan(Cf::Dirent, &prefix, &start, &mut |k, v| {
                let Some((hash, name)) = parse_dirent_key(k) else {
                    return true;
                };
                let full = bytes >= READDIR_PAGE_BYTES || entries.len() >= page_max;
                if full {
                    // Never split a hash group across pages: a resumed readdir starts at a
                    // hash, so a split group would be skipped or repeated. The page grows
                    // for a group instead, up to a bound no real group reaches.
                    if last_hash != Some(hash) {
                        cut = Some(hash);
                        return false;
                    }
                    if bytes >= READDIR_GROUP_BYTES_MAX {
                        bad = Some(OpError::Errno(Errno::EOVERFLOW));
                        return false;
                    }
                }
                match crate::inode::decode_dirent(v) {
                    Ok(d) => {
                        bytes += name.len() + 32;
                        last_hash = Some(hash);
                        entries.push(DirEntry {
                            name: name.to_vec(),
                            fid: d.fid,
                            dtype: d.dtype,
                            cookie: hash,
                            body: None,
                        });
                    }
                    Err(e) => {
                        bad = Some(e.into());
                        return false;
                    }
                }
                true
            })?;
        if let Some(e) = bad {
            if matches!(e, OpError::Errno(Errno::EOVERFLOW)) {
                warn!(dir = %fid, "readdir: a hash group larger than {READDIR_GROUP_BYTES_MAX} bytes cannot be listed");
            }
            return Err(e);
        }
        if plus {
            let fids: Vec<Fid> = entries
                .iter()
                .filter(|e| e.body.is_none())
                .map(|e| e.fid)
                .collect();
            let mut bodies = self.getattr_many(&fids).into_iter();
            for e in entries.iter_mut().filter(|e| e.body.is_none()) {
                e.body = bodies.next().and_then(Result::ok).map(Box::new);
            }
        }
        // Where the next page starts: just past the last entry given (clients take
        // that as the next offset), even when that is `..` (a count of 1 or 2).
        let next = match (cut, entries.last()) {
            (None, _) => END_COOKIE,
            (Some(_), Some(e)) => e.cookie + 1,
            (Some(h), None) => h,
        };
        Ok(ReaddirRep { entries, next })
    }

    pub(crate) fn create(&self, ctx: &Ctx, slot: u32, r: CreateReq) -> OpResult<(CreateRep, u64)> {
        if r.open_flags
            .is_some_and(|f| lode_base::perm::is_tmpfile(f as i32))
        {
            return self.create_tmpfile(ctx, slot, r);
        }
        check_new_name(&r.name)?;
        if r.open_flags.is_some() {
            self.check_open_cap(ctx, slot)?;
        }
        let ftype = FileType::from_mode(r.mode).ok_or(Errno::EINVAL)?;
        if !r.fid.is_normal() {
            return Err(Errno::EINVAL.into());
        }
        if ftype == FileType::Symlink {
            if r.target.is_empty() {
                return Err(Errno::ENOENT.into());
            }
            if r.target.len() >= SYMLINK_MAX {
                return Err(Errno::ENAMETOOLONG.into());
            }
        }
        self.check_space()?;
        let hash = name_hash(&r.name);
        let mut held = self
            .pdo
            .lock(&[(r.parent, Mode::Shared)], &[(r.parent, hash)]);
        let parent = self.dir_inode(r.parent)?;
        if parent.nlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        // As Linux: no search permission hides the name; an existing name is reported
        // (or opened) before a missing write permission.
        if !self.may(r.parent, &parent, &r.cred, MAY_EXEC) {
            return Err(Errno::EACCES.into());
        }
        if self.dirent(r.parent, &r.name)?.is_some() {
            if r.open_flags.is_some_and(|f| f as i32 & libc::O_EXCL == 0) {
                // The directory stays as it is.
                crate::inode::dirs::note(r.parent, &parent, false);
                drop(held);
                return self.open_existing(ctx, slot, &r);
            }
            return Err(Errno::EEXIST.into());
        }
        if !self.may(r.parent, &parent, &r.cred, MAY_WRITE) {
            return Err(Errno::EACCES.into());
        }
        if lode_base::perm::iflags::forbid_dir_change(parent.fs_flags(), false) {
            return Err(Errno::EPERM.into());
        }
        if matches!(ftype, FileType::CharDev | FileType::BlockDev) && r.cred.uid != 0 {
            return Err(Errno::EPERM.into());
        }
        if self.store.inode_exists(&r.fid.to_bytes())? {
            return Err(Errno::EEXIST.into());
        }
        let dir = ftype == FileType::Directory;
        let (mode, gid) = new_owner(&parent, &r.cred, ftype, r.mode);
        let layout = match ftype {
            FileType::Regular => {
                Some(self.new_layout(r.layout.as_ref(), parent.layout.as_ref(), ctx.replay)?)
            }
            FileType::Directory => match &r.layout {
                Some(l) => {
                    self.check_template(l)?;
                    Some(l.clone())
                }
                None => parent.layout.clone(),
            },
            _ => None,
        };
        let now = now_ns();
        let write = r
            .open_flags
            .is_some_and(|f| lode_base::perm::wants_write(f as i32));
        let mut rec = InodeRec {
            mode,
            uid: r.cred.uid,
            gid,
            nlink: if dir { 2 } else { 1 },
            size: match ftype {
                FileType::Directory => DIR_SIZE,
                FileType::Symlink => r.target.len() as u64,
                _ => 0,
            },
            blocks: if dir { 8 } else { 0 },
            atime: now,
            mtime: now,
            ctime: now,
            rdev: if matches!(ftype, FileType::CharDev | FileType::BlockDev) {
                r.rdev
            } else {
                0
            },
            flags: if write {
                INODE_DATA | INODE_NO_XATTRS
            } else {
                INODE_NO_XATTRS
            },
            version: 0,
            parent: if dir { r.parent } else { Fid::ZERO },
            layout,
            symlink: if ftype == FileType::Symlink {
                r.target.clone()
            } else {
                Vec::new()
            },
            links: vec![lode_store::records::Link {
                parent: r.parent,
                name: r.name.clone(),
            }],
            btime: now,
        };
        let mut b = Batch::new();
        // The parent as its inode lock keeps it: its default ACL (a setfacl -d of it
        // waits for this create, or this create for it), link count and times.
        self.pdo.lock_inodes(&mut held, &[r.parent]);
        let mut parent = self.dir_inode(r.parent)?;
        crate::inode::dirs::note(r.parent, &parent, true);
        self.inherit_acls(&mut b, r.parent, &parent, r.fid, &mut rec, r.umask)?;
        put_dirent(&mut b, r.parent, &r.name, r.fid, dtype_of(mode));
        put_inode(&mut b, r.fid, &rec);
        let handle = r
            .open_flags
            .map(|_| ctx.open_handle.unwrap_or_else(|| self.next_handle()));
        let mut body = self.body(r.fid, &rec);
        // Its creator, holding the only handle, knows it empty until it writes; any
        // other writer's open calls its locks back first (every open for writing
        // does). Others glimpse.
        body.glimpse = false;
        let rep = opened(body, handle);
        if dir {
            // Subdirectories are not bounded by `LINK_MAX` (see `shown_nlink`).
            parent.nlink = parent.nlink.checked_add(1).ok_or(Errno::EMLINK)?;
        }
        parent.mtime = now;
        parent.ctime = now;
        put_inode(&mut b, r.parent, &parent);
        let transno = self.commit(ctx, b, &Reply::Create(rep.clone()))?;
        if let Some(h) = handle {
            let mark = if write {
                DataMark::Marked
            } else {
                DataMark::Reader
            };
            self.register_open(ctx, h, r.fid, slot, mark);
        }
        Ok((rep, transno))
    }

    /// `open(O_TMPFILE)` (Lustre's volatile file): a regular file with no name, open
    /// for writing, an orphan from the start, so its last close (or a restart nobody
    /// reopens it across) destroys it unless `linkat` names it first, which a file
    /// made with `O_EXCL` refuses. Its directory lends permissions, group, default
    /// ACLs and layout, and does not change.
    fn create_tmpfile(&self, ctx: &Ctx, slot: u32, r: CreateReq) -> OpResult<(CreateRep, u64)> {
        let flags = r.open_flags.unwrap_or(0) as i32;
        if !r.name.is_empty()
            || FileType::from_mode(r.mode) != Some(FileType::Regular)
            || !lode_base::perm::wants_write(flags)
            || !r.fid.is_normal()
        {
            return Err(Errno::EINVAL.into());
        }
        self.check_open_cap(ctx, slot)?;
        self.check_space()?;
        let mut held = self.pdo.lock(&[(r.parent, Mode::Shared)], &[]);
        self.pdo.lock_inodes(&mut held, &[r.parent]);
        let parent = self.dir_inode(r.parent)?;
        if parent.nlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        if !self.may(r.parent, &parent, &r.cred, MAY_WRITE | MAY_EXEC) {
            return Err(Errno::EACCES.into());
        }
        if lode_base::perm::iflags::forbid_dir_change(parent.fs_flags(), false) {
            return Err(Errno::EPERM.into());
        }
        if self.store.inode_exists(&r.fid.to_bytes())? {
            return Err(Errno::EEXIST.into());
        }
        let (mode, gid) = new_owner(&parent, &r.cred, FileType::Regular, r.mode);
        let layout = self.new_layout(r.layout.as_ref(), parent.layout.as_ref(), ctx.replay)?;
        let now = now_ns();
        let linkable = if flags & libc::O_EXCL == 0 {
            records::INODE_LINKABLE
        } else {
            0
        };
        let mut rec = InodeRec {
            mode,
            uid: r.cred.uid,
            gid,
            nlink: 0,
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            rdev: 0,
            flags: INODE_DATA | INODE_NO_XATTRS | linkable,
            version: 0,
            parent: Fid::ZERO,
            layout: Some(layout),
            symlink: Vec::new(),
            links: Vec::new(),
            btime: now,
        };
        let mut b = Batch::new();
        self.inherit_acls(&mut b, r.parent, &parent, r.fid, &mut rec, r.umask)?;
        put_inode(&mut b, r.fid, &rec);
        b.put(Cf::Orphan, r.fid.to_bytes().to_vec(), Vec::new());
        let handle = ctx.open_handle.unwrap_or_else(|| self.next_handle());
        let mut body = self.body(r.fid, &rec);
        body.glimpse = false;
        let rep = opened(body, Some(handle));
        let transno = self.commit(ctx, b, &Reply::Create(rep.clone()))?;
        self.register_open(ctx, handle, r.fid, slot, DataMark::Marked);
        Ok((rep, transno))
    }

    fn open_existing(&self, ctx: &Ctx, slot: u32, r: &CreateReq) -> OpResult<(CreateRep, u64)> {
        let child = self.dirent(r.parent, &r.name)?.ok_or(Errno::ENOENT)?;
        let flags = r.open_flags.unwrap_or(0) & !(libc::O_CREAT as u32);
        let (rep, t) = self.open_fid(ctx, slot, &r.cred, child.fid, flags, 0)?;
        Ok((rep, t))
    }

    fn next_handle(&self) -> u64 {
        let mut o = self.opens.lock();
        o.next += 1;
        o.next
    }

    /// How many times the handles of the client in `slot` were all closed (see
    /// [`Ctx::open_epoch`]).
    pub(crate) fn open_epoch(&self, slot: u32) -> u64 {
        self.opens.lock().departures_of(slot)
    }

    fn register_open(&self, ctx: &Ctx, handle: u64, fid: Fid, slot: u32, data: DataMark) {
        let mut o = self.opens.lock();
        // Checked under the lock `close_all_of` counts under: either this handle is
        // in the table it closes, or the count has moved.
        if ctx.open_epoch.is_some_and(|e| o.departures_of(slot) != e) {
            tracing::debug!(slot, handle, %fid, "open of a departed client: no handle kept");
            return;
        }
        let write = data != DataMark::Reader;
        let (alone, events) = if write {
            o.break_migration(fid);
            *o.write_slots.entry((fid, slot)).or_insert(0) += 1;
            let w = o.writers.entry(fid).or_insert((0, 0));
            let alone = w.0 == 0;
            w.0 += 1;
            w.1 += 1;
            (alone, w.1)
        } else {
            (false, 0)
        };
        o.handles.insert(
            handle,
            OpenHandle {
                fid,
                slot,
                write,
                alone,
                events,
                layout_lock: 0,
                dom_wrote: false,
            },
        );
        *o.per_slot.entry(slot).or_insert(0) += 1;
        *o.counts.entry(fid).or_insert(0) += 1;
        match data {
            DataMark::Marked => {
                o.clean.insert(fid, handle);
            }
            DataMark::Writer => {
                o.clean.remove(&fid);
            }
            DataMark::Reader => {}
        }
    }

    /// ENFILE if the client in `slot` holds `max_open_files_per_client` handles, or
    /// the MDT four times the default of that: a client cannot grow the open table
    /// without bound. Opens registered again in recovery (`ctx.open_handle`) are not
    /// refused.
    fn check_open_cap(&self, ctx: &Ctx, slot: u32) -> OpResult<()> {
        if ctx.open_handle.is_some() {
            return Ok(());
        }
        let cap = self
            .tun
            .max_open_per_client
            .load(std::sync::atomic::Ordering::Relaxed);
        let o = self.opens.lock();
        if o.per_slot.get(&slot).copied().unwrap_or(0) >= cap
            || o.handles.len() >= lode_base::limits::OPEN_HANDLES_PER_CLIENT_MAX * 4
        {
            return Err(Errno::ENFILE.into());
        }
        Ok(())
    }

    /// Registers again, in recovery, an open its client held before the restart (the
    /// open itself was committed): the same handle, on the same file, even if it was
    /// unlinked since (an orphan). Nothing durable changes.
    pub(crate) fn reopen(&self, slot: u32, fid: Fid, flags: u32, handle: u64) -> OpResult<()> {
        if self.opens.lock().handles.contains_key(&handle) {
            return Ok(());
        }
        self.inode(fid)?;
        let mark = if lode_base::perm::wants_write(flags as i32) {
            DataMark::Writer
        } else {
            DataMark::Reader
        };
        self.register_open(&Ctx::default(), handle, fid, slot, mark);
        // Who else wrote while it was open is gone with the restart: the size its
        // client knows at close is not to be kept (lazy size on MDT).
        if let Some(h) = self.opens.lock().handles.get_mut(&handle) {
            h.alone = false;
        }
        Ok(())
    }

    /// An explicit mtime was set: a writer's glimpse from before it must not be kept.
    pub(crate) fn times_changed(&self, fid: Fid) {
        self.opens.lock().not_alone(fid);
    }

    /// True if `handle` is open for writing (or truncation) on `fid` by the client in
    /// `slot`.
    pub(crate) fn writes_through(&self, fid: Fid, slot: u32, handle: u64) -> bool {
        self.opens
            .lock()
            .handles
            .get(&handle)
            .is_some_and(|h| h.writes(fid, slot))
    }

    /// The file's data changed other than through writes (a truncate): a handle that
    /// marked it can no longer take the mark back, a migration's copy is stale, and
    /// its writers are no longer alone, unless the truncate came through open handle
    /// `through.1` of the client in slot `through.0`, and that is the file's only
    /// writer, alone since its open. That writer stays alone: its client sent the
    /// truncate while holding the handle, so the handle's close comes after it (and
    /// after the OST punch that went with it), and what the close glimpses then is
    /// the size. A `>` over an existing file (`O_TRUNC`) keeps its size on the MDT
    /// so. A truncate by path may overtake a close the kernel did not wait for
    /// (`close(fd); truncate(path)`): it names no handle and counts, as any other.
    pub(crate) fn truncated(&self, fid: Fid, through: Option<(u32, u64)>) {
        let mut guard = self.opens.lock();
        let o = &mut *guard;
        o.clean.remove(&fid);
        o.break_migration(fid);
        let own = through.and_then(|(slot, handle)| {
            let h = o.handles.get_mut(&handle)?;
            let w = o.writers.get_mut(&fid)?;
            let sole = h.writes(fid, slot) && h.alone;
            (sole && w.0 == 1 && w.1 == h.events).then_some((h, w))
        });
        match own {
            Some((h, w)) => {
                w.1 += 1;
                h.events = w.1;
            }
            None => o.not_alone(fid),
        }
    }

    /// True if some client holds `fid` open for writing.
    pub(crate) fn being_written(&self, fid: Fid) -> bool {
        self.opens.lock().writers.contains_key(&fid)
    }

    /// True if a client other than the one of `slot` holds `fid` open for writing.
    pub(crate) fn written_by_others(&self, fid: Fid, slot: u32) -> bool {
        let o = self.opens.lock();
        let all = o.writers.get(&fid).map_or(0, |w| w.0);
        all > o.write_slots.get(&(fid, slot)).copied().unwrap_or(0)
    }

    /// True if some client holds `fid` open.
    pub(crate) fn is_open(&self, fid: Fid) -> bool {
        self.opens.lock().counts.get(&fid).is_some_and(|c| *c > 0)
    }

    pub(crate) fn open_fid(
        &self,
        ctx: &Ctx,
        slot: u32,
        cred: &Cred,
        fid: Fid,
        flags: u32,
        cached: u64,
    ) -> OpResult<(CreateRep, u64)> {
        let flags = flags as i32;
        self.check_open_cap(ctx, slot)?;
        let mut held = self.pdo.lock(&[], &[]);
        self.pdo.lock_inodes(&mut held, &[fid]);
        let mut rec = self.inode(fid)?;
        // A file with no name left is still there while open (an orphan): Linux
        // opens it again through `/proc/PID/fd/N`, as Lustre opens volatile files
        // by FID.
        if rec.nlink == 0 && !self.is_open(fid) {
            return Err(Errno::ENOENT.into());
        }
        let acc = flags & libc::O_ACCMODE;
        let ft = FileType::from_mode(rec.mode).ok_or(Errno::EIO)?;
        if ft == FileType::Directory && (acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0) {
            return Err(Errno::EISDIR.into());
        }
        if flags & libc::O_DIRECTORY != 0 && ft != FileType::Directory {
            return Err(Errno::ENOTDIR.into());
        }
        if ft == FileType::Symlink {
            return Err(Errno::ELOOP.into());
        }
        // An exec's open (FMODE_EXEC) needs execute permission, not read.
        let want = lode_base::perm::open_wants(flags);
        let write = lode_base::perm::wants_write(flags);
        if !self.may(fid, &rec, cred, want) {
            return Err(Errno::EACCES.into());
        }
        if lode_base::perm::iflags::forbid_open(rec.fs_flags(), flags) {
            return Err(Errno::EPERM.into());
        }
        let mut b = Batch::new();
        let mark = if write && ft == FileType::Regular && rec.flags & INODE_DATA == 0 {
            self.mark_again(fid)?;
            rec.flags |= INODE_DATA;
            put_inode(&mut b, fid, &rec);
            DataMark::Marked
        } else if write {
            DataMark::Writer
        } else {
            DataMark::Reader
        };
        let handle = ctx.open_handle.unwrap_or_else(|| self.next_handle());
        let mut rep = opened(self.body(fid, &rec), Some(handle));
        let transno = if b.is_empty() && ctx.slot.is_none() {
            0
        } else {
            self.commit(ctx, b, &Reply::Open(rep.clone()))?
        };
        self.register_open(ctx, handle, fid, slot, mark);
        if !write && ft == FileType::Regular {
            rep.data_token = self.data_token(&rec);
            rep.cache_current = self.data_unchanged(fid, cached, rep.data_token, rec.version);
            if !rep.cache_current {
                rep.dom_data = self.read_on_open(fid, &rec)?;
            }
        }
        Ok((rep, transno))
    }

    /// A close ahead took back `fid`'s data mark in untracked write number `n`.
    fn unmarked_at(&self, fid: Fid, n: u64) {
        const MAX: usize = lode_base::limits::UNMARKED_MAX;
        let mut u = self.unmarked.lock();
        if u.len() >= MAX {
            self.forget_synced(&mut u);
            if u.len() >= MAX {
                // Rare (a burst of closes ahead faster than commits): one sync
                // settles them all.
                drop(u);
                if let Err(e) = self.store.sync() {
                    tracing::warn!("syncing data marks taken back: {e}");
                }
                u = self.unmarked.lock();
                // Not all of them: one taken back by another thread meanwhile may be
                // past what that sync covered.
                self.forget_synced(&mut u);
            }
        }
        u.insert(fid, n);
    }

    /// Drops from `unmarked` the writes a sync covers.
    fn forget_synced(&self, u: &mut std::collections::HashMap<Fid, u64>) {
        let synced = self.store.untracked_synced();
        u.retain(|_, m| *m > synced);
    }

    /// A writer's open is about to set `fid`'s data mark again (under its inode
    /// lock): if a close ahead took it back in a write no sync covers yet, that write
    /// is synced first. Otherwise a crash could lose both, and the open's replay,
    /// finding the mark, would not move the version as the open did, so that its
    /// client's later changes to the file, replayed past a recovery gap, would be
    /// refused.
    fn mark_again(&self, fid: Fid) -> OpResult<()> {
        let Some(n) = self.unmarked.lock().remove(&fid) else {
            return Ok(());
        };
        if n > self.store.untracked_synced() {
            self.store.sync()?;
        }
        Ok(())
    }

    pub(crate) fn close(
        &self,
        ctx: &Ctx,
        slot: u32,
        r: &lode_proto::CloseReq,
    ) -> OpResult<(CloseRep, u64)> {
        match self.opens.lock().handles.get(&r.handle) {
            Some(h) if h.slot == slot => {}
            _ => return Err(Errno::EBADF.into()),
        }
        self.close_inner(ctx, r.handle, r.wrote, r.attrs, false)
    }

    /// Remembers the layout lock granted with open `handle`.
    pub(crate) fn set_open_lock(&self, handle: u64, lock: u64) {
        if let Some(h) = self.opens.lock().handles.get_mut(&handle) {
            h.layout_lock = lock;
        }
    }

    /// The layout lock granted with open `handle` (0: none).
    pub(crate) fn open_lock(&self, handle: u64) -> u64 {
        self.opens
            .lock()
            .handles
            .get(&handle)
            .map_or(0, |h| h.layout_lock)
    }

    /// The file an open handle is on.
    pub(crate) fn handle_fid(&self, handle: u64) -> Option<Fid> {
        self.opens.lock().handles.get(&handle).map(|h| h.fid)
    }

    /// Closes a handle outside any request (a client's goodbye, its eviction). Like
    /// a close ahead, it takes no transno and moves no inode's version (it changes no
    /// inode but an unlinked file's and a size mark, below): no client replays it, so
    /// a crash that loses it would leave a gap in the transnos, and every later replay
    /// would be version-checked against the inode it changed (a chmod made after it refused, for one). What the client
    /// wrote is unknown, so an OST file's size marks stay (its next writer's close
    /// settles them); a DoM-only file's, whose bytes are all here, is cleared (see
    /// `close_inner`).
    pub(crate) fn close_handle(&self, handle: u64) -> OpResult<()> {
        self.close_inner(&Ctx::default(), handle, true, None, true)
            .map(drop)
    }

    /// Closes the handles of the client in `slot` that a `CloseAhead` names (nobody
    /// waits for its answer), with no lock taken and no reply record, since such a
    /// close changes nothing its client must learn: its client wrote nothing through
    /// them (read-only handles, and writers that wrote nothing, as a `creat` and its
    /// `close`). Nor does it move an inode's version, which another change could
    /// depend on: no reply record means no replay, and a later change's replay would
    /// find the inode's version short of what it was made against. Only an unlinked
    /// file's destruction at its last close (which no change can depend on; a restart
    /// destroys it again) and the taking back of a data mark (see `close_inner`) are
    /// written. A handle not open, another client's or migrating the file is skipped.
    /// `written`: handles that wrote to OST objects, each with the size its writes
    /// left if known, kept as lazy size on MDT if it was the only writer (see
    /// `close_inner`); without it the data mark stays.
    /// Returns the layout locks of the handles closed, and how many were skipped.
    pub(crate) fn close_ahead(
        &self,
        slot: u32,
        handles: &[u64],
        written: &[(u64, Option<lode_proto::CloseAttrs>)],
    ) -> (Vec<u64>, usize) {
        let (mut locks, mut skipped) = (Vec::new(), 0);
        let all = handles
            .iter()
            .map(|&h| (h, false, None))
            .chain(written.iter().map(|&(h, a)| (h, true, a)));
        for (handle, wrote, attrs) in all {
            let lock = {
                let o = self.opens.lock();
                match o.handles.get(&handle) {
                    Some(h)
                        if h.slot == slot
                            && o.migrations.get(&h.fid).is_none_or(|m| m.handle != handle) =>
                    {
                        h.layout_lock
                    }
                    _ => {
                        skipped += 1;
                        continue;
                    }
                }
            };
            match self.close_inner(&Ctx::default(), handle, wrote, attrs, true) {
                Ok(_) => locks.push(lock),
                Err(e) => tracing::warn!(handle, "closing a handle ahead: {e:?}"),
            }
        }
        (locks, skipped)
    }

    /// Moves the access times an `AccessAhead` of the client in `slot` names (nobody
    /// waits for its answer): each handle's file takes the time its read gave it, if
    /// later than the one it has, and never one ahead of this MDT's clock. The times
    /// wait in memory (`PendingAtimes`, which every inode read takes in) and are
    /// written together by [`Namespace::flush_atimes`]: one store write per read
    /// would cost more than the read. Like a close ahead they take no transno and
    /// write the inode at its version: an access time is lazy (Lustre's too: a crash
    /// before the commit loses it), no replay depends on it, and a reader's data
    /// token (the bytes) does not change. No lock is called back: other clients see
    /// the time with their next fetch of the attributes, as on Lustre. A handle not
    /// open, or another client's, is skipped. Returns how many were skipped.
    pub(crate) fn access_ahead(&self, slot: u32, items: &[(u64, i64)]) -> usize {
        let now = crate::inode::now_ns();
        let mut skipped = 0;
        let mut waiting = 0;
        {
            let o = self.opens.lock();
            for &(handle, atime) in items {
                match o.handles.get(&handle).filter(|h| h.slot == slot) {
                    Some(h) => waiting = self.atimes.note(h.fid, atime.min(now)),
                    None => skipped += 1,
                }
            }
        }
        if waiting >= lode_base::limits::ATIMES_PENDING_MAX {
            self.flush_atimes();
        }
        skipped
    }

    /// Writes the access times waiting in memory into their inodes, a chunk of
    /// files per store write, each chunk under its inodes' locks (so no change
    /// reads an inode between the write and the time leaving memory).
    pub fn flush_atimes(&self) {
        let waiting = self.atimes.snapshot();
        if waiting.is_empty() {
            return;
        }
        for chunk in waiting.chunks(lode_base::limits::ACCESS_AHEAD_MAX) {
            let fids: Vec<Fid> = chunk.iter().map(|t| t.0).collect();
            let mut held = self.pdo.lock(&[], &[]);
            self.pdo.lock_inodes(&mut held, &fids);
            let keys: Vec<_> = fids.iter().map(Fid::to_bytes).collect();
            let got = match self.store.inodes(&keys) {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!("reading inodes for access times: {e}");
                    return;
                }
            };
            let mut b = Batch::new();
            for (&(fid, atime), bytes) in chunk.iter().zip(got) {
                // Read as stored, not through `inode`, which would take the time in.
                let Some(Ok(mut rec)) = bytes.as_deref().map(InodeRec::decode) else {
                    continue;
                };
                if atime > rec.atime {
                    rec.atime = atime;
                    put_inode_unversioned(&mut b, fid, &rec);
                }
            }
            if !b.is_empty() {
                if let Err(e) = self.store.apply_untracked(&b) {
                    tracing::warn!("writing access times: {e}");
                    return;
                }
            }
            self.atimes.settled(chunk);
        }
        // Handed to the OS now, not at the next round of requests: a `kill -9` of an
        // idle MDS after this loses none of them.
        if let Err(e) = self.store.flush() {
            tracing::warn!("writing access times: {e}");
        }
    }

    /// Closes every handle of a client that disconnected on purpose.
    pub(crate) fn close_all_of(&self, slot: u32) {
        let handles: Vec<u64> = {
            let mut o = self.opens.lock();
            *o.departures.entry(slot).or_insert(0) += 1;
            o.handles
                .iter()
                .filter(|(_, h)| h.slot == slot)
                .map(|(k, _)| *k)
                .collect()
        };
        for h in handles {
            if let Err(e) = self.close_handle(h) {
                tracing::warn!("closing handle of a departing client: {e:?}");
            }
        }
    }

    /// Closes `handle`. An `untracked` close (one no client waits for: see
    /// `close_ahead` and `close_handle`) is written with no transno and leaves the
    /// inode's version as it is. It changes the inode only if the file goes with it,
    /// if it was the marking writer's and nothing was written since (the data mark
    /// taken back, see `mark_again`), or if it was a DoM-only file's last writer (its
    /// size mark cleared, and synced).
    fn close_inner(
        &self,
        ctx: &Ctx,
        handle: u64,
        wrote: bool,
        attrs: Option<lode_proto::CloseAttrs>,
        untracked: bool,
    ) -> OpResult<(CloseRep, u64)> {
        let Some(fid) = self.opens.lock().handles.get(&handle).map(|h| h.fid) else {
            return Err(Errno::EBADF.into());
        };
        let mut held = self.pdo.lock(&[], &[]);
        self.pdo.lock_inodes(&mut held, &[fid]);
        let last = {
            let mut o = self.opens.lock();
            let Some(h) = o.handles.remove(&handle) else {
                return Err(Errno::EBADF.into());
            };
            if let Some(n) = o.per_slot.get_mut(&h.slot) {
                *n -= 1;
                if *n == 0 {
                    o.per_slot.remove(&h.slot);
                }
            }
            let c = o.counts.entry(fid).or_insert(1);
            *c -= 1;
            let last = *c == 0;
            if last {
                o.counts.remove(&fid);
            }
            let marked = o.clean.get(&fid) == Some(&handle);
            if marked {
                o.clean.remove(&fid);
            }
            // The only writer since its open, and the last one out: what it glimpsed
            // before closing is the file's size.
            let mut sole = false;
            let mut last_writer = false;
            if h.write {
                if let Some(n) = o.write_slots.get_mut(&(fid, h.slot)) {
                    *n -= 1;
                    if *n == 0 {
                        o.write_slots.remove(&(fid, h.slot));
                    }
                }
                if let Some(w) = o.writers.get_mut(&fid) {
                    w.0 -= 1;
                    sole = h.alone && w.1 == h.events && w.0 == 0;
                    if w.0 == 0 {
                        o.writers.remove(&fid);
                        last_writer = true;
                    }
                }
            }
            let migrating = o.migrations.get(&fid).is_some_and(|m| m.handle == handle);
            if migrating {
                o.migrations.remove(&fid);
            }
            (
                last,
                last_writer,
                marked && !wrote,
                sole,
                migrating,
                h.dom_wrote,
            )
        };
        let (last, last_writer, unmark, sole, migrating, dom_wrote) = last;
        let lazy = attrs.filter(|_| sole);
        let mut b = Batch::new();
        if migrating {
            // Closed before its swap: the migration is abandoned with this close.
            self.migrate_abandon(&mut b, fid)?;
        }
        let mut rep = CloseRep::default();
        let mut settled = false;
        let mut unmarked = false;
        if last || last_writer || unmark || lazy.is_some() {
            if let Ok(mut rec) = self.inode(fid) {
                if last && rec.nlink == 0 {
                    b.delete(Cf::Orphan, fid.to_bytes().to_vec());
                    self.drop_inode(&mut b, fid, &rec)?;
                } else if untracked
                    && unmark
                    && rec.flags & INODE_DATA != 0
                    && (!dom_wrote || all_here(&rec))
                {
                    // Closed ahead by the writer that set the mark, with no other
                    // writer or truncate since, having written nothing or only bytes
                    // on this MDT (each of its DOM_WRITEs moved the version and left
                    // the size exact here; no OST object holds anything): the mark
                    // goes, at the same version (no byte changed since the last
                    // version, and no data token named it while marked). A handle that
                    // wrote here while objects exist keeps the mark: OST bytes may
                    // have moved on without this MDT. Not synced here: a crash that
                    // loses it leaves the mark, which costs a glimpse, never a wrong
                    // size. The one change that depends on its being gone, a writer's
                    // open setting the mark again (and moving the version, which a
                    // replay over a restored mark would not), syncs first
                    // (`mark_again`).
                    rec.flags &= !INODE_DATA;
                    put_inode_unversioned(&mut b, fid, &rec);
                    unmarked = true;
                } else if let Some(a) = lazy.filter(|_| untracked && lsom_applies(&rec)) {
                    // Closed ahead by the only writer since its open, which wrote to
                    // OST objects: lazy size on MDT as below, and the mark goes, at
                    // the same version and not synced, as a close ahead's taking back
                    // of the mark above (a crash that loses it leaves the mark: a
                    // glimpse, never a wrong size). The objects' flag keeps them
                    // destroyed at unlink either way.
                    keep_lazy_size(&mut rec, &a);
                    put_inode_unversioned(&mut b, fid, &rec);
                    unmarked = true;
                } else if untracked {
                    // See `close_ahead`: the inode stays as it is, but for the mark a
                    // departed or evicted last writer of a DoM-only file would leave
                    // (no read-on-open until the next writer's close). It goes at the
                    // same version: the bytes, which the version names, did not change,
                    // so neither a replay's version check nor a reader's data token
                    // can tell. It is synced before the inode is let go (below): a
                    // later change that saw the mark gone (a writer's open skips
                    // setting it, and moves the version) must never be replayed over
                    // an inode that has it again.
                    if last_writer && rec.flags & INODE_DATA != 0 && all_here(&rec) {
                        rec.flags &= !INODE_DATA;
                        put_inode_unversioned(&mut b, fid, &rec);
                        settled = true;
                    }
                } else if (last || last_writer) && rec.flags & INODE_DATA != 0 && all_here(&rec) {
                    // Every byte is on this MDT: with no writer left, its size is
                    // exact here (Lustre's strict size on MDT for DoM-only files): no
                    // copy needs a glimpse, and the closer's (which may predate its
                    // own writes) gets the attributes as they are now. Readers still
                    // open do not matter (their closes may ride ahead, which changes
                    // no inode).
                    rec.flags &= !INODE_DATA;
                    put_inode(&mut b, fid, &rec);
                    rep.exact_size = true;
                    rep.attr = Some(rec.attr(fid));
                    if sole {
                        // The record as `put_inode` stores it, one version on.
                        rec.version = rec.version.wrapping_add(1);
                        rep.data_token = self.data_token(&rec);
                    }
                } else if let Some(a) = lazy.filter(|_| lsom_applies(&rec)) {
                    // Lazy size on MDT: nobody else wrote since this writer opened, so
                    // its glimpse is the file's size until the next writer.
                    keep_lazy_size(&mut rec, &a);
                    put_inode(&mut b, fid, &rec);
                    rep.exact_size = true;
                    rep.attr = Some(rec.attr(fid));
                } else if unmark && rec.flags & INODE_DATA != 0 {
                    rec.flags &= !INODE_DATA;
                    put_inode(&mut b, fid, &rec);
                    rep.exact_size = true;
                }
            }
        }
        if untracked {
            // No transno: nobody would replay it, and recovery would take the missing
            // transno for a lost change (making every later replay check versions). If
            // a crash loses the orphan's destruction or the abandoned migration, both
            // are cleaned after recovery.
            if !b.is_empty() {
                let n = self.store.apply_untracked(&b)?;
                if unmarked {
                    self.unmarked_at(fid, n);
                }
            }
            if settled {
                // Rare (an evicted or departed writer): one sync, under the inode lock.
                self.store.sync()?;
            }
            return Ok((rep, 0));
        }
        if b.is_empty() && ctx.slot.is_none() {
            return Ok((rep, 0));
        }
        let t = self.commit(ctx, b, &Reply::Close(rep.clone()))?;
        Ok((rep, t))
    }

    /// Removes one link of `child` inside batch `b` (unlink, rmdir, rename over it).
    /// Directories lose both links. The inode goes, becomes an orphan (still open), or
    /// is rewritten with one link less.
    pub(crate) fn unlink_inode(
        &self,
        b: &mut Batch,
        (parent, name): (Fid, &[u8]),
        child: Fid,
        rec: &mut InodeRec,
        now: i64,
    ) -> OpResult<()> {
        rec.remove_link(parent, name);
        if is_dir(rec.mode) {
            rec.nlink = 0;
        } else {
            rec.nlink = rec.nlink.saturating_sub(1);
        }
        rec.ctime = now;
        if rec.nlink > 0 {
            put_inode(b, child, rec);
        } else if self.is_open(child) {
            put_inode(b, child, rec);
            b.put(Cf::Orphan, child.to_bytes().to_vec(), Vec::new());
        } else {
            self.drop_inode(b, child, rec)?;
        }
        Ok(())
    }

    /// Removes the entry `name` from `parent` in batch `b` (helper for unlink paths).
    pub(crate) fn remove_entry(b: &mut Batch, parent: Fid, name: &[u8]) {
        del_dirent(b, parent, name);
    }
}

/// Whether a sole writer's size may be kept as lazy size on MDT for `rec`: marked as
/// written to, still linked, with a layout.
fn lsom_applies(rec: &InodeRec) -> bool {
    rec.flags & INODE_DATA != 0 && rec.nlink > 0 && rec.layout.is_some()
}

/// Lazy size on MDT: `rec` takes the size, blocks and mtime its only writer's close
/// said (`a`), its data mark goes, and the objects' flag stays, so that unlink still
/// destroys them.
fn keep_lazy_size(rec: &mut InodeRec, a: &lode_proto::CloseAttrs) {
    rec.size = a.size;
    rec.blocks = a.blocks;
    rec.mtime = rec.mtime.max(a.mtime);
    rec.ctime = rec.ctime.max(a.mtime);
    rec.flags &= !INODE_DATA;
    rec.flags |= records::INODE_OBJECTS;
}

/// The mode and group of a new inode of type `ftype` in `parent`, made by `cred` with
/// `mode` asked: a set-group-ID directory passes its group on (and its bit, to
/// directories); a set-group-ID bit the creator could not set on the file is dropped.
fn new_owner(parent: &InodeRec, cred: &Cred, ftype: FileType, mode: u32) -> (u32, u32) {
    let dir = ftype == FileType::Directory;
    let mut mode = ftype.mode_bits() | (mode & 0o7777);
    let gid = if parent.mode & libc::S_ISGID != 0 {
        if dir {
            mode |= libc::S_ISGID;
        }
        parent.gid
    } else {
        cred.gid
    };
    if !dir && mode & libc::S_ISGID != 0 && cred.uid != 0 && !cred.in_group(gid) {
        mode &= !libc::S_ISGID;
    }
    (mode, gid)
}

/// The answer to a create or open, before what the target layer adds (directory
/// attributes, read-on-open bytes, locks).
fn opened(body: MdtBody, handle: Option<u64>) -> CreateRep {
    CreateRep {
        dom_lock: 0,
        body,
        handle,
        parent: None,
        dom_data: None,
        data_token: 0,
        cache_current: false,
        layout_lock: 0,
        open_lock: 0,
        dir_page: None,
    }
}
