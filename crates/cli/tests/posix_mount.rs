//! POSIX behaviour through a real FUSE mount, checked against what Linux does locally.
//! `posix_mount_dom.rs` runs the same checks under a Data-on-MDT default layout, and
//! `posix_mount_dev.rs` on a mount that takes requests over `/dev/fuse`, not io_uring.

/// Every file under the file system's default layout (plain, one OST stripe).
const DOM_DEFAULT: bool = false;

/// The mount's options beyond the test kit's (requests over io_uring where the kernel
/// offers it, the default).
const MOUNT_OPTIONS: &[&str] = &[];

mod common;

include!("posix/checks.rs");
