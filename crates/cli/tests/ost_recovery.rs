//! OST replay recovery, against real server processes and FUSE mounts.
//!
//! The OSS runs under its power-cut model (`LODE_OST_POWERCUT_MODEL=1`): every write
//! is journaled so that a restart rolls back what the OST had not synced, and a
//! `kill -9` of the OSS is a power cut of its disk. Commits are held back (a minute),
//! so every write a client was answered is lost by the kill unless the client
//! replays it.

mod common;

use common::*;
use lode_testkit::{wait_for, Cluster, Mount};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// A cluster of one OST whose OSS runs under the power-cut model, commits held back.
fn power_cut_cluster() -> Cluster {
    let mut c = cluster(1);
    c.set_server_env("ost0", "LODE_OST_POWERCUT_MODEL", "1");
    c.kill9("ost0");
    c.start_target("ost0");
    c.set_param("obdfilter.*.commit_interval_ms=60000");
    // The commit thread may be in its last short wait: let it pass.
    std::thread::sleep(Duration::from_millis(300));
    c
}

/// Sums `field` over every OSC of every mount in `unstable_stats`, one value per OSC.
fn unstable(c: &Cluster, field: &str) -> Vec<u64> {
    c.get_param("osc.*.unstable_stats")
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&format!("{field}: ")))
        .map(|v| v.parse().expect("a number"))
        .collect()
}

/// `kill -9` of the OSS (a power cut of its disk) and a restart; waits for its
/// recovery to end.
fn power_cut_oss(c: &mut Cluster) {
    c.kill9("ost0");
    std::thread::sleep(Duration::from_millis(200));
    c.start_target("ost0");
}

fn wait_recovered(c: &Cluster) {
    wait_for("the OST's recovery to end", Duration::from_secs(60), || {
        c.get_param("obdfilter.*.recovery_status")
            .contains("status: COMPLETE")
    });
}

/// Record `rec` of writer `w` in version `v`: bytes no other record has.
fn record(w: usize, rec: usize, v: usize) -> Vec<u8> {
    let seed = (w * 7919 + rec * 31 + v * 101) as u32;
    (0..RECORD)
        .map(|i| (seed.wrapping_mul(2_654_435_761).wrapping_add(i as u32) >> 3) as u8)
        .collect()
}

/// `path` created (or emptied) for writing.
fn create(path: &std::path::Path) -> std::fs::File {
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .expect("create")
}

const RECORD: usize = 64 << 10;
const RECORDS: usize = 48;

#[test]
fn an_oss_power_cut_loses_no_write_a_live_client_was_answered() {
    let mut c = power_cut_cluster();
    let mounts: Vec<Mount> = (0..2).map(|_| c.mount()).collect();
    let files: Vec<std::path::PathBuf> = mounts
        .iter()
        .enumerate()
        .map(|(w, m)| m.path().join(format!("writer{w}")))
        .collect();
    // Phase one: every record, version 1; no fsync.
    let handles: Vec<std::fs::File> = files
        .iter()
        .map(|p| {
            OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(p)
                .expect("create")
        })
        .collect();
    for (w, f) in handles.iter().enumerate() {
        for rec in 0..RECORDS {
            f.write_all_at(&record(w, rec, 1), (rec * RECORD) as u64)
                .expect("write");
        }
    }
    // The data has reached the OST (answered, not committed) from both mounts.
    wait_for(
        "unstable data on both mounts",
        Duration::from_secs(30),
        || {
            let u = unstable(&c, "unstable_rpcs");
            u.len() == 2 && u.iter().all(|n| *n > 0)
        },
    );
    // Phase two, with the OSS killed under it: half the records again, version 2.
    let writers: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(w, f)| {
            std::thread::spawn(move || {
                for rec in 0..RECORDS / 2 {
                    f.write_all_at(&record(w, rec, 2), (rec * RECORD) as u64)
                        .expect("write while the OSS restarts");
                }
                f
            })
        })
        .collect();
    power_cut_oss(&mut c);
    let handles: Vec<std::fs::File> = writers
        .into_iter()
        .map(|t| t.join().expect("writer"))
        .collect();
    wait_recovered(&c);
    assert!(
        c.log("ost0")
            .contains("power-cut model: writes not synced before the stop are dropped"),
        "the restart dropped nothing: the test proves nothing"
    );
    for f in &handles {
        f.sync_all().expect("fsync after recovery");
    }
    let replayed = unstable(&c, "replayed_rpcs");
    assert!(
        replayed.len() == 2 && replayed.iter().all(|n| *n > 0),
        "both mounts replay their unstable writes: {replayed:?}"
    );
    assert_eq!(unstable(&c, "lost_rpcs"), vec![0, 0]);
    let status = c.get_param("obdfilter.*.recovery_status");
    assert!(status.contains("completed_clients: 2/2"), "{status}");
    // Every byte, read back through a new mount.
    let reader = c.mount();
    for w in 0..2 {
        let got = std::fs::read(reader.path().join(format!("writer{w}"))).expect("read");
        assert_eq!(got.len(), RECORDS * RECORD, "writer {w}'s file size");
        for rec in 0..RECORDS {
            let v = if rec < RECORDS / 2 { 2 } else { 1 };
            assert!(
                got[rec * RECORD..(rec + 1) * RECORD] == record(w, rec, v)[..],
                "writer {w}, record {rec}: not version {v}"
            );
        }
    }
}

/// Evicts a client from the OST, once the restarted OSS's admin socket is up.
fn evict(c: &Cluster, uuid: &str) {
    wait_for(
        "the OSS to take evict_client",
        Duration::from_secs(30),
        || {
            c.lode()
                .args(["set-param", &format!("obdfilter.*.evict_client={uuid}")])
                .output()
                .is_ok_and(|o| o.status.success())
        },
    );
}

/// `kill -9` of mount `m` (client `uuid` of the OST), then an OSS power cut that the
/// mount does not live through (evicted, it replays nothing); waits for the recovery.
fn power_cut_without(c: &mut Cluster, m: &Mount, uuid: &str) {
    let pid = m.pid().expect("mount daemon") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the mount");
    lode_testkit::abort_fuse(m.path());
    power_cut_oss(c);
    evict(c, uuid);
    wait_recovered(c);
}

/// The UUID of the last client other than the MDT to connect to the OST.
fn last_client_uuid(c: &Cluster) -> String {
    last_uuid(c, false)
}

/// The UUID of the last client to connect to the OST that is (`mdt`) or is not the
/// MDT.
fn last_uuid(c: &Cluster, mdt: bool) -> String {
    c.log("ost0")
        .lines()
        .rev()
        .filter(|l| l.contains("client connected") && l.contains("mdtlov") == mdt)
        .filter_map(|l| l.split("client=").nth(1))
        .find_map(|r| r.split_whitespace().next())
        .expect("a client connected")
        .to_string()
}

/// The control: the same power cut with the writer gone (its mount killed with the
/// OSS, and evicted) loses the writes the OST had not synced, so the test above proves
/// the replay and not a model that drops nothing.
#[test]
fn without_its_writer_a_power_cut_loses_what_the_oss_had_not_synced() {
    let mut c = power_cut_cluster();
    let m = c.mount();
    let path = m.path().join("lost");
    let f = create(&path);
    f.write_all_at(&record(0, 0, 1), 0).expect("write");
    f.write_all_at(&record(0, 1, 1), RECORD as u64)
        .expect("write");
    wait_for(
        "unstable data on the mount",
        Duration::from_secs(30),
        || unstable(&c, "unstable_rpcs").iter().any(|n| *n > 0),
    );
    let uuid = last_client_uuid(&c);
    power_cut_without(&mut c, &m, &uuid);
    drop(f);
    let status = c.get_param("obdfilter.*.recovery_status");
    assert!(status.contains("replayed_requests: 0"), "{status}");
    let reader = c.mount();
    let got = std::fs::read(reader.path().join("lost")).expect("read");
    assert!(got.is_empty(), "{} bytes survived the power cut", got.len());
}

/// A live writer that could not replay (the restarted OSS ignored it until it was
/// evicted and recovery had ended) gets EIO at its next fsync, once.
#[test]
fn a_write_the_oss_lost_fails_the_next_fsync_once() {
    let mut c = power_cut_cluster();
    let m = c.mount();
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(m.path().join("lost"))
        .expect("create");
    f.write_all_at(&record(0, 0, 1), 0).expect("write");
    wait_for(
        "unstable data on the mount",
        Duration::from_secs(30),
        || unstable(&c, "unstable_rpcs").iter().any(|n| *n > 0),
    );
    let uuid = last_client_uuid(&c);
    let mdt = last_uuid(&c, true);
    // The restarted OSS drops every request, so the mount cannot reconnect and
    // replay; evicted, it is not waited for, and then it may come back. The MDT
    // cannot reconnect either: evicted too, so recovery ends at once.
    c.set_server_args("ost0", &["--fail-loc", "0x101"]);
    power_cut_oss(&mut c);
    evict(&c, &uuid);
    evict(&c, &mdt);
    wait_recovered(&c);
    c.set_param("obdfilter.*.fail_loc=0");
    let e = f.sync_all().expect_err("fsync of a write the OST lost");
    assert_eq!(e.raw_os_error(), Some(nix::libc::EIO), "{e}");
    f.sync_all()
        .expect("the second fsync: the loss is reported once");
    assert!(unstable(&c, "lost_rpcs").iter().any(|n| *n > 0));
    let status = c.get_param("obdfilter.*.recovery_status");
    assert!(status.contains("replayed_requests: 0"), "{status}");
}

/// Writers over `max_unstable_mb` ask the OST for a commit and go on: the caller that
/// finds the replay list full gives back its place in flight first (with every place
/// held by a caller waiting for a commit, no commit could be asked for, and the
/// writers hung: xfstests generic/346 through a mount).
#[test]
fn writers_over_max_unstable_mb_get_a_commit_and_never_wait_for_each_other() {
    let c = cluster(1);
    c.set_param("obdfilter.*.commit_interval_ms=60000");
    std::thread::sleep(Duration::from_millis(300));
    let m = c.mount();
    c.set_param("osc.*.max_unstable_mb=1");
    c.set_param("osc.*.max_rpcs_in_flight=2");
    const WRITERS: usize = 4;
    const WRITES: usize = 64;
    let (tx, rx) = std::sync::mpsc::channel();
    for w in 0..WRITERS {
        let (path, tx) = (m.path().join(format!("f{w}")), tx.clone());
        std::thread::spawn(move || {
            let f = create(&path);
            for i in 0..WRITES {
                f.write_all_at(&record(w, i, 1), (i * RECORD) as u64)
                    .expect("write");
            }
            tx.send(w).expect("report");
        });
    }
    for _ in 0..WRITERS {
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let pid = m.pid().expect("mount daemon") as i32;
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            lode_testkit::abort_fuse(m.path());
            panic!("writers over max_unstable_mb hung");
        }
    }
    // 16 MiB written, the OST committing only when asked: the list stayed near its cap.
    let mb = unstable(&c, "unstable_mb");
    assert!(mb.iter().all(|&n| n <= 2), "unstable MiB per OSC: {mb:?}");
    for w in 0..WRITERS {
        let got = std::fs::read(m.path().join(format!("f{w}"))).expect("read");
        assert_eq!(got.len(), WRITES * RECORD);
        for i in 0..WRITES {
            assert!(
                got[i * RECORD..(i + 1) * RECORD] == record(w, i, 1)[..],
                "writer {w}, record {i}"
            );
        }
    }
}

/// Appends from two mounts, answered and not committed, then an OSS power cut that
/// one of the mounts does not live through: the other's appends are replayed where
/// their replies said they went, not packed at the end of the object as the replay
/// finds it (the dead writer's records, lost with the power cut, leave a hole), and
/// an append after the recovery follows them.
#[test]
fn appends_replayed_after_an_oss_power_cut_land_where_they_were_answered() {
    let mut c = power_cut_cluster();
    let line = |w: usize, i: usize| format!("writer{w} record {i:04} {}\n", "y".repeat(30));
    let len = line(0, 0).len();
    let open = |m: &Mount| {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.path().join("log"))
            .expect("open for appending")
    };
    let append = |mut f: &std::fs::File, w: usize, i: usize| {
        std::io::Write::write_all(&mut f, line(w, i).as_bytes()).expect("append");
    };
    let survivor = c.mount();
    let s = open(&survivor);
    append(&s, 0, 0);
    let victim = c.mount();
    let v = open(&victim);
    append(&v, 1, 0);
    let victim_uuid = last_client_uuid(&c);
    for i in 1..40 {
        append(&s, 0, i);
        append(&v, 1, i);
    }
    wait_for(
        "unstable appends on both mounts",
        Duration::from_secs(30),
        || {
            let u = unstable(&c, "unstable_rpcs");
            u.len() == 2 && u.iter().all(|n| *n > 0)
        },
    );
    power_cut_without(&mut c, &victim, &victim_uuid);
    drop(v);
    assert!(
        unstable(&c, "replayed_rpcs").iter().any(|n| *n > 0),
        "the survivor replays its appends"
    );
    append(&s, 0, 40);
    s.sync_all().expect("fsync");
    let reader = c.mount();
    let got = std::fs::read(reader.path().join("log")).expect("read");
    // The end the OST knew after the recovery: the survivor's last replayed record
    // (the dead writer's after it is gone).
    assert_eq!(
        got.len(),
        80 * len,
        "the survivor's new append ends the file"
    );
    for i in 0..40 {
        let at = 2 * i * len;
        assert_eq!(
            &got[at..at + len],
            line(0, i).as_bytes(),
            "the survivor's record {i} where it was answered"
        );
        if i < 39 {
            assert!(
                got[at + len..at + 2 * len].iter().all(|&b| b == 0),
                "the dead writer's record {i}, lost with the power cut, is a hole"
            );
        }
    }
    assert_eq!(&got[79 * len..], line(0, 40).as_bytes());
}

/// Makes `target` (`mdt` or `obdfilter`) run the next `opcode` request and drop its
/// reply, once.
fn drop_next_reply(c: &Cluster, target: &str, opcode: lode_proto::Opcode) {
    c.set_param(&format!("{target}.*.fail_opc={}", opcode as u16));
    c.set_param(&format!(
        "{target}.*.fail_loc={:#x}",
        lode_rpc::fail::DROP_REPLY | lode_rpc::fail::ONCE
    ));
}

/// Record `i` of an appended log.
fn log_line(i: usize) -> String {
    format!("record {i:04} {}\n", "z".repeat(20))
}

/// `log` on mount `m` (made by `setstripe ARGS` if any, else plainly), open for
/// appending, with its first record appended.
fn append_log(c: &Cluster, m: &Mount, setstripe: &[&str]) -> (std::path::PathBuf, std::fs::File) {
    let path = m.path().join("log");
    if !setstripe.is_empty() {
        let p = arg(&path);
        let mut args = vec!["setstripe"];
        args.extend_from_slice(setstripe);
        args.push(&p);
        lode_ok(c, &args);
    }
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("open for appending");
    std::io::Write::write_all(&mut f, log_line(0).as_bytes()).expect("append");
    (path, f)
}

/// Appends the second and third records to the log of [`append_log`], the second's
/// reply dropped by `target`, which answers its resend; each record lands once.
fn append_with_a_lost_reply(setstripe: &[&str], target: &str, opcode: lode_proto::Opcode) {
    let c = cluster(1);
    let m = c.mount();
    let (path, mut f) = append_log(&c, &m, setstripe);
    drop_next_reply(&c, target, opcode);
    std::io::Write::write_all(&mut f, log_line(1).as_bytes()).expect("append, answered late");
    assert_eq!(
        c.get_param(&format!("{target}.*.fail_loc")),
        "0x0",
        "the append's reply was lost once: what answered it was the resend"
    );
    c.set_param(&format!("{target}.*.fail_opc=0"));
    std::io::Write::write_all(&mut f, log_line(2).as_bytes()).expect("append");
    let got = std::fs::read_to_string(&path).expect("read");
    assert_eq!(got, (0..3).map(log_line).collect::<String>());
}

/// An append whose reply was lost with its OSS (killed after the append ran, its bytes
/// in the page cache) is answered by the restarted OSS from the mark the append left
/// on its object, where the first went, instead of being appended twice.
#[test]
fn an_append_resent_to_a_restarted_oss_lands_once() {
    let mut c = cluster(1);
    let m = c.mount();
    let (path, mut f) = append_log(&c, &m, &[]);
    drop_next_reply(&c, "obdfilter", lode_proto::Opcode::OstWrite);
    std::thread::scope(|sc| {
        let t = sc.spawn(|| std::io::Write::write_all(&mut f, log_line(1).as_bytes()));
        wait_for(
            "the append to run, its reply lost",
            Duration::from_secs(20),
            || c.get_param("obdfilter.*.fail_loc") == "0x0",
        );
        c.kill9("ost0");
        c.start_target("ost0");
        t.join()
            .expect("the appending thread")
            .expect("the append, answered by the restarted OSS");
    });
    std::io::Write::write_all(&mut f, log_line(2).as_bytes()).expect("append");
    let got = std::fs::read_to_string(&path).expect("read");
    assert_eq!(got, (0..3).map(log_line).collect::<String>());
}

/// The same for a Data-on-MDT file, whose appends the MDT places: a DOM_WRITE's reply
/// record answers its resend.
#[test]
fn an_append_to_a_dom_file_whose_reply_was_lost_lands_once() {
    append_with_a_lost_reply(
        &["-E", "1M", "-L", "mdt"],
        "mdt",
        lode_proto::Opcode::DomWrite,
    );
}

/// An append whose reply is lost is sent again, and the OST answers the resend with
/// where the first went instead of appending it twice.
#[test]
fn an_append_whose_reply_was_lost_lands_once() {
    append_with_a_lost_reply(&[], "obdfilter", lode_proto::Opcode::OstWrite);
}
