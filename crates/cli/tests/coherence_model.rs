//! Coherence against a model: two FUSE mounts and one native client of the same cluster
//! take turns, one call at a time, making random changes to one small tree and reading
//! it back, for about a minute. Every call's result (value or errno) must be what an
//! in-memory model of the tree predicts, which proves that after any change by one
//! client returns, every other client sees it on its next call: no stale name, mode,
//! size, link count, content, directory listing or xattr, in the kernel's caches or
//! the client's.
//!
//! The seed is printed at the start; `LODE_SEED=<seed>` replays the same sequence.

mod common;

use common::*;
use lode_base::{Errno, SetAttr};
use lode_client::Session;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long operations are issued.
const RUN_FOR: Duration = Duration::from_secs(60);
/// Calls shown in a failure message (the last ones, and earlier ones on its paths).
const HISTORY: usize = 20;
/// Directories operations happen in, relative to the test directory ("" is itself).
const DIRS: [&str; 4] = ["", "d0", "d1", "d2"];
/// Names in the test directory: the three subdirectories' names and five more.
const TOP_NAMES: [&str; 8] = ["d0", "d1", "d2", "a", "b", "c", "e", "f"];
/// Names in the other directories.
const SUB_NAMES: [&str; 8] = ["a", "b", "c", "e", "f", "g", "h", "k"];
const MODES: [u32; 4] = [0o600, 0o640, 0o644, 0o755];
const XATTR: &str = "user.k";

/// 0 to `max` random lowercase letters.
fn random_bytes(rng: &mut Prng, max: u64) -> Bytes {
    let n = rng.below(max + 1);
    Bytes(rng.letters(n))
}

#[derive(Clone, Copy, Debug)]
enum WriteKind {
    /// Open with O_TRUNC and write the bytes.
    Overwrite,
    /// Write the bytes at this offset (zeros fill any gap).
    At(u64),
    /// Open with O_APPEND and write the bytes.
    Append,
}

/// One call; paths are relative to the test directory.
#[derive(Clone, Debug)]
enum Op {
    Create(String, Bytes),
    Write(String, WriteKind, Bytes),
    Truncate(String, u64),
    Chmod(String, Mode),
    Unlink(String),
    Mkdir(String),
    Rmdir(String),
    Rename(String, String),
    Link(String, String),
    SetXattr(String, Bytes),
    RemoveXattr(String),
    Stat(String),
    Read(String),
    Readdir(String),
    GetXattr(String),
}

impl Op {
    /// The paths it names.
    fn paths(&self) -> Vec<&str> {
        match self {
            Op::Rename(a, b) | Op::Link(a, b) => vec![a, b],
            Op::Create(p, _)
            | Op::Write(p, ..)
            | Op::Truncate(p, _)
            | Op::Chmod(p, _)
            | Op::Unlink(p)
            | Op::Mkdir(p)
            | Op::Rmdir(p)
            | Op::SetXattr(p, _)
            | Op::RemoveXattr(p)
            | Op::Stat(p)
            | Op::Read(p)
            | Op::Readdir(p)
            | Op::GetXattr(p) => vec![p],
        }
    }

    fn is_read(&self) -> bool {
        matches!(
            self,
            Op::Stat(_) | Op::Read(_) | Op::Readdir(_) | Op::GetXattr(_)
        )
    }
}

/// What a call returned when it succeeded.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Val {
    Done,
    /// Directory or not, mode & 0o7777, size (files only), nlink.
    Stat {
        dir: bool,
        mode: Mode,
        size: Option<u64>,
        nlink: u64,
    },
    Data(Bytes),
    Names(Vec<String>),
}

/// A call's value or errno.
type Outcome = Result<Val, i32>;

#[derive(Clone, Debug)]
enum Kind {
    File(Vec<u8>),
    Dir(BTreeMap<String, usize>),
}

#[derive(Clone, Debug)]
struct Inode {
    kind: Kind,
    mode: u32,
    xattr: Option<Vec<u8>>,
}

/// The tree as it must be: inodes by number, 0 the test directory. Link counts are
/// counted from the directory entries.
struct Model {
    nodes: HashMap<usize, Inode>,
    next: usize,
}

/// The errnos that apply to a call: one of them is the answer.
type Errs = BTreeSet<i32>;

fn err(e: i32) -> Errs {
    BTreeSet::from([e])
}

fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

impl Model {
    fn new() -> Model {
        let top = Inode {
            kind: Kind::Dir(BTreeMap::new()),
            mode: 0o755,
            xattr: None,
        };
        Model {
            nodes: HashMap::from([(0, top)]),
            next: 1,
        }
    }

    fn children(&self, ino: usize) -> Option<&BTreeMap<String, usize>> {
        match &self.nodes[&ino].kind {
            Kind::Dir(c) => Some(c),
            Kind::File(_) => None,
        }
    }

    fn children_mut(&mut self, ino: usize) -> &mut BTreeMap<String, usize> {
        match &mut self.nodes.get_mut(&ino).expect("inode").kind {
            Kind::Dir(c) => c,
            Kind::File(_) => panic!("model: {ino} is not a directory"),
        }
    }

    fn is_dir(&self, ino: usize) -> bool {
        self.children(ino).is_some()
    }

    /// The inode at `path`: `Ok(None)` if only the last name is missing.
    fn lookup(&self, path: &str) -> Result<Option<usize>, i32> {
        let mut cur = 0;
        let mut parts = path.split('/').filter(|p| !p.is_empty()).peekable();
        while let Some(name) = parts.next() {
            let Some(children) = self.children(cur) else {
                return Err(libc::ENOTDIR);
            };
            match children.get(name) {
                Some(&i) => cur = i,
                None if parts.peek().is_none() => return Ok(None),
                None => return Err(libc::ENOENT),
            }
        }
        Ok(Some(cur))
    }

    /// The inode at `path`, or the errno of resolving it.
    fn existing(&self, path: &str) -> Result<usize, i32> {
        self.lookup(path)?.ok_or(libc::ENOENT)
    }

    /// The directory `path` is in, and the last name.
    fn parent<'p>(&self, path: &'p str) -> Result<(usize, &'p str), i32> {
        let (dir, name) = split(path);
        let d = self.existing(dir)?;
        if self.is_dir(d) {
            Ok((d, name))
        } else {
            Err(libc::ENOTDIR)
        }
    }

    /// True if `dir` is `anc` or lies below it.
    fn is_under(&self, dir: usize, anc: usize) -> bool {
        dir == anc
            || self
                .children(anc)
                .is_some_and(|c| c.values().any(|&i| self.is_under(dir, i)))
    }

    fn nlink(&self, ino: usize) -> u64 {
        match &self.nodes[&ino].kind {
            Kind::Dir(c) => 2 + c.values().filter(|&&i| self.is_dir(i)).count() as u64,
            Kind::File(_) => {
                let refs = |c: &BTreeMap<String, usize>| c.values().filter(|&&i| i == ino).count();
                self.nodes
                    .values()
                    .filter_map(|n| match &n.kind {
                        Kind::Dir(c) => Some(refs(c) as u64),
                        Kind::File(_) => None,
                    })
                    .sum()
            }
        }
    }

    fn add(&mut self, kind: Kind, mode: u32) -> usize {
        let ino = self.next;
        self.next += 1;
        let node = Inode {
            kind,
            mode,
            xattr: None,
        };
        self.nodes.insert(ino, node);
        ino
    }

    /// An existing regular file's content.
    fn file(&mut self, path: &str) -> Result<&mut Vec<u8>, Errs> {
        let ino = self.existing(path).map_err(err)?;
        match &mut self.nodes.get_mut(&ino).expect("inode").kind {
            Kind::File(data) => Ok(data),
            Kind::Dir(_) => Err(err(libc::EISDIR)),
        }
    }

    /// Runs `op` on the model: its value, or every errno that applies (nothing
    /// changes then).
    fn apply(&mut self, op: &Op) -> Result<Val, Errs> {
        match op {
            Op::Create(p, data) => {
                let (d, name) = self.parent(p).map_err(err)?;
                if self.children(d).expect("dir").contains_key(name) {
                    return Err(err(libc::EEXIST));
                }
                let ino = self.add(Kind::File(data.0.clone()), 0o644);
                self.children_mut(d).insert(name.into(), ino);
            }
            Op::Write(p, how, bytes) => {
                let data = self.file(p)?;
                let off = match how {
                    WriteKind::Overwrite => {
                        data.clear();
                        0
                    }
                    WriteKind::At(off) => *off as usize,
                    WriteKind::Append => data.len(),
                };
                let end = off + bytes.0.len();
                // Writing nothing past the end does not extend the file.
                if data.len() < end && !bytes.0.is_empty() {
                    data.resize(end, 0);
                }
                if !bytes.0.is_empty() {
                    data[off..end].copy_from_slice(&bytes.0);
                }
            }
            Op::Truncate(p, len) => self.file(p)?.resize(*len as usize, 0),
            Op::Chmod(p, mode) => {
                let ino = self.existing(p).map_err(err)?;
                self.nodes.get_mut(&ino).expect("inode").mode = mode.0;
            }
            Op::Unlink(p) | Op::Rmdir(p) => {
                let rmdir = matches!(op, Op::Rmdir(_));
                let (d, name) = self.parent(p).map_err(err)?;
                let ino = *self
                    .children(d)
                    .expect("dir")
                    .get(name)
                    .ok_or(err(libc::ENOENT))?;
                match (rmdir, self.children(ino)) {
                    (false, Some(_)) => return Err(err(libc::EISDIR)),
                    (true, None) => return Err(err(libc::ENOTDIR)),
                    (true, Some(c)) if !c.is_empty() => return Err(err(libc::ENOTEMPTY)),
                    _ => {}
                }
                self.children_mut(d).remove(name);
            }
            Op::Mkdir(p) => {
                let (d, name) = self.parent(p).map_err(err)?;
                if self.children(d).expect("dir").contains_key(name) {
                    return Err(err(libc::EEXIST));
                }
                let ino = self.add(Kind::Dir(BTreeMap::new()), 0o755);
                self.children_mut(d).insert(name.into(), ino);
            }
            Op::Rename(from, to) => return self.rename(from, to),
            Op::Link(from, to) => {
                let mut errs = Errs::new();
                let src = self.existing(from).map_err(|e| errs.insert(e)).ok();
                let dst = self.parent(to).map_err(|e| errs.insert(e)).ok();
                if src.is_some_and(|s| self.is_dir(s)) {
                    errs.insert(libc::EPERM);
                }
                if let Some((d, name)) = dst {
                    if self.children(d).expect("dir").contains_key(name) {
                        errs.insert(libc::EEXIST);
                    }
                }
                match (src, dst) {
                    (Some(s), Some((d, name))) if errs.is_empty() => {
                        self.children_mut(d).insert(name.into(), s);
                    }
                    _ => return Err(errs),
                }
            }
            Op::SetXattr(p, v) => {
                let ino = self.existing(p).map_err(err)?;
                self.nodes.get_mut(&ino).expect("inode").xattr = Some(v.0.clone());
            }
            Op::RemoveXattr(p) => {
                let ino = self.existing(p).map_err(err)?;
                let node = self.nodes.get_mut(&ino).expect("inode");
                if node.xattr.take().is_none() {
                    return Err(err(libc::ENODATA));
                }
            }
            Op::Stat(p) => {
                let ino = self.existing(p).map_err(err)?;
                let n = &self.nodes[&ino];
                return Ok(Val::Stat {
                    dir: self.is_dir(ino),
                    mode: Mode(n.mode),
                    size: match &n.kind {
                        Kind::File(data) => Some(data.len() as u64),
                        Kind::Dir(_) => None,
                    },
                    nlink: self.nlink(ino),
                });
            }
            Op::Read(p) => return Ok(Val::Data(Bytes(self.file(p)?.clone()))),
            Op::Readdir(p) => {
                let ino = self.existing(p).map_err(err)?;
                let c = self.children(ino).ok_or(err(libc::ENOTDIR))?;
                return Ok(Val::Names(c.keys().cloned().collect()));
            }
            Op::GetXattr(p) => {
                let ino = self.existing(p).map_err(err)?;
                let v = self.nodes[&ino].xattr.clone();
                return v.map(|v| Val::Data(Bytes(v))).ok_or(err(libc::ENODATA));
            }
        }
        Ok(Val::Done)
    }

    /// rename(2) without flags.
    fn rename(&mut self, from: &str, to: &str) -> Result<Val, Errs> {
        let mut errs = Errs::new();
        let sp = self.parent(from).map_err(|e| errs.insert(e)).ok();
        let dp = self.parent(to).map_err(|e| errs.insert(e)).ok();
        let src = sp.and_then(|(d, n)| self.children(d).expect("dir").get(n).copied());
        if sp.is_some() && src.is_none() {
            errs.insert(libc::ENOENT);
        }
        let (Some((sd, sname)), Some((dd, dname)), Some(s)) = (sp, dp, src) else {
            return Err(errs);
        };
        let dst = self.children(dd).expect("dir").get(dname).copied();
        if dst == Some(s) {
            // Two names of one inode (or one name): nothing to do.
            return Ok(Val::Done);
        }
        let s_dir = self.is_dir(s);
        if s_dir && self.is_under(dd, s) {
            errs.insert(libc::EINVAL);
        }
        if let Some(d) = dst {
            let d_dir = self.is_dir(d);
            if s_dir && !d_dir {
                errs.insert(libc::ENOTDIR);
            }
            if !s_dir && d_dir {
                errs.insert(libc::EISDIR);
            }
            // Not empty, or the source lies in it (Linux checks that first).
            if self.children(d).is_some_and(|c| !c.is_empty()) {
                errs.insert(libc::ENOTEMPTY);
            }
        }
        if !errs.is_empty() {
            return Err(errs);
        }
        self.children_mut(sd).remove(sname);
        self.children_mut(dd).insert(dname.into(), s);
        Ok(Val::Done)
    }
}

/// The three clients.
const CLIENTS: [&str; 3] = ["mount A", "mount B", "native"];

/// The absolute path of `rel` under the test directory, for the native client.
fn native_path(rel: &str) -> String {
    if rel.is_empty() {
        "/t".into()
    } else {
        format!("/t/{rel}")
    }
}

fn io_errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn libc_result(r: isize) -> Result<usize, i32> {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1))
    } else {
        Ok(r as usize)
    }
}

/// Runs `op` through a mount whose test directory is `top`.
fn on_mount(top: &Path, op: &Op) -> Outcome {
    let p = |rel: &str| top.join(rel);
    let done = |r: std::io::Result<()>| r.map(|()| Val::Done).map_err(io_errno);
    match op {
        Op::Create(f, data) => done(
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(p(f))
                .and_then(|mut h| h.write_all(&data.0)),
        ),
        Op::Write(f, how, data) => {
            let mut o = fs::OpenOptions::new();
            match how {
                WriteKind::Overwrite => o.write(true).truncate(true),
                WriteKind::At(_) => o.write(true),
                WriteKind::Append => o.append(true),
            };
            done(o.open(p(f)).and_then(|mut h| match how {
                WriteKind::At(off) => h.write_all_at(&data.0, *off),
                _ => h.write_all(&data.0),
            }))
        }
        Op::Truncate(f, len) => {
            let r = unsafe { libc::truncate(cs(p(f)).as_ptr(), *len as libc::off_t) };
            libc_result(r as isize).map(|_| Val::Done)
        }
        Op::Chmod(f, mode) => done(fs::set_permissions(
            p(f),
            fs::Permissions::from_mode(mode.0),
        )),
        Op::Unlink(f) => done(fs::remove_file(p(f))),
        Op::Mkdir(f) => done(fs::DirBuilder::new().mode(0o755).create(p(f))),
        Op::Rmdir(f) => done(fs::remove_dir(p(f))),
        Op::Rename(from, to) => done(fs::rename(p(from), p(to))),
        Op::Link(from, to) => done(fs::hard_link(p(from), p(to))),
        Op::SetXattr(f, v) => {
            let (c, n) = (cs(p(f)), cs(XATTR));
            let r = unsafe {
                libc::setxattr(c.as_ptr(), n.as_ptr(), v.0.as_ptr().cast(), v.0.len(), 0)
            };
            libc_result(r as isize).map(|_| Val::Done)
        }
        Op::RemoveXattr(f) => {
            let (c, n) = (cs(p(f)), cs(XATTR));
            let r = unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) };
            libc_result(r as isize).map(|_| Val::Done)
        }
        Op::Stat(f) => fs::symlink_metadata(p(f))
            .map(|md| Val::Stat {
                dir: md.is_dir(),
                mode: Mode(md.mode() & 0o7777),
                size: (!md.is_dir()).then_some(md.len()),
                nlink: md.nlink(),
            })
            .map_err(io_errno),
        Op::Read(f) => fs::read(p(f))
            .map(|d| Val::Data(Bytes(d)))
            .map_err(io_errno),
        Op::Readdir(f) => fs::read_dir(p(f))
            .and_then(|rd| {
                rd.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                    .collect::<std::io::Result<Vec<_>>>()
            })
            .map(|mut names| {
                names.sort();
                Val::Names(names)
            })
            .map_err(io_errno),
        Op::GetXattr(f) => {
            let (c, n) = (cs(p(f)), cs(XATTR));
            let mut buf = [0u8; 256];
            let r = unsafe {
                libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            };
            libc_result(r as isize).map(|len| Val::Data(Bytes(buf[..len].to_vec())))
        }
    }
}

/// Runs `op` through the native client.
fn on_native(s: &Session, op: &Op) -> Outcome {
    let c = &s.client;
    let cred = &root();
    let parent = |rel: &str| {
        let p = native_path(rel);
        async move { c.resolve_parent(cred, &p).await }
    };
    let fid = |rel: &str| {
        let p = native_path(rel);
        async move { Ok::<_, Errno>(c.resolve(cred, &p, false).await?.attr.fid) }
    };
    let res: Result<Val, Errno> = s.run(async {
        match op {
            Op::Create(f, data) => {
                let (d, name) = parent(f).await?;
                if data.0.is_empty() {
                    c.create(cred, d, &name, 0o644, None).await?;
                } else {
                    let flags = libc::O_WRONLY | libc::O_EXCL;
                    let h = c.create_open(cred, d, &name, 0o644, flags, None).await?;
                    let w = c.write(&h, 0, &data.0).await;
                    c.close(&h).await?;
                    w?;
                }
            }
            Op::Write(f, how, data) => {
                let (flags, off) = match how {
                    WriteKind::Overwrite => (libc::O_WRONLY | libc::O_TRUNC, 0),
                    WriteKind::At(off) => (libc::O_WRONLY, *off),
                    WriteKind::Append => (libc::O_WRONLY | libc::O_APPEND, 0),
                };
                let h = c.open(cred, fid(f).await?, flags).await?;
                let w = c.write(&h, off, &data.0).await;
                c.close(&h).await?;
                w?;
            }
            Op::Truncate(f, len) => {
                let sa = SetAttr {
                    size: Some(*len),
                    ..Default::default()
                };
                c.setattr(cred, fid(f).await?, sa).await?;
            }
            Op::Chmod(f, mode) => {
                let sa = SetAttr {
                    mode: Some(mode.0),
                    ..Default::default()
                };
                c.setattr(cred, fid(f).await?, sa).await?;
            }
            Op::Unlink(f) => {
                let (d, name) = parent(f).await?;
                c.unlink(cred, d, &name).await?;
            }
            Op::Mkdir(f) => {
                let (d, name) = parent(f).await?;
                c.mkdir(cred, d, &name, 0o755, None).await?;
            }
            Op::Rmdir(f) => {
                let (d, name) = parent(f).await?;
                c.rmdir(cred, d, &name).await?;
            }
            Op::Rename(from, to) => {
                let (sd, sn) = parent(from).await?;
                let (dd, dn) = parent(to).await?;
                c.rename(cred, sd, &sn, dd, &dn, 0).await?;
            }
            Op::Link(from, to) => {
                let src = fid(from).await?;
                let (d, name) = parent(to).await?;
                c.link(cred, src, d, &name).await?;
            }
            Op::SetXattr(..) | Op::RemoveXattr(_) => unreachable!("mounts only"),
            Op::Stat(f) => {
                let b = c.resolve(cred, &native_path(f), false).await?;
                let a = c.complete(b).await?.attr;
                let dir = a.is_dir();
                return Ok(Val::Stat {
                    dir,
                    mode: Mode(a.mode & 0o7777),
                    size: (!dir).then_some(a.size),
                    nlink: u64::from(a.nlink),
                });
            }
            Op::Read(f) => {
                let h = c.open(cred, fid(f).await?, libc::O_RDONLY).await?;
                let r = c.read(&h, 0, 1 << 20).await;
                c.close(&h).await?;
                return Ok(Val::Data(Bytes(r?)));
            }
            Op::Readdir(f) => {
                let d = c.resolve(cred, &native_path(f), true).await?.attr.fid;
                let mut names: Vec<String> = c
                    .readdir_all(cred, d, false)
                    .await?
                    .into_iter()
                    .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                    .filter(|n| n != "." && n != "..")
                    .collect();
                names.sort();
                return Ok(Val::Names(names));
            }
            Op::GetXattr(f) => {
                let (v, _) = c
                    .getxattr(cred, fid(f).await?, XATTR.as_bytes(), 256)
                    .await?;
                return Ok(Val::Data(Bytes(v)));
            }
        }
        Ok(Val::Done)
    });
    res.map_err(|e| e.raw())
}

/// A candidate path: mostly a name in one of the [`DIRS`]; for `dirs`, often one of
/// the subdirectories' own names.
fn path(rng: &mut Prng, dirs: bool) -> String {
    if dirs && rng.chance(40) {
        return rng.pick(&DIRS[1..]).into();
    }
    match rng.pick(&DIRS) {
        "" => rng.pick(&TOP_NAMES).into(),
        d => format!("{d}/{}", rng.pick(&SUB_NAMES)),
    }
}

/// A random operation for client `who` (2 is the native client), given the model.
fn random_op(rng: &mut Prng, model: &Model, who: usize) -> Op {
    let size = |p: &str| match model.existing(p).map(|i| &model.nodes[&i].kind) {
        Ok(Kind::File(d)) => d.len() as u64,
        _ => 0,
    };
    loop {
        let op = match rng.below(100) {
            0..=9 => Op::Create(path(rng, false), random_bytes(rng, 12)),
            10..=19 => {
                let p = path(rng, false);
                let how = match rng.below(3) {
                    0 => WriteKind::Overwrite,
                    1 => WriteKind::At(rng.below(size(&p) + 4)),
                    _ => WriteKind::Append,
                };
                Op::Write(p, how, random_bytes(rng, 12))
            }
            20..=24 => {
                let p = path(rng, false);
                let len = rng.below(size(&p) + 6);
                Op::Truncate(p, len)
            }
            25..=29 => Op::Chmod(path(rng, true), Mode(rng.pick(&MODES))),
            30..=35 => Op::Unlink(path(rng, false)),
            36..=40 => Op::Mkdir(path(rng, true)),
            41..=45 => Op::Rmdir(path(rng, true)),
            46..=52 => {
                let dirs = rng.chance(20);
                Op::Rename(path(rng, dirs), path(rng, dirs))
            }
            53..=56 => Op::Link(path(rng, false), path(rng, false)),
            57..=59 if who < 2 => Op::SetXattr(path(rng, true), random_bytes(rng, 6)),
            60..=61 if who < 2 => Op::RemoveXattr(path(rng, true)),
            57..=61 => continue,
            62..=75 => Op::Stat(if rng.chance(10) {
                rng.pick(&DIRS).into()
            } else {
                path(rng, true)
            }),
            76..=87 => Op::Read(path(rng, false)),
            88..=94 => Op::Readdir(if rng.chance(80) {
                rng.pick(&DIRS).into()
            } else {
                path(rng, false)
            }),
            _ => Op::GetXattr(path(rng, true)),
        };
        // The native client opens a directory for reading without complaint.
        let native_read_of_dir = who == 2
            && matches!(&op, Op::Read(p) if model.existing(p).is_ok_and(|i| model.is_dir(i)));
        if !native_read_of_dir {
            return op;
        }
    }
}

/// One call made, for failure messages.
struct Done {
    i: u64,
    who: usize,
    op: Op,
    got: Outcome,
}

impl fmt::Display for Done {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (i, op, got) = (self.i, &self.op, &self.got);
        write!(f, "#{i} {}: {op:?} -> {got:?}", CLIENTS[self.who])
    }
}

/// True if `a` and `b` are one path, or one lies below the other (the test directory
/// counts for the names directly in it only).
fn related(a: &str, b: &str) -> bool {
    let below = |x: &str, y: &str| {
        if x.is_empty() {
            !y.contains('/')
        } else {
            y.starts_with(&format!("{x}/"))
        }
    };
    a == b || below(a, b) || below(b, a)
}

/// The calls made so far (the most recent [`KEPT`]) and how to replay them.
struct Log {
    seed: u64,
    calls: VecDeque<Done>,
}

/// Calls kept for failure messages.
const KEPT: usize = 10_000;

impl Log {
    fn push(&mut self, call: Done) {
        if self.calls.len() == KEPT {
            self.calls.pop_front();
        }
        self.calls.push_back(call);
    }

    /// Panics with `what`, the seed, the last [`HISTORY`] calls and the last
    /// [`HISTORY`] before them on the paths of the failing call `op`.
    fn fail(&self, op: &Op, what: String) -> ! {
        let seed = self.seed;
        let mut msg = format!("seed {seed} (replay with LODE_SEED={seed}): {what}\n");
        let recent = self.calls.len().saturating_sub(HISTORY);
        let paths = op.paths();
        let earlier: Vec<&Done> = self
            .calls
            .range(..recent)
            .filter(|c| {
                c.op.paths()
                    .iter()
                    .any(|p| paths.iter().any(|q| related(p, q)))
            })
            .collect();
        if !earlier.is_empty() {
            msg.push_str(&format!("earlier calls on {paths:?}, oldest first:\n"));
            for c in &earlier[earlier.len().saturating_sub(HISTORY)..] {
                msg.push_str(&format!("  {c}\n"));
            }
        }
        msg.push_str("last calls, oldest first:\n");
        for c in self.calls.range(recent..) {
            msg.push_str(&format!("  {c}\n"));
        }
        panic!("{msg}");
    }
}

#[test]
fn three_clients_taking_turns_always_see_what_the_model_says() {
    run_model(RUN_FOR, None);
}

/// The same with every client's lock LRU a few locks long: entries are given back
/// all the time, while the other clients change what they covered.
#[test]
fn three_clients_with_lock_lrus_of_eight_locks_see_what_the_model_says() {
    run_model(RUN_FOR / 3, Some(8));
}

/// Runs the model for `run_for`, with each client's `lru_size` set to `lru` if given.
fn run_model(run_for: Duration, lru: Option<usize>) {
    let seed = std::env::var("LODE_SEED")
        .ok()
        .map(|s| s.parse().expect("LODE_SEED is a number"))
        .unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970");
            t.as_nanos() as u64
        });
    println!("coherence_model: seed {seed} (replay with LODE_SEED={seed})");
    let mut rng = Prng(seed);
    // Files made through the mounts get 0o644 and directories 0o755, as in the model.
    unsafe { libc::umask(0o022) };

    let c = cluster(2);
    let (a, b) = (c.mount(), c.mount());
    let n = c.client();
    if let Some(l) = lru {
        c.set_param(&format!("ldlm.namespaces.*-mdc-*.lru_size={l}"));
        let set = c.get_param("ldlm.namespaces.*-mdc-*.lru_size");
        assert_eq!(
            set.lines().filter(|v| v.trim() == l.to_string()).count(),
            2,
            "both mounts' lru_size: {set}"
        );
        n.client.set_lock_cache_max(l);
    }
    let tops = [a.path().join("t"), b.path().join("t")];
    let mut model = Model::new();
    let mkdir = |p: &Path| fs::DirBuilder::new().mode(0o755).create(p).expect("mkdir");
    mkdir(&tops[0]);
    for d in &DIRS[1..] {
        mkdir(&tops[0].join(d));
        model.apply(&Op::Mkdir(d.to_string())).expect("model mkdir");
    }

    let mut log = Log {
        seed,
        calls: VecDeque::new(),
    };
    let (mut changes, mut reads, mut ambiguous) = ([0u64; 3], [0u64; 3], 0u64);
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < run_for {
        let who = rng.below(3) as usize;
        let op = random_op(&mut rng, &model, who);
        let expected = match model.apply(&op) {
            Ok(v) => Ok(v),
            Err(errs) if errs.len() == 1 => Err(*errs.first().expect("one errno")),
            Err(_) => {
                // Several errors apply: which one comes first is not what this is about.
                ambiguous += 1;
                continue;
            }
        };
        let exec = |op: &Op| match who {
            2 => on_native(&n, op),
            m => on_mount(&tops[m], op),
        };
        let got = exec(&op);
        if got != expected {
            let later = if op.is_read() {
                std::thread::sleep(Duration::from_secs(2));
                format!("\n  asked again 2 s later: {:?}", exec(&op))
            } else {
                String::new()
            };
            log.fail(
                &op,
                format!(
                    "call #{i} by {}: {op:?}\n  expected {expected:?}\n  got      {got:?}{later}",
                    CLIENTS[who]
                ),
            );
        }
        if op.is_read() {
            reads[who] += 1;
        } else {
            changes[who] += 1;
        }
        log.push(Done { i, who, op, got });
        i += 1;
    }
    println!(
        "coherence_model: seed {seed}: {i} calls in {:.1?} (and {ambiguous} skipped: more \
         than one errno applied); changes {changes:?}, reads {reads:?} (mount A, mount B, \
         native)",
        start.elapsed()
    );
    assert!(i > 500, "only {i} calls were made (seed {seed})");
    for who in 0..3 {
        assert!(
            changes[who] > 0 && reads[who] > 0,
            "{} made {} changes and {} reads (seed {seed})",
            CLIENTS[who],
            changes[who],
            reads[who]
        );
    }
}
