//! The MDT store: keyspaces on RocksDB behind a small [`Engine`] interface, the
//! transno critical section that writes each change together with its reply record,
//! and the commit thread that makes the WAL durable and publishes `last_committed`.

pub mod engine;
pub mod fault;
pub mod mdt;
pub mod records;
pub mod rocks;

pub use engine::{Batch, Cf, Engine, StoreError};
pub use fault::{FaultPoint, Faulty, Injector};
pub use mdt::{MdtStore, ReplyRecord};
pub use rocks::RocksEngine;

/// The MDT's store, a directory inside the target's (made by `mkfs`).
pub const MDT_DB_DIR: &str = "db";
