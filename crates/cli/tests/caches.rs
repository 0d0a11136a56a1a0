//! Server caches against real processes: a directory read from its start has its
//! entries' inodes read into the MDT's inode cache in the background (`cache_warm`),
//! so the walk that follows finds them in memory even on a freshly restarted MDS, as
//! `mdt.*.cache_stats` shows; and an OST keeps no pages of objects larger than
//! `readcache_max_filesize` after reading them, so big files cannot push out the rest.

mod common;

use common::*;
use lode_base::Fid;
use lode_testkit::wait_for;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A counter of `mdt.*.cache_stats`.
fn cache_stat(c: &lode_testkit::Cluster, what: &str) -> u64 {
    let text = c.get_param("mdt.*.cache_stats");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{what}: ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {what} in cache_stats:\n{text}"))
}

/// Lists `dir` without attributes, then looks every name up (`ls` then `stat`s).
fn walk(c: &lode_testkit::Cluster, dir: Fid) -> usize {
    let s = c.client();
    let r = root();
    let names = listed_names(&s, dir);
    if c.get_param("mdt.*.cache_warm") == "1" {
        wait_for("warming to finish", Duration::from_secs(30), || {
            cache_stat(c, "warm_dirs") >= 1
        });
    }
    for n in &names {
        s.run(s.client.lookup(&r, dir, n)).expect("lookup");
    }
    names.len()
}

#[test]
fn a_directory_read_from_its_start_is_warmed_and_its_walk_hits_the_inode_cache() {
    let mut c = cluster(1);
    const N: u64 = 3000;
    let dir = {
        let s = c.client();
        let r = root();
        let d = s
            .run(s.client.mkdir(&r, Fid::ROOT, b"warm", 0o755, None))
            .expect("mkdir")
            .attr
            .fid;
        for i in 0..N {
            s.run(
                s.client
                    .create(&r, d, format!("f{i}").as_bytes(), 0o644, None),
            )
            .expect("create");
        }
        s.run(s.client.sync()).expect("sync");
        d
    };

    // A cold MDS with warming on: the walk's lookups find the inodes in memory.
    restart_mds(&mut c, &[]);
    wait_recovered(&c);
    c.set_param("mdt.*.cache_stats=clear");
    assert_eq!(walk(&c, dir) as u64, N);
    let (warmed, hits, misses) = (
        cache_stat(&c, "warm_inodes"),
        cache_stat(&c, "inode_cache_hits"),
        cache_stat(&c, "inode_cache_misses"),
    );
    assert!(warmed >= N, "every entry's inode warmed: {warmed}");
    assert!(hits >= N, "every lookup hit the cache: {hits} hits");
    assert!(misses < N / 10, "few misses: {misses}");

    // The same walk on a cold MDS with warming off: each lookup reads the store.
    restart_mds(&mut c, &[]);
    wait_recovered(&c);
    c.set_param("mdt.*.cache_warm=0");
    c.set_param("mdt.*.cache_stats=clear");
    assert_eq!(walk(&c, dir) as u64, N);
    assert_eq!(cache_stat(&c, "warm_inodes"), 0);
    assert!(
        cache_stat(&c, "inode_cache_misses") >= N,
        "without warming every inode is a miss"
    );
    // The store's block cache reports too (index and filter blocks pinned in it).
    assert!(cache_stat(&c, "block_cache_usage_bytes") > 0);

    // The cache's bound is the admin's: lowered below what it holds, it empties, and
    // a walk of more names than it holds keeps it within the bound.
    assert!(cache_stat(&c, "inode_cache_entries") >= N);
    c.set_param("mdt.*.inode_cache_max=1024");
    assert_eq!(c.get_param("mdt.*.inode_cache_max"), "1024");
    assert_eq!(cache_stat(&c, "inode_cache_max"), 1024);
    // (Emptied: a background read may have put a record or two back since.)
    assert!(cache_stat(&c, "inode_cache_entries") < 100);
    assert_eq!(walk(&c, dir) as u64, N);
    let held = cache_stat(&c, "inode_cache_entries");
    assert!(held > 0 && held <= 1024, "{held} records held");
    let o = lode_run(&c, &["set-param", "mdt.*.inode_cache_max=10"]);
    assert!(!o.status.success(), "below the smallest bound: refused");
    assert_eq!(c.get_param("mdt.*.inode_cache_max"), "1024");
}

/// Object files under an OST's directory, with their sizes.
fn objects(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let m = e.metadata().expect("metadata");
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path(), m.len()));
            }
        }
    }
    out
}

/// Bytes of `file` in the page cache.
fn resident(file: &Path) -> u64 {
    let out = std::process::Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(file)
        .output()
        .expect("fincore");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("fincore: {out:?}"))
}

#[test]
fn reads_of_objects_over_readcache_max_filesize_leave_no_pages_cached() {
    let c = cluster(1);
    assert_eq!(
        c.get_param("obdfilter.*.readcache_max_filesize"),
        (32u64 << 20).to_string(),
        "Lustre's proposal: 32 MiB"
    );
    let m = c.mount();
    let big: Vec<u8> = (0..40u32 << 20).map(|i| (i % 251) as u8).collect();
    let small = vec![7u8; 1 << 20];
    std::fs::write(m.path().join("big"), &big).expect("write big");
    std::fs::write(m.path().join("small"), &small).expect("write small");
    let objs = objects(&c.target_dir("ost0"));
    let find = |len: u64| {
        objs.iter()
            .find(|(_, l)| *l == len)
            .map(|(p, _)| p.clone())
            .unwrap_or_else(|| panic!("an object of {len} bytes in {objs:?}"))
    };
    let (big_obj, small_obj) = (find(40 << 20), find(1 << 20));
    // Written back first: the advice drops clean pages only (dirty ones must reach the
    // disk before they can go, and durability is another issue's business).
    for o in [&big_obj, &small_obj] {
        std::fs::File::open(o)
            .and_then(|f| f.sync_all())
            .expect("fsync the object");
    }
    // Read through another mount (the first one's own page cache would answer).
    let m2 = c.mount();
    assert!(std::fs::read(m2.path().join("big")).expect("read big") == big);
    assert_eq!(
        std::fs::read(m2.path().join("small")).expect("read small"),
        small
    );
    assert!(
        c.get_param("obdfilter.*.readcache_dropped")
            .parse::<u64>()
            .expect("a count")
            > 0
    );
    assert_eq!(
        resident(&big_obj),
        0,
        "no page of the big object stays cached on the OSS"
    );
    assert!(resident(&small_obj) > 0, "the small object's pages stay");
}
