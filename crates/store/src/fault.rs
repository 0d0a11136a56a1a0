//! Fault injection for the store: a wrapper engine that fails a chosen write or sync.

use crate::engine::{Batch, Cf, Engine, StoreError};
use std::sync::Arc;

/// Where a fault can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultPoint {
    /// A batch write.
    Write,
    /// A WAL sync.
    Sync,
}

/// Decides whether an operation fails.
pub trait Injector: Send + Sync {
    /// True if this operation must fail.
    fn fail(&self, point: FaultPoint) -> bool;
    /// How long to stall before this operation (a slow disk); none by default.
    fn delay(&self, _point: FaultPoint) -> Option<std::time::Duration> {
        None
    }
}

/// An engine that consults an injector before each write and sync.
pub struct Faulty<E> {
    inner: E,
    injector: Arc<dyn Injector>,
}

impl<E: Engine> Faulty<E> {
    /// Wraps `inner`.
    pub fn new(inner: E, injector: Arc<dyn Injector>) -> Faulty<E> {
        Faulty { inner, injector }
    }
}

impl<E: Engine> Engine for Faulty<E> {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(cf, key)
    }
    fn get_many(&self, cf: Cf, sorted: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.inner.get_many(cf, sorted)
    }
    fn write(&self, batch: &Batch) -> Result<(), StoreError> {
        if self.injector.fail(FaultPoint::Write) {
            return Err(StoreError::Injected(FaultPoint::Write));
        }
        self.inner.write(batch)
    }
    fn flush_wal(&self) -> Result<(), StoreError> {
        // Faults are injected at the batch write and the sync, where tests count them.
        self.inner.flush_wal()
    }

    fn sync(&self) -> Result<(), StoreError> {
        if let Some(d) = self.injector.delay(FaultPoint::Sync) {
            std::thread::sleep(d);
        }
        if self.injector.fail(FaultPoint::Sync) {
            return Err(StoreError::Injected(FaultPoint::Sync));
        }
        self.inner.sync()
    }
    fn scan(
        &self,
        cf: Cf,
        prefix: &[u8],
        start: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.inner.scan(cf, prefix, start, f)
    }
    fn last_key(&self, cf: Cf, prefix: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.last_key(cf, prefix)
    }
    fn estimate_keys(&self, cf: Cf) -> u64 {
        self.inner.estimate_keys(cf)
    }
    fn cache_report(&self) -> Vec<(&'static str, u64)> {
        self.inner.cache_report()
    }
}

/// Fails the Nth write or sync (1-based), for tests.
pub struct FailNth {
    /// Which point.
    pub point: FaultPoint,
    /// Which occurrence fails.
    pub n: u64,
    count: std::sync::atomic::AtomicU64,
}

impl FailNth {
    /// Fails occurrence `n` of `point`.
    pub fn new(point: FaultPoint, n: u64) -> FailNth {
        FailNth {
            point,
            n,
            count: Default::default(),
        }
    }
}

impl Injector for FailNth {
    fn fail(&self, point: FaultPoint) -> bool {
        point == self.point
            && self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == self.n
    }
}
