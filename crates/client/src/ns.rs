//! Namespace operations and path resolution.

use crate::locks::DirChange;
use crate::Client;
use lode_base::hash::END_COOKIE;
use lode_base::limits::{NAME_MAX, PATH_MAX, READDIR_PAGE_ENTRIES, READDIR_RANGES_MAX};
use lode_base::{Attr, Cred, Errno, Fid, FileType, Layout};
use lode_proto::{
    CreateReq, DirEntry, GetattrReq, GetxattrReq, LinkReq, LookupReq, MdtBody, ReaddirRep,
    ReaddirReq, RenameReq, Reply, Request, SetxattrReq, UnlinkReq,
};
use std::time::Instant;

/// Symlinks followed while resolving one path (Linux MAXSYMLINKS).
const MAX_SYMLINKS: usize = 40;

impl Client {
    /// Attributes as the MDT has them (no glimpse).
    pub async fn getattr_md(&self, cred: &Cred, fid: Fid) -> Result<MdtBody, Errno> {
        if let Some(b) = self.cached_attrs(fid) {
            return Ok(b);
        }
        match self
            .md(Request::Getattr(GetattrReq {
                cred: cred.clone(),
                fid,
            }))
            .await?
        {
            Reply::Getattr(b) => {
                self.remember(&b, None);
                Ok(b)
            }
            _ => Err(Errno::EPROTO),
        }
    }

    /// Sends `subs` in one RPC (Lustre's `MDS_BATCH`), executed by the MDT in order:
    /// a read batch (lookups and getattrs, granted their locks as single requests
    /// are) if nothing in it changes anything; otherwise a modifying batch (creates,
    /// unlinks, setattrs too), each change exactly once even if the batch is resent,
    /// answered once all of them are committed. One result per sub-request.
    pub async fn batch(&self, subs: Vec<Request>) -> Result<Vec<Result<Reply, Errno>>, Errno> {
        use lode_proto::{BatchReq, SubReq};
        if subs.len() > lode_base::limits::BATCH_SUBS_MAX {
            return Err(Errno::E2BIG);
        }
        let modify = subs.iter().any(|r| r.opcode().is_modify());
        let mut cancels = Vec::new();
        let mut invals = Vec::new();
        if modify {
            // What this client caches of the changes' targets goes first, as for a
            // single change (so the MDT need not call this client back).
            for r in subs.iter().filter(|r| r.opcode().is_modify()) {
                let (c, f) = self.release_for_change(r);
                cancels.extend(c);
                invals.push(f);
            }
        }
        let body = BatchReq {
            subs: subs
                .iter()
                .map(|r| SubReq {
                    opcode: r.opcode() as u16,
                    body: r.encode(),
                })
                .collect(),
        };
        let (req, flags) = if modify {
            (Request::BatchModify(body), 0)
        } else if self.callback_channel_up() {
            (Request::Batch(body), lode_proto::frame::FLAG_INTENT)
        } else {
            (Request::Batch(body), 0)
        };
        let rep = self.mdc.call_with(req, flags, &cancels).await;
        let results = match rep.map(|r| r.reply) {
            Ok(Reply::Batch(b) | Reply::BatchModify(b)) if b.results.len() == subs.len() => {
                b.results
            }
            Ok(_) => Err(Errno::EPROTO)?,
            Err(e) => {
                for (r, f) in subs.iter().filter(|r| r.opcode().is_modify()).zip(invals) {
                    self.after_change(r, false, f);
                }
                return Err(e);
            }
        };
        let mut invals = invals.into_iter();
        let mut out = Vec::with_capacity(results.len());
        for (r, res) in subs.iter().zip(results) {
            let rep = if res.status < 0 {
                Err(Errno::from_status(res.status))
            } else {
                Reply::decode(r.opcode() as u16, &res.body).map_err(|_| Errno::EPROTO)
            };
            if r.opcode().is_modify() {
                self.after_change(r, rep.is_ok(), invals.next().unwrap_or_default());
            }
            match (r, &rep) {
                (Request::Getattr(_), Ok(Reply::Getattr(b))) => self.remember(b, None),
                (Request::Lookup(l), Ok(Reply::Lookup(b))) => {
                    self.remember(b, Some((l.parent, &l.name, &l.cred)))
                }
                _ => {}
            }
            out.push(rep);
        }
        Ok(out)
    }

    /// Completes a body with the size, blocks and mtime from OST glimpses if needed.
    pub async fn complete(&self, mut body: MdtBody) -> Result<MdtBody, Errno> {
        if body.glimpse {
            let (size, blocks, mtime, ctime) = self
                .glimpse(body.attr.fid, body.layout.as_ref(), &body.attr)
                .await?;
            body.attr.size = size;
            body.attr.blocks = blocks;
            body.attr.mtime = mtime;
            body.attr.ctime = body.attr.ctime.max(ctime);
        }
        Ok(body)
    }

    /// `stat` by FID: MDT attributes plus OST size.
    pub async fn getattr(&self, cred: &Cred, fid: Fid) -> Result<Attr, Errno> {
        let b = self.getattr_md(cred, fid).await?;
        Ok(self.complete(b).await?.attr)
    }

    /// Looks `name` up in `parent` (the MDT checks search permission).
    pub async fn lookup(&self, cred: &Cred, parent: Fid, name: &[u8]) -> Result<MdtBody, Errno> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if let Some(r) = self.cached_lookup(cred, parent, name) {
            self.statahead_answered(cred, parent, name);
            return r;
        }
        if let Some(r) = self.statahead_lookup(cred, parent, name).await {
            return r;
        }
        if let Some(r) = self.pattern_lookup(cred, parent, name).await {
            return r;
        }
        match self
            .md(Request::Lookup(LookupReq {
                cred: cred.clone(),
                parent,
                name: name.to_vec(),
            }))
            .await?
        {
            Reply::Lookup(b) => {
                self.remember(&b, Some((parent, name, cred)));
                Ok(b)
            }
            _ => Err(Errno::EPROTO),
        }
    }

    async fn lookup_dir_cached(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
    ) -> Result<MdtBody, Errno> {
        let b = self.lookup(cred, parent, name).await?;
        // The timed name cache serves only a client without locks (see `resolve`).
        if b.attr.is_dir() && !self.callback_channel_up() {
            self.dcache
                .lock()
                .insert((parent, name.to_vec()), (b.attr.fid, Instant::now()));
        }
        Ok(b)
    }

    /// Resolves an absolute path (relative to the file system root). Intermediate
    /// symlinks are followed; the last component is followed only if `follow`.
    pub async fn resolve(&self, cred: &Cred, path: &str, follow: bool) -> Result<MdtBody, Errno> {
        if path.len() >= PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut todo: Vec<Vec<u8>> = components(path.as_bytes())
            .rev()
            .map(|c| c.to_vec())
            .collect();
        let mut cur = self.getattr_md(cred, Fid::ROOT).await?;
        let mut links = 0;
        while let Some(name) = todo.pop() {
            if !cur.attr.is_dir() {
                return Err(Errno::ENOTDIR);
            }
            let here = cur.attr.fid;
            if name == b".." {
                // Physical `..`, as Linux resolves it; the root's parent is the root.
                cur = self.lookup(cred, here, b"..").await?;
                continue;
            }
            if name == b"." {
                continue;
            }
            let last = todo.is_empty();
            // Under locks the lookup cache is coherent; the timed name cache is only
            // for a client without them.
            let cached = if last || self.callback_channel_up() {
                None
            } else {
                let hit = self.dcache.lock().get(&(here, name.clone())).copied();
                hit.filter(|(_, t)| t.elapsed() < self.cfg.entry_timeout)
                    .map(|(f, _)| f)
            };
            let b = match cached {
                Some(f) => match self.getattr_md(cred, f).await {
                    Ok(b) => b,
                    Err(_) => self.lookup_dir_cached(cred, here, &name).await?,
                },
                None => self.lookup_dir_cached(cred, here, &name).await?,
            };
            if b.attr.ftype() == FileType::Symlink && (!last || follow) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(Errno::ELOOP);
                }
                let target = b.symlink.clone();
                if target.first() == Some(&b'/') {
                    // Absolute targets are taken relative to the file system root.
                    cur = self.getattr_md(cred, Fid::ROOT).await?;
                }
                for c in components(&target).rev() {
                    todo.push(c.to_vec());
                }
                continue;
            }
            cur = b;
        }
        Ok(cur)
    }

    /// Resolves the parent directory of `path` and returns it with the last name.
    pub async fn resolve_parent(&self, cred: &Cred, path: &str) -> Result<(Fid, Vec<u8>), Errno> {
        let p = path.trim_end_matches('/');
        let (dir, name) = match p.rfind('/') {
            Some(i) => (&p[..i], &p[i + 1..]),
            None => ("", p),
        };
        if name.is_empty() {
            return Err(Errno::EEXIST);
        }
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let d = self
            .resolve(cred, if dir.is_empty() { "/" } else { dir }, true)
            .await?;
        if !d.attr.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        Ok((d.attr.fid, name.as_bytes().to_vec()))
    }

    #[allow(clippy::too_many_arguments)]
    async fn create_node(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u64,
        target: &[u8],
        layout: Option<Layout>,
    ) -> Result<MdtBody, Errno> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let fid = self.alloc_fid().await?;
        let req = CreateReq {
            dom_writeback: false,
            cred: cred.clone(),
            parent,
            name: name.to_vec(),
            fid,
            mode,
            umask,
            rdev,
            target: target.to_vec(),
            layout,
            open_flags: None,
        };
        match self.md(Request::Create(req)).await? {
            Reply::Create(r) => {
                self.remember(&r.body, Some((parent, name, cred)));
                self.remember_parent(r.parent.as_ref(), parent, cred, DirChange::Add(name));
                if r.body.attr.is_dir() {
                    self.remember_new_dir(r.body.attr.fid, r.body.lock);
                }
                Ok(r.body)
            }
            _ => Err(Errno::EPROTO),
        }
    }

    /// mkdir, optionally with a default layout for files created inside.
    pub async fn mkdir(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        mode: u32,
        default_layout: Option<Layout>,
    ) -> Result<MdtBody, Errno> {
        self.mkdir_umask(cred, parent, name, mode, 0, default_layout)
            .await
    }

    /// [`Client::mkdir`] with the caller's umask left to the MDT, which applies it
    /// unless the parent has a default ACL (a mount's kernel leaves it to the file
    /// system when ACLs are on).
    pub async fn mkdir_umask(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        mode: u32,
        umask: u32,
        default_layout: Option<Layout>,
    ) -> Result<MdtBody, Errno> {
        self.create_node(
            cred,
            parent,
            name,
            libc::S_IFDIR | (mode & 0o7777),
            umask,
            0,
            &[],
            default_layout,
        )
        .await
    }

    /// Creates a regular file (not opened), with an explicit layout if given.
    pub async fn create(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        mode: u32,
        layout: Option<Layout>,
    ) -> Result<MdtBody, Errno> {
        self.create_node(
            cred,
            parent,
            name,
            libc::S_IFREG | (mode & 0o7777),
            0,
            0,
            &[],
            layout,
        )
        .await
    }

    /// mknod: fifo, socket, char or block device (`mode` carries the type).
    pub async fn mknod(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> Result<MdtBody, Errno> {
        self.mknod_umask(cred, parent, name, mode, 0, rdev).await
    }

    /// [`Client::mknod`] with the caller's umask left to the MDT (see
    /// [`Client::mkdir_umask`]).
    pub async fn mknod_umask(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u64,
    ) -> Result<MdtBody, Errno> {
        if FileType::from_mode(mode)
            .is_none_or(|t| t == FileType::Directory || t == FileType::Symlink)
        {
            return Err(Errno::EINVAL);
        }
        self.create_node(cred, parent, name, mode, umask, rdev, &[], None)
            .await
    }

    /// symlink `name` → `target`.
    pub async fn symlink(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        target: &[u8],
    ) -> Result<MdtBody, Errno> {
        self.create_node(
            cred,
            parent,
            name,
            libc::S_IFLNK | 0o777,
            0,
            0,
            target,
            None,
        )
        .await
    }

    /// The target of a symlink.
    pub async fn readlink(&self, cred: &Cred, fid: Fid) -> Result<Vec<u8>, Errno> {
        let b = self.getattr_md(cred, fid).await?;
        if b.attr.ftype() != FileType::Symlink {
            return Err(Errno::EINVAL);
        }
        Ok(b.symlink)
    }

    /// unlink.
    pub async fn unlink(&self, cred: &Cred, parent: Fid, name: &[u8]) -> Result<(), Errno> {
        self.remove(cred, parent, name, false).await
    }

    /// rmdir.
    pub async fn rmdir(&self, cred: &Cred, parent: Fid, name: &[u8]) -> Result<(), Errno> {
        self.dcache.lock().remove(&(parent, name.to_vec()));
        self.remove(cred, parent, name, true).await
    }

    async fn remove(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        rmdir: bool,
    ) -> Result<(), Errno> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if !rmdir {
            self.close_kept_victim(parent, name).await;
        }
        let rep = self
            .md(Request::Unlink(UnlinkReq {
                cred: cred.clone(),
                parent,
                name: name.to_vec(),
                rmdir,
            }))
            .await?;
        if let Reply::Unlink(r) = rep {
            self.remember_parent(r.parent.as_ref(), parent, cred, DirChange::Remove(name));
        }
        Ok(())
    }

    /// rename with `renameat2` flags.
    pub async fn rename(
        &self,
        cred: &Cred,
        sp: Fid,
        sn: &[u8],
        dp: Fid,
        dn: &[u8],
        flags: u32,
    ) -> Result<(), Errno> {
        if sn.len() > NAME_MAX || dn.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        {
            let mut dc = self.dcache.lock();
            dc.remove(&(sp, sn.to_vec()));
            dc.remove(&(dp, dn.to_vec()));
        }
        self.close_kept_victim(dp, dn).await;
        let req = RenameReq {
            cred: cred.clone(),
            src_parent: sp,
            src_name: sn.to_vec(),
            dst_parent: dp,
            dst_name: dn.to_vec(),
            flags,
        };
        let rep = self.md(Request::Rename(req)).await?;
        let Reply::Rename(r) = rep else {
            self.remember_moved(None, dp, dn, cred);
            return Ok(());
        };
        self.remember_moved(r.moved.as_ref(), dp, dn, cred);
        if sp == dp {
            self.remember_parent(
                r.parent.as_ref(),
                sp,
                cred,
                DirChange::Rename(sn, dn, flags),
            );
            return Ok(());
        }
        // Between two directories: an exchange leaves both names where they were, a
        // whiteout leaves one in the source (see `remember_parent`).
        let keep = flags & (libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT) != 0;
        let (from, to) = if keep {
            (
                DirChange::Rename(sn, sn, flags),
                DirChange::Rename(dn, dn, flags & libc::RENAME_EXCHANGE),
            )
        } else {
            (DirChange::Remove(sn), DirChange::Add(dn))
        };
        self.remember_parent(r.parent.as_ref(), sp, cred, from);
        self.remember_parent(r.dst_parent.as_ref(), dp, cred, to);
        Ok(())
    }

    /// Hard link.
    pub async fn link(
        &self,
        cred: &Cred,
        fid: Fid,
        parent: Fid,
        name: &[u8],
    ) -> Result<MdtBody, Errno> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        match self
            .md(Request::Link(LinkReq {
                cred: cred.clone(),
                fid,
                parent,
                name: name.to_vec(),
            }))
            .await?
        {
            Reply::Link(r) => {
                self.remember_parent(r.parent.as_ref(), parent, cred, DirChange::Add(name));
                self.remember(&r.body, Some((parent, name, cred)));
                Ok(r.body)
            }
            _ => Err(Errno::EPROTO),
        }
    }

    /// One readdir page from `cookie`.
    pub async fn readdir(
        &self,
        cred: &Cred,
        fid: Fid,
        cookie: u64,
        plus: bool,
    ) -> Result<ReaddirRep, Errno> {
        self.readdir_n(cred, fid, cookie, plus, 0).await
    }

    /// [`Client::readdir`] of about `count` entries (0: a full page): a caller that
    /// can take only a few entries with attributes spares the MDT the rest (their
    /// attributes and locks).
    pub async fn readdir_n(
        &self,
        cred: &Cred,
        fid: Fid,
        cookie: u64,
        plus: bool,
        count: u32,
    ) -> Result<ReaddirRep, Errno> {
        match self
            .md(Request::Readdir(ReaddirReq {
                cred: cred.clone(),
                fid,
                cookie,
                plus,
                count,
            }))
            .await?
        {
            Reply::Readdir(r) => self.take_page(cred, fid, cookie, plus, r),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Takes in a readdir page of `fid` that starts at `cookie` (a READDIR's reply, or
    /// the first page an opendir's reply carried).
    pub(crate) fn take_page(
        &self,
        cred: &Cred,
        fid: Fid,
        cookie: u64,
        plus: bool,
        r: ReaddirRep,
    ) -> Result<ReaddirRep, Errno> {
        // Cookies must advance, or a malicious server could loop us forever.
        if r.next <= cookie && r.next != lode_base::hash::END_COOKIE {
            return Err(Errno::EPROTO);
        }
        if !plus {
            self.note_listing(fid, &r.entries);
        }
        // A readdir+ with an intent: each entry's name and attributes under locks.
        self.remember_page(fid, cred, &r.entries);
        Ok(r)
    }

    /// Every entry of a directory (including `.` and `..`), in cookie order.
    ///
    /// A directory larger than its first page is read as several hash ranges side by
    /// side (names are spread evenly over the 63-bit hash space), so the MDT produces
    /// the next pages while this client takes in the ones it has; a range ends with
    /// the first page that reaches the next range's start.
    pub async fn readdir_all(
        &self,
        cred: &Cred,
        fid: Fid,
        plus: bool,
    ) -> Result<Vec<DirEntry>, Errno> {
        let first = self.readdir(cred, fid, 0, plus).await?;
        let (mut out, lo) = (first.entries, first.next);
        if lo == END_COOKIE {
            return Ok(out);
        }
        let parts = readdir_parts(out.len(), lo);
        let span = (END_COOKIE - lo) / parts;
        let ranges = (0..parts).map(|i| {
            let a = lo + i * span;
            let b = if i + 1 == parts { END_COOKIE } else { a + span };
            self.readdir_range(cred, fid, a, b, plus)
        });
        let pages = futures::future::join_all(ranges)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        // Moved once into a vector of the final size (a 100,000-entry directory grown
        // page by page was copied and faulted in again at every doubling).
        out.reserve_exact(pages.iter().flatten().map(Vec::len).sum());
        out.extend(pages.into_iter().flatten().flatten());
        Ok(out)
    }

    /// The entries whose cookies are in `from..to`, page after page.
    async fn readdir_range(
        &self,
        cred: &Cred,
        fid: Fid,
        from: u64,
        to: u64,
        plus: bool,
    ) -> Result<Vec<Vec<DirEntry>>, Errno> {
        let mut out = Vec::new();
        let mut cookie = from;
        loop {
            let mut page = self.readdir(cred, fid, cookie, plus).await?;
            // A hash group is never split across pages, so filtering by cookie keeps
            // each group whole in exactly one range.
            page.entries.retain(|e| e.cookie < to);
            out.push(page.entries);
            if page.next >= to {
                return Ok(out);
            }
            cookie = page.next;
        }
    }

    /// getxattr; `size` 0 asks for the length only.
    pub async fn getxattr(
        &self,
        cred: &Cred,
        fid: Fid,
        name: &[u8],
        size: u32,
    ) -> Result<(Vec<u8>, u32), Errno> {
        if let Some(e) = self.cached_xattr_miss(cred, fid, name) {
            return Err(e);
        }
        match self
            .md(Request::Getxattr(GetxattrReq {
                cred: cred.clone(),
                fid,
                name: name.to_vec(),
                size,
            }))
            .await?
        {
            Reply::Getxattr(x) => Ok((x.value, x.size)),
            _ => Err(Errno::EPROTO),
        }
    }

    /// May `cred` access the inode `b` describes for `want` (MAY_* bits)? Its mode
    /// bits, and its access ACL if it has one and it decides (read from the MDT then:
    /// a client decides this only where it answers without the MDT).
    pub async fn may_access(&self, cred: &Cred, b: &MdtBody, want: u32) -> Result<bool, Errno> {
        use lode_base::acl;
        if !b.acl || !acl::consulted(&b.attr, cred) {
            return Ok(lode_base::perm::may_access(&b.attr, cred, want));
        }
        let size = acl::XATTR_MAX as u32;
        let a = match self.getxattr(cred, b.attr.fid, acl::ACCESS, size).await {
            Ok((v, _)) => acl::Acl::parse(&v)?,
            Err(Errno::ENODATA) => None,
            Err(e) => return Err(e),
        };
        Ok(acl::may_access(&b.attr, a.as_ref(), cred, want))
    }

    /// The answer to looking up an xattr the inode cannot have: its attributes, under a
    /// lock, say it has no stored xattr (`ls -l` asks for `security.selinux` of every
    /// file). `None`: ask the MDT (virtual names, bad names, no lock).
    fn cached_xattr_miss(&self, cred: &Cred, fid: Fid, name: &[u8]) -> Option<Errno> {
        if name.len() > lode_base::limits::XATTR_NAME_MAX {
            return None;
        }
        let in_ns = |p: &[u8]| name.len() > p.len() && name.starts_with(p);
        let user = in_ns(b"user.");
        let acl = lode_base::acl::is_acl_name(name);
        if !(user || acl || in_ns(b"trusted.") || in_ns(b"security.")) {
            return None;
        }
        let b = self.cached_attrs(fid).filter(|b| b.no_xattrs)?;
        let ft = b.attr.mode & libc::S_IFMT;
        if acl && ft == libc::S_IFLNK {
            // Not "no such ACL": symlinks have none at all (the MDT's EOPNOTSUPP).
            return None;
        }
        // As the MDT decides: user.* needs read permission on files and directories.
        if user
            && (ft == libc::S_IFREG || ft == libc::S_IFDIR)
            && !lode_base::perm::may_access(&b.attr, cred, lode_base::perm::MAY_READ)
        {
            return Some(Errno::EACCES);
        }
        Some(Errno::ENODATA)
    }

    /// listxattr: NUL-separated names.
    pub async fn listxattr(
        &self,
        cred: &Cred,
        fid: Fid,
        size: u32,
    ) -> Result<(Vec<u8>, u32), Errno> {
        match self
            .md(Request::Listxattr(GetxattrReq {
                cred: cred.clone(),
                fid,
                name: Vec::new(),
                size,
            }))
            .await?
        {
            Reply::Listxattr(x) => Ok((x.value, x.size)),
            _ => Err(Errno::EPROTO),
        }
    }

    /// setxattr (`value` Some) or removexattr (`None`).
    pub async fn setxattr(
        &self,
        cred: &Cred,
        fid: Fid,
        name: &[u8],
        value: Option<&[u8]>,
        flags: u32,
    ) -> Result<(), Errno> {
        let req = SetxattrReq {
            cred: cred.clone(),
            fid,
            name: name.to_vec(),
            value: value.map(|v| serde_bytes::ByteBuf::from(v.to_vec())),
            flags,
        };
        self.md(Request::Setxattr(req)).await.map(|_| ())
    }
}

fn components(p: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    p.split(|b| *b == b'/').filter(|c| !c.is_empty())
}

/// Ranges a directory is read in side by side, from its first page: `n` entries below
/// cookie `next`. One range per eight pages still to read, at most
/// [`READDIR_RANGES_MAX`]; a small directory is read page after page, as it costs no
/// more RPCs that way (each range's last page reaches into the next range).
fn readdir_parts(n: usize, next: u64) -> u64 {
    let covered = (next as f64 / END_COOKIE as f64).max(f64::MIN_POSITIVE);
    let rest = n as f64 / covered - n as f64;
    let pages = rest / READDIR_PAGE_ENTRIES as f64;
    ((pages / 8.0) as u64).clamp(1, READDIR_RANGES_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_read_in_ranges_only_when_many_pages_remain() {
        let full = READDIR_PAGE_ENTRIES;
        // The first page covered a hundredth of the hash space: ~99 pages to go.
        assert_eq!(readdir_parts(full, END_COOKIE / 100), READDIR_RANGES_MAX);
        // Half of it: one page to go, read as it always was.
        assert_eq!(readdir_parts(full, END_COOKIE / 2), 1);
        // Twenty pages to go: two ranges.
        assert_eq!(readdir_parts(full, END_COOKIE / 21), 2);
        // A cookie at the very start of the space does not divide by zero.
        assert_eq!(readdir_parts(full, 0), READDIR_RANGES_MAX);
    }
}
