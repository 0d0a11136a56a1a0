//! A client's parameters under Lustre's names (`mdc.FS-MDT0000-mdc-ID.*`,
//! `osc.FS-OST0000-osc-ID.*`), for `lode get-param/set-param` through the mount's admin
//! socket. `ID` is this client's instance (the first 16 hex digits of its UUID), as
//! Lustre names a mount's devices by its superblock.

use crate::Client;
use lode_rpc::admin::{Chain, Device, Param, Params, Registry, Set};
use lode_rpc::Import;
use std::sync::Arc;

/// Parameters of one client.
pub struct ClientParams(pub Arc<Client>);

/// Largest max_rpcs_in_flight (Lustre's).
const MAX_RPCS: u64 = lode_base::limits::MAX_RPCS_IN_FLIGHT_LIMIT as u64;

fn refusal((errno, msg): (lode_base::Errno, String)) -> String {
    format!("{errno}: {msg}")
}

/// `max_rpcs_in_flight`, from `min` (an MDC needs 2: one for a close beside the
/// modify RPCs).
const fn max_rpcs(min: u64) -> Param<Import> {
    Param {
        name: "max_rpcs_in_flight",
        help: "RPCs this device may have in flight at once",
        get: |i| i.max_rpcs_in_flight().to_string(),
        set: Set::Num {
            min,
            max: MAX_RPCS,
            f: |i, n| {
                i.set_max_rpcs_in_flight(usize::try_from(n).unwrap_or(usize::MAX))
                    .map_err(refusal)
            },
        },
    }
}

const RPC_STATS: Param<Import> = Param {
    name: "rpc_stats",
    help: "RPCs in flight at each send, as histograms; a write clears it",
    get: |i| i.rpc_stats(),
    set: Set::Clear(|i| i.clear_rpc_stats()),
};

const STATS: Param<Import> = Param {
    name: "stats",
    help: "RPCs answered per opcode, with round-trip times in usecs",
    get: |i| i.stats().render(),
    set: Set::Clear(|i| i.stats().clear()),
};

const NET_DELAY: Param<Import> = Param {
    name: "net_delay_us",
    help: "hold each request this long before sending it (emulated network latency)",
    get: |i| i.net_delay_us().to_string(),
    set: Set::Num {
        min: 0,
        max: 10_000_000,
        f: |i, n| i.set_net_delay_us(n).map_err(refusal),
    },
};

const IMPORT: Param<Import> = Param {
    name: "import",
    help:
        "the target, and whether and where this device is connected (Lustre's import file, in part)",
    get: |i| i.import_info(),
    set: Set::No,
};

/// Parameters of an MDC.
static MDC: [Param<Import>; 7] = [
    max_rpcs(2),
    Param {
        name: "max_mod_rpcs_in_flight",
        help:
            "modify RPCs in flight at once: below max_rpcs_in_flight, at most what the MDT granted",
        get: |i| i.max_mod_rpcs_in_flight().to_string(),
        set: Set::Num {
            min: 1,
            max: MAX_RPCS,
            f: |i, n| {
                i.set_max_mod_rpcs_in_flight(u16::try_from(n).unwrap_or(u16::MAX))
                    .map_err(refusal)
            },
        },
    },
    RPC_STATS,
    STATS,
    Param {
        name: "md_stats",
        help: "metadata operations asked of this MDC, by kind",
        get: |i| i.md_stats().render(),
        set: Set::Clear(|i| i.md_stats().clear()),
    },
    NET_DELAY,
    IMPORT,
];

/// Parameters of an OSC.
static OSC: [Param<Import>; 7] = [
    max_rpcs(1),
    RPC_STATS,
    STATS,
    NET_DELAY,
    IMPORT,
    Param {
        name: "unstable_stats",
        help: "written data the OST answered but has not committed (kept for replay), what was replayed after restarts, and what was lost",
        get: |i| i.unstable_stats(),
        set: Set::No,
    },
    Param {
        name: "max_unstable_mb",
        help: "most unstable data kept before a write waits for the OST to commit",
        get: |i| (i.max_unstable() >> 20).to_string(),
        set: Set::Num {
            min: 1,
            max: lode_base::limits::MAX_UNSTABLE_MB_MAX,
            f: |i, n| {
                i.set_max_unstable(n << 20);
                Ok(())
            },
        },
    },
];

impl ClientParams {
    /// This client's instance name.
    pub fn instance(&self) -> String {
        self.0.uuid().replace('-', "").chars().take(16).collect()
    }
}

impl Registry for ClientParams {
    type Ctx = Import;

    fn devices(&self) -> Vec<Device<Import>> {
        let id = self.instance();
        let mut v = vec![Device {
            obj: format!("mdc.{}-mdc-{id}", self.0.mdc().target()),
            ctx: self.0.mdc().clone(),
            params: &MDC,
        }];
        let mut oscs = self.0.oscs();
        oscs.sort_by(|a, b| a.target().cmp(b.target()));
        for o in oscs {
            v.push(Device {
                obj: format!("osc.{}-osc-{id}", o.target()),
                ctx: o,
                params: &OSC,
            });
        }
        v
    }

    fn prometheus(&self) -> String {
        let mut s = String::new();
        for d in self.devices() {
            s.push_str(&format!(
                "lode_client_rpcs_in_flight_max{{device=\"{}\"}} {}\n",
                d.obj,
                d.ctx.max_rpcs_in_flight()
            ));
        }
        s
    }
}

/// Every parameter of a client: its devices', its lock namespace's and its llite's.
pub fn all(client: Arc<Client>) -> impl Params {
    Chain(
        ClientParams(client.clone()),
        Chain(LockParams(client.clone()), LliteParams(client)),
    )
}

/// The client's file system view (`llite.FS-ID.*`): statahead, unsupported ioctls.
pub struct LliteParams(pub Arc<Client>);

/// `llite.*.*`.
static LLITE: [Param<Client>; 8] = [
    Param {
        name: "statahead_max",
        help: "entries a lookup of a listed or numbered name fetches ahead, with their locks (0: no statahead, and a mount lists names without their attributes)",
        get: |c| c.statahead_max().to_string(),
        set: Set::Text(|c, v| {
            let n: usize = v
                .trim()
                .parse()
                .map_err(|_| format!("Invalid argument: {v:?} is not a number"))?;
            if n > crate::statahead::STATAHEAD_MAX_MAX {
                return Err(format!(
                    "Numerical result out of range: statahead_max must be 0..{}",
                    crate::statahead::STATAHEAD_MAX_MAX
                ));
            }
            c.set_statahead_max(n);
            Ok(())
        }),
    },
    Param {
        name: "statahead_stats",
        help: "statahead hits, misses, pages fetched and the entries they carried, and wrong guesses",
        get: |c| c.statahead_stats(),
        set: Set::Clear(|c| c.statahead_stats_clear()),
    },
    Param {
        name: "opencache_threshold_count",
        help: "read-only opens of a file, each within opencache_threshold_ms of the last, after which its handle is kept under an OPEN lock and opened again without an RPC (off or 0: never)",
        get: |c| match c.opencache_threshold_count() {
            0 => "off".to_string(),
            n => n.to_string(),
        },
        set: Set::Text(|c, v| {
            let v = v.trim();
            let n = if v == "off" {
                0
            } else {
                v.parse()
                    .map_err(|_| format!("Invalid argument: {v:?} is not a number or off"))?
            };
            c.set_opencache_threshold_count(n);
            Ok(())
        }),
    },
    Param {
        name: "opencache_threshold_ms",
        help: "longest gap between two opens of a file counted towards opencache_threshold_count",
        get: |c| c.opencache_threshold_ms().to_string(),
        set: Set::Text(|c, v| {
            c.set_opencache_threshold_ms(parse_ms(v)?);
            Ok(())
        }),
    },
    Param {
        name: "opencache_max_ms",
        help: "longest a kept open handle stays idle before it is closed (0 closes the idle ones now)",
        get: |c| c.opencache_max_ms().to_string(),
        set: Set::Text(|c, v| {
            c.set_opencache_max_ms(parse_ms(v)?);
            Ok(())
        }),
    },
    Param {
        name: "opencache_stats",
        help: "open handles kept under OPEN locks (and how many idle), opens served from them, handles kept and closed",
        get: |c| c.opencache_stats(),
        set: Set::No,
    },
    Param {
        name: "dom_writeback",
        help: "1: the first write of a small Data-on-MDT file this client made is kept back past write(2) under a DOM lock and sent in the background (saves a round trip per file on a network; costs CPU hand-offs on loopback); 0: off",
        get: |c| u8::from(c.dom_writeback()).to_string(),
        set: Set::Text(|c, v| {
            match v.trim() {
                "0" => c.set_dom_writeback(false),
                "1" => c.set_dom_writeback(true),
                _ => return Err(format!("Invalid argument: {v:?} is not 0 or 1")),
            }
            Ok(())
        }),
    },
    Param {
        name: "unsupported_ioctls",
        help: "ioctl command numbers answered ENOTTY (each logged once), with their counts",
        get: |c| c.unsupported_ioctls(),
        set: Set::No,
    },
];

/// Milliseconds, at most a day.
fn parse_ms(v: &str) -> Result<u64, String> {
    let ms: u64 = v
        .trim()
        .parse()
        .map_err(|_| format!("Invalid argument: {v:?} is not a number"))?;
    if ms > 86_400_000 {
        return Err(format!(
            "Numerical result out of range: {ms} ms is over a day"
        ));
    }
    Ok(ms)
}

impl Registry for LliteParams {
    type Ctx = Client;

    fn devices(&self) -> Vec<Device<Client>> {
        let id = ClientParams(self.0.clone()).instance();
        vec![Device {
            obj: format!("llite.{}-{id}", self.0.cfg.fsname),
            ctx: self.0.clone(),
            params: &LLITE,
        }]
    }

    fn prometheus(&self) -> String {
        String::new()
    }
}

/// The client's lock namespace on its MDT (`ldlm.namespaces.FS-MDT0000-mdc-ID.*`).
pub struct LockParams(pub Arc<Client>);

/// `ldlm.namespaces.*-mdc-*.*`.
static LDLM: [Param<Client>; 2] = [
    Param {
        name: "lock_count",
        help: "metadata locks this client holds",
        get: |c| c.locks_held().len().to_string(),
        set: Set::No,
    },
    Param {
        name: "lru_size",
        help: "most locks the cache keeps; 'clear' gives every cached lock back (a cold cache)",
        get: |c| c.lock_cache_max().to_string(),
        set: Set::Text(|c, v| {
            if v.trim() == "clear" {
                c.lock_cache_clear();
                return Ok(());
            }
            let n: usize = v
                .trim()
                .parse()
                .map_err(|_| format!("Invalid argument: {v:?} is neither a number nor 'clear'"))?;
            if n == 0 || n > lode_base::limits::LOCKS_PER_CLIENT_MAX {
                return Err(format!(
                    "Numerical result out of range: lru_size must be 1..{}",
                    lode_base::limits::LOCKS_PER_CLIENT_MAX
                ));
            }
            c.set_lock_cache_max(n);
            Ok(())
        }),
    },
];

impl Registry for LockParams {
    type Ctx = Client;

    fn devices(&self) -> Vec<Device<Client>> {
        let id = ClientParams(self.0.clone()).instance();
        vec![Device {
            obj: format!("ldlm.namespaces.{}-mdc-{id}", self.0.mdc().target()),
            ctx: self.0.clone(),
            params: &LDLM,
        }]
    }

    fn prometheus(&self) -> String {
        format!("lode_client_locks {}\n", self.0.locks_held().len())
    }
}
