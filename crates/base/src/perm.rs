//! POSIX permission rules, evaluated by the MDT for every request.

use crate::{Attr, Cred};

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

/// Whether `O_*` flags ask for write access (or truncation): an open that may change
/// the file's bytes.
pub fn wants_write(flags: i32) -> bool {
    let acc = flags & libc::O_ACCMODE;
    acc == libc::O_WRONLY || acc == libc::O_RDWR || flags & libc::O_TRUNC != 0
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

/// True if `cred` owns `attr` or is root (chmod, utimes to explicit times).
pub fn is_owner_or_root(attr: &Attr, cred: &Cred) -> bool {
    cred.uid == 0 || cred.uid == attr.uid
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Fid;

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
