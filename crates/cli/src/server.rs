//! Starting a server process: checks on the target directory (formatted, right role,
//! not already running), the listening socket, then the service itself.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use lode_base::config::{Role, TargetConfig};
use lode_proto::{TargetInfo, TargetKind};
use lode_rpc::admin::Params;
use lode_rpc::{fail, ServerConfig, Service};
use lode_store::{FaultPoint, Faulty, Injector, MdtStore, RocksEngine};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tracing::{error, info, warn};

/// Arguments every server takes.
#[derive(Args)]
pub struct ServerArgs {
    /// Address to serve on (default: 127.0.0.1 and the role's default port).
    #[arg(long)]
    listen: Option<String>,
    /// Serve Prometheus metrics on this address.
    #[arg(long)]
    metrics: Option<String>,
    /// Service threads (0: one per CPU; on 2 cores, fewer threads measured faster).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// RocksDB block cache for metadata, MiB (MDS only).
    #[arg(long, default_value_t = 256)]
    cache_mb: usize,
    /// Connections served at once; more are refused at accept.
    #[arg(long, default_value_t = lode_base::limits::CONNECTIONS_MAX)]
    max_connections: usize,
    /// Requests one connection may have read and not yet answered.
    #[arg(long, default_value_t = lode_base::limits::INFLIGHT_PER_CONN_MAX)]
    max_inflight_per_conn: usize,
    /// Milliseconds a frame may take to arrive whole; a peer stopping mid-frame is
    /// disconnected after it.
    #[arg(long, default_value_t = lode_base::limits::CONN_READ_TIMEOUT_MS)]
    read_timeout_ms: u64,
    /// Milliseconds a connection with nothing in flight may stay silent.
    #[arg(long, default_value_t = lode_base::limits::CONN_IDLE_TIMEOUT_MS)]
    idle_timeout_ms: u64,
    /// Milliseconds replies may wait for a client that does not read them.
    #[arg(long, default_value_t = lode_base::limits::CONN_WRITE_TIMEOUT_MS)]
    write_timeout_ms: u64,
    /// `fail_loc` from the start, for faults in what a server does before anyone
    /// could set it (recovery); as `set-param fail_loc`.
    #[arg(long, value_parser = parse_fail_loc, default_value = "0")]
    fail_loc: u32,
    /// `fail_val` from the start.
    #[arg(long, default_value_t = 0)]
    fail_val: u32,
    /// Formatted target directory.
    dir: PathBuf,
}

/// `--fail-loc`: a number as `set-param fail_loc` takes it (decimal or `0x` hex).
fn parse_fail_loc(s: &str) -> Result<u32, String> {
    let v = lode_rpc::admin::parse_num(s)?;
    u32::try_from(v).map_err(|_| format!("{s:?} is more than 32 bits"))
}

/// Store faults driven by `fail_loc`.
struct FailLocInjector;

impl Injector for FailLocInjector {
    fn fail(&self, point: FaultPoint) -> bool {
        match point {
            FaultPoint::Sync => fail::check(fail::STORE_SYNC_FAIL),
            FaultPoint::Write => fail::check(fail::STORE_WRITE_FAIL),
        }
    }

    fn delay(&self, point: FaultPoint) -> Option<std::time::Duration> {
        (point == FaultPoint::Sync && fail::check(fail::STORE_SYNC_DELAY))
            .then(|| std::time::Duration::from_millis(u64::from(fail::val())))
    }
}

fn default_port(role: Role, index: u32) -> u32 {
    match role {
        Role::Mgs => 9880,
        Role::Mdt => 9900 + index,
        Role::Ost => 9950 + index,
    }
}

/// How long a new server waits for the lock of a server that is exiting.
const LOCK_EXITING_WAIT: Duration = Duration::from_secs(10);

/// Takes the target's lock file; a second server on the same directory is refused.
/// A server killed a moment ago holds the lock until its last thread is gone (its
/// leader already shows as a zombie, and a large store takes a while to unmap), so
/// `kill -9` then `lode up` would find it taken: while the holder is exiting, the
/// lock is waited for, up to [`LOCK_EXITING_WAIT`].
fn lock_dir(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = dir.join("lock");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("{}", path.display()))?;
    let deadline = std::time::Instant::now() + LOCK_EXITING_WAIT;
    let mut f = loop {
        match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(l) => break l,
            Err((back, _)) => {
                let pid = std::fs::read_to_string(&path).unwrap_or_default();
                let pid = pid.trim();
                if std::time::Instant::now() < deadline && exiting(pid) {
                    std::thread::sleep(Duration::from_millis(20));
                    f = back;
                    continue;
                }
                bail!(
                    "{}: already in use by a running server (pid {pid})",
                    dir.display()
                );
            }
        }
    };
    f.set_len(0)?;
    write!(f, "{}", std::process::id())?;
    Ok(f)
}

/// Whether the process `pid` (as a lock file names it) is gone or exiting: no such
/// process, or its leader a zombie while its other threads finish.
fn exiting(pid: &str) -> bool {
    match pid.parse::<u32>() {
        Ok(p) if p > 0 => zombie(p).unwrap_or(true),
        _ => false,
    }
}

/// Whether process `pid`'s leader is a zombie (its other threads, which still hold
/// its files, may be exiting yet); `None`: no such process. The state follows the
/// last `)` of `/proc/PID/stat`, since the command name before it may hold any byte.
pub(crate) fn zombie(pid: u32) -> Option<bool> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(s.rsplit_once(')').is_some_and(|(_, r)| r.starts_with(" Z")))
}

/// Logs to stderr, filtered by `LODE_LOG` (default `info`).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LODE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

/// Lets the process hold `max_connections` sockets plus its files: raises the soft
/// descriptor limit toward the hard one, and says so when that is not enough.
fn raise_fd_limit(max_connections: usize) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let want = max_connections as u64 + 256;
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let new = want.min(hard).max(soft);
        if new > soft && setrlimit(Resource::RLIMIT_NOFILE, new, hard).is_err() {
            warn!("cannot raise the descriptor limit to {new}");
        }
        if new < want {
            warn!("descriptor limit {new} is below max_connections {max_connections} + 256: connections beyond it fail at accept");
        }
    }
}

/// Runs a server until killed.
pub fn run(role: Role, a: ServerArgs) -> Result<()> {
    init_logging();
    raise_fd_limit(a.max_connections);
    fail::set_val(a.fail_val);
    fail::set_loc(a.fail_loc);
    let cfg = TargetConfig::load(&a.dir, role).map_err(|e| anyhow!("{e}"))?;
    let _lock = lock_dir(&a.dir)?;
    let listen = a
        .listen
        .clone()
        .unwrap_or_else(|| format!("127.0.0.1:{}", default_port(role, cfg.index)));
    let std_listener = std::net::TcpListener::bind(&listen)
        .map_err(|e| anyhow!("{}: cannot listen on {listen}: {e}", cfg.name()))?;
    std_listener.set_nonblocking(true)?;
    let metrics = match &a.metrics {
        Some(m) => {
            let l = std::net::TcpListener::bind(m)
                .map_err(|e| anyhow!("cannot serve metrics on {m}: {e}"))?;
            l.set_nonblocking(true)?;
            Some(l)
        }
        None => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name(cfg.name())
        .build()
        .context("runtime")?;
    let _guard = rt.enter();
    let (svc, params): (Arc<dyn Service>, Arc<dyn Params>) = match role {
        Role::Mgs => {
            let mgs = Arc::new(lode_mgs::Mgs::open(&a.dir, cfg.fsname.clone(), cfg.key())?);
            // Every change of its targets file is synced as it is made: nothing to
            // commit, but the stop is logged as the other targets' are.
            stop_cleanly_on_sigterm(rt.handle(), || Ok::<(), std::convert::Infallible>(()));
            (mgs.clone(), Arc::new(lode_mgs::MgsParams(mgs)))
        }
        Role::Mdt => start_mdt(&cfg, &a, &listen, rt.handle())?,
        Role::Ost => {
            let name = cfg.name();
            lode_oss::set_on_sync_failure(Box::new(move |e| {
                stop_target(&name, format_args!("object sync failure ({e:?})"))
            }));
            let ost = lode_oss::Ost::open(lode_oss::OstConfig {
                fsname: cfg.fsname.clone(),
                index: cfg.index,
                uuid: cfg.uuid.clone(),
                dir: a.dir.clone(),
                key: cfg.key(),
            })?;
            spawn_register(&cfg, TargetKind::Ost, &listen, rt.handle());
            // Also empties the object pool (leftovers found at start are set aside).
            let on_term = ost.clone();
            stop_cleanly_on_sigterm(rt.handle(), move || on_term.stop_cleanly());
            (ost.clone(), Arc::new(lode_oss::OstParams(ost)))
        }
    };
    if role != Role::Mgs {
        spawn_apply_persistent(&cfg, params.clone(), rt.handle());
    }
    let run_dir = crate::params::run_dir();
    if std::fs::create_dir_all(&run_dir).is_ok() {
        rt.spawn(lode_rpc::admin::serve_admin(
            run_dir.join(format!("{}.sock", cfg.name())),
            params.clone(),
        ));
    } else {
        warn!(
            "cannot create {}: get-param will not reach this server",
            run_dir.display()
        );
    }
    if let Some(m) = metrics {
        let l = tokio::net::TcpListener::from_std(m)?;
        rt.spawn(lode_rpc::admin::serve_metrics(l, params.clone()));
    }
    info!(target_name = %cfg.name(), %listen, "serving");
    let listener = tokio::net::TcpListener::from_std(std_listener)?;
    rt.block_on(lode_rpc::serve(
        listener,
        svc,
        ServerConfig {
            threads: if a.threads == 0 {
                std::thread::available_parallelism().map_or(2, |n| n.get())
            } else {
                a.threads
            },
            max_inflight_per_conn: a.max_inflight_per_conn.max(1),
            max_connections: a.max_connections.max(1),
            read_timeout: Duration::from_millis(a.read_timeout_ms),
            idle_timeout: Duration::from_millis(a.idle_timeout_ms),
            write_timeout: Duration::from_millis(a.write_timeout_ms),
        },
    ));
    Ok(())
}

/// A target that can no longer keep what it would acknowledge (a failed write or
/// sync of its store or of an object) stops the process: one line to its log and to
/// stderr, exit status 70.
fn stop_target(name: &str, why: std::fmt::Arguments<'_>) -> ! {
    error!("{name}: {why}; target stopped");
    eprintln!("lode: {name}: {why}; target stopped");
    std::process::exit(70);
}

fn start_mdt(
    cfg: &TargetConfig,
    a: &ServerArgs,
    listen: &str,
    rt: &tokio::runtime::Handle,
) -> Result<(Arc<dyn Service>, Arc<dyn Params>)> {
    let engine = RocksEngine::open_existing(&a.dir.join(lode_store::MDT_DB_DIR), a.cache_mb)
        .map_err(|e| anyhow!("{}: {e}", cfg.name()))?;
    let engine = Arc::new(Faulty::new(engine, Arc::new(FailLocInjector)));
    let store = MdtStore::open(engine).map_err(|e| anyhow!("{}: {e}", cfg.name()))?;
    let name = cfg.name();
    store.set_on_stop(Box::new(move |e| {
        stop_target(&name, format_args!("store failure ({e})"))
    }));
    store.start_commit_thread()?;
    let mdt = lode_mds::Mdt::open(
        lode_mds::MdtConfig {
            fsname: cfg.fsname.clone(),
            index: cfg.index,
            uuid: cfg.uuid.clone(),
            dir: a.dir.clone(),
            key: cfg.key(),
        },
        store,
    )
    .map_err(|e| anyhow!("{}: {e}", cfg.name()))?;
    let on_term = mdt.clone();
    stop_cleanly_on_sigterm(rt, move || on_term.stop_cleanly());
    let mgs = mgs_import(cfg, Duration::from_secs(10), rt);
    mdt.start_background(rt.clone(), mgs);
    spawn_register(cfg, TargetKind::Mdt, listen, rt);
    Ok((mdt.clone(), Arc::new(lode_mds::params::MdtParams(mdt))))
}

/// On SIGTERM (lode down, systemd), runs a target's clean stop, which commits what is
/// written, then exits; clients still connected come back for their open files and
/// locks.
fn stop_cleanly_on_sigterm<E: std::fmt::Display + Send + 'static>(
    rt: &tokio::runtime::Handle,
    stop: impl FnOnce() -> Result<(), E> + Send + 'static,
) {
    rt.spawn(async move {
        if let Ok(mut t) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            t.recv().await;
            match tokio::task::spawn_blocking(stop).await {
                Ok(Ok(())) => info!("stopped on SIGTERM after committing"),
                Ok(Err(e)) => error!("stopping on SIGTERM: {e}"),
                Err(e) => error!("stopping on SIGTERM: {e}"),
            }
            std::process::exit(0);
        }
    });
}

/// An import of the MGS for this target (its own client UUID: `<target>_UUID`).
fn mgs_import(
    cfg: &TargetConfig,
    timeout: Duration,
    rt: &tokio::runtime::Handle,
) -> Arc<lode_rpc::Import> {
    lode_mgs::client::mgs_import(
        &cfg.mgsnode,
        &cfg.fsname,
        &format!("{}_UUID", cfg.name()),
        cfg.key(),
        timeout,
        rt.clone(),
    )
}

/// Fetches the parameters stored with `set-param -P` from the MGS (retrying until it
/// answers) and applies those that name this target's parameters.
fn spawn_apply_persistent(
    cfg: &TargetConfig,
    params: Arc<dyn Params>,
    rt: &tokio::runtime::Handle,
) {
    let mgs = mgs_import(cfg, Duration::from_secs(5), rt);
    rt.spawn(async move {
        loop {
            match lode_mgs::client::fetch_config(&mgs).await {
                Ok(conf) => {
                    for r in lode_rpc::admin::apply_persistent(&*params, &conf.params) {
                        warn!("persistent parameter refused: {r}");
                    }
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    });
}

/// Registers with the MGS, retrying until it answers.
fn spawn_register(cfg: &TargetConfig, kind: TargetKind, listen: &str, rt: &tokio::runtime::Handle) {
    let info = TargetInfo {
        kind,
        index: cfg.index,
        name: cfg.name(),
        addr: listen.to_string(),
        uuid: cfg.uuid.clone(),
    };
    let mgs = mgs_import(cfg, Duration::from_secs(5), rt);
    let fsname = cfg.fsname.clone();
    let secret = cfg.secret();
    rt.spawn(async move {
        let mut warned = false;
        loop {
            match lode_mgs::client::register(&mgs, &fsname, info.clone(), &secret).await {
                Ok(()) => {
                    info!("registered with the MGS");
                    return;
                }
                Err(e)
                    if e == lode_base::Errno::EEXIST
                        || e == lode_base::Errno::EINVAL
                        || e == lode_base::Errno::EACCES
                        || e == lode_base::Errno::EPERM =>
                {
                    error!("the MGS refused registration of {}: {e}", info.name);
                    eprintln!("lode: {}: the MGS refused registration: {e}", info.name);
                    std::process::exit(1);
                }
                Err(e) => {
                    if !warned {
                        warn!("MGS not reachable yet ({e}); retrying");
                        warned = true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_held_for_a_gone_process_is_waited_for_and_a_live_ones_refused_at_once() {
        let d = tempfile::tempdir().expect("tempdir");
        let held = lock_dir(d.path()).expect("first lock");
        // The holder named in the file is alive (this process): refused at once.
        let t = std::time::Instant::now();
        assert!(lock_dir(d.path()).is_err());
        assert!(t.elapsed() < Duration::from_secs(1));
        // The file names a process that is gone (a pid above pid_max): the lock is
        // waited for, and taken once its holder lets go.
        let f: &std::fs::File = &held;
        f.set_len(0).expect("truncate");
        std::os::unix::fs::FileExt::write_all_at(f, (1u32 << 23).to_string().as_bytes(), 0)
            .expect("write");
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(held);
        });
        let l = lock_dir(d.path()).expect("lock after the holder went");
        releaser.join().expect("releaser");
        assert_eq!(
            std::fs::read_to_string(d.path().join("lock")).expect("read"),
            std::process::id().to_string()
        );
        drop(l);
        assert!(!exiting("not a pid") && !exiting("") && !exiting(&std::process::id().to_string()));
        assert!(exiting(&(1u32 << 23).to_string()));
    }
}
