//! The few system calls lode's servers share.

use std::path::Path;

/// Space and inodes of the file system holding `dir`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsSpace {
    /// Fragment size in bytes.
    pub bsize: u32,
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Blocks available to unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Which file system this is, on which machine ([`space_id`]): targets whose
    /// directories share one file system share its space, counted once.
    pub space_id: u64,
}

/// statvfs(2) of `dir`.
pub fn statvfs(dir: &Path) -> std::io::Result<FsSpace> {
    let s = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok(FsSpace {
        bsize: s.fragment_size().max(1) as u32,
        blocks: s.blocks(),
        bfree: s.blocks_free(),
        bavail: s.blocks_available(),
        files: s.files(),
        ffree: s.files_free(),
        space_id: space_id(s.filesystem_id() as u64),
    })
}

/// An id of the file system `fsid` (statvfs's `f_fsid`) on this machine, stable while
/// both stay up: `f_fsid` alone may repeat on another machine (some file systems
/// derive it from a device number). 0 when the file system gives no id.
pub fn space_id(fsid: u64) -> u64 {
    if fsid == 0 {
        return 0;
    }
    let machine = std::fs::read("/etc/machine-id")
        .or_else(|_| std::fs::read("/proc/sys/kernel/hostname"))
        .unwrap_or_default();
    // FNV-1a: the same id in every lode process, whatever its Rust version.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in machine.iter().chain(&fsid.to_le_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_space_id_names_one_file_system_and_none_without_an_fsid() {
        assert_eq!(space_id(0), 0);
        assert_eq!(space_id(42), space_id(42));
        assert_ne!(space_id(42), 0);
        assert_ne!(space_id(42), space_id(43));
        // Two directories of one file system: one id.
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        assert_eq!(
            statvfs(a.path()).unwrap().space_id,
            statvfs(b.path()).unwrap().space_id
        );
    }
}
