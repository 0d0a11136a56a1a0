//! The POSIX checks of `posix_mount.rs` again, on a mount that takes the kernel's
//! requests over `/dev/fuse` (`-o noio_uring`) rather than io_uring, so both of the
//! mount's transports are held to the same behaviour.

/// Every file under the file system's default layout (plain, one OST stripe).
const DOM_DEFAULT: bool = false;

/// Requests over `/dev/fuse` only.
const MOUNT_OPTIONS: &[&str] = &["noio_uring"];

mod common;

include!("posix/checks.rs");
