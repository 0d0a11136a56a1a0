//! Online layout migration (`lode migrate`; Lustre's `lfs migrate`, whose layout swap
//! crashed the client kernel in the seed). The migrating client holds the file open
//! and drives three steps on that handle:
//!
//! 1. `Start`: the new layout is instantiated as the file's *pending* layout, with
//!    component ids no layout of the file ever used (from the layout generation,
//!    bumped at every start), so its OST objects — named `(FID, component id,
//!    stripe)` — can never be confused with the current layout's, nor with those of
//!    an earlier, abandoned migration still waiting to be destroyed. The pending
//!    layout is kept durably in `Cf::Migrate`, so whatever happens it can be undone.
//! 2. The client copies the bytes: reads through the current layout, writes into the
//!    pending layout's objects, and its Data-on-MDT bytes with `Dom` steps (only those
//!    at or past the current layout's DoM end: below it the records are shared).
//! 3. `Commit`: if nobody opened the file for writing or truncated it since `Start`,
//!    the pending layout becomes the file's in one batch, with a destroy record for
//!    the old layout's objects (sent only once the swap is committed). The change
//!    takes PW LAYOUT, so every client holding the file open (each open holds a PR
//!    LAYOUT lock) is called back first and does again any read in flight with the
//!    old layout, before anything of the old layout can go.
//!
//! Closing the handle before `Commit` (or being evicted, which closes it) abandons
//! the migration: its objects and DoM bytes are destroyed. A restarted MDT abandons
//! every migration no replay brought back. So a crash of any process leaves the
//! old layout or the new one, whole, and no object behind.

use crate::inode::{now_ns, put_inode};
use crate::{Ctx, Namespace, OpResult};
use lode_base::limits::{COMPONENTS_MAX, DOM_CHUNK, DOM_SIZE_MAX};
use lode_base::{Errno, Fid, Layout};
use lode_proto::{MigrateRep, MigrateReq, MigrateStep, Reply};
use lode_store::records::{self, DestroyRec, InodeRec, MigrateRec, INODE_DATA, INODE_OBJECTS};
use lode_store::{Batch, Cf};
use std::sync::atomic::Ordering;

/// A migration under way, in memory: whose it is, and whether something it cannot
/// see (a write open, a truncate) happened to the file since it began.
pub(crate) struct Migration {
    pub(crate) handle: u64,
    pub(crate) broken: bool,
}

impl Namespace {
    /// One step of a migration (see the module's text).
    pub(crate) fn migrate(
        &self,
        ctx: &Ctx,
        slot: u32,
        r: &MigrateReq,
    ) -> OpResult<(MigrateRep, u64)> {
        if let MigrateStep::Dom { data, .. } = &r.step {
            if data.len() > lode_base::limits::BULK_MAX {
                return Err(Errno::EINVAL.into());
            }
            self.check_space()?;
        }
        let mut held = self.pdo.lock(&[], &[]);
        self.pdo.lock_inodes(&mut held, &[r.fid]);
        let rec = self.inode(r.fid)?;
        if rec.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Errno::EINVAL.into());
        }
        if !self.may(r.fid, &rec, &r.cred, lode_base::perm::MAY_WRITE) {
            return Err(Errno::EACCES.into());
        }
        if lode_base::perm::iflags::forbid_xattr_change(rec.fs_flags()) {
            // A new layout is a change of the `lustre.lov` xattr.
            return Err(Errno::EPERM.into());
        }
        if !ctx.replay {
            let o = self.opens.lock();
            match o.handles.get(&r.handle) {
                Some(h) if h.fid == r.fid && h.slot == slot => {}
                _ => return Err(Errno::EBADF.into()),
            }
        }
        match &r.step {
            MigrateStep::Start { layout, size } => self.migrate_start(ctx, r, rec, layout, *size),
            MigrateStep::Dom { offset, data } => self.migrate_dom(ctx, r, *offset, data),
            MigrateStep::Commit { size, mtime } => self.migrate_commit(ctx, r, rec, *size, *mtime),
        }
    }

    /// The migration of `fid` by `handle`, in memory, not broken: EBUSY otherwise. A
    /// replay is not asked (what it replays passed this once).
    fn check_migration(&self, ctx: &Ctx, fid: Fid, handle: u64) -> OpResult<()> {
        if ctx.replay {
            return Ok(());
        }
        match self.opens.lock().migrations.get(&fid) {
            Some(m) if m.handle == handle && !m.broken => Ok(()),
            _ => Err(Errno::EBUSY.into()),
        }
    }

    fn migrate_rec(&self, fid: Fid) -> OpResult<Option<MigrateRec>> {
        match self.store.engine().get(Cf::Migrate, &fid.to_bytes())? {
            Some(v) => Ok(Some(records::decode("migrate", &v)?)),
            None => Ok(None),
        }
    }

    fn migrate_start(
        &self,
        ctx: &Ctx,
        r: &MigrateReq,
        mut rec: InodeRec,
        want: &Layout,
        size: u64,
    ) -> OpResult<(MigrateRep, u64)> {
        let mut old = rec.layout.clone().ok_or(Errno::EINVAL)?;
        if !ctx.replay {
            let o = self.opens.lock();
            if o.writers.get(&r.fid).is_some_and(|w| w.0 > 0) || o.migrations.contains_key(&r.fid) {
                return Err(Errno::EBUSY.into());
            }
        }
        if !ctx.replay && self.migrate_rec(r.fid)?.is_some() {
            return Err(Errno::EBUSY.into());
        }
        // Ids above every id the file's layouts ever had: those of its current layout
        // (1..=COMPONENTS_MAX from a create, or an earlier migration's), and those of
        // earlier migrations (below their generation's base, and generations only grow).
        let unit = COMPONENTS_MAX as u32;
        let max_id = old.components.iter().map(|c| c.id).max().unwrap_or(0);
        let gen = old
            .gen
            .checked_add(1)
            .ok_or(Errno::EOVERFLOW)?
            .max(max_id / unit + 1);
        let base = gen.checked_mul(unit).ok_or(Errno::EOVERFLOW)?;
        let mut new = want.clone();
        let n = if ctx.replay && new.components.iter().all(|c| c.id > base) {
            // The pending layout its reply gave: its OSTs may hold copied bytes.
            let n = self.ost_count_for(&new);
            new.check(n.max(1), DOM_SIZE_MAX).map_err(|e| e.errno)?;
            n
        } else {
            for (i, c) in new.components.iter_mut().enumerate() {
                c.id = base + 1 + i as u32;
                if let lode_base::Pattern::Raid0 { osts, .. } = &mut c.pattern {
                    osts.clear();
                }
            }
            self.check_layout(&new, self.tun.dom_stripesize.load(Ordering::Relaxed))?
        };
        if size > new.end() {
            // Lustre: "cannot migrate ... File too large".
            return Err(Errno::EFBIG.into());
        }
        let reach: Vec<usize> = (0..new.components.len())
            .filter(|&i| i == 0 || new.components[i].start < size)
            .collect();
        self.instantiate(&mut new, &reach, n)?;
        new.gen = gen;
        old.gen = gen;
        let dom_from = old.dom_end();
        rec.layout = Some(old);
        let mut b = Batch::new();
        put_inode(&mut b, r.fid, &rec);
        b.put(
            Cf::Migrate,
            r.fid.to_bytes().to_vec(),
            records::encode(&MigrateRec {
                layout: new.clone(),
                dom_from,
                gen,
                handle: r.handle,
            }),
        );
        let rep = MigrateRep {
            layout: Some(new),
            dom_from,
        };
        let t = self.commit(ctx, b, &Reply::Migrate(rep.clone()))?;
        self.opens.lock().migrations.insert(
            r.fid,
            Migration {
                handle: r.handle,
                broken: false,
            },
        );
        Ok((rep, t))
    }

    fn migrate_dom(
        &self,
        ctx: &Ctx,
        r: &MigrateReq,
        offset: u64,
        data: &[u8],
    ) -> OpResult<(MigrateRep, u64)> {
        self.check_migration(ctx, r.fid, r.handle)?;
        let mr = self.migrate_rec(r.fid)?.ok_or(Errno::EBUSY)?;
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EINVAL)?;
        if offset < mr.dom_from || end > mr.layout.dom_end() {
            return Err(Errno::EINVAL.into());
        }
        let mut b = Batch::new();
        // Blocks are counted at the swap, from the records then: whole chunks are
        // not looked up.
        let mut blocks = 0;
        self.put_dom_bytes(&mut b, r.fid, (offset, data), 0, &mut blocks)?;
        let rep = MigrateRep::default();
        let t = self.commit(ctx, b, &Reply::Migrate(rep.clone()))?;
        Ok((rep, t))
    }

    fn migrate_commit(
        &self,
        ctx: &Ctx,
        r: &MigrateReq,
        mut rec: InodeRec,
        size: u64,
        mtime: i64,
    ) -> OpResult<(MigrateRep, u64)> {
        self.check_migration(ctx, r.fid, r.handle)?;
        let mr = self.migrate_rec(r.fid)?.ok_or(Errno::EBUSY)?;
        let old = rec.layout.take().ok_or(Errno::EINVAL)?;
        if old.gen != mr.gen || size > mr.layout.end() {
            return Err(Errno::EBUSY.into());
        }
        let mut new = mr.layout;
        new.gen = mr.gen + 1;
        let mut b = Batch::new();
        let new_dom = new.dom_end();
        if old.dom_end() > new_dom {
            self.dom_delete_from(&mut b, r.fid, new_dom / DOM_CHUNK)?;
        }
        rec.blocks = self.dom_blocks_below(r.fid, new_dom.div_ceil(DOM_CHUNK))?;
        rec.size = size;
        if new.has_objects() {
            // Sizes, blocks and times come from the new objects' glimpse again.
            rec.flags |= INODE_DATA | INODE_OBJECTS;
        } else {
            rec.flags &= !(INODE_DATA | INODE_OBJECTS);
            // Exact here from now on: the time the old objects carried.
            rec.mtime = rec.mtime.max(mtime);
        }
        rec.ctime = now_ns().max(rec.ctime);
        destroy_later(&mut b, r.fid, old);
        b.delete(Cf::Migrate, r.fid.to_bytes().to_vec());
        rec.layout = Some(new.clone());
        put_inode(&mut b, r.fid, &rec);
        let rep = MigrateRep {
            layout: Some(new),
            dom_from: 0,
        };
        let t = self.commit(ctx, b, &Reply::Migrate(rep.clone()))?;
        self.opens.lock().migrations.remove(&r.fid);
        Ok((rep, t))
    }

    /// Adds to `b` the undoing of `fid`'s pending migration, if any: its objects to be
    /// destroyed once this commits, its own DoM bytes and its record gone.
    pub(crate) fn migrate_abandon(&self, b: &mut Batch, fid: Fid) -> OpResult<()> {
        let Some(mr) = self.migrate_rec(fid)? else {
            return Ok(());
        };
        b.delete(Cf::Migrate, fid.to_bytes().to_vec());
        if mr.layout.dom_end() > mr.dom_from {
            self.dom_delete_from(b, fid, mr.dom_from / DOM_CHUNK)?;
        }
        destroy_later(b, fid, mr.layout);
        tracing::info!(%fid, "layout migration abandoned: its copy is destroyed");
        Ok(())
    }

    /// Abandons the migrations no client took up again (after a restart, once
    /// recovery is over: a replayed `Start` brings its migration back, and one whose
    /// handle recovery opened again stays attached to it, refused at its swap).
    pub(crate) fn clean_migrations(&self) -> OpResult<()> {
        let mut fids = self.fids_in(Cf::Migrate)?;
        {
            let o = self.opens.lock();
            fids.retain(|f| !o.migrations.contains_key(f));
        }
        for fid in fids {
            let Some(mr) = self.migrate_rec(fid)? else {
                continue;
            };
            let mut o = self.opens.lock();
            if o.handles.get(&mr.handle).is_some_and(|h| h.fid == fid) {
                // Its client is back and may still be copying: abandoned when it
                // closes (its swap is refused), not under it.
                o.migrations.insert(
                    fid,
                    Migration {
                        handle: mr.handle,
                        broken: true,
                    },
                );
                continue;
            }
            drop(o);
            let mut b = Batch::new();
            self.migrate_abandon(&mut b, fid)?;
            self.store.apply(b, None)?;
        }
        Ok(())
    }
}

/// Adds to `b` a destroy record for the OST objects of `layout`, one of `fid`'s
/// layouts that a migration replaced or abandoned (keyed by its generation, which
/// the pending layout shares with the one it replaces: each ends once).
fn destroy_later(b: &mut Batch, fid: Fid, layout: Layout) {
    if layout.has_objects() {
        b.put(
            Cf::Destroy,
            records::destroy_key_gen(fid, layout.gen),
            records::encode(&DestroyRec { layout }),
        );
    }
}
