//! What a benchmark runs against: a directory through POSIX calls, or the lode client
//! library. Paths are relative to the benchmark's root, `/`-separated.

use anyhow::{anyhow, bail, Context, Result};
use lode_base::{Cred, Fid};
use lode_client::{ClientConfig, FileHandle, Session};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

/// Where a benchmark runs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum Target {
    /// Plain POSIX calls under a directory.
    Path(PathBuf),
    /// The lode client library: `MGS_HOST:PORT:/FSNAME`.
    Native(String),
}

impl Target {
    /// A short description for reports.
    pub fn describe(&self) -> String {
        match self {
            Target::Path(p) => format!("path {}", p.display()),
            Target::Native(s) => format!("native {s}"),
        }
    }
}

/// The operations benchmarks need.
pub trait Ops: Send + Sync {
    /// mkdir.
    fn mkdir(&self, p: &str) -> Result<()>;
    /// rmdir.
    fn rmdir(&self, p: &str) -> Result<()>;
    /// Creates a file, writing `bytes` bytes into it.
    fn create(&self, p: &str, bytes: usize) -> Result<()>;
    /// stat (size and attributes).
    fn stat(&self, p: &str) -> Result<u64>;
    /// chmod (a SETATTR).
    fn chmod(&self, p: &str, mode: u32) -> Result<()>;
    /// Opens and reads up to `bytes` bytes.
    fn read(&self, p: &str, bytes: usize) -> Result<usize>;
    /// unlink.
    fn unlink(&self, p: &str) -> Result<()>;
    /// Names in a directory (without `.` and `..`).
    fn list(&self, p: &str) -> Result<Vec<(String, bool)>>;
    /// Writes `total` bytes to a file in `transfer`-sized calls at `offset`.
    fn write_range(
        &self,
        p: &str,
        offset: u64,
        total: u64,
        transfer: usize,
        fsync: bool,
        random: bool,
    ) -> Result<()>;
    /// Reads `total` bytes from `offset` in `transfer`-sized calls (in a random order
    /// if `random`).
    fn read_range(
        &self,
        p: &str,
        offset: u64,
        total: u64,
        transfer: usize,
        random: bool,
    ) -> Result<u64>;
}

/// The offsets (relative to the range) of the `transfer`-sized calls covering `total`
/// bytes: in order, or shuffled (the same order every run).
pub fn call_offsets(total: u64, transfer: usize, random: bool) -> Vec<u64> {
    let t = transfer.max(1) as u64;
    let mut v: Vec<u64> = (0..total.div_ceil(t)).map(|i| i * t).collect();
    if random {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in (1..v.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.swap(i, (x % (i as u64 + 1)) as usize);
        }
    }
    v
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// POSIX calls under a root directory.
pub struct PosixOps {
    root: PathBuf,
}

impl PosixOps {
    fn path(&self, p: &str) -> Result<CString> {
        let full = self.root.join(p);
        CString::new(full.as_os_str().as_bytes()).map_err(|_| anyhow!("path with NUL"))
    }
}

impl Ops for PosixOps {
    fn mkdir(&self, p: &str) -> Result<()> {
        let c = self.path(p)?;
        // SAFETY: valid C string.
        if unsafe { libc::mkdir(c.as_ptr(), 0o755) } < 0 {
            bail!("mkdir {p}: {}", errno());
        }
        Ok(())
    }
    fn rmdir(&self, p: &str) -> Result<()> {
        let c = self.path(p)?;
        // SAFETY: valid C string.
        if unsafe { libc::rmdir(c.as_ptr()) } < 0 {
            bail!("rmdir {p}: {}", errno());
        }
        Ok(())
    }
    fn create(&self, p: &str, bytes: usize) -> Result<()> {
        let c = self.path(p)?;
        // SAFETY: valid C string.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                0o644,
            )
        };
        if fd < 0 {
            bail!("create {p}: {}", errno());
        }
        let mut r = Ok(());
        if bytes > 0 {
            let buf = vec![0x5au8; bytes];
            // SAFETY: fd is open, buf is valid for its length.
            let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
            if n != bytes as isize {
                r = Err(anyhow!("write {p}: {}", errno()));
            }
        }
        // SAFETY: fd is open.
        unsafe { libc::close(fd) };
        r
    }
    fn stat(&self, p: &str) -> Result<u64> {
        let c = self.path(p)?;
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: valid path and buffer.
        if unsafe { libc::stat(c.as_ptr(), st.as_mut_ptr()) } < 0 {
            bail!("stat {p}: {}", errno());
        }
        // SAFETY: stat succeeded and filled the buffer.
        Ok(unsafe { st.assume_init() }.st_size as u64)
    }
    fn chmod(&self, p: &str, mode: u32) -> Result<()> {
        let c = self.path(p)?;
        // SAFETY: valid C string.
        if unsafe { libc::chmod(c.as_ptr(), mode as libc::mode_t) } < 0 {
            bail!("chmod {p}: {}", errno());
        }
        Ok(())
    }
    fn read(&self, p: &str, bytes: usize) -> Result<usize> {
        let c = self.path(p)?;
        // SAFETY: valid C string.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY) };
        if fd < 0 {
            bail!("open {p}: {}", errno());
        }
        let mut buf = vec![0u8; bytes.max(1)];
        // SAFETY: fd is open, buf is valid.
        let n = if bytes > 0 {
            unsafe { libc::read(fd, buf.as_mut_ptr().cast(), bytes) }
        } else {
            0
        };
        // SAFETY: fd is open.
        unsafe { libc::close(fd) };
        if n < 0 {
            bail!("read {p}: {}", errno());
        }
        Ok(n as usize)
    }
    fn unlink(&self, p: &str) -> Result<()> {
        let c = self.path(p)?;
        // SAFETY: valid C string.
        if unsafe { libc::unlink(c.as_ptr()) } < 0 {
            bail!("unlink {p}: {}", errno());
        }
        Ok(())
    }
    fn list(&self, p: &str) -> Result<Vec<(String, bool)>> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(self.root.join(p)).with_context(|| format!("readdir {p}"))? {
            let e = e?;
            let dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
            v.push((e.file_name().to_string_lossy().into_owned(), dir));
        }
        Ok(v)
    }
    fn write_range(
        &self,
        p: &str,
        offset: u64,
        total: u64,
        transfer: usize,
        fsync: bool,
        random: bool,
    ) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.root.join(p))?;
        let buf = vec![0xa5u8; transfer];
        for at in call_offsets(total, transfer, random) {
            if crate::stopped() {
                break;
            }
            let n = (total - at).min(transfer as u64) as usize;
            f.write_all_at(&buf[..n], offset + at)
                .with_context(|| format!("write {p}"))?;
        }
        if fsync {
            f.sync_all()?;
        }
        Ok(())
    }
    fn read_range(
        &self,
        p: &str,
        offset: u64,
        total: u64,
        transfer: usize,
        random: bool,
    ) -> Result<u64> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(self.root.join(p))?;
        let mut buf = vec![0u8; transfer];
        let mut done = 0;
        for at in call_offsets(total, transfer, random) {
            if crate::stopped() {
                break;
            }
            let n = (total - at).min(transfer as u64) as usize;
            done += f
                .read_at(&mut buf[..n], offset + at)
                .with_context(|| format!("read {p}"))? as u64;
        }
        Ok(done)
    }
}

mod dircache {
    use lode_base::Fid;
    use std::collections::HashMap;
    use std::sync::RwLock;

    /// Directory path → FID, so native operations need no path walk.
    #[derive(Default)]
    pub struct DirCache(pub RwLock<HashMap<String, Fid>>);
}

/// The lode client library.
pub struct NativeOps {
    s: Session,
    cred: Cred,
    root: Fid,
    dirs: dircache::DirCache,
}

fn split(p: &str) -> (&str, &str) {
    match p.rfind('/') {
        Some(i) => (&p[..i], &p[i + 1..]),
        None => ("", p),
    }
}

impl NativeOps {
    fn dir(&self, d: &str) -> Result<Fid> {
        if d.is_empty() {
            return Ok(self.root);
        }
        if let Some(f) = self.dirs.0.read().map_err(|_| anyhow!("poisoned"))?.get(d) {
            return Ok(*f);
        }
        let b = self.lookup("lookup", d)?;
        self.dirs
            .0
            .write()
            .map_err(|_| anyhow!("poisoned"))?
            .insert(d.to_string(), b.attr.fid);
        Ok(b.attr.fid)
    }

    /// The MDT body of `p`; an error names `what` was being done.
    fn lookup(&self, what: &str, p: &str) -> Result<lode_client::MdtBody> {
        let (d, n) = split(p);
        let dir = self.dir(d)?;
        self.s
            .run(self.s.client.lookup(&self.cred, dir, n.as_bytes()))
            .map_err(|e| anyhow!("{what} {p}: {e}"))
    }

    fn open(&self, p: &str, flags: i32) -> Result<FileHandle> {
        let (d, n) = split(p);
        let dir = self.dir(d)?;
        let c = &self.s.client;
        if flags & libc::O_CREAT != 0 {
            return self
                .s
                .run(c.create_open(&self.cred, dir, n.as_bytes(), 0o644, flags, None))
                .map_err(|e| anyhow!("create {p}: {e}"));
        }
        let b = self.lookup("lookup", p)?;
        self.s
            .run(c.open(&self.cred, b.attr.fid, flags))
            .map_err(|e| anyhow!("open {p}: {e}"))
    }
}

impl Ops for NativeOps {
    fn mkdir(&self, p: &str) -> Result<()> {
        let (d, n) = split(p);
        let dir = self.dir(d)?;
        let b = self
            .s
            .run(
                self.s
                    .client
                    .mkdir(&self.cred, dir, n.as_bytes(), 0o755, None),
            )
            .map_err(|e| anyhow!("mkdir {p}: {e}"))?;
        self.dirs
            .0
            .write()
            .map_err(|_| anyhow!("poisoned"))?
            .insert(p.to_string(), b.attr.fid);
        Ok(())
    }
    fn rmdir(&self, p: &str) -> Result<()> {
        let (d, n) = split(p);
        let dir = self.dir(d)?;
        self.s
            .run(self.s.client.rmdir(&self.cred, dir, n.as_bytes()))
            .map_err(|e| anyhow!("rmdir {p}: {e}"))?;
        self.dirs
            .0
            .write()
            .map_err(|_| anyhow!("poisoned"))?
            .remove(p);
        Ok(())
    }
    fn create(&self, p: &str, bytes: usize) -> Result<()> {
        let c = &self.s.client;
        if bytes == 0 {
            let (d, n) = split(p);
            let dir = self.dir(d)?;
            self.s
                .run(c.create(&self.cred, dir, n.as_bytes(), 0o644, None))
                .map_err(|e| anyhow!("create {p}: {e}"))?;
            return Ok(());
        }
        let h = self.open(p, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY)?;
        let r = self
            .s
            .run(c.write(&h, 0, &vec![0x5au8; bytes]))
            .map_err(|e| anyhow!("write {p}: {e}"));
        let _ = self.s.run(c.close(&h));
        r.map(|_| ())
    }
    fn stat(&self, p: &str) -> Result<u64> {
        let c = &self.s.client;
        let b = self.lookup("stat", p)?;
        let b = self
            .s
            .run(c.complete(b))
            .map_err(|e| anyhow!("stat {p}: {e}"))?;
        Ok(b.attr.size)
    }
    fn chmod(&self, p: &str, mode: u32) -> Result<()> {
        let c = &self.s.client;
        let b = self.lookup("chmod", p)?;
        let sa = lode_base::SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        self.s
            .run(c.setattr(&self.cred, b.attr.fid, sa))
            .map_err(|e| anyhow!("chmod {p}: {e}"))?;
        Ok(())
    }
    fn read(&self, p: &str, bytes: usize) -> Result<usize> {
        let h = self.open(p, libc::O_RDONLY)?;
        let c = &self.s.client;
        let r = if bytes > 0 {
            self.s.run(c.read(&h, 0, bytes)).map(|d| d.len())
        } else {
            Ok(0)
        };
        let _ = self.s.run(c.close(&h));
        r.map_err(|e| anyhow!("read {p}: {e}"))
    }
    fn unlink(&self, p: &str) -> Result<()> {
        let (d, n) = split(p);
        let dir = self.dir(d)?;
        self.s
            .run(self.s.client.unlink(&self.cred, dir, n.as_bytes()))
            .map_err(|e| anyhow!("unlink {p}: {e}"))
    }
    fn list(&self, p: &str) -> Result<Vec<(String, bool)>> {
        let dir = self.dir(p)?;
        let entries = self
            .s
            .run(self.s.client.readdir_all(&self.cred, dir, false))
            .map_err(|e| anyhow!("readdir {p}: {e}"))?;
        Ok(entries
            .into_iter()
            .filter(|e| e.name != b"." && e.name != b"..")
            .map(|e| {
                (
                    String::from_utf8_lossy(&e.name).into_owned(),
                    e.dtype == libc::DT_DIR,
                )
            })
            .collect())
    }
    fn write_range(
        &self,
        p: &str,
        offset: u64,
        total: u64,
        transfer: usize,
        fsync: bool,
        random: bool,
    ) -> Result<()> {
        let (d, n) = split(p);
        let dir = self.dir(d)?;
        let c = &self.s.client;
        let h = self
            .s
            .run(c.create_open(&self.cred, dir, n.as_bytes(), 0o644, libc::O_RDWR, None))
            .map_err(|e| anyhow!("open {p}: {e}"))?;
        let buf = vec![0xa5u8; transfer];
        let mut r = Ok(());
        for at in call_offsets(total, transfer, random) {
            if crate::stopped() {
                break;
            }
            let k = (total - at).min(transfer as u64) as usize;
            if let Err(e) = self.s.run(c.write(&h, offset + at, &buf[..k])) {
                r = Err(anyhow!("write {p}: {e}"));
                break;
            }
        }
        if r.is_ok() && fsync {
            r = self
                .s
                .run(c.fsync(&h))
                .map_err(|e| anyhow!("fsync {p}: {e}"));
        }
        let _ = self.s.run(c.close(&h));
        r
    }
    fn read_range(
        &self,
        p: &str,
        offset: u64,
        total: u64,
        transfer: usize,
        random: bool,
    ) -> Result<u64> {
        let h = self.open(p, libc::O_RDONLY)?;
        let c = &self.s.client;
        let mut done = 0;
        let mut r = Ok(());
        for at in call_offsets(total, transfer, random) {
            if crate::stopped() {
                break;
            }
            let k = (total - at).min(transfer as u64) as usize;
            match self.s.run(c.read(&h, offset + at, k)) {
                Ok(d) => done += d.len() as u64,
                Err(e) => {
                    r = Err(anyhow!("read {p}: {e}"));
                    break;
                }
            }
        }
        let _ = self.s.run(c.close(&h));
        r.map(|_| done)
    }
}

/// Opens a target; `top` (a fresh directory name) is created and becomes the root of
/// every path. Problems (missing directory, unwritable, server down) fail here, before
/// any work.
pub fn open(t: &Target, top: &str, create_top: bool) -> Result<Arc<dyn Ops>> {
    match t {
        Target::Path(p) => {
            let md = std::fs::metadata(p).map_err(|e| anyhow!("{}: {e}", p.display()))?;
            if !md.is_dir() {
                bail!("{}: not a directory", p.display());
            }
            let root = p.join(top);
            if create_top {
                std::fs::create_dir(&root)
                    .map_err(|e| anyhow!("{}: cannot create {top}: {e}", p.display()))?;
            }
            Ok(Arc::new(PosixOps { root }))
        }
        Target::Native(spec) => {
            let (s, cred) = connect_native(spec)?;
            let root = if create_top {
                s.run(
                    s.client
                        .mkdir(&cred, Fid::ROOT, top.as_bytes(), 0o755, None),
                )
                .map_err(|e| anyhow!("{spec}: cannot create {top}: {e}"))?
            } else {
                s.run(s.client.lookup(&cred, Fid::ROOT, top.as_bytes()))
                    .map_err(|e| anyhow!("{spec}: {top}: {e}"))?
            };
            Ok(Arc::new(NativeOps {
                s,
                cred,
                root: root.attr.fid,
                dirs: dircache::DirCache::default(),
            }))
        }
    }
}

/// Removes the benchmark root `top` and everything below it.
pub fn remove_tree(t: &Target, top: &str) -> Result<()> {
    match t {
        Target::Path(p) => {
            let root = p.join(top);
            if root.exists() {
                std::fs::remove_dir_all(&root)
                    .map_err(|e| anyhow!("cleanup {}: {e}", root.display()))?;
            }
            Ok(())
        }
        Target::Native(spec) => {
            // One client for both: the tree below the root, then the root itself.
            let (s, cred) = connect_native(spec)?;
            let root = match s.run(s.client.lookup(&cred, Fid::ROOT, top.as_bytes())) {
                Ok(b) => b.attr.fid,
                Err(_) => return Ok(()),
            };
            let ops = NativeOps {
                s,
                cred,
                root,
                dirs: dircache::DirCache::default(),
            };
            remove_below(&ops, "")?;
            ops.s
                .run(ops.s.client.rmdir(&ops.cred, Fid::ROOT, top.as_bytes()))
                .map_err(|e| anyhow!("rmdir {top}: {e}"))
        }
    }
}

/// Environment variable carrying `--net-delay-us` to the native client (and workers).
pub const NET_DELAY_ENV: &str = "LODE_BENCH_NET_DELAY_US";
/// Environment variable naming the key file of a keyed file system, for the native
/// client (a mount has its own `key_file` option).
pub const KEY_FILE_ENV: &str = "LODE_KEY_FILE";
/// Environment variable carrying `--max-mod-rpcs-in-flight` to the native client.
pub const MAX_MOD_ENV: &str = "LODE_BENCH_MAX_MOD_RPCS";

/// Connects the lode client library to `MGS_HOST:PORT:/FSNAME`, acting as this
/// process's effective user.
fn connect_native(spec: &str) -> Result<(Session, Cred)> {
    let (mgs, fs) = lode_client::parse_source(spec).map_err(|e| anyhow!(e))?;
    let mut cfg = ClientConfig::new(&mgs, &fs);
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(us) = env(NET_DELAY_ENV) {
        cfg.net_delay = std::time::Duration::from_micros(us);
    }
    if let Ok(f) = std::env::var(KEY_FILE_ENV) {
        cfg.key = lode_base::config::read_key_file(std::path::Path::new(&f))
            .map_err(|e| anyhow!("{KEY_FILE_ENV}: {e}"))?;
    }
    if let Some(m) = env(MAX_MOD_ENV) {
        cfg.max_mod_rpcs_in_flight =
            u16::try_from(m).map_err(|_| anyhow!("max_mod_rpcs_in_flight {m}"))?;
    }
    let s = Session::connect(cfg).map_err(|e| anyhow!("{spec}: {e}"))?;
    // SAFETY: geteuid/getegid cannot fail.
    let cred = Cred {
        uid: unsafe { libc::geteuid() },
        gid: unsafe { libc::getegid() },
        groups: vec![],
    };
    Ok((s, cred))
}

fn remove_below(ops: &dyn Ops, dir: &str) -> Result<()> {
    for (name, is_dir) in ops.list(dir)? {
        let p = if dir.is_empty() {
            name
        } else {
            format!("{dir}/{name}")
        };
        if is_dir {
            remove_below(ops, &p)?;
            ops.rmdir(&p)?;
        } else {
            ops.unlink(&p)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::call_offsets;

    #[test]
    fn random_offsets_cover_every_call_once() {
        let seq = call_offsets(10 * 4096 + 100, 4096, false);
        assert_eq!(seq.len(), 11);
        let mut rnd = call_offsets(10 * 4096 + 100, 4096, true);
        assert_ne!(rnd, seq, "shuffled");
        rnd.sort_unstable();
        assert_eq!(rnd, seq);
    }
}
