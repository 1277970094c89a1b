//! RDS: one RouteConfiguration per outbound HTTP port, named by the port number as Istio does
//! (`"8080"`), with a virtual host per service on that port and the `allow_any` fallback.

use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action,
    route_match,
};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;

use super::{BLACKHOLE_CLUSTER, Named, PASSTHROUGH_CLUSTER, seconds};
use crate::model::{Proxy, Service, ServicePort, outbound_cluster_name};
use crate::push_context::PushContext;

pub(crate) fn route_to(cluster: String) -> Route {
    Route {
        name: "default".to_string(),
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix("/".to_string())),
            ..Default::default()
        }),
        action: Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster)),
            // Istio disables the route timeout unless a VirtualService sets one.
            timeout: Some(seconds(0)),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The names a client may use for `svc` on `port`: the FQDN, its short forms within the
/// namespace, and the VIPs, each with and without the port.
fn domains(svc: &Service, port: &ServicePort) -> Vec<String> {
    let mut names = vec![svc.hostname.clone()];
    let ns_suffix = format!(".{}.svc.", svc.namespace);
    if let Some(idx) = svc.hostname.find(&ns_suffix) {
        names.push(svc.hostname[..idx].to_string());
        names.push(format!("{}.{}", &svc.hostname[..idx], svc.namespace));
        names.push(format!("{}.{}.svc", &svc.hostname[..idx], svc.namespace));
    }
    names.extend(svc.addresses.iter().map(|a| match a {
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    }));
    let with_port: Vec<String> = names.iter().map(|n| format!("{n}:{}", port.port)).collect();
    names.extend(with_port);
    names
}

fn route_config(
    push: &PushContext,
    name: &str,
    visible: &dyn Fn(&Service, u16) -> bool,
    registry_only: bool,
) -> RouteConfiguration {
    let mut virtual_hosts = Vec::new();
    if let Ok(port_number) = name.parse::<u16>() {
        for svc in push.services.iter().filter(|s| visible(s, port_number)) {
            for port in svc
                .ports
                .iter()
                .filter(|p| p.port == port_number && p.protocol.is_http())
            {
                virtual_hosts.push(VirtualHost {
                    name: format!("{}:{}", svc.hostname, port.port),
                    domains: domains(svc, port),
                    routes: vec![route_to(outbound_cluster_name(port.port, &svc.hostname))],
                    ..Default::default()
                });
            }
        }
    }
    // Unknown hosts pass through, as with Istio's default outboundTrafficPolicy ALLOW_ANY;
    // under REGISTRY_ONLY they are refused.
    virtual_hosts.push(if registry_only {
        VirtualHost {
            name: "block_all".to_string(),
            domains: vec!["*".to_string()],
            routes: vec![route_to(BLACKHOLE_CLUSTER.to_string())],
            ..Default::default()
        }
    } else {
        VirtualHost {
            name: "allow_any".to_string(),
            domains: vec!["*".to_string()],
            routes: vec![route_to(PASSTHROUGH_CLUSTER.to_string())],
            ..Default::default()
        }
    });
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

/// Route configurations `names` for `proxy`; under a Sidecar resource only its egress hosts.
pub fn generate(push: &PushContext, proxy: &Proxy, names: &[impl AsRef<str>]) -> Vec<Named> {
    if let Some(scope) = push.sidecar_scope(proxy) {
        return names
            .iter()
            .map(|n| {
                let n = n.as_ref();
                Named::new(
                    n.to_string(),
                    pack_any(route_config(
                        push,
                        n,
                        &|s, p| scope.sees_port(s, p),
                        scope.registry_only,
                    )),
                )
            })
            .collect();
    }
    let all = push
        .cache
        .get(&push.cache.routes, "route configurations", || {
            push.http_ports()
                .into_iter()
                .map(|p| {
                    let name = p.to_string();
                    let resource = pack_any(route_config(
                        push,
                        &name,
                        &|_, _| true,
                        push.mesh_registry_only(),
                    ));
                    (name.clone(), Named::new(name, resource))
                })
                .collect()
        });
    names
        .iter()
        .map(|n| {
            let n = n.as_ref();
            all.get(n).cloned().unwrap_or_else(|| {
                Named::new(
                    n.to_string(),
                    pack_any(route_config(
                        push,
                        n,
                        &|_, _| true,
                        push.mesh_registry_only(),
                    )),
                )
            })
        })
        .collect()
}
