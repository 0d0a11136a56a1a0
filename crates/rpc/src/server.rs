//! The server side: accept connections, read frames, run each request on a bounded pool
//! of service threads (handlers may block on the store), write replies back batched.

use crate::fail;
use crate::stats::OpStats;
use crate::wire::{read_frame, FrameSink, ReadError};
use lode_proto::frame::FLAG_REPLY;
use lode_proto::{Frame, Header, Opcode};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

/// One request as a service sees it.
pub struct Incoming {
    /// The request header.
    pub header: Header,
    /// The postcard body (decode with `Request::decode(header.opcode, …)`).
    pub body: Vec<u8>,
    /// The peer's address.
    pub peer: SocketAddr,
    /// Identifies the TCP connection, for services that tie state to it.
    pub conn_id: u64,
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
    /// Send nothing (the request was dropped on purpose).
    pub drop: bool,
}

impl Outgoing {
    /// An error reply.
    pub fn error(errno: lode_base::Errno) -> Outgoing {
        Outgoing {
            status: errno.status(),
            ..Default::default()
        }
    }
}

/// A request handler. `handle` runs on a service thread and may block.
pub trait Service: Send + Sync + 'static {
    /// Handles one request.
    fn handle(&self, req: &Incoming) -> Outgoing;
    /// Called when a connection closes.
    fn disconnected(&self, _conn_id: u64) {}
    /// Per-opcode statistics, if the service keeps them.
    fn stats(&self) -> Option<&OpStats> {
        None
    }
}

/// Server tuning.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Service threads (`mds_num_threads`).
    pub threads: usize,
    /// Requests one connection may have queued or executing; the reader stops reading
    /// beyond this, so a flooding client is throttled by TCP.
    pub max_inflight_per_conn: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            threads: 4,
            max_inflight_per_conn: 256,
        }
    }
}

struct Job {
    inc: Incoming,
    reply: Arc<FrameSink>,
    start: Instant,
    _permit: OwnedSemaphorePermit,
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// Serves `svc` on `listener` until the process ends.
pub async fn serve(listener: TcpListener, svc: Arc<dyn Service>, cfg: ServerConfig) {
    let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Job>();
    let rt = Handle::current();
    for i in 0..cfg.threads.max(1) {
        let rx = jobs_rx.clone();
        let svc = svc.clone();
        let rt = rt.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("svc-{i}"))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    run_job(&*svc, job, &rt);
                }
            });
        if let Err(e) = spawned {
            warn!("cannot start service thread: {e}");
        }
    }
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        tokio::spawn(connection(
            sock,
            peer,
            svc.clone(),
            jobs_tx.clone(),
            cfg.max_inflight_per_conn,
        ));
    }
}

async fn connection(
    sock: TcpStream,
    peer: SocketAddr,
    svc: Arc<dyn Service>,
    jobs: crossbeam_channel::Sender<Job>,
    max_inflight: usize,
) {
    let conn_id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let (rd, wr) = sock.into_split();
    let tx = FrameSink::new(wr);
    let mut rd = tokio::io::BufReader::with_capacity(64 << 10, rd);
    let inflight = Arc::new(Semaphore::new(max_inflight.max(1)));
    loop {
        let frame = match read_frame(&mut rd).await {
            Ok(f) => f,
            Err(ReadError::Io(e)) => {
                debug!(%peer, "connection closed: {e}");
                break;
            }
            Err(ReadError::Frame(e)) => {
                warn!(%peer, "closing connection: {e}");
                break;
            }
        };
        if fail::check(fail::DROP_REQUEST) {
            debug!(xid = frame.header.xid, "fail_loc: dropping request");
            continue;
        }
        let Ok(permit) = inflight.clone().acquire_owned().await else {
            break;
        };
        let inc = Incoming {
            header: frame.header,
            body: frame.body,
            peer,
            conn_id,
        };
        if jobs
            .send(Job {
                inc,
                reply: tx.clone(),
                start: Instant::now(),
                _permit: permit,
            })
            .is_err()
        {
            break;
        }
    }
    svc.disconnected(conn_id);
}

fn run_job(svc: &dyn Service, job: Job, rt: &Handle) {
    let out = svc.handle(&job.inc);
    let us = job.start.elapsed().as_micros() as u64;
    if let (Some(stats), Some(op)) = (svc.stats(), Opcode::from_u16(job.inc.header.opcode)) {
        stats.record(op, us);
    }
    if out.drop || fail::check(fail::DROP_REPLY) {
        return;
    }
    let h = &job.inc.header;
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
    };
    let bytes = Frame::encode(&header, &out.body);
    let mut delay = fail::rpc_delay_us();
    if fail::check(fail::DELAY_REPLY) {
        delay += u64::from(fail::val()) * 1000;
    }
    if delay == 0 {
        job.reply.send(bytes);
    } else {
        let tx = job.reply.clone();
        rt.spawn(async move {
            tokio::time::sleep(Duration::from_micros(delay)).await;
            tx.send(bytes);
        });
    }
}
