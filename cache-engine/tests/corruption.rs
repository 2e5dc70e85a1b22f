//! Bits flipped in segment files: each corrupted entry reads as a miss and is counted;
//! the others still read byte-exact.

mod common;

use common::*;

/// Byte offset of `key` in `hay`: headers are 8-byte aligned and hold the key 8 bytes in.
fn find(hay: &[u8], key: &[u8]) -> Option<usize> {
    (8..hay.len().saturating_sub(16))
        .step_by(8)
        .find(|&at| &hay[at..at + 16] == key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bits_are_detected() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let n = 300u64;
        let cache = open(small(dir.path(), engine, 0));
        for i in 0..n {
            cache.insert(key(i), value(i, 0, 32 << 10)).await.unwrap();
        }
        cache.close().await;
        drop(cache);

        // Flip one bit inside the value of every third entry (found through its header,
        // which holds the key 8 bytes in; the value follows the 40-byte header).
        let mut files: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "dat"))
            .collect();
        files.sort();
        let mut contents: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
        let mut corrupted = Vec::new();
        for i in (0..n).step_by(3) {
            let k = key(i);
            let (f, at) = contents
                .iter()
                .enumerate()
                .find_map(|(f, c)| find(c, &k.0).map(|at| (f, at)))
                .expect("header on disk");
            let len = value(i, 0, 32 << 10).len();
            let value_off = at - 8 + 40;
            contents[f][value_off + (i as usize * 7919) % len] ^= 1 << (i % 8);
            corrupted.push(i);
        }
        for (f, c) in files.iter().zip(&contents) {
            std::fs::write(f, c).unwrap();
        }

        let cache = open(small(dir.path(), engine, 0));
        for i in 0..n {
            let got = cache.get(&key(i)).await;
            if corrupted.contains(&i) {
                assert!(
                    got.is_none(),
                    "{engine:?}: corrupted block {i} was returned"
                );
            } else {
                assert_eq!(
                    got.as_deref(),
                    Some(&value(i, 0, 32 << 10)[..]),
                    "{engine:?}: intact block {i}"
                );
            }
        }
        let stats = cache.stats();
        assert_eq!(
            stats.checksum_failures,
            corrupted.len() as u64,
            "{engine:?}"
        );
        // A detected entry leaves the index: the next get is a plain miss.
        assert!(!cache.contains(&key(0)));
        assert!(cache.get(&key(0)).await.is_none());
        assert_eq!(cache.stats().checksum_failures, corrupted.len() as u64);
    }
}
