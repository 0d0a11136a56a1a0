//! `lode up` / `lode down` / `lode status` and `lode mount` refusals, as a user runs them.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

fn lode() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lode"))
}

fn lode_processes_for(dir: &Path) -> usize {
    let d = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("lode") && c.contains(&d))
        .count()
}

/// Runs `lode up` (through `cmd`, a lode binary) on `dir` with ports from `base`, which
/// must succeed; returns what it printed.
fn up_with(mut cmd: Command, dir: &Path, base: u16) -> String {
    cmd.args(["up", "--dir"])
        .arg(dir)
        .args(["--port-base", &base.to_string()]);
    // A binary just copied can be "busy" for a moment: a process another test thread
    // forked meanwhile holds the copy's write descriptor until it execs.
    let mut tries = 0;
    let out = loop {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.unwrap(),
        }
    };
    assert!(
        out.status.success(),
        "up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Runs `lode down` on `dir`, which must succeed.
fn down(dir: &Path) {
    let out = lode().args(["down", "--dir"]).arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "down: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn up_then_down_twice_leaves_nothing_behind_and_keeps_data() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("data");
    // Below the ephemeral port range (32768+), so free_port() of other tests never collides.
    let base = 20000 + (std::process::id() % 1200) as u16 * 10;
    let up = || up_with(lode(), &dir, base);
    let mnt = dir.join("mnt");
    for round in 0..2 {
        let said = up();
        assert!(said.contains("mounted on"), "{said}");
        assert!(lode_testkit::is_mounted(
            &std::fs::canonicalize(&mnt).unwrap()
        ));
        // Running it again on a live file system says so.
        assert!(up().contains("already running"));
        if round == 0 {
            std::fs::write(mnt.join("kept"), b"across restarts").unwrap();
        } else {
            assert_eq!(std::fs::read(mnt.join("kept")).unwrap(), b"across restarts");
        }
        let st = lode().args(["status", "--dir"]).arg(&dir).output().unwrap();
        let st = String::from_utf8_lossy(&st.stdout);
        assert_eq!(st.lines().filter(|l| l.contains(" up ")).count(), 4, "{st}");
        assert!(st.contains("mounted"), "{st}");
        down(&dir);
        assert!(!lode_testkit::is_mounted(
            &std::fs::canonicalize(&mnt).unwrap()
        ));
        lode_testkit::wait_for(
            "lode processes to exit",
            std::time::Duration::from_secs(15),
            || lode_processes_for(&dir) == 0,
        );
    }
}

/// `lode down` at once after `lode up` (the mount may still be registering its ring
/// entries when it is unmounted) is a clean stop: no failure in the mount's log.
#[test]
fn down_at_once_after_up_leaves_no_failure_in_the_mount_log() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("data");
    let base = 20005 + (std::process::id() % 1200) as u16 * 10;
    // The window is a few milliseconds wide: several rounds to meet it.
    for round in 0..8 {
        up_with(lode(), &dir, base);
        down(&dir);
        lode_testkit::wait_for(
            "lode processes to exit",
            std::time::Duration::from_secs(15),
            || lode_processes_for(&dir) == 0,
        );
        let log = std::fs::read_to_string(dir.join("mount.log")).unwrap();
        let bad: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("lode: mount:") || l.contains(" ERROR ") || l.contains(" WARN "))
            .collect();
        assert!(bad.is_empty(), "round {round}: {bad:?}");
    }
}

/// `lode down` stops what `lode up` started even when that was a copy of the binary
/// under another name (one that starts with `lode`).
#[test]
fn down_stops_servers_started_by_a_renamed_copy_of_lode() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("data");
    let copy = t.path().join("lodefs-copy");
    std::fs::copy(env!("CARGO_BIN_EXE_lode"), &copy).unwrap();
    let base = 21000 + (std::process::id() % 1000) as u16 * 10;
    up_with(Command::new(&copy), &dir, base);
    assert!(
        lode_processes_for(&dir) >= 5,
        "four servers and a mount run"
    );
    down(&dir);
    lode_testkit::wait_for(
        "the copy's processes to exit",
        std::time::Duration::from_secs(15),
        || lode_processes_for(&dir) == 0,
    );
}

fn fails_with(cmd: &mut Command, words: &str) {
    let out = cmd.output().expect("run lode");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure; stderr: {err}");
    assert!(
        err.contains(words),
        "stderr {err:?} should mention {words:?}"
    );
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
}

#[test]
fn mount_refuses_bad_mount_points_and_sources() {
    let c = cluster(1);
    let src = format!("{}:/{}", c.mgs_addr, c.fsname);
    let t = tempfile::tempdir().unwrap();
    fails_with(
        lode().args(["mount", &src]).arg(t.path().join("missing")),
        "No such file or directory",
    );
    let full = t.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), b"").unwrap();
    fails_with(lode().args(["mount", &src]).arg(&full), "not empty");
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails_with(
        lode()
            .args(["mount", "127.0.0.1:1:/testfs"])
            .arg(&empty)
            .env("LODE_LOG", "off"),
        "no answer",
    );
    fails_with(
        lode()
            .args(["mount", &format!("{}:/wrongfs", c.mgs_addr)])
            .arg(&empty),
        "wrong file system name",
    );
    fails_with(
        lode().args(["mount", "nonsense"]).arg(&empty),
        "expected MGS_HOST:PORT:/FSNAME",
    );
    assert!(
        !lode_testkit::is_mounted(&std::fs::canonicalize(&empty).unwrap()),
        "nothing left mounted"
    );
    // A mount point that is already a lode mount is refused.
    let m = c.mount();
    fails_with(
        lode().args(["mount", &src]).arg(m.path()),
        "already mounted",
    );
    // Daemonized mount, then lode umount.
    let out = lode().args(["mount", &src]).arg(&empty).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let abs = std::fs::canonicalize(&empty).unwrap();
    assert!(lode_testkit::is_mounted(&abs));
    std::fs::write(abs.join("f"), b"data").unwrap();
    // An unsupported ioctl (Python's isatty check on every open) makes the mount log a
    // line; with no log file that once went into a pipe nobody read, killing the mount.
    let f = std::fs::File::open(abs.join("f")).unwrap();
    let mut tio = std::mem::MaybeUninit::<libc::termios>::uninit();
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::TCGETS,
            tio.as_mut_ptr(),
        )
    };
    assert_eq!(r, -1, "not a terminal");
    drop(f);
    assert_eq!(
        std::fs::read(abs.join("f")).unwrap(),
        b"data",
        "the mount lives on"
    );
    let out = lode().args(["umount"]).arg(&abs).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!lode_testkit::is_mounted(&abs));
    fails_with(lode().args(["umount"]).arg(&abs), "not a lode mount");
}

#[test]
fn a_server_restart_while_mounted_is_waited_for() {
    let mut c = cluster(1);
    let m = c.mount();
    let f = m.path().join("f");
    std::fs::write(&f, b"before").unwrap();
    c.kill9("mdt0");
    let p = f.clone();
    let waiter = std::thread::spawn(move || std::fs::write(p.with_file_name("g"), b"during"));
    std::thread::sleep(std::time::Duration::from_millis(500));
    c.start_target("mdt0");
    waiter
        .join()
        .unwrap()
        .expect("the write waited for the MDT and succeeded");
    assert_eq!(std::fs::read(m.path().join("g")).unwrap(), b"during");
    assert_eq!(std::fs::read(&f).unwrap(), b"before");
}

#[test]
fn lfs_commands_on_a_mount() {
    let c = cluster(2);
    let m = c.mount();
    let run = |args: &[&str]| {
        let out = lode().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let mp = m.path().to_str().unwrap().to_string();
    let f = format!("{mp}/wide");
    run(&["setstripe", "-c", "2", "-S", "128k", &f]);
    let g = run(&["getstripe", &f]);
    assert!(
        g.contains("lmm_stripe_count:  2\nlmm_stripe_size:   131072\nlmm_pattern:       raid0"),
        "{g}"
    );
    assert_eq!(run(&["getstripe", "-c", &f]), "2\n");
    assert_eq!(run(&["getstripe", "-S", &f]), "131072\n");
    std::fs::write(&f, vec![5u8; 1 << 20]).unwrap();
    assert_eq!(std::fs::read(&f).unwrap(), vec![5u8; 1 << 20]);
    // A file with data keeps its layout.
    let out = lode().args(["setstripe", "-c", "1", &f]).output().unwrap();
    assert!(!out.status.success());
    // Directory default layout, inherited by new files.
    let d = format!("{mp}/d");
    std::fs::create_dir(&d).unwrap();
    run(&["setstripe", "-c", "-1", &d]);
    assert!(run(&["getstripe", "-d", &d]).contains("stripe_count:  -1 stripe_size:   1048576"));
    std::fs::write(format!("{d}/inner"), b"x").unwrap();
    assert_eq!(run(&["getstripe", "-c", &format!("{d}/inner")]), "2\n");
    // path2fid / fid2path round trip, hard links included.
    std::fs::create_dir_all(format!("{mp}/a/b")).unwrap();
    std::fs::hard_link(&f, format!("{mp}/a/b/link")).unwrap();
    let fid = run(&["path2fid", &f]).trim().to_string();
    assert!(fid.starts_with("[0x") && fid.ends_with(']'), "{fid}");
    let paths = run(&["fid2path", &mp, &fid]);
    let mut got: Vec<&str> = paths.lines().collect();
    got.sort();
    assert_eq!(got, vec![format!("{mp}/a/b/link"), f.clone()]);
    let df = run(&["df", &mp]);
    assert!(df.starts_with("UUID"), "{df}");
    assert!(
        df.contains("testfs-OST0001_UUID") && df.contains("filesystem_summary:"),
        "{df}"
    );
    assert!(run(&["df", "-i", &mp]).contains("Inodes"));
    // Both OSTs of `lode up` share one disk: the summary counts it once, as df(1).
    let kib = |line: &str| -> u64 {
        let f: Vec<&str> = line.split_whitespace().collect();
        f[1].parse().expect("1K-blocks")
    };
    let rows: Vec<&str> = df.lines().collect();
    let ost0 = rows
        .iter()
        .find(|l| l.contains("-OST0000_UUID"))
        .expect("OST0000");
    let sum = rows
        .iter()
        .find(|l| l.starts_with("filesystem_summary:"))
        .expect("summary");
    assert_eq!(kib(sum), kib(ost0), "{df}");
    let st = nix::sys::statvfs::statvfs(mp.as_str()).expect("statvfs");
    let disk = st.blocks() * st.fragment_size() / 1024;
    assert!(
        disk.abs_diff(kib(ost0)) <= disk / 100,
        "df {disk} KiB: {df}"
    );
}

#[test]
fn entry_timeout_zero_sees_other_clients_at_once_default_within_its_timeout() {
    let c = cluster(1);
    let strict = c.mount_with(&["attr_timeout=0", "entry_timeout=0"]);
    let cached = c.mount();
    // Both look the name up while it does not exist (the default mount caches that).
    assert!(!strict.path().join("n").exists());
    assert!(!cached.path().join("n").exists());
    let s = c.client();
    s.run(
        s.client
            .create(&root(), lode_base::Fid::ROOT, b"n", 0o644, None),
    )
    .unwrap();
    assert!(
        strict.path().join("n").exists(),
        "a strict mount sees another client's create at once"
    );
    lode_testkit::wait_for(
        "the default mount to see it",
        std::time::Duration::from_secs(5),
        || cached.path().join("n").exists(),
    );
    // Removal by another client likewise.
    s.run(s.client.unlink(&root(), lode_base::Fid::ROOT, b"n"))
        .unwrap();
    assert!(!strict.path().join("n").exists());
    lode_testkit::wait_for(
        "the default mount to lose it",
        std::time::Duration::from_secs(5),
        || !cached.path().join("n").exists(),
    );
}

#[test]
fn get_param_finds_the_servers_of_lode_up_in_the_current_directory() {
    let t = tempfile::tempdir().unwrap();
    // Its own port range, apart from the other up/down test's, below the ephemeral range.
    let base = 8000 + (std::process::id() % 1000) as u16 * 10;
    let run = |args: &[&str]| {
        let out = lode()
            .args(args)
            .current_dir(t.path())
            .env_remove("LODE_RUN_DIR")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, _, err) = run(&["up", "--port-base", &base.to_string()]);
    assert!(ok, "up: {err}");
    let (ok, out, err) = run(&["get-param", "-n", "mdt.*.num_exports"]);
    let (down_ok, _, down_err) = run(&["down"]);
    assert!(ok, "get-param after lode up, with no LODE_RUN_DIR: {err}");
    assert_eq!(out.trim(), "1", "the mount is the MDT's one export");
    assert!(down_ok, "down: {down_err}");
}
