//! The pieces of listeners that sidecar (`lds`) and router (`gateway`) listeners are both built
//! from: filters, filter chains, the HTTP connection manager with the route filters its routes
//! use, and the authorization filters put in front of a chain or a router.

use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager, http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use envoy_types::pb::google::protobuf::{Any, BoolValue};
use envoy_types::util::pack_any;

use super::authz::InboundFilters;
use crate::push_context::PushContext;

pub fn network_filter(name: &str, config: Any) -> Filter {
    Filter {
        name: name.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(config)),
    }
}

pub fn tcp_proxy_filter(stat_prefix: &str, cluster: &str) -> Filter {
    network_filter(
        "envoy.filters.network.tcp_proxy",
        pack_any(TcpProxy {
            stat_prefix: stat_prefix.to_string(),
            cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.to_string())),
            ..Default::default()
        }),
    )
}

pub fn http_filter(name: &str, config: Any) -> HttpFilter {
    HttpFilter {
        name: name.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(config)),
        ..Default::default()
    }
}

/// The HTTP filters a connection manager needs beyond the router: fault and CORS (configured
/// per route by VirtualServices), as Istio's chain has them; here only when some route of the
/// snapshot uses them, since each costs every request something. Inbound routes are ours and
/// use neither.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteFilters {
    fault: bool,
    cors: bool,
}

impl RouteFilters {
    pub fn of(push: &PushContext) -> RouteFilters {
        let http = || {
            push.routing
                .virtual_services
                .iter()
                .chain(&push.routing.gateway_routes)
                .flat_map(|vs| vs.http.iter())
        };
        RouteFilters {
            fault: http().any(|r| r.fault.is_some()),
            cors: http().any(|r| r.cors_policy.is_some()),
        }
    }
}

pub fn hcm(
    stat_prefix: String,
    routes: http_connection_manager::RouteSpecifier,
    filters: RouteFilters,
) -> HttpConnectionManager {
    use envoy_types::pb::envoy::extensions::filters::http::{cors::v3::Cors, fault::v3::HttpFault};
    let mut http_filters = Vec::new();
    if filters.fault {
        http_filters.push(http_filter(
            crate::resource::FAULT_FILTER,
            pack_any(HttpFault::default()),
        ));
    }
    if filters.cors {
        http_filters.push(http_filter(
            crate::resource::CORS_FILTER,
            pack_any(Cors::default()),
        ));
    }
    http_filters.push(http_filter(
        "envoy.filters.http.router",
        pack_any(Router::default()),
    ));
    HttpConnectionManager {
        stat_prefix,
        route_specifier: Some(routes),
        http_filters,
        // Istio's default path normalization (BASE): paths are normalized (RFC 3986, `.`
        // and `..` resolved) before routes and authorization policies see them.
        normalize_path: Some(BoolValue { value: true }),
        // WebSocket upgrades pass through, as every HTTP connection manager of Istio's allows.
        upgrade_configs: vec![http_connection_manager::UpgradeConfig {
            upgrade_type: "websocket".to_string(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub fn listener_filter(name: &str, config: Any) -> ListenerFilter {
    ListenerFilter {
        name: name.to_string(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(config)),
        ..Default::default()
    }
}

pub fn chain(name: &str, filters: Vec<Filter>) -> FilterChain {
    FilterChain {
        name: name.to_string(),
        filters,
        ..Default::default()
    }
}

/// The network filters of a chain: the authorization filters, then `last`.
pub fn guarded(authz: &InboundFilters, last: Filter) -> Vec<Filter> {
    let mut filters = authz.tcp.clone();
    filters.push(last);
    filters
}

/// Puts the authorization HTTP filters just before the router (the router stays last).
pub fn with_authz(hcm: &mut HttpConnectionManager, authz: &InboundFilters) {
    let router = hcm.http_filters.len() - 1;
    hcm.http_filters
        .splice(router..router, authz.http.iter().cloned());
}
