//! Statahead (Lustre's `llite.*.statahead_*`): a directory listed without attributes
//! (`ls -l`, `du`, `find` read the names first) and then looked up name by name gets
//! its attributes fetched ahead, a readdir+ page at a time from the name looked up,
//! under the locks that page grants; the lookups that follow are answered from the
//! lock cache. A wrong guess costs one page; `statahead_max` bounds how many entries'
//! locks a fetch keeps (the rest are given back at once).

use crate::Client;
use lode_base::{Cred, Errno, Fid};
use lode_proto::{DirEntry, MdtBody, ReaddirReq, Reply, Request};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Directories whose listings are remembered at once.
const DIRS_MAX: usize = 4;
/// Names remembered per directory.
const NAMES_MAX: usize = 1 << 17;
/// `statahead_max` unless set: how many entries from the name looked up a fetch keeps
/// (at most a readdir+ page).
pub const STATAHEAD_MAX_DEFAULT: usize = 1024;
/// The largest `statahead_max` (Lustre's bound).
pub const STATAHEAD_MAX_MAX: usize = 8192;

/// One directory as statahead knows it.
#[derive(Default)]
struct Dir {
    /// Names listed and not fetched yet → their readdir cookies.
    listed: HashMap<Vec<u8>, u64>,
    /// Names fetched ahead and not looked up yet.
    fetched: HashSet<Vec<u8>>,
}

/// What the client remembers of listings, and what statahead did.
pub(crate) struct Statahead {
    dirs: Mutex<HashMap<Fid, Dir>>,
    /// `statahead_max` (0: off; `usize::MAX` stands for the default).
    max: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
    pages: AtomicU64,
    wrong: AtomicU64,
}

impl Default for Statahead {
    fn default() -> Self {
        Statahead {
            dirs: Mutex::default(),
            max: AtomicUsize::new(usize::MAX),
            hits: AtomicU64::default(),
            misses: AtomicU64::default(),
            pages: AtomicU64::default(),
            wrong: AtomicU64::default(),
        }
    }
}

impl Statahead {
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

    /// Sets `statahead_max` (0 turns statahead off and forgets the listings).
    pub fn set_statahead_max(&self, n: usize) {
        self.statahead.max.store(n, Ordering::Relaxed);
        if n == 0 {
            self.statahead.dirs.lock().clear();
        }
    }

    /// `statahead_stats`: lookups answered by what statahead fetched (hits), fetched
    /// entries never looked up before their directory's listing was dropped (misses),
    /// pages fetched, and fetches that did not answer the lookup that asked (wrong).
    pub fn statahead_stats(&self) -> String {
        let s = &self.statahead;
        format!(
            "statahead_max: {}\nhits: {}\nmisses: {}\npages: {}\nwrong: {}\n",
            s.max(),
            s.hits.load(Ordering::Relaxed),
            s.misses.load(Ordering::Relaxed),
            s.pages.load(Ordering::Relaxed),
            s.wrong.load(Ordering::Relaxed),
        )
    }

    /// Clears `statahead_stats`' counters.
    pub fn statahead_stats_clear(&self) {
        let s = &self.statahead;
        for c in [&s.hits, &s.misses, &s.pages, &s.wrong] {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// A page of `dir` read without attributes: its names may be looked up next.
    pub(crate) fn note_listing(&self, dir: Fid, entries: &[DirEntry]) {
        if self.statahead.max() == 0 || !self.callback_channel_up() {
            return;
        }
        let mut dirs = self.statahead.dirs.lock();
        if !dirs.contains_key(&dir) && dirs.len() >= DIRS_MAX {
            // Room for this one: forget another directory's.
            if let Some(k) = dirs.keys().next().copied() {
                if let Some(d) = dirs.remove(&k) {
                    self.statahead
                        .misses
                        .fetch_add(d.fetched.len() as u64, Ordering::Relaxed);
                }
            }
        }
        let d = dirs.entry(dir).or_default();
        for e in entries {
            if d.listed.len() >= NAMES_MAX {
                break;
            }
            if e.name != b"." && e.name != b".." {
                d.listed.insert(e.name.clone(), e.cookie);
            }
        }
    }

    /// A lookup the cache answered: counted as a hit if statahead fetched it.
    pub(crate) fn statahead_answered(&self, parent: Fid, name: &[u8]) {
        if self.statahead.max() == 0 {
            return;
        }
        let mut dirs = self.statahead.dirs.lock();
        if let Some(d) = dirs.get_mut(&parent) {
            if d.fetched.remove(name) {
                self.statahead.hits.fetch_add(1, Ordering::Relaxed);
            }
        }
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
        let cookie = self
            .statahead
            .dirs
            .lock()
            .get_mut(&parent)?
            .listed
            .remove(name)?;
        self.statahead.pages.fetch_add(1, Ordering::Relaxed);
        let got = self.readdir_ahead(cred, parent, cookie, max).await.ok()?;
        if let Some(d) = self.statahead.dirs.lock().get_mut(&parent) {
            for n in got {
                d.listed.remove(&n);
                if n != name {
                    d.fetched.insert(n);
                }
            }
        }
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

    /// One readdir+ page of `dir` from `cookie`: the first `max` entries are kept under
    /// the locks granted with them, the others' locks given back at once. Returns the
    /// names kept.
    async fn readdir_ahead(
        &self,
        cred: &Cred,
        dir: Fid,
        cookie: u64,
        max: usize,
    ) -> Result<Vec<Vec<u8>>, Errno> {
        let page = match self
            .md(Request::Readdir(ReaddirReq {
                cred: cred.clone(),
                fid: dir,
                cookie,
                plus: true,
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
            kept.push(e.name);
        }
        if !extra.is_empty() {
            let _ = self.lock_cancel(extra).await;
        }
        Ok(kept)
    }
}
