//! Exactly-once execution of modifying MDT requests, whatever happens to their replies.
//!
//! A modifying request (one that takes a modify tag) whose reply is lost is resent by the
//! client with the same xid and tag and the `RESENT` flag. The MDS must then answer from
//! the reply record it wrote with the change, never execute the request a second time:
//! a second execution would answer a create with EEXIST, an unlink with ENOENT, a
//! rename with ENOENT, an `XATTR_CREATE` setxattr with EEXIST, and so on, and would
//! change the namespace twice (link counts, open handles).
//!
//! This file proves, against real server processes:
//!
//! * for every modifying opcode (create, open-create, close, mkdir, mknod, symlink,
//!   unlink, rmdir, rename, link, setattr, setxattr, removexattr), a lost reply
//!   (`fail_loc` DROP_REPLY|ONCE) still gives the caller the original result, and the
//!   change is there exactly once;
//! * a failing request is answered the same way when resent, even if by then it could
//!   succeed (the error reply is recorded too);
//! * a resend arriving on another connection of the same client while the original
//!   still executes (`fail_loc` DELAY_EXEC|ONCE) does not run it a second time;
//! * a client that gave up waiting (its `timeout` passed while the MDT was slow) keeps
//!   the request's modify tag until the server answers, so its next modification does
//!   not reuse a tag that is still executing.

mod common;

use common::*;
use lode_base::{Errno, Fid, SetAttr};
use lode_client::{MdtBody, Session};
use lode_proto::frame::FLAG_RESENT;
use lode_proto::{CreateReq, Empty, Frame, GetattrReq, Header, Reply, Request};
use lode_testkit::{wait_for, Cluster};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `fail_loc` DROP_REPLY|ONCE: the MDS executes the next request but drops its reply.
const DROP_REPLY_ONCE: &str = "mdt.*.fail_loc=0x80000102";
/// `fail_loc` DELAY_EXEC|ONCE: the MDS sleeps `fail_val` ms before executing the next
/// modifying request (after it is registered as executing on its tag).
const DELAY_EXEC_ONCE: &str = "mdt.*.fail_loc=0x80000104";
/// `setxattr` flag: fail with EEXIST if the attribute exists.
const XATTR_CREATE: u32 = 1;

// ---------------------------------------------------------------------------------------
// Every modifying opcode, its reply lost once

#[test]
fn a_resent_create_open_create_close_mkdir_mknod_or_symlink_returns_the_original_result_and_runs_once(
) {
    let c = cluster(1);
    let s = resending_client(&c, Duration::from_millis(300));
    let cl = &s.client;
    let r = root();
    let dir = s.run(mkdir_p(cl, "/creates"));
    warm_up(&s, dir);

    // create: a second execution would find its own name and say EEXIST.
    let made = with_lost_reply(&c, "create", || {
        s.run(cl.create(&r, dir, b"file", 0o644, None))
    })
    .unwrap_or_else(|e| panic!("create: resent create must succeed, got {e:?}"));
    check_made(&s, dir, "file", &made, libc::S_IFREG | 0o644, "create");

    // open-create: a second execution (no O_EXCL) would open the file again and leave
    // a second open handle behind.
    let fh = with_lost_reply(&c, "open-create", || {
        s.run(cl.create_open(&r, dir, b"opened", 0o644, libc::O_RDWR, None))
    })
    .unwrap_or_else(|e| panic!("open-create: resent open-create must succeed, got {e:?}"));
    assert_eq!(
        lookup_fid(&s, dir, "opened"),
        Ok(fh.fid),
        "open-create: the FID the caller got is the one in the namespace"
    );
    assert_eq!(
        c.get_param("mdt.*.open_files"),
        "1",
        "open-create: exactly one open handle, not one per execution"
    );

    // close: a second execution would find the handle gone and say EBADF.
    with_lost_reply(&c, "close", || s.run(cl.close_now(&fh)))
        .unwrap_or_else(|e| panic!("close: resent close must succeed, got {e:?}"));
    assert_eq!(
        c.get_param("mdt.*.open_files"),
        "0",
        "close: the handle is closed"
    );
    assert_eq!(
        lookup_fid(&s, dir, "opened"),
        Ok(fh.fid),
        "close: the file is still there"
    );

    // A read-only open and its close change nothing on disk: their replies are kept
    // in memory only, and a resend is still answered from them (a second open would
    // leave a second handle, a second close would say EBADF).
    let ro = with_lost_reply(&c, "read-only open", || {
        s.run(cl.open(&r, fh.fid, libc::O_RDONLY))
    })
    .unwrap_or_else(|e| panic!("read-only open: resent open must succeed, got {e:?}"));
    assert_eq!(
        c.get_param("mdt.*.open_files"),
        "1",
        "read-only open: exactly one open handle, not one per execution"
    );
    with_lost_reply(&c, "read-only close", || s.run(cl.close_now(&ro)))
        .unwrap_or_else(|e| panic!("read-only close: resent close must succeed, got {e:?}"));
    assert_eq!(
        c.get_param("mdt.*.open_files"),
        "0",
        "read-only close: the handle is closed"
    );

    // mkdir: EEXIST on a second execution, and the parent's link count would not be
    // what one new subdirectory makes it.
    let before = nlink(&s, dir);
    let sub = with_lost_reply(&c, "mkdir", || {
        s.run(cl.mkdir(&r, dir, b"sub", 0o755, None))
    })
    .unwrap_or_else(|e| panic!("mkdir: resent mkdir must succeed, got {e:?}"));
    check_made(&s, dir, "sub", &sub, libc::S_IFDIR | 0o755, "mkdir");
    assert_eq!(
        nlink(&s, dir),
        before + 1,
        "mkdir: the parent's nlink rose by exactly one"
    );
    assert_eq!(
        nlink(&s, sub.attr.fid),
        2,
        "mkdir: the new directory's nlink"
    );

    // mknod (a fifo).
    let fifo = with_lost_reply(&c, "mknod", || {
        s.run(cl.mknod(&r, dir, b"fifo", libc::S_IFIFO | 0o640, 0))
    })
    .unwrap_or_else(|e| panic!("mknod: resent mknod must succeed, got {e:?}"));
    check_made(&s, dir, "fifo", &fifo, libc::S_IFIFO | 0o640, "mknod");

    // symlink.
    let link = with_lost_reply(&c, "symlink", || {
        s.run(cl.symlink(&r, dir, b"sym", b"../somewhere/else"))
    })
    .unwrap_or_else(|e| panic!("symlink: resent symlink must succeed, got {e:?}"));
    assert_eq!(
        lookup_fid(&s, dir, "sym"),
        Ok(link.attr.fid),
        "symlink: the FID the caller got is the one in the namespace"
    );
    assert_eq!(
        s.run(cl.readlink(&r, link.attr.fid)).as_deref(),
        Ok(&b"../somewhere/else"[..]),
        "symlink: its target"
    );

    // Everything once: the names made above and nothing else.
    assert_eq!(
        names_in(&s, dir),
        ["fifo", "file", "opened", "sub", "sym", "warmup"],
        "one entry per creating request"
    );
    assert_eq!(
        nlink(&s, dir),
        3,
        "the directory holds one subdirectory (mkdir ran once)"
    );
}

#[test]
fn a_resent_unlink_rmdir_or_rename_succeeds_and_is_neither_repeated_nor_undone() {
    let c = cluster(1);
    let s = resending_client(&c, Duration::from_millis(300));
    let cl = &s.client;
    let r = root();
    let dir = s.run(mkdir_p(cl, "/removals"));
    warm_up(&s, dir);
    s.run(cl.create(&r, dir, b"victim", 0o644, None))
        .expect("create victim");
    s.run(cl.mkdir(&r, dir, b"doomed", 0o755, None))
        .expect("mkdir doomed");
    let moved = s
        .run(cl.create(&r, dir, b"a", 0o644, None))
        .expect("create a")
        .attr
        .fid;

    // unlink: a second execution would say ENOENT.
    with_lost_reply(&c, "unlink", || s.run(cl.unlink(&r, dir, b"victim")))
        .unwrap_or_else(|e| panic!("unlink: resent unlink must succeed, got {e:?}"));
    assert_eq!(
        lookup_fid(&s, dir, "victim"),
        Err(Errno::ENOENT),
        "unlink: the name is gone"
    );

    // rmdir: ENOENT on a second execution; the parent loses exactly one link.
    let before = nlink(&s, dir);
    with_lost_reply(&c, "rmdir", || s.run(cl.rmdir(&r, dir, b"doomed")))
        .unwrap_or_else(|e| panic!("rmdir: resent rmdir must succeed, got {e:?}"));
    assert_eq!(
        lookup_fid(&s, dir, "doomed"),
        Err(Errno::ENOENT),
        "rmdir: the name is gone"
    );
    assert_eq!(
        nlink(&s, dir),
        before - 1,
        "rmdir: the parent's nlink dropped by exactly one"
    );

    // rename a -> b: a second execution would say ENOENT (a is gone); it must not be
    // answered with an error, nor undo or redo the move.
    with_lost_reply(&c, "rename", || {
        s.run(cl.rename(&r, dir, b"a", dir, b"b", 0))
    })
    .unwrap_or_else(|e| panic!("rename: resent rename must succeed, got {e:?}"));
    assert_eq!(
        lookup_fid(&s, dir, "b"),
        Ok(moved),
        "rename: b is the file that was a"
    );
    assert_eq!(
        lookup_fid(&s, dir, "a"),
        Err(Errno::ENOENT),
        "rename: a is gone (the rename did not undo itself)"
    );
    assert_eq!(
        s.run(cl.getattr(&r, moved)).map(|a| a.nlink),
        Ok(1),
        "rename: the file has its one link"
    );

    assert_eq!(
        names_in(&s, dir),
        ["b", "warmup"],
        "what is left after one unlink, one rmdir and one rename"
    );
    assert_eq!(nlink(&s, dir), 2, "no subdirectory is left");
}

#[test]
fn a_resent_link_setattr_setxattr_or_removexattr_returns_the_original_result_applied_once() {
    let c = cluster(1);
    let s = resending_client(&c, Duration::from_millis(300));
    let cl = &s.client;
    let r = root();
    let dir = s.run(mkdir_p(cl, "/changes"));
    warm_up(&s, dir);
    let file = s
        .run(cl.create(&r, dir, b"orig", 0o644, None))
        .expect("create orig")
        .attr;

    // link: a second execution would say EEXIST (and could not raise nlink past 2).
    let linked = with_lost_reply(&c, "link", || s.run(cl.link(&r, file.fid, dir, b"hard")))
        .unwrap_or_else(|e| panic!("link: resent link must succeed, got {e:?}"));
    assert_eq!(
        linked.attr.fid, file.fid,
        "link: the reply is about the file"
    );
    assert_eq!(linked.attr.nlink, 2, "link: the original reply's nlink");
    assert_eq!(
        lookup_fid(&s, dir, "hard"),
        Ok(file.fid),
        "link: the new name leads to the file"
    );
    assert_eq!(
        s.run(cl.getattr(&r, file.fid)).map(|a| a.nlink),
        Ok(2),
        "link: nlink is exactly 2"
    );

    // setattr (chmod): the caller gets the attributes the change left on disk.
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    let set = with_lost_reply(&c, "setattr", || {
        s.run(cl.setattr(&r, file.fid, chmod.clone()))
    })
    .unwrap_or_else(|e| panic!("setattr: resent setattr must succeed, got {e:?}"));
    let now = now_ns();
    assert_eq!(
        set.attr.mode,
        libc::S_IFREG | 0o600,
        "setattr: the reply's mode"
    );
    let stored = s
        .run(cl.getattr(&r, file.fid))
        .expect("getattr after chmod");
    assert_eq!(
        stored.mode,
        libc::S_IFREG | 0o600,
        "setattr: the mode as set"
    );
    assert_eq!(
        stored.ctime, set.attr.ctime,
        "setattr: the ctime the caller got is the one stored"
    );
    assert!(
        set.attr.ctime >= file.ctime && set.attr.ctime <= now,
        "setattr: ctime {} between the create's {} and now {now}",
        set.attr.ctime,
        file.ctime
    );

    // setxattr with XATTR_CREATE: a second execution would say EEXIST.
    with_lost_reply(&c, "setxattr", || {
        s.run(cl.setxattr(&r, file.fid, b"user.once", Some(b"v1"), XATTR_CREATE))
    })
    .unwrap_or_else(|e| panic!("setxattr: resent XATTR_CREATE setxattr must succeed, got {e:?}"));
    assert_eq!(
        s.run(cl.getxattr(&r, file.fid, b"user.once", 64))
            .map(|(v, _)| v),
        Ok(b"v1".to_vec()),
        "setxattr: the value is there"
    );

    // removexattr (setxattr with no value): a second execution would say ENODATA.
    s.run(cl.setxattr(&r, file.fid, b"user.gone", Some(b"x"), 0))
        .expect("set user.gone");
    with_lost_reply(&c, "removexattr", || {
        s.run(cl.setxattr(&r, file.fid, b"user.gone", None, 0))
    })
    .unwrap_or_else(|e| panic!("removexattr: resent removexattr must succeed, got {e:?}"));
    assert_eq!(
        s.run(cl.getxattr(&r, file.fid, b"user.gone", 64))
            .map(|(v, _)| v),
        Err(Errno::ENODATA),
        "removexattr: the attribute is gone"
    );
    let (names, _) = s.run(cl.listxattr(&r, file.fid, 4096)).expect("listxattr");
    let user: Vec<&[u8]> = names
        .split(|b| *b == 0)
        .filter(|n| n.starts_with(b"user."))
        .collect();
    assert_eq!(
        user,
        [&b"user.once"[..]],
        "setxattr/removexattr: exactly the attribute set once is left"
    );
}

// ---------------------------------------------------------------------------------------
// A failing request, resent

#[test]
fn a_resent_failing_rename_fails_the_same_way_even_if_it_could_now_succeed() {
    let c = cluster(1);
    let r = root();
    let b = c.client();
    let src = s_mkdir(&b, Fid::ROOT, "src");
    let dst = s_mkdir(&b, Fid::ROOT, "dst");
    b.run(b.client.create(&r, dst, b"file", 0o644, None))
        .expect("create dst/file");
    // A resends late enough for B to empty dst in between.
    let a = Arc::new(resending_client(&c, Duration::from_millis(1500)));

    c.set_param(DROP_REPLY_ONCE);
    let renamer = {
        let a = a.clone();
        std::thread::spawn(move || {
            let cl = &a.client;
            a.run(cl.rename(&root(), Fid::ROOT, b"src", Fid::ROOT, b"dst", 0))
        })
    };
    wait_for(
        "the rename to be executed and its reply dropped",
        Duration::from_secs(10),
        || c.get_param("mdt.*.fail_loc") == "0x0",
    );
    // Now the rename could succeed (src would replace the empty dst).
    b.run(b.client.unlink(&r, dst, b"file"))
        .expect("B unlinks dst/file");
    let res = renamer.join().expect("rename thread");
    assert_eq!(
        res,
        Err(Errno::ENOTEMPTY),
        "rename: the resend is answered with the recorded ENOTEMPTY, not executed again"
    );
    assert_eq!(
        lookup_fid(&b, Fid::ROOT, "src"),
        Ok(src),
        "rename: src is still there"
    );
    assert_eq!(
        lookup_fid(&b, Fid::ROOT, "dst"),
        Ok(dst),
        "rename: dst is still the original directory"
    );
    assert_eq!(
        lookup_fid(&b, dst, "src"),
        Err(Errno::ENOENT),
        "rename: src was not moved into dst"
    );
    assert!(
        names_in(&b, dst).is_empty(),
        "rename: dst holds nothing (B emptied it)"
    );
    assert_eq!(nlink(&b, Fid::ROOT), 4, "the root holds src and dst");
}

// ---------------------------------------------------------------------------------------
// A resend on another connection while the original executes

#[test]
fn a_resend_arriving_on_another_connection_while_the_original_executes_runs_once() {
    let mut c = cluster(1);
    // Two service threads: the two connections below go to different ones (each new
    // connection goes to the thread with the fewest), so the resend is looked at while
    // the original still executes. On one thread it would be looked at after; the
    // outcome must be the same either way.
    restart_mds(&mut c, &["--threads", "2"]);
    let s = c.client();
    let r = root();
    let parent = s.run(mkdir_p(&s.client, "/raw"));
    let before = nlink(&s, parent);

    let addr = c.addr("mdt0");
    let target = format!("{}-MDT0000", c.fsname);
    let uuid = "exactly-once-two-connections";
    let mut one = RawPeer::connect(&addr);
    let mut two = RawPeer::connect(&addr);
    let h1 = one.connect_as(&c.fsname, &target, uuid).handle;
    let h2 = two.connect_as(&c.fsname, &target, uuid).handle;
    assert_ne!(h1, h2, "one export per connection");

    // A FID from a sequence of our own, as a client allocates them.
    let seq = match one.call_xid(&Request::SeqAlloc(Empty {}), 2, h1) {
        f if f.header.status == 0 => match Reply::decode(f.header.opcode, &f.body) {
            Ok(Reply::SeqAlloc(s)) => s,
            other => panic!("SEQ_ALLOC reply: {other:?}"),
        },
        f => panic!(
            "SEQ_ALLOC failed: {:?}",
            Errno::from_status(f.header.status)
        ),
    };
    let fid = Fid::new(seq.seq, 1, 0);
    let mkdir = Request::Create(CreateReq {
        dom_writeback: false,
        cred: r.clone(),
        parent,
        name: b"twice".to_vec(),
        fid,
        mode: libc::S_IFDIR | 0o755,
        umask: 0,
        rdev: 0,
        target: Vec::new(),
        layout: None,
        open_flags: None,
    });
    const XID: u64 = 100;
    let header = Header {
        opcode: mkdir.opcode() as u16,
        tag: 1,
        xid: XID,
        ..Default::default()
    };

    c.set_param("mdt.*.fail_val=1500");
    c.set_param(DELAY_EXEC_ONCE);
    one.send_request(
        &Header {
            handle: h1,
            ..header
        },
        &mkdir,
    );
    std::thread::sleep(Duration::from_millis(200));
    two.send_request(
        &Header {
            handle: h2,
            flags: FLAG_RESENT,
            ..header
        },
        &mkdir,
    );

    // Whatever answers comes within 10 s; once one has, the other gets 3 s more.
    let mut replies: [Option<Frame>; 2] = [None, None];
    let mut deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && replies.iter().any(Option::is_none) {
        for (i, peer) in [&mut one, &mut two].into_iter().enumerate() {
            if replies[i].is_none() {
                if let Some(f) = peer.next_frame(Duration::from_millis(50)) {
                    replies[i] = Some(f);
                    deadline = deadline.min(Instant::now() + Duration::from_secs(3));
                }
            }
        }
    }
    assert_eq!(
        c.get_param("mdt.*.fail_loc"),
        "0x0",
        "the delayed execution fired"
    );
    let answered: Vec<(usize, &Frame)> = replies
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.as_ref().map(|f| (i + 1, f)))
        .collect();
    assert!(
        !answered.is_empty(),
        "neither the original nor the resend was answered"
    );
    for (conn, f) in &answered {
        assert_ne!(
            f.header.status,
            Errno::EEXIST.status(),
            "mkdir on connection {conn}: EEXIST, so it was executed twice"
        );
        assert_eq!(
            f.header.status,
            0,
            "mkdir on connection {conn}: {:?}",
            Errno::from_status(f.header.status)
        );
        assert_eq!(f.header.xid, XID, "mkdir on connection {conn}: the xid");
        match Reply::decode(f.header.opcode, &f.body) {
            Ok(Reply::Create(rep)) => assert_eq!(
                rep.body.attr.fid, fid,
                "mkdir on connection {conn}: the new directory's FID"
            ),
            other => panic!("mkdir on connection {conn}: reply {other:?}"),
        }
    }
    if let [(_, a), (_, b)] = answered[..] {
        assert_eq!(a.body, b.body, "both connections got the same reply");
    }
    assert_eq!(
        lookup_fid(&s, parent, "twice"),
        Ok(fid),
        "mkdir: the directory exists with its FID"
    );
    assert_eq!(
        nlink(&s, parent),
        before + 1,
        "mkdir: the parent's nlink rose by exactly one"
    );
    assert_eq!(names_in(&s, parent), ["twice"], "mkdir: one entry");
    let log = c.log("mdt0");
    let misuse = lines_with(&log, "tag reused");
    assert!(misuse.is_empty(), "tag misuse in the MDS log: {misuse:#?}");
}

// ---------------------------------------------------------------------------------------
// A client that timed out holds its tag

#[test]
fn a_client_that_times_out_on_a_slow_mdt_keeps_its_tag_until_answered() {
    let c = cluster(1);
    let mut cfg = c.client_config();
    cfg.max_mod_rpcs_in_flight = 1;
    cfg.timeout = Duration::from_secs(1);
    cfg.resend_interval = Duration::from_millis(300);
    let s = Session::connect(cfg).expect("client connects");
    let cl = &s.client;
    let r = root();
    let dir = s.run(mkdir_p(cl, "/slow-mdt"));
    warm_up(&s, dir);
    let before = nlink(&s, dir);

    c.set_param("mdt.*.fail_val=2500");
    c.set_param(DELAY_EXEC_ONCE);
    // The MDS takes 2.5 s over it: the caller gives up after 1 s.
    assert_eq!(
        s.run(cl.mkdir(&r, dir, b"slow", 0o755, None))
            .map(|b| b.attr.fid),
        Err(Errno::EIO),
        "mkdir slow: the caller times out"
    );
    // The only tag is still the slow mkdir's until the MDS answers it: this one waits
    // for it instead of reusing it while the slow one executes.
    let next = s
        .run(cl.mkdir(&r, dir, b"next", 0o755, None))
        .unwrap_or_else(|e| panic!("mkdir next: must succeed once the tag is free, got {e:?}"));
    assert_eq!(
        c.get_param("mdt.*.fail_loc"),
        "0x0",
        "the delayed execution fired"
    );
    assert!(
        lookup_fid(&s, dir, "slow").is_ok(),
        "mkdir slow: executed (once) although its caller gave up"
    );
    assert_eq!(
        lookup_fid(&s, dir, "next"),
        Ok(next.attr.fid),
        "mkdir next: the FID the caller got"
    );
    assert_eq!(
        nlink(&s, dir),
        before + 2,
        "two subdirectories: slow ran exactly once, next once"
    );
    assert_eq!(
        names_in(&s, dir),
        ["next", "slow", "warmup"],
        "one entry per mkdir"
    );
    let log = c.log("mdt0");
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("EPROTO") || (l.contains("tag") && l.contains("refused")))
        .collect();
    assert!(
        bad.is_empty(),
        "protocol or tag misuse in the MDS log: {bad:#?}"
    );
}

// ---------------------------------------------------------------------------------------
// Helpers

#[test]
fn tags_outside_the_grant_and_late_duplicates_are_refused_and_the_connection_stays_usable() {
    let c = cluster(1);
    let s = c.client();
    let r = root();
    let parent = s.run(mkdir_p(&s.client, "/misuse"));
    let before = nlink(&s, parent);
    let addr = c.addr("mdt0");
    let target = format!("{}-MDT0000", c.fsname);
    let mut raw = RawPeer::connect(&addr);
    let h = raw.connect_as(&c.fsname, &target, "tag-misuser").handle;
    let seq = match raw.call_xid(&Request::SeqAlloc(Empty {}), 2, h) {
        f if f.header.status == 0 => match Reply::decode(f.header.opcode, &f.body) {
            Ok(Reply::SeqAlloc(s)) => s,
            other => panic!("SEQ_ALLOC reply: {other:?}"),
        },
        f => panic!(
            "SEQ_ALLOC failed: {:?}",
            Errno::from_status(f.header.status)
        ),
    };
    let mkdir = |name: &str, oid: u32| {
        Request::Create(CreateReq {
            dom_writeback: false,
            cred: r.clone(),
            parent,
            name: name.as_bytes().to_vec(),
            fid: Fid::new(seq.seq, oid, 0),
            mode: libc::S_IFDIR | 0o755,
            umask: 0,
            rdev: 0,
            target: Vec::new(),
            layout: None,
            open_flags: None,
        })
    };
    let send = |raw: &mut RawPeer, req: &Request, tag: u16, xid: u64, last_xid: u64| {
        let header = Header {
            opcode: req.opcode() as u16,
            tag,
            xid,
            last_xid,
            handle: h,
            ..Default::default()
        };
        raw.send_request(&header, req);
        raw.next_frame(Duration::from_secs(10))
    };
    // CONNECT granted 1 tag (plus one for close): tags 0 and 3 are outside it.
    for tag in [0u16, 3] {
        let f = send(&mut raw, &mkdir("bad-tag", 1), tag, 10 + u64::from(tag), 0)
            .expect("a reply to a misused tag");
        assert_eq!(
            Errno::from_status(f.header.status),
            Errno::EPROTO,
            "modify request with tag {tag}"
        );
    }
    // A tag on a request that modifies nothing is refused too.
    let f = send(
        &mut raw,
        &Request::Getattr(GetattrReq {
            cred: r.clone(),
            fid: parent,
        }),
        1,
        20,
        0,
    )
    .expect("a reply to a tagged getattr");
    assert_eq!(
        Errno::from_status(f.header.status),
        Errno::EPROTO,
        "tagged getattr"
    );
    assert!(
        lines_with(&c.log("mdt0"), "refused").len() >= 3,
        "each misuse is logged"
    );
    // The connection is still usable: a proper request works.
    let f = send(&mut raw, &mkdir("good", 2), 1, 30, 29).expect("reply");
    assert_eq!(f.header.status, 0, "a proper mkdir after the refusals");
    // The client says (last_xid) it has seen every reply up to 40: a copy of xid 30
    // arriving late is a duplicate and is not executed again (it would say EEXIST),
    // nor is anything with an xid it already covers.
    let f = send(&mut raw, &mkdir("later", 3), 1, 41, 40).expect("reply");
    assert_eq!(f.header.status, 0, "mkdir later");
    let late = send(&mut raw, &mkdir("good", 2), 1, 30, 29);
    assert!(
        late.is_none(),
        "a late duplicate is dropped, not answered: {late:?}"
    );
    let names = names_in(&s, parent);
    assert!(
        names.contains(&"good".to_string()) && names.contains(&"later".to_string()),
        "{names:?}"
    );
    assert!(!names.contains(&"bad-tag".to_string()), "{names:?}");
    assert_eq!(
        nlink(&s, parent),
        before + 2,
        "two directories made, once each"
    );
}

#[test]
fn a_client_with_seven_tags_and_one_forced_to_one_tag_are_both_correct() {
    let c = cluster(1);
    let many = Arc::new(c.client());
    let mut one_cfg = c.client_config();
    one_cfg.max_mod_rpcs_in_flight = 1;
    let one = Arc::new(Session::connect(one_cfg).expect("connect"));
    let dir = many.run(mkdir_p(&many.client, "/both"));
    let r = root();
    let workers: Vec<_> = [("many", many.clone()), ("one", one.clone())]
        .into_iter()
        .flat_map(|(who, s)| {
            let r = r.clone();
            (0..4).map(move |t| {
                let (s, r) = (s.clone(), r.clone());
                std::thread::spawn(move || {
                    for i in 0..40 {
                        let name = format!("{who}-{t}-{i}");
                        let made = s
                            .run(s.client.create(&r, dir, name.as_bytes(), 0o644, None))
                            .unwrap_or_else(|e| panic!("create {name}: {e}"));
                        let chmod = SetAttr {
                            mode: Some(0o600),
                            ..Default::default()
                        };
                        let b = s
                            .run(s.client.setattr(&r, made.attr.fid, chmod))
                            .unwrap_or_else(|e| panic!("chmod {name}: {e}"));
                        assert_eq!(b.attr.mode & 0o7777, 0o600, "chmod {name}");
                        if i % 2 == 0 {
                            s.run(s.client.unlink(&r, dir, name.as_bytes()))
                                .unwrap_or_else(|e| panic!("unlink {name}: {e}"));
                        }
                    }
                })
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let names = names_in(&many, dir);
    assert_eq!(
        names.len(),
        2 * 4 * 20,
        "every odd-numbered file left: {names:?}"
    );
    assert_eq!(one.client.mdc().max_mod_rpcs_in_flight(), 1);
    assert_eq!(many.client.mdc().max_mod_rpcs_in_flight(), 7);
}

#[test]
fn fail_opc_picks_the_opcode_and_skip_lets_the_first_ones_pass() {
    let c = cluster(1);
    let s = resending_client(&c, Duration::from_millis(300));
    let r = root();
    let dir = s.run(mkdir_p(&s.client, "/selected"));
    // Drop the reply of the second UNLINK only: creates and lookups go untouched.
    c.set_param(&format!(
        "mdt.*.fail_opc={}",
        lode_proto::Opcode::Unlink as u16
    ));
    c.set_param("mdt.*.fail_val=1");
    c.set_param("mdt.*.fail_loc=0x30000102"); // DROP_REPLY | SKIP | SOME: skip 1, then 1
    for n in ["x", "y", "z"] {
        s.run(s.client.create(&r, dir, n.as_bytes(), 0o644, None))
            .expect("create: not selected");
    }
    assert_eq!(c.get_param("mdt.*.fail_loc"), "0x30000102", "no unlink yet");
    s.run(s.client.unlink(&r, dir, b"x"))
        .expect("first unlink passes");
    assert_eq!(c.get_param("mdt.*.fail_loc"), "0x30000102", "skipped one");
    s.run(s.client.unlink(&r, dir, b"y"))
        .expect("second unlink: reply dropped, resent, answered from its record");
    assert_eq!(
        c.get_param("mdt.*.fail_loc"),
        "0x0",
        "fired once, then cleared"
    );
    assert_eq!(names_in(&s, dir), ["z"]);
    c.set_param("mdt.*.fail_opc=0");
}

/// A client that resends unanswered requests after `resend`.
fn resending_client(c: &Cluster, resend: Duration) -> Session {
    let mut cfg = c.client_config();
    cfg.resend_interval = resend;
    Session::connect(cfg).expect("client connects")
}

/// Creates `dir/warmup`, so the client holds a FID sequence: the request under test is
/// then the next one the MDS answers (no SEQ_ALLOC in between to catch the fault).
fn warm_up(s: &Session, dir: Fid) {
    s.run(s.client.create(&root(), dir, b"warmup", 0o644, None))
        .expect("warm-up create");
}

/// Runs `f` (one modifying call) with the MDS set to drop its next reply, and checks
/// that the fault fired: `f` was executed, its reply lost, and what `f` returns came
/// from the resend.
fn with_lost_reply<T>(c: &Cluster, op: &str, f: impl FnOnce() -> T) -> T {
    c.set_param(DROP_REPLY_ONCE);
    let out = f();
    assert_eq!(
        c.get_param("mdt.*.fail_loc"),
        "0x0",
        "{op}: the injected reply loss fired"
    );
    out
}

/// mkdir as root through a session.
fn s_mkdir(s: &Session, parent: Fid, name: &str) -> Fid {
    s.run(
        s.client
            .mkdir(&root(), parent, name.as_bytes(), 0o755, None),
    )
    .unwrap_or_else(|e| panic!("mkdir {name}: {e:?}"))
    .attr
    .fid
}

/// Checks what a resent creation answered: the mode asked for, and the FID that the
/// namespace now holds under `name` (a second execution would have made another).
fn check_made(s: &Session, dir: Fid, name: &str, got: &MdtBody, mode: u32, op: &str) {
    assert_eq!(got.attr.mode, mode, "{op}: the original reply's mode");
    assert_eq!(
        lookup_fid(s, dir, name),
        Ok(got.attr.fid),
        "{op}: the FID the caller got is the one in the namespace"
    );
}

/// The FID `name` in `dir` leads to.
fn lookup_fid(s: &Session, dir: Fid, name: &str) -> Result<Fid, Errno> {
    s.run(s.client.lookup(&root(), dir, name.as_bytes()))
        .map(|b| b.attr.fid)
}

/// The link count of `fid`.
fn nlink(s: &Session, fid: Fid) -> u32 {
    s.run(s.client.getattr(&root(), fid))
        .unwrap_or_else(|e| panic!("getattr {fid}: {e:?}"))
        .nlink
}

/// The names in `dir` other than `.` and `..`, sorted.
fn names_in(s: &Session, dir: Fid) -> Vec<String> {
    let mut names: Vec<String> = s
        .run(s.client.readdir_all(&root(), dir, false))
        .unwrap_or_else(|e| panic!("readdir {dir}: {e:?}"))
        .into_iter()
        .filter(|e| e.name != b"." && e.name != b"..")
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    names.sort();
    names
}

/// Nanoseconds since the epoch, as the MDS stamps times.
fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}
