//! FUSE threads run their requests to completion, but never all of them: a stalled
//! server cannot take every thread, and one thread alone runs everything on the runtime.
//! With FUSE over io_uring this holds per queue (each CPU's requests go to its own
//! queue), and a request never waits behind work its thread does after answering.

mod common;

use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn a_stalled_ost_does_not_stop_the_mount_answering_the_mdt() {
    let c = cluster(1);
    let m = c.mount_with(&["threads=2", "attr_timeout=0", "entry_timeout=0"]);
    let data = m.path().join("data");
    std::fs::write(&data, vec![7u8; 4096]).unwrap();
    // Open for writing: its size is glimpsed (closed, the MDT would know it).
    let _writer = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    std::fs::create_dir(m.path().join("dir")).unwrap();
    let before = glimpses(&c);
    // Every OST reply now takes 3 s: a stat of `data` waits for its size (a glimpse).
    c.set_param("obdfilter.*.fail_val=3000");
    c.set_param("obdfilter.*.fail_loc=0x103");
    let done = Arc::new(AtomicUsize::new(0));
    let stalled: Vec<_> = (0..3)
        .map(|_| {
            let (p, done) = (data.clone(), done.clone());
            std::thread::spawn(move || {
                let md = std::fs::metadata(&p);
                done.fetch_add(1, Ordering::SeqCst);
                md.map(|m| m.len())
            })
        })
        .collect();
    // Two stalled stats hold the OST (more than the one request the two FUSE threads
    // may run inline) before the directory is asked for.
    lode_testkit::wait_for(
        "two glimpses to reach the stalled OST",
        Duration::from_secs(10),
        || glimpses(&c) >= before + 2,
    );
    let dir = std::fs::metadata(m.path().join("dir")).expect("stat of a directory");
    assert!(dir.is_dir());
    assert_eq!(
        done.load(Ordering::SeqCst),
        0,
        "the directory was answered while every stalled stat still waited on the OST"
    );
    c.set_param("obdfilter.*.fail_loc=0");
    for t in stalled {
        assert_eq!(t.join().unwrap().expect("stalled stat completes"), 4096);
    }
}

#[test]
fn one_fuse_thread_serves_everything_through_the_runtime() {
    let c = cluster(1);
    let m = c.mount_with(&["threads=1"]);
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..50 {
        std::fs::write(d.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    let mut names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 50);
    assert_eq!(std::fs::read_to_string(d.join("f42")).unwrap(), "42");
    std::fs::rename(d.join("f1"), d.join("g1")).unwrap();
    std::fs::remove_file(d.join("g1")).unwrap();
    assert!(std::fs::metadata(d.join("f1")).is_err());
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 49);
}

/// A request that needs no server (the FLUSH an `exec` sends as it closes a descriptor
/// of a file on the mount that it inherited) is answered while calls wait on a slow
/// MDT: closes (whose RELEASE waits for the MDT's close) and lookups, more of them than
/// the mount has threads. Before each queue kept a thread free and RELEASE answered
/// only once done, such a FLUSH waited for the MDT: for as long as a restarted MDS's
/// own `exec` took, in a crash test (the test process held files on the mount open).
fn requests_needing_no_server_are_not_held_by_calls_waiting_on_it(transport: &str) {
    let c = cluster(1);
    // Two threads: over io_uring one per CPU queue to start with.
    let m = c.mount_with(&["threads=2", transport]);
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let opened: Vec<std::fs::File> = (0..4)
        .map(|i| {
            let p = d.join(format!("o{i}"));
            std::fs::write(&p, b"x").unwrap();
            // Written through: a close that wrote nothing would ride ahead of a
            // later request, with no RELEASE waiting for the MDT.
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .unwrap();
            std::io::Write::write_all(&mut f, b"y").unwrap();
            f
        })
        .collect();
    // Names this mount has not seen (another client makes them): looked up on the MDT.
    let other = c.client();
    let dir = fid(&other, "/d").expect("d");
    for i in 0..3 {
        other
            .run(
                other
                    .client
                    .create(&root(), dir, format!("x{i}").as_bytes(), 0o644, None),
            )
            .expect("create");
    }
    // Inherited by the child below (close-on-exec): its exec sends a FLUSH.
    let held = std::fs::File::open(d.join("o0")).unwrap();
    // A stat below `d` waits on the MDT for the name's lookup, or first for `d`'s
    // attributes: `other`'s creates called back this mount's lock on `d`, and a
    // directory just contended is read without one (not cached) for a while.
    let asked = || mdt_stat(&c, "mds_getattr_name") + mdt_stat(&c, "mds_getattr");
    let (closes, lookups) = (mdt_stat(&c, "mds_close"), asked());
    // Every MDT reply now leaves 10 s late.
    c.set_param("mdt.*.fail_val=10000");
    c.set_param("mdt.*.fail_loc=0x103");
    drop(opened);
    // Seven calls in all: the client's RPCs in flight stay under max_rpcs_in_flight.
    let waiting: Vec<_> = (0..3)
        .map(|i| {
            let p = d.join(format!("x{i}"));
            std::thread::spawn(move || std::fs::metadata(p).map(|m| m.len()))
        })
        .collect();
    lode_testkit::wait_for(
        "the closes and lookups to reach the MDT",
        Duration::from_secs(10),
        || mdt_stat(&c, "mds_close") >= closes + 4 && asked() >= lookups + 3,
    );
    let t = Instant::now();
    let st = std::process::Command::new("/bin/true")
        .status()
        .expect("run /bin/true");
    let took = t.elapsed();
    c.set_param("mdt.*.fail_loc=0");
    assert!(st.success());
    assert!(
        took < Duration::from_secs(5),
        "an exec closing a file on the mount waited {took:?} behind calls to a slow MDT"
    );
    for w in waiting {
        assert_eq!(
            w.join().unwrap().expect("a lookup that waited on the MDT"),
            0
        );
    }
    drop(held);
}

#[test]
fn a_flush_passes_calls_waiting_on_a_slow_mdt_over_io_uring() {
    requests_needing_no_server_are_not_held_by_calls_waiting_on_it("io_uring");
}

#[test]
fn a_flush_passes_calls_waiting_on_a_slow_mdt_over_dev_fuse() {
    requests_needing_no_server_are_not_held_by_calls_waiting_on_it("noio_uring");
}

/// OST glimpses (`ost_getattr`) counted so far.
fn glimpses(c: &lode_testkit::Cluster) -> u64 {
    ost_stat(c, &["ost_getattr"])
}
