//! lode's own interface to the kernel's FUSE driver: mounting, the protocol's bytes,
//! the request loop over `/dev/fuse`, and FUSE over io_uring.
//!
//! lode speaks the protocol itself rather than through `fuser` (which it used until
//! this module existed) because no Rust FUSE crate offers the kernel's io_uring
//! transport, which keeps each request's round trip on its caller's CPU; `fuser` also
//! hides which kind a lock request is (`FUSE_LK_FLOCK`) and keeps its request parser
//! private, so the transport could not be added beside it.

pub mod abi;
mod mount;
mod op;
mod reply;
mod session;
mod uring;

pub use abi::{FileAttr, FileType};
pub use mount::MountOption;
pub use op::{LkIn, Request, SetattrIn, TimeOrNow};
pub use reply::{
    FileHandle, FopenFlags, Generation, INodeNo, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr,
};
pub use session::{peer_free, Config, Filesystem, Notifier, Session};
