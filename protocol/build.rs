// Generates the gRPC code from proto/iota.proto with the protoc binary that
// `protoc-bin-vendored` ships, so no system package is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/iota.proto");
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_with_config(config, &["proto/iota.proto"], &["proto"])?;
    Ok(())
}
