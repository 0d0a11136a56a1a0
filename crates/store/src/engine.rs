//! The engine interface the MDT store is written against.

/// One keyspace (a RocksDB column family).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cf {
    /// FID → inode record (attributes and layout).
    Inode,
    /// parent FID ‖ name hash ‖ name → child FID and type.
    Dirent,
    /// FID ‖ name → value.
    Xattr,
    /// FID ‖ block → Data-on-MDT bytes.
    Dom,
    /// client UUID → client record (slot).
    Clients,
    /// slot ‖ tag → reply record.
    Reply,
    /// FID → open-unlinked inode awaiting last close.
    Orphan,
    /// FID → OST objects to destroy once the unlink commits.
    Destroy,
    /// Fixed keys: last transno, sequence allocator, format.
    Server,
    /// FID → the pending layout of a migration under way.
    Migrate,
}

impl Cf {
    /// Every keyspace.
    pub const ALL: [Cf; 10] = [
        Cf::Inode,
        Cf::Dirent,
        Cf::Xattr,
        Cf::Dom,
        Cf::Clients,
        Cf::Reply,
        Cf::Orphan,
        Cf::Destroy,
        Cf::Server,
        Cf::Migrate,
    ];

    /// Column family name.
    pub fn name(self) -> &'static str {
        match self {
            Cf::Inode => "inode",
            Cf::Dirent => "dirent",
            Cf::Xattr => "xattr",
            Cf::Dom => "dom",
            Cf::Clients => "clients",
            Cf::Reply => "reply",
            Cf::Orphan => "orphan",
            Cf::Destroy => "destroy",
            Cf::Server => "server",
            Cf::Migrate => "migrate",
        }
    }
}

/// A store failure. Any failed write or sync stops the target.
#[derive(Debug, thiserror::Error, Clone)]
pub enum StoreError {
    /// The engine reported an error.
    #[error("store engine: {0}")]
    Engine(String),
    /// A record could not be decoded: the store is corrupt or from a newer version.
    #[error("corrupt record in {0}: {1}")]
    Corrupt(&'static str, String),
    /// An injected fault.
    #[error("injected fault at {0:?}")]
    Injected(crate::fault::FaultPoint),
    /// The target stopped after an earlier failure and accepts no more changes.
    #[error("target stopped after a store failure")]
    Stopped,
}

/// One operation in a batch.
#[derive(Clone, Debug)]
pub enum Op {
    /// Insert or overwrite.
    Put(Cf, Vec<u8>, Vec<u8>),
    /// Remove.
    Delete(Cf, Vec<u8>),
}

/// An atomic group of changes: all of them become visible, and durable, together.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// The operations, applied in order.
    pub ops: Vec<Op>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Adds a put.
    pub fn put(&mut self, cf: Cf, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.ops.push(Op::Put(cf, key.into(), value.into()));
    }

    /// Adds a delete.
    pub fn delete(&mut self, cf: Cf, key: impl Into<Vec<u8>>) {
        self.ops.push(Op::Delete(cf, key.into()));
    }

    /// True if nothing is in it.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// The storage engine under the MDT. Writes are atomic per batch and reach the WAL
/// without a sync; `sync` makes everything written so far durable.
pub trait Engine: Send + Sync {
    /// Point read.
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Point reads of several keys, sorted (an engine may share the work of finding
    /// them: RocksDB's MultiGet looks each block up once for all its keys).
    fn get_many(&self, cf: Cf, sorted: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        sorted.iter().map(|k| self.get(cf, k)).collect()
    }
    /// Applies a batch atomically (WAL written, not synced).
    fn write(&self, batch: &Batch) -> Result<(), StoreError>;
    /// Hands every written batch's WAL bytes to the OS (no sync): after it, a crash of
    /// the process alone loses none of them. Batches written meanwhile by other threads
    /// go in the same system call (group commit).
    fn flush_wal(&self) -> Result<(), StoreError>;
    /// Makes every written batch durable.
    fn sync(&self) -> Result<(), StoreError>;
    /// Visits keys of `cf` that start with `prefix`, from `start` (≥ prefix) in key
    /// order, until `f` returns false.
    fn scan(
        &self,
        cf: Cf,
        prefix: &[u8],
        start: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError>;
    /// The last key of `cf` that starts with `prefix`, if any. The default visits
    /// every such key; an engine that can seek backwards does better.
    fn last_key(&self, cf: Cf, prefix: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let mut last = None;
        self.scan(cf, prefix, prefix, &mut |k, _| {
            last = Some(k.to_vec());
            true
        })?;
        Ok(last)
    }
    /// Approximate number of keys in `cf`.
    fn estimate_keys(&self, cf: Cf) -> u64;
    /// The engine's own cache: (name, value) lines for `cache_stats` (none by default).
    fn cache_report(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}
