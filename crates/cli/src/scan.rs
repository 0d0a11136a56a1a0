//! `lode scan`: incremental tree scans (seed 004's "dir-mtime incremental scans").
//!
//! A scan records, for every directory under a path, its inode number, mtime and
//! ctime and the names in it. The next scan stats every directory but reads again
//! only those whose record no longer matches (a create, unlink or rename in a
//! directory moves its mtime), and prints what was created (`+ path`) and removed
//! (`- path`) since. Stat first, read after: a change made while a directory is
//! read leaves a newer mtime than the one recorded, so the next scan reads it again.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `lode scan`.
#[derive(Args)]
pub struct ScanArgs {
    /// The scan's record: read if it exists, written when the scan ends.
    #[arg(long)]
    db: PathBuf,
    /// Read every directory, whatever the record says (the output is the same; this
    /// is the full walk an incremental scan is measured against).
    #[arg(long)]
    full: bool,
    /// Only the summary, no `+`/`-` lines.
    #[arg(short, long)]
    quiet: bool,
    /// The directory to scan.
    path: PathBuf,
}

/// Bumped when the record's shape changes.
const DB_VERSION: u32 = 2;

/// The record of one scan.
#[derive(Serialize, Deserialize)]
struct Db {
    version: u32,
    /// The path scanned, as given.
    root: Vec<u8>,
    /// Directories by path relative to the root (the root is empty).
    dirs: HashMap<Vec<u8>, DirRec>,
}

/// One directory as the scan saw it.
#[derive(Clone, Serialize, Deserialize)]
struct DirRec {
    ino: u64,
    mtime_ns: i64,
    ctime_ns: i64,
    /// Its subdirectories' names (walked into whether or not it changed).
    subdirs: Vec<Vec<u8>>,
    /// Every name, sorted, packed (see [`pack`]): read back only for a directory that
    /// changed, so loading a large record costs no allocation per entry.
    #[serde(with = "serde_bytes")]
    names: Vec<u8>,
    /// How many names `names` holds.
    count: u64,
}

/// Names and whether each is a directory, as one buffer: per entry a flag byte, a
/// two-byte length and the name.
fn pack(entries: &[(Vec<u8>, bool)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(entries.iter().map(|(n, _)| n.len() + 3).sum());
    for (n, d) in entries {
        b.push(u8::from(*d));
        b.extend_from_slice(&(n.len() as u16).to_le_bytes());
        b.extend_from_slice(n);
    }
    b
}

/// The entries [`pack`] packed; a damaged buffer ends the list where it goes wrong.
fn unpack(b: &[u8]) -> Vec<(Vec<u8>, bool)> {
    let mut v = Vec::new();
    let mut i = 0;
    while i + 3 <= b.len() {
        let len = u16::from_le_bytes([b[i + 1], b[i + 2]]) as usize;
        let Some(name) = b.get(i + 3..i + 3 + len) else {
            break;
        };
        v.push((name.to_vec(), b[i] == 1));
        i += 3 + len;
    }
    v
}

impl DirRec {
    fn same_as(&self, m: &std::fs::Metadata) -> bool {
        self.ino == m.ino() && self.mtime_ns == mtime_ns(m) && self.ctime_ns == ctime_ns(m)
    }
}

fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec()
}

fn ctime_ns(m: &std::fs::Metadata) -> i64 {
    m.ctime().saturating_mul(1_000_000_000) + m.ctime_nsec()
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    if rel.is_empty() {
        return name.to_vec();
    }
    let mut p = rel.to_vec();
    p.push(b'/');
    p.extend_from_slice(name);
    p
}

/// What a scan found, in the order found.
#[derive(Default)]
struct Changes {
    created: Vec<Vec<u8>>,
    removed: Vec<Vec<u8>>,
    dirs: u64,
    dirs_read: u64,
    entries: u64,
}

fn load(db: &Path, root: &Path) -> Result<Option<Db>> {
    let bytes = match std::fs::read(db) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", db.display())),
    };
    let d: Db = postcard::from_bytes(&bytes).map_err(|e| {
        anyhow!(
            "{} is not a lode scan record ({e}); remove it to start again",
            db.display()
        )
    })?;
    if d.version != DB_VERSION {
        bail!(
            "{} is a scan record of version {}, this lode writes {DB_VERSION}; remove it to start again",
            db.display(),
            d.version
        );
    }
    if d.root != root.as_os_str().as_bytes() {
        bail!(
            "{} records a scan of {}, not {}",
            db.display(),
            String::from_utf8_lossy(&d.root),
            root.display()
        );
    }
    Ok(Some(d))
}

fn save(db: &Path, d: &Db) -> Result<()> {
    let bytes = postcard::to_stdvec(d).context("encoding the scan record")?;
    let mut tmp = db.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(&bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, db).with_context(|| format!("replacing {}", db.display()))
}

/// Every path recorded under directory `rel` (not `rel` itself), for a directory gone.
fn recorded_below(old: &HashMap<Vec<u8>, DirRec>, rel: &[u8], out: &mut Vec<Vec<u8>>) {
    let Some(d) = old.get(rel) else { return };
    for (name, is_dir) in unpack(&d.names) {
        let p = join(rel, &name);
        if is_dir {
            recorded_below(old, &p, out);
        }
        out.push(p);
    }
}

/// Reads a directory's names, sorted.
fn read_entries(path: &Path) -> std::io::Result<Vec<(Vec<u8>, bool)>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(path)? {
        let e = e?;
        let is_dir = e.file_type()?.is_dir();
        v.push((e.file_name().into_vec(), is_dir));
    }
    v.sort();
    Ok(v)
}

/// Walks `root`, reading only the directories whose record no longer matches.
fn scan(
    root: &Path,
    old: Option<&HashMap<Vec<u8>, DirRec>>,
    full: bool,
) -> Result<(HashMap<Vec<u8>, DirRec>, Changes)> {
    let empty = HashMap::new();
    let first = old.is_none();
    let old = old.unwrap_or(&empty);
    let mut now = HashMap::new();
    let mut ch = Changes::default();
    let mut stack = vec![Vec::new()];
    while let Some(rel) = stack.pop() {
        let path = root.join(std::ffi::OsStr::from_bytes(&rel));
        let m = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => m,
            // Gone (or replaced) since its parent was read: its parent's next scan
            // sees it.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("stat {}", path.display())),
        };
        ch.dirs += 1;
        let before = old.get(&rel);
        let rec = match before {
            Some(b) if !full && b.same_as(&m) => b.clone(),
            _ => {
                ch.dirs_read += 1;
                let entries = match read_entries(&path) {
                    Ok(v) => v,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
                };
                if !first {
                    diff(old, &rel, before, &entries, &mut ch);
                }
                DirRec {
                    ino: m.ino(),
                    mtime_ns: mtime_ns(&m),
                    ctime_ns: ctime_ns(&m),
                    subdirs: entries
                        .iter()
                        .filter(|(_, d)| *d)
                        .map(|(n, _)| n.clone())
                        .collect(),
                    names: pack(&entries),
                    count: entries.len() as u64,
                }
            }
        };
        ch.entries += rec.count;
        for name in &rec.subdirs {
            stack.push(join(&rel, name));
        }
        now.insert(rel, rec);
    }
    Ok((now, ch))
}

/// What changed in directory `rel` between its record and `now`: names created and
/// removed (a directory removed takes everything recorded below it along).
fn diff(
    old: &HashMap<Vec<u8>, DirRec>,
    rel: &[u8],
    before: Option<&DirRec>,
    now: &[(Vec<u8>, bool)],
    ch: &mut Changes,
) {
    let before = before.map(|b| unpack(&b.names)).unwrap_or_default();
    let was: BTreeMap<&[u8], bool> = before.iter().map(|(n, d)| (&n[..], *d)).collect();
    let is: BTreeMap<&[u8], bool> = now.iter().map(|(n, d)| (&n[..], *d)).collect();
    for (name, d) in &was {
        if is.get(name) != Some(d) {
            let p = join(rel, name);
            if *d {
                recorded_below(old, &p, &mut ch.removed);
            }
            ch.removed.push(p);
        }
    }
    for (name, d) in &is {
        if was.get(name) != Some(d) {
            // A new directory's own entries are printed when it is read (it has no
            // record, so it is read).
            ch.created.push(join(rel, name));
        }
    }
}

/// `lode scan`.
pub fn run(a: ScanArgs) -> Result<()> {
    let start = Instant::now();
    let old = load(&a.db, &a.path)?;
    let (dirs, ch) = scan(&a.path, old.as_ref().map(|d| &d.dirs), a.full)?;
    let took = start.elapsed();
    if !a.quiet {
        let out = std::io::stdout();
        let mut out = std::io::BufWriter::new(out.lock());
        for (sign, paths) in [("-", &ch.removed), ("+", &ch.created)] {
            for p in paths {
                out.write_all(sign.as_bytes())?;
                out.write_all(b" ")?;
                out.write_all(p)?;
                out.write_all(b"\n")?;
            }
        }
        out.flush()?;
    }
    save(
        &a.db,
        &Db {
            version: DB_VERSION,
            root: a.path.as_os_str().as_bytes().to_vec(),
            dirs,
        },
    )?;
    eprintln!(
        "scan of {}: {} directories ({} read), {} entries, {} created, {} removed{} in {:.3} s",
        a.path.display(),
        ch.dirs,
        ch.dirs_read,
        ch.entries,
        ch.created.len(),
        ch.removed.len(),
        if old.is_none() { " (first scan)" } else { "" },
        took.as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_names_come_back_and_a_damaged_buffer_stops_short() {
        let e = vec![
            (b"a".to_vec(), false),
            (b"dir".to_vec(), true),
            (vec![0xff; 255], false),
        ];
        let b = pack(&e);
        assert_eq!(unpack(&b), e);
        assert_eq!(unpack(&b[..b.len() - 1]), e[..2].to_vec());
        assert!(unpack(&[]).is_empty());
    }
}
