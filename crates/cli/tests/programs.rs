//! Real programs on a lode mount: tar, git, cp, rsync, sqlite3 (and diff to check).

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs a command to success and returns its stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cmd(prog: &str, args: &[&str]) -> Command {
    let mut c = Command::new(prog);
    c.args(args);
    c
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `diff -r` finds no difference.
fn same_tree(a: &Path, b: &Path) {
    run(&mut cmd("diff", &["-r", "--no-dereference", s(a), s(b)]));
}

/// A snapshot of the workspace's crates/ outside the mount: the tarball and its extraction.
/// (The source tree itself may change while the tests run, so compare to the snapshot.)
struct Snapshot {
    dir: tempfile::TempDir,
}

impl Snapshot {
    fn take() -> Snapshot {
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("archive.tar");
        // The workspace root; files edited meanwhile make tar exit 1 ("changed as we read it").
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let st = cmd("tar", &["-C", root, "-cf", s(&tar), "crates"])
            .status()
            .unwrap();
        assert!(
            matches!(st.code(), Some(0 | 1)),
            "tar -c of the sources: {st}"
        );
        let tree = dir.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        run(&mut cmd("tar", &["-C", s(&tree), "-xf", s(&tar)]));
        Snapshot { dir }
    }
    fn tar(&self) -> std::path::PathBuf {
        self.dir.path().join("archive.tar")
    }
    /// The extracted `crates` directory.
    fn tree(&self) -> std::path::PathBuf {
        self.dir.path().join("tree/crates")
    }
}

#[test]
fn tar_extracts_a_source_tree() {
    let snap = Snapshot::take();
    let c = cluster(2);
    let m = c.mount();
    let dst = m.path().join("x");
    std::fs::create_dir(&dst).unwrap();
    run(&mut cmd("tar", &["-C", s(&dst), "-xpf", s(&snap.tar())]));
    same_tree(&snap.tree(), &dst.join("crates"));
    // tar --compare finds the same modes, times, sizes and contents.
    run(&mut cmd(
        "tar",
        &["-C", s(&dst), "--compare", "-f", s(&snap.tar())],
    ));
    // tar can archive the mount's copy again, with the same members.
    let again = snap.dir.path().join("again.tar");
    run(&mut cmd(
        "tar",
        &["-C", s(&dst), "-cf", s(&again), "crates"],
    ));
    let list = |t: &Path| {
        let mut v: Vec<String> = run(&mut cmd("tar", &["-tf", s(t)]))
            .lines()
            .map(String::from)
            .collect();
        v.sort();
        v
    };
    assert_eq!(list(&again), list(&snap.tar()));
}

#[test]
fn git_init_add_commit_log_fsck() {
    let snap = Snapshot::take();
    let c = cluster(2);
    let m = c.mount();
    let repo = m.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    run(&mut cmd("cp", &["-r", s(&snap.tree()), s(&repo)]));
    let git = |args: &[&str]| {
        let mut c = cmd(
            "git",
            &["-c", "user.name=Lode Test", "-c", "user.email=t@lode.test"],
        );
        c.args(["-c", "init.defaultBranch=main", "-C", s(&repo)])
            .args(args);
        c.env("GIT_CONFIG_NOSYSTEM", "1").env("HOME", m.path());
        run(&mut c)
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "first"]);
    std::fs::write(repo.join("crates/new.txt"), "second\n").unwrap();
    git(&["add", "crates/new.txt"]);
    git(&["commit", "-q", "-m", "second"]);
    let log = git(&["log", "--format=%s"]);
    assert_eq!(log.lines().collect::<Vec<_>>(), ["second", "first"]);
    git(&["fsck", "--full", "--strict"]);
    assert_eq!(git(&["status", "--porcelain"]), "");
    git(&["gc", "-q"]);
    git(&["fsck", "--full"]);
    let files = git(&["ls-files"]);
    assert!(files.lines().count() > 20, "ls-files: {files}");
    // A clone on the mount checks out the same tree.
    let clone = m.path().join("clone");
    run(&mut cmd("git", &["clone", "-q", s(&repo), s(&clone)]));
    same_tree(&repo.join("crates"), &clone.join("crates"));
}

#[test]
fn cp_a_copies_a_tree() {
    let snap = Snapshot::take();
    let c = cluster(2);
    let m = c.mount();
    let dst = m.path().join("copy");
    run(&mut cmd("cp", &["-a", s(&snap.tree()), s(&dst)]));
    same_tree(&snap.tree(), &dst);
    // -a keeps modes and times; a second copy from the mount to the mount too.
    let md = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).unwrap();
        (m.mode(), m.mtime(), m.len())
    };
    let f = "cli/Cargo.toml";
    assert_eq!(md(&dst.join(f)), md(&snap.tree().join(f)));
    run(&mut cmd("cp", &["-a", s(&dst), s(&m.path().join("copy2"))]));
    same_tree(&snap.tree(), &m.path().join("copy2"));
}

#[test]
fn rsync_a_copies_a_tree() {
    let snap = Snapshot::take();
    let c = cluster(2);
    let m = c.mount();
    let dst = m.path().join("sync");
    let src = format!("{}/", s(&snap.tree()));
    run(&mut cmd("rsync", &["-a", &src, s(&dst)]));
    same_tree(&snap.tree(), &dst);
    // A second run finds nothing to transfer.
    let out = run(&mut cmd(
        "rsync",
        &["-a", "--itemize-changes", &src, s(&dst)],
    ));
    assert_eq!(out, "", "second rsync transferred: {out}");
}

#[test]
fn sqlite3_transaction_of_1000_rows() {
    let c = cluster(2);
    let m = c.mount();
    let db = m.path().join("db/test.sqlite");
    std::fs::create_dir(db.parent().unwrap()).unwrap();
    let mut sql = String::from("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);\nBEGIN;\n");
    for i in 0..1000 {
        sql += &format!(
            "INSERT INTO t(v) VALUES ('row {i} {}');\n",
            "x".repeat(i % 50)
        );
    }
    sql += "COMMIT;\n";
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), sql).unwrap();
    let read = format!(".read {}", s(script.path()));
    run(&mut cmd("sqlite3", &[s(&db), &read]));
    let q = |q: &str| run(&mut cmd("sqlite3", &[s(&db), q])).trim().to_string();
    assert_eq!(q("SELECT count(*) FROM t;"), "1000");
    assert_eq!(
        q("SELECT v FROM t WHERE id = 1000;"),
        format!("row 999 {}", "x".repeat(49))
    );
    assert_eq!(q("PRAGMA integrity_check;"), "ok");
    // WAL mode too.
    assert_eq!(q("PRAGMA journal_mode=WAL;"), "wal");
    assert_eq!(
        q("DELETE FROM t WHERE id % 2 = 0; SELECT count(*) FROM t;"),
        "500"
    );
    assert_eq!(q("PRAGMA integrity_check;"), "ok");
}

/// Programs probe files with ioctls (Python asks TCGETS of every file it opens): each
/// gets ENOTTY, is counted in `llite.*.unsupported_ioctls`, and is logged once per
/// command number, not once per call.
#[test]
fn an_unsupported_ioctl_is_enotty_counted_and_logged_once() {
    use std::os::fd::AsRawFd;
    let c = cluster(1);
    let m = c.mount();
    let p = m.path().join("plain");
    std::fs::write(&p, b"x").expect("create");
    for _ in 0..20 {
        let f = std::fs::File::open(&p).expect("open");
        let mut t = std::mem::MaybeUninit::<libc::termios>::uninit();
        // SAFETY: TCGETS with a termios buffer on an open descriptor.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TCGETS, t.as_mut_ptr()) };
        assert_eq!(r, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOTTY),
            "not a terminal"
        );
    }
    let counts = c.get_param("llite.*.unsupported_ioctls");
    assert!(
        counts.lines().any(|l| l.trim() == "0x00005401 20"),
        "TCGETS counted 20 times: {counts:?}"
    );
    let log = m.log();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("ioctl not supported"))
            .count(),
        1,
        "logged once:\n{log}"
    );
}
