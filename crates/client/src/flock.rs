//! File locks (`fcntl` and `flock`) kept by the MDT for all clients: taken, tested and
//! dropped with FLOCK requests; a waiting request is answered "queued" and the grant
//! comes on the callback channel. Without a channel, a waiting request polls.

use crate::Client;
use lode_base::flock::RangeLock;
use lode_base::{Errno, Fid};
use lode_proto::{FlockDesc, FlockGrantedReq, FlockReq, Reply, Request};
use std::collections::HashMap;

/// A lock request as the MDT takes it: used as is by callers (FUSE, the native API).
pub type FlockArgs = FlockReq;
use std::time::Duration;

/// First and longest pause between tries of a waiting lock without a callback channel.
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(100);
/// How often a waiting lock asks whether its caller was interrupted.
const INTERRUPT_POLL: Duration = Duration::from_millis(20);

/// The file locks a client holds, kept as the MDT keeps them (the same range
/// arithmetic), so that they can be taken again when the MDT restarts.
#[derive(Default)]
pub(crate) struct HeldFlocks {
    by_owner: HashMap<(Fid, u64), Vec<RangeLock<()>>>,
    /// `forgotten + evictions` when these were last known good: a change means the MDT
    /// dropped every lock of this client, and so must this.
    seen: u64,
}

impl HeldFlocks {
    /// Records a granted lock or unlock of `a`.
    fn apply(&mut self, a: &FlockArgs) {
        let key = (a.fid, a.owner);
        if a.typ == libc::F_UNLCK as u32 {
            if let Some(v) = self.by_owner.get_mut(&key) {
                lode_base::flock::remove_range(v, (), a.start, a.end);
                if v.is_empty() {
                    self.by_owner.remove(&key);
                }
            }
            return;
        }
        let l = RangeLock {
            owner: (),
            pid: a.pid,
            write: a.typ == libc::F_WRLCK as u32,
            start: a.start,
            end: a.end,
        };
        lode_base::flock::set(self.by_owner.entry(key).or_default(), l);
    }

    /// Forgets every lock if the MDT did since `seen`.
    fn check(&mut self, lost: u64) {
        if lost != self.seen {
            self.by_owner.clear();
            self.seen = lost;
        }
    }
}

impl Client {
    /// How many times the MDT dropped every lock of this client (it evicted it, or
    /// restarted and recovered without it).
    fn flocks_lost(&self) -> u64 {
        self.mdc.forgotten() + self.evictions()
    }

    /// Takes (or with `F_UNLCK` drops) a file lock; with `a.wait`, until it is granted
    /// (`EDEADLK` if waiting would deadlock), else `EAGAIN` on a conflict.
    pub async fn flock(&self, a: &FlockArgs) -> Result<(), Errno> {
        self.flock_interruptible(a, &|| false).await
    }

    /// [`Client::flock`], with a wait that `interrupted` can end: it is asked every
    /// 20 ms while the lock is awaited, and once it says so the wait is
    /// cancelled on the MDT (the owner's held locks stay) and the call returns `EINTR`,
    /// unless the grant came first.
    pub async fn flock_interruptible(
        &self,
        a: &FlockArgs,
        interrupted: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), Errno> {
        let lost = self.flocks_lost();
        let r = self.flock_inner(a, interrupted).await;
        let mut held = self.locks.flock_held.lock();
        held.check(lost);
        if r.is_ok() {
            held.apply(a);
        }
        r
    }

    /// The lock requests that take again, in recovery, every file lock this client
    /// holds.
    pub(crate) fn flock_replays(&self) -> Vec<(lode_proto::Opcode, Vec<u8>)> {
        let mut held = self.locks.flock_held.lock();
        held.check(self.flocks_lost());
        let mut out = Vec::new();
        for (&(fid, owner), v) in &held.by_owner {
            for l in v {
                let req = Request::Flock(FlockReq {
                    fid,
                    owner,
                    pid: l.pid,
                    typ: if l.write {
                        libc::F_WRLCK
                    } else {
                        libc::F_RDLCK
                    } as u32,
                    start: l.start,
                    end: l.end,
                    wait: false,
                    test: false,
                });
                out.push((lode_proto::Opcode::Flock, req.encode()));
            }
        }
        out
    }

    async fn flock_inner(
        &self,
        a: &FlockArgs,
        interrupted: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), Errno> {
        if !a.wait || a.typ == libc::F_UNLCK as u32 {
            return self.flock_once(a, false).await.map(|_| ());
        }
        if !self.callback_channel_up() {
            return self.flock_poll(a, interrupted).await;
        }
        loop {
            let lost = self.flocks_lost();
            let mut rx = {
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.locks.flock_waits.lock().insert((a.fid, a.owner), tx);
                rx
            };
            let queued = self.flock_once(a, true).await;
            return match queued {
                Ok(true) => match self.await_grant(a, &mut rx, interrupted).await {
                    Ok(true) => Ok(()),
                    // Cancelled because interrupted.
                    Ok(false) if interrupted() => Err(Errno::EINTR),
                    // Its owner unlocked meanwhile (another thread, or a close): a
                    // POSIX wait goes on.
                    Ok(false) => continue,
                    // The callback channel went (the MDT restarted, or the connection
                    // broke) but the MDT kept this client: wait again, unless the
                    // caller gave up meanwhile.
                    Err(_) if interrupted() => Err(Errno::EINTR),
                    Err(_) if self.flocks_lost() == lost => {
                        if !self.callback_channel_up() {
                            return self.flock_poll(a, interrupted).await;
                        }
                        continue;
                    }
                    // Evicted: the wait is lost.
                    Err(_) => Err(Errno::EIO),
                },
                other => {
                    self.locks.flock_waits.lock().remove(&(a.fid, a.owner));
                    other.map(|_| ())
                }
            };
        }
    }

    /// Whether `owner` may hold locks on `fid` (it took one and has not dropped all
    /// its locks on the file since): a close needs to drop them only then.
    pub fn flock_may_hold(&self, fid: Fid, owner: u64) -> bool {
        self.locks
            .flock_held
            .lock()
            .by_owner
            .contains_key(&(fid, owner))
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

    /// The MDT's answer to a queued wait (`true`: granted). Once `interrupted`, the
    /// wait is cancelled on the MDT, which then answers it (not granted, or granted
    /// if the grant won the race).
    async fn await_grant(
        &self,
        a: &FlockArgs,
        rx: &mut tokio::sync::oneshot::Receiver<bool>,
        interrupted: &(dyn Fn() -> bool + Sync),
    ) -> Result<bool, tokio::sync::oneshot::error::RecvError> {
        loop {
            tokio::select! {
                r = &mut *rx => return r,
                () = tokio::time::sleep(INTERRUPT_POLL) => {
                    if !interrupted() {
                        continue;
                    }
                    let cancel = FlockReq {
                        typ: libc::F_UNLCK as u32,
                        wait: true,
                        test: false,
                        ..a.clone()
                    };
                    match self.md(Request::Flock(cancel)).await {
                        Ok(_) => return rx.await,
                        // Asked again at the next tick, while the caller still waits
                        // for nothing else.
                        Err(e) => tracing::warn!(fid = %a.fid, "cancelling an interrupted lock wait failed: {e}"),
                    }
                }
            }
        }
    }

    /// A waiting lock without a callback channel: tries again until granted or
    /// `interrupted`.
    async fn flock_poll(
        &self,
        a: &FlockArgs,
        interrupted: &(dyn Fn() -> bool + Sync),
    ) -> Result<(), Errno> {
        let mut pause = POLL_FIRST;
        loop {
            match self.flock_once(a, false).await {
                Err(Errno::EAGAIN) if interrupted() => return Err(Errno::EINTR),
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
