//! LDS: the sidecar's listeners as Istio lays them out.
//! - `virtualOutbound` on 15001 (`use_original_dst`) hands each captured connection to the
//!   listener of its original destination, else passes it through.
//! - Per service port, a non-binding outbound listener: `0.0.0.0_PORT` with RDS for HTTP ports,
//!   `VIP_PORT` with tcp_proxy for TCP ports.
//! - `virtualInbound` on 15006 restores the original destination and has one filter chain per
//!   inbound port of the proxy's own workload, plus a passthrough chain.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use envoy_types::pb::google::protobuf::{Any, BoolValue, UInt32Value};
use envoy_types::util::pack_any;

use super::rds::route_to;
use super::{
    INBOUND_PASSTHROUGH_CLUSTER, Named, PASSTHROUGH_CLUSTER, VIRTUAL_INBOUND, VIRTUAL_INBOUND_PORT,
    VIRTUAL_OUTBOUND, VIRTUAL_OUTBOUND_PORT, ads_config_source, socket_address,
};
use crate::model::{Protocol, Proxy, inbound_cluster_name, outbound_cluster_name};
use crate::push_context::PushContext;

const WILDCARD: &str = "0.0.0.0";

fn network_filter(name: &str, config: Any) -> Filter {
    Filter {
        name: name.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(config)),
    }
}

fn tcp_proxy_filter(stat_prefix: &str, cluster: &str) -> Filter {
    network_filter(
        "envoy.filters.network.tcp_proxy",
        pack_any(TcpProxy {
            stat_prefix: stat_prefix.to_string(),
            cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.to_string())),
            ..Default::default()
        }),
    )
}

fn hcm_filter(stat_prefix: String, routes: http_connection_manager::RouteSpecifier) -> Filter {
    network_filter(
        "envoy.filters.network.http_connection_manager",
        pack_any(HttpConnectionManager {
            stat_prefix,
            route_specifier: Some(routes),
            http_filters: vec![HttpFilter {
                name: "envoy.filters.http.router".to_string(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
                    Router::default(),
                ))),
                ..Default::default()
            }],
            ..Default::default()
        }),
    )
}

fn listener(name: String, ip: &str, port: u16, chains: Vec<FilterChain>, bind: bool) -> Listener {
    Listener {
        name,
        address: Some(socket_address(ip, port)),
        filter_chains: chains,
        bind_to_port: (!bind).then_some(BoolValue { value: false }),
        traffic_direction: TrafficDirection::Outbound as i32,
        ..Default::default()
    }
}

fn chain(name: &str, filters: Vec<Filter>) -> FilterChain {
    FilterChain {
        name: name.to_string(),
        filters,
        ..Default::default()
    }
}

fn outbound_listeners(push: &PushContext) -> Vec<Listener> {
    let mut out = Vec::new();
    let mut http_ports = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for svc in &push.services {
        for port in &svc.ports {
            if port.protocol.is_http() {
                http_ports.insert(port.port);
                continue;
            }
            let cluster = outbound_cluster_name(port.port, &svc.hostname);
            for vip in &svc.addresses {
                let ip = vip.to_string();
                // Two services claiming the same VIP and port: the first (by hostname) wins, as
                // Envoy rejects a listener set with duplicate names.
                if !seen.insert((ip.clone(), port.port)) {
                    tracing::warn!(vip = %ip, port = port.port, host = %svc.hostname, "VIP:port already used by another service; skipped");
                    continue;
                }
                out.push(listener(
                    format!("{ip}_{}", port.port),
                    &ip,
                    port.port,
                    vec![chain(&cluster, vec![tcp_proxy_filter(&cluster, &cluster)])],
                    false,
                ));
            }
        }
    }
    for port in http_ports {
        let name = format!("{WILDCARD}_{port}");
        let rds = http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: Some(ads_config_source()),
            route_config_name: port.to_string(),
        });
        out.push(listener(
            name.clone(),
            WILDCARD,
            port,
            vec![chain(
                &name,
                vec![hcm_filter(format!("outbound_{name}"), rds)],
            )],
            false,
        ));
    }
    out
}

fn virtual_outbound() -> Listener {
    Listener {
        use_original_dst: Some(BoolValue { value: true }),
        ..listener(
            VIRTUAL_OUTBOUND.to_string(),
            WILDCARD,
            VIRTUAL_OUTBOUND_PORT,
            vec![chain(
                "virtualOutbound-catchall-tcp",
                vec![tcp_proxy_filter(PASSTHROUGH_CLUSTER, PASSTHROUGH_CLUSTER)],
            )],
            true,
        )
    }
}

fn virtual_inbound(push: &PushContext, proxy: &Proxy) -> Listener {
    // Workload port → protocol; HTTP wins if two services disagree.
    let mut ports: BTreeMap<u16, Protocol> = BTreeMap::new();
    for svc in &push.services {
        for ep in svc.endpoints.iter().filter(|e| proxy.owns(e)) {
            for port in &svc.ports {
                let entry = ports.entry(ep.target_port(port)).or_insert(port.protocol);
                if port.protocol.is_http() {
                    *entry = port.protocol;
                }
            }
        }
    }
    let mut chains: Vec<FilterChain> = ports
        .into_iter()
        .map(|(port, protocol)| {
            let cluster = inbound_cluster_name(port);
            let filter = if protocol.is_http() {
                let routes =
                    http_connection_manager::RouteSpecifier::RouteConfig(RouteConfiguration {
                        name: cluster.clone(),
                        virtual_hosts: vec![VirtualHost {
                            name: format!("inbound|http|{port}"),
                            domains: vec!["*".to_string()],
                            routes: vec![route_to(cluster.clone())],
                            ..Default::default()
                        }],
                        validate_clusters: Some(BoolValue { value: false }),
                        ..Default::default()
                    });
                hcm_filter(format!("inbound_{WILDCARD}_{port}"), routes)
            } else {
                tcp_proxy_filter(&cluster, &cluster)
            };
            FilterChain {
                filter_chain_match: Some(FilterChainMatch {
                    destination_port: Some(UInt32Value {
                        value: u32::from(port),
                    }),
                    ..Default::default()
                }),
                ..chain(&format!("{WILDCARD}_{port}"), vec![filter])
            }
        })
        .collect();
    chains.push(chain(
        "virtualInbound-catchall-tcp",
        vec![tcp_proxy_filter(
            INBOUND_PASSTHROUGH_CLUSTER,
            INBOUND_PASSTHROUGH_CLUSTER,
        )],
    ));
    Listener {
        listener_filters: vec![ListenerFilter {
            name: "envoy.filters.listener.original_dst".to_string(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(
                OriginalDst::default(),
            ))),
            ..Default::default()
        }],
        traffic_direction: TrafficDirection::Inbound as i32,
        ..listener(
            VIRTUAL_INBOUND.to_string(),
            WILDCARD,
            VIRTUAL_INBOUND_PORT,
            chains,
            true,
        )
    }
}

/// All listeners for `proxy` (LDS is requested as a wildcard).
pub fn generate(push: &PushContext, proxy: &Proxy) -> Vec<Named> {
    let mut listeners = outbound_listeners(push);
    listeners.push(virtual_outbound());
    listeners.push(virtual_inbound(push, proxy));
    listeners
        .into_iter()
        .map(|l| Named {
            name: l.name.clone(),
            resource: pack_any(l),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Service, ServicePort};

    #[test]
    fn two_services_on_one_vip_port_yield_one_listener() {
        let svc = |host: &str| Service {
            hostname: host.into(),
            namespace: "ns".into(),
            addresses: vec!["10.0.0.1".parse().unwrap()],
            ports: vec![ServicePort {
                name: "tcp".into(),
                port: 5432,
                protocol: Protocol::Tcp,
            }],
            endpoints: vec![],
        };
        let push = PushContext {
            version: "1".into(),
            services: vec![svc("a.example"), svc("b.example")],
        };
        let proxy = Proxy::from_node_id("sidecar~10.1.1.1~p.ns~ns.svc.cluster.local").unwrap();
        let names: Vec<String> = generate(&push, &proxy)
            .into_iter()
            .map(|n| n.name)
            .collect();
        assert_eq!(
            names.iter().filter(|n| *n == "10.0.0.1_5432").count(),
            1,
            "{names:?}"
        );
    }
}
