//! Restart survival: a reader loops over the mount while the agent is SIGKILLed and
//! restarted. With the fd keeper the connection is adopted by the new agent and the reader
//! sees no error; with the keeper gone too, the dead mount is detached and remounted
//! without anyone running `umount`.

#[path = "fuse_harness.rs"]
mod harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use harness::Env;

/// Reads every file `rounds` times comparing with the source, retrying a failed read (as
/// a data loader would) until `deadline`; returns (reads, errors).
fn reader(
    env_files: Vec<(std::path::PathBuf, Vec<u8>)>,
    stop: Arc<AtomicBool>,
    errors: Arc<AtomicU64>,
) -> u64 {
    let mut reads = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed) {
        for (path, want) in &env_files {
            loop {
                assert!(
                    Instant::now() < deadline,
                    "reader stuck on {}",
                    path.display()
                );
                match std::fs::File::open(path).and_then(|f| {
                    let mut got = Vec::with_capacity(want.len());
                    std::io::Read::read_to_end(&mut &f, &mut got)?;
                    // Drop this file's page cache so the next round goes to the agent again.
                    let _ = nix::fcntl::posix_fadvise(
                        &f,
                        0,
                        0,
                        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
                    );
                    Ok(got)
                }) {
                    Ok(got) => {
                        assert!(
                            got == *want,
                            "{}: wrong bytes after restart",
                            path.display()
                        );
                        reads += 1;
                        break;
                    }
                    Err(e) => {
                        eprintln!("reader error on {}: {e}", path.display());
                        errors.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        }
    }
    reads
}

fn run(kill_keeper_too: bool) -> (u64, u64, Env) {
    let mut env = Env::new(60, &[6 << 20], "1MiB");
    env.start_agent();
    let files: Vec<_> = env
        .files
        .iter()
        .map(|r| (env.served(r), std::fs::read(env.source(r)).unwrap()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    // Four readers, each starting at a different file, so reads are in flight at the kill.
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let (stop, errors) = (stop.clone(), errors.clone());
            let mut files = files.clone();
            let shift = i * files.len() / 4;
            files.rotate_left(shift);
            std::thread::spawn(move || reader(files, stop, errors))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    env.kill_agent();
    if kill_keeper_too {
        env.stop_fd_keeper();
    }
    // Readers now block (keeper) or fail with ENOTCONN (no keeper) until the agent is back.
    std::thread::sleep(Duration::from_millis(500));
    env.start_agent();
    std::thread::sleep(Duration::from_millis(800));
    stop.store(true, Ordering::Relaxed);
    let reads = handles
        .into_iter()
        .map(|h| h.join().expect("reader panicked"))
        .sum();
    let errs = errors.load(Ordering::Relaxed);
    (reads, errs, env)
}

#[test]
fn sigkilled_agent_resumes_the_kept_connection_and_readers_see_no_error() {
    require_fuse!();
    let (reads, errors, mut env) = run(false);
    println!("restart with fd keeper: {reads} reads, {errors} reader errors");
    assert!(
        env.log(1).contains("resumed the kept FUSE connection"),
        "{}",
        env.log(1)
    );
    assert_eq!(errors, 0, "readers saw errors across the restart");
    // New opens, lookups and reads work on the adopted connection.
    let rel = env.files[3].clone();
    assert_eq!(
        std::fs::read(env.served(&rel)).unwrap(),
        std::fs::read(env.source(&rel)).unwrap()
    );
    assert!(env.stop_agent().success());
}

#[test]
fn dead_mount_without_keeper_is_detached_and_remounted() {
    require_fuse!();
    let (reads, errors, mut env) = run(true);
    println!(
        "restart without fd keeper: {reads} reads, {errors} reader errors (ENOTCONN while no agent ran; retried)"
    );
    assert!(
        env.log(1).contains("detaching stale FUSE mount"),
        "{}",
        env.log(1)
    );
    let rel = env.files[3].clone();
    assert_eq!(
        std::fs::read(env.served(&rel)).unwrap(),
        std::fs::read(env.source(&rel)).unwrap()
    );
    assert!(env.stop_agent().success());
}
