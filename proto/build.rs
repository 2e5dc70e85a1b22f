//! Compiles the .proto files with protox (pure Rust), so no protoc is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/block.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
