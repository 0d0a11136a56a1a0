//! The server's bounds: peers that stall mid-frame, flood without reading, open too many
//! connections or CONNECT twice are cut off or contained, and everyone else keeps being
//! served, correctly, while that happens.

mod common;

use common::*;
use lode_base::{Errno, Fid};
use lode_client::{Client, Session};
use lode_proto::{Empty, Request};
use lode_testkit::{wait_for, Cluster};
use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MDT: &str = "testfs-MDT0000";

#[test]
fn a_peer_that_stops_mid_frame_is_disconnected_after_the_read_timeout() {
    let mut c = cluster(1);
    // One service thread: the stalled peer and the good client share it.
    restart_mds(&mut c, &["--threads", "1", "--read-timeout-ms", "500"]);
    let s = c.client();
    let dir = s.run(mkdir_p(&s.client, "/served"));

    let mut stalled = RawPeer::connect(&c.addr("mdt0"));
    let whole = ping_frame(1, 0);
    stalled.send(&whole[..whole.len() / 2]);

    // The good client is served while the half frame waits, until the peer is cut off.
    let mut served_while_stalled = 0;
    let end = Instant::now() + Duration::from_secs(30);
    for i in 0.. {
        assert!(
            Instant::now() < end,
            "the stalled peer was not disconnected within 30 s"
        );
        create_and_stat(&s, dir, &format!("f{i}"));
        if stalled.is_closed() {
            break;
        }
        served_while_stalled += 1;
    }
    assert!(
        served_while_stalled > 0,
        "no request of the good client completed while the half frame was pending"
    );
    assert!(
        stalled.received.is_empty(),
        "half a frame got an answer: {:?}",
        stalled.received
    );

    let log = c.log("mdt0");
    let timeouts = lines_with(&log, "read timeout");
    assert_eq!(
        timeouts.len(),
        1,
        "only the stalled peer hit the read timeout (an idle client must not): {timeouts:#?}"
    );
    assert!(
        timeouts[0].contains(&stalled.local_addr),
        "the read timeout line names the stalled peer {}: {}",
        stalled.local_addr,
        timeouts[0]
    );
    // The good client kept its connection and is still served.
    create_and_stat(&s, dir, "after");
}

#[test]
fn connections_beyond_max_connections_are_closed_at_once_and_the_others_keep_working() {
    let mut c = cluster(1);
    restart_mds(&mut c, &["--max-connections", "8"]);
    let addr = c.addr("mdt0");
    let r = root();
    let s1 = c.client();
    let s2 = c.client();
    let handle_of = |s: &Session| s.client.mdc().granted().expect("connected").handle;
    let (h1, h2) = (handle_of(&s1), handle_of(&s2));
    let d1 = s1.run(mkdir_p(&s1.client, "/one"));
    let d2 = s2.run(mkdir_p(&s2.client, "/two"));

    // Each client holds two connections (its requests and its lock callback channel);
    // four raw peers fill the eight; each is served (a PING is answered, ENOTCONN since
    // it never connected). A probe of the testkit's may still hold a slot for a moment,
    // hence the retry.
    for s in [&s1, &s2] {
        channel_up(s);
    }
    let fillers: Vec<RawPeer> = (0..4)
        .map(|i| {
            let mut served = None;
            wait_for(
                &format!("filler {i} to be served"),
                Duration::from_secs(10),
                || {
                    let mut p = RawPeer::connect(&addr);
                    if p.try_ping(0).is_some() {
                        served = Some(p);
                    }
                    served.is_some()
                },
            );
            served.expect("served")
        })
        .collect();

    // Every further connection is accepted and closed straight away.
    let mut extras: Vec<RawPeer> = (0..4).map(|_| RawPeer::connect(&addr)).collect();
    for (i, p) in extras.iter_mut().enumerate() {
        assert!(
            p.closed_by_server(Duration::from_secs(5)),
            "connection {} beyond max_connections was left open",
            i + 9
        );
    }
    let log = c.log("mdt0");
    let refusals = lines_with(&log, "max_connections");
    assert!(!refusals.is_empty(), "no max_connections line in the log");
    assert!(
        extras.iter().any(|p| refusals[0].contains(&p.local_addr)),
        "the refusal names a refused peer: {}",
        refusals[0]
    );

    // The connections that were in keep working, on their original connections.
    create_and_stat(&s1, d1, "still");
    create_and_stat(&s2, d2, "still");
    assert_eq!(handle_of(&s1), h1, "client 1 kept its connection");
    assert_eq!(handle_of(&s2), h2, "client 2 kept its connection");
    for (i, mut p) in fillers.into_iter().enumerate() {
        assert!(p.try_ping(0).is_some(), "filler {i} is still served");
    }
    // (the fillers are closed here, as they go out of scope)
    drop(extras);

    // With the raw peers gone there is room again: a new client connects and works.
    wait_for("a free connection slot", Duration::from_secs(10), || {
        RawPeer::connect(&addr).try_ping(0).is_some()
    });
    let s3 = c.client();
    let d3 = s3.run(mkdir_p(&s3.client, "/three"));
    create_and_stat(&s3, d3, "new");
    assert!(s3
        .run(s3.client.lookup(&r, d1, b"still"))
        .is_ok_and(|b| b.attr.mode == libc::S_IFREG | 0o644));
}

#[test]
fn a_client_that_never_reads_its_replies_is_disconnected_after_the_write_timeout() {
    let mut c = cluster(1);
    // One service thread: the flooder and the good client share it.
    restart_mds(&mut c, &["--threads", "1", "--write-timeout-ms", "1000"]);
    let s = c.client();
    let dir = s.run(mkdir_p(&s.client, "/served"));

    let mut flooder = RawPeer::connect(&c.addr("mdt0"));
    let handle = flooder.connect_as("testfs", MDT, "flooder").handle;
    let flooder_addr = flooder.local_addr.clone();
    let written = Arc::new(AtomicUsize::new(0));
    let cut_off = Arc::new(AtomicBool::new(false));
    let writer = {
        let sock = flooder.sock.try_clone().expect("clone socket");
        let (written, cut_off) = (written.clone(), cut_off.clone());
        std::thread::spawn(move || flood_pings(sock, handle, &written, &cut_off))
    };
    wait_for("the flood to be under way", Duration::from_secs(30), || {
        written.load(Ordering::Relaxed) >= 1 << 20
    });

    // The good client is served while the flooder's replies pile up, until the
    // flooder is cut off.
    let mut served_during_flood = 0;
    let end = Instant::now() + Duration::from_secs(30);
    for i in 0.. {
        assert!(
            Instant::now() < end,
            "the flooder was not disconnected within 30 s ({} bytes sent)",
            written.load(Ordering::Relaxed)
        );
        create_and_stat(&s, dir, &format!("f{i}"));
        if c.log("mdt0").contains("write timeout") {
            break;
        }
        served_during_flood += 1;
    }
    assert!(
        served_during_flood > 0,
        "no request of the good client completed during the flood"
    );
    wait_for(
        "the MDS to close the flooder's socket after its write timeout",
        Duration::from_secs(10),
        || cut_off.load(Ordering::Relaxed),
    );
    writer.join().expect("flood thread");

    let log = c.log("mdt0");
    let timeouts = lines_with(&log, "write timeout");
    assert_eq!(timeouts.len(), 1, "only the flooder: {timeouts:#?}");
    assert!(
        timeouts[0].contains(&flooder_addr),
        "the write timeout line names the flooder {flooder_addr}: {}",
        timeouts[0]
    );
    // The MDS held the flood in bounded memory (its peak resident set, generously).
    match mds_pid(&c) {
        Some(pid) => {
            let peak = proc_status_kib(pid, "VmHWM").expect("VmHWM");
            let now = proc_status_kib(pid, "VmRSS").expect("VmRSS");
            eprintln!(
                "flood: {} bytes sent; MDS resident now {now} KiB, peak {peak} KiB",
                written.load(Ordering::Relaxed)
            );
            assert!(
                peak < 1 << 20,
                "MDS peak resident set {peak} KiB exceeds 1 GiB"
            );
        }
        None => eprintln!("MDS pid not found: resident set not checked"),
    }
    create_and_stat(&s, dir, "after");
}

#[test]
fn a_second_connect_on_one_connection_replaces_its_export() {
    let c = cluster(1);
    wait_for(
        "the testkit's own clients' exports to go",
        Duration::from_secs(10),
        || num_exports(&c) == 0,
    );
    let mut p = RawPeer::connect(&c.addr("mdt0"));
    let first = p.connect_as("testfs", MDT, "twice");
    assert_eq!(num_exports(&c), 1);

    let second = p.connect_as("testfs", MDT, "twice");
    assert_ne!(first.handle, second.handle);
    assert_eq!(num_exports(&c), 1, "one export for the one connection");
    assert!(c.log("mdt0").contains("earlier export is replaced"));
    assert_eq!(
        p.ping(first.handle).header.status,
        Errno::ENOTCONN.status(),
        "the replaced export's handle is gone"
    );
    assert_eq!(p.ping(second.handle).header.status, 0);

    // Under another client UUID it is still one export per connection.
    let third = p.connect_as("testfs", MDT, "someone-else");
    assert_eq!(num_exports(&c), 1);
    assert_eq!(p.ping(third.handle).header.status, 0);

    drop(p);
    wait_for(
        "the export to go with its connection",
        Duration::from_secs(10),
        || num_exports(&c) == 0,
    );
}

#[test]
fn early_cancels_lead_a_request_and_a_malformed_lead_is_refused() {
    use lode_proto::frame::{with_cancels, FLAG_CANCELS};
    use lode_proto::{Frame, GetattrReq, Header};
    let c = cluster(1);
    let mut p = RawPeer::connect(&c.addr("mdt0"));
    let handle = p.connect_as("testfs", MDT, "cancels").handle;
    let getattr = Request::Getattr(GetattrReq {
        cred: lode_base::Cred::root(),
        fid: Fid::ROOT,
    });
    let header = Header {
        opcode: getattr.opcode() as u16,
        flags: FLAG_CANCELS,
        xid: 100,
        handle,
        ..Default::default()
    };
    // Cancels of locks this client does not hold change nothing: the getattr behind
    // them is answered.
    p.send(&Frame::encode(
        &header,
        &with_cancels(&[1, 2, 3 << 32], &getattr.encode()),
    ));
    let f = p.next_frame(Duration::from_secs(10)).expect("a reply");
    assert_eq!((f.header.xid, f.header.status), (100, 0));
    // A lead shorter than its count says: refused, logged, and the connection served on.
    p.send(&Frame::encode(
        &Header { xid: 101, ..header },
        &[9, 0, 1, 2, 3],
    ));
    let f = p.next_frame(Duration::from_secs(10)).expect("a reply");
    assert_eq!(
        (f.header.xid, f.header.status),
        (101, Errno::EPROTO.status())
    );
    assert!(c.log("mdt0").contains("bad early cancels in a request"));
    assert_eq!(p.ping(handle).header.status, 0);
}

#[test]
fn a_sync_waiting_for_a_slow_commit_does_not_hold_up_other_clients() {
    let mut c = cluster(1);
    // One service thread: the parked SYNC and the other client's requests share it.
    restart_mds(&mut c, &["--threads", "1"]);
    let r = root();
    let a = c.client();
    let b = c.client();
    let dir = b.run(mkdir_p(&b.client, "/busy"));

    c.set_param(&format!("mdt.{MDT}.fail_val=2000"));
    c.set_param(&format!("mdt.{MDT}.fail_loc=0x203"));
    // Something to commit: A's sync must wait for a commit that starts after it, and
    // every commit now takes 2 s.
    a.run(a.client.create(&r, Fid::ROOT, b"to-commit", 0o644, None))
        .expect("create before sync");

    let sync_sent = AtomicBool::new(false);
    let sync_returned = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let syncer = scope.spawn(|| {
            sync_sent.store(true, Ordering::SeqCst);
            // The MDT's SYNC alone (`Client::sync` goes on to sync the OSTs too).
            let res = a
                .run(a.client.mdc().call(Request::Sync(Empty {})))
                .map(|_| ());
            sync_returned.store(true, Ordering::SeqCst);
            res
        });
        wait_for("A to send its sync", Duration::from_secs(10), || {
            sync_sent.load(Ordering::SeqCst)
        });
        for i in 0..50 {
            create_and_stat(&b, dir, &format!("f{i}"));
        }
        let sync_returned_before_b_finished = sync_returned.load(Ordering::SeqCst);

        wait_for("A's sync to return", Duration::from_secs(30), || {
            sync_returned.load(Ordering::SeqCst)
        });
        let res = syncer.join().expect("sync thread");
        c.set_param(&format!("mdt.{MDT}.fail_loc=0"));
        assert!(
            !sync_returned_before_b_finished,
            "B's 50 creates and stats waited for A's slow sync"
        );
        assert_eq!(res, Ok(()), "A's sync completes once the commit does");
    });
    assert!(a.run(a.client.lookup(&r, Fid::ROOT, b"to-commit")).is_ok());
}

#[test]
fn sixty_four_clients_on_two_service_threads_all_get_correct_answers() {
    const CLIENTS: usize = 64;
    const FILES: usize = 30;
    let mut c = cluster(1);
    restart_mds(&mut c, &["--threads", "2"]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let cfg = c.client_config();
    let clients: Vec<Arc<Client>> = rt.block_on(async {
        futures::future::join_all((0..CLIENTS).map(|_| Client::connect(cfg.clone())))
            .await
            .into_iter()
            .map(|r| r.expect("client connects"))
            .collect()
    });
    let uuids: std::collections::BTreeSet<&str> = clients.iter().map(|cl| cl.uuid()).collect();
    assert_eq!(uuids.len(), CLIENTS, "every client has its own UUID");
    wait_for("one export per client", Duration::from_secs(10), || {
        num_exports(&c) == CLIENTS
    });

    let start = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let failures: Vec<String> = rt.block_on(async {
        let tasks: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, cl)| {
                let (cl, start) = (cl.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    create_stat_unlink(&cl, i, FILES).await
                })
            })
            .collect();
        let mut failures = Vec::new();
        for (i, t) in futures::future::join_all(tasks)
            .await
            .into_iter()
            .enumerate()
        {
            match t {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failures.push(e),
                Err(e) => failures.push(format!("client {i}: task failed: {e}")),
            }
        }
        failures
    });
    assert!(
        failures.is_empty(),
        "{} clients saw wrong answers: {failures:#?}",
        failures.len()
    );
}

#[test]
fn a_client_closed_for_idling_reconnects_on_its_next_request_and_keeps_its_open_file() {
    let mut c = cluster(1);
    restart_mds(&mut c, &["--idle-timeout-ms", "500"]);
    let s = c.client();
    let r = root();
    let dir = s.run(mkdir_p(&s.client, "/idle"));
    create_and_stat(&s, dir, "before");
    // An open handle lives in the client's slot, not in the closed connection.
    let made = s
        .run(
            s.client
                .create_open(&r, dir, b"open", 0o644, libc::O_RDWR, None),
        )
        .expect("create and open");
    wait_for(
        "the MDS to close the idle connection",
        Duration::from_secs(10),
        || c.log("mdt0").contains("closing idle connection"),
    );
    create_and_stat(&s, dir, "after");
    assert_eq!(
        c.get_param("mdt.*.open_files"),
        "1",
        "the handle outlived the connection"
    );
    let handles = c.get_param("mdt.*.open_handles");
    assert!(
        handles.lines().count() == 1
            && handles.contains(&format!("fid={}", made.fid))
            && handles.contains(&format!("handle={:#x}", made.handle))
            && handles.ends_with("mode=w"),
        "open_handles names the one handle: {handles:?}"
    );
    s.run(s.client.close_now(&made))
        .expect("close after reconnecting");
    assert_eq!(c.get_param("mdt.*.open_files"), "0");
    assert_eq!(c.get_param("mdt.*.open_handles"), "");
    assert!(
        c.log("mdt0").matches("client connected").count() >= 2,
        "the client connected again"
    );
}

// ---------------------------------------------------------------------------------------
// Helpers

/// Creates `name` in `dir` and checks what create and getattr say about it.
fn create_and_stat(s: &Session, dir: Fid, name: &str) {
    let r = root();
    let made = s
        .run(s.client.create(&r, dir, name.as_bytes(), 0o644, None))
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    assert_eq!(made.attr.mode, libc::S_IFREG | 0o644, "create {name}");
    let attr = s
        .run(s.client.getattr(&r, made.attr.fid))
        .unwrap_or_else(|e| panic!("getattr {name}: {e}"));
    assert_eq!(attr.fid, made.attr.fid, "getattr {name}");
    assert_eq!(attr.mode, libc::S_IFREG | 0o644, "getattr {name}");
}

/// One client's share of the concurrency test: its own directory, `files` files
/// created, stat'ed, unlinked and looked up again; every answer checked.
async fn create_stat_unlink(cl: &Client, i: usize, files: usize) -> Result<(), String> {
    let r = root();
    let mode = libc::S_IFREG | 0o640;
    let dir = cl
        .mkdir(&r, Fid::ROOT, format!("c{i}").as_bytes(), 0o755, None)
        .await
        .map_err(|e| format!("client {i}: mkdir: {e}"))?
        .attr
        .fid;
    let mut fids = Vec::with_capacity(files);
    for j in 0..files {
        let name = format!("f{j}");
        let made = cl
            .create(&r, dir, name.as_bytes(), 0o640, None)
            .await
            .map_err(|e| format!("client {i}: create {name}: {e}"))?;
        if made.attr.mode != mode {
            return Err(format!(
                "client {i}: create {name}: mode {:o}",
                made.attr.mode
            ));
        }
        fids.push(made.attr.fid);
    }
    for (j, fid) in fids.iter().enumerate() {
        let attr = cl
            .getattr(&r, *fid)
            .await
            .map_err(|e| format!("client {i}: getattr f{j}: {e}"))?;
        if attr.fid != *fid || attr.mode != mode {
            return Err(format!(
                "client {i}: getattr f{j}: got {:?} mode {:o}, created {fid:?} mode {mode:o}",
                attr.fid, attr.mode
            ));
        }
    }
    for j in 0..files {
        let name = format!("f{j}");
        cl.unlink(&r, dir, name.as_bytes())
            .await
            .map_err(|e| format!("client {i}: unlink {name}: {e}"))?;
        match cl.lookup(&r, dir, name.as_bytes()).await {
            Err(Errno::ENOENT) => {}
            other => {
                return Err(format!(
                    "client {i}: lookup {name} after unlink: {:?}",
                    other.map(|b| b.attr.fid)
                ))
            }
        }
    }
    let left = cl
        .readdir_all(&r, dir, false)
        .await
        .map_err(|e| format!("client {i}: readdir: {e}"))?;
    if left.len() != 2 {
        return Err(format!(
            "client {i}: {} entries left, want . and ..",
            left.len()
        ));
    }
    Ok(())
}

/// Writes PING frames as fast as the socket takes them and never reads, until the
/// server cuts the connection (`cut_off`), 256 MiB went out, or a minute passed.
fn flood_pings(mut sock: TcpStream, handle: u64, written: &AtomicUsize, cut_off: &AtomicBool) {
    const MAX_BYTES: usize = 256 << 20;
    sock.set_write_timeout(Some(Duration::from_millis(200)))
        .expect("write timeout");
    let batch: Vec<u8> = (0..1024u64)
        .flat_map(|x| ping_frame(x + 10, handle))
        .collect();
    let end = Instant::now() + Duration::from_secs(60);
    let mut off = 0;
    while Instant::now() < end && written.load(Ordering::Relaxed) < MAX_BYTES {
        match sock.write(&batch[off..]) {
            Ok(0) => break,
            Ok(n) => {
                written.fetch_add(n, Ordering::Relaxed);
                off = (off + n) % batch.len();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => {
                cut_off.store(true, Ordering::Relaxed);
                return;
            }
        }
    }
}

/// A PING frame.
fn ping_frame(xid: u64, handle: u64) -> Vec<u8> {
    request_frame(&Request::Ping(Empty {}), xid, handle)
}

/// `mdt.*.num_exports`: connected clients of the MDT.
fn num_exports(c: &Cluster) -> usize {
    let v = c.get_param(&format!("mdt.{MDT}.num_exports"));
    v.parse()
        .unwrap_or_else(|_| panic!("num_exports is not a number: {v:?}"))
}

/// The MDS's pid, from its target directory's lock file, if that process is the MDS
/// serving that directory.
fn mds_pid(c: &Cluster) -> Option<u32> {
    let dir = c.target_dir("mdt0");
    let pid: u32 = std::fs::read_to_string(dir.join("lock"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let dir = dir.to_string_lossy();
    cmdline
        .split(|b| *b == 0)
        .any(|arg| arg == dir.as_bytes())
        .then_some(pid)
}

/// A `kB` field of `/proc/PID/status` (`VmRSS`, `VmHWM`).
fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
