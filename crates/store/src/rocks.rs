//! The RocksDB engine.

use crate::engine::{Batch, Cf, Engine, Op, StoreError};
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBWithThreadMode, MultiThreaded, Options,
    ReadOptions, WriteBatch, WriteOptions,
};
use std::path::Path;

type Db = DBWithThreadMode<MultiThreaded>;

/// RocksDB with one column family per keyspace.
pub struct RocksEngine {
    db: Db,
    /// The block cache and the options holding the statistics (`cache_stats`); none
    /// for a read-only open.
    cache: Option<(Cache, Options)>,
}

fn err(e: rocksdb::Error) -> StoreError {
    StoreError::Engine(e.into_string())
}

impl RocksEngine {
    /// Opens (creating if needed) the store at `path`, with `cache_mb` of block cache
    /// for metadata (index and filter blocks pinned).
    pub fn open(path: &Path, cache_mb: usize) -> Result<RocksEngine, StoreError> {
        Self::open_with(path, cache_mb, true)
    }

    /// Opens the store at `path`, which must exist: a formatted target whose store is
    /// gone (a power cut that took the directory's entry, a mistaken `rm`) must not come
    /// up as a new, empty file system over the OSTs' objects.
    pub fn open_existing(path: &Path, cache_mb: usize) -> Result<RocksEngine, StoreError> {
        match std::fs::metadata(path.join("CURRENT")) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::Engine(format!(
                    "{}: no store here (formatted targets have one): refusing to start empty",
                    path.display()
                )))
            }
            Err(e) => return Err(StoreError::Engine(format!("{}: {e}", path.display()))),
        }
        Self::open_with(path, cache_mb, false)
    }

    fn open_with(path: &Path, cache_mb: usize, create: bool) -> Result<RocksEngine, StoreError> {
        let cache = Cache::new_lru_cache(cache_mb.max(8) << 20);
        let mut db_opts = Options::default();
        db_opts.create_if_missing(create);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(2);
        db_opts.set_keep_log_file_num(4);
        db_opts.set_max_total_wal_size(256 << 20);
        // Batches go to an in-memory WAL buffer, which reaches the OS when the commit
        // thread syncs it (or, with `wal_flush_per_round`, before each round's replies).
        db_opts.set_manual_wal_flush(true);
        // Room for every batch between two commits (the buffer grows as needed): with
        // RocksDB's 1 MiB, a burst would reach the OS early, and a `kill -9` would lose
        // less than a power cut does. Equal losses keep the crash tests honest.
        db_opts.set_writable_file_max_buffer_size(256 << 20);
        // Counters only (no timers or histograms): the block cache's hits and misses
        // for `cache_stats`, at the cost of a per-core counter bump.
        db_opts.enable_statistics();
        db_opts.set_statistics_level(rocksdb::statistics::StatsLevel::ExceptHistogramOrTimers);
        // The kernel may read ahead in table files (RocksDB's default advises random
        // access, which turns that off). A cold MDT's reads mostly go in key order: a
        // directory's entries, then its inodes, whose FIDs were given in creation
        // order. Measured: a cold native stat walk of 1 M files waited on the disk
        // for half as long (iowait 4-8 % against 9-20 %), median 219k against 202k
        // entries/s.
        db_opts.set_advise_random_on_open(false);
        let cfs = Cf::ALL.iter().map(|cf| {
            let mut bo = BlockBasedOptions::default();
            bo.set_block_cache(&cache);
            // Index and filter blocks live in the cache, at high priority (data blocks
            // are evicted first), and those of L0 and the top-level index are pinned:
            // file and inode data read once cannot push out what finds every key.
            bo.set_cache_index_and_filter_blocks(true);
            bo.set_cache_index_and_filter_blocks_with_high_priority(true);
            bo.set_pin_l0_filter_and_index_blocks_in_cache(true);
            bo.set_pin_top_level_index_and_filter(true);
            if matches!(cf, Cf::Inode | Cf::Dirent | Cf::Xattr | Cf::Reply) {
                bo.set_bloom_filter(10.0, false);
            }
            let mut o = Options::default();
            o.set_block_based_table_factory(&bo);
            o.set_compression_type(rocksdb::DBCompressionType::Lz4);
            o.set_write_buffer_size(64 << 20);
            if matches!(cf, Cf::Inode | Cf::Dirent | Cf::Xattr | Cf::Reply) {
                // Point lookups dominate, and many miss (a new name, a new FID): a whole
                // key bloom filter in the memtable spares the skip-list search (a quarter
                // of the MDS's CPU in profiles before it).
                o.set_memtable_prefix_bloom_ratio(0.1);
                o.set_memtable_whole_key_filtering(true);
            }
            if *cf == Cf::Dirent {
                // A directory's entries share the parent FID prefix.
                o.set_prefix_extractor(rocksdb::SliceTransform::create_fixed_prefix(16));
            }
            ColumnFamilyDescriptor::new(cf.name(), o)
        });
        let db = Db::open_cf_descriptors(&db_opts, path, cfs).map_err(err)?;
        // RocksDB syncs the store's directory, not the one holding it: the store's own
        // entry is durable only once that one is synced too.
        if let Some(parent) = path.parent() {
            lode_base::config::sync_dir(parent)
                .map_err(|e| StoreError::Engine(format!("{}: sync: {e}", parent.display())))?;
        }
        Ok(RocksEngine {
            db,
            cache: Some((cache, db_opts)),
        })
    }

    /// Opens the store at `path` read-only: it takes no lock, so it works beside the
    /// server that has it open (seeing what that server's WAL holds at open time).
    pub fn open_read_only(path: &Path) -> Result<RocksEngine, StoreError> {
        let opts = Options::default();
        let names = Cf::ALL.iter().map(|cf| cf.name());
        let db = Db::open_cf_for_read_only(&opts, path, names, false).map_err(err)?;
        Ok(RocksEngine { db, cache: None })
    }

    fn cf(&self, cf: Cf) -> Result<std::sync::Arc<rocksdb::BoundColumnFamily<'_>>, StoreError> {
        self.db
            .cf_handle(cf.name())
            .ok_or_else(|| StoreError::Engine(format!("missing column family {}", cf.name())))
    }
}

impl Engine for RocksEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get_cf(&self.cf(cf)?, key).map_err(err)
    }

    fn get_many(&self, cf: Cf, sorted: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.db
            .batched_multi_get_cf(&self.cf(cf)?, sorted.iter().copied(), true)
            .into_iter()
            .map(|r| r.map(|v| v.map(|v| v.to_vec())).map_err(err))
            .collect()
    }

    fn write(&self, batch: &Batch) -> Result<(), StoreError> {
        let mut wb = WriteBatch::default();
        for op in &batch.ops {
            match op {
                Op::Put(cf, k, v) => wb.put_cf(&self.cf(*cf)?, k, v),
                Op::Delete(cf, k) => wb.delete_cf(&self.cf(*cf)?, k),
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(false);
        self.db.write_opt(wb, &wo).map_err(err)
    }

    fn flush_wal(&self) -> Result<(), StoreError> {
        self.db.flush_wal(false).map_err(err)
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.db.flush_wal(true).map_err(err)
    }

    fn scan(
        &self,
        cf: Cf,
        prefix: &[u8],
        start: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let mut ro = ReadOptions::default();
        ro.set_total_order_seek(true);
        if let Some(upper) = prefix_upper_bound(prefix) {
            ro.set_iterate_upper_bound(upper);
        }
        let handle = self.cf(cf)?;
        let mut it = self.db.raw_iterator_cf_opt(&handle, ro);
        it.seek(if start < prefix { prefix } else { start });
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            if !k.starts_with(prefix) || !f(k, v) {
                return Ok(());
            }
            it.next();
        }
        it.status().map_err(err)
    }

    fn last_key(&self, cf: Cf, prefix: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let mut ro = ReadOptions::default();
        ro.set_total_order_seek(true);
        ro.set_iterate_lower_bound(prefix.to_vec());
        if let Some(upper) = prefix_upper_bound(prefix) {
            ro.set_iterate_upper_bound(upper);
        }
        let handle = self.cf(cf)?;
        let mut it = self.db.raw_iterator_cf_opt(&handle, ro);
        it.seek_to_last();
        if let Some(k) = it.key().filter(|k| k.starts_with(prefix)) {
            return Ok(Some(k.to_vec()));
        }
        it.status().map_err(err)?;
        Ok(None)
    }

    fn estimate_keys(&self, cf: Cf) -> u64 {
        self.cf(cf)
            .ok()
            .and_then(|h| {
                self.db
                    .property_int_value_cf(&h, "rocksdb.estimate-num-keys")
                    .ok()
                    .flatten()
            })
            .unwrap_or(0)
    }

    fn cache_report(&self) -> Vec<(&'static str, u64)> {
        use rocksdb::statistics::Ticker;
        let Some((cache, o)) = &self.cache else {
            return Vec::new();
        };
        let mut out = vec![
            ("block_cache_usage_bytes", cache.get_usage() as u64),
            ("block_cache_pinned_bytes", cache.get_pinned_usage() as u64),
        ];
        for (name, t) in [
            ("block_cache_data_hits", Ticker::BlockCacheDataHit),
            ("block_cache_data_misses", Ticker::BlockCacheDataMiss),
            ("block_cache_index_hits", Ticker::BlockCacheIndexHit),
            ("block_cache_index_misses", Ticker::BlockCacheIndexMiss),
            ("block_cache_filter_hits", Ticker::BlockCacheFilterHit),
            ("block_cache_filter_misses", Ticker::BlockCacheFilterMiss),
        ] {
            out.push((name, o.get_ticker_count(t)));
        }
        out
    }
}

/// The smallest key greater than every key starting with `prefix`.
fn prefix_upper_bound(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut up = prefix.to_vec();
    while let Some(last) = up.pop() {
        if last < 0xff {
            up.push(last + 1);
            return Some(up);
        }
    }
    None
}
