//! Layout instantiation: turning a template (file system default, directory default
//! or an explicit request) into a layout with OSTs chosen, round robin while free space
//! is balanced and by free space when it is not (Lustre's `qos_threshold_rr`, 17%).

use crate::{Namespace, OpResult};
use lode_base::{Errno, Layout, Pattern};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Imbalance (percent of the largest free space) above which OSTs are chosen by free
/// space instead of round robin.
const QOS_THRESHOLD_RR: u64 = 17;

/// What the MDS knows about one OST.
#[derive(Clone, Debug)]
pub struct OstState {
    /// OST index.
    pub index: u32,
    /// Target name.
    pub name: String,
    /// Address.
    pub addr: String,
    /// Free bytes at the last statfs (`u64::MAX` before the first).
    pub free: u64,
    /// Answered the last statfs.
    pub active: bool,
}

/// The OST table.
#[derive(Default)]
pub(crate) struct Osts {
    list: RwLock<Arc<Vec<OstState>>>,
    rr: AtomicU32,
}

impl Osts {
    pub(crate) fn set(&self, mut v: Vec<OstState>) {
        v.sort_by_key(|o| o.index);
        *self.list.write() = Arc::new(v);
    }

    pub(crate) fn get(&self) -> Vec<OstState> {
        (**self.list.read()).clone()
    }

    /// OST indices run 0..count (the MGS refuses holes larger than the table).
    pub(crate) fn count(&self) -> u32 {
        self.list
            .read()
            .iter()
            .map(|o| o.index + 1)
            .max()
            .unwrap_or(0)
    }

    /// Picks `count` distinct OSTs, starting at `offset` if given.
    pub(crate) fn choose(&self, count: u32, offset: i32) -> Vec<u32> {
        let list = self.list.read().clone();
        let n = list.len();
        if n == 0 {
            return Vec::new();
        }
        let start = if offset >= 0 {
            list.iter()
                .position(|o| o.index == offset as u32)
                .unwrap_or(0)
        } else {
            self.rr.fetch_add(1, Ordering::Relaxed) as usize % n
        };
        let rotated: Vec<&OstState> = (0..n).map(|i| &list[(start + i) % n]).collect();
        let active: Vec<&OstState> = rotated.iter().copied().filter(|o| o.active).collect();
        let pool = if active.len() >= count as usize {
            active
        } else {
            rotated
        };
        let known: Vec<u64> = pool
            .iter()
            .filter(|o| o.free != u64::MAX)
            .map(|o| o.free)
            .collect();
        let max = known.iter().copied().max().unwrap_or(0);
        let min = known.iter().copied().min().unwrap_or(0);
        let imbalanced = offset < 0 && max > 0 && (max - min) * 100 / max > QOS_THRESHOLD_RR;
        let mut chosen: Vec<&OstState> = pool;
        if imbalanced {
            // Stable sort keeps round-robin order among equals.
            chosen.sort_by_key(|o| std::cmp::Reverse(o.free));
        }
        chosen
            .iter()
            .take(count as usize)
            .map(|o| o.index)
            .collect()
    }
}

impl Namespace {
    /// Instantiates a layout for a new regular file from an explicit request, the
    /// directory's default, or the file system default.
    pub(crate) fn new_layout(
        &self,
        req: Option<&Layout>,
        dir_default: Option<&Layout>,
    ) -> OpResult<Layout> {
        let mut n = self.osts.count();
        let wanted = req.or(dir_default).map_or(0, |l| {
            l.components
                .iter()
                .map(|c| match c.pattern {
                    Pattern::Raid0 {
                        stripe_count,
                        stripe_offset,
                        ..
                    } => stripe_count.max(stripe_offset + 1).max(0) as u32,
                    Pattern::Mdt => 0,
                })
                .max()
                .unwrap_or(0)
        });
        if n == 0 || wanted > n {
            // More stripes (or a higher OST index) than known: the MGS may know more OSTs.
            self.refresh_osts_now();
            n = self.osts.count();
            if n == 0 {
                return Err(Errno::ENOSPC.into());
            }
        }
        let def_count = self.tun.default_stripe_count.load(Ordering::Relaxed);
        let def_size = self.tun.default_stripe_size.load(Ordering::Relaxed);
        let mut l = req.or(dir_default).cloned().unwrap_or_else(|| {
            Layout::plain(
                if def_count == u32::MAX {
                    -1
                } else {
                    def_count as i32
                },
                def_size,
                -1,
            )
        });
        l.validate(n)?;
        for c in &mut l.components {
            match &mut c.pattern {
                Pattern::Mdt => return Err(Errno::EOPNOTSUPP.into()),
                Pattern::Raid0 {
                    stripe_count,
                    stripe_offset,
                    osts,
                    ..
                } => {
                    if !osts.is_empty() {
                        continue;
                    }
                    let count = match *stripe_count {
                        -1 => n,
                        0 => def_count.min(n),
                        c => (c as u32).min(n),
                    }
                    .min(n)
                    .max(1);
                    let chosen = self.osts.choose(count, *stripe_offset);
                    if chosen.is_empty() {
                        return Err(Errno::ENOSPC.into());
                    }
                    *stripe_count = chosen.len() as i32;
                    *osts = chosen;
                }
            }
        }
        Ok(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ost(index: u32, free: u64) -> OstState {
        OstState {
            index,
            name: String::new(),
            addr: String::new(),
            free,
            active: true,
        }
    }

    #[test]
    fn round_robin_when_balanced() {
        let o = Osts::default();
        o.set(vec![ost(0, 100), ost(1, 100)]);
        let a = o.choose(1, -1);
        let b = o.choose(1, -1);
        assert_ne!(a, b);
        assert_eq!(o.choose(2, 1), vec![1, 0]);
    }

    #[test]
    fn free_space_wins_when_imbalanced() {
        let o = Osts::default();
        o.set(vec![ost(0, 10), ost(1, 100)]);
        for _ in 0..4 {
            assert_eq!(o.choose(1, -1), vec![1]);
        }
    }
}
