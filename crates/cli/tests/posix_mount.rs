//! POSIX behaviour through a real FUSE mount, checked against what Linux does locally.
//! `posix_mount_dom.rs` runs the same checks under a Data-on-MDT default layout.

/// Every file under the file system's default layout (plain, one OST stripe).
const DOM_DEFAULT: bool = false;

mod common;

include!("posix/checks.rs");
