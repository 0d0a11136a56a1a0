//! How replies reach their callers: a thread blocked in a call reads its own reply
//! (leader/follower), tasks on the runtime get theirs from the import's reader thread,
//! and both kinds share one import, its tags and its reconnects.

mod common;

use common::*;
use lode_base::Fid;
use lode_client::Session;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The tests of this file run one at a time: every client's MDT import has a reader
/// thread of the same name, and one test counts the wake-ups of its own (another
/// test's, found by the same name, made it see nonsense).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The id and voluntary context switches of this process's newest thread named
/// `comm`.
fn thread_switches(comm: &str) -> Option<(u64, u64)> {
    // The newest thread of that name: an earlier test's client may still be letting
    // its reader go.
    let tid = std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|n| n.trim() == comm))
        .filter_map(|t| t.file_name().to_str()?.parse::<u64>().ok())
        .max()?;
    Some((tid, switches_of(tid)?))
}

/// Voluntary context switches of thread `tid` of this process.
fn switches_of(tid: u64) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Creates, stats, looks up and unlinks `n` files named `{tag}-{i}` in `dir`, checking
/// every answer against the request it belongs to.
async fn churn(s: &lode_client::Client, dir: Fid, tag: &str, n: usize) -> Result<(), String> {
    let r = root();
    for i in 0..n {
        let name = format!("{tag}-{i}");
        let made = s
            .create(&r, dir, name.as_bytes(), 0o600 | (i as u32 % 0o100), None)
            .await
            .map_err(|e| format!("create {name}: {e}"))?;
        let attr = s
            .getattr(&r, made.attr.fid)
            .await
            .map_err(|e| format!("getattr {name}: {e}"))?;
        if attr.fid != made.attr.fid || attr.mode != made.attr.mode {
            return Err(format!(
                "getattr {name} answered for another file: {attr:?}"
            ));
        }
        let found = s
            .lookup(&r, dir, name.as_bytes())
            .await
            .map_err(|e| format!("lookup {name}: {e}"))?;
        if found.attr.fid != made.attr.fid {
            return Err(format!("lookup {name} found {}", found.attr.fid));
        }
        s.unlink(&r, dir, name.as_bytes())
            .await
            .map_err(|e| format!("unlink {name}: {e}"))?;
    }
    Ok(())
}

#[test]
fn blocked_threads_and_runtime_tasks_share_one_import_and_each_gets_its_own_reply() {
    let _one_at_a_time = serial();
    let c = cluster(1);
    let s = Arc::new(c.client());
    let dir = s.run(mkdir_p(&s.client, "/mixed"));
    // Tasks on the runtime (their replies come through the reader thread)...
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let s = s.clone();
            s.handle().spawn({
                let s = s.clone();
                async move { churn(&s.client, dir, &format!("task{t}"), 150).await }
            })
        })
        .collect();
    // ...while threads blocked in calls read replies for themselves and each other.
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || s.run(churn(&s.client, dir, &format!("thread{t}"), 150)))
        })
        .collect();
    let mut failures = Vec::new();
    for t in threads {
        if let Err(e) = t.join().expect("thread") {
            failures.push(e);
        }
    }
    for t in tasks {
        if let Err(e) = s.run(t).expect("task") {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "wrong answers: {failures:#?}");
    let left = s
        .run(s.client.readdir_all(&root(), dir, false))
        .expect("readdir");
    assert!(
        left.iter().all(|e| e.name == b"." || e.name == b".."),
        "every file was unlinked"
    );
}

#[test]
fn a_blocked_caller_reads_its_own_reply_without_the_reader_thread() {
    let _one_at_a_time = serial();
    let c = cluster(1);
    let s: Session = c.client();
    let dir = s.run(mkdir_p(&s.client, "/alone"));
    // Thread names are cut to 15 bytes.
    let reader: String = "rd-testfs-MDT0000".chars().take(15).collect();
    let (tid, before) = thread_switches(&reader).expect("the MDT import has a reader thread");
    s.run(churn(&s.client, dir, "f", 300)).expect("churn");
    let after = switches_of(tid).expect("reader thread still there");
    // 1,200 calls; the idle reader thread only wakes up every 200 ms to look around.
    assert!(
        after - before < 100,
        "the reader thread woke {} times for 1,200 calls made by a blocked caller",
        after - before
    );
}

#[test]
fn blocked_callers_wait_through_an_mds_restart_and_get_their_answers() {
    let _one_at_a_time = serial();
    let mut c = cluster(1);
    let mut cfg = c.client_config();
    cfg.timeout = Duration::from_secs(60);
    cfg.resend_interval = Duration::from_millis(500);
    let s = Arc::new(Session::connect(cfg).expect("connect"));
    let dir = s.run(mkdir_p(&s.client, "/restart"));
    let files: Vec<Fid> = (0..4)
        .map(|i| {
            s.run(
                s.client
                    .create(&root(), dir, format!("f{i}").as_bytes(), 0o644, None),
            )
            .expect("create")
            .attr
            .fid
        })
        .collect();
    s.run(s.client.sync()).expect("sync");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads: Vec<_> = files
        .iter()
        .map(|&fid| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut calls = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || calls < 50 {
                    let attr = s
                        .run(s.client.getattr(&root(), fid))
                        .map_err(|e| format!("getattr {fid}: {e}"))?;
                    if attr.fid != fid {
                        return Err(format!("getattr {fid} answered for {}", attr.fid));
                    }
                    calls += 1;
                }
                Ok(calls)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    c.kill9("mdt0");
    std::thread::sleep(Duration::from_millis(300));
    c.start_target("mdt0");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in threads {
        let calls = t.join().expect("thread").expect("every call answered");
        assert!(calls >= 50);
    }
}

#[test]
fn calls_joined_on_one_blocked_thread_are_all_answered() {
    let _one_at_a_time = serial();
    let c = cluster(2);
    let s = c.client();
    let dir = s.run(mkdir_p(&s.client, "/joined"));
    let r = root();
    let made: Vec<Fid> = (0..16)
        .map(|i| {
            s.run(
                s.client
                    .create(&r, dir, format!("f{i}").as_bytes(), 0o644, None),
            )
            .expect("create")
            .attr
            .fid
        })
        .collect();
    // Sixteen MDT calls, then a statfs that asks both OSTs at once, from one thread:
    // none may read for itself while the others wait on the same thread.
    let found = s.run(futures::future::join_all((0..16).map(|i| {
        let (cl, r) = (&s.client, &r);
        async move { cl.lookup(r, dir, format!("f{i}").as_bytes()).await }
    })));
    for (i, f) in found.into_iter().enumerate() {
        assert_eq!(f.expect("lookup").attr.fid, made[i], "lookup f{i}");
    }
    let st = s.run(s.client.statfs()).expect("statfs");
    assert!(st.blocks > 0, "statfs summed the OSTs: {st:?}");
}
