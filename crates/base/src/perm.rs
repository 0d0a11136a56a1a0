//! POSIX permission rules, evaluated by the MDT for every request.

use crate::{Attr, Cred, SetAttr, TimeSet};

/// Read permission.
pub const MAY_READ: u32 = 4;
/// Write permission.
pub const MAY_WRITE: u32 = 2;
/// Execute / search permission.
pub const MAY_EXEC: u32 = 1;

/// Whether `O_*` flags open a file for reading only, and neither create, truncate nor
/// append: an open whose handle another such open may share (the open cache), and
/// after which the caller's copy of the bytes may still be the file's.
pub fn plain_read(flags: i32) -> bool {
    let mask = libc::O_ACCMODE | libc::O_TRUNC | libc::O_CREAT | libc::O_APPEND;
    flags & mask == libc::O_RDONLY
}

/// `FS_IMMUTABLE_FL` (`chattr +i`): the inode may not change at all, nor be removed,
/// renamed or linked; a directory's entries may not change.
pub const FS_IMMUTABLE_FL: u32 = 0x10;
/// `FS_APPEND_FL` (`chattr +a`): a file may only be appended to, and may not be
/// removed, renamed or linked; entries may be added to a directory, not removed.
pub const FS_APPEND_FL: u32 = 0x20;
/// The inode flags lode keeps, as Lustre does; setting another is EOPNOTSUPP.
pub const FS_FLAGS_KEPT: u32 = FS_IMMUTABLE_FL | FS_APPEND_FL;

/// `bits` translated through `pairs` of (from, to) flags: each `to` whose `from` is
/// set (between the `FS_*_FL` flags, the MDT's inode flags and `struct fsxattr`'s).
pub fn map_bits(bits: u32, pairs: impl IntoIterator<Item = (u32, u32)>) -> u32 {
    pairs
        .into_iter()
        .filter(|(from, _)| bits & from != 0)
        .fold(0, |acc, (_, to)| acc | to)
}

/// Linux's rules for the immutable and append-only flags (`IS_IMMUTABLE`,
/// `IS_APPEND` in the VFS), which the MDT applies since the kernel of a FUSE mount
/// does not know an inode's flags. Each says whether an operation is refused
/// (EPERM).
pub mod iflags {
    use super::*;

    fn fixed(flags: u32) -> bool {
        flags & FS_FLAGS_KEPT != 0
    }

    /// The inode itself removed, renamed or linked (`may_delete`, `may_linkat`).
    pub fn forbid_unlink(flags: u32) -> bool {
        fixed(flags)
    }

    /// An entry added to (`removing` false) or removed from a directory.
    pub fn forbid_dir_change(dir_flags: u32, removing: bool) -> bool {
        dir_flags & FS_IMMUTABLE_FL != 0 || removing && dir_flags & FS_APPEND_FL != 0
    }

    /// An open with `O_*` flags `open` (`may_open`): no writing an immutable file,
    /// and only appending to an append-only one, never truncating it.
    pub fn forbid_open(flags: u32, open: i32) -> bool {
        if flags & FS_IMMUTABLE_FL != 0 {
            return wants_write(open);
        }
        if flags & FS_APPEND_FL != 0 {
            let writes = open & libc::O_ACCMODE != libc::O_RDONLY;
            return writes && open & libc::O_APPEND == 0 || open & libc::O_TRUNC != 0;
        }
        false
    }

    /// An attribute change other than of the flags (`notify_change`): none to an
    /// immutable inode; to an append-only one, only setting its times to now, or any
    /// times by a `writer` holding it open for writing (the kernel's own update of a
    /// writer's times).
    pub fn forbid_setattr(flags: u32, sa: &SetAttr, writer: bool) -> bool {
        if !fixed(flags) {
            return false;
        }
        let immutable = flags & FS_IMMUTABLE_FL != 0;
        let time = |t: Option<TimeSet>| match t {
            None => false,
            Some(TimeSet::Now) => immutable,
            Some(TimeSet::At(_)) => immutable || !writer,
        };
        sa.mode.is_some()
            || sa.uid.is_some()
            || sa.gid.is_some()
            || sa.size.is_some()
            || time(sa.atime)
            || time(sa.mtime)
    }

    /// An xattr (or ACL, or layout) set or removed (`xattr_permission`).
    pub fn forbid_xattr_change(flags: u32) -> bool {
        fixed(flags)
    }
}

/// Whether `O_*` flags ask for write access (or truncation): an open that may change
/// the file's bytes.
pub fn wants_write(flags: i32) -> bool {
    let acc = flags & libc::O_ACCMODE;
    acc == libc::O_WRONLY || acc == libc::O_RDWR || flags & libc::O_TRUNC != 0
}

/// The kernel's `__FMODE_EXEC` in an open's flags (Lustre's `MDS_FMODE_EXEC`, the
/// same bit): the open of a program to run, which needs search (execute) permission,
/// not read permission (a mode of `--x` runs).
pub const FMODE_EXEC: i32 = 0o40;

/// The access an open with `O_*` flags needs (MAY_* bits).
pub fn open_wants(flags: i32) -> u32 {
    let acc = flags & libc::O_ACCMODE;
    let mut want = 0;
    if acc == libc::O_RDONLY || acc == libc::O_RDWR {
        want |= if acc == libc::O_RDONLY && flags & FMODE_EXEC != 0 {
            MAY_EXEC
        } else {
            MAY_READ
        };
    }
    if wants_write(flags) {
        want |= MAY_WRITE;
    }
    want
}

/// `O_TMPFILE` without the `O_DIRECTORY` it includes: an open-create that makes a
/// file with no name (Lustre's volatile file), which `linkat` may name later.
pub const O_TMPFILE_BIT: i32 = libc::O_TMPFILE & !libc::O_DIRECTORY;

/// Whether `O_*` flags ask for a file with no name (`O_TMPFILE`).
pub fn is_tmpfile(flags: i32) -> bool {
    flags & O_TMPFILE_BIT != 0
}

/// `generic_permission` of Linux without ACLs: may `cred` access `attr` for `want`
/// (a mask of MAY_*)?
pub fn may_access(attr: &Attr, cred: &Cred, want: u32) -> bool {
    if cred.uid == 0 {
        // Root may do anything, except execute a non-directory without any x bit.
        if want & MAY_EXEC != 0 && !attr.is_dir() && attr.mode & 0o111 == 0 {
            return false;
        }
        return true;
    }
    let bits = if cred.uid == attr.uid {
        (attr.mode >> 6) & 7
    } else if cred.in_group(attr.gid) {
        (attr.mode >> 3) & 7
    } else {
        attr.mode & 7
    };
    bits & want == want
}

/// May `cred` remove or rename the entry `child` from directory `dir` (sticky rule)?
/// The caller must already have write+search permission on `dir`.
pub fn may_delete_in_sticky(dir: &Attr, child: &Attr, cred: &Cred) -> bool {
    if dir.mode & libc::S_ISVTX == 0 || cred.uid == 0 {
        return true;
    }
    cred.uid == dir.uid || cred.uid == child.uid
}

/// `mode` without the set-ID bits a change of a file's bytes or owner drops on Linux:
/// set-user-ID, and set-group-ID when the file is group-executable (without group
/// execute it marks mandatory locking, not a privilege).
pub fn drop_setid(mode: u32) -> u32 {
    let mut m = mode & !libc::S_ISUID;
    if m & libc::S_IXGRP != 0 {
        m &= !libc::S_ISGID;
    }
    m
}

/// True if `cred` owns `attr` or is root (chmod, utimes to explicit times).
pub fn is_owner_or_root(attr: &Attr, cred: &Cred) -> bool {
    cred.uid == 0 || cred.uid == attr.uid
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Fid;

    #[test]
    fn a_change_of_bytes_or_owner_drops_set_user_id_and_executable_set_group_id() {
        for (before, after) in [
            (0o6755, 0o755),
            (0o4755, 0o755),
            (0o2745, 0o2745),
            (0o2755, 0o755),
            (0o100644, 0o100644),
            (0o106711, 0o100711),
        ] {
            assert_eq!(drop_setid(before), after, "{before:o}");
        }
    }

    #[test]
    fn an_exec_open_needs_execute_permission_not_read() {
        assert_eq!(open_wants(libc::O_RDONLY), MAY_READ);
        assert_eq!(open_wants(libc::O_RDONLY | FMODE_EXEC), MAY_EXEC);
        assert_eq!(open_wants(libc::O_RDWR), MAY_READ | MAY_WRITE);
        assert_eq!(open_wants(libc::O_WRONLY), MAY_WRITE);
        assert_eq!(
            open_wants(libc::O_RDONLY | libc::O_TRUNC),
            MAY_READ | MAY_WRITE
        );
        // No O_* flag of userspace's is FMODE_EXEC.
        for f in [
            libc::O_CREAT,
            libc::O_EXCL,
            libc::O_NOCTTY,
            libc::O_TRUNC,
            libc::O_APPEND,
        ] {
            assert_eq!(f & FMODE_EXEC, 0);
        }
    }

    #[test]
    fn immutable_and_append_only_inodes_refuse_what_linux_refuses() {
        use iflags::*;
        let (i, a) = (FS_IMMUTABLE_FL, FS_APPEND_FL);
        for f in [i, a, i | a] {
            assert!(forbid_unlink(f) && forbid_xattr_change(f));
        }
        assert!(!forbid_unlink(0) && !forbid_xattr_change(0));
        assert!(forbid_dir_change(i, false) && forbid_dir_change(i, true));
        assert!(!forbid_dir_change(a, false) && forbid_dir_change(a, true));
        assert!(!forbid_dir_change(0, true));
        let (rd, wr, app, tr) = (
            libc::O_RDONLY,
            libc::O_WRONLY,
            libc::O_APPEND,
            libc::O_TRUNC,
        );
        assert!(!forbid_open(i, rd) && forbid_open(i, wr) && forbid_open(i, rd | tr));
        assert!(forbid_open(i, wr | app));
        assert!(!forbid_open(a, rd) && forbid_open(a, wr) && !forbid_open(a, wr | app));
        assert!(!forbid_open(a, libc::O_RDWR | app) && forbid_open(a, wr | app | tr));
        let touch = SetAttr {
            mtime: Some(TimeSet::Now),
            ..Default::default()
        };
        let set = SetAttr {
            mtime: Some(TimeSet::At(5)),
            ..Default::default()
        };
        let chmod = SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        assert!(forbid_setattr(i, &touch, false) && forbid_setattr(i, &chmod, false));
        assert!(
            !forbid_setattr(a, &touch, false)
                && forbid_setattr(a, &set, false)
                && forbid_setattr(a, &chmod, true)
        );
        assert!(!forbid_setattr(0, &chmod, false));
        assert!(!forbid_setattr(a, &set, true), "a writer's times");
        assert!(
            !forbid_setattr(i, &SetAttr::default(), false),
            "a flags-only change"
        );
    }

    #[test]
    fn plain_read_is_read_only_without_create_truncate_or_append() {
        assert!(plain_read(libc::O_RDONLY));
        assert!(plain_read(
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW
        ));
        assert!(!plain_read(libc::O_RDWR));
        assert!(!plain_read(libc::O_WRONLY));
        assert!(!plain_read(libc::O_RDONLY | libc::O_TRUNC));
        assert!(!plain_read(libc::O_RDONLY | libc::O_CREAT));
        assert!(!plain_read(libc::O_RDONLY | libc::O_APPEND));
    }

    /// Attributes with this mode and owner, the rest zero (tests of permission rules).
    pub(crate) fn attr(mode: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            fid: Fid::ROOT,
            mode,
            uid,
            gid,
            nlink: 1,
            size: 0,
            blocks: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            btime: 0,
            rdev: 0,
            flags: 0,
        }
    }

    #[test]
    fn owner_group_other_classes() {
        let a = attr(libc::S_IFREG | 0o640, 10, 20);
        let owner = Cred {
            uid: 10,
            gid: 99,
            groups: vec![],
        };
        let member = Cred {
            uid: 11,
            gid: 99,
            groups: vec![20],
        };
        let other = Cred {
            uid: 12,
            gid: 99,
            groups: vec![],
        };
        assert!(may_access(&a, &owner, MAY_READ | MAY_WRITE));
        assert!(may_access(&a, &member, MAY_READ));
        assert!(!may_access(&a, &member, MAY_WRITE));
        assert!(!may_access(&a, &other, MAY_READ));
        assert!(may_access(&a, &Cred::root(), MAY_READ | MAY_WRITE));
        assert!(!may_access(&a, &Cred::root(), MAY_EXEC));
    }

    #[test]
    fn sticky_directory_protects_others_entries() {
        let dir = attr(libc::S_IFDIR | 0o1777, 0, 0);
        let f = attr(libc::S_IFREG | 0o644, 10, 10);
        assert!(may_delete_in_sticky(
            &dir,
            &f,
            &Cred {
                uid: 10,
                gid: 10,
                groups: vec![]
            }
        ));
        assert!(!may_delete_in_sticky(
            &dir,
            &f,
            &Cred {
                uid: 11,
                gid: 10,
                groups: vec![]
            }
        ));
    }
}
