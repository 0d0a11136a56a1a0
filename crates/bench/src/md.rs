//! The metadata benchmark, modelled on mdtest: tree, directory and file phases, `T`
//! threads per client sharing one client, `P` clients as separate processes, every
//! phase timed from its first start to its last finish across all of them.

use crate::report::{Env, PhaseReport, Report};
use crate::stats::Latencies;
use crate::target::{self, Ops, Target};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Options of `lode bench md`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MdOptions {
    /// Directory (`--path`) or `MGS:PORT:/FS` (`--native`).
    pub path: Option<String>,
    /// Native target.
    pub native: Option<String>,
    /// Items per client.
    pub items: usize,
    /// Clients (separate processes).
    pub clients: usize,
    /// Threads per client.
    pub threads: usize,
    /// Each client in its own directory (else one shared directory).
    pub unique_dir: bool,
    /// Bytes written into each file at creation.
    pub write_bytes: usize,
    /// Bytes read from each file in the read phase.
    pub read_bytes: usize,
    /// Depth of the directory tree the items are spread over.
    pub depth: usize,
    /// Branching factor of that tree.
    pub branch: usize,
    /// Iterations.
    pub iterations: usize,
    /// Keep what was created.
    pub keep: bool,
    /// Name of the benchmark's top directory (set by the parent for workers).
    pub top: String,
}

impl MdOptions {
    /// The target.
    pub fn target(&self) -> Result<Target> {
        match (&self.path, &self.native) {
            (Some(p), None) => Ok(Target::Path(p.into())),
            (None, Some(n)) => Ok(Target::Native(n.clone())),
            _ => bail!("give --path DIR or --native MGS_HOST:PORT:/FSNAME"),
        }
    }
}

/// The phases, in the order mdtest runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Create the directory tree.
    TreeCreate,
    /// mkdir of the items.
    DirCreate,
    /// stat of those directories.
    DirStat,
    /// rmdir of them.
    DirRemove,
    /// Create the files (writing `write_bytes`).
    FileCreate,
    /// stat of the files.
    FileStat,
    /// chmod of the files (a SETATTR each).
    FileSetattr,
    /// Read `read_bytes` of each file.
    FileRead,
    /// unlink of the files.
    FileRemove,
    /// Remove the tree.
    TreeRemove,
}

impl Phase {
    /// mdtest's name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::TreeCreate => "Tree creation",
            Phase::DirCreate => "Directory creation",
            Phase::DirStat => "Directory stat",
            Phase::DirRemove => "Directory removal",
            Phase::FileCreate => "File creation",
            Phase::FileStat => "File stat",
            Phase::FileSetattr => "File setattr",
            Phase::FileRead => "File read",
            Phase::FileRemove => "File removal",
            Phase::TreeRemove => "Tree removal",
        }
    }

    const ALL: [Phase; 10] = [
        Phase::TreeCreate,
        Phase::DirCreate,
        Phase::DirStat,
        Phase::DirRemove,
        Phase::FileCreate,
        Phase::FileStat,
        Phase::FileSetattr,
        Phase::FileRead,
        Phase::FileRemove,
        Phase::TreeRemove,
    ];
}

/// What one client reports for one phase.
#[derive(Clone, Debug, Serialize, Deserialize, Default)]
pub struct Outcome {
    /// First operation start, ns since the epoch.
    pub start_ns: u64,
    /// Last operation end.
    pub end_ns: u64,
    /// Operations done.
    pub ops: u64,
    /// Latencies, ns.
    pub lat: Vec<u64>,
    /// Why the phase failed, if it did.
    pub error: Option<String>,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The base directory of client `c` in iteration `it`.
fn base(o: &MdOptions, it: usize, c: usize) -> String {
    if o.unique_dir {
        format!("it{it}/c{c}")
    } else {
        format!("it{it}/shared")
    }
}

/// Tree directories below `base` (parents first) and the leaves items go into.
fn tree(o: &MdOptions, base: &str) -> (Vec<String>, Vec<String>) {
    let mut all = Vec::new();
    let mut level = vec![base.to_string()];
    for _ in 0..o.depth {
        let mut next = Vec::new();
        for d in &level {
            for b in 0..o.branch.max(1) {
                let p = format!("{d}/t{b}");
                all.push(p.clone());
                next.push(p);
            }
        }
        level = next;
    }
    (all, level)
}

/// Runs one phase for one client with its threads.
pub fn run_client_phase(
    ops: &Arc<dyn Ops>,
    o: &MdOptions,
    c: usize,
    it: usize,
    phase: Phase,
) -> Outcome {
    let b = base(o, it, c);
    let (dirs, leaves) = tree(o, &b);
    let tree_owner = o.unique_dir || c == 0;
    // Tree phases: done by the tree's owner, single-threaded, parents first.
    if matches!(phase, Phase::TreeCreate | Phase::TreeRemove) {
        let mut out = Outcome {
            start_ns: now_ns(),
            ..Default::default()
        };
        if tree_owner {
            let list: Vec<String> = if phase == Phase::TreeCreate {
                let mut v = vec![b.clone()];
                v.extend(dirs.iter().cloned());
                v
            } else {
                let mut v = dirs.clone();
                v.reverse();
                v.push(b.clone());
                v
            };
            for d in list {
                if crate::stopped() {
                    out.error = Some("interrupted".into());
                    break;
                }
                let t = std::time::Instant::now();
                let r = if phase == Phase::TreeCreate {
                    ops.mkdir(&d)
                } else {
                    ops.rmdir(&d)
                };
                if let Err(e) = r {
                    out.error = Some(format!("{e:#}"));
                    break;
                }
                out.lat.push(t.elapsed().as_nanos() as u64);
                out.ops += 1;
            }
        }
        out.end_ns = now_ns();
        return out;
    }
    let threads = o.threads.max(1);
    let per = o.items / threads;
    let extra = o.items % threads;
    let barrier = Arc::new(Barrier::new(threads));
    let results = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        for t in 0..threads {
            let n = per + usize::from(t < extra);
            let barrier = barrier.clone();
            let results = results.clone();
            let leaves = &leaves;
            let ops = ops.clone();
            s.spawn(move || {
                let mut out = Outcome::default();
                barrier.wait();
                out.start_ns = now_ns();
                for k in 0..n {
                    if crate::stopped() {
                        out.error = Some("interrupted".into());
                        break;
                    }
                    let dir = &leaves[k % leaves.len()];
                    let kind =
                        if matches!(phase, Phase::DirCreate | Phase::DirStat | Phase::DirRemove) {
                            'd'
                        } else {
                            'f'
                        };
                    let p = format!("{dir}/{kind}.c{c}.t{t}.{k}");
                    let start = std::time::Instant::now();
                    let r = match phase {
                        Phase::DirCreate => ops.mkdir(&p),
                        Phase::DirStat | Phase::FileStat => ops.stat(&p).map(|_| ()),
                        Phase::DirRemove => ops.rmdir(&p),
                        Phase::FileCreate => ops.create(&p, o.write_bytes),
                        Phase::FileRead => ops.read(&p, o.read_bytes).map(|_| ()),
                        Phase::FileSetattr => ops.chmod(&p, 0o600),
                        Phase::FileRemove => ops.unlink(&p),
                        Phase::TreeCreate | Phase::TreeRemove => Ok(()),
                    };
                    if let Err(e) = r {
                        out.error = Some(format!("{e:#}"));
                        break;
                    }
                    out.lat.push(start.elapsed().as_nanos() as u64);
                    out.ops += 1;
                }
                out.end_ns = now_ns();
                if let Ok(mut r) = results.lock() {
                    r.push(out);
                }
            });
        }
    });
    let parts = results.lock().map(|r| r.clone()).unwrap_or_default();
    merge(parts)
}

fn merge(parts: Vec<Outcome>) -> Outcome {
    let mut out = Outcome {
        start_ns: u64::MAX,
        ..Default::default()
    };
    for p in parts {
        out.start_ns = out.start_ns.min(p.start_ns);
        out.end_ns = out.end_ns.max(p.end_ns);
        out.ops += p.ops;
        out.lat.extend(p.lat);
        if out.error.is_none() {
            out.error = p.error;
        }
    }
    if out.start_ns == u64::MAX {
        out.start_ns = out.end_ns;
    }
    out
}

/// A client process driven over its stdin/stdout.
struct Worker {
    child: Child,
    tx: ChildStdin,
    rx: BufReader<ChildStdout>,
}

fn spawn_workers(o: &MdOptions) -> Result<Vec<Worker>> {
    let exe = std::env::current_exe().context("cannot find the lode binary")?;
    let opts = serde_json::to_string(o)?;
    let mut v = Vec::new();
    for c in 0..o.clients {
        let mut child = Command::new(&exe)
            .args([
                "bench",
                "md-worker",
                "--client",
                &c.to_string(),
                "--options",
                &opts,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start a bench client process")?;
        let tx = child.stdin.take().context("no stdin")?;
        let rx = BufReader::new(child.stdout.take().context("no stdout")?);
        v.push(Worker { child, tx, rx });
    }
    for w in &mut v {
        let mut line = String::new();
        w.rx.read_line(&mut line)?;
        if line.trim() != "READY" {
            bail!("a bench client failed to start: {}", line.trim());
        }
    }
    Ok(v)
}

/// The worker side: connect, then run phases as the parent asks.
pub fn worker(client: usize, opts: &str) -> Result<()> {
    let o: MdOptions = serde_json::from_str(opts)?;
    let ops = target::open(&o.target()?, &o.top, false)?;
    let mut out = std::io::stdout();
    writeln!(out, "READY")?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let (phase, it): (Phase, usize) = serde_json::from_str(&line)?;
        let r = run_client_phase(&ops, &o, client, it, phase);
        writeln!(out, "{}", serde_json::to_string(&r)?)?;
        out.flush()?;
    }
    Ok(())
}

/// Runs the whole benchmark and returns its report. Removes what it created unless
/// `keep`, also after a failure or Ctrl-C.
pub fn run(o: &MdOptions) -> Result<Report> {
    if o.items == 0 || o.clients == 0 || o.threads == 0 || o.iterations == 0 {
        bail!("--items, --clients, --threads and --iterations must be at least 1");
    }
    if o.depth > 0 && o.branch == 0 {
        bail!("--branch must be at least 1 with --depth");
    }
    let t = o.target()?;
    let mut o = o.clone();
    o.top = format!(
        "lode-bench-md.{}.{}",
        std::process::id(),
        now_ns() % 1_000_000
    );
    let local = target::open(&t, &o.top, true)?;
    let result = run_phases(&o, &local);
    if !o.keep {
        if let Err(e) = target::remove_tree(&t, &o.top) {
            eprintln!("lode: bench: cleanup: {e:#}");
        }
    }
    let phases = result?;
    Ok(Report {
        kind: "md".into(),
        env: Env::here(t.describe()),
        options: serde_json::to_value(&o)?,
        phases,
    })
}

fn run_phases(o: &MdOptions, local: &Arc<dyn Ops>) -> Result<Vec<PhaseReport>> {
    let mut workers = if o.clients > 1 {
        spawn_workers(o)?
    } else {
        Vec::new()
    };
    let progress = crate::progress::Progress::new();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); Phase::ALL.len()];
    let mut lats: Vec<Latencies> = vec![Latencies::default(); Phase::ALL.len()];
    let mut opss = vec![0u64; Phase::ALL.len()];
    let phases = Phase::ALL;
    for it in 0..o.iterations {
        // The iteration's directory is made (and removed) outside the timed phases.
        local.mkdir(&format!("it{it}"))?;
        for (pi, phase) in phases.iter().enumerate() {
            progress.show(&format!(
                "{} (iteration {}/{})",
                phase.name(),
                it + 1,
                o.iterations
            ));
            let parts: Vec<Outcome> = if workers.is_empty() {
                vec![run_client_phase(local, o, 0, it, *phase)]
            } else {
                let msg = serde_json::to_string(&(phase, it))?;
                for w in &mut workers {
                    writeln!(w.tx, "{msg}")?;
                    w.tx.flush()?;
                }
                let mut v = Vec::new();
                for w in &mut workers {
                    let mut line = String::new();
                    w.rx.read_line(&mut line)?;
                    v.push(serde_json::from_str(&line).map_err(|e| anyhow!("bench client: {e}"))?);
                }
                v
            };
            let all = merge(parts);
            if let Some(e) = &all.error {
                progress.clear();
                for mut w in workers {
                    let _ = w.child.kill();
                    let _ = w.child.wait();
                }
                bail!(
                    "phase {:?} failed after {} operations: {e}",
                    phase.name(),
                    all.ops
                );
            }
            let secs = (all.end_ns.saturating_sub(all.start_ns)) as f64 / 1e9;
            rates[pi].push(if secs > 0.0 {
                all.ops as f64 / secs
            } else {
                0.0
            });
            opss[pi] += all.ops;
            lats[pi].0.extend(all.lat);
        }
        local.rmdir(&format!("it{it}"))?;
    }
    progress.clear();
    for mut w in workers {
        drop(w.tx);
        let _ = w.child.wait();
    }
    Ok(phases
        .iter()
        .enumerate()
        .map(|(i, p)| PhaseReport::new(p.name(), "ops/s", rates[i].clone(), opss[i], &mut lats[i]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_has_branch_to_the_depth_leaves() {
        let o = MdOptions {
            path: None,
            native: None,
            items: 1,
            clients: 1,
            threads: 1,
            unique_dir: true,
            write_bytes: 0,
            read_bytes: 0,
            depth: 2,
            branch: 3,
            iterations: 1,
            keep: false,
            top: String::new(),
        };
        let (all, leaves) = tree(&o, "b");
        assert_eq!(all.len(), 3 + 9);
        assert_eq!(leaves.len(), 9);
        assert!(leaves.contains(&"b/t2/t1".to_string()));
    }
}
