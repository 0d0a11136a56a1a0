//! The management service: the file system's config (targets and their addresses,
//! persistent parameters), and the client calls servers and clients use to reach it.

pub mod client;

use lode_base::limits::TARGETS_MAX;
use lode_base::Errno;
use lode_proto::{
    ConnectRep, Empty, MgsConfigRep, MgsRegisterReq, MgsRequest, Opcode, Reply, TargetInfo,
    TargetKind, CONNECT_SUPPORTED,
};
use lode_rpc::{Incoming, OpStats, Outgoing, Service};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use tracing::{info, warn};

/// File holding the registered targets.
const TARGETS_FILE: &str = "targets";
/// Each target's secret and the stamp of its last registration (0600).
const SECRETS_FILE: &str = "secrets";

/// What the MGS keeps to check a target's registrations.
#[derive(Clone, Serialize, Deserialize)]
struct TargetSecret {
    name: String,
    secret: Vec<u8>,
    last_stamp: u64,
}

#[derive(Clone, Default, Serialize, Deserialize)]
struct State {
    targets: Vec<TargetInfo>,
    params: Vec<(String, String)>,
}

/// The MGS.
pub struct Mgs {
    fsname: String,
    key: Vec<u8>,
    dir: PathBuf,
    state: Mutex<State>,
    /// Taken after `state` when both are.
    secrets: Mutex<Vec<TargetSecret>>,
    stats: OpStats,
}

impl Mgs {
    /// Opens the MGS state in `dir`.
    pub fn open(dir: &Path, fsname: String, key: Vec<u8>) -> std::io::Result<Mgs> {
        let state = match std::fs::read(dir.join(TARGETS_FILE)) {
            Ok(b) => postcard::from_bytes(&b).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("targets: {e}"))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(e) => return Err(e),
        };
        let secrets_path = dir.join(SECRETS_FILE);
        let secrets = match lode_base::config::check_secret(&secrets_path) {
            Ok(()) => {
                let b = std::fs::read(&secrets_path)?;
                postcard::from_bytes(&b).map_err(|e| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("secrets: {e}"))
                })?
            }
            Err(_) if !secrets_path.exists() => Vec::new(),
            Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, e)),
        };
        Ok(Mgs {
            fsname,
            key,
            dir: dir.to_path_buf(),
            state: Mutex::new(state),
            secrets: Mutex::new(secrets),
            stats: OpStats::default(),
        })
    }

    /// Registered targets.
    pub fn targets(&self) -> Vec<TargetInfo> {
        self.state.lock().targets.clone()
    }

    /// Sets (or with `None` deletes) a persistent parameter.
    pub fn set_param(&self, name: &str, value: Option<&str>) -> std::io::Result<()> {
        let mut st = self.state.lock();
        st.params.retain(|(n, _)| n != name);
        if let Some(v) = value {
            st.params.push((name.to_string(), v.to_string()));
        }
        self.save(&st)
    }

    fn save(&self, st: &State) -> std::io::Result<()> {
        let bytes = postcard::to_stdvec(st).map_err(|e| std::io::Error::other(e.to_string()))?;
        let tmp = self.dir.join(format!("{TARGETS_FILE}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(TARGETS_FILE))?;
        std::fs::File::open(&self.dir)?.sync_all()
    }

    /// Registers (or moves) a target. A target formatted with a secret proves each
    /// registration with it, in increasing `stamp` order; the first one binds the name
    /// to the secret it sends.
    fn register(&self, r: MgsRegisterReq, peer: std::net::SocketAddr) -> Result<(), Errno> {
        if r.fsname != self.fsname {
            return Err(Errno::EINVAL);
        }
        let t = r.target.clone();
        let want = match t.kind {
            TargetKind::Mdt => format!("{}-MDT{:04x}", self.fsname, t.index),
            TargetKind::Ost => format!("{}-OST{:04x}", self.fsname, t.index),
        };
        if t.name != want
            || t.index as usize >= TARGETS_MAX
            || t.addr.len() > 256
            || t.uuid.len() > 64
        {
            return Err(Errno::EINVAL);
        }
        let mut st = self.state.lock();
        let mut secrets = self.secrets.lock();
        let proved = |secret: &[u8]| {
            lode_rpc::auth::verify_register(secret, &t.name, &t.addr, &t.uuid, r.stamp, &r.proof)
        };
        let known = secrets.iter().position(|k| k.name == t.name);
        match known {
            Some(i) if !proved(&secrets[i].secret) => {
                warn!(%peer, target = %t.name, "refusing registration: wrong target secret (not the target formatted under that name)");
                return Err(Errno::EPERM);
            }
            Some(i) if r.stamp <= secrets[i].last_stamp => {
                warn!(%peer, target = %t.name, "refusing registration: not newer than the last one (replayed?)");
                return Err(Errno::EPERM);
            }
            // The first registration of a target with a secret: it must send it.
            None if !r.proof.is_empty() && r.secret.is_empty() => return Err(Errno::ENODATA),
            None if !r.proof.is_empty() && !proved(&r.secret) => {
                warn!(%peer, target = %t.name, "refusing registration: its proof does not match its secret");
                return Err(Errno::EPERM);
            }
            _ => {}
        }
        // Changes go to copies, which replace the state once on disk: a failed write
        // leaves nothing in memory that the files do not hold.
        let mut next = st.clone();
        let changed = match next.targets.iter_mut().find(|o| o.name == t.name) {
            Some(o) if o.uuid != t.uuid => {
                warn!(target = %t.name, "refusing registration: already registered with another UUID");
                return Err(Errno::EEXIST);
            }
            Some(o) if *o == t && (known.is_some() || r.proof.is_empty()) => return Ok(()),
            Some(o) if *o == t => false,
            Some(o) => {
                info!(target = %t.name, addr = %t.addr, "target moved");
                *o = t;
                true
            }
            None => {
                if next.targets.len() >= TARGETS_MAX {
                    return Err(Errno::ENOSPC);
                }
                info!(target = %t.name, addr = %t.addr, "target registered");
                next.targets.push(t);
                true
            }
        };
        // The secret first: a crash between the two writes must not leave a target on
        // record without it (its next registration would then be taken on its word).
        if !r.proof.is_empty() {
            let mut with = secrets.clone();
            match known {
                Some(i) => with[i].last_stamp = r.stamp,
                None => with.push(TargetSecret {
                    name: r.target.name.clone(),
                    secret: r.secret,
                    last_stamp: r.stamp,
                }),
            }
            let bytes = postcard::to_stdvec(&with).map_err(|_| Errno::EIO)?;
            lode_base::config::write_secret(&self.dir.join(SECRETS_FILE), &bytes)
                .map_err(|e| Errno::from_io(&e))?;
            *secrets = with;
        }
        if changed {
            next.targets.sort_by(|a, b| a.name.cmp(&b.name));
            self.save(&next).map_err(|e| Errno::from_io(&e))?;
            *st = next;
        }
        Ok(())
    }
}

impl Service for Mgs {
    fn handle(&self, inc: &Incoming) -> Outgoing {
        let req = match inc.decode(MgsRequest::decode) {
            Ok(r) => r,
            Err(e) => return Outgoing::error(e),
        };
        let rep = match req {
            MgsRequest::Connect(c) => {
                if c.fsname != self.fsname {
                    warn!(peer = %inc.peer, "refusing connect for file system {:?}", c.fsname);
                    return Outgoing::error(Errno::EINVAL);
                }
                if !inc.verify_handshake(&self.key, &c.client_uuid, &c.target, &c.auth) {
                    return Outgoing::error(Errno::EACCES);
                }
                Ok(Reply::Connect(ConnectRep {
                    handle: rand::random::<u64>() | 1,
                    flags: c.flags & CONNECT_SUPPORTED,
                    max_mod_rpcs: 1,
                    target_uuid: "MGS".into(),
                    index: 0,
                    // Nothing to replay here: only the MDT runs recovery.
                    instance: 0,
                    recovering: false,
                }))
            }
            MgsRequest::Ping(_) => Ok(Reply::Ping(Empty {})),
            MgsRequest::MgsRegister(r) => self
                .register(r, inc.peer)
                .map(|_| Reply::MgsRegister(Empty {})),
            MgsRequest::MgsConfig(_) => {
                let st = self.state.lock();
                Ok(Reply::MgsConfig(MgsConfigRep {
                    fsname: self.fsname.clone(),
                    targets: st.targets.clone(),
                    params: st.params.clone(),
                }))
            }
        };
        Outgoing::answer(rep)
    }

    fn key(&self) -> &[u8] {
        &self.key
    }

    fn stats(&self) -> Option<&OpStats> {
        Some(&self.stats)
    }
}

/// The opcodes the MGS serves (for documentation and tests).
pub const MGS_OPCODES: &[Opcode] = MgsRequest::OPCODES;

/// Parameters of the MGS process.
pub struct MgsParams(pub std::sync::Arc<Mgs>);

/// `mgs.MGS.*`.
static MGS: [lode_rpc::admin::Param<Mgs>; 4] = {
    use lode_rpc::admin::{Param, Set};
    [
        Param {
            name: "stats",
            help: "requests served per opcode, with service times in usecs",
            get: |m| m.stats.render(),
            set: Set::Clear(|m| m.stats.clear()),
        },
        Param {
            name: "targets",
            help: "registered targets: name, address, UUID",
            get: |m| {
                let mut s = String::new();
                for t in m.targets() {
                    s.push_str(&format!("{} {} {}\n", t.name, t.addr, t.uuid));
                }
                s
            },
            set: Set::No,
        },
        Param {
            name: "fsname",
            help: "the file system's name",
            get: |m| m.fsname.clone(),
            set: Set::No,
        },
        // The persistent parameters, as `set-param -P` stored them.
        Param {
            name: "params",
            help: "parameters stored with set-param -P, in the order they were set",
            get: |m| {
                m.state
                    .lock()
                    .params
                    .iter()
                    .map(|(n, v)| format!("{n}={v}\n"))
                    .collect()
            },
            set: Set::No,
        },
    ]
};

impl lode_rpc::admin::Registry for MgsParams {
    type Ctx = Mgs;

    fn devices(&self) -> Vec<lode_rpc::admin::Device<Mgs>> {
        vec![lode_rpc::admin::Device {
            obj: "mgs.MGS".into(),
            ctx: self.0.clone(),
            params: &MGS,
        }]
    }

    fn set_persistent(&self, name: &str, value: &str) -> Option<Result<(), String>> {
        let ok = !name.is_empty()
            && name.len() <= 256
            && value.len() <= 4096
            && !name.contains(['\n', '=', ' '])
            && !value.contains('\n');
        if !ok {
            return Some(Err("Invalid argument: bad parameter name or value".into()));
        }
        Some(
            self.0
                .set_param(name, Some(value))
                .map_err(|e| format!("Input/output error: {e}")),
        )
    }

    fn prometheus(&self) -> String {
        let mut s = String::new();
        self.0.stats.prometheus("lode_mgs", "MGS", &mut s);
        s.push_str(&format!(
            "# TYPE lode_mgs_targets gauge\nlode_mgs_targets {}\n",
            self.0.targets().len()
        ));
        s
    }
}
