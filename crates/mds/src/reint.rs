//! Namespace changes: unlink/rmdir, rename, link, setattr.

use crate::inode::{
    all_here, check_name, check_new_name, dtype_of, is_dir, now_ns, put_dirent, put_inode,
};
use crate::pdo::Mode;
use crate::{Ctx, Namespace, OpResult};
use lode_base::hash::name_hash;
use lode_base::limits::{FILE_SIZE_MAX, LINK_MAX};
use lode_base::perm::{
    iflags, is_owner_or_root, may_delete_in_sticky, FS_FLAGS_KEPT, MAY_EXEC, MAY_WRITE,
};
use lode_base::{Cred, Errno, Fid, SetAttr, TimeSet};
use lode_proto::{LinkRep, MdtBody, RenameRep, RenameReq, Reply};
use lode_store::records::{INODE_DATA, INODE_LINKABLE};
use lode_store::{Batch, Cf};

/// `renameat2` flags.
const RENAME_NOREPLACE: u32 = 1;
/// `renameat2`'s flag to swap two names.
pub(crate) const RENAME_EXCHANGE: u32 = 2;

impl Namespace {
    pub(crate) fn unlink(
        &self,
        ctx: &Ctx,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
        rmdir: bool,
    ) -> OpResult<u64> {
        match name {
            b"." if rmdir => return Err(Errno::EINVAL.into()),
            b".." if rmdir => return Err(Errno::ENOTEMPTY.into()),
            b"." | b".." => return Err(Errno::EISDIR.into()),
            _ => check_name(name)?,
        }
        let hash = name_hash(name);
        // Peek at the child to know whether its directory must be locked too.
        let peek = self.dirent(parent, name)?.ok_or(Errno::ENOENT)?;
        let mut dirs = vec![(parent, Mode::Shared)];
        if rmdir {
            dirs.push((peek.fid, Mode::Exclusive));
        }
        let mut held = self.pdo.lock(&dirs, &[(parent, hash)]);
        let pdir = self.dir_inode(parent)?;
        if !self.may(parent, &pdir, cred, MAY_WRITE | MAY_EXEC) {
            return Err(Errno::EACCES.into());
        }
        let ent = self.dirent(parent, name)?.ok_or(Errno::ENOENT)?;
        if ent.fid != peek.fid {
            // Replaced between peek and lock; the caller retries as Linux would see ENOENT.
            return Err(Errno::ENOENT.into());
        }
        let child_rec = self.inode(ent.fid)?;
        if !may_delete_in_sticky(&pdir.attr(parent), &child_rec.attr(ent.fid), cred)
            || iflags::forbid_dir_change(pdir.fs_flags(), true)
            || iflags::forbid_unlink(child_rec.fs_flags())
        {
            return Err(Errno::EPERM.into());
        }
        let child_dir = is_dir(child_rec.mode);
        if rmdir && !child_dir {
            return Err(Errno::ENOTDIR.into());
        }
        if !rmdir && child_dir {
            return Err(Errno::EISDIR.into());
        }
        if child_dir && ent.fid == Fid::ROOT {
            return Err(Errno::EBUSY.into());
        }
        if child_dir && !self.dir_is_empty(ent.fid)? {
            return Err(Errno::ENOTEMPTY.into());
        }
        self.pdo.lock_inodes(&mut held, &[parent, ent.fid]);
        let now = now_ns();
        let mut b = Batch::new();
        Namespace::remove_entry(&mut b, parent, name);
        let mut child_rec = self.inode(ent.fid)?;
        self.unlink_inode(&mut b, (parent, name), ent.fid, &mut child_rec, now)?;
        let mut p = self.dir_inode(parent)?;
        crate::inode::dirs::note(parent, &p, true);
        if child_dir {
            p.nlink = p.nlink.saturating_sub(1);
        }
        p.mtime = now;
        p.ctime = now;
        put_inode(&mut b, parent, &p);
        self.commit(ctx, b, &Reply::Unlink(lode_proto::UnlinkRep::default()))
    }

    pub(crate) fn link(
        &self,
        ctx: &Ctx,
        cred: &Cred,
        fid: Fid,
        parent: Fid,
        name: &[u8],
    ) -> OpResult<(MdtBody, u64)> {
        check_new_name(name)?;
        self.check_space()?;
        let hash = name_hash(name);
        let mut held = self.pdo.lock(&[(parent, Mode::Shared)], &[(parent, hash)]);
        let pdir = self.dir_inode(parent)?;
        if pdir.nlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        if !self.may(parent, &pdir, cred, MAY_WRITE | MAY_EXEC) {
            return Err(Errno::EACCES.into());
        }
        if self.dirent(parent, name)?.is_some() {
            return Err(Errno::EEXIST.into());
        }
        self.pdo.lock_inodes(&mut held, &[parent, fid]);
        let mut rec = self.inode(fid)?;
        if is_dir(rec.mode)
            || iflags::forbid_unlink(rec.fs_flags())
            || iflags::forbid_dir_change(pdir.fs_flags(), false)
        {
            return Err(Errno::EPERM.into());
        }
        // A file with no link left is gone, but for an `O_TMPFILE` file's first name.
        let named = rec.nlink == 0;
        if named && rec.flags & INODE_LINKABLE == 0 {
            return Err(Errno::ENOENT.into());
        }
        if rec.nlink >= LINK_MAX {
            return Err(Errno::EMLINK.into());
        }
        let now = now_ns();
        rec.nlink += 1;
        rec.flags &= !INODE_LINKABLE;
        rec.add_link(parent, name);
        rec.ctime = now;
        let mut b = Batch::new();
        if named {
            b.delete(Cf::Orphan, fid.to_bytes().to_vec());
        }
        put_dirent(&mut b, parent, name, fid, dtype_of(rec.mode));
        put_inode(&mut b, fid, &rec);
        let mut p = self.dir_inode(parent)?;
        crate::inode::dirs::note(parent, &p, true);
        p.mtime = now;
        p.ctime = now;
        put_inode(&mut b, parent, &p);
        let body = self.body(fid, &rec);
        let rep = Reply::Link(LinkRep {
            body: body.clone(),
            parent: None,
        });
        let t = self.commit(ctx, b, &rep)?;
        Ok((body, t))
    }

    /// True if `dir` is `anc` or lies below it (walks `..` pointers up to the root).
    fn is_under(&self, mut dir: Fid, anc: Fid) -> OpResult<bool> {
        for _ in 0..4096 {
            if dir == anc {
                return Ok(true);
            }
            if dir == Fid::ROOT {
                return Ok(false);
            }
            dir = self.dir_inode(dir)?.parent;
        }
        Err(Errno::ELOOP.into())
    }

    pub(crate) fn rename(&self, ctx: &Ctx, r: &RenameReq) -> OpResult<u64> {
        let cred = &r.cred;
        if r.flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || r.flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            return Err(Errno::EINVAL.into());
        }
        for n in [&r.src_name, &r.dst_name] {
            if n.as_slice() == b"." || n.as_slice() == b".." {
                return Err(Errno::EBUSY.into());
            }
            check_name(n)?;
        }
        let exchange = r.flags & RENAME_EXCHANGE != 0;
        let (sp, dp) = (r.src_parent, r.dst_parent);
        let cross = sp != dp;
        let _rename_guard = cross.then(|| self.pdo.rename.lock());
        let mode = if cross { Mode::Exclusive } else { Mode::Shared };
        let (sh, dh) = (name_hash(&r.src_name), name_hash(&r.dst_name));
        // A directory the rename may replace is locked exclusively too, as rmdir locks
        // it: a create inside it between the emptiness check and the rename would be
        // lost with it. Which directory that is shows only at a peek before the locks;
        // if the name changed meanwhile, peek and lock again.
        let mut tries = 0;
        let (mut held, dst) = loop {
            let peek = self.dirent(dp, &r.dst_name)?;
            let mut dirs = vec![(sp, mode), (dp, mode)];
            if let Some(p) = peek.as_ref().filter(|p| p.dtype == libc::DT_DIR) {
                dirs.push((p.fid, Mode::Exclusive));
            }
            let held = self.pdo.lock(&dirs, &[(sp, sh), (dp, dh)]);
            let dst = self.dirent(dp, &r.dst_name)?;
            if dst.as_ref().map(|d| d.fid) == peek.as_ref().map(|p| p.fid) {
                break (held, dst);
            }
            drop(held);
            tries += 1;
            if tries >= 64 {
                return Err(Errno::EBUSY.into());
            }
        };
        let sdir = self.dir_inode(sp)?;
        let ddir = self.dir_inode(dp)?;
        if ddir.nlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        for (f, d) in [(sp, &sdir), (dp, &ddir)] {
            if !self.may(f, d, cred, MAY_WRITE | MAY_EXEC) {
                return Err(Errno::EACCES.into());
            }
        }
        let src = self.dirent(sp, &r.src_name)?.ok_or(Errno::ENOENT)?;
        if exchange && dst.is_none() {
            return Err(Errno::ENOENT.into());
        }
        if dst.is_some() && r.flags & RENAME_NOREPLACE != 0 {
            return Err(Errno::EEXIST.into());
        }
        if dst.as_ref().is_some_and(|d| d.fid == src.fid) {
            // Two links to one inode: POSIX says do nothing (before any other check,
            // as Linux's vfs_rename).
            return self.commit(ctx, Batch::new(), &Reply::Rename(RenameRep::default()));
        }
        let src_rec = self.inode(src.fid)?;
        let src_is_dir = is_dir(src_rec.mode);
        if !may_delete_in_sticky(&sdir.attr(sp), &src_rec.attr(src.fid), cred)
            || iflags::forbid_dir_change(sdir.fs_flags(), true)
            || iflags::forbid_dir_change(ddir.fs_flags(), exchange || dst.is_some())
            || iflags::forbid_unlink(src_rec.fs_flags())
        {
            return Err(Errno::EPERM.into());
        }
        if let Some(d) = &dst {
            let drec = self.inode(d.fid)?;
            if !may_delete_in_sticky(&ddir.attr(dp), &drec.attr(d.fid), cred)
                || iflags::forbid_unlink(drec.fs_flags())
            {
                return Err(Errno::EPERM.into());
            }
            let dst_is_dir = is_dir(drec.mode);
            if !exchange {
                if src_is_dir && !dst_is_dir {
                    return Err(Errno::ENOTDIR.into());
                }
                if !src_is_dir && dst_is_dir {
                    return Err(Errno::EISDIR.into());
                }
                if dst_is_dir && !self.dir_is_empty(d.fid)? {
                    return Err(Errno::ENOTEMPTY.into());
                }
            } else if cross && dst_is_dir {
                if !self.may(d.fid, &drec, cred, MAY_WRITE) {
                    return Err(Errno::EACCES.into());
                }
                if self.is_under(sp, d.fid)? {
                    return Err(Errno::EINVAL.into());
                }
            }
        }
        if cross && src_is_dir {
            // Moving a directory rewrites its `..`: needs write permission on it, and it
            // can never move below itself.
            if !self.may(src.fid, &src_rec, cred, MAY_WRITE) {
                return Err(Errno::EACCES.into());
            }
            if self.is_under(dp, src.fid)? {
                return Err(Errno::EINVAL.into());
            }
        }
        let mut fids = vec![sp, dp, src.fid];
        if let Some(d) = &dst {
            fids.push(d.fid);
        }
        self.pdo.lock_inodes(&mut held, &fids);
        let now = now_ns();
        let mut b = Batch::new();
        let mut srec = self.inode(src.fid)?;
        let mut sdir = self.dir_inode(sp)?;
        let mut ddir = if cross {
            self.dir_inode(dp)?
        } else {
            sdir.clone()
        };
        crate::inode::dirs::note(sp, &sdir, true);
        crate::inode::dirs::note(dp, &ddir, true);
        put_dirent(&mut b, dp, &r.dst_name, src.fid, src.dtype);
        srec.ctime = now;
        srec.remove_link(sp, &r.src_name);
        srec.add_link(dp, &r.dst_name);
        if src_is_dir && cross {
            srec.parent = dp;
            sdir.nlink = sdir.nlink.saturating_sub(1);
            // Subdirectories are not bounded by `LINK_MAX` (see `shown_nlink`).
            ddir.nlink = ddir.nlink.checked_add(1).ok_or(Errno::EMLINK)?;
        }
        match &dst {
            Some(d) if exchange => {
                let mut drec = self.inode(d.fid)?;
                put_dirent(&mut b, sp, &r.src_name, d.fid, d.dtype);
                drec.ctime = now;
                drec.remove_link(dp, &r.dst_name);
                drec.add_link(sp, &r.src_name);
                if is_dir(drec.mode) && cross {
                    drec.parent = sp;
                    ddir.nlink = ddir.nlink.saturating_sub(1);
                    sdir.nlink = sdir.nlink.checked_add(1).ok_or(Errno::EMLINK)?;
                }
                put_inode(&mut b, d.fid, &drec);
            }
            Some(d) => {
                Namespace::remove_entry(&mut b, sp, &r.src_name);
                let mut drec = self.inode(d.fid)?;
                if is_dir(drec.mode) {
                    ddir.nlink = ddir.nlink.saturating_sub(1);
                }
                self.unlink_inode(&mut b, (dp, &r.dst_name), d.fid, &mut drec, now)?;
            }
            None => Namespace::remove_entry(&mut b, sp, &r.src_name),
        }
        put_inode(&mut b, src.fid, &srec);
        for d in [&mut sdir, &mut ddir] {
            d.mtime = now;
            d.ctime = now;
        }
        if cross {
            put_inode(&mut b, sp, &sdir);
            put_inode(&mut b, dp, &ddir);
        } else {
            // One directory: every nlink change above was made on `ddir`.
            put_inode(&mut b, dp, &ddir);
        }
        self.commit(ctx, b, &Reply::Rename(RenameRep::default()))
    }

    pub(crate) fn setattr(
        &self,
        ctx: &Ctx,
        cred: &Cred,
        fid: Fid,
        sa: &SetAttr,
        opened_for_write: bool,
        through: Option<(u32, u64)>,
    ) -> OpResult<(MdtBody, u64)> {
        let mut held = self.pdo.lock(&[], &[]);
        self.pdo.lock_inodes(&mut held, &[fid]);
        let mut rec = self.inode(fid)?;
        // The client's word that it holds the file open for writing counts only with
        // the handle to show for it (a replay's handle may be opened again after it).
        let opened_for_write = opened_for_write
            && (ctx.replay || through.is_some_and(|(slot, h)| self.writes_through(fid, slot, h)));
        let attr = rec.attr(fid);
        let now = now_ns();
        let root = cred.uid == 0;
        let owner = is_owner_or_root(&attr, cred);
        let dir = is_dir(rec.mode);
        if let Some(f) = sa.flags {
            // The owner may set the flags; changing one lode keeps takes
            // CAP_LINUX_IMMUTABLE, which is root's alone.
            if !owner || !root && (f ^ rec.fs_flags()) & FS_FLAGS_KEPT != 0 {
                return Err(Errno::EPERM.into());
            }
            if f & !FS_FLAGS_KEPT != 0 {
                return Err(Errno::EOPNOTSUPP.into());
            }
        }
        if iflags::forbid_setattr(rec.fs_flags(), sa, opened_for_write) {
            return Err(Errno::EPERM.into());
        }
        if let Some(size) = sa.size {
            if dir {
                return Err(Errno::EISDIR.into());
            }
            if rec.mode & libc::S_IFMT != libc::S_IFREG {
                return Err(Errno::EINVAL.into());
            }
            if size > FILE_SIZE_MAX {
                return Err(Errno::EFBIG.into());
            }
            if !opened_for_write && !self.may(fid, &rec, cred, MAY_WRITE) {
                return Err(Errno::EACCES.into());
            }
            if rec.layout.as_ref().is_some_and(|l| size > l.end()) {
                // No component holds the new end (Lustre: ENODATA).
                return Err(Errno::ENODATA.into());
            }
        }
        if let Some(m) = sa.mode {
            // Dropping set-user/group-ID bits, one or both, is never an escalation: the
            // kernel (or the mount, for it) does it on behalf of any writer
            // (file_remove_privs), so anyone who may write may.
            let setid = libc::S_ISUID | libc::S_ISGID;
            let kill_privs = m & 0o7777 & !setid == rec.mode & 0o7777 & !setid
                && m & setid & !rec.mode == 0
                && m & setid != rec.mode & setid
                && self.may(fid, &rec, cred, MAY_WRITE);
            if !owner && !kill_privs {
                return Err(Errno::EPERM.into());
            }
        }
        // Linux's chown_ok/chgrp_ok: only the owner may "change" the owner to itself,
        // or the group to its own group or one it is in; anyone else gets EPERM even
        // when nothing would change.
        if let Some(uid) = sa.uid {
            if !(root || cred.uid == rec.uid && uid == rec.uid) {
                return Err(Errno::EPERM.into());
            }
        }
        if let Some(gid) = sa.gid {
            if !(root || cred.uid == rec.uid && (gid == rec.gid || cred.in_group(gid))) {
                return Err(Errno::EPERM.into());
            }
        }
        for t in [sa.atime, sa.mtime].into_iter().flatten() {
            match t {
                TimeSet::Now => {
                    if !owner && !self.may(fid, &rec, cred, MAY_WRITE) {
                        return Err(Errno::EACCES.into());
                    }
                }
                TimeSet::At(_) => {
                    if !owner {
                        return Err(Errno::EPERM.into());
                    }
                }
            }
        }
        let mut changed = false;
        if let Some(m) = sa.mode {
            let mut m = m & 0o7777;
            let gid = sa.gid.unwrap_or(rec.gid);
            if !root && !cred.in_group(gid) {
                m &= !libc::S_ISGID;
            }
            rec.mode = (rec.mode & libc::S_IFMT) | m;
            changed = true;
        }
        let chown = sa.uid.is_some_and(|u| u != rec.uid) || sa.gid.is_some_and(|g| g != rec.gid);
        if let Some(u) = sa.uid {
            rec.uid = u;
            changed = true;
        }
        if let Some(g) = sa.gid {
            rec.gid = g;
            changed = true;
        }
        if (chown || sa.uid.is_some() || sa.gid.is_some()) && !dir && sa.mode.is_none() {
            // chown clears set-user-ID, and set-group-ID when group-executable.
            rec.mode = lode_base::perm::drop_setid(rec.mode);
        }
        if let Some(size) = sa.size {
            if size != rec.size || rec.flags & INODE_DATA != 0 {
                rec.mtime = now;
            }
            rec.size = size;
            if !all_here(&rec) {
                // OST objects may hold bytes past the new size for a while: the size
                // needs a glimpse until a writer's close settles it. A file whose
                // bytes are all here has its size exact as it is cut.
                rec.flags |= INODE_DATA;
            }
            self.truncated(fid, through);
            if !root {
                rec.mode = lode_base::perm::drop_setid(rec.mode);
            }
            changed = true;
        }
        if let Some(t) = sa.atime {
            self.atimes.forget(fid);
            rec.atime = match t {
                TimeSet::Now => now,
                TimeSet::At(ns) => ns,
            };
            changed = true;
        }
        if let Some(t) = sa.mtime {
            self.times_changed(fid);
            rec.mtime = match t {
                TimeSet::Now => now,
                TimeSet::At(ns) => ns,
            };
            changed = true;
        }
        if let Some(f) = sa.flags {
            rec.set_fs_flags(f);
            changed = true;
        }
        if changed {
            rec.ctime = now;
        }
        let mut b = Batch::new();
        if sa.mode.is_some() {
            self.chmod_acl(&mut b, fid, &rec)?;
        }
        if let Some(size) = sa.size {
            if rec.layout.as_ref().is_some_and(|l| l.dom_end() > 0) {
                self.dom_truncate(&mut b, fid, &mut rec, size)?;
            }
        }
        put_inode(&mut b, fid, &rec);
        let body = self.body(fid, &rec);
        let t = self.commit(ctx, b, &Reply::Setattr(body.clone()))?;
        if sa.size.is_none() {
            self.attrs_only_step(fid, rec.version);
        }
        Ok((body, t))
    }
}
