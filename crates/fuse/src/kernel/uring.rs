//! FUSE over io_uring (Linux 6.14 and later, `enable_uring`): the kernel hands each
//! request to a ring entry of the queue of the CPU its caller runs on, and takes the
//! reply from the same entry, whose commit also asks for the entry's next request. A
//! request and its answer then cost the caller no wake-up of another CPU: each queue's
//! threads are pinned to that queue's CPU.
//!
//! Each thread owns a ring and one entry, and runs what it gets to completion, as a
//! `/dev/fuse` reader does. A reply given on the thread is written into the entry at
//! once and committed when the request's handler returns, with the thread's next wait
//! (one system call): the kernel gives a new request to the entry committed last, which
//! must not wait behind work its thread still does after answering. A reply given
//! later from another thread (a lock wait's) reaches the thread through a queue and an
//! eventfd its ring watches. Like the `/dev/fuse` readers, a
//! queue always keeps a thread free: the kernel sends a request only to its caller's
//! CPU's queue, so a queue whose threads all wait on a server could not take a request
//! the server's own restart waits for (an `exec` closing an inherited descriptor of a
//! file on the mount sends a FLUSH). When the last free thread of a queue takes a
//! request, the queue gets another thread first (up to [`MAX_PER_QUEUE`]). An entry
//! cannot be taken back from the kernel, so threads are never retired; the kernel hands
//! requests to the entry committed last, so spare threads stay asleep.
//!
//! A request that finds no free entry waits in the kernel's queue until some entry of
//! the queue commits (registering an entry does not fetch it). A new thread therefore
//! "kicks" its queue once registered: a helper thread moves to the queue's CPU and
//! calls `statfs(2)` on the mount point, whose request comes to a free entry of that
//! queue and is answered at once by the transport (it knows the helper's thread id);
//! committing it fetches what waited.

use super::abi::{self, op, IN_HEADER_LEN};
use super::op::Request;
use super::reply::Sink;
use super::session::{dispatch, expects_reply, join_group, Dev, Filesystem, Group, BUF_LEN};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use parking_lot::Mutex;
use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

/// `struct fuse_uring_req_header`: the request's (then the reply's) header, the
/// opcode's own header, and `fuse_uring_ent_in_out`.
const HEADER_LEN: usize = 288;
/// Where `op_in` starts in the header buffer.
const OP_IN: usize = 128;
/// Where `fuse_uring_ent_in_out` starts.
const ENT_IN_OUT: usize = 256;
/// `FUSE_IO_URING_CMD_REGISTER`.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The `user_data` of the entry's command.
const ENTRY: u64 = 1;
/// The `user_data` of the eventfd poll.
const EVENT: u64 = 2;
/// Threads a queue may grow to: as many requests of one CPU can wait on servers at
/// once before the next waits for one of them.
pub const MAX_PER_QUEUE: usize = 64;

/// The ring entry: the buffers the kernel writes a request into and reads the reply
/// from. Boxed, so that the addresses the kernel keeps never move.
struct Ent {
    header: Box<[u8; HEADER_LEN]>,
    payload: Box<[u8]>,
    iov: [libc::iovec; 2],
}

impl Ent {
    fn new() -> Box<Ent> {
        let mut e = Box::new(Ent {
            header: Box::new([0; HEADER_LEN]),
            payload: vec![0u8; BUF_LEN].into_boxed_slice(),
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
        });
        e.iov[0] = libc::iovec {
            iov_base: e.header.as_mut_ptr().cast(),
            iov_len: HEADER_LEN,
        };
        e.iov[1] = libc::iovec {
            iov_base: e.payload.as_mut_ptr().cast(),
            iov_len: e.payload.len(),
        };
        e
    }
}

/// `struct fuse_uring_cmd_req` in the command area of a 128-byte SQE.
fn cmd(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_le_bytes());
    c[16..18].copy_from_slice(&qid.to_le_bytes());
    c
}

/// A reply that comes from another thread than the entry's, for the entry's thread to
/// commit: the request's id, the error and the body.
struct Late {
    reply: Mutex<Option<(u64, i32, Vec<u8>)>>,
    event: OwnedFd,
}

/// The reply path of one ring thread's requests.
struct RingSink {
    late: Arc<Late>,
}

/// The request the current thread is running from its ring, if any: its reply is
/// committed in place (see [`Worker::commit`]).
#[derive(Clone, Copy)]
struct Current {
    worker: *mut Worker,
    unique: u64,
}

std::thread_local! {
    static CURRENT: Cell<Option<Current>> = const { Cell::new(None) };
}

impl Sink for RingSink {
    fn send(&self, unique: u64, error: i32, body: &[&[u8]]) {
        if let Some(c) = CURRENT.get().filter(|c| c.unique == unique) {
            CURRENT.set(None);
            // SAFETY: CURRENT is set only by the worker's own thread, around a dispatch
            // during which the worker holds no reference to itself, and the request's
            // arguments were copied out of the entry before it.
            let w = unsafe { &mut *c.worker };
            w.commit(unique, error, body);
            return;
        }
        let body = if error == 0 {
            body.concat()
        } else {
            Vec::new()
        };
        *self.late.reply.lock() = Some((unique, error, body));
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to an eventfd.
        unsafe { libc::write(self.late.event.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// One ring thread: its ring and its entry.
struct Worker {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    fd: i32,
    qid: u16,
    ent: Box<Ent>,
    /// The entry is with the kernel (registered, or committed), not torn down.
    live: bool,
}

impl Worker {
    fn push(&mut self, e: squeue::Entry128) {
        // SAFETY: the SQE's buffers (the entry's iovecs) live as long as the worker.
        while unsafe { self.ring.submission().push(&e) }.is_err() {
            if let Err(err) = self.ring.submit() {
                tracing::warn!("FUSE ring submit: {err}");
            }
        }
    }

    /// Registers the entry with the kernel's queue.
    fn register(&mut self) {
        let mut sqe = opcode::UringCmd80::new(types::Fd(self.fd), CMD_REGISTER)
            .cmd(cmd(0, self.qid))
            .addr(Some(self.ent.iov.as_ptr() as u64))
            .build()
            .user_data(ENTRY);
        // `sqe->len` (offset 24) is the iovec count, which UringCmd80 does not set.
        // SAFETY: Entry128 is a 128-byte `repr(C)` SQE; bytes 24..28 are `len`.
        unsafe {
            (&mut sqe as *mut squeue::Entry128)
                .cast::<u8>()
                .add(24)
                .cast::<u32>()
                .write_unaligned(2)
        };
        self.live = true;
        self.push(sqe);
    }

    /// Writes the reply to the entry's request and commits it, which also asks for the
    /// entry's next request.
    fn commit(&mut self, unique: u64, error: i32, body: &[&[u8]]) {
        let mut len = 0;
        let mut error = error;
        if error == 0 {
            for b in body {
                let end = len + b.len();
                if end > self.ent.payload.len() {
                    tracing::warn!(unique, "a FUSE reply larger than the ring's buffer");
                    error = -libc::EIO;
                    len = 0;
                    break;
                }
                self.ent.payload[len..end].copy_from_slice(b);
                len = end;
            }
        }
        self.ent.header[..16].copy_from_slice(&abi::out_header(len, error, unique));
        self.ent.header[ENT_IN_OUT + 16..ENT_IN_OUT + 20]
            .copy_from_slice(&(len as u32).to_le_bytes());
        let commit_id = u64::from_le_bytes(
            self.ent.header[ENT_IN_OUT + 8..ENT_IN_OUT + 16]
                .try_into()
                .unwrap_or_default(),
        );
        let sqe = opcode::UringCmd80::new(types::Fd(self.fd), CMD_COMMIT_AND_FETCH)
            .cmd(cmd(commit_id, self.qid))
            .build()
            .user_data(ENTRY);
        self.push(sqe);
    }
}

/// The CPUs the kernel has queues for (`num_possible_cpus`): 0 to the highest possible.
fn queues() -> usize {
    let n = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
                .max()
        })
        .map(|m| m + 1);
    n.unwrap_or_else(|| {
        // SAFETY: sysconf has no preconditions.
        unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize
    })
}

/// The thread that kicks queues (see the module's doc): where to ask it, and its
/// thread id, by which its requests are known.
struct Kicker {
    tx: Mutex<std::sync::mpsc::Sender<u16>>,
    tid: std::sync::atomic::AtomicU32,
}

impl Kicker {
    /// Starts the kicker for the mount at `mountpoint`.
    fn start(mountpoint: std::path::PathBuf) -> io::Result<Arc<Kicker>> {
        let (tx, rx) = std::sync::mpsc::channel::<u16>();
        let k = Arc::new(Kicker {
            tx: Mutex::new(tx),
            tid: std::sync::atomic::AtomicU32::new(0),
        });
        let me = k.clone();
        let path = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
            .map_err(io::Error::other)?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("fuse-kick".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                me.tid
                    .store(unsafe { libc::gettid() } as u32, Ordering::Release);
                let _ = ready_tx.send(());
                drop(me);
                for q in rx {
                    pin(q as usize);
                    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
                    // SAFETY: a valid C string and a buffer of the right type.
                    unsafe { libc::statfs(path.as_ptr(), st.as_mut_ptr()) };
                }
            })?;
        let _ = ready_rx.recv();
        Ok(k)
    }

    /// Asks for a request on queue `qid`.
    fn kick(&self, qid: u16) {
        let _ = self.tx.lock().send(qid);
    }

    /// Whether `req` is a kick.
    fn is_kick(&self, req: &Request) -> bool {
        req.opcode == op::STATFS && req.pid != 0 && req.pid == self.tid.load(Ordering::Acquire)
    }
}

/// The ring threads' handles, joined by the session once unmounted.
pub type Threads = Arc<Mutex<Vec<JoinHandle<io::Result<()>>>>>;

/// What a queue's threads share.
struct Queue<FS> {
    fs: Arc<FS>,
    dev: Arc<Dev>,
    kicker: Arc<Kicker>,
    qid: u16,
    /// Its threads, and how many of them run a request.
    group: Arc<Group>,
    /// Where new threads' handles go, for the session to join.
    handles: Threads,
    /// The thread that may spin for the queue's next request: the one that committed
    /// last, whose entry the kernel fills next. The others sleep at once, so spinning
    /// threads of one CPU never yield the CPU to each other (each such yield is a
    /// context switch, and they were most of the mount's).
    spinner: std::sync::atomic::AtomicUsize,
}

/// Starts the ring threads: `threads` in all, at least one per queue. Returns once each
/// has registered its entry (the kernel serves nothing until every queue has one), with
/// the list their handles go to (threads added later go there too).
pub fn start<FS: Filesystem>(
    fs: Arc<FS>,
    dev: Arc<Dev>,
    mountpoint: std::path::PathBuf,
    threads: usize,
) -> io::Result<Threads> {
    let kicker = Kicker::start(mountpoint)?;
    let nq = queues();
    let per_queue = (threads / nq).clamp(1, MAX_PER_QUEUE);
    let handles = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel::<io::Result<()>>();
    for q in 0..nq {
        let queue = Arc::new(Queue {
            fs: fs.clone(),
            dev: dev.clone(),
            kicker: kicker.clone(),
            qid: q as u16,
            group: Group::new(0),
            handles: handles.clone(),
            spinner: std::sync::atomic::AtomicUsize::new(0),
        });
        for _ in 0..per_queue {
            add_thread(&queue, Some(tx.clone()), false)?;
        }
    }
    drop(tx);
    for r in rx.iter().take(nq * per_queue) {
        r?;
    }
    Ok(handles)
}

/// Adds a thread to `queue`; `started` hears when its entry is registered; `kick`: it
/// kicks the queue then.
fn add_thread<FS: Filesystem>(
    queue: &Arc<Queue<FS>>,
    started: Option<std::sync::mpsc::Sender<io::Result<()>>>,
    kick: bool,
) -> io::Result<()> {
    let n = queue.group.grow();
    let q = queue.clone();
    let h = std::thread::Builder::new()
        .name(format!("fuse-q{}-{n}", queue.qid))
        .spawn(move || {
            join_group(q.group.clone());
            run(&q, started, kick)
        });
    match h {
        Ok(h) => {
            queue.handles.lock().push(h);
            Ok(())
        }
        Err(e) => {
            queue.group.shrink();
            Err(e)
        }
    }
}

/// Pins the calling thread to `cpu` (where its queue's requests come from); a CPU it may
/// not run on is left alone.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays within it for cpu < CPU_SETSIZE.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

type Cqe = (u64, i32, u32);

fn run<FS: Filesystem>(
    queue: &Arc<Queue<FS>>,
    started: Option<std::sync::mpsc::Sender<io::Result<()>>>,
    kick_after: bool,
) -> io::Result<()> {
    pin(queue.qid as usize);
    let setup = || -> io::Result<(Box<Worker>, Arc<Late>, Vec<Cqe>)> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(8)?;
        // SAFETY: eventfd has no memory preconditions.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just made.
        let event = unsafe { OwnedFd::from_raw_fd(efd) };
        let mut w = Box::new(Worker {
            ring,
            fd: queue.dev.0.as_raw_fd(),
            qid: queue.qid,
            ent: Ent::new(),
            live: false,
        });
        let poll = opcode::PollAdd::new(types::Fd(event.as_raw_fd()), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(EVENT);
        w.push(poll.into());
        w.register();
        w.ring.submit()?;
        // A refused registration completes at once (a request may come too, once
        // every queue has an entry: it is served first).
        let first: Vec<Cqe> = w
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result(), c.flags()))
            .collect();
        if let Some(e) = first
            .iter()
            .find_map(|&(ud, res, _)| (ud == ENTRY && res < 0).then_some(-res))
        {
            let e = io::Error::from_raw_os_error(e);
            return Err(io::Error::new(
                e.kind(),
                format!("registering a FUSE ring entry: {e}"),
            ));
        }
        let late = Arc::new(Late {
            reply: Mutex::new(None),
            event,
        });
        Ok((w, late, first))
    };
    let (w, late, first) = match setup() {
        Ok(x) => x,
        Err(e) => {
            queue.group.shrink();
            // A thread added while the session runs that finds the connection gone
            // (unmounted meanwhile) has nothing to serve: the session's end, not a
            // failure to report.
            if started.is_none() && e.kind() == io::ErrorKind::NotConnected {
                return Ok(());
            }
            let msg = e.to_string();
            if let Some(s) = started {
                let _ = s.send(Err(e));
            }
            return Err(io::Error::other(msg));
        }
    };
    if let Some(s) = started {
        let _ = s.send(Ok(()));
    }
    if kick_after {
        queue.kicker.kick(queue.qid);
    }
    let sink: Arc<dyn Sink> = Arc::new(RingSink { late: late.clone() });
    let w: *mut Worker = Box::into_raw(w);
    // SAFETY: `w` is this thread's alone; it is freed at the end of this function, after
    // the last use. References to it live only within each block of `serve`, never
    // across a dispatch (whose reply may reach it through CURRENT).
    let result = unsafe { serve(queue, w, &late, &sink, first) };
    // SAFETY: from Box::into_raw above; nothing refers to it any more.
    drop(unsafe { Box::from_raw(w) });
    result
}

/// The ring thread's loop.
///
/// # Safety
/// `w` is valid and used by this thread alone.
unsafe fn serve<FS: Filesystem>(
    queue: &Arc<Queue<FS>>,
    w: *mut Worker,
    late: &Late,
    sink: &Arc<dyn Sink>,
    first: Vec<Cqe>,
) -> io::Result<()> {
    // The request's arguments, copied out of the entry before it runs: its reply is
    // written into the same buffers.
    let mut args: Vec<u8> = Vec::with_capacity(4096);
    // The request whose reply comes from another thread, if any.
    let mut waiting: Option<u64> = None;
    let mut first = Some(first);
    // Spin a little for the next request before sleeping (see `lode_rpc::spin`): a
    // process making one request after another (`ls -l`'s getxattr per file, `du`)
    // otherwise wakes this thread, and itself, from sleep at each one; measured here,
    // a getxattr answered by the mount took 35 µs that way and 12-14 µs spinning.
    let mut spin = lode_rpc::spin::Spin::default();
    loop {
        let done: Vec<Cqe> = if let Some(f) = first.take() {
            f
        } else {
            // SAFETY: see the function's contract.
            let wr = unsafe { &mut *w };
            if !wr.live {
                return Ok(());
            }
            // This thread's address names it among the queue's threads. Having
            // committed, it is the queue's last committer, whether or not it spins; a
            // thread whose reply comes from another thread (a lock wait) has not.
            let me = w as usize;
            if waiting.is_none() {
                queue.spinner.store(me, Ordering::Release);
            }
            let budget = match waiting {
                None => spin.budget(),
                Some(_) => std::time::Duration::ZERO,
            };
            if !budget.is_zero() {
                match wr.ring.submit() {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
                let until = std::time::Instant::now() + budget;
                while wr.ring.completion().is_empty()
                    && queue.spinner.load(Ordering::Acquire) == me
                    && std::time::Instant::now() < until
                {
                    std::thread::yield_now();
                }
                // Overtaken by a later committer: neither a hit nor a miss.
                if queue.spinner.load(Ordering::Acquire) == me || !wr.ring.completion().is_empty() {
                    spin.record(!wr.ring.completion().is_empty());
                }
            }
            match wr.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            wr.ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags()))
                .collect()
        };
        for (ud, res, flags) in done {
            if ud == EVENT {
                // SAFETY: see the function's contract.
                let wr = unsafe { &mut *w };
                let mut n = [0u8; 8];
                // SAFETY: reads 8 bytes into a live buffer from a non-blocking eventfd.
                unsafe { libc::read(late.event.as_raw_fd(), n.as_mut_ptr().cast(), 8) };
                let reply = late.reply.lock().take();
                if let Some((unique, error, body)) = reply {
                    if waiting == Some(unique) {
                        waiting = None;
                        wr.commit(unique, error, &[&body]);
                        queue.group.done();
                    }
                }
                if !cqueue::more(flags) {
                    let poll = opcode::PollAdd::new(
                        types::Fd(late.event.as_raw_fd()),
                        libc::POLLIN as u32,
                    )
                    .multi(true)
                    .build()
                    .user_data(EVENT);
                    wr.push(poll.into());
                }
                continue;
            }
            if res < 0 {
                // SAFETY: see the function's contract.
                let wr = unsafe { &mut *w };
                match -res {
                    libc::EAGAIN | libc::EINTR => wr.register(),
                    e => {
                        // ENOTCONN: unmounted (the kernel tore the entry down).
                        if e != libc::ENOTCONN && e != libc::ECANCELED {
                            tracing::warn!(
                                "FUSE ring entry failed: {}",
                                io::Error::from_raw_os_error(e)
                            );
                        }
                        wr.live = false;
                    }
                }
                continue;
            }
            // A request: copy it out, run it, and see whether it was answered.
            let (req, hl) = {
                // SAFETY: see the function's contract.
                let wr = unsafe { &mut *w };
                let ent = &wr.ent;
                let Some(req) = Request::parse(&ent.header[..IN_HEADER_LEN]) else {
                    continue;
                };
                let psz = u32::from_le_bytes(
                    ent.header[ENT_IN_OUT + 16..ENT_IN_OUT + 20]
                        .try_into()
                        .unwrap_or_default(),
                ) as usize;
                let psz = psz.min(ent.payload.len());
                let hl = (req.len as usize)
                    .saturating_sub(IN_HEADER_LEN + psz)
                    .min(ENT_IN_OUT - OP_IN);
                args.clear();
                args.extend_from_slice(&ent.header[OP_IN..OP_IN + hl]);
                args.extend_from_slice(&ent.payload[..psz]);
                (req, hl)
            };
            if queue.kicker.is_kick(&req) {
                // Nothing to do but answer, which fetches what waited in the queue.
                let st = abi::statfs_out(0, 0, 0, 0, 0, 4096, 255, 4096);
                // SAFETY: see the function's contract.
                unsafe { &mut *w }.commit(req.unique, 0, &[&st]);
                continue;
            }
            // The last free thread of the queue takes this one: the queue gets another.
            if queue.group.take() && queue.group.size() < MAX_PER_QUEUE {
                if let Err(e) = add_thread(queue, None, true) {
                    tracing::warn!("cannot add a FUSE ring thread: {e}");
                }
            }
            CURRENT.set(Some(Current {
                worker: w,
                unique: req.unique,
            }));
            let (h, p) = args.split_at(hl);
            dispatch(&*queue.fs, &req, h, p, sink.clone());
            let answered = CURRENT.take().is_none();
            if answered {
                queue.group.done();
                continue;
            }
            if !expects_reply(req.opcode) {
                // SAFETY: see the function's contract.
                unsafe { &mut *w }.commit(req.unique, 0, &[]);
                queue.group.done();
                continue;
            }
            // Answered later, from another thread: the entry waits for it.
            waiting = Some(req.unique);
            if let Some((unique, error, body)) = late.reply.lock().take() {
                if waiting == Some(unique) {
                    waiting = None;
                    // SAFETY: see the function's contract.
                    unsafe { &mut *w }.commit(unique, error, &[&body]);
                    queue.group.done();
                }
            }
        }
    }
}
