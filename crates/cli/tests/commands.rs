//! The command line: mkfs and server start-up refusals, get-param / set-param.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

fn lode() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lode"))
}

fn fails_with(cmd: &mut Command, words: &str) {
    let out = cmd.output().expect("run lode");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {err}"
    );
    assert!(
        err.contains(words),
        "stderr {err:?} should mention {words:?}"
    );
    assert!(
        err.lines().filter(|l| l.starts_with("lode: ")).count() == 1,
        "one error line: {err:?}"
    );
}

/// Runs `lode mkfs ARGS DIR`, which must succeed.
fn mkfs_ok(args: &[&str], dir: &Path) {
    let st = lode()
        .arg("mkfs")
        .args(args)
        .arg(dir)
        .status()
        .expect("run lode");
    assert!(st.success(), "mkfs {args:?} {}", dir.display());
}

#[test]
fn mkfs_refuses_bad_input_and_non_empty_directories() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("mdt");
    fails_with(
        lode()
            .args(["mkfs", "--mdt", "--fsname", "toolongname"])
            .arg(&d),
        "must be 1 to 8",
    );
    fails_with(
        lode().args(["mkfs", "--mdt", "--fsname", "a-b"]).arg(&d),
        "may only contain",
    );
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("junk"), b"x").unwrap();
    fails_with(
        lode().args(["mkfs", "--mdt", "--fsname", "fs"]).arg(&d),
        "not empty, refusing to format",
    );
    let ok = t.path().join("ok");
    mkfs_ok(&["--mdt", "--fsname", "fs"], &ok);
    fails_with(
        lode().args(["mkfs", "--mdt", "--fsname", "fs"]).arg(&ok),
        "already formatted",
    );
}

#[test]
fn a_format_cut_short_is_done_again_from_the_start() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("mdt");
    // What a format cut short before its configuration leaves: its marker, a store
    // and a half-written configuration.
    mkfs_ok(&["--mdt", "--fsname", "fs"], &d);
    assert!(
        !d.join("FORMATTING").exists(),
        "a finished format leaves no marker"
    );
    let old = std::fs::read_to_string(d.join("CONFIG")).unwrap();
    std::fs::remove_file(d.join("CONFIG")).unwrap();
    std::fs::write(d.join("FORMATTING"), b"").unwrap();
    std::fs::write(d.join("CONFIG.tmp"), b"format=").unwrap();
    mkfs_ok(&["--mdt", "--fsname", "fs"], &d);
    let new = std::fs::read_to_string(d.join("CONFIG")).unwrap();
    assert_ne!(old, new, "a new target (its own uuid)");
    assert!(d.join("db/CURRENT").is_file(), "a store again");
    for gone in ["FORMATTING", "CONFIG.tmp"] {
        assert!(!d.join(gone).exists(), "{gone} removed");
    }
    // Without the marker, a directory someone else filled is still refused.
    std::fs::remove_file(d.join("CONFIG")).unwrap();
    fails_with(
        lode().args(["mkfs", "--mdt", "--fsname", "fs"]).arg(&d),
        "not empty, refusing to format",
    );
}

#[test]
fn servers_refuse_unformatted_foreign_and_busy_directories() {
    let t = tempfile::tempdir().unwrap();
    let run = t.path().join("run");
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails_with(
        lode()
            .env("LODE_RUN_DIR", &run)
            .args(["mds", "--listen", "127.0.0.1:0"])
            .arg(&empty),
        "not formatted",
    );
    let ost = t.path().join("ost");
    mkfs_ok(&["--ost", "--fsname", "fs"], &ost);
    fails_with(
        lode()
            .env("LODE_RUN_DIR", &run)
            .args(["mds", "--listen", "127.0.0.1:0"])
            .arg(&ost),
        "formatted as ost",
    );
    std::fs::write(
        ost.join("CONFIG"),
        std::fs::read_to_string(ost.join("CONFIG"))
            .unwrap()
            .replace("format=1", "format=99"),
    )
    .unwrap();
    fails_with(
        lode()
            .env("LODE_RUN_DIR", &run)
            .args(["oss", "--listen", "127.0.0.1:0"])
            .arg(&ost),
        "newer",
    );
}

#[test]
fn an_mdt_whose_store_is_gone_refuses_to_start_rather_than_come_up_empty() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("mdt");
    mkfs_ok(&["--mdt", "--fsname", "fs"], &d);
    assert!(d.join("db/CURRENT").is_file(), "mkfs makes the store");
    std::fs::remove_dir_all(d.join("db")).unwrap();
    fails_with(
        lode()
            .env("LODE_RUN_DIR", t.path().join("run"))
            .args(["mds", "--listen", "127.0.0.1:0"])
            .arg(&d),
        "no store here",
    );
    assert!(!d.join("db").exists(), "nothing made in its place");
}

#[test]
fn a_second_server_on_a_running_target_or_a_busy_port_is_refused() {
    let c = cluster(1);
    fails_with(
        c.lode()
            .args(["oss", "--listen", "127.0.0.1:0"])
            .arg(c.target_dir("ost0")),
        "already in use",
    );
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("ost9");
    mkfs_ok(&["--ost", "--fsname", "testfs", "--index", "9"], &d);
    fails_with(
        c.lode().args(["oss", "--listen", &c.addr("mdt0")]).arg(&d),
        "cannot listen on",
    );
}

#[test]
fn get_param_and_set_param_speak_lctl() {
    let c = cluster(1);
    let out = c
        .lode()
        .args(["get-param", "mdt.*.max_mod_rpcs_in_flight"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "mdt.testfs-MDT0000.max_mod_rpcs_in_flight=8\n"
    );
    let out = c
        .lode()
        .args(["set-param", "mdt.*.max_mod_rpcs_in_flight=16"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "mdt.testfs-MDT0000.max_mod_rpcs_in_flight=16\n"
    );
    assert_eq!(
        c.get_param("mdt.testfs-MDT0000.max_mod_rpcs_in_flight"),
        "16"
    );
    let out = c
        .lode()
        .args(["set-param", "mdt.*.max_mod_rpcs_in_flight=0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("error: set_param: setting"));
    let out = c
        .lode()
        .args(["get-param", "no.such.param"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file or directory"));
    // Stats in Lustre's format, after some traffic.
    let s = c.client();
    s.run(
        s.client
            .create(&root(), lode_base::Fid::ROOT, b"f", 0o644, None),
    )
    .unwrap();
    let stats = c
        .lode()
        .args(["get-param", "mdt.*.stats"])
        .output()
        .unwrap();
    let stats = String::from_utf8_lossy(&stats.stdout);
    assert!(
        stats.starts_with("mdt.testfs-MDT0000.stats=\nsnapshot_time"),
        "{stats}"
    );
    assert!(
        stats
            .lines()
            .any(|l| l.starts_with("mds_reint_create") && l.contains("samples [usecs]")),
        "{stats}"
    );
    let names = c
        .lode()
        .args(["get-param", "-N", "*.fail_loc"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&names.stdout).lines().count(),
        2,
        "MDT and OST have fail_loc"
    );
    assert!(Path::new(&c.run_dir()).join("testfs-MDT0000.sock").exists());
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("mgs");
    mkfs_ok(&["--mgs", "--fsname", "fs"], &d);
    let port = lode_testkit::free_port();
    let mport = lode_testkit::free_port();
    let mut child = lode()
        .env("LODE_RUN_DIR", t.path().join("run"))
        .args([
            "mgs",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics",
            &format!("127.0.0.1:{mport}"),
        ])
        .arg(&d)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut body = String::new();
    lode_testkit::wait_for("metrics", std::time::Duration::from_secs(10), || {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", mport)) else {
            return false;
        };
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        body.clear();
        s.read_to_string(&mut body).is_ok() && body.contains("lode_mgs_targets 0")
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(body.starts_with("HTTP/1.1 200 OK"));
}

/// `lode sync PATH`: what the mount wrote (kept in the kernel's cache, not fsynced) is
/// sent on and made durable: the MDT has committed everything and every OST synced
/// when it returns; a path on no lode mount is refused in one line.
#[test]
fn lode_sync_commits_the_mdt_and_syncs_every_ost_before_returning() {
    let c = cluster(2);
    let m = c.mount_with(&["writeback"]);
    // Nothing commits on its own in this test's time.
    c.set_param("mdt.*.commit_interval_ms=60000");
    c.set_param("obdfilter.*.stats=clear");
    std::fs::write(m.path().join("unsynced"), vec![7u8; 300_000]).expect("write");
    // The writer's close goes in the background: one landing after the sync would be a
    // change the sync did not cover.
    lode_testkit::wait_for(
        "the writer closed",
        std::time::Duration::from_secs(10),
        || c.get_param("mdt.*.open_files") == "0",
    );
    let out = c
        .lode()
        .arg("sync")
        .arg(m.path().join("unsynced"))
        .output()
        .expect("run lode sync");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        c.get_param("mdt.*.last_committed"),
        c.get_param("mdt.*.last_transno"),
        "the MDT committed everything"
    );
    let stats = c.get_param("obdfilter.*.stats");
    assert_eq!(
        stats.lines().filter(|l| l.starts_with("ost_sync ")).count(),
        2,
        "both OSTs synced:\n{stats}"
    );
    assert!(
        stats.lines().any(|l| l.starts_with("ost_write ")),
        "the cached write reached an OST first:\n{stats}"
    );
    fails_with(c.lode().arg("sync").arg("/proc"), "not on a lode mount");
}

/// Data written and not fsynced is made durable by each OST's commit within
/// `commit_interval_ms` (100 ms by default): the objects written are fsynced, with the
/// directories naming them, not left to the kernel's writeback.
#[test]
fn written_objects_are_synced_by_the_ost_commit_within_its_interval() {
    let c = cluster(1);
    assert_eq!(c.get_param("obdfilter.*.commit_interval_ms"), "100");
    let m = c.mount();
    let committed = |what: &str| -> u64 {
        let text = c.get_param("obdfilter.*.commits");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{what}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {what} in {text}"))
    };
    let before = committed("objects");
    for i in 0..5 {
        std::fs::write(m.path().join(format!("w{i}")), vec![1u8; 10_000]).expect("write");
    }
    lode_testkit::wait_for(
        "the OST commit to sync the five objects",
        std::time::Duration::from_secs(5),
        || committed("objects") >= before + 5,
    );
    assert!(committed("commits") >= 1);
}
