//! Hardening, against real processes: secrets kept as secrets (key files and keyed
//! CONFIG records others can read are refused), only root may change parameters, and
//! names no entry may have.

mod common;

use common::*;
use lode_base::{Errno, Fid};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use lode_proto::{Reply, Request};
use lode_rpc::auth::{Opener, Sealer};

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
    // The MDT counts them once each OST has committed its destroys, a moment after
    // the files are gone.
    let destroyed = || -> u64 {
        let destroys = c.get_param("mdt.*.destroys");
        destroys
            .lines()
            .find_map(|l| l.strip_prefix("destroyed: "))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {destroys:?}"))
    };
    lode_testkit::wait_for(
        "the MDT to count the 40 destroys",
        std::time::Duration::from_secs(30),
        || destroyed() >= 40,
    );
}

/// One whole frame from `p` as it came after its length field (sealed or not), or
/// `None` if the connection closed or nothing came within 10 s.
fn raw_next(p: &mut RawPeer) -> Option<Vec<u8>> {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if p.received.len() >= 4 {
            let mut len = [0u8; 4];
            len.copy_from_slice(&p.received[..4]);
            let len = u32::from_le_bytes(len) as usize;
            if p.received.len() >= 4 + len {
                let rest = p.received[4..4 + len].to_vec();
                p.received.drain(..4 + len);
                return Some(rest);
            }
        }
        let left = end.checked_duration_since(std::time::Instant::now())?;
        if !p.read_some(left).ok()? {
            return None;
        }
    }
}

/// An unsealed reply's status.
fn plain_status(p: &mut RawPeer) -> i32 {
    let rest = raw_next(p).expect("a reply");
    lode_proto::Frame::decode_rest(rest)
        .expect("an unsealed reply")
        .header
        .status
}

/// The AUTH_NONCE step by hand: the target's nonce for `mine`.
fn nonce_step(p: &mut RawPeer, mine: &[u8]) -> Vec<u8> {
    let req = Request::AuthNonce(lode_proto::NonceMsg {
        nonce: mine.to_vec(),
    });
    p.send(&request_frame(&req, 1, 0));
    let f = lode_proto::Frame::decode_rest(raw_next(p).expect("nonce reply")).expect("plain");
    match Reply::decode(f.header.opcode, &f.body) {
        Ok(Reply::AuthNonce(n)) => n.nonce,
        other => panic!("AUTH_NONCE reply: {other:?}"),
    }
}

fn connect_req(fsname: &str, target: &str, uuid: &str, auth: Vec<u8>) -> Request {
    Request::Connect(lode_proto::ConnectReq {
        fsname: fsname.into(),
        target: target.into(),
        client_uuid: uuid.into(),
        flags: lode_proto::CONNECT_SUPPORTED,
        max_mod_rpcs: 1,
        auth,
    })
}

/// A hand-made client that holds `key`: the handshake, then a sealed CONNECT reply.
/// Returns the peer, its session, the CONNECT frame as sent and the export handle.
fn keyed_peer(
    addr: &str,
    fsname: &str,
    target: &str,
    key: &[u8],
) -> (RawPeer, Sealer, Opener, Vec<u8>, u64) {
    let mut p = RawPeer::connect(addr);
    let mine = lode_rpc::auth::nonce();
    let theirs = nonce_step(&mut p, &mine);
    let hs = lode_rpc::auth::Handshake {
        server: &theirs,
        client: &mine,
        uuid: "hand-made",
        target,
    };
    let (sealer, mut opener) = hs.client_session(key).expect("session");
    let connect = request_frame(
        &connect_req(fsname, target, "hand-made", hs.proof(key)),
        2,
        0,
    );
    p.send(&connect);
    let mut rest = raw_next(&mut p).expect("CONNECT reply");
    opener
        .open(&mut rest)
        .expect("the target proves the key: a sealed reply");
    let f = lode_proto::Frame::decode_rest(rest).expect("decodes");
    assert_eq!(f.header.status, 0, "CONNECT with the key accepted");
    let handle = match Reply::decode(f.header.opcode, &f.body) {
        Ok(Reply::Connect(r)) => r.handle,
        other => panic!("CONNECT reply: {other:?}"),
    };
    (p, sealer, opener, connect, handle)
}

/// A cluster of `osts` OSTs whose targets and clients share `key`.
fn keyed_cluster(osts: u32, key: &[u8]) -> lode_testkit::Cluster {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_lode"));
    lode_testkit::Cluster::start_with_key(bin, osts, Some(key))
}

#[test]
fn a_keyed_file_system_admits_only_key_holders_and_no_captured_frame_works_twice() {
    let key = b"s3cret";
    let c = keyed_cluster(1, key);
    let (fs, mdt) = (c.fsname.clone(), format!("{}-MDT0000", c.fsname));
    let addr = c.addr("mdt0");
    let statfs = Request::Statfs(lode_proto::Empty {});
    let eacces = Errno::EACCES.status();

    // Without the key: a CONNECT is refused, and so is any request before one.
    let mut p = RawPeer::connect(&addr);
    p.send(&request_frame(
        &connect_req(&fs, &mdt, "nokey", Vec::new()),
        1,
        0,
    ));
    assert_eq!(plain_status(&mut p), eacces, "CONNECT without the key");
    p.send(&request_frame(&statfs, 2, 0));
    assert_eq!(plain_status(&mut p), eacces, "a request before any CONNECT");

    // A wrong key: the handshake runs, its proof fails.
    let mut p = RawPeer::connect(&addr);
    let mine = lode_rpc::auth::nonce();
    let theirs = nonce_step(&mut p, &mine);
    let hs = lode_rpc::auth::Handshake {
        server: &theirs,
        client: &mine,
        uuid: "wrongkey",
        target: &mdt,
    };
    p.send(&request_frame(
        &connect_req(&fs, &mdt, "wrongkey", hs.proof(b"wrong")),
        2,
        0,
    ));
    assert_eq!(plain_status(&mut p), eacces, "CONNECT with a wrong key");

    // With the key: connected, and a sealed request is answered, sealed.
    let (mut good, mut sealer, mut opener, captured_connect, handle) =
        keyed_peer(&addr, &fs, &mdt, key);
    let captured_req = sealer.seal(&request_frame(&statfs, 3, handle));
    good.send(&captured_req);
    let mut rest = raw_next(&mut good).expect("STATFS reply");
    opener.open(&mut rest).expect("sealed reply");
    assert_eq!(
        lode_proto::Frame::decode_rest(rest)
            .expect("decodes")
            .header
            .status,
        0
    );

    // A captured CONNECT replayed on another connection: bound to the nonces of the
    // first, it proves nothing, with or without a fresh handshake.
    let mut p = RawPeer::connect(&addr);
    p.send(&captured_connect);
    assert_eq!(
        plain_status(&mut p),
        eacces,
        "replayed CONNECT, no handshake"
    );
    let mut p = RawPeer::connect(&addr);
    nonce_step(&mut p, &lode_rpc::auth::nonce());
    p.send(&captured_connect);
    assert_eq!(
        plain_status(&mut p),
        eacces,
        "replayed CONNECT after a handshake"
    );

    // A captured request frame replayed: on its own connection (out of sequence), on
    // another key holder's connection, or a request sent unsealed there: the target
    // closes the connection and answers nothing.
    good.send(&captured_req);
    assert!(
        raw_next(&mut good).is_none() && good.is_closed(),
        "replayed on its own connection"
    );
    let (mut other, _, _, _, _) = keyed_peer(&addr, &fs, &mdt, key);
    other.send(&captured_req);
    assert!(
        raw_next(&mut other).is_none() && other.is_closed(),
        "replayed on another connection"
    );
    let (mut other, _, _, _, h) = keyed_peer(&addr, &fs, &mdt, key);
    other.send(&request_frame(&statfs, 3, h));
    assert!(
        raw_next(&mut other).is_none() && other.is_closed(),
        "unsealed after the handshake"
    );

    // Each refusal is one line naming the peer and the reason.
    let log = c.log("mdt0");
    for why in [
        "refusing connect: no handshake",
        "refusing connect: wrong key",
        "not proved the file system key",
        "frame not authenticated",
    ] {
        assert!(log.contains(why), "the MDT log says {why:?}:\n{log}");
    }

    // The MGS too: a peer without the key cannot register, move or add a target.
    let targets = c.get_param("mgs.MGS.targets");
    let mut p = RawPeer::connect(&c.mgs_addr);
    let reg = Request::MgsRegister(lode_proto::MgsRegisterReq {
        fsname: fs.clone(),
        target: lode_proto::TargetInfo {
            kind: lode_proto::TargetKind::Ost,
            index: 9,
            name: format!("{fs}-OST0009"),
            addr: "127.0.0.1:1".into(),
            uuid: "intruder".into(),
        },
        stamp: 0,
        proof: Vec::new(),
        secret: Vec::new(),
    });
    p.send(&request_frame(&reg, 1, 0));
    assert_eq!(plain_status(&mut p), eacces, "MGS_REGISTER without the key");
    let moved = Request::MgsRegister(lode_proto::MgsRegisterReq {
        fsname: fs.clone(),
        target: lode_proto::TargetInfo {
            kind: lode_proto::TargetKind::Mdt,
            index: 0,
            name: mdt.clone(),
            addr: "127.0.0.1:1".into(),
            uuid: "intruder".into(),
        },
        stamp: 0,
        proof: Vec::new(),
        secret: Vec::new(),
    });
    p.send(&request_frame(&moved, 2, 0));
    assert_eq!(plain_status(&mut p), eacces, "moving MDT0 without the key");
    assert_eq!(c.get_param("mgs.MGS.targets"), targets, "no target changed");

    // Key holders work as ever, callbacks included (that channel does the handshake
    // too): a mount sees another client's change at once.
    let m = c.mount();
    std::fs::write(m.path().join("f"), b"x").expect("write through a keyed mount");
    let s = c.client();
    channel_up(&s);
    let f = fid(&s, "/f").expect("resolve");
    let _ = std::fs::metadata(m.path().join("f"));
    let sa = lode_base::SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    s.run(s.client.setattr(&root(), f, sa)).expect("chmod");
    assert_eq!(
        std::fs::metadata(m.path().join("f"))
            .expect("stat")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
}

/// `lode df` and `lode fid2path` ask the mount (virtual xattrs on its root): no
/// connection, key or client slot of their own, however often they run. Native clients
/// that come and go give their slots back when they disconnect.
#[test]
fn ten_thousand_lode_df_runs_leave_the_client_slot_table_as_it_was() {
    let key = b"s3cret";
    let c = keyed_cluster(2, key);
    let m = c.mount();
    std::fs::write(m.path().join("f"), b"x").expect("write");
    let slots = || {
        (
            c.get_param("mdt.*.client_slots"),
            c.get_param("mdt.*.num_exports"),
        )
    };
    let before = slots();
    assert_eq!(before.1, "1", "the mount");
    let mp = m.path().display().to_string();
    let bin = env!("CARGO_BIN_EXE_lode");
    std::thread::scope(|sc| {
        for _ in 0..2 {
            sc.spawn(|| {
                for _ in 0..5_000 {
                    let out = std::process::Command::new(bin)
                        .args(["df", &mp])
                        .output()
                        .expect("run lode df");
                    assert!(out.status.success(), "{:?}", out);
                }
            });
        }
    });
    let out = std::process::Command::new(bin)
        .args(["df", &mp])
        .output()
        .expect("run lode df");
    let text = String::from_utf8_lossy(&out.stdout);
    for t in [
        "MDT0000_UUID",
        "OST0000_UUID",
        "OST0001_UUID",
        "filesystem_summary",
    ] {
        assert!(text.contains(t), "lode df shows {t}:\n{text}");
    }
    for _ in 0..100 {
        let s = c.client();
        assert!(fid(&s, "/f").is_ok());
    }
    assert_eq!(slots(), before, "no slot taken or left behind");
}

/// An export handle is good only on the connection that was granted it: another
/// connection naming it (a guessed or sniffed handle) is told ENOTCONN, on the MDT and
/// on an OST alike.
#[test]
fn a_handle_works_only_on_the_connection_it_was_granted_on() {
    let c = cluster(1);
    let statfs = Request::Statfs(lode_proto::Empty {});
    for (t, name) in [("mdt0", "MDT0000"), ("ost0", "OST0000")] {
        let target = format!("{}-{name}", c.fsname);
        let mut owner = RawPeer::connect(&c.addr(t));
        let h = owner.connect_as(&c.fsname, &target, "owner").handle;
        let mut other = RawPeer::connect(&c.addr(t));
        let rep = other.call(&statfs, h).expect("answered");
        assert_eq!(
            rep.header.status,
            Errno::ENOTCONN.status(),
            "{t}: a borrowed handle"
        );
        let rep = owner.call(&statfs, h).expect("answered");
        assert_eq!(rep.header.status, 0, "{t}: the owner's own connection");
    }
}

/// A host holding the file system key still cannot move a target it does not run:
/// each target proves its registrations with its own secret (written at mkfs), in
/// increasing order, so neither a guess nor a replay of an old one moves it.
#[test]
fn only_the_target_itself_can_move_it_even_for_a_key_holder() {
    let key = b"s3cret";
    let c = keyed_cluster(1, key);
    let mdt = format!("{}-MDT0000", c.fsname);
    let cfg = std::fs::read_to_string(c.target_dir("mdt0").join("CONFIG")).expect("CONFIG");
    let cfg = lode_base::config::TargetConfig::parse(&cfg, "mdt0").expect("parses");
    let real = c.get_param("mgs.MGS.targets");
    let uuid = real
        .lines()
        .find(|l| l.starts_with(&mdt))
        .and_then(|l| l.split_whitespace().nth(2))
        .expect("MDT0 registered")
        .to_string();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mgs = lode_mgs::client::mgs_import(
        &c.mgs_addr,
        &c.fsname,
        "intruder",
        key.to_vec(),
        Duration::from_secs(5),
        rt.handle().clone(),
    );
    let to = lode_proto::TargetInfo {
        kind: lode_proto::TargetKind::Mdt,
        index: 0,
        name: mdt.clone(),
        addr: "127.0.0.1:1".into(),
        uuid,
    };
    let register = |secret: &[u8], stamp: u64| {
        let proof = if secret.is_empty() {
            Vec::new()
        } else {
            lode_rpc::auth::register_proof(secret, &to.name, &to.addr, &to.uuid, stamp)
        };
        let req = lode_proto::MgsRegisterReq {
            fsname: c.fsname.clone(),
            target: to.clone(),
            stamp,
            proof,
            secret: secret.to_vec(),
        };
        rt.block_on(mgs.call(Request::MgsRegister(req))).map(|_| ())
    };
    let eperm = Err(Errno::EPERM);
    assert_eq!(register(b"", u64::MAX), eperm, "no proof");
    assert_eq!(register(b"guess", u64::MAX), eperm, "a wrong secret");
    assert_eq!(register(&cfg.secret(), 1), eperm, "an old stamp (a replay)");
    assert_eq!(c.get_param("mgs.MGS.targets"), real, "MDT0 did not move");
    let log = c.log("mgs");
    assert!(log.contains("wrong target secret"), "{log}");
    assert!(log.contains("not newer than the last one"), "{log}");
    // The target itself still registers after a restart (a newer stamp).
    let mut c = c;
    c.kill9("mdt0");
    c.start_target("mdt0");
    let s = c.client();
    assert!(fid(&s, "/").is_ok(), "MDT0 serves again");
}

/// A SETATTR saying its caller holds the file open for writing (which lets a
/// truncate skip the write-permission check, as `ftruncate` does on Linux) counts
/// only with a write handle of that caller on that file to show for it: a claim with
/// no handle, or with another file's or a read handle, is checked as a truncate by
/// path is. Through a real write handle the truncate goes through.
#[test]
fn holding_a_file_open_for_writing_takes_a_write_handle_to_show() {
    let c = cluster(1);
    let s = c.client();
    let r = root();
    let u = user();
    let other = s
        .run(s.client.create(&r, Fid::ROOT, b"other", 0o666, None))
        .expect("create other");
    let f = s
        .run(s.client.create(&r, Fid::ROOT, b"f", 0o644, None))
        .expect("create f");
    let fid = f.attr.fid;
    let fh = s.run(s.client.open(&r, fid, libc::O_RDWR)).expect("open f");
    assert_eq!(s.run(s.client.write(&fh, 0, b"root's")), Ok(6));
    let ro = s
        .run(s.client.open(&u, fid, libc::O_RDONLY))
        .expect("the user reads f");
    let w_other = s
        .run(s.client.open(&u, other.attr.fid, libc::O_RDWR))
        .expect("the user writes other");
    let claim = |handle: u64| {
        Request::Setattr(lode_proto::SetattrReq {
            cred: u.clone(),
            fid,
            attr: lode_base::SetAttr {
                size: Some(0),
                ..Default::default()
            },
            opened_for_write: true,
            handle,
        })
    };
    for (h, what) in [
        (0, "no handle"),
        (ro.handle, "a read handle"),
        (w_other.handle, "another file's write handle"),
        (fh.handle + 1_000_000, "a handle nobody has"),
    ] {
        let got = s.run(s.client.batch(vec![claim(h)])).expect("the batch");
        assert!(
            matches!(got.first(), Some(Err(Errno::EACCES))),
            "{what}: {got:?}"
        );
    }
    let a = s.run(s.client.getattr(&r, fid)).expect("getattr");
    assert_eq!(a.size, 6, "nothing was cut");
    // The user's own write handle (the mode lets the user write once root allows).
    let sa = lode_base::SetAttr {
        mode: Some(0o666),
        ..Default::default()
    };
    s.run(s.client.setattr(&r, fid, sa)).expect("chmod");
    let uw = s
        .run(s.client.open(&u, fid, libc::O_WRONLY))
        .expect("the user opens f for writing");
    let sa = lode_base::SetAttr {
        mode: Some(0o644),
        ..Default::default()
    };
    s.run(s.client.setattr(&r, fid, sa)).expect("chmod back");
    s.run(s.client.truncate_open(&u, &uw, 2))
        .expect("ftruncate through the user's own write handle");
    let a = s.run(s.client.getattr(&r, fid)).expect("getattr");
    assert_eq!(a.size, 2);
    for h in [&fh, &ro, &w_other, &uw] {
        s.run(s.client.close(h)).expect("close");
    }
}
