//! A router's (`pilot-agent proxy router`) config from the Gateways that select it, as istiod
//! builds a gateway's (`pilot/pkg/networking/core/gateway.go`, `pilot/pkg/model/gateway.go`):
//! - Selection: a Gateway whose `selector` is a subset of the router's labels (an empty selector
//!   selects every router), in any namespace unless PILOT_SCOPE_GATEWAY_TO_NAMESPACE.
//! - LDS: one binding listener per server port (`0.0.0.0_PORT`, or `BIND_PORT`). Plain HTTP
//!   servers share one chain whose routes are `http.PORT`; each TLS-terminating HTTPS server has
//!   a chain matched by SNI (its hosts) with routes `https.PORT.PORTNAME.GATEWAY.NAMESPACE`; TLS
//!   servers carry the bound VirtualServices' `tcp` routes (terminated) or `tls` routes by SNI
//!   (PASSTHROUGH); AUTO_PASSTHROUGH sends the connection to the cluster its SNI names; TCP
//!   servers carry `tcp` routes. The authorization filters that select the router guard every
//!   chain.
//! - RDS: per server, a virtual host per host of each bound VirtualService (`gateways` naming
//!   the Gateway) that the server's hosts admit; VirtualServices naming one host are merged
//!   in order; `httpsRedirect` is `require_tls: ALL` (a 301 to https). An unmatched host gets
//!   Envoy's 404.
//! - CDS: every service's outbound clusters (and, for AUTO_PASSTHROUGH, the SNI-named ones).
//! - SDS over ADS: `kubernetes://NAME` (certificate and key) and `kubernetes://NAME-cacert`
//!   (the CA of NAME-cacert, else of NAME) from the Secrets of the router's own namespace.
//!
//! What a port cannot carry (a plain HTTP server on a port a TLS server holds, a second chain
//! for the same SNI names) is left out and logged, as istiod does.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{DataSource, TrafficDirection, data_source};
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, Route, RouteConfiguration, RouteMatch, VirtualHost, route, route_match,
    virtual_host,
};
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    Rds, http_connection_manager,
};
use envoy_types::pb::envoy::extensions::filters::network::sni_cluster::v3::SniCluster;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;

use super::blocks::{ads_config_source, socket_address};
use super::listener::{
    RouteFilters, chain, guarded, hcm, listener_filter, network_filter, with_authz,
};
use super::route::http::{self, Ctx};
use super::route::tcp::{self, Source};
use super::tls;
use crate::config_store::Metadata;
use crate::config_store::TlsSecret;
use crate::config_store::gateway::{
    GatewaySpec, Server, ServerProtocol, ServerTls, TlsMode, split_host,
};
use crate::model::Proxy;
use crate::push_context::routing::host_matches;
use crate::push_context::{MeshRoute, PushContext};
use crate::resource::{BLACKHOLE_CLUSTER, Named};

/// SDS names of a `credentialName`, as istiod names them.
pub const CREDENTIAL_PREFIX: &str = "kubernetes://";
pub const CACERT_SUFFIX: &str = "-cacert";

/// One server of a Gateway that selects the router.
#[derive(Debug, Clone, Copy)]
pub struct GatewayServer<'a> {
    pub meta: &'a Metadata,
    pub server: &'a Server,
}

impl GatewayServer<'_> {
    /// `namespace/name` of the Gateway, as VirtualServices name it once resolved.
    pub fn gateway(&self) -> String {
        format!("{}/{}", self.meta.namespace(), self.meta.name)
    }

    fn number(&self) -> u16 {
        self.server
            .port
            .as_ref()
            .and_then(|p| u16::try_from(p.number).ok())
            .unwrap_or_default()
    }

    fn listen_port(&self) -> u16 {
        self.server
            .port
            .as_ref()
            .map(|p| p.listen_port())
            .unwrap_or_default()
    }

    fn bind(&self) -> &str {
        self.server.bind.as_deref().unwrap_or(WILDCARD)
    }

    /// `https.PORT.PORTNAME.GATEWAY.NAMESPACE`: the routes of one TLS-terminating server.
    fn https_route_name(&self) -> String {
        let port_name = self.server.port.as_ref().map_or("", |p| p.name.as_str());
        format!(
            "https.{}.{port_name}.{}.{}",
            self.number(),
            self.meta.name,
            self.meta.namespace()
        )
    }

    /// The server's hosts without their namespace part; `*` among them is any name.
    fn dns_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .server
            .hosts
            .iter()
            .map(|h| split_host(h).1.to_ascii_lowercase())
            .collect();
        if names.iter().any(|n| n == "*") {
            return Vec::new();
        }
        names.sort();
        names.dedup();
        names
    }
}

const WILDCARD: &str = "0.0.0.0";

/// The servers of every Gateway that selects `proxy` (whose workload carries `labels`),
/// Gateways in (namespace, name) order.
pub fn servers<'a>(
    push: &'a PushContext,
    proxy: &Proxy,
    labels: &BTreeMap<String, String>,
) -> Vec<GatewayServer<'a>> {
    let selects = |meta: &Metadata, spec: &GatewaySpec| {
        (!(push.scope_gateway_to_namespace || spec.own_namespace_only)
            || meta.namespace() == proxy.namespace)
            && crate::registry::selects(&spec.selector, labels)
    };
    push.gateways
        .iter()
        .filter(|(m, s)| selects(m, s))
        .flat_map(|(meta, spec)| {
            spec.servers
                .iter()
                .map(move |server| GatewayServer { meta, server })
        })
        .collect()
}

/// The hosts of `vs` a server admits (Istio's host intersection with the `ns/` filter): each
/// VirtualService host matched by a server host, the more specific of the two.
fn admitted_hosts(gs: &GatewayServer, vs: &MeshRoute) -> Vec<String> {
    let mut out = Vec::new();
    for h in &gs.server.hosts {
        let (ns, host) = split_host(h);
        let ns_ok = match ns {
            "*" => true,
            "." => vs.namespace == gs.meta.namespace(),
            // `~/host`: no VirtualService, the server takes none.
            "~" => false,
            other => vs.namespace == other,
        };
        if !ns_ok {
            continue;
        }
        let host = host.to_ascii_lowercase();
        for vh in &vs.hosts {
            let pick = if host_matches(&host, vh) {
                vh.clone()
            } else if host_matches(vh, &host) {
                host.clone()
            } else {
                continue;
            };
            if !out.contains(&pick) {
                out.push(pick);
            }
        }
    }
    out
}

/// The VirtualServices bound to the server's Gateway and visible in its namespace, with the
/// hosts of each the server admits.
fn bound<'a>(push: &'a PushContext, gs: &GatewayServer) -> Vec<(&'a MeshRoute, Vec<String>)> {
    let gateway = gs.gateway();
    push.routing
        .gateway_routes
        .iter()
        .filter(|vs| vs.gateways.contains(&gateway) && vs.visible_in(gs.meta.namespace()))
        .filter_map(|vs| {
            let hosts = admitted_hosts(gs, vs);
            (!hosts.is_empty()).then_some((vs.as_ref(), hosts))
        })
        .collect()
}

/// How a port's connections are read: decided by the first server on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortKind {
    PlainHttp,
    Tls,
    Tcp,
}

fn port_kind(s: &Server) -> Option<PortKind> {
    Some(match s.protocol()? {
        ServerProtocol::Http | ServerProtocol::Http2 | ServerProtocol::Grpc => PortKind::PlainHttp,
        ServerProtocol::Https | ServerProtocol::Tls => PortKind::Tls,
        ServerProtocol::Tcp | ServerProtocol::Mongo => PortKind::Tcp,
    })
}

/// The servers of each listener (bind address, port), in order.
fn by_listener<'a>(
    servers: &[GatewayServer<'a>],
) -> BTreeMap<(String, u16), Vec<GatewayServer<'a>>> {
    let mut out: BTreeMap<(String, u16), Vec<GatewayServer>> = BTreeMap::new();
    for s in servers {
        out.entry((s.bind().to_string(), s.listen_port()))
            .or_default()
            .push(*s);
    }
    out
}

/// The router's listeners.
pub fn listeners(push: &PushContext, proxy: &Proxy) -> Vec<Named> {
    let labels = proxy.workload_labels(&push.services);
    let servers = servers(push, proxy, &labels);
    let authz = super::authz::inbound(push, proxy, &labels);
    let filters = RouteFilters::of(push);
    // A gateway reports and logs as a client (Istio's CLIENT mode for gateways).
    let telemetry = push.telemetry(&proxy.namespace, &labels);
    let instruments =
        super::telemetry::Instruments::new(push, proxy, &telemetry.client, true, true);
    let mut out = Vec::new();
    for ((bind, port), on_port) in by_listener(&servers) {
        let Some(kind) = port_kind(on_port[0].server) else {
            continue;
        };
        let name = format!("{bind}_{port}");
        let mut chains: Vec<FilterChain> = Vec::new();
        for gs in &on_port {
            if port_kind(gs.server) != Some(kind) {
                tracing::warn!(
                    gateway = %gs.gateway(),
                    port,
                    "a server's protocol conflicts with the first server on this port; it is left out"
                );
                continue;
            }
            match kind {
                PortKind::PlainHttp => {
                    if chains.is_empty() {
                        chains.push(http_chain(
                            &name,
                            format!("http.{port}"),
                            None,
                            &authz,
                            filters,
                        ));
                    }
                }
                PortKind::Tcp => {
                    if chains.is_empty()
                        && let Some(c) = tcp_chain(push, proxy, gs, &name, None, &authz)
                    {
                        chains.push(c);
                    }
                }
                PortKind::Tls => {
                    for c in tls_chains(push, proxy, gs, &name, &authz, filters) {
                        add_unique(&mut chains, c, &name);
                    }
                }
            }
        }
        if chains.is_empty() {
            continue;
        }
        let tls_port = kind == PortKind::Tls;
        let mut listener = Listener {
            name: name.clone(),
            address: Some(socket_address(&bind, port)),
            filter_chains: chains,
            traffic_direction: TrafficDirection::Outbound as i32,
            listener_filters: if tls_port {
                vec![listener_filter(
                    "envoy.filters.listener.tls_inspector",
                    pack_any(TlsInspector::default()),
                )]
            } else {
                Vec::new()
            },
            ..Default::default()
        };
        instruments.apply(&mut listener);
        out.push(Named::new(name, pack_any(listener)));
    }
    out
}

/// Adds `c` unless an earlier chain matches the same connections (Envoy refuses a listener
/// with two chains of one match).
fn add_unique(chains: &mut Vec<FilterChain>, c: FilterChain, listener: &str) {
    if chains
        .iter()
        .any(|other| other.filter_chain_match == c.filter_chain_match)
    {
        tracing::warn!(
            listener,
            chain = %c.name,
            "two gateway servers or routes match the same SNI names; the later one is left out"
        );
        return;
    }
    chains.push(c);
}

fn sni_match(names: Vec<String>) -> Option<FilterChainMatch> {
    (!names.is_empty()).then(|| FilterChainMatch {
        server_names: names,
        ..Default::default()
    })
}

/// A connection manager with RDS `route_name`; behind TLS when `tls` is given.
fn http_chain(
    listener: &str,
    route_name: String,
    tls: Option<TlsMatch>,
    authz: &super::authz::InboundFilters,
    filters: RouteFilters,
) -> FilterChain {
    let mut manager = hcm(
        format!("outbound_{listener}"),
        http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: Some(ads_config_source()),
            route_config_name: route_name.clone(),
        }),
        filters,
    );
    // The gateway is the edge: the client's address is the peer's, not a header's.
    manager.use_remote_address = Some(BoolValue { value: true });
    manager.forward_client_cert_details =
        http_connection_manager::ForwardClientCertDetails::Sanitize as i32;
    with_authz(&mut manager, authz);
    let mut c = chain(
        &route_name,
        vec![network_filter(
            "envoy.filters.network.http_connection_manager",
            pack_any(manager),
        )],
    );
    behind_tls(&mut c, tls);
    c
}

/// What a TLS-terminating chain matches (SNI) and its TLS.
type TlsMatch = (
    FilterChainMatch,
    envoy_types::pb::envoy::config::core::v3::TransportSocket,
);

/// Puts chain `c` behind `tls` (an empty match matches any connection).
fn behind_tls(c: &mut FilterChain, tls: Option<TlsMatch>) {
    if let Some((m, socket)) = tls {
        c.filter_chain_match = Some(m).filter(|m| *m != FilterChainMatch::default());
        c.transport_socket = Some(socket);
    }
}

/// The first bound VirtualService's `tcp` route that applies to this server.
fn tcp_chain(
    push: &PushContext,
    proxy: &Proxy,
    gs: &GatewayServer,
    listener: &str,
    tls: Option<TlsMatch>,
    authz: &super::authz::InboundFilters,
) -> Option<FilterChain> {
    let gateway = gs.gateway();
    let source = Source {
        proxy: Some(proxy),
        gateway: Some(&gateway),
    };
    let unspecified = std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
    let (spec, stat) = bound(push, gs)
        .into_iter()
        .find_map(|(vs, _)| tcp::vs_tcp_route(push, vs, gs.number(), unspecified, source))?;
    let mut c = chain(
        &format!("{listener}-tcp-{}", gs.gateway()),
        guarded(
            authz,
            network_filter(
                "envoy.filters.network.tcp_proxy",
                pack_any(tcp::tcp_proxy(spec, stat)),
            ),
        ),
    );
    behind_tls(&mut c, tls);
    Some(c)
}

/// The chains of one server on a TLS port.
fn tls_chains(
    push: &PushContext,
    proxy: &Proxy,
    gs: &GatewayServer,
    listener: &str,
    authz: &super::authz::InboundFilters,
    filters: RouteFilters,
) -> Vec<FilterChain> {
    let Some(server_tls) = gs.server.tls.as_ref() else {
        return Vec::new();
    };
    match server_tls.mode {
        TlsMode::Passthrough => passthrough_chains(push, proxy, gs, listener, authz),
        TlsMode::AutoPassthrough => vec![auto_passthrough_chain(gs, listener, authz)],
        TlsMode::Simple | TlsMode::Mutual | TlsMode::OptionalMutual | TlsMode::IstioMutual => {
            terminating_chains(push, proxy, gs, server_tls, listener, authz, filters)
        }
    }
}

/// PASSTHROUGH: the TLS routes of the VirtualServices bound to the server, by SNI.
fn passthrough_chains(
    push: &PushContext,
    proxy: &Proxy,
    gs: &GatewayServer,
    listener: &str,
    authz: &super::authz::InboundFilters,
) -> Vec<FilterChain> {
    let names = gs.dns_names();
    let gateway = gs.gateway();
    let source = Source {
        proxy: Some(proxy),
        gateway: Some(&gateway),
    };
    let mut out = Vec::new();
    for (vs, _) in bound(push, gs) {
        for (i, (sni, spec, stat)) in tcp::vs_tls_routes(push, vs, gs.number(), None, source)
            .into_iter()
            .enumerate()
        {
            // SNI names the server does not admit are not routed here.
            let sni: Vec<String> = if sni.is_empty() { names.clone() } else { sni };
            let mut c = chain(
                &format!("{listener}-{}.{}-{i}", vs.name, vs.namespace),
                guarded(
                    authz,
                    network_filter(
                        "envoy.filters.network.tcp_proxy",
                        pack_any(tcp::tcp_proxy(spec, stat)),
                    ),
                ),
            );
            c.filter_chain_match = sni_match(sni);
            out.push(c);
        }
    }
    out
}

/// AUTO_PASSTHROUGH: to the cluster the SNI names.
fn auto_passthrough_chain(
    gs: &GatewayServer,
    listener: &str,
    authz: &super::authz::InboundFilters,
) -> FilterChain {
    let names = gs.dns_names();
    // The SNI is `outbound_.PORT_.SUBSET_.HOST`, the name of a cluster CDS gives
    // routers with such a server; sni_cluster picks it, tcp_proxy's own is a fallback.
    let mut c = chain(
        &format!("{listener}-auto-passthrough"),
        guarded(
            authz,
            network_filter(
                "envoy.filters.network.sni_cluster",
                pack_any(SniCluster::default()),
            ),
        ),
    );
    c.filters.push(network_filter(
        "envoy.filters.network.tcp_proxy",
        pack_any(tcp::tcp_proxy(
            envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier::Cluster(
                BLACKHOLE_CLUSTER.to_string(),
            ),
            format!("{listener}-auto-passthrough"),
        )),
    ));
    c.filter_chain_match = sni_match(names.iter().map(|n| sni_pattern(n)).collect());
    c
}

/// SIMPLE, MUTUAL, OPTIONAL_MUTUAL and ISTIO_MUTUAL: TLS ends here, then HTTPS routes or TCP.
/// A server whose credentialName cannot be served is left out.
fn terminating_chains(
    push: &PushContext,
    proxy: &Proxy,
    gs: &GatewayServer,
    server_tls: &ServerTls,
    listener: &str,
    authz: &super::authz::InboundFilters,
    filters: RouteFilters,
) -> Vec<FilterChain> {
    let verifies = matches!(server_tls.mode, TlsMode::Mutual | TlsMode::OptionalMutual);
    if let Some(c) = &server_tls.credential_name
        && !(proxy.reads_secrets
            && credential_secret(push, &proxy.namespace, c)
                .is_some_and(|(ns, name)| has_secret(push, ns, name, verifies)))
    {
        tracing::warn!(
            gateway = %gs.gateway(),
            credential = %c,
            namespace = %proxy.namespace,
            "credentialName cannot be served: no Secret in the gateway's namespace with a certificate and key (and, to verify clients, a CA), or the caller is not verified for that namespace; the server is left out"
        );
        return Vec::new();
    }
    let http = gs.server.protocol() == Some(ServerProtocol::Https);
    let socket = tls::gateway_socket(server_tls, http);
    let matched = FilterChainMatch {
        server_names: gs.dns_names(),
        ..Default::default()
    };
    if http {
        vec![http_chain(
            listener,
            gs.https_route_name(),
            Some((matched, socket)),
            authz,
            filters,
        )]
    } else {
        tcp_chain(push, proxy, gs, listener, Some((matched, socket)), authz)
            .into_iter()
            .collect()
    }
}

/// A server host as an AUTO_PASSTHROUGH SNI pattern: the SNI ends in the service host.
fn sni_pattern(host: &str) -> String {
    if host.starts_with("*.") {
        host.to_string()
    } else {
        format!("*.{host}")
    }
}

/// The Secret (namespace, name) a router of `namespace` reads for credentialName `c`: `NAME`
/// of its own namespace, or `kubernetes-gateway://NS/NAME` when NS is its own or a
/// ReferenceGrant of NS lets its Gateways read that Secret (as istiod allows); `None` when not
/// permitted.
fn credential_secret<'a>(
    push: &PushContext,
    namespace: &'a str,
    c: &'a str,
) -> Option<(&'a str, &'a str)> {
    let Some(rest) = c.strip_prefix(crate::gateway_conversion::GATEWAY_CREDENTIAL_PREFIX) else {
        return Some((namespace, c));
    };
    let (ns, name) = rest.split_once('/')?;
    crate::gateway_conversion::secret_granted(&push.reference_grants, namespace, ns, name)
        .then_some((ns, name))
}

/// Whether the Secrets of `namespace` serve `kubernetes://name` (and, with `ca`, a CA for
/// `kubernetes://name-cacert`): a server whose credential is missing is left out rather than
/// leaving the whole listener waiting for it.
fn has_secret(push: &PushContext, namespace: &str, name: &str, ca: bool) -> bool {
    find_secret(push, namespace, name).is_some_and(|s| s.cert.is_some() && s.key.is_some())
        && (!ca || credential_ca(push, namespace, name).is_some())
}

/// The Secret `name` of `namespace`.
fn find_secret<'a>(push: &'a PushContext, namespace: &str, name: &str) -> Option<&'a TlsSecret> {
    push.secrets
        .iter()
        .find(|(m, _)| m.namespace() == namespace && m.name == name)
        .map(|(_, s)| s)
}

/// The CA of credential `name` (`kubernetes://name-cacert`), as istiod finds it: the CA of
/// the Secret `name-cacert`, else that of the Secret `name`.
fn credential_ca<'a>(push: &'a PushContext, namespace: &str, name: &str) -> Option<&'a [u8]> {
    find_secret(push, namespace, &format!("{name}{CACERT_SUFFIX}"))
        .and_then(|s| s.ca.as_deref())
        .or_else(|| find_secret(push, namespace, name).and_then(|s| s.ca.as_deref()))
}

/// Whether any server of the router passes TLS through by SNI cluster (AUTO_PASSTHROUGH).
pub fn auto_passthrough(push: &PushContext, proxy: &Proxy) -> bool {
    servers(push, proxy, &proxy.workload_labels(&push.services))
        .iter()
        .any(|gs| gs.server.tls.as_ref().map(|t| t.mode) == Some(TlsMode::AutoPassthrough))
}

/// Route configurations `names` for the router.
pub fn routes(push: &PushContext, proxy: &Proxy, names: &[impl AsRef<str>]) -> Vec<Named> {
    let servers = servers(push, proxy, &proxy.workload_labels(&push.services));
    names
        .iter()
        .map(|n| {
            let n = n.as_ref();
            Named::new(
                n.to_string(),
                pack_any(route_config(push, proxy, &servers, n)),
            )
        })
        .collect()
}

fn route_config(
    push: &PushContext,
    proxy: &Proxy,
    servers: &[GatewayServer],
    name: &str,
) -> RouteConfiguration {
    let plain_port = name
        .strip_prefix("http.")
        .and_then(|p| p.parse::<u16>().ok());
    let chosen: Vec<&GatewayServer> = servers
        .iter()
        .filter(|gs| match plain_port {
            Some(port) => gs.server.is_plain_http() && gs.listen_port() == port,
            None => gs.server.terminates_http() && gs.https_route_name() == name,
        })
        .collect();
    // host → index into virtual_hosts.
    let mut by_host: BTreeMap<String, usize> = BTreeMap::new();
    let mut virtual_hosts: Vec<VirtualHost> = Vec::new();
    for gs in chosen {
        add_server_hosts(push, proxy, gs, &mut by_host, &mut virtual_hosts);
    }
    if let Some(port) = plain_port {
        add_redirect_hosts(servers, port, &mut by_host, &mut virtual_hosts);
    }
    // Envoy refuses a domain twice: a `*` host (domain `*`) may sit with `*:*`.
    super::route::claim_domains(&mut virtual_hosts, |_| ());
    if virtual_hosts.is_empty() {
        virtual_hosts.push(VirtualHost {
            name: "blackhole:80".to_string(),
            domains: vec!["*".to_string()],
            routes: vec![not_found()],
            ..Default::default()
        });
    }
    super::route::route_configuration(name, virtual_hosts)
}

/// The virtual hosts of one server: the routes of each VirtualService bound to it, by host.
/// `by_host` (host → index into `virtual_hosts`) holds the hosts of earlier servers.
fn add_server_hosts(
    push: &PushContext,
    proxy: &Proxy,
    gs: &GatewayServer,
    by_host: &mut BTreeMap<String, usize>,
    virtual_hosts: &mut Vec<VirtualHost>,
) {
    let gateway = gs.gateway();
    let ctx = Ctx {
        push,
        port: gs.number(),
        proxy: Some(proxy),
        gateway: Some(&gateway),
    };
    let redirect = gs.server.tls.as_ref().is_some_and(|t| t.https_redirect);
    // Hosts this server adds (a host an earlier server already holds stays that server's).
    let mut mine: BTreeMap<String, usize> = BTreeMap::new();
    for (vs, hosts) in bound(push, gs) {
        let routes = http::routes(ctx, vs);
        if routes.is_empty() {
            continue;
        }
        for host in hosts {
            if let Some(&i) = mine.get(&host) {
                virtual_hosts[i].routes.extend(routes.iter().cloned());
                continue;
            }
            if by_host.contains_key(&host) {
                continue;
            }
            let i = virtual_hosts.len();
            virtual_hosts.push(VirtualHost {
                name: format!("{host}:{}", gs.number()),
                domains: vec![host.clone(), format!("{host}:*")],
                routes: routes.clone(),
                require_tls: if redirect {
                    virtual_host::TlsRequirementType::All as i32
                } else {
                    0
                },
                ..Default::default()
            });
            mine.insert(host, i);
        }
    }
    by_host.extend(mine);
}

/// A host of a server on plain HTTP `port` that redirects to HTTPS, with no VirtualService,
/// still redirects.
fn add_redirect_hosts(
    servers: &[GatewayServer],
    port: u16,
    by_host: &mut BTreeMap<String, usize>,
    virtual_hosts: &mut Vec<VirtualHost>,
) {
    for gs in servers.iter().filter(|gs| {
        gs.server.is_plain_http()
            && gs.listen_port() == port
            && gs.server.tls.as_ref().is_some_and(|t| t.https_redirect)
    }) {
        for host in gs
            .server
            .hosts
            .iter()
            .map(|h| split_host(h).1.to_ascii_lowercase())
        {
            if by_host.contains_key(&host) {
                continue;
            }
            by_host.insert(host.clone(), virtual_hosts.len());
            virtual_hosts.push(VirtualHost {
                name: format!("{host}:{}", gs.number()),
                domains: vec![host.clone(), format!("{host}:*")],
                routes: vec![not_found()],
                require_tls: virtual_host::TlsRequirementType::All as i32,
                ..Default::default()
            });
        }
    }
}

fn not_found() -> Route {
    Route {
        name: "404".to_string(),
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix("/".to_string())),
            ..Default::default()
        }),
        action: Some(route::Action::DirectResponse(DirectResponseAction {
            status: 404,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The SNI-named clusters AUTO_PASSTHROUGH routes to: `outbound_.PORT_.SUBSET_.HOST` for each
/// outbound cluster, the same endpoints, no TLS of the router's own (the client's passes
/// through).
pub fn sni_clusters(outbound: &[Named]) -> Vec<Named> {
    use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
    use prost::Message;
    outbound
        .iter()
        .filter_map(|n| {
            let parts: Vec<&str> = n.name.split('|').collect();
            let ["outbound", port, subset, host] = parts[..] else {
                return None;
            };
            let mut c = Cluster::decode(n.resource.value.as_slice()).ok()?;
            c.name = format!("outbound_.{port}_.{subset}_.{host}");
            c.transport_socket = None;
            c.transport_socket_matches.clear();
            c.typed_extension_protocol_options.clear();
            // EDS clusters take the outbound cluster's assignment; DNS and static clusters keep
            // their own endpoints.
            if c.cluster_discovery_type
                == Some(cluster::ClusterDiscoveryType::Type(
                    cluster::DiscoveryType::Eds as i32,
                ))
                && let Some(eds) = c.eds_cluster_config.as_mut()
            {
                eds.service_name = n.name.clone();
            }
            Some(Named::new(c.name.clone(), pack_any(c)))
        })
        .collect()
}

/// SDS over ADS for a router: `kubernetes://NAME` and `kubernetes://NAME-cacert` from the
/// Secrets of the router's own namespace (a gateway reads no other namespace's Secrets), and
/// only for a caller known to act for that namespace (`Proxy::reads_secrets`).
/// Names that are not ours, or name no such Secret, are left out (Envoy keeps waiting).
pub fn secrets(push: &PushContext, proxy: &Proxy, names: &[impl AsRef<str>]) -> Vec<Named> {
    if !proxy.is_router() {
        return Vec::new();
    }
    if !proxy.reads_secrets {
        tracing::warn!(
            proxy = %proxy.id,
            namespace = %proxy.namespace,
            "Secrets refused: the caller is not verified as acting for this namespace (connect over mTLS with a certificate of the namespace)"
        );
        return Vec::new();
    }
    let bytes = |b: &[u8]| DataSource {
        specifier: Some(data_source::Specifier::InlineBytes(b.to_vec())),
        ..Default::default()
    };
    let mut out = Vec::new();
    for n in names {
        let n = n.as_ref();
        // `kubernetes://NAME` of the router's namespace, or `kubernetes-gateway://NS/NAME`
        // where a ReferenceGrant permits it.
        let (ns, credential) = match n.strip_prefix(CREDENTIAL_PREFIX) {
            Some(c) => (proxy.namespace.as_str(), c.to_string()),
            None if n.starts_with(crate::gateway_conversion::GATEWAY_CREDENTIAL_PREFIX) => {
                let (base, suffix) = match n.strip_suffix(CACERT_SUFFIX) {
                    Some(b) => (b, CACERT_SUFFIX),
                    None => (n, ""),
                };
                match credential_secret(push, &proxy.namespace, base) {
                    Some((ns, name)) => (ns, format!("{name}{suffix}")),
                    None => {
                        tracing::warn!(
                            proxy = %proxy.id,
                            secret = n,
                            "Secret of another namespace refused: no ReferenceGrant there lets this namespace's Gateways read it"
                        );
                        continue;
                    }
                }
            }
            None => continue,
        };
        let kind = if let Some(base) = credential.strip_suffix(CACERT_SUFFIX) {
            credential_ca(push, ns, base).map(|ca| {
                secret::Type::ValidationContext(CertificateValidationContext {
                    trusted_ca: Some(bytes(ca)),
                    ..Default::default()
                })
            })
        } else {
            find_secret(push, ns, &credential).and_then(|s| {
                Some(secret::Type::TlsCertificate(TlsCertificate {
                    certificate_chain: Some(bytes(s.cert.as_ref()?)),
                    private_key: Some(bytes(s.key.as_ref()?)),
                    ..Default::default()
                }))
            })
        };
        match kind {
            Some(kind) => out.push(Named::new(
                n.to_string(),
                pack_any(Secret {
                    name: n.to_string(),
                    r#type: Some(kind),
                }),
            )),
            None => tracing::warn!(
                proxy = %proxy.id,
                secret = n,
                "no Secret in the gateway's namespace holds this credential"
            ),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::push_context::from_yaml as push;

    fn router(ns: &str, labels: &[(&str, &str)], reads_secrets: bool) -> Proxy {
        let mut p = Proxy::from_node_id(&format!("router~10.0.0.9~gw.{ns}~{ns}.svc.cluster.local"))
            .unwrap();
        p.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        p.reads_secrets = reads_secrets;
        p
    }

    #[test]
    fn gateways_select_routers_by_labels_and_scope() {
        let mut p = push(
            "kind: Gateway\nmetadata: {name: a, namespace: gw}\nspec: {selector: {istio: ingress}, servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]}\n---\nkind: Gateway\nmetadata: {name: b, namespace: other}\nspec: {servers: [{port: {number: 81, name: http, protocol: HTTP}, hosts: ['*']}]}\n",
        );
        let gw = router("gw", &[("istio", "ingress")], true);
        let names = |p: &PushContext, r: &Proxy| -> Vec<String> {
            servers(p, r, &r.workload_labels(&p.services))
                .iter()
                .map(|s| s.gateway())
                .collect()
        };
        // An empty selector selects every router.
        assert_eq!(names(&p, &gw), ["gw/a", "other/b"]);
        assert_eq!(names(&p, &router("gw", &[], true)), ["other/b"]);
        p.scope_gateway_to_namespace = true;
        assert_eq!(names(&p, &gw), ["gw/a"]);
        // Sidecars get no gateway listeners.
        let sidecar = Proxy::from_node_id("sidecar~10.0.0.8~s.gw~gw.svc.cluster.local").unwrap();
        assert!(!sidecar.is_router());
    }

    #[test]
    fn another_namespaces_secret_only_where_a_reference_grant_permits_it() {
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".to_string()])
            .unwrap()
            .cert
            .pem();
        let secret = format!(
            "kind: Secret\nmetadata: {{name: cert, namespace: web}}\nstringData: {{cacert: {ca:?}}}\n"
        );
        let grant = "---\napiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: web}\nspec: {from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: gw}], to: [{group: '', kind: Secret, name: cert}]}\n";
        let names = ["kubernetes-gateway://web/cert-cacert"];
        let without = push(&secret);
        assert_eq!(secrets(&without, &router("gw", &[], true), &names).len(), 0);
        let with = push(&format!("{secret}{grant}"));
        let got = secrets(&with, &router("gw", &[], true), &names);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].name, names[0]);
        // The grant is for the Gateways of `gw` only.
        assert_eq!(secrets(&with, &router("other", &[], true), &names).len(), 0);
        // A plain name is still the router's own namespace's.
        assert_eq!(
            secrets(
                &with,
                &router("gw", &[], true),
                &["kubernetes://cert-cacert"]
            )
            .len(),
            0
        );
    }

    #[test]
    fn secrets_only_to_a_verified_router_of_their_namespace() {
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".to_string()])
            .unwrap()
            .cert
            .pem();
        let p = push(&format!(
            "kind: Secret\nmetadata: {{name: cert, namespace: gw}}\nstringData: {{cacert: {ca:?}}}\n"
        ));
        let names = ["kubernetes://cert-cacert"];
        let got = |r: &Proxy| secrets(&p, r, &names).len();
        assert_eq!(got(&router("gw", &[], true)), 1);
        assert_eq!(got(&router("gw", &[], false)), 0, "unverified caller");
        assert_eq!(got(&router("other", &[], true)), 0, "another namespace");
        let sidecar = Proxy::from_node_id("sidecar~10.0.0.8~s.gw~gw.svc.cluster.local").unwrap();
        assert_eq!(secrets(&p, &sidecar, &names).len(), 0, "a sidecar");
    }
}
