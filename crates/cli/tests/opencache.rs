//! Lustre's open cache through the mount: a file opened for reading again and again
//! keeps its open handle under an OPEN lock and is opened without an RPC, and still
//! reads what another client wrote; an unlink or a rename over it by another client
//! closes an idle kept handle first (the file goes with the unlink), and a handle in
//! use keeps the unlinked file readable until its last close.

mod common;

use common::*;
use lode_testkit::wait_for;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

/// A field of the (only) mount's `llite.*.opencache_stats`.
fn oc_stat(c: &lode_testkit::Cluster, name: &str) -> u64 {
    c.get_param("llite.*.opencache_stats")
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in opencache_stats"))
}

fn open_files(c: &lode_testkit::Cluster) -> u64 {
    c.get_param("mdt.*.open_files").parse().expect("a count")
}

/// Writes `data` over the file at `path` from another client.
fn write_from(s: &lode_client::Session, path: &str, data: &[u8]) {
    let f = fid(s, path).expect("resolve");
    s.run(async {
        let fh = s
            .client
            .open(&root(), f, libc::O_WRONLY | libc::O_TRUNC)
            .await?;
        s.client.write(&fh, 0, data).await?;
        s.client.close(&fh).await
    })
    .expect("write from the other client");
}

/// Waits for the writers' closes, which the mount sends in the background (by RPC,
/// or ahead of a later request for a Data-on-MDT file's maker), to reach the MDT.
fn settle(c: &lode_testkit::Cluster) {
    wait_for("the closes", Duration::from_secs(10), || open_files(c) == 0);
}

#[test]
fn a_file_read_again_and_again_is_opened_without_an_rpc_and_still_sees_other_writes() {
    let c = cluster(1);
    let m = c.mount();
    let s = c.client();
    dom_dir(&c, &m.path().join("dom"));
    let (o, g) = (m.path().join("o"), m.path().join("dom/g"));
    // Lustre's default.
    assert_eq!(c.get_param("llite.*.opencache_threshold_count"), "5");
    fs::write(&o, b"ost bytes").expect("write");
    fs::write(&g, vec![7u8; 4096]).expect("write");
    settle(&c);

    for (kept, (p, want)) in [(&o, b"ost bytes".to_vec()), (&g, vec![7u8; 4096])]
        .into_iter()
        .enumerate()
    {
        let opens = mdt_stat(&c, "mds_reint_open");
        // Lustre's setting: the fifth open in a row (each within 100 ms of the last)
        // asks for the lock.
        for _ in 0..5 {
            assert_eq!(fs::read(p).expect("read"), want);
        }
        assert_eq!(
            mdt_stat(&c, "mds_reint_open") - opens,
            5,
            "{p:?}: five opens"
        );
        // The first four handles were closed (read-only: ahead of a later request).
        wait_for("the first four closed", Duration::from_secs(10), || {
            open_files(&c) == kept as u64 + 1
        });
        let all_closes = || mdt_stat(&c, "mds_close") + mdt_stat(&c, "mds_close_ahead");
        let (closes, hits) = (all_closes(), oc_stat(&c, "hits"));
        for _ in 0..20 {
            assert_eq!(fs::read(p).expect("read"), want);
        }
        assert_eq!(
            mdt_stat(&c, "mds_reint_open") - opens,
            5,
            "{p:?}: no more opens"
        );
        assert_eq!(
            oc_stat(&c, "hits") - hits,
            20,
            "{p:?}: served from the cache"
        );
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(all_closes(), closes, "{p:?}: no closes");
    }
    assert_eq!(oc_stat(&c, "handles"), 2);

    // A DoM file kept, whose pages the kernel keeps: rereads need no RPC at all.
    let reads = mdt_stat(&c, "dom_read");
    for _ in 0..10 {
        assert_eq!(fs::read(&g).expect("read"), vec![7u8; 4096]);
    }
    assert_eq!(mdt_stat(&c, "dom_read"), reads, "pages kept across opens");

    // Another client's writes are read through the kept handles.
    write_from(&s, "/o", b"new ost bytes");
    write_from(&s, "/dom/g", &[9u8; 100]);
    assert_eq!(fs::read(&o).expect("read"), b"new ost bytes");
    assert_eq!(fs::read(&g).expect("read"), vec![9u8; 100]);
    assert_eq!(oc_stat(&c, "handles"), 2, "still kept");

    // Off: the idle handles are closed at once.
    c.set_param("llite.*.opencache_max_ms=0");
    wait_for("the kept handles closed", Duration::from_secs(10), || {
        open_files(&c) == 0
    });
    assert_eq!(oc_stat(&c, "handles"), 0);
}

#[test]
fn an_unlink_by_another_client_closes_an_idle_kept_handle_and_the_file_goes() {
    let c = cluster(1);
    let m = c.mount();
    let s = c.client();
    c.set_param("llite.*.opencache_threshold_count=1");
    let (f, g) = (m.path().join("f"), m.path().join("g"));
    fs::write(&f, b"f bytes").expect("write");
    fs::write(&g, b"g bytes").expect("write");
    settle(&c);
    for p in [&f, &g] {
        fs::read(p).expect("read");
        fs::read(p).expect("read");
    }
    idle(&c, 2);
    assert_eq!(open_files(&c), 2, "the kept handles are open on the MDT");

    let callbacks = mdt_stat(&c, "ldlm_bl_callback");
    s.run(s.client.unlink(&root(), lode_base::Fid::ROOT, b"f"))
        .expect("unlink");
    // The unlink waited for the callback, and the mount closed its handle before
    // giving the lock back: nothing holds the file open now.
    assert!(mdt_stat(&c, "ldlm_bl_callback") > callbacks, "called back");
    assert_eq!(open_files(&c), 1, "f closed before the unlink went on");
    assert!(gone(&f));
    assert_eq!(oc_stat(&c, "handles"), 1);

    // A rename over g: the same for the file it replaces.
    let closes = mdt_stat(&c, "mds_close");
    s.run(async {
        let fh = s
            .client
            .create_open(
                &root(),
                lode_base::Fid::ROOT,
                b"h",
                0o644,
                libc::O_WRONLY,
                None,
            )
            .await?;
        s.client.write(&fh, 0, b"h bytes").await?;
        s.client.close(&fh).await
    })
    .expect("h");
    s.run(s.client.rename(
        &root(),
        lode_base::Fid::ROOT,
        b"h",
        lode_base::Fid::ROOT,
        b"g",
        0,
    ))
    .expect("rename over g");
    assert!(mdt_stat(&c, "mds_close") > closes, "g's kept handle closed");
    assert_eq!(open_files(&c), 0);
    assert_eq!(fs::read(&g).expect("read"), b"h bytes");
}

#[test]
fn a_kept_handle_in_use_keeps_an_unlinked_file_readable_until_its_last_close() {
    let c = cluster(1);
    let m = c.mount();
    let s = c.client();
    c.set_param("llite.*.opencache_threshold_count=1");
    let f = m.path().join("f");
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(&f, &body).expect("write");
    settle(&c);
    fs::read(&f).expect("read");
    let mut held = fs::File::open(&f).expect("open again");
    assert_eq!(
        oc_stat(&c, "hits"),
        1,
        "the second open took the kept handle"
    );

    s.run(s.client.unlink(&root(), lode_base::Fid::ROOT, b"f"))
        .expect("unlink");
    assert!(gone(&f));
    assert_eq!(
        open_files(&c),
        1,
        "kept open while in use: the file is an orphan"
    );
    // Nothing of it was read yet through this descriptor: every byte comes from the
    // objects the orphan keeps.
    let mut got = Vec::new();
    held.read_to_end(&mut got).expect("read the unlinked file");
    assert!(got == body, "the unlinked file reads whole");
    drop(held);
    wait_for("the orphan closed", Duration::from_secs(10), || {
        open_files(&c) == 0
    });
    assert_eq!(oc_stat(&c, "handles"), 0);
}

/// Waits for `n` idle kept handles (a close reaches the mount in the background).
fn idle(c: &lode_testkit::Cluster, n: u64) {
    wait_for("the kept handles idle", Duration::from_secs(10), || {
        oc_stat(c, "idle") == n
    });
}

fn gone(p: &Path) -> bool {
    fs::symlink_metadata(p).err().and_then(|e| e.raw_os_error()) == Some(libc::ENOENT)
}

#[test]
fn idle_kept_handles_give_way_to_new_opens_at_the_mdts_limit() {
    let c = cluster(1);
    let m = c.mount();
    c.set_param("llite.*.opencache_threshold_count=1");
    let p = |i: usize| m.path().join(format!("f{i}"));
    for i in 0..3 {
        fs::write(p(i), format!("file {i}")).expect("write");
    }
    settle(&c);
    for i in 0..2 {
        fs::read(p(i)).expect("read");
    }
    idle(&c, 2);
    c.set_param("mdt.*.max_open_files_per_client=2");
    // Without giving way, this open would get ENFILE.
    assert_eq!(fs::read(p(2)).expect("read at the limit"), b"file 2");
    idle(&c, 1);
    let held: Vec<fs::File> = (0..2)
        .map(|i| fs::File::open(p(i)).expect("open at the limit"))
        .collect();
    assert_eq!(
        fs::File::open(p(2)).err().and_then(|e| e.raw_os_error()),
        Some(libc::ENFILE),
        "two files really open: the limit holds"
    );
    drop(held);
}

#[test]
fn a_mounts_own_unlink_of_a_file_it_keeps_open_needs_no_callback() {
    let c = cluster(1);
    let m = c.mount();
    c.set_param("llite.*.opencache_threshold_count=1");
    let (f, g, h) = (m.path().join("f"), m.path().join("g"), m.path().join("h"));
    for p in [&f, &g, &h] {
        fs::write(p, b"bytes").expect("write");
    }
    settle(&c);
    for p in [&f, &g] {
        fs::read(p).expect("read");
        fs::read(p).expect("read");
    }
    idle(&c, 2);
    let callbacks = mdt_stat(&c, "ldlm_bl_callback");
    fs::remove_file(&f).expect("unlink");
    fs::rename(&h, &g).expect("rename over");
    assert_eq!(
        mdt_stat(&c, "ldlm_bl_callback"),
        callbacks,
        "the mount gave its OPEN locks back with its own changes"
    );
    assert_eq!(open_files(&c), 0, "both kept handles closed first");
    assert_eq!(oc_stat(&c, "handles"), 0);
    assert!(gone(&f));
    assert_eq!(fs::read(&g).expect("read"), b"bytes");
}

#[test]
fn a_change_of_who_may_read_a_file_ends_the_handles_kept_open_on_it() {
    let c = cluster(1);
    let m = c.mount();
    let f = m.path().join("f");
    fs::write(&f, b"secret").expect("write");
    settle(&c);
    // A native client reading as an unprivileged user keeps its handle.
    let s = c.client();
    s.client.set_opencache_threshold_count(1);
    // OPEN locks are asked for only with the callback channel up (it opens in the
    // background after the connect).
    channel_up(&s);
    let file = fid(&s, "/f").expect("resolve");
    let read_as_user = || {
        s.run(async {
            let fh = s.client.open(&user(), file, libc::O_RDONLY).await?;
            let r = s.client.read(&fh, 0, 100).await;
            s.client.close(&fh).await?;
            r
        })
    };
    assert_eq!(read_as_user().expect("read"), b"secret");
    assert_eq!(read_as_user().expect("read"), b"secret");
    assert!(s.client.opencache_stats().contains("hits: 1\n"));
    // Root takes read permission away (through the mount): the kept handle goes.
    fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    assert_eq!(read_as_user(), Err(lode_base::Errno::EACCES));
}
