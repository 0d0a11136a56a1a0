//! `lode scan` through a real mount: the first scan records the tree, a scan with
//! nothing changed reads no directory, and a scan after a random change set (made
//! through the mount and by another client) prints exactly the entries created and
//! removed, reading only the directories that changed. A damaged record is refused
//! with a clear message.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Runs `lode scan`; returns (stdout lines as a set, stderr).
fn scan(c: &lode_testkit::Cluster, db: &Path, tree: &Path) -> (BTreeSet<String>, String) {
    let out = c
        .lode()
        .args(["scan", "--db"])
        .arg(db)
        .arg(tree)
        .output()
        .expect("run lode scan");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "lode scan failed: {err}");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    (lines, err)
}

/// The number before `what` in the summary line.
fn summary(err: &str, what: &str) -> u64 {
    let words: Vec<&str> = err.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[1].trim_start_matches('(').trim_end_matches([')', ',']) == what)
        .and_then(|w| w[0].trim_start_matches('(').parse().ok())
        .unwrap_or_else(|| panic!("no {what} in {err:?}"))
}

#[test]
fn an_incremental_scan_finds_exactly_the_created_and_removed_entries() {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    println!("seed {seed}");
    let mut rng = Prng(seed);
    let c = cluster(1);
    let m = c.mount();
    let tree = m.path().join("tree");
    const DIRS: usize = 12;
    const FILES: usize = 25;
    for d in 0..DIRS {
        let dir = tree.join(format!("d{d}"));
        fs::create_dir_all(dir.join("sub")).expect("mkdir");
        for f in 0..FILES {
            fs::write(dir.join(format!("f{f}")), b"x").expect("create");
        }
        fs::write(dir.join("sub").join("deep"), b"y").expect("create deep");
    }
    let work = tempfile::tempdir().expect("tempdir");
    let db = work.path().join("scan.db");

    let (lines, err) = scan(&c, &db, &tree);
    assert!(
        lines.is_empty(),
        "a first scan prints no changes: {lines:?}"
    );
    assert!(err.contains("first scan"), "{err}");
    let all_dirs = summary(&err, "directories");
    assert_eq!(all_dirs, 1 + 2 * DIRS as u64);

    let (lines, err) = scan(&c, &db, &tree);
    assert!(lines.is_empty(), "nothing changed: {lines:?}");
    assert_eq!(summary(&err, "read"), 0, "no directory read again: {err}");

    // A random change set, through the mount and from another client.
    let mut want = BTreeSet::new();
    let mut changed_dirs = BTreeSet::new();
    let s = c.client();
    let r = root();
    for i in 0..15 {
        let d = rng.below(DIRS as u64);
        let f = rng.below(FILES as u64);
        let rel = format!("d{d}/f{f}");
        let path = tree.join(&rel);
        if path.exists() {
            if rng.chance(50) {
                fs::remove_file(&path).expect("unlink");
            } else {
                let dir = fid(&s, &format!("/tree/d{d}")).expect("dir fid");
                s.run(s.client.unlink(&r, dir, format!("f{f}").as_bytes()))
                    .expect("unlink elsewhere");
            }
            if !want.remove(&format!("+ {rel}")) {
                want.insert(format!("- {rel}"));
            }
        } else {
            fs::write(&path, b"again").expect("re-create");
            if !want.remove(&format!("- {rel}")) {
                want.insert(format!("+ {rel}"));
            }
        }
        changed_dirs.insert(format!("d{d}"));
        let new = format!("d{d}/new{i}");
        fs::write(tree.join(&new), b"n").expect("create new");
        want.insert(format!("+ {new}"));
    }
    // A new directory with entries, and a whole directory gone.
    fs::create_dir(tree.join("fresh")).expect("mkdir fresh");
    fs::write(tree.join("fresh/one"), b"1").expect("fresh/one");
    want.extend(["+ fresh", "+ fresh/one"].map(String::from));
    let gone = format!("d{}", rng.below(DIRS as u64));
    // Whatever the change set did in it, the scan reports what was recorded.
    want.retain(|l| !l[2..].starts_with(&format!("{gone}/")));
    fs::remove_dir_all(tree.join(&gone)).expect("rm -rf");
    want.insert(format!("- {gone}"));
    want.insert(format!("- {gone}/sub"));
    want.insert(format!("- {gone}/sub/deep"));
    for f in 0..FILES {
        want.insert(format!("- {gone}/f{f}"));
    }

    let (lines, err) = scan(&c, &db, &tree);
    assert_eq!(lines, want, "exactly the changes (seed {seed})");
    let read = summary(&err, "read");
    // The root, the changed directories (less the one gone), and the new one.
    let expect_read = 1 + changed_dirs.iter().filter(|d| **d != gone).count() as u64 + 1;
    assert_eq!(read, expect_read, "only changed directories read: {err}");

    // Once recorded, nothing is reported again.
    let (lines, _) = scan(&c, &db, &tree);
    assert!(lines.is_empty(), "{lines:?}");

    // A damaged record: a clear refusal, not a panic.
    fs::write(&db, b"\xff\xff\xff\xffnot a record").expect("damage");
    let out = c
        .lode()
        .args(["scan", "--db"])
        .arg(&db)
        .arg(&tree)
        .output()
        .expect("run lode scan");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("is not a lode scan record") && err.lines().count() == 1,
        "{err}"
    );
}
