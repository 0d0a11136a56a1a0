//! Byte-range file locks as POSIX defines them for one file: a lock belongs to an
//! owner, and an owner's later lock or unlock replaces what it held in its range,
//! splitting the locks it cuts. The MDT keeps every client's locks this way; a client
//! keeps its own the same way, so that it can replay them after an MDT restart.

/// One held lock (or, on the MDT, one wait for a lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeLock<O> {
    /// Who holds it.
    pub owner: O,
    /// The process that took it, for `F_GETLK`.
    pub pid: u32,
    /// Exclusive (else shared).
    pub write: bool,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive).
    pub end: u64,
}

impl<O: PartialEq> RangeLock<O> {
    /// Whether the two cannot be held at once: different owners, overlapping ranges,
    /// one of them exclusive.
    pub fn conflicts(&self, other: &RangeLock<O>) -> bool {
        self.owner != other.owner
            && (self.write || other.write)
            && self.start <= other.end
            && other.start <= self.end
    }
}

/// Takes `[start, end]` out of `owner`'s locks in `locks`, splitting those it cuts.
pub fn remove_range<O: PartialEq + Copy>(
    locks: &mut Vec<RangeLock<O>>,
    owner: O,
    start: u64,
    end: u64,
) {
    let mut kept = Vec::with_capacity(locks.len() + 1);
    for l in locks.drain(..) {
        if l.owner != owner || l.end < start || end < l.start {
            kept.push(l);
            continue;
        }
        if l.start < start {
            kept.push(RangeLock {
                end: start - 1,
                ..l
            });
        }
        if l.end > end {
            kept.push(RangeLock {
                start: end + 1,
                ..l
            });
        }
    }
    *locks = kept;
}

/// Sets `l` for its owner, replacing what the owner held in its range.
pub fn set<O: PartialEq + Copy>(locks: &mut Vec<RangeLock<O>>, l: RangeLock<O>) {
    remove_range(locks, l.owner, l.start, l.end);
    locks.push(l);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lk(owner: u8, write: bool, start: u64, end: u64) -> RangeLock<u8> {
        RangeLock {
            owner,
            pid: 1,
            write,
            start,
            end,
        }
    }

    #[test]
    fn an_unlock_in_the_middle_splits_and_a_new_lock_replaces_only_its_range() {
        let mut v = vec![lk(1, true, 0, 99), lk(2, false, 200, 299)];
        remove_range(&mut v, 1, 10, 19);
        set(&mut v, lk(1, false, 50, 149));
        v.sort_by_key(|l| (l.start, l.owner));
        assert_eq!(
            v,
            vec![
                lk(1, true, 0, 9),
                lk(1, true, 20, 49),
                lk(1, false, 50, 149),
                lk(2, false, 200, 299)
            ]
        );
        assert!(lk(1, true, 0, 9).conflicts(&lk(2, false, 5, 5)));
        assert!(!lk(1, false, 0, 9).conflicts(&lk(2, false, 5, 5)));
        assert!(!lk(1, true, 0, 9).conflicts(&lk(1, true, 5, 5)));
    }
}
