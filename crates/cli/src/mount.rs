//! `lode mount` and `lode umount`.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use lode_base::attr::AtimeMode;
use lode_client::{Client, ClientConfig};
use lode_fuse::kernel::MountOption;
use std::io::{BufRead, Write as _};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// Environment variable telling a foreground mount to report readiness on stdout.
const NOTIFY_ENV: &str = "LODE_MOUNT_NOTIFY";

/// Arguments of `lode mount`.
#[derive(Args, Clone)]
pub struct MountArgs {
    /// Mount options, mount(8) style: attr_timeout=SECS, entry_timeout=SECS, allow_other,
    /// writeback, threads=N, timeout=SECS, key_file=PATH, nolocks (no metadata locks:
    /// nothing cached beyond the timeouts), flock (the default: fcntl and flock(2)
    /// locks hold across the cluster) or localflock (they hold on this machine only),
    /// readdirplus=auto|always (attributes with a directory's first page only, the
    /// default, or with every page), seclabel (store SELinux labels even where this
    /// machine does not run SELinux; see [`lode_fuse::MountOptions::seclabel`]),
    /// io_uring (the default: the kernel hands requests over io_uring, with one queue
    /// per CPU, where it can; see [`URING_PARAM`]) or noio_uring (over `/dev/fuse`),
    /// acl (the default: POSIX ACLs, as on Lustre) or noacl, relatime (the default),
    /// strictatime or noatime (when reads move access times), nodiratime.
    #[arg(short = 'o')]
    pub options: Option<String>,
    /// Stay in the foreground instead of daemonizing once mounted.
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// MGS_HOST:PORT:/FSNAME
    pub source: String,
    /// Where to mount (an existing empty directory).
    pub mountpoint: PathBuf,
}

struct Opts {
    attr_timeout: Duration,
    entry_timeout: Duration,
    allow_other: bool,
    writeback: bool,
    threads: usize,
    timeout: Duration,
    key: Vec<u8>,
    locks: bool,
    /// fcntl and flock(2) locks across the cluster (`flock`), or this machine's only
    /// (`localflock`).
    cluster_locks: bool,
    /// Attributes with every directory page (`readdirplus=always`), or with the first
    /// one only (`auto`).
    readdirplus_always: bool,
    /// `security.selinux` stored although SELinux is off here (`seclabel`).
    seclabel: bool,
    /// Requests over io_uring where the kernel can (`io_uring`, the default), or over
    /// `/dev/fuse` only (`noio_uring`).
    io_uring: bool,
    /// POSIX ACLs (`acl`, the default) or none (`noacl`).
    acl: bool,
    /// Birth times (`btime`, the default) or none (`nobtime`).
    btime: bool,
    /// When reads move access times (`noatime`, `relatime`: the default,
    /// `strictatime`).
    atime: AtimeMode,
    /// Directories' too (`nodiratime`: no).
    diratime: bool,
    /// mount(8)'s generic options given (suid, nodev, noexec, ro, ...), for the kernel.
    kernel: Vec<MountOption>,
}

fn secs(v: &str, what: &str) -> Result<Duration> {
    let f: f64 = v
        .parse()
        .map_err(|_| anyhow!("mount: {what}={v:?} is not a number of seconds"))?;
    if !(0.0..=86400.0).contains(&f) {
        bail!("mount: {what}={v} out of range (0..86400)");
    }
    Ok(Duration::from_secs_f64(f))
}

fn parse_opts(s: Option<&str>) -> Result<Opts> {
    let mut o = Opts {
        attr_timeout: Duration::from_secs(1),
        entry_timeout: Duration::from_secs(1),
        allow_other: false,
        writeback: false,
        threads: 8,
        timeout: Duration::from_secs(100),
        key: Vec::new(),
        locks: true,
        cluster_locks: true,
        readdirplus_always: false,
        seclabel: std::path::Path::new(lode_fuse::SELINUX_FS).exists(),
        io_uring: true,
        acl: true,
        btime: true,
        atime: AtimeMode::Relative,
        diratime: true,
        kernel: Vec::new(),
    };
    for opt in s.unwrap_or("").split(',').filter(|x| !x.is_empty()) {
        let (k, v) = opt.split_once('=').unwrap_or((opt, ""));
        match k {
            "attr_timeout" => o.attr_timeout = secs(v, k)?,
            "entry_timeout" => o.entry_timeout = secs(v, k)?,
            "timeout" => o.timeout = secs(v, k)?.max(Duration::from_secs(1)),
            "allow_other" => o.allow_other = true,
            "nolocks" => o.locks = false,
            "flock" => o.cluster_locks = true,
            "localflock" => o.cluster_locks = false,
            "seclabel" => o.seclabel = true,
            "io_uring" => o.io_uring = true,
            "noio_uring" => o.io_uring = false,
            "acl" => o.acl = true,
            "noacl" => o.acl = false,
            "btime" => o.btime = true,
            "nobtime" => o.btime = false,
            "readdirplus" => {
                o.readdirplus_always = match v {
                    "always" => true,
                    "auto" => false,
                    _ => bail!("mount: readdirplus={v:?} must be always or auto"),
                }
            }
            "writeback" => o.writeback = true,
            "threads" => {
                o.threads = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or_else(|| anyhow!("mount: threads={v:?} must be 1..64"))?
            }
            "key_file" => {
                o.key = lode_base::config::read_key_file(Path::new(v))
                    .map_err(|e| anyhow!("mount: {e}"))?
            }
            // As mount(8) says; unless given, a FUSE mount is nosuid and nodev.
            "suid" => o.kernel.push(MountOption::Suid),
            "nosuid" => o.kernel.retain(|m| *m != MountOption::Suid),
            "dev" => o.kernel.push(MountOption::Dev),
            "nodev" => o.kernel.retain(|m| *m != MountOption::Dev),
            "noexec" => o.kernel.push(MountOption::NoExec),
            "exec" => o.kernel.retain(|m| *m != MountOption::NoExec),
            "ro" => o.kernel.push(MountOption::RO),
            // Access times as mount(8) has them; FUSE leaves them to the client.
            "noatime" => {
                o.atime = AtimeMode::Never;
                o.kernel.push(MountOption::NoAtime);
            }
            "atime" | "relatime" => {
                o.atime = AtimeMode::Relative;
                o.kernel.retain(|m| *m != MountOption::NoAtime);
            }
            "strictatime" => {
                o.atime = AtimeMode::Strict;
                o.kernel.retain(|m| *m != MountOption::NoAtime);
            }
            "nodiratime" => o.diratime = false,
            "diratime" => o.diratime = true,
            "rw" | "defaults" => {}
            _ => bail!("mount: unknown option {opt:?}"),
        }
    }
    Ok(o)
}

/// True if `path` is mounted (listed in /proc/mounts).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(m) = std::fs::read_to_string("/proc/mounts") else {
        return false;
    };
    let p = path.to_string_lossy();
    m.lines().any(|l| l.split(' ').nth(1) == Some(&*p))
}

fn check_mountpoint(p: &Path) -> Result<PathBuf> {
    let d = p.display();
    let md = std::fs::metadata(p).map_err(|e| anyhow!("mount: {d}: {e}"))?;
    if !md.is_dir() {
        bail!("mount: {d}: not a directory");
    }
    let abs = std::fs::canonicalize(p).with_context(|| format!("mount: {d}"))?;
    if is_mounted(&abs) {
        bail!("mount: {d}: already mounted");
    }
    if std::fs::read_dir(&abs)
        .with_context(|| format!("mount: {d}"))?
        .next()
        .is_some()
    {
        bail!("mount: {d}: not empty, refusing to mount over it");
    }
    Ok(abs)
}

/// Runs `lode mount`.
pub fn run(a: MountArgs) -> Result<()> {
    let (mgs, fsname) = lode_client::parse_source(&a.source).map_err(|e| anyhow!("mount: {e}"))?;
    let opts = parse_opts(a.options.as_deref())?;
    let mnt = check_mountpoint(&a.mountpoint)?;
    if !a.foreground {
        return daemonize(&a, None, None, None).map(|_| ());
    }
    crate::server::init_logging();
    let notify = std::env::var_os(NOTIFY_ENV).is_some();
    // FUSE threads run their own requests; the runtime only reads replies and closes in
    // the background. One worker measured fewer context switches and CPU than two.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .thread_name("lode-client")
        .build()
        .context("runtime")?;
    let mut cfg = ClientConfig::new(&mgs, &fsname);
    cfg.timeout = opts.timeout;
    cfg.key = opts.key.clone();
    cfg.entry_timeout = opts.entry_timeout;
    cfg.locks = opts.locks;
    cfg.atime = opts.atime;
    cfg.diratime = opts.diratime;
    let client = rt
        .block_on(Client::connect(cfg))
        .map_err(|e| anyhow!("mount: {e}"))?;
    // Until the MDT can call this client back, nothing is cached under locks and the
    // kernel gets short timeouts: a mount that served at once would answer its first
    // calls that way (and count more round trips than it needs). The channel is up
    // within a round trip or two; a mount whose channel is slow serves anyway.
    if opts.locks && !rt.block_on(client.wait_callback_channel(CALLBACK_CHANNEL_WAIT)) {
        tracing::warn!("mount: the MDT cannot call this client back yet: caching with short timeouts until it can");
    }
    // Whoever started this mount (`lode up`) learns who it is, to evict it from
    // recovery if the mount dies with the servers.
    if let Some(f) = std::env::var_os(UUID_FILE_ENV) {
        let _ = lode_base::config::write_durable(Path::new(&f), client.uuid().as_bytes(), 0o644);
    }
    // get-param/set-param reach the client's tunables through this socket.
    let instance = lode_client::params::ClientParams(client.clone()).instance();
    let params = Arc::new(lode_client::params::all(client.clone()));
    let run_dir = crate::params::run_dir();
    let admin = run_dir.join(format!("{fsname}-client-{instance}.sock"));
    if std::fs::create_dir_all(&run_dir).is_ok() {
        rt.spawn(lode_rpc::admin::serve_admin(admin.clone(), params));
    }
    let fs = lode_fuse::LodeFs::new(
        client,
        lode_fuse::MountOptions {
            attr_timeout: opts.attr_timeout,
            entry_timeout: opts.entry_timeout,
            writeback: opts.writeback,
            threads: opts.threads,
            cluster_locks: opts.cluster_locks,
            readdirplus_always: opts.readdirplus_always,
            seclabel: opts.seclabel,
            acl: opts.acl,
            btime: opts.btime,
        },
        rt.handle().clone(),
    );
    let mut options = vec![
        MountOption::FSName(format!("{mgs}:/{fsname}")),
        MountOption::Subtype("lode".into()),
        MountOption::Custom("max_read=1048576".into()),
        // The kernel checks mode bits itself, from attributes kept coherent by locks
        // (the MDT still decides on its side): without it, a path the kernel has
        // cached would be walked without search permission, and a FIFO opened
        // without asking anyone.
        MountOption::DefaultPermissions,
    ];
    options.extend(opts.kernel.iter().cloned());
    if opts.allow_other {
        options.push(MountOption::AllowOther);
    }
    if opts.io_uring {
        enable_uring();
    }
    let config = lode_fuse::kernel::Config {
        flags: fs.init_flags(),
        threads: opts.threads,
        io_uring: opts.io_uring,
        max_readahead: 1 << 20,
    };
    let invalidation = fs.invalidation();
    let session = lode_fuse::kernel::Session::new(fs, &mnt, &options, config)
        .map_err(|e| anyhow!("mount: {}: {e}", mnt.display()))?;
    invalidation
        .start(session.notifier())
        .context("mount: cannot start the invalidation thread")?;
    let unmounter = mnt.clone();
    rt.spawn(async move {
        // SIGTERM/SIGINT unmount cleanly; the session loop then ends.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let int = tokio::signal::ctrl_c();
        tokio::select! {
            _ = async { if let Some(t) = term.as_mut() { t.recv().await; } else { std::future::pending::<()>().await } } => {}
            _ = int => {}
        }
        // `lode down` unmounts first and signals after: then there is nothing left to
        // unmount, and fusermount3's EINVAL says just that.
        match Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&unmounter)
            .stderr(Stdio::piped())
            .output()
        {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr);
                if !why.contains("Invalid argument") {
                    tracing::warn!("unmounting on a signal: {}", why.trim());
                }
            }
            Err(e) => tracing::warn!("unmounting on a signal: fusermount3: {e}"),
        }
    });
    tracing::info!(
        mountpoint = %mnt.display(),
        transport = if session.io_uring() { "io_uring" } else { "/dev/fuse" },
        "mounted {mgs}:/{fsname}"
    );
    if notify {
        println!("READY");
        let _ = std::io::stdout().flush();
        redirect_stdout_to_null();
    }
    let ran = session
        .run()
        .map_err(|e| anyhow!("mount: {}: {e}", mnt.display()));
    let _ = std::fs::remove_file(&admin);
    ran?;
    drop(rt);
    Ok(())
}

/// How long a mount waits for its callback channel before it serves anyway.
const CALLBACK_CHANNEL_WAIT: Duration = Duration::from_secs(5);

/// The kernel's switch for FUSE over io_uring (off by default).
pub const URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns the kernel's FUSE-over-io_uring switch on, where it exists and this process
/// may: it only lets the kernel offer the transport at INIT, which FUSE daemons that
/// do not ask for it ignore. Where it cannot, requests go over `/dev/fuse`.
fn enable_uring() {
    match std::fs::read_to_string(URING_PARAM) {
        Ok(v) if v.trim() == "Y" || v.trim() == "1" => {}
        Ok(_) => match std::fs::write(URING_PARAM, "Y") {
            Ok(()) => tracing::info!("turned FUSE over io_uring on ({URING_PARAM})"),
            Err(e) => tracing::info!("FUSE over io_uring stays off: {URING_PARAM}: {e}"),
        },
        Err(_) => {}
    }
}

/// Once the mount is live its starter stops reading our stdout, and our stderr if
/// that is the pipe it read errors from: both go to /dev/null, or the next log line
/// would write into a pipe nobody reads (and the mount would die of it).
fn redirect_stdout_to_null() {
    if let Ok(f) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto stdout of a valid descriptor.
        unsafe { libc::dup2(f.as_raw_fd(), 1) };
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat of fd 2 into a buffer of the right type.
        let piped = unsafe { libc::fstat(2, st.as_mut_ptr()) } == 0
            // SAFETY: fstat succeeded and filled it.
            && unsafe { st.assume_init() }.st_mode & libc::S_IFMT == libc::S_IFIFO;
        if piped {
            // SAFETY: dup2 onto stderr of a valid descriptor.
            unsafe { libc::dup2(f.as_raw_fd(), 2) };
        }
    }
}

/// Set for a mount started by `lode up`: the file where it writes its client UUID.
pub const UUID_FILE_ENV: &str = "LODE_MOUNT_UUID_FILE";

/// Starts the mount in the background and returns its pid once it is live (or the
/// reason it failed). The mount process logs to `log` (or `$LODE_MOUNT_LOG`) and, if
/// `uuid_file` is given, writes its client UUID there.
pub fn daemonize(
    a: &MountArgs,
    log: Option<PathBuf>,
    run_dir: Option<&Path>,
    uuid_file: Option<&Path>,
) -> Result<u32> {
    let exe = std::env::current_exe().context("mount: cannot find the lode binary")?;
    let log = log.or_else(|| std::env::var_os("LODE_MOUNT_LOG").map(PathBuf::from));
    let stderr = match &log {
        Some(p) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        ),
        None => Stdio::piped(),
    };
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg("--foreground");
    if let Some(o) = &a.options {
        cmd.arg("-o").arg(o);
    }
    cmd.arg(&a.source)
        .arg(&a.mountpoint)
        .env(NOTIFY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    if let Some(d) = run_dir {
        // Its admin socket goes beside the servers' (get-param finds it there).
        cmd.env("LODE_RUN_DIR", d);
    }
    if let Some(f) = uuid_file {
        cmd.env(UUID_FILE_ENV, f);
    }
    detach(&mut cmd);
    let mut child = cmd
        .spawn()
        .context("mount: cannot start the mount process")?;
    let out = child.stdout.take().context("mount: no pipe")?;
    let mut line = String::new();
    let _ = std::io::BufReader::new(out).read_line(&mut line);
    if line.trim() == "READY" {
        // Without a log file, the mount's stderr goes nowhere once we exit.
        return Ok(child.id());
    }
    let status = child.wait()?;
    let mut msg = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut msg);
    }
    let last = msg
        .lines()
        .rev()
        .find(|l| l.starts_with("lode: "))
        .map(|l| l.trim_start_matches("lode: ").to_string());
    // With a log file, the reason is its last line (the log may be the admin's only
    // record, but the caller should not have to go and look).
    let logged = log.as_ref().and_then(|p| {
        let text = std::fs::read_to_string(p).ok()?;
        let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
        Some(format!(
            "mount: failed ({status}): {}",
            line.trim().trim_start_matches("lode: ")
        ))
    });
    bail!(
        "{}",
        last.or(logged)
            .unwrap_or_else(|| format!("mount: failed ({status})"))
    )
}

/// Makes `cmd`'s process a session leader, so it outlives this command and its
/// terminal (a daemonized mount, the servers of `lode up`).
pub fn detach(cmd: &mut Command) {
    // SAFETY: setsid is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
}

/// Arguments of `lode sync`.
#[derive(Args)]
pub struct SyncArgs {
    /// Files or directories on lode mounts (default: every lode mount here).
    paths: Vec<PathBuf>,
}

/// Runs `lode sync`: for each mount, the kernel's cached writes go to the mount daemon
/// (`syncfs`), then the daemon makes everything durable (an `fsync` of the mount's
/// root: the MDT commits and every OST syncs) before this returns. `sync(1)` does the
/// first half only: Linux does not pass syncfs on to FUSE servers.
pub fn sync(a: SyncArgs) -> Result<()> {
    let mounts: Vec<PathBuf> = if a.paths.is_empty() {
        lode_mounts().into_iter().map(|(_, mp)| mp).collect()
    } else {
        let mut v = Vec::new();
        for p in &a.paths {
            let (_, mp) = source_of(p)
                .ok_or_else(|| anyhow!("sync: {}: not on a lode mount", p.display()))?;
            if !v.contains(&mp) {
                v.push(mp);
            }
        }
        v
    };
    if mounts.is_empty() {
        bail!("sync: no lode mount here");
    }
    let mut failed = false;
    for mp in mounts {
        let r = std::fs::File::open(&mp).and_then(|d| {
            nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&d))
                .map_err(std::io::Error::from)?;
            d.sync_all()
        });
        if let Err(e) = r {
            eprintln!("lode: sync: {}: {e}", mp.display());
            failed = true;
        }
    }
    if failed {
        std::process::exit(1);
    }
    Ok(())
}

/// Arguments of `lode umount`.
#[derive(Args)]
pub struct UmountArgs {
    /// The mount point.
    mountpoint: PathBuf,
}

/// Runs `lode umount`: unmounts and waits for the mount process to finish.
pub fn umount(a: UmountArgs) -> Result<()> {
    let abs = std::fs::canonicalize(&a.mountpoint)
        .map_err(|e| anyhow!("umount: {}: {e}", a.mountpoint.display()))?;
    if !is_lode_mount(&abs) {
        bail!("umount: {}: not a lode mount", abs.display());
    }
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg(&abs)
        .stderr(Stdio::piped())
        .output()?;
    if st.status.success() {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&st.stderr).trim().to_string();
    if why.contains("busy") {
        // Busy (a process sits in it, or a server is down): detach it now; the kernel
        // releases it when the last user leaves, and the mount process then exits.
        let lazy = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&abs)
            .status()?;
        if lazy.success() {
            eprintln!(
                "lode: umount: {}: busy, detached (lazy unmount)",
                abs.display()
            );
            return Ok(());
        }
    }
    bail!(
        "umount: {}: {}",
        abs.display(),
        if why.is_empty() { "failed".into() } else { why }
    );
}

/// Lode mounts in /proc/mounts: a FUSE type and a `MGS:/FSNAME` source.
fn lode_mounts() -> Vec<(String, PathBuf)> {
    let Ok(m) = std::fs::read_to_string("/proc/mounts") else {
        return Vec::new();
    };
    m.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let fuse = f.len() > 2 && (f[2] == "fuse" || f[2] == "fuse.lode");
            (fuse && lode_client::parse_source(f[0]).is_ok())
                .then(|| (f[0].to_string(), PathBuf::from(f[1])))
        })
        .collect()
}

/// True if `path` is a lode mount point.
pub fn is_lode_mount(path: &Path) -> bool {
    lode_mounts().iter().any(|(_, mp)| mp == path)
}

/// The mount source (`MGS:/FSNAME`) and mount point of the lode mount holding `path`.
pub fn source_of(path: &Path) -> Option<(String, PathBuf)> {
    let abs = std::fs::canonicalize(path).ok()?;
    lode_mounts()
        .into_iter()
        .filter(|(_, mp)| abs.starts_with(mp))
        .max_by_key(|(_, mp)| mp.as_os_str().len())
}
