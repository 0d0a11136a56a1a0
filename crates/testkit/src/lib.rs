//! Real clusters for tests: `lode mkfs` and `lode mgs|mds|oss` as separate processes on
//! 127.0.0.1 in a temporary directory, each with its own log, killed on drop.

use lode_base::config::{Role, TargetConfig};
use lode_client::{ClientConfig, Session};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running cluster: one MGS, one MDT, `osts` OSTs.
pub struct Cluster {
    /// Everything lives under here (target dirs, logs, admin sockets).
    pub dir: tempfile::TempDir,
    bin: PathBuf,
    /// File system name.
    pub fsname: String,
    /// MGS address.
    pub mgs_addr: String,
    addrs: BTreeMap<String, String>,
    procs: BTreeMap<String, Child>,
    osts: u32,
    key: Option<Vec<u8>>,
    server_args: BTreeMap<String, Vec<String>>,
    server_env: BTreeMap<String, Vec<(String, String)>>,
}

/// Ports handed out are below Linux's ephemeral range (32768 and up by default): a
/// port the kernel picked for `bind(0)` and that was then released can be taken by any
/// outgoing connection before the server binds it (every client connects several
/// times), and the server then fails to start. Below the range only this process hands
/// ports out, each once.
const PORT_BASE: u16 = 20_000;
const PORT_SPAN: u16 = 12_000;

/// A TCP port on 127.0.0.1 that was free a moment ago and that no connection will take
/// meanwhile (see [`PORT_BASE`]); each call gives another.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Test binaries run one at a time; the pid keeps two at once apart anyway.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = (std::process::id() % u32::from(PORT_SPAN)) as u16;
    for _ in 0..PORT_SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = PORT_BASE + (start.wrapping_add(n) % PORT_SPAN);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {PORT_BASE}..{}", PORT_BASE + PORT_SPAN)
}

/// Waits until `f` holds or `deadline` passes; panics with `what` on timeout.
pub fn wait_for(what: &str, deadline: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}");
}

impl Cluster {
    /// Formats and starts a cluster with `osts` OSTs using the `lode` binary at `bin`.
    pub fn start(bin: &Path, osts: u32) -> Cluster {
        Cluster::start_with_key(bin, osts, None)
    }

    /// Like [`Cluster::start`], every target formatted with a shared key (and clients
    /// of [`Cluster::client_config`] presenting it).
    pub fn start_with_key(bin: &Path, osts: u32, key: Option<&[u8]>) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("lode-test-")
            .tempdir()
            .expect("temp dir");
        let mgs_addr = format!("127.0.0.1:{}", free_port());
        let mut c = Cluster {
            dir,
            bin: bin.to_path_buf(),
            fsname: "testfs".into(),
            mgs_addr,
            addrs: BTreeMap::new(),
            procs: BTreeMap::new(),
            osts,
            key: key.map(|k| k.to_vec()),
            server_args: BTreeMap::new(),
            server_env: BTreeMap::new(),
        };
        if let Some(k) = key {
            // 0600, or servers and mounts refuse it.
            let f = c.dir.path().join("key");
            std::fs::write(&f, k).expect("key file");
            std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .expect("chmod key file");
        }
        c.mkfs("--mgs", 0, "mgs");
        c.mkfs("--mdt", 0, "mdt0");
        for i in 0..osts {
            c.mkfs("--ost", i, &format!("ost{i}"));
        }
        c.addrs.insert("mgs".into(), c.mgs_addr.clone());
        c.addrs
            .insert("mdt0".into(), format!("127.0.0.1:{}", free_port()));
        for i in 0..osts {
            c.addrs
                .insert(format!("ost{i}"), format!("127.0.0.1:{}", free_port()));
        }
        c.start_target("mgs");
        c.start_target("mdt0");
        for i in 0..osts {
            c.start_target(&format!("ost{i}"));
        }
        c.wait_ready();
        c
    }

    fn mkfs(&self, role: &str, index: u32, name: &str) {
        let out = Command::new(&self.bin)
            .args([
                "mkfs",
                role,
                "--fsname",
                &self.fsname,
                "--index",
                &index.to_string(),
                "--mgsnode",
                &self.mgs_addr,
            ])
            .args(
                self.key
                    .as_ref()
                    .map(|_| {
                        let k = self.dir.path().join("key");
                        vec!["--key-file".to_string(), k.display().to_string()]
                    })
                    .unwrap_or_default(),
            )
            .arg(self.dir.path().join(name))
            .output()
            .expect("run lode mkfs");
        assert!(
            out.status.success(),
            "mkfs {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The directory of a target (`mgs`, `mdt0`, `ost1`).
    pub fn target_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Where this cluster's admin sockets live (`LODE_RUN_DIR`).
    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// A `lode` command with this cluster's run directory.
    pub fn lode(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.env("LODE_RUN_DIR", self.run_dir());
        c
    }

    /// Extra command-line arguments for target `name`'s server from its next start
    /// (e.g. `--max-connections 8`); restart it with [`Cluster::kill9`] and
    /// [`Cluster::start_target`].
    pub fn set_server_args(&mut self, name: &str, args: &[&str]) {
        self.server_args.insert(
            name.to_string(),
            args.iter().map(|a| a.to_string()).collect(),
        );
    }

    /// An environment variable for target `name`'s server from its next start (e.g.
    /// the OST's power-cut model); restart it with [`Cluster::kill9`] and
    /// [`Cluster::start_target`].
    pub fn set_server_env(&mut self, name: &str, key: &str, value: &str) {
        self.server_env
            .entry(name.to_string())
            .or_default()
            .push((key.to_string(), value.to_string()));
    }

    /// Starts (or restarts) the server of target `name`.
    pub fn start_target(&mut self, name: &str) {
        let role = match name {
            "mgs" => "mgs",
            n if n.starts_with("mdt") => "mds",
            _ => "oss",
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .expect("log file");
        let extra = self.server_args.get(name).cloned().unwrap_or_default();
        let threads: &[&str] = if extra.iter().any(|a| a == "--threads") {
            &[]
        } else {
            &["--threads", "4"]
        };
        let child = self
            .lode()
            .args([role, "--listen", &self.addrs[name], "--cache-mb", "64"])
            .args(threads)
            .args(extra)
            .arg(self.target_dir(name))
            .env("LODE_LOG", log_level())
            .envs(self.server_env.get(name).cloned().unwrap_or_default())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start server");
        self.procs.insert(name.to_string(), child);
        let addr = self.addrs[name].clone();
        wait_for(
            &format!("{name} to listen on {addr}"),
            Duration::from_secs(30),
            || std::net::TcpStream::connect(&addr).is_ok(),
        );
        // Its port takes connections before its admin socket is served (a restarted
        // target's old socket file may still be there): `get_param` right after
        // would miss it.
        let kind = match role {
            "mgs" => Role::Mgs,
            "mds" => Role::Mdt,
            _ => Role::Ost,
        };
        // Named as the server names it (`TargetConfig::name`).
        let target = TargetConfig::load(&self.target_dir(name), kind)
            .expect("the target's config")
            .name();
        let sock = self.run_dir().join(format!("{target}.sock"));
        wait_for(
            &format!("{name}'s admin socket {}", sock.display()),
            Duration::from_secs(30),
            || std::os::unix::net::UnixStream::connect(&sock).is_ok(),
        );
    }

    fn wait_ready(&self) {
        // One session, kept once it connects (a new one per try costs a runtime and
        // its threads), asked again until every OST is listed.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut session: Option<Session> = None;
        let mut last = String::from("not tried");
        loop {
            if session.is_none() {
                match Session::connect(self.client_config()) {
                    Ok(s) => session = Some(s),
                    Err(e) => last = format!("connect: {e}"),
                }
            }
            if let Some(s) = &session {
                match s.run(s.client.refresh_config()) {
                    Ok(()) if s.client.ost_count() == self.osts as usize => break,
                    Ok(()) => {
                        last = format!("{} of {} OSTs listed", s.client.ost_count(), self.osts)
                    }
                    Err(e) => last = format!("refresh_config: {e}"),
                }
            }
            if std::time::Instant::now() > deadline {
                let mut logs = String::new();
                for name in self.procs.keys() {
                    let log = self.log(name);
                    let tail: Vec<&str> = log.lines().rev().take(15).collect();
                    logs.push_str(&format!("--- {name}.log (last lines)\n"));
                    for l in tail.into_iter().rev() {
                        logs.push_str(l);
                        logs.push('\n');
                    }
                }
                panic!("timed out waiting for every target to register ({last})\n{logs}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The MDS learns OSTs from the MGS too; creates stripe over what it knows.
        wait_for("the MDS to see every OST", Duration::from_secs(30), || {
            let obd = self.get_param("lod.*.target_obd");
            obd.lines().filter(|l| l.ends_with(" ACTIVE")).count() == self.osts as usize
        });
    }

    /// The client settings for this cluster (short timeout so failure tests end fast).
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new(&self.mgs_addr, &self.fsname);
        c.timeout = Duration::from_secs(30);
        c.key = self.key.clone().unwrap_or_default();
        c
    }

    /// A connected client.
    pub fn client(&self) -> Session {
        Session::connect(self.client_config()).expect("client connects")
    }

    /// `kill -9` of a target's server; waits until it is gone.
    pub fn kill9(&mut self, name: &str) {
        if let Some(mut c) = self.procs.remove(name) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for a target's server to exit by itself and returns its exit code.
    pub fn wait_exit(&mut self, name: &str, within: Duration) -> Option<i32> {
        let end = Instant::now() + within;
        let child = self.procs.get_mut(name)?;
        while Instant::now() < end {
            if let Ok(Some(st)) = child.try_wait() {
                self.procs.remove(name);
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The address a target serves on.
    pub fn addr(&self, name: &str) -> String {
        self.addrs[name].clone()
    }

    /// `lode set-param NAME=VALUE` against this cluster's servers.
    pub fn set_param(&self, pair: &str) {
        let out = self
            .lode()
            .args(["set-param", pair])
            .output()
            .expect("run set-param");
        assert!(
            out.status.success(),
            "set-param {pair}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `lode get-param -n NAME`.
    pub fn get_param(&self, name: &str) -> String {
        let out = self
            .lode()
            .args(["get-param", "-n", name])
            .output()
            .expect("run get-param");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The log of a target so far.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, mut c) in std::mem::take(&mut self.procs) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A FUSE mount of a cluster (`lode mount --foreground` as a child process), unmounted
/// on drop.
pub struct Mount {
    path: PathBuf,
    child: Option<Child>,
    /// Its `-o` options and its log, to mount it again ([`Cluster::remount`]).
    options: String,
    log: PathBuf,
}

/// True if `path` is a mount point listed in /proc/mounts.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(m) = std::fs::read_to_string("/proc/mounts") else {
        return false;
    };
    let p = path.to_string_lossy();
    m.lines().any(|l| l.split(' ').nth(1) == Some(&*p))
}

impl Cluster {
    /// Mounts the file system on a new directory under the cluster's temp dir, with
    /// `allow_other` (so tests can act as other users) and any extra `-o` options.
    pub fn mount(&self) -> Mount {
        self.mount_with(&[])
    }

    /// Like [`Cluster::mount`], with extra mount options (e.g. `attr_timeout=0`).
    pub fn mount_with(&self, opts: &[&str]) -> Mount {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.path().join(format!("mnt{n}"));
        std::fs::create_dir_all(&path).expect("mount point");
        let mut o = vec!["allow_other".to_string()];
        o.extend(opts.iter().map(|s| s.to_string()));
        if self.key.is_some() {
            o.push(format!(
                "key_file={}",
                self.dir.path().join("key").display()
            ));
        }
        let mut m = Mount {
            path,
            child: None,
            options: o.join(","),
            log: self.dir.path().join(format!("mount{n}.log")),
        };
        self.start_mount(&mut m);
        m
    }

    /// Mounts `m` again at its mount point, with its options and log, after its client
    /// process died (a `kill -9` of [`Mount::pid`], as a crash of the client node; it is
    /// killed here if it still runs): the dead mount, on which every call fails with
    /// ENOTCONN, is detached first, lazily, as files still open on it would keep it
    /// busy. The new client is another client for the servers: nothing of the dead
    /// one's state (open files, locks) carries over.
    pub fn remount(&self, m: &mut Mount) {
        if let Some(mut c) = m.child.take() {
            let _ = c.kill();
            abort_fuse(&m.path);
            let _ = c.wait();
        }
        if is_mounted(&m.path) {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&m.path)
                .status();
        }
        wait_for(
            &format!("the dead mount on {} to go", m.path.display()),
            Duration::from_secs(10),
            || !is_mounted(&m.path),
        );
        self.start_mount(m);
    }

    /// Starts `m`'s client process and waits until it is mounted.
    fn start_mount(&self, m: &mut Mount) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .expect("log file");
        let child = self
            .lode()
            .args(["mount", "--foreground", "-o", &m.options])
            .arg(format!("{}:/{}", self.mgs_addr, self.fsname))
            .arg(&m.path)
            .env("LODE_LOG", log_level())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start lode mount");
        m.child = Some(child);
        let path = m.path.clone();
        wait_for(
            &format!("{} to be mounted", path.display()),
            Duration::from_secs(30),
            || is_mounted(&path),
        );
    }
}

impl Mount {
    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The mount process's pid (to stop and resume it).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The mount's log (all its lives, if it was mounted again).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Unmounts (flushing everything) and waits for the client to exit.
    pub fn unmount(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if is_mounted(&self.path) {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.path)
                .status();
            if is_mounted(&self.path) {
                let _ = Command::new("umount").arg("-l").arg(&self.path).status();
            }
        }
        if let Some(mut c) = self.child.take() {
            let end = Instant::now() + Duration::from_secs(10);
            while Instant::now() < end {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            abort_fuse(&self.path);
            let _ = c.wait();
        }
    }
}

/// Aborts the FUSE connection mounted on `path`, as `fusectl` allows: a killed mount
/// daemon whose thread is inside a kernel invalidation (which waits for a directory
/// lock that a request to the dead daemon holds) can never exit otherwise, and every
/// request on its mount waits forever.
pub fn abort_fuse(path: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let want = path.to_string_lossy();
    let minor = info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let fuse = l.split(" - ").nth(1).is_some_and(|t| t.starts_with("fuse"));
        (fuse && f.get(4) == Some(&want.as_ref()))
            .then(|| f.get(2)?.split(':').nth(1).map(str::to_string))
            .flatten()
    });
    let Some(minor) = minor else { return };
    let conns = Path::new("/sys/fs/fuse/connections");
    if !conns.join(&minor).exists() {
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "none"])
            .arg(conns)
            .status();
    }
    let _ = std::fs::write(conns.join(&minor).join("abort"), b"1");
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The log level of the servers and mounts a test starts: `LODE_TEST_LOG` (e.g.
/// `debug`, to follow a failure request by request), else `info`.
fn log_level() -> String {
    std::env::var("LODE_TEST_LOG").unwrap_or_else(|_| "info".into())
}
