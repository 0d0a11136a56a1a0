//! Server cache warming (seed 004's "warm the MDS cache", seed 001's "pre-read inode
//! and directory blocks"): a directory read from its start is about to be walked, so
//! the inodes of its entries are read into the MDT's inode cache in the background,
//! on one thread, in FID order (the order they sit in the store). The lookups and
//! getattrs of the walk then find them in memory, even on a cold MDS. Bounded: a few
//! directories queued (more are dropped and counted), a bounded number of entries
//! per directory, nothing read twice while it stays cached.

use crate::Namespace;
use lode_base::Fid;
use lode_store::Cf;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use tracing::debug;

/// Directories queued for warming at most.
const QUEUE_MAX: usize = 8;
/// Inodes read from the store together (one MultiGet; the cache's lock is taken
/// twice per batch, so a batch is short).
const WARM_BATCH: usize = 256;

/// The warming thread's queue and counters.
pub(crate) struct Warmer {
    tx: SyncSender<Fid>,
    pending: Mutex<HashSet<Fid>>,
    /// `cache_warm`: on unless set off.
    pub(crate) on: AtomicBool,
    pub(crate) dirs: AtomicU64,
    pub(crate) inodes: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

impl Warmer {
    /// Starts the warming thread for `ns`; it ends when `ns` goes.
    pub(crate) fn start(ns: &Arc<Namespace>) -> std::io::Result<Arc<Warmer>> {
        let (tx, rx) = sync_channel::<Fid>(QUEUE_MAX);
        let w = Arc::new(Warmer {
            tx,
            pending: Mutex::default(),
            on: AtomicBool::new(true),
            dirs: AtomicU64::default(),
            inodes: AtomicU64::default(),
            dropped: AtomicU64::default(),
        });
        let (ns, me): (Weak<Namespace>, Weak<Warmer>) = (Arc::downgrade(ns), Arc::downgrade(&w));
        std::thread::Builder::new()
            .name("mdt-warm".into())
            .spawn(move || {
                // Background work on what the service threads leave idle: under
                // SCHED_IDLE the scheduler also treats its CPU as free when it places a
                // woken service thread or client (a nice value alone does not).
                let idle = libc::sched_param { sched_priority: 0 };
                // SAFETY: sets the calling thread's policy; `idle` outlives the call.
                if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) } != 0 {
                    debug!("cache warming: could not lower its priority");
                }
                while let Ok(dir) = rx.recv() {
                    let (Some(ns), Some(w)) = (ns.upgrade(), me.upgrade()) else {
                        return;
                    };
                    let n = warm_dir(&ns, dir);
                    w.inodes.fetch_add(n, Ordering::Relaxed);
                    w.dirs.fetch_add(1, Ordering::Relaxed);
                    w.pending.lock().remove(&dir);
                }
            })?;
        Ok(w)
    }

    /// `dir` is being read from its start: warm its entries' inodes soon.
    pub(crate) fn request(&self, dir: Fid) {
        if !self.on.load(Ordering::Relaxed) || !self.pending.lock().insert(dir) {
            return;
        }
        match self.tx.try_send(dir) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.pending.lock().remove(&dir);
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Reads the inodes of `dir`'s entries into the cache; returns how many it read.
fn warm_dir(ns: &Namespace, dir: Fid) -> u64 {
    let prefix = dir.to_bytes();
    let mut fids = Vec::new();
    let entries_max = ns.store.inode_cache_max() / 4;
    let scanned = ns
        .store
        .engine()
        .scan(Cf::Dirent, &prefix, &prefix, &mut |_, v| {
            if let Ok(d) = crate::inode::decode_dirent(v) {
                fids.push(d.fid);
            }
            // A quarter of the inode cache at most for one directory.
            fids.len() < entries_max
        });
    if let Err(e) = scanned {
        debug!(%dir, "cache warming: {e}");
        return 0;
    }
    fids.sort_unstable();
    let mut n = 0;
    for chunk in fids.chunks(WARM_BATCH) {
        let keys: Vec<_> = chunk.iter().map(Fid::to_bytes).collect();
        match ns.store.warm_inodes(&keys) {
            Ok(k) => n += k as u64,
            Err(e) => {
                debug!(%dir, "cache warming: {e}");
                break;
            }
        }
    }
    n
}
