//! A VirtualService's `tcp` routes on a sidecar's outbound TCP listener (Istio's
//! `buildSidecarOutboundTCPFilterChainOpts` / `buildOutboundNetworkFilters`): the first route
//! whose match applies to this proxy, port and destination decides where the connection goes,
//! to one cluster or split by weight.

use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};

use super::http::destination_cluster;
use crate::config_store::virtual_service::{L4Match, RouteDestination, TlsMatch};
use crate::model::{Proxy, Service};
use crate::push_context::{MeshRoute, PushContext};

fn in_subnet(ip: std::net::IpAddr, subnet: &str) -> bool {
    let (net, len) = subnet.split_once('/').unwrap_or((subnet, ""));
    let Ok(net) = net.parse::<std::net::IpAddr>() else {
        return false;
    };
    let bits = |ip: std::net::IpAddr| -> u128 {
        match ip {
            std::net::IpAddr::V4(v4) => u128::from(u32::from(v4)) << 96,
            std::net::IpAddr::V6(v6) => u128::from(v6),
        }
    };
    if ip.is_ipv4() != net.is_ipv4() {
        return false;
    }
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len: u32 = len.parse().unwrap_or(max);
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    };
    bits(ip) & mask == bits(net) & mask
}

/// Where the routes are built: the proxy (`None` when shared) and the Gateway
/// (`namespace/name`; `None` for sidecars).
#[derive(Clone, Copy)]
pub struct Source<'a> {
    pub proxy: Option<&'a Proxy>,
    pub gateway: Option<&'a str>,
}

fn applies(m: &L4Match, port: u16, vip: std::net::IpAddr, source: Source) -> bool {
    if m.port.is_some_and(|p| p.0 != port) {
        return false;
    }
    if !m.destination_subnets.is_empty() && !m.destination_subnets.iter().any(|s| in_subnet(vip, s))
    {
        return false;
    }
    super::source_applies(
        &m.gateways,
        &m.source_labels,
        m.source_namespace.as_ref(),
        source.proxy,
        source.gateway,
    )
}

/// Where `svc`'s connections on `vip:port` go when a VirtualService's tcp routes name it
/// (`None`: no route applies, the service's own cluster).
pub fn tcp_route(
    push: &PushContext,
    svc: &Service,
    port: u16,
    vip: std::net::IpAddr,
    proxy: Option<&Proxy>,
) -> Option<(tcp_proxy::ClusterSpecifier, String)> {
    let ns = proxy.map_or(svc.namespace.as_str(), |p| p.namespace.as_str());
    let vs = push.routing.for_host(&svc.hostname, ns)?;
    let source = Source {
        proxy,
        gateway: None,
    };
    vs_tcp_route(push, vs, port, vip, source)
}

/// The first of `vs`'s tcp routes that applies here, as (where to, stat prefix).
pub fn vs_tcp_route(
    push: &PushContext,
    vs: &MeshRoute,
    port: u16,
    vip: std::net::IpAddr,
    source: Source,
) -> Option<(tcp_proxy::ClusterSpecifier, String)> {
    let route = vs.tcp.iter().find(|r| {
        r.matches.is_empty() || r.matches.iter().any(|m| applies(m, port, vip, source))
    })?;
    Some(specifier(
        push,
        &route.route,
        port,
        &format!("{}.{}", vs.name, vs.namespace),
    ))
}

fn specifier(
    push: &PushContext,
    route: &[RouteDestination],
    port: u16,
    weighted_stat: &str,
) -> (tcp_proxy::ClusterSpecifier, String) {
    if let [only] = route {
        let cluster = destination_cluster(push, &only.destination, port);
        return (
            tcp_proxy::ClusterSpecifier::Cluster(cluster.clone()),
            cluster,
        );
    }
    let clusters = route
        .iter()
        .filter(|d| d.weight.unwrap_or(0) > 0)
        .map(|d| tcp_proxy::weighted_cluster::ClusterWeight {
            name: destination_cluster(push, &d.destination, port),
            weight: d.weight.unwrap_or(0),
            ..Default::default()
        })
        .collect();
    (
        tcp_proxy::ClusterSpecifier::WeightedClusters(tcp_proxy::WeightedCluster { clusters }),
        weighted_stat.to_string(),
    )
}

/// A VirtualService's `tls` routes for `svc` on this listener, in order, each as (SNI names,
/// where to), as Istio's `buildSidecarOutboundTLSFilterChainOpts`: one per applicable match,
/// `*` among the names meaning any; a repeated name set keeps the first.
pub fn tls_routes(
    push: &PushContext,
    svc: &Service,
    port: u16,
    vip: Option<std::net::IpAddr>,
    proxy: Option<&Proxy>,
) -> Vec<(Vec<String>, tcp_proxy::ClusterSpecifier, String)> {
    let ns = proxy.map_or(svc.namespace.as_str(), |p| p.namespace.as_str());
    let Some(vs) = push.routing.for_host(&svc.hostname, ns) else {
        return Vec::new();
    };
    let source = Source {
        proxy,
        gateway: None,
    };
    vs_tls_routes(push, vs, port, vip, source)
}

/// `vs`'s tls routes that apply here, each as (SNI names, where to, stat prefix); see
/// `tls_routes`.
pub fn vs_tls_routes(
    push: &PushContext,
    vs: &MeshRoute,
    port: u16,
    vip: Option<std::net::IpAddr>,
    source: Source,
) -> Vec<(Vec<String>, tcp_proxy::ClusterSpecifier, String)> {
    let mut out: Vec<(Vec<String>, tcp_proxy::ClusterSpecifier, String)> = Vec::new();
    for r in &vs.tls {
        for m in r
            .matches
            .iter()
            .filter(|m| tls_applies(m, port, vip, source))
        {
            let mut names: Vec<String> = if m.sni_hosts.iter().any(|h| h == "*") {
                Vec::new()
            } else {
                m.sni_hosts.iter().map(|h| h.to_ascii_lowercase()).collect()
            };
            names.sort();
            names.dedup();
            if out.iter().any(|(n, _, _)| *n == names) {
                continue;
            }
            let (spec, stat) = specifier(
                push,
                &r.route,
                port,
                &format!("{}.{}", vs.name, vs.namespace),
            );
            out.push((names, spec, stat));
        }
    }
    out
}

fn tls_applies(m: &TlsMatch, port: u16, vip: Option<std::net::IpAddr>, source: Source) -> bool {
    let as_l4 = L4Match {
        destination_subnets: if vip.is_some() {
            m.destination_subnets.clone()
        } else {
            Vec::new()
        },
        port: m.port,
        source_labels: m.source_labels.clone(),
        gateways: m.gateways.clone(),
        source_namespace: m.source_namespace.clone(),
    };
    applies(
        &as_l4,
        port,
        vip.unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
        source,
    )
}

/// The tcp_proxy config for a cluster specifier and stat prefix.
pub fn tcp_proxy(spec: tcp_proxy::ClusterSpecifier, stat_prefix: String) -> TcpProxy {
    TcpProxy {
        stat_prefix,
        cluster_specifier: Some(spec),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets() {
        let ip = |s: &str| s.parse().unwrap();
        assert!(in_subnet(ip("10.1.2.3"), "10.1.0.0/16"));
        assert!(!in_subnet(ip("10.2.2.3"), "10.1.0.0/16"));
        assert!(in_subnet(ip("10.2.2.3"), "10.2.2.3"));
        assert!(in_subnet(ip("10.2.2.3"), "0.0.0.0/0"));
        assert!(!in_subnet(ip("::1"), "0.0.0.0/0"));
    }
}
