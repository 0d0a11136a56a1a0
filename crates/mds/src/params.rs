//! The MDT's parameters under Lustre's names, for `lode get-param/set-param` and
//! `/metrics`.

use crate::Mdt;
use lode_base::limits::MAX_MOD_RPCS_LIMIT;
use lode_rpc::admin::Params;
use lode_rpc::fail;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Parameters of one MDS process.
pub struct MdtParams(pub Arc<Mdt>);

fn parse<T: TryFrom<u64>>(v: &str) -> Result<T, String> {
    let n = lode_rpc::admin::parse_num(v.trim_start_matches('-'))?;
    T::try_from(n).map_err(|_| format!("value {v:?} out of range"))
}

impl MdtParams {
    fn mdt(&self) -> String {
        format!("mdt.{}", self.0.config().target_name())
    }

    fn lod(&self) -> String {
        format!("lod.{}-mdtlov", self.0.config().target_name())
    }
}

impl Params for MdtParams {
    fn names(&self) -> Vec<String> {
        let (m, l) = (self.mdt(), self.lod());
        let mut v: Vec<String> = [
            "max_mod_rpcs_in_flight",
            "max_mod_rpcs_per_client",
            "commit_interval_ms",
            "last_transno",
            "last_committed",
            "num_exports",
            "open_files",
            "stats",
            "uuid",
            "fail_loc",
            "fail_val",
            "fail_opc",
            "rpc_delay_us",
        ]
        .iter()
        .map(|p| format!("{m}.{p}"))
        .collect();
        v.extend(
            ["stripecount", "stripesize", "target_obd"]
                .iter()
                .map(|p| format!("{l}.{p}")),
        );
        v
    }

    fn get(&self, name: &str) -> Option<String> {
        let m = &self.0;
        let (pfx, p) = name.rsplit_once('.').unwrap_or(("", name));
        Some(match (pfx, p) {
            (x, p) if x == self.mdt() => match p {
                "fail_loc" => format!("{:#x}", fail::loc()),
                "fail_val" => fail::val().to_string(),
                "fail_opc" => fail::opc().to_string(),
                "rpc_delay_us" => fail::rpc_delay_us().to_string(),
                // The second is Lustre's older name (a module parameter before 2.16).
                "max_mod_rpcs_in_flight" | "max_mod_rpcs_per_client" => {
                    m.tun().max_mod_rpcs.load(Ordering::Relaxed).to_string()
                }
                "commit_interval_ms" => m.store().commit_interval_ms().to_string(),
                "last_transno" => m.store().last_transno().to_string(),
                "last_committed" => m.store().last_committed().to_string(),
                "num_exports" => m.export_count().to_string(),
                "open_files" => m.open_count().to_string(),
                "stats" => m.op_stats().render(),
                "uuid" => m.config().uuid.clone(),
                _ => return None,
            },
            (x, p) if x == self.lod() => match p {
                "stripecount" => m
                    .tun()
                    .default_stripe_count
                    .load(Ordering::Relaxed)
                    .to_string(),
                "stripesize" => m
                    .tun()
                    .default_stripe_size
                    .load(Ordering::Relaxed)
                    .to_string(),
                "target_obd" => {
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
                }
                _ => return None,
            },
            _ => return None,
        })
    }

    fn set(&self, name: &str, value: &str) -> Result<(), String> {
        let m = &self.0;
        let (pfx, p) = name.rsplit_once('.').unwrap_or(("", name));
        match (pfx, p) {
            (x, "fail_loc") if x == self.mdt() => fail::set_loc(parse(value)?),
            (x, "fail_val") if x == self.mdt() => fail::set_val(parse(value)?),
            (x, "fail_opc") if x == self.mdt() => fail::set_opc(parse(value)?),
            (x, "rpc_delay_us") if x == self.mdt() => fail::set_rpc_delay_us(parse(value)?),
            (x, "max_mod_rpcs_in_flight" | "max_mod_rpcs_per_client") if x == self.mdt() => {
                let v: u32 = parse(value)?;
                if v == 0 || v > u32::from(MAX_MOD_RPCS_LIMIT) {
                    return Err(format!(
                        "Numerical result out of range (1..{MAX_MOD_RPCS_LIMIT})"
                    ));
                }
                m.tun().max_mod_rpcs.store(v, Ordering::Relaxed);
            }
            (x, "commit_interval_ms") if x == self.mdt() => {
                let v: u64 = parse(value)?;
                if v == 0 || v > 60_000 {
                    return Err("Numerical result out of range (1..60000)".into());
                }
                m.store().set_commit_interval_ms(v);
            }
            (x, "stats") if x == self.mdt() => m.op_stats().clear(),
            (x, "stripecount") if x == self.lod() => {
                let v: i64 = if value.trim() == "-1" {
                    -1
                } else {
                    parse(value)?
                };
                if !(-1..=i64::from(lode_base::limits::STRIPE_COUNT_MAX)).contains(&v) || v == 0 {
                    return Err("invalid stripe count".into());
                }
                m.tun()
                    .default_stripe_count
                    .store(if v < 0 { u32::MAX } else { v as u32 }, Ordering::Relaxed);
            }
            (x, "stripesize") if x == self.lod() => {
                let v: u64 = parse(value)?;
                if v == 0
                    || !v.is_multiple_of(lode_base::limits::STRIPE_SIZE_UNIT)
                    || v > lode_base::limits::STRIPE_SIZE_MAX
                {
                    return Err("stripe size must be a multiple of 65536".into());
                }
                m.tun().default_stripe_size.store(v, Ordering::Relaxed);
            }
            _ => return Err("read-only parameter".into()),
        }
        Ok(())
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
        s
    }
}
