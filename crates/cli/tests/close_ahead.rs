//! Closes of handles nothing was written through (read-only ones, and writers that
//! wrote nothing), and of the handle that made a file all on the MDT or all on OSTs
//! and alone wrote it, that ride ahead of the next request (`CloseAhead`): no round
//! trip of their own, yet every handle is closed on the MDT soon after, through an
//! idle spell, an MDS restart and another client's unlink, and a client can close
//! only its own handles that way.

mod common;

use common::*;
use lode_base::limits::CLOSES_AHEAD_MAX;
use lode_base::{Errno, Fid};
use lode_client::Session;
use lode_proto::{CloseAheadReq, Request};
use lode_testkit::{wait_for, Cluster};
use std::time::Duration;

fn open_files(c: &Cluster) -> u64 {
    c.get_param("mdt.*.open_files").parse().expect("a count")
}

/// `s` opens `f` read-only and closes it: the close rides ahead of the next request
/// (a STATFS here), after which the MDT holds no handle open.
fn open_and_close_ahead(c: &Cluster, s: &Session, f: Fid) {
    let cl = &s.client;
    let fh = s.run(cl.open(&root(), f, libc::O_RDONLY)).expect("open");
    s.run(cl.close(&fh)).expect("close");
    s.run(cl.statfs()).expect("statfs");
    assert_eq!(open_files(c), 0);
}

/// `s` makes `name` in the root, open with `flags`.
fn create_in_root(s: &Session, name: &str, flags: i32) -> lode_client::FileHandle {
    s.run(
        s.client
            .create_open(&root(), Fid::ROOT, name.as_bytes(), 0o644, flags, None),
    )
    .expect("create")
}

/// `name`'s size in the root as `s` finds it (glimpsed if need be).
fn size_in_root(s: &Session, name: &str) -> u64 {
    let b = s
        .run(s.client.lookup(&root(), Fid::ROOT, name.as_bytes()))
        .expect("lookup");
    s.run(s.client.complete(b)).expect("size").attr.size
}

/// A file of `bytes` bytes named `name` in the root, written and closed (by RPC).
fn made(s: &Session, name: &str, bytes: usize) -> Fid {
    let cl = &s.client;
    let fh = create_in_root(s, name, libc::O_RDWR);
    s.run(cl.write(&fh, 0, &vec![7u8; bytes])).expect("write");
    s.run(cl.close_now(&fh)).expect("close");
    fh.fid
}

#[test]
fn a_read_only_close_rides_ahead_of_the_next_request() {
    let c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let f = made(&s, "f", 4096);
    assert_eq!(open_files(&c), 0);
    let (closes, ahead) = (mdt_stat(&c, "mds_close"), mdt_stat(&c, "mds_close_ahead"));
    let fh = s.run(cl.open(&root(), f, libc::O_RDONLY)).expect("open");
    assert_eq!(s.run(cl.read(&fh, 0, 4096)).expect("read").len(), 4096);
    s.run(cl.close(&fh)).expect("close");
    // Whatever goes next carries it (or the PING an idle moment sends).
    s.run(cl.statfs()).expect("statfs");
    assert_eq!(open_files(&c), 0, "closed on the MDT");
    assert_eq!(mdt_stat(&c, "mds_close"), closes, "no CLOSE RPC");
    assert_eq!(mdt_stat(&c, "mds_close_ahead"), ahead + 1);
}

#[test]
fn an_idle_clients_read_only_closes_reach_the_mdt_by_themselves() {
    let c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let f = made(&s, "f", 100);
    let closes = mdt_stat(&c, "mds_close");
    // Fewer opens than `opencache_threshold_count`: none is kept under an OPEN lock.
    for _ in 0..3 {
        let fh = s.run(cl.open(&root(), f, libc::O_RDONLY)).expect("open");
        s.run(cl.close(&fh)).expect("close");
    }
    wait_for(
        "the closes, with nothing else sent",
        Duration::from_secs(5),
        || open_files(&c) == 0,
    );
    assert_eq!(mdt_stat(&c, "mds_close"), closes, "no CLOSE RPC");
    assert_eq!(cl.mdc().closes_ahead(), 0);
}

#[test]
fn a_close_made_while_the_mds_is_down_is_done_once_it_has_recovered() {
    let mut c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let f = made(&s, "f", 100);
    let fh = s.run(cl.open(&root(), f, libc::O_RDONLY)).expect("open");
    // The recovery then waits for nobody else.
    wait_for("only the test's client", Duration::from_secs(10), || {
        c.get_param("mdt.*.num_exports") == "1"
    });
    c.kill9("mdt0");
    // Nothing can carry it now: it waits, and the handle is opened again in the
    // recovery (it is still the client's until the MDT has closed it).
    s.run(cl.close(&fh)).expect("close");
    c.start_target("mdt0");
    let status = wait_recovered(&c);
    assert_eq!(
        status_field(&status, "completed_clients"),
        "1/1",
        "{status}"
    );
    // Stats start again with the restart: the close came after it, ahead of a PING.
    wait_for(
        "the close after the recovery",
        Duration::from_secs(10),
        || open_files(&c) == 0 && mdt_stat(&c, "mds_close_ahead") == 1,
    );
    let again = s.run(cl.open(&root(), f, libc::O_RDONLY)).expect("open");
    assert_eq!(s.run(cl.read(&again, 0, 200)).expect("read").len(), 100);
    s.run(cl.close(&again)).expect("close");
}

#[test]
fn the_last_close_of_an_unlinked_file_ahead_of_a_request_destroys_it() {
    let c = cluster(1);
    let (a, b) = (c.client(), c.client());
    let f = made(&a, "f", 65536);
    let destroyed = || {
        c.get_param("mdt.*.destroys")
            .lines()
            .find_map(|l| l.strip_prefix("destroyed: "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("destroyed: in destroys")
    };
    let before = destroyed();
    let fh = a
        .run(a.client.open(&root(), f, libc::O_RDONLY))
        .expect("open");
    b.run(b.client.unlink(&root(), Fid::ROOT, b"f"))
        .expect("unlink by another client");
    assert_eq!(
        a.run(a.client.read(&fh, 0, 65536))
            .expect("still readable")
            .len(),
        65536
    );
    a.run(a.client.close(&fh)).expect("close");
    wait_for("the orphan destroyed", Duration::from_secs(20), || {
        open_files(&c) == 0 && destroyed() > before
    });
}

#[test]
fn a_client_closes_ahead_only_its_own_handles() {
    let c = cluster(1);
    let (a, b) = (c.client(), c.client());
    let f = made(&a, "f", 10);
    let w = a
        .run(a.client.open(&root(), f, libc::O_RDWR))
        .expect("open for writing");
    let r = a
        .run(a.client.open(&root(), f, libc::O_RDONLY))
        .expect("open for reading");
    assert_eq!(open_files(&c), 2);
    let sized = |h: u64| {
        (
            h,
            Some(lode_proto::CloseAttrs {
                size: 1 << 40,
                blocks: 8,
                mtime: 1,
            }),
        )
    };
    let close_ahead = |s: &Session, handles: Vec<u64>, written: Vec<u64>| {
        let written = written.into_iter().map(sized).collect();
        s.run(
            s.client
                .mdc()
                .call(Request::CloseAhead(CloseAheadReq { handles, written })),
        )
        .map(|_| ())
    };
    // Another client's handles, with a size or not, and one that is not open:
    // ignored.
    close_ahead(&b, vec![w.handle, r.handle], vec![]).expect("answered");
    close_ahead(&b, vec![], vec![w.handle]).expect("answered");
    close_ahead(&a, vec![12345], vec![54321]).expect("answered");
    assert_eq!(open_files(&c), 2, "nothing closed");
    assert_eq!(
        close_ahead(&a, vec![r.handle; CLOSES_AHEAD_MAX + 1], vec![]),
        Err(Errno::EPROTO),
        "too many handles in one frame"
    );
    assert_eq!(
        close_ahead(&a, vec![r.handle; CLOSES_AHEAD_MAX], vec![w.handle]),
        Err(Errno::EPROTO),
        "too many handles in one frame, with sizes"
    );
    assert_eq!(open_files(&c), 2);
    let closes = mdt_stat(&c, "mds_close");
    a.run(a.client.write(&w, 10, b"x"))
        .expect("the writer still writes");
    a.run(a.client.close(&w)).expect("close by RPC");
    assert_eq!(mdt_stat(&c, "mds_close"), closes + 1, "a writer's close");
    a.run(a.client.close(&r)).expect("close ahead");
    a.run(a.client.statfs()).expect("statfs");
    assert_eq!(open_files(&c), 0);
    assert_eq!(size_in_root(&b, "f"), 11, "the written byte counts");
}

/// `s` closes `fh`; returns the CLOSE RPCs the MDT counted meanwhile (0: it went
/// ahead of a later request, or is still waiting to).
fn close_rpcs(c: &Cluster, s: &Session, fh: &lode_client::FileHandle) -> u64 {
    let closes = mdt_stat(c, "mds_close");
    s.run(s.client.close(fh)).expect("close");
    mdt_stat(c, "mds_close") - closes
}

/// `s` makes `name` in the root with `creat` (open for writing) and closes it having
/// written nothing.
fn created_and_closed(s: &Session, name: &str) -> Fid {
    let fh = create_in_root(s, name, libc::O_WRONLY | libc::O_TRUNC);
    s.run(s.client.close(&fh)).expect("close");
    fh.fid
}

#[test]
fn a_created_file_closed_having_written_nothing_rides_ahead_and_needs_no_glimpse() {
    let c = cluster(1);
    let (s, other) = (c.client(), c.client());
    let (closes, ahead) = (mdt_stat(&c, "mds_close"), mdt_stat(&c, "mds_close_ahead"));
    let f = created_and_closed(&s, "f");
    s.run(s.client.statfs()).expect("statfs");
    assert_eq!(open_files(&c), 0, "closed on the MDT");
    assert_eq!(mdt_stat(&c, "mds_close"), closes, "no CLOSE RPC");
    assert_eq!(mdt_stat(&c, "mds_close_ahead"), ahead + 1);
    // The writer's mark went with it: another client is told the size is the MDT's.
    let b = other
        .run(other.client.lookup(&root(), Fid::ROOT, b"f"))
        .expect("lookup");
    assert_eq!(b.attr.fid, f);
    assert!(!b.glimpse, "the mark taken back");
    assert_eq!(b.attr.size, 0);
    // A writer that wrote, and another opened meanwhile, keep theirs.
    let cl = &s.client;
    let w = s
        .run(cl.open(&root(), f, libc::O_WRONLY))
        .expect("open for writing");
    let w2 = other
        .run(other.client.open(&root(), f, libc::O_WRONLY))
        .expect("another writer");
    s.run(cl.close(&w))
        .expect("close ahead, another writer open");
    s.run(cl.statfs()).expect("statfs");
    other
        .run(other.client.write(&w2, 0, &[1u8; 3000]))
        .expect("the other writes");
    let b = s.run(cl.lookup(&root(), Fid::ROOT, b"f")).expect("lookup");
    assert!(b.glimpse, "the other writer's mark stays");
    assert_eq!(s.run(cl.complete(b)).expect("glimpse").attr.size, 3000);
    other.run(other.client.close(&w2)).expect("close by RPC");
    assert_eq!(size_in_root(&s, "f"), 3000);
}

#[test]
fn a_handle_that_truncated_closes_by_rpc() {
    let c = cluster(1);
    let s = c.client();
    made(&s, "f", 5000);
    // An existing file opened with O_TRUNC: truncated through the handle.
    let fh = create_in_root(&s, "f", libc::O_WRONLY | libc::O_TRUNC);
    assert_eq!(close_rpcs(&c, &s, &fh), 1, "closed by RPC");
    assert_eq!(open_files(&c), 0);
}

#[test]
fn a_writer_opening_a_file_whose_mark_a_close_ahead_took_back_waits_for_it_to_commit() {
    let c = cluster(1);
    let (s, other) = (c.client(), c.client());
    hold_commits(&c, 2);
    let f = created_and_closed(&s, "f");
    s.run(s.client.statfs())
        .expect("statfs: the close goes ahead of it");
    let (last, committed) = transnos(&c);
    assert!(committed < last, "nothing committed since the create");
    // Setting the mark again moves the version, which a replay over a mark restored
    // by a crash would not: the write that took it back is made durable first.
    let w = other
        .run(other.client.open(&root(), f, libc::O_WRONLY))
        .expect("open for writing");
    assert!(
        transnos(&c).1 >= last,
        "the create and the mark's taking back committed before the open"
    );
    other
        .run(other.client.write(&w, 0, b"data"))
        .expect("write");
    other.run(other.client.close(&w)).expect("close");
    assert_eq!(size_in_root(&s, "f"), 4);
}

/// Kills the MDS and starts it again: its recovery replays every change (an open
/// closed ahead before it committed too: without that replay its transno would be a
/// gap, and every later replay would have to pass a version check), and the handles
/// opened again by the replay are closed again.
fn crash_and_recover_with_no_gap(c: &mut Cluster) {
    c.kill9("mdt0");
    c.start_target("mdt0");
    let status = wait_recovered(c);
    assert_eq!(status_field(&status, "vbr_gaps"), "0", "{status}");
    assert_eq!(status_field(&status, "vbr_refused"), "0", "{status}");
    wait_for("the handles closed again", Duration::from_secs(10), || {
        open_files(c) == 0
    });
}

#[test]
fn an_uncommitted_create_closed_ahead_is_replayed_and_closed_again() {
    let mut c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    hold_commits(&c, 1);
    let f = created_and_closed(&s, "n");
    let g = s
        .run(cl.create(&root(), Fid::ROOT, b"g", 0o644, None))
        .expect("a change after it")
        .attr
        .fid;
    assert_eq!(open_files(&c), 0, "closed ahead of the change");
    crash_and_recover_with_no_gap(&mut c);
    let other = c.client();
    let b = other
        .run(other.client.lookup(&root(), Fid::ROOT, b"n"))
        .expect("the create was replayed");
    assert_eq!(b.attr.fid, f);
    assert!(!b.glimpse, "and its mark taken back again");
    assert_eq!(
        other
            .run(other.client.lookup(&root(), Fid::ROOT, b"g"))
            .map(|b| b.attr.fid),
        Ok(g),
        "the later change was replayed"
    );
}

#[test]
fn an_uncommitted_open_closed_ahead_is_replayed_so_recovery_finds_no_gap() {
    let mut c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let f = made(&s, "f", 100);
    hold_commits(&c, 1);
    // The open takes a transno (kept in memory only); its close has none.
    open_and_close_ahead(&c, &s, f);
    let g = s
        .run(cl.create(&root(), Fid::ROOT, b"g", 0o644, None))
        .expect("a change after it")
        .attr
        .fid;
    crash_and_recover_with_no_gap(&mut c);
    assert_eq!(
        s.run(cl.lookup(&root(), Fid::ROOT, b"g"))
            .map(|b| b.attr.fid),
        Ok(g),
        "the later change was replayed"
    );
}

#[test]
fn a_close_ahead_replayed_in_a_long_recovery_is_sent_again_after_its_open_commits() {
    let mut c = cluster(1);
    let (s, other) = (c.client(), c.client());
    let cl = &s.client;
    let f = made(&s, "f", 100);
    hold_commits(&c, 2);
    open_and_close_ahead(&c, &s, f);
    // The other client goes with the MDS: recovery waits for it (3 s), long enough
    // for the restarted MDT to commit the replayed open before it ends. The replay's
    // last answer then says the open committed, which must not make the client
    // forget to close it again.
    let status = power_cut_without(&mut c, other);
    s.run(cl.statfs()).expect("statfs after recovery");
    assert_eq!(status_field(&status, "vbr_refused"), "0", "{status}");
    wait_for("the handle closed again", Duration::from_secs(10), || {
        open_files(&c) == 0
    });
}

#[test]
fn more_closes_than_one_frame_takes_waiting_through_an_mds_restart_are_all_done() {
    let mut c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    // One file each: repeated opens of one file would be kept by the open cache.
    let n = CLOSES_AHEAD_MAX + CLOSES_AHEAD_MAX / 2;
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let f = made(&s, &format!("f{i}"), 10);
            s.run(cl.open(&root(), f, libc::O_RDONLY)).expect("open")
        })
        .collect();
    assert_eq!(open_files(&c), n as u64);
    wait_for("only the test's client", Duration::from_secs(10), || {
        c.get_param("mdt.*.num_exports") == "1"
    });
    c.kill9("mdt0");
    // A frame's worth, which a PING takes and cannot deliver; then more, queued
    // while it waits. Once it fails they wait together, more than one frame holds.
    for h in &handles[..CLOSES_AHEAD_MAX] {
        s.run(cl.close(h)).expect("close");
    }
    std::thread::sleep(Duration::from_millis(200));
    for h in &handles[CLOSES_AHEAD_MAX..] {
        s.run(cl.close(h)).expect("close");
    }
    c.start_target("mdt0");
    let status = wait_recovered(&c);
    assert_eq!(
        status_field(&status, "completed_clients"),
        "1/1",
        "{status}"
    );
    s.run(cl.statfs()).expect("statfs");
    wait_for("every handle closed", Duration::from_secs(10), || {
        open_files(&c) == 0
    });
    assert_eq!(mdt_stat(&c, "mds_close_ahead"), 2, "two frames");
}

/// A layout with its first 64 KiB on the MDT and the rest, to EOF, on one OST stripe.
fn dom_then_ost_layout() -> lode_base::Layout {
    let mut l = dom_only_layout();
    l.components[0].end = 64 << 10;
    l.components
        .push(raid0_component(2, 64 << 10, lode_base::layout::EOF, 1));
    l
}

/// `name` in the root, made by `s` with [`dom_then_ost_layout`], open read-write with
/// `bytes` bytes written at 0.
fn pfl_file_written(s: &Session, name: &str, bytes: usize) -> lode_client::FileHandle {
    let fh = s
        .run(s.client.create_open(
            &root(),
            Fid::ROOT,
            name.as_bytes(),
            0o644,
            libc::O_RDWR,
            Some(dom_then_ost_layout()),
        ))
        .expect("create");
    s.run(s.client.write(&fh, 0, &vec![1u8; bytes]))
        .expect("write");
    fh
}

/// Up to `len` bytes of `f` from its start, as `s` reads them through a handle of its
/// own (opened read-only, then closed).
fn read_by(s: &Session, f: Fid, len: usize) -> Vec<u8> {
    let r = s
        .run(s.client.open(&root(), f, libc::O_RDONLY))
        .expect("open");
    let data = s.run(s.client.read(&r, 0, len)).expect("read");
    s.run(s.client.close(&r)).expect("close");
    data
}

/// The size of `b` as `s` completes it (a glimpse where it says so).
fn glimpsed_size(s: &Session, b: lode_proto::MdtBody) -> u64 {
    s.run(s.client.complete(b)).expect("glimpse").attr.size
}

/// `name` in the root as `s` knows it now, from what it holds (no glimpse).
fn cached_in_root(s: &Session, name: &str) -> lode_proto::MdtBody {
    s.run(s.client.lookup(&root(), Fid::ROOT, name.as_bytes()))
        .expect("lookup")
}

#[test]
fn the_maker_of_a_file_all_on_the_mdt_closes_ahead_after_writing_it() {
    let c = cluster(1);
    let (s, other) = (c.client(), c.client());
    let cl = &s.client;
    let (closes, ahead) = (mdt_stat(&c, "mds_close"), mdt_stat(&c, "mds_close_ahead"));
    let fh = dom_file_written(&s, b"d", &[5u8; 5000]);
    s.run(cl.write(&fh, 5000, &[6u8; 3000]))
        .expect("a second write");
    // A whole chunk written again is charged once.
    s.run(cl.write(&fh, 0, &[5u8; 4096])).expect("a rewrite");
    s.run(cl.close(&fh)).expect("close");
    let gets = || mdt_stat(&c, "mds_getattr") + mdt_stat(&c, "mds_getattr_name");
    let before = gets();
    // The writer knows the size, blocks and times the MDT has, with no glimpse.
    let mine = cached_in_root(&s, "d");
    assert!(!mine.glimpse, "the size is known exactly");
    assert_eq!(mine.attr.size, 8000);
    assert_eq!(mine.attr.blocks, 16, "two 4 KiB chunks");
    assert_eq!(gets(), before, "no GETATTR, no LOOKUP");
    s.run(cl.statfs())
        .expect("statfs: the close goes ahead of it");
    assert_eq!(open_files(&c), 0, "closed on the MDT");
    assert_eq!(mdt_stat(&c, "mds_close"), closes, "no CLOSE RPC");
    assert_eq!(mdt_stat(&c, "mds_close_ahead"), ahead + 1);
    // Another client finds the mark taken back, and the same attributes.
    let theirs = cached_in_root(&other, "d");
    assert!(!theirs.glimpse, "the mark taken back");
    for (a, b) in [
        (mine.attr.size, theirs.attr.size),
        (mine.attr.blocks, theirs.attr.blocks),
    ] {
        assert_eq!(a, b, "size and blocks");
    }
    assert_eq!(mine.attr.mtime, theirs.attr.mtime, "mtime");
    assert_eq!(mine.attr.ctime, theirs.attr.ctime, "ctime");
    // Its bytes come with the open (read-on-open needs the mark gone).
    let data = read_by(&other, fh.fid, 8192);
    assert_eq!(data.len(), 8000);
    assert!(data[..5000].iter().all(|&b| b == 5) && data[5000..].iter().all(|&b| b == 6));
}

#[test]
fn a_maker_that_is_not_the_only_writer_here_or_whose_bytes_reach_an_ost_closes_by_rpc() {
    let c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    // Another writer opened here meanwhile: the maker's answers are not the whole story.
    let fh = dom_file_written(&s, b"two", b"first");
    let w2 = s
        .run(cl.open(&root(), fh.fid, libc::O_WRONLY))
        .expect("another writer");
    s.run(cl.write(&w2, 5, b" second")).expect("write");
    assert_eq!(close_rpcs(&c, &s, &fh), 1, "the maker closed by RPC");
    s.run(cl.close(&w2)).expect("close");
    assert_eq!(size_in_root(&s, "two"), 12);
    // A setattr between the writes and the close (here a chmod).
    let fh = dom_file_written(&s, b"chmod", b"bytes");
    let sa = lode_base::SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    s.run(cl.setattr(&root(), fh.fid, sa)).expect("chmod");
    assert_eq!(close_rpcs(&c, &s, &fh), 1, "closed by RPC");
    // Bytes past the MDT's component: an OST object holds some.
    let fh = pfl_file_written(&s, "pfl", 100 << 10);
    assert_eq!(close_rpcs(&c, &s, &fh), 1, "closed by RPC, with its size");
    assert_eq!(size_in_root(&c.client(), "pfl"), 100 << 10);
    // Small, on the MDT alone, through the same layout: ahead.
    let fh = pfl_file_written(&s, "small", 4096);
    assert_eq!(close_rpcs(&c, &s, &fh), 0, "closed ahead");
    s.run(cl.statfs()).expect("statfs");
    let b = cached_in_root(&c.client(), "small");
    assert!(!b.glimpse, "the mark taken back");
    assert_eq!(b.attr.size, 4096);
}

#[test]
fn a_close_ahead_of_a_writer_whose_bytes_reached_an_ost_keeps_the_mark() {
    let c = cluster(1);
    let (s, other) = (c.client(), c.client());
    let cl = &s.client;
    let fh = pfl_file_written(&s, "pfl", 100 << 10);
    // A client that says nothing of its size, closing ahead what wrote on an OST: the
    // MDT, which saw bytes written here while objects exist, keeps the mark.
    s.run(cl.mdc().call(Request::CloseAhead(CloseAheadReq {
        handles: vec![fh.handle],
        written: vec![],
    })))
    .expect("answered");
    assert_eq!(open_files(&c), 0, "closed");
    let b = cached_in_root(&other, "pfl");
    assert!(b.glimpse, "the mark stays: the OST has the size");
    assert_eq!(glimpsed_size(&other, b), 100 << 10);
}

/// `s` closes `fh` (ahead), the MDS is killed and recovers, and another client finds
/// `name` holding `bytes`, its mark taken back again.
fn closed_ahead_through_a_crash(
    c: &mut Cluster,
    s: &Session,
    fh: &lode_client::FileHandle,
    bytes: &[u8],
) {
    s.run(s.client.close(fh)).expect("close ahead");
    s.run(s.client.statfs())
        .expect("statfs: the close goes ahead of it");
    assert_eq!(open_files(c), 0);
    crash_and_recover_with_no_gap(c);
    let other = c.client();
    let b = cached_in_root(&other, "d");
    assert_eq!(b.attr.fid, fh.fid, "the create is there");
    assert_eq!(b.attr.size, bytes.len() as u64, "and its write");
    assert!(!b.glimpse, "and its mark taken back again");
    assert_eq!(read_by(&other, fh.fid, 8192), bytes);
}

#[test]
fn an_uncommitted_file_all_on_the_mdt_written_and_closed_ahead_is_replayed_whole() {
    let mut c = cluster(1);
    let s = c.client();
    hold_commits(&c, 1);
    let fh = dom_file_written(&s, b"d", &[9u8; 3000]);
    closed_ahead_through_a_crash(&mut c, &s, &fh, &[9u8; 3000]);
}

#[test]
fn a_maker_whose_file_another_client_changed_learns_the_size_from_the_mdt() {
    let c = cluster(1);
    let (s, other) = (c.client(), c.client());
    let cl = &s.client;
    let fh = dom_file_written(&s, b"d", &[5u8; 8000]);
    // Another client truncates it by path (no open): the maker's lock is called back.
    let f = cached_in_root(&other, "d").attr.fid;
    let sa = lode_base::SetAttr {
        size: Some(10),
        ..Default::default()
    };
    other
        .run(other.client.setattr(&root(), f, sa))
        .expect("truncate");
    // The maker looks again (a new lock), then closes: what its writes said is not
    // the size any more.
    assert_eq!(size_in_root(&s, "d"), 10);
    s.run(cl.close(&fh)).expect("close");
    s.run(cl.statfs()).expect("statfs");
    assert_eq!(size_in_root(&s, "d"), 10, "the truncate counts");
    assert_eq!(cached_in_root(&s, "d").attr.size, 10);
}

#[test]
fn a_committed_dom_create_whose_writes_were_not_is_opened_again_for_their_replay() {
    let mut c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let fh = s
        .run(cl.create_open(
            &root(),
            Fid::ROOT,
            b"d",
            0o644,
            libc::O_RDWR,
            Some(dom_only_layout()),
        ))
        .expect("create");
    // The create commits; the write and the close ahead after it do not. Replayed
    // with no open, the write would leave the file marked as being written.
    hold_commits(&c, 1);
    s.run(cl.write(&fh, 0, &[3u8; 6000])).expect("write");
    closed_ahead_through_a_crash(&mut c, &s, &fh, &[3u8; 6000]);
}

/// `name` in the root, made by `s` on the OSTs (the root's layout) and open
/// read-write, with `bytes` written at 0 and at 5,000.
fn ost_file_written(s: &Session, name: &str, bytes: &[u8]) -> lode_client::FileHandle {
    let fh = create_in_root(s, name, libc::O_RDWR);
    s.run(s.client.write(&fh, 0, bytes)).expect("write");
    s.run(s.client.write(&fh, 5000, bytes)).expect("write");
    fh
}

#[test]
fn the_maker_of_a_file_on_osts_closes_ahead_with_the_size_its_writes_left() {
    let c = cluster(2);
    let (s, other) = (c.client(), c.client());
    let cl = &s.client;
    let (closes, ahead) = (mdt_stat(&c, "mds_close"), mdt_stat(&c, "mds_close_ahead"));
    let fh = ost_file_written(&s, "o", &[4u8; 3000]);
    assert!(fh.layout().is_some_and(|l| l.has_objects()));
    s.run(cl.close(&fh)).expect("close");
    let gets = || mdt_stat(&c, "mds_getattr") + mdt_stat(&c, "mds_getattr_name");
    let glimpses = || ost_stat(&c, &["ost_getattr"]);
    let (before, glimpsed) = (gets(), glimpses());
    // The maker knows the size with no glimpse.
    let mine = cached_in_root(&s, "o");
    assert!(!mine.glimpse, "the size is known exactly");
    assert_eq!(mine.attr.size, 8000);
    assert!(mine.attr.blocks > 0);
    assert_eq!(
        (gets(), glimpses()),
        (before, glimpsed),
        "no GETATTR, no glimpse"
    );
    s.run(cl.statfs())
        .expect("statfs: the close goes ahead of it");
    assert_eq!(open_files(&c), 0, "closed on the MDT");
    assert_eq!(mdt_stat(&c, "mds_close"), closes, "no CLOSE RPC");
    assert_eq!(mdt_stat(&c, "mds_close_ahead"), ahead + 1);
    // The MDT keeps it as lazy size: another client needs no glimpse either, and
    // sees what the OSTs would say.
    let theirs = cached_in_root(&other, "o");
    assert!(!theirs.glimpse, "the mark taken back");
    assert_eq!(glimpses(), glimpsed, "no glimpse");
    assert_eq!(
        (theirs.attr.size, theirs.attr.blocks, theirs.attr.mtime),
        (mine.attr.size, mine.attr.blocks, mine.attr.mtime)
    );
    let data = read_by(&other, fh.fid, 9000);
    assert_eq!(data.len(), 8000);
    assert!(data[..3000].iter().all(|&b| b == 4) && data[3000..5000].iter().all(|&b| b == 0));
}

#[test]
fn a_maker_on_osts_whose_file_another_client_opened_for_writing_leaves_the_size_to_the_osts() {
    let c = cluster(2);
    let (s, other) = (c.client(), c.client());
    let cl = &s.client;
    let fh = ost_file_written(&s, "o", &[4u8; 3000]);
    // Another client opens it for writing (the maker's lock is called back) and
    // writes further.
    let w = other
        .run(other.client.open(&root(), fh.fid, libc::O_WRONLY))
        .expect("another writer");
    other
        .run(other.client.write(&w, 20_000, b"end"))
        .expect("the other writes");
    s.run(cl.close(&fh)).expect("close");
    s.run(cl.statfs()).expect("statfs");
    let b = cached_in_root(&s, "o");
    assert!(b.glimpse, "the maker's copy is no longer exact");
    assert_eq!(size_in_root(&s, "o"), 20_003);
    other.run(other.client.close(&w)).expect("close");
    assert_eq!(size_in_root(&c.client(), "o"), 20_003);
}

#[test]
fn an_uncommitted_file_on_osts_closed_ahead_is_replayed_and_closed_again_leaving_the_size_to_the_osts(
) {
    let mut c = cluster(2);
    let s = c.client();
    hold_commits(&c, 1);
    let fh = ost_file_written(&s, "o", &[6u8; 3000]);
    s.run(s.client.close(&fh)).expect("close ahead");
    s.run(s.client.statfs())
        .expect("statfs: the close goes ahead of it");
    assert_eq!(open_files(&c), 0);
    let (last, committed) = transnos(&c);
    assert!(committed < last, "the create is not committed");
    crash_and_recover_with_no_gap(&mut c);
    let other = c.client();
    let b = cached_in_root(&other, "o");
    assert_eq!(b.attr.fid, fh.fid, "the create is there");
    // Closed again saying it wrote, not what: another client may have written since
    // (see the next test), which the replayed open cannot know.
    assert!(b.glimpse, "the size is the OSTs'");
    assert_eq!(glimpsed_size(&other, b), 8000);
    let data = read_by(&other, fh.fid, 9000);
    assert_eq!(data.len(), 8000);
    assert!(data[5000..].iter().all(|&b| b == 6));
}

/// The maker closes ahead with its size; another client then writes further and
/// closes (its size kept on the MDT), and the MDS restarts before the maker heard
/// that its create committed: the maker's open, replayed and closed again, must not
/// put back the size it had.
#[test]
fn a_close_ahead_sent_again_after_a_restart_never_undoes_a_later_writers_size() {
    let mut c = cluster(2);
    let (s, other) = (c.client(), c.client());
    hold_commits(&c, 2);
    let fh = ost_file_written(&s, "o", &[6u8; 3000]);
    s.run(s.client.close(&fh)).expect("close ahead");
    s.run(s.client.statfs())
        .expect("statfs: the close goes ahead of it");
    let w = other
        .run(other.client.open(&root(), fh.fid, libc::O_WRONLY))
        .expect("another writer");
    other
        .run(other.client.write(&w, 20_000, b"end"))
        .expect("the other writes");
    other.run(other.client.close(&w)).expect("close");
    assert_eq!(size_in_root(&other, "o"), 20_003);
    crash_and_recover_with_no_gap(&mut c);
    let third = c.client();
    assert_eq!(size_in_root(&third, "o"), 20_003, "after the restart");
    assert_eq!(size_in_root(&s, "o"), 20_003, "for the maker too");
}
