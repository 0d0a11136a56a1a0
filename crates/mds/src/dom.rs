//! Data-on-MDT: the bytes of a layout's `mdt` component, kept in the store's `dom`
//! keyspace in [`DOM_CHUNK`] records keyed `(FID, chunk number)`. A write rewrites the
//! chunks it touches and the inode's size, blocks and times in one batch, under one
//! transno and reply record, so it is exactly-once, committed and replayed like any
//! other change. A missing chunk, or a short one, is a hole.

use crate::inode::{all_here, now_ns, put_inode};
use crate::{Ctx, Namespace, OpResult};
use lode_base::limits::{BULK_MAX, DOM_CHUNK, DOM_SEEK_CHUNKS};
use lode_base::{Errno, Fid, Layout, Pattern};
use lode_proto::{DomPrefetch, DomWriteRep, DomWriteReq, LayoutIntentReq, MdtBody, Reply, SeekRep};
use lode_store::records::{self, InodeRec, INODE_DATA};
use lode_store::{Batch, Cf};

/// Key of chunk `n` of `fid`'s DoM data.
fn chunk_key(fid: Fid, n: u64) -> Vec<u8> {
    let mut k = fid.to_bytes().to_vec();
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// The chunk number in a chunk key.
fn chunk_no(k: &[u8]) -> Option<u64> {
    k.get(16..24)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
}

/// Where the next data (`hole` false) or hole at or after `offset` starts, among the
/// chunks from `offset`'s on, given in order as `(number, bytes)`: `Ok(Some(at))`,
/// `Ok(None)` (no data from `offset` on), or `Err(at)` when `budget` chunks were
/// passed with no hole before `at`. A missing chunk, and the end of a short one,
/// is a hole.
fn seek_in_chunks(
    chunks: impl IntoIterator<Item = (u64, u64)>,
    offset: u64,
    hole: bool,
    budget: usize,
) -> Result<Option<u64>, u64> {
    let mut pos = offset;
    for (i, (n, len)) in chunks.into_iter().enumerate() {
        let start = n.saturating_mul(DOM_CHUNK);
        let end = start.saturating_add(len);
        if !hole {
            if end > offset {
                return Ok(Some(offset.max(start)));
            }
            continue;
        }
        if start > pos || end <= pos {
            return Ok(Some(pos));
        }
        pos = end;
        if len < DOM_CHUNK {
            return Ok(Some(pos));
        }
        if i + 1 >= budget {
            return Err(pos);
        }
    }
    Ok(hole.then_some(pos))
}

/// 512-byte blocks a chunk of `len` bytes is charged (whole 4 KiB blocks, as a
/// local file system allocates them).
fn chunk_blocks(len: usize) -> u64 {
    (len as u64).div_ceil(4096) * 8
}

impl Namespace {
    /// A chunk's bytes (empty: a hole).
    fn dom_chunk(&self, fid: Fid, n: u64) -> OpResult<Vec<u8>> {
        match self.store.engine().get(Cf::Dom, &chunk_key(fid, n))? {
            Some(v) => match v.split_first() {
                Some((&records::RECORD_V1, rest)) => Ok(rest.to_vec()),
                _ => Err(lode_store::StoreError::Corrupt("dom", fid.to_string()).into()),
            },
            None => Ok(Vec::new()),
        }
    }

    fn put_dom_chunk(b: &mut Batch, fid: Fid, n: u64, data: &[u8]) {
        if data.is_empty() {
            b.delete(Cf::Dom, chunk_key(fid, n));
        } else {
            let mut v = Vec::with_capacity(data.len() + 1);
            v.push(records::RECORD_V1);
            v.extend_from_slice(data);
            b.put(Cf::Dom, chunk_key(fid, n), v);
        }
    }

    /// The open handle `handle` of this client on `fid`, opened for writing (a replay
    /// is not asked: its open may be replayed after it), which from now on has
    /// written bytes here (see `OpenHandle::dom_wrote`).
    fn check_write_handle(&self, ctx: &Ctx, slot: u32, fid: Fid, handle: u64) -> OpResult<()> {
        let mut o = self.opens.lock();
        match o.handles.get_mut(&handle) {
            Some(h) if h.writes(fid, slot) => {
                h.dom_wrote = true;
                Ok(())
            }
            _ if ctx.replay => Ok(()),
            _ => Err(Errno::EBADF.into()),
        }
    }

    /// DOM_WRITE: `data` at `offset` (an append: at the file's end), all within the
    /// file's DoM component. Returns the reply (where the bytes went, the attributes
    /// they left), and the transno.
    pub(crate) fn dom_write(
        &self,
        ctx: &Ctx,
        slot: u32,
        r: &DomWriteReq,
    ) -> OpResult<(DomWriteRep, u64)> {
        if r.data.len() > BULK_MAX {
            return Err(Errno::EINVAL.into());
        }
        self.check_space()?;
        let mut held = self.pdo.lock(&[], &[]);
        self.pdo.lock_inodes(&mut held, &[r.fid]);
        let mut rec = self.inode(r.fid)?;
        if rec.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Errno::EINVAL.into());
        }
        self.check_write_handle(ctx, slot, r.fid, r.handle)?;
        let dom_end = rec.layout.as_ref().map_or(0, Layout::dom_end);
        // An append goes at the end, which is exact here only while every byte is.
        let offset = if r.append {
            if !all_here(&rec) || rec.size.saturating_add(r.data.len() as u64) > dom_end {
                return Err(Errno::ERANGE.into());
            }
            rec.size
        } else {
            r.offset
        };
        let end = offset
            .checked_add(r.data.len() as u64)
            .ok_or(Errno::EFBIG)?;
        if end > dom_end {
            // The client splits writes at the component's end; past it is not ours.
            return Err(Errno::ENODATA.into());
        }
        let mut b = Batch::new();
        self.put_dom_bytes(&mut b, r.fid, (offset, &r.data), rec.size, &mut rec.blocks)?;
        let now = now_ns();
        rec.size = rec.size.max(end);
        rec.mtime = now;
        rec.ctime = now;
        rec.flags |= INODE_DATA;
        put_inode(&mut b, r.fid, &rec);
        let rep = DomWriteRep {
            offset,
            attrs: lode_proto::CloseAttrs {
                size: rec.size,
                blocks: rec.blocks,
                mtime: now,
            },
            // The record's as `put_inode` stores it (one version on), once unmarked:
            // a regular file with a DoM component, which the checks above made sure.
            data_token: self.data_salt.wrapping_add(rec.version.wrapping_add(1)),
        };
        let t = self.commit(ctx, b, &Reply::DomWrite(rep.clone()))?;
        Ok((rep, t))
    }

    /// Adds to `b` the chunks `data` at `offset` rewrites (partial chunks read,
    /// patched and written whole), keeping `blocks` (the inode's) in step. No chunk
    /// starts at or past `old_end` (the file's size: a truncate deletes those), so a
    /// whole one written there is not looked up; one below it is, for what it was
    /// charged.
    pub(crate) fn put_dom_bytes(
        &self,
        b: &mut Batch,
        fid: Fid,
        (offset, data): (u64, &[u8]),
        old_end: u64,
        blocks: &mut u64,
    ) -> OpResult<()> {
        let end = offset + data.len() as u64;
        let mut pos = offset;
        while pos < end {
            let n = pos / DOM_CHUNK;
            let within = (pos % DOM_CHUNK) as usize;
            let take = ((DOM_CHUNK as usize) - within).min((end - pos) as usize);
            let src = &data[(pos - offset) as usize..][..take];
            let whole = within == 0 && take == DOM_CHUNK as usize;
            let old = if whole && pos >= old_end {
                Vec::new()
            } else {
                self.dom_chunk(fid, n)?
            };
            let before = chunk_blocks(old.len());
            // A whole chunk is written anew; the old bytes counted only for `before`.
            let mut chunk = if whole { Vec::new() } else { old };
            if chunk.len() < within + take {
                chunk.resize(within + take, 0);
            }
            chunk[within..within + take].copy_from_slice(src);
            *blocks = blocks.saturating_sub(before) + chunk_blocks(chunk.len());
            Self::put_dom_chunk(b, fid, n, &chunk);
            pos += take as u64;
        }
        Ok(())
    }

    /// 512-byte blocks the DoM chunks of `fid` below chunk `upto` are charged.
    pub(crate) fn dom_blocks_below(&self, fid: Fid, upto: u64) -> OpResult<u64> {
        let mut blocks = 0;
        self.store
            .engine()
            .scan(Cf::Dom, &fid.to_bytes(), &chunk_key(fid, 0), &mut |k, v| {
                let n = chunk_no(k).unwrap_or(u64::MAX);
                if n >= upto {
                    return false;
                }
                blocks += chunk_blocks(v.len().saturating_sub(1));
                true
            })?;
        Ok(blocks)
    }

    /// DOM_READ: up to `len` bytes at `offset`, ending at the MDT's size or the DoM
    /// component's end, holes as zeros. Short only there.
    pub(crate) fn dom_read(&self, fid: Fid, offset: u64, len: u32) -> OpResult<Vec<u8>> {
        let len = (len as usize).min(BULK_MAX);
        // Under the inode's lock: a write is seen whole or not at all.
        let mut held = self.pdo.lock(&[], &[]);
        self.pdo.lock_inodes(&mut held, &[fid]);
        let rec = self.inode(fid)?;
        if rec.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Errno::EINVAL.into());
        }
        self.dom_bytes(fid, &rec, offset, len)
    }

    /// DOM_SEEK: where the next data or hole of `fid`'s DoM bytes at or after
    /// `offset` starts, as the chunks stand (the client cuts the answer at the file's
    /// size and the component's end).
    pub(crate) fn dom_seek(&self, fid: Fid, offset: u64, hole: bool) -> OpResult<SeekRep> {
        let mut held = self.pdo.lock(&[], &[]);
        self.pdo.lock_inodes(&mut held, &[fid]);
        let rec = self.inode(fid)?;
        if rec.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Errno::EINVAL.into());
        }
        let mut chunks = Vec::new();
        self.scan_chunks(fid, offset / DOM_CHUNK, |n, data| {
            chunks.push((n, data.len() as u64));
            // A data search needs at most two chunks (the first may end before
            // `offset`).
            chunks.len() < if hole { DOM_SEEK_CHUNKS } else { 2 }
        })?;
        Ok(
            match seek_in_chunks(chunks, offset, hole, DOM_SEEK_CHUNKS) {
                Ok(found) => SeekRep {
                    found,
                    scanned_to: u64::MAX,
                },
                Err(at) => SeekRep {
                    found: None,
                    scanned_to: at,
                },
            },
        )
    }

    /// The DoM bytes of `fid` in `[offset, offset+len)`, cut at the MDT's size and the
    /// component's end (the caller holds the inode's lock).
    fn dom_bytes(&self, fid: Fid, rec: &InodeRec, offset: u64, len: usize) -> OpResult<Vec<u8>> {
        let dom_end = rec.layout.as_ref().map_or(0, Layout::dom_end);
        let end = offset.saturating_add(len as u64).min(rec.size).min(dom_end);
        if end <= offset {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        if end - offset <= DOM_CHUNK {
            // One or two chunks: point reads (bloom-filtered) beat an iterator.
            let mut pos = offset;
            while pos < end {
                let n = pos / DOM_CHUNK;
                let within = (pos % DOM_CHUNK) as usize;
                let take = ((DOM_CHUNK as usize) - within).min((end - pos) as usize);
                let chunk = self.dom_chunk(fid, n)?;
                if chunk.len() > within {
                    let have = (chunk.len() - within).min(take);
                    let at = (pos - offset) as usize;
                    out[at..at + have].copy_from_slice(&chunk[within..within + have]);
                }
                pos += take as u64;
            }
            return Ok(out);
        }
        // Many chunks: one pass of an iterator over those that exist.
        let last = (end - 1) / DOM_CHUNK;
        self.scan_chunks(fid, offset / DOM_CHUNK, |n, data| {
            if n > last {
                return false;
            }
            let cstart = n * DOM_CHUNK;
            let from = offset.max(cstart);
            let to = end.min(cstart + data.len() as u64);
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&data[(from - cstart) as usize..(to - cstart) as usize]);
            }
            true
        })?;
        Ok(out)
    }

    /// Passes `f` each chunk of `fid` from chunk `first` on, in order, as (number,
    /// bytes), until it returns false.
    fn scan_chunks(
        &self,
        fid: Fid,
        first: u64,
        mut f: impl FnMut(u64, &[u8]) -> bool,
    ) -> OpResult<()> {
        let mut bad = false;
        self.store.engine().scan(
            Cf::Dom,
            &fid.to_bytes(),
            &chunk_key(fid, first),
            &mut |k, v| match (chunk_no(k), v.split_first()) {
                (Some(n), Some((&records::RECORD_V1, data))) => f(n, data),
                _ => {
                    bad = true;
                    false
                }
            },
        )?;
        if bad {
            return Err(lode_store::StoreError::Corrupt("dom", fid.to_string()).into());
        }
        Ok(())
    }

    /// The name of the data of a file whose inode record is `rec`, for a client that
    /// keeps the bytes in its page cache (see `OpenReq::cached`). Every change of a
    /// file's bytes rewrites its inode, whose version moves on each time, and the
    /// version is mixed with this start's salt: equal tokens mean the same bytes. 0
    /// (none) where the bytes are not all known here: a writer is at work, or the file
    /// has no Data-on-MDT component (OST data changes without the MDT seeing it).
    pub(crate) fn data_token(&self, rec: &InodeRec) -> u64 {
        let dom = rec.layout.as_ref().is_some_and(|l| l.dom_end() > 0);
        if !dom || rec.flags & INODE_DATA != 0 || rec.mode & libc::S_IFMT != libc::S_IFREG {
            return 0;
        }
        self.data_salt.wrapping_add(rec.version)
    }

    /// Whether the bytes the data token `cached` named are still the file's, whose
    /// inode is now at `version` with token `now` (0: none): the same token, or only
    /// changes of attributes since (see `Namespace::attr_steps`).
    pub(crate) fn data_unchanged(&self, fid: Fid, cached: u64, now: u64, version: u64) -> bool {
        if cached == 0 || now == 0 {
            return false;
        }
        if cached == now {
            return true;
        }
        let then = cached.wrapping_sub(self.data_salt);
        self.attr_steps
            .lock()
            .get(&fid)
            .is_some_and(|&(lo, hi)| hi == version && lo <= then && then < hi)
    }

    /// A change of `fid`'s attributes alone took its inode from version `from` to the
    /// next, committed.
    pub(crate) fn attrs_only_step(&self, fid: Fid, from: u64) {
        let to = from.wrapping_add(1);
        let mut steps = self.attr_steps.lock();
        if steps.len() >= crate::ATTR_STEPS_MAX && !steps.contains_key(&fid) {
            steps.clear();
        }
        let e = steps.entry(fid).or_insert((from, to));
        if e.1 != from {
            e.0 = from;
        }
        e.1 = to;
    }

    /// Read-on-open: the first `dom_read_on_open` bytes of a DoM file that nobody is
    /// writing (its size is then exact here), for an open for reading.
    pub(crate) fn read_on_open(&self, fid: Fid, rec: &InodeRec) -> OpResult<Option<DomPrefetch>> {
        let limit = self
            .tun
            .dom_read_on_open
            .load(std::sync::atomic::Ordering::Relaxed) as usize;
        let dom_end = rec.layout.as_ref().map_or(0, Layout::dom_end);
        if limit == 0 || dom_end == 0 || rec.flags & INODE_DATA != 0 {
            return Ok(None);
        }
        let data = self.dom_bytes(fid, rec, 0, limit)?;
        let eof = rec.size <= data.len() as u64;
        Ok(Some(DomPrefetch { data, eof }))
    }

    /// Cuts the DoM data of `fid` to `size` bytes inside batch `b` (truncate), and
    /// its blocks with it.
    pub(crate) fn dom_truncate(
        &self,
        b: &mut Batch,
        fid: Fid,
        rec: &mut InodeRec,
        size: u64,
    ) -> OpResult<()> {
        // Chunks past the layout's DoM end are a pending migration's: they go too (the
        // truncate breaks it), but were never counted in the inode's blocks.
        let counted = rec.layout.as_ref().map_or(0, Layout::dom_end) / DOM_CHUNK;
        let freed = self.dom_delete_below(b, fid, size.div_ceil(DOM_CHUNK), counted)?;
        rec.blocks = rec.blocks.saturating_sub(freed);
        if !size.is_multiple_of(DOM_CHUNK) {
            let n = size / DOM_CHUNK;
            let mut chunk = self.dom_chunk(fid, n)?;
            let keep = (size % DOM_CHUNK) as usize;
            if chunk.len() > keep {
                rec.blocks = rec.blocks.saturating_sub(chunk_blocks(chunk.len()));
                chunk.truncate(keep);
                rec.blocks += chunk_blocks(chunk.len());
                Self::put_dom_chunk(b, fid, n, &chunk);
            }
        }
        Ok(())
    }

    /// Deletes, inside batch `b`, every DoM record of `fid` from chunk `first` on (a
    /// truncate; 0: the file goes); returns the blocks they were charged.
    pub(crate) fn dom_delete_from(&self, b: &mut Batch, fid: Fid, first: u64) -> OpResult<u64> {
        self.dom_delete_below(b, fid, first, u64::MAX)
    }

    /// Like [`Namespace::dom_delete_from`], counting only the blocks of chunks below
    /// `counted`.
    fn dom_delete_below(&self, b: &mut Batch, fid: Fid, first: u64, counted: u64) -> OpResult<u64> {
        let mut gone = Vec::new();
        self.store.engine().scan(
            Cf::Dom,
            &fid.to_bytes(),
            &chunk_key(fid, first),
            &mut |k, v| {
                gone.push((k.to_vec(), v.len().saturating_sub(1)));
                true
            },
        )?;
        let mut blocks = 0;
        for (k, len) in gone {
            let n = chunk_no(&k).unwrap_or(u64::MAX);
            if n < counted {
                blocks += chunk_blocks(len);
            }
            b.delete(Cf::Dom, k);
        }
        Ok(blocks)
    }

    /// LAYOUT_INTENT: instantiates the components a write to `[start, end)` reaches.
    /// A replay brings the layout its client was given and keeps its OSTs.
    pub(crate) fn layout_intent(
        &self,
        ctx: &Ctx,
        slot: u32,
        r: &LayoutIntentReq,
    ) -> OpResult<(MdtBody, u64)> {
        let mut held = self.pdo.lock(&[], &[]);
        self.pdo.lock_inodes(&mut held, &[r.fid]);
        let mut rec = self.inode(r.fid)?;
        if rec.mode & libc::S_IFMT != libc::S_IFREG || r.end <= r.start {
            return Err(Errno::EINVAL.into());
        }
        self.check_write_handle(ctx, slot, r.fid, r.handle)?;
        let mut layout = rec.layout.clone().ok_or(Errno::EINVAL)?;
        let todo = layout.uninit_in(r.start, r.end - r.start);
        if !todo.is_empty() {
            let n = self.ost_count_for(&layout);
            if let Some(given) = r.layout.as_ref().filter(|_| ctx.replay) {
                adopt_osts(&mut layout, given, &todo, n);
            }
            self.instantiate(&mut layout, &todo, n)?;
            layout.gen += 1;
            rec.layout = Some(layout);
            rec.flags |= INODE_DATA;
        }
        let mut b = Batch::new();
        put_inode(&mut b, r.fid, &rec);
        let body = self.body(r.fid, &rec);
        let t = self.commit(ctx, b, &Reply::LayoutIntent(body.clone()))?;
        Ok((body, t))
    }
}

/// Takes the OSTs a replayed intent's client was given for the components `todo`, when
/// they still make sense (same component, OSTs that exist).
fn adopt_osts(layout: &mut Layout, given: &Layout, todo: &[usize], ost_count: u32) {
    for &i in todo {
        let (Some(c), Some(g)) = (layout.components.get_mut(i), given.components.get(i)) else {
            continue;
        };
        if c.id != g.id || c.start != g.start || c.end != g.end {
            continue;
        }
        if let (
            Pattern::Raid0 {
                stripe_count,
                stripe_size,
                osts,
                ..
            },
            Pattern::Raid0 {
                stripe_size: gs,
                osts: go,
                ..
            },
        ) = (&mut c.pattern, &g.pattern)
        {
            if gs == stripe_size
                && !go.is_empty()
                && go.len() <= lode_base::limits::STRIPE_COUNT_MAX as usize
                && go.iter().all(|&o| o < ost_count.max(1))
            {
                *osts = go.clone();
                *stripe_count = go.len() as i32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_whole_4k_blocks() {
        assert_eq!(chunk_blocks(0), 0);
        assert_eq!(chunk_blocks(1), 8);
        assert_eq!(chunk_blocks(4096), 8);
        assert_eq!(chunk_blocks(4097), 16);
    }

    #[test]
    fn seeks_find_missing_and_short_chunks() {
        const C: u64 = DOM_CHUNK;
        let full = |n: u64| (n, C);
        // Chunks 0, 1 full, 2 short (100 bytes), 5 full.
        let chunks = [full(0), full(1), (2, 100), full(5)];
        let from = |off: u64| chunks.iter().copied().filter(move |(n, _)| *n >= off / C);
        let data = |off| seek_in_chunks(from(off), off, false, 10);
        let hole = |off| seek_in_chunks(from(off), off, true, 10);
        assert_eq!(data(0), Ok(Some(0)));
        assert_eq!(data(C + 7), Ok(Some(C + 7)));
        assert_eq!(
            data(2 * C + 100),
            Ok(Some(5 * C)),
            "past a short chunk's end"
        );
        assert_eq!(data(4 * C), Ok(Some(5 * C)));
        assert_eq!(data(6 * C), Ok(None));
        assert_eq!(hole(0), Ok(Some(2 * C + 100)));
        assert_eq!(hole(2 * C + 100), Ok(Some(2 * C + 100)));
        assert_eq!(hole(3 * C), Ok(Some(3 * C)), "a missing chunk");
        assert_eq!(hole(5 * C), Ok(Some(6 * C)), "after the last chunk");
        assert_eq!(hole(9 * C), Ok(Some(9 * C)));
        // A search that runs out of budget says where it stopped.
        assert_eq!(seek_in_chunks(from(0), 0, true, 2), Err(2 * C));
        assert_eq!(seek_in_chunks(from(0), 0, true, 3), Ok(Some(2 * C + 100)));
    }

    #[test]
    fn chunk_keys_sort_by_offset() {
        let f = Fid::new(0x200000400, 1, 0);
        assert!(chunk_key(f, 1) < chunk_key(f, 2));
        assert!(chunk_key(f, 255) < chunk_key(f, 256));
        assert!(chunk_key(f, 0).starts_with(&f.to_bytes()));
    }
}
