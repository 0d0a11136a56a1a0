//! The OST's replay recovery, the MDT's protocol over the same bookkeeping
//! ([`lode_rpc::recovery`]): a client keeps every write (punch, destroy, setattr) it was
//! answered until a reply's `last_committed` covers it; after a restart the OST waits
//! for the clients that may have such changes, runs their replays in transno order
//! across clients, commits, and only then serves anything else. So a crash of the OSS,
//! or a power cut of its disk, loses nothing a client that lives on was told it wrote.
//!
//! Which clients to wait for is kept durably in `clients` (one UUID per line): a client
//! is listed before its first change is answered, and leaves the list once its
//! connection is gone and a commit has covered every change made before that.

use crate::{Export, Ost};
use lode_base::Errno;
use lode_proto::frame::{FLAG_REPLAY, FLAG_REPLAY_DONE};
use lode_proto::{Empty, OstRequest, Reply};
use lode_rpc::recovery::Next;
use lode_rpc::server::Deferred;
use lode_rpc::{Incoming, Outgoing, Service};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// The file in the OST directory listing the clients recovery waits for.
const CLIENTS_FILE: &str = "clients";

/// Longest client UUID accepted (Lustre's `UUID_MAX` is 40; lode's are longer).
const UUID_MAX: usize = 128;

/// Whether a client UUID can be kept on the list: not empty, not too long, no control
/// characters (a newline would split its line).
pub(crate) fn valid_uuid(uuid: &str) -> bool {
    !uuid.is_empty() && uuid.len() <= UUID_MAX && !uuid.chars().any(char::is_control)
}

/// The clients of an OST: who is connected now, and who recovery must wait for.
pub(crate) struct Clients {
    path: PathBuf,
    inner: Mutex<ClientsInner>,
}

#[derive(Default)]
struct ClientsInner {
    /// Every client seen since the start → its slot (recovery's name for it).
    slots: HashMap<String, u32>,
    /// Connections per client now.
    conns: HashMap<String, usize>,
    /// The durable list: clients that may have uncommitted changes.
    listed: BTreeSet<String>,
    /// Clients whose connection went, with the transno given last when it did.
    leaving: Vec<(u64, String)>,
}

impl ClientsInner {
    fn slot(&mut self, uuid: &str) -> u32 {
        let n = self.slots.len() as u32;
        *self.slots.entry(uuid.to_string()).or_insert(n)
    }
}

impl Clients {
    /// Loads the list under `dir`; returns it with the clients recovery waits for
    /// (slot → UUID).
    pub fn load(dir: &Path) -> std::io::Result<(Clients, HashMap<u32, String>)> {
        let path = dir.join(CLIENTS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let mut inner = ClientsInner::default();
        let mut expected = HashMap::new();
        for uuid in text.lines().filter(|l| valid_uuid(l)) {
            let slot = inner.slot(uuid);
            inner.listed.insert(uuid.to_string());
            expected.insert(slot, uuid.to_string());
        }
        Ok((
            Clients {
                path,
                inner: Mutex::new(inner),
            },
            expected,
        ))
    }

    /// The slot of a client (given now if new).
    pub fn slot(&self, uuid: &str) -> u32 {
        self.inner.lock().slot(uuid)
    }

    /// Whether the client is on the durable list.
    pub fn is_listed(&self, uuid: &str) -> bool {
        self.inner.lock().listed.contains(uuid)
    }

    /// A connection of the client is up.
    pub fn connected(&self, uuid: &str) {
        let mut i = self.inner.lock();
        i.slot(uuid);
        *i.conns.entry(uuid.to_string()).or_default() += 1;
    }

    /// A connection of the client went when `transno` was the last given.
    pub fn gone(&self, uuid: &str, transno: u64) {
        let mut i = self.inner.lock();
        if let Some(n) = i.conns.get_mut(uuid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                i.conns.remove(uuid);
            }
        }
        if i.listed.contains(uuid) {
            i.leaving.push((transno, uuid.to_string()));
        }
    }

    /// Puts the client on the durable list.
    pub fn list(&self, uuid: &str) -> Result<(), Errno> {
        let mut i = self.inner.lock();
        if i.listed.insert(uuid.to_string()) {
            if let Err(e) = self.persist(&i) {
                i.listed.remove(uuid);
                warn!("cannot record a client for recovery: {e}");
                return Err(Errno::from_io(&e));
            }
        }
        Ok(())
    }

    /// Everything up to `transno` is durable: clients that left before it and have
    /// not come back leave the list.
    pub fn committed(&self, transno: u64) {
        let mut i = self.inner.lock();
        if !i.leaving.iter().any(|(t, _)| *t <= transno) {
            return;
        }
        let (done, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut i.leaving)
            .into_iter()
            .partition(|(t, _)| *t <= transno);
        i.leaving = rest;
        let mut changed = false;
        for (_, uuid) in done {
            if !i.conns.contains_key(&uuid) && !i.leaving.iter().any(|(_, u)| *u == uuid) {
                changed |= i.listed.remove(&uuid);
            }
        }
        if changed {
            if let Err(e) = self.persist(&i) {
                // Only makes a later recovery wait for a client that is gone.
                warn!("cannot update the clients recovery waits for: {e}");
            }
        }
    }

    /// Evicted: not waited for again (its connections are gone already).
    pub fn evicted(&self, uuid: &str) {
        let mut i = self.inner.lock();
        i.conns.remove(uuid);
        i.leaving.retain(|(_, u)| u != uuid);
        if i.listed.remove(uuid) {
            if let Err(e) = self.persist(&i) {
                warn!("cannot update the clients recovery waits for: {e}");
            }
        }
    }

    fn persist(&self, i: &ClientsInner) -> std::io::Result<()> {
        let mut text = String::new();
        for u in &i.listed {
            text.push_str(u);
            text.push('\n');
        }
        lode_base::config::write_durable(&self.path, text.as_bytes(), 0o600)
    }
}

/// The reply a change gets.
fn reply_of(req: &OstRequest) -> Reply {
    match req {
        OstRequest::Punch(_) => Reply::Punch(Empty {}),
        OstRequest::OstFallocate(_) => Reply::OstFallocate(Empty {}),
        OstRequest::Destroy(_) => Reply::Destroy(Empty {}),
        OstRequest::OstSetattr(_) => Reply::OstSetattr(Empty {}),
        // A replay's object may have changed since: nothing said of it.
        _ => Reply::OstWrite(lode_proto::OstWriteRep::default()),
    }
}

/// A replay waiting for its turn.
pub(crate) struct OstReplay {
    inc: Incoming,
    slot: u32,
    uuid: String,
    req: OstRequest,
    d: Deferred,
}

/// Recovery's state and the requests held until it ends.
pub(crate) type Recovery = lode_rpc::recovery::Recovery<OstReplay>;

/// Moves recovery on when nothing arrives: the windows pass, clients are evicted.
pub(crate) fn start_timer(ost: &Arc<Ost>) -> std::io::Result<()> {
    let weak: Weak<Ost> = Arc::downgrade(ost);
    std::thread::Builder::new()
        .name("ost-recovery".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_millis(100));
            let Some(o) = weak.upgrade() else { return };
            if !o.in_recovery.load(Ordering::Acquire) {
                return;
            }
            o.recover();
        })?;
    Ok(())
}

impl Ost {
    /// A request while recovery runs: a replay is queued for its turn, anything else
    /// waits for the end (a client's final PING, flagged `FLAG_REPLAY_DONE`, among
    /// them). `Err` gives the request back if recovery ended meanwhile.
    pub(crate) fn during_recovery(
        &self,
        inc: &Incoming,
        exp: &Arc<Export>,
        req: OstRequest,
    ) -> Result<Outgoing, Box<OstRequest>> {
        let replay = inc.header.flags & FLAG_REPLAY != 0
            && matches!(
                req,
                OstRequest::OstWrite(_)
                    | OstRequest::Punch(_)
                    | OstRequest::OstFallocate(_)
                    | OstRequest::Destroy(_)
                    | OstRequest::OstSetattr(_)
            );
        let Some(d) = inc.defer() else {
            return Ok(Outgoing::error(Errno::EAGAIN));
        };
        let slot = self.clients.slot(&exp.uuid);
        {
            let mut rec = self.recovery.lock();
            if !rec.st.active {
                return Err(Box::new(req));
            }
            let again = d.request(inc.body.clone(), inc.peer, inc.conn_id);
            if replay {
                let (xid, transno) = (inc.header.xid, inc.header.transno);
                let r = OstReplay {
                    inc: again,
                    slot,
                    uuid: exp.uuid.clone(),
                    req,
                    d,
                };
                // A replay sent twice (its client reconnected): the newer one waits.
                drop(rec.st.queue(slot, xid, transno, r));
            } else {
                if matches!(req, OstRequest::Ping(_))
                    && inc.header.flags & FLAG_REPLAY_DONE != 0
                    && rec.st.expects(slot)
                {
                    rec.st.done.insert(slot);
                }
                rec.held.push((again, d));
            }
        }
        self.recover();
        Ok(Outgoing::parked())
    }

    /// Runs one replayed change under its original transno.
    fn replay(&self, req: &OstRequest, transno: u64) -> Result<u64, Errno> {
        let at = Some(transno);
        match req {
            // An append is replayed where its reply said it went (the client's
            // replay says so, `append` cleared).
            OstRequest::OstWrite(r) => self
                .write(&r.obj, r.offset, &r.data, at, r.append, None)
                .map(|(t, _, _)| t),
            OstRequest::Punch(r) => {
                crate::punch_object(&self.objects, &r.obj, r.size, self.commit.undo.as_deref())?;
                Ok(self.commit.wrote(r.obj, at))
            }
            OstRequest::OstFallocate(r) => {
                crate::fallocate_object(&self.objects, r, self.commit.undo.as_deref())?;
                Ok(self.commit.wrote(r.obj, at))
            }
            OstRequest::Destroy(r) => self.destroy(crate::bounded(&r.objs)?, at),
            OstRequest::OstSetattr(r) => self.set_mtime(crate::bounded(&r.objs)?, r.mtime, at),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Moves recovery on as far as it can now: runs the replays whose turn it is,
    /// evicts clients past the windows, and at the end commits and serves what was
    /// held.
    pub(crate) fn recover(&self) {
        loop {
            let soft = Duration::from_secs(self.recovery_soft_s.load(Ordering::Relaxed));
            let hard = Duration::from_secs(self.recovery_hard_s.load(Ordering::Relaxed));
            let next = self.recovery.lock().st.next(Instant::now(), soft, hard);
            match next {
                Next::Wait => return,
                Next::Done(r) => {
                    let t = r.inc.header.transno;
                    self.recovery.lock().st.ran(r.slot, r.inc.header.xid, t);
                    r.d.send(Outgoing {
                        transno: t,
                        last_committed: self.commit.last_committed(),
                        ..Default::default()
                    });
                }
                Next::Run(r) => {
                    let t = r.inc.header.transno;
                    let res = self.replay(&r.req, t);
                    {
                        let mut rec = self.recovery.lock();
                        rec.st.running = false;
                        if res.is_ok() {
                            rec.st.replayed += 1;
                        }
                        rec.st.ran(r.slot, r.inc.header.xid, t);
                    }
                    if let Err(e) = &res {
                        warn!(client = %r.uuid, xid = r.inc.header.xid, transno = t, "replay failed: {e}");
                    }
                    r.d.send(self.changed(res, reply_of(&r.req)));
                }
                Next::Evict(gone) => self.evict_unrecovered(&gone),
                Next::End(gone) => {
                    self.evict_unrecovered(&gone);
                    // Replays are durable before anything new is answered: a second
                    // crash must not need them again from clients that may be gone.
                    if let Err(e) = self.commit.run(&self.objects) {
                        warn!("commit after recovery failed: {e}");
                    }
                    let ended = {
                        let mut rec = self.recovery.lock();
                        self.in_recovery.store(false, Ordering::Release);
                        rec.end()
                    };
                    for r in ended.left {
                        r.d.send(self.out(Err(Errno::ESTALE)));
                    }
                    info!(target = %self.cfg.target_name(), duration = ?ended.duration, replayed = ended.replayed, gaps = ended.gaps, evicted = ended.evicted, "recovery over");
                    for (inc, d) in ended.held {
                        d.send(Service::handle(self, &inc));
                    }
                    return;
                }
            }
        }
    }

    /// Clients recovery stopped waiting for: their uncommitted changes are lost.
    fn evict_unrecovered(&self, gone: &[(u32, String)]) {
        for (_, uuid) in gone {
            warn!(client = %uuid, "recovery: client did not come back in time: evicted, its uncommitted writes are lost");
            self.drop_exports(uuid);
            self.clients.evicted(uuid);
        }
    }

    /// Drops every export of a client: its next request gets ENOTCONN.
    fn drop_exports(&self, uuid: &str) {
        self.handles.write().retain(|_, e| e.uuid != uuid);
    }

    /// `obdfilter.*.evict_client=UUID`: evicts that client now (its exports go; it
    /// reconnects as if new) and recovery stops waiting for it. A client the OST does
    /// not know is nothing to do.
    pub fn evict_client(&self, uuid: &str) -> Result<(), String> {
        warn!(client = %uuid, "evicting client: by the administrator");
        self.drop_exports(uuid);
        self.clients.evicted(uuid);
        let slot = self.clients.slot(uuid);
        let recovering = {
            let mut r = self.recovery.lock();
            r.st.give_up_on(slot);
            r.st.active
        };
        if recovering {
            self.recover();
        }
        Ok(())
    }

    /// `obdfilter.*.recovery_status`, in Lustre's format.
    pub fn recovery_status(&self) -> String {
        self.recovery.lock().st.status(
            self.recovery_soft_s.load(Ordering::Relaxed),
            self.recovery_hard_s.load(Ordering::Relaxed),
        )
    }
}
