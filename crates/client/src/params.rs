//! A client's parameters under Lustre's names (`mdc.FS-MDT0000-mdc-ID.*`,
//! `osc.FS-OST0000-osc-ID.*`), for `lode get-param/set-param` through the mount's admin
//! socket. `ID` is this client's instance (the first 16 hex digits of its UUID), as
//! Lustre names a mount's devices by its superblock.

use crate::Client;
use lode_rpc::admin::{parse_num, Params};
use lode_rpc::Import;
use std::sync::Arc;

/// Parameters of one client.
pub struct ClientParams(pub Arc<Client>);

/// Parameters of an MDC.
const MDC: &[&str] = &[
    "max_rpcs_in_flight",
    "max_mod_rpcs_in_flight",
    "rpc_stats",
    "stats",
    "net_delay_us",
];
/// Parameters of an OSC.
const OSC: &[&str] = &["max_rpcs_in_flight", "rpc_stats", "stats", "net_delay_us"];

impl ClientParams {
    /// This client's instance name.
    pub fn instance(&self) -> String {
        self.0.uuid().replace('-', "").chars().take(16).collect()
    }

    /// Every device of the client: (object name, import, its parameter names).
    fn devices(&self) -> Vec<(String, Arc<Import>, &'static [&'static str])> {
        let id = self.instance();
        let mut v = vec![(
            format!("mdc.{}-mdc-{id}", self.0.mdc().target()),
            self.0.mdc().clone(),
            MDC,
        )];
        let mut oscs = self.0.oscs();
        oscs.sort_by(|a, b| a.target().cmp(b.target()));
        for o in oscs {
            v.push((format!("osc.{}-osc-{id}", o.target()), o, OSC));
        }
        v
    }

    fn find(&self, name: &str) -> Option<(Arc<Import>, String)> {
        let (obj, p) = name.rsplit_once('.')?;
        self.devices()
            .into_iter()
            .find(|(o, _, ps)| o == obj && ps.contains(&p))
            .map(|(_, i, _)| (i, p.to_string()))
    }
}

fn refusal((errno, msg): (lode_base::Errno, String)) -> String {
    format!("{errno}: {msg}")
}

impl Params for ClientParams {
    fn names(&self) -> Vec<String> {
        self.devices()
            .into_iter()
            .flat_map(|(o, _, ps)| ps.iter().map(move |p| format!("{o}.{p}")))
            .collect()
    }

    fn get(&self, name: &str) -> Option<String> {
        let (imp, p) = self.find(name)?;
        Some(match p.as_str() {
            "max_rpcs_in_flight" => imp.max_rpcs_in_flight().to_string(),
            "max_mod_rpcs_in_flight" => imp.max_mod_rpcs_in_flight().to_string(),
            "rpc_stats" => imp.rpc_stats(),
            "stats" => imp.stats().render(),
            "net_delay_us" => imp.net_delay_us().to_string(),
            _ => return None,
        })
    }

    fn set(&self, name: &str, value: &str) -> Result<(), String> {
        let Some((imp, p)) = self.find(name) else {
            return Err("No such file or directory".into());
        };
        let num = || {
            parse_num(value.trim())
                .map_err(|_| format!("Invalid argument: {value:?} is not a number"))
        };
        match p.as_str() {
            "max_rpcs_in_flight" => {
                let n = usize::try_from(num()?).unwrap_or(usize::MAX);
                imp.set_max_rpcs_in_flight(n).map_err(refusal)
            }
            "max_mod_rpcs_in_flight" => {
                let n = u16::try_from(num()?).unwrap_or(u16::MAX);
                imp.set_max_mod_rpcs_in_flight(n).map_err(refusal)
            }
            "net_delay_us" => imp.set_net_delay_us(num()?).map_err(refusal),
            // Writing anything clears the statistics, as in Lustre.
            "rpc_stats" => {
                imp.clear_rpc_stats();
                Ok(())
            }
            "stats" => {
                imp.stats().clear();
                Ok(())
            }
            _ => Err("Permission denied: read-only parameter".into()),
        }
    }

    fn prometheus(&self) -> String {
        let mut s = String::new();
        for (o, imp, _) in self.devices() {
            s.push_str(&format!(
                "lode_client_rpcs_in_flight_max{{device=\"{o}\"}} {}\n",
                imp.max_rpcs_in_flight()
            ));
        }
        s
    }
}
