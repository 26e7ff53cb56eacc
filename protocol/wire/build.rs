// Generates the schema's message types (no services: those need tonic and
// live in `iota-protocol`) from ../proto/iota.proto with the protoc binary
// that `protoc-bin-vendored` ships, so no system package is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto/iota.proto");
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    config.compile_protos(&["../proto/iota.proto"], &["../proto"])?;
    Ok(())
}
