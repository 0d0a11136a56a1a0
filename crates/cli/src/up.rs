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
    /// File system name.
    #[arg(long, default_value = "lode")]
    fsname: String,
    /// MGS port; MDT0 listens on base+20, OSTn on base+70+n.
    #[arg(long, default_value_t = 9880)]
    port_base: u16,
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
    fn load(dir: &Path) -> Option<UpConf> {
        let s = std::fs::read_to_string(dir.join("up.conf")).ok()?;
        let get = |k: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .map(str::to_string)
        };
        Some(UpConf {
            fsname: get("fsname")?,
            port_base: get("port_base")?.parse().ok()?,
            mount: get("mount")?.into(),
        })
    }

    fn save(&self, dir: &Path) -> Result<()> {
        let s = format!(
            "fsname={}\nport_base={}\nmount={}\n",
            self.fsname,
            self.port_base,
            self.mount.display()
        );
        std::fs::write(dir.join("up.conf"), s)?;
        Ok(())
    }
}

fn pid_alive(dir: &Path, name: &str) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join(format!("{name}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmd)
        .contains("lode")
        .then_some(pid)
}

fn lode_cmd(dir: &Path) -> Result<Command> {
    let mut c = Command::new(std::env::current_exe().context("cannot find the lode binary")?);
    c.env("LODE_RUN_DIR", dir.join("run"));
    Ok(c)
}

fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("timed out waiting for {what}")
}

fn log_tail(dir: &Path, name: &str) -> String {
    let s = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
    s.lines()
        .rev()
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `lode up`.
pub fn up(a: UpArgs) -> Result<()> {
    lode_base::config::check_fsname(&a.fsname).map_err(|e| anyhow!("up: {e}"))?;
    std::fs::create_dir_all(&a.dir).with_context(|| format!("up: {}", a.dir.display()))?;
    let dir = std::fs::canonicalize(&a.dir)?;
    let conf = match UpConf::load(&dir) {
        Some(c) => c,
        None => UpConf {
            fsname: a.fsname.clone(),
            port_base: a.port_base,
            mount: a.mount.clone().unwrap_or_else(|| dir.join("mnt")),
        },
    };
    let mnt = match &a.mount {
        Some(m) => {
            std::fs::create_dir_all(m)?;
            std::fs::canonicalize(m)?
        }
        None => {
            std::fs::create_dir_all(&conf.mount)?;
            std::fs::canonicalize(&conf.mount)?
        }
    };
    let conf = UpConf {
        mount: mnt.clone(),
        ..conf
    };
    let mgs = format!("127.0.0.1:{}", conf.port_base);
    if TARGETS.iter().all(|t| pid_alive(&dir, t.name).is_some()) && is_lode_mount(&mnt) {
        println!(
            "lode is already running: {}:/{} mounted on {}",
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
    conf.save(&dir)?;
    for t in &TARGETS {
        if pid_alive(&dir, t.name).is_some() {
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
        std::fs::write(dir.join(format!("{}.pid", t.name)), child.id().to_string())?;
    }
    for t in &TARGETS {
        let addr = format!("127.0.0.1:{}", port(conf.port_base, t));
        wait_until(
            &format!("{} on {addr}", t.name),
            Duration::from_secs(30),
            || pid_alive(&dir, t.name).is_some() && std::net::TcpStream::connect(&addr).is_ok(),
        )
        .map_err(|e| anyhow!("up: {e}: {}", log_tail(&dir, t.name)))?;
    }
    let sock = dir
        .join("run")
        .join(format!("{}-MDT0000.sock", conf.fsname));
    wait_until("the MDT to see both OSTs", Duration::from_secs(30), || {
        lode_rpc::admin::admin_request(&sock, "value lod.*.target_obd")
            .is_ok_and(|v| v.lines().filter(|l| l.ends_with(" ACTIVE")).count() == 2)
    })
    .map_err(|e| anyhow!("up: {e}"))?;
    if !is_lode_mount(&mnt) {
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
        let pid = daemonize(&args, Some(dir.join("mount.log")), Some(&dir.join("run")))
            .map_err(|e| anyhow!("up: {e}"))?;
        std::fs::write(dir.join("mount.pid"), pid.to_string())?;
    }
    println!(
        "lode is up: {mgs}:/{} mounted on {}",
        conf.fsname,
        mnt.display()
    );
    println!("stop it with: lode down --dir {}", dir.display());
    Ok(())
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

/// Waits up to `within` for `pid` to exit (or become a zombie); true if it did.
fn wait_gone(pid: u32, within: Duration) -> bool {
    let end = Instant::now() + within;
    loop {
        let gone = !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "));
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
        .ok_or_else(|| anyhow!("down: {}: no file system started by lode up", dir.display()))?;
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
    if let Some(pid) = pid_alive(&dir, "mount") {
        stop_pid(pid);
    }
    let _ = std::fs::remove_file(dir.join("mount.pid"));
    for t in TARGETS.iter().rev() {
        if let Some(pid) = pid_alive(&dir, t.name) {
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
    let conf = UpConf::load(&dir).ok_or_else(|| {
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
        let name = match t.role {
            "mgs" => "MGS".to_string(),
            "mds" => format!("{}-MDT{:04x}", conf.fsname, t.index),
            _ => format!("{}-OST{:04x}", conf.fsname, t.index),
        };
        let addr = format!("127.0.0.1:{}", port(conf.port_base, t));
        let up = pid_alive(&dir, t.name).is_some() && std::net::TcpStream::connect(&addr).is_ok();
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
