//! Replay recovery (Lustre's target recovery): after a restart a target (the MDT, an
//! OST) waits for the
//! clients that were connected when it stopped, executes the changes they replay in
//! the order of their original transnos, across clients, and only then serves anything
//! else.
//!
//! A client replays what it was answered and the target had not committed; its replays
//! arrive in transno order on its connection, followed by a PING flagged
//! `FLAG_REPLAY_DONE`. The next replay to run is the one with the next transno; if no
//! client holds it (a change whose reply never arrived, resent later as new work), the
//! lowest queued one runs once every expected client has either finished or queued a
//! replay, so nothing lower can still come. Clients that do not come back within
//! `recovery_time_soft` are evicted and recovery goes on without them; after
//! `recovery_time_hard` it ends whatever is missing.
//!
//! This module is the bookkeeping and the decisions, generic over what a queued replay
//! is, so the order can be tested without sockets; the MDT's `target` and the OSS run
//! them.

use crate::server::Deferred;
use crate::Incoming;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// What recovery does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<Q> {
    /// Execute this replay.
    Run(Q),
    /// Answer this replay as done: its change is already in the store.
    Done(Q),
    /// Nothing can run yet: wait for more replays or clients.
    Wait,
    /// These clients (slot, uuid) did not come back in time: evicted, and recovery
    /// goes on without them.
    Evict(Vec<(u32, String)>),
    /// Recovery is over; these clients never finished and are evicted.
    End(Vec<(u32, String)>),
}

/// A target's recovery: its state, and the requests other than replays that arrived
/// during it, served once it ends.
pub struct Recovery<Q> {
    /// The bookkeeping.
    pub st: RecState<Q>,
    /// Requests held until the end, each with its promise of a reply.
    pub held: Vec<(Incoming, Deferred)>,
}

/// What is left to do when recovery ends.
pub struct Ended<Q> {
    /// Replays still queued: never run (answered ESTALE).
    pub left: Vec<Q>,
    /// Requests held: served now.
    pub held: Vec<(Incoming, Deferred)>,
    /// For the "recovery over" log line.
    pub duration: Duration,
    /// Replays executed.
    pub replayed: u64,
    /// Transnos no client replayed that recovery went past.
    pub gaps: u64,
    /// Clients evicted.
    pub evicted: u64,
}

impl<Q> Recovery<Q> {
    /// Recovery over `st`, nothing held yet.
    pub fn new(st: RecState<Q>) -> Recovery<Q> {
        Recovery {
            st,
            held: Vec::new(),
        }
    }

    /// Takes what is left once [`Next::End`] said recovery is over.
    pub fn end(&mut self) -> Ended<Q> {
        Ended {
            left: self.st.drain(),
            held: std::mem::take(&mut self.held),
            duration: self.st.duration.unwrap_or_default(),
            replayed: self.st.replayed,
            gaps: self.st.gaps,
            evicted: self.st.evicted,
        }
    }
}

/// The state of one recovery.
pub struct RecState<Q> {
    /// False once recovery is over (or if there was nothing to recover).
    pub active: bool,
    /// When the target started.
    pub start: Instant,
    /// How long recovery took, once over.
    pub duration: Option<Duration>,
    /// Clients connected when the target stopped (slot → UUID): the ones waited for.
    pub expected: HashMap<u32, String>,
    /// Expected clients that reconnected.
    pub connected: HashSet<u32>,
    /// Expected clients that sent every replay they had.
    pub done: HashSet<u32>,
    /// Replays waiting for their turn: transno → (slot, xid, item).
    queue: BTreeMap<u64, (u32, u64, Q)>,
    /// Queued replays per client.
    queued: HashMap<u32, usize>,
    /// Highest transno in the store when the target started: replays at or below it
    /// are already there.
    pub durable: u64,
    /// Highest transno executed (or durable).
    pub last: u64,
    /// Replays executed in this recovery (slot, xid): a client that reconnects during
    /// recovery sends them again.
    executed: HashSet<(u32, u64)>,
    /// Replays executed.
    pub replayed: u64,
    /// File locks clients held again.
    pub locks_replayed: u64,
    /// Replays refused by version-based recovery.
    pub version_mismatches: u64,
    /// Transnos no client replayed that recovery went past.
    pub gaps: u64,
    /// Clients evicted at the end.
    pub evicted: u64,
    /// One replay executes at a time.
    pub running: bool,
    /// Expected clients the administrator evicted: not waited for any longer.
    given_up: HashSet<u32>,
}

impl<Q> RecState<Q> {
    /// Recovery waiting for `expected`, over a store whose last transno is `durable`.
    /// Inactive when nobody is expected.
    pub fn new(expected: HashMap<u32, String>, durable: u64, start: Instant) -> RecState<Q> {
        RecState {
            active: !expected.is_empty(),
            start,
            duration: expected.is_empty().then_some(Duration::ZERO),
            expected,
            connected: HashSet::new(),
            done: HashSet::new(),
            queue: BTreeMap::new(),
            queued: HashMap::new(),
            durable,
            last: durable,
            executed: HashSet::new(),
            replayed: 0,
            locks_replayed: 0,
            version_mismatches: 0,
            gaps: 0,
            evicted: 0,
            running: false,
            given_up: HashSet::new(),
        }
    }

    /// Whether `slot` is one recovery waits for.
    pub fn expects(&self, slot: u32) -> bool {
        self.expected.contains_key(&slot)
    }

    /// Queues a replay. A replay already queued under the same transno (a client that
    /// reconnected and sent it again) replaces it: `Some` is the one replaced, to be
    /// dropped unanswered.
    pub fn queue(&mut self, slot: u32, xid: u64, transno: u64, q: Q) -> Option<Q> {
        let old = self.queue.insert(transno, (slot, xid, q));
        match old {
            Some((s, _, q)) => {
                self.dec(s);
                *self.queued.entry(slot).or_default() += 1;
                Some(q)
            }
            None => {
                *self.queued.entry(slot).or_default() += 1;
                None
            }
        }
    }

    fn dec(&mut self, slot: u32) {
        if let Some(n) = self.queued.get_mut(&slot) {
            *n -= 1;
            if *n == 0 {
                self.queued.remove(&slot);
            }
        }
    }

    /// Records that a replay ran (or was answered as done).
    pub fn ran(&mut self, slot: u32, xid: u64, transno: u64) {
        self.executed.insert((slot, xid));
        self.last = self.last.max(transno);
    }

    /// What to do next at `now`, given the windows.
    pub fn next(&mut self, now: Instant, soft: Duration, hard: Duration) -> Next<Q> {
        if !self.active || self.running {
            return Next::Wait;
        }
        let elapsed = now.saturating_duration_since(self.start);
        // Past the soft window, clients that never came back are not waited for; past
        // the hard one, nobody still replaying is.
        for past_hard in [false, true] {
            let (window, waited) = if past_hard {
                (hard, &self.done)
            } else {
                (soft, &self.connected)
            };
            let gone: Vec<u32> = self
                .expected
                .keys()
                .filter(|s| (elapsed >= window && !waited.contains(s)) || self.given_up.contains(s))
                .copied()
                .collect();
            if !gone.is_empty() {
                return self.end_or_drop(gone);
            }
        }
        let Some((&t, &(slot, xid, _))) = self.queue.first_key_value() else {
            if self.expected.keys().all(|s| self.done.contains(s)) {
                return self.finish(Vec::new());
            }
            return Next::Wait;
        };
        let settled = self
            .expected
            .keys()
            .all(|s| self.done.contains(s) || self.queued.contains_key(s));
        let already = t <= self.durable || self.executed.contains(&(slot, xid));
        if !already && t != self.last + 1 && !settled {
            return Next::Wait;
        }
        if !already && t > self.last + 1 {
            self.gaps += 1;
        }
        let (_, (slot, _, q)) = self.queue.pop_first().expect("the queue is not empty");
        self.dec(slot);
        if already {
            Next::Done(q)
        } else {
            self.running = true;
            Next::Run(q)
        }
    }

    /// Stops waiting for `gone`: evicted now, and recovery ends if they were the last
    /// ones it waited for; else it goes on without them.
    fn end_or_drop(&mut self, gone: Vec<u32>) -> Next<Q> {
        let evicted: Vec<(u32, String)> = gone
            .into_iter()
            .filter_map(|s| self.expected.remove(&s).map(|u| (s, u)))
            .collect();
        self.evicted += evicted.len() as u64;
        if self.expected.is_empty()
            || (self.queue.is_empty() && self.expected.keys().all(|s| self.done.contains(s)))
        {
            return self.finish(evicted);
        }
        Next::Evict(evicted)
    }

    fn finish(&mut self, evicted: Vec<(u32, String)>) -> Next<Q> {
        self.active = false;
        self.duration = Some(self.start.elapsed());
        Next::End(evicted)
    }

    /// Stops waiting for `slot` (an administrator evicted it, e.g. `lode up` for a
    /// mount of its own that died with the servers): recovery goes on, or ends,
    /// without it at the next step.
    pub fn give_up_on(&mut self, slot: u32) {
        if self.expected.contains_key(&slot) {
            self.given_up.insert(slot);
        }
    }

    /// Replays queued now.
    pub fn queued_len(&self) -> usize {
        self.queue.len()
    }

    /// `recovery_status` in Lustre's format, with the windows in seconds.
    pub fn status(&self, soft: u64, hard: u64) -> String {
        let start = std::time::SystemTime::now()
            .checked_sub(self.start.elapsed())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let total = self.expected.len() as u64 + self.evicted;
        if self.active {
            let left = if self.connected.len() < self.expected.len() {
                soft
            } else {
                hard
            }
            .saturating_sub(self.start.elapsed().as_secs());
            format!(
                "status: RECOVERING\nrecovery_start: {start}\ntime_remaining: {left}\nconnected_clients: {}/{total}\nreq_replay_clients: {}\ncompleted_clients: {}\nevicted_clients: {}\nreplayed_requests: {}\nreplayed_locks: {}\nqueued_requests: {}\nnext_transno: {}\n",
                self.connected.len(),
                self.connected.len().saturating_sub(self.done.len()),
                self.done.len(),
                self.evicted,
                self.replayed,
                self.locks_replayed,
                self.queued_len(),
                self.last + 1,
            )
        } else {
            format!(
                "status: COMPLETE\nrecovery_start: {start}\nrecovery_duration: {}\ncompleted_clients: {}/{total}\nreplayed_requests: {}\nreplayed_locks: {}\nlast_transno: {}\nVBR: ENABLED\nvbr_gaps: {}\nvbr_refused: {}\nIR: DISABLED\n",
                self.duration.unwrap_or_default().as_secs(),
                self.done.len(),
                self.replayed,
                self.locks_replayed,
                self.last,
                self.gaps,
                self.version_mismatches,
            )
        }
    }

    /// Takes the replays still queued (recovery ended without running them).
    pub fn drain(&mut self) -> Vec<Q> {
        self.queued.clear();
        std::mem::take(&mut self.queue)
            .into_values()
            .map(|(_, _, q)| q)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOFT: Duration = Duration::from_secs(30);
    const HARD: Duration = Duration::from_secs(90);

    fn two_clients(durable: u64) -> (RecState<u64>, Instant) {
        let t0 = Instant::now();
        let expected = HashMap::from([(1, "a".to_string()), (2, "b".to_string())]);
        let mut r = RecState::new(expected, durable, t0);
        r.connected.extend([1, 2]);
        (r, t0)
    }

    /// Runs what can run now, returning the transnos in the order they ran.
    fn run_all(r: &mut RecState<u64>, now: Instant) -> Vec<u64> {
        let mut ran = Vec::new();
        loop {
            match r.next(now, SOFT, HARD) {
                Next::Run(t) | Next::Done(t) => {
                    r.running = false;
                    r.ran(0, t, t);
                    ran.push(t);
                }
                _ => return ran,
            }
        }
    }

    #[test]
    fn replays_run_in_transno_order_across_clients() {
        let (mut r, t0) = two_clients(1);
        r.queue(1, 20, 2, 2);
        r.queue(1, 40, 4, 4);
        r.done.insert(1);
        // 3 is the other client's and it has not sent anything yet: only 2 may run.
        assert_eq!(run_all(&mut r, t0), vec![2]);
        r.queue(2, 30, 3, 3);
        r.queue(2, 50, 5, 5);
        assert_eq!(run_all(&mut r, t0), vec![3, 4, 5]);
        assert!(r.active, "the second client has not said it is done");
        r.done.insert(2);
        assert_eq!(r.next(t0, SOFT, HARD), Next::End(vec![]));
        assert!(!r.active);
        assert_eq!(r.gaps, 0);
    }

    #[test]
    fn a_transno_nobody_holds_is_passed_once_every_client_has_spoken() {
        let (mut r, t0) = two_clients(1);
        r.queue(1, 30, 3, 3);
        // Transno 2 is missing (its reply never arrived; it will be resent as new work).
        assert_eq!(run_all(&mut r, t0), vec![]);
        r.queue(2, 40, 4, 4);
        assert_eq!(run_all(&mut r, t0), vec![3, 4]);
        assert_eq!(r.gaps, 1);
        r.done.extend([1, 2]);
        assert_eq!(r.next(t0, SOFT, HARD), Next::End(vec![]));
    }

    #[test]
    fn a_client_that_never_returns_is_evicted_at_the_soft_window() {
        let t0 = Instant::now();
        let expected = HashMap::from([(1, "a".to_string()), (2, "b".to_string())]);
        let mut r: RecState<u64> = RecState::new(expected, 1, t0);
        r.connected.insert(1);
        r.queue(1, 20, 2, 2);
        r.queue(1, 40, 4, 4);
        r.done.insert(1);
        assert_eq!(run_all(&mut r, t0), vec![2]);
        assert_eq!(r.next(t0 + SOFT / 2, SOFT, HARD), Next::Wait);
        assert_eq!(
            r.next(t0 + SOFT, SOFT, HARD),
            Next::Evict(vec![(2, "b".to_string())])
        );
        // Without the evicted client, 4 runs past the gap, then recovery ends.
        assert_eq!(run_all(&mut r, t0 + SOFT), vec![4]);
        assert!(!r.active, "ended once the only client left was done");
        assert_eq!(r.evicted, 1);
    }

    #[test]
    fn a_client_still_replaying_at_the_hard_window_is_evicted() {
        let (mut r, t0) = two_clients(1);
        r.queue(1, 20, 2, 2);
        r.done.insert(1);
        assert_eq!(run_all(&mut r, t0), vec![2]);
        // Client 2 connected and sent nothing more.
        assert_eq!(r.next(t0 + SOFT, SOFT, HARD), Next::Wait);
        assert_eq!(
            r.next(t0 + HARD, SOFT, HARD),
            Next::End(vec![(2, "b".to_string())])
        );
    }

    #[test]
    fn replays_already_in_the_store_or_already_run_are_answered_not_run() {
        let (mut r, t0) = two_clients(5);
        r.queue(1, 40, 4, 4);
        assert_eq!(r.next(t0, SOFT, HARD), Next::Done(4));
        r.queue(1, 60, 6, 6);
        assert_eq!(r.next(t0, SOFT, HARD), Next::Run(6));
        r.running = false;
        r.ran(1, 60, 6);
        // Sent again after a reconnect during recovery.
        r.queue(1, 60, 6, 6);
        assert_eq!(r.next(t0, SOFT, HARD), Next::Done(6));
    }

    #[test]
    fn nothing_to_wait_for_means_no_recovery() {
        let r: RecState<u64> = RecState::new(HashMap::new(), 9, Instant::now());
        assert!(!r.active);
    }
}
