//! Shared helpers for the integration tests.
#![allow(dead_code)]

use lode_base::{Component, Cred, Errno, Fid, Layout, Pattern};
use lode_client::{Client, Session};
use lode_proto::{ConnectRep, Empty, Frame, FrameError, Header, Reply, Request, CONNECT_SUPPORTED};
use lode_testkit::{wait_for, Cluster};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// A cluster of real `lode` processes with `osts` OSTs.
pub fn cluster(osts: u32) -> Cluster {
    Cluster::start(Path::new(env!("CARGO_BIN_EXE_lode")), osts)
}

/// The superuser.
pub fn root() -> Cred {
    Cred::root()
}

/// An unprivileged user (uid 1000, gid 1000).
pub fn user() -> Cred {
    Cred {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    }
}

/// Waits (up to 10 s) until `s`'s callback channel is up: locks are granted, and
/// caches kept, only with it.
pub fn channel_up(s: &Session) {
    wait_for(
        "the callback channel to come up",
        Duration::from_secs(10),
        || s.client.callback_channel_up(),
    );
}

/// Resolves a path to its FID (no final symlink following).
pub fn fid(s: &Session, path: &str) -> Result<Fid, Errno> {
    s.run(s.client.resolve(&root(), path, false))
        .map(|b| b.attr.fid)
}

/// Creates directories along `path` as root and returns the last FID.
pub async fn mkdir_p(c: &Client, path: &str) -> Fid {
    let mut cur = Fid::ROOT;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        cur = match c.lookup(&root(), cur, part.as_bytes()).await {
            Ok(b) => b.attr.fid,
            Err(_) => {
                c.mkdir(&root(), cur, part.as_bytes(), 0o755, None)
                    .await
                    .expect("mkdir")
                    .attr
                    .fid
            }
        };
    }
    cur
}

pub fn request_frame(req: &Request, xid: u64, handle: u64) -> Vec<u8> {
    let header = Header {
        opcode: req.opcode() as u16,
        xid,
        handle,
        ..Default::default()
    };
    Frame::encode(&header, &req.encode())
}

/// A peer of the MDS speaking the wire format by hand over a plain socket.
pub struct RawPeer {
    pub sock: TcpStream,
    /// Bytes received and not yet taken as a frame.
    pub received: Vec<u8>,
    /// This end's address, as the server logs the peer.
    pub local_addr: String,
    xid: u64,
}

impl RawPeer {
    pub fn connect(addr: &str) -> RawPeer {
        let sock = TcpStream::connect(addr).expect("connect to the MDS");
        sock.set_nodelay(true).expect("nodelay");
        let local_addr = sock.local_addr().expect("local address").to_string();
        RawPeer {
            sock,
            received: Vec::new(),
            local_addr,
            xid: 0,
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).expect("send to the MDS");
    }

    /// Sends `req` under `header` (its opcode must be the request's).
    pub fn send_request(&mut self, header: &Header, req: &Request) {
        assert_eq!(header.opcode, req.opcode() as u16, "header opcode");
        self.send(&Frame::encode(header, &req.encode()));
    }

    /// Sends `req` with this `xid` and waits (10 s) for its reply.
    pub fn call_xid(&mut self, req: &Request, xid: u64, handle: u64) -> Frame {
        self.sock
            .write_all(&request_frame(req, xid, handle))
            .expect("send to the MDS");
        let reply = self
            .next_frame(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("no reply to xid {xid} within 10 s"));
        assert_eq!(reply.header.xid, xid, "the reply echoes the request's xid");
        reply
    }

    /// Sends `req` with the next xid and waits (10 s) for its reply; `None` if the
    /// connection is gone.
    pub fn call(&mut self, req: &Request, handle: u64) -> Option<Frame> {
        self.xid += 1;
        let xid = self.xid;
        self.sock.write_all(&request_frame(req, xid, handle)).ok()?;
        let reply = self.next_frame(Duration::from_secs(10))?;
        assert_eq!(reply.header.xid, xid, "the reply echoes the request's xid");
        Some(reply)
    }

    /// A PING with `handle`; `None` if the connection is gone.
    pub fn try_ping(&mut self, handle: u64) -> Option<Frame> {
        self.call(&Request::Ping(Empty {}), handle)
    }

    pub fn ping(&mut self, handle: u64) -> Frame {
        self.try_ping(handle).expect("PING answered")
    }

    /// CONNECT to `target` of `fsname` as client `uuid` (test clusters have no key),
    /// asking for one modify tag.
    pub fn connect_as(&mut self, fsname: &str, target: &str, uuid: &str) -> ConnectRep {
        let req = Request::Connect(lode_proto::ConnectReq {
            fsname: fsname.into(),
            target: target.into(),
            client_uuid: uuid.into(),
            flags: CONNECT_SUPPORTED,
            max_mod_rpcs: 1,
            auth: Vec::new(),
        });
        let reply = self.call(&req, 0).expect("CONNECT answered");
        assert_eq!(reply.header.status, 0, "CONNECT accepted");
        match Reply::decode(reply.header.opcode, &reply.body) {
            Ok(Reply::Connect(rep)) => rep,
            other => panic!("CONNECT reply: {other:?}"),
        }
    }

    /// The next whole frame, or `None` if the connection closes or `within` passes.
    pub fn next_frame(&mut self, within: Duration) -> Option<Frame> {
        let end = Instant::now() + within;
        loop {
            match Frame::decode(&self.received) {
                Ok((frame, used)) => {
                    self.received.drain(..used);
                    return Some(frame);
                }
                Err(FrameError::Truncated) => {}
                Err(e) => panic!("malformed frame from the MDS: {e}"),
            }
            let left = end.checked_duration_since(Instant::now())?;
            if left.is_zero() || !self.read_some(left).ok()? {
                return None;
            }
        }
    }

    /// Reads what arrives within `within` into `received`: Ok(false) at end of stream,
    /// Ok(true) otherwise (data or not), Err if the connection failed.
    pub fn read_some(&mut self, within: Duration) -> std::io::Result<bool> {
        self.sock
            .set_read_timeout(Some(within.max(Duration::from_millis(1))))?;
        let mut chunk = [0u8; 64 << 10];
        match self.sock.read(&mut chunk) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.received.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    /// True if the server has closed (or reset) the connection, looking without waiting.
    pub fn is_closed(&mut self) -> bool {
        self.sock.set_nonblocking(true).expect("nonblocking");
        let mut chunk = [0u8; 4096];
        let closed = loop {
            match self.sock.read(&mut chunk) {
                Ok(0) => break true,
                Ok(n) => self.received.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
                Err(_) => break true,
            }
        };
        self.sock.set_nonblocking(false).expect("blocking");
        closed
    }

    /// Waits up to `within` for the server to close the connection.
    pub fn closed_by_server(&mut self, within: Duration) -> bool {
        let end = Instant::now() + within;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.read_some(left.min(Duration::from_millis(100))) {
                Ok(true) => {}
                Ok(false) | Err(_) => return true,
            }
        }
        false
    }
}

/// The lines of `log` that contain `needle`.
pub fn lines_with<'a>(log: &'a str, needle: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(needle)).collect()
}

/// Restarts the MDS with extra server flags and waits until it can place objects again.
pub fn restart_mds(c: &mut Cluster, args: &[&str]) {
    c.set_server_args("mdt0", args);
    c.kill9("mdt0");
    c.start_target("mdt0");
    lode_testkit::wait_for(
        "the restarted MDS to see its OST",
        Duration::from_secs(30),
        || {
            c.get_param("lod.*.target_obd")
                .lines()
                .any(|l| l.ends_with(" ACTIVE"))
        },
    );
}

/// A C string of a path.
pub fn cs(p: impl AsRef<Path>) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_ref().as_os_str().as_bytes()).expect("no NUL in a test path")
}

/// The unprivileged user tests act as.
pub const UID: u32 = 4242;

/// Runs `f` in a forked child with working directory `dir`, as uid/gid 4242 without
/// supplementary groups if `drop`; returns 0 if `f` returned >= 0, else its errno.
/// `f` must not allocate (the parent has other threads).
pub fn in_child(dir: &Path, drop: bool, f: impl FnOnce() -> i64) -> i32 {
    static USER: std::sync::Once = std::sync::Once::new();
    USER.call_once(|| {
        // "Already exists" after the first run; the uid works either way.
        let args = "-u 4242 -U -M -s /usr/sbin/nologin lodetest";
        let _ = std::process::Command::new("useradd")
            .args(args.split(' '))
            .output();
    });
    let d = cs(dir);
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let ok = libc::chdir(d.as_ptr()) == 0
                && (!drop
                    || (libc::setgroups(0, std::ptr::null()) == 0
                        && libc::setgid(UID) == 0
                        && libc::setuid(UID) == 0));
            if !ok {
                libc::_exit(200);
            }
            let r = f();
            libc::_exit(if r < 0 { *libc::__errno_location() } else { 0 });
        }
        let mut st = 0;
        assert_eq!(libc::waitpid(pid, &mut st, 0), pid);
        assert!(libc::WIFEXITED(st), "child died: status {st}");
        let code = libc::WEXITSTATUS(st);
        assert_ne!(code, 200, "child could not chdir or setuid");
        code
    }
}

/// `f` on `name` (relative to `dir`) as uid 4242: 0 or the errno.
pub fn as_user(dir: &Path, name: &str, f: impl FnOnce(*const libc::c_char) -> i32) -> i32 {
    let n = cs(name);
    in_child(dir, true, || f(n.as_ptr()) as i64)
}

/// A small deterministic PRNG (splitmix64), for randomized tests that replay from a
/// printed seed.
pub struct Prng(pub u64);

impl Prng {
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// One of `v`.
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }

    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }

    /// `n` random lowercase letters.
    pub fn letters(&mut self, n: u64) -> Vec<u8> {
        (0..n).map(|_| b'a' + self.below(26) as u8).collect()
    }
}

/// Holds commits back for a minute: whatever the tests do next is uncommitted. First
/// waits until only the test's `clients` are connected (the cluster's own start-up
/// client has gone) and that is on disk, so the restart waits for nobody else.
pub fn hold_commits(c: &Cluster, clients: usize) {
    wait_for("only the test's clients", Duration::from_secs(10), || {
        c.get_param("mdt.*.num_exports") == clients.to_string()
    });
    wait_for(
        "everything so far to commit",
        Duration::from_secs(10),
        || {
            let (last, committed) = transnos(c);
            last == committed
        },
    );
    c.set_param("mdt.*.commit_interval_ms=60000");
    // The commit thread may be in the last short wait: let it pass.
    std::thread::sleep(Duration::from_millis(300));
}

pub fn transnos(c: &Cluster) -> (u64, u64) {
    let n = |p: &str| c.get_param(p).trim().parse::<u64>().expect("a number");
    (n("mdt.*.last_transno"), n("mdt.*.last_committed"))
}

/// Kills the MDS, and client `gone` with it, and restarts the MDS: recovery waits 3 s
/// for `gone`, evicts it, and ends without it. Returns the `recovery_status`.
pub fn power_cut_without(c: &mut Cluster, gone: Session) -> String {
    c.kill9("mdt0");
    drop(gone);
    c.start_target("mdt0");
    wait_for("the MDS to answer", Duration::from_secs(30), || {
        !c.get_param("mdt.*.recovery_time_soft").is_empty()
    });
    c.set_param("mdt.*.recovery_time_soft=3");
    let status = wait_recovered(c);
    assert_eq!(
        status_field(&status, "completed_clients"),
        "1/2",
        "{status}"
    );
    status
}

/// A layout whose one component, the first MiB, is on the MDT.
pub fn dom_only_layout() -> Layout {
    Layout {
        gen: 0,
        components: vec![Component {
            id: 1,
            start: 0,
            end: 1 << 20,
            pattern: Pattern::Mdt,
        }],
    }
}

/// A RAID0 component `id` over `[start, end)`, `stripes` OSTs chosen by the MDT,
/// 64 KiB stripes.
pub fn raid0_component(id: u32, start: u64, end: u64, stripes: i32) -> Component {
    Component {
        id,
        start,
        end,
        pattern: Pattern::Raid0 {
            stripe_size: 64 << 10,
            stripe_count: stripes,
            stripe_offset: -1,
            osts: Vec::new(),
        },
    }
}

/// `name` in the root, made by `s` as root with [`dom_only_layout`], open read-write,
/// nothing written.
pub fn dom_created(s: &Session, name: &[u8]) -> lode_client::FileHandle {
    s.run(s.client.create_open(
        &root(),
        Fid::ROOT,
        name,
        0o644,
        libc::O_RDWR,
        Some(dom_only_layout()),
    ))
    .expect("create_open")
}

/// `name` in the root, made by `s` as root with [`dom_only_layout`], open read-write
/// with `bytes` written at 0.
pub fn dom_file_written(s: &Session, name: &[u8], bytes: &[u8]) -> lode_client::FileHandle {
    let fh = dom_created(s, name);
    assert_eq!(s.run(s.client.write(&fh, 0, bytes)), Ok(bytes.len()));
    fh
}

/// Waits until the MDT's recovery is over and returns its `recovery_status`.
pub fn wait_recovered(c: &Cluster) -> String {
    let mut status = String::new();
    lode_testkit::wait_for("recovery to end", Duration::from_secs(60), || {
        status = c.get_param("mdt.*.recovery_status");
        status.starts_with("status: COMPLETE")
    });
    status
}

/// The value of `name:` in a `recovery_status`.
pub fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("no {name} in\n{status}"))
        .to_string()
}

/// File content or an xattr value, shown as a byte string (model tests).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Bytes(pub Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}

/// Permission bits, shown in octal (model tests).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Mode(pub u32);

impl std::fmt::Debug for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#o}", self.0)
    }
}

/// The count of `name` in the (only) mount's `mdc.*.md_stats` (0 if absent).
pub fn md_stat(c: &Cluster, name: &str) -> u64 {
    let out = c.get_param("mdc.*.md_stats");
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .map_or(0, |n| n.parse().expect("a count"))
}

/// Runs `lode ARGS` against the cluster.
pub fn lode_run(c: &Cluster, args: &[&str]) -> std::process::Output {
    c.lode().args(args).output().expect("lode runs")
}

/// Runs `lode ARGS`, which must succeed; its standard output.
pub fn lode_ok(c: &Cluster, args: &[&str]) -> String {
    let o = lode_run(c, args);
    assert!(
        o.status.success(),
        "lode {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8")
}

/// GNU `ls -l DIR`, which must succeed: its standard output.
pub fn gnu_ls_l(dir: &Path) -> String {
    let out = std::process::Command::new("ls")
        .arg("-l")
        .arg(dir)
        .output()
        .expect("ls");
    assert!(out.status.success(), "ls -l: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Makes directory `dir`, whose new files keep their first MiB on the MDT (`lode
/// setstripe -E 1M -L mdt`).
pub fn dom_dir(c: &Cluster, dir: &Path) {
    std::fs::create_dir(dir).expect("mkdir");
    lode_ok(c, &["setstripe", "-E", "1M", "-L", "mdt", &arg(dir)]);
}

/// A path as a command-line argument.
pub fn arg(p: &Path) -> String {
    p.display().to_string()
}

/// A random seed, or `LODE_TEST_SEED`'s (to repeat a run).
pub fn test_seed() -> u64 {
    std::env::var("LODE_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random)
}

/// The count of `name` in the MDT's `stats`.
pub fn mdt_stat(c: &Cluster, name: &str) -> u64 {
    c.get_param("mdt.*.stats")
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// The MDT's next request with `opcode` waits `ms` before it runs (`fail_loc`
/// DELAY_EXEC|ONCE, `fail_opc`); `fail_loc` reads 0 again once it has.
pub fn delay_next(c: &Cluster, opcode: lode_proto::Opcode, ms: u32) {
    c.set_param(&format!("mdt.*.fail_val={ms}"));
    c.set_param(&format!("mdt.*.fail_opc={}", opcode as u16));
    c.set_param("mdt.*.fail_loc=0x80000104");
}

/// The OSTs' `obdfilter.*.stats` counts of `names`, summed over the OSTs.
pub fn ost_stat(c: &Cluster, names: &[&str]) -> u64 {
    c.get_param("obdfilter.*.stats")
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|n| names.contains(&n))
        })
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// The names in directory `dir` (without `.` and `..`), listed by `s` without
/// attributes, as `ls` and `du` list before they stat.
pub fn listed_names(s: &Session, dir: Fid) -> Vec<Vec<u8>> {
    s.run(s.client.readdir_all(&root(), dir, false))
        .expect("readdir")
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != b"." && n != b"..")
        .collect()
}
