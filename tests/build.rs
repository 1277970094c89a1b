//! For recorded xDS (`src/xds_descriptors.rs`: the fixture replay's `fixture-ads`, `record-xds`):
//! one descriptor set holding Envoy's API (the set the `envoy-types` crate is generated from,
//! which it does not export) and the Istio-only extension configs of `protos/`, so recorded
//! config dumps can be encoded to protobuf and recorded responses rendered as JSON.

use std::path::PathBuf;
use std::process::Command;

const PROTOS: [&str; 4] = [
    "protos/udpa_typed_struct.proto",
    "protos/istio_metadata_exchange.proto",
    "protos/istio_stats.proto",
    "protos/istio_alpn.proto",
];

/// envoy-types' `src/generated/types.bin`, found through `cargo metadata`. Filtered to the
/// platform being built for: without the filter, cargo wants the manifests of every platform's
/// crates (Windows-only ones too), which a CARGO_HOME that fetched only this platform's crates
/// does not hold, and `--offline` cannot download.
fn envoy_types_descriptors() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let cargo = std::env::var("CARGO")?;
    let target = std::env::var("TARGET")?;
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &target])
        .current_dir(std::env::var("CARGO_MANIFEST_DIR")?)
        .output()?;
    if !out.status.success() {
        return Err(format!("cargo metadata: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let manifest = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("envoy-types is not among the dependencies")?;
    let bin = PathBuf::from(manifest)
        .parent()
        .ok_or("envoy-types manifest has no directory")?
        .join("src/generated/types.bin");
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
