//! RDS: the outbound route configurations, as istiod lays them out
//! (`pilot/pkg/networking/core/httproute.go`):
//! - `"PORT"` for each port some service declares HTTP on: a virtual host per service on that
//!   port (`host:port`, sorted by name), whose routes come from the VirtualService that names the
//!   host (`http`), else one default route to `outbound|PORT||HOST`; VirtualService hosts that
//!   are no service get a virtual host of their own on port 80 (or on a port where the same
//!   VirtualService routes a service); `allow_any` (or `block_all` under REGISTRY_ONLY) last.
//! - `"HOST:PORT"` for a port with no declared protocol (sniffed HTTP): one virtual host for
//!   every authority, with that service's routes.

pub mod http;
pub mod retry;
pub mod tcp;

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::route::v3::{
    Decorator, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route,
    route_action, route_match,
};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;

use super::blocks::seconds;
use crate::model::{Proxy, Service, outbound_cluster_name};
use crate::push_context::PushContext;
use crate::resource::{BLACKHOLE_CLUSTER, Named, PASSTHROUGH_CLUSTER};

/// The per-proxy part of a route's match (Istio's sourceMatchHTTP / matchTCP): named gateways
/// (resolved, `routing::resolve_gateway`) must include the one the routes are built for
/// (`gateway`, `namespace/name`; `None` is `mesh`), and the source is then not checked; else
/// the proxy's labels and namespace must fit. Without a proxy (routes shared by all) only a
/// match on no source applies; shared routes exist only when no route matches on its source
/// (`Routing::per_proxy`).
pub(crate) fn source_applies(
    gateways: &[String],
    labels: &std::collections::BTreeMap<String, String>,
    namespace: Option<&String>,
    proxy: Option<&Proxy>,
    gateway: Option<&str>,
) -> bool {
    use crate::config_store::virtual_service::MESH_GATEWAY;
    if !gateways.is_empty() {
        let me = gateway.unwrap_or(MESH_GATEWAY);
        return gateways.iter().any(|g| g == me);
    }
    match proxy {
        None => labels.is_empty() && namespace.is_none(),
        Some(p) => {
            crate::registry::selects(labels, &p.labels)
                && namespace.is_none_or(|ns| *ns == p.namespace)
        }
    }
}

/// A route sending everything to `cluster`, with no retries: inbound routes and passthrough.
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

/// A service's route when no VirtualService names it: Istio's default route, with the
/// default retry policy and the DestinationRule's consistent hash.
fn default_route(push: &PushContext, svc: &Service, port: u16) -> Route {
    let mut r = route_to(outbound_cluster_name(port, &svc.hostname));
    let hash = if push.destination_rules.contains_key(&svc.hostname) {
        let destination = crate::config_store::virtual_service::Destination {
            host: svc.hostname.clone(),
            ..Default::default()
        };
        super::cluster_policy::hash_policy(push, &destination)
    } else {
        Vec::new()
    };
    if let Some(route::Action::Route(action)) = &mut r.action {
        action.retry_policy = Some(retry::default_retry(!hash.is_empty()));
        action.hash_policy = hash;
        #[allow(deprecated)]
        {
            action.max_grpc_timeout = action.timeout;
        }
    }
    r.decorator = Some(Decorator {
        operation: format!("{}:{port}/*", svc.hostname),
        ..Default::default()
    });
    r
}

/// The names a client may use for `svc`, as istiod 1.31 writes them for a sidecar (its
/// `generateVirtualHostDomains` with `ignore_port_in_host_matching`, so no `:PORT` forms): the
/// FQDN, the FQDN with a trailing dot (`PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN`, on by
/// default), for a Kubernetes service its short forms `NAME`, `NAME.NS.svc`, `NAME.NS`, then
/// the VIPs. istiod gives `NAME` only to proxies of the service's namespace; the route
/// configurations here are shared by every proxy, so it is there for all (the first service by
/// name claims it, `claim_domains`). Built without `format!`: this runs for every service of
/// every HTTP port.
fn domains(svc: &Service) -> Vec<String> {
    let mut names = Vec::with_capacity(5 + svc.addresses.len());
    names.push(svc.hostname.clone());
    if svc.hostname.parse::<std::net::IpAddr>().is_err() {
        names.push([svc.hostname.as_str(), "."].concat());
    }
    let ns = svc.namespace.as_str();
    if let Some(idx) = svc.hostname.find(&[".", ns, ".svc."].concat()) {
        let short = &svc.hostname[..idx];
        names.push(short.to_string());
        names.push([short, ".", ns, ".svc"].concat());
        names.push([short, ".", ns].concat());
    }
    for a in &svc.addresses {
        names.push(match a {
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            std::net::IpAddr::V4(v4) => {
                let mut out = String::with_capacity(15);
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        out.push('.');
                    }
                    push_decimal(&mut out, octet.into());
                }
                out
            }
        });
    }
    names
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, n: u16) {
    let mut digits = [0u8; 5];
    let mut len = 0;
    let mut n = n;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[..len].iter().rev().map(|&d| char::from(d)));
}

/// Drops every domain an earlier virtual host already claims (Envoy refuses a route
/// configuration naming a domain twice), then the virtual hosts left with none, and returns
/// what `with_claimed` makes of the claimed names (a membership check; dropping duplicates does
/// not change the set). One pass over borrowed names, so no domain is copied.
pub(super) fn claim_domains<T>(
    virtual_hosts: &mut Vec<VirtualHost>,
    with_claimed: impl FnOnce(&dyn Fn(&str) -> bool) -> T,
) -> T {
    let mut duplicates: Vec<(usize, usize)> = Vec::new();
    let out = {
        let mut seen = foldhash::HashSet::default();
        for (v, vh) in virtual_hosts.iter().enumerate() {
            for (d, domain) in vh.domains.iter().enumerate() {
                if !seen.insert(domain.as_str()) {
                    duplicates.push((v, d));
                }
            }
        }
        with_claimed(&|name| seen.contains(name))
    };
    if !duplicates.is_empty() {
        for &(v, d) in duplicates.iter().rev() {
            virtual_hosts[v].domains.remove(d);
        }
        virtual_hosts.retain(|vh| !vh.domains.is_empty());
    }
    out
}

/// The routes of `svc` on `port` for `proxy`: its VirtualService's, else the default route.
fn service_routes(ctx: http::Ctx, svc: &Service) -> Vec<Route> {
    let ns = ctx
        .proxy
        .map_or(svc.namespace.as_str(), |p| p.namespace.as_str());
    let vs = ctx.push.routing.for_host(&svc.hostname, ns);
    let routes = vs.map(|vs| http::routes(ctx, vs)).unwrap_or_default();
    if routes.is_empty() {
        vec![default_route(ctx.push, svc, ctx.port)]
    } else {
        routes
    }
}

/// A route configuration as Istio writes it: clusters are not validated, so a route to a
/// cluster Envoy has not received yet does not reject the whole configuration.
pub(super) fn route_configuration(
    name: &str,
    virtual_hosts: Vec<VirtualHost>,
) -> RouteConfiguration {
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

fn route_config(
    push: &PushContext,
    name: &str,
    visible: &dyn Fn(&Service, u16) -> bool,
    registry_only: bool,
    proxy: Option<&Proxy>,
) -> RouteConfiguration {
    let mut virtual_hosts = Vec::new();
    if let Some((host, port)) = name.rsplit_once(':')
        && let Ok(port) = port.parse::<u16>()
    {
        // A sniffed port: every authority reaching this listener is this service.
        if let Some(svc) = push.service(host).filter(|s| visible(s, port)) {
            virtual_hosts.push(VirtualHost {
                name: format!("{host}:{port}"),
                domains: vec!["*".to_string()],
                routes: service_routes(
                    http::Ctx {
                        push,
                        port,
                        proxy,
                        gateway: None,
                    },
                    svc,
                ),
                ..Default::default()
            });
        }
        return sidecar_route_configuration(name, virtual_hosts);
    }
    if let Ok(port_number) = name.parse::<u16>() {
        let ctx = http::Ctx {
            push,
            port: port_number,
            proxy,
            gateway: None,
        };
        for svc in push.services.iter().filter(|s| visible(s, port_number)) {
            for port in svc
                .ports
                .iter()
                .filter(|p| p.port == port_number && p.protocol.is_http())
            {
                let mut name = String::with_capacity(svc.hostname.len() + 6);
                name.push_str(&svc.hostname);
                name.push(':');
                push_decimal(&mut name, port.port);
                virtual_hosts.push(VirtualHost {
                    name,
                    domains: domains(svc),
                    routes: service_routes(ctx, svc),
                    ..Default::default()
                });
            }
        }
        let extra = claim_domains(&mut virtual_hosts, |claimed| {
            vs_host_vhosts(ctx, visible, claimed)
        });
        virtual_hosts.extend(extra);
        virtual_hosts.sort_by(|a, b| a.name.cmp(&b.name));
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
    sidecar_route_configuration(name, virtual_hosts)
}

/// A sidecar's outbound route configuration: as `route_configuration`, and the port of the
/// Host header is not part of the match (istiod's `ignore_port_in_host_matching`), so the
/// domains need no `:PORT` forms.
fn sidecar_route_configuration(name: &str, virtual_hosts: Vec<VirtualHost>) -> RouteConfiguration {
    RouteConfiguration {
        ignore_port_in_host_matching: true,
        ..route_configuration(name, virtual_hosts)
    }
}

/// Virtual hosts for VirtualService hosts that are no service on this port (an external name
/// such as `www.example.com`): on port 80 always, on another port when the same
/// VirtualService routes a service there (Istio's rule).
fn vs_host_vhosts(
    ctx: http::Ctx,
    visible: &dyn Fn(&Service, u16) -> bool,
    claimed: &dyn Fn(&str) -> bool,
) -> Vec<VirtualHost> {
    let mut out = Vec::new();
    // VirtualService hosts given a virtual host here (two VirtualServices may name one).
    let mut used = BTreeSet::new();
    let ns = ctx.proxy.map(|p| p.namespace.as_str());
    for vs in &ctx.push.routing.virtual_services {
        if ns.is_some_and(|ns| !vs.visible_in(ns)) {
            continue;
        }
        // Whether a host names a service serving HTTP on this port (worked out once a host).
        let serves = |s: &Service| {
            visible(s, ctx.port)
                && s.ports
                    .iter()
                    .any(|p| p.port == ctx.port && p.protocol.is_http())
        };
        let on_port: Vec<bool> = vs
            .hosts
            .iter()
            .map(|h| {
                if h.starts_with('*') {
                    ctx.push.services.iter().any(|s| {
                        crate::push_context::routing::host_matches(h, &s.hostname) && serves(s)
                    })
                } else {
                    ctx.push.service(h).is_some_and(serves)
                }
            })
            .collect();
        if ctx.port != 80 && !on_port.contains(&true) {
            continue;
        }
        let others: Vec<&String> = vs
            .hosts
            .iter()
            .zip(&on_port)
            .filter(|(_, on)| !**on)
            .map(|(h, _)| h)
            .collect();
        if others.is_empty() {
            continue;
        }
        let routes = http::routes(ctx, vs);
        if routes.is_empty() {
            continue;
        }
        for host in others {
            if claimed(host) || !used.insert(host.clone()) {
                continue;
            }
            out.push(VirtualHost {
                name: format!("{host}:{}", ctx.port),
                domains: vec![host.clone()],
                routes: routes.clone(),
                ..Default::default()
            });
        }
    }
    out
}

/// Route configurations `names` for `proxy`; under a Sidecar resource only its egress hosts.
/// Shared by every proxy unless a route depends on the proxy (sourceLabels, sourceNamespace,
/// exportTo) or a Sidecar scopes it.
pub fn generate(push: &PushContext, proxy: &Proxy, names: &[impl AsRef<str>]) -> Vec<Named> {
    let scope = push.sidecar_scope(proxy);
    if scope.is_some() || push.routing.per_proxy {
        let registry_only = scope
            .as_ref()
            .map_or(push.mesh_registry_only(), |s| s.registry_only);
        return names
            .iter()
            .map(|n| {
                let n = n.as_ref();
                let visible =
                    |s: &Service, p: u16| scope.as_ref().is_none_or(|sc| sc.sees_port(s, p));
                Named::new(
                    n.to_string(),
                    pack_any(route_config(push, n, &visible, registry_only, Some(proxy))),
                )
            })
            .collect();
    }
    let all = push
        .cache
        .get(&push.cache.routes, "route configurations", || {
            push.route_names()
                .into_iter()
                .map(|name| {
                    let resource = pack_any(route_config(
                        push,
                        &name,
                        &|_, _| true,
                        push.mesh_registry_only(),
                        None,
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
                        None,
                    )),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::push_context::from_yaml as push;

    #[test]
    fn domains_are_the_names_a_client_uses_each_claimed_once() {
        let push = push(
            "kind: ServiceEntry\nmetadata: {name: a, namespace: shop}\nspec:\n  hosts: [cart.shop.svc.cluster.local]\n  addresses: [240.0.0.1, 'fd00::1']\n  ports: [{number: 8080, name: http, protocol: HTTP}]\n  resolution: STATIC\n  endpoints: [{address: 10.0.0.1}]\n---\nkind: ServiceEntry\nmetadata: {name: b, namespace: shop}\nspec:\n  hosts: [other.example.com]\n  addresses: [240.0.0.1]\n  ports: [{number: 8080, name: http, protocol: HTTP}]\n  resolution: STATIC\n  endpoints: [{address: 10.0.0.2}]\n---\nkind: VirtualService\nmetadata: {name: v, namespace: shop}\nspec:\n  hosts: [other.example.com, www.example.com]\n  http: [{route: [{destination: {host: other.example.com}}]}]\n",
        );
        let config = route_config(&push, "8080", &|_, _| true, false, None);
        let hosts: Vec<(&str, Vec<&str>)> = config
            .virtual_hosts
            .iter()
            .map(|vh| {
                (
                    vh.name.as_str(),
                    vh.domains.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            hosts,
            vec![
                (
                    "cart.shop.svc.cluster.local:8080",
                    vec![
                        "cart.shop.svc.cluster.local",
                        "cart.shop.svc.cluster.local.",
                        "cart",
                        "cart.shop.svc",
                        "cart.shop",
                        "240.0.0.1",
                        "[fd00::1]",
                    ]
                ),
                // The shared VIP stays with the first service (by name).
                (
                    "other.example.com:8080",
                    vec!["other.example.com", "other.example.com."]
                ),
                // A VirtualService host that is a service gets no second virtual host; one that
                // is not gets its own, as it routes a service on this port.
                ("www.example.com:8080", vec!["www.example.com"]),
                ("allow_any", vec!["*"]),
            ]
        );
    }

    #[test]
    fn decimal_digits() {
        for n in [0u16, 7, 10, 80, 255, 8080, 15001, 65535] {
            let mut s = String::new();
            push_decimal(&mut s, n);
            assert_eq!(s, n.to_string());
        }
    }
}
