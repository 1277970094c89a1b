//! Generators: turn the PushContext snapshot into Envoy resources for one proxy, one xDS type
//! each (istiod's `pilot/pkg/networking/core` and `pilot/pkg/xds/*gen.go`). Pure functions of
//! (snapshot, proxy, requested names); the xDS server decides when to call them.

pub mod authn;
pub mod authz;
pub mod cds;
pub mod cluster_policy;
pub mod eds;
pub mod ext_authz;
pub mod gateway;
pub mod lds;
pub mod locality;
pub mod nds;
pub mod route;
pub mod telemetry;
pub mod tls;

use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, SocketAddress, address, config_source,
    socket_address,
};
use envoy_types::pb::google::protobuf::{Any, Duration};

pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// ECDS: a filter's config served on its own (EnvoyFilter EXTENSION_CONFIG).
pub const EXTENSION_CONFIG_TYPE: &str =
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";

/// Istio's well-known cluster names.
pub const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";
pub const BLACKHOLE_CLUSTER: &str = "BlackHoleCluster";
pub const INBOUND_PASSTHROUGH_CLUSTER: &str = "InboundPassthroughCluster";

/// Istio's listener names and ports for the capture targets.
pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";
pub const VIRTUAL_INBOUND: &str = "virtualInbound";
pub const VIRTUAL_OUTBOUND_PORT: u16 = 15001;
pub const VIRTUAL_INBOUND_PORT: u16 = 15006;

/// Source address Envoy uses towards the local app, exempted from capture by istio-init.
pub const INBOUND_PASSTHROUGH_BIND_V4: &str = "127.0.0.6";

/// A generated resource with its name, ready to be sent. The resource is shared: the
/// snapshot's cache and every response that carries it hold the same one.
#[derive(Debug, Clone)]
pub struct Named {
    pub name: String,
    pub resource: std::sync::Arc<Any>,
}

impl PartialEq for Named {
    /// The same resource: the same bytes, or, where a message holds a protobuf map (per-route
    /// filter configs, metadata) whose entries prost encodes in hash order, the same decoded
    /// message.
    fn eq(&self, other: &Self) -> bool {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        use envoy_types::pb::envoy::config::listener::v3::Listener;
        use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
        use prost::Message;
        fn same<M: Message + Default + PartialEq>(a: &Any, b: &Any) -> bool {
            match (M::decode(a.value.as_slice()), M::decode(b.value.as_slice())) {
                (Ok(x), Ok(y)) => x == y,
                _ => false,
            }
        }
        let (a, b) = (&*self.resource, &*other.resource);
        if self.name != other.name || a.type_url != b.type_url {
            return false;
        }
        a.value == b.value
            || match a.type_url.as_str() {
                ROUTE_TYPE => same::<RouteConfiguration>(a, b),
                CLUSTER_TYPE => same::<Cluster>(a, b),
                LISTENER_TYPE => same::<Listener>(a, b),
                _ => false,
            }
    }
}

impl Named {
    pub fn new(name: String, resource: Any) -> Self {
        Named {
            name,
            resource: std::sync::Arc::new(resource),
        }
    }
}

pub(crate) fn ads_config_source() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        resource_api_version: ApiVersion::V3 as i32,
        // Do not block Envoy's startup on a resource that may never come.
        initial_fetch_timeout: Some(Duration {
            seconds: 0,
            nanos: 0,
        }),
        ..Default::default()
    }
}

pub(crate) fn socket_address(
    ip: &str,
    port: u16,
) -> envoy_types::pb::envoy::config::core::v3::Address {
    envoy_types::pb::envoy::config::core::v3::Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    }
}

/// A gRPC service reached through Envoy's own client on `cluster`, with `authority` as the
/// `:authority` (a mesh service's host name: Envoy's default would be the cluster name, whose `|`
/// an HTTP/2 server refuses in an authority; empty keeps that default).
pub(crate) fn envoy_grpc(
    cluster: &str,
    authority: &str,
) -> envoy_types::pb::envoy::config::core::v3::GrpcService {
    use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};
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

pub(crate) fn seconds(s: i64) -> Duration {
    Duration {
        seconds: s,
        nanos: 0,
    }
}

/// `base` encoded, then each of `entries`: protobuf merges concatenated encodings of one
/// message, so a map field given as single-entry messages in `entries` decodes as the whole map
/// with its entries written in the order given. prost writes a protobuf map (a HashMap) in hash
/// order, which would make each generation of the same config differ in its bytes.
pub(crate) fn encode_map_in_order<M: prost::Message>(
    base: &M,
    entries: impl IntoIterator<Item = M>,
) -> Vec<u8> {
    let mut out = base.encode_to_vec();
    for e in entries {
        e.encode_raw(&mut out);
    }
    out
}
