//! Reader threads, each with its own single-threaded tokio runtime, that run dataset reads.
//!
//! Why not `tokio::spawn`: the cache engine's `get_or_fetch` future is not `Send` today (it
//! keeps a mutex guard in scope across an await), so reads run as local tasks on these
//! threads; jobs are handed over as `Send` closures that build the future on arrival. Once
//! the engine's future is `Send` this can become a plain `Handle::spawn`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

type Job = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// A fixed set of reader threads; jobs are spread round-robin.
#[derive(Debug)]
pub struct ReadPool {
    senders: Vec<mpsc::UnboundedSender<Job>>,
    next: AtomicUsize,
}

impl ReadPool {
    /// Starts `threads` reader threads.
    pub fn new(threads: usize) -> std::io::Result<ReadPool> {
        let mut senders = Vec::with_capacity(threads);
        for i in 0..threads.max(1) {
            let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            std::thread::Builder::new()
                .name(format!("sluice-read-{i}"))
                .spawn(move || {
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, async move {
                        while let Some(job) = rx.recv().await {
                            tokio::task::spawn_local(job());
                        }
                    });
                })?;
            senders.push(tx);
        }
        Ok(ReadPool {
            senders,
            next: AtomicUsize::new(0),
        })
    }

    /// Runs the future that `make` builds on one of the reader threads.
    pub fn spawn<F, Fut>(&self, make: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.senders.len();
        let job: Job = Box::new(move || Box::pin(make()));
        // Send fails only once the thread is gone (process exit): the reply is then dropped,
        // and fuser answers the kernel with EIO for an unanswered reply.
        let _ = self.senders[i].send(job);
    }
}
