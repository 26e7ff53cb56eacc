// Generates the gRPC services from proto/iota.proto with the protoc binary
// that `protoc-bin-vendored` ships, so no system package is needed. The
// message types are `iota-wire`'s (generated there without tonic), so the
// pure crates and the services share one set of types.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/iota.proto");
    println!("cargo:rerun-if-changed=proto/status.proto");
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().extern_path(".iota.v1", "::iota_wire::pb").compile_with_config(
        config,
        &["proto/iota.proto"],
        &["proto"],
    )?;
    Ok(())
}
