//! The envelope of an xDS response from a remote control plane: a `DiscoveryResponse` or
//! `DeltaDiscoveryResponse` with every field decoded except the bytes of each resource. A
//! response whose envelope does not decode is garbage (a broken or hostile control plane) and
//! ends Envoy's stream with an error, so Envoy keeps its config and reconnects; a resource that
//! does not decode is Envoy's to reject (it NACKs, and keeps the config it has), as the xDS
//! protocol has it. The resource bytes are slices of the received message, never copied.

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{ControlPlane, Metadata};
use envoy_types::pb::envoy::service::discovery::v3::resource::CacheControl;
use envoy_types::pb::envoy::service::discovery::v3::{ResourceError, ResourceName};
use envoy_types::pb::google::protobuf::Duration;
use prost::Message;
use tonic::Status;

/// `google.protobuf.Any` with its value left as bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct AnyBytes {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "bytes", tag = "2")]
    value: Bytes,
}

/// `DiscoveryResponse` (envoy/service/discovery/v3/discovery.proto), resources as `AnyBytes`.
#[derive(Clone, PartialEq, prost::Message)]
struct Sotw {
    #[prost(string, tag = "1")]
    version_info: String,
    #[prost(message, repeated, tag = "2")]
    resources: Vec<AnyBytes>,
    #[prost(bool, tag = "3")]
    canary: bool,
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
    #[prost(message, optional, tag = "6")]
    control_plane: Option<ControlPlane>,
    #[prost(message, repeated, tag = "7")]
    resource_errors: Vec<ResourceError>,
}

/// `Resource` of a Delta response, its resource as `AnyBytes`.
#[derive(Clone, PartialEq, prost::Message)]
struct DeltaResource {
    #[prost(string, tag = "1")]
    version: String,
    #[prost(message, optional, tag = "2")]
    resource: Option<AnyBytes>,
    #[prost(string, tag = "3")]
    name: String,
    #[prost(string, repeated, tag = "4")]
    aliases: Vec<String>,
    #[prost(message, optional, tag = "6")]
    ttl: Option<Duration>,
    #[prost(message, optional, tag = "7")]
    cache_control: Option<CacheControl>,
    #[prost(message, optional, tag = "8")]
    resource_name: Option<ResourceName>,
    #[prost(message, optional, tag = "9")]
    metadata: Option<Metadata>,
}

/// `DeltaDiscoveryResponse`, resources as `DeltaResource`.
#[derive(Clone, PartialEq, prost::Message)]
struct Delta {
    #[prost(string, tag = "1")]
    system_version_info: String,
    #[prost(message, repeated, tag = "2")]
    resources: Vec<DeltaResource>,
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
    #[prost(string, repeated, tag = "6")]
    removed_resources: Vec<String>,
    #[prost(message, optional, tag = "7")]
    control_plane: Option<ControlPlane>,
    #[prost(message, repeated, tag = "8")]
    removed_resource_names: Vec<ResourceName>,
    #[prost(message, repeated, tag = "9")]
    resource_errors: Vec<ResourceError>,
}

/// `msg` when its envelope decodes; otherwise the status that ends Envoy's stream.
pub(super) fn checked(delta: bool, msg: Bytes) -> Result<Bytes, Status> {
    let decoded = if delta {
        Delta::decode(msg.clone()).map(drop)
    } else {
        Sotw::decode(msg.clone()).map(drop)
    };
    match decoded {
        Ok(()) => Ok(msg),
        Err(e) => {
            tracing::error!(
                bytes = msg.len(),
                error = %e,
                "undecodable xDS response from the control plane; closing Envoy's stream"
            );
            Err(Status::internal(format!(
                "undecodable {} from the control plane ({} bytes): {e}",
                if delta {
                    "DeltaDiscoveryResponse"
                } else {
                    "DiscoveryResponse"
                },
                msg.len()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, Resource,
    };
    use envoy_types::pb::google::protobuf::Any;

    fn any() -> Any {
        Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            // Not a Cluster: the resource is Envoy's to judge, the envelope is fine.
            value: b"\xff\xff\xff".to_vec(),
        }
    }

    #[test]
    fn full_responses_pass_untouched() {
        let sotw = Bytes::from(
            DiscoveryResponse {
                version_info: "v1".into(),
                resources: vec![any()],
                type_url: "t".into(),
                nonce: "n".into(),
                control_plane: Some(ControlPlane {
                    identifier: "istiod-core".into(),
                }),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        assert_eq!(checked(false, sotw.clone()).unwrap(), sotw);
        let delta = Bytes::from(
            DeltaDiscoveryResponse {
                system_version_info: "v1".into(),
                resources: vec![Resource {
                    name: "a".into(),
                    version: "1".into(),
                    resource: Some(any()),
                    aliases: vec!["b".into()],
                    ttl: Some(Duration {
                        seconds: 5,
                        nanos: 0,
                    }),
                    metadata: Some(Metadata::default()),
                    ..Default::default()
                }],
                removed_resources: vec!["gone".into()],
                nonce: "n".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        assert_eq!(checked(true, delta.clone()).unwrap(), delta);
    }

    #[test]
    fn broken_envelopes_are_errors() {
        let sotw = DiscoveryResponse {
            resources: vec![any()],
            type_url: "t".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("not protobuf", b"\xff\xff\xff\xff".to_vec()),
            ("truncated", sotw[..sotw.len() - 2].to_vec()),
            // Field 2 (resources) as a varint instead of a message.
            ("wrong wire type", vec![0x10, 0x01]),
            // A resource whose Any is itself broken framing.
            ("broken resource", vec![0x12, 0x03, 0x0a, 0x05, b'x']),
        ];
        for (what, bytes) in cases {
            for delta in [false, true] {
                let e = checked(delta, Bytes::from(bytes.clone())).unwrap_err();
                assert_eq!(e.code(), tonic::Code::Internal, "{what}");
                assert!(e.message().contains("undecodable"), "{what}: {e:?}");
            }
        }
    }
}
