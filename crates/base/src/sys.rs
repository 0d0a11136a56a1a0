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
    })
}
