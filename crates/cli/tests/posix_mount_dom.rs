//! The POSIX checks of `posix_mount.rs` again, every file under a Data-on-MDT default
//! layout set on the root (64 KiB on the MDT, then one OST to 1 MiB, then two).

/// Every file under the root's DoM default layout.
const DOM_DEFAULT: bool = true;

/// The mount's options beyond the test kit's (requests over io_uring where the kernel
/// offers it, the default).
const MOUNT_OPTIONS: &[&str] = &[];

mod common;

include!("posix/checks.rs");
