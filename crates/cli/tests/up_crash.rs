//! `lode up` after a crash, as a user runs it: every process of an instance killed
//! with SIGKILL (servers and mount daemon, a writer busy on the mount, pid files left
//! torn) comes back with a bare `lode up --dir D` on the same mount and ports, with
//! everything fsynced intact; a server that cannot start (a corrupt MDT store) makes
//! `lode up` fail fast with the server's own error line and leaves nothing running.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn lode() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lode"))
}

/// Pids of the lode processes whose command line names `dir`.
fn lode_pids_for(dir: &Path) -> Vec<i32> {
    let d = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let c = std::fs::read(e.path().join("cmdline")).ok()?;
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            (c.contains("lode") && c.contains(&d) && pid != std::process::id() as i32)
                .then_some(pid)
        })
        .collect()
}

fn kill_all(dir: &Path) {
    for pid in lode_pids_for(dir) {
        // SAFETY: a signal to a process of this test's instance.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    lode_testkit::wait_for("every lode process to die", Duration::from_secs(15), || {
        lode_pids_for(dir).iter().all(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).map_or(true, |s| s.contains(") Z "))
        })
    });
}

/// A port base below the ephemeral range, distinct per test process and test.
fn port_base(n: u16) -> u16 {
    21000 + (std::process::id() % 500) as u16 * 20 + n * 10
}

/// Stops the instance in `dir` when the test ends, passed or not: a failed test must
/// not leave servers and a mount behind.
struct Instance(std::path::PathBuf);

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = lode().arg("down").arg("--dir").arg(&self.0).output();
        for pid in lode_pids_for(&self.0) {
            // SAFETY: a signal to a process of this test's instance.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

fn up(args: &[&str]) -> std::process::Output {
    lode().arg("up").args(args).output().expect("run lode up")
}

#[test]
fn a_bare_lode_up_brings_back_an_instance_killed_whole_with_its_fsynced_data() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = t.path().join("inst");
    let _cleanup = Instance(dir.clone());
    let d = dir.to_str().expect("utf-8 path");
    let base = port_base(0).to_string();
    let out = up(&["--dir", d, "--port-base", &base]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mnt = std::fs::canonicalize(dir.join("mnt")).expect("mount point");

    // Data made durable before the crash.
    let mut f = std::fs::File::create(mnt.join("durable")).expect("create");
    f.write_all(b"fsynced before the crash").expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    std::fs::create_dir(mnt.join("dir")).expect("mkdir");
    std::fs::write(mnt.join("dir/inner"), b"inner").expect("write inner");
    std::fs::File::open(mnt.join("dir/inner"))
        .and_then(|f| f.sync_all())
        .expect("fsync inner");

    // A writer busy on the mount while everything dies at once.
    let busy = mnt.clone();
    let writer = std::thread::spawn(move || {
        for i in 0..100_000 {
            if std::fs::write(busy.join(format!("w{}", i % 50)), b"busy").is_err() {
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    kill_all(&dir);
    let _ = writer.join();
    // What a power cut leaves of pid files.
    std::fs::write(dir.join("mdt0.pid"), b"").expect("empty pid file");
    std::fs::write(dir.join("ost0.pid"), b"9999999\n").expect("stale pid file");

    let start = Instant::now();
    let out = up(&["--dir", d]);
    let took = start.elapsed();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bare lode up after the crash: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!("127.0.0.1:{base}"))
            && said.contains(&format!("mounted on {}", mnt.display())),
        "same ports and mount point: {said}"
    );
    assert!(took < Duration::from_secs(10), "back within 10 s: {took:?}");
    eprintln!("back in {took:?}");
    assert_eq!(
        std::fs::read(mnt.join("durable")).expect("read after restart"),
        b"fsynced before the crash"
    );
    assert_eq!(
        std::fs::read(mnt.join("dir/inner")).expect("inner"),
        b"inner"
    );
    let st = lode()
        .args(["status", "--dir", d])
        .output()
        .expect("status");
    let st = String::from_utf8_lossy(&st.stdout);
    assert_eq!(st.lines().filter(|l| l.contains(" up ")).count(), 4, "{st}");

    // Only the servers dead, the mount daemon alive: lode up restarts them and the
    // mount reconnects by itself.
    // Waited for: a server killed a moment ago still looks alive to `lode up`, which
    // would then leave it down and start it only on the next call.
    kill_all(&dir.join("ost1"));
    let out = up(&["--dir", d]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(mnt.join("durable")).expect("read"),
        b"fsynced before the crash"
    );
    // A live instance: nothing to do.
    let out = up(&["--dir", d]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("already running"));

    let out = lode().args(["down", "--dir", d]).output().expect("down");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn lode_up_on_a_corrupt_mdt_store_fails_fast_with_the_mdts_own_error() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = t.path().join("inst");
    let _cleanup = Instance(dir.clone());
    let d = dir.to_str().expect("utf-8 path");
    let base = port_base(1).to_string();
    let out = up(&["--dir", d, "--port-base", &base]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = lode().args(["down", "--dir", d]).output().expect("down");
    assert!(out.status.success());
    std::fs::write(dir.join("mdt0/db/CURRENT"), b"garbage, not a manifest name")
        .expect("corrupt CURRENT");

    let start = Instant::now();
    let out = up(&["--dir", d]);
    let took = start.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a corrupt MDT cannot come up");
    assert!(
        took < Duration::from_secs(10),
        "fails within 10 s: {took:?}"
    );
    assert!(
        err.contains("mdt0 exited") && err.contains("mdt0.log"),
        "names the server, its exit and its log: {err}"
    );
    assert!(
        err.to_lowercase().contains("corrupt"),
        "carries the MDT's own error line: {err}"
    );
    lode_testkit::wait_for("nothing left running", Duration::from_secs(15), || {
        lode_pids_for(&dir).is_empty()
    });
}

/// A torn `up.conf` (which its durable write prevents, but a disk can still do) is
/// reported in one line naming the file, and nothing is started.
#[test]
fn a_damaged_up_conf_is_reported_in_one_line() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = t.path().join("inst");
    let _cleanup = Instance(dir.clone());
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("up.conf"), b"fsname=lo").expect("torn up.conf");
    let d = dir.to_str().expect("utf-8 path");
    let start = Instant::now();
    let out = up(&["--dir", d]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(start.elapsed() < Duration::from_secs(5), "no wait");
    assert!(
        err.contains("up.conf is damaged") && err.lines().count() == 1,
        "one line naming the file: {err}"
    );
    assert!(lode_pids_for(&dir).is_empty(), "nothing started");
}
