//! A small Data-on-MDT file's first write kept back past `write(2)` (Lustre's DoM
//! write-back under a DOM lock).
//!
//! The create of a file whose every byte will be on the MDT, opened for writing, asks
//! for a PW lock on the file's DOM bit (`CreateReq::dom_writeback`). While the client
//! holds it, the MDT answers nobody else's read of the file's data or size (getattr,
//! lookup, readdir+, open, DOM_READ, a change) before calling the lock back, and this
//! client answers the callback only once the write it kept back is on the MDT. So the
//! first write of the handle that made the file is answered here at once and sent in
//! the background (its DOM_WRITE names the lock, which the MDT lets go with it), and
//! the application's `creat`, `write`, `close` waits for the CREATE alone. Later
//! writes, and every other call on the file from this client, wait for that one
//! first. A kept-back write that fails is told at the file's next `fsync` or close,
//! as a write-back cache's are.

use lode_base::{Errno, Fid};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::watch;

/// The file a request to the MDT reads the size or bytes of, or changes, if it names
/// one: sent only once no write to it is kept back here. (A lookup's, readdir+'s or
/// batch's answer says the size of a file open for writing is to be asked for, which
/// such a request then does.)
pub(crate) fn after_write_back(req: &lode_proto::Request) -> Option<Fid> {
    use lode_proto::Request as R;
    match req {
        R::Getattr(r) => Some(r.fid),
        R::Open(r) => Some(r.fid),
        R::DomRead(r) => Some(r.fid),
        R::DomSeek(r) => Some(r.fid),
        R::Setattr(r) => Some(r.fid),
        R::Link(r) => Some(r.fid),
        R::LayoutIntent(r) => Some(r.fid),
        R::Migrate(r) => Some(r.fid),
        _ => None,
    }
}

/// The write-back locks this client holds, and the writes kept back under them.
#[derive(Default)]
pub(crate) struct WriteBacks {
    /// Write-back locks held, by handle: the file, and the write kept back under it
    /// (set to true when answered), if one is. Taken after the lock cache's
    /// `revoked`, as a callback looks here under it.
    locks: Mutex<HashMap<u64, Option<watch::Receiver<bool>>>>,
    /// Writes kept back and not answered yet, by file.
    pending: Mutex<HashMap<Fid, watch::Receiver<bool>>>,
    /// How many are in `pending`: 0 lets every other call skip the map.
    count: AtomicUsize,
    /// Kept-back writes that failed, by file: told at its next `fsync` or close.
    failed: Mutex<HashMap<Fid, Errno>>,
}

/// A write kept back: sends `true` to those waiting for it when answered.
pub(crate) struct Kept {
    fid: Fid,
    lock: u64,
    tx: watch::Sender<bool>,
}

impl WriteBacks {
    /// Records write-back lock `lock` on `fid`, granted with its create.
    pub(crate) fn hold(&self, lock: u64) {
        self.locks.lock().insert(lock, None);
    }

    /// Keeps a write to `fid` back under `lock`: `None` if the lock is no longer held
    /// (called back before this: the write must go now).
    pub(crate) fn keep(&self, fid: Fid, lock: u64) -> Option<Kept> {
        let mut locks = self.locks.lock();
        let slot = locks.get_mut(&lock)?;
        if slot.is_some() {
            return None;
        }
        let (tx, rx) = watch::channel(false);
        *slot = Some(rx.clone());
        self.pending.lock().insert(fid, rx);
        self.count.fetch_add(1, Ordering::AcqRel);
        Some(Kept { fid, lock, tx })
    }

    /// The write kept back was answered (`err`: it failed): the MDT let its lock go.
    pub(crate) fn done(&self, k: Kept, err: Option<Errno>) {
        self.locks.lock().remove(&k.lock);
        if let Some(e) = err {
            self.failed.lock().insert(k.fid, e);
        }
        if self.pending.lock().remove(&k.fid).is_some() {
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
        let _ = k.tx.send(true);
    }

    /// A callback of `lock`: whether it is a write-back lock, and the write kept back
    /// under it to wait for before the cancel, if any. It is no longer held here.
    pub(crate) fn called_back(&self, lock: u64) -> Option<Option<watch::Receiver<bool>>> {
        self.locks.lock().remove(&lock)
    }

    /// A write-back lock its handle is done with unused (the close of a file it
    /// wrote nothing to): true if it was held, to be given back.
    pub(crate) fn unused(&self, lock: u64) -> bool {
        let mut locks = self.locks.lock();
        match locks.get(&lock) {
            Some(None) => {
                locks.remove(&lock);
                true
            }
            _ => false,
        }
    }

    /// Waits until no write to `fid` is kept back.
    pub(crate) async fn wait(&self, fid: Fid) {
        if !self.any() {
            return;
        }
        let rx = self.pending.lock().get(&fid).cloned();
        if let Some(mut rx) = rx {
            let _ = rx.wait_for(|done| *done).await;
        }
    }

    /// Whether any write is kept back.
    fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// Whether a write to `fid` is kept back.
    pub(crate) fn pending(&self, fid: Fid) -> bool {
        self.any() && self.pending.lock().contains_key(&fid)
    }

    /// How a kept-back write to `fid` failed, if one did: told once.
    pub(crate) fn take_error(&self, fid: Fid) -> Result<(), Errno> {
        let mut failed = self.failed.lock();
        if failed.is_empty() {
            return Ok(());
        }
        failed.remove(&fid).map_or(Ok(()), Err)
    }

    /// Every lock is gone (eviction, the callback channel lost): writes kept back
    /// still go, without one.
    pub(crate) fn drop_locks(&self) {
        self.locks.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_kept_back_once_under_a_held_lock_and_its_failure_told_once() {
        let w = WriteBacks::default();
        let fid = Fid::new(0x200000401, 1, 0);
        assert!(w.keep(fid, 7).is_none(), "no lock held");
        w.hold(7);
        let k = w.keep(fid, 7).expect("kept");
        assert!(w.keep(fid, 7).is_none(), "one write per lock");
        assert!(!w.unused(7), "a lock with a write kept back is not unused");
        w.done(k, Some(Errno::ENOSPC));
        assert_eq!(w.take_error(fid), Err(Errno::ENOSPC));
        assert_eq!(w.take_error(fid), Ok(()));
        assert!(
            w.called_back(7).is_none(),
            "the MDT let it go with the write"
        );
    }

    #[test]
    fn a_callback_takes_the_lock_so_no_write_is_kept_back_after_it() {
        let w = WriteBacks::default();
        let fid = Fid::new(0x200000401, 2, 0);
        w.hold(9);
        assert!(matches!(w.called_back(9), Some(None)));
        assert!(w.keep(fid, 9).is_none());
        w.hold(10);
        assert!(w.unused(10));
        assert!(!w.unused(10));
    }
}
