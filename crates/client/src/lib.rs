//! The lode client library: the MGS config, one import per target (MDC for the MDT,
//! OSC per OST), FID allocation from granted sequences, path resolution, namespace
//! operations, and striped I/O split by component and stripe and sent concurrently.
//!
//! Every method is `async` and safe to call from many tasks and threads at once; there
//! is no client-wide lock on the request path. Sync callers use [`Session`].

mod fids;
mod flock;
mod io;
mod locks;
mod ns;
mod opencache;
pub mod params;
mod statahead;
mod writeback;

use lode_base::{Errno, Fid};
use lode_proto::{Reply, Request, StatfsRep, TargetKind, CONNECT_SUPPORTED};
use lode_rpc::{Import, ImportConfig};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

pub use flock::FlockArgs;
pub use io::FileHandle;
pub use locks::{HeldLock, Inval, Invalidator};
pub use lode_proto::{DirEntry, MdtBody, ReaddirRep};
pub use lode_rpc::blocking_caller;

/// Client settings; the names follow Lustre's tunables.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// MGS address, `host:port`.
    pub mgs: String,
    /// File system name.
    pub fsname: String,
    /// Shared key (empty: none).
    pub key: Vec<u8>,
    /// `timeout`: how long a request waits for a server before EIO.
    pub timeout: Duration,
    /// `mdc.*.max_rpcs_in_flight`.
    pub mdc_max_rpcs_in_flight: usize,
    /// `mdc.*.max_mod_rpcs_in_flight`.
    pub max_mod_rpcs_in_flight: u16,
    /// `osc.*.max_rpcs_in_flight`.
    pub osc_max_rpcs_in_flight: usize,
    /// How long resolved directory names are trusted (`--entry-timeout`).
    pub entry_timeout: Duration,
    /// Resend an unanswered request after this long (same xid).
    pub resend_interval: Duration,
    /// Emulated one-way network latency before each request (`*.net_delay_us`).
    pub net_delay: Duration,
    /// Take metadata locks (open the callback channel). Off (`-o nolocks`), nothing
    /// is cached beyond the short timeouts, as before locks existed: for comparison
    /// and diagnosis.
    pub locks: bool,
    /// When reads move access times (`-o noatime`, `relatime`, the default, or
    /// `strictatime`).
    pub atime: lode_base::attr::AtimeMode,
    /// Whether reading a directory moves its access time too (`-o nodiratime`: no).
    pub diratime: bool,
    /// Whether the first write of a small Data-on-MDT file this client made is kept
    /// back past `write(2)` under a DOM lock (see [`writeback`]; `llite.*.dom_writeback`).
    /// Off by default: on loopback with two CPUs its hand-offs to the runtime cost more
    /// than the round trip it saves.
    pub dom_writeback: bool,
}

impl ClientConfig {
    /// Defaults for a file system at `mgs`.
    pub fn new(mgs: &str, fsname: &str) -> ClientConfig {
        ClientConfig {
            mgs: mgs.to_string(),
            fsname: fsname.to_string(),
            key: Vec::new(),
            timeout: Duration::from_secs(100),
            mdc_max_rpcs_in_flight: lode_base::limits::MAX_RPCS_IN_FLIGHT_DEFAULT,
            max_mod_rpcs_in_flight: lode_base::limits::MAX_MOD_RPCS_DEFAULT,
            osc_max_rpcs_in_flight: lode_base::limits::MAX_RPCS_IN_FLIGHT_DEFAULT,
            entry_timeout: Duration::from_secs(1),
            resend_interval: Duration::from_secs(10),
            net_delay: Duration::ZERO,
            locks: true,
            atime: lode_base::attr::AtimeMode::Relative,
            diratime: true,
            dom_writeback: false,
        }
    }
}

/// Directory names resolved recently: (parent, name) → (directory, when).
type DirCache = HashMap<(Fid, Vec<u8>), (Fid, Instant)>;

/// How long the MGS may take to answer before connecting fails.
const MGS_CONNECT_TIMEOUT: Duration = Duration::from_secs(8);
/// Counters `Client::file_epochs` hashes files into.
const FILE_EPOCHS: usize = 256;

/// A connected client.
pub struct Client {
    cfg: ClientConfig,
    uuid: String,
    mdc: Arc<Import>,
    oscs: RwLock<HashMap<u32, Arc<Import>>>,
    mgs: Arc<Import>,
    fids: fids::FidPool,
    dcache: Mutex<DirCache>,
    locks: locks::Locks,
    statahead: statahead::Statahead,
    /// Read-only open handles kept under OPEN locks (see [`opencache`]).
    opencache: opencache::OpenCache,
    /// ioctl command numbers the mount answered ENOTTY, and how often.
    unsupported_ioctls: parking_lot::Mutex<std::collections::BTreeMap<u32, u64>>,
    /// Moves on every write or truncate through this client: bytes a read-only handle
    /// was sent with its open (read-on-open) are used only while it has not moved.
    data_epoch: std::sync::atomic::AtomicU64,
    /// [`Client::data_epoch`] per file, hashed into a few counters: a close takes
    /// the MDT's attributes as exact only if nothing wrote or truncated that file
    /// here while it was out. Writes to other files leave them alone; two files
    /// sharing a counter only cost a missed exact size.
    file_epochs: Box<[std::sync::atomic::AtomicU64]>,
    /// Objects a change of this client's is on its way to the MDT for, and how many
    /// such changes: a getattr of one asks for no lock (see [`Client::md`]).
    changing: Mutex<HashMap<Fid, u32>>,
    /// Files this client made whose every OST write it saw answered (see
    /// [`io::Known`]): their size at close needs no glimpse.
    known: Mutex<HashMap<Fid, io::Known>>,
    /// First writes of small Data-on-MDT files kept back past `write(2)`, and the
    /// locks that let them be (see [`writeback`]).
    wb: writeback::WriteBacks,
    /// `llite.*.dom_writeback`, from [`ClientConfig::dom_writeback`].
    dom_writeback: std::sync::atomic::AtomicBool,
    rt: Handle,
    /// This client, for work it starts in the background (statahead's next fetch).
    me: std::sync::Weak<Client>,
}

impl Drop for Client {
    fn drop(&mut self) {
        // Close the callback channel now, so the MDT drops this client's locks at once
        // instead of calling back a client that is gone.
        if let Some(t) = self.locks.channel_task.lock().take() {
            t.abort();
        }
    }
}

impl Client {
    /// Fetches the config from the MGS and connects to every target. Connection
    /// refusals (wrong fsname, key, version) come back as errors with a message.
    pub async fn connect(cfg: ClientConfig) -> Result<Arc<Client>, ConnectError> {
        let rt = Handle::current();
        let uuid = uuid::Uuid::new_v4().to_string();
        // A mount should fail in seconds when the MGS is not there, not after `timeout`.
        let mgs_timeout = cfg.timeout.min(MGS_CONNECT_TIMEOUT);
        let mgs = lode_mgs::client::mgs_import(
            &cfg.mgs,
            &cfg.fsname,
            &uuid,
            cfg.key.clone(),
            mgs_timeout,
            rt.clone(),
        );
        let conf = lode_mgs::client::fetch_config(&mgs)
            .await
            .map_err(|e| ConnectError(format!("MGS {}: {}", cfg.mgs, refusal(e))))?;
        let mdt = conf
            .targets
            .iter()
            .find(|t| t.kind == TargetKind::Mdt && t.index == 0)
            .ok_or_else(|| {
                ConnectError(format!(
                    "MGS {}: no MDT0000 registered for {}",
                    cfg.mgs, cfg.fsname
                ))
            })?;
        let mdc = Import::new(
            mdt.addr.clone(),
            ImportConfig {
                fsname: cfg.fsname.clone(),
                target: mdt.name.clone(),
                client_uuid: uuid.clone(),
                key: cfg.key.clone(),
                flags: CONNECT_SUPPORTED,
                max_rpcs_in_flight: cfg.mdc_max_rpcs_in_flight,
                max_mod_rpcs: cfg.max_mod_rpcs_in_flight,
                timeout: cfg.timeout,
                resend_interval: cfg.resend_interval,
            },
            rt.clone(),
        );
        let delay_us = u64::try_from(cfg.net_delay.as_micros()).unwrap_or(u64::MAX);
        let _ = mdc.set_net_delay_us(delay_us);
        mdc.connect()
            .await
            .map_err(|e| ConnectError(format!("{} at {}: {}", mdt.name, mdt.addr, refusal(e))))?;
        let client = Arc::new_cyclic(|me| Client {
            me: me.clone(),
            fids: fids::FidPool::default(),
            oscs: RwLock::new(HashMap::new()),
            dcache: Mutex::new(HashMap::new()),
            locks: locks::Locks::default(),
            statahead: statahead::Statahead::default(),
            opencache: opencache::OpenCache::default(),
            unsupported_ioctls: Default::default(),
            data_epoch: Default::default(),
            file_epochs: (0..FILE_EPOCHS).map(|_| Default::default()).collect(),
            changing: Mutex::new(HashMap::new()),
            known: Mutex::new(HashMap::new()),
            wb: writeback::WriteBacks::default(),
            dom_writeback: std::sync::atomic::AtomicBool::new(cfg.dom_writeback),
            cfg,
            uuid,
            mdc,
            mgs,
            rt,
        });
        client.apply_targets(&conf.targets);
        let weak = Arc::downgrade(&client);
        client.mdc.set_lock_replay(Arc::new(move || {
            weak.upgrade()
                .map(|c| c.flock_replays())
                .unwrap_or_default()
        }));
        if client.cfg.locks {
            let channel = client
                .rt
                .spawn(locks::callback_channel(Arc::downgrade(&client)));
            *client.locks.channel_task.lock() = Some(channel.abort_handle());
        }
        // Parameters stored with `set-param -P` that name this client's devices.
        let params = params::all(client.clone());
        for r in lode_rpc::admin::apply_persistent(&params, &conf.params) {
            tracing::warn!("persistent parameter refused: {r}");
        }
        Ok(client)
    }

    fn apply_targets(&self, targets: &[lode_proto::TargetInfo]) {
        let mut oscs = self.oscs.write();
        for t in targets.iter().filter(|t| t.kind == TargetKind::Ost) {
            match oscs.get(&t.index) {
                Some(imp) if imp.addr() != t.addr => imp.set_addr(t.addr.clone()),
                Some(_) => {}
                None => {
                    let osc = Import::new(
                        t.addr.clone(),
                        ImportConfig {
                            fsname: self.cfg.fsname.clone(),
                            target: t.name.clone(),
                            client_uuid: self.uuid.clone(),
                            key: self.cfg.key.clone(),
                            flags: CONNECT_SUPPORTED,
                            max_rpcs_in_flight: self.cfg.osc_max_rpcs_in_flight,
                            max_mod_rpcs: 1,
                            timeout: self.cfg.timeout,
                            resend_interval: self.cfg.resend_interval,
                        },
                        self.rt.clone(),
                    );
                    let delay_us =
                        u64::try_from(self.cfg.net_delay.as_micros()).unwrap_or(u64::MAX);
                    let _ = osc.set_net_delay_us(delay_us);
                    oscs.insert(t.index, osc);
                }
            }
        }
    }

    /// Re-reads the target list from the MGS (new OSTs, moved targets).
    pub async fn refresh_config(&self) -> Result<(), Errno> {
        let conf = lode_mgs::client::fetch_config(&self.mgs).await?;
        self.apply_targets(&conf.targets);
        if let Some(m) = conf
            .targets
            .iter()
            .find(|t| t.kind == TargetKind::Mdt && t.index == 0)
        {
            if m.addr != self.mdc.addr() {
                self.mdc.set_addr(m.addr.clone());
            }
        }
        Ok(())
    }

    /// This client's UUID.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// The settings.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// The MDC import (for tunables and statistics).
    pub fn mdc(&self) -> &Arc<Import> {
        &self.mdc
    }

    /// The OSC import of OST `index`, looking the OST up at the MGS if unknown.
    pub(crate) async fn osc(&self, index: u32) -> Result<Arc<Import>, Errno> {
        if let Some(i) = self.oscs.read().get(&index) {
            return Ok(i.clone());
        }
        self.refresh_config().await?;
        self.oscs.read().get(&index).cloned().ok_or(Errno::EIO)
    }

    /// Number of OSTs known.
    pub fn ost_count(&self) -> usize {
        self.oscs.read().len()
    }

    /// The OST imports connected so far.
    pub fn oscs(&self) -> Vec<Arc<Import>> {
        self.oscs.read().values().cloned().collect()
    }

    /// Sends one request to the MDT.
    pub(crate) async fn md(&self, req: Request) -> Result<Reply, Errno> {
        // The MDT does not hold this client's own requests back for its write-back
        // locks: what reads or changes a file whose first write is kept back here
        // goes after that write (see [`writeback`]).
        if let Some(fid) = writeback::after_write_back(&req) {
            self.wb.wait(fid).await;
        }
        // Marked before its early cancels are chosen, so a getattr that starts after
        // this point cannot be granted a lock the change would have to call back.
        let changing = Changing::new(self, &req);
        let (cancels, forgot) = self.release_for_change(&req);
        let locks_wanted = match &req {
            Request::Getattr(_)
            | Request::Lookup(_)
            | Request::Create(_)
            | Request::Unlink(_)
            | Request::Setattr(_)
            | Request::Readdir(lode_proto::ReaddirReq { plus: true, .. }) => true,
            // The reply hands the directories back.
            Request::Rename(_) | Request::Link(_) => true,
            // The attributes lock, unless held: it vouches for read-on-open bytes and
            // for the pages read or written after. Asked again if the one held was
            // granted while another client had the file open for writing (it then
            // vouched for nothing), so a file is cached again once its writers are
            // gone. An open for writing gave its own back (see `release_for_change`).
            // A directory's first readdir+ page, as a READDIR's, under locks.
            Request::Open(o) => o.first_page.is_some_and(|p| p.plus) || !self.pages_vouched(o.fid),
            _ => false,
        };
        let flags = if locks_wanted && self.callback_channel_up() && !self.being_changed(&req) {
            if changing.shared {
                lode_proto::frame::FLAG_INTENT | lode_proto::frame::FLAG_NO_DIR_ATTRS
            } else {
                lode_proto::frame::FLAG_INTENT
            }
        } else {
            0
        };
        if forgot.is_empty() {
            return Ok(self.mdc.call_with(req, flags, &cancels).await?.reply);
        }
        let r = self.mdc.call_with(req.clone(), flags, &cancels).await;
        self.after_change(&req, r.is_ok(), forgot);
        Ok(r?.reply)
    }

    /// Whether `req` is a getattr of an object a change of this client's is on its
    /// way to the MDT for. Its lock would be granted to this client after the change's
    /// early cancels were chosen, and the change would then wait for this client to be
    /// called back: two processes working in one directory (the kernel's permission
    /// check after each change asks for the directory's attributes) would take turns
    /// doing so. The change's reply brings the attributes back with a lock instead.
    fn being_changed(&self, req: &Request) -> bool {
        let Request::Getattr(r) = req else {
            return false;
        };
        self.changing.lock().contains_key(&r.fid)
    }

    /// statfs of the file system: space summed over OSTs, inodes from the MDT.
    pub async fn statfs(&self) -> Result<StatfsRep, Errno> {
        let Reply::Statfs(md) = self.md(Request::Statfs(lode_proto::Empty {})).await? else {
            return Err(Errno::EPROTO);
        };
        let oscs: Vec<Arc<Import>> = self.oscs.read().values().cloned().collect();
        let replies = futures::future::join_all(
            oscs.iter()
                .map(|o| o.call(Request::Statfs(lode_proto::Empty {}))),
        )
        .await;
        let mut out = StatfsRep {
            bsize: 4096,
            files: md.files,
            ffree: md.ffree,
            namelen: md.namelen,
            ..Default::default()
        };
        // OSTs on one file system (as `lode up` makes them) share its space.
        let mut counted = std::collections::HashSet::new();
        for r in replies {
            if let Reply::Statfs(s) = r?.reply {
                if s.space_id != 0 && !counted.insert(s.space_id) {
                    continue;
                }
                let scale = u64::from(s.bsize) / 4096;
                let conv = |v: u64| {
                    if scale >= 1 {
                        v * scale
                    } else {
                        v * u64::from(s.bsize) / 4096
                    }
                };
                out.blocks += conv(s.blocks);
                out.bfree += conv(s.bfree);
                out.bavail += conv(s.bavail);
            }
        }
        Ok(out)
    }

    /// Every path of `fid` (one per hard link), relative to the root.
    pub async fn paths_of(&self, fid: Fid) -> Result<Vec<Vec<u8>>, Errno> {
        if fid == Fid::ROOT {
            return Ok(vec![Vec::new()]);
        }
        let cred = lode_base::Cred::root();
        let (v, _) = self.getxattr(&cred, fid, b"lustre.link", 65536).await?;
        let links = lode_proto::decode_links(&v).ok_or(Errno::EPROTO)?;
        let mut out = Vec::new();
        for (parent, name) in links {
            let mut path = name;
            let mut cur = parent;
            for _ in 0..4096 {
                if cur == Fid::ROOT {
                    break;
                }
                let (v, _) = self.getxattr(&cred, cur, b"lustre.link", 65536).await?;
                let Some((p, n)) = lode_proto::decode_links(&v).and_then(|l| l.into_iter().next())
                else {
                    return Err(Errno::ENOENT);
                };
                let mut full = n;
                full.push(b'/');
                full.extend_from_slice(&path);
                path = full;
                cur = p;
            }
            out.push(path);
        }
        if out.is_empty() {
            return Err(Errno::ENOENT);
        }
        Ok(out)
    }

    /// Every target's statfs as `lode df` shows it, one line each: `NAME BSIZE BLOCKS
    /// BFREE BAVAIL FILES FFREE`, or `NAME inactive ERRNO`. What a mount answers for
    /// its `lustre.statfs` xattr, so `lode df` needs no connection (nor key) of its own.
    pub async fn statfs_report(&self) -> Vec<u8> {
        let mut out = String::new();
        for (name, r) in self.statfs_targets().await {
            match r {
                Ok(s) => out.push_str(&format!(
                    "{name} {} {} {} {} {} {} {}\n",
                    s.bsize, s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.space_id
                )),
                Err(e) => out.push_str(&format!("{name} inactive {}\n", e.raw())),
            }
        }
        out.into_bytes()
    }

    /// statfs of each target, for `lode df`: (target name, statfs).
    pub async fn statfs_targets(&self) -> Vec<(String, Result<StatfsRep, Errno>)> {
        let mut out = Vec::new();
        let md = self
            .md(Request::Statfs(lode_proto::Empty {}))
            .await
            .and_then(|r| match r {
                Reply::Statfs(s) => Ok(s),
                _ => Err(Errno::EPROTO),
            });
        out.push((self.mdc.target().to_string(), md));
        let mut oscs: Vec<(u32, Arc<Import>)> = self
            .oscs
            .read()
            .iter()
            .map(|(i, o)| (*i, o.clone()))
            .collect();
        oscs.sort_by_key(|(i, _)| *i);
        for (_, o) in oscs {
            let r = o
                .call(Request::Statfs(lode_proto::Empty {}))
                .await
                .and_then(|r| match r.reply {
                    Reply::Statfs(s) => Ok(s),
                    _ => Err(Errno::EPROTO),
                });
            out.push((o.target().to_string(), r));
        }
        out
    }

    /// Makes everything durable on every target: MDT commit and OST syncs.
    pub async fn sync(&self) -> Result<(), Errno> {
        self.md(Request::Sync(lode_proto::Empty {})).await?;
        let oscs: Vec<Arc<Import>> = self.oscs.read().values().cloned().collect();
        for r in futures::future::join_all(
            oscs.iter()
                .map(|o| o.call(Request::OstSync(lode_proto::ObjsReq { objs: Vec::new() }))),
        )
        .await
        {
            r?;
        }
        Ok(())
    }

    /// Disconnects from the MDT: open handles are closed there.
    pub async fn disconnect(&self) {
        let _ = self.md(Request::Disconnect(lode_proto::Empty {})).await;
    }
}

/// A connection failure, with a message for the user.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(pub String);

fn refusal(e: Errno) -> String {
    match e {
        Errno::EINVAL => "refused: wrong file system name".into(),
        Errno::EACCES => "refused: wrong or missing key".into(),
        Errno::ENODEV => "refused: no such target there".into(),
        Errno::EPROTO => "refused: protocol version mismatch".into(),
        Errno::EIO => "no answer (is it running?)".into(),
        e => e.to_string(),
    }
}

/// A client with its own runtime, for synchronous callers (tests, tools).
pub struct Session {
    rt: tokio::runtime::Runtime,
    /// The client.
    pub client: Arc<Client>,
}

impl Session {
    /// Starts a runtime and connects.
    pub fn connect(cfg: ClientConfig) -> Result<Session, ConnectError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("lode-client")
            .build()
            .map_err(|e| ConnectError(format!("runtime: {e}")))?;
        let client = rt.block_on(Client::connect(cfg))?;
        Ok(Session { rt, client })
    }

    /// Runs a future to completion; callable from many threads at once. The calling
    /// thread reads its own MDT replies (see [`blocking_caller`]).
    pub fn run<F: Future>(&self, f: F) -> F::Output {
        blocking_caller(|| self.rt.handle().block_on(f))
    }

    /// The runtime handle.
    pub fn handle(&self) -> &Handle {
        self.rt.handle()
    }
}

impl Drop for Session {
    /// Says goodbye to the MDT if connected (briefly: a target that is down is not
    /// waited for), so that it closes this client's files and a restart of the MDT
    /// does not wait for a client that is gone.
    fn drop(&mut self) {
        if self.client.mdc().connected() {
            let c = self.client.clone();
            let _ = self.run(async move {
                tokio::time::timeout(Duration::from_secs(2), c.disconnect()).await
            });
        }
    }
}

/// Parses a mount source `MGS_HOST:PORT:/FSNAME` into (MGS address, fsname).
pub fn parse_source(spec: &str) -> Result<(String, String), String> {
    let bad = || format!("{spec:?}: expected MGS_HOST:PORT:/FSNAME");
    let (mgs, fs) = spec.rsplit_once(":/").ok_or_else(bad)?;
    if fs.is_empty() || fs.contains('/') || !mgs.contains(':') {
        return Err(bad());
    }
    Ok((mgs.to_string(), fs.to_string()))
}

/// Parses [`Client::statfs_report`]: (target name, statfs or errno).
pub fn parse_statfs_report(b: &[u8]) -> Vec<(String, Result<StatfsRep, Errno>)> {
    let text = String::from_utf8_lossy(b);
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = (*f.first()?).to_string();
            if f.get(1) == Some(&"inactive") {
                let e: i32 = f.get(2).and_then(|v| v.parse().ok()).unwrap_or(0);
                return Some((name, Err(Errno::from_status(-e))));
            }
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
            Some((
                name,
                Ok(StatfsRep {
                    bsize: u32::try_from(n(1)?).ok()?,
                    blocks: n(2)?,
                    bfree: n(3)?,
                    bavail: n(4)?,
                    files: n(5)?,
                    ffree: n(6)?,
                    namelen: 255,
                    space_id: n(7).unwrap_or(0),
                }),
            ))
        })
        .collect()
}

impl Client {
    /// Counts an ioctl the mount does not support; true the first time `cmd` is seen
    /// (so the mount logs each command number once, not every call).
    pub fn note_unsupported_ioctl(&self, cmd: u32) -> bool {
        let mut m = self.unsupported_ioctls.lock();
        let n = m.entry(cmd).or_insert(0);
        *n += 1;
        *n == 1
    }

    /// `unsupported_ioctls`: each command number answered ENOTTY, with its count.
    pub fn unsupported_ioctls(&self) -> String {
        self.unsupported_ioctls
            .lock()
            .iter()
            .map(|(c, n)| format!("{c:#010x} {n}\n"))
            .collect()
    }
}

/// The objects a change is on its way to the MDT for (see [`Client::being_changed`]),
/// marked for as long as this lives.
struct Changing<'a> {
    client: &'a Client,
    fids: Vec<Fid>,
    /// Another change of this client's in a directory of a create, unlink, link or
    /// rename is on its way too: the reply should bring no lock on the directories'
    /// attributes (`FLAG_NO_DIR_ATTRS`), which the other change would have to call
    /// back.
    shared: bool,
}

impl<'a> Changing<'a> {
    fn new(client: &'a Client, req: &Request) -> Changing<'a> {
        // `dirs`: how many of `fids`, from the first, are directories whose
        // attributes lock the reply may bring back.
        let (fids, dirs) = match req {
            Request::Create(r) => (vec![r.parent], 1),
            Request::Unlink(r) => (vec![r.parent], 1),
            Request::Link(r) => (vec![r.parent, r.fid], 1),
            Request::Rename(r) if r.src_parent == r.dst_parent => (vec![r.src_parent], 1),
            Request::Rename(r) => (vec![r.src_parent, r.dst_parent], 2),
            Request::Setattr(r) => (vec![r.fid], 0),
            Request::Setxattr(r) => (vec![r.fid], 0),
            _ => (Vec::new(), 0),
        };
        let mut shared = false;
        if !fids.is_empty() {
            let mut c = client.changing.lock();
            for f in &fids {
                *c.entry(*f).or_default() += 1;
            }
            shared = fids[..dirs]
                .iter()
                .any(|d| c.get(d).is_some_and(|n| *n > 1));
        }
        Changing {
            client,
            fids,
            shared,
        }
    }
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        if self.fids.is_empty() {
            return;
        }
        let mut c = self.client.changing.lock();
        for f in &self.fids {
            if let std::collections::hash_map::Entry::Occupied(mut e) = c.entry(*f) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sources_parse() {
        assert_eq!(
            super::parse_source("127.0.0.1:9880:/lode").unwrap(),
            ("127.0.0.1:9880".into(), "lode".into())
        );
        assert!(super::parse_source("127.0.0.1:/lode").is_err());
        assert!(super::parse_source("127.0.0.1:9880:/").is_err());
        assert!(super::parse_source("nothing").is_err());
    }

    #[test]
    fn a_statfs_report_parses_back() {
        let r = super::parse_statfs_report(
            b"fs-MDT0000 4096 100 50 40 1000 900\nfs-OST0000 inactive 107\nbad line\n",
        );
        assert_eq!(r.len(), 2);
        let (name, st) = &r[0];
        let st = st.as_ref().expect("active");
        assert_eq!(name, "fs-MDT0000");
        assert_eq!(
            (st.bsize, st.blocks, st.bavail, st.ffree),
            (4096, 100, 40, 900)
        );
        assert_eq!(r[1].1, Err(lode_base::Errno::ENOTCONN));
    }
}
