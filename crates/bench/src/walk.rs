//! The tree-walk benchmark: `ls -l` of one large directory, a recursive `du`, a
//! `find -name`, and a parallel stat walk, over a tree of `dirs × files`.

use crate::report::{Env, PhaseReport, Report};
use crate::stats::Latencies;
use crate::target::{self, Ops, Target};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Options of `lode bench walk`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WalkOptions {
    /// Target.
    pub target: Target,
    /// Directories in the tree.
    pub dirs: usize,
    /// Files per directory (the first directory is the "large directory").
    pub files: usize,
    /// Parallel walkers for the stat walk.
    pub walkers: usize,
    /// Drop caches before each phase (needs root; `drop_caches`).
    pub cold: bool,
    /// Iterations.
    pub iterations: usize,
    /// Keep the tree afterwards (and reuse one left by an earlier `--keep` run).
    pub keep: bool,
    /// The phases to run, by index into [`PHASES`] (empty: all), so that one can be
    /// timed or profiled alone.
    pub phases: Vec<usize>,
}

/// The phases, in the order they run.
pub const PHASES: [&str; 4] = ["ls -l (large dir)", "du", "find -name", "stat walk"];

/// The short names `--phases` takes, in the order of [`PHASES`].
pub const PHASE_KEYS: [&str; 4] = ["ls", "du", "find", "stat"];

const TOP: &str = "lode-bench-walk";

fn drop_caches() -> Result<()> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .context("--cold: cannot write /proc/sys/vm/drop_caches (root needed)")
}

fn build(ops: &dyn Ops, o: &WalkOptions) -> Result<()> {
    let progress = crate::progress::Progress::new();
    for d in 0..o.dirs {
        ops.mkdir(&format!("d{d}"))?;
        for f in 0..o.files {
            if crate::stopped() {
                bail!("interrupted");
            }
            if f % 1000 == 0 {
                progress.show(&format!(
                    "building tree: dir {}/{}, file {f}",
                    d + 1,
                    o.dirs
                ));
            }
            ops.create(&format!("d{d}/f{f}"), 0)?;
        }
    }
    progress.clear();
    Ok(())
}

/// Walks below `dir`, calling `f` for each (path, is_dir); returns entries seen.
fn walk(ops: &dyn Ops, dir: &str, f: &mut dyn FnMut(&str, bool) -> Result<()>) -> Result<u64> {
    let mut n = 0;
    for (name, is_dir) in ops.list(dir)? {
        let p = if dir.is_empty() {
            name
        } else {
            format!("{dir}/{name}")
        };
        f(&p, is_dir)?;
        n += 1;
        if is_dir {
            n += walk(ops, &p, f)?;
        }
    }
    Ok(n)
}

/// Builds (or reuses) the tree and times the walks.
pub fn run(o: &WalkOptions) -> Result<Report> {
    if o.dirs == 0 || o.files == 0 || o.walkers == 0 || o.iterations == 0 {
        bail!("--dirs, --files, --walkers and --iterations must be at least 1");
    }
    let reuse = target::open(&o.target, TOP, false)
        .ok()
        .filter(|ops| ops.list("").map(|l| l.len() == o.dirs).unwrap_or(false));
    let ops: Arc<dyn Ops> = match reuse {
        Some(ops) => ops,
        None => {
            let _ = target::remove_tree(&o.target, TOP);
            let ops = target::open(&o.target, TOP, true)?;
            if let Err(e) = build(&*ops, o) {
                let _ = target::remove_tree(&o.target, TOP);
                return Err(e.context("building the tree"));
            }
            ops
        }
    };
    let r = phases(o, &ops);
    if !o.keep {
        if let Err(e) = target::remove_tree(&o.target, TOP) {
            eprintln!("lode: bench: cleanup: {e:#}");
        }
    }
    let phases = r?;
    Ok(Report {
        kind: "walk".into(),
        env: Env::here(o.target.describe()),
        options: serde_json::to_value(o)?,
        phases,
    })
}

fn phases(o: &WalkOptions, warm: &Arc<dyn Ops>) -> Result<Vec<PhaseReport>> {
    let mut ops = warm.clone();
    let run = |pi: usize| o.phases.is_empty() || o.phases.contains(&pi);
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); PHASES.len()];
    let mut lats: Vec<Latencies> = vec![Latencies::default(); PHASES.len()];
    let mut counts = [0u64; PHASES.len()];
    let progress = crate::progress::Progress::new();
    for it in 0..o.iterations {
        for (pi, name) in PHASES.iter().enumerate().filter(|(pi, _)| run(*pi)) {
            progress.show(&format!("{name} (iteration {}/{})", it + 1, o.iterations));
            if o.cold {
                drop_caches()?;
                if matches!(o.target, Target::Native(_)) {
                    // A new client: nothing cached on the client side either.
                    ops = target::open(&o.target, TOP, false)?;
                }
            }
            let t = Instant::now();
            let n: u64 = match pi {
                0 => {
                    let l = ops.list("d0")?;
                    for (name, _) in &l {
                        ops.stat(&format!("d0/{name}"))?;
                    }
                    l.len() as u64
                }
                1 => {
                    let mut total = 0u64;
                    walk(&*ops, "", &mut |p, _| {
                        total += ops.stat(p)?;
                        Ok(())
                    })?
                }
                2 => {
                    let mut hits = 0u64;
                    let n = walk(&*ops, "", &mut |p, _| {
                        if p.ends_with("/f7") {
                            hits += 1;
                        }
                        Ok(())
                    })?;
                    if hits != o.dirs as u64 {
                        bail!("find -name: found {hits} of {} files", o.dirs);
                    }
                    n
                }
                _ => stat_walk(&ops, o.dirs, o.walkers)?,
            };
            let ns = t.elapsed().as_nanos() as u64;
            lats[pi].0.push(ns);
            counts[pi] += n;
            rates[pi].push(n as f64 / (ns as f64 / 1e9).max(1e-9));
        }
    }
    progress.clear();
    Ok(PHASES
        .iter()
        .enumerate()
        .filter(|(pi, _)| run(*pi))
        .map(|(i, n)| PhaseReport::new(n, "entries/s", rates[i].clone(), counts[i], &mut lats[i]))
        .collect())
}

/// Directories handed out to `walkers` threads; each lists and stats everything in it.
fn stat_walk(ops: &Arc<dyn Ops>, dirs: usize, walkers: usize) -> Result<u64> {
    let next = AtomicUsize::new(0);
    let total = AtomicUsize::new(0);
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..walkers)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let d = next.fetch_add(1, Ordering::Relaxed);
                        if d >= dirs || crate::stopped() {
                            return Ok(());
                        }
                        let dir = format!("d{d}");
                        ops.stat(&dir)?;
                        for (name, _) in ops.list(&dir)? {
                            ops.stat(&format!("{dir}/{name}"))?;
                            total.fetch_add(1, Ordering::Relaxed);
                        }
                        total.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap_or_else(|_| bail!("a walker panicked"))?;
        }
        Ok(())
    })?;
    Ok(total.load(Ordering::Relaxed) as u64)
}
