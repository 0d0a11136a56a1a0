//! Striped files: random writes, truncates and reads checked against an in-memory model.

mod common;

use common::*;
use lode_base::{Fid, Layout};
use rand::{Rng, SeedableRng};

fn run_model(count: i32, seed: u64) {
    let c = cluster(3);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    println!("stripe count {count}, seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model: Vec<u8> = Vec::new();
    s.run(async {
        let layout = Layout::plain(count, 65536, -1);
        let fh = cl
            .create_open(&r, Fid::ROOT, b"striped", 0o644, libc::O_RDWR, Some(layout))
            .await
            .unwrap();
        let want = if count < 0 { 3 } else { count as usize };
        match &fh.layout().unwrap().components[0].pattern {
            lode_base::Pattern::Raid0 { osts, .. } => assert_eq!(osts.len(), want),
            p => panic!("unexpected pattern {p:?}"),
        }
        for step in 0..120 {
            match rng.random_range(0..10) {
                0..=5 => {
                    let off = rng.random_range(0..1_200_000u64);
                    let len = rng.random_range(1..300_000usize);
                    let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                    assert_eq!(cl.write(&fh, off, &data).await.unwrap(), len, "step {step}");
                    let end = off as usize + len;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].copy_from_slice(&data);
                }
                6 | 7 => {
                    let size = rng.random_range(0..1_500_000u64);
                    cl.truncate_open(&r, &fh, size).await.unwrap();
                    model.resize(size as usize, 0);
                }
                _ => {
                    let off = rng.random_range(0..1_600_000u64);
                    let len = rng.random_range(0..400_000usize);
                    let got = cl.read(&fh, off, len).await.unwrap();
                    let from = (off as usize).min(model.len());
                    let to = (off as usize + len).min(model.len());
                    assert_eq!(got.len(), to - from, "read length at step {step}");
                    assert!(
                        got == model[from..to],
                        "read bytes differ at step {step} (seed {seed})"
                    );
                }
            }
            let a = cl.getattr(&r, fh.fid).await.unwrap();
            assert_eq!(
                a.size,
                model.len() as u64,
                "size after step {step} (seed {seed})"
            );
        }
        let all = cl.read(&fh, 0, model.len() + 10).await.unwrap();
        assert!(all == model, "final contents differ (seed {seed})");
        cl.fsync(&fh).await.unwrap();
        cl.close(&fh).await.unwrap();
    });
}

fn seed() -> u64 {
    std::env::var("LODE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

#[test]
fn stripe_count_1_matches_model() {
    run_model(1, seed());
}

#[test]
fn stripe_count_2_matches_model() {
    run_model(2, seed());
}

#[test]
fn stripe_count_all_matches_model() {
    run_model(-1, seed());
}

#[test]
fn default_layout_is_one_stripe_of_1mib_and_directories_pass_theirs_on() {
    let c = cluster(2);
    let s = c.client();
    let cl = &s.client;
    let r = root();
    s.run(async {
        let f = cl
            .create(&r, Fid::ROOT, b"plain", 0o644, None)
            .await
            .unwrap();
        let l = f.layout.unwrap();
        assert!(l.is_plain());
        match &l.components[0].pattern {
            lode_base::Pattern::Raid0 {
                stripe_size, osts, ..
            } => {
                assert_eq!((*stripe_size, osts.len()), (1 << 20, 1));
            }
            p => panic!("{p:?}"),
        }
        let d = cl
            .mkdir(
                &r,
                Fid::ROOT,
                b"wide",
                0o755,
                Some(Layout::plain(-1, 131072, -1)),
            )
            .await
            .unwrap();
        let f = cl.create(&r, d.attr.fid, b"f", 0o644, None).await.unwrap();
        match &f.layout.unwrap().components[0].pattern {
            lode_base::Pattern::Raid0 {
                stripe_size, osts, ..
            } => assert_eq!((*stripe_size, osts.len()), (131072, 2)),
            p => panic!("{p:?}"),
        }
        let sub = cl.mkdir(&r, d.attr.fid, b"sub", 0o755, None).await.unwrap();
        assert_eq!(
            sub.layout, d.layout,
            "subdirectories inherit the default layout"
        );
        // Bad layouts are refused.
        let bad = Layout::plain(1, 1000, -1);
        assert_eq!(
            cl.create(&r, Fid::ROOT, b"bad", 0o644, Some(bad))
                .await
                .unwrap_err(),
            lode_base::Errno::EINVAL
        );
        let bad = Layout::plain(1, 65536, 7);
        assert_eq!(
            cl.create(&r, Fid::ROOT, b"bad", 0o644, Some(bad))
                .await
                .unwrap_err(),
            lode_base::Errno::EINVAL
        );
        // Round robin spreads single-stripe files over both OSTs.
        let mut used = std::collections::HashSet::new();
        for i in 0..6 {
            let f = cl
                .create(&r, Fid::ROOT, format!("rr{i}").as_bytes(), 0o644, None)
                .await
                .unwrap();
            if let lode_base::Pattern::Raid0 { osts, .. } = &f.layout.unwrap().components[0].pattern
            {
                used.insert(osts[0]);
            }
        }
        assert_eq!(used.len(), 2);
    });
}

#[test]
fn statfs_counts_the_space_of_osts_sharing_one_disk_once() {
    let c = cluster(2);
    let s = c.client();
    let st = s.run(s.client.statfs()).unwrap();
    let one = lode_base::sys::statvfs(&c.target_dir("ost0")).unwrap();
    // Both OSTs share this machine's disk: df shows the disk, not twice it (a
    // program filling the file system would find it full half way).
    let want = one.blocks * u64::from(one.bsize) / 4096;
    assert!(
        st.blocks.abs_diff(want) <= want / 100,
        "blocks {} vs {want}",
        st.blocks
    );
    assert!(st.files > 0 && st.ffree > 0);
    let targets = s.run(s.client.statfs_targets());
    assert_eq!(targets.len(), 3);
    // Each OST still reports the space it sees, with the disk's id.
    let ids: Vec<u64> = targets[1..]
        .iter()
        .map(|(_, r)| r.as_ref().expect("statfs").space_id)
        .collect();
    assert!(ids[0] != 0 && ids[0] == ids[1], "{ids:?}");
}

/// `ready`/`reused` of every OST's `object_pool`, summed.
fn pool_field(c: &lode_testkit::Cluster, field: &str) -> u64 {
    c.get_param("obdfilter.*.object_pool")
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&format!("{field}: ")))
        .map(|v| v.parse::<u64>().expect("a number"))
        .sum()
}

#[test]
fn objects_made_from_destroyed_ones_hold_only_their_own_bytes_also_after_an_oss_kill() {
    let mut c = cluster(1);
    let m = c.mount();
    // The OST precreates new files first; destroyed ones come on top of those, and
    // the pool hands out its newest first.
    lode_testkit::wait_for(
        "the pool precreated",
        std::time::Duration::from_secs(30),
        || pool_field(&c, "precreated") >= 1024,
    );
    let old = vec![0xa5u8; 200_000];
    for i in 0..20 {
        std::fs::write(m.path().join(format!("old{i}")), &old).unwrap();
    }
    // (These took precreated files, leaving the pool above its low mark.)
    let base = pool_field(&c, "ready");
    for i in 0..20 {
        std::fs::remove_file(m.path().join(format!("old{i}"))).unwrap();
    }
    // The MDT destroys the objects in the background; a commit then makes their
    // files usable.
    lode_testkit::wait_for(
        "destroyed objects in the pool",
        std::time::Duration::from_secs(30),
        || pool_field(&c, "ready") >= base + 20,
    );
    // New files: a few bytes past a hole, so a former object's bytes would show.
    // They take the destroyed files (the newest): the pool is back where it was.
    let reused = pool_field(&c, "reused");
    let new = |i: usize| format!("new file {i}").into_bytes();
    for i in 0..20 {
        let f = std::fs::File::create(m.path().join(format!("new{i}"))).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &new(i), 4096).unwrap();
    }
    assert_eq!(
        (pool_field(&c, "reused"), pool_field(&c, "ready")),
        (reused + 20, base),
        "{}",
        c.get_param("obdfilter.*.object_pool")
    );
    let check = || {
        for i in 0..20 {
            let got = std::fs::read(m.path().join(format!("new{i}"))).unwrap();
            assert_eq!(got.len(), 4096 + new(i).len(), "new{i}");
            assert!(
                got[..4096].iter().all(|b| *b == 0),
                "new{i}: old bytes in the hole"
            );
            assert_eq!(&got[4096..], &new(i)[..], "new{i}");
        }
    };
    check();
    // Synced, then the OSS killed: the pool starts with none of its former files
    // (only what the precreator made since), the objects stay as written.
    let s = c.client();
    s.run(s.client.sync()).expect("sync");
    drop(s);
    c.kill9("ost0");
    c.start_target("ost0");
    let text = c.get_param("obdfilter.*.object_pool");
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    assert_eq!(
        field("ready") + field("reused"),
        field("precreated"),
        "{text}"
    );
    check();
}

#[test]
fn the_mdt_counts_objects_destroyed_only_once_their_ost_committed_the_destruction() {
    let c = cluster(1);
    let m = c.mount();
    let f = m.path().join("f");
    std::fs::write(&f, vec![7u8; 100_000]).unwrap();
    let s = c.client();
    s.run(s.client.sync()).expect("sync");
    drop(s);
    // No periodic OST commit from now on (the current wait ends first).
    c.set_param("obdfilter.*.commit_interval_ms=60000");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let field = |param: &str, name: &str| -> u64 {
        let text = c.get_param(param);
        text.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    let commits = field("obdfilter.*.commits", "commits");
    std::fs::remove_file(&f).unwrap();
    lode_testkit::wait_for(
        "the MDT to destroy the objects",
        std::time::Duration::from_secs(30),
        || field("mdt.*.destroys", "destroyed") >= 1,
    );
    // A destroy lost in a power cut before the OST's commit is never sent again once
    // the MDT has dropped its record: the MDT asks for that commit first.
    assert!(
        field("obdfilter.*.commits", "commits") > commits,
        "{}",
        c.get_param("obdfilter.*.commits")
    );
}
