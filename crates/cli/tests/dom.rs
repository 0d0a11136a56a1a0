//! Data-on-MDT and composite (PFL) layouts, against real servers, the `lode` command
//! and FUSE mounts: Lustre's layout rules (the seed's examples among them),
//! `dom_stripesize`, lazy instantiation, DoM data against an in-memory model, ENODATA
//! past the end of a layout, and DoM data through an MDS crash.

mod common;

use common::{arg as s, lode_ok as ok, lode_run as lode, test_seed as seed};

use common::*;
use lode_base::layout::EOF;
use lode_base::{Component, Errno, Fid, Layout, Pattern};
use lode_testkit::{wait_for, Cluster};
use rand::{Rng, SeedableRng};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

/// Runs `lode ARGS`, which must fail saying `why`.
fn refused(c: &Cluster, args: &[&str], why: &str) {
    let o = lode(c, args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "lode {args:?} was accepted");
    assert!(err.contains(why), "lode {args:?}: {err:?} lacks {why:?}");
}

/// The seed's four-component layout: DoM, then 1, 4 and all OSTs.
const SEED_PFL: [&str; 15] = [
    "-E", "1M", "-L", "mdt", "-E", "64M", "-c1", "-S", "1M", "-E", "8G", "-c4", "-E", "-1", "-c",
];

#[test]
fn layouts_follow_lustres_rules() {
    let c = cluster(2);
    let m = c.mount();
    let p = |n: &str| s(&m.path().join(n));

    // The seed's examples are accepted.
    ok(&c, &["setstripe", "-E", "1M", "-L", "mdt", &p("dom1")]);
    let g = ok(&c, &["getstripe", &p("dom1")]);
    assert!(g.contains("  lcm_entry_count:   1\n"), "{g}");
    assert!(g.contains("      lmm_pattern:       mdt\n"), "{g}");
    assert!(g.contains("    lcme_flags:          init\n"), "{g}");
    assert!(g.contains("    lcme_extent.e_end:   1048576\n"), "{g}");
    assert!(g.contains("      lmm_stripe_size:   1048576\n"), "{g}");

    ok(
        &c,
        &[
            "setstripe",
            "-L",
            "mdt",
            "-E",
            "1M",
            "-E",
            "-1",
            "-S",
            "1M",
            &p("dom2"),
        ],
    );
    let g = ok(&c, &["getstripe", &p("dom2")]);
    assert!(g.contains("  lcm_entry_count:   2\n"), "{g}");
    assert!(g.contains("    lcme_extent.e_end:   EOF\n"), "{g}");
    // The OST component waits for data.
    assert!(g.contains("    lcme_flags:          0\n"), "{g}");
    assert!(g.contains("      lmm_stripe_offset: -1\n"), "{g}");

    let mut args = vec!["setstripe"];
    args.extend(SEED_PFL);
    let f = p("pfl4");
    args.extend(["-1", "-S", "4M", &f]);
    ok(&c, &args);
    let g = ok(&c, &["getstripe", &f]);
    assert!(g.contains("  lcm_entry_count:   4\n"), "{g}");
    assert!(g.contains("    lcme_extent.e_end:   8589934592\n"), "{g}");
    assert_eq!(g.matches("lcme_flags:          0\n").count(), 3, "{g}");

    // And the refused ones, each before anything is created, naming its rule.
    for (args, why) in [
        (
            &["-E", "1M", "-E", "2M", "-L", "mdt"][..],
            "'mdt' layout can be only the first one",
        ),
        (
            &["-E", "1M", "-L", "mdt", "-c", "1"][..],
            "Option 'stripe-count' can't be specified with Data-on-MDT",
        ),
        (
            &["-E", "1M", "-L", "mdt", "-S", "1M"][..],
            "Option 'stripe-size' can't be specified",
        ),
        (
            &["-E", "2G", "-L", "mdt", "-E", "-1"][..],
            "'mdt' layout size is too big",
        ),
        (
            &["-E", "-1", "-L", "mdt"][..],
            "'mdt' layout size is too big",
        ),
        (
            &["-E", "100k", "-c", "1", "-E", "-1"][..],
            "multiple of 64 KiB",
        ),
        (
            &["-E", "1M", "-S", "768k", "-E", "-1"][..],
            "multiple of its stripe size",
        ),
        (&["-E", "2M", "-E", "1M"][..], "must end after it starts"),
        (&["-L", "mdt"][..], "needs a component end"),
        (&["-E", "1M", "-L", "ost"][..], "unknown layout"),
    ] {
        let f = p("refused");
        let mut v = vec!["setstripe"];
        v.extend(args);
        v.push(&f);
        refused(&c, &v, why);
        assert!(!Path::new(&f).exists(), "{args:?} left a file behind");
    }

    // A directory's default is inherited by new files and subdirectories.
    let d = p("domdir");
    std::fs::create_dir(&d).unwrap();
    ok(
        &c,
        &[
            "setstripe",
            "-E",
            "256k",
            "-L",
            "mdt",
            "-E",
            "-1",
            "-c",
            "2",
            &d,
        ],
    );
    let g = ok(&c, &["getstripe", "-d", &d]);
    assert!(g.contains("    lcme_id:             N/A\n"), "{g}");
    assert!(g.contains("pattern:       mdt"), "{g}");
    std::fs::create_dir(format!("{d}/sub")).unwrap();
    std::fs::write(format!("{d}/sub/f"), b"hello").unwrap();
    let g = ok(&c, &["getstripe", &format!("{d}/sub/f")]);
    assert!(g.contains("      lmm_pattern:       mdt\n"), "{g}");
    assert!(g.contains("    lcme_extent.e_end:   262144\n"), "{g}");
    assert_eq!(std::fs::read(format!("{d}/sub/f")).unwrap(), b"hello");

    // A file-system-wide default on the root reaches directories made before it.
    let old = p("olddir");
    std::fs::create_dir(&old).unwrap();
    ok(
        &c,
        &[
            "setstripe",
            "-E",
            "128k",
            "-L",
            "mdt",
            "-E",
            "-1",
            &s(m.path()),
        ],
    );
    std::fs::write(format!("{old}/f"), b"x").unwrap();
    let g = ok(&c, &["getstripe", &format!("{old}/f")]);
    assert!(g.contains("    lcme_extent.e_end:   131072\n"), "{g}");
}

#[test]
fn dom_stripesize_limits_are_kept_and_refused_not_reset() {
    let c = cluster(1);
    let m = c.mount();
    let p = |n: &str| s(&m.path().join(n));
    let get = || c.get_param("lod.*.dom_stripesize").trim().to_string();
    assert_eq!(get(), "1048576", "the default");
    c.set_param("lod.*.dom_stripesize=65536");
    assert_eq!(get(), "65536");
    refused(
        &c,
        &["setstripe", "-E", "1M", "-L", "mdt", &p("big")],
        "dom_stripesize",
    );
    assert!(!Path::new(&p("big")).exists());
    ok(&c, &["setstripe", "-E", "64k", "-L", "mdt", &p("small")]);
    // An inherited default is fitted, as Lustre does: the DoM part cut to the limit.
    let d = p("d");
    std::fs::create_dir(&d).unwrap();
    c.set_param("lod.*.dom_stripesize=1048576");
    ok(&c, &["setstripe", "-E", "1M", "-L", "mdt", "-E", "-1", &d]);
    c.set_param("lod.*.dom_stripesize=65536");
    std::fs::write(format!("{d}/f"), b"data").unwrap();
    let g = ok(&c, &["getstripe", &format!("{d}/f")]);
    assert!(g.contains("    lcme_extent.e_end:   65536\n"), "{g}");
    assert!(g.contains("    lcme_extent.e_start: 65536\n"), "{g}");

    // Out of range: refused, the old value kept (the seed's 2.11 reset 32K to 1M).
    for bad in ["32768", "1", "1074790400", "lots"] {
        let o = lode(&c, &["set-param", &format!("lod.*.dom_stripesize={bad}")]);
        assert!(!o.status.success(), "{bad} was accepted");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("Invalid argument"),
            "{bad}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(get(), "65536", "after {bad}");
    }
    // Nor stored for later starts (`-P`), where it would fail each one.
    let o = lode(&c, &["set-param", "-P", "lod.*.dom_stripesize=32768"]);
    assert!(!o.status.success(), "-P of a refused value was accepted");
    assert!(!c.get_param("mgs.*.params").contains("dom_stripesize"));
    ok(&c, &["set-param", "-P", "lod.*.dom_stripesize=131072"]);
    assert!(
        c.get_param("mgs.*.params")
            .contains("dom_stripesize=131072"),
        "a good value is stored: {}",
        c.get_param("mgs.*.params")
    );
    // Rounded down to 64 KiB.
    c.set_param("lod.*.dom_stripesize=132072");
    assert_eq!(get(), "131072");
    c.set_param("lod.*.dom_stripesize=1073741824");
    assert_eq!(get(), "1073741824");

    // 0 disables DoM: new `-L mdt` layouts are refused, inherited ones lose the DoM part.
    c.set_param("lod.*.dom_stripesize=0");
    refused(
        &c,
        &["setstripe", "-E", "64k", "-L", "mdt", &p("none")],
        "Invalid argument",
    );
    std::fs::write(format!("{d}/g"), b"data").unwrap();
    let g = ok(&c, &["getstripe", &format!("{d}/g")]);
    assert!(!g.contains("mdt"), "{g}");
    assert_eq!(std::fs::read(format!("{d}/g")).unwrap(), b"data");
}

/// The obdfilter `ost_write` and `ost_read` counts summed over the OSTs.
fn ost_io(c: &Cluster) -> u64 {
    ost_stat(c, &["ost_write", "ost_read"])
}

#[test]
fn components_are_instantiated_when_data_reaches_them() {
    let c = cluster(2);
    let m = c.mount();
    let f = s(&m.path().join("grow"));
    let mut args = vec!["setstripe"];
    args.extend(SEED_PFL);
    args.extend(["-1", "-S", "4M", &f]);
    ok(&c, &args);
    let gen = |g: &str| -> u32 {
        g.lines()
            .find_map(|l| l.trim().strip_prefix("lcm_layout_gen:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("a layout gen")
    };
    let before = ost_io(&c);
    let file = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    file.write_all_at(&[7u8; 4096], 0).unwrap();
    file.sync_all().unwrap();
    let g0 = ok(&c, &["getstripe", &f]);
    assert_eq!(g0.matches("lcme_flags:          0\n").count(), 3, "{g0}");
    assert!(
        !g0.contains("lmm_objects"),
        "a 4 KiB file has no OST object: {g0}"
    );
    assert_eq!(ost_io(&c), before, "no OST I/O for DoM bytes");

    // Into the second component: it alone is instantiated, the layout generation moves.
    file.write_all_at(&[8u8; 4096], 2 << 20).unwrap();
    let g1 = ok(&c, &["getstripe", &f]);
    assert_eq!(g1.matches("lcme_flags:          0\n").count(), 2, "{g1}");
    assert_eq!(g1.matches("l_ost_idx").count(), 1, "{g1}");
    assert_eq!(gen(&g1), gen(&g0) + 1, "{g0}\n{g1}");
    // Far out: the fourth, over every OST; the third stays a hole.
    file.write_all_at(&[9u8; 4096], 9 << 30).unwrap();
    let g2 = ok(&c, &["getstripe", &f]);
    assert_eq!(g2.matches("lcme_flags:          0\n").count(), 1, "{g2}");
    assert_eq!(g2.matches("l_ost_idx").count(), 3, "{g2}");
    drop(file);
    let file = OpenOptions::new().read(true).open(&f).unwrap();
    let mut buf = vec![0u8; 4096];
    for (off, want) in [(0u64, 7u8), (2 << 20, 8), (9 << 30, 9), (100 << 20, 0)] {
        file.read_exact_at(&mut buf, off).unwrap();
        assert!(buf.iter().all(|&b| b == want), "at {off}");
    }
    assert_eq!(file.metadata().unwrap().len(), (9 << 30) + 4096);
    // `getstripe -I` and `--component-end`.
    let g = ok(&c, &["getstripe", "-I", "2", &f]);
    assert!(
        g.contains("    lcme_id:             2\n") && !g.contains("lcme_id:             3"),
        "{g}"
    );
    let g = ok(&c, &["getstripe", "--component-end", &f]);
    assert!(g.contains("lcme_extent.e_end:   67108864\n"), "{g}");
    assert!(g.contains("lcme_extent.e_end:   EOF\n"), "{g}");
    assert_eq!(ok(&c, &["getstripe", "-c", &f]), "2\n");
}

#[test]
fn a_write_past_a_dom_only_layout_fails_with_enodata_after_the_bytes_that_fit() {
    let c = cluster(1);
    let m = c.mount();
    let f = s(&m.path().join("dom.1c"));
    ok(&c, &["setstripe", "-E", "1M", "-L", "mdt", &f]);
    let mut file = OpenOptions::new().write(true).open(&f).unwrap();
    let mb = vec![0x5au8; 1 << 20];
    // The seed's `dd bs=1M count=10`: one MiB written, then "No data available".
    file.write_all(&mb).unwrap();
    let e = file.write(&mb).expect_err("past the layout's end");
    assert_eq!(e.raw_os_error(), Some(libc::ENODATA), "{e}");
    // A write straddling the end: the bytes that fit, then ENODATA.
    let n = file.write_at(&mb[..8192], (1 << 20) - 4096).unwrap();
    assert_eq!(n, 4096);
    drop(file);
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 1 << 20);
    let e = OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(2 << 20)
        .expect_err("a truncate past the end");
    assert_eq!(e.raw_os_error(), Some(libc::ENODATA), "{e}");
    assert_eq!(std::fs::read(&f).unwrap(), mb);
}

fn dom_layout() -> Layout {
    Layout {
        gen: 0,
        components: vec![
            Component {
                id: 1,
                start: 0,
                end: 256 << 10,
                pattern: Pattern::Mdt,
            },
            Component {
                id: 2,
                start: 256 << 10,
                end: 1 << 20,
                pattern: Pattern::Raid0 {
                    stripe_size: 64 << 10,
                    stripe_count: 1,
                    stripe_offset: -1,
                    osts: Vec::new(),
                },
            },
            Component {
                id: 3,
                start: 1 << 20,
                end: EOF,
                pattern: Pattern::Raid0 {
                    stripe_size: 64 << 10,
                    stripe_count: 2,
                    stripe_offset: -1,
                    osts: Vec::new(),
                },
            },
        ],
    }
}

/// One random step against the model: a write, a truncate, a fallocate (mode, offset,
/// length) or a read-and-compare.
enum Step {
    Write(u64, Vec<u8>),
    Truncate(u64),
    Fallocate(i32, u64, u64),
    Read(u64, usize),
}

fn step(rng: &mut rand::rngs::StdRng) -> Step {
    // Offsets cluster around the DoM end and the component boundary.
    let near = |rng: &mut rand::rngs::StdRng| -> u64 {
        let base = [0u64, 256 << 10, 1 << 20, 1_500_000][rng.random_range(0..4)];
        base.saturating_add_signed(rng.random_range(-70_000i64..70_000))
    };
    match rng.random_range(0..11) {
        0..=4 => {
            let len = rng.random_range(1..200_000usize);
            Step::Write(near(rng), (0..len).map(|_| rng.random()).collect())
        }
        5 => Step::Truncate(near(rng)),
        6 => {
            let keep = libc::FALLOC_FL_KEEP_SIZE;
            let modes = [
                0,
                keep,
                libc::FALLOC_FL_PUNCH_HOLE | keep,
                libc::FALLOC_FL_ZERO_RANGE,
                libc::FALLOC_FL_ZERO_RANGE | keep,
            ];
            let mode = modes[rng.random_range(0..modes.len())];
            Step::Fallocate(mode, near(rng), rng.random_range(1..300_000))
        }
        _ => Step::Read(near(rng), rng.random_range(0..400_000)),
    }
}

fn apply(model: &mut Vec<u8>, st: &Step) {
    match st {
        Step::Write(off, data) => {
            let end = *off as usize + data.len();
            if model.len() < end {
                model.resize(end, 0);
            }
            model[*off as usize..end].copy_from_slice(data);
        }
        Step::Truncate(size) => model.resize(*size as usize, 0),
        &Step::Fallocate(mode, off, len) => {
            let (off, end) = (off as usize, (off + len) as usize);
            if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && model.len() < end {
                model.resize(end, 0);
            }
            if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
                let to = end.min(model.len());
                if off < to {
                    model[off..to].fill(0);
                }
            }
        }
        Step::Read(..) => {}
    }
}

fn expect(model: &[u8], off: u64, len: usize) -> &[u8] {
    let from = (off as usize).min(model.len());
    let to = (off as usize + len).min(model.len());
    &model[from..to]
}

#[test]
fn dom_data_matches_a_model_through_the_mount_and_natively() {
    let seed = seed();
    println!("seed {seed} (LODE_TEST_SEED={seed} repeats it)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let c = cluster(2);
    let m = c.mount();
    let sess = c.client();
    let cl = &sess.client;
    let r = root();

    // Through the mount: a file under a directory default of DoM + two OST components.
    let d = m.path().join("model");
    std::fs::create_dir(&d).unwrap();
    ok(
        &c,
        &[
            "setstripe",
            "-E",
            "256k",
            "-L",
            "mdt",
            "-E",
            "1M",
            "-c",
            "1",
            "-S",
            "64k",
            "-E",
            "-1",
            "-c",
            "2",
            "-S",
            "64k",
            &s(&d),
        ],
    );
    let path = d.join("f");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut model = Vec::new();
    for i in 0..150 {
        let st = step(&mut rng);
        match &st {
            Step::Write(off, data) => file.write_all_at(data, *off).unwrap(),
            Step::Truncate(size) => file.set_len(*size).unwrap(),
            &Step::Fallocate(mode, off, len) => {
                let r = unsafe { libc::fallocate(file.as_raw_fd(), mode, off as i64, len as i64) };
                assert_eq!(
                    r,
                    0,
                    "fallocate({mode:#x}, {off}, {len}) at step {i}: {}",
                    std::io::Error::last_os_error()
                );
            }
            Step::Read(off, len) => {
                let mut buf = vec![0u8; *len];
                let mut got = 0;
                while got < *len {
                    let n = file.read_at(&mut buf[got..], off + got as u64).unwrap();
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                buf.truncate(got);
                assert!(
                    buf == expect(&model, *off, *len),
                    "mount: read of {len} at {off} differs at step {i} (seed {seed})"
                );
            }
        }
        apply(&mut model, &st);
        if i % 25 == 0 {
            file.sync_all().unwrap();
            assert_eq!(
                file.metadata().unwrap().len(),
                model.len() as u64,
                "step {i}"
            );
        }
    }
    drop(file);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        model,
        "mount: the whole file (seed {seed})"
    );

    // The native client sees the same bytes, then runs its own steps.
    let dfid = fid(&sess, "/model").unwrap();
    let ffid = sess.run(cl.lookup(&r, dfid, b"f")).unwrap().attr.fid;
    let fh = sess.run(cl.open(&r, ffid, libc::O_RDWR)).unwrap();
    assert_eq!(
        sess.run(cl.read(&fh, 0, model.len() + 10)).unwrap(),
        model,
        "native: the whole file"
    );
    let fh2 = sess
        .run(cl.create_open(
            &r,
            Fid::ROOT,
            b"native",
            0o644,
            libc::O_RDWR,
            Some(dom_layout()),
        ))
        .unwrap();
    let mut model2 = Vec::new();
    for i in 0..150 {
        let st = step(&mut rng);
        match &st {
            Step::Write(off, data) => {
                assert_eq!(
                    sess.run(cl.write(&fh2, *off, data)),
                    Ok(data.len()),
                    "step {i}"
                )
            }
            Step::Truncate(size) => sess.run(cl.truncate_open(&r, &fh2, *size)).unwrap(),
            &Step::Fallocate(mode, off, len) => {
                sess.run(cl.fallocate(&fh2, mode, off, len)).unwrap()
            }
            Step::Read(off, len) => {
                let got = sess.run(cl.read(&fh2, *off, *len)).unwrap();
                assert!(
                    got == expect(&model2, *off, *len),
                    "native: read of {len} at {off} differs at step {i} (seed {seed})"
                );
                // SEEK_DATA skips only zeros; SEEK_HOLE stops at a zero or the end.
                let size = model2.len() as u64;
                let data = sess.run(cl.seek(&fh2, *off, false, true));
                let hole = sess.run(cl.seek(&fh2, *off, true, true));
                if *off >= size {
                    assert_eq!((data, hole), (Err(Errno::ENXIO), Err(Errno::ENXIO)));
                } else {
                    let skipped = data.unwrap_or(size);
                    assert!(
                        skipped >= *off
                            && model2[*off as usize..skipped as usize]
                                .iter()
                                .all(|&b| b == 0),
                        "native: SEEK_DATA from {off} gave {data:?} at step {i} (seed {seed})"
                    );
                    let h = hole.unwrap();
                    assert!(
                        h >= *off && (h == size || model2[h as usize] == 0),
                        "native: SEEK_HOLE from {off} gave {h} at step {i} (seed {seed})"
                    );
                }
            }
        }
        apply(&mut model2, &st);
        let a = sess.run(cl.getattr(&r, fh2.fid)).unwrap();
        assert_eq!(
            a.size,
            model2.len() as u64,
            "native size at step {i} (seed {seed})"
        );
    }
    sess.run(cl.close(&fh2)).unwrap();
    sess.run(cl.close(&fh)).unwrap();
    // Closed and all on the MDT below 256 KiB: exact size, no glimpse needed.
    assert_eq!(
        std::fs::read(m.path().join("native")).unwrap(),
        model2,
        "the mount reads what the native client wrote (seed {seed})"
    );
}

#[test]
fn dom_data_survives_an_mds_crash_committed_or_replayed() {
    let mut c = cluster(1);
    let sess = c.client();
    let cl = &sess.client;
    let r = root();
    let fh = sess
        .run(cl.create_open(
            &r,
            Fid::ROOT,
            b"d",
            0o644,
            libc::O_RDWR,
            Some(dom_only_layout()),
        ))
        .unwrap();
    let a: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(sess.run(cl.write(&fh, 0, &a)), Ok(a.len()));
    sess.run(cl.fsync(&fh)).unwrap();
    // Committed by the fsync: a kill -9 loses nothing, with or without the client.
    c.kill9("mdt0");
    c.start_target("mdt0");
    wait_recovered(&c);
    assert_eq!(
        sess.run(cl.read(&fh, 0, 1 << 20)),
        Ok(a.clone()),
        "after the crash"
    );

    // Answered, not committed: the client replays it.
    hold_commits(&c, 1);
    let b = vec![0xb5u8; 70_000];
    assert_eq!(sess.run(cl.write(&fh, 200_000, &b)), Ok(b.len()));
    c.kill9("mdt0");
    c.start_target("mdt0");
    let status = wait_recovered(&c);
    assert_ne!(status_field(&status, "replayed_requests"), "0", "{status}");
    let mut want = a.clone();
    want.resize(270_000.max(want.len()), 0);
    want[200_000..270_000].copy_from_slice(&b);
    assert_eq!(
        sess.run(cl.read(&fh, 0, 1 << 20)),
        Ok(want),
        "after the replay"
    );
    sess.run(cl.close(&fh)).unwrap();
}

#[test]
fn find_selects_by_layout_name_size_and_component_end() {
    let c = cluster(2);
    let m = c.mount();
    let root = m.path();
    let p = |n: &str| root.join(n);
    std::fs::create_dir(p("dom")).unwrap();
    ok(
        &c,
        &[
            "setstripe",
            "-E",
            "1M",
            "-L",
            "mdt",
            "-E",
            "-1",
            &s(&p("dom")),
        ],
    );
    std::fs::create_dir(p("dom/sub")).unwrap();
    std::fs::create_dir(p("plain")).unwrap();
    std::fs::write(p("dom/a"), b"0123456789").unwrap();
    std::fs::write(p("dom/b.txt"), vec![1u8; 200_000]).unwrap();
    std::fs::write(p("dom/sub/c"), b"c").unwrap();
    std::fs::write(p("plain/x"), vec![2u8; 100]).unwrap();
    std::fs::write(p("plain/y.txt"), b"y").unwrap();
    ok(
        &c,
        &[
            "setstripe",
            "-E",
            "64k",
            "-L",
            "mdt",
            "-E",
            "-1",
            &s(&p("plain/small")),
        ],
    );
    let find = |args: &[&str]| -> Vec<String> {
        let mut v = vec!["find", root.to_str().unwrap()];
        v.extend(args);
        let mut out: Vec<String> = ok(&c, &v)
            .lines()
            .map(|l| {
                l.strip_prefix(root.to_str().unwrap())
                    .unwrap_or(l)
                    .trim_start_matches('/')
                    .to_string()
            })
            .collect();
        out.sort();
        out
    };
    assert_eq!(
        find(&["-L", "mdt", "-type", "f"]),
        ["dom/a", "dom/b.txt", "dom/sub/c", "plain/small"]
    );
    assert_eq!(find(&["-L", "mdt", "-type", "d"]), ["dom", "dom/sub"]);
    // The seed's `lfs find -L mdt -S -180K`.
    assert_eq!(find(&["-L", "mdt", "-S", "-180K"]), ["plain/small"]);
    assert_eq!(
        find(&["-E", "1M", "-type", "f"]),
        ["dom/a", "dom/b.txt", "dom/sub/c"]
    );
    assert_eq!(
        find(&["--component-count", "1", "-type", "f"]),
        ["plain/x", "plain/y.txt"]
    );
    assert_eq!(find(&["-name", "*.txt"]), ["dom/b.txt", "plain/y.txt"]);
    assert_eq!(find(&["-type", "f", "-size", "+100k"]), ["dom/b.txt"]);
    assert_eq!(
        find(&["-type", "f", "-mtime", "-1", "-name", "c"]),
        ["dom/sub/c"]
    );
    let z = ok(&c, &["find", &s(&p("dom")), "-name", "a", "-print0"]);
    assert_eq!(z, format!("{}\0", s(&p("dom/a"))));
}

#[test]
fn a_small_dom_file_is_read_with_its_open() {
    let c = cluster(1);
    let (m, r) = (c.mount(), c.mount());
    let d = m.path().join("small");
    std::fs::create_dir(&d).unwrap();
    ok(
        &c,
        &["setstripe", "-E", "1M", "-L", "mdt", "-E", "-1", &s(&d)],
    );
    let body = |i: usize| -> Vec<u8> { (0..4096).map(|k| (i * 31 + k) as u8).collect() };
    for i in 0..100 {
        std::fs::write(d.join(format!("f{i}")), body(i)).unwrap();
    }
    // Every writer's close has reached the MDT (they go in the background, and
    // ahead of the next request).
    all_closed(&c);
    let (reads, opens, ost) = (
        mdt_stat(&c, "dom_read"),
        mdt_stat(&c, "mds_reint_open"),
        ost_io(&c),
    );
    // Read through another mount, which never held the files' pages. The writer's
    // mount would keep its own pages across opens (see
    // `a_dom_files_pages_are_kept_across_opens_until_its_bytes_change`), but the
    // kernel may reclaim them at any time (these VMs run DAMON's proactive
    // reclaim), and then reads them again from the MDT.
    let rd = r.path().join("small");
    for i in 0..100 {
        assert_eq!(
            std::fs::read(rd.join(format!("f{i}"))).unwrap(),
            body(i),
            "f{i}"
        );
    }
    assert_eq!(mdt_stat(&c, "mds_reint_open") - opens, 100, "one open each");
    assert_eq!(
        mdt_stat(&c, "dom_read"),
        reads,
        "no read RPC: the bytes came with the open"
    );
    assert_eq!(ost_io(&c), ost, "nothing from the OSTs");
    // With read-on-open off, reading bytes this mount does not hold is a DOM_READ (a
    // page written in part is not kept past its writer's close).
    c.set_param("mdt.*.dom_read_on_open=0");
    std::fs::write(d.join("g"), b"part of a page").unwrap();
    assert_eq!(std::fs::read(d.join("g")).unwrap(), b"part of a page");
    assert!(mdt_stat(&c, "dom_read") > reads);
}

/// Waits until the MDT holds no file open: every close, by RPC or ahead of a
/// request, has reached it.
fn all_closed(c: &Cluster) {
    wait_for("the closes", Duration::from_secs(10), || {
        c.get_param("mdt.*.open_files").trim() == "0"
    });
}

/// `ost_getattr` (glimpses) summed over the OSTs.
fn glimpses(c: &Cluster) -> u64 {
    ost_stat(c, &["ost_getattr"])
}

#[test]
fn a_closed_files_size_is_kept_on_the_mdt_and_stat_needs_no_glimpse() {
    let c = cluster(2);
    let m = c.mount();
    let sess = c.client();
    let cl = &sess.client;
    let r = root();
    // By RPC, or (the handle made the file and alone wrote it) ahead of the next
    // request.
    let all_closes = || mdt_stat(&c, "mds_close") + mdt_stat(&c, "mds_close_ahead");
    let closes = all_closes();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(m.path().join("f"), &data).unwrap();
    wait_for("the close", Duration::from_secs(10), || {
        all_closes() > closes
    });
    let fid = sess.run(cl.lookup(&r, Fid::ROOT, b"f")).unwrap().attr.fid;
    let before = glimpses(&c);
    for _ in 0..5 {
        let a = sess.run(cl.getattr(&r, fid)).unwrap();
        assert_eq!(a.size, data.len() as u64);
        assert!(a.blocks >= data.len() as u64 / 512, "blocks {}", a.blocks);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        assert!(
            (now - a.mtime).abs() < 60_000_000_000,
            "mtime of the writes"
        );
    }
    assert_eq!(glimpses(&c), before, "stat of a closed file asks no OST");
    let big = ok(&c, &["find", &s(m.path()), "-type", "f", "-size", "+2M"]);
    assert_eq!(big.trim(), s(&m.path().join("f")));

    // Two writers overlapping: neither may say what the size is; it stays glimpsed
    // and right.
    let fa = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(m.path().join("two"))
        .unwrap();
    let tfid = sess.run(cl.lookup(&r, Fid::ROOT, b"two")).unwrap().attr.fid;
    let fb = sess.run(cl.open(&r, tfid, libc::O_RDWR)).unwrap();
    fa.write_all_at(&[1u8; 1000], 0).unwrap();
    assert_eq!(sess.run(cl.write(&fb, 5_000_000, &[2u8; 1000])), Ok(1000));
    let closes = all_closes();
    drop(fa);
    wait_for("the close", Duration::from_secs(10), || {
        all_closes() > closes
    });
    sess.run(cl.close(&fb)).unwrap();
    let other = c.client();
    let a = other.run(other.client.getattr(&r, tfid)).unwrap();
    assert_eq!(a.size, 5_001_000, "both writers' bytes");
    // A new writer after the size was kept: its growth is seen.
    let fh = sess.run(cl.open(&r, fid, libc::O_RDWR)).unwrap();
    assert_eq!(sess.run(cl.write(&fh, 4_000_000, b"tail")), Ok(4));
    let a = other.run(other.client.getattr(&r, fid)).unwrap();
    assert_eq!(a.size, 4_000_004, "seen while open");
    sess.run(cl.close(&fh)).unwrap();
    let a = other.run(other.client.getattr(&r, fid)).unwrap();
    assert_eq!(a.size, 4_000_004, "kept at its close");
    assert_eq!(
        std::fs::metadata(m.path().join("f")).unwrap().len(),
        4_000_004,
        "and through the mount"
    );
}

/// A file written again over itself (`>` on an existing file: `O_TRUNC`), or cut by
/// `ftruncate` through its only writer, has its size kept on the MDT at the close,
/// as a new file's is: the truncate names the handle it comes through, so it is
/// ordered before that handle's close. A truncate by path names none: it may
/// overtake a close the kernel did not wait for, and leaves the size to glimpses;
/// as does another client's truncate while a writer has the file open.
#[test]
fn a_truncate_through_the_only_writer_keeps_the_size_at_its_close() {
    let c = cluster(2);
    let m = c.mount();
    let other = c.client();
    let r = root();
    let p = m.path().join("f");
    std::fs::write(&p, vec![5u8; 200_000]).unwrap();
    all_closed(&c);
    std::fs::write(&p, vec![6u8; 1000]).unwrap();
    all_closed(&c);
    let fid = other
        .run(other.client.lookup(&r, Fid::ROOT, b"f"))
        .unwrap()
        .attr
        .fid;
    let stat = |want: u64| {
        let a = other.run(other.client.getattr(&r, fid)).unwrap();
        assert_eq!(a.size, want);
    };
    let before = glimpses(&c);
    stat(1000);
    assert_eq!(
        glimpses(&c),
        before,
        "`>`: the size kept, a stat asks no OST"
    );

    // ftruncate through the only writer, shorter and then longer (a hole).
    let w = OpenOptions::new().write(true).open(&p).unwrap();
    w.write_all_at(&[7u8; 3000], 0).unwrap();
    w.set_len(10).unwrap();
    w.set_len(70_000).unwrap();
    drop(w);
    all_closed(&c);
    let before = glimpses(&c);
    stat(70_000);
    assert_eq!(glimpses(&c), before, "ftruncate: the size kept");
    let back = std::fs::read(&p).unwrap();
    assert_eq!(back.len(), 70_000);
    assert_eq!(&back[..10], &[7u8; 10]);
    assert!(back[10..].iter().all(|&b| b == 0), "the hole reads zeros");

    // A truncate by path from the same mount overtakes the writer's close, which
    // the kernel does not wait for: the close, its size glimpsed, is held before it
    // leaves (`mdc.*.net_delay_us`), and the truncate, sent when the delay is off
    // again, reaches the MDT first. What the close glimpsed is not the size then.
    let w = OpenOptions::new().write(true).open(&p).unwrap();
    w.write_all_at(&[8u8; 200_000], 0).unwrap();
    let closes = mdt_stat(&c, "mds_close");
    c.set_param("mdc.*.net_delay_us=800000");
    drop(w);
    std::thread::sleep(Duration::from_millis(200));
    c.set_param("mdc.*.net_delay_us=0");
    let cpath = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::truncate(cpath.as_ptr(), 0) }, 0);
    assert_eq!(mdt_stat(&c, "mds_close"), closes, "the truncate went first");
    all_closed(&c);
    stat(0);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 0, "through the mount");

    // B truncates while the mount has the file open for writing: the mount's close
    // does not say the size.
    let w = OpenOptions::new().write(true).open(&p).unwrap();
    w.write_all_at(&[9u8; 10], 0).unwrap();
    let a = other
        .run(other.client.setattr(
            &r,
            fid,
            lode_base::SetAttr {
                size: Some(500),
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(a.attr.size, 500);
    drop(w);
    all_closed(&c);
    let before = glimpses(&c);
    stat(500);
    assert!(glimpses(&c) > before, "B's truncate: glimpsed");
}

#[test]
fn the_close_of_the_handle_that_made_a_file_says_its_size_without_a_glimpse() {
    let c = cluster(2);
    let sess = c.client();
    let cl = &sess.client;
    let other = c.client();
    let r = root();
    // Over both OSTs, written out of order and past holes.
    let fh = sess
        .run(cl.create_open(
            &r,
            Fid::ROOT,
            b"made",
            0o644,
            libc::O_RDWR,
            Some(Layout::plain(2, 65536, -1)),
        ))
        .unwrap();
    assert_eq!(sess.run(cl.write(&fh, 300_000, &[7u8; 5000])), Ok(5000));
    assert_eq!(sess.run(cl.write(&fh, 0, &[1u8; 100])), Ok(100));
    assert_eq!(sess.run(cl.write(&fh, 70_000, &[2u8; 10])), Ok(10));
    let before = glimpses(&c);
    sess.run(cl.close(&fh)).unwrap();
    assert_eq!(glimpses(&c), before, "the close asked no OST");
    // It went ahead, with the size: it reaches the MDT with the next request.
    assert_eq!(sess.client.mdc().closes_ahead(), 1);
    sess.run(cl.statfs()).unwrap();
    let a = other.run(other.client.getattr(&r, fh.fid)).unwrap();
    assert_eq!(a.size, 305_000);
    assert_eq!(
        glimpses(&c),
        before,
        "the MDT keeps the size: a stat asks no OST"
    );
    // Opened again, it is glimpsed at close (that handle did not make it), and the
    // glimpse finds what the writes' answers said.
    let fh2 = sess.run(cl.open(&r, fh.fid, libc::O_RDWR)).unwrap();
    assert_eq!(sess.run(cl.write(&fh2, 0, &[1u8; 100])), Ok(100));
    sess.run(cl.close(&fh2)).unwrap();
    assert!(
        glimpses(&c) > before,
        "a handle that did not make the file glimpses"
    );
    let b = other.run(other.client.getattr(&r, fh.fid)).unwrap();
    assert_eq!((b.size, b.blocks), (a.size, a.blocks));

    // Truncated by the handle that made it: glimpsed at close, and right.
    let t = sess
        .run(cl.create_open(&r, Fid::ROOT, b"cut", 0o644, libc::O_RDWR, None))
        .unwrap();
    assert_eq!(sess.run(cl.write(&t, 0, &[3u8; 10_000])), Ok(10_000));
    sess.run(cl.truncate_open(&r, &t, 10)).unwrap();
    sess.run(cl.close(&t)).unwrap();
    let a = other.run(other.client.getattr(&r, t.fid)).unwrap();
    assert_eq!(a.size, 10);
}

/// A mount keeps a Data-on-MDT file's pages across opens while the MDT says the bytes
/// they hold are still the file's (its data token), through changes of attributes,
/// and reads the file anew once anyone changed its bytes: another mount's rewrite
/// with the mtime put back (as rsync does), a truncate.
#[test]
fn a_dom_files_pages_are_kept_across_opens_until_its_bytes_change() {
    let c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    let d = a.path().join("kept");
    std::fs::create_dir(&d).unwrap();
    ok(&c, &["setstripe", "-E", "1M", "-L", "mdt", &s(&d)]);
    // Without read-on-open every read that reaches the MDT is a DOM_READ, counted.
    c.set_param("mdt.*.dom_read_on_open=0");
    let body = |i: u8| -> Vec<u8> { (0..4096u32).map(|k| (k as u8) ^ i).collect() };
    // The writer's pages are named by its close, which leaves in the background: a
    // read that opens before the name is back reads from the MDT, so try new files
    // until one is read from the pages alone.
    let mut n = 0;
    let mut kept = None;
    wait_for(
        "a read served by the writer's pages",
        Duration::from_secs(20),
        || {
            n += 1;
            let f = d.join(format!("f{n}"));
            std::fs::write(&f, body(1)).unwrap();
            all_closed(&c);
            std::thread::sleep(Duration::from_millis(50));
            let reads = mdt_stat(&c, "dom_read");
            assert_eq!(std::fs::read(&f).unwrap(), body(1), "f{n}");
            let hit = mdt_stat(&c, "dom_read") == reads;
            if hit {
                kept = Some(f);
            }
            hit
        },
    );
    let f = kept.unwrap();
    let fb = b.path().join("kept").join(f.file_name().unwrap());
    let reads = mdt_stat(&c, "dom_read");
    // A change of attributes alone (a chmod) leaves the pages current.
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    assert_eq!(std::fs::read(&f).unwrap(), body(1));
    assert_eq!(std::fs::read(&f).unwrap(), body(1));
    assert_eq!(mdt_stat(&c, "dom_read"), reads, "kept through a chmod");
    // Another mount rewrites the bytes in place, same size, and puts the mtime back.
    let mtime = std::fs::metadata(&fb).unwrap().modified().unwrap();
    {
        let w = OpenOptions::new().write(true).open(&fb).unwrap();
        w.write_all_at(&body(2), 0).unwrap();
        w.set_modified(mtime).unwrap();
    }
    assert_eq!(std::fs::metadata(&fb).unwrap().modified().unwrap(), mtime);
    wait_for(
        "the rewrite seen through the other mount",
        Duration::from_secs(10),
        || std::fs::read(&f).unwrap() == body(2),
    );
    assert!(mdt_stat(&c, "dom_read") > reads, "read anew from the MDT");
    // A truncate through this mount, then a read through both.
    let t = OpenOptions::new().write(true).open(&f).unwrap();
    t.set_len(100).unwrap();
    drop(t);
    assert_eq!(std::fs::read(&f).unwrap(), body(2)[..100].to_vec());
    assert_eq!(std::fs::read(&fb).unwrap(), body(2)[..100].to_vec());
    // And a rewrite through this mount, read through the other and again here.
    std::fs::write(&f, body(3)).unwrap();
    wait_for("the other mount sees it", Duration::from_secs(10), || {
        std::fs::read(&fb).unwrap() == body(3)
    });
    assert_eq!(std::fs::read(&f).unwrap(), body(3));
}

#[test]
fn a_dom_file_is_read_with_its_open_after_a_writer_that_a_reader_outlived_and_a_truncate() {
    let c = cluster(1);
    let (w, r, other) = (c.client(), c.client(), c.client());
    let cred = root();
    let fh = dom_file_written(&w, b"f", b"hello world");
    // A reader holds the file open past its writer's close, and closes last.
    let rh = r
        .run(r.client.open(&cred, fh.fid, libc::O_RDONLY))
        .expect("open");
    w.run(w.client.close(&fh)).expect("close");
    // The maker's close rides ahead of its next request: sent here.
    w.run(w.client.statfs()).expect("statfs");
    r.run(r.client.close(&rh)).expect("close");
    read_with_its_open(&c, &other, fh.fid, b"hello world");
    // A truncate with no writer open leaves the size exact too.
    let sa = lode_base::SetAttr {
        size: Some(5),
        ..Default::default()
    };
    r.run(r.client.setattr(&cred, fh.fid, sa))
        .expect("truncate");
    read_with_its_open(&c, &other, fh.fid, b"hello");
}

/// `reader` opens `fid` for reading and reads `want`, with no DOM_READ: no writer
/// left, the size is exact, and the bytes came with the open.
fn read_with_its_open(c: &Cluster, reader: &lode_client::Session, fid: Fid, want: &[u8]) {
    let reads = mdt_stat(c, "dom_read");
    let h = reader
        .run(reader.client.open(&root(), fid, libc::O_RDONLY))
        .expect("open");
    assert_eq!(
        reader.run(reader.client.read(&h, 0, 100)).as_deref(),
        Ok(want)
    );
    reader.run(reader.client.close_now(&h)).expect("close");
    assert_eq!(
        mdt_stat(c, "dom_read"),
        reads,
        "the bytes came with the open: no writer left, the size is exact"
    );
}

#[test]
fn a_dom_file_whose_last_writer_was_evicted_is_read_with_its_open() {
    let c = cluster(1);
    let (w, other) = (c.client(), c.client());
    let fh = dom_file_written(&w, b"f", b"hello world");
    // The writer goes without closing: the MDT closes its handle as it evicts it.
    c.set_param(&format!("mdt.*.evict_client={}", w.client.uuid()));
    assert_eq!(c.get_param("mdt.*.open_files"), "0");
    read_with_its_open(&c, &other, fh.fid, b"hello world");
}
