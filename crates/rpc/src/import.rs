//! The client side of one target connection (Lustre's import): xids, modify tags,
//! the in-flight limit, reconnect after a lost connection and resend of every request
//! still waiting for its reply (same xid, `RESENT` flag).

use crate::wire::{read_frame, FrameSink};
use lode_base::Errno;
use lode_proto::frame::{FLAG_REPLY, FLAG_RESENT};
use lode_proto::{ConnectRep, ConnectReq, Empty, Frame, Header, Opcode, Reply, Request};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::{oneshot, Semaphore};
use tracing::{debug, info, warn};

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
    tx: oneshot::Sender<Frame>,
}

struct ConnState {
    tx: Option<Arc<FrameSink>>,
    gen: u64,
    handle: u64,
    conn_cnt: u32,
    connecting: bool,
    refused: Option<Errno>,
    granted: Option<ConnectRep>,
}

struct Tags {
    bits: Mutex<Vec<bool>>,
    sem: Semaphore,
}

/// One connection to one target, shareable by many tasks and threads.
pub struct Import {
    cfg: ImportConfig,
    addr: Mutex<String>,
    rt: Handle,
    xid: AtomicU64,
    state: Mutex<ConnState>,
    pending: Mutex<BTreeMap<u64, Pending>>,
    rif: Semaphore,
    tags: Mutex<Arc<Tags>>,
    last_committed: AtomicU64,
}

struct TagGuard {
    tags: Arc<Tags>,
    tag: u16,
}

impl Drop for TagGuard {
    fn drop(&mut self) {
        self.tags.bits.lock()[self.tag as usize] = false;
        self.tags.sem.add_permits(1);
    }
}

/// True if requests with this opcode modify state on the target and so take a tag (the
/// opcode table in `lode_proto` is the one source of this fact).
pub fn is_modify(op: Opcode) -> bool {
    op.is_modify()
}

impl Import {
    /// A new, not yet connected import of target at `addr`.
    pub fn new(addr: String, cfg: ImportConfig, rt: Handle) -> Arc<Import> {
        let start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
            << 20;
        let tags = Arc::new(Tags {
            bits: Mutex::new(vec![false; usize::from(cfg.max_mod_rpcs) + 1]),
            sem: Semaphore::new(usize::from(cfg.max_mod_rpcs.max(1))),
        });
        Arc::new(Import {
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
            pending: Mutex::new(BTreeMap::new()),
            rif: Semaphore::new(cfg.max_rpcs_in_flight.max(1)),
            tags: Mutex::new(tags),
            last_committed: AtomicU64::new(0),
            cfg,
        })
    }

    /// The target's name.
    pub fn target(&self) -> &str {
        &self.cfg.target
    }

    /// The address currently used.
    pub fn addr(&self) -> String {
        self.addr.lock().clone()
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
        let op = req.opcode();
        let _tag = if is_modify(op) {
            Some(self.take_tag().await?)
        } else {
            None
        };
        let _permit = self.rif.acquire().await.map_err(|_| Errno::EIO)?;
        let xid = self.next_xid();
        let tag = _tag.as_ref().map_or(0, |t| t.tag);
        let body = Arc::new(req.encode());
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(
            xid,
            Pending {
                opcode: op as u16,
                tag,
                body: body.clone(),
                tx,
            },
        );
        self.send(xid, op as u16, tag, &body, 0);
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let mut rx = rx;
        let frame = loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                self.pending.lock().remove(&xid);
                warn!(target = %self.cfg.target, xid, "request timed out after {:?}", self.cfg.timeout);
                return Err(Errno::EIO);
            }
            let wait = self
                .cfg
                .resend_interval
                .max(Duration::from_millis(10))
                .min(deadline - now);
            match tokio::time::timeout(wait, &mut rx).await {
                Ok(Ok(f)) => break f,
                Ok(Err(_)) => {
                    // Dropped sender: the import refused (e.g. CONNECT was refused).
                    self.pending.lock().remove(&xid);
                    return Err(self.state.lock().refused.unwrap_or(Errno::EIO));
                }
                Err(_) => {
                    debug!(target = %self.cfg.target, xid, "no reply yet, resending");
                    self.send(xid, op as u16, tag, &body, FLAG_RESENT);
                }
            }
        };
        self.last_committed
            .fetch_max(frame.header.last_committed, Ordering::Relaxed);
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

    async fn take_tag(&self) -> Result<TagGuard, Errno> {
        let tags = self.tags.lock().clone();
        let permit = tags.sem.acquire().await.map_err(|_| Errno::EIO)?;
        permit.forget();
        let mut bits = tags.bits.lock();
        let tag = bits
            .iter()
            .skip(1)
            .position(|b| !b)
            .map(|p| p + 1)
            .ok_or(Errno::EIO)?;
        bits[tag] = true;
        drop(bits);
        Ok(TagGuard {
            tags,
            tag: tag as u16,
        })
    }

    /// Lowest unreplied xid minus one: the server may drop reply records at or below it.
    fn last_xid(&self) -> u64 {
        match self.pending.lock().keys().next() {
            Some(x) => x - 1,
            None => self.xid.load(Ordering::Relaxed),
        }
    }

    fn send(self: &Arc<Self>, xid: u64, opcode: u16, tag: u16, body: &[u8], flags: u16) {
        let mut st = self.state.lock();
        let Some(tx) = st.tx.clone() else {
            if let Some(e) = st.refused {
                drop(st);
                // Fail fast: the target refused us and will keep refusing.
                self.fail_pending(e);
                return;
            }
            if !st.connecting {
                st.connecting = true;
                drop(st);
                let me = self.clone();
                self.rt.spawn(me.reconnect());
            }
            return;
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
        tx.send(Frame::encode(&header, body));
    }

    fn fail_pending(&self, _e: Errno) {
        // Dropping the senders wakes every waiter with the refusal.
        self.pending.lock().clear();
    }

    /// Boxed: the reader task of a new connection may start another reconnect, and a
    /// boxed future breaks that type cycle.
    fn reconnect(
        self: Arc<Self>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move { self.reconnect_loop().await })
    }

    async fn reconnect_loop(self: Arc<Self>) {
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
                    if self.pending.lock().is_empty() {
                        // Nobody waits: connect again when someone asks.
                        self.state.lock().connecting = false;
                        return;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
        // Resend everything that has not been answered, in xid order, on the new connection.
        let resend: Vec<(u64, u16, u16, Arc<Vec<u8>>)> = self
            .pending
            .lock()
            .iter()
            .map(|(x, p)| (*x, p.opcode, p.tag, p.body.clone()))
            .collect();
        for (xid, op, tag, body) in resend {
            self.send(xid, op, tag, &body, FLAG_RESENT);
        }
    }

    /// One connection attempt: TCP, then CONNECT. `Err(Some(e))` is a refusal by the
    /// target (bad fsname, key or version), `Err(None)` a transient failure.
    async fn try_connect(self: &Arc<Self>) -> Result<(), Option<Errno>> {
        let addr = self.addr();
        let sock =
            match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&addr)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    debug!(target = %self.cfg.target, %addr, "connect failed: {e}");
                    return Err(None);
                }
                Err(_) => return Err(None),
            };
        let _ = sock.set_nodelay(true);
        let (rd, mut wr) = sock.into_split();
        let mut rd = tokio::io::BufReader::with_capacity(64 << 10, rd);
        let req = Request::Connect(ConnectReq {
            fsname: self.cfg.fsname.clone(),
            target: self.cfg.target.clone(),
            client_uuid: self.cfg.client_uuid.clone(),
            flags: self.cfg.flags,
            max_mod_rpcs: self.cfg.max_mod_rpcs,
            auth: crate::auth::proof(&self.cfg.key, &self.cfg.client_uuid, &self.cfg.target),
        });
        let xid = self.next_xid();
        let header = Header {
            opcode: Opcode::Connect as u16,
            xid,
            ..Default::default()
        };
        use tokio::io::AsyncWriteExt;
        if wr
            .write_all(&Frame::encode(&header, &req.encode()))
            .await
            .is_err()
        {
            return Err(None);
        }
        let frame = match tokio::time::timeout(Duration::from_secs(10), read_frame(&mut rd)).await {
            Ok(Ok(f)) => f,
            _ => return Err(None),
        };
        if frame.header.status < 0 {
            let e = Errno::from_status(frame.header.status);
            warn!(target = %self.cfg.target, %addr, "connection refused by target: {e}");
            return Err(Some(e));
        }
        let Ok(Reply::Connect(rep)) = Reply::decode(Opcode::Connect as u16, &frame.body) else {
            return Err(Some(Errno::EPROTO));
        };
        let tx = FrameSink::new(wr);
        let gen = {
            let mut st = self.state.lock();
            st.gen += 1;
            st.conn_cnt = st.conn_cnt.wrapping_add(1);
            st.handle = rep.handle;
            st.tx = Some(tx);
            st.connecting = false;
            let reconnect = st.granted.is_some();
            if rep.max_mod_rpcs < self.cfg.max_mod_rpcs {
                self.shrink_tags(rep.max_mod_rpcs);
            }
            st.granted = Some(rep);
            if reconnect {
                info!(target = %self.cfg.target, %addr, "reconnected");
            }
            st.gen
        };
        let me = self.clone();
        tokio::spawn(async move { me.read_loop(rd, gen).await });
        Ok(())
    }

    fn shrink_tags(&self, n: u16) {
        let n = n.max(1);
        *self.tags.lock() = Arc::new(Tags {
            bits: Mutex::new(vec![false; usize::from(n) + 1]),
            sem: Semaphore::new(usize::from(n)),
        });
    }

    async fn read_loop(
        self: Arc<Self>,
        mut rd: tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
        gen: u64,
    ) {
        loop {
            let frame = match read_frame(&mut rd).await {
                Ok(f) => f,
                Err(e) => {
                    debug!(target = %self.cfg.target, "connection lost: {e}");
                    break;
                }
            };
            if frame.header.flags & FLAG_REPLY == 0 {
                continue;
            }
            if frame.header.status == Errno::ENOTCONN.status() {
                // The target does not know our handle (it restarted): reconnect, resend.
                break;
            }
            if let Some(p) = self.pending.lock().remove(&frame.header.xid) {
                let _ = p.tx.send(frame);
            }
        }
        let restart = {
            let mut st = self.state.lock();
            if st.gen != gen {
                false
            } else {
                st.tx = None;
                let r = !st.connecting && !self.pending.lock().is_empty();
                if r {
                    st.connecting = true;
                }
                r
            }
        };
        if restart {
            warn!(target = %self.cfg.target, "connection lost, reconnecting");
            let me = self.clone();
            tokio::spawn(me.reconnect());
        }
    }
}
