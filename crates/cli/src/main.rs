//! The `lode` command: argument parsing and output only; the work is in the crates.

mod bench;
mod find;
mod lfs;
mod lr_reader;
mod mount;
mod params;
mod scan;
mod server;
mod up;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use lode_base::config::{check_fsname, Role, TargetConfig, CONFIG_FILE, FORMAT_VERSION};
use std::path::PathBuf;

/// The allocator of every lode process (see ARCHITECTURE.md, "Memory").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// lode: a user-space parallel file system with Lustre's metadata model.
#[derive(Parser)]
#[command(name = "lode", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Format a target directory (like mkfs.lustre).
    Mkfs(MkfsArgs),
    /// Run the management service on a formatted MGS directory.
    Mgs(server::ServerArgs),
    /// Run a metadata server on a formatted MDT directory.
    Mds(server::ServerArgs),
    /// Run an object storage server on a formatted OST directory.
    Oss(server::ServerArgs),
    /// Read parameters of the servers on this machine (like lctl get_param).
    GetParam(params::GetArgs),
    /// List the parameters of the servers and mounts on this machine (like lctl
    /// list_param; `-v` adds range and meaning).
    ListParam(params::ListArgs),
    /// Set parameters of the servers on this machine (like lctl set_param).
    SetParam(params::SetArgs),
    /// Print an MDT's server data, clients (-c) and reply records (-r), like Lustre's
    /// lr_reader; works on a stopped MDT and read-only beside a running one.
    LrReader(lr_reader::LrArgs),
    /// Format (once), start and mount a local file system: MGS, MDT0, OST0, OST1.
    Up(up::UpArgs),
    /// Unmount and stop what `lode up` started.
    Down(up::DirArgs),
    /// Show the targets `lode up` started: address, state, usage.
    Status(up::DirArgs),
    /// Set the layout of a new file or the default layout of a directory (lfs setstripe).
    Setstripe(lfs::SetstripeArgs),
    /// Move files' data into a new layout, online (lfs migrate).
    Migrate(lfs::MigrateArgs),
    /// Show layouts (lfs getstripe).
    Getstripe(lfs::GetstripeArgs),
    /// Find files by layout, name, type, size and age (lfs find).
    Find(find::FindArgs),
    /// Space and inodes per target (lfs df).
    Df(lfs::DfArgs),
    /// Print the FID of files (lfs path2fid).
    Path2fid(lfs::Path2fidArgs),
    /// Print the paths of FIDs (lfs fid2path).
    Fid2path(lfs::Fid2pathArgs),
    /// Scan a tree, reading only the directories changed since the last scan, and
    /// print the entries created (+) and removed (-) since.
    Scan(scan::ScanArgs),
    /// Mount a lode file system with FUSE.
    Mount(mount::MountArgs),
    /// Unmount a lode mount.
    Umount(mount::UmountArgs),
    /// Make everything written through lode mounts durable on every MDT and OST, and
    /// return only then (what sync(1) cannot do on a FUSE mount).
    Sync(mount::SyncArgs),
    /// Benchmarks (mdtest-like metadata phases).
    #[command(subcommand)]
    Bench(bench::BenchCmd),
}

#[derive(Args)]
struct MkfsArgs {
    /// Format a management target.
    #[arg(long, group = "role")]
    mgs: bool,
    /// Format a metadata target.
    #[arg(long, group = "role")]
    mdt: bool,
    /// Format an object storage target.
    #[arg(long, group = "role")]
    ost: bool,
    /// File system name (1-8 letters, digits or '_').
    #[arg(long)]
    fsname: String,
    /// Target index.
    #[arg(long, default_value_t = 0)]
    index: u32,
    /// MGS address (HOST:PORT) for MDTs and OSTs.
    #[arg(long, default_value = "127.0.0.1:9880")]
    mgsnode: String,
    /// File holding the shared key every target and client of this file system uses.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Directory to format (created if missing; must be empty).
    dir: PathBuf,
}

/// The file `mkfs` keeps in a target's directory while it formats it.
const FORMATTING: &str = "FORMATTING";

/// Removes everything in `dir` (not `dir` itself), then syncs it.
fn clear_dir(dir: &std::path::Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            std::fs::remove_dir_all(e.path())?;
        } else {
            std::fs::remove_file(e.path())?;
        }
    }
    lode_base::config::sync_dir(dir)
}

fn mkfs(a: MkfsArgs) -> Result<()> {
    let role = match (a.mgs, a.mdt, a.ost) {
        (true, false, false) => Role::Mgs,
        (false, true, false) => Role::Mdt,
        (false, false, true) => Role::Ost,
        _ => bail!("mkfs: give exactly one of --mgs, --mdt, --ost"),
    };
    check_fsname(&a.fsname).map_err(|e| anyhow::anyhow!("mkfs: {e}"))?;
    if a.index > 0xffff {
        bail!("mkfs: index {} out of range (0..65535)", a.index);
    }
    if role != Role::Mgs && !a.mgsnode.contains(':') {
        bail!("mkfs: --mgsnode {:?} is not HOST:PORT", a.mgsnode);
    }
    let d = a.dir.display().to_string();
    if a.dir.exists() {
        if !a.dir.is_dir() {
            bail!("mkfs: {d}: not a directory");
        }
        if a.dir.join(CONFIG_FILE).exists() {
            bail!("mkfs: {d}: already formatted, refusing to format");
        }
        if a.dir.join(FORMATTING).exists() {
            // A format cut short (a crash, a power cut): everything here is its own.
            clear_dir(&a.dir)
                .with_context(|| format!("mkfs: {d}: clearing an unfinished format"))?;
            eprintln!("mkfs: {d}: an unfinished format's leftovers removed");
        }
        if std::fs::read_dir(&a.dir)
            .with_context(|| format!("mkfs: {d}"))?
            .next()
            .is_some()
        {
            bail!("mkfs: {d}: not empty, refusing to format");
        }
    }
    lode_base::config::create_dir_durable(&a.dir)
        .with_context(|| format!("mkfs: {d}: cannot create"))?;
    // Durable before anything else is made here, gone once the configuration is: a
    // format cut short is then told from a directory someone else filled.
    std::fs::File::create(a.dir.join(FORMATTING))
        .and_then(|f| f.sync_all())
        .and_then(|()| lode_base::config::sync_dir(&a.dir))
        .with_context(|| format!("mkfs: {d}"))?;
    let key_hex = match &a.key_file {
        Some(f) => {
            let k =
                lode_base::config::read_key_file(f).map_err(|e| anyhow::anyhow!("mkfs: {e}"))?;
            lode_base::config::to_hex(&k)
        }
        None => String::new(),
    };
    // A target's own secret, proving its registrations to the MGS.
    let secret_hex = match role {
        Role::Mgs => String::new(),
        Role::Mdt | Role::Ost => lode_base::config::to_hex(&lode_rpc::auth::nonce()),
    };
    let c = TargetConfig {
        format: FORMAT_VERSION,
        role,
        fsname: a.fsname,
        index: a.index,
        uuid: uuid::Uuid::new_v4().to_string(),
        mgsnode: if role == Role::Mgs {
            String::new()
        } else {
            a.mgsnode
        },
        key_hex,
        secret_hex,
    };
    if role == Role::Mdt {
        // The store is made now, before the configuration that says the target is
        // formatted: a server then never makes one, and refuses to start without it.
        lode_store::rocks::RocksEngine::open(&a.dir.join(lode_store::MDT_DB_DIR), 8)
            .map_err(|e| anyhow::anyhow!("mkfs: {d}: {e}"))?;
    }
    // 0600: it holds secrets.
    lode_base::config::write_secret(&a.dir.join(CONFIG_FILE), c.render().as_bytes())
        .with_context(|| format!("mkfs: {d}"))?;
    std::fs::remove_file(a.dir.join(FORMATTING))
        .and_then(|()| lode_base::config::sync_dir(&a.dir))
        .with_context(|| format!("mkfs: {d}"))?;
    println!("formatted {} as {} ({})", d, c.name(), c.uuid);
    Ok(())
}

/// `find`'s one-dash long options (`-type f`, `-name X`), as `lfs find` takes them,
/// spelt the way the parser wants (`--type f`).
fn find_style_args() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "find") {
        for a in args.iter_mut().skip(2) {
            if let Some(s) = a.to_str() {
                if matches!(s, "-type" | "-name" | "-size" | "-mtime" | "-print0") {
                    *a = format!("-{s}").into();
                }
            }
        }
    }
    args
}

fn main() {
    let cli = Cli::parse_from(find_style_args());
    let r = match cli.cmd {
        Cmd::Mkfs(a) => mkfs(a),
        Cmd::Mgs(a) => server::run(Role::Mgs, a),
        Cmd::Mds(a) => server::run(Role::Mdt, a),
        Cmd::Oss(a) => server::run(Role::Ost, a),
        Cmd::GetParam(a) => params::get(a),
        Cmd::LrReader(a) => lr_reader::run(a),
        Cmd::SetParam(a) => params::set(a),
        Cmd::ListParam(a) => params::list(a),
        Cmd::Bench(b) => bench::run(b),
        Cmd::Mount(a) => mount::run(a),
        Cmd::Up(a) => up::up(a),
        Cmd::Down(a) => up::down(a),
        Cmd::Status(a) => up::status(a),
        Cmd::Setstripe(a) => lfs::setstripe(a),
        Cmd::Migrate(a) => lfs::migrate(a),
        Cmd::Getstripe(a) => lfs::getstripe(a),
        Cmd::Find(a) => find::find(a),
        Cmd::Df(a) => lfs::df(a),
        Cmd::Path2fid(a) => lfs::path2fid(a),
        Cmd::Fid2path(a) => lfs::fid2path(a),
        Cmd::Umount(a) => mount::umount(a),
        Cmd::Sync(a) => mount::sync(a),
        Cmd::Scan(a) => scan::run(a),
    };
    if let Err(e) = r {
        eprintln!("lode: {e:#}");
        std::process::exit(1);
    }
}
