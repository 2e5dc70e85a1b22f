//! The disk tier's index: block key → location, sharded, 28 bytes per entry.
//!
//! Only the first 8 bytes of the key are stored (keys are already uniform hashes). Two keys
//! that share them overwrite each other's slot, which costs a miss, never wrong bytes: the
//! entry checksum covers the full key, so a read for the other key fails verification.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

use crate::api::Key;

const SHARDS: usize = 64;

/// Where an entry lives on disk (20 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub seg: u32,
    pub value_off: u32,
    pub len: u32,
    pub crc: u32,
    pub part: u16,
    pub disk: u8,
}

/// The index keys are hash bytes already: pass them through.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ *b as u64;
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0 << 32) | v as u64;
    }
}

type Shard = HashMap<(u32, u32), Loc, BuildHasherDefault<PassThrough>>;

/// The sharded index.
pub(crate) struct Index {
    shards: Vec<Mutex<Shard>>,
}

fn split(key: &Key) -> (usize, (u32, u32)) {
    let k = &key.0;
    let a = u32::from_le_bytes(k[0..4].try_into().unwrap());
    let b = u32::from_le_bytes(k[4..8].try_into().unwrap());
    (k[8] as usize % SHARDS, (a, b))
}

impl Index {
    pub(crate) fn new() -> Self {
        Index {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }
    pub(crate) fn get(&self, key: &Key) -> Option<Loc> {
        let (s, k) = split(key);
        self.shards[s].lock().unwrap().get(&k).copied()
    }
    /// Inserts and returns the location it replaced.
    pub(crate) fn insert(&self, key: &Key, loc: Loc) -> Option<Loc> {
        let (s, k) = split(key);
        self.shards[s].lock().unwrap().insert(k, loc)
    }
    pub(crate) fn remove(&self, key: &Key) -> Option<Loc> {
        let (s, k) = split(key);
        self.shards[s].lock().unwrap().remove(&k)
    }
    /// Removes the entry only if it still points at `loc`.
    pub(crate) fn remove_exact(&self, key: &Key, loc: &Loc) -> bool {
        let (s, k) = split(key);
        let mut shard = self.shards[s].lock().unwrap();
        if shard.get(&k) == Some(loc) {
            shard.remove(&k);
            true
        } else {
            false
        }
    }
    /// Removes every entry that `pred` selects; returns them.
    pub(crate) fn remove_where(&self, pred: impl Fn(&Loc) -> bool) -> Vec<Loc> {
        let mut out = Vec::new();
        for shard in &self.shards {
            shard.lock().unwrap().retain(|_, l| {
                if pred(l) {
                    out.push(*l);
                    false
                } else {
                    true
                }
            });
        }
        out
    }
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().len()).sum()
    }
    /// DRAM held by the index: the hash tables' buckets (entry + one control byte each)
    /// at their current size, plus the shard headers.
    pub(crate) fn bytes(&self) -> u64 {
        let per_bucket = std::mem::size_of::<((u32, u32), Loc)>() + 1;
        let mut total = (SHARDS * std::mem::size_of::<Mutex<Shard>>()) as u64;
        for s in &self.shards {
            let cap = s.lock().unwrap().capacity();
            // hashbrown keeps buckets a power of two and fills them to 7/8 at most.
            let buckets = if cap == 0 {
                0
            } else if cap < 8 {
                (cap + 1).next_power_of_two()
            } else {
                (cap * 8 / 7).next_power_of_two()
            };
            total += (buckets * per_bucket) as u64;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_is_compact() {
        assert_eq!(std::mem::size_of::<((u32, u32), Loc)>(), 28);
    }
}
