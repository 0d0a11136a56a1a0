//! MDS power cuts under load, against a model: two FUSE mounts and two native clients
//! each work in a directory of their own, as fast as they can, making random changes
//! (create with content, overwrite, mkdir, rename, hard link, unlink, chmod, rmdir,
//! open-unlink-read), while the MDS is killed with `kill -9` twenty times. Commits are
//! held back (`commit_interval_ms=2000`), so each kill loses what the clients were told
//! in the last moments and the clients must replay it. Every call's result (value or
//! errno) must be what an in-memory model of the client's directory predicts; at the
//! end every directory must be what its model says (names, types, contents, modes,
//! link counts, hard links), and a file each client held open for the whole run must
//! still be open, readable through the same handle, and closable; the MDS must then
//! hold exactly those four open handles (none lost, none left over from a close that
//! recovery lost).
//!
//! The seed is printed at the start; `LODE_SEED=<seed>` replays the same operations
//! (not the same timing of the kills).

mod common;

use common::*;
use lode_base::{Errno, Fid, SetAttr};
use lode_client::{FileHandle, Session};
use lode_testkit::wait_for;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::IntoRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How many times the MDS is killed.
const RESTARTS: usize = 20;
/// Pause before each kill, in ms.
const PAUSE_MS: (u64, u64) = (150, 500);
/// Commit interval while the clients work: most of what they did since the last
/// commit is lost at each kill and must be replayed.
const COMMIT_INTERVAL_MS: u32 = 2000;
/// Names the operations use, in each client's directory: few, so they collide.
const NAMES: [&str; 12] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"];
/// The file each client holds open for the whole run (not in [`NAMES`]).
const HELD: &str = "held";
/// Modes chmod sets (the test runs as root: none locks it out).
const MODES: [u32; 5] = [0o600, 0o640, 0o644, 0o700, 0o755];
/// Operations shown in a failure message (the client's last ones).
const HISTORY: usize = 30;
/// The clients: two mounts, two native sessions.
const KINDS: [&str; 4] = ["mount A", "mount B", "native A", "native B"];

/// 1 to 24 random lowercase letters.
fn content(rng: &mut Prng) -> Bytes {
    let n = 1 + rng.below(24);
    Bytes(rng.letters(n))
}

/// An errno, shown by name.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct E(i32);

impl fmt::Debug for E {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            libc::EPERM => "EPERM",
            libc::ENOENT => "ENOENT",
            libc::EIO => "EIO",
            libc::EBADF => "EBADF",
            libc::EEXIST => "EEXIST",
            libc::ENOTDIR => "ENOTDIR",
            libc::EISDIR => "EISDIR",
            libc::EINVAL => "EINVAL",
            libc::ENOTEMPTY => "ENOTEMPTY",
            libc::ESTALE => "ESTALE",
            libc::ETIMEDOUT => "ETIMEDOUT",
            libc::ENOTCONN => "ENOTCONN",
            libc::EPROTO => "EPROTO",
            libc::ENODATA => "ENODATA",
            n => return write!(f, "errno {n}"),
        };
        f.write_str(name)
    }
}

fn io_errno(e: std::io::Error) -> E {
    E(Errno::from_io(&e).raw())
}

/// One operation in the client's directory.
#[derive(Clone, Debug)]
enum Op {
    /// open(O_CREAT|O_EXCL|O_WRONLY), write the bytes, close.
    Create(String, Bytes),
    /// open(O_TRUNC|O_WRONLY), write the bytes, close.
    Overwrite(String, Bytes),
    Mkdir(String),
    Rename(String, String),
    Link(String, String),
    Unlink(String),
    Chmod(String, Mode),
    Rmdir(String),
    /// open(O_RDONLY), unlink, read everything through the open file, close.
    OpenUnlinkRead(String),
    /// open(O_RDONLY), read everything, close.
    Read(String),
}

/// What a call returned when it succeeded.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Val {
    Done,
    Data(Bytes),
}

type Outcome = Result<Val, E>;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    File(Vec<u8>),
    /// Always empty: operations name entries of the client's directory only.
    Dir,
}

#[derive(Clone, Debug)]
struct Node {
    kind: Kind,
    mode: u32,
}

/// One client's directory as it must be: names to inode numbers, inodes by number.
#[derive(Clone)]
struct Model {
    names: BTreeMap<String, usize>,
    nodes: HashMap<usize, Node>,
    next: usize,
}

/// The errnos that may answer a call (several when more than one check fails and
/// which comes first is not what this test is about).
type Errs = BTreeSet<E>;

fn err(e: i32) -> Errs {
    BTreeSet::from([E(e)])
}

impl Model {
    fn new() -> Model {
        Model {
            names: BTreeMap::new(),
            nodes: HashMap::new(),
            next: 0,
        }
    }

    fn get(&self, name: &str) -> Option<&Node> {
        self.names.get(name).map(|i| &self.nodes[i])
    }

    fn is_dir(&self, name: &str) -> bool {
        self.get(name).is_some_and(|n| n.kind == Kind::Dir)
    }

    fn add(&mut self, name: &str, kind: Kind, mode: u32) {
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(ino, Node { kind, mode });
        self.names.insert(name.into(), ino);
    }

    /// Removes a name; its inode goes with its last name.
    fn remove(&mut self, name: &str) {
        if let Some(ino) = self.names.remove(name) {
            if !self.names.values().any(|&i| i == ino) {
                self.nodes.remove(&ino);
            }
        }
    }

    fn nlink(&self, ino: usize) -> u32 {
        match self.nodes[&ino].kind {
            Kind::Dir => 2,
            Kind::File(_) => self.names.values().filter(|&&i| i == ino).count() as u32,
        }
    }

    /// The content of an existing regular file.
    fn file(&mut self, name: &str) -> Result<&mut Vec<u8>, Errs> {
        let ino = *self.names.get(name).ok_or(err(libc::ENOENT))?;
        match &mut self.nodes.get_mut(&ino).expect("inode").kind {
            Kind::File(data) => Ok(data),
            Kind::Dir => Err(err(libc::EISDIR)),
        }
    }

    /// Runs `op` on the model: its value, or every errno that may answer it (nothing
    /// changes then).
    fn apply(&mut self, op: &Op) -> Result<Val, Errs> {
        match op {
            Op::Create(name, data) => {
                if self.names.contains_key(name) {
                    return Err(err(libc::EEXIST));
                }
                self.add(name, Kind::File(data.0.clone()), 0o644);
            }
            Op::Overwrite(name, data) => *self.file(name)? = data.0.clone(),
            Op::Mkdir(name) => {
                if self.names.contains_key(name) {
                    return Err(err(libc::EEXIST));
                }
                self.add(name, Kind::Dir, 0o755);
            }
            Op::Rename(from, to) => {
                let src = *self.names.get(from).ok_or(err(libc::ENOENT))?;
                let dst = self.names.get(to).copied();
                if dst == Some(src) {
                    // One name, or two names of one inode: nothing to do.
                    return Ok(Val::Done);
                }
                if let Some(d) = dst {
                    match (self.is_dir(from), self.nodes[&d].kind == Kind::Dir) {
                        (true, false) => return Err(err(libc::ENOTDIR)),
                        (false, true) => return Err(err(libc::EISDIR)),
                        // A directory replaces an (always empty) directory.
                        _ => {}
                    }
                }
                self.remove(to);
                self.names.remove(from);
                self.names.insert(to.clone(), src);
            }
            Op::Link(from, to) => {
                let mut errs = Errs::new();
                match self.names.get(from) {
                    None => {
                        errs.insert(E(libc::ENOENT));
                    }
                    Some(_) if self.is_dir(from) => {
                        errs.insert(E(libc::EPERM));
                    }
                    Some(_) => {}
                }
                if self.names.contains_key(to) {
                    errs.insert(E(libc::EEXIST));
                }
                if !errs.is_empty() {
                    return Err(errs);
                }
                let ino = self.names[from];
                self.names.insert(to.clone(), ino);
            }
            Op::Unlink(name) => {
                if self.get(name).is_none() {
                    return Err(err(libc::ENOENT));
                }
                if self.is_dir(name) {
                    return Err(err(libc::EISDIR));
                }
                self.remove(name);
            }
            Op::Chmod(name, mode) => {
                let ino = *self.names.get(name).ok_or(err(libc::ENOENT))?;
                self.nodes.get_mut(&ino).expect("inode").mode = mode.0;
            }
            Op::Rmdir(name) => {
                if self.get(name).is_none() {
                    return Err(err(libc::ENOENT));
                }
                if !self.is_dir(name) {
                    return Err(err(libc::ENOTDIR));
                }
                self.remove(name);
            }
            Op::OpenUnlinkRead(name) => {
                let data = self.file(name)?.clone();
                self.remove(name);
                return Ok(Val::Data(Bytes(data)));
            }
            Op::Read(name) => return Ok(Val::Data(Bytes(self.file(name)?.clone()))),
        }
        Ok(Val::Done)
    }

    /// The directory, one line per name, for failure messages.
    fn show(&self) -> String {
        let mut out = String::new();
        for (name, ino) in &self.names {
            let n = &self.nodes[ino];
            let what = match &n.kind {
                Kind::Dir => "dir".to_string(),
                Kind::File(d) => format!("file {:?}", Bytes(d.clone())),
            };
            out.push_str(&format!(
                "    {name}: inode {ino} {what} mode {:?} nlink {}\n",
                Mode(n.mode),
                self.nlink(*ino)
            ));
        }
        out
    }
}

/// A random operation, given the model (reads of directories are not asked: a mount
/// and a native client answer them differently, and that is not what this is about).
fn random_op(rng: &mut Prng, model: &Model) -> Op {
    loop {
        let name = rng.pick(&NAMES).to_string();
        let op = match rng.below(100) {
            0..=17 => Op::Create(name, content(rng)),
            18..=29 => Op::Overwrite(name, content(rng)),
            30..=37 => Op::Mkdir(name),
            38..=51 => Op::Rename(name, rng.pick(&NAMES).into()),
            52..=59 => Op::Link(name, rng.pick(&NAMES).into()),
            60..=71 => Op::Unlink(name),
            72..=79 => Op::Chmod(name, Mode(rng.pick(&MODES))),
            80..=85 => Op::Rmdir(name),
            86..=92 if !model.is_dir(&name) => Op::OpenUnlinkRead(name),
            93..=99 if !model.is_dir(&name) => Op::Read(name),
            _ => continue,
        };
        return op;
    }
}

/// A client and the directory it works in.
enum Client {
    /// The directory through a mount.
    Mount(PathBuf),
    /// A native session and the directory's FID.
    Native(Session, Fid),
}

/// The file a client holds open for the whole run.
enum Held {
    File(fs::File),
    Native(FileHandle),
}

impl Client {
    fn run(&self, op: &Op) -> Outcome {
        match self {
            Client::Mount(dir) => on_mount(dir, op),
            Client::Native(s, dir) => on_native(s, *dir, op),
        }
    }

    /// Creates and opens [`HELD`] for reading and writing, with `data` in it.
    fn open_held(&self, data: &[u8]) -> Held {
        match self {
            Client::Mount(dir) => {
                let mut f = fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(dir.join(HELD))
                    .expect("create the held file");
                f.write_all(data).expect("write the held file");
                Held::File(f)
            }
            Client::Native(s, dir) => {
                let c = &s.client;
                let flags = libc::O_RDWR | libc::O_EXCL;
                let h = s
                    .run(c.create_open(&root(), *dir, HELD.as_bytes(), 0o644, flags, None))
                    .expect("create the held file");
                s.run(c.write(&h, 0, data)).expect("write the held file");
                Held::Native(h)
            }
        }
    }

    /// Reads the held file through its handle.
    fn read_held(&self, held: &Held) -> Result<Vec<u8>, E> {
        match (self, held) {
            (Client::Mount(_), Held::File(f)) => {
                let mut buf = vec![0u8; 4096];
                let n = f.read_at(&mut buf, 0).map_err(io_errno)?;
                buf.truncate(n);
                Ok(buf)
            }
            (Client::Native(s, _), Held::Native(h)) => {
                s.run(s.client.read(h, 0, 4096)).map_err(|e| E(e.raw()))
            }
            _ => unreachable!("a held file of the client's kind"),
        }
    }

    /// Closes the held file: 0 or the errno.
    fn close_held(&self, held: Held) -> Result<(), E> {
        match (self, held) {
            (Client::Mount(_), Held::File(f)) => {
                let fd = f.into_raw_fd();
                if unsafe { libc::close(fd) } == 0 {
                    Ok(())
                } else {
                    Err(io_errno(std::io::Error::last_os_error()))
                }
            }
            (Client::Native(s, _), Held::Native(h)) => {
                s.run(s.client.close(&h)).map_err(|e| E(e.raw()))
            }
            _ => unreachable!("a held file of the client's kind"),
        }
    }

    /// The directory as this client sees it now, for failure messages.
    fn listing(&self) -> String {
        let names: Result<Vec<String>, E> = match self {
            Client::Mount(dir) => fs::read_dir(dir).map_err(io_errno).and_then(|rd| {
                rd.map(|e| {
                    e.map(|e| e.file_name().to_string_lossy().into_owned())
                        .map_err(io_errno)
                })
                .collect()
            }),
            Client::Native(s, dir) => s
                .run(s.client.readdir_all(&root(), *dir, false))
                .map(|v| {
                    v.into_iter()
                        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                        .filter(|n| n != "." && n != "..")
                        .collect()
                })
                .map_err(|e| E(e.raw())),
        };
        match names {
            Ok(mut n) => {
                n.sort();
                format!("{n:?}")
            }
            Err(e) => format!("(listing failed: {e:?})"),
        }
    }
}

/// Runs `op` through a mount, in directory `dir`.
fn on_mount(dir: &std::path::Path, op: &Op) -> Outcome {
    let p = |name: &str| dir.join(name);
    let done = |r: std::io::Result<()>| r.map(|()| Val::Done).map_err(io_errno);
    match op {
        Op::Create(name, data) => done(
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(p(name))
                .and_then(|mut f| f.write_all(&data.0)),
        ),
        Op::Overwrite(name, data) => done(
            fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(p(name))
                .and_then(|mut f| f.write_all(&data.0)),
        ),
        Op::Mkdir(name) => done(fs::DirBuilder::new().mode(0o755).create(p(name))),
        Op::Rename(from, to) => done(fs::rename(p(from), p(to))),
        Op::Link(from, to) => done(fs::hard_link(p(from), p(to))),
        Op::Unlink(name) => done(fs::remove_file(p(name))),
        Op::Chmod(name, mode) => done(fs::set_permissions(
            p(name),
            fs::Permissions::from_mode(mode.0),
        )),
        Op::Rmdir(name) => done(fs::remove_dir(p(name))),
        Op::OpenUnlinkRead(name) => {
            let mut f = fs::File::open(p(name)).map_err(io_errno)?;
            fs::remove_file(p(name)).map_err(io_errno)?;
            let mut data = Vec::new();
            f.read_to_end(&mut data).map_err(io_errno)?;
            Ok(Val::Data(Bytes(data)))
        }
        Op::Read(name) => fs::read(p(name))
            .map(|d| Val::Data(Bytes(d)))
            .map_err(io_errno),
    }
}

/// Runs `op` through a native client, in the directory `dir`.
fn on_native(s: &Session, dir: Fid, op: &Op) -> Outcome {
    let c = &s.client;
    let cred = &root();
    let fid = |name: &str| {
        let name = name.as_bytes().to_vec();
        async move { Ok::<_, Errno>(c.lookup(cred, dir, &name).await?.attr.fid) }
    };
    let res: Result<Val, Errno> = s.run(async {
        match op {
            Op::Create(name, data) => {
                let flags = libc::O_WRONLY | libc::O_EXCL;
                let h = c
                    .create_open(cred, dir, name.as_bytes(), 0o644, flags, None)
                    .await?;
                let w = c.write(&h, 0, &data.0).await;
                c.close(&h).await?;
                w?;
            }
            Op::Overwrite(name, data) => {
                let h = c
                    .open(cred, fid(name).await?, libc::O_WRONLY | libc::O_TRUNC)
                    .await?;
                let w = c.write(&h, 0, &data.0).await;
                c.close(&h).await?;
                w?;
            }
            Op::Mkdir(name) => {
                c.mkdir(cred, dir, name.as_bytes(), 0o755, None).await?;
            }
            Op::Rename(from, to) => {
                c.rename(cred, dir, from.as_bytes(), dir, to.as_bytes(), 0)
                    .await?;
            }
            Op::Link(from, to) => {
                c.link(cred, fid(from).await?, dir, to.as_bytes()).await?;
            }
            Op::Unlink(name) => c.unlink(cred, dir, name.as_bytes()).await?,
            Op::Chmod(name, mode) => {
                let sa = SetAttr {
                    mode: Some(mode.0),
                    ..Default::default()
                };
                c.setattr(cred, fid(name).await?, sa).await?;
            }
            Op::Rmdir(name) => c.rmdir(cred, dir, name.as_bytes()).await?,
            Op::OpenUnlinkRead(name) => {
                let h = c.open(cred, fid(name).await?, libc::O_RDONLY).await?;
                let r = async {
                    c.unlink(cred, dir, name.as_bytes()).await?;
                    c.read(&h, 0, 4096).await
                }
                .await;
                c.close(&h).await?;
                return Ok(Val::Data(Bytes(r?)));
            }
            Op::Read(name) => {
                let h = c.open(cred, fid(name).await?, libc::O_RDONLY).await?;
                let r = c.read(&h, 0, 4096).await;
                c.close(&h).await?;
                return Ok(Val::Data(Bytes(r?)));
            }
        }
        Ok(Val::Done)
    });
    res.map_err(|e| E(e.raw()))
}

/// Where the MDS was in the run: `2r - 1` while restart `r` is under way (from the
/// kill to the end of its recovery), `2r` after it.
fn phase_name(p: usize) -> String {
    if p.is_multiple_of(2) {
        format!("up after {} restarts", p / 2)
    } else {
        format!("during restart {}", p / 2 + 1)
    }
}

/// The time of day (UTC) as the servers' logs show it.
fn wall_clock() -> String {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    let s = t.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        t.subsec_millis()
    )
}

/// One operation done, for failure messages.
struct Done {
    i: u64,
    at: String,
    phases: (usize, usize),
    op: Op,
    got: Outcome,
}

impl fmt::Display for Done {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = self.phases;
        let when = if a == b {
            phase_name(a)
        } else {
            format!("from {} to {}", phase_name(a), phase_name(b))
        };
        write!(
            f,
            "#{} at {} ({when}): {:?} -> {:?}",
            self.i, self.at, self.op, self.got
        )
    }
}

/// What a worker hands back.
struct Worker {
    model: Model,
    ops: u64,
    /// Operations under way while the MDS was killed or recovering.
    across: u64,
    /// The first result the model did not predict, described; the worker stopped there.
    failure: Option<String>,
}

/// Client `who` runs random operations until `stop`, checking each against `model`.
fn work(
    who: usize,
    client: &Client,
    mut model: Model,
    mut rng: Prng,
    stop: &AtomicBool,
    phase: &AtomicUsize,
) -> Worker {
    let mut history: VecDeque<Done> = VecDeque::new();
    let (mut i, mut across) = (0u64, 0u64);
    while !stop.load(Ordering::Acquire) {
        let op = random_op(&mut rng, &model);
        let mut next = model.clone();
        let expected = next.apply(&op);
        let at = wall_clock();
        let before = phase.load(Ordering::Acquire);
        let got = client.run(&op);
        let after = phase.load(Ordering::Acquire);
        let ok = match (&expected, &got) {
            (Ok(v), Ok(g)) => v == g,
            (Err(errs), Err(e)) => errs.contains(e),
            _ => false,
        };
        let done = Done {
            i,
            at,
            phases: (before, after),
            op,
            got,
        };
        if !ok {
            let expected = match &expected {
                Ok(v) => format!("Ok({v:?})"),
                Err(errs) => format!("one of {errs:?}"),
            };
            let mut msg = format!(
                "client {who} ({}): operation {done}\n  expected {expected}\n  \
                 its directory through it now: {}\n  its model before the operation:\n{}  \
                 its last operations, oldest first:\n",
                KINDS[who],
                client.listing(),
                model.show()
            );
            for d in history.iter().chain([&done]) {
                msg.push_str(&format!("    {d}\n"));
            }
            return Worker {
                model,
                ops: i,
                across,
                failure: Some(msg),
            };
        }
        model = next;
        if before != after || !before.is_multiple_of(2) {
            across += 1;
        }
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back(done);
        i += 1;
    }
    Worker {
        model,
        ops: i,
        across,
        failure: None,
    }
}

/// Sets the stop flag when dropped: a panic of the main thread ends the workers too.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Compares directory `dir` as a fresh client sees it with `model`: the differences.
fn check_dir(s: &Session, dir: Fid, model: &Model) -> Vec<String> {
    let c = &s.client;
    let cred = &root();
    let mut out = Vec::new();
    let names: Vec<String> = match s.run(c.readdir_all(cred, dir, false)) {
        Ok(v) => {
            let mut n: Vec<String> = v
                .into_iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                .filter(|n| n != "." && n != "..")
                .collect();
            n.sort();
            n
        }
        Err(e) => return vec![format!("readdir: {e:?}")],
    };
    let want: Vec<String> = model.names.keys().cloned().collect();
    if names != want {
        out.push(format!("names: expected {want:?}, found {names:?}"));
    }
    // Names of one inode in the model must be names of one FID, and only they.
    let mut fids: BTreeMap<usize, Fid> = BTreeMap::new();
    for (name, ino) in &model.names {
        let node = &model.nodes[ino];
        let b = match s.run(c.lookup(cred, dir, name.as_bytes())) {
            Ok(b) => b,
            Err(e) => {
                out.push(format!("{name}: lookup: {e:?}"));
                continue;
            }
        };
        let a = match s.run(c.getattr(cred, b.attr.fid)) {
            Ok(a) => a,
            Err(e) => {
                out.push(format!("{name}: getattr: {e:?}"));
                continue;
            }
        };
        let is_dir = node.kind == Kind::Dir;
        if a.is_dir() != is_dir {
            out.push(format!(
                "{name}: expected a directory: {is_dir}, found mode {:o}",
                a.mode
            ));
            continue;
        }
        if a.mode & 0o7777 != node.mode {
            out.push(format!(
                "{name}: mode: expected {:?}, found {:?}",
                Mode(node.mode),
                Mode(a.mode & 0o7777)
            ));
        }
        if a.nlink != model.nlink(*ino) {
            out.push(format!(
                "{name}: nlink: expected {}, found {}",
                model.nlink(*ino),
                a.nlink
            ));
        }
        match fids.insert(*ino, a.fid) {
            Some(f) if f != a.fid => out.push(format!(
                "{name}: expected a hard link of {f}, found another inode {}",
                a.fid
            )),
            _ => {}
        }
        if let Kind::File(want) = &node.kind {
            let data = s.run(async {
                let h = c.open(cred, a.fid, libc::O_RDONLY).await?;
                let r = c.read(&h, 0, 4096).await;
                c.close(&h).await?;
                r
            });
            match data {
                Ok(d) if d == *want => {}
                Ok(d) => out.push(format!(
                    "{name}: content: expected {:?}, found {:?}",
                    Bytes(want.clone()),
                    Bytes(d)
                )),
                Err(e) => out.push(format!("{name}: read: {e:?}")),
            }
        }
    }
    let mut seen: HashMap<Fid, usize> = HashMap::new();
    for (ino, f) in &fids {
        if let Some(other) = seen.insert(*f, *ino) {
            out.push(format!(
                "inodes {other} and {ino} of the model are one FID {f}: names that \
                 should be separate files are hard links"
            ));
        }
    }
    out
}

/// Lines of `log` with a warning or an error, the last `n`.
fn warnings(log: &str, n: usize) -> Vec<&str> {
    let w: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    w[w.len().saturating_sub(n)..].to_vec()
}

#[test]
fn what_four_busy_clients_were_told_survives_twenty_mds_power_cuts() {
    let seed = std::env::var("LODE_SEED")
        .ok()
        .map(|s| s.parse().expect("LODE_SEED is a number"))
        .unwrap_or_else(|| {
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock after 1970");
            t.as_nanos() as u64
        });
    println!("crash_model: seed {seed} (replay with LODE_SEED={seed})");
    let start = Instant::now();
    let mut rng = Prng(seed);
    // Files made through the mounts get 0o644 and directories 0o755, as in the model.
    unsafe { libc::umask(0o022) };

    let mut c = cluster(1);
    let mounts = [c.mount(), c.mount()];
    let natives = [c.client(), c.client()];
    let s = &natives[0];
    let dirs: Vec<Fid> = (0..4)
        .map(|i| {
            s.run(
                s.client
                    .mkdir(&root(), Fid::ROOT, format!("c{i}").as_bytes(), 0o755, None),
            )
            .unwrap_or_else(|e| panic!("mkdir /c{i}: {e:?}"))
            .attr
            .fid
        })
        .collect();
    // Only the four clients are connected (the cluster's start-up client has said
    // goodbye): recovery waits for them and nobody else.
    wait_for("only the four clients", Duration::from_secs(10), || {
        c.get_param("mdt.*.num_exports") == "4"
    });
    let [n0, n1] = natives;
    let clients = [
        Client::Mount(mounts[0].path().join("c0")),
        Client::Mount(mounts[1].path().join("c1")),
        Client::Native(n0, dirs[2]),
        Client::Native(n1, dirs[3]),
    ];
    let interval = format!("mdt.*.commit_interval_ms={COMMIT_INTERVAL_MS}");
    c.set_param(&interval);

    // Each client's held file, open from here to the end, and its model.
    let mut models = Vec::new();
    let mut helds = Vec::new();
    let mut held_data = Vec::new();
    for (who, client) in clients.iter().enumerate() {
        let data = format!("held open by client {who} ({}), seed {seed}", KINDS[who]);
        helds.push(client.open_held(data.as_bytes()));
        let mut m = Model::new();
        m.add(HELD, Kind::File(data.as_bytes().to_vec()), 0o644);
        models.push(m);
        held_data.push(data.into_bytes());
    }

    let stop = AtomicBool::new(false);
    let phase = AtomicUsize::new(0);
    let failed = AtomicUsize::new(0);
    let mut restarts: Vec<(u64, String, Duration)> = Vec::new();
    let workers: Vec<Worker> = std::thread::scope(|sc| {
        let _stop = StopOnDrop(&stop);
        let handles: Vec<_> = clients
            .iter()
            .zip(models)
            .enumerate()
            .map(|(who, (client, model))| {
                let rng = Prng(seed ^ (who as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03));
                let (stop, phase, failed) = (&stop, &phase, &failed);
                sc.spawn(move || {
                    let w = work(who, client, model, rng, stop, phase);
                    if w.failure.is_some() {
                        failed.fetch_add(1, Ordering::AcqRel);
                    }
                    w
                })
            })
            .collect();
        for r in 1..=RESTARTS {
            if failed.load(Ordering::Acquire) == clients.len() {
                println!("crash_model: every client has failed: no more restarts");
                break;
            }
            let pause = PAUSE_MS.0 + rng.below(PAUSE_MS.1 - PAUSE_MS.0 + 1);
            std::thread::sleep(Duration::from_millis(pause));
            let t = Instant::now();
            phase.store(2 * r - 1, Ordering::Release);
            let killed_at = wall_clock();
            restart_mds(&mut c, &[]);
            let status = wait_recovered(&c);
            phase.store(2 * r, Ordering::Release);
            c.set_param(&interval);
            let replayed: u64 = status_field(&status, "replayed_requests")
                .parse()
                .expect("a number");
            let clients_done = status_field(&status, "completed_clients");
            println!(
                "crash_model: restart {r} (killed at {killed_at} after {pause} ms): \
                 {replayed} requests replayed, clients {clients_done}, {:.2?} to recover",
                t.elapsed()
            );
            restarts.push((replayed, clients_done, t.elapsed()));
        }
        stop.store(true, Ordering::Release);
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread"))
            .collect()
    });

    let mut problems: Vec<String> = Vec::new();
    for (who, w) in workers.iter().enumerate() {
        println!(
            "crash_model: client {who} ({}): {} operations, {} of them under way between \
             a kill and the end of its recovery{}",
            KINDS[who],
            w.ops,
            w.across,
            if w.failure.is_some() { ", FAILED" } else { "" }
        );
        if let Some(f) = &w.failure {
            problems.push(f.clone());
        }
    }
    for (r, (_, clients_done, _)) in restarts.iter().enumerate() {
        let (done, total) = clients_done.split_once('/').unwrap_or(("?", "?"));
        if done != total {
            problems.push(format!(
                "restart {}: only {clients_done} clients completed recovery (the others \
                 were evicted and their changes lost)",
                r + 1
            ));
        }
    }

    // The held files: still open on the MDS, readable through their handles, closable.
    let mut open = String::new();
    let all_open = (0..250).any(|_| {
        open = c.get_param("mdt.*.open_files");
        std::thread::sleep(Duration::from_millis(40));
        open == clients.len().to_string()
    });
    if !all_open {
        let why = match open.parse::<usize>() {
            Ok(n) if n < clients.len() => "handles the clients hold were lost",
            Ok(_) => "handles no client holds were left open: closes lost in recovery",
            Err(_) => "no number",
        };
        problems.push(format!(
            "open handles: the MDS has {open:?}, the clients hold {} (one held file \
             each, open since before the first restart): {why}",
            clients.len()
        ));
    }
    for (who, (client, held)) in clients.iter().zip(helds).enumerate() {
        match client.read_held(&held) {
            Ok(d) if d == held_data[who] => {}
            Ok(d) => problems.push(format!(
                "client {who} ({}): held file read through its handle: expected {:?}, \
                 found {:?}",
                KINDS[who],
                Bytes(held_data[who].clone()),
                Bytes(d)
            )),
            Err(e) => problems.push(format!(
                "client {who} ({}): held file read through its handle: {e:?}",
                KINDS[who]
            )),
        }
        if let Err(e) = client.close_held(held) {
            problems.push(format!(
                "client {who} ({}): closing the held file: {e:?}",
                KINDS[who]
            ));
        }
    }

    // Every directory as a new client sees it, against its model.
    let fresh = c.client();
    for (who, w) in workers.iter().enumerate() {
        if w.failure.is_some() {
            continue;
        }
        let diffs = check_dir(&fresh, dirs[who], &w.model);
        if !diffs.is_empty() {
            problems.push(format!(
                "client {who} ({}): /c{who} after the run differs from its model:\n  {}\n  \
                 the model:\n{}",
                KINDS[who],
                diffs.join("\n  "),
                w.model.show()
            ));
        }
    }

    let replayed: u64 = restarts.iter().map(|r| r.0).sum();
    if replayed == 0 {
        problems.push(format!(
            "no request was replayed in {} restarts: the test proved nothing",
            restarts.len()
        ));
    }
    let ops: u64 = workers.iter().map(|w| w.ops).sum();
    println!(
        "crash_model: seed {seed}: {ops} operations, {} restarts, {replayed} requests \
         replayed, {:.1?}",
        restarts.len(),
        start.elapsed()
    );
    if !problems.is_empty() {
        let mut msg = format!(
            "seed {seed} (replay with LODE_SEED={seed}): {} problems\n\n{}\n",
            problems.len(),
            problems.join("\n\n")
        );
        msg.push_str("\nMDS log, last warnings:\n");
        for l in warnings(&c.log("mdt0"), 20) {
            msg.push_str(&format!("  {l}\n"));
        }
        for n in 0..mounts.len() {
            // The testkit numbers mounts from 0 in this process: ours are the only ones.
            let log = c.log(&format!("mount{n}"));
            msg.push_str(&format!("mount{n} log, last warnings:\n"));
            for l in warnings(&log, 10) {
                msg.push_str(&format!("  {l}\n"));
            }
        }
        panic!("{msg}");
    }
}
