//! Mounting: `mount(2)` on a new `/dev/fuse` descriptor where this process may (root),
//! else through the setuid helper `fusermount3`, which mounts and passes the
//! descriptor back over a socket (libfuse's protocol: `_FUSE_COMMFD`, `SCM_RIGHTS`).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mount option.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountOption {
    /// The source shown in `/proc/mounts`.
    FSName(String),
    /// The file system type's second half (`fuse.SUBTYPE`).
    Subtype(String),
    /// The kernel checks permission bits itself.
    DefaultPermissions,
    /// Users other than the one mounting may use the mount.
    AllowOther,
    /// Set-user-ID and set-group-ID bits take effect (off by default).
    Suid,
    /// Device nodes work (off by default).
    Dev,
    /// Programs cannot be run from the mount.
    NoExec,
    /// Read-only.
    RO,
    /// Access times are not updated.
    NoAtime,
    /// Any other `key[=value]` option, passed to the kernel as is.
    Custom(String),
}

/// Where the file system is mounted; unmounted again by [`Mount::unmount`].
pub struct Mount {
    /// The mount point, made absolute.
    pub mountpoint: PathBuf,
}

impl Mount {
    /// Mounts a FUSE file system on `mountpoint`; returns the connection's `/dev/fuse`
    /// descriptor.
    pub fn new(mountpoint: &Path, options: &[MountOption]) -> io::Result<(OwnedFd, Mount)> {
        let mountpoint = mountpoint.canonicalize()?;
        let fd = match mount_sys(&mountpoint, options)? {
            Some(fd) => fd,
            None => mount_fusermount(&mountpoint, options)?,
        };
        Ok((fd, Mount { mountpoint }))
    }

    /// Unmounts (lazily: open files keep it until they close), directly or through
    /// `fusermount3`.
    pub fn unmount(&self) -> io::Result<()> {
        let p = CString::new(self.mountpoint.as_os_str().as_bytes())?;
        // SAFETY: a valid C string.
        if unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::ENOENT) => Ok(()),
            Some(libc::EPERM) => {
                let st = Command::new("fusermount3")
                    .args(["-u", "-z", "--"])
                    .arg(&self.mountpoint)
                    .status()?;
                if st.success() {
                    Ok(())
                } else {
                    Err(io::Error::other(format!("fusermount3 -u: {st}")))
                }
            }
            _ => Err(e),
        }
    }
}

fn open_dev_fuse() -> io::Result<OwnedFd> {
    // SAFETY: a constant C string; the descriptor returned is ours.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(e.kind(), "/dev/fuse not found (modprobe fuse)")
        } else {
            e
        });
    }
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The kernel option string for `options` (without `fd`, `rootmode`, ids).
fn kernel_options(options: &[MountOption]) -> Vec<String> {
    options
        .iter()
        .filter_map(|o| match o {
            MountOption::DefaultPermissions => Some("default_permissions".to_string()),
            MountOption::AllowOther => Some("allow_other".to_string()),
            MountOption::Custom(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

fn subtype(options: &[MountOption]) -> Option<&str> {
    options.iter().find_map(|o| match o {
        MountOption::Subtype(s) => Some(s.as_str()),
        _ => None,
    })
}

fn fsname(options: &[MountOption]) -> Option<&str> {
    options.iter().find_map(|o| match o {
        MountOption::FSName(s) => Some(s.as_str()),
        _ => None,
    })
}

/// `mount(2)` directly; `None` if this process may not (not root).
fn mount_sys(mountpoint: &Path, options: &[MountOption]) -> io::Result<Option<OwnedFd>> {
    let mode = std::fs::metadata(mountpoint)?.permissions().mode() & libc::S_IFMT;
    let fd = open_dev_fuse()?;
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut opts = vec![
        format!("fd={}", fd.as_raw_fd()),
        format!("rootmode={mode:o}"),
        format!("user_id={uid}"),
        format!("group_id={gid}"),
    ];
    opts.extend(kernel_options(options));
    let mut flags: libc::c_ulong = 0;
    if !options.contains(&MountOption::Dev) {
        flags |= libc::MS_NODEV;
    }
    if !options.contains(&MountOption::Suid) {
        flags |= libc::MS_NOSUID;
    }
    for o in options {
        flags |= match o {
            MountOption::NoExec => libc::MS_NOEXEC,
            MountOption::RO => libc::MS_RDONLY,
            MountOption::NoAtime => libc::MS_NOATIME,
            _ => 0,
        };
    }
    let fstype = match subtype(options) {
        Some(s) => format!("fuse.{s}"),
        None => "fuse".to_string(),
    };
    let source = CString::new(fsname(options).unwrap_or("/dev/fuse"))?;
    let fstype = CString::new(fstype)?;
    let target = CString::new(mountpoint.as_os_str().as_bytes())?;
    let data = CString::new(opts.join(","))?;
    // SAFETY: valid C strings that outlive the call.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if r == 0 {
        return Ok(Some(fd));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EPERM) {
        return Ok(None);
    }
    Err(io::Error::new(
        e.kind(),
        format!("mount({}): {e}", mountpoint.display()),
    ))
}

/// Mounts through `fusermount3`, which sends the descriptor back on a socket.
fn mount_fusermount(mountpoint: &Path, options: &[MountOption]) -> io::Result<OwnedFd> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just made, owned by nobody else.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut opts = kernel_options(options);
    for o in options {
        match o {
            MountOption::FSName(s) => opts.push(format!("fsname={s}")),
            MountOption::Subtype(s) => opts.push(format!("subtype={s}")),
            MountOption::Suid => opts.push("suid".into()),
            MountOption::Dev => opts.push("dev".into()),
            MountOption::NoExec => opts.push("noexec".into()),
            MountOption::RO => opts.push("ro".into()),
            MountOption::NoAtime => opts.push("noatime".into()),
            _ => {}
        }
    }
    if !options.contains(&MountOption::Suid) {
        opts.push("nosuid".into());
    }
    if !options.contains(&MountOption::Dev) {
        opts.push("nodev".into());
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-o")
        .arg(opts.join(","))
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string());
    let child_fd = theirs.as_raw_fd();
    // SAFETY: between fork and exec only async-signal-safe calls: clear CLOEXEC on the
    // socket end fusermount3 must inherit.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::fcntl(child_fd, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("fusermount3: {e}")))?;
    drop(theirs);
    let fd = receive_fd(&ours);
    let st = child.wait()?;
    match fd {
        Ok(fd) if st.success() => Ok(fd),
        Ok(_) | Err(_) if !st.success() => Err(io::Error::other(format!(
            "fusermount3 could not mount {}: {st}",
            mountpoint.display()
        ))),
        r => r,
    }
}

/// Receives one descriptor sent with `SCM_RIGHTS`.
fn receive_fd(sock: &OwnedFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one descriptor's control message, aligned.
    let mut cbuf = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; its pointers are set below to live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    loop {
        // SAFETY: msg points to live buffers for the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::other("fusermount3 sent no descriptor"));
        }
        break;
    }
    // SAFETY: walking the control messages recvmsg filled in.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                return Ok(OwnedFd::from_raw_fd(fd));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Err(io::Error::other("fusermount3 sent no descriptor"))
}
