//! Namespace behaviour through the client library against real servers.

mod common;

use common::*;
use futures::StreamExt;
use lode_base::hash::END_COOKIE;
use lode_base::{Errno, Fid};
use std::collections::{HashMap, HashSet};

/// `n` empty files `{prefix}00000`… in `dir`, created 64 at a time.
async fn create_many(cl: &lode_client::Client, dir: Fid, prefix: &str, n: u32) {
    futures::stream::iter(0..n)
        .map(|i| async move {
            let name = format!("{prefix}{i:05}");
            cl.create(&root(), dir, name.as_bytes(), 0o644, None).await
        })
        .buffer_unordered(64)
        .for_each(|r| async {
            r.expect("create");
        })
        .await;
}

#[test]
fn a_directory_of_40000_entries_is_listed_in_ranges_side_by_side_each_entry_once_in_order() {
    let c = cluster(2);
    let s = c.client();
    let cl = s.client.clone();
    s.run(async {
        let dir = mkdir_p(&cl, "/big").await;
        create_many(&cl, dir, "e", 40_000).await;
        // About 40 pages: read as four hash ranges at once.
        let first = cl.readdir(&root(), dir, 0, false).await.expect("readdir");
        assert!(
            first.next < END_COOKIE / 16,
            "the first page covers a sliver"
        );
        let before = cl.mdc().stats().count(lode_proto::Opcode::Readdir);
        let all = cl.readdir_all(&root(), dir, false).await.expect("readdir");
        let pages = cl.mdc().stats().count(lode_proto::Opcode::Readdir) - before;
        assert_eq!(all.len(), 40_002, "40,000 entries plus . and ..");
        let names: HashSet<Vec<u8>> = all.iter().map(|e| e.name.clone()).collect();
        assert_eq!(names.len(), 40_002, "no entry listed twice");
        assert!(
            all.windows(2).all(|w| w[0].cookie <= w[1].cookie),
            "listed in cookie order, as page after page would"
        );
        // Each range's last page reaches into the next range: a few pages more than
        // reading them one after another, never many.
        assert!((40..=50).contains(&pages), "{pages} readdir RPCs");
    });
}

#[test]
fn tree_of_10000_entries_lists_renames_links_and_unlinks() {
    let c = cluster(2);
    let s = c.client();
    let cl = s.client.clone();
    s.run(async {
        let dir = mkdir_p(&cl, "/tree").await;
        create_many(&cl, dir, "f", 10_000).await;
        let all = cl.readdir_all(&root(), dir, false).await.expect("readdir");
        assert_eq!(all.len(), 10_002, "10,000 entries plus . and ..");
        let names: HashSet<Vec<u8>> = all.iter().map(|e| e.name.clone()).collect();
        assert_eq!(names.len(), 10_002, "no entry listed twice");
        assert!(names.contains(b"f00000".as_slice()) && names.contains(b"f09999".as_slice()));
    });

    // List page by page while another task deletes f0xxxx and creates new names:
    // every entry that exists throughout (f01000..f09999) is listed exactly once.
    let dir = fid(&s, "/tree").unwrap();
    let churn = {
        let cl = cl.clone();
        s.handle().spawn(async move {
            for i in 0..1000 {
                cl.unlink(&root(), dir, format!("f{i:05}").as_bytes())
                    .await
                    .expect("unlink");
                cl.create(&root(), dir, format!("n{i:05}").as_bytes(), 0o644, None)
                    .await
                    .expect("create");
            }
        })
    };
    let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut cookie = 0;
    let mut pages = 0;
    loop {
        let page = s
            .run(cl.readdir(&root(), dir, cookie, false))
            .expect("readdir page");
        pages += 1;
        for e in page.entries {
            *seen.entry(e.name).or_insert(0) += 1;
        }
        if page.next == END_COOKIE {
            break;
        }
        cookie = page.next;
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    s.run(churn).expect("churn task");
    assert!(pages > 5, "the listing spanned several pages ({pages})");
    for i in 1000..10_000 {
        assert_eq!(
            seen.get(format!("f{i:05}").as_bytes()),
            Some(&1),
            "f{i:05} listed exactly once"
        );
    }
    assert!(seen.values().all(|n| *n == 1), "no name repeated");

    s.run(async {
        // Rename half into a second directory, hard-link a few, then unlink everything.
        let d2 = mkdir_p(&cl, "/tree2").await;
        for i in 1000..6000 {
            let n = format!("f{i:05}");
            cl.rename(&root(), dir, n.as_bytes(), d2, n.as_bytes(), 0)
                .await
                .expect("rename");
        }
        for i in 6000..6100 {
            let n = format!("f{i:05}");
            let b = cl.lookup(&root(), dir, n.as_bytes()).await.unwrap();
            let l = cl
                .link(&root(), b.attr.fid, d2, format!("l{i}").as_bytes())
                .await
                .expect("link");
            assert_eq!(l.attr.nlink, 2);
        }
        assert_eq!(
            cl.readdir_all(&root(), d2, false).await.unwrap().len(),
            5000 + 100 + 2
        );
        assert_eq!(
            cl.readdir_all(&root(), dir, false).await.unwrap().len(),
            4000 + 1000 + 2
        );
        for d in [dir, d2] {
            let names: Vec<Vec<u8>> = cl
                .readdir_all(&root(), d, false)
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.name)
                .filter(|n| n != b"." && n != b"..")
                .collect();
            for n in names {
                cl.unlink(&root(), d, &n).await.expect("unlink");
            }
        }
        assert_eq!(cl.readdir_all(&root(), dir, false).await.unwrap().len(), 2);
        cl.rmdir(&root(), Fid::ROOT, b"tree")
            .await
            .expect("rmdir empty");
        cl.rmdir(&root(), Fid::ROOT, b"tree2")
            .await
            .expect("rmdir empty");
        let rootattr = cl.getattr(&root(), Fid::ROOT).await.unwrap();
        assert_eq!(rootattr.nlink, 2, "root lost its two subdirectories");
    });
}

#[test]
fn unlinked_open_file_stays_readable_until_close() {
    let c = cluster(2);
    let s = c.client();
    let cl = &s.client;
    let file = s.run(async {
        let fh = cl
            .create_open(&root(), Fid::ROOT, b"tmp", 0o644, libc::O_RDWR, None)
            .await
            .unwrap();
        cl.write(&fh, 0, b"still here").await.unwrap();
        cl.unlink(&root(), Fid::ROOT, b"tmp").await.unwrap();
        assert_eq!(
            cl.lookup(&root(), Fid::ROOT, b"tmp").await.unwrap_err(),
            Errno::ENOENT
        );
        assert_eq!(cl.read(&fh, 0, 100).await.unwrap(), b"still here");
        let a = cl.getattr(&root(), fh.fid).await.unwrap();
        assert_eq!((a.nlink, a.size), (0, 10));
        cl.close(&fh).await.unwrap();
        assert_eq!(
            cl.getattr(&root(), fh.fid).await.unwrap_err(),
            Errno::ENOENT
        );
        fh.fid
    });
    // The OST objects go once the unlink is committed.
    let fh_seq = format!("{:x}", file.seq);
    lode_testkit::wait_for(
        "objects destroyed",
        std::time::Duration::from_secs(20),
        || {
            (0..2).all(|i| {
                let d = c.target_dir(&format!("ost{i}")).join("O").join(&fh_seq);
                walk_files(&d) == 0
            })
        },
    );
}

#[test]
fn dot_dot_finds_the_parent_and_a_removed_directory_held_open_lists_nothing() {
    let c = cluster(2);
    let s = c.client();
    let cl = &s.client;
    let d = s.run(async {
        let d = mkdir_p(cl, "/d").await;
        // `..` of a directory this client made (and so lists itself, every name in
        // it known): the parent, not "no such name".
        let up = cl.lookup(&root(), d, b"..").await.expect("lookup ..");
        assert_eq!(up.attr.fid, Fid::ROOT);
        assert_eq!(cl.lookup(&root(), d, b".").await.map(|b| b.attr.fid), Ok(d));
        let fh = cl
            .open(&root(), d, libc::O_RDONLY | libc::O_DIRECTORY)
            .await
            .expect("open");
        cl.rmdir(&root(), Fid::ROOT, b"d").await.expect("rmdir");
        let a = cl
            .getattr(&root(), d)
            .await
            .expect("still there while open");
        assert_eq!(a.nlink, 0);
        // Not even `.` and `..`: a removed directory lists as empty (Lustre's dead
        // directory).
        assert_eq!(cl.readdir_all(&root(), d, true).await, Ok(Vec::new()));
        cl.close_now(&fh).await.expect("close");
        d
    });
    assert_eq!(c.get_param("mdt.*.open_files"), "0");
    // Gone with its last close (asked by a client with nothing cached).
    let other = c.client();
    assert_eq!(
        other.run(other.client.getattr(&root(), d)).unwrap_err(),
        Errno::ENOENT
    );
}

fn walk_files(d: &std::path::Path) -> usize {
    let Ok(rd) = std::fs::read_dir(d) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .map(|e| {
            if e.path().is_dir() {
                walk_files(&e.path())
            } else {
                1
            }
        })
        .sum()
}

#[test]
fn concurrent_creates_in_one_directory_from_many_threads() {
    let c = cluster(1);
    let s = c.client();
    let dir = s.run(mkdir_p(&s.client, "/shared"));
    std::thread::scope(|sc| {
        for t in 0..8 {
            let s = &s;
            sc.spawn(move || {
                for i in 0..300 {
                    s.run(s.client.create(
                        &root(),
                        dir,
                        format!("t{t}-{i}").as_bytes(),
                        0o644,
                        None,
                    ))
                    .expect("create");
                }
            });
        }
    });
    let n = s.run(s.client.readdir_all(&root(), dir, true)).unwrap();
    assert_eq!(n.len(), 8 * 300 + 2);
    assert!(
        n.iter().all(|e| e.body.is_some()),
        "readdir+ returns attributes"
    );
}

#[test]
fn birth_times_are_kept_by_the_mdt_and_a_nobtime_mount_reports_none() {
    let mut c = cluster(1);
    let s = c.client();
    let cl = s.client.clone();
    let (f, born) = s.run(async {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        let f = cl
            .create(&root(), Fid::ROOT, b"f", 0o644, None)
            .await
            .unwrap();
        let a = cl.getattr(&root(), f.attr.fid).await.unwrap();
        assert!(
            a.btime >= before && a.btime == a.ctime,
            "born at its creation"
        );
        let sa = lode_base::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        let b = cl.setattr(&root(), a.fid, sa).await.unwrap();
        assert!(b.attr.ctime >= a.ctime);
        assert_eq!(b.attr.btime, a.btime, "a chmod keeps it");
        // Committed: an MDS crash keeps it with the inode. (A create replayed after
        // a crash takes the time of its replay, as Lustre's crtime does.)
        cl.sync().await.unwrap();
        (a.fid, a.btime)
    });
    restart_mds(&mut c, &[]);
    s.run(async {
        assert_eq!(cl.getattr(&root(), f).await.unwrap().btime, born);
    });
    let m = c.mount();
    let t = std::fs::metadata(m.path().join("f"))
        .unwrap()
        .created()
        .unwrap();
    assert_eq!(
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos(),
        born as u128
    );
    let n = c.mount_with(&["nobtime"]);
    let md = std::fs::metadata(n.path().join("f")).unwrap();
    assert!(md.created().is_err(), "nobtime: no birth time");
    assert_eq!(std::os::unix::fs::MetadataExt::mode(&md) & 0o777, 0o600);
}

#[test]
fn only_root_sets_inode_flags_and_the_mdt_holds_an_immutable_file_for_native_clients() {
    let c = cluster(1);
    let s = c.client();
    let cl = s.client.clone();
    s.run(async {
        let user = user();
        let f = cl
            .create(&root(), Fid::ROOT, b"f", 0o666, None)
            .await
            .unwrap();
        let fid = f.attr.fid;
        let flags = |v| lode_base::SetAttr {
            flags: Some(v),
            ..Default::default()
        };
        let immutable = lode_base::perm::FS_IMMUTABLE_FL;
        assert_eq!(
            cl.setattr(&user, fid, flags(0)).await.unwrap_err(),
            Errno::EPERM
        );
        // Its owner may set the flags but not change one lode keeps (that takes
        // CAP_LINUX_IMMUTABLE).
        let chown = lode_base::SetAttr {
            uid: Some(user.uid),
            ..Default::default()
        };
        cl.setattr(&root(), fid, chown).await.unwrap();
        cl.setattr(&user, fid, flags(0)).await.unwrap();
        assert_eq!(
            cl.setattr(&user, fid, flags(immutable)).await.unwrap_err(),
            Errno::EPERM
        );
        assert_eq!(
            cl.setattr(&root(), fid, flags(0x40)).await.unwrap_err(),
            Errno::EOPNOTSUPP
        );
        let b = cl.setattr(&root(), fid, flags(immutable)).await.unwrap();
        assert_eq!(b.attr.flags, immutable);
        assert_eq!(cl.getattr(&root(), fid).await.unwrap().flags, immutable);
        // Root too is held by it, whatever the mode bits allow.
        assert_eq!(
            cl.open(&root(), fid, libc::O_WRONLY).await.unwrap_err(),
            Errno::EPERM
        );
        assert_eq!(
            cl.unlink(&root(), Fid::ROOT, b"f").await.unwrap_err(),
            Errno::EPERM
        );
        let h = cl.open(&user, fid, libc::O_RDONLY).await.unwrap();
        cl.close(&h).await.unwrap();
        cl.setattr(&root(), fid, flags(0)).await.unwrap();
        cl.unlink(&root(), Fid::ROOT, b"f").await.unwrap();
    });
}

#[test]
fn a_writeback_mount_appends_to_an_append_only_file_and_closes_it() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let c = cluster(1);
    let m = c.mount_with(&["writeback"]);
    let p = m.path().join("log");
    std::fs::write(&p, b"one\n").unwrap();
    let f = std::fs::File::open(&p).unwrap();
    let append_only: libc::c_int = 0x20; // FS_APPEND_FL
                                         // SAFETY: the kernel reads one int.
    assert_eq!(
        unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &append_only) },
        0
    );
    drop(f);
    // The MDT sees the O_APPEND the kernel keeps to itself, and takes the times the
    // kernel sends for the writer at close.
    let mut log = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    log.write_all(b"two\n").unwrap();
    log.sync_all().unwrap();
    drop(log);
    assert_eq!(std::fs::read(&p).unwrap(), b"one\ntwo\n");
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
}
