//! Statahead (Lustre's `llite.*.statahead_*`): a directory listed without attributes
//! (`ls -l`, `du`, `find` read the names first) and then looked up name by name gets
//! its attributes fetched ahead, a readdir+ page at a time from the name looked up,
//! under the locks that page grants; the lookups that follow are answered from the
//! lock cache. A wrong guess costs one page; `statahead_max` bounds how many entries'
//! locks a fetch keeps (the rest are given back at once).
//!
//! Names looked up without a listing in a numbered sequence (`file.0001`,
//! `file.0002`, …: mdtest's stat phase, a job reading its shards) are guessed ahead
//! (Lustre 2.16's pattern statahead): after two consecutive numbers in one directory
//! the next ones are looked up in one batched RPC, under their locks. A guessed name
//! that does not exist ends the pattern and counts as a wrong guess.

use crate::Client;
use lode_base::{Cred, Errno, Fid};
use lode_proto::{DirEntry, LookupReq, MdtBody, ReaddirReq, Reply, Request};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::sync::watch;

/// Directories whose listings are remembered at once (the least recently used goes
/// first: a parallel walk has one directory per walker in progress).
const DIRS_MAX: usize = 8;
/// Names remembered per directory.
const NAMES_MAX: usize = 1 << 17;
/// `statahead_max` unless set: how many entries from the name looked up a fetch keeps
/// (at most a readdir+ page).
pub const STATAHEAD_MAX_DEFAULT: usize = 1024;
/// The largest `statahead_max` (Lustre's bound).
pub const STATAHEAD_MAX_MAX: usize = 8192;

/// Names a pattern fetch guesses at once, at most (Lustre's `statahead_batch_max`
/// is 64; a larger window costs one RPC per window either way).
const PATTERN_WINDOW: usize = 256;

/// A numbered sequence of lookups in one directory.
#[derive(Default)]
struct Pattern {
    parent: Fid,
    prefix: Vec<u8>,
    suffix: Vec<u8>,
    /// Digits of the number (zero-padded to this width).
    width: usize,
    last: u64,
    /// Consecutive numbers seen.
    streak: u32,
    /// Numbers below this were fetched already.
    fetched_to: u64,
}

/// A name split around its last run of digits: (prefix, number, width, suffix).
fn numbered(name: &[u8]) -> Option<(&[u8], u64, usize, &[u8])> {
    let end = name.iter().rposition(|b| b.is_ascii_digit())? + 1;
    let start = name[..end]
        .iter()
        .rposition(|b| !b.is_ascii_digit())
        .map_or(0, |i| i + 1);
    if end - start > 18 {
        return None;
    }
    let n = std::str::from_utf8(&name[start..end]).ok()?.parse().ok()?;
    Some((&name[..start], n, end - start, &name[end..]))
}

/// The name of number `n` in a sequence.
fn nth_name(prefix: &[u8], n: u64, width: usize, suffix: &[u8]) -> Vec<u8> {
    let mut v = prefix.to_vec();
    v.extend_from_slice(format!("{n:0width$}").as_bytes());
    v.extend_from_slice(suffix);
    v
}

/// A listed name as statahead keeps it: a 64-bit hash, not a copy, so a walk that
/// only lists (`find -name`) pays no allocation per name. Two names of one directory
/// with the same hash only make a fetch start at the wrong one: the lookup is then
/// answered by the MDT, and counted as a wrong guess.
fn name_key(name: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(0x5a7a).hash_one(name)
}

/// One directory as statahead knows it.
#[derive(Default)]
struct Dir {
    /// Names listed and not fetched yet (their [`name_key`]s) → their readdir cookies.
    listed: foldhash::HashMap<u64, u64>,
    /// Names fetched ahead and not looked up yet (their [`name_key`]s).
    fetched: foldhash::HashSet<u64>,
    /// Every listed cookie, in order, and whether a fetch took its entry already: a
    /// fetch stops before the first entry taken, so a walk that stats in another order
    /// than the listing's (`du`, `find`, `rm -r`: gnulib's fts stats a large directory
    /// in inode order) fetches each entry once, not a page from every name it misses.
    /// Empty until the first miss in the directory.
    cookies: BTreeMap<u64, bool>,
    /// Fetches in the background, by the first and last cookies they take: a lookup of
    /// a name one of them is bringing waits for it, rather than fetch that name alone
    /// (a caller that outruns the fetch would otherwise send a page per name).
    in_flight: Vec<(u64, u64, watch::Receiver<()>)>,
    /// When it was last used (a count of uses across all directories).
    used: u64,
    /// The run fetched last in the background: a lookup of its first name fetches the
    /// run after it, so a walk in listing order keeps a run ahead of it and waits for
    /// no fetch past its first miss.
    trigger: Option<Run>,
}

/// A run of entries fetched ahead in the background: its first cookie, its first
/// name's [`name_key`] once the fetch is back, and its last cookie.
#[derive(Clone, Copy)]
struct Run {
    first: u64,
    first_key: Option<u64>,
    last: u64,
}

impl Dir {
    /// Takes the next run of at most `max` entries no fetch took, from `from` past
    /// `skip` entries, and puts it in flight: its cookies and the sender whose drop
    /// tells the lookups waiting for it that it is done. Looked for within `2 * max`
    /// entries (bounded: a directory whose entries were all taken would otherwise be
    /// scanned to its end at every miss, quadratic over a walk of it).
    fn take_run(
        &mut self,
        from: (Bound<u64>, Bound<u64>),
        skip: usize,
        max: usize,
    ) -> Option<(Vec<u64>, watch::Sender<()>)> {
        let next: Vec<u64> = self
            .cookies
            .range(from)
            .skip(skip)
            .take(2 * max)
            .skip_while(|(_, taken)| **taken)
            .take(max)
            .take_while(|(_, taken)| !**taken)
            .map(|(c, _)| *c)
            .collect();
        let (&first, &last) = (next.first()?, next.last()?);
        for c in &next {
            self.cookies.insert(*c, true);
        }
        let (tx, rx) = watch::channel(());
        self.in_flight.push((first, last, rx));
        Some((next, tx))
    }
}

/// What the client remembers of listings, and what statahead did.
pub(crate) struct Statahead {
    dirs: Mutex<HashMap<Fid, Dir>>,
    /// Uses of `dirs` so far, to tell the least recently used directory.
    ticks: AtomicU64,
    pattern: Mutex<Pattern>,
    /// `statahead_max` (0: off; `usize::MAX` stands for the default).
    max: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
    pages: AtomicU64,
    /// Entries the pages carried.
    entries: AtomicU64,
    wrong: AtomicU64,
}

impl Default for Statahead {
    fn default() -> Self {
        Statahead {
            dirs: Mutex::default(),
            ticks: AtomicU64::default(),
            pattern: Mutex::default(),
            max: AtomicUsize::new(usize::MAX),
            hits: AtomicU64::default(),
            misses: AtomicU64::default(),
            pages: AtomicU64::default(),
            entries: AtomicU64::default(),
            wrong: AtomicU64::default(),
        }
    }
}

impl Statahead {
    /// `dir`'s entry, made if new, marked as used now: room for it is made by
    /// forgetting the least recently used directory's, whose fetched names never
    /// looked up count as misses.
    fn dir<'a>(&self, dirs: &'a mut HashMap<Fid, Dir>, dir: Fid) -> &'a mut Dir {
        if !dirs.contains_key(&dir) && dirs.len() >= DIRS_MAX {
            let lru = dirs.iter().min_by_key(|(_, d)| d.used).map(|(k, _)| *k);
            if let Some(d) = lru.and_then(|k| dirs.remove(&k)) {
                self.misses
                    .fetch_add(d.fetched.len() as u64, Ordering::Relaxed);
            }
        }
        let d = dirs.entry(dir).or_default();
        d.used = self.ticks.fetch_add(1, Ordering::Relaxed);
        d
    }

    /// `dir`'s entry if there is one, marked as used now.
    fn used<'a>(&self, dirs: &'a mut HashMap<Fid, Dir>, dir: Fid) -> Option<&'a mut Dir> {
        let d = dirs.get_mut(&dir)?;
        d.used = self.ticks.fetch_add(1, Ordering::Relaxed);
        Some(d)
    }

    fn max(&self) -> usize {
        match self.max.load(Ordering::Relaxed) {
            usize::MAX => STATAHEAD_MAX_DEFAULT,
            n => n,
        }
    }
}

impl Client {
    /// `statahead_max`.
    pub fn statahead_max(&self) -> usize {
        self.statahead.max()
    }

    /// Sets `statahead_max` (0 turns statahead off and forgets the listings; a mount
    /// then lists names without attributes too, see `lode_fuse`).
    pub fn set_statahead_max(&self, n: usize) {
        self.statahead.max.store(n, Ordering::Relaxed);
        if n == 0 {
            self.statahead.dirs.lock().clear();
        }
    }

    /// `statahead_stats`: lookups answered by what statahead fetched (hits), fetched
    /// entries never looked up before their directory's listing was dropped (misses),
    /// pages fetched and the entries they carried, and fetches that did not answer the
    /// lookup that asked (wrong).
    pub fn statahead_stats(&self) -> String {
        let s = &self.statahead;
        format!(
            "statahead_max: {}\nhits: {}\nmisses: {}\npages: {}\nentries: {}\nwrong: {}\n",
            s.max(),
            s.hits.load(Ordering::Relaxed),
            s.misses.load(Ordering::Relaxed),
            s.pages.load(Ordering::Relaxed),
            s.entries.load(Ordering::Relaxed),
            s.wrong.load(Ordering::Relaxed),
        )
    }

    /// Clears `statahead_stats`' counters.
    pub fn statahead_stats_clear(&self) {
        let s = &self.statahead;
        for c in [&s.hits, &s.misses, &s.pages, &s.entries, &s.wrong] {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// A page of `dir` read without attributes: its names may be looked up next.
    pub(crate) fn note_listing(&self, dir: Fid, entries: &[DirEntry]) {
        if self.statahead.max() == 0 || !self.callback_channel_up() {
            return;
        }
        let mut dirs = self.statahead.dirs.lock();
        let d = self.statahead.dir(&mut dirs, dir);
        for e in entries {
            if d.listed.len() >= NAMES_MAX {
                break;
            }
            if e.name != b"." && e.name != b".." {
                d.listed.insert(name_key(&e.name), e.cookie);
                if !d.cookies.is_empty() {
                    // Listed again: a new walk, which may miss entries the lock LRU
                    // gave back since an earlier walk fetched them; were they still
                    // marked taken, each miss would cost a lookup of its own.
                    d.cookies.insert(e.cookie, false);
                }
            }
        }
    }

    /// A lookup the cache answered: counted as a hit if statahead fetched it, and if
    /// it is the first name of the run fetched last, the run after it is fetched now.
    pub(crate) fn statahead_answered(&self, cred: &Cred, parent: Fid, name: &[u8]) {
        let max = self.statahead.max();
        if max == 0 {
            return;
        }
        let key = name_key(name);
        let run = {
            let mut dirs = self.statahead.dirs.lock();
            let Some(d) = self.statahead.used(&mut dirs, parent) else {
                return;
            };
            // A lookup may find a name in the cache after its fetch put it there and
            // before the fetch marked it fetched: it is then still listed, in a run in
            // flight, and taken out of the listing here so that the fetch does not
            // mark it. (A run in the background names the trigger's first name when it
            // marks its names fetched, so a name found marked is checked by its key.)
            let racing = if d.fetched.remove(&key) {
                None
            } else {
                let Some(c) = d.listed.get(&key).copied() else {
                    return;
                };
                if !d
                    .in_flight
                    .iter()
                    .any(|(first, last, _)| (*first..=*last).contains(&c))
                {
                    return;
                }
                d.listed.remove(&key);
                Some(c)
            };
            self.statahead.hits.fetch_add(1, Ordering::Relaxed);
            let trigger = d.trigger.filter(|t| match racing {
                None => t.first_key == Some(key),
                Some(c) => c == t.first,
            });
            match trigger {
                Some(t) => {
                    d.trigger = None;
                    d.take_run((Bound::Excluded(t.last), Bound::Unbounded), 0, max)
                }
                None => None,
            }
        };
        if let Some((next, done)) = run {
            self.fetch_run_ahead(cred, parent, next, done);
        }
    }

    /// Fetches run `next` of listed directory `parent` in the background (see
    /// [`Dir::take_run`]); `done` is dropped when it is over.
    fn fetch_run_ahead(&self, cred: &Cred, parent: Fid, next: Vec<u64>, done: watch::Sender<()>) {
        let (Some(&from), Some(&last), Some(me)) = (next.first(), next.last(), self.me.upgrade())
        else {
            return;
        };
        if let Some(d) = self.statahead.dirs.lock().get_mut(&parent) {
            d.trigger = Some(Run {
                first: from,
                first_key: None,
                last,
            });
        }
        let cred = cred.clone();
        self.rt.spawn(async move {
            let fetched = me.fetch_ahead(&cred, parent, from, next.len(), None).await;
            if let Some(d) = me.statahead.dirs.lock().get_mut(&parent) {
                d.in_flight.retain(|(first, _, _)| *first != from);
                if fetched.is_none() {
                    // Not fetched: misses ask for them again.
                    for c in next {
                        if let Some(taken) = d.cookies.get_mut(&c) {
                            *taken = false;
                        }
                    }
                }
            }
            // Wakes the lookups waiting for these names.
            drop(done);
        });
    }

    /// A lookup the cache could not answer: if `name` was listed in `parent`, fetch
    /// the attributes of it and of the names after it (one readdir+ page, under locks)
    /// and answer from the cache. `None`: ask the MDT as usual.
    pub(crate) async fn statahead_lookup(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
    ) -> Option<Result<MdtBody, Errno>> {
        let max = self.statahead.max();
        if max == 0 {
            return None;
        }
        let key = name_key(name);
        let coming = {
            let mut dirs = self.statahead.dirs.lock();
            let d = self.statahead.used(&mut dirs, parent)?;
            let cookie = *d.listed.get(&key)?;
            d.in_flight
                .iter()
                .find(|(first, last, _)| (*first..=*last).contains(&cookie))
                .map(|(_, _, rx)| rx.clone())
        };
        if let Some(mut rx) = coming {
            // Ends when the fetch is done (its sender dropped), failed or not.
            let _ = rx.changed().await;
            if let Some(r) = self.cached_lookup(cred, parent, name) {
                self.statahead_answered(cred, parent, name);
                return Some(r);
            }
        }
        let (cookie, count, run) = {
            let mut dirs = self.statahead.dirs.lock();
            let d = self.statahead.used(&mut dirs, parent)?;
            if d.cookies.is_empty() && d.listed.contains_key(&key) {
                // Put in order at the first miss: a listing nobody stats (`find -name`)
                // costs no ordering.
                d.cookies = d.listed.values().map(|c| (*c, false)).collect();
            }
            let cookie = d.listed.remove(&key)?;
            // Up to the first entry a fetch took already (or `max`).
            let count = d
                .cookies
                .range(cookie..)
                .take(max)
                .take_while(|(c, taken)| **c == cookie || !**taken)
                .count()
                .max(1);
            // The next entries not taken, fetched meanwhile in the background: a walk
            // in listing order finds them there when it gets to them, and one in
            // another order needs them sooner or later too. Taken now, so that no
            // other fetch asks for them again.
            let run = d.take_run((Bound::Included(cookie), Bound::Unbounded), count, max);
            (cookie, count, run)
        };
        if let Some((next, done)) = run {
            self.fetch_run_ahead(cred, parent, next, done);
        }
        self.fetch_ahead(cred, parent, cookie, count, Some(name))
            .await?;
        match self.cached_lookup(cred, parent, name) {
            Some(r) => {
                self.statahead.hits.fetch_add(1, Ordering::Relaxed);
                Some(r)
            }
            None => {
                self.statahead.wrong.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// A lookup of a name no listing holds: if it continues a numbered sequence in
    /// `parent`, look it and the next names up in one batch (under their locks) and
    /// answer from that. `None`: ask the MDT as usual.
    pub(crate) async fn pattern_lookup(
        &self,
        cred: &Cred,
        parent: Fid,
        name: &[u8],
    ) -> Option<Result<MdtBody, Errno>> {
        let max = self.statahead.max().min(PATTERN_WINDOW);
        if max < 2 || !self.callback_channel_up() {
            return None;
        }
        let (prefix, n, width, suffix) = numbered(name)?;
        let names: Vec<Vec<u8>> = {
            let mut p = self.statahead.pattern.lock();
            let same = p.parent == parent
                && p.prefix == prefix
                && p.suffix == suffix
                && (p.width == width || n.to_string().len() == width)
                && p.last.checked_add(1) == Some(n);
            if same {
                p.streak += 1;
            } else {
                *p = Pattern {
                    parent,
                    prefix: prefix.to_vec(),
                    suffix: suffix.to_vec(),
                    width,
                    last: n,
                    streak: 1,
                    fetched_to: 0,
                };
            }
            p.last = n;
            if p.streak < 2 || n < p.fetched_to {
                return None;
            }
            let to = n.saturating_add(max as u64);
            p.fetched_to = to;
            std::iter::once(name.to_vec())
                .chain((n + 1..to).map(|k| nth_name(prefix, k, width, suffix)))
                .collect()
        };
        let subs = names
            .iter()
            .map(|nm| {
                Request::Lookup(LookupReq {
                    cred: cred.clone(),
                    parent,
                    name: nm.clone(),
                })
            })
            .collect();
        self.statahead.pages.fetch_add(1, Ordering::Relaxed);
        let results = self.batch(subs).await.ok()?;
        let mut mine = None;
        let mut fetched = Vec::new();
        for (nm, r) in names.into_iter().zip(results) {
            match r {
                Ok(Reply::Lookup(b)) if mine.is_none() => mine = Some(b),
                Ok(_) => fetched.push(nm),
                Err(e) if mine.is_none() => return Some(Err(e)),
                Err(_) => {
                    // The sequence ends (or has a hole): stop guessing here.
                    self.statahead.wrong.fetch_add(1, Ordering::Relaxed);
                    let mut p = self.statahead.pattern.lock();
                    if p.parent == parent {
                        p.streak = 0;
                    }
                    break;
                }
            }
        }
        {
            let mut dirs = self.statahead.dirs.lock();
            self.statahead
                .dir(&mut dirs, parent)
                .fetched
                .extend(fetched.iter().map(|n| name_key(n)));
        }
        self.statahead.hits.fetch_add(1, Ordering::Relaxed);
        mine.map(Ok)
    }

    /// Fetches `count` entries of listed directory `parent` from `cookie` (see
    /// [`Client::readdir_ahead`]) and notes them fetched, but for `asked`, the name whose
    /// lookup this fetch answers. A fetch in the background (`asked` none) names the
    /// first entry of the directory's trigger if it is that run, in the same step, so
    /// that a lookup finding that name fetched also finds it the trigger. `None` if
    /// the fetch failed.
    async fn fetch_ahead(
        &self,
        cred: &Cred,
        parent: Fid,
        cookie: u64,
        count: usize,
        asked: Option<&[u8]>,
    ) -> Option<()> {
        self.statahead.pages.fetch_add(1, Ordering::Relaxed);
        let got = self.readdir_ahead(cred, parent, cookie, count).await.ok()?;
        self.statahead
            .entries
            .fetch_add(got.len() as u64, Ordering::Relaxed);
        if let Some(d) = self.statahead.dirs.lock().get_mut(&parent) {
            if let (None, Some(t), Some((n, _))) = (asked, d.trigger.as_mut(), got.first()) {
                if t.first == cookie {
                    t.first_key = Some(name_key(n));
                }
            }
            // Marks only: a listing dropped and made again meanwhile starts unordered.
            if let Some(taken) = d.cookies.get_mut(&cookie) {
                *taken = true;
            }
            for (n, c) in got {
                let key = name_key(&n);
                if let Some(taken) = d.cookies.get_mut(&c) {
                    *taken = true;
                }
                // Not if a lookup already found it (see `statahead_answered`).
                if d.listed.remove(&key).is_some() && Some(&n[..]) != asked {
                    d.fetched.insert(key);
                }
            }
        }
        Some(())
    }

    /// One readdir+ page of `dir` from `cookie`: the first `max` entries are kept under
    /// the locks granted with them, the others' locks given back at once. Returns the
    /// names kept, with their cookies.
    async fn readdir_ahead(
        &self,
        cred: &Cred,
        dir: Fid,
        cookie: u64,
        max: usize,
    ) -> Result<Vec<(Vec<u8>, u64)>, Errno> {
        let page = match self
            .md(Request::Readdir(ReaddirReq {
                cred: cred.clone(),
                fid: dir,
                cookie,
                plus: true,
                // The MDT does only what is kept.
                count: max as u32,
            }))
            .await?
        {
            Reply::Readdir(r) => r,
            _ => return Err(Errno::EPROTO),
        };
        let mut kept = Vec::new();
        let mut extra = Vec::new();
        for e in page.entries {
            let Some(b) = e.body.as_ref() else { continue };
            let locks = [b.lock, b.name_lock].into_iter().filter(|h| *h != 0);
            if e.name == b"." || e.name == b".." || kept.len() >= max {
                extra.extend(locks);
                continue;
            }
            if b.lock != 0 || b.name_lock != 0 {
                self.remember(b, Some((dir, &e.name, cred)));
            }
            kept.push((e.name, e.cookie));
        }
        if !extra.is_empty() {
            let _ = self.lock_cancel(extra).await;
        }
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_splits_around_its_last_number() {
        assert_eq!(
            numbered(b"file.mdtest.0.17"),
            Some((&b"file.mdtest.0."[..], 17, 2, &b""[..]))
        );
        assert_eq!(
            numbered(b"shard-0042.tar"),
            Some((&b"shard-"[..], 42, 4, &b".tar"[..]))
        );
        assert_eq!(numbered(b"7"), Some((&b""[..], 7, 1, &b""[..])));
        assert_eq!(numbered(b"readme"), None);
        assert_eq!(
            numbered(b"x99999999999999999999"),
            None,
            "too long a number"
        );
    }

    #[test]
    fn the_next_names_keep_their_width_and_grow_past_it() {
        assert_eq!(nth_name(b"shard-", 43, 4, b".tar"), b"shard-0043.tar");
        assert_eq!(nth_name(b"f.", 10, 1, b""), b"f.10");
        assert_eq!(nth_name(b"f.", 10000, 4, b""), b"f.10000");
    }
}
