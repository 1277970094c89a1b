//! Small pieces of Envoy config that more than one program builds: a gRPC service reached
//! through Envoy's own client, and a duration as protobuf's.

use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};

/// A gRPC service reached through Envoy's own client on `cluster`, with `authority` as the
/// `:authority` (a mesh service's host name: Envoy's default would be the cluster name, whose `|`
/// an HTTP/2 server refuses in an authority; empty keeps that default).
pub fn envoy_grpc(cluster: &str, authority: &str) -> GrpcService {
    GrpcService {
        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
            grpc_service::EnvoyGrpc {
                cluster_name: cluster.to_string(),
                authority: authority.to_string(),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// `d` as a protobuf Duration; saturates at protobuf's largest (never reached from a
/// `GoDuration`, which is at most 2^63-1 ns).
pub fn proto_duration(d: std::time::Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
