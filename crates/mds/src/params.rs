//! The MDT's parameters under Lustre's names, for `lode get-param/set-param` and
//! `/metrics`.

use crate::Mdt;
use lode_base::limits::MAX_MOD_RPCS_LIMIT;
use lode_rpc::admin::{Device, Param, Registry, Set};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Parameters of one MDS process.
pub struct MdtParams(pub Arc<Mdt>);

/// `max_mod_rpcs_in_flight`, under `name`.
const fn max_mod(name: &'static str) -> Param<Mdt> {
    Param {
        name,
        help: "modify RPCs a client may have in flight (granted at connect: new connections)",
        get: |m| m.tun().max_mod_rpcs.load(Ordering::Relaxed).to_string(),
        set: Set::Num {
            min: 1,
            max: MAX_MOD_RPCS_LIMIT as u64,
            f: |m, v| {
                m.tun()
                    .max_mod_rpcs
                    .store(u32::try_from(v).unwrap_or(u32::MAX), Ordering::Relaxed);
                Ok(())
            },
        },
    }
}

/// `mdt.FS-MDTxxxx.*`.
static MDT: [Param<Mdt>; 30] = {
    let [fail_loc, fail_val, fail_opc, rpc_delay_us] = lode_rpc::fail::params::<Mdt>();
    [
        max_mod("max_mod_rpcs_in_flight"),
        // Lustre's older name (a module parameter before 2.16).
        max_mod("max_mod_rpcs_per_client"),
        Param {
            name: "commit_interval_ms",
            help: "longest a change waits before the commit thread syncs it",
            get: |m| m.store().commit_interval_ms().to_string(),
            set: Set::Num {
                min: 1,
                max: 60_000,
                f: |m, v| {
                    m.store().set_commit_interval_ms(v);
                    Ok(())
                },
            },
        },
        Param {
            name: "last_transno",
            help: "the last transaction number given",
            get: |m| m.store().last_transno().to_string(),
            set: Set::No,
        },
        Param {
            name: "last_committed",
            help: "the last transaction number on stable storage",
            get: |m| m.store().last_committed().to_string(),
            set: Set::No,
        },
        Param {
            name: "num_exports",
            help: "clients connected",
            get: |m| m.export_count().to_string(),
            set: Set::No,
        },
        Param {
            name: "client_slots",
            help: "client slots held (connected clients and those recovery waits for)",
            get: |m| m.client_slots().to_string(),
            set: Set::No,
        },
        Param {
            name: "open_files",
            help: "open handles held by clients",
            get: |m| m.open_count().to_string(),
            set: Set::No,
        },
        Param {
            name: "open_handles",
            help: "each open handle: its client, slot, FID, handle and access",
            get: |m| m.open_handles_text(),
            set: Set::No,
        },
        Param {
            name: "stats",
            help: "requests served per opcode, with service times in usecs",
            get: |m| m.op_stats().render(),
            set: Set::Clear(|m| m.op_stats().clear()),
        },
        Param {
            name: "uuid",
            help: "the target's UUID",
            get: |m| m.config().uuid.clone(),
            set: Set::No,
        },
        Param {
            name: "ldlm_timeout",
            help: "seconds a client may keep a lock after its callback before it is evicted",
            get: |m| m.ldlm_timeout_s().to_string(),
            set: Set::Num {
                min: 1,
                max: 3600,
                f: |m, v| {
                    m.set_ldlm_timeout_s(v);
                    Ok(())
                },
            },
        },
        Param {
            name: "recovery_status",
            help: "replay recovery after the last start: state, clients, requests replayed",
            get: |m| m.recovery_status(),
            set: Set::No,
        },
        Param {
            name: "recovery_time_soft",
            help: "seconds a restarted MDT waits for its clients before evicting the missing",
            get: |m| m.recovery_windows().0.to_string(),
            set: Set::Num {
                min: 1,
                max: 86_400,
                f: |m, v| {
                    m.set_recovery_window(false, v);
                    Ok(())
                },
            },
        },
        Param {
            name: "recovery_time_hard",
            help: "seconds after which recovery ends whatever is missing",
            get: |m| m.recovery_windows().1.to_string(),
            set: Set::Num {
                min: 1,
                max: 86_400,
                f: |m, v| {
                    m.set_recovery_window(true, v);
                    Ok(())
                },
            },
        },
        Param {
            name: "dom_read_on_open",
            help: "bytes of a Data-on-MDT file sent with an open for reading (0: none)",
            get: |m| m.tun().dom_read_on_open.load(Ordering::Relaxed).to_string(),
            set: Set::Num {
                min: 0,
                max: lode_base::limits::DOM_READ_ON_OPEN_MAX,
                f: |m, v| {
                    m.tun().dom_read_on_open.store(v, Ordering::Relaxed);
                    Ok(())
                },
            },
        },
        Param {
            name: "max_open_files_per_client",
            help: "open files one client may hold; one more open gets ENFILE",
            get: |m| m.tun().max_open_per_client.load(Ordering::Relaxed).to_string(),
            set: Set::Num {
                min: 1,
                max: lode_base::limits::OPEN_HANDLES_PER_CLIENT_MAX as u64,
                f: |m, v| {
                    m.tun().max_open_per_client.store(v, Ordering::Relaxed);
                    Ok(())
                },
            },
        },
        Param {
            name: "evict_timeout",
            help: "seconds a client gone without a goodbye may take to come back before it is evicted (its open files closed, file locks released)",
            get: |m| m.evict_timeout_s().to_string(),
            set: Set::Num {
                min: 1,
                max: 86_400,
                f: |m, v| {
                    m.set_evict_timeout_s(v);
                    Ok(())
                },
            },
        },
        Param {
            name: "destroys",
            help: "OST objects of unlinked files: destroyed since start (counted once their OST committed it), and files whose objects await destruction (estimate)",
            get: |m| {
                let ns = m.ns();
                format!(
                    "destroyed: {}\npending_files: {}\n",
                    ns.destroyed.load(std::sync::atomic::Ordering::Relaxed),
                    ns.store.engine().estimate_keys(lode_store::Cf::Destroy)
                )
            },
            set: Set::No,
        },
        Param {
            name: "root_squash",
            help: "UID:GID that root's requests run as, from clients not in nosquash_nids (0:0: off)",
            get: |m| m.squash.read().root(),
            set: Set::Text(|m, v| m.set_squash(|s| s.set_root(v))),
        },
        Param {
            name: "nosquash_nids",
            help: "client addresses whose root stays root, as 10.0.[2-10].*@tcp, space-separated (NONE: none)",
            get: |m| m.squash.read().nids(),
            set: Set::Text(|m, v| m.set_squash(|s| s.set_nids(v))),
        },
        Param {
            name: "evict_client",
            help: "write a client UUID to evict it now",
            get: |_| String::new(),
            set: Set::Text(|m, v| m.evict_client(v.trim())),
        },
        Param {
            name: "wal_flush_per_round",
            help: "1: write the WAL to the OS before each round of replies (an MDS crash alone loses nothing); 0: only at commit, clients replay the rest",
            get: |m| u8::from(m.wal_flush_per_round()).to_string(),
            set: Set::Num {
                min: 0,
                max: 1,
                f: |m, v| {
                    m.set_wal_flush_per_round(v == 1);
                    Ok(())
                },
            },
        },
        Param {
            name: "cache_stats",
            help: "inode cache size, hits and misses, what warming read, and the store's block cache",
            get: |m| m.cache_stats(),
            set: Set::Clear(|m| m.clear_cache_stats()),
        },
        Param {
            name: "inode_cache_max",
            help: "inode records the MDS keeps in memory at most (about 180 bytes each); lowering it below what is cached empties the cache",
            get: |m| m.store().inode_cache_max().to_string(),
            set: Set::Num {
                min: lode_store::mdt::INODE_CACHE_MIN as u64,
                max: 1 << 30,
                f: |m, v| {
                    m.store()
                        .set_inode_cache_max(usize::try_from(v).unwrap_or(usize::MAX));
                    Ok(())
                },
            },
        },
        Param {
            name: "cache_warm",
            help: "1: a directory read from its start has its entries' inodes read into the cache in the background",
            get: |m| u8::from(m.cache_warm()).to_string(),
            set: Set::Num {
                min: 0,
                max: 1,
                f: |m, v| {
                    m.set_cache_warm(v == 1);
                    Ok(())
                },
            },
        },
        fail_loc,
        fail_val,
        fail_opc,
        rpc_delay_us,
    ]
};

/// `ldlm.namespaces.mdt-FS-MDTxxxx_UUID.*`: the MDT's lock manager.
static LDLM: [Param<Mdt>; 3] = [
    Param {
        name: "max_locks_per_client",
        help: "most locks one client may hold; past it an enqueue gets ENOLCK",
        get: |m| m.ldlm().max_per_client().to_string(),
        set: Set::Num {
            min: 1,
            max: lode_base::limits::LOCKS_PER_CLIENT_MAX as u64,
            f: |m, v| {
                m.ldlm()
                    .set_max_per_client(usize::try_from(v).unwrap_or(usize::MAX));
                Ok(())
            },
        },
    },
    Param {
        name: "lock_count",
        help: "locks granted now (clients' and the MDT's own)",
        get: |m| m.ldlm().lock_count().to_string(),
        set: Set::No,
    },
    Param {
        name: "resource_count",
        help: "objects and names with a lock or a waiter",
        get: |m| m.ldlm().resource_count().to_string(),
        set: Set::No,
    },
];

/// `lod.FS-MDTxxxx-mdtlov.*`: the default layout of new files, and the OSTs.
static LOD: [Param<Mdt>; 4] = [
    Param {
        name: "stripecount",
        help: "default stripe count of new files (-1: every OST)",
        get: |m| {
            m.tun()
                .default_stripe_count
                .load(Ordering::Relaxed)
                .to_string()
        },
        set: Set::Text(|m, value| {
            let v: i64 = value
                .trim()
                .parse()
                .map_err(|_| format!("Invalid argument: {value:?} is not a number"))?;
            if !(-1..=i64::from(lode_base::limits::STRIPE_COUNT_MAX)).contains(&v) || v == 0 {
                return Err(format!(
                    "Numerical result out of range: stripecount must be -1 or 1..{}",
                    lode_base::limits::STRIPE_COUNT_MAX
                ));
            }
            m.tun()
                .default_stripe_count
                .store(u32::try_from(v).unwrap_or(u32::MAX), Ordering::Relaxed);
            Ok(())
        }),
    },
    Param {
        name: "stripesize",
        help: "default stripe size of new files, a multiple of 65536",
        get: |m| {
            m.tun()
                .default_stripe_size
                .load(Ordering::Relaxed)
                .to_string()
        },
        set: Set::Num {
            min: lode_base::limits::STRIPE_SIZE_UNIT,
            max: lode_base::limits::STRIPE_SIZE_MAX,
            f: |m, v| {
                if !v.is_multiple_of(lode_base::limits::STRIPE_SIZE_UNIT) {
                    return Err("Invalid argument: stripe size must be a multiple of 65536".into());
                }
                m.tun().default_stripe_size.store(v, Ordering::Relaxed);
                Ok(())
            },
        },
    },
    Param {
        name: "dom_stripesize",
        help: "largest Data-on-MDT component of new files: 0 (disabled) or 65536..1073741824, rounded down to 64 KiB",
        get: |m| m.tun().dom_stripesize.load(Ordering::Relaxed).to_string(),
        set: Set::Text(|m, value| {
            let v = lode_base::units::parse_size(value)
                .map_err(|_| format!("Invalid argument: {value:?} is not a size"))?;
            m.tun()
                .dom_stripesize
                .store(check_dom_stripesize(v)?, Ordering::Relaxed);
            Ok(())
        }),
    },
    Param {
        name: "target_obd",
        help: "the OSTs, with their state",
        get: |m| {
            let mut s = String::new();
            for o in m.osts() {
                let _ = writeln!(
                    s,
                    "{}: {}_UUID {}",
                    o.index,
                    o.name,
                    if o.active { "ACTIVE" } else { "INACTIVE" }
                );
            }
            s
        },
        set: Set::No,
    },
];

impl Registry for MdtParams {
    type Ctx = Mdt;

    fn devices(&self) -> Vec<Device<Mdt>> {
        let t = self.0.config().target_name();
        vec![
            Device {
                obj: format!("mdt.{t}"),
                ctx: self.0.clone(),
                params: &MDT,
            },
            Device {
                obj: format!("lod.{t}-mdtlov"),
                ctx: self.0.clone(),
                params: &LOD,
            },
            Device {
                obj: format!("ldlm.namespaces.mdt-{t}_UUID"),
                ctx: self.0.clone(),
                params: &LDLM,
            },
        ]
    }

    fn prometheus(&self) -> String {
        let m = &self.0;
        let t = m.config().target_name();
        let mut s = String::new();
        m.op_stats().prometheus("lode_mdt", &t, &mut s);
        let _ = writeln!(
            s,
            "# TYPE lode_mdt_last_transno gauge\nlode_mdt_last_transno{{target=\"{t}\"}} {}",
            m.store().last_transno()
        );
        let _ = writeln!(
            s,
            "# TYPE lode_mdt_last_committed gauge\nlode_mdt_last_committed{{target=\"{t}\"}} {}",
            m.store().last_committed()
        );
        let _ = writeln!(
            s,
            "# TYPE lode_mdt_exports gauge\nlode_mdt_exports{{target=\"{t}\"}} {}",
            m.export_count()
        );
        let _ = writeln!(
            s,
            "# TYPE lode_mdt_open_files gauge\nlode_mdt_open_files{{target=\"{t}\"}} {}",
            m.open_count()
        );
        // The lock namespace (callbacks are in the per-opcode counters above).
        for (name, v) in [
            ("ldlm_locks", m.ldlm().lock_count()),
            ("ldlm_resources", m.ldlm().resource_count()),
            ("file_locks", m.flock_count()),
        ] {
            let _ = writeln!(
                s,
                "# TYPE lode_mdt_{name} gauge\nlode_mdt_{name}{{target=\"{t}\"}} {v}"
            );
        }
        s
    }
}

/// `lod.*.dom_stripesize`: 0, or 64 KiB..1 GiB rounded down to 64 KiB. Unlike Lustre
/// 2.11 (which silently reset a value below the minimum to 1 MiB), every value out of
/// range is refused and the old one kept.
fn check_dom_stripesize(v: u64) -> Result<u64, String> {
    use lode_base::limits::{DOM_SIZE_MAX, DOM_SIZE_MIN};
    if v > DOM_SIZE_MAX {
        return Err(format!(
            "Invalid argument: dom_stripesize {v} is above the maximum {DOM_SIZE_MAX}"
        ));
    }
    if v != 0 && v < DOM_SIZE_MIN {
        return Err(format!(
            "Invalid argument: dom_stripesize {v} is below the minimum {DOM_SIZE_MIN} (0 disables Data-on-MDT)"
        ));
    }
    Ok(v / DOM_SIZE_MIN * DOM_SIZE_MIN)
}

#[cfg(test)]
mod dom_stripesize_tests {
    use super::*;

    #[test]
    fn limits_as_the_seed_wants_them() {
        assert_eq!(check_dom_stripesize(0), Ok(0));
        assert_eq!(check_dom_stripesize(65536), Ok(65536));
        assert_eq!(check_dom_stripesize(131072 + 1000), Ok(131072));
        assert_eq!(check_dom_stripesize(1 << 30), Ok(1 << 30));
        assert!(check_dom_stripesize(32768).is_err());
        assert!(check_dom_stripesize((1 << 30) + (1 << 20)).is_err());
    }
}
