//! Memory-only body behind the API so the agent can build while the real engine lands.
//! The cache-engine work replaces this module entirely.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::api::*;

pub(crate) struct Inner {
    config: CacheConfig,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    map: HashMap<Key, (u16, Bytes)>,
    partitions: Vec<(String, PartitionConfig, PartitionStats)>,
    bytes: u64,
}

pub(crate) fn open(config: CacheConfig) -> Result<Cache, OpenError> {
    let mut state = State::default();
    state.partitions.push(("default".into(), PartitionConfig::default(), PartitionStats { name: "default".into(), ..Default::default() }));
    Ok(Cache { inner: Arc::new(Inner { config, state: Mutex::new(state) }) })
}

pub(crate) fn partition(cache: &Cache, name: &str, config: PartitionConfig) -> Partition {
    let mut st = cache.inner.state.lock().unwrap();
    let id = match st.partitions.iter().position(|p| p.0 == name) {
        Some(i) => { st.partitions[i].1 = config; i }
        None => { st.partitions.push((name.into(), config, PartitionStats { name: name.into(), ..Default::default() })); st.partitions.len() - 1 }
    };
    Partition { cache: cache.clone(), id: id as u16 }
}

pub(crate) fn engine_choice(_: &Cache) -> EngineChoice {
    EngineChoice { kind: EngineKind::Psync, fallback_reason: Some("bootstrap memory-only engine".into()) }
}

pub(crate) fn stats(cache: &Cache) -> CacheStats {
    let st = cache.inner.state.lock().unwrap();
    CacheStats {
        memory: TierStats { bytes: st.bytes, entries: st.map.len() as u64, capacity: cache.inner.config.memory_capacity, ..Default::default() },
        partitions: st.partitions.iter().map(|p| { let mut s = p.2.clone(); s.quota = p.1.quota; s }).collect(),
        ..Default::default()
    }
}

pub(crate) async fn get(p: &Partition, key: &Key) -> Option<Lookup> {
    let mut st = p.cache.inner.state.lock().unwrap();
    let v = st.map.get(key).map(|e| e.1.clone());
    let ps = &mut st.partitions[p.id as usize].2;
    match v {
        Some(value) => { ps.hits_memory += 1; Some(Lookup { value, origin: Origin::Memory }) }
        None => { ps.misses += 1; None }
    }
}

pub(crate) async fn insert(p: &Partition, key: Key, value: Bytes) -> Result<(), InsertError> {
    let inner = &p.cache.inner;
    if value.len() as u64 > inner.config.max_value_size {
        return Err(InsertError::TooLarge { size: value.len() as u64, max: inner.config.max_value_size });
    }
    let mut st = inner.state.lock().unwrap();
    if st.bytes + value.len() as u64 > inner.config.memory_capacity {
        return Err(InsertError::QuotaReached { partition: st.partitions[p.id as usize].0.clone() });
    }
    st.bytes += value.len() as u64;
    let ps = &mut st.partitions[p.id as usize].2;
    ps.bytes += value.len() as u64;
    ps.entries += 1;
    if let Some((old_p, old)) = st.map.insert(key, (p.id, value)) {
        st.bytes -= old.len() as u64;
        let ps = &mut st.partitions[old_p as usize].2;
        ps.bytes -= old.len() as u64;
        ps.entries -= 1;
    }
    Ok(())
}

pub(crate) async fn get_or_fetch<F, Fut, E>(p: &Partition, key: Key, fetch: F) -> Result<Lookup, Arc<E>>
where
    F: FnOnce() -> Fut + Send,
    Fut: Future<Output = Result<Bytes, E>> + Send,
    E: Send + Sync + 'static,
{
    if let Some(l) = get(p, &key).await {
        return Ok(l);
    }
    let value = fetch().await.map_err(Arc::new)?;
    let _ = insert(p, key, value.clone()).await;
    Ok(Lookup { value, origin: Origin::Fetch })
}

pub(crate) async fn remove(p: &Partition, key: &Key) -> bool {
    let mut st = p.cache.inner.state.lock().unwrap();
    match st.map.remove(key) {
        Some((pid, v)) => {
            st.bytes -= v.len() as u64;
            let ps = &mut st.partitions[pid as usize].2;
            ps.bytes -= v.len() as u64;
            ps.entries -= 1;
            true
        }
        None => false,
    }
}

pub(crate) fn contains(p: &Partition, key: &Key) -> bool {
    p.cache.inner.state.lock().unwrap().map.contains_key(key)
}

pub(crate) fn partition_stats(p: &Partition) -> PartitionStats {
    let st = p.cache.inner.state.lock().unwrap();
    let mut s = st.partitions[p.id as usize].2.clone();
    s.quota = st.partitions[p.id as usize].1.quota;
    s
}

pub(crate) async fn close(_: &Cache) {}
