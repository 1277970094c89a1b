//! What the generators produce and every later stage handles: a named resource ready to send
//! ([`Named`]), the xDS type URLs, and Istio's well-known names of listeners, clusters and
//! filters that the generators, the EnvoyFilter pass and the debug views all refer to.

use envoy_types::pb::google::protobuf::Any;

pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// ECDS: a filter's config served on its own (EnvoyFilter EXTENSION_CONFIG).
pub const EXTENSION_CONFIG_TYPE: &str =
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
/// SDS: a gateway's certificates (`credentialName`).
pub const SECRET_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// Istio's well-known cluster names.
pub const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";
pub const BLACKHOLE_CLUSTER: &str = "BlackHoleCluster";
pub const INBOUND_PASSTHROUGH_CLUSTER: &str = "InboundPassthroughCluster";

/// Istio's listener names and ports for the capture targets.
pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";
pub const VIRTUAL_INBOUND: &str = "virtualInbound";
pub use mesh_common::names::{VIRTUAL_INBOUND_PORT, VIRTUAL_OUTBOUND_PORT};

/// Source address Envoy uses towards the local app, exempted from capture by istio-init.
pub const INBOUND_PASSTHROUGH_BIND_V4: &str = "127.0.0.6";

/// Envoy's filter names that more than one generator places or matches.
pub const HTTP_RBAC: &str = "envoy.filters.http.rbac";
pub const NETWORK_RBAC: &str = "envoy.filters.network.rbac";
pub const JWT_AUTHN: &str = "envoy.filters.http.jwt_authn";
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
pub const CORS_FILTER: &str = "envoy.filters.http.cors";

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
