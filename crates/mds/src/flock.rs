//! File locks (`fcntl` POSIX record locks and BSD `flock`), kept by the MDT for every
//! client of a file, as Lustre's LDLM_FLOCK locks are: byte ranges, shared or
//! exclusive, owned by a (client, owner) pair, split and replaced by their owner's later
//! requests as POSIX says. A request that conflicts either fails at once (`EAGAIN`) or
//! waits in its file's queue; the grant then goes to the waiting client on its callback
//! channel. A wait that would close a cycle of owners waiting for each other, across
//! clients and files, is refused with `EDEADLK`. A client that goes (disconnect,
//! eviction) loses its locks and waits, and the waiters behind them are granted.

use lode_base::flock::RangeLock;
use lode_base::{Errno, Fid};
use lode_proto::{FlockDesc, FlockRep, FlockReq};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};

/// Most file locks (held and waited for) one client may have on one MDT.
pub const FLOCKS_PER_CLIENT_MAX: usize = 1 << 16;

const RD: u32 = libc::F_RDLCK as u32;
const WR: u32 = libc::F_WRLCK as u32;
const UN: u32 = libc::F_UNLCK as u32;

/// Who holds a lock: a client and its owner id there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Owner {
    slot: u32,
    id: u64,
}

/// A held lock, or a wait for one.
type Lk = RangeLock<Owner>;

fn desc(l: &Lk) -> FlockDesc {
    FlockDesc {
        typ: if l.write { WR } else { RD },
        start: l.start,
        end: l.end,
        pid: l.pid,
    }
}

#[derive(Default)]
struct FileLocks {
    granted: Vec<Lk>,
    waiting: VecDeque<Lk>,
}

impl FileLocks {
    fn remove_range(&mut self, owner: Owner, start: u64, end: u64) {
        lode_base::flock::remove_range(&mut self.granted, owner, start, end);
    }

    fn set(&mut self, l: Lk) {
        lode_base::flock::set(&mut self.granted, l);
    }

    fn blockers(&self, want: &Lk) -> impl Iterator<Item = &Lk> + '_ {
        let want = *want;
        self.granted.iter().filter(move |g| g.conflicts(&want))
    }

    /// The lock `F_GETLK` reports for `want`, as Linux (and Lustre's flock) find it:
    /// the first owner in the way, its conflicting lock that starts first (each
    /// owner's locks are kept sorted by start there).
    fn first_blocker(&self, want: &Lk) -> Option<&Lk> {
        let owner = self.blockers(want).next()?.owner;
        self.blockers(want)
            .filter(|l| l.owner == owner)
            .min_by_key(|l| l.start)
    }
}

/// A waiting client to tell: its wait on `fid` for `owner` ended, granted or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The client.
    pub slot: u32,
    /// The file.
    pub fid: Fid,
    /// Its owner id on the client.
    pub owner: u64,
    /// Granted (else cancelled).
    pub granted: bool,
}

/// The file locks of one MDT.
#[derive(Default)]
pub struct Flocks {
    files: Mutex<HashMap<Fid, FileLocks>>,
}

impl Flocks {
    /// Takes, tests or drops a lock for client `slot`. A waiting request is queued
    /// only if `can_wait` (the client can be called back); else a conflict is `EAGAIN`.
    /// Returns the reply and the waiters that this request's unlock ended.
    pub fn request(
        &self,
        slot: u32,
        r: &FlockReq,
        can_wait: bool,
    ) -> Result<(FlockRep, Vec<Grant>), Errno> {
        if r.start > r.end || !matches!(r.typ, RD | WR | UN) {
            return Err(Errno::EINVAL);
        }
        let owner = Owner { slot, id: r.owner };
        let lk = Lk {
            owner,
            pid: r.pid,
            write: r.typ == WR,
            start: r.start,
            end: r.end,
        };
        let mut files = self.files.lock();
        let rep = |granted, queued, conflict| FlockRep {
            granted,
            queued,
            conflict,
        };
        if r.test {
            let conflict = (r.typ != UN)
                .then(|| files.get(&r.fid)?.first_blocker(&lk).map(desc))
                .flatten();
            return Ok((rep(false, false, conflict), Vec::new()));
        }
        if r.typ == UN {
            let mut grants = Vec::new();
            if let Some(f) = files.get_mut(&r.fid) {
                // `wait` on an unlock cancels only the owner's wait (an interrupted
                // F_SETLKW): the locks it holds stay, as after a local wait a signal
                // ended.
                if !r.wait {
                    f.remove_range(owner, r.start, r.end);
                }
                // Its waits on this file end too (a process that unlocks no longer
                // waits: it was interrupted, or is closing the file).
                f.waiting.retain(|w| {
                    let mine = w.owner == owner;
                    if mine {
                        grants.push(Grant {
                            slot,
                            fid: r.fid,
                            owner: r.owner,
                            granted: false,
                        });
                    }
                    !mine
                });
            }
            grants.extend(reprocess(&mut files, r.fid));
            return Ok((rep(true, false, None), grants));
        }
        if owned_by(&files, slot) >= FLOCKS_PER_CLIENT_MAX {
            return Err(Errno::ENOLCK);
        }
        let f = files.entry(r.fid).or_default();
        // A resent or repeated wait replaces the earlier one.
        f.waiting.retain(|w| w.owner != owner);
        if f.blockers(&lk).next().is_none() {
            f.set(lk);
            return Ok((rep(true, false, None), Vec::new()));
        }
        if !r.wait || !can_wait {
            prune(&mut files, r.fid);
            return Err(Errno::EAGAIN);
        }
        if would_deadlock(&files, r.fid, &lk) {
            prune(&mut files, r.fid);
            return Err(Errno::EDEADLK);
        }
        files.entry(r.fid).or_default().waiting.push_back(lk);
        Ok((rep(false, true, None), Vec::new()))
    }

    /// A lock client `slot` held before this MDT restarted, replayed in recovery: set
    /// as it was, as Lustre grants a replayed lock without a conflict check (every
    /// client replays only what it was granted, so together they cannot conflict; if
    /// they do, some client's view was stale, and it is logged). Returns whether it
    /// conflicted.
    pub fn replay(&self, slot: u32, r: &FlockReq) -> Result<bool, Errno> {
        if r.start > r.end || !matches!(r.typ, RD | WR) || r.test {
            return Err(Errno::EINVAL);
        }
        let lk = Lk {
            owner: Owner { slot, id: r.owner },
            pid: r.pid,
            write: r.typ == WR,
            start: r.start,
            end: r.end,
        };
        let mut files = self.files.lock();
        if owned_by(&files, slot) >= FLOCKS_PER_CLIENT_MAX {
            return Err(Errno::ENOLCK);
        }
        let f = files.entry(r.fid).or_default();
        let conflict = f.blockers(&lk).next().is_some();
        f.set(lk);
        Ok(conflict)
    }

    /// Drops every lock and wait of client `slot`; returns the grants that frees.
    pub fn drop_client(&self, slot: u32) -> Vec<Grant> {
        let mut files = self.files.lock();
        let touched: Vec<Fid> = files
            .iter_mut()
            .filter_map(|(fid, f)| {
                let before = f.granted.len() + f.waiting.len();
                f.granted.retain(|l| l.owner.slot != slot);
                f.waiting.retain(|l| l.owner.slot != slot);
                (f.granted.len() + f.waiting.len() != before).then_some(*fid)
            })
            .collect();
        touched
            .into_iter()
            .flat_map(|fid| reprocess(&mut files, fid))
            .collect()
    }

    /// Ends the waits of client `slot` (its callback channel is gone, so no grant can
    /// reach it); its held locks stay.
    pub fn drop_waits(&self, slot: u32) {
        let mut files = self.files.lock();
        let fids: Vec<Fid> = files.keys().copied().collect();
        for fid in fids {
            if let Some(f) = files.get_mut(&fid) {
                f.waiting.retain(|l| l.owner.slot != slot);
            }
            prune(&mut files, fid);
        }
    }

    /// Locks held now (for `lock_count`-style statistics and tests).
    pub fn held(&self) -> usize {
        self.files.lock().values().map(|f| f.granted.len()).sum()
    }
}

fn owned_by(files: &HashMap<Fid, FileLocks>, slot: u32) -> usize {
    files
        .values()
        .flat_map(|f| f.granted.iter().chain(f.waiting.iter()))
        .filter(|l| l.owner.slot == slot)
        .count()
}

/// Grants, in order, the waiters of `fid` that nothing blocks now.
fn reprocess(files: &mut HashMap<Fid, FileLocks>, fid: Fid) -> Vec<Grant> {
    let mut grants = Vec::new();
    if let Some(f) = files.get_mut(&fid) {
        let mut still = VecDeque::with_capacity(f.waiting.len());
        while let Some(w) = f.waiting.pop_front() {
            // An earlier waiter still queued keeps its place against a later one.
            let behind = still.iter().any(|e: &Lk| e.conflicts(&w));
            if !behind && f.blockers(&w).next().is_none() {
                f.set(w);
                grants.push(Grant {
                    slot: w.owner.slot,
                    fid,
                    owner: w.owner.id,
                    granted: true,
                });
            } else {
                still.push_back(w);
            }
        }
        f.waiting = still;
    }
    prune(files, fid);
    grants
}

fn prune(files: &mut HashMap<Fid, FileLocks>, fid: Fid) {
    if files
        .get(&fid)
        .is_some_and(|f| f.granted.is_empty() && f.waiting.is_empty())
    {
        files.remove(&fid);
    }
}

/// Whether `want`'s owner waiting on `fid` closes a cycle: some owner it would wait
/// for waits, directly or through others, for it.
fn would_deadlock(files: &HashMap<Fid, FileLocks>, fid: Fid, want: &Lk) -> bool {
    let me = want.owner;
    let mut todo: Vec<Owner> = files
        .get(&fid)
        .map(|f| f.blockers(want).map(|l| l.owner).collect())
        .unwrap_or_default();
    let mut seen = HashSet::new();
    while let Some(o) = todo.pop() {
        if o == me {
            return true;
        }
        if !seen.insert(o) {
            continue;
        }
        for f in files.values() {
            for w in f.waiting.iter().filter(|w| w.owner == o) {
                todo.extend(f.blockers(w).map(|l| l.owner));
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fid(n: u32) -> Fid {
        Fid {
            seq: 0x2_0000_0400,
            oid: n,
            ver: 0,
        }
    }

    fn req(f: u32, owner: u64, typ: u32, start: u64, end: u64, wait: bool) -> FlockReq {
        FlockReq {
            fid: fid(f),
            owner,
            pid: owner as u32,
            typ,
            start,
            end,
            wait,
            test: false,
        }
    }

    #[test]
    fn shared_locks_share_and_exclusive_ones_conflict() {
        let l = Flocks::default();
        assert!(l.request(1, &req(1, 1, RD, 0, 99, false), true).is_ok());
        assert!(l.request(2, &req(1, 2, RD, 50, 60, false), true).is_ok());
        assert_eq!(
            l.request(2, &req(1, 3, WR, 0, 0, false), true).err(),
            Some(Errno::EAGAIN)
        );
        // Past the ranges held: free.
        assert!(l.request(2, &req(1, 3, WR, 100, 200, false), true).is_ok());
        let mut t = req(1, 9, WR, 55, 55, false);
        t.test = true;
        let (rep, _) = l.request(3, &t, true).expect("test");
        assert_eq!(rep.conflict.map(|c| c.typ), Some(RD));
    }

    #[test]
    fn an_unlock_splits_the_owners_range_and_grants_the_waiter() {
        let l = Flocks::default();
        l.request(1, &req(1, 1, WR, 0, 99, false), true)
            .expect("lock");
        l.request(1, &req(1, 1, UN, 40, 59, false), true)
            .expect("unlock middle");
        // The middle is free, the ends are not.
        assert!(l.request(2, &req(1, 2, WR, 40, 59, false), true).is_ok());
        assert_eq!(
            l.request(2, &req(1, 2, WR, 30, 30, false), true).err(),
            Some(Errno::EAGAIN)
        );
        let (rep, _) = l
            .request(2, &req(1, 2, WR, 0, 10, true), true)
            .expect("queued");
        assert!(rep.queued);
        let (_, grants) = l
            .request(1, &req(1, 1, UN, 0, u64::MAX, false), true)
            .expect("unlock all");
        assert_eq!(
            grants,
            [Grant {
                slot: 2,
                fid: fid(1),
                owner: 2,
                granted: true
            }]
        );
    }

    #[test]
    fn a_cancelled_wait_ends_alone_and_the_owners_locks_stay() {
        let l = Flocks::default();
        l.request(1, &req(1, 1, WR, 0, 9, false), true)
            .expect("A holds 0-9");
        l.request(2, &req(1, 2, WR, 20, 29, false), true)
            .expect("B holds 20-29");
        let (rep, _) = l
            .request(2, &req(1, 2, WR, 0, 9, true), true)
            .expect("B waits for 0-9");
        assert!(rep.queued);
        // B is interrupted: its wait ends, answered "not granted"...
        let (_, grants) = l
            .request(2, &req(1, 2, UN, 0, u64::MAX, true), true)
            .expect("cancel");
        assert_eq!(
            grants,
            [Grant {
                slot: 2,
                fid: fid(1),
                owner: 2,
                granted: false
            }]
        );
        // ...but B still holds 20-29, and A's unlock grants nobody.
        assert_eq!(
            l.request(3, &req(1, 3, RD, 25, 25, false), true).err(),
            Some(Errno::EAGAIN)
        );
        let (_, grants) = l
            .request(1, &req(1, 1, UN, 0, u64::MAX, false), true)
            .expect("unlock");
        assert!(grants.is_empty());
        assert_eq!(l.held(), 1);
    }

    #[test]
    fn a_cycle_of_waits_across_clients_and_files_is_edeadlk() {
        let l = Flocks::default();
        l.request(1, &req(1, 1, WR, 0, 0, false), true)
            .expect("A holds f1");
        l.request(2, &req(2, 2, WR, 0, 0, false), true)
            .expect("B holds f2");
        let (rep, _) = l
            .request(1, &req(2, 1, WR, 0, 0, true), true)
            .expect("A waits for f2");
        assert!(rep.queued);
        assert_eq!(
            l.request(2, &req(1, 2, WR, 0, 0, true), true).err(),
            Some(Errno::EDEADLK)
        );
    }

    #[test]
    fn a_departed_client_frees_its_locks_for_the_waiters() {
        let l = Flocks::default();
        l.request(1, &req(1, 1, WR, 0, 9, false), true)
            .expect("lock");
        l.request(2, &req(1, 2, RD, 0, 9, true), true)
            .expect("wait");
        // A client that cannot be called back does not wait.
        assert_eq!(
            l.request(3, &req(1, 3, RD, 0, 9, true), false).err(),
            Some(Errno::EAGAIN)
        );
        let grants = l.drop_client(1);
        assert_eq!(grants.len(), 1);
        assert_eq!((grants[0].slot, grants[0].granted), (2, true));
        assert_eq!(l.held(), 1);
        assert!(l.drop_client(2).is_empty());
        assert_eq!(l.held(), 0);
        assert!(l.files.lock().is_empty(), "nothing left behind");
    }

    #[test]
    fn replayed_locks_are_held_again_and_block_others() {
        let f = Flocks::default();
        assert_eq!(f.replay(1, &req(1, 7, WR, 0, 9, false)), Ok(false));
        assert_eq!(f.replay(2, &req(1, 8, RD, 20, 29, false)), Ok(false));
        assert_eq!(f.held(), 2);
        assert_eq!(
            f.request(3, &req(1, 9, RD, 5, 5, false), true)
                .map(|r| r.0.granted),
            Err(Errno::EAGAIN)
        );
        assert_eq!(f.replay(1, &req(1, 7, UN, 0, 9, false)), Err(Errno::EINVAL));
    }

    #[test]
    fn a_test_reports_the_first_conflicting_range_of_the_owner_in_the_way() {
        let fl = Flocks::default();
        // Taken out of order: a write lock in the middle, then a read lock before it.
        fl.request(1, &req(1, 7, WR, 10, 14, false), true).unwrap();
        fl.request(1, &req(1, 7, RD, 1, 5, false), true).unwrap();
        let test = |start, end| {
            let r = FlockReq {
                test: true,
                ..req(1, 8, WR, start, end, false)
            };
            fl.request(2, &r, true)
                .unwrap()
                .0
                .conflict
                .map(|c| (c.typ, c.start, c.end))
        };
        assert_eq!(
            test(0, u64::MAX),
            Some((RD, 1, 5)),
            "F_GETLK's answer on Linux"
        );
        assert_eq!(test(6, u64::MAX), Some((WR, 10, 14)));
        assert_eq!(test(15, u64::MAX), None);
    }

    #[test]
    fn bad_requests_are_refused() {
        let l = Flocks::default();
        assert_eq!(
            l.request(1, &req(1, 1, 7, 0, 9, false), true).err(),
            Some(Errno::EINVAL)
        );
        assert_eq!(
            l.request(1, &req(1, 1, RD, 9, 0, false), true).err(),
            Some(Errno::EINVAL)
        );
    }
}
