//! Model-based test: random sequences of POSIX calls run on a lode mount and on a local
//! directory must give the same results (values or errnos) and leave equal trees.
//!
//! Every sequence prints its seed; `LODE_SEED=<seed>` replays just that sequence.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::prelude::*;
use std::path::Path;

/// A small pool of names, so that operations collide and hit every error path: mostly
/// used for files, mostly used for directories, and both.
const FILES: &[&str] = &["a", "b", "d/x", "d/y", "e/x", "d/z/x", "c/a"];
const DIRS: &[&str] = &["c", "d", "e", "d/z", "e/w"];
const NAMES: &[&str] = &[
    "a", "b", "c", "d", "e", "d/x", "d/y", "d/z", "e/x", "d/z/x", "c/a",
];
/// Symlink targets: names of the pool (relative, so they stay inside the tree) or nothing.
const TARGETS: &[&str] = &["a", "b", "d", "e", "x", "z", "zz", "d/x"];
const MODES: &[u32] = &[0o644, 0o755, 0o600, 0o000, 0o444, 0o4755, 0o2755, 0o1777];
const SEQUENCES: u64 = 20;
const OPS: usize = 200;

#[derive(Debug, Clone)]
enum Op {
    /// open(O_WRONLY | flags, mode) and close.
    Open(&'static str, i32, u32),
    Write(&'static str, u64, usize, u8),
    Truncate(&'static str, i64),
    /// fallocate(2) through a descriptor open for writing: mode, offset, length.
    Fallocate(&'static str, i32, u64, u64),
    Mkdir(&'static str, u32),
    Rmdir(&'static str),
    Unlink(&'static str),
    Rename(&'static str, &'static str, u32),
    Link(&'static str, &'static str),
    Symlink(&'static str, &'static str),
    Chmod(&'static str, u32),
    Read(&'static str),
    Stat(&'static str),
    Readdir(&'static str),
    Readlink(&'static str),
}

/// What a call returned.
#[derive(Debug, PartialEq, Eq, Clone)]
enum Out {
    Done,
    Count(u64),
    /// Length and hash of the data read.
    Data(usize, u64),
    /// st_mode, size (not for directories), nlink.
    Stat(u32, Option<u64>, u64),
    Names(Vec<String>),
    Link(String),
}

fn hash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100000001b3)
    })
}

fn pick<T: Copy>(rng: &mut StdRng, v: &[T]) -> T {
    v[rng.random_range(0..v.len())]
}

/// Mostly a name of `v`, sometimes any name.
fn kind(rng: &mut StdRng, v: &[&'static str]) -> &'static str {
    if rng.random_bool(0.8) {
        pick(rng, v)
    } else {
        pick(rng, NAMES)
    }
}

fn offset(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..4) {
        0 => 0,
        1 => rng.random_range(0..8192),
        2 => 65536 + rng.random_range(0..4096),
        // Past the first 1 MiB stripe.
        _ => (1 << 20) - 100 + rng.random_range(0..200),
    }
}

fn random_op(rng: &mut StdRng) -> Op {
    let f = |rng: &mut StdRng| kind(rng, FILES);
    let d = |rng: &mut StdRng| kind(rng, DIRS);
    let n = |rng: &mut StdRng| pick(rng, NAMES);
    let m = |rng: &mut StdRng| pick(rng, MODES);
    match rng.random_range(0..26) {
        0..=3 => {
            let flags = pick(
                rng,
                &[libc::O_CREAT, libc::O_CREAT | libc::O_EXCL, libc::O_TRUNC],
            );
            Op::Open(f(rng), flags, m(rng))
        }
        4..=6 => Op::Write(f(rng), offset(rng), rng.random_range(1..5000), rng.random()),
        7 => Op::Truncate(f(rng), offset(rng) as i64),
        8..=10 => Op::Mkdir(d(rng), m(rng)),
        11 => Op::Rmdir(d(rng)),
        12 => Op::Unlink(f(rng)),
        13 | 14 => {
            let flags = pick(
                rng,
                &[0, 0, 0, libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE],
            );
            Op::Rename(n(rng), n(rng), flags)
        }
        15 => Op::Link(f(rng), f(rng)),
        16 => Op::Symlink(pick(rng, TARGETS), n(rng)),
        17 => Op::Chmod(n(rng), m(rng)),
        18 | 19 => Op::Read(f(rng)),
        20 | 21 => Op::Stat(n(rng)),
        22 => Op::Readdir(pick(rng, &[".", "c", "d", "e", "d/z"])),
        23 => Op::Readlink(n(rng)),
        _ => {
            // The modes lode has, as Lustre (no collapse, insert or unshare); punch
            // without KEEP_SIZE is refused by both.
            let keep = libc::FALLOC_FL_KEEP_SIZE;
            let mode = pick(
                rng,
                &[
                    0,
                    keep,
                    libc::FALLOC_FL_PUNCH_HOLE | keep,
                    libc::FALLOC_FL_PUNCH_HOLE | keep,
                    libc::FALLOC_FL_ZERO_RANGE,
                    libc::FALLOC_FL_ZERO_RANGE | keep,
                    libc::FALLOC_FL_PUNCH_HOLE,
                ],
            );
            Op::Fallocate(f(rng), mode, offset(rng), rng.random_range(1..70_000))
        }
    }
}

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().expect("an OS error")
}

fn cs(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn sys(r: i64) -> Result<i64, i32> {
    if r < 0 {
        Err(errno(std::io::Error::last_os_error()))
    } else {
        Ok(r)
    }
}

/// Runs one call under `root`.
fn apply(root: &Path, op: &Op) -> Result<Out, i32> {
    let p = |n: &str| root.join(n);
    let done = |r: std::io::Result<()>| r.map(|_| Out::Done).map_err(errno);
    match *op {
        Op::Open(n, flags, mode) => {
            let c = cs(&p(n));
            let fd = sys(unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | flags, mode) } as i64)?;
            unsafe { libc::close(fd as i32) };
            Ok(Out::Done)
        }
        Op::Write(n, off, len, byte) => {
            let f = fs::OpenOptions::new()
                .write(true)
                .open(p(n))
                .map_err(errno)?;
            f.write_all_at(&vec![byte; len], off).map_err(errno)?;
            Ok(Out::Count(len as u64))
        }
        Op::Fallocate(n, mode, off, len) => {
            let f = fs::OpenOptions::new()
                .write(true)
                .open(p(n))
                .map_err(errno)?;
            let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) };
            sys(r as i64).map(|_| Out::Done)
        }
        Op::Truncate(n, len) => {
            let c = cs(&p(n));
            sys(unsafe { libc::truncate(c.as_ptr(), len) } as i64).map(|_| Out::Done)
        }
        Op::Mkdir(n, mode) => done(fs::DirBuilder::new().mode(mode).create(p(n))),
        Op::Rmdir(n) => done(fs::remove_dir(p(n))),
        Op::Unlink(n) => done(fs::remove_file(p(n))),
        Op::Rename(a, b, flags) => {
            let (a, b) = (cs(&p(a)), cs(&p(b)));
            let at = libc::AT_FDCWD;
            let r = unsafe {
                libc::syscall(libc::SYS_renameat2, at, a.as_ptr(), at, b.as_ptr(), flags)
            };
            sys(r).map(|_| Out::Done)
        }
        Op::Link(a, b) => done(fs::hard_link(p(a), p(b))),
        Op::Symlink(t, n) => done(std::os::unix::fs::symlink(t, p(n))),
        Op::Chmod(n, mode) => done(fs::set_permissions(p(n), fs::Permissions::from_mode(mode))),
        Op::Read(n) => fs::read(p(n))
            .map(|d| Out::Data(d.len(), hash(&d)))
            .map_err(errno),
        Op::Stat(n) => fs::symlink_metadata(p(n)).map(|m| stat(&m)).map_err(errno),
        Op::Readdir(n) => {
            let mut names = fs::read_dir(p(n))
                .map_err(errno)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(errno)?;
            names.sort();
            Ok(Out::Names(names))
        }
        Op::Readlink(n) => {
            let t = fs::read_link(p(n)).map_err(errno)?;
            Ok(Out::Link(t.to_string_lossy().into_owned()))
        }
    }
}

fn stat(m: &fs::Metadata) -> Out {
    Out::Stat(m.mode(), (!m.is_dir()).then_some(m.len()), m.nlink())
}

/// Every entry under `root` (not following symlinks) with its type, mode, nlink, size
/// and contents or target.
fn tree(root: &Path) -> BTreeMap<String, (Out, Option<Out>)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![String::new()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(root.join(&dir)).unwrap() {
            let e = e.unwrap();
            let rel = format!("{dir}{}", e.file_name().to_string_lossy());
            let m = fs::symlink_metadata(e.path()).unwrap();
            let extra = if m.is_dir() {
                todo.push(format!("{rel}/"));
                None
            } else if m.is_symlink() {
                let t = fs::read_link(e.path()).unwrap();
                Some(Out::Link(t.to_string_lossy().into_owned()))
            } else {
                let d = fs::read(e.path()).unwrap();
                Some(Out::Data(d.len(), hash(&d)))
            };
            out.insert(rel, (stat(&m), extra));
        }
    }
    out
}

fn run_sequence(m: &Path, local: &Path, seq: u64, seed: u64) {
    println!("sequence {seq}: LODE_SEED={seed}");
    let (ours, theirs) = (m.join(format!("s{seq}")), local.join(format!("s{seq}")));
    fs::create_dir(&ours).unwrap();
    fs::create_dir(&theirs).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut history = Vec::new();
    let mut failed = 0;
    // Start from a few directories and files, then go random.
    let start = DIRS.iter().map(|d| Op::Mkdir(d, 0o755));
    let start = start.chain(FILES.iter().map(|f| Op::Open(f, libc::O_CREAT, 0o644)));
    let start = start.chain(FILES.iter().map(|f| Op::Write(f, 10, 100, 1)));
    let mut start: Vec<Op> = start.collect();
    start.reverse();
    for step in 0..OPS {
        let op = start.pop().unwrap_or_else(|| random_op(&mut rng));
        let (got, want) = (apply(&ours, &op), apply(&theirs, &op));
        failed += want.is_err() as usize;
        history.push(format!("{step}: {op:?} -> {want:?}"));
        assert_eq!(
            got,
            want,
            "LODE_SEED={seed}: step {step} {op:?}: lode (left) differs from Linux (right)\n\
             history:\n{}",
            history.join("\n")
        );
    }
    let (got, want) = (tree(&ours), tree(&theirs));
    println!(
        "  {failed} of {OPS} calls failed (on both); {} entries at the end",
        want.len()
    );
    if got != want {
        let mut diff = Vec::new();
        for k in got
            .keys()
            .chain(want.keys())
            .collect::<std::collections::BTreeSet<_>>()
        {
            if got.get(k) != want.get(k) {
                diff.push(format!(
                    "{k}: lode {:?} Linux {:?}",
                    got.get(k),
                    want.get(k)
                ));
            }
        }
        panic!(
            "LODE_SEED={seed}: trees differ after {OPS} ops:\n{}\nhistory:\n{}",
            diff.join("\n"),
            history.join("\n")
        );
    }
}

#[test]
fn random_posix_calls_match_a_local_file_system() {
    unsafe { libc::umask(0o022) };
    let c = cluster(2);
    let m = c.mount();
    let local = tempfile::tempdir().unwrap();
    let replay = std::env::var("LODE_SEED")
        .ok()
        .map(|s| s.parse::<u64>().expect("LODE_SEED"));
    let base = replay.unwrap_or_else(|| rand::rng().random());
    let n = if replay.is_some() { 1 } else { SEQUENCES };
    for seq in 0..n {
        run_sequence(m.path(), local.path(), seq, base.wrapping_add(seq));
    }
}
