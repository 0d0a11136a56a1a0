//! `lode get-param` / `set-param`: talk to the admin sockets of the servers running on
//! this machine (one socket per target under the run directory).

use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

/// Where servers put their admin sockets: `$LODE_RUN_DIR`, else `/run/lode`.
pub fn run_dir() -> PathBuf {
    std::env::var_os("LODE_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/lode"))
}

/// Arguments of get-param.
#[derive(Args)]
pub struct GetArgs {
    /// Print values only.
    #[arg(short = 'n', long = "no-name")]
    no_name: bool,
    /// Print names only.
    #[arg(short = 'N', long = "only-name")]
    only_name: bool,
    /// Parameter names, `*` and `?` allowed (e.g. `mdt.*.stats`).
    #[arg(required = true)]
    names: Vec<String>,
}

/// Arguments of list-param.
#[derive(Args)]
pub struct ListArgs {
    /// Also say whether each can be set, its range, and what it is.
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
    /// Parameter names, `*` and `?` allowed (default: every one).
    names: Vec<String>,
}

/// Arguments of set-param.
#[derive(Args)]
pub struct SetArgs {
    /// Do not echo what was set.
    #[arg(short = 'n', long = "no-name")]
    no_name: bool,
    /// Permanent: store on the MGS (run where the MGS runs); every target and client
    /// applies it at start, and the processes on this machine at once.
    #[arg(short = 'P')]
    permanent: bool,
    /// NAME=VALUE pairs.
    #[arg(required = true)]
    pairs: Vec<String>,
}

/// Where to look for admin sockets: `$LODE_RUN_DIR` if set; else `/run/lode` and the
/// run directory of a `lode up` in the current directory (`./lode-data/run`), so
/// `lode up` followed by `lode get-param` works with no setup.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![run_dir()];
    if std::env::var_os("LODE_RUN_DIR").is_none() {
        dirs.push(PathBuf::from(crate::up::DEFAULT_DIR).join("run"));
    }
    dirs
}

fn sockets() -> Result<Vec<PathBuf>> {
    let dirs = search_dirs();
    let mut v: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .collect();
    v.sort();
    if v.is_empty() {
        let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        bail!(
            "no lode servers running here (no admin sockets in {}; set LODE_RUN_DIR to DIR/run for a `lode up --dir DIR`)",
            shown.join(" or ")
        );
    }
    Ok(v)
}

fn ask(line: &str) -> Result<String> {
    let mut out = String::new();
    for s in sockets()? {
        // A stale socket of a stopped server is skipped.
        if let Ok(ans) = lode_rpc::admin::admin_request(&s, line) {
            out.push_str(&ans);
        }
    }
    Ok(out)
}

/// Runs get-param.
pub fn get(a: GetArgs) -> Result<()> {
    let mut failed = false;
    for pat in &a.names {
        let verb = if a.only_name {
            "list"
        } else if a.no_name {
            "value"
        } else {
            "get"
        };
        let ans = ask(&format!("{verb} {pat}"))?;
        if ans.is_empty() {
            eprintln!("error: get_param: param_path '{pat}': No such file or directory");
            failed = true;
            continue;
        }
        print!("{ans}");
    }
    if failed {
        std::process::exit(2);
    }
    Ok(())
}

/// Runs list-param.
pub fn list(a: ListArgs) -> Result<()> {
    let pats = if a.names.is_empty() {
        vec!["*".to_string()]
    } else {
        a.names
    };
    let verb = if a.verbose { "help" } else { "list" };
    let mut failed = false;
    for pat in &pats {
        let ans = ask(&format!("{verb} {pat}"))?;
        if ans.is_empty() {
            eprintln!("error: list_param: param_path '{pat}': No such file or directory");
            failed = true;
        }
        print!("{ans}");
    }
    if failed {
        std::process::exit(2);
    }
    Ok(())
}

/// Runs set-param.
pub fn set(a: SetArgs) -> Result<()> {
    let mut failed = false;
    for pair in &a.pairs {
        if !pair.contains('=') {
            bail!("set-param: {pair:?}: expected NAME=VALUE");
        }
        if a.permanent {
            // What runs here applies it now (the rest at their next start), and so
            // checks it: a value a running target refuses is not stored, where it
            // would fail every later start.
            let now = ask(&format!("set {pair}"))?;
            let refused: Vec<&str> = now.lines().filter(|l| l.starts_with("error:")).collect();
            if !refused.is_empty() {
                for l in refused {
                    eprintln!("{l}");
                }
                failed = true;
                continue;
            }
            let stored = ask(&format!("setp {pair}"))?;
            if stored.is_empty() {
                bail!("set-param -P: no MGS running here (run it where the MGS runs)");
            }
            if let Some(l) = stored.lines().find(|l| l.starts_with("error:")) {
                eprintln!("{l}");
                failed = true;
                continue;
            }
            if !a.no_name {
                print!("{stored}");
            }
            continue;
        }
        let ans = ask(&format!("set {pair}"))?;
        if ans.is_empty() {
            let name = pair.split('=').next().unwrap_or(pair);
            eprintln!("error: set_param: param_path '{name}': No such file or directory");
            failed = true;
        }
        for l in ans.lines() {
            if l.starts_with("error:") {
                eprintln!("{l}");
                failed = true;
            } else if !a.no_name {
                println!("{l}");
            }
        }
    }
    if failed {
        std::process::exit(2);
    }
    Ok(())
}
