//! Coherence through the kernel's cache: mounts give the kernel long timeouts for what
//! their locks cover and make it forget when a lock goes, so a change by one client is
//! seen by every other on its next call; a create in a directory the mount made is one
//! MDT request; permissions are checked on every path the kernel has cached.

mod common;

use common::*;
use libc::{EACCES, ENOENT};
use lode_testkit::Mount;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn mode(p: &Path) -> u32 {
    fs::metadata(p).expect("stat").mode() & 0o7777
}

fn gone(p: &Path) -> bool {
    fs::symlink_metadata(p).err().and_then(|e| e.raw_os_error()) == Some(ENOENT)
}

fn xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let (c, n) = (cs(p), cs(name));
    let mut buf = [0u8; 256];
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| buf[..r as usize].to_vec())
}

/// Looks at everything under `dir` on mount `m`, so its kernel holds it all.
fn warm(m: &Mount, dir: &str) {
    for e in fs::read_dir(m.path().join(dir)).expect("readdir") {
        let e = e.expect("entry");
        let _ = fs::metadata(e.path());
    }
}

#[test]
fn every_change_by_one_mount_is_seen_by_the_other_on_its_next_call() {
    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    let (pa, pb) = (|r: &str| a.path().join(r), |r: &str| b.path().join(r));

    fs::create_dir(pa("d")).expect("mkdir");
    fs::write(pa("d/data"), b"abc").expect("write");
    fs::File::create(pa("d/e")).expect("create");
    warm(&b, "d");
    assert_eq!(fs::metadata(pb("d/data")).expect("stat").len(), 3);
    // A name looked up and missing on B, then made on A.
    assert!(gone(&pb("d/new")));
    fs::File::create(pa("d/new")).expect("create");
    assert!(!gone(&pb("d/new")), "create seen");

    for m in [0o600, 0o640, 0o604] {
        fs::set_permissions(pa("d/e"), fs::Permissions::from_mode(m)).expect("chmod");
        assert_eq!(mode(&pb("d/e")), m, "chmod seen");
    }
    std::os::unix::fs::chown(pa("d/e"), Some(UID), Some(UID)).expect("chown");
    let md = fs::metadata(pb("d/e")).expect("stat");
    assert_eq!((md.uid(), md.gid()), (UID, UID), "chown seen");

    fs::OpenOptions::new()
        .write(true)
        .open(pa("d/e"))
        .and_then(|f| f.set_len(10))
        .expect("truncate");
    assert_eq!(
        fs::metadata(pb("d/e")).expect("stat").len(),
        10,
        "truncate seen"
    );
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(pa("d/data"))
        .expect("open");
    f.write_all(b"defg").expect("write");
    drop(f);
    assert_eq!(
        fs::read(pb("d/data")).expect("read"),
        b"abcdefg",
        "write seen"
    );

    fs::rename(pa("d/e"), pa("d/e2")).expect("rename");
    assert!(gone(&pb("d/e")), "rename: old name gone");
    assert_eq!(fs::metadata(pb("d/e2")).expect("stat").len(), 10);

    fs::hard_link(pa("d/e2"), pa("d/e3")).expect("link");
    assert_eq!(
        fs::metadata(pb("d/e2")).expect("stat").nlink(),
        2,
        "link seen"
    );
    fs::remove_file(pa("d/e3")).expect("unlink");
    assert!(gone(&pb("d/e3")), "unlink seen");
    assert_eq!(fs::metadata(pb("d/e2")).expect("stat").nlink(), 1);

    // The names a rename or link of A's leaves, A keeps under locks: B's change of
    // them calls A back.
    fs::create_dir(pa("d/other")).expect("mkdir");
    fs::rename(pa("d/e2"), pa("d/other/m")).expect("rename between directories");
    fs::hard_link(pa("d/other/m"), pa("d/l")).expect("link");
    assert_eq!(fs::metadata(pa("d/other/m")).expect("stat").nlink(), 2);
    fs::remove_file(pb("d/l")).expect("unlink on B");
    assert!(gone(&pa("d/l")), "B's unlink of A's link seen by A");
    assert_eq!(fs::metadata(pa("d/other/m")).expect("stat").nlink(), 1);
    fs::rename(pb("d/other/m"), pb("d/e2")).expect("rename back on B");
    assert!(
        gone(&pa("d/other/m")),
        "B's rename of A's moved name seen by A"
    );
    assert_eq!(fs::metadata(pa("d/e2")).expect("stat").len(), 10);
    fs::remove_dir(pb("d/other")).expect("rmdir on B");
    assert!(gone(&pa("d/other")), "B's rmdir seen by A");

    let (e2, name) = (cs(pa("d/e2")), cs("user.k"));
    let r = unsafe { libc::setxattr(e2.as_ptr(), name.as_ptr(), b"v1".as_ptr().cast(), 2, 0) };
    assert_eq!(r, 0);
    assert_eq!(xattr(&pb("d/e2"), "user.k").as_deref(), Some(&b"v1"[..]));
    assert_eq!(unsafe { libc::removexattr(e2.as_ptr(), name.as_ptr()) }, 0);
    assert_eq!(xattr(&pb("d/e2"), "user.k"), None, "removexattr seen");

    fs::create_dir(pa("d/sub")).expect("mkdir");
    assert!(
        fs::metadata(pb("d/sub")).expect("stat").is_dir(),
        "mkdir seen"
    );
    let nlink = fs::metadata(pb("d")).expect("stat").nlink();
    fs::remove_dir(pa("d/sub")).expect("rmdir");
    assert!(gone(&pb("d/sub")), "rmdir seen");
    assert_eq!(fs::metadata(pb("d")).expect("stat").nlink(), nlink - 1);

    // And the other way round, into a directory A made and knows completely.
    fs::create_dir(pa("mine")).expect("mkdir");
    assert!(gone(&pa("mine/x")));
    fs::write(pb("mine/x"), b"1").expect("create on B");
    assert_eq!(fs::read(pa("mine/x")).expect("A sees B's create"), b"1");
    let names: Vec<_> = fs::read_dir(pa("mine"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["x"]);
}

#[test]
fn a_directory_the_mount_made_answers_new_names_itself_past_65536_entries() {
    // mdtest makes hundreds of thousands of files in one directory: the listing that
    // answers "no such name" without a LOOKUP follows it past 65,536 names.
    let c = cluster(2);
    let m = c.mount();
    fs::create_dir(m.path().join("d")).expect("mkdir");
    let create = |i: usize| {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(m.path().join(format!("d/f{i}")))
            .expect("create");
    };
    (0..66_000).for_each(create);
    c.set_param("mdc.*.md_stats=0");
    (66_000..67_000).for_each(create);
    assert_eq!(md_stat(&c, "create"), 1000);
    assert_eq!(md_stat(&c, "getattr_name"), 0, "no LOOKUP of a new name");
    // And a name it holds is still found as the file it is.
    assert!(fs::metadata(m.path().join("d/f65999"))
        .expect("stat")
        .is_file());
}

#[test]
fn a_directory_looked_in_keeps_its_listing_through_a_walk_larger_than_the_lru() {
    // mdtest stats every entry of its directory, more than the LRU holds, then makes
    // files there: the directory, used by every lookup, must outlive the entries.
    // (The LRU holds two of statahead's pages: 4,096 locks, 2 an entry.)
    let c = cluster(2);
    let m = c.mount();
    c.set_param("ldlm.namespaces.*-mdc-*.lru_size=4096");
    fs::create_dir(m.path().join("d")).expect("mkdir");
    for i in 0..6000 {
        fs::File::create(m.path().join(format!("d/f{i}"))).expect("create");
    }
    for i in 0..6000 {
        fs::metadata(m.path().join(format!("d/f{i}"))).expect("stat");
    }
    c.set_param("mdc.*.md_stats=0");
    for i in 6000..6100 {
        fs::File::create(m.path().join(format!("d/f{i}"))).expect("create");
    }
    assert_eq!(md_stat(&c, "create"), 100);
    assert_eq!(md_stat(&c, "getattr_name"), 0, "no LOOKUP of a new name");
}

#[test]
fn a_create_in_a_directory_the_mount_made_is_one_create_and_stats_need_no_rpc() {
    let c = cluster(2);
    let m = c.mount();
    fs::create_dir(m.path().join("d")).expect("mkdir");
    c.set_param("mdc.*.md_stats=0");
    for i in 0..20 {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(m.path().join(format!("d/f{i}")))
            .expect("create");
    }
    let counts = |c: &lode_testkit::Cluster| {
        ["create", "close", "getattr", "getattr_name", "unlink"].map(|n| md_stat(c, n))
    };
    // One CREATE (and the CLOSE) per file: no LOOKUP of the new name, no GETATTR of
    // the directory for the kernel's permission check.
    assert_eq!(
        counts(&c),
        [20, 20, 0, 0, 0],
        "create, close, getattr, getattr_name, unlink"
    );
    c.set_param("mdc.*.md_stats=0");
    for i in 0..20 {
        let md = fs::metadata(m.path().join(format!("d/f{i}"))).expect("stat");
        assert_eq!((md.len(), md.mode() & 0o777), (0, 0o644));
    }
    assert_eq!(counts(&c), [0, 0, 0, 0, 0], "stats answered by the kernel");
    // A rename within the directory hands it back too: no LOOKUP of the new name, no
    // GETATTR of the directory, and the kernel still sees every name as it is.
    for i in 0..20 {
        let (from, to) = (format!("d/f{i}"), format!("d/g{i}"));
        fs::rename(m.path().join(from), m.path().join(to)).expect("rename");
    }
    assert_eq!(md_stat(&c, "rename"), 20);
    assert_eq!(counts(&c), [0, 0, 0, 0, 0], "one RENAME per rename");
    let mut names: Vec<String> = fs::read_dir(m.path().join("d"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    names.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("g{i}")).collect();
    want.sort();
    assert_eq!(names, want);
    assert!(gone(&m.path().join("d/f3")));
    // So do a rename into another directory (both directories) and a hard link.
    fs::create_dir(m.path().join("e")).expect("mkdir");
    c.set_param("mdc.*.md_stats=0");
    for i in 0..10 {
        let (from, to) = (format!("d/g{i}"), format!("e/h{i}"));
        fs::rename(m.path().join(from), m.path().join(to)).expect("rename");
        let (from, to) = (format!("e/h{i}"), format!("d/l{i}"));
        fs::hard_link(m.path().join(from), m.path().join(to)).expect("link");
    }
    assert_eq!((md_stat(&c, "rename"), md_stat(&c, "link")), (10, 10));
    assert_eq!(counts(&c), [0, 0, 0, 0, 0], "one RENAME or LINK each");
    let listed = |d: &str| {
        let mut n: Vec<String> = fs::read_dir(m.path().join(d))
            .expect("readdir")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        n.sort();
        n
    };
    let mut want: Vec<String> = (10..20)
        .map(|i| format!("g{i}"))
        .chain((0..10).map(|i| format!("l{i}")))
        .collect();
    want.sort();
    assert_eq!(listed("d"), want);
    let mut want: Vec<String> = (0..10).map(|i| format!("h{i}")).collect();
    want.sort();
    assert_eq!(listed("e"), want);
    assert!(gone(&m.path().join("d/g3")));
    assert_eq!(
        fs::metadata(m.path().join("d/l3")).expect("stat").nlink(),
        2
    );
    let names = listed("d");
    c.set_param("mdc.*.md_stats=0");
    for n in names {
        fs::remove_file(m.path().join("d").join(n)).expect("unlink");
    }
    assert_eq!(counts(&c), [0, 0, 0, 0, 20], "one UNLINK per removal");
}

#[test]
fn removing_search_permission_stops_other_users_on_paths_the_kernel_had_cached() {
    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    fs::create_dir_all(a.path().join("top/mid")).expect("mkdir");
    fs::write(a.path().join("top/mid/f"), b"x").expect("write");
    fs::set_permissions(
        a.path().join("top/mid/f"),
        fs::Permissions::from_mode(0o666),
    )
    .expect("chmod");
    let stat = |p: *const libc::c_char| unsafe {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        libc::stat(p, st.as_mut_ptr())
    };
    let open_w = |p: *const libc::c_char| unsafe {
        let fd = libc::open(p, libc::O_WRONLY);
        if fd >= 0 {
            libc::close(fd);
        }
        fd
    };
    let chmod = |p: *const libc::c_char| unsafe { libc::chmod(p, 0o600) };
    // The user walks the path on both mounts (their kernels cache it)...
    for m in [&a, &b] {
        assert_eq!(as_user(m.path(), "top/mid/f", stat), 0);
        assert_eq!(as_user(m.path(), "top/mid/f", open_w), 0);
    }
    // ...then root takes search permission away on mount A.
    fs::set_permissions(a.path().join("top"), fs::Permissions::from_mode(0o700)).expect("chmod");
    for m in [&a, &b] {
        assert_eq!(as_user(m.path(), "top/mid/f", stat), EACCES, "stat");
        assert_eq!(as_user(m.path(), "top/mid/f", open_w), EACCES, "open");
        assert_eq!(as_user(m.path(), "top/mid/f", chmod), EACCES, "chmod");
    }
    fs::set_permissions(b.path().join("top"), fs::Permissions::from_mode(0o755)).expect("chmod");
    for m in [&a, &b] {
        assert_eq!(
            as_user(m.path(), "top/mid/f", stat),
            0,
            "search allowed again"
        );
    }
}

#[test]
fn fifo_opens_follow_the_mode_bits() {
    let c = cluster(1);
    let m = c.mount();
    let p = cs(m.path().join("fifo"));
    assert_eq!(unsafe { libc::mkfifo(p.as_ptr(), 0o600) }, 0);
    let open_nb = |flags: i32| {
        move |p: *const libc::c_char| unsafe {
            let fd = libc::open(p, flags | libc::O_NONBLOCK);
            if fd >= 0 {
                libc::close(fd);
            }
            fd
        }
    };
    assert_eq!(as_user(m.path(), "fifo", open_nb(libc::O_RDONLY)), EACCES);
    assert_eq!(as_user(m.path(), "fifo", open_nb(libc::O_WRONLY)), EACCES);
    fs::set_permissions(m.path().join("fifo"), fs::Permissions::from_mode(0o644)).expect("chmod");
    assert_eq!(
        as_user(m.path(), "fifo", open_nb(libc::O_RDONLY)),
        0,
        "readable now"
    );
    // Writable still not: no writer bit for others (and no reader: ENXIO otherwise).
    assert_eq!(as_user(m.path(), "fifo", open_nb(libc::O_WRONLY)), EACCES);
}

#[test]
fn a_close_that_wrote_nothing_makes_the_size_exact_but_never_hides_another_writers_data() {
    let c = cluster(2);
    let (s1, s2) = (c.client(), c.client());
    let cr = root();
    let root_fid = lode_base::Fid::ROOT;
    let body = |s: &lode_client::Session, f| s.run(s.client.getattr_md(&cr, f)).expect("getattr");

    // Created for writing and closed untouched: the MDT's size is exact again.
    let h = s1
        .run(
            s1.client
                .create_open(&cr, root_fid, b"empty", 0o644, libc::O_WRONLY, None),
        )
        .expect("create");
    assert!(body(&s2, h.fid).glimpse, "open for write: size on the OSTs");
    s1.run(s1.client.close(&h)).expect("close");
    // The close rides ahead of s1's next request (it wrote nothing): this one.
    s1.run(s1.client.statfs()).expect("statfs");
    let fresh = c.client();
    let b = body(&fresh, h.fid);
    assert!(!b.glimpse, "closed unwritten: no glimpse needed");
    assert_eq!(b.attr.size, 0);

    // Another writer meanwhile: the first handle's empty close leaves the mark.
    let h1 = s1
        .run(
            s1.client
                .create_open(&cr, root_fid, b"shared", 0o644, libc::O_WRONLY, None),
        )
        .expect("create");
    let h2 = s2
        .run(s2.client.open(&cr, h1.fid, libc::O_WRONLY))
        .expect("open");
    s2.run(s2.client.write(&h2, 0, b"hello")).expect("write");
    s2.run(s2.client.close(&h2)).expect("close");
    s1.run(s1.client.close(&h1)).expect("close");
    assert_eq!(size_seen_by_a_new_client(&c, h1.fid), 5);

    // And a truncate meanwhile, through the marking handle's own client.
    let h = s1
        .run(
            s1.client
                .create_open(&cr, root_fid, b"cut", 0o644, libc::O_WRONLY, None),
        )
        .expect("create");
    let sa = lode_base::SetAttr {
        size: Some(7),
        ..Default::default()
    };
    s2.run(s2.client.setattr(&cr, h.fid, sa)).expect("truncate");
    s1.run(s1.client.close(&h)).expect("close");
    assert_eq!(size_seen_by_a_new_client(&c, h.fid), 7);
}

fn size_seen_by_a_new_client(c: &lode_testkit::Cluster, fid: lode_base::Fid) -> u64 {
    let s = c.client();
    s.run(s.client.getattr(&root(), fid)).expect("stat").size
}

#[test]
fn ls_l_of_a_directory_is_its_readdir_pages_and_nothing_else() {
    let c = cluster(1);
    let s = c.client();
    let d = s
        .run(
            s.client
                .mkdir(&root(), lode_base::Fid::ROOT, b"big", 0o755, None),
        )
        .expect("mkdir")
        .attr
        .fid;
    for i in 0..300 {
        let name = format!("f{i}");
        s.run(s.client.create(&root(), d, name.as_bytes(), 0o644, None))
            .expect("create");
    }
    let m = c.mount();
    c.set_param("mdc.*.md_stats=0");
    for round in 0..2 {
        assert_eq!(
            gnu_ls_l(&m.path().join("big")).lines().count(),
            301,
            "round {round}"
        );
    }
    // Readdir+ pages carry each entry's locks: the stats are the kernel's, and the
    // `security.selinux` lookups ls makes are answered by the client.
    for op in ["getattr", "getattr_name", "getxattr"] {
        assert!(
            md_stat(&c, op) <= 2,
            "{op}: {}",
            c.get_param("mdc.*.md_stats")
        );
    }
    assert!(md_stat(&c, "read_page") >= 1);
}

#[test]
fn a_creator_still_holding_its_new_file_open_sees_another_mounts_write() {
    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(a.path().join("new"))
        .expect("create");
    assert_eq!(fs::metadata(a.path().join("new")).expect("stat").len(), 0);
    fs::OpenOptions::new()
        .write(true)
        .open(b.path().join("new"))
        .and_then(|mut g| g.write_all(b"hello"))
        .expect("write on B");
    assert_eq!(
        fs::metadata(a.path().join("new")).expect("stat").len(),
        5,
        "open"
    );
    drop(f);
    assert_eq!(
        fs::metadata(a.path().join("new")).expect("stat").len(),
        5,
        "closed"
    );
    assert_eq!(fs::read(a.path().join("new")).expect("read"), b"hello");
}

/// An open for write hands the mount's lock on the file back early (so the MDT does not
/// call it back for its own open); the attributes its kernel kept under that lock must
/// go too, or a later truncate by another client is never seen there.
#[test]
fn a_mount_that_opened_a_file_for_writing_sees_another_clients_later_truncate() {
    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    let s = c.client();
    fs::write(b.path().join("f"), b"").expect("create on B");
    for (name, len) in [("append", 5), ("write", 9)] {
        let mut o = fs::OpenOptions::new();
        match name {
            "append" => o.append(true),
            _ => o.write(true),
        };
        // Looked up (its attributes cached under a lock), opened, nothing written.
        assert!(fs::metadata(a.path().join("f")).expect("stat").len() < len);
        o.open(a.path().join("f"))
            .and_then(|mut h| h.write_all(b""))
            .expect("open on A");
        let fid = s
            .run(s.client.resolve(&root(), "/f", false))
            .expect("resolve")
            .attr
            .fid;
        let sa = lode_base::SetAttr {
            size: Some(len),
            ..Default::default()
        };
        s.run(s.client.setattr(&root(), fid, sa)).expect("truncate");
        assert_eq!(
            fs::metadata(a.path().join("f")).expect("stat").len(),
            len,
            "{name}: stat"
        );
        assert_eq!(
            fs::read(a.path().join("f")).expect("read"),
            vec![0u8; len as usize],
            "{name}: read"
        );
    }
}

#[test]
fn a_stopped_mount_is_evicted_the_others_go_on_and_it_recovers_with_eio_on_stale_handles() {
    let c = cluster(1);
    c.set_param("mdt.*.ldlm_timeout=2");
    let (a, b) = (c.mount(), c.mount());
    fs::write(a.path().join("f"), b"x").expect("write");
    let mut stale = fs::OpenOptions::new()
        .write(true)
        .open(b.path().join("f"))
        .expect("open on B");
    assert_eq!(mode(&b.path().join("f")), 0o644);
    // B's open for write handed its lock on f back early, and a cached stat asks
    // nothing: a listing (readdir+ under locks) makes sure B holds f's attributes
    // again, so A's chmod must call B back.
    fs::read_dir(b.path()).expect("readdir on B").for_each(drop);
    let pid = b.pid().expect("B's pid") as i32;
    /// Resumes B however the test ends: a failed assertion while B is stopped would
    /// otherwise hang on closing `stale`, a file on B.
    struct Resume(i32);
    impl Drop for Resume {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0, libc::SIGCONT) };
        }
    }
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let resume = Resume(pid);
    // B holds locks on f and cannot answer their callback: it is evicted after
    // ldlm_timeout and A's change goes ahead.
    fs::set_permissions(a.path().join("f"), fs::Permissions::from_mode(0o600)).expect("chmod");
    fs::write(a.path().join("g"), b"y").expect("A carries on");
    lode_testkit::wait_for(
        "the eviction to be logged",
        std::time::Duration::from_secs(10),
        || c.log("mdt0").contains("evicting client"),
    );
    drop(resume);
    // Resumed, B reads the eviction notice and forgets what it cached...
    lode_testkit::wait_for(
        "B to see A's chmod",
        std::time::Duration::from_secs(30),
        || mode(&b.path().join("f")) == 0o600,
    );
    // ...its handle opened before the eviction is gone...
    let r = stale.write_all(b"zz").and_then(|_| stale.sync_all());
    assert_eq!(
        r.err().and_then(|e| e.raw_os_error()),
        Some(libc::EIO),
        "stale handle"
    );
    drop(stale);
    // ...and B works again.
    assert_eq!(fs::read(b.path().join("g")).expect("read on B"), b"y");
    fs::write(b.path().join("h"), b"z").expect("B writes again");
    assert_eq!(fs::read(a.path().join("h")).expect("A sees it"), b"z");
}

#[test]
fn a_mount_working_alone_in_its_directory_is_never_called_back() {
    let c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    // B has looked at the root (it holds locks there) and then stays idle.
    fs::read_dir(b.path()).expect("readdir").for_each(drop);
    fs::create_dir(a.path().join("mine")).expect("mkdir");
    for i in 0..50 {
        let p = a.path().join(format!("mine/f{i}"));
        fs::write(&p, b"").expect("create");
        fs::metadata(&p).expect("stat");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    for i in 0..50 {
        fs::remove_file(a.path().join(format!("mine/f{i}"))).expect("unlink");
    }
    let callbacks = || {
        c.get_param("mdt.*.stats")
            .lines()
            .find(|l| l.starts_with("ldlm_bl_callback"))
            .and_then(|l| l.split_whitespace().nth(1))
            .map_or(0, |n| n.parse::<u64>().expect("a count"))
    };
    // Only the mkdir in the root, which B holds a lock on, may call B back.
    let alone = callbacks();
    assert!(alone <= 1, "{alone} callbacks");
    // B working in A's directory is another matter: A's lock on it goes.
    fs::write(b.path().join("mine/from-b"), b"").expect("create on B");
    assert!(callbacks() > alone, "the counter counts");
}

/// Whether the kernel holds the first page of `f` in its page cache (`mincore` of a
/// mapping that has not been touched, so nothing is read to answer).
fn first_page_cached(f: &fs::File) -> bool {
    use std::os::fd::AsRawFd;
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        let mut v = [0u8; 1];
        assert_eq!(libc::mincore(p, 4096, v.as_mut_ptr()), 0, "mincore");
        libc::munmap(p, 4096);
        v[0] & 1 == 1
    }
}

/// Read-on-open fills the kernel's page cache (as Lustre's does the client's pages),
/// so reading a small DoM file after opening it is no FUSE round trip; the pages are
/// the file as it is at each open, whoever changed it, and never replace what a
/// writable mapping of this mount has not written back yet.
#[test]
fn a_small_dom_file_opened_for_reading_is_in_the_page_cache_and_stays_current() {
    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    let (pa, pb) = (a.path().join("d/f"), b.path().join("d/f"));
    dom_dir(&c, &a.path().join("d"));
    fs::write(&pa, b"first version").expect("write");
    let _ = fs::metadata(&pa);
    // The writer's close goes in the background; while the mount still has the file
    // open for writing, an open does not fill the pages.
    lode_testkit::wait_for(
        "the writer closed",
        std::time::Duration::from_secs(10),
        || c.get_param("mdt.*.open_files") == "0",
    );

    let f = fs::File::open(&pa).expect("open");
    assert!(
        first_page_cached(&f),
        "the open put the file in the page cache"
    );
    assert_eq!(std::io::read_to_string(&f).expect("read"), "first version");
    drop(f);

    // Changed elsewhere, longer then shorter: each open on A reads it as it is.
    fs::write(&pb, b"second, longer version").expect("write on B");
    assert_eq!(fs::read(&pa).expect("read"), b"second, longer version");
    fs::write(&pb, b"third").expect("write on B");
    assert_eq!(fs::read(&pa).expect("read"), b"third");
    assert_eq!(fs::metadata(&pa).expect("stat").len(), 5);

    // A shared writable mapping on A, not written back: a read-only open on A must
    // read the mapping's bytes, not the MDT's older ones over them.
    let w = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pa)
        .expect("open rw");
    unsafe {
        use std::os::fd::AsRawFd;
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            w.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        std::ptr::copy_nonoverlapping(b"THIRD".as_ptr(), p.cast::<u8>(), 5);
        // The attributes asked again, so the mount may hold their lock once more.
        let _ = fs::metadata(&pa);
        let _ = fs::metadata(&pb);
        let _ = fs::metadata(&pa);
        assert_eq!(
            fs::read(&pa).expect("read"),
            b"THIRD",
            "the mapping's bytes"
        );
        libc::munmap(p, 4096);
    }
    drop(w);
    assert_eq!(
        fs::read(&pb).expect("read on B"),
        b"THIRD",
        "written back at unmap"
    );
}

/// A reader that keeps a file open sees another client's later write on its next
/// read, as on Lustre: the kernel asks for the attributes a lock no longer covers
/// before a read and drops the pages of a file whose mtime moved, and a handle's
/// read-on-open bytes (DoM) answer only while the attributes lock that vouched for
/// them is held.
#[test]
fn a_reader_holding_a_file_open_sees_another_clients_later_writes() {
    use std::os::unix::fs::FileExt;
    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    let s = c.client();
    dom_dir(&c, &a.path().join("dom"));
    let closed = || {
        lode_testkit::wait_for(
            "the writers' closes",
            std::time::Duration::from_secs(10),
            || c.get_param("mdt.*.open_files") == "0",
        )
    };
    for name in ["ost", "dom/f"] {
        let (pa, pb) = (a.path().join(name), b.path().join(name));
        fs::write(&pa, b"first version").expect("write");
        closed();
        let native = open_native(&s, name);
        let f = fs::File::open(&pa).expect("open on A");
        let read_a = || {
            let mut buf = [0u8; 100];
            let n = f.read_at(&mut buf, 0).expect("read on A");
            buf[..n].to_vec()
        };
        let read_native = || s.run(s.client.read(&native, 0, 100)).expect("native read");
        assert_eq!(read_a(), b"first version", "{name}");
        assert_eq!(read_native(), b"first version", "{name}");
        for (how, new) in [
            ("in place, same size", &b"FIRST VERSION"[..]),
            ("longer", &b"second, longer version"[..]),
            ("shorter", &b"third"[..]),
        ] {
            if how.starts_with("in place") {
                fs::OpenOptions::new()
                    .write(true)
                    .open(&pb)
                    .and_then(|mut g| g.write_all(new))
                    .expect("write on B");
            } else {
                fs::write(&pb, new).expect("write on B");
            }
            assert_eq!(read_a(), new, "{name}, {how}: mount A's open file");
            assert_eq!(read_native(), new, "{name}, {how}: the native handle");
            closed_but(&c, 2);
        }
        s.run(s.client.close(&native)).expect("close");
    }
}

/// The writer stays open across its writes, so only its first open calls the
/// readers' locks back: what a reader reads after that is not vouched for by any lock,
/// and must not be served from pages cached at its read before the next write.
#[test]
fn a_reader_holding_a_file_open_sees_each_write_of_a_writer_that_stays_open() {
    use std::os::unix::fs::FileExt;
    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    let s = c.client();
    dom_dir(&c, &a.path().join("dom"));
    for name in ["ost", "dom/f"] {
        let (pa, pb) = (a.path().join(name), b.path().join(name));
        fs::write(&pa, b"version 0").expect("write");
        closed_but(&c, 0);
        let native = open_native(&s, name);
        let f = fs::File::open(&pa).expect("open on A");
        let read_a = || {
            let mut buf = [0u8; 100];
            let n = f.read_at(&mut buf, 0).expect("read on A");
            // A's mount drops pages it could not vouch for just after answering.
            std::thread::sleep(std::time::Duration::from_millis(50));
            buf[..n].to_vec()
        };
        let read_native = || s.run(s.client.read(&native, 0, 100)).expect("native read");
        assert_eq!(read_a(), b"version 0", "{name}");
        let g = fs::OpenOptions::new()
            .write(true)
            .open(&pb)
            .expect("open on B");
        for v in 1..=4 {
            let new = format!("version {v}");
            g.write_at(new.as_bytes(), 0).expect("write on B");
            assert_eq!(read_a(), new.as_bytes(), "{name}: mount A's open file");
            assert_eq!(read_native(), new.as_bytes(), "{name}: the native handle");
            // A new open on A sees it too, and leaves the held handle reading fresh
            // (once the pages its read left are dropped, as after `read_a`).
            assert_eq!(
                fs::read(&pa).expect("read"),
                new.as_bytes(),
                "{name}: new open"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        drop(g);
        s.run(s.client.close(&native)).expect("close");
    }
}

/// Two mounts write one page of a file, both holding it open: one writes it whole
/// (the kernel keeps the page it wrote through), the other a few bytes inside it (an
/// MPI-IO pattern with unaligned ranks). Each then reads the other's bytes, not
/// those of the page it had cached.
#[test]
fn two_writers_sharing_a_page_each_read_the_others_bytes() {
    use std::os::unix::fs::FileExt;
    const PAGE: usize = 4096;
    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    dom_dir(&c, &a.path().join("dom"));
    for name in ["ost", "dom/f"] {
        let (pa, pb) = (a.path().join(name), b.path().join(name));
        fs::write(&pa, [b'.'; PAGE]).expect("write");
        closed_but(&c, 0);
        let open = |p: &std::path::Path| {
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .expect("open")
        };
        let (fa, fb) = (open(&pa), open(&pb));
        let read = |f: &fs::File| {
            let mut buf = vec![0u8; PAGE];
            f.read_exact_at(&mut buf, 0).expect("read");
            // A mount drops pages no lock vouches for just after answering.
            std::thread::sleep(std::time::Duration::from_millis(50));
            buf
        };
        assert_eq!(read(&fa), [b'.'; PAGE], "{name}");
        assert_eq!(read(&fb), [b'.'; PAGE], "{name}");
        for round in 0..3u8 {
            let (ca, cb) = (b'a' + round, b'A' + round);
            fa.write_all_at(&[ca; PAGE], 0).expect("write on A");
            std::thread::sleep(std::time::Duration::from_millis(50));
            fb.write_all_at(&[cb; 16], 100).expect("write on B");
            std::thread::sleep(std::time::Duration::from_millis(50));
            let mut want = vec![ca; PAGE];
            want[100..116].fill(cb);
            assert!(
                read(&fa) == want,
                "{name}, round {round}: A reads its own page"
            );
            assert!(read(&fb) == want, "{name}, round {round}: B");
        }
    }
}

/// A writer alone is not slowed by the rule above: its own open for writing leaves it
/// a lock that vouches for its pages, so what it wrote and reads back through the
/// same descriptor comes from the kernel's pages, not from the OSTs or the MDT.
#[test]
fn a_writer_alone_reads_back_what_it_wrote_from_its_pages() {
    use std::os::unix::fs::FileExt;
    let c = cluster(2);
    let m = c.mount();
    dom_dir(&c, &m.path().join("dom"));
    for name in ["ost", "dom/f"] {
        let p = m.path().join(name);
        fs::write(&p, [b'.'; 8192]).expect("write");
        closed_but(&c, 0);
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .expect("open");
        f.write_all_at(&[b'x'; 4096], 4096).expect("write");
        let (ost, dom) = (ost_reads(&c), md_stat(&c, "dom_read"));
        for _ in 0..3 {
            let mut buf = [0u8; 4096];
            f.read_exact_at(&mut buf, 4096).expect("read");
            assert_eq!(buf, [b'x'; 4096], "{name}");
        }
        assert_eq!(
            (ost_reads(&c) - ost, md_stat(&c, "dom_read") - dom),
            (0, 0),
            "{name}: reads sent to the OSTs and the MDT"
        );
    }
}

/// A file this mount made, whose attributes it keeps under its create's lock (the
/// kernel with them, for as long as the lock is held), shows each of its own writes
/// at once: the size, the blocks and the modification time that `stat` gives after
/// each write, through another descriptor too, and where an O_APPEND lands. The
/// kernel is not told of them by the mount; its own write path marks them stale.
#[test]
fn a_file_made_here_shows_each_of_its_own_writes_at_once() {
    use std::os::unix::fs::FileExt;
    let c = cluster(2);
    let m = c.mount();
    dom_dir(&c, &m.path().join("dom"));
    for name in ["ost", "dom/f"] {
        let p = m.path().join(name);
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
            .expect("create");
        let other = fs::File::open(&p).expect("open");
        let md = fs::metadata(&p).expect("stat");
        assert_eq!((md.len(), md.blocks()), (0, 0), "{name}");
        let mut mtime = (md.mtime(), md.mtime_nsec());
        std::thread::sleep(std::time::Duration::from_millis(20));
        for (i, (off, len)) in [(0u64, 100usize), (100, 4000), (65536, 10)]
            .into_iter()
            .enumerate()
        {
            f.write_all_at(&vec![b'a' + i as u8; len], off)
                .expect("write");
            let end = off + len as u64;
            for md in [fs::metadata(&p), other.metadata(), f.metadata()] {
                let md = md.expect("stat");
                assert_eq!(md.len(), end, "{name}: size after write {i}");
                assert!(md.blocks() > 0, "{name}: blocks after write {i}");
                assert!(
                    (md.mtime(), md.mtime_nsec()) > mtime,
                    "{name}: mtime after write {i}"
                );
            }
            mtime = {
                let md = fs::metadata(&p).expect("stat");
                (md.mtime(), md.mtime_nsec())
            };
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut a = fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .expect("open for append");
        a.write_all(b"tail").expect("append");
        drop(a);
        let want = 65546 + 4;
        assert_eq!(fs::metadata(&p).expect("stat").len(), want, "{name}");
        let mut buf = [0u8; 4];
        other.read_exact_at(&mut buf, want - 4).expect("read");
        assert_eq!(&buf, b"tail", "{name}");
        drop((f, other));
        assert_eq!(fs::metadata(&p).expect("stat").len(), want, "{name}");
    }
}

/// A file on the OSTs read again through the same mount, with nobody else changing
/// it meanwhile, comes from the kernel's pages: the attributes lock its first read
/// found vouching for them is still held, and any other client's open for writing,
/// truncate or layout change would have called it back first. Another mount's write
/// ends that, and the next read is of the new bytes, which are then kept again.
#[test]
fn a_file_read_again_under_the_same_lock_comes_from_the_page_cache() {
    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    let (pa, pb) = (a.path().join("f"), b.path().join("f"));
    // A change on B, then B's close awaited (no handle is kept open by the open
    // cache, so the MDT's open files are B's writer's): until then a lock A is
    // granted does not vouch for the pages.
    c.set_param("llite.*.opencache_threshold_count=0");
    let on_b = |change: &dyn Fn() -> std::io::Result<()>| {
        change().expect("change on B");
        closed_but(&c, 0);
    };
    let first: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
    on_b(&|| fs::write(&pb, &first));
    assert_eq!(fs::read(&pa).expect("read"), first);
    let read_once = ost_reads(&c);
    for _ in 0..3 {
        let f = fs::File::open(&pa).expect("open");
        assert!(first_page_cached(&f), "kept at the open");
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut &f, &mut got).expect("read");
        assert_eq!(got, first);
    }
    assert_eq!(ost_reads(&c), read_once, "reads again sent to the OSTs");

    // Changed on B in place, same size, then shorter: each next read on A is of
    // the new bytes, which are kept again after.
    let second: Vec<u8> = first.iter().map(|x| x ^ 0xff).collect();
    on_b(&|| {
        fs::OpenOptions::new()
            .write(true)
            .open(&pb)
            .and_then(|mut g| g.write_all(&second))
    });
    assert_eq!(fs::read(&pa).expect("read"), second, "B's write, same size");
    on_b(&|| fs::write(&pb, b"third"));
    assert_eq!(fs::read(&pa).expect("read"), b"third", "B's write, shorter");
    // After a truncate the MDT keeps no size until a writer's close settles it (lazy
    // size on MDT), so nothing is kept until then: B writes it again in place.
    on_b(&|| {
        fs::OpenOptions::new()
            .write(true)
            .open(&pb)
            .and_then(|mut g| g.write_all(b"THIRD"))
    });
    assert_eq!(fs::read(&pa).expect("read"), b"THIRD", "B's write in place");
    let read_once = ost_reads(&c);
    assert_eq!(fs::read(&pa).expect("read"), b"THIRD");
    assert_eq!(ost_reads(&c), read_once, "kept again");

    // Truncated on B: A's next read is empty.
    on_b(&|| fs::OpenOptions::new().write(true).open(&pb)?.set_len(0));
    assert_eq!(fs::read(&pa).expect("read"), b"", "B's truncate");
}

/// A reader holding a file open whose attributes lock its mount let go unasked (the
/// lock LRU, `lru_size`) reads another client's later write, as when the lock is
/// called back: the pages that lock vouched for go with it.
#[test]
fn a_reader_whose_lock_left_the_lru_sees_another_clients_later_write() {
    use std::os::unix::fs::FileExt;
    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    let (pa, pb) = (a.path().join("f"), b.path().join("f"));
    // Made on B: A takes a lock for each when it looks them up.
    fs::create_dir(b.path().join("others")).expect("mkdir");
    for i in 0..64 {
        fs::write(b.path().join(format!("others/{i}")), b"x").expect("write");
    }
    // Made without a truncate, so that its size is exact on the MDT after the close
    // and A's lock vouches for its pages.
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&pb)
        .and_then(|mut g| g.write_all(b"first version"))
        .expect("write on B");
    closed_but(&c, 0);
    let f = fs::File::open(&pa).expect("open on A");
    let read_a = || {
        let mut buf = [0u8; 100];
        let n = f.read_at(&mut buf, 0).expect("read on A");
        buf[..n].to_vec()
    };
    assert_eq!(read_a(), b"first version");
    let once = ost_reads(&c);
    assert_eq!(read_a(), b"first version");
    assert_eq!(ost_reads(&c), once, "the second read from A's pages");
    // A's lock on f leaves its LRU as other files' locks come in.
    c.set_param("ldlm.namespaces.*-mdc-*.lru_size=8");
    for i in 0..64 {
        let _ = fs::metadata(a.path().join(format!("others/{i}"))).expect("stat");
    }
    fs::OpenOptions::new()
        .write(true)
        .open(&pb)
        .and_then(|mut g| g.write_all(b"FIRST VERSION"))
        .expect("write on B");
    assert_eq!(read_a(), b"FIRST VERSION", "A's open file after B's write");
}

/// A writer's close makes its client's copy of the size exact again, even when the
/// client wrote another file while the close was out: only a write to the same file
/// could have come after the attributes the MDT answered with. (Before, any write at
/// all meanwhile kept the copy glimpsing, and with two writers in one mount about
/// one file in ten went on asking the OSTs for its size, and read its bytes again.)
#[test]
fn a_close_while_the_client_writes_another_file_still_makes_the_size_exact() {
    let c = cluster(1);
    let a = c.client();
    // Locks come only once the callback channel, opened after the connect, is up.
    channel_up(&a);
    let cr = root();
    let open = |name: &[u8]| {
        let fh = a
            .run(
                a.client
                    .create_open(&cr, lode_base::Fid::ROOT, name, 0o644, libc::O_RDWR, None),
            )
            .expect("create");
        a.run(a.client.write(&fh, 0, &[7u8; 4096])).expect("write");
        // A stat, as a program's: the first write's layout change gave the
        // attributes lock back, and this takes one again.
        a.run(a.client.getattr(&cr, fh.fid)).expect("stat");
        fh
    };
    let (x, y) = (open(b"x"), open(b"y"));
    assert_ne!(a.client.attr_lock(x.fid), 0, "X's attributes under a lock");
    // X's close (by RPC: as its maker and only writer it would go ahead) waits on the
    // MDT before it runs; Y is written meanwhile.
    delay_next(&c, lode_proto::Opcode::Close, 500);
    std::thread::scope(|sc| {
        let closer = sc.spawn(|| a.run(a.client.close_now(&x)));
        std::thread::sleep(std::time::Duration::from_millis(200));
        a.run(a.client.write(&y, 4096, &[8u8; 4096]))
            .expect("write Y");
        closer.join().expect("closer").expect("close X");
    });
    assert_eq!(c.get_param("mdt.*.fail_loc"), "0x0", "the close waited");
    c.set_param("mdt.*.fail_opc=0");
    assert!(a.client.keeps_pages(x.fid), "X's size exact in the cache");
    assert!(
        !a.client.keeps_pages(y.fid),
        "Y, still open for writing, glimpses"
    );
    a.run(a.client.close(&y)).expect("close Y");
}

/// A reader holding a file open across an MDS restart reads another client's write
/// made after it: the mount's callback channel closed with the MDS, every lock it held
/// went, and the pages those locks vouched for went with them (before, the kernel kept
/// serving the pages read before the restart).
#[test]
fn a_reader_holding_a_file_open_across_an_mds_restart_sees_a_later_write() {
    use std::os::unix::fs::FileExt;
    let mut c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    let (pa, pb) = (a.path().join("f"), b.path().join("f"));
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&pb)
        .and_then(|mut g| g.write_all(&[b'a'; 8192]))
        .expect("write on B");
    closed_but(&c, 0);
    let f = fs::File::open(&pa).expect("open on A");
    let read_a = || {
        let mut buf = [0u8; 8];
        f.read_exact_at(&mut buf, 0).expect("read on A");
        buf
    };
    assert_eq!(read_a(), [b'a'; 8]);
    let once = ost_reads(&c);
    assert_eq!(read_a(), [b'a'; 8]);
    assert_eq!(ost_reads(&c), once, "the second read from A's pages");
    restart_mds(&mut c, &[]);
    wait_recovered(&c);
    fs::OpenOptions::new()
        .write(true)
        .open(&pb)
        .and_then(|mut g| g.write_all(&[b'B'; 8192]))
        .expect("write on B");
    assert_eq!(
        read_a(),
        [b'B'; 8],
        "A's open file after the restart and B's write"
    );
}

/// OST reads sent by every client of `c` so far (`osc.*.stats`).
fn ost_reads(c: &lode_testkit::Cluster) -> u64 {
    c.get_param("osc.*.stats")
        .lines()
        .filter(|l| l.split_whitespace().next() == Some("ost_read"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum::<u64>()
}

/// Opens `/name` read-only through native client `s`.
fn open_native(s: &lode_client::Session, name: &str) -> lode_client::FileHandle {
    let fid = s
        .run(s.client.resolve(&root(), &format!("/{name}"), false))
        .expect("resolve")
        .attr
        .fid;
    s.run(s.client.open(&root(), fid, libc::O_RDONLY))
        .expect("native open")
}

/// Waits until the MDT has no more than `n` open handles (the readers' own).
fn closed_but(c: &lode_testkit::Cluster, n: u64) {
    lode_testkit::wait_for(
        "the writer's close",
        std::time::Duration::from_secs(10),
        || {
            c.get_param("mdt.*.open_files")
                .parse::<u64>()
                .is_ok_and(|o| o <= n)
        },
    );
}

/// Appends to one file from two mounts and a native client at once each land whole,
/// once, and none overwrites another: the OST places an append of a one-object file
/// at the object's end under its lock (before, each client wrote at the end it had
/// just asked for, and about two records in five were overwritten).
#[test]
fn appends_from_several_clients_at_once_all_land_whole() {
    appends_land_whole(None);
}

/// The same for a Data-on-MDT file: the MDT places each append at the end of file
/// under the inode's lock.
#[test]
fn appends_to_a_dom_file_from_several_clients_at_once_all_land_whole() {
    appends_land_whole(Some(&["setstripe", "-E", "1M", "-L", "mdt"]));
}

/// The same for a file striped over two OSTs, which no one server can place an
/// append in: each append finds the end of file and writes there under the file's
/// append lock on the MDT (before, about one record in three was overwritten).
#[test]
fn appends_to_a_striped_file_from_several_clients_at_once_all_land_whole() {
    appends_land_whole(Some(&["setstripe", "-c", "2", "-S", "64K"]));
}

/// Two mounts and a native client append to one file (made by `setstripe`, if given,
/// else plainly) at once; every record lands whole, once, in each writer's order.
fn appends_land_whole(setstripe: Option<&[&str]>) {
    const PER_WRITER: usize = 400;
    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    let s = c.client();
    let record = |who: &str, i: usize| format!("{who}:{i:05}:{}\n", "x".repeat(40));
    let log = a.path().join("log");
    match setstripe {
        Some(args) => {
            let mut args = args.to_vec();
            let p = log.to_string_lossy().into_owned();
            args.push(&p);
            lode_ok(&c, &args);
        }
        None => fs::write(&log, b"").expect("create"),
    }
    std::thread::scope(|sc| {
        for (who, m) in [("a", &a), ("b", &b)] {
            let path = m.path().join("log");
            sc.spawn(move || {
                let mut f = fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .expect("open for appending");
                for i in 0..PER_WRITER {
                    f.write_all(record(who, i).as_bytes()).expect("append");
                }
            });
        }
        sc.spawn(|| {
            let r = root();
            let fid = s
                .run(s.client.lookup(&r, lode_base::Fid::ROOT, b"log"))
                .expect("lookup")
                .attr
                .fid;
            let h = s
                .run(s.client.open(&r, fid, libc::O_WRONLY | libc::O_APPEND))
                .expect("open");
            for i in 0..PER_WRITER {
                s.run(s.client.write(&h, 0, record("n", i).as_bytes()))
                    .expect("append");
            }
            s.run(s.client.close(&h)).expect("close");
        });
    });
    let text = fs::read_to_string(b.path().join("log")).expect("read");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3 * PER_WRITER, "every record, once");
    if setstripe.is_some_and(|a| a.contains(&"mdt")) {
        let o = lode_ok(&c, &["getstripe", &log.to_string_lossy()]);
        assert!(!o.contains("l_ost_idx"), "no OST object: {o}");
    }
    for who in ["a", "b", "n"] {
        let mine: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.starts_with(&format!("{who}:")))
            .collect();
        let want: Vec<String> = (0..PER_WRITER).map(|i| record(who, i)).collect();
        let want: Vec<&str> = want.iter().map(|l| l.trim_end()).collect();
        assert_eq!(mine, want, "{who}'s records, whole and in its order");
    }
}

#[test]
fn a_rename_onto_another_link_of_the_same_file_leaves_both_names_in_the_renamers_listing() {
    let c = cluster(1);
    let s = c.client();
    let cr = root();
    let mkdir = |parent, name: &[u8]| {
        s.run(s.client.mkdir(&cr, parent, name, 0o755, None))
            .expect("mkdir")
            .attr
            .fid
    };
    // Directories this client made, and so lists completely.
    let d = mkdir(lode_base::Fid::ROOT, b"d");
    let e = mkdir(lode_base::Fid::ROOT, b"e");
    let f = s
        .run(s.client.create(&cr, d, b"k", 0o644, None))
        .expect("create")
        .attr
        .fid;
    s.run(s.client.link(&cr, f, d, b"j")).expect("link");
    s.run(s.client.link(&cr, f, e, b"m")).expect("link");
    // POSIX: a rename onto another link of the same file does nothing. The kernel
    // never sends one, but a native client does.
    s.run(s.client.rename(&cr, d, b"k", d, b"j", 0))
        .expect("rename within one directory");
    s.run(s.client.rename(&cr, d, b"j", e, b"m", 0))
        .expect("rename between two");
    for (dir, name) in [(d, &b"k"[..]), (d, b"j"), (e, b"m")] {
        let b = s.run(s.client.lookup(&cr, dir, name));
        assert_eq!(
            b.map(|b| b.attr.fid),
            Ok(f),
            "{} still names the file",
            String::from_utf8_lossy(name)
        );
    }
    assert_eq!(s.run(s.client.getattr(&cr, f)).expect("getattr").nlink, 3);
}

#[test]
fn another_clients_create_while_a_link_waits_to_run_is_in_the_linkers_listing_after() {
    let c = cluster(1);
    let (a, b) = (c.client(), c.client());
    let cr = root();
    // A directory A made, and so lists completely under its lock.
    let d = a
        .run(a.client.mkdir(&cr, lode_base::Fid::ROOT, b"d", 0o755, None))
        .expect("mkdir")
        .attr
        .fid;
    let f = a
        .run(a.client.create(&cr, d, b"f", 0o644, None))
        .expect("create")
        .attr
        .fid;
    // A's link gives the directory's lock back and then waits on the MDT before it
    // runs; B's create in the directory, which nothing of A's holds up, runs then.
    delay_next(&c, lode_proto::Opcode::Link, 800);
    std::thread::scope(|sc| {
        let linker = sc.spawn(|| a.run(a.client.link(&cr, f, d, b"l")));
        std::thread::sleep(std::time::Duration::from_millis(300));
        b.run(b.client.create(&cr, d, b"x", 0o644, None))
            .expect("B's create");
        linker.join().expect("linker").expect("link");
    });
    assert_eq!(c.get_param("mdt.*.fail_loc"), "0x0", "the link waited");
    c.set_param("mdt.*.fail_opc=0");
    for name in [&b"f"[..], b"l", b"x"] {
        assert!(
            a.run(a.client.lookup(&cr, d, name)).is_ok(),
            "A finds {}",
            String::from_utf8_lossy(name)
        );
    }
}

#[test]
fn after_a_mount_exchanges_two_names_another_mounts_unlink_of_one_is_seen() {
    let c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    let d = a.path().join("d");
    fs::create_dir(&d).expect("mkdir");
    fs::write(d.join("p"), b"p").expect("p");
    fs::write(d.join("q"), b"qq").expect("q");
    // A's kernel knows both names (and B's, once it has looked).
    assert_eq!(fs::read(d.join("p")).expect("read p"), b"p");
    assert_eq!(fs::read(d.join("q")).expect("read q"), b"qq");
    let name = |n: &str| {
        std::ffi::CString::new(d.join(n).into_os_string().into_encoded_bytes()).expect("path")
    };
    let (p, q) = (name("p"), name("q"));
    // SAFETY: two valid C strings; renameat2 reads them only.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            p.as_ptr(),
            libc::AT_FDCWD,
            q.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(rc, 0, "exchange: {}", std::io::Error::last_os_error());
    assert_eq!(fs::read(d.join("p")).expect("read p"), b"qq");
    assert_eq!(fs::read(d.join("q")).expect("read q"), b"p");
    // B removes both and makes p anew; A, which holds no lock on either name since
    // the exchange, must not keep either.
    for n in ["p", "q"] {
        fs::remove_file(b.path().join("d").join(n)).expect("B's unlink");
    }
    fs::write(b.path().join("d").join("p"), b"new").expect("B's new p");
    assert_eq!(fs::read(d.join("p")).expect("A reads p"), b"new");
    assert!(gone(&d.join("q")), "q is gone for A too");
}
