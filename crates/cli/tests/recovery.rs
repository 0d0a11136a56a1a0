//! Replay recovery, against real server processes.
//!
//! The MDS answers a change before it is on disk, and (by default) keeps the WAL in
//! the process until its commit thread syncs it: a `kill -9` of the MDS loses every
//! change not yet committed, as a power cut would. Each test holds commits back
//! (`commit_interval_ms` of a minute), so every change a client was told succeeded is
//! lost by the kill unless the client replays it, and checks that it is there after the
//! restart. A test that passed without replay would show `replayed_requests: 0`.

mod common;

use common::*;
use lode_base::{Errno, Fid, SetAttr};
use lode_client::Session;
use lode_testkit::{wait_for, Cluster};
use std::time::Duration;

/// Kills the MDS (`kill -9`, losing what it had not committed) and starts it again.
fn power_cut_mds(c: &mut Cluster) {
    power_cut_mds_with(c, &[]);
}

/// [`power_cut_mds`], the new MDS started with `args`.
fn power_cut_mds_with(c: &mut Cluster, args: &[&str]) {
    let (last, committed) = transnos(c);
    assert!(
        last > committed,
        "the test needs uncommitted changes to lose (last_transno {last}, last_committed {committed})"
    );
    c.set_server_args("mdt0", args);
    c.kill9("mdt0");
    c.start_target("mdt0");
}

fn lookup(s: &Session, dir: Fid, name: &str) -> Result<lode_client::MdtBody, Errno> {
    s.run(s.client.lookup(&root(), dir, name.as_bytes()))
}

fn mkdir(s: &Session, dir: Fid, name: &str) -> Fid {
    s.run(s.client.mkdir(&root(), dir, name.as_bytes(), 0o755, None))
        .unwrap_or_else(|e| panic!("mkdir {name}: {e:?}"))
        .attr
        .fid
}

fn create(s: &Session, dir: Fid, name: &str) -> Fid {
    s.run(s.client.create(&root(), dir, name.as_bytes(), 0o644, None))
        .unwrap_or_else(|e| panic!("create {name}: {e:?}"))
        .attr
        .fid
}

#[test]
fn every_change_a_client_was_answered_survives_an_mds_power_cut() {
    let mut c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    hold_commits(&c, 1);

    let d = mkdir(&s, Fid::ROOT, "d");
    let mut files = Vec::new();
    for i in 0..50 {
        files.push(create(&s, d, &format!("f{i}")));
    }
    s.run(cl.rename(&r, d, b"f0", d, b"renamed", 0))
        .expect("rename");
    s.run(cl.unlink(&r, d, b"f1")).expect("unlink");
    let sa = SetAttr {
        mode: Some(0o600),
        uid: Some(77),
        ..Default::default()
    };
    s.run(cl.setattr(&r, files[2], sa)).expect("setattr");
    s.run(cl.link(&r, files[3], d, b"hard")).expect("link");
    s.run(cl.symlink(&r, d, b"sym", b"f4")).expect("symlink");
    let sub = mkdir(&s, d, "sub");
    s.run(cl.rmdir(&r, d, b"sub")).expect("rmdir");
    let _ = sub;
    s.run(cl.setxattr(&r, files[5], b"user.k", Some(b"v"), 0))
        .expect("setxattr");

    power_cut_mds(&mut c);
    let status = wait_recovered(&c);
    let replayed: u64 = status_field(&status, "replayed_requests")
        .parse()
        .expect("n");
    assert!(
        replayed >= 58,
        "every change was uncommitted and had to be replayed:\n{status}"
    );

    assert!(lookup(&s, Fid::ROOT, "d").is_ok(), "the directory is back");
    assert_eq!(
        lookup(&s, d, "f0").err(),
        Some(Errno::ENOENT),
        "renamed away"
    );
    assert_eq!(lookup(&s, d, "renamed").map(|b| b.attr.fid), Ok(files[0]));
    assert_eq!(lookup(&s, d, "f1").err(), Some(Errno::ENOENT), "unlinked");
    for (i, f) in files.iter().enumerate().skip(2) {
        assert_eq!(
            lookup(&s, d, &format!("f{i}")).map(|b| b.attr.fid),
            Ok(*f),
            "f{i} came back with the FID its creator was given"
        );
    }
    let a = s.run(cl.getattr(&r, files[2])).expect("getattr");
    assert_eq!((a.mode & 0o7777, a.uid), (0o600, 77), "setattr replayed");
    assert_eq!(s.run(cl.getattr(&r, files[3])).expect("getattr").nlink, 2);
    assert_eq!(
        s.run(cl.readlink(&r, lookup(&s, d, "sym").expect("sym").attr.fid)),
        Ok(b"f4".to_vec())
    );
    assert_eq!(
        lookup(&s, d, "sub").err(),
        Some(Errno::ENOENT),
        "rmdir replayed"
    );
    assert_eq!(
        s.run(cl.getxattr(&r, files[5], b"user.k", 64))
            .map(|(v, _)| v),
        Ok(b"v".to_vec())
    );
    // Work goes on, and is not confused by the replayed transnos.
    create(&s, d, "after");
    assert!(lookup(&s, d, "after").is_ok());
}

#[test]
fn replays_of_two_clients_run_in_their_original_order() {
    let mut c = cluster(1);
    let (a, b) = (c.client(), c.client());
    hold_commits(&c, 2);
    // Each change depends on the other client's last one: only the original order
    // across both clients rebuilds it.
    let mut dir = Fid::ROOT;
    for i in 0..20 {
        let s = if i % 2 == 0 { &a } else { &b };
        dir = mkdir(s, dir, &format!("level{i}"));
    }
    power_cut_mds(&mut c);
    let status = wait_recovered(&c);
    assert_eq!(
        status_field(&status, "completed_clients"),
        "2/2",
        "{status}"
    );
    let mut cur = Fid::ROOT;
    for i in 0..20 {
        cur = lookup(&a, cur, &format!("level{i}"))
            .unwrap_or_else(|e| panic!("level{i} after recovery: {e:?}\n{status}"))
            .attr
            .fid;
    }
    assert_eq!(cur, dir);
}

#[test]
fn a_client_that_never_returns_is_evicted_and_the_others_recover() {
    let mut c = cluster(1);
    let (a, b) = (c.client(), c.client());
    // Committed: each client's first FID sequence is synced when granted.
    let da = mkdir(&a, Fid::ROOT, "a");
    let db = mkdir(&b, Fid::ROOT, "b");
    hold_commits(&c, 2);
    for i in 0..10 {
        create(&a, da, &format!("x{i}"));
        create(&b, db, &format!("y{i}"));
    }
    // Client a dies with the MDS: nobody replays its changes.
    let (last, committed) = transnos(&c);
    assert!(last > committed);
    let status = power_cut_without(&mut c, a);
    assert!(
        c.log("mdt0").contains("did not come back in time"),
        "the eviction is logged"
    );
    // Recovery went past a's changes, and b's replays, which depend on none of them,
    // passed the version checks.
    assert_ne!(status_field(&status, "vbr_gaps"), "0", "{status}");
    assert_eq!(status_field(&status, "vbr_refused"), "0", "{status}");
    // b's changes are all there; a's (uncommitted, never replayed) are not.
    for i in 0..10 {
        assert!(lookup(&b, db, &format!("y{i}")).is_ok(), "y{i}");
        assert_eq!(
            lookup(&b, da, &format!("x{i}")).err(),
            Some(Errno::ENOENT),
            "x{i}"
        );
    }
}

#[test]
fn an_idle_client_does_not_hold_recovery_up_and_new_clients_wait_for_it() {
    let mut c = cluster(1);
    let s = c.client();
    let d = mkdir(&s, Fid::ROOT, "d");
    // A client that went away before the crash is not waited for.
    let gone = c.client();
    assert!(lookup(&gone, d, ".").is_ok());
    drop(gone);
    hold_commits(&c, 1);
    create(&s, d, "f");
    power_cut_mds(&mut c);
    let status = wait_recovered(&c);
    let took: u64 = status_field(&status, "recovery_duration")
        .parse()
        .expect("n");
    assert!(
        took < 10,
        "recovery waited only for the connected client:\n{status}"
    );
    // A new client connects once recovery is over and sees the replayed file.
    let n = c.client();
    assert!(lookup(&n, d, "f").is_ok());
}

#[test]
fn files_held_open_survive_an_mds_power_cut_committed_or_not_unlinked_or_not() {
    let mut c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    let d = mkdir(&s, Fid::ROOT, "d");
    // Opened, and the open committed, before commits are held.
    let b = s
        .run(cl.create_open(&r, d, b"committed", 0o644, libc::O_RDWR, None))
        .expect("create_open");
    // A file held open, then unlinked: an orphan the restart must keep.
    let o = s
        .run(cl.create_open(&r, d, b"orphan", 0o644, libc::O_RDWR, None))
        .expect("create_open");
    hold_commits(&c, 1);
    s.run(cl.unlink(&r, d, b"orphan")).expect("unlink");
    // Created and opened after: the open is replayed with its create.
    let a = s
        .run(cl.create_open(&r, d, b"uncommitted", 0o644, libc::O_RDWR, None))
        .expect("create_open");
    for (fh, data) in [(&a, b"aaaa"), (&b, b"bbbb"), (&o, b"oooo")] {
        assert_eq!(s.run(cl.write(fh, 0, data)), Ok(4));
    }
    // Read-only opens write nothing (their transnos are empty): one of a file created
    // before the cut was held, one of a file whose create is replayed.
    let rb = s.run(cl.open(&r, b.fid, libc::O_RDONLY)).expect("open");
    let ra = s.run(cl.open(&r, a.fid, libc::O_RDONLY)).expect("open");
    assert_eq!(c.get_param("mdt.*.open_files"), "5");

    power_cut_mds(&mut c);
    let status = wait_recovered(&c);
    assert_eq!(
        c.get_param("mdt.*.open_files"),
        "5",
        "every handle is open again after recovery:\n{status}"
    );
    assert_eq!(lookup(&s, d, "orphan").err(), Some(Errno::ENOENT));
    for (fh, data) in [
        (&a, b"aaaa"),
        (&b, b"bbbb"),
        (&o, b"oooo"),
        (&ra, b"aaaa"),
        (&rb, b"bbbb"),
    ] {
        assert_eq!(
            s.run(cl.read(fh, 0, 4)).as_deref(),
            Ok(&data[..]),
            "the handle still reads its file"
        );
        assert_eq!(s.run(cl.close(fh)), Ok(()), "the same handle closes");
    }
    // The read-only ones close ahead of a later request (or a PING).
    wait_for("every handle closed", Duration::from_secs(10), || {
        c.get_param("mdt.*.open_files") == "0"
    });
    assert_eq!(
        s.run(cl.getattr(&r, o.fid)).err(),
        Some(Errno::ENOENT),
        "the orphan went with its last close"
    );
}

#[test]
fn files_with_no_name_survive_an_mds_power_cut_and_only_linkable_ones_get_one() {
    let mut c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    let d = mkdir(&s, Fid::ROOT, "d");
    let tmp = |flags| s.run(cl.tmpfile(&r, d, 0o600, 0, flags, None));
    assert_eq!(
        tmp(libc::O_RDONLY).err(),
        Some(Errno::EINVAL),
        "a file with no name is opened for writing"
    );
    // Made, and committed, before commits are held; and one made after (its create is
    // replayed); and one made with O_EXCL, which no name may reach.
    let before = tmp(libc::O_RDWR).expect("tmpfile");
    hold_commits(&c, 1);
    let after = tmp(libc::O_RDWR).expect("tmpfile");
    let excl = tmp(libc::O_RDWR | libc::O_EXCL).expect("tmpfile");
    for (fh, data) in [(&before, b"bbbb"), (&after, b"aaaa"), (&excl, b"eeee")] {
        assert_eq!(fh.attr.nlink, 0, "no name, no link");
        assert_eq!(s.run(cl.write(fh, 0, data)), Ok(4));
    }

    power_cut_mds(&mut c);
    let status = wait_recovered(&c);
    assert_eq!(
        c.get_param("mdt.*.open_files"),
        "3",
        "every handle is open again after recovery:\n{status}"
    );
    assert_eq!(
        s.run(cl.link(&r, excl.fid, d, b"excl")).err(),
        Some(Errno::ENOENT),
        "made with O_EXCL: never linkable"
    );
    let named = s.run(cl.link(&r, after.fid, d, b"named")).expect("link");
    assert_eq!(named.attr.nlink, 1);
    for (fh, data) in [(&before, b"bbbb"), (&after, b"aaaa"), (&excl, b"eeee")] {
        assert_eq!(s.run(cl.read(fh, 0, 4)).as_deref(), Ok(&data[..]));
        assert_eq!(s.run(cl.close(fh)), Ok(()), "the same handle closes");
    }
    wait_for("every handle closed", Duration::from_secs(10), || {
        c.get_param("mdt.*.open_files") == "0"
    });
    for fh in [&before, &excl] {
        assert_eq!(
            s.run(cl.getattr(&r, fh.fid)).err(),
            Some(Errno::ENOENT),
            "a file with no name goes with its last close"
        );
    }
    assert_eq!(lookup(&s, d, "named").map(|b| b.attr.fid), Ok(after.fid));
    assert_eq!(
        s.run(cl.link(&r, before.fid, d, b"late")).err(),
        Some(Errno::ENOENT)
    );
}

#[test]
fn changes_replayed_after_an_mds_power_cut_keep_the_times_they_were_given() {
    let mut c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    let d = mkdir(&s, Fid::ROOT, "d");
    hold_commits(&c, 1);
    // Changes a few milliseconds apart, each stamping times on the objects it changes:
    // a create (the file's four times, the directory's mtime and ctime), a mkdir, a
    // chmod (ctime), a rename (the directory's times again).
    let pause = || std::thread::sleep(Duration::from_millis(20));
    let f = create(&s, d, "f");
    pause();
    let sub = mkdir(&s, d, "sub");
    pause();
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    s.run(cl.setattr(&r, f, chmod)).expect("chmod");
    pause();
    s.run(cl.rename(&r, d, b"sub", d, b"sub2", 0))
        .expect("rename");
    let times = |s: &Session| -> Vec<(i64, i64, i64, i64)> {
        [d, sub, f]
            .iter()
            .map(|x| {
                let a = s.run(s.client.getattr(&r, *x)).expect("getattr");
                (a.atime, a.mtime, a.ctime, a.btime)
            })
            .collect()
    };
    let before = times(&s);

    power_cut_mds(&mut c);
    let status = wait_recovered(&c);
    let replayed: u64 = status_field(&status, "replayed_requests")
        .parse()
        .unwrap_or(0);
    assert!(replayed >= 4, "the four changes were replayed:\n{status}");
    // A new client: nothing it reads comes from a cache.
    let fresh = c.client();
    assert_eq!(
        times(&fresh),
        before,
        "atime, mtime, ctime and birth time of the directory, the new directory and the \
         file, as their changes first stamped them"
    );
}

#[test]
fn clients_that_say_goodbye_free_their_slot_for_the_next() {
    let c = cluster(1);
    for i in 0..20 {
        let s = c.client();
        // A change: the client's slot holds a reply record.
        mkdir(&s, Fid::ROOT, &format!("d{i}"));
    }
    let log = c.log("mdt0");
    let slots: Vec<u32> = lines_with(&log, "client connected")
        .iter()
        .filter_map(|l| l.split("slot=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert!(slots.len() >= 20, "every client connected:\n{log}");
    assert!(
        slots.iter().all(|s| *s < 3),
        "short-lived clients reuse slots instead of using the table up: {slots:?}"
    );
}

/// `fail_loc` points that make the MDS die (`fail_loc` flag ONCE is 0x80000000, SKIP
/// 0x20000000).
const ABORT_BEFORE_COMMIT_ONCE: &str = "0x80000105";
const ABORT_AFTER_COMMIT_ONCE: &str = "0x80000106";
const ABORT_IN_RECOVERY_SKIP: &str = "0x20000107";
const DROP_CONNECT_ONCE: &str = "0x80000108";

/// Waits until the MDS died at a `fail_loc` point (it says so in its log first).
fn wait_died(c: &mut Cluster, when: &str) {
    wait_for(
        "the MDS to die at its fault point",
        Duration::from_secs(30),
        || {
            c.log("mdt0")
                .contains(&format!("fail_loc: the MDS dies here, {when}"))
        },
    );
    c.wait_exit("mdt0", Duration::from_secs(10));
}

#[test]
fn an_mds_that_dies_before_or_after_committing_a_change_applies_it_exactly_once() {
    let mut c = cluster(1);
    let s = c.client();
    let d = mkdir(&s, Fid::ROOT, "d");
    for (point, when, name) in [
        (ABORT_BEFORE_COMMIT_ONCE, "before the change", "lost"),
        (
            ABORT_AFTER_COMMIT_ONCE,
            "after the change is committed",
            "kept",
        ),
    ] {
        c.set_param(&format!(
            "mdt.*.fail_opc={}",
            lode_proto::Opcode::Create as u16
        ));
        c.set_param(&format!("mdt.*.fail_loc={point}"));
        let made = std::thread::scope(|t| {
            let call = t.spawn(|| s.run(s.client.mkdir(&root(), d, name.as_bytes(), 0o755, None)));
            wait_died(&mut c, when);
            c.start_target("mdt0");
            call.join().expect("the caller")
        });
        // Lost with the process: executed again when resent. Committed: answered from
        // its reply record, not executed twice (which would say EEXIST).
        let made = made.unwrap_or_else(|e| panic!("mkdir {name} ({when}): {e:?}"));
        assert_eq!(lookup(&s, d, name).map(|b| b.attr.fid), Ok(made.attr.fid));
    }
    let status = wait_recovered(&c);
    assert!(status.starts_with("status: COMPLETE"));
    assert_eq!(
        s.run(s.client.getattr(&root(), d)).expect("getattr").nlink,
        4,
        "two subdirectories, each made once"
    );
}

#[test]
fn an_mds_that_dies_during_recovery_recovers_again_from_the_same_state() {
    let mut c = cluster(1);
    let s = c.client();
    let d = mkdir(&s, Fid::ROOT, "d");
    hold_commits(&c, 1);
    for i in 0..10 {
        create(&s, d, &format!("f{i}"));
    }
    // The restarted MDS dies before its fifth replay.
    power_cut_mds_with(
        &mut c,
        &["--fail-loc", ABORT_IN_RECOVERY_SKIP, "--fail-val", "4"],
    );
    wait_died(&mut c, "in recovery");
    c.set_server_args("mdt0", &[]);
    c.start_target("mdt0");
    let status = wait_recovered(&c);
    for i in 0..10 {
        assert!(
            lookup(&s, d, &format!("f{i}")).is_ok(),
            "f{i} after two recoveries:\n{status}"
        );
    }
}

#[test]
fn a_dropped_reconnect_is_tried_again_and_recovery_completes() {
    let mut c = cluster(1);
    let s = c.client();
    let d = mkdir(&s, Fid::ROOT, "d");
    hold_commits(&c, 1);
    for i in 0..5 {
        create(&s, d, &format!("f{i}"));
    }
    power_cut_mds_with(&mut c, &["--fail-loc", DROP_CONNECT_ONCE]);
    let status = wait_recovered(&c);
    assert!(
        c.log("mdt0").contains("fail_loc: CONNECT dropped"),
        "the first reconnect was dropped, and the client came back anyway"
    );
    assert_eq!(
        status_field(&status, "completed_clients"),
        "1/1",
        "{status}"
    );
    for i in 0..5 {
        assert!(lookup(&s, d, &format!("f{i}")).is_ok(), "f{i}:\n{status}");
    }
}

#[test]
fn a_killed_client_keeps_its_committed_work_and_its_open_files_close_after_evict_timeout() {
    let c = cluster(1);
    c.set_param("mdt.*.evict_timeout=2");
    let m = c.mount();
    let d = m.path().join("d");
    std::fs::create_dir(&d).expect("mkdir");
    std::fs::write(d.join("kept"), b"kept").expect("write");
    let held = std::fs::File::create(d.join("open")).expect("create");
    wait_for("everything to commit", Duration::from_secs(10), || {
        let (last, committed) = transnos(&c);
        last == committed
    });
    assert_eq!(c.get_param("mdt.*.open_files"), "1");

    let pid = m.pid().expect("the mount's pid");
    // SAFETY: kill(2) on a child process of this test.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_for(
        "the killed client's file to close",
        Duration::from_secs(30),
        || c.get_param("mdt.*.open_files") == "0",
    );
    assert!(c.log("mdt0").contains("gone without a goodbye"));
    let s = c.client();
    let dir = lookup(&s, Fid::ROOT, "d").expect("d").attr.fid;
    let kept = lookup(&s, dir, "kept").expect("kept").attr.fid;
    let fh = s
        .run(s.client.open(&root(), kept, libc::O_RDONLY))
        .expect("open");
    assert_eq!(
        s.run(s.client.read(&fh, 0, 16)).as_deref(),
        Ok(&b"kept"[..]),
        "its committed work is there"
    );
    assert!(lookup(&s, dir, "open").is_ok());
    drop(held);
    drop(m);
}

#[test]
fn an_evicted_client_gets_eio_on_its_old_handles_and_then_works_again() {
    let c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let d = mkdir(&s, Fid::ROOT, "d");
    let fh = s
        .run(cl.create_open(&root(), d, b"f", 0o644, libc::O_RDWR, None))
        .expect("create_open");
    assert_eq!(c.get_param("mdt.*.open_files"), "1");
    c.set_param(&format!("mdt.*.evict_client={}", cl.uuid()));
    assert_eq!(c.get_param("mdt.*.open_files"), "0", "its file was closed");
    assert!(c.log("mdt0").contains("by the administrator"));
    // Its next call learns it was forgotten; the old handle is stale from then on.
    assert!(
        lookup(&s, d, "f").is_ok(),
        "the client reconnects and goes on"
    );
    assert_eq!(s.run(cl.close(&fh)), Err(Errno::EIO));
    create(&s, d, "g");
}

#[test]
fn a_client_holds_at_most_max_open_files_per_client_and_a_close_frees_one() {
    let c = cluster(1);
    c.set_param("mdt.*.max_open_files_per_client=3");
    let (s, other) = (c.client(), c.client());
    let cl = &s.client;
    let d = mkdir(&s, Fid::ROOT, "d");
    let open_create = |s: &Session, name: &str| {
        s.run(
            s.client
                .create_open(&root(), d, name.as_bytes(), 0o644, libc::O_RDWR, None),
        )
    };
    let fhs: Vec<_> = (0..3)
        .map(|i| open_create(&s, &format!("f{i}")).expect("under the cap"))
        .collect();
    assert_eq!(open_create(&s, "f3").err(), Some(Errno::ENFILE));
    assert_eq!(
        lookup(&s, d, "f3").err(),
        Some(Errno::ENOENT),
        "refused before the create"
    );
    assert_eq!(
        s.run(cl.open(&root(), fhs[0].fid, libc::O_RDONLY)).err(),
        Some(Errno::ENFILE)
    );
    assert!(open_create(&other, "g").is_ok(), "the cap is per client");
    s.run(cl.close(&fhs[0])).expect("close");
    assert!(open_create(&s, "f3").is_ok(), "a close frees a place");
}

/// The pid of the server process serving `target` (its directory is on its command
/// line).
fn server_pid(c: &Cluster, target: &str) -> i32 {
    let dir = c.target_dir(target);
    let dir = dir.to_string_lossy();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.iter().any(|a| *a == dir.as_bytes())
            })
        })
        .unwrap_or_else(|| panic!("no server process for {target}"))
}

#[test]
fn a_clean_mds_stop_keeps_the_open_files_and_file_locks_of_connected_clients() {
    let mut c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    let path = a.path().join("held");
    std::fs::write(&path, b"open and unlinked across a clean restart").expect("write");
    let held = std::fs::File::open(&path).expect("open");
    std::fs::remove_file(&path).expect("unlink");
    let locked = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(a.path().join("locked"))
        .expect("create");
    let setlk = |f: &std::fs::File, ty: i32| {
        let mut l: libc::flock = unsafe { std::mem::zeroed() };
        (l.l_type, l.l_whence) = (ty as i16, libc::SEEK_SET as i16);
        // SAFETY: fcntl on an open descriptor with a valid struct flock.
        let r = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(f), libc::F_SETLK, &l) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error())
        }
    };
    assert_eq!(setlk(&locked, libc::F_WRLCK), Ok(()));
    wait_for("only the two mounts", Duration::from_secs(10), || {
        c.get_param("mdt.*.num_exports") == "2"
    });

    // SAFETY: kill(2) of a server process this test started.
    unsafe { libc::kill(server_pid(&c, "mdt0"), libc::SIGTERM) };
    assert_eq!(c.wait_exit("mdt0", Duration::from_secs(20)), Some(0));
    c.start_target("mdt0");
    let status = wait_recovered(&c);
    assert_eq!(
        status_field(&status, "completed_clients"),
        "2/2",
        "{status}"
    );
    assert_eq!(status_field(&status, "replayed_locks"), "1", "{status}");
    // Both files are open on the MDT again (the unlinked one was not destroyed).
    assert_eq!(c.get_param("mdt.*.open_files"), "2");

    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut &held, &mut data).expect("read the held file");
    assert_eq!(data, b"open and unlinked across a clean restart");
    let other = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(b.path().join("locked"))
        .expect("open on B");
    assert_eq!(setlk(&other, libc::F_RDLCK), Err(Some(libc::EAGAIN)));
    drop(locked);
    assert_eq!(setlk(&other, libc::F_RDLCK), Ok(()));
}

/// What the MDT has as `path`'s access time, asked by a new client (no cached copy).
fn mdt_atime(c: &Cluster, path: &std::path::Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    let fid = Fid::from_ino(std::fs::metadata(path).expect("stat").ino()).expect("a lode inode");
    let s = c.client();
    s.run(s.client.getattr_md(&root(), fid))
        .expect("getattr")
        .attr
        .atime
}

/// Reads `path` through its mount (the first read since its write: relatime moves
/// the access time) and waits until the MDT has the time the mount shows.
fn read_moving_atime(c: &Cluster, path: &std::path::Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::read(path).expect("read"), b"data");
    let md = std::fs::metadata(path).expect("stat");
    let ns = |s: i64, n: i64| s * 1_000_000_000 + n;
    let a = ns(md.atime(), md.atime_nsec());
    assert!(a > ns(md.mtime(), md.mtime_nsec()), "the read moved it");
    wait_for(
        "the MDT to have the access time",
        Duration::from_secs(10),
        || mdt_atime(c, path) == a,
    );
    a
}

#[test]
fn access_times_the_mdt_holds_in_memory_survive_its_kill_after_a_second_and_a_clean_stop() {
    let mut c = cluster(1);
    let m = c.mount();
    let (f, g) = (m.path().join("f"), m.path().join("g"));
    for p in [&f, &g] {
        let file = std::fs::File::create(p).expect("create");
        std::io::Write::write_all(&mut &file, b"data").expect("write");
        file.sync_all().expect("fsync");
    }
    // Written to the store within a second of the read: a `kill -9` after that keeps it.
    let a = read_moving_atime(&c, &f);
    std::thread::sleep(Duration::from_millis(
        2 * lode_base::limits::ATIMES_FLUSH_MS,
    ));
    c.kill9("mdt0");
    c.start_target("mdt0");
    wait_recovered(&c);
    assert_eq!(
        mdt_atime(&c, &f),
        a,
        "lost by a kill -9 a second after the read"
    );

    // A clean stop writes what still waits.
    let a = read_moving_atime(&c, &g);
    // SAFETY: kill(2) of a server process this test started.
    unsafe { libc::kill(server_pid(&c, "mdt0"), libc::SIGTERM) };
    assert_eq!(c.wait_exit("mdt0", Duration::from_secs(20)), Some(0));
    c.start_target("mdt0");
    wait_recovered(&c);
    assert_eq!(mdt_atime(&c, &g), a, "lost by a clean stop");
}

#[test]
fn a_replay_that_depends_on_an_evicted_clients_lost_change_is_refused_and_the_rest_recover() {
    let mut c = cluster(1);
    let (a, b) = (c.client(), c.client());
    let shared = create(&b, Fid::ROOT, "shared");
    let db = mkdir(&b, Fid::ROOT, "b");
    hold_commits(&c, 2);
    let chmod = |s: &Session, mode: u32| {
        let sa = SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        s.run(s.client.setattr(&root(), shared, sa)).expect("chmod");
    };
    // a changes the shared file, then b changes it after a (b's change found a's
    // version of it), and b makes a file of its own.
    chmod(&a, 0o600);
    chmod(&b, 0o640);
    create(&b, db, "own");
    // a dies with the MDS: its change is lost, and b's change to the same file cannot
    // be replayed on top of what a's would have left.
    let status = power_cut_without(&mut c, a);
    assert_eq!(status_field(&status, "vbr_refused"), "1", "{status}");
    assert!(
        c.log("mdt0").contains("version mismatch"),
        "the refusal is logged"
    );
    // The shared file is as it was committed; b's own file is there; b goes on.
    let attr = lookup(&b, Fid::ROOT, "shared").expect("shared").attr;
    assert_eq!(attr.mode & 0o7777, 0o644);
    assert!(lookup(&b, db, "own").is_ok());
    chmod(&b, 0o604);
    assert_eq!(
        lookup(&b, Fid::ROOT, "shared").expect("shared").attr.mode & 0o7777,
        0o604
    );
}

#[test]
fn a_replayed_create_keeps_the_osts_its_data_was_written_to() {
    let mut c = cluster(2);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    // The round robin has moved on, and the restarted MDS starts it again.
    create(&s, Fid::ROOT, "first");
    hold_commits(&c, 1);
    let mut files = Vec::new();
    for i in 0..6u8 {
        let name = format!("f{i}");
        let fh = s
            .run(cl.create_open(&r, Fid::ROOT, name.as_bytes(), 0o644, libc::O_RDWR, None))
            .expect("create_open");
        let data = vec![b'a' + i; 1000 + usize::from(i)];
        assert_eq!(s.run(cl.write(&fh, 0, &data)), Ok(data.len()));
        let osts = fh.layout().map(|l| l.components[0].pattern.clone());
        s.run(cl.close(&fh)).expect("close");
        files.push((name, data, osts));
    }
    power_cut_mds(&mut c);
    let status = wait_recovered(&c);
    assert_ne!(status_field(&status, "replayed_requests"), "0", "{status}");
    for (name, data, osts) in files {
        let fid = lookup(&s, Fid::ROOT, &name).expect("lookup").attr.fid;
        let fh = s.run(cl.open(&r, fid, libc::O_RDONLY)).expect("open");
        let now = fh.layout().map(|l| l.components[0].pattern.clone());
        assert_eq!(now, osts, "{name}: the layout it was created with");
        assert_eq!(s.run(cl.read(&fh, 0, 4096)), Ok(data), "{name}");
        s.run(cl.close(&fh)).expect("close");
    }
}

#[test]
fn a_handle_open_across_an_mds_restart_keeps_no_size_at_close_that_misses_another_writer() {
    let mut c = cluster(1);
    let a = c.client();
    let b = c.client();
    let r = root();
    // Made by a, which knows its own writes only.
    let fh = a
        .run(
            a.client
                .create_open(&r, Fid::ROOT, b"f", 0o644, libc::O_RDWR, None),
        )
        .expect("create_open");
    assert_eq!(a.run(a.client.write(&fh, 0, b"aaaa")), Ok(4));
    let fb = b
        .run(b.client.open(&r, fh.fid, libc::O_RDWR))
        .expect("open");
    assert_eq!(b.run(b.client.write(&fb, 1 << 20, b"bbbb")), Ok(4));
    assert_eq!(b.run(b.client.close(&fb)), Ok(()));
    // Committed, so that recovery replays none of it: the restart forgets who wrote
    // while a's handle was open, which it opens again as it was.
    wait_for("the changes to commit", Duration::from_secs(30), || {
        let (last, committed) = transnos(&c);
        committed >= last
    });
    c.kill9("mdt0");
    c.start_target("mdt0");
    let glimpses = ost_stat(&c, &["ost_getattr"]);
    assert_eq!(a.run(a.client.close(&fh)), Ok(()), "the same handle closes");
    assert_eq!(
        ost_stat(&c, &["ost_getattr"]),
        glimpses,
        "the close sends the size its writes said"
    );
    let other = c.client();
    let at = other
        .run(other.client.getattr(&r, fh.fid))
        .expect("getattr");
    assert_eq!(at.size, (1 << 20) + 4, "b's bytes count");
}

#[test]
fn a_close_made_by_an_eviction_leaves_no_gap_for_later_replays_to_fall_into() {
    let mut c = cluster(1);
    let (a, b) = (c.client(), c.client());
    let r = root();
    // a writes a file whose bytes are all on the MDT, and keeps it open.
    let fh = dom_file_written(&a, b"f", b"aaaa");
    hold_commits(&c, 2);
    // The MDT closes a's handle as it evicts a: the file's last writer is gone, and
    // the close may note that its size is now exact.
    c.set_param(&format!("mdt.*.evict_client={}", a.client.uuid()));
    assert_eq!(c.get_param("mdt.*.open_files"), "0");
    // b changes the file after that close, and is answered.
    let sa = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    b.run(b.client.setattr(&r, fh.fid, sa)).expect("chmod");
    // Both are lost with the MDS. No client replays the eviction's close, so it must
    // not be a change that b's replay depends on (b's chmod would be refused).
    let status = power_cut_without(&mut c, a);
    assert_eq!(status_field(&status, "vbr_refused"), "0", "{status}");
    let at = b.run(b.client.getattr(&r, fh.fid)).expect("getattr");
    assert_eq!(at.mode & 0o7777, 0o600, "b's chmod was replayed");
    assert_eq!(at.size, 4);
    let fb = b
        .run(b.client.open(&r, fh.fid, libc::O_RDONLY))
        .expect("open");
    assert_eq!(
        b.run(b.client.read(&fb, 0, 16)).as_deref(),
        Ok(&b"aaaa"[..])
    );
}
