//! `lode bench`: argument parsing and printing; the engine is `lode-bench`.

use anyhow::{anyhow, bail, Result};
use clap::{Args, Subcommand};
use lode_bench::report::{compare, plot, Report};
use lode_bench::target::Target;
use std::path::PathBuf;

/// Benchmarks.
#[derive(Subcommand)]
pub enum BenchCmd {
    /// Metadata phases, like mdtest: tree, directory and file create/stat/read/remove.
    Md(MdArgs),
    /// Tree walking: ls -l of a large directory, du, find -name, parallel stat walk.
    Walk(WalkArgs),
    /// Sequential I/O, like IOR: file per client or one shared file.
    Io(IoArgs),
    /// Phase-by-phase ratios of result files (the first is the base).
    Compare(CompareArgs),
    /// Internal: one client process of a multi-client md run.
    #[command(hide = true)]
    MdWorker(WorkerArgs),
}

/// Where to run and how to report.
#[derive(Args, Clone)]
pub struct Common {
    /// Run with POSIX calls under this directory (any file system).
    #[arg(long, conflicts_with = "native")]
    path: Option<PathBuf>,
    /// Run through the lode client library: MGS_HOST:PORT:/FSNAME (a keyed file system:
    /// its key file in LODE_KEY_FILE).
    #[arg(long)]
    native: Option<String>,
    /// Iterations.
    #[arg(long, default_value_t = 1)]
    iterations: usize,
    /// Write every figure and the environment to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw the phases as an SVG bar chart.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Keep what the benchmark created.
    #[arg(long)]
    keep: bool,
}

impl Common {
    fn target(&self) -> Result<Target> {
        match (&self.path, &self.native) {
            (Some(p), None) => Ok(Target::Path(p.clone())),
            (None, Some(n)) => Ok(Target::Native(n.clone())),
            _ => bail!("give --path DIR or --native MGS_HOST:PORT:/FSNAME"),
        }
    }
}

/// Arguments of `lode bench md`.
#[derive(Args)]
pub struct MdArgs {
    #[command(flatten)]
    common: Common,
    /// Items per client.
    #[arg(long, default_value_t = 1000)]
    items: usize,
    /// Clients, each a separate process with its own lode client.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Threads per client, sharing its client (their RPCs overlap).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Each client in its own directory (default: one shared directory).
    #[arg(long)]
    unique_dir: bool,
    /// Bytes written into each file at creation.
    #[arg(long, default_value_t = 0)]
    write_bytes: usize,
    /// Bytes read from each file in the read phase.
    #[arg(long, default_value_t = 0)]
    read_bytes: usize,
    /// Depth of the directory tree items are spread over.
    #[arg(long, default_value_t = 0)]
    depth: usize,
    /// Branching factor of the tree.
    #[arg(long, default_value_t = 1)]
    branch: usize,
    /// Native client: emulated one-way network latency before each request (µs), as
    /// `*.net_delay_us` (for a mount: `lode set-param mdc.*.net_delay_us=N`).
    #[arg(long, default_value_t = 0)]
    net_delay_us: u64,
    /// Native client: `mdc.*.max_mod_rpcs_in_flight` (default 7).
    #[arg(long)]
    max_mod_rpcs_in_flight: Option<u16>,
}

/// Arguments of `lode bench walk`.
#[derive(Args)]
pub struct WalkArgs {
    #[command(flatten)]
    common: Common,
    /// Directories in the tree.
    #[arg(long, default_value_t = 10)]
    dirs: usize,
    /// Files per directory.
    #[arg(long, default_value_t = 1000)]
    files: usize,
    /// Parallel walkers for the stat walk.
    #[arg(long, default_value_t = 4)]
    walkers: usize,
    /// Drop caches before each phase (root).
    #[arg(long)]
    cold: bool,
    /// Run only these phases, comma-separated: ls, du, find, stat (default: all).
    #[arg(long, value_delimiter = ',')]
    phases: Vec<String>,
}

/// Arguments of `lode bench io`.
#[derive(Args)]
pub struct IoArgs {
    #[command(flatten)]
    common: Common,
    /// Clients (each with its own connection).
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Bytes per client (k/M/G suffixes).
    #[arg(long, default_value = "256M")]
    block: String,
    /// Bytes per call.
    #[arg(long, default_value = "1M")]
    transfer: String,
    /// One shared file instead of a file per client.
    #[arg(long)]
    shared: bool,
    /// fsync at the end of the write phase.
    #[arg(long)]
    fsync: bool,
    /// Calls in a random order within each block (IOR's -z).
    #[arg(long)]
    random: bool,
}

/// Arguments of `lode bench compare`.
#[derive(Args)]
pub struct CompareArgs {
    /// JSON result files; ratios are to the first.
    #[arg(required = true, num_args = 2..)]
    files: Vec<PathBuf>,
    /// Also draw them side by side as an SVG bar chart.
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// Arguments of the hidden worker.
#[derive(Args)]
pub struct WorkerArgs {
    #[arg(long)]
    client: usize,
    #[arg(long)]
    options: String,
}

fn finish(r: &Report, c: &Common) -> Result<()> {
    print!("{}", r.table());
    if let Some(j) = &c.json {
        r.write_json(j)?;
    }
    if let Some(p) = &c.plot {
        plot(&[(r.env.target.clone(), r.clone())], p)?;
    }
    Ok(())
}

/// Runs a benchmark.
pub fn run(cmd: BenchCmd) -> Result<()> {
    lode_bench::install_ctrlc();
    match cmd {
        BenchCmd::Md(a) => {
            let c = &a.common;
            c.target()?;
            // Worker processes inherit these; the native target reads them at connect.
            std::env::set_var(
                lode_bench::target::NET_DELAY_ENV,
                a.net_delay_us.to_string(),
            );
            if let Some(m) = a.max_mod_rpcs_in_flight {
                std::env::set_var(lode_bench::target::MAX_MOD_ENV, m.to_string());
            }
            let o = lode_bench::md::MdOptions {
                path: c.path.as_ref().map(|p| p.display().to_string()),
                native: c.native.clone(),
                items: a.items,
                clients: a.clients,
                threads: a.threads,
                unique_dir: a.unique_dir,
                write_bytes: a.write_bytes,
                read_bytes: a.read_bytes,
                depth: a.depth,
                branch: a.branch,
                iterations: c.iterations,
                keep: c.keep,
                top: String::new(),
            };
            let r = lode_bench::md::run(&o).map_err(|e| anyhow!("bench md: {e:#}"))?;
            finish(&r, c)
        }
        BenchCmd::MdWorker(w) => lode_bench::md::worker(w.client, &w.options),
        BenchCmd::Walk(a) => {
            let c = &a.common;
            let o = lode_bench::walk::WalkOptions {
                target: c.target()?,
                dirs: a.dirs,
                files: a.files,
                walkers: a.walkers,
                cold: a.cold,
                iterations: c.iterations,
                keep: c.keep,
                phases: a
                    .phases
                    .iter()
                    .map(|p| {
                        lode_bench::walk::PHASE_KEYS
                            .iter()
                            .position(|k| k == p)
                            .ok_or_else(|| {
                                let keys = lode_bench::walk::PHASE_KEYS.join(", ");
                                anyhow!("bench walk: no phase {p:?} ({keys})")
                            })
                    })
                    .collect::<Result<_>>()?,
            };
            let r = lode_bench::walk::run(&o).map_err(|e| anyhow!("bench walk: {e:#}"))?;
            finish(&r, c)
        }
        BenchCmd::Io(a) => {
            let c = &a.common;
            let size = |s: &str| crate::lfs::parse_size(s).map_err(|e| anyhow!("bench io: {e}"));
            let o = lode_bench::io::IoOptions {
                target: c.target()?,
                clients: a.clients,
                block: size(&a.block)?,
                transfer: size(&a.transfer)? as usize,
                shared: a.shared,
                fsync: a.fsync,
                random: a.random,
                iterations: c.iterations,
                keep: c.keep,
            };
            let r = lode_bench::io::run(&o).map_err(|e| anyhow!("bench io: {e:#}"))?;
            finish(&r, c)
        }
        BenchCmd::Compare(a) => {
            let reports: Vec<(String, Report)> = a
                .files
                .iter()
                .map(|f| Report::read_json(f).map(|r| (f.display().to_string(), r)))
                .collect::<Result<_>>()
                .map_err(|e| anyhow!("bench compare: {e:#}"))?;
            print!("{}", compare(&reports)?);
            if let Some(p) = &a.plot {
                plot(&reports, p)?;
            }
            Ok(())
        }
    }
}
