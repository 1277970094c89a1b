//! Protobuf descriptors for reading and writing recorded xDS as JSON: Envoy's API (the set the
//! `envoy-types` crate is generated from, which it does not export) and the Istio-only
//! extension configs of `protos/` that istiod puts into sidecar config (see `build.rs`).

use prost_reflect::DescriptorPool;

const ENVOY_DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_types.bin"));
const ISTIO_DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/istio_only.bin"));

/// Envoy's API and the Istio-only extension configs.
pub fn descriptor_pool() -> Result<DescriptorPool, String> {
    let mut pool = DescriptorPool::decode(ENVOY_DESCRIPTORS)
        .map_err(|e| format!("envoy-types descriptor set: {e}"))?;
    pool.decode_file_descriptor_set(ISTIO_DESCRIPTORS)
        .map_err(|e| format!("Istio-only descriptor set: {e}"))?;
    Ok(pool)
}
