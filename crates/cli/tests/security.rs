//! Hardening, against real processes: secrets kept as secrets (key files and keyed
//! CONFIG records others can read are refused), only root may change parameters, and
//! names no entry may have.

mod common;

use common::*;
use lode_base::{Errno, Fid};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn a_local_user_may_read_parameters_but_not_change_them() {
    let c = cluster(1);
    // The test's directories are the test's own: let the user reach the sockets.
    for d in [c.run_dir(), c.run_dir().join("..")] {
        chmod(&d, 0o755);
    }
    let before = c.get_param("mdt.*.commit_interval_ms");
    let as_user = |args: &[&str]| {
        c.lode()
            .args(args)
            .uid(UID)
            .gid(UID)
            .output()
            .expect("run lode")
    };
    let got = as_user(&["get-param", "-n", "mdt.*.commit_interval_ms"]);
    assert!(got.status.success(), "{got:?}");
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), before);
    let set = as_user(&["set-param", "mdt.*.commit_interval_ms=777"]);
    assert!(!set.status.success(), "{set:?}");
    assert!(
        String::from_utf8_lossy(&set.stderr).contains("Permission denied"),
        "{set:?}"
    );
    assert_eq!(c.get_param("mdt.*.commit_interval_ms"), before);
    // Root may.
    c.set_param("mdt.*.commit_interval_ms=777");
    assert_eq!(c.get_param("mdt.*.commit_interval_ms"), "777");
}

#[test]
fn key_files_and_keyed_configs_that_others_can_read_are_refused() {
    let c = cluster(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("key");
    std::fs::write(&key, b"s3cret").expect("write key");
    chmod(&key, 0o644);
    let mkfs = |target: &Path| {
        c.lode()
            .args(["mkfs", "--mdt", "--fsname", "sec", "--key-file"])
            .arg(&key)
            .arg(target)
            .output()
            .expect("run mkfs")
    };
    let out = mkfs(&dir.path().join("mdt-open"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("chmod 600"),
        "{out:?}"
    );
    // With the key kept secret: formatted, and the CONFIG holding it is 0600.
    chmod(&key, 0o600);
    let target = dir.path().join("mdt");
    let out = mkfs(&target);
    assert!(out.status.success(), "{out:?}");
    let config = target.join("CONFIG");
    let mode = std::fs::metadata(&config)
        .expect("stat")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    // A server refuses to start on a keyed CONFIG others can read, and says why.
    chmod(&config, 0o644);
    let out = c
        .lode()
        .args(["mds", "--listen", "127.0.0.1:1"])
        .arg(&target)
        .output()
        .expect("run mds");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("chmod 600"),
        "{out:?}"
    );
    // A mount refuses a key file others can read, before connecting.
    chmod(&key, 0o640);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let out = c
        .lode()
        .args(["mount", "--foreground", "-o"])
        .arg(format!("key_file={}", key.display()))
        .arg(format!("{}:/testfs", c.addr("mgs")))
        .arg(&mnt)
        .output()
        .expect("run mount");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("chmod 600"),
        "{out:?}"
    );
}

#[test]
fn dot_and_dotdot_are_refused_as_names_as_linux_does() {
    let c = cluster(1);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    let d = s
        .run(cl.mkdir(&r, Fid::ROOT, b"d", 0o755, None))
        .expect("mkdir")
        .attr
        .fid;
    let f = s
        .run(cl.create(&r, d, b"f", 0o644, None))
        .expect("create")
        .attr
        .fid;
    for name in [&b"."[..], b".."] {
        assert_eq!(
            s.run(cl.create(&r, d, name, 0o644, None)).err(),
            Some(Errno::EEXIST)
        );
        assert_eq!(
            s.run(cl.mkdir(&r, d, name, 0o755, None)).err(),
            Some(Errno::EEXIST)
        );
        assert_eq!(s.run(cl.link(&r, f, d, name)).err(), Some(Errno::EEXIST));
        assert_eq!(
            s.run(cl.rename(&r, d, b"f", d, name, 0)).err(),
            Some(Errno::EBUSY)
        );
        assert_eq!(
            s.run(cl.rename(&r, d, name, d, b"g", 0)).err(),
            Some(Errno::EBUSY)
        );
    }
    // Nothing was made: the directory holds its one file and can be emptied and
    // removed.
    s.run(cl.unlink(&r, d, b"f")).expect("unlink");
    s.run(cl.rmdir(&r, Fid::ROOT, b"d")).expect("rmdir");
}

/// `op` on `path`: 0, or the errno.
fn errno_of(r: i32) -> i32 {
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }
}

#[test]
fn root_on_a_squashed_client_is_the_squash_user_and_a_listed_address_keeps_root() {
    use std::os::unix::fs::MetadataExt;
    let c = cluster(1);
    let m = c.mount();
    let public = m.path().join("public");
    std::fs::create_dir(&public).expect("mkdir");
    chmod(&public, 0o777);
    c.set_param(&format!("mdt.*.root_squash={UID}:{UID}"));
    assert_eq!(c.get_param("mdt.*.nosquash_nids"), "NONE");
    // Squashed, root may not write where only root may.
    let denied = std::fs::write(m.path().join("top"), b"x").map_err(|e| e.raw_os_error());
    assert_eq!(denied, Err(Some(libc::EACCES)));
    let f = public.join("squashed");
    std::fs::write(&f, b"x").expect("root creates where anyone may");
    let md = std::fs::metadata(&f).expect("stat");
    assert_eq!((md.uid(), md.gid()), (UID, UID), "owned by the squash user");
    // SAFETY: libc calls on NUL-terminated paths.
    let chown = unsafe { libc::chown(cs(&f).as_ptr(), 0, 0) };
    assert_eq!(errno_of(chown), libc::EPERM, "chown");
    let dev = libc::makedev(1, 3);
    let mknod =
        unsafe { libc::mknod(cs(public.join("null")).as_ptr(), libc::S_IFCHR | 0o666, dev) };
    assert_eq!(errno_of(mknod), libc::EPERM, "mknod of a device");
    let set = |name: &str| unsafe {
        libc::setxattr(
            cs(&f).as_ptr(),
            cs(name).as_ptr(),
            b"v".as_ptr().cast(),
            1,
            0,
        )
    };
    assert_eq!(errno_of(set("trusted.t")), libc::EPERM, "trusted.*");
    assert_eq!(errno_of(set("security.s")), libc::EPERM, "security.*");

    // This client's address listed: root is root again.
    c.set_param("mdt.*.nosquash_nids=127.0.0.[1-2]@tcp");
    let g = m.path().join("root");
    std::fs::write(&g, b"x").expect("root creates");
    assert_eq!(std::fs::metadata(&g).expect("stat").uid(), 0);
    let chown = unsafe { libc::chown(cs(&f).as_ptr(), 0, 0) };
    assert_eq!(errno_of(chown), 0, "chown as root");
    assert_eq!(errno_of(set("trusted.t")), 0, "trusted.* as root");
}

#[test]
fn a_setuid_program_runs_setuid_only_from_a_suid_mount() {
    let c = cluster(1);
    let (with, without) = (c.mount_with(&["suid"]), c.mount());
    chmod(&c.run_dir().join(".."), 0o755);
    // A copy of id(1), owned by root, set-user-ID.
    let prog = with.path().join("id");
    std::fs::copy("/usr/bin/id", &prog).expect("copy id");
    chmod(&prog, 0o4755);
    let euid = |dir: &Path| {
        let out = std::process::Command::new(dir.join("id"))
            .arg("-u")
            .uid(UID)
            .gid(UID)
            .output()
            .expect("run id");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(euid(with.path()), "0", "suid mount: runs as its owner");
    assert_eq!(
        euid(without.path()),
        UID.to_string(),
        "nosuid (the default): runs as its caller"
    );
}

/// Object files under an OST's directory.
fn objects_on(c: &lode_testkit::Cluster, ost: &str) -> usize {
    fn count(d: &Path) -> usize {
        std::fs::read_dir(d).map_or(0, |it| {
            it.filter_map(Result::ok)
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => count(&e.path()),
                    Ok(t) if t.is_file() => 1,
                    _ => 0,
                })
                .sum()
        })
    }
    count(&c.target_dir(ost).join("O"))
}

#[test]
fn a_dead_ost_does_not_stop_space_reclaim_on_the_others() {
    let mut c = cluster(2);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    // Files on OST 1 first: a reclaim that waited for each of them in turn would hold
    // up those on OST 0 behind them.
    let mut names = Vec::new();
    for ost in [1, 0] {
        for i in 0..20 {
            let name = format!("o{ost}-{i}");
            let layout = lode_base::Layout::plain(1, 1 << 20, ost);
            let fh = s
                .run(cl.create_open(
                    &r,
                    Fid::ROOT,
                    name.as_bytes(),
                    0o644,
                    libc::O_RDWR,
                    Some(layout),
                ))
                .expect("create");
            s.run(cl.write(&fh, 0, b"data")).expect("write");
            s.run(cl.close(&fh)).expect("close");
            names.push(name);
        }
    }
    assert_eq!((objects_on(&c, "ost0"), objects_on(&c, "ost1")), (20, 20));
    c.kill9("ost1");
    for n in &names {
        s.run(cl.unlink(&r, Fid::ROOT, n.as_bytes()))
            .expect("unlink");
    }
    lode_testkit::wait_for(
        "OST 0's objects to be destroyed while OST 1 is down",
        std::time::Duration::from_secs(30),
        || objects_on(&c, "ost0") == 0,
    );
    assert_eq!(objects_on(&c, "ost1"), 20, "the dead OST's objects wait");
    c.start_target("ost1");
    lode_testkit::wait_for(
        "OST 1's objects to be destroyed once it is back",
        std::time::Duration::from_secs(60),
        || objects_on(&c, "ost1") == 0,
    );
    let destroys = c.get_param("mdt.*.destroys");
    let destroyed: u64 = destroys
        .lines()
        .find_map(|l| l.strip_prefix("destroyed: "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {destroys:?}"));
    assert!(destroyed >= 40, "{destroys}");
}
