//! For recorded xDS (`src/xds_descriptors.rs`: the fixture replay's `fixture-ads`, `record-xds`):
//! one descriptor set holding Envoy's API (the set the `envoy-types` crate is generated from,
//! which it does not export) and the Istio-only extension configs of `protos/`, so recorded
//! config dumps can be encoded to protobuf and recorded responses rendered as JSON.

use std::path::PathBuf;

const PROTOS: [&str; 4] = [
    "protos/udpa_typed_struct.proto",
    "protos/istio_metadata_exchange.proto",
    "protos/istio_stats.proto",
    "protos/istio_alpn.proto",
];

/// envoy-types' `src/generated/types.bin`, in the package `istio-proto`'s build found (from
/// Cargo.lock and the registry, offline: no `cargo metadata`, which would want every
/// dev-dependency's manifest, more than a machine that only built has).
fn envoy_types_descriptors() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let dir = std::env::var("DEP_ISTIO_PROTO_ENVOY_TYPES_DIR")
        .map_err(|_| "istio-proto's build did not say where envoy-types is")?;
    let bin = PathBuf::from(dir).join("src/generated/types.bin");
    if !bin.exists() {
        return Err(format!("{} not found", bin.display()).into());
    }
    Ok(bin)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for f in PROTOS {
        println!("cargo:rerun-if-changed={f}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let envoy = envoy_types_descriptors()?;
    println!("cargo:rerun-if-changed={}", envoy.display());
    std::fs::copy(&envoy, out.join("envoy_types.bin"))?;
    let mut compiler = protox::Compiler::new(["protos"])?;
    compiler.include_imports(false);
    compiler.open_files(PROTOS)?;
    std::fs::write(
        out.join("istio_only.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    Ok(())
}
