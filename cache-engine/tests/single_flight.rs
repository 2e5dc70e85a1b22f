//! Concurrent misses on one key run one fetch; an error reaches every waiter and is not cached.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use common::*;
use sluice_cache_engine::Origin;

// A current-thread runtime: every spawned caller reaches its first wait before the test
// task resumes, so all of them are waiting when the fetch completes.
#[tokio::test]
async fn fifty_callers_one_fetch() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let cache = open(small(dir.path(), engine, 1 << 20));
        let fetches = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Notify::new());
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (cache, fetches, gate) = (cache.clone(), fetches.clone(), gate.clone());
            tasks.push(tokio::spawn(async move {
                cache
                    .get_or_fetch(key(1), || async move {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        // Hold the fetch open until the test has started every caller.
                        gate.notified().await;
                        Ok::<_, std::io::Error>(value(1, 0, 100_000))
                    })
                    .await
            }));
        }
        // Release the fetch once it is running (no timing: poll the counter).
        while fetches.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        gate.notify_waiters();
        gate.notify_one();
        for t in tasks {
            let got = t.await.unwrap().unwrap();
            assert_eq!(got.value, value(1, 0, 100_000));
        }
        assert_eq!(
            fetches.load(Ordering::SeqCst),
            1,
            "{engine:?}: the fetch ran more than once"
        );
        assert_eq!(
            cache
                .get_or_fetch(key(1), || async { Err::<Bytes, _>("not called") })
                .await
                .unwrap()
                .origin,
            Origin::Memory
        );
    }
}

// A current-thread runtime: every spawned caller reaches its first wait before the test
// task resumes, so all of them are waiting when the fetch completes.
#[tokio::test]
async fn errors_are_shared_and_not_cached() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let cache = open(small(dir.path(), engine, 1 << 20));
        let fetches = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let (cache, fetches, gate) = (cache.clone(), fetches.clone(), gate.clone());
            tasks.push(tokio::spawn(async move {
                cache
                    .get_or_fetch(key(2), || async move {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        let _ = gate.acquire().await;
                        Err::<Bytes, String>("source unavailable".into())
                    })
                    .await
            }));
        }
        while fetches.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(100);
        let errors: Vec<Arc<String>> = futures::future::join_all(tasks)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap_err())
            .collect();
        let first = errors[0].clone();
        assert!(errors.iter().all(|e| **e == "source unavailable"));
        assert!(
            errors.iter().all(|e| Arc::ptr_eq(e, &first)),
            "{engine:?}: waiters get the leader's Arc"
        );
        assert_eq!(
            fetches.load(Ordering::SeqCst),
            1,
            "{engine:?}: the failing fetch ran more than once"
        );
        // Not cached: the next call fetches again.
        let got = cache
            .get_or_fetch(key(2), || async {
                Ok::<_, String>(Bytes::from_static(b"ok"))
            })
            .await
            .unwrap();
        assert_eq!(
            (got.value.as_ref(), got.origin),
            (&b"ok"[..], Origin::Fetch)
        );
    }
}
