//! The server side, run to completion: each service thread owns the connections it was
//! given at accept and runs its own reactor. A round on a connection reads every byte
//! already there, executes every complete request inline, lets the service make the
//! round's store writes visible to the OS once (`Service::flush`), and writes all the
//! replies with one system call. No request crosses a thread between its read and its
//! reply; a request that must wait (a SYNC for the commit, an fsync) is parked with a
//! [`Deferred`] and answered later by whoever finishes it, without holding the thread.
//!
//! Bounds (each in `lode_base::limits`): connections per server, bytes per read round,
//! requests read and unanswered per connection, how long a frame may take to arrive,
//! how long a connection may idle, how long replies may wait for a client that does
//! not read them. Frame bodies grow as their bytes arrive, never to an announced size.

use crate::fail;
use crate::stats::OpStats;
use crate::wire::FrameSink;
use lode_base::limits;
use lode_proto::frame::{split_cancels, FLAG_CALLBACK, FLAG_CANCELS, FLAG_REPLY, FLAG_SEALED};
use lode_proto::{DecodeError, Frame, FrameError, Header, Opcode, Reply};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};
use tracing::{debug, info, warn};

/// One request as a service sees it.
pub struct Incoming {
    /// The request header.
    pub header: Header,
    /// The postcard body (decode with `Request::decode(header.opcode, …)`).
    pub body: Vec<u8>,
    /// The early lock cancels that led the body (`FLAG_CANCELS`), taken off it: the
    /// service applies them before the request.
    pub cancels: Vec<u64>,
    /// The peer's address.
    pub peer: SocketAddr,
    /// Identifies the TCP connection, for services that tie state to it.
    pub conn_id: u64,
    /// Where a parked request's reply goes; `None` for requests built in-process.
    reply_to: Option<ReplyTo>,
    start: Instant,
}

#[derive(Clone)]
struct ReplyTo {
    sink: Arc<FrameSink>,
    conn: Arc<ConnShared>,
    stats: Option<Arc<dyn Service>>,
}

impl Incoming {
    /// A request built in-process (tests, tools): it has no connection to reply on, so
    /// it cannot be parked.
    pub fn local(header: Header, body: Vec<u8>, peer: SocketAddr, conn_id: u64) -> Incoming {
        Incoming {
            header,
            body,
            cancels: Vec::new(),
            peer,
            conn_id,
            reply_to: None,
            start: Instant::now(),
        }
    }

    /// Decodes the body with a service's decoder (`MdtRequest::decode`, …). An opcode of
    /// another service gets EOPNOTSUPP; a malformed body gets EPROTO and a log line
    /// naming the peer.
    pub fn decode<T>(
        &self,
        decode: fn(u16, &[u8]) -> Result<T, DecodeError>,
    ) -> Result<T, lode_base::Errno> {
        decode(self.header.opcode, &self.body).map_err(|e| match e {
            DecodeError::Service(_) => lode_base::Errno::EOPNOTSUPP,
            e => {
                warn!(peer = %self.peer, "bad request: {e}");
                lode_base::Errno::EPROTO
            }
        })
    }

    /// Parks this request: the service returns [`Outgoing::parked`] now and answers
    /// through the [`Deferred`] later, from any thread. `None` when the request has no
    /// connection (built in-process); the service must then answer inline.
    pub fn defer(&self) -> Option<Deferred> {
        let to = self.reply_to.clone()?;
        to.conn.inflight.fetch_add(1, Ordering::AcqRel);
        Some(Deferred {
            to: Some(to),
            header: self.header,
            start: self.start,
        })
    }
}

/// A connection a client gave the server for callbacks: the server sends requests
/// (flagged [`FLAG_CALLBACK`]) on it from any thread, and does not wait for answers.
#[derive(Clone)]
pub struct CallbackChannel {
    sink: Arc<FrameSink>,
    /// The connection, for [`Service::disconnected`] bookkeeping by the service.
    pub conn_id: u64,
}

static NEXT_CALLBACK_XID: AtomicU64 = AtomicU64::new(1);

impl CallbackChannel {
    /// Sends a callback; false if the connection is gone.
    pub fn send(&self, req: &lode_proto::Request) -> bool {
        let header = Header {
            opcode: req.opcode() as u16,
            flags: FLAG_CALLBACK,
            xid: NEXT_CALLBACK_XID.fetch_add(1, Ordering::Relaxed),
            ..Default::default()
        };
        !self.sink.broken() && self.sink.send(Frame::encode(&header, &req.encode()))
    }

    /// Whether the connection is gone.
    pub fn broken(&self) -> bool {
        self.sink.broken()
    }
}

impl Incoming {
    /// Checks the proof a CONNECT (or a callback channel registration) carries for
    /// this connection's handshake, for client `uuid` of `target`. On success the
    /// connection is sealed from this request's reply on. True without a key; false
    /// (with a log line naming the peer) for a missing or wrong proof, or a connection
    /// that did not start a handshake. The nonces serve one proof only.
    pub fn verify_handshake(&self, key: &[u8], uuid: &str, target: &str, proof: &[u8]) -> bool {
        if key.is_empty() {
            return true;
        }
        let Some(to) = &self.reply_to else {
            return false;
        };
        let mut auth = to.conn.auth.lock();
        let Some((server, client)) = auth.nonces.take() else {
            warn!(peer = %self.peer, client = %uuid, "refusing connect: no handshake (a client without the key, or an older one)");
            return false;
        };
        let hs = crate::auth::Handshake {
            server: &server,
            client: &client,
            uuid,
            target,
        };
        if !hs.verify(key, proof) {
            warn!(peer = %self.peer, client = %uuid, "refusing connect: wrong key");
            return false;
        }
        let Some((sealer, opener)) = hs.server_session(key) else {
            return false;
        };
        auth.opener = Some(opener);
        to.sink.set_sealer(sealer);
        to.conn.sealed.store(true, Ordering::Release);
        true
    }

    /// This request's connection as a callback channel (`None` for an in-process
    /// request).
    pub fn callback_channel(&self) -> Option<CallbackChannel> {
        self.reply_to.as_ref().map(|to| CallbackChannel {
            sink: to.sink.clone(),
            conn_id: self.conn_id,
        })
    }
}

/// A parked request's promise of a reply. It holds the request's in-flight permit on its
/// connection until the reply is written; dropping it unanswered releases the permit and
/// sends nothing (the client resends).
pub struct Deferred {
    to: Option<ReplyTo>,
    header: Header,
    start: Instant,
}

impl Deferred {
    /// The parked request as it arrived, to be handled anew later (after recovery, say):
    /// like the original it can be parked again, with a permit of its own.
    pub fn request(&self, body: Vec<u8>, peer: SocketAddr, conn_id: u64) -> Incoming {
        Incoming {
            header: self.header,
            body,
            cancels: Vec::new(),
            peer,
            conn_id,
            reply_to: self.to.clone(),
            start: self.start,
        }
    }

    /// Sends the reply (from any thread).
    pub fn send(self, out: Outgoing) {
        let us = self.start.elapsed().as_micros() as u64;
        if let Some(svc) = self.to.as_ref().and_then(|t| t.stats.as_ref()) {
            record(&**svc, &self.header, us);
        }
        let frame =
            (!out.drop && !out.parked && !fail::check_op(fail::DROP_REPLY, self.header.opcode))
                .then(|| reply_frame(&self.header, &out, us));
        self.send_frame(frame);
    }

    /// Sends an encoded reply (or none) and releases the request's permit.
    fn send_frame(mut self, frame: Option<Vec<u8>>) {
        let Some(to) = self.to.take() else { return };
        if let Some(f) = frame {
            to.sink.send(f);
        }
        to.conn.release();
    }
}

/// Adds one request's service time to the service's per-opcode statistics.
fn record(svc: &dyn Service, h: &Header, us: u64) {
    if let (Some(stats), Some(op)) = (svc.stats(), Opcode::from_u16(h.opcode)) {
        stats.record(op, us);
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if let Some(to) = self.to.take() {
            to.conn.release();
        }
    }
}

/// A service's answer.
#[derive(Default)]
pub struct Outgoing {
    /// 0 or a negative errno.
    pub status: i32,
    /// Transaction number of the change (0 if none).
    pub transno: u64,
    /// Highest committed transno.
    pub last_committed: u64,
    /// Reply body (postcard), empty on error.
    pub body: Vec<u8>,
    /// See [`Header::pre_version`].
    pub pre_version: u64,
    /// See [`Header::op_time`].
    pub op_time: i64,
    /// Send nothing (the request was dropped on purpose).
    pub drop: bool,
    /// Send nothing now: the request was parked and a [`Deferred`] will answer it.
    pub parked: bool,
}

impl Outgoing {
    /// An error reply.
    pub fn error(errno: lode_base::Errno) -> Outgoing {
        Outgoing {
            status: errno.status(),
            ..Default::default()
        }
    }

    /// The reply to a request that changes nothing (no transno), or its errno.
    pub fn answer(r: Result<Reply, lode_base::Errno>) -> Outgoing {
        match r {
            Ok(rep) => Outgoing {
                body: rep.encode(),
                ..Default::default()
            },
            Err(e) => Outgoing::error(e),
        }
    }

    /// The answer of a request that was parked with [`Incoming::defer`].
    pub fn parked() -> Outgoing {
        Outgoing {
            parked: true,
            ..Default::default()
        }
    }
}

/// A request handler. `handle` runs on the service thread that read the request; it may
/// block briefly (a store write, a short lock) but must park anything that waits long.
pub trait Service: Send + Sync + 'static {
    /// Handles one request.
    fn handle(&self, req: &Incoming) -> Outgoing;
    /// Called after a round of requests has executed and before their replies are
    /// written: the place to make the round's writes reach the OS in one go (group
    /// commit). Returns false if that failed; the replies are then not sent.
    fn flush(&self) -> bool {
        true
    }
    /// Called when a connection closes.
    fn disconnected(&self, _conn_id: u64) {}
    /// The file system key (empty: none). With a key, a connection must complete the
    /// handshake (see [`crate::auth`]) before any request but the handshake's own is
    /// served, and every frame after it is sealed.
    fn key(&self) -> &[u8] {
        &[]
    }
    /// Per-opcode statistics, if the service keeps them.
    fn stats(&self) -> Option<&OpStats> {
        None
    }
}

/// Server tuning; the defaults are the named limits.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Service threads (`mds_num_threads`), each owning its connections.
    pub threads: usize,
    /// Requests one connection may have read and not yet answered.
    pub max_inflight_per_conn: usize,
    /// Connections open at once.
    pub max_connections: usize,
    /// A frame must arrive whole within this long of its first byte.
    pub read_timeout: Duration,
    /// A connection with nothing in flight and silent this long is closed.
    pub idle_timeout: Duration,
    /// Replies must drain within this long once the socket stops taking them.
    pub write_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            threads: 2,
            max_inflight_per_conn: limits::INFLIGHT_PER_CONN_MAX,
            max_connections: limits::CONNECTIONS_MAX,
            read_timeout: Duration::from_millis(limits::CONN_READ_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(limits::CONN_IDLE_TIMEOUT_MS),
            write_timeout: Duration::from_millis(limits::CONN_WRITE_TIMEOUT_MS),
        }
    }
}

/// State of one connection shared with its parked requests.
#[derive(Default)]
struct ConnShared {
    /// Requests read and not yet answered (parked ones).
    inflight: AtomicUsize,
    /// Signalled when a parked request is answered.
    released: Notify,
    /// The handshake of a keyed connection (see [`crate::auth`]).
    auth: Mutex<ConnAuth>,
    /// The handshake succeeded: every frame from the peer is sealed from now on.
    sealed: std::sync::atomic::AtomicBool,
}

/// Where a connection's handshake stands.
#[derive(Default)]
struct ConnAuth {
    /// The nonces exchanged (server's, client's), until a proof uses them.
    nonces: Option<(Vec<u8>, Vec<u8>)>,
    /// The opener for the peer's frames, handed to the reading loop once.
    opener: Option<crate::auth::Opener>,
}

impl ConnShared {
    fn release(&self) {
        self.inflight.fetch_sub(1, Ordering::AcqRel);
        self.released.notify_one();
    }
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

struct Worker {
    tx: mpsc::UnboundedSender<(std::net::TcpStream, SocketAddr)>,
    conns: Arc<AtomicUsize>,
}

/// Serves `svc` on `listener` until the process ends: accepts here, and hands each
/// connection once to the service thread with the fewest.
pub async fn serve(listener: TcpListener, svc: Arc<dyn Service>, cfg: ServerConfig) {
    let open = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for i in 0..cfg.threads.max(1) {
        let (tx, rx) = mpsc::unbounded_channel();
        let conns = Arc::new(AtomicUsize::new(0));
        let (svc, cfg2, conns2, open2) = (svc.clone(), cfg.clone(), conns.clone(), open.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("svc-{i}"))
            .spawn(move || service_thread(rx, svc, cfg2, conns2, open2));
        match spawned {
            Ok(_) => workers.push(Worker { tx, conns }),
            Err(e) => warn!("cannot start service thread: {e}"),
        }
    }
    if workers.is_empty() {
        warn!("no service thread could start; not serving");
        return;
    }
    let refusals = RateLimited::default();
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors or a transient error: wait rather than spin.
                warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let n = open.load(Ordering::Acquire);
        if n >= cfg.max_connections {
            refusals.warn(|dropped| {
                warn!(%peer, "refusing connection: {n} open, max_connections {} ({dropped} more refused since the last line)", cfg.max_connections);
            });
            drop(sock);
            continue;
        }
        let Ok(std_sock) = sock.into_std() else {
            continue;
        };
        open.fetch_add(1, Ordering::AcqRel);
        let w = workers
            .iter()
            .min_by_key(|w| w.conns.load(Ordering::Relaxed))
            .expect("workers is not empty");
        w.conns.fetch_add(1, Ordering::AcqRel);
        if w.tx.send((std_sock, peer)).is_err() {
            w.conns.fetch_sub(1, Ordering::AcqRel);
            open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A log line at most once a second, counting what it swallowed.
#[derive(Default)]
struct RateLimited {
    state: Mutex<(Option<Instant>, u64)>,
}

impl RateLimited {
    fn warn(&self, f: impl FnOnce(u64)) {
        let mut st = self.state.lock();
        let now = Instant::now();
        if st
            .0
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            let n = st.1;
            *st = (Some(now), 0);
            drop(st);
            f(n);
        } else {
            st.1 += 1;
        }
    }
}

fn service_thread(
    mut rx: mpsc::UnboundedReceiver<(std::net::TcpStream, SocketAddr)>,
    svc: Arc<dyn Service>,
    cfg: ServerConfig,
    conns: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            warn!("cannot start a service thread's reactor: {e}");
            return;
        }
    };
    rt.block_on(async move {
        while let Some((sock, peer)) = rx.recv().await {
            let (svc, cfg, conns, open) = (svc.clone(), cfg.clone(), conns.clone(), open.clone());
            tokio::spawn(async move {
                match tokio::net::TcpStream::from_std(sock) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        connection(s, peer, svc, &cfg).await;
                    }
                    Err(e) => warn!(%peer, "cannot register connection: {e}"),
                }
                conns.fetch_sub(1, Ordering::AcqRel);
                open.fetch_sub(1, Ordering::AcqRel);
            });
        }
    });
}

/// Why a connection's loop ended.
enum Closed {
    Peer,
    Io(std::io::Error),
    Frame(FrameError),
    ReadTimeout(usize),
    Idle,
    NotReading,
    StoreFailed,
}

async fn connection(
    sock: tokio::net::TcpStream,
    peer: SocketAddr,
    svc: Arc<dyn Service>,
    cfg: &ServerConfig,
) {
    let conn_id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let (rd, wr) = sock.into_split();
    let reply_to = ReplyTo {
        sink: FrameSink::new(wr),
        conn: Arc::new(ConnShared::default()),
        stats: svc.stats().is_some().then(|| svc.clone()),
    };
    let why = serve_connection(&rd, &reply_to, conn_id, peer, &*svc, cfg).await;
    match why {
        Closed::Peer => debug!(%peer, "connection closed by peer"),
        Closed::Io(e) => debug!(%peer, "connection lost: {e}"),
        Closed::Frame(e) => warn!(%peer, "closing connection: malformed frame: {e}"),
        Closed::ReadTimeout(n) => warn!(
            %peer,
            "closing connection: a frame stayed incomplete ({n} bytes) for {:?} (read timeout)",
            cfg.read_timeout
        ),
        Closed::Idle => info!(%peer, "closing idle connection after {:?}", cfg.idle_timeout),
        Closed::NotReading => warn!(
            %peer,
            "closing connection: its replies were not read for {:?} (write timeout)",
            cfg.write_timeout
        ),
        Closed::StoreFailed => warn!(%peer, "closing connection: the store failed"),
    }
    svc.disconnected(conn_id);
}

async fn serve_connection(
    rd: &tokio::net::tcp::OwnedReadHalf,
    to: &ReplyTo,
    conn_id: u64,
    peer: SocketAddr,
    svc: &dyn Service,
    cfg: &ServerConfig,
) -> Closed {
    let mut buf: Vec<u8> = Vec::with_capacity(64 << 10);
    // When the oldest incomplete frame started arriving.
    let mut partial_since: Option<Instant> = None;
    let mut out: Vec<u8> = Vec::new();
    // Requests executed since the last flush (a delayed or dropped reply still needs its
    // writes flushed before anything else is answered).
    let mut executed = false;
    // A keyed connection's opener, once its handshake is done.
    let mut opener: Option<crate::auth::Opener> = None;
    let mut spin = crate::spin::Spin::default();
    loop {
        // Wait for bytes, bounded by the read timeout (a frame under way) or the idle
        // timeout (nothing under way, nothing parked).
        let wait = match partial_since {
            Some(t) => Some(cfg.read_timeout.saturating_sub(t.elapsed())),
            None if to.conn.inflight.load(Ordering::Acquire) == 0 => Some(cfg.idle_timeout),
            None => None,
        };
        let before = buf.len();
        // Spin a little before sleeping (see `crate::spin`), never within a frame; this
        // thread's other connections run between the checks.
        let budget = match partial_since {
            None => spin.budget(),
            Some(_) => Duration::ZERO,
        };
        let mut spun = false;
        // The last read came up short, so the socket was empty then: reading again
        // now would only get EAGAIN, a system call per round. (Tokio's readiness is
        // not cleared by it, so a wait below still reads once to find out.)
        let mut drained = false;
        if !budget.is_zero() {
            let t = Instant::now();
            while !spun && t.elapsed() < budget {
                buf.reserve(64 << 10);
                let room = buf.capacity() - buf.len();
                match rd.try_read_buf(&mut buf) {
                    Ok(0) => return Closed::Peer,
                    Ok(n) => {
                        spun = true;
                        drained = n < room;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::yield_now();
                        tokio::task::yield_now().await;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Closed::Io(e),
                }
            }
            spin.record(spun);
        }
        if !spun {
            let ready = match wait {
                Some(d) => tokio::time::timeout(d, rd.readable()).await.ok(),
                None => Some(rd.readable().await),
            };
            match ready {
                None if partial_since.is_some() => return Closed::ReadTimeout(buf.len()),
                None => return Closed::Idle,
                Some(Err(e)) => return Closed::Io(e),
                Some(Ok(())) => {}
            }
        }
        // Read what is there, up to one round's worth.
        while !drained {
            if buf.len() - before >= limits::READ_ROUND_BYTES {
                break;
            }
            buf.reserve(64 << 10);
            let room = buf.capacity() - buf.len();
            match rd.try_read_buf(&mut buf) {
                Ok(0) => return Closed::Peer,
                Ok(n) => drained = n < room,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Closed::Io(e),
            }
        }
        if buf.len() == before {
            continue;
        }
        // Execute every complete request, collecting the replies.
        let mut off = 0;
        loop {
            while to.conn.inflight.load(Ordering::Acquire) >= cfg.max_inflight_per_conn {
                // Parked requests hold every permit: answer what we have, then wait
                // for one to finish before reading on.
                if !flush_replies(svc, to, &mut out, &mut executed) {
                    return Closed::StoreFailed;
                }
                let released = to.conn.released.notified();
                if to.conn.inflight.load(Ordering::Acquire) >= cfg.max_inflight_per_conn {
                    released.await;
                }
            }
            if opener.is_none() && to.conn.sealed.load(Ordering::Acquire) {
                opener = to.conn.auth.lock().opener.take();
            }
            let decoded = match opener.as_mut() {
                Some(o) => o
                    .take(&buf[off..])
                    .and_then(|(rest, used)| Ok((Frame::decode_rest(rest)?, used))),
                None => Frame::decode(&buf[off..]),
            };
            match decoded {
                Ok((frame, _)) if opener.is_none() && frame.header.flags & FLAG_SEALED != 0 => {
                    return Closed::Frame(FrameError::Unauthenticated);
                }
                Ok((frame, used)) => {
                    off += used;
                    executed = true;
                    execute(svc, to, frame, peer, conn_id, &mut out);
                    // Large replies (readdir pages, data) go out as soon as they are
                    // ready, so the client takes in one while the next is made.
                    if out.len() >= limits::REPLY_EARLY_BYTES
                        && !flush_replies(svc, to, &mut out, &mut executed)
                    {
                        return Closed::StoreFailed;
                    }
                }
                Err(FrameError::Truncated) => break,
                Err(e) => return Closed::Frame(e),
            }
        }
        buf.drain(..off);
        partial_since = match (buf.is_empty(), partial_since) {
            (true, _) => None,
            (false, Some(t)) if off == 0 => Some(t),
            (false, _) => Some(Instant::now()),
        };
        if buf.capacity() > (1 << 20) && buf.len() < (64 << 10) {
            buf.shrink_to(64 << 10);
        }
        if !flush_replies(svc, to, &mut out, &mut executed) {
            return Closed::StoreFailed;
        }
        // A bounded reply queue: read no more while this connection's replies wait.
        if to.sink.backlogged()
            && tokio::time::timeout(cfg.write_timeout, to.sink.wait_drained())
                .await
                .is_err()
        {
            return Closed::NotReading;
        }
        if to.sink.broken() {
            return Closed::Peer;
        }
    }
}

/// Lets the service flush the round's writes, then sends the round's replies at once.
fn flush_replies(svc: &dyn Service, to: &ReplyTo, out: &mut Vec<u8>, executed: &mut bool) -> bool {
    if !std::mem::take(executed) {
        return true;
    }
    if !svc.flush() {
        out.clear();
        return false;
    }
    if !out.is_empty() {
        to.sink.send(std::mem::take(out));
    }
    true
}

fn execute(
    svc: &dyn Service,
    to: &ReplyTo,
    frame: Frame,
    peer: SocketAddr,
    conn_id: u64,
    out: &mut Vec<u8>,
) {
    if fail::check_op(fail::DROP_REQUEST, frame.header.opcode) {
        debug!(xid = frame.header.xid, "fail_loc: dropping request");
        return;
    }
    let (mut header, mut body) = (frame.header, frame.body);
    let mut cancels = Vec::new();
    let mut malformed = false;
    if header.flags & FLAG_CANCELS != 0 {
        header.flags &= !FLAG_CANCELS;
        match split_cancels(&body) {
            Some((c, rest)) => {
                cancels = c;
                let lead = body.len() - rest.len();
                body.drain(..lead);
            }
            None => {
                warn!(%peer, opcode = header.opcode, "bad early cancels in a request: refused");
                malformed = true;
            }
        }
    }
    let inc = Incoming {
        header,
        body,
        cancels,
        peer,
        conn_id,
        reply_to: Some(to.clone()),
        start: Instant::now(),
    };
    let res = if malformed {
        Outgoing::error(lode_base::Errno::EPROTO)
    } else {
        match handshake(svc, to, &inc) {
            Some(res) => res,
            None => svc.handle(&inc),
        }
    };
    if res.parked {
        return;
    }
    let us = inc.start.elapsed().as_micros() as u64;
    record(svc, &inc.header, us);
    if res.drop || fail::check_op(fail::DROP_REPLY, inc.header.opcode) {
        return;
    }
    let frame = reply_frame(&inc.header, &res, us);
    let mut delay = fail::rpc_delay_us();
    if fail::check_op(fail::DELAY_REPLY, inc.header.opcode) {
        delay += u64::from(fail::val()) * 1000;
    }
    if delay == 0 {
        out.extend_from_slice(&frame);
        return;
    }
    // An emulated slow network: the reply leaves later, the thread goes on.
    if let Some(d) = inc.defer() {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(delay)).await;
            d.send_frame(Some(frame));
        });
    }
}

/// The RPC layer's part of a keyed connection: it answers `AUTH_NONCE` itself, and
/// before the handshake is done lets through only the requests that complete it.
fn handshake(svc: &dyn Service, to: &ReplyTo, inc: &Incoming) -> Option<Outgoing> {
    let op = Opcode::from_u16(inc.header.opcode);
    if op == Some(Opcode::AuthNonce) {
        let r = match lode_proto::Request::decode(inc.header.opcode, &inc.body) {
            Ok(lode_proto::Request::AuthNonce(r)) if r.nonce.len() == crate::auth::NONCE_LEN => r,
            _ => return Some(Outgoing::error(lode_base::Errno::EPROTO)),
        };
        if to.conn.sealed.load(Ordering::Acquire) {
            return Some(Outgoing::error(lode_base::Errno::EALREADY));
        }
        let mine = crate::auth::nonce().to_vec();
        to.conn.auth.lock().nonces = Some((mine.clone(), r.nonce));
        return Some(Outgoing::answer(Ok(Reply::AuthNonce(
            lode_proto::NonceMsg { nonce: mine },
        ))));
    }
    if svc.key().is_empty()
        || to.conn.sealed.load(Ordering::Acquire)
        || matches!(op, Some(Opcode::Connect | Opcode::LdlmCallbackChannel))
    {
        return None;
    }
    warn!(peer = %inc.peer, opcode = inc.header.opcode, "refusing request: the connection has not proved the file system key");
    Some(Outgoing::error(lode_base::Errno::EACCES))
}

fn reply_frame(h: &Header, out: &Outgoing, us: u64) -> Vec<u8> {
    let header = Header {
        opcode: h.opcode,
        flags: FLAG_REPLY,
        tag: h.tag,
        status: out.status,
        xid: h.xid,
        handle: h.handle,
        last_xid: 0,
        transno: out.transno,
        last_committed: out.last_committed,
        service_us: us.min(u64::from(u32::MAX)) as u32,
        conn_cnt: h.conn_cnt,
        pre_version: out.pre_version,
        op_time: out.op_time,
    };
    Frame::encode(&header, &out.body)
}

/// A few threads for requests that wait on a disk (an fsync): the request is parked and
/// runs here, so its service thread goes on serving its other connections.
pub struct Offload {
    tx: crossbeam_channel::Sender<Box<dyn FnOnce() + Send>>,
}

impl Offload {
    /// Starts `threads` threads named `name-N`.
    pub fn new(name: &str, threads: usize) -> std::io::Result<Offload> {
        let (tx, rx) = crossbeam_channel::unbounded::<Box<dyn FnOnce() + Send>>();
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })?;
        }
        Ok(Offload { tx })
    }

    /// Parks `inc` and answers it with `f`'s result, computed on an offload thread.
    /// A request built in-process (no connection) runs `f` inline instead.
    pub fn run(&self, inc: &Incoming, f: impl FnOnce() -> Outgoing + Send + 'static) -> Outgoing {
        let Some(d) = inc.defer() else {
            return f();
        };
        let job: Box<dyn FnOnce() + Send> = Box::new(move || d.send(f()));
        match self.tx.send(job) {
            Ok(()) => Outgoing::parked(),
            // The threads are gone: run it here rather than lose it.
            Err(crossbeam_channel::SendError(job)) => {
                job();
                Outgoing::parked()
            }
        }
    }
}
