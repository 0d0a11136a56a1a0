//! Batched requests (Lustre's `MDS_BATCH`) against real servers: a batch of lookups and
//! getattrs answers what the single requests answer; a bad sub-request fails alone; a
//! modifying batch whose reply is lost is resent and each of its changes runs exactly
//! once; a change in a batch waits for another client's locks like a single change; and
//! a modifying batch is answered only once committed, so it survives `kill -9` of the
//! MDS with nothing to replay.

mod common;

use common::*;
use lode_base::{Errno, Fid, SetAttr};
use lode_client::Session;
use lode_proto::{
    BatchReq, CreateReq, GetattrReq, LookupReq, Opcode, Reply, Request, SetattrReq, SubReq,
    UnlinkReq,
};
use lode_testkit::Cluster;
use std::time::Duration;

fn lookup(parent: Fid, name: &str) -> Request {
    Request::Lookup(LookupReq {
        cred: root(),
        parent,
        name: name.as_bytes().to_vec(),
    })
}

fn getattr(fid: Fid) -> Request {
    Request::Getattr(GetattrReq { cred: root(), fid })
}

fn create(s: &Session, parent: Fid, name: &str) -> Request {
    let fid = s.run(s.client.alloc_fid()).expect("a FID");
    Request::Create(CreateReq {
        dom_writeback: false,
        cred: root(),
        parent,
        name: name.as_bytes().to_vec(),
        fid,
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        rdev: 0,
        target: Vec::new(),
        layout: None,
        open_flags: None,
    })
}

fn unlink(parent: Fid, name: &str) -> Request {
    Request::Unlink(UnlinkReq {
        cred: root(),
        parent,
        name: name.as_bytes().to_vec(),
        rmdir: false,
    })
}

fn chmod(fid: Fid, mode: u32) -> Request {
    Request::Setattr(SetattrReq {
        cred: root(),
        fid,
        attr: SetAttr {
            mode: Some(mode),
            ..Default::default()
        },
        opened_for_write: false,
        handle: 0,
    })
}

/// A client that resends unanswered requests after `resend`.
fn resending_client(c: &Cluster, resend: Duration) -> Session {
    let mut cfg = c.client_config();
    cfg.resend_interval = resend;
    Session::connect(cfg).expect("client connects")
}

/// The FID `name` in `dir` leads to, asked by a single lookup.
fn lookup_fid(s: &Session, dir: Fid, name: &str) -> Result<Fid, Errno> {
    s.run(s.client.lookup(&root(), dir, name.as_bytes()))
        .map(|b| b.attr.fid)
}

#[test]
fn batched_lookups_and_getattrs_answer_what_single_requests_answer() {
    let c = cluster(1);
    let a = c.client();
    let r = root();
    let dir = a.run(mkdir_p(&a.client, "/walk"));
    let mut fids = Vec::new();
    for i in 0..20 {
        let b = a
            .run(
                a.client
                    .create(&r, dir, format!("f{i}").as_bytes(), 0o640, None),
            )
            .expect("create");
        fids.push(b.attr.fid);
    }
    a.run(a.client.mkdir(&r, dir, b"sub", 0o755, None))
        .expect("mkdir");
    let mut subs: Vec<Request> = (0..20).map(|i| lookup(dir, &format!("f{i}"))).collect();
    subs.push(lookup(dir, "sub"));
    subs.push(lookup(dir, "missing"));
    subs.extend(fids.iter().map(|f| getattr(*f)));
    subs.push(getattr(Fid::new(0x2_0000_0400, 999_999, 0)));

    // Batched from one client, single from another (so neither answers from a cache).
    let b = c.client();
    let got = b.run(b.client.batch(subs.clone())).expect("batch");
    assert_eq!(got.len(), subs.len(), "one result per sub-request");
    let single = c.client();
    // One RPC per request on this side: no statahead guessing the numbered names.
    single.client.set_statahead_max(0);
    for (req, res) in subs.iter().zip(&got) {
        let want = match req {
            Request::Lookup(l) => single.run(single.client.lookup(&r, l.parent, &l.name)),
            Request::Getattr(g) => single.run(single.client.getattr_md(&r, g.fid)),
            _ => unreachable!(),
        };
        match (res, want) {
            (Ok(Reply::Lookup(got)) | Ok(Reply::Getattr(got)), Ok(want)) => {
                assert_eq!(got.attr, want.attr, "{req:?}: the same attributes");
                assert_eq!(got.layout, want.layout, "{req:?}: the same layout");
            }
            (Err(got), Err(want)) => assert_eq!(*got, want, "{req:?}: the same error"),
            (got, want) => panic!("{req:?}: batch gave {got:?}, single {want:?}"),
        }
    }
    assert!(
        matches!(got[21], Err(Errno::ENOENT)),
        "a missing name fails alone: {:?}",
        got[21]
    );
    // The batch was one RPC.
    let stats = c.get_param("mdt.*.stats");
    let batches = stats
        .lines()
        .find(|l| l.starts_with("mds_batch "))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("0");
    assert_eq!(batches, "1", "one batch RPC in the MDT's stats:\n{stats}");
}

#[test]
fn a_malformed_unknown_or_oversized_sub_request_fails_alone() {
    let c = cluster(1);
    let a = c.client();
    let dir = a.run(mkdir_p(&a.client, "/bad"));
    a.run(a.client.create(&root(), dir, b"x", 0o644, None))
        .expect("create");
    let good = lookup(dir, "x");
    let good = SubReq {
        opcode: Opcode::Lookup as u16,
        body: good.encode(),
    };
    let subs = vec![
        good.clone(),
        // A lookup's opcode over bytes that are no lookup.
        SubReq {
            opcode: Opcode::Lookup as u16,
            body: vec![0xff; 7],
        },
        // No such opcode.
        SubReq {
            opcode: 9999,
            body: Vec::new(),
        },
        // An opcode a batch may not carry, and a change in a read batch.
        SubReq {
            opcode: Opcode::Statfs as u16,
            body: Request::Statfs(lode_proto::Empty {}).encode(),
        },
        SubReq {
            opcode: Opcode::Unlink as u16,
            body: unlink(dir, "x").encode(),
        },
        // Over the size a sub-request may have.
        SubReq {
            opcode: Opcode::Lookup as u16,
            body: vec![0; lode_base::limits::BATCH_SUB_BYTES_MAX + 1],
        },
        good,
    ];
    let rep = a
        .run(
            a.client
                .mdc()
                .call(Request::Batch(BatchReq { subs: subs.clone() })),
        )
        .expect("the batch is answered");
    let Reply::Batch(rep) = rep.reply else {
        panic!("a batch reply")
    };
    let status: Vec<i32> = rep.results.iter().map(|r| r.status).collect();
    assert_eq!(
        status,
        [
            0,
            Errno::EPROTO.status(),
            Errno::EINVAL.status(),
            Errno::EINVAL.status(),
            Errno::EINVAL.status(),
            Errno::EPROTO.status(),
            0
        ],
        "each bad sub-request fails alone, the good ones are answered"
    );
    assert!(lookup_fid(&a, dir, "x").is_ok(), "the unlink did not run");

    // A batch over the limit is refused whole; the connection stays usable.
    let many = vec![subs[0].clone(); lode_base::limits::BATCH_SUBS_MAX + 1];
    let err = a
        .run(a.client.mdc().call(Request::Batch(BatchReq { subs: many })))
        .expect_err("too many sub-requests");
    assert_eq!(err, Errno::EPROTO);
    assert!(lookup_fid(&a, dir, "x").is_ok(), "still served");
}

#[test]
fn a_resent_modifying_batch_runs_each_change_exactly_once() {
    let c = cluster(1);
    let s = resending_client(&c, Duration::from_millis(300));
    let r = root();
    let dir = s.run(mkdir_p(&s.client, "/batched"));
    for n in ["exists", "doomed", "plain"] {
        s.run(s.client.create(&r, dir, n.as_bytes(), 0o644, None))
            .expect("create");
    }
    let plain = lookup_fid(&s, dir, "plain").expect("plain");
    let subs = vec![
        create(&s, dir, "new1"),
        create(&s, dir, "exists"),
        unlink(dir, "doomed"),
        chmod(plain, 0o600),
        lookup(dir, "doomed"),
        create(&s, dir, "new2"),
        unlink(dir, "never-there"),
    ];
    c.set_param(&format!("mdt.*.fail_opc={}", Opcode::BatchModify as u16));
    c.set_param("mdt.*.fail_loc=0x80000102"); // DROP_REPLY | ONCE
    let got = s.run(s.client.batch(subs)).expect("the batch");
    assert_eq!(
        c.get_param("mdt.*.fail_loc"),
        "0x0",
        "the batch's reply was lost once, so what it returned came from the resend"
    );
    c.set_param("mdt.*.fail_opc=0");
    // A second execution would say EEXIST for new1 and new2 and ENOENT for doomed.
    let outcome: Vec<Result<(), Errno>> = got
        .iter()
        .map(|r| r.as_ref().map(|_| ()).map_err(|e| *e))
        .collect();
    assert_eq!(
        outcome,
        [
            Ok(()),
            Err(Errno::EEXIST),
            Ok(()),
            Ok(()),
            Err(Errno::ENOENT),
            Ok(()),
            Err(Errno::ENOENT)
        ],
        "every sub-request's first outcome, not a second execution's"
    );
    let Ok(Reply::Create(new1)) = &got[0] else {
        panic!("create new1: {:?}", got[0])
    };
    let check = c.client();
    assert_eq!(
        lookup_fid(&check, dir, "new1"),
        Ok(new1.body.attr.fid),
        "new1 is the file the batch made, made once"
    );
    assert_eq!(lookup_fid(&check, dir, "doomed"), Err(Errno::ENOENT));
    let mode = check
        .run(check.client.getattr(&r, plain))
        .expect("getattr")
        .mode;
    assert_eq!(mode & 0o7777, 0o600, "the chmod took");
    let mut names: Vec<String> = check
        .run(check.client.readdir_all(&r, dir, false))
        .expect("readdir")
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    names.sort();
    assert_eq!(names, ["exists", "new1", "new2", "plain"]);
}

#[test]
fn a_change_in_a_batch_waits_for_another_clients_lock_and_that_client_sees_it() {
    let c = cluster(1);
    let a = c.client();
    let r = root();
    let dir = a.run(mkdir_p(&a.client, "/shared"));
    // B lists the directory and caches "no such name" under its lock on it.
    let b = c.client();
    channel_up(&b);
    b.run(b.client.getattr(&r, dir)).expect("getattr");
    b.run(b.client.readdir_all(&r, dir, true)).expect("list");
    assert_eq!(lookup_fid(&b, dir, "late"), Err(Errno::ENOENT));
    let got = a
        .run(
            a.client
                .batch(vec![create(&a, dir, "late"), lookup(dir, "late")]),
        )
        .expect("batch");
    assert!(got.iter().all(|r| r.is_ok()), "both ran: {got:?}");
    let stats = c.get_param("mdt.*.stats");
    assert!(
        stats.lines().any(|l| l.starts_with("ldlm_bl_callback ")),
        "the batch's create called B back first:\n{stats}"
    );
    assert!(
        lookup_fid(&b, dir, "late").is_ok(),
        "B was called back before the create and sees the new name"
    );
}

#[test]
fn a_modifying_batch_is_answered_committed_and_survives_kill_9_with_nothing_to_replay() {
    let mut c = cluster(1);
    let a = c.client();
    let dir = a.run(mkdir_p(&a.client, "/durable"));
    a.run(a.client.sync()).expect("sync");
    // A long commit interval: only the batch's own wait makes it durable.
    c.set_param("mdt.*.commit_interval_ms=60000");
    let subs = (0..50).map(|i| create(&a, dir, &format!("d{i}"))).collect();
    let got = a.run(a.client.batch(subs)).expect("batch");
    assert!(got.iter().all(|r| r.is_ok()), "all made");
    assert_eq!(
        a.client.mdc().replay_count(),
        0,
        "the reply said committed: the client keeps nothing of the batch to replay"
    );
    restart_mds(&mut c, &[]);
    wait_recovered(&c);
    let b = c.client();
    for i in 0..50 {
        assert!(
            lookup_fid(&b, dir, &format!("d{i}")).is_ok(),
            "d{i} was committed before the batch was answered"
        );
    }
}

/// The glimpses of a readdir+ page go one RPC per OST for all its files: sizes,
/// blocks and mtimes equal what a glimpse of each file alone gives (striped files,
/// files on either OST, empty files, files never written).
#[test]
fn batched_glimpses_equal_single_glimpses() {
    let c = cluster(2);
    let s = c.client();
    let r = root();
    let cl = &s.client;
    let dir = s.run(mkdir_p(cl, "/sizes"));
    let mut open = Vec::new();
    for i in 0..40u64 {
        let layout = match i % 3 {
            0 => Some(lode_base::Layout::plain(2, 65536, -1)),
            1 => Some(lode_base::Layout::plain(1, 65536, (i % 2) as i32)),
            _ => None,
        };
        let fh = s
            .run(cl.create_open(
                &r,
                dir,
                format!("f{i}").as_bytes(),
                0o644,
                libc::O_RDWR,
                layout,
            ))
            .expect("create");
        if i % 5 != 4 {
            s.run(cl.write(
                &fh,
                i * 40_000,
                &vec![1u8; (i as usize * 777) % 150_000 + 1],
            ))
            .expect("write");
        }
        // Kept open: a closed file's size is kept on the MDT and needs no glimpse.
        open.push(fh);
    }
    let other = c.client();
    let page = other
        .run(other.client.readdir_all(&r, dir, true))
        .expect("readdir+");
    let bodies: Vec<_> = page
        .iter()
        .filter(|e| e.name != b"." && e.name != b"..")
        .filter_map(|e| e.body.as_deref().cloned())
        .collect();
    assert_eq!(bodies.len(), 40);
    assert!(
        bodies.iter().filter(|b| b.glimpse).count() >= 20,
        "most need a glimpse"
    );
    c.set_param("obdfilter.*.stats=clear");
    let many = other.run(other.client.complete_many(bodies.clone()));
    let stats = c.get_param("obdfilter.*.stats");
    let rpcs: u64 = stats
        .lines()
        .filter(|l| l.starts_with("ost_getattr "))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    assert_eq!(rpcs, 2, "one glimpse RPC per OST:\n{stats}");
    for (b, got) in bodies.into_iter().zip(many) {
        let name = b.attr.fid;
        let one = other.run(other.client.complete(b)).expect("single glimpse");
        let got = got.expect("batched glimpse");
        assert_eq!(
            (got.attr.size, got.attr.blocks, got.attr.mtime),
            (one.attr.size, one.attr.blocks, one.attr.mtime),
            "{name}"
        );
    }
    for fh in open {
        s.run(cl.close(&fh)).expect("close");
    }
}
