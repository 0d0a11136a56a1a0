//! Every errno case of the MDT's POSIX rules, through the client library.

mod common;

use common::*;
use lode_base::{Cred, Errno, Fid, SetAttr, TimeSet};

fn err<T: std::fmt::Debug>(r: Result<T, Errno>) -> Errno {
    r.expect_err("expected an error")
}

#[test]
fn namespace_errnos() {
    let c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    s.run(async {
        let d = cl
            .mkdir(&r, Fid::ROOT, b"d", 0o755, None)
            .await
            .unwrap()
            .attr
            .fid;
        let f = cl.create(&r, d, b"f", 0o644, None).await.unwrap().attr.fid;
        assert_eq!(err(cl.lookup(&r, d, b"missing").await), Errno::ENOENT);
        assert_eq!(
            err(cl.create(&r, d, b"f", 0o644, None).await),
            Errno::EEXIST
        );
        assert_eq!(err(cl.mkdir(&r, d, b"f", 0o755, None).await), Errno::EEXIST);
        assert_eq!(err(cl.lookup(&r, f, b"x").await), Errno::ENOTDIR);
        assert_eq!(
            err(cl.create(&r, f, b"x", 0o644, None).await),
            Errno::ENOTDIR
        );
        assert_eq!(err(cl.resolve(&r, "/d/f/x", false).await), Errno::ENOTDIR);
        assert_eq!(err(cl.unlink(&r, Fid::ROOT, b"d").await), Errno::EISDIR);
        assert_eq!(err(cl.rmdir(&r, d, b"f").await), Errno::ENOTDIR);
        assert_eq!(err(cl.rmdir(&r, Fid::ROOT, b"d").await), Errno::ENOTEMPTY);
        assert_eq!(err(cl.rmdir(&r, d, b".").await), Errno::EINVAL);
        assert_eq!(err(cl.rmdir(&r, d, b"..").await), Errno::ENOTEMPTY);
        // Names: 255 bytes is fine, 256 is too long; '/' and NUL are invalid.
        let long = vec![b'a'; 255];
        cl.create(&r, d, &long, 0o644, None).await.unwrap();
        assert_eq!(
            err(cl.create(&r, d, &[b'a'; 256], 0o644, None).await),
            Errno::ENAMETOOLONG
        );
        assert_eq!(
            err(cl.lookup(&r, d, &[b'b'; 256]).await),
            Errno::ENAMETOOLONG
        );
        assert_eq!(
            err(cl.create(&r, d, b"a/b", 0o644, None).await),
            Errno::EINVAL
        );
        assert_eq!(
            err(cl.create(&r, d, b"a\0b", 0o644, None).await),
            Errno::EINVAL
        );
        assert_eq!(
            err(cl
                .resolve(&r, &format!("/{}", "x/".repeat(2100)), false)
                .await),
            Errno::ENAMETOOLONG
        );
        // Links.
        assert_eq!(
            err(cl.link(&r, d, Fid::ROOT, b"dirlink").await),
            Errno::EPERM
        );
        assert_eq!(err(cl.link(&r, f, d, b"f").await), Errno::EEXIST);
        // Symlinks.
        cl.symlink(&r, d, b"sl", b"f").await.unwrap();
        let sl = cl.resolve(&r, "/d/sl", false).await.unwrap();
        assert_eq!(cl.readlink(&r, sl.attr.fid).await.unwrap(), b"f");
        assert_eq!(cl.resolve(&r, "/d/sl", true).await.unwrap().attr.fid, f);
        assert_eq!(err(cl.readlink(&r, f).await), Errno::EINVAL);
        assert_eq!(err(cl.symlink(&r, d, b"empty", b"").await), Errno::ENOENT);
        cl.symlink(&r, d, b"loop", b"loop").await.unwrap();
        assert_eq!(err(cl.resolve(&r, "/d/loop", true).await), Errno::ELOOP);
        // Open.
        assert_eq!(err(cl.open(&r, d, libc::O_WRONLY).await), Errno::EISDIR);
        assert_eq!(err(cl.open(&r, f, libc::O_DIRECTORY).await), Errno::ENOTDIR);
        assert_eq!(
            err(cl.open(&r, sl.attr.fid, libc::O_RDONLY).await),
            Errno::ELOOP
        );
        assert_eq!(
            err(cl
                .create_open(&r, d, b"f", 0o644, libc::O_RDWR | libc::O_EXCL, None)
                .await),
            Errno::EEXIST
        );
        let fh = cl
            .create_open(&r, d, b"f", 0o644, libc::O_RDWR, None)
            .await
            .expect("open existing");
        assert_eq!(fh.fid, f);
        cl.close_now(&fh).await.unwrap();
        assert_eq!(err(cl.close_now(&fh).await), Errno::EBADF);
        // Setattr.
        assert_eq!(
            err(cl
                .setattr(
                    &r,
                    d,
                    SetAttr {
                        size: Some(0),
                        ..Default::default()
                    }
                )
                .await),
            Errno::EISDIR
        );
        // Nodes: only root makes devices.
        cl.mknod(&r, d, b"fifo", libc::S_IFIFO | 0o644, 0)
            .await
            .unwrap();
        cl.mknod(&r, d, b"sock", libc::S_IFSOCK | 0o644, 0)
            .await
            .unwrap();
        let dev = cl
            .mknod(&r, d, b"null", libc::S_IFCHR | 0o666, 0x0103)
            .await
            .unwrap();
        assert_eq!(dev.attr.rdev, 0x0103);
        assert_eq!(
            err(cl.mknod(&user(), d, b"x", libc::S_IFBLK | 0o600, 1).await),
            Errno::EACCES
        );
        let open = cl
            .mkdir(&r, Fid::ROOT, b"open", 0o777, None)
            .await
            .unwrap()
            .attr
            .fid;
        assert_eq!(
            err(cl
                .mknod(&user(), open, b"x", libc::S_IFBLK | 0o600, 1)
                .await),
            Errno::EPERM
        );
    });
}

#[test]
fn rename_errnos_and_cases() {
    let c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    s.run(async {
        let a = cl
            .mkdir(&r, Fid::ROOT, b"a", 0o755, None)
            .await
            .unwrap()
            .attr
            .fid;
        let b = cl.mkdir(&r, a, b"b", 0o755, None).await.unwrap().attr.fid;
        let e = cl
            .mkdir(&r, Fid::ROOT, b"e", 0o755, None)
            .await
            .unwrap()
            .attr
            .fid;
        cl.create(&r, e, b"inside", 0o644, None).await.unwrap();
        let f1 = cl
            .create(&r, Fid::ROOT, b"f1", 0o644, None)
            .await
            .unwrap()
            .attr
            .fid;
        let f2 = cl
            .create(&r, Fid::ROOT, b"f2", 0o644, None)
            .await
            .unwrap()
            .attr
            .fid;
        // Never a directory into its own subtree.
        assert_eq!(
            err(cl.rename(&r, Fid::ROOT, b"a", b, b"x", 0).await),
            Errno::EINVAL
        );
        assert_eq!(
            err(cl.rename(&r, Fid::ROOT, b"a", a, b"x", 0).await),
            Errno::EINVAL
        );
        // File over file replaces it.
        cl.rename(&r, Fid::ROOT, b"f1", Fid::ROOT, b"f2", 0)
            .await
            .unwrap();
        assert_eq!(cl.lookup(&r, Fid::ROOT, b"f2").await.unwrap().attr.fid, f1);
        assert_eq!(err(cl.getattr(&r, f2).await), Errno::ENOENT);
        // Directory over non-empty directory, file over directory, directory over file.
        assert_eq!(
            err(cl.rename(&r, a, b"b", Fid::ROOT, b"e", 0).await),
            Errno::ENOTEMPTY
        );
        assert_eq!(
            err(cl.rename(&r, Fid::ROOT, b"f2", Fid::ROOT, b"a", 0).await),
            Errno::EISDIR
        );
        assert_eq!(
            err(cl.rename(&r, Fid::ROOT, b"a", Fid::ROOT, b"f2", 0).await),
            Errno::ENOTDIR
        );
        // Directory over an empty directory; parents' link counts follow.
        let empty = cl
            .mkdir(&r, Fid::ROOT, b"empty", 0o755, None)
            .await
            .unwrap()
            .attr
            .fid;
        cl.rename(&r, a, b"b", Fid::ROOT, b"empty", 0)
            .await
            .unwrap();
        assert_eq!(err(cl.getattr(&r, empty).await), Errno::ENOENT);
        assert_eq!(cl.getattr(&r, a).await.unwrap().nlink, 2);
        assert_eq!(cl.lookup(&r, b, b"..").await.unwrap().attr.fid, Fid::ROOT);
        // RENAME_NOREPLACE and RENAME_EXCHANGE.
        assert_eq!(
            err(cl.rename(&r, Fid::ROOT, b"f2", Fid::ROOT, b"e", 1).await),
            Errno::EEXIST
        );
        assert_eq!(
            err(cl
                .rename(&r, Fid::ROOT, b"f2", Fid::ROOT, b"nothere", 2)
                .await),
            Errno::ENOENT
        );
        assert_eq!(
            err(cl.rename(&r, Fid::ROOT, b"f2", Fid::ROOT, b"e", 3).await),
            Errno::EINVAL
        );
        cl.rename(&r, Fid::ROOT, b"f2", Fid::ROOT, b"e", 2)
            .await
            .unwrap();
        assert_eq!(cl.lookup(&r, Fid::ROOT, b"e").await.unwrap().attr.fid, f1);
        assert_eq!(cl.lookup(&r, Fid::ROOT, b"f2").await.unwrap().attr.fid, e);
        assert_eq!(
            err(cl
                .rename(&r, Fid::ROOT, b"missing", Fid::ROOT, b"x", 0)
                .await),
            Errno::ENOENT
        );
        assert_eq!(
            err(cl.rename(&r, Fid::ROOT, b".", Fid::ROOT, b"x", 0).await),
            Errno::EBUSY
        );
    });
}

#[test]
fn permission_errnos_for_a_non_root_user() {
    let c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    let u = user();
    let other = Cred {
        uid: 2000,
        gid: 2000,
        groups: vec![],
    };
    s.run(async {
        let d = cl
            .mkdir(&r, Fid::ROOT, b"rootonly", 0o755, None)
            .await
            .unwrap()
            .attr
            .fid;
        assert_eq!(
            err(cl.create(&u, d, b"x", 0o644, None).await),
            Errno::EACCES
        );
        let locked = cl
            .mkdir(&r, Fid::ROOT, b"locked", 0o700, None)
            .await
            .unwrap()
            .attr
            .fid;
        cl.create(&r, locked, b"secret", 0o644, None).await.unwrap();
        assert_eq!(err(cl.lookup(&u, locked, b"secret").await), Errno::EACCES);
        assert_eq!(
            err(cl.resolve(&u, "/locked/secret", false).await),
            Errno::EACCES
        );
        assert_eq!(err(cl.readdir(&u, locked, 0, false).await), Errno::EACCES);
        // Sticky /tmp-like directory: others' entries cannot be removed or renamed.
        let tmp = cl
            .mkdir(&r, Fid::ROOT, b"tmp", 0o1777, None)
            .await
            .unwrap()
            .attr
            .fid;
        let mine = cl.create(&u, tmp, b"mine", 0o644, None).await.unwrap();
        assert_eq!(mine.attr.uid, 1000);
        assert_eq!(err(cl.unlink(&other, tmp, b"mine").await), Errno::EPERM);
        assert_eq!(
            err(cl.rename(&other, tmp, b"mine", tmp, b"stolen", 0).await),
            Errno::EPERM
        );
        cl.unlink(&u, tmp, b"mine").await.unwrap();
        // Files of another user: chmod, chown, explicit times, writes are refused.
        let f = cl
            .create(&u, tmp, b"f", 0o644, None)
            .await
            .unwrap()
            .attr
            .fid;
        assert_eq!(
            err(cl
                .setattr(
                    &other,
                    f,
                    SetAttr {
                        mode: Some(0o777),
                        ..Default::default()
                    }
                )
                .await),
            Errno::EPERM
        );
        assert_eq!(
            err(cl
                .setattr(
                    &u,
                    f,
                    SetAttr {
                        uid: Some(0),
                        ..Default::default()
                    }
                )
                .await),
            Errno::EPERM
        );
        assert_eq!(
            err(cl
                .setattr(
                    &u,
                    f,
                    SetAttr {
                        gid: Some(5),
                        ..Default::default()
                    }
                )
                .await),
            Errno::EPERM
        );
        let member = Cred {
            uid: 1000,
            gid: 1000,
            groups: vec![5],
        };
        cl.setattr(
            &member,
            f,
            SetAttr {
                gid: Some(5),
                ..Default::default()
            },
        )
        .await
        .expect("chgrp to own group");
        assert_eq!(
            err(cl
                .setattr(
                    &other,
                    f,
                    SetAttr {
                        mtime: Some(TimeSet::At(1)),
                        ..Default::default()
                    }
                )
                .await),
            Errno::EPERM
        );
        assert_eq!(
            err(cl
                .setattr(
                    &other,
                    f,
                    SetAttr {
                        mtime: Some(TimeSet::Now),
                        ..Default::default()
                    }
                )
                .await),
            Errno::EACCES
        );
        assert_eq!(err(cl.open(&other, f, libc::O_WRONLY).await), Errno::EACCES);
        assert_eq!(
            err(cl
                .setattr(
                    &other,
                    f,
                    SetAttr {
                        size: Some(0),
                        ..Default::default()
                    }
                )
                .await),
            Errno::EACCES
        );
        // chown/chgrp by a non-owner fail even when nothing would change (Linux's
        // chown_ok/chgrp_ok); the owner may "change" its own uid and the file's group.
        let fg = cl.getattr_md(&u, f).await.unwrap().attr.gid;
        for sa in [
            SetAttr {
                uid: Some(1000),
                ..Default::default()
            },
            SetAttr {
                gid: Some(fg),
                ..Default::default()
            },
        ] {
            assert_eq!(
                err(cl.setattr(&other, f, sa.clone()).await),
                Errno::EPERM,
                "non-owner no-op chown {sa:?}"
            );
            cl.setattr(&u, f, sa)
                .await
                .expect("the owner's no-op chown");
        }
        // setgid is dropped when a non-member sets it; chown clears setuid.
        let g = cl
            .setattr(
                &u,
                f,
                SetAttr {
                    mode: Some(0o2755),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            g.attr.mode & 0o7777,
            0o755,
            "setgid cleared for a non-member of group 5"
        );
        let su = cl
            .setattr(
                &r,
                f,
                SetAttr {
                    mode: Some(0o4755),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(su.attr.mode & 0o7777, 0o4755);
        let ch = cl
            .setattr(
                &r,
                f,
                SetAttr {
                    uid: Some(2000),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(ch.attr.mode & 0o7777, 0o755, "chown clears setuid");
        // A setgid directory passes its group down.
        let sg = cl.mkdir(&r, Fid::ROOT, b"sg", 0o2777, None).await.unwrap();
        let sgc = cl
            .setattr(
                &r,
                sg.attr.fid,
                SetAttr {
                    gid: Some(77),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            sgc.attr.mode & 0o7000,
            0o2000,
            "chown keeps a directory's set-group-ID bit"
        );
        let inner = cl
            .mkdir(&u, sg.attr.fid, b"inner", 0o755, None)
            .await
            .unwrap();
        assert_eq!(inner.attr.gid, 77);
        assert_ne!(inner.attr.mode & libc::S_ISGID, 0);
    });
}

#[test]
fn xattr_errnos() {
    let c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    let u = user();
    s.run(async {
        let f = cl.create(&u, Fid::ROOT, b"x", 0o644, None).await;
        assert_eq!(f.unwrap_err(), Errno::EACCES);
        let tmp = cl
            .mkdir(&r, Fid::ROOT, b"tmp", 0o777, None)
            .await
            .unwrap()
            .attr
            .fid;
        let f = cl
            .create(&u, tmp, b"x", 0o644, None)
            .await
            .unwrap()
            .attr
            .fid;
        cl.setxattr(&u, f, b"user.k", Some(b"v"), 0).await.unwrap();
        assert_eq!(cl.getxattr(&u, f, b"user.k", 0).await.unwrap().1, 1);
        assert_eq!(cl.getxattr(&u, f, b"user.k", 10).await.unwrap().0, b"v");
        cl.setxattr(&u, f, b"user.long", Some(b"0123456789"), 0)
            .await
            .unwrap();
        assert_eq!(
            err(cl.getxattr(&u, f, b"user.long", 3).await),
            Errno::ERANGE
        );
        assert_eq!(
            err(cl.getxattr(&u, f, b"user.none", 10).await),
            Errno::ENODATA
        );
        assert_eq!(
            err(cl.setxattr(&u, f, b"user.k", Some(b"w"), 1).await),
            Errno::EEXIST
        );
        assert_eq!(
            err(cl.setxattr(&u, f, b"user.none", Some(b"w"), 2).await),
            Errno::ENODATA
        );
        assert_eq!(
            err(cl.setxattr(&u, f, b"user.none", None, 0).await),
            Errno::ENODATA
        );
        assert_eq!(
            err(cl
                .setxattr(&u, f, b"user.big", Some(&vec![0u8; 65537]), 0)
                .await),
            Errno::E2BIG
        );
        cl.setxattr(&u, f, b"user.max", Some(&vec![0u8; 65536]), 0)
            .await
            .unwrap();
        assert_eq!(
            err(cl.setxattr(&u, f, &[b'u'; 256], Some(b"v"), 0).await),
            Errno::ERANGE
        );
        assert_eq!(
            err(cl.setxattr(&u, f, b"trusted.k", Some(b"v"), 0).await),
            Errno::EPERM
        );
        // A malformed ACL; another system.* name.
        assert_eq!(
            err(cl
                .setxattr(&u, f, b"system.posix_acl_access", Some(b"v"), 0)
                .await),
            Errno::EINVAL
        );
        assert_eq!(
            err(cl.setxattr(&u, f, b"system.other", Some(b"v"), 0).await),
            Errno::EOPNOTSUPP
        );
        cl.setxattr(&r, f, b"trusted.k", Some(b"t"), 0)
            .await
            .unwrap();
        assert_eq!(
            err(cl.getxattr(&u, f, b"trusted.k", 10).await),
            Errno::ENODATA
        );
        let other = Cred {
            uid: 2000,
            gid: 2000,
            groups: vec![],
        };
        assert_eq!(
            err(cl.setxattr(&other, f, b"user.k", Some(b"w"), 0).await),
            Errno::EACCES
        );
        let (names, _) = cl.listxattr(&u, f, 4096).await.unwrap();
        let names: Vec<&[u8]> = names.split(|b| *b == 0).filter(|n| !n.is_empty()).collect();
        assert!(names.contains(&&b"user.k"[..]) && !names.contains(&&b"trusted.k"[..]));
        assert_eq!(err(cl.listxattr(&u, f, 2).await), Errno::ERANGE);
        let (rootnames, _) = cl.listxattr(&r, f, 4096).await.unwrap();
        assert!(rootnames.windows(9).any(|w| w == b"trusted.k"));
        cl.setxattr(&u, f, b"user.k", None, 0).await.unwrap();
        assert_eq!(err(cl.getxattr(&u, f, b"user.k", 10).await), Errno::ENODATA);
        let sl = cl.symlink(&u, tmp, b"sl", b"x").await.unwrap().attr.fid;
        assert_eq!(
            err(cl.setxattr(&u, sl, b"user.k", Some(b"v"), 0).await),
            Errno::EPERM
        );
    });
}

#[test]
fn a_directory_holds_more_subdirectories_than_link_max_and_then_shows_one_link() {
    // As ext4 and Lustre's ldiskfs MDTs with `dir_nlink`: mkdir past 65,000
    // subdirectories succeeds (mdtest makes 100,000s in one directory), and the
    // directory's link count reads 1 ("not counted") while it is past the bound.
    let c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    s.run(async {
        use futures::StreamExt;
        let top = cl
            .mkdir(&r, Fid::ROOT, b"wide", 0o755, None)
            .await
            .unwrap()
            .attr
            .fid;
        let other = cl
            .mkdir(&r, Fid::ROOT, b"other", 0o755, None)
            .await
            .unwrap()
            .attr
            .fid;
        let n = lode_base::limits::LINK_MAX; // 2 + n - 1 = LINK_MAX + 1 links at the end
        futures::stream::iter(0..n - 1)
            .map(|i| {
                let r = &r;
                async move {
                    cl.mkdir(r, top, format!("d{i}").as_bytes(), 0o755, None)
                        .await
                }
            })
            .buffer_unordered(32)
            .for_each(|x| async {
                x.expect("mkdir");
            })
            .await;
        assert_eq!(cl.getattr(&r, top).await.unwrap().nlink, 1);
        // A directory moved in from elsewhere counts too, and moved back out.
        cl.mkdir(&r, other, b"m", 0o755, None).await.unwrap();
        cl.rename(&r, other, b"m", top, b"m", 0).await.unwrap();
        assert_eq!(cl.getattr(&r, other).await.unwrap().nlink, 2);
        assert_eq!(cl.getattr(&r, top).await.unwrap().nlink, 1);
        cl.rename(&r, top, b"m", other, b"m", 0).await.unwrap();
        assert_eq!(cl.getattr(&r, other).await.unwrap().nlink, 3);
        // The exact count is kept: below the bound again, it shows again.
        for i in 0..2 {
            cl.rmdir(&r, top, format!("d{i}").as_bytes()).await.unwrap();
        }
        assert_eq!(
            cl.getattr(&r, top).await.unwrap().nlink,
            lode_base::limits::LINK_MAX - 1
        );
        // A file's hard links stay bounded (see `link_max_gives_emlink`).
    });
}

#[test]
fn link_max_gives_emlink() {
    let c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    s.run(async {
        use futures::StreamExt;
        let d = cl
            .mkdir(&r, Fid::ROOT, b"links", 0o755, None)
            .await
            .unwrap()
            .attr
            .fid;
        let f = cl.create(&r, d, b"f", 0o644, None).await.unwrap().attr.fid;
        futures::stream::iter(1..lode_base::limits::LINK_MAX)
            .map(|i| {
                let r = &r;
                async move { cl.link(r, f, d, format!("l{i}").as_bytes()).await }
            })
            .buffer_unordered(32)
            .for_each(|x| async {
                x.expect("link");
            })
            .await;
        assert_eq!(
            cl.getattr(&r, f).await.unwrap().nlink,
            lode_base::limits::LINK_MAX
        );
        assert_eq!(err(cl.link(&r, f, d, b"one-too-many").await), Errno::EMLINK);
    });
}
