//! Key and memory accounting: each store's own counts (`Usage`) and the node-wide caps that
//! every shard's store shares (`Caps`), which decide whether a new key is admitted.

use super::record::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Refusal to add a key: the key cap or the memory cap is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreFull;

/// The node's key and memory caps, shared by every shard's store so that they hold for the
/// node as a whole however keys spread over shards. The caps can change at run time (CONFIG
/// SET). The shared counters are only kept while a cap is set, and only touched when a key is
/// added or removed, never on a plain check.
///
/// Invariant: `keys` and `bytes` are the sum of the usage of every store whose
/// `Usage::counted` is set. Only a store's own thread changes its usage and its `counted`
/// flag, and it adds or withdraws its whole usage whenever it sees that caps were switched on
/// or off (`Usage::sync_caps`), so the sum stays exact however the caps change.
#[derive(Debug, Default)]
pub struct Caps {
    /// 0 = no cap.
    max_keys: AtomicUsize,
    /// 0 = no cap.
    max_bytes: AtomicUsize,
    keys: AtomicUsize,
    bytes: AtomicUsize,
    /// The largest string or hash value any store has held (a high-water mark, never
    /// lowered): how large one reply carrying a stored value can be.
    largest_value: AtomicUsize,
    /// Up to where small collections keep their compact encoding (CONFIG SET, node-wide).
    pub encodings: Encodings,
}

/// Redis's thresholds for the compact encodings of small collections, as CONFIG SET changes
/// them: a collection converts to its indexed encoding once it passes one (and, as in Redis,
/// never converts back).
#[derive(Debug)]
pub struct Encodings {
    pub zset_max_listpack_entries: AtomicUsize,
    pub zset_max_listpack_value: AtomicUsize,
    pub set_max_intset_entries: AtomicUsize,
    pub hash_max_listpack_entries: AtomicUsize,
    pub hash_max_listpack_value: AtomicUsize,
    /// Kept for CONFIG GET (lists have one encoding in Redis 7.0, `quicklist`).
    pub list_max_listpack_size: std::sync::atomic::AtomicI64,
    pub list_compress_depth: AtomicUsize,
}

impl Default for Encodings {
    /// Redis 7.0's defaults.
    fn default() -> Encodings {
        Encodings {
            zset_max_listpack_entries: AtomicUsize::new(128),
            zset_max_listpack_value: AtomicUsize::new(64),
            set_max_intset_entries: AtomicUsize::new(512),
            hash_max_listpack_entries: AtomicUsize::new(128),
            hash_max_listpack_value: AtomicUsize::new(64),
            list_max_listpack_size: std::sync::atomic::AtomicI64::new(-2),
            list_compress_depth: AtomicUsize::new(0),
        }
    }
}

impl Encodings {
    /// A threshold's value now.
    pub fn get(v: &AtomicUsize) -> usize {
        v.load(Ordering::Relaxed)
    }
}

impl Caps {
    pub fn new(max_keys: usize, max_bytes: usize) -> Arc<Caps> {
        Arc::new(Caps {
            max_keys: AtomicUsize::new(max_keys),
            max_bytes: AtomicUsize::new(max_bytes),
            ..Caps::default()
        })
    }

    pub fn max_keys(&self) -> usize {
        self.max_keys.load(Ordering::Relaxed)
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes.load(Ordering::Relaxed)
    }

    /// True when a memory cap is set and the node's stores have reached it: a command that
    /// can only grow memory (adding to a collection) is then refused with OOM, as Redis
    /// refuses its `denyoom` commands over `maxmemory`.
    pub fn memory_full(&self) -> bool {
        let max = self.max_bytes();
        max > 0 && self.bytes.load(Ordering::Relaxed) >= max
    }

    /// The largest string or hash value stored so far (at least 4 KiB: smaller ones are not
    /// tracked).
    pub fn largest_value(&self) -> usize {
        self.largest_value.load(Ordering::Relaxed).max(4096)
    }

    /// Raises the largest-value mark; touches the shared counter only for a large value. A
    /// hash counts as a whole: HGETALL answers all of it at once.
    #[inline]
    pub(super) fn note_value(&self, value: &Value<'_>) {
        let len = match value {
            Value::Str(s) => s.len(),
            Value::Hash(h) => h.as_bytes().len(),
            Value::Coll(c) => c.mem(),
            _ => return,
        };
        self.note_len(len);
    }

    /// Raises the largest-value mark to `len` bytes (a collection that grew in place).
    #[inline]
    pub(super) fn note_len(&self, len: usize) {
        if len > 4096 {
            self.largest_value.fetch_max(len, Ordering::Relaxed);
        }
    }

    /// Changes the key cap; each store starts or stops counting on its next add or removal,
    /// or when told to (`Store::sync_caps`).
    pub fn set_max_keys(&self, n: usize) {
        self.max_keys.store(n, Ordering::Relaxed);
    }

    pub fn set_max_bytes(&self, n: usize) {
        self.max_bytes.store(n, Ordering::Relaxed);
    }

    /// Whether the node is at a cap: a write that adds a key would be refused now.
    pub fn reached(&self) -> bool {
        let (max_keys, max_bytes) = (self.max_keys(), self.max_bytes());
        (max_keys > 0 && self.keys.load(Ordering::Relaxed) >= max_keys)
            || (max_bytes > 0 && self.bytes.load(Ordering::Relaxed) >= max_bytes)
    }

    #[inline]
    pub(super) fn enabled(&self) -> bool {
        self.max_keys() > 0 || self.max_bytes() > 0
    }

    /// Takes room for one key of `bytes`; false if a cap would be passed.
    #[inline]
    pub(super) fn reserve(&self, bytes: usize) -> bool {
        let max_keys = self.max_keys();
        if self.keys.fetch_add(1, Ordering::Relaxed) >= max_keys && max_keys > 0 {
            self.keys.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        let max_bytes = self.max_bytes();
        if self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes > max_bytes && max_bytes > 0 {
            self.bytes.fetch_sub(bytes, Ordering::Relaxed);
            self.keys.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Counts keys admitted regardless of the caps (a snapshot being installed, or a store
    /// that starts counting).
    #[inline]
    pub(super) fn force(&self, keys: usize, bytes: usize) {
        self.keys.fetch_add(keys, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    #[inline]
    pub(super) fn release(&self, keys: usize, bytes: usize) {
        self.keys.fetch_sub(keys, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Counts and caps; kept beside the table so an entry and its accounting change together.
#[derive(Debug, Default)]
pub struct Usage {
    pub keys: usize,
    /// Bytes of live records plus the index slots they occupy.
    pub bytes: usize,
    pub caps: Arc<Caps>,
    pub expired: u64,
    pub rejected_full: u64,
    /// Partitions the sweep has walked (a partition with nothing due is skipped without a walk).
    pub sweep_walks: u64,
    /// Keys that have an expiry (buckets always do: they expire once refilled).
    pub expires: usize,
    /// Average time to live of keys with an expiry, in ms, sampled by the sweep over its last
    /// full round of the partitions (0 until one has completed).
    pub avg_ttl_ms: u64,
    /// This store's usage is included in the caps' shared counters.
    pub(super) counted: bool,
    /// Adds are admitted regardless of the caps (installing a snapshot).
    pub(super) admit_all: bool,
}

impl Usage {
    /// Accounts a new key of `cost` bytes, unless a cap is reached.
    #[inline]
    pub(super) fn add(&mut self, cost: usize) -> bool {
        self.sync_caps();
        if self.counted {
            if self.admit_all {
                self.caps.force(1, cost);
            } else if !self.caps.reserve(cost) {
                self.rejected_full += 1;
                return false;
            }
        }
        self.keys += 1;
        self.bytes += cost;
        true
    }

    #[inline]
    pub(super) fn remove(&mut self, cost: usize) {
        self.sync_caps();
        let cost = cost.min(self.bytes);
        self.keys -= 1;
        self.bytes -= cost;
        if self.counted {
            self.caps.release(1, cost);
        }
    }

    #[inline]
    pub(super) fn resize(&mut self, old: usize, new: usize) {
        self.sync_caps();
        let old = old.min(self.bytes);
        self.bytes = self.bytes - old + new;
        if self.counted {
            self.caps.force(0, new);
            self.caps.release(0, old);
        }
    }

    /// Adds this store's usage to the shared counters when caps were switched on, and takes it
    /// out when they were switched off.
    #[inline]
    pub(super) fn sync_caps(&mut self) {
        let on = self.caps.enabled();
        if on != self.counted {
            if on {
                self.caps.force(self.keys, self.bytes);
            } else {
                self.caps.release(self.keys, self.bytes);
            }
            self.counted = on;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::store::tests::put;

    #[test]
    fn key_cap_refuses_new_keys_but_updates_live_ones() {
        let mut s = Store::new(2, 0);
        put(&mut s, b"a", Value::Int(1), 0, 0).unwrap();
        put(&mut s, b"b", Value::Int(1), 0, 0).unwrap();
        assert_eq!(put(&mut s, b"c", Value::Int(1), 0, 0), Err(StoreFull));
        put(&mut s, b"a", Value::Int(5), 0, 0).unwrap();
        assert_eq!(s.get(b"a", 0).map(|e| e.value), Some(Value::Int(5)));
        assert_eq!(s.usage.rejected_full, 1);
    }

    #[test]
    fn caps_switched_on_at_run_time_count_the_keys_already_held() {
        let caps = Caps::new(0, 0);
        let mut a = Store::with_caps(caps.clone());
        let mut b = Store::with_caps(caps.clone());
        for i in 0..5u32 {
            put(&mut a, &i.to_be_bytes(), Value::Int(1), 0, 0).unwrap();
            put(&mut b, &(i + 100).to_be_bytes(), Value::Int(1), 0, 0).unwrap();
        }
        caps.set_max_keys(12);
        a.sync_caps();
        b.sync_caps();
        put(&mut a, b"x1", Value::Int(1), 0, 0).unwrap();
        put(&mut b, b"x2", Value::Int(1), 0, 0).unwrap();
        assert_eq!(put(&mut a, b"x3", Value::Int(1), 0, 0), Err(StoreFull));
        assert_eq!(put(&mut b, b"x3", Value::Int(1), 0, 0), Err(StoreFull));
        // Switched off, then on again with room for one more: the count is still exact.
        caps.set_max_keys(0);
        put(&mut a, b"x4", Value::Int(1), 0, 0).unwrap();
        b.remove(b"x2", 0);
        caps.set_max_keys(13);
        a.sync_caps();
        b.sync_caps();
        put(&mut b, b"x5", Value::Int(1), 0, 0).unwrap();
        assert_eq!(put(&mut a, b"x6", Value::Int(1), 0, 0), Err(StoreFull));
        assert_eq!(caps.keys.load(Ordering::Relaxed), a.len() + b.len());
        caps.set_max_bytes(1 << 20);
        caps.set_max_keys(0);
        a.clear();
        b.sync_caps();
        assert_eq!(caps.keys.load(Ordering::Relaxed), b.len());
        assert_eq!(caps.bytes.load(Ordering::Relaxed), b.usage.bytes);
    }

    #[test]
    fn memory_cap_counts_bytes() {
        let mut s = Store::new(0, 100);
        put(&mut s, b"k1", Value::Str(&[0u8; 40]), 0, 0).unwrap();
        assert_eq!(
            put(&mut s, b"k2", Value::Str(&[0u8; 60]), 0, 0),
            Err(StoreFull)
        );
        assert!(s.usage.bytes <= 100);
    }
}
