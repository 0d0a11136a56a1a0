//! FUSE threads run their requests to completion, but never all of them: a stalled
//! server cannot take every thread, and one thread alone runs everything on the runtime.

mod common;

use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// OST glimpses (`ost_getattr`) counted so far.
fn glimpses(c: &lode_testkit::Cluster) -> u64 {
    ost_stat(c, &["ost_getattr"])
}
