//! Work the MDS does outside requests: keeping the OST table current from the MGS,
//! polling OST free space, destroying OST objects of unlinked files once the unlink is
//! committed, and watching its own free space.

use crate::layout::OstState;
use crate::Namespace;
use lode_base::limits::MDT_RESERVED_BYTES;
use lode_proto::{ObjId, ObjsReq, Reply, Request, TargetKind};
use lode_rpc::{Import, ImportConfig};
use lode_store::records::{self, DestroyRec};
use lode_store::{Batch, Cf};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tracing::{debug, info, warn};

/// Destroy records handled per round.
const DESTROY_BATCH: usize = 4096;
/// Objects per DESTROY request (the OSS takes at most 4,096).
const DESTROY_OBJS: usize = 1024;
/// How long one DESTROY may take before its OST is skipped for the round.
const DESTROY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the OST's commit after a round's destroys may take (a full commit of a
/// busy OST takes longer than a destroy).
const DESTROY_COMMIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Cached "is the disk nearly full" answer, refreshed at most every 500 ms.
#[derive(Default)]
pub(crate) struct SpaceCheck {
    checked_ms: AtomicU64,
    low: AtomicBool,
}

impl SpaceCheck {
    pub(crate) fn low(&self, dir: &Path) -> bool {
        let now = START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1000;
        let last = self.checked_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 500
            && self
                .checked_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let low = match lode_base::sys::statvfs(dir) {
                Ok(s) => s.bavail.saturating_mul(u64::from(s.bsize)) < MDT_RESERVED_BYTES,
                Err(_) => false,
            };
            self.low.store(low, Ordering::Relaxed);
        }
        self.low.load(Ordering::Relaxed)
    }
}

static START: OnceLock<Instant> = OnceLock::new();

/// The MDS's own connections: the MGS and every OST.
pub struct Links {
    rt: Handle,
    mgs: Arc<Import>,
    osts: Mutex<HashMap<u32, Arc<Import>>>,
    fsname: String,
    uuid: String,
    key: Vec<u8>,
}

impl Namespace {
    /// Starts the background work: OST table refresh, OST statfs, object destroy,
    /// writing the access times reads left in memory.
    pub fn start_background(self: &Arc<Self>, rt: Handle, mgs: Arc<Import>) {
        let links = Arc::new(Links {
            rt: rt.clone(),
            mgs,
            osts: Mutex::new(HashMap::new()),
            fsname: self.cfg.fsname.clone(),
            uuid: format!("{}-mdtlov_UUID", self.cfg.target_name()),
            key: self.cfg.key.clone(),
        });
        let _ = self.links.set(links.clone());
        let me = Arc::downgrade(self);
        rt.spawn(async move {
            let every = Duration::from_millis(lode_base::limits::ATIMES_FLUSH_MS);
            loop {
                tokio::time::sleep(every).await;
                let Some(ns) = me.upgrade() else { return };
                if ns.atimes.is_waiting() {
                    let _ = tokio::task::spawn_blocking(move || ns.flush_atimes()).await;
                }
            }
        });
        let me = self.clone();
        rt.spawn(async move {
            loop {
                me.refresh(&links).await;
                // One round a second: going on at once after a full round measured
                // slower in bulk (1 M objects: 1,660/s against 2,650/s).
                me.destroy_round(&links).await;
                tokio::time::sleep(Duration::from_millis(1000)).await;
            }
        });
    }

    /// Refreshes the OST table now, from a service thread (used when a create finds
    /// no OSTs yet).
    pub(crate) fn refresh_osts_now(&self) {
        let Some(links) = self.links.get().cloned() else {
            return;
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let me_links = links.clone();
        // The MDT itself is not 'static here; refresh only the table via a snapshot.
        links.rt.spawn(async move {
            let r = lode_mgs::client::fetch_config(&me_links.mgs).await;
            let _ = tx.send(r);
        });
        if let Ok(Ok(cfg)) = rx.recv_timeout(Duration::from_secs(5)) {
            self.apply_config(&links, &cfg.targets);
        }
    }

    fn apply_config(&self, links: &Links, targets: &[lode_proto::TargetInfo]) {
        let old: HashMap<u32, OstState> =
            self.osts.get().into_iter().map(|o| (o.index, o)).collect();
        let mut new = Vec::new();
        let mut imports = links.osts.lock();
        for t in targets.iter().filter(|t| t.kind == TargetKind::Ost) {
            let imp = imports.entry(t.index).or_insert_with(|| {
                Import::new(
                    t.addr.clone(),
                    ImportConfig {
                        fsname: links.fsname.clone(),
                        target: t.name.clone(),
                        client_uuid: links.uuid.clone(),
                        key: links.key.clone(),
                        flags: 0,
                        max_rpcs_in_flight: 8,
                        max_mod_rpcs: 1,
                        timeout: Duration::from_secs(10),
                        resend_interval: Duration::from_secs(5),
                    },
                    links.rt.clone(),
                )
            });
            if imp.addr() != t.addr {
                imp.set_addr(t.addr.clone());
            }
            let prev = old.get(&t.index);
            new.push(OstState {
                index: t.index,
                name: t.name.clone(),
                addr: t.addr.clone(),
                free: prev.map_or(u64::MAX, |p| p.free),
                active: prev.is_none_or(|p| p.active),
            });
        }
        if new.len() != old.len() {
            info!("{} OSTs known", new.len());
        }
        self.osts.set(new);
    }

    async fn refresh(&self, links: &Arc<Links>) {
        match lode_mgs::client::fetch_config(&links.mgs).await {
            Ok(cfg) => self.apply_config(links, &cfg.targets),
            Err(e) => debug!("MGS config fetch failed: {e}"),
        }
        let imports: Vec<(u32, Arc<Import>)> = links
            .osts
            .lock()
            .iter()
            .map(|(i, imp)| (*i, imp.clone()))
            .collect();
        let mut osts = self.osts.get();
        for (idx, imp) in imports {
            let r = tokio::time::timeout(
                Duration::from_secs(2),
                imp.call(Request::Statfs(lode_proto::Empty {})),
            )
            .await;
            if let Some(o) = osts.iter_mut().find(|o| o.index == idx) {
                match r {
                    Ok(Ok(resp)) => {
                        if let Reply::Statfs(s) = resp.reply {
                            o.free = s.bavail.saturating_mul(u64::from(s.bsize));
                            o.active = true;
                        }
                    }
                    _ => o.active = false,
                }
            }
        }
        self.osts.set(osts);
    }

    /// Destroys the OST objects of unlinked files whose unlink is committed: up to
    /// [`DESTROY_BATCH`] records a round, from where the last round stopped (so records
    /// that cannot be finished, such as those with objects on a dead OST, never hold
    /// up the others), each OST's objects in one request per [`DESTROY_OBJS`],
    /// all OSTs at once. An OST that is inactive or does not answer within
    /// [`DESTROY_TIMEOUT`] is skipped until a later round; a record goes only when
    /// every OST holding its objects has destroyed them.
    async fn destroy_round(&self, links: &Arc<Links>) {
        let cursor = self.destroy_cursor.lock().clone();
        let mut recs: Vec<(Vec<u8>, DestroyRec)> = Vec::new();
        let scan = self
            .store
            .engine()
            .scan(Cf::Destroy, b"", &cursor, &mut |k, v| {
                if let Ok(r) = records::decode::<DestroyRec>("destroy", v) {
                    recs.push((k.to_vec(), r));
                }
                recs.len() < DESTROY_BATCH
            });
        if scan.is_err() {
            return;
        }
        // The end of the keyspace: the next round starts again from the beginning.
        *self.destroy_cursor.lock() = match recs.last() {
            Some((k, _)) if recs.len() == DESTROY_BATCH => {
                let mut next = k.clone();
                next.push(0);
                next
            }
            _ => Vec::new(),
        };
        if recs.is_empty() {
            return;
        }
        // Every record seen was written at or before this transno; act once it is durable.
        let upto = self.store.last_transno();
        if self.store.last_committed() < upto {
            let store = self.store.clone();
            if tokio::task::spawn_blocking(move || store.sync())
                .await
                .is_err()
            {
                return;
            }
            if self.store.last_committed() < upto {
                return;
            }
        }
        let active: HashMap<u32, bool> = self
            .osts
            .get()
            .into_iter()
            .map(|o| (o.index, o.active))
            .collect();
        let mut per_ost: HashMap<u32, Vec<ObjId>> = HashMap::new();
        let mut rec_osts: Vec<Vec<u32>> = Vec::with_capacity(recs.len());
        for (key, rec) in &recs {
            let mut osts = Vec::new();
            if let Some(fid) = lode_base::Fid::from_bytes(key) {
                for c in &rec.layout.components {
                    if let lode_base::Pattern::Raid0 { osts: on, .. } = &c.pattern {
                        for (i, o) in on.iter().enumerate() {
                            per_ost.entry(*o).or_default().push(ObjId {
                                fid,
                                comp: c.id,
                                stripe: i as u32,
                            });
                            osts.push(*o);
                        }
                    }
                }
            }
            rec_osts.push(osts);
        }
        let calls = per_ost.into_iter().map(|(ost, objs)| {
            let imp = links.osts.lock().get(&ost).cloned();
            let up = active.get(&ost).copied().unwrap_or(false);
            async move {
                let Some(imp) = imp.filter(|_| up) else {
                    return (ost, 0, false);
                };
                // The OST instance the destroys go to: if it restarts before the commit
                // below, the commit is another instance's, and the destroys are sent
                // again.
                let instance = match tokio::time::timeout(DESTROY_TIMEOUT, imp.connect()).await {
                    Ok(Ok(g)) => (g.instance, imp.forgotten()),
                    _ => return (ost, 0, false),
                };
                let mut done = 0;
                for chunk in objs.chunks(DESTROY_OBJS) {
                    let req = Request::Destroy(ObjsReq {
                        objs: chunk.to_vec(),
                    });
                    match tokio::time::timeout(DESTROY_TIMEOUT, imp.call(req)).await {
                        Ok(Ok(_)) => done += chunk.len() as u64,
                        Ok(Err(e)) => {
                            debug!(ost, "destroy failed, will retry: {e}");
                            return (ost, done, false);
                        }
                        Err(_) => {
                            debug!(ost, "destroy timed out, will retry");
                            return (ost, done, false);
                        }
                    }
                }
                // The records go once the OST has committed the destroys: one lost to
                // a power cut there would not be sent again (destroys are not replayed),
                // and its object would stay on the OST for good.
                let req = Request::OstSync(ObjsReq { objs: Vec::new() });
                match tokio::time::timeout(DESTROY_COMMIT_TIMEOUT, imp.call(req)).await {
                    Ok(Ok(_))
                        if imp.granted().map(|g| g.instance) == Some(instance.0)
                            && imp.forgotten() == instance.1 =>
                    {
                        (ost, done, true)
                    }
                    Ok(Ok(_)) => {
                        debug!(ost, "the OST restarted during destroys: sending them again");
                        (ost, done, false)
                    }
                    Ok(Err(e)) => {
                        debug!(ost, "commit after destroy failed, will retry: {e}");
                        (ost, done, false)
                    }
                    Err(_) => {
                        debug!(ost, "commit after destroy timed out, will retry");
                        (ost, done, false)
                    }
                }
            }
        });
        let mut ok: HashMap<u32, bool> = HashMap::new();
        for (ost, done, all) in futures::future::join_all(calls).await {
            // Counted once committed (a round that fails is sent and counted again).
            if all {
                self.destroyed.fetch_add(done, Ordering::Relaxed);
            }
            ok.insert(ost, all);
        }
        let mut b = Batch::new();
        for ((key, _), osts) in recs.into_iter().zip(rec_osts) {
            if osts.iter().all(|o| ok.get(o).copied().unwrap_or(false)) {
                b.delete(Cf::Destroy, key);
            }
        }
        if let Err(e) = self.store.apply_untracked(&b) {
            warn!("clearing destroy records: {e}");
        }
    }
}
