//! `lode bench`: argument parsing and the mdtest-like report.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use lode_bench::md::{MdOptions, Target};
use std::path::PathBuf;

/// Benchmarks.
#[derive(Subcommand)]
pub enum BenchCmd {
    /// Metadata phases: file create, stat, remove (each thread in its own directory).
    Md(MdArgs),
}

/// Arguments of `lode bench md`.
#[derive(Args)]
pub struct MdArgs {
    /// Run with POSIX calls under this directory (any file system).
    #[arg(long, conflicts_with = "native")]
    path: Option<PathBuf>,
    /// Run through the lode client library: MGS_HOST:PORT:/FSNAME.
    #[arg(long)]
    native: Option<String>,
    /// Items per thread.
    #[arg(long, default_value_t = 10_000)]
    items: usize,
    /// Threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// Runs a benchmark and prints its table.
pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Md(a) => {
            let target = match (a.path, a.native) {
                (Some(p), None) => Target::Path(p),
                (None, Some(n)) => Target::Native(n),
                _ => bail!("bench md: give --path DIR or --native MGS:/FSNAME"),
            };
            let res = lode_bench::md::run(&MdOptions {
                target,
                items: a.items,
                threads: a.threads,
            })?;
            println!(
                "SUMMARY rate: (of {} threads, {} items each)",
                a.threads, a.items
            );
            println!("   Operation                      ops/s      p50 us      p99 us      max us");
            println!("   ---------                      -----      ------      ------      ------");
            for r in res {
                println!(
                    "   {:<22} {:>13.1} {:>11.1} {:>11.1} {:>11.1}",
                    r.name, r.rate, r.p50_us, r.p99_us, r.max_us
                );
            }
            Ok(())
        }
    }
}
