//! File locks (`fcntl` and `flock`) kept by the MDT for all clients: taken, tested and
//! dropped with FLOCK requests; a waiting request is answered "queued" and the grant
//! comes on the callback channel. Without a channel, a waiting request polls.

use crate::Client;
use lode_base::{Errno, Fid};
use lode_proto::{FlockDesc, FlockGrantedReq, FlockReq, Reply, Request};

/// A lock request as the MDT takes it: used as is by callers (FUSE, the native API).
pub type FlockArgs = FlockReq;
use std::time::Duration;

/// First and longest pause between tries of a waiting lock without a callback channel.
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(100);

impl Client {
    /// Takes (or with `F_UNLCK` drops) a file lock; with `a.wait`, until it is granted
    /// (`EDEADLK` if waiting would deadlock), else `EAGAIN` on a conflict.
    pub async fn flock(&self, a: &FlockArgs) -> Result<(), Errno> {
        let r = self.flock_inner(a).await;
        let key = (a.fid, a.owner);
        if a.typ == libc::F_UNLCK as u32 {
            if r.is_ok() && a.start == 0 && a.end >= i64::MAX as u64 {
                self.locks.flock_owners.lock().remove(&key);
            }
        } else if r.is_ok() {
            self.locks.flock_owners.lock().insert(key);
        }
        r
    }

    async fn flock_inner(&self, a: &FlockArgs) -> Result<(), Errno> {
        if !a.wait || a.typ == libc::F_UNLCK as u32 {
            return self.flock_once(a, false).await.map(|_| ());
        }
        if !self.callback_channel_up() {
            return self.flock_poll(a).await;
        }
        let rx = {
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.locks.flock_waits.lock().insert((a.fid, a.owner), tx);
            rx
        };
        let queued = self.flock_once(a, true).await;
        match queued {
            Ok(true) => match rx.await {
                Ok(true) => Ok(()),
                // Its owner unlocked meanwhile (an interrupted wait).
                Ok(false) => Err(Errno::EINTR),
                // Evicted, or the callback channel went: the wait is lost.
                Err(_) => Err(Errno::EIO),
            },
            other => {
                self.locks.flock_waits.lock().remove(&(a.fid, a.owner));
                other.map(|_| ())
            }
        }
    }

    /// Whether `owner` may hold locks on `fid` (it took one and has not dropped all
    /// its locks on the file since): a close needs to drop them only then.
    pub fn flock_may_hold(&self, fid: Fid, owner: u64) -> bool {
        self.locks.flock_owners.lock().contains(&(fid, owner))
    }

    /// The lock that would conflict with `a` (`F_GETLK`), if any.
    pub async fn flock_test(&self, a: &FlockArgs) -> Result<Option<FlockDesc>, Errno> {
        let req = FlockReq {
            wait: false,
            test: true,
            ..a.clone()
        };
        match self.md(Request::Flock(req)).await? {
            Reply::Flock(r) => Ok(r.conflict),
            _ => Err(Errno::EPROTO),
        }
    }

    /// One request; `Ok(true)`: queued.
    async fn flock_once(&self, a: &FlockArgs, wait: bool) -> Result<bool, Errno> {
        let req = FlockReq {
            wait,
            test: false,
            ..a.clone()
        };
        match self.md(Request::Flock(req)).await? {
            Reply::Flock(r) => Ok(r.queued),
            _ => Err(Errno::EPROTO),
        }
    }

    /// A waiting lock without a callback channel: tries again until granted.
    async fn flock_poll(&self, a: &FlockArgs) -> Result<(), Errno> {
        let mut pause = POLL_FIRST;
        loop {
            match self.flock_once(a, false).await {
                Err(Errno::EAGAIN) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(POLL_MAX);
                }
                r => return r.map(|_| ()),
            }
        }
    }

    /// The MDT ended a wait: granted, or not.
    pub(crate) fn on_flock_granted(self: &std::sync::Arc<Self>, r: FlockGrantedReq) {
        self.mdc.stats().record(lode_proto::Opcode::FlockGranted, 0);
        match self.locks.flock_waits.lock().remove(&(r.fid, r.owner)) {
            Some(tx) => {
                let _ = tx.send(r.granted);
            }
            None if r.granted => {
                // Nobody waits for it any more: give it back.
                tracing::debug!(fid = %r.fid, "file lock granted to no waiter: dropped");
                let a = FlockArgs {
                    fid: r.fid,
                    owner: r.owner,
                    pid: 0,
                    typ: libc::F_UNLCK as u32,
                    start: 0,
                    end: u64::MAX,
                    wait: false,
                    test: false,
                };
                let me = self.clone();
                self.rt.spawn(async move {
                    let _ = me.flock(&a).await;
                });
            }
            None => {}
        }
    }
}
