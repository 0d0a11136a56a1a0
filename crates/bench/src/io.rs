//! The I/O benchmark, modelled on IOR: write then read, sequential or in a random order
//! of `--transfer`-sized calls, file per client or one shared file (each client its
//! own block range).

use crate::report::{Env, PhaseReport, Report};
use crate::stats::Latencies;
use crate::target::{self, Target};
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Options of `lode bench io`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IoOptions {
    /// Target.
    pub target: Target,
    /// Clients (each with its own connection; threads of this process).
    pub clients: usize,
    /// Bytes each client writes and reads.
    pub block: u64,
    /// Bytes per write/read call.
    pub transfer: usize,
    /// One shared file instead of a file per client.
    pub shared: bool,
    /// fsync before the write phase ends.
    pub fsync: bool,
    /// Calls in a random order (IOR's `-z`) instead of sequential.
    #[serde(default)]
    pub random: bool,
    /// Iterations.
    pub iterations: usize,
    /// Keep the files.
    pub keep: bool,
}

/// Runs write and read phases and reports MB/s.
pub fn run(o: &IoOptions) -> Result<Report> {
    if o.clients == 0 || o.block == 0 || o.transfer == 0 || o.iterations == 0 {
        bail!("--clients, --block, --transfer and --iterations must be at least 1");
    }
    let top = format!("lode-bench-io.{}", std::process::id());
    target::open(&o.target, &top, true)?;
    let r = phases(o, &top);
    if !o.keep {
        if let Err(e) = target::remove_tree(&o.target, &top) {
            eprintln!("lode: bench: cleanup: {e:#}");
        }
    }
    let phases = r?;
    Ok(Report {
        kind: "io".into(),
        env: Env::here(o.target.describe()),
        options: serde_json::to_value(o)?,
        phases,
    })
}

fn phases(o: &IoOptions, top: &str) -> Result<Vec<PhaseReport>> {
    let conns: Vec<_> = (0..o.clients)
        .map(|_| target::open(&o.target, top, false))
        .collect::<Result<_>>()?;
    let mut rates = [Vec::new(), Vec::new()];
    let mut lats = [Latencies::default(), Latencies::default()];
    let progress = crate::progress::Progress::new();
    for it in 0..o.iterations {
        for (pi, write) in [true, false].into_iter().enumerate() {
            progress.show(&format!(
                "{} (iteration {}/{})",
                if write { "write" } else { "read" },
                it + 1,
                o.iterations
            ));
            let start = Instant::now();
            let results: Vec<Result<(u64, u64)>> = std::thread::scope(|s| {
                let hs: Vec<_> = conns
                    .iter()
                    .enumerate()
                    .map(|(c, ops)| {
                        s.spawn(move || {
                            let (file, off) = if o.shared {
                                (format!("shared.{it}"), c as u64 * o.block)
                            } else {
                                (format!("file.{it}.{c}"), 0)
                            };
                            let t = Instant::now();
                            let n = if write {
                                ops.write_range(
                                    &file, off, o.block, o.transfer, o.fsync, o.random,
                                )?;
                                o.block
                            } else {
                                ops.read_range(&file, off, o.block, o.transfer, o.random)?
                            };
                            Ok((n, t.elapsed().as_nanos() as u64))
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| bail!("an I/O client panicked")))
                    .collect()
            });
            let secs = start.elapsed().as_secs_f64().max(1e-9);
            let mut bytes = 0;
            for r in results {
                let (n, ns) = r?;
                bytes += n;
                lats[pi].0.push(ns);
            }
            if crate::stopped() {
                bail!("interrupted");
            }
            rates[pi].push(bytes as f64 / secs / 1e6);
        }
    }
    progress.clear();
    let n = (o.iterations * o.clients) as u64;
    Ok(vec![
        PhaseReport::new("Write", "MB/s", rates[0].clone(), n, &mut lats[0]),
        PhaseReport::new("Read", "MB/s", rates[1].clone(), n, &mut lats[1]),
    ])
}
