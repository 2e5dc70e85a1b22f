//! The FUSE mount over an S3 source (SeaweedFS on 127.0.0.1): every file reads back
//! byte-exact and the listing matches.

#[path = "fuse_harness.rs"]
mod harness;
mod support;

use harness::Env;
use support::SeaweedFs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_dataset_reads_back_byte_exact_through_fuse() {
    require_fuse!();
    let Some(s3) = SeaweedFs::start() else { return };
    s3.create_bucket("train").await;
    let mut env = Env::new(50, &[(5 << 20) + 777], "1MiB");
    for rel in &env.files {
        s3.put(
            "train",
            &format!("imagenet/{rel}"),
            std::fs::read(env.source(rel)).unwrap(),
        )
        .await;
    }
    env.use_s3(
        "s3://train/imagenet",
        &s3.endpoint(),
        s3.access_key(),
        s3.secret_key(),
    );

    tokio::task::block_in_place(|| {
        env.start_agent();
        let mut listed = Vec::new();
        for rel in &env.files {
            let got = std::fs::read(env.served(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
            let want = std::fs::read(env.source(rel)).unwrap();
            assert!(
                got == want,
                "{rel}: bytes differ ({} vs {})",
                got.len(),
                want.len()
            );
            listed.push(rel.split('/').next().unwrap().to_string());
        }
        listed.sort();
        listed.dedup();
        let mut served: Vec<String> = std::fs::read_dir(env.mount().join("m"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        served.sort();
        assert_eq!(served, listed);
        assert!(env.stop_agent().success());
    });
}
