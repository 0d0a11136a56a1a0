//! The metadata benchmark: file create, stat and remove phases (mdtest's "easy" mode:
//! each thread in its own directory), timed from the first start to the last finish.

use crate::stats::Latencies;
use anyhow::{bail, Context, Result};
use lode_base::{Cred, Fid};
use lode_client::{ClientConfig, Session};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

/// Where the benchmark runs.
#[derive(Clone, Debug)]
pub enum Target {
    /// Plain POSIX calls under a directory.
    Path(PathBuf),
    /// The lode client library: `MGS_HOST:PORT:/FSNAME`.
    Native(String),
}

/// Options of `lode bench md`.
#[derive(Clone, Debug)]
pub struct MdOptions {
    /// Target.
    pub target: Target,
    /// Items per thread.
    pub items: usize,
    /// Threads.
    pub threads: usize,
}

/// One phase's result.
#[derive(Clone, Debug)]
pub struct PhaseResult {
    /// Phase name (mdtest's).
    pub name: &'static str,
    /// Operations done.
    pub ops: usize,
    /// Operations per second, first start to last finish.
    pub rate: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// Largest latency, µs.
    pub max_us: f64,
}

trait Ops: Send + Sync {
    fn mkdir(&self, dir: &str) -> Result<()>;
    fn create(&self, dir: &str, name: &str) -> Result<()>;
    fn stat(&self, dir: &str, name: &str) -> Result<()>;
    fn remove(&self, dir: &str, name: &str) -> Result<()>;
    fn rmdir(&self, dir: &str) -> Result<()>;
    /// Removes the benchmark's top directory.
    fn finish(&self) -> Result<()>;
}

struct PosixOps(PathBuf);

fn cpath(p: &Path) -> Result<CString> {
    Ok(CString::new(p.as_os_str().as_bytes())?)
}

fn check(r: libc::c_int, what: &str, p: &Path) -> Result<()> {
    if r < 0 {
        bail!(
            "{what} {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

impl Ops for PosixOps {
    fn mkdir(&self, dir: &str) -> Result<()> {
        std::fs::create_dir(self.0.join(dir)).with_context(|| format!("mkdir {dir}"))
    }
    fn create(&self, dir: &str, name: &str) -> Result<()> {
        let p = self.0.join(dir).join(name);
        let c = cpath(&p)?;
        // SAFETY: c is a valid NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                0o644,
            )
        };
        check(fd, "create", &p)?;
        // SAFETY: fd was just returned by open.
        unsafe { libc::close(fd) };
        Ok(())
    }
    fn stat(&self, dir: &str, name: &str) -> Result<()> {
        let p = self.0.join(dir).join(name);
        let c = cpath(&p)?;
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: valid path and a buffer of the right type.
        check(
            unsafe { libc::stat(c.as_ptr(), st.as_mut_ptr()) },
            "stat",
            &p,
        )
    }
    fn remove(&self, dir: &str, name: &str) -> Result<()> {
        let p = self.0.join(dir).join(name);
        let c = cpath(&p)?;
        // SAFETY: valid path.
        check(unsafe { libc::unlink(c.as_ptr()) }, "unlink", &p)
    }
    fn rmdir(&self, dir: &str) -> Result<()> {
        std::fs::remove_dir(self.0.join(dir)).with_context(|| format!("rmdir {dir}"))
    }
    fn finish(&self) -> Result<()> {
        std::fs::remove_dir(&self.0).with_context(|| format!("rmdir {}", self.0.display()))
    }
}

struct NativeOps {
    s: Session,
    cred: Cred,
    base: Fid,
    top: Vec<u8>,
    dirs: Mutex<std::collections::HashMap<String, Fid>>,
}

impl NativeOps {
    fn dir(&self, d: &str) -> Result<Fid> {
        self.dirs
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .get(d)
            .copied()
            .context("unknown dir")
    }
}

impl Ops for NativeOps {
    fn mkdir(&self, dir: &str) -> Result<()> {
        let b =
            self.s.run(
                self.s
                    .client
                    .mkdir(&self.cred, self.base, dir.as_bytes(), 0o755, None),
            )?;
        self.dirs
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .insert(dir.to_string(), b.attr.fid);
        Ok(())
    }
    fn create(&self, dir: &str, name: &str) -> Result<()> {
        let d = self.dir(dir)?;
        self.s.run(
            self.s
                .client
                .create(&self.cred, d, name.as_bytes(), 0o644, None),
        )?;
        Ok(())
    }
    fn stat(&self, dir: &str, name: &str) -> Result<()> {
        let d = self.dir(dir)?;
        let b = self
            .s
            .run(self.s.client.lookup(&self.cred, d, name.as_bytes()))?;
        self.s.run(self.s.client.complete(b))?;
        Ok(())
    }
    fn remove(&self, dir: &str, name: &str) -> Result<()> {
        let d = self.dir(dir)?;
        self.s
            .run(self.s.client.unlink(&self.cred, d, name.as_bytes()))?;
        Ok(())
    }
    fn rmdir(&self, dir: &str) -> Result<()> {
        self.s
            .run(self.s.client.rmdir(&self.cred, self.base, dir.as_bytes()))?;
        Ok(())
    }
    fn finish(&self) -> Result<()> {
        self.s
            .run(self.s.client.rmdir(&self.cred, Fid::ROOT, &self.top))?;
        Ok(())
    }
}

/// Parses `HOST:PORT:/FSNAME`.
pub fn parse_native(spec: &str) -> Result<(String, String)> {
    lode_client::parse_source(spec).map_err(|e| anyhow::anyhow!(e))
}

fn ops_for(t: &Target, top: &str) -> Result<Arc<dyn Ops>> {
    Ok(match t {
        Target::Path(p) => {
            let md = std::fs::metadata(p).with_context(|| format!("{}", p.display()))?;
            if !md.is_dir() {
                bail!("{}: not a directory", p.display());
            }
            std::fs::create_dir(p.join(top))
                .with_context(|| format!("{}: cannot create the bench directory", p.display()))?;
            Arc::new(PosixOps(p.join(top)))
        }
        Target::Native(spec) => {
            let (mgs, fs) = parse_native(spec)?;
            let s = Session::connect(ClientConfig::new(&mgs, &fs))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            // SAFETY: geteuid/getegid cannot fail.
            let cred = Cred {
                uid: unsafe { libc::geteuid() },
                gid: unsafe { libc::getegid() },
                groups: vec![],
            };
            let b = s.run(
                s.client
                    .mkdir(&cred, Fid::ROOT, top.as_bytes(), 0o755, None),
            )?;
            Arc::new(NativeOps {
                s,
                cred,
                base: b.attr.fid,
                top: top.as_bytes().to_vec(),
                dirs: Mutex::new(Default::default()),
            })
        }
    })
}

/// One operation of a phase: (ops, directory, name).
type Phase = fn(&dyn Ops, &str, &str) -> Result<()>;

fn run_phase(
    name: &'static str,
    ops: &Arc<dyn Ops>,
    threads: usize,
    items: usize,
    f: Phase,
) -> Result<PhaseResult> {
    let barrier = Arc::new(Barrier::new(threads));
    let start = Arc::new(Mutex::new(None::<Instant>));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let ops = ops.clone();
            let barrier = barrier.clone();
            let start = start.clone();
            std::thread::spawn(move || -> Result<(Latencies, Instant)> {
                let dir = format!("t{t}");
                let mut lat = Latencies(Vec::with_capacity(items));
                barrier.wait();
                let t0 = Instant::now();
                if let Ok(mut s) = start.lock() {
                    if s.is_none_or(|x| t0 < x) {
                        *s = Some(t0);
                    }
                }
                for i in 0..items {
                    let a = Instant::now();
                    f(&*ops, &dir, &format!("f{i}"))
                        .with_context(|| format!("{name}: after {i} operations"))?;
                    lat.0.push(a.elapsed().as_nanos() as u64);
                }
                Ok((lat, Instant::now()))
            })
        })
        .collect();
    let mut all = Latencies::default();
    let mut end = None::<Instant>;
    for h in handles {
        let (lat, fin) = h
            .join()
            .map_err(|_| anyhow::anyhow!("{name}: a worker panicked"))??;
        all.0.extend(lat.0);
        end = Some(end.map_or(fin, |e: Instant| e.max(fin)));
    }
    let begin = start
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .unwrap_or_else(Instant::now);
    let secs = end
        .map_or(0.0, |e| e.duration_since(begin).as_secs_f64())
        .max(1e-9);
    let ops_n = threads * items;
    Ok(PhaseResult {
        name,
        ops: ops_n,
        rate: ops_n as f64 / secs,
        p50_us: all.quantile(0.5) as f64 / 1e3,
        p99_us: all.quantile(0.99) as f64 / 1e3,
        max_us: all.max() as f64 / 1e3,
    })
}

/// Runs the file phases and removes what it made.
pub fn run(o: &MdOptions) -> Result<Vec<PhaseResult>> {
    if o.items == 0 || o.threads == 0 {
        bail!("--items and --threads must be at least 1");
    }
    let top = format!("lode-bench.{}", std::process::id());
    let ops = ops_for(&o.target, &top)?;
    for t in 0..o.threads {
        ops.mkdir(&format!("t{t}"))?;
    }
    let phases: [(&'static str, Phase); 3] = [
        ("File creation", |o, d, n| o.create(d, n)),
        ("File stat", |o, d, n| o.stat(d, n)),
        ("File removal", |o, d, n| o.remove(d, n)),
    ];
    let mut out = Vec::with_capacity(phases.len());
    for (name, f) in phases {
        out.push(run_phase(name, &ops, o.threads, o.items, f)?);
    }
    for t in 0..o.threads {
        ops.rmdir(&format!("t{t}"))?;
    }
    ops.finish()?;
    Ok(out)
}
