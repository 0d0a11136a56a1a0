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
