//! The first write of a small Data-on-MDT file kept back past `write(2)` under a
//! DOM lock (`lode_client`'s `writeback`), against real servers, native clients and
//! FUSE mounts: every other client's read of the file's size or bytes calls the lock
//! back and finds what the writer's `write(2)` returned for; the maker's own calls
//! wait for it; nobody is called back once the maker is done with the file. Off by
//! default (`llite.*.dom_writeback`): each test turns it on.

mod common;

use common::{arg as s, lode_ok as ok};

use common::*;
use lode_base::Fid;
use lode_client::Session;
use lode_testkit::Cluster;
use std::time::Duration;

/// A writer with write-back on (its callback channel up, so it gets locks) and
/// another client.
fn writer_and_other(c: &Cluster) -> (Session, Session) {
    let (s, other) = (c.client(), c.client());
    assert!(s.run(s.client.wait_callback_channel(Duration::from_secs(10))));
    s.client.set_dom_writeback(true);
    (s, other)
}

/// The size of `name` in the root as `s` gets it from the MDT.
fn size_in_root(s: &Session, name: &[u8]) -> u64 {
    let b = s
        .run(s.client.lookup(&root(), Fid::ROOT, name))
        .expect("lookup");
    s.run(s.client.complete(b)).expect("attributes").attr.size
}

/// Every byte of `fid` (up to 8 KiB), read through an open of `s`'s own.
fn read_whole(s: &Session, fid: Fid) -> Vec<u8> {
    let r = s
        .run(s.client.open(&root(), fid, libc::O_RDONLY))
        .expect("open");
    let data = s.run(s.client.read(&r, 0, 8192)).expect("read");
    s.run(s.client.close(&r)).expect("close");
    data
}

#[test]
fn another_client_sees_a_kept_back_write_before_it_reaches_the_mdt_by_itself() {
    let c = cluster(1);
    let (s, other) = writer_and_other(&c);
    let fh = dom_created(&s, b"d");
    // Every request of the writer now waits 300 ms before it is sent: the write kept
    // back is still on its way when the other client asks.
    s.client.mdc().set_net_delay_us(300_000).expect("delay");
    let called = s.client.lock_callbacks();
    assert_eq!(s.run(s.client.write(&fh, 0, &[7u8; 5000])), Ok(5000));
    assert_eq!(size_in_root(&other, b"d"), 5000, "the size the write left");
    assert_eq!(read_whole(&other, fh.fid), vec![7u8; 5000]);
    assert_eq!(
        s.client.lock_callbacks(),
        called + 1,
        "the write-back lock was called back"
    );
    // The writer's own getattr of another such file goes after its write, calling
    // nobody back.
    let fh2 = dom_created(&s, b"e");
    assert_eq!(s.run(s.client.write(&fh2, 0, &[9u8; 3000])), Ok(3000));
    let mine = s.run(s.client.getattr(&root(), fh2.fid)).expect("getattr");
    assert_eq!(mine.size, 3000, "the writer sees its write");
    assert_eq!(
        s.client.lock_callbacks(),
        called + 1,
        "not called back by itself"
    );
    s.run(s.client.close(&fh2)).expect("close");
    s.client.mdc().set_net_delay_us(0).expect("no delay");
    // The maker's own later calls come after the write: a second write, a read.
    assert_eq!(s.run(s.client.write(&fh, 5000, &[8u8; 100])), Ok(100));
    let mine = s.run(s.client.read(&fh, 0, 8192)).expect("read");
    assert_eq!(mine.len(), 5100);
    assert!(mine[..5000].iter().all(|&x| x == 7) && mine[5000..].iter().all(|&x| x == 8));
    s.run(s.client.close(&fh)).expect("close");
}

#[test]
fn the_maker_done_with_its_files_is_never_called_back_for_them() {
    let c = cluster(1);
    let (s, other) = writer_and_other(&c);
    let mut fids = Vec::new();
    for i in 0..20u32 {
        let name = format!("f{i}");
        let fh = dom_created(&s, name.as_bytes());
        // Every other file is closed without a write: its lock goes back with the close.
        if i % 2 == 0 {
            let data = vec![i as u8; 3000 + i as usize];
            assert_eq!(s.run(s.client.write(&fh, 0, &data)), Ok(data.len()));
        }
        s.run(s.client.close(&fh)).expect("close");
        fids.push((name, fh.fid));
    }
    // The closes (and the cancels of unused locks) go ahead of this.
    s.run(s.client.statfs()).expect("statfs");
    let called = s.client.lock_callbacks();
    for (i, (name, fid)) in fids.iter().enumerate() {
        let want = if i % 2 == 0 { 3000 + i as u64 } else { 0 };
        assert_eq!(size_in_root(&other, name.as_bytes()), want, "{name}");
        assert_eq!(
            read_whole(&other, *fid),
            vec![i as u8; want as usize],
            "{name}"
        );
    }
    assert_eq!(s.client.lock_callbacks(), called, "no callback");
}

#[test]
fn a_file_written_through_one_mount_is_read_whole_through_another_at_once() {
    let c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    c.set_param("llite.*.dom_writeback=1");
    let d = a.path().join("wb");
    std::fs::create_dir(&d).unwrap();
    ok(&c, &["setstripe", "-E", "1M", "-L", "mdt", &s(&d)]);
    let body = |i: u32| -> Vec<u8> { (0..4096u32).map(|k| (k ^ i) as u8).collect() };
    for i in 0..200u32 {
        let name = format!("f{i}");
        std::fs::write(d.join(&name), body(i)).unwrap();
        if i % 2 == 1 {
            assert_eq!(
                std::fs::metadata(d.join(&name)).unwrap().len(),
                4096,
                "{name}: size through the writer's mount"
            );
        }
        let theirs = b.path().join("wb").join(&name);
        assert_eq!(
            std::fs::metadata(&theirs).unwrap().len(),
            4096,
            "{name}: size through the other mount"
        );
        assert_eq!(std::fs::read(&theirs).unwrap(), body(i), "{name}");
    }
    // And through the writer's own mount, stat and read.
    for i in 0..200u32 {
        let f = d.join(format!("f{i}"));
        assert_eq!(std::fs::metadata(&f).unwrap().len(), 4096);
        assert_eq!(std::fs::read(&f).unwrap(), body(i));
    }
    assert_eq!(
        ost_stat(&c, &["ost_write", "ost_read"]),
        0,
        "nothing on an OST"
    );
}
