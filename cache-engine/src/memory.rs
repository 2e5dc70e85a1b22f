//! The memory tier: a byte-budgeted map evicted by CLOCK (FIFO with a second chance).
//!
//! Why CLOCK and not LRU: a hit only sets a bit, so a read never reorders a list, and
//! one-hit wonders (a block read once during a scan) leave after one pass of the hand
//! instead of pushing hot blocks out, the property SIEVE and S3-FIFO build on. The memory
//! tier is a cache of the disk tier (writes go through to disk, see `engine`), so an
//! eviction here drops the copy and never loses data when a disk tier exists.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::Bytes;

use crate::api::Key;

struct Entry {
    value: Bytes,
    part: u16,
    visited: bool,
    generation: u64,
}

#[derive(Default)]
struct State {
    map: HashMap<Key, Entry>,
    clock: VecDeque<(Key, u64)>,
    bytes: u64,
    next_generation: u64,
}

/// The memory tier.
pub(crate) struct MemoryTier {
    /// The byte budget; changed at runtime by [`MemoryTier::set_capacity`].
    capacity: AtomicU64,
    state: Mutex<State>,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
}

/// An entry that left the memory tier: (partition, bytes).
pub(crate) type Evicted = Vec<(u16, u64)>;

impl MemoryTier {
    pub(crate) fn new(capacity: u64) -> Self {
        MemoryTier {
            capacity: AtomicU64::new(capacity),
            state: Mutex::new(State::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The value, marking it recently used. `count_miss` false: a repeated lookup of a
    /// miss already counted (single-flight's re-check), which must not count twice.
    pub(crate) fn get(&self, key: &Key, count_miss: bool) -> Option<Bytes> {
        let mut st = self.state.lock().unwrap();
        match st.map.get_mut(key) {
            Some(e) => {
                e.visited = true;
                self.hits.fetch_add(1, Relaxed);
                Some(e.value.clone())
            }
            None => {
                if count_miss {
                    self.misses.fetch_add(1, Relaxed);
                }
                None
            }
        }
    }

    pub(crate) fn contains(&self, key: &Key) -> bool {
        self.state.lock().unwrap().map.contains_key(key)
    }

    /// Stores the value. With `evict` false it is stored only if it fits in free space.
    /// Returns whether it was stored, the entry it replaced and the entries evicted.
    pub(crate) fn insert(
        &self,
        key: Key,
        part: u16,
        value: Bytes,
        evict: bool,
    ) -> (bool, Option<(u16, u64)>, Evicted) {
        let len = value.len() as u64;
        let mut evicted = Vec::new();
        let mut st = self.state.lock().unwrap();
        let replaced = st.map.remove(&key).map(|e| {
            st.bytes -= e.value.len() as u64;
            (e.part, e.value.len() as u64)
        });
        let capacity = self.capacity();
        if len > capacity || (!evict && st.bytes + len > capacity) {
            return (false, replaced, evicted);
        }
        self.evict_to(&mut st, capacity - len, &mut evicted);
        let generation = st.next_generation;
        st.next_generation += 1;
        st.bytes += len;
        st.map.insert(
            key,
            Entry {
                value,
                part,
                visited: false,
                generation,
            },
        );
        st.clock.push_back((key, generation));
        // Stale queue slots (removed keys) are dropped lazily; bound them.
        if st.clock.len() > 2 * st.map.len() + 1024 {
            let State { map, clock, .. } = &mut *st;
            clock.retain(|(k, g)| map.get(k).is_some_and(|e| e.generation == *g));
        }
        (true, replaced, evicted)
    }

    /// The byte budget now.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity.load(Relaxed)
    }

    /// Sets the byte budget; a smaller one evicts (CLOCK order) down to it at once. Returns
    /// the entries evicted, for the caller's partition accounting.
    pub(crate) fn set_capacity(&self, capacity: u64) -> Evicted {
        let mut st = self.state.lock().unwrap();
        self.capacity.store(capacity, Relaxed);
        let mut evicted = Vec::new();
        self.evict_to(&mut st, capacity, &mut evicted);
        evicted
    }

    /// Runs the CLOCK hand until at most `target` bytes are held.
    fn evict_to(&self, st: &mut State, target: u64, evicted: &mut Evicted) {
        while st.bytes > target {
            let Some((k, generation)) = st.clock.pop_front() else {
                break;
            };
            let second_chance = match st.map.get_mut(&k) {
                Some(e) if e.generation == generation => {
                    let visited = e.visited;
                    e.visited = false;
                    visited
                }
                _ => continue, // removed or replaced since it was queued
            };
            if second_chance {
                st.clock.push_back((k, generation));
            } else if let Some(e) = st.map.remove(&k) {
                st.bytes -= e.value.len() as u64;
                self.evictions.fetch_add(1, Relaxed);
                evicted.push((e.part, e.value.len() as u64));
            }
        }
    }

    /// Drops the entry; returns its (partition, bytes).
    pub(crate) fn remove(&self, key: &Key) -> Option<(u16, u64)> {
        let mut st = self.state.lock().unwrap();
        let e = st.map.remove(key)?;
        st.bytes -= e.value.len() as u64;
        Some((e.part, e.value.len() as u64))
    }

    /// (bytes, entries) held now.
    pub(crate) fn usage(&self) -> (u64, u64) {
        let st = self.state.lock().unwrap();
        (st.bytes, st.map.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_keeps_the_visited_entry() {
        let m = MemoryTier::new(300);
        for i in 0..3u8 {
            m.insert(Key([i; 16]), 0, Bytes::from(vec![i; 100]), true);
        }
        assert!(m.get(&Key([0; 16]), true).is_some());
        let (stored, _, evicted) = m.insert(Key([9; 16]), 0, Bytes::from(vec![9; 100]), true);
        assert!(stored);
        assert_eq!(evicted.len(), 1);
        assert!(m.contains(&Key([0; 16])));
        assert!(!m.contains(&Key([1; 16])));
    }

    #[test]
    fn shrinking_evicts_down_and_growing_admits_more() {
        let m = MemoryTier::new(1000);
        for i in 0..10u8 {
            assert!(m.insert(Key([i; 16]), 0, Bytes::from(vec![i; 100]), true).0);
        }
        assert!(m.get(&Key([9; 16]), true).is_some());
        let evicted = m.set_capacity(300);
        assert_eq!(evicted.len(), 7);
        assert_eq!(m.usage(), (300, 3));
        assert!(
            m.contains(&Key([9; 16])),
            "the visited entry had a second chance"
        );
        // Without eviction an insert must fit the new budget.
        assert!(
            !m.insert(Key([20; 16]), 0, Bytes::from(vec![0; 100]), false)
                .0
        );
        m.set_capacity(600);
        assert!(
            m.insert(Key([20; 16]), 0, Bytes::from(vec![0; 100]), false)
                .0
        );
        assert_eq!(m.usage(), (400, 4));
    }
}
