//! `lode bench`: mdtest-, IOR- and tree-walk-style benchmarks that run against any
//! directory (plain POSIX calls) or natively through the lode client library, with
//! mdtest-like tables, JSON results, comparisons and SVG plots.

pub mod io;
pub mod md;
pub mod progress;
pub mod report;
pub mod stats;
pub mod target;
pub mod walk;

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C handler: the running phase stops and the benchmark cleans up.
pub fn install_ctrlc() {
    let _ = ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst));
}

/// True once Ctrl-C was pressed.
pub fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}
