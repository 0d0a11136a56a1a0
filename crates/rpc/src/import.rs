//! The client side of one target connection (Lustre's import): xids, modify tags,
//! the in-flight limit, reconnect after a lost connection and resend of every request
//! still waiting for its reply (same xid, `RESENT` flag).
//!
//! Replies are read leader/follower, not by a reactor: the socket is registered with
//! the runtime for writability only. A call made by a thread inside
//! [`blocking_caller`] that has no other call outstanding reads the socket itself
//! while no one else does: it hands every other reply to its waiter and, once its own
//! has come, passes the reading to a waiting caller. So a lone caller is woken once per
//! call, by its own reply. Calls that cannot block their thread (tasks on the runtime,
//! calls joined with others) are served by the import's reader thread, which reads
//! only while such calls wait.
//!
//! Changes the target answered but has not committed are kept (the replay list, by
//! transno) until a reply says they are committed. If the target restarts, it asks at
//! CONNECT for them, and they are replayed in transno order (`FLAG_REPLAY`, original
//! xid, tag and transno) before anything else is sent.

use crate::auth::{Opener, Sealer, NONCE_LEN};
use crate::wire::{open_rest, read_frame, read_raw, read_sealed, FrameSink};
use lode_base::limits::{ACCESS_AHEAD_MAX, CLOSES_AHEAD_MAX, CLOSE_AHEAD_WAIT_MS};
use lode_base::Errno;
use lode_proto::frame::{
    check_len, FLAG_INTENT, FLAG_REPLAY, FLAG_REPLAY_DONE, FLAG_REPLY, FLAG_RESENT,
};
use lode_proto::{
    CloseAttrs, ConnectRep, ConnectReq, Empty, Frame, Header, Opcode, Reply, Request,
};
use parking_lot::{Condvar, Mutex};
use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

thread_local! {
    static BLOCKING: Cell<bool> = const { Cell::new(false) };
    /// Calls this thread has sent and waits for, on every import.
    static WAITING: Cell<usize> = const { Cell::new(0) };
}

/// Runs `f` with this thread marked as one that may block waiting for replies: a call
/// it makes (inside `f`, typically a `block_on`) while it has no other call outstanding
/// reads its reply on this thread instead of being woken by another. For threads that
/// run one operation at a time: while the call reads, nothing else in `f` runs.
pub fn blocking_caller<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BLOCKING.with(|b| b.set(self.0));
        }
    }
    let _restore = Restore(BLOCKING.with(|b| b.replace(true)));
    f()
}

/// Counts a call in [`WAITING`] for as long as it lives, on a blocking thread only (a
/// task may move between the runtime's threads; a `block_on` future never does).
struct Waiting(bool);

impl Waiting {
    fn enter() -> Waiting {
        let counted = BLOCKING.with(|b| b.get());
        if counted {
            WAITING.with(|w| w.set(w.get() + 1));
        }
        Waiting(counted)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.0 {
            WAITING.with(|w| w.set(w.get().saturating_sub(1)));
        }
    }
}

/// True if the call being polled may read for itself: a blocking thread with no other
/// call outstanding.
fn may_lead() -> bool {
    BLOCKING.with(|b| b.get()) && WAITING.with(|w| w.get()) == 1
}

/// Settings of one import.
#[derive(Clone, Debug)]
pub struct ImportConfig {
    /// File system name presented at CONNECT.
    pub fsname: String,
    /// Target name, e.g. `lode-MDT0000`.
    pub target: String,
    /// This client's UUID.
    pub client_uuid: String,
    /// Shared key (empty: none).
    pub key: Vec<u8>,
    /// `CONNECT_*` flags wanted.
    pub flags: u64,
    /// RPCs in flight at once (`max_rpcs_in_flight`).
    pub max_rpcs_in_flight: usize,
    /// Modify RPCs in flight at once (`max_mod_rpcs_in_flight`), ≤ the server's grant.
    pub max_mod_rpcs: u16,
    /// How long a request waits for a reply, across reconnects, before EIO (`timeout`).
    pub timeout: Duration,
    /// Resend (same xid, `RESENT`) a request still unanswered after this long; the
    /// server answers a resend of an executed modification from its reply record.
    pub resend_interval: Duration,
}

/// A reply: its header (transno, last_committed) and decoded body.
#[derive(Debug)]
pub struct Response {
    /// Reply header.
    pub header: Header,
    /// Reply body.
    pub reply: Reply,
}

struct Pending {
    opcode: u16,
    tag: u16,
    body: Arc<Vec<u8>>,
    /// Header flags it was sent with (kept on resends).
    flags: u16,
    tx: oneshot::Sender<Frame>,
    /// Its caller cannot read (a task, or a thread with several calls out).
    passive: bool,
    /// The tag of a modification whose caller gave up waiting: free once answered.
    held_tag: Option<TagGuard>,
    /// An open (caller and flags): held for replay while the file stays open.
    open: Option<(lode_base::Cred, u32)>,
    /// Its reply says how to replay it (see [`replay_body`]): kept with it.
    keep_reply: bool,
}

#[derive(Default)]
struct PendingMap {
    map: BTreeMap<u64, Pending>,
    /// Passive entries: the reader thread reads while there are any.
    n_passive: usize,
}

impl PendingMap {
    fn insert(&mut self, xid: u64, p: Pending) {
        self.n_passive += usize::from(p.passive);
        self.map.insert(xid, p);
    }

    fn remove(&mut self, xid: u64) -> Option<Pending> {
        let p = self.map.remove(&xid)?;
        self.n_passive -= usize::from(p.passive);
        Some(p)
    }

    /// Marks `xid`'s caller as one that cannot read; false if it is answered already.
    fn make_passive(&mut self, xid: u64) -> bool {
        match self.map.get_mut(&xid) {
            Some(p) if !p.passive => {
                p.passive = true;
                self.n_passive += 1;
                true
            }
            Some(_) => true,
            None => false,
        }
    }
}

/// Who reads the socket now.
#[derive(Default)]
struct Lead {
    /// Someone reads (a caller or the reader thread).
    leader: bool,
    /// Callers that may read, waiting while someone else does (xid, waker), oldest
    /// first.
    followers: VecDeque<(u64, Waker)>,
    /// The follower last woken to take over the reading, until it has looked.
    baton: Option<u64>,
    /// The reader thread should read.
    kick: bool,
}

/// One TCP connection to the target.
struct Conn {
    gen: u64,
    sock: Arc<AsyncFd<std::net::TcpStream>>,
    sink: Arc<FrameSink<AsyncFd<std::net::TcpStream>>>,
    /// Whether the reader spins before it sleeps.
    spin: Mutex<crate::spin::Spin>,
    /// Bytes read and not yet a whole frame; only the leader touches it.
    rd: Mutex<RdBuf>,
}

#[derive(Default)]
struct RdBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// A keyed connection's opener: every frame read is checked with it.
    opener: Option<Opener>,
}

struct ConnState {
    tx: Option<Arc<Conn>>,
    gen: u64,
    handle: u64,
    conn_cnt: u32,
    connecting: bool,
    refused: Option<Errno>,
    granted: Option<ConnectRep>,
}

/// The modify tags of an import (Lustre's mod RPC slots): at most `limit` modifications
/// in flight, plus one close beyond it so closes never wait behind opens. The limit can
/// change while tags are held; a tag is reused only once it is free.
struct Tags {
    st: Mutex<TagState>,
    freed: tokio::sync::Notify,
    /// Modify RPCs in flight at each grant (`rpc_stats`).
    hist: crate::stats::InFlight,
}

struct TagState {
    /// `used[t]`: tag `t` is taken (index 0 unused: tag 0 means "no tag").
    used: Vec<bool>,
    limit: usize,
    /// Taken, closes included.
    in_use: usize,
    /// Taken by closes.
    closes: usize,
}

impl Tags {
    fn new(limit: u16) -> Tags {
        Tags {
            st: Mutex::new(TagState {
                used: vec![false; usize::from(lode_base::limits::MAX_MOD_RPCS_LIMIT) + 2],
                limit: usize::from(limit.max(1)),
                in_use: 0,
                closes: 0,
            }),
            freed: tokio::sync::Notify::new(),
            hist: crate::stats::InFlight::default(),
        }
    }

    /// A tag now, if one may be taken: fewer than `limit` taken, or a close while no
    /// other close holds one.
    fn try_take(self: &Arc<Self>, close: bool) -> Option<TagGuard> {
        let mut st = self.st.lock();
        if st.in_use >= st.limit && !(close && st.closes == 0) {
            return None;
        }
        // With room, at most `limit` tags are taken: one of 1..=limit+1 is free.
        let t = (1..=st.limit + 1).find(|&t| !st.used[t])?;
        st.used[t] = true;
        st.in_use += 1;
        st.closes += usize::from(close);
        self.hist.tally(st.in_use);
        Some(TagGuard {
            tags: self.clone(),
            tag: t as u16,
            close,
        })
    }

    fn set_limit(&self, n: u16) {
        self.st.lock().limit =
            usize::from(n.max(1)).min(usize::from(lode_base::limits::MAX_MOD_RPCS_LIMIT));
        self.freed.notify_waiters();
    }

    fn limit(&self) -> u16 {
        self.st.lock().limit as u16
    }

    /// Tags taken now, closes included.
    fn in_flight(&self) -> usize {
        self.st.lock().in_use
    }
}

/// One direction (read or write) of an OSC's bulk RPCs: how many are out now, and
/// the three histograms of its `rpc_stats`.
#[derive(Default)]
struct Bulk {
    now: Arc<std::sync::atomic::AtomicUsize>,
    /// RPCs in flight at each send, that one included.
    in_flight: crate::stats::InFlight,
    /// log2 buckets of pages (4 KiB) per RPC, as Lustre's `lprocfs_oh_tally_log2`.
    pages: crate::stats::InFlight,
    /// log2 buckets of the starting page in the object, plus one.
    offset: crate::stats::InFlight,
}

/// Lustre's `fls(v)`: the position of the highest set bit, 0 for 0.
fn fls(v: u64) -> usize {
    (u64::BITS - v.leading_zeros()) as usize
}

impl Bulk {
    fn clear(&self) {
        self.in_flight.clear();
        self.pages.clear();
        self.offset.clear();
    }
}

/// Counts one OST read or write in flight while it lives, and tallies it at entry.
struct InFlightGuard(Arc<std::sync::atomic::AtomicUsize>);

impl InFlightGuard {
    fn enter(b: &Bulk, offset: u64, len: u64) -> Self {
        b.in_flight.tally(b.now.fetch_add(1, Ordering::Relaxed) + 1);
        let pages = len.div_ceil(4096).max(1);
        b.pages.tally(fls(pages - 1));
        b.offset.tally(fls(offset / 4096));
        InFlightGuard(b.now.clone())
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// RPCs in flight (`max_rpcs_in_flight`); the limit can change while RPCs are out.
struct Rif {
    st: Mutex<(usize, usize)>,
    freed: tokio::sync::Notify,
}

struct RifGuard(Arc<Rif>);

impl Drop for RifGuard {
    fn drop(&mut self) {
        self.0.st.lock().1 -= 1;
        self.0.freed.notify_one();
    }
}

impl Rif {
    fn new(limit: usize) -> Rif {
        Rif {
            st: Mutex::new((limit.max(1), 0)),
            freed: tokio::sync::Notify::new(),
        }
    }

    async fn take(self: &Arc<Self>) -> RifGuard {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut st = self.st.lock();
                if st.1 < st.0 {
                    st.1 += 1;
                    return RifGuard(self.clone());
                }
            }
            freed.await;
        }
    }

    fn set_limit(&self, n: usize) {
        self.st.lock().0 = n.max(1);
        self.freed.notify_waiters();
    }
}

/// One connection to one target, shareable by many tasks and threads.
pub struct Import {
    cfg: ImportConfig,
    addr: Mutex<String>,
    rt: Handle,
    xid: AtomicU64,
    state: Mutex<ConnState>,
    pending: Mutex<PendingMap>,
    rif: Arc<Rif>,
    /// OST reads and writes in flight now, and at each send (`rpc_stats`).
    reads: Bulk,
    writes: Bulk,
    tags: Arc<Tags>,
    last_committed: AtomicU64,
    lead: Mutex<Lead>,
    reader_cv: Condvar,
    /// Emulated network latency: each request is held this long (µs) before it is sent.
    net_delay_us: AtomicU64,
    /// Requests answered, per opcode, with their round-trip times (`stats`).
    stats: crate::stats::OpStats,
    /// Metadata operations asked, by md method (`md_stats`).
    md_stats: crate::stats::MdStats,
    /// Replies saying the target does not know this client (it evicted it or
    /// restarted): what the target held for it, such as open files, is gone.
    forgotten: AtomicU64,
    /// Changes answered and not yet committed, by transno: replayed after a restart.
    replay: Mutex<ReplayList>,
    /// `max_unstable_mb` in bytes: a reply that finds more than this kept for replay
    /// asks the target for a commit before its caller goes on.
    max_unstable: AtomicU64,
    /// Changes and bytes replayed to restarted targets, and changes lost (the target
    /// ended its recovery without this client, or refused a replay).
    replayed: AtomicU64,
    replayed_bytes: AtomicU64,
    lost: AtomicU64,
    /// Files with a change the target lost: their next fsync or close gets EIO.
    lost_fids: Mutex<std::collections::HashSet<lode_base::Fid>>,
    /// Files this client holds open: opened again (same handle) in the target's
    /// recovery, committed or not, until their close is committed.
    opens: Mutex<HeldOpens>,
    /// Lock requests to replay after the changes and opens (the layer above keeps the
    /// locks; see [`Import::set_lock_replay`]).
    lock_replay: Mutex<Option<LockReplay>>,
    /// The highest `last_committed` the two lists above were pruned to: most replies
    /// repeat it, and then neither list is locked.
    pruned: AtomicU64,
    /// Handles the caller closed having written nothing, whose CLOSE rides ahead of
    /// the next request (see [`Import::close_ahead`]).
    ahead: Mutex<AheadCloses>,
    /// Held by the one caller asking for a commit because the replay list is full:
    /// the others wait for its answer instead of each sending one.
    committing: tokio::sync::Mutex<()>,
}

/// What goes with a request besides its body.
struct Extra<'a> {
    /// Frames sent just before it, in the same write, answered by nobody.
    ahead: &'a [(Opcode, Vec<u8>)],
    /// Early lock cancels, carried by its first send (`FLAG_CANCELS`).
    cancels: &'a [u64],
    /// An open's credentials and flags, for holding it for replay.
    open: Option<(lode_base::Cred, u32)>,
    /// Keep its reply with it for replay (see `Pending::keep_reply`).
    keep_reply: bool,
}

/// Closes waiting for a request to ride ahead of, and access times (see
/// [`Import::access_ahead`]).
#[derive(Default)]
struct AheadCloses {
    /// Each with what it says of its writes.
    handles: Vec<(u64, AheadWrote)>,
    /// Open handles read through, with the access time each read gave its file.
    access: Vec<(u64, i64)>,
    /// A PING is due to carry them if no request does first.
    armed: bool,
}

/// Closes taken to ride ahead of one request. Dropped before [`AheadTaken::done`]
/// (the call's future dropped, say), they wait for the next request again: the
/// MDT may have closed them already, and closing a closed handle does nothing.
struct AheadTaken<'a> {
    imp: &'a Arc<Import>,
    closes: Vec<(u64, AheadWrote)>,
    /// Access times: sent once, not again if the request fails (they are lazy, as
    /// Lustre's are: a lost one leaves the file's access time earlier, nothing else).
    access: Vec<(u64, i64)>,
}

impl AheadTaken<'_> {
    /// The request they rode ahead of is over: done if its reply came back on the
    /// connection they were sent on (`sent`: its `conn_cnt`), else waiting again.
    fn done(mut self, sent: Option<u32>, reply: Option<u32>) {
        let closes = std::mem::take(&mut self.closes);
        if sent.is_some() && sent == reply {
            for (h, wrote) in closes {
                self.imp.closed_ahead(h, wrote);
            }
        } else {
            self.imp.ahead_again(closes);
        }
    }
}

impl Drop for AheadTaken<'_> {
    fn drop(&mut self) {
        self.imp.ahead_again(std::mem::take(&mut self.closes));
    }
}

/// The changes kept for replay, by transno, and their size.
#[derive(Default)]
struct ReplayList {
    map: BTreeMap<u64, Replayable>,
    bytes: u64,
}

impl ReplayList {
    fn insert(&mut self, transno: u64, r: Replayable) {
        self.bytes += r.body.len() as u64;
        if let Some(old) = self.map.insert(transno, r) {
            self.bytes -= old.body.len() as u64;
        }
    }

    fn remove(&mut self, transno: &u64) -> Option<Replayable> {
        let r = self.map.remove(transno)?;
        self.bytes -= r.body.len() as u64;
        Some(r)
    }

    /// Drops everything at or below `transno`.
    fn prune(&mut self, transno: u64) {
        if self
            .map
            .first_key_value()
            .is_some_and(|(t, _)| *t <= transno)
        {
            let keep = self.map.split_off(&(transno + 1));
            let gone = std::mem::replace(&mut self.map, keep);
            self.bytes -= gone.values().map(|r| r.body.len() as u64).sum::<u64>();
        }
    }

    fn take(&mut self) -> BTreeMap<u64, Replayable> {
        self.bytes = 0;
        std::mem::take(&mut self.map)
    }
}

/// The files a change names (an OST write, punch, fallocate or setattr; a metadata
/// setattr), for
/// telling their writers when it is lost.
fn fids_of(opcode: u16, body: &[u8]) -> Vec<lode_base::Fid> {
    match Request::decode(opcode, body) {
        Ok(Request::OstWrite(w)) => vec![w.obj.fid],
        Ok(Request::Punch(p)) => vec![p.obj.fid],
        Ok(Request::OstFallocate(f)) => vec![f.obj.fid],
        Ok(Request::OstSetattr(r)) => r.objs.iter().map(|o| o.fid).collect(),
        Ok(Request::Setattr(r)) => vec![r.fid],
        _ => Vec::new(),
    }
}

/// Gives the lock requests (opcode, encoded body) that re-take what the client holds.
pub type LockReplay = Arc<dyn Fn() -> Vec<(Opcode, Vec<u8>)> + Send + Sync>;

/// Opens held for replay.
#[derive(Default)]
struct HeldOpens {
    /// By MDT handle.
    held: std::collections::HashMap<u64, HeldOpen>,
    /// Closed, the close not yet committed: close transno → handle. A replayed close
    /// needs its open replayed first.
    closing: BTreeMap<u64, u64>,
}

/// An open held for replay.
struct HeldOpen {
    transno: u64,
    xid: u64,
    tag: u16,
    /// An OPEN of the file by FID, sent if the open itself was committed.
    reopen: Arc<Vec<u8>>,
    /// The transno of its close, until that commits (0: still open); for one closed
    /// ahead, its own transno.
    closing: u64,
    /// Closed ahead of a request (see [`Import::close_ahead`]) before its open, or
    /// a DOM_WRITE through it, was committed: its open is replayed (or the file
    /// opened again) after a restart, lest its transno be taken for a lost change or
    /// a replayed write leave the file marked as being written, and it is then
    /// closed ahead again.
    ahead: bool,
    /// The highest transno of a DOM_WRITE through it (0: none).
    last_write: u64,
    /// Closed ahead after writes to OST objects: its close ahead again says so
    /// (else the MDT would take the file for unwritten), without the size, which
    /// other clients may have changed since (a replay's open knows nothing of them).
    wrote_osts: bool,
}

/// What a close riding ahead says of the writes through its handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AheadWrote {
    /// Nothing the MDT must learn: nothing written, or only bytes on the MDT.
    Nothing,
    /// Writes to OST objects, which then held this (see
    /// [`Import::close_ahead_written`]).
    Sized(CloseAttrs),
    /// Writes to OST objects, what they hold not known to be current.
    Unsized,
}

/// A change to replay if the target restarts before committing it.
#[derive(Clone)]
struct Replayable {
    xid: u64,
    opcode: u16,
    tag: u16,
    body: Arc<Vec<u8>>,
    /// Flags it was first sent with.
    flags: u16,
    /// The open handle it gave this client (an open), else 0: replayed with it, so
    /// that a close replayed after it finds it.
    open_handle: u64,
    /// The versions its target found (see `Header::pre_version`), sent back with it.
    pre_version: u64,
    /// The time its target gave it (see `Header::op_time`), sent back with it.
    op_time: i64,
    /// A create's reply body: the layout the target chose, which the replay must ask
    /// for (see [`replay_body`]).
    reply: Option<Arc<Vec<u8>>>,
}

/// The body a change is replayed with. A create of a regular file, a layout intent or
/// a migration's start asks for the layout its reply gave, OSTs and all: the
/// restarted target would otherwise choose the OSTs again, and data already written
/// to the objects of the first choice would be lost.
fn replay_body(r: &Replayable) -> Arc<Vec<u8>> {
    let Some(reply) = &r.reply else {
        return r.body.clone();
    };
    let (Ok(mut req), Ok(rep)) = (
        Request::decode(r.opcode, &r.body),
        Reply::decode(r.opcode, reply),
    ) else {
        return r.body.clone();
    };
    match (&mut req, rep) {
        // An append is written again where it went, not at the end as it is then.
        (Request::OstWrite(q), Reply::OstWrite(p)) if q.append => {
            q.append = false;
            q.offset = p.offset;
        }
        (Request::DomWrite(q), Reply::DomWrite(p)) if q.append => {
            q.append = false;
            q.offset = p.offset;
        }
        (Request::LayoutIntent(q), Reply::LayoutIntent(p)) => q.layout = p.layout,
        (Request::Migrate(q), Reply::Migrate(p)) => match (&mut q.step, p.layout) {
            (lode_proto::MigrateStep::Start { layout, .. }, Some(given)) => *layout = given,
            _ => return r.body.clone(),
        },
        (Request::Create(q), Reply::Create(p))
            if q.mode & nix::libc::S_IFMT == nix::libc::S_IFREG
                && p.body.layout.is_some()
                && q.layout != p.body.layout =>
        {
            q.layout = p.body.layout
        }
        _ => return r.body.clone(),
    }
    Arc::new(req.encode())
}

struct TagGuard {
    tags: Arc<Tags>,
    tag: u16,
    close: bool,
}

impl Drop for TagGuard {
    fn drop(&mut self) {
        {
            let mut st = self.tags.st.lock();
            st.used[usize::from(self.tag)] = false;
            st.in_use -= 1;
            st.closes -= usize::from(self.close);
        }
        self.tags.freed.notify_waiters();
    }
}

/// Ends a call's wait however it ends (answer, timeout, refusal, or the caller dropping
/// the call): its entry leaves the followers, and a hand-over of the reading it was
/// given goes to someone else. Its pending entry goes too, except for a modification
/// the target has not answered: the target may still execute it, so its tag stays
/// taken (the entry keeps it, and is resent until answered) and is never reused for
/// another request meanwhile.
struct WaitGuard<'a> {
    imp: &'a Arc<Import>,
    xid: u64,
    tag: Option<TagGuard>,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let mut lead = self.imp.lead.lock();
        lead.followers.retain(|(x, _)| *x != self.xid);
        let orphan = {
            let mut pending = self.imp.pending.lock();
            match self.tag.take() {
                Some(tag) if pending.map.contains_key(&self.xid) => {
                    if let Some(p) = pending.map.get_mut(&self.xid) {
                        p.held_tag = Some(tag);
                    }
                    // Nobody waits for it any more: the reader thread reads its reply.
                    pending.make_passive(self.xid);
                    true
                }
                _ => {
                    pending.remove(self.xid);
                    false
                }
            }
        };
        if lead.baton == Some(self.xid) {
            lead.baton = None;
        }
        self.imp.kick(&mut lead);
        drop(lead);
        if orphan {
            let me = self.imp.clone();
            let xid = self.xid;
            self.imp
                .rt
                .spawn(async move { me.resend_orphan(xid).await });
        }
    }
}

/// Returns `Pending` once (asking to be polled again at once), so that futures joined
/// with this one get polled before it goes on.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// True if requests with this opcode modify state on the target and so take a tag (the
/// opcode table in `lode_proto` is the one source of this fact).
pub fn is_modify(op: Opcode) -> bool {
    op.is_modify()
}

/// Highest `max_rpcs_in_flight` (Lustre's `OBD_MAX_RIF_MAX`).
const MAX_RIF: usize = 512;
/// How long the reader thread reads before it looks again at who should.
const READER_ROUND: Duration = Duration::from_millis(100);
/// How long an idle reader thread sleeps before it looks again.
const READER_IDLE: Duration = Duration::from_millis(200);
/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 64 << 10;

impl Import {
    /// A new, not yet connected import of target at `addr`.
    pub fn new(addr: String, cfg: ImportConfig, rt: Handle) -> Arc<Import> {
        let start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
            << 20;
        let tags = Arc::new(Tags::new(cfg.max_mod_rpcs));
        let imp = Arc::new(Import {
            addr: Mutex::new(addr),
            rt,
            xid: AtomicU64::new(start),
            state: Mutex::new(ConnState {
                tx: None,
                gen: 0,
                handle: 0,
                conn_cnt: 0,
                connecting: false,
                refused: None,
                granted: None,
            }),
            pending: Mutex::new(PendingMap::default()),
            rif: Arc::new(Rif::new(cfg.max_rpcs_in_flight)),
            reads: Bulk::default(),
            writes: Bulk::default(),
            tags,
            last_committed: AtomicU64::new(0),
            lead: Mutex::new(Lead::default()),
            reader_cv: Condvar::new(),
            net_delay_us: AtomicU64::new(0),
            stats: crate::stats::OpStats::default(),
            md_stats: crate::stats::MdStats::default(),
            forgotten: AtomicU64::new(0),
            replay: Mutex::new(ReplayList::default()),
            max_unstable: AtomicU64::new(lode_base::limits::MAX_UNSTABLE_MB_DEFAULT << 20),
            replayed: AtomicU64::new(0),
            replayed_bytes: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            lost_fids: Mutex::new(std::collections::HashSet::new()),
            opens: Mutex::new(HeldOpens::default()),
            lock_replay: Mutex::new(None),
            pruned: AtomicU64::new(0),
            ahead: Mutex::new(AheadCloses::default()),
            committing: tokio::sync::Mutex::new(()),
            cfg,
        });
        let weak = Arc::downgrade(&imp);
        let spawned = std::thread::Builder::new()
            .name(format!("rd-{}", imp.cfg.target))
            .spawn(move || reader_thread(weak));
        if let Err(e) = spawned {
            // Blocked callers still read for themselves; tasks would wait forever.
            warn!(target = %imp.cfg.target, "cannot start the reader thread: {e}");
        }
        imp
    }

    /// Sets what re-takes this client's locks when the target restarts: sent in
    /// recovery after the changes and opens, before the client says it is done.
    pub fn set_lock_replay(&self, f: LockReplay) {
        *self.lock_replay.lock() = Some(f);
    }

    /// The target's name.
    pub fn target(&self) -> &str {
        &self.cfg.target
    }

    /// The UUID this import connects as.
    pub fn client_uuid(&self) -> &str {
        &self.cfg.client_uuid
    }

    /// The address currently used.
    pub fn addr(&self) -> String {
        self.addr.lock().clone()
    }

    /// Lustre's `import` file, in part: the target, whether the import is connected,
    /// and to what (`HOST@tcp`).
    pub fn import_info(&self) -> String {
        let addr = self.addr();
        let st = self.state.lock();
        let (state, nid) = match &st.tx {
            Some(_) => {
                let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
                ("FULL", format!("{}@tcp", host.trim_matches(['[', ']'])))
            }
            None if st.connecting => ("CONNECTING", "none".to_string()),
            None => ("DISCONN", "none".to_string()),
        };
        format!(
            "import:\n    target: {}\n    state: {state}\n    connection:\n       current_connection: {nid}\n       address: {addr}\n       generation: {}\n",
            self.cfg.target, st.gen
        )
    }

    /// Points the import at a new address (the target moved); takes effect at the next
    /// reconnect.
    pub fn set_addr(&self, addr: String) {
        *self.addr.lock() = addr;
    }

    /// Highest transno this target reported committed.
    pub fn last_committed(&self) -> u64 {
        self.last_committed.load(Ordering::Relaxed)
    }

    /// `max_rpcs_in_flight`.
    pub fn max_rpcs_in_flight(&self) -> usize {
        self.rif.st.lock().0
    }

    /// Sets `max_rpcs_in_flight` with Lustre's rules: 1..=512 (an MDC needs 2: one for
    /// a modification, one for anything else); lowering it to `max_mod_rpcs_in_flight`
    /// or below lowers that to the new value − 1.
    pub fn set_max_rpcs_in_flight(&self, n: usize) -> Result<(), (Errno, String)> {
        let min = if self.is_mdc() { 2 } else { 1 };
        if !(min..=MAX_RIF).contains(&n) {
            return Err((
                Errno::ERANGE,
                format!("max_rpcs_in_flight must be {min}..{MAX_RIF}"),
            ));
        }
        if self.is_mdc() && n <= usize::from(self.tags.limit()) {
            self.tags.set_limit((n - 1) as u16);
        }
        self.rif.set_limit(n);
        Ok(())
    }

    /// `max_mod_rpcs_in_flight`.
    pub fn max_mod_rpcs_in_flight(&self) -> u16 {
        self.tags.limit()
    }

    /// Sets `max_mod_rpcs_in_flight` with Lustre's rules: 1..=511, below
    /// `max_rpcs_in_flight`, and no more than the MDT granted at connect.
    pub fn set_max_mod_rpcs_in_flight(&self, n: u16) -> Result<(), (Errno, String)> {
        let max = MAX_RIF - 1;
        if n == 0 || usize::from(n) > max {
            return Err((
                Errno::ERANGE,
                format!("max_mod_rpcs_in_flight must be 1..{max}"),
            ));
        }
        let rif = self.max_rpcs_in_flight();
        if usize::from(n) >= rif {
            return Err((
                Errno::ERANGE,
                format!(
                    "max_mod_rpcs_in_flight ({n}) must be less than max_rpcs_in_flight ({rif})"
                ),
            ));
        }
        if let Some(g) = self.granted() {
            if n > g.max_mod_rpcs {
                return Err((
                    Errno::ERANGE,
                    format!(
                        "can't set max_mod_rpcs_in_flight={n} higher than mdt.*.max_mod_rpcs_in_flight={} returned by the MDT server at connection",
                        g.max_mod_rpcs
                    ),
                ));
            }
        }
        self.tags.set_limit(n);
        Ok(())
    }

    /// `net_delay_us`: emulated latency added before each request is sent.
    pub fn net_delay_us(&self) -> u64 {
        self.net_delay_us.load(Ordering::Relaxed)
    }

    /// Sets `net_delay_us` (at most 10 s), so a loopback test behaves like a network
    /// with that one-way latency.
    pub fn set_net_delay_us(&self, us: u64) -> Result<(), (Errno, String)> {
        if us > 10_000_000 {
            return Err((Errno::ERANGE, "net_delay_us must be 0..10000000".into()));
        }
        self.net_delay_us.store(us, Ordering::Relaxed);
        Ok(())
    }

    /// `rpc_stats` as Lustre prints it: for an MDC the modify RPCs-in-flight
    /// histogram, for an OSC the read and write ones.
    pub fn rpc_stats(&self) -> String {
        use crate::stats::{rpc_stats_header, rpc_stats_table, rpc_stats_table2};
        use std::fmt::Write as _;
        let mut s = String::new();
        if self.is_mdc() {
            rpc_stats_header(&mut s, &self.tags.hist);
            let _ = writeln!(s, "modify_RPCs_in_flight:  {}", self.mod_rpcs_in_flight());
            let _ = writeln!(s);
            rpc_stats_table(&mut s, "modify", &self.tags.hist);
        } else {
            rpc_stats_header(&mut s, &self.reads.in_flight);
            let _ = writeln!(
                s,
                "read RPCs in flight:  {}",
                self.reads.now.load(Ordering::Relaxed)
            );
            let _ = writeln!(
                s,
                "write RPCs in flight: {}",
                self.writes.now.load(Ordering::Relaxed)
            );
            // Writes leave at once (no write-back cache of pages yet).
            let _ = writeln!(s, "pending write pages:  0");
            let _ = writeln!(s, "pending read pages:   0");
            let _ = writeln!(s);
            rpc_stats_table2(
                &mut s,
                "pages per rpc",
                &self.reads.pages,
                &self.writes.pages,
                |i| 1 << i,
            );
            let _ = writeln!(s);
            rpc_stats_table2(
                &mut s,
                "rpcs in flight",
                &self.reads.in_flight,
                &self.writes.in_flight,
                |i| i as u64,
            );
            let _ = writeln!(s);
            rpc_stats_table2(
                &mut s,
                "offset",
                &self.reads.offset,
                &self.writes.offset,
                |i| {
                    if i == 0 {
                        0
                    } else {
                        1 << (i - 1)
                    }
                },
            );
        }
        s
    }

    /// `stats`: requests answered per opcode with their round-trip times (µs), in
    /// Lustre's layout; writing to it clears it.
    pub fn stats(&self) -> &crate::stats::OpStats {
        &self.stats
    }

    /// `md_stats`: the metadata operations asked of this import, by Lustre's md method
    /// names; writing to it clears it.
    pub fn md_stats(&self) -> &crate::stats::MdStats {
        &self.md_stats
    }

    /// Clears `rpc_stats` (what writing to it does).
    pub fn clear_rpc_stats(&self) {
        self.tags.hist.clear();
        self.reads.clear();
        self.writes.clear();
    }

    /// The most modify RPCs ever in flight at once since `rpc_stats` was cleared, and
    /// how many sends found exactly `n` in flight.
    pub fn mod_rpcs_seen(&self, n: usize) -> (usize, u64) {
        (self.tags.hist.max_seen(), self.tags.hist.count(n))
    }

    /// Modify tags taken now (closes included).
    pub fn mod_rpcs_in_flight(&self) -> usize {
        self.tags.in_flight()
    }

    fn is_mdc(&self) -> bool {
        self.cfg.target.contains("-MDT")
    }

    /// How many times the target answered that it does not know this client (it
    /// evicted it or restarted): state it held for the client from before is gone.
    pub fn forgotten(&self) -> u64 {
        self.forgotten.load(Ordering::Acquire)
    }

    /// What the target granted at the last CONNECT.
    pub fn granted(&self) -> Option<ConnectRep> {
        self.state.lock().granted.clone()
    }

    /// Connects now, returning the grant or the target's refusal.
    pub async fn connect(self: &Arc<Self>) -> Result<ConnectRep, Errno> {
        if let Some(g) = self.state.lock().granted.clone() {
            return Ok(g);
        }
        match self.call(Request::Ping(Empty {})).await {
            Ok(_) => self.state.lock().granted.clone().ok_or(Errno::EIO),
            Err(e) => Err(e),
        }
    }

    fn next_xid(&self) -> u64 {
        self.xid.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Sends a request and waits for its reply; a negative status becomes `Err`.
    pub async fn call(self: &Arc<Self>, req: Request) -> Result<Response, Errno> {
        self.call_with(req, 0, &[]).await
    }

    /// [`Import::call`] with header `flags` (e.g. `FLAG_INTENT`), and locks to cancel
    /// first (early lock cancel): their handles lead the request's body
    /// (`FLAG_CANCELS`), so the target drops them before the request looks for
    /// conflicts, and no round trip or frame is added.
    pub async fn call_with(
        self: &Arc<Self>,
        req: Request,
        flags: u16,
        cancels: &[u64],
    ) -> Result<Response, Errno> {
        let op = req.opcode();
        self.md_stats.record(op);
        let tag_guard = if is_modify(op) {
            Some(self.take_tag(op == Opcode::Close).await)
        } else {
            None
        };
        let permit = self.rif.take().await;
        let bulk = match &req {
            Request::OstRead(r) => Some(InFlightGuard::enter(
                &self.reads,
                r.offset,
                u64::from(r.len),
            )),
            Request::OstWrite(w) => Some(InFlightGuard::enter(
                &self.writes,
                w.offset,
                w.data.len() as u64,
            )),
            _ => None,
        };
        let open = match &req {
            Request::Open(o) => Some((o.cred.clone(), o.flags)),
            Request::Create(c) => c.open_flags.map(|f| (c.cred.clone(), f)),
            _ => None,
        };
        let body = Arc::new(req.encode());
        let sent = std::time::Instant::now();
        let mut ahead = Vec::new();
        let mut closes = self.take_ahead();
        if !closes.access.is_empty() {
            // Before the closes: one of them may close a handle read through.
            let c = Request::AccessAhead(lode_proto::AccessAheadReq {
                items: std::mem::take(&mut closes.access),
            });
            ahead.push((Opcode::AccessAhead, c.encode()));
        }
        if !closes.closes.is_empty() {
            let mut c = lode_proto::CloseAheadReq {
                handles: Vec::new(),
                written: Vec::new(),
            };
            for &(h, w) in &closes.closes {
                match w {
                    AheadWrote::Nothing => c.handles.push(h),
                    AheadWrote::Sized(a) => c.written.push((h, Some(a))),
                    AheadWrote::Unsized => c.written.push((h, None)),
                }
            }
            let c = Request::CloseAhead(c);
            ahead.push((Opcode::CloseAhead, c.encode()));
        }
        let mut on = None;
        let extra = Extra {
            ahead: &ahead,
            cancels,
            open,
            keep_reply: match &req {
                Request::Create(_) | Request::LayoutIntent(_) | Request::Migrate(_) => true,
                Request::OstWrite(w) => w.append,
                Request::DomWrite(w) => w.append,
                _ => false,
            },
        };
        let frame = self
            .wait(op as u16, tag_guard, body, flags, extra, &mut on)
            .await;
        closes.done(on, frame.as_ref().ok().map(|f| f.header.conn_cnt));
        let frame = frame?;
        self.stats.record(
            op,
            u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX),
        );
        self.last_committed
            .fetch_max(frame.header.last_committed, Ordering::Relaxed);
        // This RPC is answered: its place in flight goes before any wait for a commit,
        // which needs a place of its own (with every place held by a caller waiting
        // for a commit, none could be asked for).
        drop(bulk);
        drop(permit);
        if frame.header.transno > frame.header.last_committed
            && op != Opcode::Sync
            && op != Opcode::OstSync
            && self.replay_full()
        {
            // The list is full: wait for a commit, which empties it, instead of growing.
            // One caller asks; those who find it asking wait for its answer.
            let _one = self.committing.lock().await;
            if self.replay_full() {
                debug!(target = %self.cfg.target, "replay list full: asking for a commit");
                let sync = if self.is_mdc() {
                    Request::Sync(Empty {})
                } else {
                    Request::OstSync(lode_proto::ObjsReq { objs: Vec::new() })
                };
                let _ = Box::pin(self.call_with(sync, 0, &[])).await;
            }
        }
        if frame.header.status < 0 {
            return Err(Errno::from_status(frame.header.status));
        }
        let reply = Reply::decode(frame.header.opcode, &frame.body).map_err(|e| {
            warn!(target = %self.cfg.target, "malformed reply: {e}");
            Errno::EPROTO
        })?;
        Ok(Response {
            header: frame.header,
            reply,
        })
    }

    /// Whether the replay list holds as much as it may.
    fn replay_full(&self) -> bool {
        let r = self.replay.lock();
        r.map.len() > lode_base::limits::REPLAY_LIST_MAX || r.bytes > self.max_unstable()
    }

    fn resend_interval(&self) -> Duration {
        self.cfg.resend_interval.max(Duration::from_millis(10))
    }

    /// Sends the request and waits for its reply: reading the socket itself when it
    /// may and nobody else does, else woken by whoever reads. `on` is set to the
    /// `conn_cnt` of the connection the request first went out on.
    async fn wait(
        self: &Arc<Self>,
        op: u16,
        tag_guard: Option<TagGuard>,
        body: Arc<Vec<u8>>,
        flags: u16,
        Extra {
            ahead,
            cancels,
            open,
            keep_reply,
        }: Extra<'_>,
        on: &mut Option<u32>,
    ) -> Result<Frame, Errno> {
        let tag = tag_guard.as_ref().map_or(0, |t| t.tag);
        let (tx, mut rx) = oneshot::channel();
        // The xid is taken under the pending lock: `last_xid` (computed under it too)
        // must never cover an xid that is taken but not yet pending, or the target
        // would drop that request as a late duplicate.
        let xid = {
            let mut pending = self.pending.lock();
            let xid = self.next_xid();
            pending.insert(
                xid,
                Pending {
                    opcode: op,
                    tag,
                    body: body.clone(),
                    flags,
                    tx,
                    passive: false,
                    held_tag: None,
                    open,
                    keep_reply,
                },
            );
            xid
        };
        let _waiting = Waiting::enter();
        let guard = WaitGuard {
            imp: self,
            xid,
            tag: tag_guard,
        };
        let delay = self.net_delay_us();
        if delay > 0 {
            let d = Duration::from_micros(delay);
            if BLOCKING.with(|b| b.get()) {
                // A blocked caller sleeps itself: precise to tens of µs, unlike the
                // runtime's millisecond timer.
                std::thread::sleep(d);
            } else {
                tokio::time::sleep(d).await;
            }
        }
        *on = self.send_first(xid, op, tag, &body, flags, (ahead, cancels));
        // Let calls joined with this one send theirs before deciding who may read.
        YieldOnce(false).await;
        let active = may_lead();
        if !active && self.pending.lock().make_passive(xid) {
            self.kick(&mut self.lead.lock());
        }
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                drop(guard);
                warn!(target = %self.cfg.target, xid, "request timed out after {:?}", self.cfg.timeout);
                return Err(Errno::EIO);
            }
            let until = deadline.min(now + self.resend_interval());
            let timer = tokio::time::sleep_until(until);
            tokio::pin!(timer);
            let got = std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = Pin::new(&mut rx).poll(cx) {
                    return Poll::Ready(Some(r));
                }
                // The runtime's timer fires up to a tick late (or never, if its
                // threads are stuck): a caller that reads for itself does not spin
                // waiting for it.
                if timer.as_mut().poll(cx).is_ready() || tokio::time::Instant::now() >= until {
                    return Poll::Ready(None);
                }
                if active {
                    if let Some(f) = self.lead_or_follow(xid, &mut rx, until.into_std(), cx) {
                        return Poll::Ready(Some(Ok(f)));
                    }
                }
                Poll::Pending
            })
            .await;
            match got {
                Some(Ok(f)) => return Ok(f),
                Some(Err(_)) => {
                    // Dropped sender: the import refused (e.g. CONNECT was refused).
                    return Err(self.state.lock().refused.unwrap_or(Errno::EIO));
                }
                None if tokio::time::Instant::now() >= deadline => {}
                None => {
                    debug!(target = %self.cfg.target, xid, "no reply yet, resending");
                    self.send(xid, op, tag, &body, FLAG_RESENT | flags);
                }
            }
        }
    }

    /// For a caller that may read: reads the socket until its reply comes (returned) or
    /// `until`, if nobody else reads; else joins the followers, to be woken by its
    /// reply or to take over the reading.
    fn lead_or_follow(
        self: &Arc<Self>,
        xid: u64,
        rx: &mut oneshot::Receiver<Frame>,
        until: Instant,
        cx: &mut Context<'_>,
    ) -> Option<Frame> {
        let conn = self.state.lock().tx.clone();
        let mut lead = self.lead.lock();
        if lead.baton == Some(xid) {
            lead.baton = None;
        }
        match conn {
            Some(conn) if !lead.leader => {
                lead.leader = true;
                lead.followers.retain(|(x, _)| *x != xid);
                drop(lead);
                let mut mine = None;
                let alive = self.read_until(&conn, rx, &mut mine, until);
                let mut lead = self.lead.lock();
                lead.leader = false;
                if alive {
                    self.kick(&mut lead);
                }
                drop(lead);
                if mine.is_none() {
                    // Timed out or the connection failed: come back through the timer.
                    cx.waker().wake_by_ref();
                }
                mine
            }
            _ => {
                match lead.followers.iter_mut().find(|(x, _)| *x == xid) {
                    Some((_, w)) => w.clone_from(cx.waker()),
                    None => lead.followers.push_back((xid, cx.waker().clone())),
                }
                None
            }
        }
    }

    /// With nobody reading: wakes a caller that may read to take over, else (if
    /// passive calls wait) the reader thread. Called with `lead` held.
    fn kick(&self, lead: &mut Lead) {
        if lead.leader {
            return;
        }
        if let Some((xid, w)) = lead.followers.pop_front() {
            lead.baton = Some(xid);
            w.wake();
            return;
        }
        // Callers that may read and are not among the followers are on their way and
        // will read themselves; only passive calls need the reader thread.
        if self.pending.lock().n_passive > 0 {
            lead.kick = true;
            self.reader_cv.notify_one();
        }
    }

    /// Reads replies on `conn` and hands them out until the caller's own arrives on
    /// `rx` (put in `mine`) or `until` passes. False if the connection failed (a
    /// reconnect has been started).
    fn read_until(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        rx: &mut oneshot::Receiver<Frame>,
        mine: &mut Option<Frame>,
        until: Instant,
    ) -> bool {
        loop {
            if let Ok(f) = rx.try_recv() {
                *mine = Some(f);
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            if let Err(e) = self.read_some(conn, until - now) {
                debug!(target = %self.cfg.target, "connection lost: {e}");
                self.conn_lost(conn.gen);
                return false;
            }
        }
    }

    /// Waits up to `wait` for bytes, reads all there are and hands out every whole
    /// reply.
    fn read_some(&self, conn: &Conn, wait: Duration) -> Result<(), String> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let sock = conn.sock.get_ref();
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        // Spin a little before sleeping (see `crate::spin`).
        let t = Instant::now();
        let budget = conn.spin.lock().budget().min(wait);
        if !budget.is_zero() {
            let mut hit = false;
            while !hit && t.elapsed() < budget {
                hit = matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0);
                if !hit {
                    std::thread::yield_now();
                }
            }
            conn.spin.lock().record(hit);
        }
        let left = wait.saturating_sub(t.elapsed());
        let ms = u16::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
        let mut rd = conn.rd.lock();
        let rd = &mut *rd;
        loop {
            if rd.buf.len() - rd.end < READ_CHUNK / 4 {
                // Move what is left to the front, and grow if a frame needs more room.
                rd.buf.copy_within(rd.start..rd.end, 0);
                rd.end -= rd.start;
                rd.start = 0;
                if rd.buf.len() - rd.end < READ_CHUNK / 4 {
                    let n = rd.buf.len().max(READ_CHUNK) * 2;
                    rd.buf.resize(n, 0);
                }
            }
            let room = rd.buf.len() - rd.end;
            match (&*sock).read(&mut rd.buf[rd.end..]) {
                Ok(0) => return Err("closed by the target".into()),
                Ok(n) => {
                    rd.end += n;
                    self.take_frames(rd)?;
                    // A short read emptied the socket: asking again would only get
                    // EAGAIN (a system call per reply); the next wait polls anyway.
                    if n < room {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Hands out every whole frame in `rd`.
    fn take_frames(&self, rd: &mut RdBuf) -> Result<(), String> {
        while rd.end - rd.start >= 4 {
            let mut len = [0u8; 4];
            len.copy_from_slice(&rd.buf[rd.start..rd.start + 4]);
            let len = check_len(u32::from_le_bytes(len)).map_err(|e| e.to_string())?;
            if rd.end - rd.start < 4 + len {
                if rd.buf.len() < 4 + len {
                    let need = 4 + len;
                    rd.buf.resize(need.max(READ_CHUNK), 0);
                }
                return Ok(());
            }
            let mut rest = rd.buf[rd.start + 4..rd.start + 4 + len].to_vec();
            rd.start += 4 + len;
            open_rest(&mut rest, rd.opener.as_mut()).map_err(|e| e.to_string())?;
            let frame = Frame::decode_rest(rest).map_err(|e| e.to_string())?;
            if frame.header.flags & FLAG_REPLY == 0 {
                continue;
            }
            if frame.header.status == Errno::ENOTCONN.status() {
                // The target does not know our handle (it evicted us or restarted):
                // reconnect, resend.
                self.forgotten.fetch_add(1, Ordering::AcqRel);
                return Err("the target does not know this client".into());
            }
            let p = self.pending.lock().remove(frame.header.xid);
            let (transno, committed) = (frame.header.transno, frame.header.last_committed);
            if let Some(p) = p {
                let mut open_handle = 0;
                if transno > 0 {
                    if let Some((cred, flags)) = &p.open {
                        open_handle = self.hold_open(&frame, p.tag, transno, cred, *flags);
                    } else if p.opcode == Opcode::Close as u16 {
                        self.closing(&p.body, transno, committed);
                    } else if p.opcode == Opcode::DomWrite as u16 && transno > committed {
                        self.written_through(&p.body, transno);
                    }
                }
                if transno > committed {
                    // Kept before its caller sees the reply: a restart noticed after
                    // this point replays it.
                    self.replay.lock().insert(
                        transno,
                        Replayable {
                            xid: frame.header.xid,
                            opcode: p.opcode,
                            tag: p.tag,
                            body: p.body.clone(),
                            flags: p.flags,
                            open_handle,
                            pre_version: frame.header.pre_version,
                            op_time: frame.header.op_time,
                            reply: p.keep_reply.then(|| Arc::new(frame.body.clone())),
                        },
                    );
                }
                let _ = p.tx.send(frame);
            }
            self.committed(committed);
        }
        if rd.start == rd.end {
            rd.start = 0;
            rd.end = 0;
        }
        Ok(())
    }

    /// With nobody reading, notices a connection the target closed (it stopped or
    /// restarted) by peeking at the socket, so that an idle client reconnects, and
    /// replays, without waiting for its next call.
    fn check_alive(self: &Arc<Self>) {
        use nix::sys::socket::{recv, MsgFlags};
        let Some(conn) = self.state.lock().tx.clone() else {
            return;
        };
        let fd = conn.sock.get_ref().as_raw_fd();
        let mut b = [0u8; 1];
        let gone = match recv(fd, &mut b, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e, nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR),
        };
        if gone {
            debug!(target = %self.cfg.target, "connection closed by the target while idle");
            self.conn_lost(conn.gen);
        }
    }

    /// Whether a lost connection is made again at once: while calls wait or changes
    /// wait for a replay, and always to an MDT, whose recovery after a restart waits
    /// for every client that was connected (an idle one too).
    fn wants_connection(&self) -> bool {
        self.is_mdc() || !self.pending.lock().map.is_empty() || !self.replay.lock().map.is_empty()
    }

    /// The target says everything up to `transno` is on disk: nothing there needs a
    /// replay any more.
    fn committed(&self, transno: u64) {
        if self.pruned.fetch_max(transno, Ordering::AcqRel) >= transno {
            // Nothing kept is at or below it: entries are kept only above the
            // `last_committed` of the reply that brought them, which only grows. (A
            // reply written late by another server thread can bring one just below;
            // it goes at the next advance, and its replay is answered as done.)
            return;
        }
        self.replay.lock().prune(transno);
        let mut o = self.opens.lock();
        while let Some(e) = o.closing.first_entry() {
            if *e.key() > transno {
                break;
            }
            let (t, handle) = e.remove_entry();
            if o.held.get(&handle).is_some_and(|h| h.closing == t) {
                o.held.remove(&handle);
            }
        }
    }

    /// Keeps an answered open for replay: its handle and file, from the reply. Returns
    /// the handle (0 if the reply has none).
    fn hold_open(
        &self,
        frame: &Frame,
        tag: u16,
        transno: u64,
        cred: &lode_base::Cred,
        flags: u32,
    ) -> u64 {
        let rep = match Reply::decode(frame.header.opcode, &frame.body) {
            Ok(Reply::Create(r) | Reply::Open(r)) => r,
            _ => return 0,
        };
        let Some(handle) = rep.handle else { return 0 };
        let reopen = Request::Open(lode_proto::OpenReq {
            cred: cred.clone(),
            fid: rep.body.attr.fid,
            flags: flags
                & !((nix::libc::O_CREAT
                    | nix::libc::O_EXCL
                    | nix::libc::O_TRUNC
                    | nix::libc::O_TMPFILE) as u32),
            cached: 0,
            open_lock: false,
            first_page: None,
        })
        .encode();
        self.opens.lock().held.insert(
            handle,
            HeldOpen {
                transno,
                xid: frame.header.xid,
                tag,
                reopen: Arc::new(reopen),
                closing: 0,
                ahead: false,
                last_write: 0,
                wrote_osts: false,
            },
        );
        handle
    }

    /// A DOM_WRITE (`body`) was answered with `transno`, not committed yet: a close
    /// ahead of its handle keeps the open for replay until it is (see
    /// [`HeldOpen::ahead`]).
    fn written_through(&self, body: &[u8], transno: u64) {
        let Some(handle) = lode_proto::DomWriteReq::handle_of(body) else {
            return;
        };
        if let Some(h) = self.opens.lock().held.get_mut(&handle) {
            h.last_write = h.last_write.max(transno);
        }
    }

    /// A close was answered with `transno`: its open is replayed until it commits
    /// (at once if the reply says it is committed already).
    fn closing(&self, body: &[u8], transno: u64, committed: u64) {
        if let Ok(Request::Close(c)) = Request::decode(Opcode::Close as u16, body) {
            let mut o = self.opens.lock();
            if transno <= committed {
                o.held.remove(&c.handle);
            } else if let Some(h) = o.held.get_mut(&c.handle) {
                h.closing = transno;
                o.closing.insert(transno, c.handle);
            }
        }
    }

    /// Closes `handle`, which nothing was written through, without a round trip of its
    /// own: its CLOSE (`CloseAhead`, answered by nothing) leaves in the same write as
    /// the next request to the target, or with a PING within [`CLOSE_AHEAD_WAIT_MS`]
    /// if none comes. The target runs a connection's frames in order, so the reply to
    /// that request, come back on the same connection, shows the close done; only then is the handle no
    /// longer opened again in a recovery. A close that may not have arrived (the
    /// connection changed) is sent again: closing a closed handle does nothing. Returns
    /// false (the caller closes it with an RPC) if [`CLOSES_AHEAD_MAX`] wait already.
    ///
    /// Only for handles whose close changes nothing the client must know: the MDT
    /// closes them as it closes a departed client's handles, but for taking back the
    /// data mark that a writer's open set.
    pub fn close_ahead(self: &Arc<Self>, handle: u64) -> bool {
        self.queue_close(handle, AheadWrote::Nothing)
    }

    /// [`Import::close_ahead`] for a handle that made a file on OST objects and alone
    /// wrote it: its close says the size, blocks and mtime its writes left (`attrs`),
    /// for the MDT to keep as lazy size on MDT if nobody else wrote the file since
    /// its open. Its open, replayed after a restart, is closed ahead again saying
    /// that it wrote but not what (the MDT then keeps asking the OSTs): by then
    /// another client may have written the file and closed it, which the replayed
    /// open cannot know.
    pub fn close_ahead_written(self: &Arc<Self>, handle: u64, attrs: CloseAttrs) -> bool {
        self.queue_close(handle, AheadWrote::Sized(attrs))
    }

    fn queue_close(self: &Arc<Self>, handle: u64, written: AheadWrote) -> bool {
        let mut a = self.ahead.lock();
        if a.handles.len() >= CLOSES_AHEAD_MAX {
            return false;
        }
        a.handles.push((handle, written));
        self.md_stats.record(Opcode::Close);
        self.arm_ahead(&mut a);
        true
    }

    /// Closes waiting to ride ahead of a request.
    pub fn closes_ahead(&self) -> usize {
        self.ahead.lock().handles.len()
    }

    /// Tells the MDT, ahead of the next request (or with a PING within
    /// [`CLOSE_AHEAD_WAIT_MS`]), that a read through the open `handle` gave its file
    /// the access time `atime`. Sent before any close riding with it, so the handle is
    /// still open when the MDT reads it; best effort, as Lustre's lazy access times:
    /// one lost with a connection leaves the file's access time as it was. Past
    /// [`ACCESS_AHEAD_MAX`] waiting, a PING carries them at once; past twice that, the
    /// newest is dropped.
    pub fn access_ahead(self: &Arc<Self>, handle: u64, atime: i64) {
        let mut a = self.ahead.lock();
        if let Some(e) = a.access.iter_mut().find(|e| e.0 == handle) {
            e.1 = e.1.max(atime);
            return;
        }
        if a.access.len() >= 2 * ACCESS_AHEAD_MAX {
            debug!(target = %self.cfg.target, handle, "too many access times waiting: one dropped");
            return;
        }
        a.access.push((handle, atime));
        if a.access.len() >= ACCESS_AHEAD_MAX {
            let me = Arc::downgrade(self);
            self.rt.spawn(async move {
                if let Some(me) = me.upgrade() {
                    let _ = me.call(Request::Ping(Empty {})).await;
                }
            });
        } else {
            self.arm_ahead(&mut a);
        }
    }

    /// Starts the wait after which a PING carries the waiting closes.
    fn arm_ahead(self: &Arc<Self>, a: &mut AheadCloses) {
        if a.armed || (a.handles.is_empty() && a.access.is_empty()) {
            return;
        }
        a.armed = true;
        let me = Arc::downgrade(self);
        self.rt.spawn(async move {
            tokio::time::sleep(Duration::from_millis(CLOSE_AHEAD_WAIT_MS)).await;
            let Some(me) = me.upgrade() else { return };
            let waiting = {
                let mut a = me.ahead.lock();
                a.armed = false;
                !a.handles.is_empty() || !a.access.is_empty()
            };
            if waiting {
                let _ = me.call(Request::Ping(Empty {})).await;
            }
        });
    }

    /// The closes to send ahead of a request now (only an MDC import has any): at
    /// most `CLOSES_AHEAD_MAX`, the most the MDT takes in one frame (the queue can
    /// hold more after closes come back from a failed request); the rest wait for
    /// the next request, or the PING armed for them.
    fn take_ahead(self: &Arc<Self>) -> AheadTaken<'_> {
        let mut a = self.ahead.lock();
        let n = a.handles.len().min(CLOSES_AHEAD_MAX);
        let closes = a.handles.drain(..n).collect();
        let n = a.access.len().min(ACCESS_AHEAD_MAX);
        let access = a.access.drain(..n).collect();
        self.arm_ahead(&mut a);
        AheadTaken {
            imp: self,
            closes,
            access,
        }
    }

    /// `handles` wait again for a request to ride ahead of (once each: a reconnect
    /// that failed after its replay queued them may queue them again).
    fn ahead_again(self: &Arc<Self>, handles: Vec<(u64, AheadWrote)>) {
        if handles.is_empty() {
            return;
        }
        let mut a = self.ahead.lock();
        for h in handles {
            if !a.handles.iter().any(|(k, _)| *k == h.0) {
                a.handles.push(h);
            }
        }
        self.arm_ahead(&mut a);
    }

    /// The MDT closed `handle` ahead of a request: nothing to open again once its open
    /// and the DOM_WRITEs through it are committed. Until then the open is replayed
    /// (or the file opened again) after a restart, a close ahead having no transno to
    /// be replayed at, and closed ahead again.
    fn closed_ahead(&self, handle: u64, wrote: AheadWrote) {
        let committed = self.pruned.load(Ordering::Acquire);
        let mut o = self.opens.lock();
        let Some(h) = o.held.get_mut(&handle) else {
            return;
        };
        if h.closing != 0 {
            // Closed ahead before and opened again in a recovery: kept as it was.
            return;
        }
        let t = h.transno.max(h.last_write);
        if t <= committed {
            o.held.remove(&handle);
            return;
        }
        h.ahead = true;
        h.wrote_osts = wrote != AheadWrote::Nothing;
        h.closing = t;
        o.closing.insert(t, handle);
    }

    /// The caller is done with the file open under `handle`: unless its close awaits
    /// a commit (and so its open a possible replay), nothing to open again.
    pub fn closed(&self, handle: u64) {
        let mut o = self.opens.lock();
        if o.held.get(&handle).is_some_and(|h| h.closing == 0) {
            o.held.remove(&handle);
        }
    }

    /// Whether a connection to the target is up now.
    pub fn connected(&self) -> bool {
        self.state.lock().tx.is_some()
    }

    /// Changes kept for replay now (`replay_list` in Lustre's import state).
    pub fn replay_count(&self) -> usize {
        self.replay.lock().map.len()
    }

    /// Bytes of the changes kept for replay now (an OSC's unstable data).
    pub fn replay_bytes(&self) -> u64 {
        self.replay.lock().bytes
    }

    /// `max_unstable_mb`, in bytes.
    pub fn max_unstable(&self) -> u64 {
        self.max_unstable.load(Ordering::Relaxed)
    }

    /// Sets `max_unstable_mb`, in bytes.
    pub fn set_max_unstable(&self, bytes: u64) {
        self.max_unstable.store(bytes, Ordering::Relaxed);
    }

    /// `unstable_stats`: what is kept for replay now, what was replayed to restarted
    /// targets, and what was lost, in Lustre's style.
    pub fn unstable_stats(&self) -> String {
        let (n, bytes) = {
            let r = self.replay.lock();
            (r.map.len(), r.bytes)
        };
        format!(
            "unstable_check: 1\nunstable_rpcs: {n}\nunstable_pages: {}\nunstable_mb: {}\nmax_unstable_mb: {}\nreplayed_rpcs: {}\nreplayed_mb: {}\nlost_rpcs: {}\n",
            bytes.div_ceil(4096),
            bytes >> 20,
            self.max_unstable() >> 20,
            self.replayed.load(Ordering::Relaxed),
            self.replayed_bytes.load(Ordering::Relaxed) >> 20,
            self.lost.load(Ordering::Relaxed),
        )
    }

    /// Changes the target will never have: counted, and their files' next fsync or
    /// close is told.
    fn lose(&self, gone: impl Iterator<Item = Replayable>) {
        let mut fids = self.lost_fids.lock();
        for r in gone {
            self.lost.fetch_add(1, Ordering::Relaxed);
            fids.extend(fids_of(r.opcode, &r.body));
        }
    }

    /// Whether a change to `fid` was lost since the last ask (then forgotten: one EIO
    /// per loss, as Lustre reports a write error once).
    pub fn take_lost(&self, fid: lode_base::Fid) -> bool {
        let mut f = self.lost_fids.lock();
        !f.is_empty() && f.remove(&fid)
    }

    /// Whether changes to `fid` were lost, leaving the mark for [`Import::take_lost`].
    pub fn has_lost(&self, fid: lode_base::Fid) -> bool {
        let f = self.lost_fids.lock();
        !f.is_empty() && f.contains(&fid)
    }

    /// Replays, on a new connection to a target in recovery, every change it had not
    /// committed, in transno order, and then says so (a PING flagged
    /// `FLAG_REPLAY_DONE`, answered when the target's recovery is over). Replies are
    /// read while the replays are written, so neither side waits on the other.
    async fn handshake(
        &self,
        sock: &mut TcpStream,
        addr: &str,
    ) -> Result<Option<(Vec<u8>, Sealer, Opener)>, Option<Errno>> {
        let r = client_handshake(
            sock,
            &self.cfg.key,
            &self.cfg.client_uuid,
            &self.cfg.target,
            self.next_xid(),
        )
        .await;
        if let Err(Some(e)) = &r {
            warn!(target = %self.cfg.target, %addr, "connection refused: the target does not take part in the key handshake ({e})");
        }
        r
    }

    async fn replay_all(
        self: &Arc<Self>,
        sock: &mut TcpStream,
        rep: &ConnectRep,
        conn_cnt: u32,
        session: Option<&mut (Sealer, Opener)>,
    ) -> Result<(), Option<Errno>> {
        let (mut sealer, mut opener) = match session {
            Some((s, o)) => (Some(s), Some(o)),
            None => (None, None),
        };
        use tokio::io::AsyncWriteExt;
        // Each change in transno order; an open still held carries its handle (in
        // `last_xid`, unused by replays) and, if it was committed, is sent as an OPEN
        // by FID in its place.
        let mut frames: BTreeMap<u64, (Header, Arc<Vec<u8>>)> = self
            .replay
            .lock()
            .map
            .iter()
            .map(|(transno, r)| {
                let h = Header {
                    opcode: r.opcode,
                    flags: FLAG_REPLAY | (r.flags & !(FLAG_INTENT | FLAG_RESENT)),
                    tag: r.tag,
                    xid: r.xid,
                    handle: rep.handle,
                    transno: *transno,
                    last_xid: r.open_handle,
                    conn_cnt,
                    pre_version: r.pre_version,
                    op_time: r.op_time,
                    ..Default::default()
                };
                (*transno, (h, replay_body(r)))
            })
            .collect();
        let changes = frames.len();
        let change_bytes: u64 = frames.values().map(|(_, b)| b.len() as u64).sum();
        // Opens closed ahead before they committed are opened again here, and are
        // closed ahead again once connected (a close leaves only on a connection
        // that is up, so after these reopens). Queued now, whatever happens next: the
        // replies to come may commit them, which drops them from `held`.
        let mut again = Vec::new();
        for (handle, o) in self.opens.lock().held.iter() {
            if o.ahead {
                again.push((
                    *handle,
                    if o.wrote_osts {
                        AheadWrote::Unsized
                    } else {
                        AheadWrote::Nothing
                    },
                ));
            }
            let f = frames.entry(o.transno).or_insert_with(|| {
                let h = Header {
                    opcode: Opcode::Open as u16,
                    flags: FLAG_REPLAY,
                    tag: o.tag,
                    xid: o.xid,
                    handle: rep.handle,
                    transno: o.transno,
                    conn_cnt,
                    ..Default::default()
                };
                (h, o.reopen.clone())
            });
            f.0.last_xid = *handle;
        }
        self.ahead_again(again);
        let mut out = Vec::new();
        for (h, body) in frames.values() {
            out.extend_from_slice(&Frame::encode(h, body));
        }
        // Then the locks, which need no order among themselves.
        let locks = self
            .lock_replay
            .lock()
            .clone()
            .map(|f| f())
            .unwrap_or_default();
        let mut lock_xids = std::collections::HashSet::with_capacity(locks.len());
        for (opcode, body) in &locks {
            let h = Header {
                opcode: *opcode as u16,
                flags: FLAG_REPLAY,
                xid: self.next_xid(),
                handle: rep.handle,
                conn_cnt,
                ..Default::default()
            };
            lock_xids.insert(h.xid);
            out.extend_from_slice(&Frame::encode(&h, body));
        }
        let done_xid = self.next_xid();
        let h = Header {
            opcode: Opcode::Ping as u16,
            flags: FLAG_REPLAY_DONE,
            xid: done_xid,
            handle: rep.handle,
            conn_cnt,
            ..Default::default()
        };
        out.extend_from_slice(&Frame::encode(&h, &Request::Ping(Empty {}).encode()));
        if !frames.is_empty() || !locks.is_empty() {
            info!(target = %self.cfg.target, changes, opens = frames.len() - changes, locks = locks.len(), "the target restarted: replaying what it had not committed, reopening open files and taking locks again");
        }
        let by_xid: std::collections::HashMap<u64, (u64, u64)> = frames
            .values()
            .map(|(h, _)| (h.xid, (h.transno, h.last_xid)))
            .collect();
        if let Some(s) = sealer.as_mut() {
            out = s.seal(&out);
        }
        let (mut rd, mut wr) = sock.split();
        let write = async { wr.write_all(&out).await.is_ok() };
        let read = async {
            loop {
                let Ok(f) = read_sealed(&mut rd, opener.as_deref_mut()).await else {
                    return false;
                };
                if f.header.flags & FLAG_REPLY == 0 {
                    continue;
                }
                if f.header.xid == done_xid {
                    self.committed(f.header.last_committed);
                    return f.header.status >= 0;
                }
                if lock_xids.contains(&f.header.xid) {
                    if f.header.status < 0 {
                        let e = Errno::from_status(f.header.status);
                        warn!(target = %self.cfg.target, "a lock could not be taken again ({e}): it is lost");
                    }
                    continue;
                }
                let Some(&(transno, open_handle)) = by_xid.get(&f.header.xid) else {
                    continue;
                };
                let status = f.header.status;
                if status < 0 {
                    // Nothing more can be done for it: say so where an admin looks.
                    let e = Errno::from_status(status);
                    if open_handle != 0 {
                        self.opens.lock().held.remove(&open_handle);
                    }
                    let lost = self.replay.lock().remove(&transno);
                    if let Some(r) = lost {
                        self.lose(std::iter::once(r));
                        warn!(target = %self.cfg.target, xid = f.header.xid, transno, "replay refused ({e}): a change this client was told succeeded is lost");
                    } else {
                        warn!(target = %self.cfg.target, transno, "an open file could not be opened again ({e}): its handle is lost");
                    }
                } else if f.header.transno != transno && f.header.transno != 0 {
                    let mut r = self.replay.lock();
                    if let Some(e) = r.remove(&transno) {
                        r.insert(f.header.transno, e);
                    }
                }
            }
        };
        // A target waits for every client before it ends recovery: as long as its
        // hard window, and then some.
        let limit = self.cfg.timeout.max(Duration::from_secs(
            lode_base::limits::RECOVERY_TIME_HARD_DEFAULT_S + 30,
        ));
        match tokio::time::timeout(limit, async { tokio::join!(write, read) }).await {
            Ok((true, true)) => {
                self.replayed.fetch_add(changes as u64, Ordering::Relaxed);
                self.replayed_bytes
                    .fetch_add(change_bytes, Ordering::Relaxed);
                if !frames.is_empty() || !locks.is_empty() {
                    info!(target = %self.cfg.target, "replay done");
                }
                Ok(())
            }
            _ => Err(None),
        }
    }

    /// The connection of generation `gen` failed: forget it and, if anyone waits,
    /// reconnect.
    fn conn_lost(self: &Arc<Self>, gen: u64) {
        let restart = {
            let mut st = self.state.lock();
            if st.gen != gen || st.tx.is_none() {
                false
            } else {
                st.tx = None;
                let r = !st.connecting && self.wants_connection();
                if r {
                    st.connecting = true;
                }
                r
            }
        };
        if restart {
            warn!(target = %self.cfg.target, "connection lost, reconnecting");
            let me = self.clone();
            self.rt.spawn(me.reconnect());
        }
    }

    /// Keeps resending a modification whose caller gave up until the target answers it
    /// (the reply frees its tag) or the target refuses this client.
    async fn resend_orphan(self: Arc<Self>, xid: u64) {
        loop {
            tokio::time::sleep(self.resend_interval()).await;
            let Some((op, tag, body, flags)) = self
                .pending
                .lock()
                .map
                .get(&xid)
                .map(|p| (p.opcode, p.tag, p.body.clone(), p.flags))
            else {
                return;
            };
            self.send(xid, op, tag, &body, FLAG_RESENT | flags);
        }
    }

    /// Takes a modify tag, waiting while `max_mod_rpcs_in_flight` are taken (a close
    /// may take one more).
    async fn take_tag(&self, close: bool) -> TagGuard {
        loop {
            let freed = self.tags.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(t) = self.tags.try_take(close) {
                return t;
            }
            freed.await;
        }
    }

    /// Lowest unreplied xid minus one: the server may drop reply records at or below it.
    fn last_xid(&self) -> u64 {
        match self.pending.lock().map.keys().next() {
            Some(x) => x - 1,
            None => self.xid.load(Ordering::Relaxed),
        }
    }

    fn send(self: &Arc<Self>, xid: u64, opcode: u16, tag: u16, body: &[u8], flags: u16) {
        self.send_first(xid, opcode, tag, body, flags, (&[], &[]));
    }

    /// Sends a request, after the `ahead` frames (opcode and body, xid 0: nobody
    /// answers them) in the same write, with `cancels` leading its body. Returns the
    /// `conn_cnt` of the connection it went out on (`None`: not sent; a reconnect
    /// sends it, without `ahead` or `cancels`: a lock the target still thinks held is
    /// called back, and the client answers that it holds none).
    fn send_first(
        self: &Arc<Self>,
        xid: u64,
        opcode: u16,
        tag: u16,
        body: &[u8],
        flags: u16,
        (ahead, cancels): (&[(Opcode, Vec<u8>)], &[u64]),
    ) -> Option<u32> {
        let mut st = self.state.lock();
        let Some(conn) = st.tx.clone() else {
            if let Some(e) = st.refused {
                drop(st);
                // Fail fast: the target refused us and will keep refusing.
                self.fail_pending(e);
                return None;
            }
            if !st.connecting {
                st.connecting = true;
                drop(st);
                let me = self.clone();
                self.rt.spawn(me.reconnect());
            }
            return None;
        };
        let header = Header {
            opcode,
            flags,
            tag,
            xid,
            handle: st.handle,
            last_xid: 0,
            conn_cnt: st.conn_cnt,
            ..Default::default()
        };
        drop(st);
        let header = Header {
            last_xid: self.last_xid(),
            ..header
        };
        let mut bytes = Vec::new();
        for (op, b) in ahead {
            let ch = Header {
                opcode: *op as u16,
                flags: 0,
                tag: 0,
                xid: 0,
                ..header
            };
            bytes.extend_from_slice(&Frame::encode(&ch, b));
        }
        if cancels.is_empty() {
            bytes.extend_from_slice(&Frame::encode(&header, body));
        } else {
            let header = Header {
                flags: header.flags | lode_proto::frame::FLAG_CANCELS,
                ..header
            };
            bytes.extend_from_slice(&Frame::encode(
                &header,
                &lode_proto::frame::with_cancels(cancels, body),
            ));
        }
        conn.sink.send(bytes);
        Some(header.conn_cnt)
    }

    fn fail_pending(&self, _e: Errno) {
        // Dropping the senders wakes every waiter with the refusal.
        let map = std::mem::take(&mut *self.pending.lock());
        drop(map);
    }

    /// Boxed: a reconnect may be started from code that a reconnect runs, and a boxed
    /// future breaks that type cycle.
    fn reconnect(
        self: Arc<Self>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move { self.reconnect_loop().await })
    }

    async fn reconnect_loop(mut self: Arc<Self>) {
        let mut backoff = Duration::from_millis(20);
        loop {
            match self.try_connect().await {
                Ok(()) => break,
                Err(Some(refusal)) => {
                    let mut st = self.state.lock();
                    st.refused = Some(refusal);
                    st.connecting = false;
                    drop(st);
                    self.fail_pending(refusal);
                    return;
                }
                Err(None) => {
                    if !self.wants_connection() {
                        // Nobody waits: connect again when someone asks.
                        self.state.lock().connecting = false;
                        return;
                    }
                    // Not holding the import while asleep: a client dropped meanwhile
                    // stops trying.
                    let weak = Arc::downgrade(&self);
                    drop(self);
                    tokio::time::sleep(backoff).await;
                    let Some(me) = weak.upgrade() else { return };
                    self = me;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
        // Resend everything that has not been answered, in xid order, on the new connection.
        type Resend = (u64, u16, u16, Arc<Vec<u8>>, u16);
        let resend: Vec<Resend> = self
            .pending
            .lock()
            .map
            .iter()
            .map(|(x, p)| (*x, p.opcode, p.tag, p.body.clone(), p.flags))
            .collect();
        for (xid, op, tag, body, flags) in resend {
            self.send(xid, op, tag, &body, FLAG_RESENT | flags);
        }
        self.kick(&mut self.lead.lock());
    }

    /// One connection attempt: TCP, then CONNECT. `Err(Some(e))` is a refusal by the
    /// target (bad fsname, key or version), `Err(None)` a transient failure.
    async fn try_connect(self: &Arc<Self>) -> Result<(), Option<Errno>> {
        let addr = self.addr();
        let mut sock =
            match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&addr)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    debug!(target = %self.cfg.target, %addr, "connect failed: {e}");
                    return Err(None);
                }
                Err(_) => return Err(None),
            };
        let _ = sock.set_nodelay(true);
        let (auth, mut session) = match self.handshake(&mut sock, &addr).await? {
            Some((proof, sealer, opener)) => (proof, Some((sealer, opener))),
            None => (Vec::new(), None),
        };
        let req = Request::Connect(ConnectReq {
            fsname: self.cfg.fsname.clone(),
            target: self.cfg.target.clone(),
            client_uuid: self.cfg.client_uuid.clone(),
            flags: self.cfg.flags,
            max_mod_rpcs: self.cfg.max_mod_rpcs,
            auth,
        });
        let xid = self.next_xid();
        let header = Header {
            opcode: Opcode::Connect as u16,
            xid,
            ..Default::default()
        };
        use tokio::io::AsyncWriteExt;
        if sock
            .write_all(&Frame::encode(&header, &req.encode()))
            .await
            .is_err()
        {
            return Err(None);
        }
        let rest = match tokio::time::timeout(Duration::from_secs(10), read_raw(&mut sock)).await {
            Ok(Ok(f)) => f,
            _ => return Err(None),
        };
        let frame = match handshake_reply(rest, session.as_mut().map(|s| &mut s.1)) {
            Ok(f) => f,
            Err(why) => {
                warn!(target = %self.cfg.target, %addr, "connection refused: {why}");
                return Err(Some(Errno::EACCES));
            }
        };
        if frame.header.status < 0 {
            let e = Errno::from_status(frame.header.status);
            if e == Errno::EAGAIN {
                // The target is in recovery and does not wait for this client: later.
                debug!(target = %self.cfg.target, %addr, "target busy recovering, connecting again");
                return Err(None);
            }
            warn!(target = %self.cfg.target, %addr, "connection refused by target: {e}");
            return Err(Some(e));
        }
        let Ok(Reply::Connect(rep)) = Reply::decode(Opcode::Connect as u16, &frame.body) else {
            return Err(Some(Errno::EPROTO));
        };
        let committed = frame.header.last_committed;
        self.committed(committed);
        let (restarted, conn_cnt) = {
            let st = self.state.lock();
            let restarted = st
                .granted
                .as_ref()
                .is_some_and(|g| g.instance != rep.instance);
            (restarted, st.conn_cnt.wrapping_add(1))
        };
        if rep.recovering {
            self.replay_all(&mut sock, &rep, conn_cnt, session.as_mut())
                .await?;
        } else if restarted {
            let gone = self.replay.lock().take();
            let lost = gone.len();
            self.lose(gone.into_values());
            // Nothing this client held there survived: its open handles are stale.
            *self.opens.lock() = HeldOpens::default();
            self.forgotten.fetch_add(1, Ordering::AcqRel);
            if lost > 0 {
                warn!(target = %self.cfg.target, lost, "the target restarted and ended its recovery without this client: changes it had not committed are lost");
            }
        }
        // From here on the runtime watches the socket for room to write only; replies
        // are read by waiting callers or the reader thread.
        let registered = sock.into_std().and_then(|s| {
            // SAFETY: the TcpStream owns its descriptor, keeps it open and returns the
            // same one for as long as the AsyncFd owns the stream.
            unsafe { AsyncFd::register_with_interest(s, Interest::WRITABLE) }
                .map_err(|e| e.into_parts().1)
        });
        let sock = match registered {
            Ok(s) => Arc::new(s),
            Err(e) => {
                debug!(target = %self.cfg.target, %addr, "socket setup failed: {e}");
                return Err(None);
            }
        };
        let sink = FrameSink::with_writer(sock.clone());
        let mut rd = RdBuf::default();
        if let Some((sealer, opener)) = session {
            sink.set_sealer(sealer);
            rd.opener = Some(opener);
        }
        let mut st = self.state.lock();
        st.gen += 1;
        st.conn_cnt = st.conn_cnt.wrapping_add(1);
        st.handle = rep.handle;
        st.tx = Some(Arc::new(Conn {
            gen: st.gen,
            sock,
            sink,
            spin: Mutex::default(),
            rd: Mutex::new(rd),
        }));
        st.connecting = false;
        let reconnect = st.granted.is_some();
        if rep.max_mod_rpcs < self.tags.limit() {
            self.tags.set_limit(rep.max_mod_rpcs);
        }
        st.granted = Some(rep);
        drop(st);
        if reconnect {
            info!(target = %self.cfg.target, %addr, "reconnected");
        }
        Ok(())
    }
}

/// The first step of a keyed connection (see [`crate::auth`]): nonces both ways, as
/// client `uuid` of `target`. Returns the proof for the request that completes the
/// handshake, and the session; `None` without a key. `Err(Some(_))`: the target
/// refused; `Err(None)`: the connection failed.
pub async fn client_handshake(
    sock: &mut TcpStream,
    key: &[u8],
    uuid: &str,
    target: &str,
    xid: u64,
) -> Result<Option<(Vec<u8>, Sealer, Opener)>, Option<Errno>> {
    if key.is_empty() {
        return Ok(None);
    }
    let mine = crate::auth::nonce().to_vec();
    let header = Header {
        opcode: Opcode::AuthNonce as u16,
        xid,
        ..Default::default()
    };
    let req = Request::AuthNonce(lode_proto::NonceMsg {
        nonce: mine.clone(),
    });
    use tokio::io::AsyncWriteExt;
    if sock
        .write_all(&Frame::encode(&header, &req.encode()))
        .await
        .is_err()
    {
        return Err(None);
    }
    let f = match tokio::time::timeout(Duration::from_secs(10), read_frame(sock)).await {
        Ok(Ok(f)) => f,
        _ => return Err(None),
    };
    let theirs = match Reply::decode(Opcode::AuthNonce as u16, &f.body) {
        Ok(Reply::AuthNonce(n)) if f.header.status == 0 && n.nonce.len() == NONCE_LEN => n.nonce,
        _ if f.header.status < 0 => return Err(Some(Errno::from_status(f.header.status))),
        _ => return Err(Some(Errno::EPROTO)),
    };
    let hs = crate::auth::Handshake {
        server: &theirs,
        client: &mine,
        uuid,
        target,
    };
    let (sealer, opener) = hs.client_session(key).ok_or(Some(Errno::EINVAL))?;
    Ok(Some((hs.proof(key), sealer, opener)))
}

/// The reply to the request that completes a handshake (CONNECT, a callback channel's
/// registration), as read after its length field: on a keyed connection a grant must
/// be sealed (the target proves the key too); a refusal may come unsealed.
pub fn handshake_reply(mut rest: Vec<u8>, opener: Option<&mut Opener>) -> Result<Frame, String> {
    let Some(opener) = opener else {
        open_rest(&mut rest, None).map_err(|e| e.to_string())?;
        return Frame::decode_rest(rest).map_err(|e| e.to_string());
    };
    if crate::auth::says_sealed(&rest) {
        opener
            .open(&mut rest)
            .map_err(|_| "the target's reply fails the key: not a target of this file system")?;
        return Frame::decode_rest(rest).map_err(|e| e.to_string());
    }
    let f = Frame::decode_rest(rest).map_err(|e| e.to_string())?;
    if f.header.status < 0 {
        return Ok(f);
    }
    Err("the target granted the connection without proving the key (it has none?)".into())
}

/// The import's reader thread: reads while passive calls wait and no caller reads, and
/// stops as soon as none does (the others read for themselves). Ends when the import is
/// dropped.
fn reader_thread(imp: Weak<Import>) {
    loop {
        let Some(me) = imp.upgrade() else { return };
        let conn = {
            let mut lead = me.lead.lock();
            if lead.leader || !lead.kick {
                // Short: this holds the import, which a dropped client then keeps no
                // longer than this.
                me.reader_cv.wait_for(&mut lead, READER_IDLE);
            }
            if lead.leader || !lead.kick {
                let idle = !lead.leader;
                drop(lead);
                if idle {
                    me.check_alive();
                }
                continue;
            }
            lead.kick = false;
            let Some(conn) = me.state.lock().tx.clone() else {
                continue;
            };
            if me.pending.lock().n_passive == 0 {
                continue;
            }
            lead.leader = true;
            conn
        };
        loop {
            // One round at a time: after each, see whether tasks still wait.
            let alive = match me.read_some(&conn, READER_ROUND) {
                Ok(()) => true,
                Err(e) => {
                    debug!(target = %me.cfg.target, "connection lost: {e}");
                    me.conn_lost(conn.gen);
                    false
                }
            };
            let mut lead = me.lead.lock();
            let stale = me.state.lock().tx.as_ref().map(|c| c.gen) != Some(conn.gen);
            let n_passive = me.pending.lock().n_passive;
            if !alive || stale || n_passive == 0 {
                lead.leader = false;
                if alive {
                    me.kick(&mut lead);
                }
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take_now(tags: &Arc<Tags>, close: bool) -> Option<TagGuard> {
        tags.try_take(close)
    }

    #[test]
    fn one_close_beyond_the_limit_and_tags_never_shared() {
        let tags = Arc::new(Tags::new(2));
        let a = take_now(&tags, false).expect("tag 1");
        let b = take_now(&tags, false).expect("tag 2");
        assert!(
            take_now(&tags, false).is_none(),
            "a third modification waits"
        );
        let c = take_now(&tags, true).expect("one close beyond the limit");
        assert!(take_now(&tags, true).is_none(), "a second close waits");
        let mut all = [a.tag, b.tag, c.tag];
        all.sort();
        assert_eq!(all, [1, 2, 3]);
        drop(a);
        assert!(
            take_now(&tags, false).is_none(),
            "the close counts: 2 of 2 taken"
        );
        drop(c);
        let d = take_now(&tags, false).expect("a freed tag is reused");
        assert_eq!(d.tag, 1);
    }

    #[test]
    fn lowering_the_limit_while_tags_are_held_reuses_none_of_them() {
        let tags = Arc::new(Tags::new(4));
        let mut held: Vec<TagGuard> = (0..4)
            .map(|_| take_now(&tags, false).expect("tag"))
            .collect();
        tags.set_limit(1);
        assert!(take_now(&tags, false).is_none(), "4 held, limit 1: wait");
        let last = held.pop().expect("4 held");
        drop(held);
        assert!(take_now(&tags, false).is_none(), "still 1 held: wait");
        assert_eq!(tags.in_flight(), 1);
        let kept = last.tag;
        drop(last);
        let next = take_now(&tags, false).expect("none held: a tag");
        assert!(next.tag == 1 || next.tag == kept);
    }
}
