//! `lode find`: Lustre's `lfs find` subset for layouts (`-L`, `-S`, `-c`, `-E`,
//! `--component-count`) with `find`'s `-type`, `-name`, `-size`, `-mtime` and
//! `-print0`. Directories are read in parallel; each entry's layout comes from the
//! `lustre.lov` xattr (a directory's: its default for new files).

use crate::lfs::parse_size;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use lode_base::layout::{decode_xattr, EOF};
use lode_base::{Layout, Pattern};
use nix::sys::stat::FileStat;
use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Arguments of `lode find`.
#[derive(Args)]
pub struct FindArgs {
    /// Where to start.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Layout pattern: mdt (Data-on-MDT) or raid0 (OST stripes).
    #[arg(short = 'L', long = "layout")]
    layout: Option<String>,
    /// Stripe size of some component, [+-]SIZE (a DoM component's is its size).
    #[arg(short = 'S', long = "stripe-size", allow_hyphen_values = true)]
    stripe_size: Option<String>,
    /// Stripe count of some component, [+-]N.
    #[arg(short = 'c', long = "stripe-count", allow_hyphen_values = true)]
    stripe_count: Option<String>,
    /// End of some component, [+-]END (-1 or eof: the open end).
    #[arg(short = 'E', long = "component-end", allow_hyphen_values = true)]
    component_end: Option<String>,
    /// Number of components, [+-]N.
    #[arg(long = "component-count", allow_hyphen_values = true)]
    component_count: Option<String>,
    /// Type: f, d or l.
    #[arg(short = 't', long = "type", visible_alias = "type")]
    ftype: Option<String>,
    /// Name matches this shell pattern.
    #[arg(short = 'n', long = "name")]
    name: Option<String>,
    /// Size in bytes, [+-]N[kMGT].
    #[arg(short = 's', long = "size", allow_hyphen_values = true)]
    size: Option<String>,
    /// Modified [+-]N days ago.
    #[arg(short = 'M', long = "mtime", allow_hyphen_values = true)]
    mtime: Option<String>,
    /// End each path with NUL, not a newline.
    #[arg(long = "print0")]
    print0: bool,
    /// Directories read at once.
    #[arg(long, default_value_t = 8)]
    threads: usize,
}

/// `lstat(2)`: the attributes `find` tests, asked without the birth time. (std's
/// metadata asks `statx` for everything, and a lode mount then answers a request of
/// its own for each file whose birth time its kernel has not seen yet.)
fn lstat(p: &Path) -> nix::Result<FileStat> {
    nix::sys::stat::lstat(p)
}

fn is_dir(md: &FileStat) -> bool {
    md.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// `[+-]N`: more than, less than, or exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    Gt(u64),
    Lt(u64),
    Eq(u64),
}

impl Cmp {
    /// `minus_one`: "-1" is a value (every OST, the open end), not "less than 1".
    fn parse(v: &str, minus_one: bool, num: impl Fn(&str) -> Result<u64>) -> Result<Cmp> {
        Ok(match v.as_bytes().first() {
            Some(b'+') => Cmp::Gt(num(&v[1..])?),
            Some(b'-') if !(minus_one && v == "-1") => Cmp::Lt(num(&v[1..])?),
            _ => Cmp::Eq(num(v)?),
        })
    }

    /// [`Cmp::parse`] of an option that may be absent.
    fn parse_opt(
        v: &Option<String>,
        minus_one: bool,
        num: impl Fn(&str) -> Result<u64>,
    ) -> Result<Option<Cmp>> {
        v.as_deref()
            .map(|v| Cmp::parse(v, minus_one, num))
            .transpose()
    }

    fn holds(self, x: u64) -> bool {
        match self {
            Cmp::Gt(n) => x > n,
            Cmp::Lt(n) => x < n,
            Cmp::Eq(n) => x == n,
        }
    }
}

/// What an entry must be to be printed.
struct Filter {
    pattern: Option<bool>,
    stripe_size: Option<Cmp>,
    stripe_count: Option<Cmp>,
    component_end: Option<Cmp>,
    component_count: Option<Cmp>,
    ftype: Option<u32>,
    name: Option<std::ffi::CString>,
    size: Option<Cmp>,
    mtime: Option<Cmp>,
}

impl Filter {
    fn from_args(a: &FindArgs) -> Result<Filter> {
        let count = |v: &str| -> Result<u64> {
            if v == "-1" {
                return Ok(u64::MAX);
            }
            v.parse()
                .map_err(|_| anyhow!("find: {v:?} is not a number"))
        };
        let end = |v: &str| -> Result<u64> {
            match v {
                "-1" | "eof" | "EOF" => Ok(EOF),
                v => parse_size(v),
            }
        };
        Ok(Filter {
            pattern: match a.layout.as_deref() {
                None => None,
                Some("mdt") => Some(true),
                Some("raid0") => Some(false),
                Some(v) => bail!("find: unknown layout {v:?} (mdt or raid0)"),
            },
            stripe_size: Cmp::parse_opt(&a.stripe_size, false, parse_size)?,
            stripe_count: Cmp::parse_opt(&a.stripe_count, true, count)?,
            component_end: Cmp::parse_opt(&a.component_end, true, end)?,
            component_count: Cmp::parse_opt(&a.component_count, false, count)?,
            ftype: match a.ftype.as_deref() {
                None => None,
                Some("f") => Some(libc::S_IFREG),
                Some("d") => Some(libc::S_IFDIR),
                Some("l") => Some(libc::S_IFLNK),
                Some(v) => bail!("find: unknown type {v:?} (f, d or l)"),
            },
            name: a
                .name
                .as_deref()
                .map(|n| std::ffi::CString::new(n).map_err(|_| anyhow!("find: NUL in -name")))
                .transpose()?,
            size: Cmp::parse_opt(&a.size, false, parse_size)?,
            mtime: Cmp::parse_opt(&a.mtime, false, count)?,
        })
    }

    fn wants_layout(&self) -> bool {
        self.pattern.is_some()
            || self.stripe_size.is_some()
            || self.stripe_count.is_some()
            || self.component_end.is_some()
            || self.component_count.is_some()
    }

    /// Whether `l` passes every layout test (some component passing each).
    fn layout_ok(&self, l: &Layout) -> bool {
        let any = |f: &dyn Fn(&lode_base::Component) -> bool| l.components.iter().any(f);
        self.pattern
            .is_none_or(|mdt| any(&|c| (c.pattern == Pattern::Mdt) == mdt))
            && self.stripe_size.is_none_or(|s| {
                any(&|c| match &c.pattern {
                    Pattern::Mdt => s.holds(c.end),
                    Pattern::Raid0 { stripe_size, .. } => s.holds(*stripe_size),
                })
            })
            && self.stripe_count.is_none_or(|s| {
                any(&|c| match &c.pattern {
                    Pattern::Mdt => s.holds(0),
                    Pattern::Raid0 {
                        stripe_count, osts, ..
                    } => s.holds(if !osts.is_empty() {
                        osts.len() as u64
                    } else if *stripe_count < 0 {
                        u64::MAX
                    } else {
                        (*stripe_count).max(1) as u64
                    }),
                })
            })
            && self.component_end.is_none_or(|s| any(&|c| s.holds(c.end)))
            && self
                .component_count
                .is_none_or(|s| s.holds(l.components.len() as u64))
    }

    fn matches(&self, path: &Path, md: &FileStat) -> bool {
        let ft = md.st_mode & libc::S_IFMT;
        if self.ftype.is_some_and(|t| t != ft) {
            return false;
        }
        if let Some(pat) = &self.name {
            let base = path.file_name().map_or(path.as_os_str(), |n| n);
            let Ok(base) = std::ffi::CString::new(base.as_bytes()) else {
                return false;
            };
            // SAFETY: two valid C strings.
            if unsafe { libc::fnmatch(pat.as_ptr(), base.as_ptr(), 0) } != 0 {
                return false;
            }
        }
        if self.size.is_some_and(|s| !s.holds(md.st_size as u64)) {
            return false;
        }
        if let Some(m) = self.mtime {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let days = (now - md.st_mtime).max(0) as u64 / 86_400;
            if !m.holds(days) {
                return false;
            }
        }
        if self.wants_layout() {
            if ft != libc::S_IFREG && ft != libc::S_IFDIR {
                return false;
            }
            let Some(l) = crate::lfs::getxattr(path, "lustre.lov")
                .ok()
                .and_then(|v| decode_xattr(&v))
            else {
                return false;
            };
            return self.layout_ok(&l);
        }
        true
    }
}

/// Locks `m`, whatever a panicking holder left (the queue stays consistent).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The directories waiting to be read, and how many readers are busy.
struct Queue {
    st: Mutex<(VecDeque<PathBuf>, usize)>,
    cv: Condvar,
}

/// Runs `lode find`.
pub fn find(a: FindArgs) -> Result<()> {
    let filter = Filter::from_args(&a)?;
    let out = Mutex::new(std::io::BufWriter::new(std::io::stdout()));
    let end = if a.print0 { b'\0' } else { b'\n' };
    let print = |p: &Path| {
        let mut o = lock(&out);
        let _ = o.write_all(p.as_os_str().as_bytes());
        let _ = o.write_all(&[end]);
    };
    let errors = Mutex::new(0u64);
    let q = Queue {
        st: Mutex::new((VecDeque::new(), 0)),
        cv: Condvar::new(),
    };
    for p in &a.paths {
        let md = lstat(p).map_err(|e| anyhow!("find: {}: {e}", p.display()))?;
        if filter.matches(p, &md) {
            print(p);
        }
        if is_dir(&md) {
            lock(&q.st).0.push_back(p.clone());
        }
    }
    std::thread::scope(|s| {
        for _ in 0..a.threads.clamp(1, 64) {
            s.spawn(|| loop {
                let dir = {
                    let mut st = lock(&q.st);
                    loop {
                        if let Some(d) = st.0.pop_front() {
                            st.1 += 1;
                            break d;
                        }
                        if st.1 == 0 {
                            q.cv.notify_all();
                            return;
                        }
                        st =
                            q.cv.wait(st)
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                    }
                };
                match std::fs::read_dir(&dir) {
                    Ok(rd) => {
                        for e in rd.flatten() {
                            let p = e.path();
                            let Ok(md) = lstat(&p) else {
                                continue;
                            };
                            if filter.matches(&p, &md) {
                                print(&p);
                            }
                            if is_dir(&md) {
                                lock(&q.st).0.push_back(p);
                                q.cv.notify_one();
                            }
                        }
                    }
                    Err(e) => {
                        eprintln!("find: {}: {e}", dir.display());
                        *lock(&errors) += 1;
                    }
                }
                lock(&q.st).1 -= 1;
                q.cv.notify_all();
            });
        }
    });
    let _ = lock(&out).flush();
    if *lock(&errors) > 0 {
        bail!("find: some directories could not be read");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_read_like_lfs_find() {
        let n = |v: &str| -> Result<u64> { Ok(v.parse()?) };
        assert_eq!(Cmp::parse("+5", false, n).unwrap(), Cmp::Gt(5));
        assert_eq!(Cmp::parse("-5", false, n).unwrap(), Cmp::Lt(5));
        assert_eq!(Cmp::parse("5", false, n).unwrap(), Cmp::Eq(5));
        assert_eq!(Cmp::parse("-1", false, n).unwrap(), Cmp::Lt(1));
        assert!(Cmp::parse("-180K", false, parse_size)
            .unwrap()
            .holds(128 << 10));
        assert!(!Cmp::parse("-180K", false, parse_size)
            .unwrap()
            .holds(1 << 20));
    }
}
