//! Requests from the kernel: the common header and each opcode's arguments, parsed from
//! the two parts both transports deliver (the opcode's fixed header, and the rest:
//! names, values, data).

use super::abi::{op, Fields, IN_HEADER_LEN, LK_FLOCK};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `struct fuse_in_header`: who asks, about what.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    /// The request's id, which its reply carries.
    pub unique: u64,
    /// The inode the request is about.
    pub nodeid: u64,
    /// The caller's user.
    pub uid: u32,
    /// The caller's group.
    pub gid: u32,
    /// The calling thread (0 for requests the kernel makes itself).
    pub pid: u32,
    /// The opcode.
    pub opcode: u32,
    /// The whole request's length.
    pub len: u32,
}

impl Request {
    /// Parses the 40-byte header.
    pub fn parse(h: &[u8]) -> Option<Request> {
        let mut f = super::abi::Fields(h.get(..IN_HEADER_LEN)?);
        Some(Request {
            len: f.u32()?,
            opcode: f.u32()?,
            unique: f.u64()?,
            nodeid: f.u64()?,
            uid: f.u32()?,
            gid: f.u32()?,
            pid: f.u32()?,
        })
    }
    /// The caller's user.
    pub fn uid(&self) -> u32 {
        self.uid
    }
    /// The caller's group.
    pub fn gid(&self) -> u32 {
        self.gid
    }
    /// The calling thread.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

/// A time to set: now, or a given instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeOrNow {
    /// The given time.
    SpecificTime(SystemTime),
    /// The server's current time.
    Now,
}

/// A SETATTR's changes.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetattrIn {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeOrNow>,
    /// New modification time.
    pub mtime: Option<TimeOrNow>,
    /// The open file the change comes through (a truncate of an open file).
    pub fh: Option<u64>,
}

/// A lock request (`fuse_lk_in`).
#[derive(Clone, Copy, Debug)]
pub struct LkIn {
    /// The open file.
    pub fh: u64,
    /// The lock's owner: a process's files table (record locks) or an open file
    /// description (flock and OFD locks).
    pub owner: u64,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive).
    pub end: u64,
    /// `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
    pub typ: i32,
    /// The process asking.
    pub pid: u32,
    /// A `flock(2)` lock.
    pub flock: bool,
}

/// One request's arguments.
#[derive(Debug)]
#[allow(missing_docs)]
pub enum Op<'a> {
    Lookup {
        name: &'a [u8],
    },
    Forget {
        nlookup: u64,
    },
    BatchForget {
        forgets: Vec<(u64, u64)>,
    },
    Getattr {
        fh: Option<u64>,
    },
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        name: &'a [u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    Mkdir {
        name: &'a [u8],
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    Rename {
        name: &'a [u8],
        newdir: u64,
        newname: &'a [u8],
        flags: u32,
    },
    Link {
        oldnodeid: u64,
        newname: &'a [u8],
    },
    Open {
        flags: i32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        data: &'a [u8],
        /// The write must drop set-ID bits (`FUSE_WRITE_KILL_SUIDGID`).
        kill_suidgid: bool,
    },
    Statfs,
    Release {
        fh: u64,
        flags: i32,
        lock_owner: Option<u64>,
        flush: bool,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    Setxattr {
        name: &'a [u8],
        value: &'a [u8],
        flags: i32,
    },
    Getxattr {
        name: &'a [u8],
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Flush {
        fh: u64,
        lock_owner: u64,
    },
    Opendir {
        flags: i32,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Readdirplus {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Releasedir {
        fh: u64,
    },
    Fsyncdir {
        fh: u64,
        datasync: bool,
    },
    Getlk(LkIn),
    Setlk {
        lk: LkIn,
        sleep: bool,
    },
    Access {
        mask: u32,
    },
    Create {
        name: &'a [u8],
        flags: i32,
        mode: u32,
        umask: u32,
    },
    /// `open(dir, O_TMPFILE)`: a `fuse_create_in` like CREATE's; the name the
    /// kernel sends ("/") is not the file's (it has none).
    Tmpfile {
        flags: i32,
        mode: u32,
        umask: u32,
    },
    Interrupt,
    Destroy,
    Ioctl {
        cmd: u32,
        /// The argument's bytes the kernel passes in.
        data: &'a [u8],
        /// Bytes the kernel takes back.
        out_size: u32,
    },
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    },
    /// GETATTR with the birth time: `statx(2)` asking for `STATX_BTIME`.
    Statx {
        fh: Option<u64>,
    },
    /// `SEEK_DATA` or `SEEK_HOLE` (the kernel answers the other kinds itself).
    Lseek {
        fh: u64,
        offset: u64,
        whence: u32,
    },
    /// An opcode lode does not serve: answered `ENOSYS`.
    Unsupported,
}

fn time(secs: u64, nsecs: u32) -> SystemTime {
    let s = secs as i64;
    if s >= 0 {
        UNIX_EPOCH + Duration::new(s as u64, nsecs)
    } else {
        UNIX_EPOCH - Duration::from_secs(s.unsigned_abs()) + Duration::from_nanos(nsecs.into())
    }
}

/// The handle a `fuse_getattr_in` names, if its flags say it names one
/// (`FUSE_GETATTR_FH`).
fn getattr_fh(f: &mut Fields) -> Option<Option<u64>> {
    let flags = f.u32()?;
    f.u32()?;
    let fh = f.u64()?;
    Some((flags & 1 != 0).then_some(fh))
}

/// Parses opcode `opcode`'s arguments from its fixed header `h` and the rest `p`.
/// `None`: the request is malformed (answered `EIO`).
pub fn parse<'a>(opcode: u32, h: &'a [u8], p: &'a [u8]) -> Option<Op<'a>> {
    let mut f = Fields(h);
    let mut rest = Fields(p);
    Some(match opcode {
        op::LOOKUP => Op::Lookup { name: rest.cstr()? },
        op::FORGET => Op::Forget { nlookup: f.u64()? },
        op::BATCH_FORGET => {
            let count = f.u32()? as usize;
            // At most what the buffer holds, whatever the count says.
            let mut forgets = Vec::with_capacity(count.min(p.len() / 16));
            for _ in 0..count {
                forgets.push((rest.u64()?, rest.u64()?));
            }
            Op::BatchForget { forgets }
        }
        op::GETATTR => Op::Getattr {
            fh: getattr_fh(&mut f)?,
        },
        op::SETATTR => {
            use super::abi::fattr;
            let valid = f.u32()?;
            f.u32()?;
            let fh = f.u64()?;
            let size = f.u64()?;
            let _lock_owner = f.u64()?;
            let (atime, mtime, _ctime) = (f.u64()?, f.u64()?, f.u64()?);
            let (atimensec, mtimensec, _ctimensec) = (f.u32()?, f.u32()?, f.u32()?);
            let mode = f.u32()?;
            f.u32()?;
            let (uid, gid) = (f.u32()?, f.u32()?);
            let when = |set: u32, now: u32, s, n| {
                if valid & now != 0 {
                    Some(TimeOrNow::Now)
                } else if valid & set != 0 {
                    Some(TimeOrNow::SpecificTime(time(s, n)))
                } else {
                    None
                }
            };
            Op::Setattr(SetattrIn {
                mode: (valid & fattr::MODE != 0).then_some(mode),
                uid: (valid & fattr::UID != 0).then_some(uid),
                gid: (valid & fattr::GID != 0).then_some(gid),
                size: (valid & fattr::SIZE != 0).then_some(size),
                atime: when(fattr::ATIME, fattr::ATIME_NOW, atime, atimensec),
                mtime: when(fattr::MTIME, fattr::MTIME_NOW, mtime, mtimensec),
                fh: (valid & fattr::FH != 0).then_some(fh),
            })
        }
        op::READLINK => Op::Readlink,
        op::SYMLINK => Op::Symlink {
            name: rest.cstr()?,
            target: rest.cstr()?,
        },
        op::MKNOD => {
            let (mode, rdev, umask) = (f.u32()?, f.u32()?, f.u32()?);
            Op::Mknod {
                name: rest.cstr()?,
                mode,
                rdev,
                umask,
            }
        }
        op::MKDIR => {
            let (mode, umask) = (f.u32()?, f.u32()?);
            Op::Mkdir {
                name: rest.cstr()?,
                mode,
                umask,
            }
        }
        op::UNLINK => Op::Unlink { name: rest.cstr()? },
        op::RMDIR => Op::Rmdir { name: rest.cstr()? },
        op::RENAME | op::RENAME2 => {
            let newdir = f.u64()?;
            let flags = if opcode == op::RENAME2 { f.u32()? } else { 0 };
            Op::Rename {
                newdir,
                flags,
                name: rest.cstr()?,
                newname: rest.cstr()?,
            }
        }
        op::LINK => Op::Link {
            oldnodeid: f.u64()?,
            newname: rest.cstr()?,
        },
        op::OPEN => Op::Open { flags: f.i32()? },
        op::OPENDIR => Op::Opendir { flags: f.i32()? },
        op::READ | op::READDIR | op::READDIRPLUS => {
            let (fh, offset, size) = (f.u64()?, f.u64()?, f.u32()?);
            match opcode {
                op::READ => Op::Read { fh, offset, size },
                op::READDIR => Op::Readdir { fh, offset, size },
                _ => Op::Readdirplus { fh, offset, size },
            }
        }
        op::WRITE => {
            let (fh, offset, size, write_flags) = (f.u64()?, f.u64()?, f.u32()?, f.u32()?);
            Op::Write {
                fh,
                offset,
                data: p.get(..size as usize)?,
                kill_suidgid: write_flags & super::abi::WRITE_KILL_SUIDGID != 0,
            }
        }
        op::STATFS => Op::Statfs,
        op::RELEASE => {
            let (fh, flags, release_flags, lock_owner) = (f.u64()?, f.i32()?, f.u32()?, f.u64()?);
            Op::Release {
                fh,
                flags,
                // FUSE_RELEASE_FLUSH, FUSE_RELEASE_FLOCK_UNLOCK
                flush: release_flags & 1 != 0,
                lock_owner: (release_flags & super::abi::RELEASE_FLOCK_UNLOCK != 0)
                    .then_some(lock_owner),
            }
        }
        op::RELEASEDIR => Op::Releasedir { fh: f.u64()? },
        op::FSYNC | op::FSYNCDIR => {
            let (fh, flags) = (f.u64()?, f.u32()?);
            let datasync = flags & 1 != 0;
            if opcode == op::FSYNC {
                Op::Fsync { fh, datasync }
            } else {
                Op::Fsyncdir { fh, datasync }
            }
        }
        op::SETXATTR => {
            let (size, flags) = (f.u32()?, f.i32()?);
            let name = rest.cstr()?;
            Op::Setxattr {
                name,
                value: rest.bytes(size as usize)?,
                flags,
            }
        }
        op::GETXATTR => {
            let size = f.u32()?;
            Op::Getxattr {
                name: rest.cstr()?,
                size,
            }
        }
        op::LISTXATTR => Op::Listxattr { size: f.u32()? },
        op::REMOVEXATTR => Op::Removexattr { name: rest.cstr()? },
        op::FLUSH => {
            let fh = f.u64()?;
            f.u64()?;
            Op::Flush {
                fh,
                lock_owner: f.u64()?,
            }
        }
        op::GETLK | op::SETLK | op::SETLKW => {
            let lk = LkIn {
                fh: f.u64()?,
                owner: f.u64()?,
                start: f.u64()?,
                end: f.u64()?,
                typ: f.i32()?,
                pid: f.u32()?,
                flock: f.u32()? & LK_FLOCK != 0,
            };
            match opcode {
                op::GETLK => Op::Getlk(lk),
                _ => Op::Setlk {
                    lk,
                    sleep: opcode == op::SETLKW,
                },
            }
        }
        op::ACCESS => Op::Access { mask: f.u32()? },
        op::CREATE => {
            let (flags, mode, umask) = (f.i32()?, f.u32()?, f.u32()?);
            Op::Create {
                name: rest.cstr()?,
                flags,
                mode,
                umask,
            }
        }
        op::TMPFILE => Op::Tmpfile {
            flags: f.i32()?,
            mode: f.u32()?,
            umask: f.u32()?,
        },
        op::INTERRUPT => {
            f.u64()?;
            Op::Interrupt
        }
        op::DESTROY => Op::Destroy,
        // `fuse_ioctl_in`: fh, flags, cmd, arg, in_size, out_size; `in_size` bytes of
        // the argument follow.
        op::IOCTL => {
            f.u64()?;
            f.u32()?;
            let cmd = f.u32()?;
            f.u64()?;
            let in_size = f.u32()? as usize;
            let out_size = f.u32()?;
            Op::Ioctl {
                cmd,
                data: p.get(..in_size)?,
                out_size,
            }
        }
        op::FALLOCATE => Op::Fallocate {
            fh: f.u64()?,
            offset: f.u64()?,
            length: f.u64()?,
            mode: f.i32()?,
        },
        // `fuse_statx_in` begins as `fuse_getattr_in`; the statx flags and mask after
        // it change nothing lode answers.
        op::STATX => Op::Statx {
            fh: getattr_fh(&mut f)?,
        },
        op::LSEEK => Op::Lseek {
            fh: f.u64()?,
            offset: f.u64()?,
            whence: f.u32()?,
        },
        _ => Op::Unsupported,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::abi::Put;

    #[test]
    fn a_header_is_parsed_and_a_short_one_refused() {
        let h = Put::<40>::new()
            .u32(45)
            .u32(op::LOOKUP)
            .u64(2)
            .u64(1)
            .u32(1000)
            .u32(100)
            .u32(4242)
            .u32(0)
            .done();
        let r = Request::parse(&h).expect("header");
        assert_eq!(
            (r.unique, r.nodeid, r.uid, r.gid, r.pid),
            (2, 1, 1000, 100, 4242)
        );
        assert!(Request::parse(&h[..39]).is_none());
    }

    #[test]
    fn names_and_values_come_from_the_rest() {
        match parse(op::LOOKUP, &[], b"file\0") {
            Some(Op::Lookup { name }) => assert_eq!(name, b"file"),
            o => panic!("{o:?}"),
        }
        let h = Put::<16>::new().u64(9).u32(1).u32(0).done();
        match parse(op::RENAME2, &h, b"a\0bc\0") {
            Some(Op::Rename {
                name,
                newdir,
                newname,
                flags,
            }) => assert_eq!(
                (name, newdir, newname, flags),
                (&b"a"[..], 9, &b"bc"[..], 1)
            ),
            o => panic!("{o:?}"),
        }
        let h = Put::<8>::new().u32(3).u32(0).done();
        match parse(op::SETXATTR, &h, b"user.x\0abcdef") {
            Some(Op::Setxattr { name, value, .. }) => {
                assert_eq!((name, value), (&b"user.x"[..], &b"abc"[..]))
            }
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn malformed_requests_are_refused_not_read_past() {
        // No NUL after the name.
        assert!(parse(op::LOOKUP, &[], b"file").is_none());
        // A value longer than what came.
        let h = Put::<8>::new().u32(100).u32(0).done();
        assert!(parse(op::SETXATTR, &h, b"user.x\0abc").is_none());
        // A write shorter than it says.
        let h = Put::<40>::new().u64(1).u64(0).u32(10).skip(20).done();
        assert!(parse(op::WRITE, &h, b"12345").is_none());
        // A batch forget counting more than it holds.
        let h = Put::<8>::new().u32(1_000_000).u32(0).done();
        assert!(parse(op::BATCH_FORGET, &h, &[0; 32]).is_none());
        // A header too short for its opcode.
        assert!(parse(op::GETATTR, &[0; 8], &[]).is_none());
    }

    #[test]
    fn setattr_takes_only_the_fields_marked_valid() {
        use crate::kernel::abi::fattr;
        let h = Put::<88>::new()
            .u32(fattr::MODE | fattr::MTIME_NOW | fattr::SIZE)
            .u32(0)
            .u64(0)
            .u64(123)
            .u64(0)
            .u64(0)
            .u64(0)
            .u64(0)
            .u32(0)
            .u32(0)
            .u32(0)
            .u32(0o640)
            .u32(0)
            .u32(5)
            .u32(6)
            .u32(0)
            .done();
        match parse(op::SETATTR, &h, &[]) {
            Some(Op::Setattr(s)) => {
                assert_eq!(
                    (s.mode, s.uid, s.gid, s.size),
                    (Some(0o640), None, None, Some(123))
                );
                assert_eq!((s.atime, s.mtime, s.fh), (None, Some(TimeOrNow::Now), None));
            }
            o => panic!("{o:?}"),
        }
    }
}
