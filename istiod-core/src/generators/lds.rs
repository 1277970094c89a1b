//! LDS: the sidecar's listeners as Istio lays them out.
//! - `virtualOutbound` on 15001 (`use_original_dst`) hands each captured connection to the
//!   listener of its original destination, else passes it through.
//! - Per service port, a non-binding outbound listener: `0.0.0.0_PORT` with RDS for HTTP ports,
//!   `VIP_PORT` with tcp_proxy for TCP ports.
//! - `virtualInbound` on 15006 restores the original destination and, per inbound port of the
//!   proxy's own workload, has a mutual-TLS chain (Istio ALPN, client certificate required) and,
//!   unless a PeerAuthentication says STRICT, a plaintext chain; plus a passthrough chain.

use std::collections::BTreeSet;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter,
};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::listener::http_inspector::v3::HttpInspector;
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    Rds, http_connection_manager,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::SetCurrentClientCertDetails;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy;
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_types::util::pack_any;

use super::authz::InboundFilters;
use super::blocks::{ads_config_source, socket_address};
use super::listener::{
    RouteFilters, chain, guarded, hcm, listener_filter, network_filter, tcp_proxy_filter,
    with_authz,
};
use super::route::route_to;
use super::tls;
use crate::config_store::MtlsMode;
use crate::model::{
    Protocol, Proxy, Service, ServicePort, inbound_cluster_name, outbound_cluster_name,
};
use crate::push_context::PushContext;
use crate::resource::{
    BLACKHOLE_CLUSTER, INBOUND_PASSTHROUGH_CLUSTER, Named, PASSTHROUGH_CLUSTER, VIRTUAL_INBOUND,
    VIRTUAL_INBOUND_PORT, VIRTUAL_OUTBOUND, VIRTUAL_OUTBOUND_PORT,
};

const WILDCARD: &str = "0.0.0.0";

fn hcm_filter(
    stat_prefix: String,
    routes: http_connection_manager::RouteSpecifier,
    filters: RouteFilters,
) -> Filter {
    network_filter(
        "envoy.filters.network.http_connection_manager",
        pack_any(hcm(stat_prefix, routes, filters)),
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

/// Application protocols Envoy's http_inspector reports for plaintext HTTP.
const SNIFFED_HTTP: [&str; 3] = ["http/1.0", "http/1.1", "h2c"];
/// ALPN a peer sidecar offers for HTTP over Istio mTLS (Istio's client ALPN for HTTP).
const MTLS_HTTP: [&str; 3] = ["istio-http/1.0", "istio-http/1.1", "istio-h2"];

/// An inline route configuration that sends every request to `cluster` through one virtual
/// host named `vhost` (inbound ports and sniffed outbound ports have no RDS of their own).
fn all_to(cluster: &str, vhost: String) -> http_connection_manager::RouteSpecifier {
    http_connection_manager::RouteSpecifier::RouteConfig(RouteConfiguration {
        name: cluster.to_string(),
        virtual_hosts: vec![VirtualHost {
            name: vhost,
            domains: vec!["*".to_string()],
            routes: vec![route_to(cluster.to_string())],
            ..Default::default()
        }],
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    })
}

/// What an inbound filter chain matches: the original destination port (any when `None`),
/// the transport and the application protocols (any when empty).
fn inbound_match(port: Option<u16>, transport: &str, protocols: &[&str]) -> FilterChainMatch {
    FilterChainMatch {
        destination_port: port.map(|p| UInt32Value {
            value: u32::from(p),
        }),
        transport_protocol: transport.to_string(),
        application_protocols: protocols.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// `LISTENER-blackhole`: a connection to the capture port itself (not redirected there) goes
/// nowhere, rather than looping through the listener, as in Istio.
fn blackhole_chain(listener: &str, port: u16) -> FilterChain {
    FilterChain {
        filter_chain_match: Some(FilterChainMatch {
            destination_port: Some(UInt32Value {
                value: u32::from(port),
            }),
            ..Default::default()
        }),
        ..chain(
            &format!("{listener}-blackhole"),
            vec![tcp_proxy_filter(BLACKHOLE_CLUSTER, BLACKHOLE_CLUSTER)],
        )
    }
}

fn outbound_listeners(
    push: &PushContext,
    visible: &dyn Fn(&Service, u16) -> bool,
    proxy: Option<&Proxy>,
    registry_only: bool,
) -> Vec<Listener> {
    let mut out = Vec::new();
    let mut http_ports = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let route_filters = RouteFilters::of(push);
    // TLS ports of services with no VIP: one wildcard listener per port, chains by SNI.
    let mut tls_wildcard: std::collections::BTreeMap<u16, Vec<&Service>> = Default::default();
    for svc in &push.services {
        // Its VIPs, or for a proxy that captures DNS its auto-allocated addresses.
        let addresses = svc.addresses_for(proxy);
        for port in svc.ports.iter().filter(|p| visible(svc, p.port)) {
            if port.protocol.is_http() {
                http_ports.insert(port.port);
                continue;
            }
            if port.protocol == Protocol::Tls && addresses.is_empty() {
                tls_wildcard.entry(port.port).or_default().push(svc);
                continue;
            }
            for vip in &addresses {
                let ip = vip.to_string();
                // Two services claiming the same VIP and port: the first (by hostname) wins, as
                // Envoy rejects a listener set with duplicate names.
                if !seen.insert((ip.clone(), port.port)) {
                    tracing::warn!(vip = %ip, port = port.port, host = %svc.hostname, "VIP:port already used by another service; skipped");
                    continue;
                }
                out.push(vip_listener(push, svc, port, *vip, route_filters, proxy));
            }
        }
    }
    for (port, services) in tls_wildcard {
        if http_ports.contains(&port) {
            tracing::warn!(
                port,
                "a TLS service without a VIP shares its port with HTTP services; not routed by SNI"
            );
            continue;
        }
        out.push(tls_wildcard_listener(push, port, services, proxy));
    }
    for port in http_ports {
        out.push(http_outbound_listener(port, route_filters, registry_only));
    }
    out
}

/// The listener `VIP_PORT` of a non-HTTP service port: tcp_proxy (a VirtualService's tcp route,
/// else the service's cluster); on a port of no declared protocol, HTTP sniffed first; on a
/// TLS port, chains by SNI.
fn vip_listener(
    push: &PushContext,
    svc: &Service,
    port: &ServicePort,
    vip: IpAddr,
    route_filters: RouteFilters,
    proxy: Option<&Proxy>,
) -> Listener {
    let ip = vip.to_string();
    let cluster = outbound_cluster_name(port.port, &svc.hostname);
    let name = format!("{ip}_{}", port.port);
    // A VirtualService's tcp route, else the service's own cluster.
    let tcp_filter = match super::route::tcp::tcp_route(push, svc, port.port, vip, proxy) {
        Some((spec, stat)) => network_filter(
            "envoy.filters.network.tcp_proxy",
            pack_any(super::route::tcp::tcp_proxy(spec, stat)),
        ),
        None => tcp_proxy_filter(&cluster, &cluster),
    };
    let tcp = chain(&cluster, vec![tcp_filter]);
    if port.protocol == Protocol::Unknown {
        // Sniffed: HTTP goes through an HTTP connection manager, anything else
        // through tcp_proxy.
        let http = FilterChain {
            filter_chain_match: Some(FilterChainMatch {
                application_protocols: SNIFFED_HTTP.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
            ..chain(
                &format!("{cluster}-http"),
                vec![hcm_filter(
                    format!("outbound_{name}"),
                    // Routes of its own, "HOST:PORT", so VirtualServices apply.
                    http_connection_manager::RouteSpecifier::Rds(Rds {
                        config_source: Some(ads_config_source()),
                        route_config_name: format!("{}:{}", svc.hostname, port.port),
                    }),
                    route_filters,
                )],
            )
        };
        Listener {
            listener_filters: vec![listener_filter(
                "envoy.filters.listener.http_inspector",
                pack_any(HttpInspector::default()),
            )],
            continue_on_listener_filters_timeout: true,
            ..listener(name, &ip, port.port, vec![http, tcp], false)
        }
    } else if port.protocol == Protocol::Tls {
        let routes = super::route::tcp::tls_routes(push, svc, port.port, Some(vip), proxy);
        sni_listener(
            name,
            &ip,
            port.port,
            sni_chains(&cluster, routes, Some(tcp)),
        )
    } else {
        listener(name, &ip, port.port, vec![tcp], false)
    }
}

/// The wildcard listener of a TLS port whose services have no VIP: each service's TLS routes,
/// then the service itself by its host name, chosen by SNI.
fn tls_wildcard_listener(
    push: &PushContext,
    port: u16,
    services: Vec<&Service>,
    proxy: Option<&Proxy>,
) -> Listener {
    let name = format!("{WILDCARD}_{port}");
    let mut chains: Vec<FilterChain> = Vec::new();
    let mut names_seen = BTreeSet::new();
    for svc in services {
        let cluster = outbound_cluster_name(port, &svc.hostname);
        let mut routes = super::route::tcp::tls_routes(push, svc, port, None, proxy);
        // The service itself, by its host name, after its routes.
        routes.push((
            vec![svc.hostname.clone()],
            tcp_proxy::ClusterSpecifier::Cluster(cluster.clone()),
            cluster.clone(),
        ));
        routes.retain(|(n, _, _)| names_seen.insert(n.clone()));
        chains.extend(sni_chains(&cluster, routes, None));
    }
    sni_listener(name, WILDCARD, port, chains)
}

/// The wildcard listener `0.0.0.0_PORT` of an HTTP port, as istiod lays it out: what Envoy's
/// http_inspector finds to be HTTP/1.1 or h2c goes to RDS route configuration `PORT`; anything
/// else (TLS, another protocol) to the default chain `PassthroughFilterChain`, out as it came
/// (`PassthroughCluster`), or nowhere under REGISTRY_ONLY (`BlackHoleCluster`).
fn http_outbound_listener(port: u16, route_filters: RouteFilters, registry_only: bool) -> Listener {
    let name = format!("{WILDCARD}_{port}");
    let rds = http_connection_manager::RouteSpecifier::Rds(Rds {
        config_source: Some(ads_config_source()),
        route_config_name: port.to_string(),
    });
    let http = FilterChain {
        filter_chain_match: Some(FilterChainMatch {
            transport_protocol: "raw_buffer".to_string(),
            application_protocols: vec!["http/1.1".to_string(), "h2c".to_string()],
            ..Default::default()
        }),
        ..chain(
            &name,
            vec![hcm_filter(format!("outbound_{name}"), rds, route_filters)],
        )
    };
    let fallback = if registry_only {
        BLACKHOLE_CLUSTER
    } else {
        PASSTHROUGH_CLUSTER
    };
    Listener {
        listener_filters: vec![listener_filter(
            "envoy.filters.listener.http_inspector",
            pack_any(HttpInspector::default()),
        )],
        continue_on_listener_filters_timeout: true,
        // As istiod (PROTOCOL_DETECTION_TIMEOUT 0s): the inspector waits for the client's
        // first bytes, so a server-first protocol on an HTTP port waits too (Istio's caveat).
        listener_filters_timeout: Some(super::blocks::seconds(0)),
        default_filter_chain: Some(chain(
            PASSTHROUGH_FILTER_CHAIN,
            vec![tcp_proxy_filter(fallback, fallback)],
        )),
        ..listener(name, WILDCARD, port, vec![http], false)
    }
}

/// The default chain of an outbound HTTP listener (istiod's name).
const PASSTHROUGH_FILTER_CHAIN: &str = "PassthroughFilterChain";

/// A TLS route: SNI names (empty: any), where to, stat prefix.
type SniRoute = (Vec<String>, tcp_proxy::ClusterSpecifier, String);

/// Filter chains matching TLS routes by SNI (an empty name list matches any), then `default`
/// unless a route already matches any.
fn sni_chains(
    cluster: &str,
    routes: Vec<SniRoute>,
    default: Option<FilterChain>,
) -> Vec<FilterChain> {
    let any = routes.iter().any(|(n, _, _)| n.is_empty());
    let mut chains: Vec<FilterChain> = routes
        .into_iter()
        .enumerate()
        .map(|(i, (names, spec, stat))| FilterChain {
            filter_chain_match: (!names.is_empty()).then(|| FilterChainMatch {
                server_names: names,
                ..Default::default()
            }),
            ..chain(
                &format!("{cluster}-sni-{i}"),
                vec![network_filter(
                    "envoy.filters.network.tcp_proxy",
                    pack_any(super::route::tcp::tcp_proxy(spec, stat)),
                )],
            )
        })
        .collect();
    if !any {
        chains.extend(default);
    }
    chains
}

/// A non-binding outbound listener that reads the TLS ClientHello (for SNI) first.
fn sni_listener(name: String, ip: &str, port: u16, chains: Vec<FilterChain>) -> Listener {
    Listener {
        listener_filters: vec![listener_filter(
            "envoy.filters.listener.tls_inspector",
            pack_any(TlsInspector::default()),
        )],
        ..listener(name, ip, port, chains, false)
    }
}

/// The capture listener; with REGISTRY_ONLY, unknown destinations go to the BlackHoleCluster.
fn virtual_outbound(registry_only: bool) -> Listener {
    let fallback = if registry_only {
        BLACKHOLE_CLUSTER
    } else {
        PASSTHROUGH_CLUSTER
    };
    Listener {
        use_original_dst: Some(BoolValue { value: true }),
        ..listener(
            VIRTUAL_OUTBOUND.to_string(),
            WILDCARD,
            VIRTUAL_OUTBOUND_PORT,
            vec![
                blackhole_chain(VIRTUAL_OUTBOUND, VIRTUAL_OUTBOUND_PORT),
                chain(
                    "virtualOutbound-catchall-tcp",
                    vec![tcp_proxy_filter(fallback, fallback)],
                ),
            ],
            true,
        )
    }
}

/// One inbound filter chain per accepted transport: mutual TLS, plaintext, or both under
/// PERMISSIVE, where mutual TLS is told from a client's own TLS by the Istio ALPN the peer
/// sidecar offers. Under STRICT any TLS is taken for mutual TLS, as istiod matches it (a client
/// without a mesh certificate fails the handshake).
fn inbound_chains(
    name: &str,
    port: Option<u16>,
    mode: MtlsMode,
    filters: &dyn Fn(bool) -> Vec<Filter>,
    alpn: &[&str],
) -> Vec<FilterChain> {
    let matching = |transport: &str, alpn: &[&str]| inbound_match(port, transport, alpn);
    let peer_alpn: &[&str] = match mode {
        MtlsMode::Strict => &[],
        _ => &tls::ALPN_INBOUND_MATCH,
    };
    let mtls = || FilterChain {
        filter_chain_match: Some(matching("tls", peer_alpn)),
        transport_socket: Some(tls::inbound_mtls_socket(alpn)),
        ..chain(name, filters(true))
    };
    let plain = |transport: &str| FilterChain {
        filter_chain_match: Some(matching(transport, &[])),
        ..chain(name, filters(false))
    };
    match mode {
        MtlsMode::Strict => vec![mtls()],
        MtlsMode::Disable => vec![plain("")],
        MtlsMode::Permissive | MtlsMode::Unset => vec![mtls(), plain("raw_buffer")],
    }
}

/// The inbound chains of a port with no declared protocol: by transport and by what the
/// connection turns out to carry (the ALPN a peer sidecar offers under mTLS, what Envoy's
/// http_inspector finds in plaintext), HTTP to an HTTP connection manager and anything else
/// to tcp_proxy.
fn sniffed_inbound_chains(
    name: &str,
    port: u16,
    mode: MtlsMode,
    cluster: &str,
    authz: &InboundFilters,
) -> Vec<FilterChain> {
    let matching =
        |transport: &str, protocols: &[&str]| inbound_match(Some(port), transport, protocols);
    let tcp = || guarded(authz, tcp_proxy_filter(cluster, cluster));
    let mtls = || {
        vec![
            FilterChain {
                filter_chain_match: Some(matching("tls", &MTLS_HTTP)),
                transport_socket: Some(tls::inbound_mtls_socket(&["h2", "http/1.1"])),
                ..chain(name, vec![inbound_hcm(port, cluster, true, authz)])
            },
            FilterChain {
                // Under STRICT, any TLS that is not HTTP (as istiod matches it).
                filter_chain_match: Some(matching(
                    "tls",
                    if mode == MtlsMode::Strict {
                        &[]
                    } else {
                        &tls::ALPN_ISTIO
                    },
                )),
                transport_socket: Some(tls::inbound_mtls_socket(&tls::ALPN_TCP_SERVER)),
                ..chain(name, tcp())
            },
        ]
    };
    let plain = |transport: &str| {
        vec![
            FilterChain {
                filter_chain_match: Some(matching(transport, &SNIFFED_HTTP)),
                ..chain(name, vec![inbound_hcm(port, cluster, false, authz)])
            },
            FilterChain {
                filter_chain_match: Some(matching(transport, &[])),
                ..chain(name, tcp())
            },
        ]
    };
    match mode {
        MtlsMode::Strict => mtls(),
        MtlsMode::Disable => plain(""),
        MtlsMode::Permissive | MtlsMode::Unset => {
            let mut all = mtls();
            all.extend(plain("raw_buffer"));
            all
        }
    }
}

fn inbound_hcm(port: u16, cluster: &str, mtls: bool, authz: &InboundFilters) -> Filter {
    let mut hcm = hcm(
        format!("inbound_{WILDCARD}_{port}"),
        all_to(cluster, format!("inbound|http|{port}")),
        RouteFilters::default(),
    );
    with_authz(&mut hcm, authz);
    // The app sees exactly the verified peer in x-forwarded-client-cert; a header the client
    // sent itself is dropped (Istio appends to it, so a client could prefix a forged entry).
    if mtls {
        hcm.forward_client_cert_details =
            http_connection_manager::ForwardClientCertDetails::SanitizeSet as i32;
        hcm.set_current_client_cert_details = Some(SetCurrentClientCertDetails {
            subject: Some(BoolValue { value: true }),
            uri: true,
            dns: true,
            ..Default::default()
        });
    } else {
        hcm.forward_client_cert_details =
            http_connection_manager::ForwardClientCertDetails::Sanitize as i32;
    }
    network_filter(
        "envoy.filters.network.http_connection_manager",
        pack_any(hcm),
    )
}

/// The inbound listener of `proxy`, whose workload carries `labels`.
fn virtual_inbound(
    push: &PushContext,
    proxy: &Proxy,
    labels: &std::collections::BTreeMap<String, String>,
) -> Listener {
    let ports = push.inbound_ports(proxy);
    let mtls = push.inbound_mtls(&proxy.namespace, labels);
    let authz = super::authz::inbound(push, proxy, labels);
    let mut chains = vec![blackhole_chain(VIRTUAL_INBOUND, VIRTUAL_INBOUND_PORT)];
    let mut sniffed = Vec::new();
    for (port, (protocol, _)) in ports {
        if protocol == Protocol::Unknown {
            sniffed.push(port);
        }
        chains.extend(inbound_port_chains(
            port,
            protocol,
            mtls.on_port(port),
            &authz,
        ));
    }
    chains.extend(catchall_chains(mtls.default, &authz));
    let mut listener_filters = vec![
        listener_filter(
            "envoy.filters.listener.original_dst",
            pack_any(OriginalDst::default()),
        ),
        listener_filter(
            "envoy.filters.listener.tls_inspector",
            pack_any(TlsInspector::default()),
        ),
    ];
    if !sniffed.is_empty() {
        listener_filters.push(http_inspector_on(&sniffed));
    }
    Listener {
        continue_on_listener_filters_timeout: !sniffed.is_empty(),
        listener_filters,
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

/// The chains of one inbound port: sniffed (no declared protocol), HTTP or TCP, each with
/// mutual TLS and, unless `mode` is STRICT, plaintext.
fn inbound_port_chains(
    port: u16,
    protocol: Protocol,
    mode: MtlsMode,
    authz: &InboundFilters,
) -> Vec<FilterChain> {
    let cluster = inbound_cluster_name(port);
    let name = format!("{WILDCARD}_{port}");
    if protocol == Protocol::Unknown {
        sniffed_inbound_chains(&name, port, mode, &cluster, authz)
    } else if protocol.is_http() {
        let filter = |m: bool| vec![inbound_hcm(port, &cluster, m, authz)];
        inbound_chains(&name, Some(port), mode, &filter, &["h2", "http/1.1"])
    } else {
        let filter = |_: bool| guarded(authz, tcp_proxy_filter(&cluster, &cluster));
        inbound_chains(&name, Some(port), mode, &filter, &tls::ALPN_TCP_SERVER)
    }
}

/// The chains of ports no service declares: passthrough, mutual TLS only under STRICT.
fn catchall_chains(default: MtlsMode, authz: &InboundFilters) -> Vec<FilterChain> {
    // Ports no service declares are authorized too: a policy has no unguarded way in.
    let tcp = || {
        guarded(
            authz,
            tcp_proxy_filter(INBOUND_PASSTHROUGH_CLUSTER, INBOUND_PASSTHROUGH_CLUSTER),
        )
    };
    // HTTP over mutual TLS (the ALPN a peer sidecar offers for HTTP), as istiod's
    // `virtualInbound-catchall-http`: an HTTP connection manager, with the HTTP authorization
    // filters, to the original destination.
    let mtls_http = || FilterChain {
        filter_chain_match: Some(inbound_match(None, "tls", &MTLS_HTTP)),
        transport_socket: Some(tls::inbound_mtls_socket(&["h2", "http/1.1"])),
        ..chain(
            VIRTUAL_INBOUND_CATCHALL_HTTP,
            vec![inbound_hcm(0, INBOUND_PASSTHROUGH_CLUSTER, true, authz)],
        )
    };
    let mtls_tcp = |alpn: &[&str]| FilterChain {
        filter_chain_match: Some(inbound_match(None, "tls", alpn)),
        transport_socket: Some(tls::inbound_mtls_socket(&tls::ALPN_TCP_SERVER)),
        ..chain(VIRTUAL_INBOUND, tcp())
    };
    match default {
        // Under STRICT, ports no service names also take mutual TLS only (any TLS that is not
        // HTTP is taken for mutual TLS, as istiod matches it).
        MtlsMode::Strict => vec![mtls_http(), mtls_tcp(&[])],
        MtlsMode::Disable => vec![chain(VIRTUAL_INBOUND, tcp())],
        // PERMISSIVE: mutual TLS from peer sidecars, anything else as it came.
        MtlsMode::Permissive | MtlsMode::Unset => vec![
            mtls_http(),
            mtls_tcp(&tls::ALPN_ISTIO),
            chain(VIRTUAL_INBOUND, tcp()),
        ],
    }
}

/// istiod's name of the catch-all chain for HTTP over mutual TLS.
const VIRTUAL_INBOUND_CATCHALL_HTTP: &str = "virtualInbound-catchall-http";

/// The HTTP inspector, on the `sniffed` ports only: it waits for the client's first bytes, so
/// a server-first protocol on a declared port is never held up.
fn http_inspector_on(sniffed: &[u16]) -> ListenerFilter {
    use envoy_types::pb::envoy::config::listener::v3::{
        ListenerFilterChainMatchPredicate as Predicate, listener_filter_chain_match_predicate,
    };
    use listener_filter_chain_match_predicate::{MatchSet, Rule};
    let on_port = |port: u16| Predicate {
        rule: Some(Rule::DestinationPortRange(
            envoy_types::pb::envoy::r#type::v3::Int32Range {
                start: i32::from(port),
                end: i32::from(port) + 1,
            },
        )),
    };
    // (A match set needs two rules or more.)
    let on_sniffed = match sniffed {
        [one] => on_port(*one),
        many => Predicate {
            rule: Some(Rule::OrMatch(MatchSet {
                rules: many.iter().map(|p| on_port(*p)).collect(),
            })),
        },
    };
    ListenerFilter {
        filter_disabled: Some(Predicate {
            rule: Some(Rule::NotMatch(Box::new(on_sniffed))),
        }),
        ..listener_filter(
            "envoy.filters.listener.http_inspector",
            pack_any(HttpInspector::default()),
        )
    }
}

/// All listeners for `proxy` (LDS is requested as a wildcard); a router's are its Gateways'.
pub fn generate(push: &PushContext, proxy: &Proxy) -> Vec<Named> {
    // Telemetry per side. The outbound listeners are shared by every proxy unless a
    // Telemetry of the proxy's own namespace could apply to it.
    let labels = proxy.workload_labels(&push.services);
    let own = push.telemetry(&proxy.namespace, &labels);
    let client = super::telemetry::Instruments::new(push, proxy, &own.client, true, false);
    let server = super::telemetry::Instruments::new(push, proxy, &own.server, false, false);
    // (A proxy's own tracing sampling makes its connection managers its own too.)
    let telemetry_shared =
        !push.telemetry_varies_in(&proxy.namespace) && proxy.tracing_sampling.is_none();
    let named = |mut l: Listener| {
        if l.name == VIRTUAL_INBOUND {
            server.apply(&mut l);
        } else {
            client.apply(&mut l);
        }
        Named::new(l.name.clone(), pack_any(l))
    };
    let scope = push.sidecar_scope(proxy);
    let mut out = match scope {
        // Routes that depend on the proxy, or addresses of its own (auto-allocated ones for a
        // proxy that captures DNS): its listeners are its own.
        None if push.routing.per_proxy
            || !telemetry_shared
            || (proxy.uses_auto_addresses()
                && push.services.iter().any(|s| !s.auto_addresses.is_empty())) =>
        {
            let mut own: Vec<Named> =
                outbound_listeners(push, &|_, _| true, Some(proxy), push.mesh_registry_only())
                    .into_iter()
                    .map(named)
                    .collect();
            own.push(named(virtual_outbound(push.mesh_registry_only())));
            own
        }
        None => push
            .cache
            .get(&push.cache.outbound_listeners, "outbound listeners", || {
                let mut shared: Vec<Named> =
                    outbound_listeners(push, &|_, _| true, None, push.mesh_registry_only())
                        .into_iter()
                        .map(named)
                        .collect();
                shared.push(named(virtual_outbound(push.mesh_registry_only())));
                shared
            })
            .clone(),
        // Under a Sidecar resource: only its egress hosts (generated for this proxy).
        Some(scope) => {
            let mut own: Vec<Named> = outbound_listeners(
                push,
                &|s, p| scope.sees_port(s, p),
                Some(proxy),
                scope.registry_only,
            )
            .into_iter()
            .map(named)
            .collect();
            own.push(named(virtual_outbound(scope.registry_only)));
            own
        }
    };
    out.push(named(virtual_inbound(push, proxy, &labels)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Protocol, Service, ServicePort};

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
            ..Default::default()
        };
        let push = PushContext {
            version: "1".into(),
            services: vec![svc("a.example"), svc("b.example")],
            ..Default::default()
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

    /// Istio's DNS auto-allocation: two address-less TCP ServiceEntries on one port get a
    /// listener each on their own addresses, for a proxy that captures DNS; another proxy gets
    /// neither.
    #[test]
    fn auto_allocated_addresses_are_listeners_for_dns_capturing_proxies() {
        let mut push = crate::push_context::from_yaml(
            "kind: ServiceEntry\nmetadata: {name: one, namespace: ns}\nspec:\n  hosts: [tcp-echo.external-1.svc.cluster.local]\n  ports: [{number: 9000, name: tcp, protocol: TCP}]\n  resolution: DNS\n---\nkind: ServiceEntry\nmetadata: {name: two, namespace: ns}\nspec:\n  hosts: [tcp-echo.external-2.svc.cluster.local]\n  ports: [{number: 9000, name: tcp, protocol: TCP}]\n  resolution: DNS\n",
        );
        crate::push_context::auto_ip::allocate(&mut push.services, None, Default::default(), true);
        let mut proxy = Proxy::from_node_id("sidecar~10.1.1.1~p.ns~ns.svc.cluster.local").unwrap();
        let names = |push: &PushContext, proxy: &Proxy| -> Vec<String> {
            generate(push, proxy)
                .into_iter()
                .map(|n| n.name)
                .filter(|n| n.ends_with("_9000"))
                .collect()
        };
        assert!(names(&push, &proxy).is_empty());
        proxy.metadata.insert("DNS_CAPTURE".into(), "true".into());
        assert_eq!(
            names(&push, &proxy),
            ["240.240.0.1_9000", "240.240.0.2_9000"]
        );
    }
}
