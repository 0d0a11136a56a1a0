//! POSIX ACLs, as Lustre has them by default: set and read as
//! `system.posix_acl_access`/`system.posix_acl_default`, checked by the mounts' kernels
//! and by the MDT alike, kept in step with chmod, inherited from a directory's default
//! ACL instead of the umask, and seen by every mount on its next call.

mod common;

use common::*;
use libc::{EACCES, EINVAL, EOPNOTSUPP, EPERM};
use lode_base::acl::{self, Acl, Entry, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
use lode_base::{Cred, Errno, Fid};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn acl_of(entries: &[(u16, u16, u32)]) -> Acl {
    let e = entries
        .iter()
        .map(|&(tag, perm, id)| Entry { tag, perm, id })
        .collect();
    Acl::from_entries(e).expect("valid ACL")
}

/// setxattr of `value` as `name` on `p`: 0 or the errno.
fn set(p: &Path, name: &[u8], value: &[u8]) -> i32 {
    let (c, n) = (cs(p), std::ffi::CString::new(name).expect("name"));
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// The ACL stored as `name` on `p`, if any.
fn get(p: &Path, name: &[u8]) -> Option<Acl> {
    let (c, n) = (cs(p), std::ffi::CString::new(name).expect("name"));
    let mut buf = vec![0u8; 4096];
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| {
        Acl::parse(&buf[..r as usize])
            .expect("stored ACL")
            .expect("entries")
    })
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).expect("stat").mode() & 0o7777
}

fn open_as_user(m: &Path, name: &str, flags: i32) -> i32 {
    as_user(m, name, |p| unsafe {
        let fd = libc::open(p, flags);
        if fd >= 0 {
            libc::close(fd);
        }
        fd
    })
}

#[test]
fn an_acl_grants_a_named_user_on_every_mount_and_chmod_moves_its_mask() {
    let c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    let (pa, pb) = (a.path().join("f"), b.path().join("f"));
    fs::write(&pa, b"secret").expect("write");
    fs::set_permissions(&pa, fs::Permissions::from_mode(0o600)).expect("chmod");
    for m in [&a, &b] {
        assert_eq!(open_as_user(m.path(), "f", libc::O_RDONLY), EACCES);
    }
    // user::rw- user:4242:r-- group::--- mask::r-- other::---
    let grant = acl_of(&[
        (USER_OBJ, 6, 0),
        (USER, 4, UID),
        (GROUP_OBJ, 0, 0),
        (MASK, 4, 0),
        (OTHER, 0, 0),
    ]);
    assert_eq!(set(&pa, acl::ACCESS, &grant.to_xattr()), 0);
    assert_eq!(
        mode(&pb),
        0o640,
        "the mask is the group bits, on the other mount too"
    );
    assert_eq!(get(&pb, acl::ACCESS), Some(grant.clone()));
    for m in [&a, &b] {
        assert_eq!(open_as_user(m.path(), "f", libc::O_RDONLY), 0, "granted");
        assert_eq!(
            open_as_user(m.path(), "f", libc::O_WRONLY),
            EACCES,
            "read only"
        );
    }
    // A chmod sets the mask: the named entry stays but grants nothing.
    fs::set_permissions(&pb, fs::Permissions::from_mode(0o600)).expect("chmod");
    let masked = get(&pa, acl::ACCESS).expect("still an ACL");
    assert!(masked.entries().contains(&Entry {
        tag: USER,
        perm: 4,
        id: UID
    }));
    assert!(masked.entries().contains(&Entry {
        tag: MASK,
        perm: 0,
        id: u32::MAX
    }));
    assert_eq!(
        open_as_user(a.path(), "f", libc::O_RDONLY),
        EACCES,
        "masked"
    );
    fs::set_permissions(&pa, fs::Permissions::from_mode(0o660)).expect("chmod");
    assert_eq!(
        open_as_user(b.path(), "f", libc::O_RDONLY),
        0,
        "mask rw-, entry r--"
    );
    assert_eq!(open_as_user(b.path(), "f", libc::O_RDWR), EACCES);
    // Removed: the mode alone decides again, and stays as it was.
    let (c_, n) = (cs(&pa), std::ffi::CString::new(acl::ACCESS).expect("name"));
    assert_eq!(unsafe { libc::removexattr(c_.as_ptr(), n.as_ptr()) }, 0);
    assert_eq!(get(&pb, acl::ACCESS), None);
    assert_eq!(mode(&pb), 0o660);
    assert_eq!(open_as_user(b.path(), "f", libc::O_RDONLY), EACCES);
    // A minimal ACL is only a mode.
    let minimal = acl_of(&[(USER_OBJ, 6, 0), (GROUP_OBJ, 4, 0), (OTHER, 4, 0)]);
    assert_eq!(set(&pa, acl::ACCESS, &minimal.to_xattr()), 0);
    assert_eq!(mode(&pb), 0o644);
    assert_eq!(get(&pa, acl::ACCESS), None);

    // Refusals: a malformed ACL, a default ACL on a file, an ACL on another's file.
    let no_mask = acl::Acl::parse(&grant.to_xattr())
        .expect("ok")
        .expect("acl");
    let mut bytes = no_mask.to_xattr();
    bytes.drain(4 + 3 * 8..4 + 4 * 8);
    assert_eq!(set(&pa, acl::ACCESS, &bytes), EINVAL);
    assert_eq!(set(&pa, acl::DEFAULT, &grant.to_xattr()), EACCES);
    let v = minimal.to_xattr();
    let setter = |p: *const libc::c_char| unsafe {
        libc::setxattr(
            p,
            c"system.posix_acl_access".as_ptr(),
            v.as_ptr().cast(),
            v.len(),
            0,
        )
    };
    assert_eq!(as_user(a.path(), "f", setter), EPERM);
    // A mount with ACLs off refuses them, as Lustre's noacl.
    let n = c.mount_with(&["noacl"]);
    assert_eq!(
        set(&n.path().join("f"), acl::ACCESS, &grant.to_xattr()),
        EOPNOTSUPP
    );
}

#[test]
fn a_default_acl_is_inherited_instead_of_the_umask() {
    let c = cluster(1);
    let m = c.mount();
    let d = m.path().join("shared");
    fs::create_dir(&d).expect("mkdir");
    // default: user::rwx user:4242:rwx group::r-x mask::rwx other::---
    let def = acl_of(&[
        (USER_OBJ, 7, 0),
        (USER, 7, UID),
        (GROUP_OBJ, 5, 0),
        (MASK, 7, 0),
        (OTHER, 0, 0),
    ]);
    assert_eq!(set(&d, acl::DEFAULT, &def.to_xattr()), 0);
    fs::create_dir(m.path().join("plain")).expect("mkdir");
    // Made with umask 077, which the default ACL overrides; next door, the umask.
    let made = in_child(m.path(), false, || unsafe {
        libc::umask(0o077);
        let fd = libc::open(c"shared/f".as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o666);
        if fd < 0 {
            return -1;
        }
        libc::close(fd);
        if libc::mkdir(c"shared/sub".as_ptr(), 0o777) < 0
            || libc::mkdir(c"plain/sub".as_ptr(), 0o777) < 0
        {
            return -1;
        }
        libc::mknod(c"shared/fifo".as_ptr(), libc::S_IFIFO | 0o644, 0) as i64
    });
    assert_eq!(made, 0);
    assert_eq!(
        mode(&d.join("f")),
        0o660,
        "mode & the default ACL, no umask"
    );
    assert_eq!(mode(&d.join("sub")), 0o770);
    assert_eq!(mode(&d.join("fifo")), 0o640);
    assert_eq!(
        mode(&m.path().join("plain/sub")),
        0o700,
        "the umask where no default ACL"
    );
    let f = get(&d.join("f"), acl::ACCESS).expect("inherited access ACL");
    assert!(f.entries().contains(&Entry {
        tag: USER,
        perm: 7,
        id: UID
    }));
    assert!(f.entries().contains(&Entry {
        tag: MASK,
        perm: 6,
        id: u32::MAX
    }));
    assert_eq!(
        get(&d.join("sub"), acl::DEFAULT),
        Some(def.clone()),
        "a subdirectory inherits the default"
    );
    assert_eq!(get(&d.join("f"), acl::DEFAULT), None);
    assert_eq!(
        open_as_user(m.path(), "shared/f", libc::O_RDWR),
        0,
        "the named user, masked to rw-"
    );
    assert_eq!(
        as_user(m.path(), "shared/sub/new", |p| unsafe {
            let fd = libc::open(p, libc::O_CREAT | libc::O_WRONLY, 0o600);
            if fd >= 0 {
                libc::close(fd);
            }
            fd
        }),
        0,
        "the named user may create in the subdirectory"
    );
    assert_eq!(open_as_user(m.path(), "plain/sub", libc::O_RDONLY), EACCES);
}

#[test]
fn the_mdt_checks_acls_for_native_clients_too() {
    let mut c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let (r, u) = (root(), user());
    let other = Cred {
        uid: 2000,
        gid: 2000,
        groups: vec![],
    };
    let (d, f) = s.run(async {
        let d = cl
            .mkdir(&r, Fid::ROOT, b"d", 0o700, None)
            .await
            .unwrap()
            .attr
            .fid;
        let f = cl.create(&r, d, b"f", 0o600, None).await.unwrap().attr.fid;
        assert_eq!(cl.lookup(&u, d, b"f").await.unwrap_err(), Errno::EACCES);
        // Search for uid 1000 on the directory, read and write on the file.
        let dacl = acl_of(&[
            (USER_OBJ, 7, 0),
            (USER, 1, 1000),
            (GROUP_OBJ, 0, 0),
            (MASK, 1, 0),
            (OTHER, 0, 0),
        ]);
        cl.setxattr(&r, d, acl::ACCESS, Some(&dacl.to_xattr()), 0)
            .await
            .unwrap();
        let facl = acl_of(&[
            (USER_OBJ, 6, 0),
            (USER, 6, 1000),
            (GROUP_OBJ, 0, 0),
            (MASK, 6, 0),
            (OTHER, 0, 0),
        ]);
        cl.setxattr(&r, f, acl::ACCESS, Some(&facl.to_xattr()), 0)
            .await
            .unwrap();
        assert_eq!(cl.lookup(&u, d, b"f").await.unwrap().attr.fid, f);
        assert!(
            cl.lookup(&u, d, b"f").await.unwrap().acl,
            "replies say an ACL is there"
        );
        let h = cl
            .open(&u, f, libc::O_RDWR)
            .await
            .expect("granted by the ACL");
        cl.close(&h).await.unwrap();
        assert_eq!(cl.lookup(&other, d, b"f").await.unwrap_err(), Errno::EACCES);
        // Only the owner sets ACLs; anyone reads them.
        assert_eq!(
            cl.setxattr(&u, f, acl::ACCESS, Some(&facl.to_xattr()), 0)
                .await
                .unwrap_err(),
            Errno::EPERM
        );
        let (v, _) = cl.getxattr(&other, f, acl::ACCESS, 4096).await.unwrap();
        assert_eq!(Acl::parse(&v).unwrap(), Some(facl));
        // A chmod by the owner masks the named user out.
        let sa = lode_base::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        cl.setattr(&r, f, sa).await.unwrap();
        assert_eq!(
            cl.open(&u, f, libc::O_RDONLY).await.unwrap_err(),
            Errno::EACCES
        );
        (d, f)
    });
    // ACLs, and the flags that say where they are, survive an MDS crash (replayed or
    // committed): the grant on the directory still lets uid 1000 search it.
    restart_mds(&mut c, &[]);
    s.run(async {
        assert_eq!(cl.lookup(&u, d, b"f").await.unwrap().attr.fid, f);
        assert_eq!(cl.lookup(&other, d, b"f").await.unwrap_err(), Errno::EACCES);
        let (v, _) = cl.getxattr(&r, f, acl::ACCESS, 4096).await.unwrap();
        let masked = Acl::parse(&v).unwrap().expect("still an ACL");
        assert_eq!(masked.mode_bits(), 0o600);
        assert_eq!(
            cl.open(&u, f, libc::O_RDONLY).await.unwrap_err(),
            Errno::EACCES
        );
    });
}
