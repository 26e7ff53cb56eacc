// Generates the schema's message types (no services: those need tonic and
// live in `iota-protocol`) from ../proto/iota.proto (and status.proto, which
// it imports: one package) with the protoc binary
// that `protoc-bin-vendored` ships, so no system package is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto/iota.proto");
    println!("cargo:rerun-if-changed=../proto/status.proto");
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    config.compile_protos(&["../proto/iota.proto", "../proto/status.proto"], &["../proto"])?;
    Ok(())
}
