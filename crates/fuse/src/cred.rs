//! The caller's identity: uid and gid from the FUSE request, supplementary groups from
//! `/proc/PID/status`, cached briefly per pid.

use lode_base::limits::GROUPS_MAX;
use lode_base::Cred;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a process's groups are trusted.
const GROUPS_TTL: Duration = Duration::from_secs(1);
/// Processes remembered at once.
const CACHE_MAX: usize = 4096;

/// Supplementary groups by pid.
#[derive(Default)]
pub(crate) struct Groups {
    cache: Mutex<HashMap<u32, (Vec<u32>, Instant)>>,
}

fn read_groups(pid: u32) -> Vec<u32> {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    s.lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .take(GROUPS_MAX)
                .collect()
        })
        .unwrap_or_default()
}

impl Groups {
    /// The credentials of a FUSE caller.
    pub(crate) fn cred(&self, uid: u32, gid: u32, pid: u32) -> Cred {
        if uid == 0 {
            return Cred {
                uid,
                gid,
                groups: Vec::new(),
            };
        }
        let now = Instant::now();
        if let Some((g, t)) = self.cache.lock().get(&pid) {
            if now.duration_since(*t) < GROUPS_TTL {
                return Cred {
                    uid,
                    gid,
                    groups: g.clone(),
                };
            }
        }
        let groups = read_groups(pid);
        let mut c = self.cache.lock();
        if c.len() >= CACHE_MAX {
            c.retain(|_, (_, t)| now.duration_since(*t) < GROUPS_TTL);
        }
        c.insert(pid, (groups.clone(), now));
        Cred { uid, gid, groups }
    }
}
