//! `lode up`, `lode down`, `lode status`: the embedded default file system (one MGS, one
//! MDT, two OSTs as separate background processes on 127.0.0.1, and a mount).

use crate::mount::{daemonize, detach, is_lode_mount, MountArgs};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where `lode up` keeps everything unless told otherwise.
pub const DEFAULT_DIR: &str = "./lode-data";

/// Arguments of `lode up`.
#[derive(Args)]
pub struct UpArgs {
    /// Where the targets, logs and pid files live.
    #[arg(long, default_value = DEFAULT_DIR)]
    dir: PathBuf,
    /// Mount point (default DIR/mnt).
    #[arg(long)]
    mount: Option<PathBuf>,
    /// File system name (default: what DIR/up.conf says, else "lode").
    #[arg(long)]
    fsname: Option<String>,
    /// MGS port; MDT0 listens on base+20, OSTn on base+70+n (default: what DIR/up.conf
    /// says, else 9880).
    #[arg(long)]
    port_base: Option<u16>,
    /// Format without a shared key (by default a new file system gets one, in
    /// DIR/key: only holders of it may connect).
    #[arg(long)]
    no_key: bool,
}

/// Arguments of `lode down` and `lode status`.
#[derive(Args)]
pub struct DirArgs {
    /// The directory given to `lode up`.
    #[arg(long, default_value = DEFAULT_DIR)]
    dir: PathBuf,
}

/// The shared key of a file system `lode up` made, in its directory.
const KEY_FILE: &str = "key";

/// The client UUID of the mount `lode up` started last, in its directory.
const MOUNT_UUID_FILE: &str = "mount.uuid";

struct Target {
    name: &'static str,
    role: &'static str,
    mkfs: &'static str,
    index: u32,
}

const TARGETS: [Target; 4] = [
    Target {
        name: "mgs",
        role: "mgs",
        mkfs: "--mgs",
        index: 0,
    },
    Target {
        name: "mdt0",
        role: "mds",
        mkfs: "--mdt",
        index: 0,
    },
    Target {
        name: "ost0",
        role: "oss",
        mkfs: "--ost",
        index: 0,
    },
    Target {
        name: "ost1",
        role: "oss",
        mkfs: "--ost",
        index: 1,
    },
];

/// A target's name, as it registers with the MGS (`TargetConfig::name`).
fn target_name(fsname: &str, t: &Target) -> String {
    match t.role {
        "mgs" => "MGS".to_string(),
        "mds" => format!("{fsname}-MDT{:04x}", t.index),
        _ => format!("{fsname}-OST{:04x}", t.index),
    }
}

fn port(base: u16, t: &Target) -> u16 {
    match t.role {
        "mgs" => base,
        "mds" => base + 20 + t.index as u16,
        _ => base + 70 + t.index as u16,
    }
}

/// The settings `lode up` used, kept in DIR/up.conf so down/status/up agree.
struct UpConf {
    fsname: String,
    port_base: u16,
    mount: PathBuf,
}

impl UpConf {
    /// The settings recorded in `dir`: none if nothing was recorded; an error naming
    /// the file if it cannot be read as written.
    fn load(dir: &Path) -> Result<Option<UpConf>> {
        let path = dir.join("up.conf");
        let s = match std::fs::read_to_string(&path) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => bail!("{}: {e}", path.display()),
        };
        let get = |k: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .map(str::to_string)
        };
        let conf = (|| {
            Some(UpConf {
                fsname: get("fsname")?,
                port_base: get("port_base")?.parse().ok()?,
                mount: get("mount")?.into(),
            })
        })();
        match conf {
            Some(c) => Ok(Some(c)),
            None => bail!(
                "{} is damaged; remove it and give --fsname, --port-base and --mount as first given",
                path.display()
            ),
        }
    }

    /// Records the settings durably (a crash leaves the old file or the new one).
    fn save(&self, dir: &Path) -> Result<()> {
        let s = format!(
            "fsname={}\nport_base={}\nmount={}\n",
            self.fsname,
            self.port_base,
            self.mount.display()
        );
        lode_base::config::write_durable(&dir.join("up.conf"), s.as_bytes(), 0o644)?;
        Ok(())
    }
}

/// The command lines of running processes: (pid, arguments).
fn processes() -> Vec<(u32, Vec<String>)> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let args = cmd
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>();
            Some((pid, args))
        })
        .collect()
}

/// The live lode process whose arguments include `verb` and `path` (a server's role
/// and target directory, or `mount` and its mount point), whatever its pid file says:
/// after a crash a pid file may be empty, torn or name a pid reused since. A copy of
/// the binary under another name that starts with `lode` (`lode-old`, a build kept
/// for comparison) counts when `verb` is its first argument, as `lode up` starts it;
/// other programs with a `mount` verb (`rclone mount SRC DIR`) never do.
fn lode_process(verb: &str, path: &Path) -> Option<u32> {
    let p = path.to_string_lossy();
    processes().into_iter().find_map(|(pid, args)| {
        let name = args
            .first()
            .and_then(|a| Path::new(a).file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let lode =
            name == "lode" || (name.starts_with("lode") && args.get(1).is_some_and(|a| a == verb));
        let zombie = crate::server::zombie(pid) == Some(true);
        (lode && !zombie && args.iter().any(|a| a == verb) && args.iter().any(|a| *a == p))
            .then_some(pid)
    })
}

/// The running server of target `t` in `dir`.
fn server_pid(dir: &Path, t: &Target) -> Option<u32> {
    lode_process(t.role, &dir.join(t.name))
}

/// The FUSE connection number of the mount at `mnt` (its device minor), from
/// mountinfo, without touching the mount point (a dead mount answers ENOTCONN and a
/// mount whose servers are down makes a stat wait).
fn fuse_connection(mnt: &Path) -> Option<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let m = mnt.to_string_lossy();
    info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() < 5 || f[4] != m {
            return None;
        }
        let (major, minor) = f[2].split_once(':')?;
        (major == "0").then(|| minor.parse().ok())?
    })
}

/// A lode mount whose daemon is gone: its FUSE connection is aborted (so nothing
/// waiting on it hangs) and it is detached, so the mount point can be used again.
fn clear_dead_mount(mnt: &Path) -> Result<()> {
    if let Some(n) = fuse_connection(mnt) {
        let _ = std::fs::write(format!("/sys/fs/fuse/connections/{n}/abort"), "1");
    }
    let c = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid C string; MNT_DETACH takes the mount away even if busy.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } < 0 {
        bail!(
            "{}: a dead mount is in the way and cannot be unmounted: {}",
            mnt.display(),
            std::io::Error::last_os_error()
        );
    }
    eprintln!(
        "lode: {}: the mount's process was gone; its dead mount was detached",
        mnt.display()
    );
    Ok(())
}

fn lode_cmd(dir: &Path) -> Result<Command> {
    let mut c = Command::new(std::env::current_exe().context("cannot find the lode binary")?);
    c.env("LODE_RUN_DIR", dir.join("run"));
    Ok(c)
}

/// The line of a server's log that says why it stopped: the last error, else the
/// last line.
fn log_cause(dir: &Path, name: &str) -> String {
    let s = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines
        .iter()
        .rev()
        .find(|l| l.contains("ERROR") || l.contains("error") || l.starts_with("lode: "))
        .or(lines.last())
        .map_or_else(
            || "(its log is empty)".to_string(),
            |l| l.trim().to_string(),
        )
}

/// Waits for `what`, failing at once (with the server's exit status, the line of its
/// log that says why, and the log's path) if a server this run started exits.
fn wait_started(
    dir: &Path,
    started: &mut [(&'static str, std::process::Child)],
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> bool,
) -> Result<()> {
    let end = Instant::now() + within;
    loop {
        if f() {
            return Ok(());
        }
        for (name, child) in started.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                bail!(
                    "up: {name} exited ({status}) while starting: {} (log: {})",
                    log_cause(dir, name),
                    dir.join(format!("{name}.log")).display()
                );
            }
        }
        if Instant::now() >= end {
            bail!("up: timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `lode up`: formats what is not formatted, starts what is not running, and
/// mounts if the mount is not live, so it also brings back an instance after a crash.
pub fn up(a: UpArgs) -> Result<()> {
    if let Some(f) = &a.fsname {
        lode_base::config::check_fsname(f).map_err(|e| anyhow!("up: {e}"))?;
    }
    lode_base::config::create_dir_durable(&a.dir)
        .with_context(|| format!("up: {}", a.dir.display()))?;
    let dir = std::fs::canonicalize(&a.dir)?;
    let recorded = UpConf::load(&dir).map_err(|e| anyhow!("up: {e}"))?;
    // Options given now win over what was recorded.
    let fsname = a
        .fsname
        .clone()
        .or_else(|| recorded.as_ref().map(|c| c.fsname.clone()))
        .unwrap_or_else(|| "lode".into());
    let port_base = a
        .port_base
        .or(recorded.as_ref().map(|c| c.port_base))
        .unwrap_or(9880);
    let want_mnt = match &a.mount {
        Some(m) if m.is_absolute() => m.clone(),
        Some(m) => std::env::current_dir()?.join(m),
        None => recorded
            .as_ref()
            .map_or_else(|| dir.join("mnt"), |c| c.mount.clone()),
    };
    // The mount point is looked at through /proc first: stat of a dead mount fails,
    // and of a live one whose servers are down, waits.
    let mut live_mount = false;
    if is_lode_mount(&want_mnt) {
        if lode_process("mount", &want_mnt).is_some() {
            live_mount = true;
        } else {
            clear_dead_mount(&want_mnt).map_err(|e| anyhow!("up: {e}"))?;
        }
    }
    let mnt = if live_mount {
        want_mnt
    } else {
        std::fs::create_dir_all(&want_mnt)
            .with_context(|| format!("up: {}", want_mnt.display()))?;
        std::fs::canonicalize(&want_mnt)?
    };
    let conf = UpConf {
        fsname,
        port_base,
        mount: mnt.clone(),
    };
    let mgs = format!("127.0.0.1:{}", conf.port_base);
    let running: Vec<bool> = TARGETS
        .iter()
        .map(|t| server_pid(&dir, t).is_some())
        .collect();
    if running.iter().all(|r| *r) && live_mount {
        println!(
            "lode is already running: {}:/{} mounted on {} (nothing to do)",
            mgs,
            conf.fsname,
            mnt.display()
        );
        return Ok(());
    }
    let key = dir.join(KEY_FILE);
    let fresh = TARGETS.iter().all(|t| {
        !dir.join(t.name)
            .join(lode_base::config::CONFIG_FILE)
            .exists()
    });
    if fresh && !a.no_key && !key.exists() {
        // A lab file system is still on a network: only key holders connect.
        let hex = lode_base::config::to_hex(&lode_rpc::auth::nonce());
        lode_base::config::write_secret(&key, hex.as_bytes())
            .with_context(|| format!("up: {}", key.display()))?;
    }
    let keyed = key.exists();
    // Recorded before anything starts: a crash from here on leaves the settings a bare
    // `lode up --dir` needs.
    conf.save(&dir)?;
    for t in &TARGETS {
        let tdir = dir.join(t.name);
        if tdir.join(lode_base::config::CONFIG_FILE).exists() {
            continue;
        }
        let mut cmd = lode_cmd(&dir)?;
        cmd.args([
            "mkfs",
            t.mkfs,
            "--fsname",
            &conf.fsname,
            "--index",
            &t.index.to_string(),
            "--mgsnode",
            &mgs,
        ]);
        if keyed {
            cmd.arg("--key-file").arg(&key);
        }
        let out = cmd.arg(&tdir).output()?;
        if !out.status.success() {
            bail!(
                "up: {}",
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .trim_start_matches("lode: ")
            );
        }
    }
    let mut started = Vec::new();
    for (t, up) in TARGETS.iter().zip(&running) {
        if *up {
            continue;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.log", t.name)))?;
        let mut cmd = lode_cmd(&dir)?;
        cmd.arg(t.role)
            .args([
                "--listen",
                &format!("127.0.0.1:{}", port(conf.port_base, t)),
            ])
            .arg(dir.join(t.name))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        detach(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("up: starting {}", t.name))?;
        // For `lode down` and people; `lode up` itself finds servers by their command
        // line, so a pid file a crash left empty or stale misleads nobody.
        lode_base::config::write_durable(
            &dir.join(format!("{}.pid", t.name)),
            child.id().to_string().as_bytes(),
            0o644,
        )?;
        started.push((t.name, child));
    }
    let waited = (|| {
        for t in &TARGETS {
            let addr = format!("127.0.0.1:{}", port(conf.port_base, t));
            wait_started(
                &dir,
                &mut started,
                &format!("{} on {addr}", t.name),
                Duration::from_secs(30),
                || std::net::TcpStream::connect(&addr).is_ok(),
            )?;
        }
        let sock = dir
            .join("run")
            .join(format!("{}-MDT0000.sock", conf.fsname));
        if !live_mount {
            // This instance's own mount died with the servers and will not replay:
            // the restarted MDT is told not to wait for it (its recovery would
            // otherwise hold the new mount for the whole window).
            if let Ok(uuid) = std::fs::read_to_string(dir.join(MOUNT_UUID_FILE)) {
                let uuid = uuid.trim().to_string();
                let mut targets = vec![(
                    "the MDT's admin socket".to_string(),
                    sock.clone(),
                    format!("set mdt.*.evict_client={uuid}"),
                )];
                // The OSTs' recoveries too wait for the writers they had.
                for t in TARGETS.iter().filter(|t| t.role == "oss") {
                    targets.push((
                        format!("the admin socket of {}", t.name),
                        dir.join("run")
                            .join(format!("{}-OST{:04x}.sock", conf.fsname, t.index)),
                        format!("set obdfilter.*.evict_client={uuid}"),
                    ));
                }
                for (what, sock, line) in targets {
                    wait_started(&dir, &mut started, &what, Duration::from_secs(30), || {
                        lode_rpc::admin::admin_request(&sock, &line).is_ok()
                    })?;
                }
            }
        }
        wait_started(
            &dir,
            &mut started,
            "the MDT to see both OSTs",
            Duration::from_secs(30),
            || {
                lode_rpc::admin::admin_request(&sock, "value lod.*.target_obd")
                    .is_ok_and(|v| v.lines().filter(|l| l.ends_with(" ACTIVE")).count() == 2)
            },
        )?;
        // A mount asks the MGS for the MDT first: its registration may come after the
        // MDT saw the OSTs (it is sent on its own, and retried).
        let mgs_sock = dir.join("run").join("MGS.sock");
        let registered: Vec<String> = TARGETS
            .iter()
            .filter(|t| t.role != "mgs")
            .map(|t| target_name(&conf.fsname, t))
            .collect();
        wait_started(
            &dir,
            &mut started,
            "the MGS to list every target",
            Duration::from_secs(30),
            || {
                lode_rpc::admin::admin_request(&mgs_sock, "value mgs.*.targets").is_ok_and(|v| {
                    let listed: Vec<&str> = v.lines().filter_map(|l| l.split(' ').next()).collect();
                    registered.iter().all(|n| listed.contains(&n.as_str()))
                })
            },
        )?;
        Ok::<(), anyhow::Error>(())
    })();
    if let Err(e) = waited {
        stop_started(&mut started);
        return Err(e);
    }
    if !live_mount {
        let mut options = "allow_other".to_string();
        if keyed {
            options.push_str(&format!(",key_file={}", key.display()));
        }
        let args = MountArgs {
            options: Some(options),
            foreground: false,
            source: format!("{mgs}:/{}", conf.fsname),
            mountpoint: mnt.clone(),
        };
        let pid = match daemonize(
            &args,
            Some(dir.join("mount.log")),
            Some(&dir.join("run")),
            Some(&dir.join(MOUNT_UUID_FILE)),
        ) {
            Ok(pid) => pid,
            Err(e) => {
                stop_started(&mut started);
                return Err(anyhow!("up: {e}"));
            }
        };
        lode_base::config::write_durable(
            &dir.join("mount.pid"),
            pid.to_string().as_bytes(),
            0o644,
        )?;
    }
    println!(
        "lode is up: {mgs}:/{} mounted on {}",
        conf.fsname,
        mnt.display()
    );
    println!("stop it with: lode down --dir {}", dir.display());
    Ok(())
}

/// Nothing half-started is left behind: what a failed `lode up` started goes again.
fn stop_started(started: &mut [(&'static str, std::process::Child)]) {
    for (_, child) in started {
        stop_pid(child.id());
        let _ = child.wait();
    }
}

fn stop_pid(pid: u32) {
    // SAFETY: sending a signal to a pid we started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    if !wait_gone(pid, Duration::from_secs(10)) {
        // SAFETY: as above.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        // Gone for good before returning: a `lode up` right after must not find the
        // target still held by a process the kernel is still tearing down.
        if !wait_gone(pid, Duration::from_secs(10)) {
            eprintln!("lode: process {pid} did not exit after SIGKILL");
        }
    }
}

/// Waits up to `within` for `pid` to exit (or become a zombie with no thread left);
/// true if it did.
fn wait_gone(pid: u32, within: Duration) -> bool {
    let end = Instant::now() + within;
    loop {
        // A thread group's leader shows as a zombie while its other threads are still
        // exiting, and those still hold the process's files (a target's lock file):
        // gone means the leader alone is left.
        let gone = !Path::new(&format!("/proc/{pid}")).exists()
            || (crate::server::zombie(pid) == Some(true)
                && std::fs::read_dir(format!("/proc/{pid}/task")).map_or(true, |d| d.count() <= 1));
        if gone {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `lode down`.
pub fn down(a: DirArgs) -> Result<()> {
    let dir =
        std::fs::canonicalize(&a.dir).map_err(|e| anyhow!("down: {}: {e}", a.dir.display()))?;
    let conf = UpConf::load(&dir)
        .map_err(|e| anyhow!("down: {e}"))?
        .ok_or_else(|| anyhow!("down: {}: no file system started by lode up", dir.display()))?;
    if is_lode_mount(&conf.mount) && lode_process("mount", &conf.mount).is_none() {
        clear_dead_mount(&conf.mount).map_err(|e| anyhow!("down: {e}"))?;
    }
    if is_lode_mount(&conf.mount) {
        let ok = Command::new("fusermount3")
            .arg("-u")
            .arg(&conf.mount)
            .stderr(Stdio::null())
            .status()?
            .success();
        if !ok {
            // Busy: detach now, the kernel finishes when the last user leaves.
            Command::new("umount").arg("-l").arg(&conf.mount).status()?;
        }
    }
    if let Some(pid) = lode_process("mount", &conf.mount) {
        stop_pid(pid);
    }
    let _ = std::fs::remove_file(dir.join("mount.pid"));
    for t in TARGETS.iter().rev() {
        if let Some(pid) = server_pid(&dir, t) {
            stop_pid(pid);
        }
        let _ = std::fs::remove_file(dir.join(format!("{}.pid", t.name)));
    }
    println!(
        "lode is down ({} unmounted, servers stopped)",
        conf.mount.display()
    );
    Ok(())
}

/// Runs `lode status`.
pub fn status(a: DirArgs) -> Result<()> {
    let dir =
        std::fs::canonicalize(&a.dir).map_err(|e| anyhow!("status: {}: {e}", a.dir.display()))?;
    let conf = UpConf::load(&dir)
        .map_err(|e| anyhow!("status: {e}"))?
        .ok_or_else(|| {
            anyhow!(
                "status: {}: no file system started by lode up",
                dir.display()
            )
        })?;
    let mgs = format!("127.0.0.1:{}", conf.port_base);
    let usage: std::collections::HashMap<String, lode_proto::StatfsRep> =
        match lode_client::Session::connect({
            let mut c = lode_client::ClientConfig::new(&mgs, &conf.fsname);
            c.timeout = Duration::from_secs(3);
            let key = dir.join(KEY_FILE);
            if key.exists() {
                c.key = lode_base::config::read_key_file(&key).unwrap_or_default();
            }
            c
        }) {
            Ok(s) => s
                .run(s.client.statfs_targets())
                .into_iter()
                .filter_map(|(n, r)| r.ok().map(|st| (n, st)))
                .collect(),
            Err(_) => Default::default(),
        };
    println!(
        "{:<16} {:<21} {:<6} {:>10} {:>10} {:>5}",
        "TARGET", "ADDRESS", "STATE", "USED", "AVAIL", "USE%"
    );
    for t in &TARGETS {
        let name = target_name(&conf.fsname, t);
        let addr = format!("127.0.0.1:{}", port(conf.port_base, t));
        let up = server_pid(&dir, t).is_some() && std::net::TcpStream::connect(&addr).is_ok();
        let (used, avail, pct) = match usage.get(&name) {
            Some(s) => {
                let b = u64::from(s.bsize);
                let used = s.blocks.saturating_sub(s.bfree) * b;
                let avail = s.bavail * b;
                let pct = if used + avail > 0 {
                    (used * 100).div_ceil(used + avail)
                } else {
                    0
                };
                (
                    crate::lfs::human(used),
                    crate::lfs::human(avail),
                    format!("{pct}%"),
                )
            }
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "{:<16} {:<21} {:<6} {:>10} {:>10} {:>5}",
            name,
            addr,
            if up { "up" } else { "down" },
            used,
            avail,
            pct
        );
    }
    let mounted = is_lode_mount(&conf.mount);
    println!(
        "mount {} {}",
        conf.mount.display(),
        if mounted { "mounted" } else { "not mounted" }
    );
    Ok(())
}
