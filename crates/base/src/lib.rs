//! Shared vocabulary of lode: FIDs, errno values, limits, credentials, attributes and
//! layouts. Everything here is plain data and pure functions; every other crate builds
//! on it and nothing here does I/O.

pub mod acl;
pub mod attr;
pub mod config;
pub mod errno;
pub mod fid;
pub mod flock;
pub mod hash;
pub mod layout;
pub mod limits;
pub mod perm;
pub mod sys;
pub mod units;

pub use attr::{Attr, Cred, FileType, SetAttr, TimeSet};
pub use errno::Errno;
pub use fid::Fid;
pub use layout::{Component, Layout, Pattern, StripeSpec};
