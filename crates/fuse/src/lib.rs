//! The FUSE adapter over the lode client library (`fuser` 0.18).
//!
//! A FUSE thread never waits on the network: every request that needs a server is
//! handed, with its reply object, to the client's runtime, and the thread goes back to
//! reading `/dev/fuse`. The servers check permissions (`default_permissions` is off):
//! each request carries the caller's uid, gid and supplementary groups.

mod attr;
mod caller;
mod cred;
mod fs;

pub use fs::{
    LodeFs, MountOptions, FID2PATH_XATTR, FID_XATTR, MIGRATE_XATTR, SELINUX_FS, STATFS_XATTR,
};
