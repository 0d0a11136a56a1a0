//! Layout instantiation: turning a template (file system default, directory default
//! or an explicit request) into a layout with OSTs chosen, round robin while free space
//! is balanced and by free space when it is not (Lustre's `qos_threshold_rr`, 17%).

use crate::{Namespace, OpResult};
use lode_base::limits::DOM_SIZE_MAX;
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
    /// Makes the layout of a new regular file from an explicit request, else the
    /// directory's default, else the root's (the file system default), else
    /// `lod.*.stripecount/stripesize`. Only the first component is instantiated (OSTs
    /// chosen); the others wait for a write to reach them ([`Namespace::instantiate`]).
    /// An explicit request breaking a rule is refused; an inherited template is first
    /// fitted to `dom_stripesize`, as Lustre does. A replay keeps what its client was
    /// given, so `dom_stripesize` does not bound it.
    pub(crate) fn new_layout(
        &self,
        req: Option<&Layout>,
        dir_default: Option<&Layout>,
        replay: bool,
    ) -> OpResult<Layout> {
        let root_default;
        let dir_default = match dir_default {
            Some(d) => Some(d),
            None if req.is_none() => {
                root_default = self.root_default();
                root_default.as_ref()
            }
            None => None,
        };
        let def_count = self.tun.default_stripe_count.load(Ordering::Relaxed);
        let def_size = self.tun.default_stripe_size.load(Ordering::Relaxed);
        let mut l = match req.or(dir_default) {
            Some(t) => t.clone(),
            None => Layout::plain(
                if def_count == u32::MAX {
                    -1
                } else {
                    def_count as i32
                },
                def_size,
                -1,
            ),
        };
        let dom_max = if replay {
            DOM_SIZE_MAX
        } else {
            self.tun.dom_stripesize.load(Ordering::Relaxed)
        };
        if req.is_none() {
            l = l.fit_dom(dom_max).ok_or(Errno::EFBIG)?;
        }
        if !replay {
            // Ids 1..n, whatever the request said: a migration's are above
            // `COMPONENTS_MAX` (see `migrate`), so no two layouts of a file share one.
            for (i, c) in l.components.iter_mut().enumerate() {
                c.id = i as u32 + 1;
            }
        }
        let n = self.check_layout(&l, dom_max)?;
        self.instantiate(&mut l, &[0], n)?;
        Ok(l)
    }

    /// The root's default layout (the file system's), read outside version-based
    /// recovery's bookkeeping: a replay brings its layout and does not read it, so it
    /// must not count in the original's versions either.
    fn root_default(&self) -> Option<Layout> {
        let raw = self.store.inode(&lode_base::Fid::ROOT.to_bytes()).ok()??;
        lode_store::records::InodeRec::decode(&raw).ok()?.layout
    }

    /// Checks a directory's default layout (a template: nothing instantiated) against
    /// the rules and this MDT's `dom_stripesize`.
    pub(crate) fn check_template(&self, l: &Layout) -> OpResult<()> {
        self.check_layout(l, self.tun.dom_stripesize.load(Ordering::Relaxed))
            .map(|_| ())
    }

    /// Checks a layout against the rules with DoM components up to `dom_max`; the
    /// number of OSTs known (see [`Namespace::ost_count_for`]).
    pub(crate) fn check_layout(&self, l: &Layout, dom_max: u64) -> OpResult<u32> {
        let n = self.ost_count_for(l);
        l.check(n.max(1), dom_max).map_err(|e| {
            tracing::debug!("layout refused: {e}");
            e.errno
        })?;
        Ok(n)
    }

    /// The number of OSTs, asked of the MGS again when the layout wants more stripes (or
    /// a higher OST index) than are known.
    pub(crate) fn ost_count_for(&self, l: &Layout) -> u32 {
        let wanted = l
            .components
            .iter()
            .map(|c| match c.pattern {
                Pattern::Raid0 {
                    stripe_count,
                    stripe_offset,
                    ..
                } => stripe_count.max(stripe_offset + 1).max(1) as u32,
                Pattern::Mdt => 0,
            })
            .max()
            .unwrap_or(0);
        let n = self.osts.count();
        if n == 0 && wanted > 0 || wanted > n {
            self.refresh_osts_now();
            return self.osts.count();
        }
        n
    }

    /// Instantiates the raid0 components at `idx` that have no OSTs yet: chooses them
    /// among the `n` OSTs known, round robin or by free space. ENOSPC when none is.
    pub(crate) fn instantiate(&self, l: &mut Layout, idx: &[usize], n: u32) -> OpResult<()> {
        let def_count = self.tun.default_stripe_count.load(Ordering::Relaxed);
        for &i in idx {
            let Some(c) = l.components.get_mut(i) else {
                continue;
            };
            let Pattern::Raid0 {
                stripe_count,
                stripe_offset,
                osts,
                ..
            } = &mut c.pattern
            else {
                continue;
            };
            if !osts.is_empty() {
                continue;
            }
            if n == 0 {
                return Err(Errno::ENOSPC.into());
            }
            let count = match *stripe_count {
                -1 => n,
                0 => def_count.min(n),
                c => (c as u32).min(n),
            }
            .max(1);
            let chosen = self.osts.choose(count, *stripe_offset);
            if chosen.is_empty() {
                return Err(Errno::ENOSPC.into());
            }
            *stripe_count = chosen.len() as i32;
            *osts = chosen;
        }
        Ok(())
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
