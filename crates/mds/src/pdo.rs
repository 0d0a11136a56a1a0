//! Parallel directory operations: a directory is locked shared for operations on one
//! name, plus an exclusive lock on (directory, name hash); whole-directory changes take
//! the directory exclusively. Inode locks serialize read-modify-write of one inode
//! record. Locks are striped (fixed tables) and always taken in stripe order, so two
//! operations never wait on each other in a cycle.

use lode_base::Fid;
use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

const DIR_STRIPES: usize = 1024;
const NAME_STRIPES: usize = 4096;
const INODE_STRIPES: usize = 4096;

fn mix(fid: Fid, extra: u64) -> u64 {
    let mut h = fid.seq.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ u64::from(fid.oid).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    h ^= extra.wrapping_mul(0x1656_67b1_9e37_79f9);
    h ^ (h >> 29)
}

/// Directory lock mode.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Mode {
    /// Operations on names.
    Shared,
    /// Whole-directory changes.
    Exclusive,
}

/// The lock tables of one MDT.
pub struct Pdo {
    dirs: Vec<RwLock<()>>,
    names: Vec<Mutex<()>>,
    inodes: Vec<Mutex<()>>,
    /// Serializes renames that move entries between directories, so the loop check
    /// ("never a directory into its own subtree") sees a stable tree.
    pub rename: Mutex<()>,
}

enum DirGuard<'a> {
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// Held locks; released on drop.
#[derive(Default)]
pub struct Held<'a> {
    dirs: Vec<DirGuard<'a>>,
    names: Vec<MutexGuard<'a, ()>>,
    inodes: Vec<MutexGuard<'a, ()>>,
}

impl Default for Pdo {
    fn default() -> Self {
        Pdo {
            dirs: (0..DIR_STRIPES).map(|_| RwLock::new(())).collect(),
            names: (0..NAME_STRIPES).map(|_| Mutex::new(())).collect(),
            inodes: (0..INODE_STRIPES).map(|_| Mutex::new(())).collect(),
            rename: Mutex::new(()),
        }
    }
}

impl Pdo {
    /// Locks directories (each in its mode; the stronger mode wins for a shared stripe)
    /// and then names `(dir, hash)`, each set in stripe order.
    pub fn lock<'a>(&'a self, dirs: &[(Fid, Mode)], names: &[(Fid, u64)]) -> Held<'a> {
        let mut d: Vec<(usize, Mode)> = dirs
            .iter()
            .map(|(f, m)| (mix(*f, 0) as usize % DIR_STRIPES, *m))
            .collect();
        d.sort();
        let mut dd: Vec<(usize, Mode)> = Vec::with_capacity(d.len());
        for (i, m) in d {
            match dd.last_mut() {
                Some(last) if last.0 == i => last.1 = last.1.max(m),
                _ => dd.push((i, m)),
            }
        }
        let mut held = Held::default();
        for (i, m) in dd {
            held.dirs.push(match m {
                Mode::Shared => DirGuard::Shared(self.dirs[i].read()),
                Mode::Exclusive => DirGuard::Exclusive(self.dirs[i].write()),
            });
        }
        let mut n: Vec<usize> = names
            .iter()
            .map(|(f, h)| mix(*f, *h) as usize % NAME_STRIPES)
            .collect();
        n.sort_unstable();
        n.dedup();
        for i in n {
            held.names.push(self.names[i].lock());
        }
        held
    }

    /// Adds inode locks (taken after directory and name locks, in stripe order).
    pub fn lock_inodes<'a>(&'a self, held: &mut Held<'a>, fids: &[Fid]) {
        let mut n: Vec<usize> = fids
            .iter()
            .map(|f| mix(*f, 1) as usize % INODE_STRIPES)
            .collect();
        n.sort_unstable();
        n.dedup();
        for i in n {
            held.inodes.push(self.inodes[i].lock());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_stripe_twice_does_not_deadlock() {
        let p = Pdo::default();
        let f = Fid::ROOT;
        let mut h = p.lock(
            &[(f, Mode::Shared), (f, Mode::Exclusive)],
            &[(f, 1), (f, 1)],
        );
        p.lock_inodes(&mut h, &[f, f]);
    }
}
