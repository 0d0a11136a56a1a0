//! Crashes, injected faults and bad input: what survives, what is refused.

mod common;

use common::*;
use lode_base::{Errno, Fid};
use lode_client::{ClientConfig, Session};
use std::io::{Read, Write};
use std::time::Duration;

#[test]
fn kill9_of_the_mds_after_sync_keeps_the_synced_namespace() {
    let mut c = cluster(1);
    let r = root();
    {
        let s = c.client();
        let cl = &s.client;
        s.run(async {
            let d = cl
                .mkdir(&r, Fid::ROOT, b"synced", 0o755, None)
                .await
                .unwrap()
                .attr
                .fid;
            for i in 0..200 {
                cl.create(&r, d, format!("f{i}").as_bytes(), 0o644, None)
                    .await
                    .unwrap();
            }
            cl.mkdir(&r, d, b"sub", 0o700, None).await.unwrap();
            cl.sync().await.unwrap();
            // Work after the sync: it may or may not survive, but never half of it.
            let u = cl
                .mkdir(&r, Fid::ROOT, b"unsynced", 0o755, None)
                .await
                .unwrap()
                .attr
                .fid;
            for i in 0..200 {
                cl.mkdir(&r, u, format!("d{i}").as_bytes(), 0o755, None)
                    .await
                    .unwrap();
            }
        });
    }
    c.kill9("mdt0");
    c.start_target("mdt0");
    let s = c.client();
    let cl = &s.client;
    s.run(async {
        let d = cl
            .resolve(&r, "/synced", false)
            .await
            .expect("synced dir survives")
            .attr
            .fid;
        let names = cl.readdir_all(&r, d, false).await.unwrap();
        assert_eq!(names.len(), 200 + 1 + 2, "every synced entry is there");
        let sub = cl.lookup(&r, d, b"sub").await.unwrap();
        assert_eq!(sub.attr.mode & 0o7777, 0o700);
        assert_eq!(cl.getattr(&r, d).await.unwrap().nlink, 3);
        // Whatever of the unsynced work survived is whole: every entry has its inode and
        // the directory's link count matches its subdirectories.
        if let Ok(u) = cl.lookup(&r, Fid::ROOT, b"unsynced").await {
            let entries = cl.readdir_all(&r, u.attr.fid, true).await.unwrap();
            assert!(
                entries.iter().all(|e| e.body.is_some()),
                "no entry without its inode"
            );
            assert_eq!(
                cl.getattr(&r, u.attr.fid).await.unwrap().nlink as usize,
                entries.len()
            );
        }
        let root_entries = cl.readdir_all(&r, Fid::ROOT, true).await.unwrap();
        let subdirs = root_entries
            .iter()
            .filter(|e| e.name != b"." && e.name != b"..")
            .count();
        assert_eq!(
            cl.getattr(&r, Fid::ROOT).await.unwrap().nlink as usize,
            2 + subdirs
        );
        // The restarted MDT keeps serving new work.
        cl.create(&r, d, b"after", 0o644, None).await.unwrap();
    });
}

#[test]
fn kill9_of_an_oss_keeps_synced_data_and_the_client_reconnects() {
    let mut c = cluster(2);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let fh = s.run(async {
        let l = lode_base::Layout::plain(2, 1 << 20, -1);
        let fh = cl
            .create_open(&r, Fid::ROOT, b"data", 0o644, libc::O_RDWR, Some(l))
            .await
            .unwrap();
        cl.write(&fh, 0, &data).await.unwrap();
        cl.fsync(&fh).await.unwrap();
        fh
    });
    c.kill9("ost0");
    c.kill9("ost1");
    // A read while the OSTs are down waits and completes once they are back.
    let reader = {
        let cl = cl.clone();
        let fh = fh.clone();
        s.handle()
            .spawn(async move { cl.read(&fh, 0, 3_000_000).await })
    };
    std::thread::sleep(Duration::from_millis(300));
    c.start_target("ost0");
    c.start_target("ost1");
    let got = s.run(reader).unwrap().expect("read after OSS restart");
    assert!(got == data, "data intact after kill -9 of the OSSes");
    s.run(cl.close(&fh)).unwrap();
}

/// A client that gives up on a request after 3 s (a stopped target's requests fail).
fn impatient_client(c: &lode_testkit::Cluster) -> Session {
    let mut cfg = c.client_config();
    cfg.timeout = Duration::from_secs(3);
    Session::connect(cfg).unwrap()
}

#[test]
fn a_failed_sync_stops_the_mdt() {
    let mut c = cluster(1);
    let s = impatient_client(&c);
    let cl = &s.client;
    let r = root();
    s.run(cl.create(&r, Fid::ROOT, b"before", 0o644, None))
        .unwrap();
    s.run(cl.sync()).unwrap();
    // Only the explicit sync below may commit: a periodic commit landing between the
    // create and its reply would stop the MDT first and fail the create with EIO.
    c.set_param("mdt.*.commit_interval_ms=60000");
    std::thread::sleep(Duration::from_millis(300));
    c.set_param("mdt.*.fail_loc=0x201");
    // A change, then a commit that fails: the MDT stops instead of acknowledging more.
    s.run(cl.create(&r, Fid::ROOT, b"pending", 0o644, None))
        .unwrap();
    assert!(s.run(cl.sync()).is_err(), "sync must not succeed");
    assert_eq!(
        c.wait_exit("mdt0", Duration::from_secs(10)),
        Some(70),
        "MDS exits with EX_SOFTWARE"
    );
    assert!(c.log("mdt0").contains("target stopped"));
    assert_eq!(
        s.run(cl.create(&r, Fid::ROOT, b"after", 0o644, None))
            .unwrap_err(),
        Errno::EIO
    );
    // Restarted, it serves what was committed.
    c.start_target("mdt0");
    let s2 = c.client();
    assert!(s2.run(s2.client.lookup(&r, Fid::ROOT, b"before")).is_ok());
}

#[test]
fn a_failed_object_sync_stops_the_ost_and_it_serves_what_was_synced_after() {
    let mut c = cluster(1);
    let s = impatient_client(&c);
    let r = root();
    let h = s
        .run(
            s.client
                .create_open(&r, Fid::ROOT, b"f", 0o644, libc::O_RDWR, None),
        )
        .unwrap();
    s.run(s.client.write(&h, 0, b"before")).unwrap();
    s.run(s.client.fsync(&h)).unwrap();
    // Only the fsync below may sync the object: a periodic commit landing first would
    // stop the OST before the write (the periodic commit syncs it again).
    c.set_param("obdfilter.*.commit_interval_ms=60000");
    std::thread::sleep(Duration::from_millis(300));
    // The next fsync of an object fails: the OST stops rather than try again, which
    // on Linux may report the lost pages as written.
    c.set_param("obdfilter.*.fail_loc=0x80000204");
    let wrote = s.run(s.client.write(&h, 6, b" after"));
    assert!(
        wrote.is_err() || s.run(s.client.fsync(&h)).is_err(),
        "the write must not be reported durable"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (ost, code) = loop {
        let stopped = ["ost0", "ost1"]
            .into_iter()
            .find_map(|o| Some((o, c.wait_exit(o, Duration::from_millis(100))?)));
        if let Some(s) = stopped {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "no OST stopped");
    };
    assert_eq!(code, 70, "OSS exits with EX_SOFTWARE");
    assert!(c.log(ost).contains("target stopped"));
    // Restarted, it serves what was synced, and the write made again is durable.
    c.start_target(ost);
    s.run(s.client.write(&h, 6, b" after")).unwrap();
    s.run(s.client.fsync(&h)).unwrap();
    assert_eq!(s.run(s.client.read(&h, 0, 64)).unwrap(), b"before after");
}

#[test]
fn a_failed_write_stops_the_mdt_and_the_change_is_not_acknowledged() {
    let mut c = cluster(1);
    let s = impatient_client(&c);
    let r = root();
    c.set_param("mdt.*.fail_loc=0x80000202");
    assert!(s
        .run(s.client.create(&r, Fid::ROOT, b"lost", 0o644, None))
        .is_err());
    assert_eq!(c.wait_exit("mdt0", Duration::from_secs(10)), Some(70));
    c.start_target("mdt0");
    let s2 = c.client();
    assert_eq!(
        s2.run(s2.client.lookup(&r, Fid::ROOT, b"lost"))
            .unwrap_err(),
        Errno::ENOENT
    );
}

#[test]
fn a_lost_reply_is_answered_from_the_reply_record_not_executed_twice() {
    let c = cluster(1);
    let mut cfg = c.client_config();
    cfg.resend_interval = Duration::from_millis(300);
    let s = Session::connect(cfg).unwrap();
    let r = root();
    s.run(s.client.create(&r, Fid::ROOT, b"warmup", 0o644, None))
        .unwrap();
    c.set_param("mdt.*.fail_loc=0x80000102");
    // Executed once, reply dropped, resent: a second execution would say EEXIST.
    let b = s
        .run(s.client.mkdir(&r, Fid::ROOT, b"once", 0o755, None))
        .expect("resend answered");
    assert_eq!(c.get_param("mdt.*.fail_loc"), "0x0", "the fault fired");
    assert_eq!(
        s.run(s.client.lookup(&r, Fid::ROOT, b"once"))
            .unwrap()
            .attr
            .fid,
        b.attr.fid
    );
    assert_eq!(s.run(s.client.getattr(&r, Fid::ROOT)).unwrap().nlink, 3);
}

#[test]
fn malformed_frames_close_only_that_connection() {
    let c = cluster(1);
    let s = c.client();
    for junk in [
        vec![0xffu8; 64],
        vec![0x10, 0, 0, 0, 1, 2, 3, 4, 5],
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
    ] {
        let mut t = std::net::TcpStream::connect(c.addr("mdt0")).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        t.write_all(&junk).unwrap();
        let _ = t.write_all(&[0u8; 200]);
        let mut buf = [0u8; 16];
        assert!(
            matches!(t.read(&mut buf), Ok(0) | Err(_)),
            "server closes a connection that sent junk"
        );
    }
    // Everyone else is still served.
    s.run(
        s.client
            .create(&root(), Fid::ROOT, b"still-serving", 0o644, None),
    )
    .unwrap();
    assert!(c.log("mdt0").contains("closing connection"));
}

#[test]
fn wrong_fsname_is_refused_clearly() {
    let c = cluster(1);
    let mut cfg = ClientConfig::new(&c.mgs_addr, "other");
    cfg.timeout = Duration::from_secs(5);
    let e = Session::connect(cfg).err().expect("refused");
    assert!(e.to_string().contains("wrong file system name"), "{e}");
    let mut cfg = ClientConfig::new("127.0.0.1:1", &c.fsname);
    cfg.timeout = Duration::from_secs(1);
    let e = Session::connect(cfg).err().expect("no MGS");
    assert!(e.to_string().contains("no answer"), "{e}");
}

/// A small tmpfs mounted over a target directory for disk-full tests (root only).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &std::path::Path, size: &str) -> Option<Tmpfs> {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Moves a stopped target onto a fresh tmpfs of `size`.
fn target_on_tmpfs(c: &lode_testkit::Cluster, name: &str, size: &str) -> Tmpfs {
    let dir = c.target_dir(name);
    let old = c.dir.path().join(format!("{name}.disk"));
    std::fs::rename(&dir, &old).unwrap();
    std::fs::create_dir(&dir).unwrap();
    let t = Tmpfs::mount(&dir, size).expect("mount tmpfs (tests run as root)");
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", old.display()))
        .arg(&dir)
        .status();
    assert!(out.unwrap().success());
    t
}

#[test]
fn a_full_ost_gives_enospc_and_recovers_when_space_is_freed() {
    let mut c = cluster(1);
    c.kill9("ost0");
    let _t = target_on_tmpfs(&c, "ost0", "8m");
    c.start_target("ost0");
    let s = c.client();
    let cl = &s.client;
    let r = root();
    s.run(async {
        let fh = cl
            .create_open(&r, Fid::ROOT, b"big", 0o644, libc::O_RDWR, None)
            .await
            .unwrap();
        let chunk = vec![7u8; 1 << 20];
        let mut written = 0u64;
        let e = loop {
            match cl.write(&fh, written, &chunk).await {
                Ok(n) => written += n as u64,
                Err(e) => break e,
            }
            assert!(written < 64 << 20, "an 8 MiB OST must fill up");
        };
        assert_eq!(e, Errno::ENOSPC);
        cl.close(&fh).await.unwrap();
        cl.unlink(&r, Fid::ROOT, b"big").await.unwrap();
    });
    // Once the destroy of the unlinked file's objects ran, writes succeed again.
    lode_testkit::wait_for("space freed", Duration::from_secs(20), || {
        s.run(async {
            let fh = cl
                .create_open(&r, Fid::ROOT, b"again", 0o644, libc::O_RDWR, None)
                .await
                .unwrap();
            let ok = cl.write(&fh, 0, &vec![1u8; 4 << 20]).await.is_ok();
            cl.close(&fh).await.unwrap();
            cl.unlink(&r, Fid::ROOT, b"again").await.unwrap();
            ok
        })
    });
}

#[test]
fn a_full_mdt_gives_enospc_and_stays_consistent() {
    let mut c = cluster(1);
    c.kill9("mdt0");
    let _t = target_on_tmpfs(&c, "mdt0", "400m");
    c.start_target("mdt0");
    let s = c.client();
    let cl = &s.client;
    let r = root();
    s.run(cl.create(&r, Fid::ROOT, b"before", 0o644, None))
        .unwrap();
    // Leave less than the MDT's reserve free.
    let filler = c.target_dir("mdt0").join("filler");
    let free = lode_base::sys::statvfs(&c.target_dir("mdt0")).unwrap();
    let fill = (free.bavail * u64::from(free.bsize)).saturating_sub(16 << 20);
    std::fs::write(&filler, vec![0u8; fill as usize]).unwrap();
    lode_testkit::wait_for("ENOSPC", Duration::from_secs(10), || {
        s.run(cl.create(&r, Fid::ROOT, b"full", 0o644, None)) == Err(Errno::ENOSPC)
    });
    assert!(
        s.run(cl.lookup(&r, Fid::ROOT, b"before")).is_ok(),
        "reads still work"
    );
    s.run(cl.unlink(&r, Fid::ROOT, b"before"))
        .expect("unlink frees, so it is allowed");
    std::fs::remove_file(&filler).unwrap();
    lode_testkit::wait_for("creates work again", Duration::from_secs(10), || {
        s.run(cl.create(&r, Fid::ROOT, b"after", 0o644, None))
            .is_ok()
    });
}

#[test]
fn a_file_system_key_refuses_clients_without_it() {
    let c = lode_testkit::Cluster::start_with_key(
        std::path::Path::new(env!("CARGO_BIN_EXE_lode")),
        1,
        Some(b"s3cret"),
    );
    let s = c.client();
    s.run(s.client.create(&root(), Fid::ROOT, b"f", 0o644, None))
        .expect("a keyed client works");
    let m = c.mount();
    assert!(m.path().join("f").exists(), "a mount with key_file works");
    for key in [&b""[..], b"wrong"] {
        let mut cfg = c.client_config();
        cfg.key = key.to_vec();
        cfg.timeout = Duration::from_secs(5);
        let e = Session::connect(cfg).err().expect("refused");
        assert!(e.to_string().contains("wrong or missing key"), "{e}");
    }
    assert!(c.log("mgs").contains("refusing connect"));
}
