//! `lode migrate` (Lustre's `lfs migrate`), against real servers, FUSE mounts and
//! native clients: data moves between Data-on-MDT and OSTs in both directions and
//! between stripings while another client reads it (every read checked), a writer
//! during a migration makes it fail with EBUSY and loses nothing, and a process killed
//! midway (the MDS, or the client doing the copy) leaves one layout, whole, and no
//! object of the other behind.

mod common;

use common::{arg as s, lode_ok as ok, lode_run as lode, test_seed as seed};

use common::*;
use lode_base::{Fid, Layout, Pattern};
use lode_proto::Opcode;
use lode_testkit::{wait_for, Cluster};
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Bytes no two offsets of which are alike over a few MiB (a misplaced piece shows).
fn pattern(n: usize) -> Vec<u8> {
    (0..n as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i >> 16) as u8)
        .collect()
}

/// The file's layout, from the MDT.
fn layout(sess: &lode_client::Session, name: &str) -> Layout {
    let f = fid(sess, &format!("/{name}")).expect("the file");
    let b = sess
        .run(sess.client.getattr_md(&root(), f))
        .expect("getattr");
    b.layout.expect("a layout")
}

/// Every OST object of file `f` on the cluster's OSTs: (OST, component id).
fn objects(c: &Cluster, osts: u32, f: Fid) -> BTreeSet<(u32, u32)> {
    let mut out = BTreeSet::new();
    let prefix = format!("{:x}_{:x}_", f.oid, f.ver);
    for o in 0..osts {
        let root = c.target_dir(&format!("ost{o}")).join("O");
        let mut stack = vec![root];
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let name = e.file_name().to_string_lossy().to_string();
                let in_seq = d
                    .parent()
                    .and_then(Path::file_name)
                    .is_some_and(|s| s.to_string_lossy() == format!("{:x}", f.seq));
                if let Some(rest) = name.strip_prefix(&prefix).filter(|_| in_seq) {
                    if let Some(comp) = rest.split('_').next().and_then(|c| c.parse().ok()) {
                        out.insert((o, comp));
                    }
                }
            }
        }
    }
    out
}

/// Waits until every object of `name` on the OSTs belongs to its layout now (those
/// of a replaced or abandoned layout are destroyed once that commits), and returns
/// them.
fn only_current_objects(
    c: &Cluster,
    sess: &lode_client::Session,
    osts: u32,
    name: &str,
) -> BTreeSet<(u32, u32)> {
    let f = fid(sess, &format!("/{name}")).expect("the file");
    let l = layout(sess, name);
    let ids: BTreeSet<u32> = l.components.iter().map(|c| c.id).collect();
    let mut objs = BTreeSet::new();
    wait_for(
        "the objects of other layouts to be destroyed",
        Duration::from_secs(30),
        || {
            objs = objects(c, osts, f);
            objs.iter().all(|(_, comp)| ids.contains(comp))
        },
    );
    objs
}

/// Makes `f` with 1 MiB on the MDT, the rest on one OST.
fn dom_then_one_ost(c: &Cluster, f: &Path) {
    ok(
        c,
        &[
            "setstripe",
            "-E",
            "1M",
            "-L",
            "mdt",
            "-E",
            "-1",
            "-c",
            "1",
            &s(f),
        ],
    );
}

fn has_dom(l: &Layout) -> bool {
    l.components
        .first()
        .is_some_and(|c| c.pattern == Pattern::Mdt)
}

fn stripes(l: &Layout) -> Vec<usize> {
    l.components
        .iter()
        .filter_map(|c| match &c.pattern {
            Pattern::Raid0 { osts, .. } => Some(osts.len()),
            Pattern::Mdt => None,
        })
        .collect()
}

/// Makes every step of a migration wait `ms` on the MDT (so a reader's reads overlap
/// the copy and the swap), or no longer (0).
fn slow_migrate_steps(c: &Cluster, ms: u32) {
    c.set_param(&format!("mdt.*.fail_opc={}", Opcode::Migrate as u16));
    c.set_param(&format!("mdt.*.fail_val={ms}"));
    c.set_param(&format!(
        "mdt.*.fail_loc={}",
        if ms > 0 { "0x104" } else { "0" }
    ));
}

/// `lode migrate` options, and a check of the layout they give.
type Step<'a> = (&'a [&'a str], fn(&Layout) -> bool);

/// Migrates `name` through `steps` (`lode migrate` options, and a check of the
/// layout each gives) while a native client reads it at random all along, checking
/// every byte; the content through the mount is checked after each step.
fn migrate_under_a_reader(
    c: &Cluster,
    m: &lode_testkit::Mount,
    name: &str,
    data: &[u8],
    steps: &[Step],
) {
    let seed = seed();
    println!("seed {seed} (LODE_TEST_SEED={seed} repeats it)");
    let path = m.path().join(name);
    let stop = AtomicBool::new(false);
    // Reads done so far, and whether the last one left the reader holding a layout
    // lock. Each swap waits for the reader to have read under the layout's lock, its
    // first swap included (the reader's thread may not even have opened the file yet),
    // however slowly the reader's thread runs. A read may also find the lock not
    // grantable (a swap's locks still held) and go without it, checking the layout
    // with the MDT instead; a swap then has nobody to call back.
    let done = AtomicU64::new(0);
    let locked = AtomicBool::new(false);
    let reads = std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let sess = c.client();
            let f = fid(&sess, &format!("/{name}")).expect("the file");
            let fh = sess
                .run(sess.client.open(&root(), f, libc::O_RDONLY))
                .expect("open");
            let called_back = sess.client.lock_callbacks();
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut reads = 0u64;
            while !stop.load(Ordering::Acquire) || reads == 0 {
                let off = rng.random_range(0..data.len() as u64);
                let len = rng.random_range(1..=700_000usize);
                let got = sess
                    .run(sess.client.read(&fh, off, len))
                    .expect("a read during migrations");
                let end = (off as usize + len).min(data.len());
                assert!(
                    got == data[off as usize..end],
                    "read of {len} at {off} during a migration returned wrong data (seed {seed})"
                );
                reads += 1;
                locked.store(sess.client.holds_layout_lock(&fh), Ordering::Release);
                done.fetch_add(1, Ordering::Release);
            }
            sess.run(sess.client.close(&fh)).expect("close");
            (reads, sess.client.lock_callbacks() - called_back)
        });
        // The reader stops even if a check below fails.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let stopper = Stop(&stop);
        let mut swapped = 0;
        for (args, check) in steps {
            wait_for(
                "the reader to read under the layout's lock",
                Duration::from_secs(30),
                || done.load(Ordering::Acquire) >= swapped + 2 && locked.load(Ordering::Acquire),
            );
            let mut a = vec!["migrate"];
            a.extend_from_slice(args);
            let p = s(&path);
            a.push(&p);
            ok(c, &a);
            swapped = done.load(Ordering::Acquire);
            let sess = c.client();
            let l = layout(&sess, name);
            assert!(check(&l), "lode migrate {args:?} gave {l:?}");
            assert!(
                std::fs::read(&path).expect("read through the mount") == data,
                "{name} after lode migrate {args:?}"
            );
        }
        drop(stopper);
        reader.join().expect("the reader")
    });
    let (n, callbacks) = reads;
    assert!(n > 0);
    assert!(
        callbacks >= steps.len() as u64,
        "each swap calls back the reader's layout lock ({callbacks} callbacks, {} swaps)",
        steps.len()
    );
}

#[test]
fn migrate_moves_data_between_mdt_and_osts_both_ways_under_a_concurrent_reader() {
    let c = cluster(2);
    let m = c.mount();
    let sess = c.client();
    slow_migrate_steps(&c, 100);

    // A file larger than its DoM component: DoM → OSTs (restriped) → DoM again.
    let big = pattern((3 << 20) + 12_345);
    let f = m.path().join("big");
    dom_then_one_ost(&c, &f);
    std::fs::write(&f, &big).expect("write");
    migrate_under_a_reader(
        &c,
        &m,
        "big",
        &big,
        &[
            (&["-c", "2"], |l| !has_dom(l) && stripes(l) == [2]),
            (&["-c", "1", "-S", "64k"], |l| {
                !has_dom(l) && stripes(l) == [1]
            }),
            (&["-E", "1M", "-L", "mdt", "-E", "-1", "-c", "2"], |l| {
                has_dom(l) && stripes(l) == [2]
            }),
        ],
    );
    let objs = only_current_objects(&c, &sess, 2, "big");
    assert_eq!(objs.len(), 2, "one object on each OST: {objs:?}");

    // A small file on one OST moves wholly onto the MDT, then back.
    let small = pattern(300_000);
    let f = m.path().join("small");
    ok(&c, &["setstripe", "-c", "1", &s(&f)]);
    std::fs::write(&f, &small).expect("write");
    migrate_under_a_reader(
        &c,
        &m,
        "small",
        &small,
        &[
            (&["-E", "1M", "-L", "mdt"], |l| {
                has_dom(l) && l.components.len() == 1
            }),
            (&["-c", "2"], |l| !has_dom(l) && stripes(l) == [2]),
            // The OST component is not instantiated: no byte reaches it.
            (&["-E", "512k", "-L", "mdt", "-E", "-1", "-c", "1"], |l| {
                has_dom(l) && stripes(l) == [0]
            }),
        ],
    );
    // Everything of it on the MDT now: no object left on any OST.
    assert_eq!(only_current_objects(&c, &sess, 2, "small"), BTreeSet::new());
    slow_migrate_steps(&c, 0);

    // The file keeps its times; a file too large for the new layout is refused.
    let before = std::fs::metadata(m.path().join("big")).expect("stat");
    ok(&c, &["migrate", "-c", "1", &s(&m.path().join("big"))]);
    let after = std::fs::metadata(m.path().join("big")).expect("stat");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (before.mtime(), before.mtime_nsec(), before.size()),
        (after.mtime(), after.mtime_nsec(), after.size())
    );
    let o = lode(
        &c,
        &[
            "migrate",
            "-E",
            "1M",
            "-L",
            "mdt",
            &s(&m.path().join("big")),
        ],
    );
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("File too large"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(std::fs::read(m.path().join("big")).expect("read") == big);

    // A migrated layout copied onto a new file gets ids 1..n there: the ids above 64
    // are kept for migrations, whose objects must never be named like a live one's.
    let mut v = vec![0u8; 65536];
    let name = std::ffi::CString::new("lustre.lov").expect("name");
    // SAFETY: valid C strings and a buffer of the stated length.
    let n = unsafe {
        libc::getxattr(
            cs(m.path().join("big")).as_ptr(),
            name.as_ptr(),
            v.as_mut_ptr().cast(),
            v.len(),
        )
    };
    assert!(n > 0, "{}", std::io::Error::last_os_error());
    v.truncate(n as usize);
    let copied = lode_base::layout::decode_xattr(&v).expect("a layout");
    assert!(copied.components.iter().all(|c| c.id > 64), "{copied:?}");
    let f = m.path().join("copy");
    std::fs::File::create(&f).expect("create");
    // The kernel sends the create's RELEASE after close(2) returns; until the MDT
    // has it the file is open for writing, may hold data, and refuses a layout
    // (EBUSY). Asked again until the close is in.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let r = loop {
        // SAFETY: valid C strings and a value of the stated length.
        let r = unsafe {
            libc::setxattr(
                cs(&f).as_ptr(),
                name.as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                0,
            )
        };
        let busy = std::io::Error::last_os_error().raw_os_error() == Some(libc::EBUSY);
        if r == 0 || !busy || std::time::Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let ids: Vec<u32> = layout(&sess, "copy")
        .components
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, [1]);
}

/// OST writes answer late: a migration's copy takes a while.
fn slow_ost_writes(c: &Cluster, ms: u32) {
    c.set_param(&format!("obdfilter.*.fail_opc={}", Opcode::OstWrite as u16));
    c.set_param(&format!("obdfilter.*.fail_val={ms}"));
    c.set_param(&format!(
        "obdfilter.*.fail_loc={}",
        if ms > 0 { "0x103" } else { "0" }
    ));
}

/// Starts `lode migrate -c STRIPES F` in the background.
fn spawn_migrate(
    c: &Cluster,
    stripes: &str,
    f: &Path,
    stderr: std::process::Stdio,
) -> std::process::Child {
    c.lode()
        .args(["migrate", "-c", stripes, &s(f)])
        .stderr(stderr)
        .spawn()
        .expect("lode migrate")
}

/// Starts `lode migrate -c 2 F` with slow OST writes (its copy takes a while), and
/// returns once its migration has started on the MDT: the SYNC that follows a start
/// the MDT granted (a refused start, asked again, counts as a swap too).
fn start_slow_migration(c: &Cluster, f: &Path, stderr: std::process::Stdio) -> std::process::Child {
    slow_ost_writes(c, 1500);
    let (swaps, syncs) = (mdt_stat(c, "mds_swap_layouts"), mdt_stat(c, "mds_sync"));
    let child = spawn_migrate(c, "2", f, stderr);
    wait_for("the migration to start", Duration::from_secs(10), || {
        mdt_stat(c, "mds_swap_layouts") > swaps && mdt_stat(c, "mds_sync") > syncs
    });
    child
}

#[test]
fn a_writer_during_a_migration_makes_it_fail_with_ebusy_and_nothing_is_lost() {
    let c = cluster(2);
    let m = c.mount();
    let sess = c.client();
    let f = m.path().join("w");
    ok(&c, &["setstripe", "-c", "1", &s(&f)]);
    let mut data = pattern(2 << 20);
    std::fs::write(&f, &data).expect("write");
    let before = layout(&sess, "w");

    // Opened for writing when the migration starts, and kept open: refused (once the
    // wait for a writer's close on its way is over).
    {
        let _w = std::fs::OpenOptions::new()
            .append(true)
            .open(&f)
            .expect("open for writing");
        let o = lode(&c, &["migrate", "-c", "2", &s(&f)]);
        assert!(!o.status.success());
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("Device or resource busy"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    // Opened for writing, and written, while the copy is under way: the swap is
    // refused, the copy dropped, the write kept.
    let child = start_slow_migration(&c, &f, std::process::Stdio::piped());
    let w = sess.client.clone();
    let wf = fid(&sess, "/w").expect("w");
    let fh = sess
        .run(w.open(&root(), wf, libc::O_WRONLY))
        .expect("open for writing");
    assert_eq!(sess.run(w.write(&fh, 1000, b"written meanwhile")), Ok(17));
    sess.run(w.close(&fh)).expect("close");
    data[1000..1017].copy_from_slice(b"written meanwhile");
    let out = child.wait_with_output().expect("lode migrate ends");
    slow_ost_writes(&c, 0);
    assert!(!out.status.success(), "the migration went through");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Device or resource busy"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = layout(&sess, "w");
    assert_eq!(
        after.components, before.components,
        "the layout is unchanged"
    );
    assert!(
        std::fs::read(&f).expect("read") == data,
        "the write is kept"
    );
    let objs = only_current_objects(&c, &sess, 2, "w");
    assert_eq!(objs.len(), 1, "{objs:?}");

    // And with nobody writing, the same migration goes through.
    ok(&c, &["migrate", "-c", "2", &s(&f)]);
    assert_eq!(stripes(&layout(&sess, "w")), [2]);
    assert!(std::fs::read(&f).expect("read") == data);

    // A writer that closes just after the migration is asked for (as the CLOSE of a
    // `cp` through a mount comes after cp's close() returned): it goes through.
    let fh = sess
        .run(w.open(&root(), wf, libc::O_WRONLY))
        .expect("open for writing");
    let starts = mdt_stat(&c, "mds_swap_layouts");
    let child = spawn_migrate(&c, "1", &f, std::process::Stdio::piped());
    wait_for("the migration to be asked", Duration::from_secs(10), || {
        mdt_stat(&c, "mds_swap_layouts") > starts
    });
    sess.run(w.close(&fh)).expect("close");
    let out = child.wait_with_output().expect("lode migrate ends");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stripes(&layout(&sess, "w")), [1]);
    assert!(std::fs::read(&f).expect("read") == data);
}

/// Checks a file after an interrupted migration: one of the two layouts, whole, and
/// no object of the other.
fn one_layout_whole(c: &Cluster, name: &str, data: &[u8], old: &Layout, new_stripes: usize) {
    let sess = c.client();
    let l = layout(&sess, name);
    let kept_old = l.components == old.components;
    assert!(
        kept_old || (!has_dom(&l) && stripes(&l) == [new_stripes]),
        "neither layout: {l:?}"
    );
    let f = fid(&sess, &format!("/{name}")).expect("the file");
    let fh = sess
        .run(sess.client.open(&root(), f, libc::O_RDONLY))
        .expect("open");
    let got = sess
        .run(sess.client.read(&fh, 0, data.len() + 1))
        .expect("read");
    sess.run(sess.client.close(&fh)).expect("close");
    assert!(
        got == data,
        "{name} is whole ({} layout)",
        if kept_old { "old" } else { "new" }
    );
    let objs = only_current_objects(c, &sess, 2, name);
    assert!(!objs.is_empty() || has_dom(&l));
}

#[test]
fn an_mds_killed_midway_leaves_one_layout_whole_and_no_objects_of_the_other() {
    let mut c = cluster(2);
    let m = c.mount();
    let data = pattern((2 << 20) + 777);
    let sess = c.client();
    // Killed after executing the start, then after executing the swap, each time
    // before it is committed or answered.
    for (skip, name) in [(0u32, "at_start"), (1, "at_swap")] {
        let f = m.path().join(name);
        dom_then_one_ost(&c, &f);
        std::fs::write(&f, &data).expect("write");
        let old = layout(&sess, name);
        c.set_param(&format!("mdt.*.fail_opc={}", Opcode::Migrate as u16));
        c.set_param(&format!("mdt.*.fail_val={skip}"));
        c.set_param("mdt.*.fail_loc=0x20000105");
        let child = spawn_migrate(&c, "2", &f, std::process::Stdio::piped());
        wait_for(
            "the MDS to die at its fault point",
            Duration::from_secs(30),
            || {
                c.log("mdt0")
                    .contains("fail_loc: the MDS dies here, before the change")
            },
        );
        c.wait_exit("mdt0", Duration::from_secs(10));
        c.start_target("mdt0");
        wait_recovered(&c);
        let out = child.wait_with_output().expect("lode migrate ends");
        println!(
            "{name}: lode migrate {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        one_layout_whole(&c, name, &data, &old, 2);
    }
}

#[test]
fn a_client_killed_midway_leaves_the_old_layout_whole_and_no_objects_of_the_new() {
    let c = cluster(2);
    c.set_param("mdt.*.evict_timeout=2");
    let m = c.mount();
    let sess = c.client();
    let data = pattern((2 << 20) + 99);
    let f = m.path().join("k");
    ok(&c, &["setstripe", "-c", "1", &s(&f)]);
    std::fs::write(&f, &data).expect("write");
    let old = layout(&sess, "k");

    // The copy's writes are slow; the mount doing it is killed in the middle.
    let mut child = start_slow_migration(&c, &f, std::process::Stdio::null());
    // Some of the copy's objects are on the OSTs by now.
    let kf = fid(&sess, "/k").expect("k");
    wait_for("the copy to begin", Duration::from_secs(10), || {
        objects(&c, 2, kf).len() > 1
    });
    let pid = m.pid().expect("the mount's pid");
    // SAFETY: kill(2) on a child process of this test.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    lode_testkit::abort_fuse(m.path());
    let _ = child.wait();
    slow_ost_writes(&c, 0);
    // Evicted after evict_timeout: its handle closes, and the migration with it.
    wait_for(
        "the killed client's migration to be abandoned",
        Duration::from_secs(30),
        || c.log("mdt0").contains("layout migration abandoned"),
    );
    one_layout_whole(&c, "k", &data, &old, 2);
    assert_eq!(layout(&sess, "k").components, old.components);
    drop(m);
}
