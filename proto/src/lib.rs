//! Istio's own protos that Envoy's API (the `envoy-types` crate) does not carry: the CA service
//! (`istio.v1.auth.IstioCertificateService`) and the DNS name table pushed over NDS.

/// `istio.v1.auth`: the certificate signing service of istiod.
pub mod ca {
    tonic::include_proto!("istio.v1.auth");
}

/// `istio.networking.nds.v1`: the DNS name table.
pub mod nds {
    tonic::include_proto!("istio.networking.nds.v1");

    /// Type URL Envoy and the agent use for the name table.
    pub const TYPE_URL: &str = "type.googleapis.com/istio.networking.nds.v1.NameTable";
}

/// Envoy's v3 API as an encoded `FileDescriptorSet` (every `envoy/**/v3` message and what it
/// imports, the TypedStruct messages; no source info), compiled at build time from the protos
/// the `envoy-types` package ships: what typed Envoy config written as JSON (an EnvoyFilter's
/// patch values) is decoded and checked against.
pub const ENVOY_DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy.bin"));
