//! The FUSE adapter over the lode client library, on lode's own kernel interface
//! (`kernel`: `/dev/fuse` and FUSE over io_uring).
//!
//! A request runs on the thread that took it from the kernel (a `/dev/fuse` reader or a
//! ring thread), which sends its own RPCs and reads its own replies. The kernel checks
//! mode bits (`default_permissions`) from attributes kept coherent by locks; the
//! servers check again, with the caller's uid, gid and supplementary groups.

mod attr;
mod caller;
mod cred;
mod fs;
pub mod kernel;

pub use fs::{
    LodeFs, MountOptions, FID2PATH_XATTR, FID_XATTR, MIGRATE_XATTR, SELINUX_FS, STATFS_XATTR,
};
