//! CDS: one EDS cluster per service port (`outbound|PORT||HOST`), one ORIGINAL_DST cluster per
//! inbound port of the proxy's own workload (`inbound|PORT||`), and Istio's fixed clusters
//! (PassthroughCluster, BlackHoleCluster, InboundPassthroughCluster).

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{BindConfig, Http2ProtocolOptions, SocketAddress};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
use envoy_types::util::pack_any;

use super::blocks::{ads_config_source, seconds};
use super::cluster_policy::{self, HTTP_PROTOCOL_OPTIONS};
use super::locality;
use super::tls;
use crate::config_store::IngressEndpoint;
use crate::model::{
    Protocol, Proxy, Resolution, Service, inbound_cluster_name, outbound_cluster_name,
    port_clusters,
};
use crate::push_context::PushContext;
use crate::resource::{
    BLACKHOLE_CLUSTER, INBOUND_PASSTHROUGH_BIND_V4, INBOUND_PASSTHROUGH_CLUSTER, Named,
    PASSTHROUGH_CLUSTER,
};

const CONNECT_TIMEOUT_SECS: i64 = 10;

/// Sets what the proxy module reads of a cluster (`mesh_common::module::cluster`) to one
/// `key`: `value`. One key, so the cluster encodes the same every time.
fn with_module_metadata(c: &mut Cluster, key: &str, value: String) {
    use envoy_types::pb::google::protobuf::{Struct, Value, value};
    let value = Value {
        kind: Some(value::Kind::StringValue(value)),
    };
    c.metadata
        .get_or_insert_with(Default::default)
        .filter_metadata
        .insert(
            mesh_common::module::cluster::NAMESPACE.to_string(),
            Struct {
                fields: [(key.to_string(), value)].into_iter().collect(),
            },
        );
}

/// An inbound cluster's service for the module, as Istio's `istio.services` names it. (Outbound
/// clusters are named `outbound|PORT|SUBSET|HOST`, which tells the module the service, and carry
/// the ALPN of their protocol in their TLS context.)
fn with_module_service(c: &mut Cluster, svc: &Service) {
    use mesh_common::module::cluster as m;
    let (name, _) = m::name_of(&svc.hostname);
    with_module_metadata(
        c,
        m::SERVICE,
        m::service(&svc.hostname, name, &svc.namespace),
    );
}

fn base(name: String, kind: cluster::DiscoveryType) -> Cluster {
    Cluster {
        name,
        connect_timeout: Some(seconds(CONNECT_TIMEOUT_SECS)),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(kind as i32)),
        ..Default::default()
    }
}

/// Connections leave from `ip` (any port).
fn bind_to(ip: &str) -> BindConfig {
    BindConfig {
        source_address: Some(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(0)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn original_dst(name: String, bind: Option<&str>) -> Cluster {
    Cluster {
        lb_policy: cluster::LbPolicy::ClusterProvided as i32,
        upstream_bind_config: bind.map(bind_to),
        ..base(name, cluster::DiscoveryType::OriginalDst)
    }
}

fn with_http2(mut c: Cluster) -> Cluster {
    let options = HttpProtocolOptions {
        upstream_protocol_options: Some(
            http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config: Some(
                        http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                            Http2ProtocolOptions::default(),
                        ),
                    ),
                },
            ),
        ),
        ..Default::default()
    };
    c.typed_extension_protocol_options
        .insert(HTTP_PROTOCOL_OPTIONS.to_string(), pack_any(options));
    c
}

/// All clusters for `proxy` (CDS is requested as a wildcard): the snapshot's outbound clusters
/// (built once, shared by every proxy) and the proxy's own inbound and fixed clusters.
/// A proxy under a Sidecar resource sees only its egress hosts (generated for it, uncached).
pub fn generate(push: &PushContext, proxy: &Proxy) -> Vec<Named> {
    let shared = || {
        push.cache
            .get(&push.cache.outbound_clusters, "outbound clusters", || {
                outbound(push, &|_, _| true)
            })
            .clone()
    };
    // A router: every service's clusters (and the SNI-named ones AUTO_PASSTHROUGH routes to).
    if proxy.is_router() {
        let mut out = shared();
        if super::gateway::auto_passthrough(push, proxy) {
            let sni = super::gateway::sni_clusters(&out);
            out.extend(sni);
        }
        out.extend(named(vec![base(
            BLACKHOLE_CLUSTER.to_string(),
            cluster::DiscoveryType::Static,
        )]));
        return out;
    }
    let mut out = match push.sidecar_scope(proxy) {
        None => shared(),
        Some(scope) => outbound(push, &|s, p| scope.sees_port(s, p)),
    };
    out.extend(own(push, proxy));
    out
}

fn named(clusters: Vec<Cluster>) -> Vec<Named> {
    clusters
        .into_iter()
        .map(|c| Named::new(c.name.clone(), pack_any(c)))
        .collect()
}

fn outbound(push: &PushContext, visible: &dyn Fn(&Service, u16) -> bool) -> Vec<Named> {
    let mut clusters = Vec::new();
    for svc in &push.services {
        for port in svc.ports.iter().filter(|p| visible(svc, p.port)) {
            let mut c = base(
                outbound_cluster_name(port.port, &svc.hostname),
                cluster::DiscoveryType::Eds,
            );
            cluster_policy::defaults(&mut c);
            c.eds_cluster_config = Some(cluster::EdsClusterConfig {
                eds_config: Some(ads_config_source()),
                service_name: String::new(),
            });
            if matches!(port.protocol, Protocol::Http2 | Protocol::Grpc) {
                c = with_http2(c);
            }
            let sans: BTreeSet<String> = svc
                .endpoints
                .iter()
                // Outside the mesh: no auto mTLS (Istio's MESH_EXTERNAL).
                .filter(|ep| !svc.mesh_external && push.endpoint_mtls(svc, ep, port))
                .map(|ep| {
                    crate::model::spiffe_id(&push.trust_domain, &svc.namespace, &ep.service_account)
                })
                .collect();
            let sans: Vec<String> = sans.into_iter().collect();
            let with_mtls = |mut c: Cluster, subset: &str| {
                if !sans.is_empty() {
                    c.transport_socket_matches = tls::auto_mtls_matches(
                        format!("outbound_.{}_.{subset}_.{}", port.port, svc.hostname),
                        &sans,
                    );
                }
                c
            };
            // The service's cluster, and one per DestinationRule subset,
            // `outbound|PORT|SUBSET|HOST`, whose endpoints EDS narrows to the subset's labels.
            let subsets = push
                .subsets
                .get(&svc.hostname)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let rule = push.destination_rules.get(&svc.hostname);
            for (subset, name) in port_clusters(port.port, &svc.hostname, subsets) {
                let sni_subset = subset.map_or("", |i| subsets[i].name.as_str());
                let mut cluster = with_mtls(Cluster { name, ..c.clone() }, sni_subset);
                if !resolve(&mut cluster, svc, port, subset.map(|i| &subsets[i])) {
                    // A DNS cluster with no name to resolve (its subset matches none): Istio
                    // leaves it out.
                    continue;
                }
                let subset_name = subset.map(|i| subsets[i].name.as_str());
                // The rule's policy for this port and subset (none without a rule).
                let eff = rule
                    .map(|r| cluster_policy::effective(r, subset_name, port.port))
                    .unwrap_or_default();
                if let Some(rule) = rule {
                    cluster_policy::apply(
                        &mut cluster,
                        &eff,
                        port.protocol,
                        &cluster_policy::TlsInputs {
                            istio_sni: format!(
                                "outbound_.{}_.{sni_subset}_.{}",
                                port.port, svc.hostname
                            ),
                            sans: &sans,
                            h2: matches!(port.protocol, Protocol::Http2 | Protocol::Grpc),
                        },
                    );
                    cluster.metadata = Some(cluster_policy::metadata(rule, subset_name));
                }
                // The ALPN Istio's `istio.alpn` would give its requests, fixed per cluster. A
                // port of no declared protocol carries HTTP and TCP through one cluster: its
                // list offers the TCP exchange, and the module's `istio.alpn` in the sniffed
                // HTTP chain names HTTP requests' own (`istio-http/1.1`, `istio-h2`) as they go,
                // told by this metadata to follow the downstream's protocol.
                let alpn =
                    tls::istio_alpn(port.protocol.is_http(), cluster_policy::speaks_h2(&cluster));
                tls::set_istio_alpn(&mut cluster, alpn);
                if port.protocol == Protocol::Unknown {
                    with_module_metadata(
                        &mut cluster,
                        mesh_common::module::cluster::UPSTREAM_PROTOCOL,
                        "downstream".to_string(),
                    );
                }
                if locality::plan_for(push, &eff).is_some_and(|p| p.weighted()) {
                    use envoy_types::pb::envoy::config::cluster::v3::cluster::common_lb_config;
                    cluster
                        .common_lb_config
                        .get_or_insert_with(Default::default)
                        .locality_config_specifier = Some(
                        common_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(
                            Default::default(),
                        ),
                    );
                }
                clusters.push(cluster);
            }
        }
    }
    named(clusters)
}

/// The cluster type of `svc`'s resolution (Istio's convertResolution): EDS for STATIC,
/// STRICT_DNS / LOGICAL_DNS with the names to resolve for DNS / DNS_ROUND_ROBIN, ORIGINAL_DST
/// for NONE. False when a DNS cluster has nothing to resolve.
fn resolve(
    c: &mut Cluster,
    svc: &Service,
    port: &crate::model::ServicePort,
    subset: Option<&crate::model::Subset>,
) -> bool {
    use envoy_types::pb::envoy::config::endpoint::v3::{
        ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
    };
    let kind = match svc.resolution {
        Resolution::Static => return true,
        Resolution::Passthrough => {
            cluster_policy::to_original_dst(c);
            return true;
        }
        Resolution::Dns => cluster::DiscoveryType::StrictDns,
        Resolution::DnsRoundRobin => cluster::DiscoveryType::LogicalDns,
    };
    let lb_endpoints: Vec<LbEndpoint> = svc
        .dns_targets
        .iter()
        .filter(|t| subset.is_none_or(|s| crate::registry::selects(&s.labels, &t.labels)))
        .map(|t| LbEndpoint {
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                address: Some(super::blocks::socket_address(
                    &t.host,
                    t.ports.get(&port.name).copied().unwrap_or(port.port),
                )),
                ..Default::default()
            })),
            ..Default::default()
        })
        .collect();
    if lb_endpoints.is_empty() {
        return false;
    }
    c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(kind as i32));
    c.eds_cluster_config = None;
    c.dns_lookup_family = cluster::DnsLookupFamily::V4Only as i32;
    // Istio's fields (Envoy 1.40 still takes them; the DnsCluster extension replaces them).
    #[allow(deprecated)]
    {
        c.respect_dns_ttl = true;
        c.dns_refresh_rate = Some(seconds(60));
    }
    c.load_assignment = Some(ClusterLoadAssignment {
        cluster_name: c.name.clone(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints,
            ..Default::default()
        }],
        ..Default::default()
    });
    true
}

/// A Sidecar ingress listener's cluster: a static one to its defaultEndpoint.
fn ingress_endpoint(name: String, proxy: &Proxy, to: &IngressEndpoint) -> Cluster {
    use envoy_types::pb::envoy::config::core::v3::{Address, Pipe, address};
    use envoy_types::pb::envoy::config::endpoint::v3::{
        ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
    };
    let (target, bind) = match to {
        IngressEndpoint::Address(a) => (
            super::blocks::socket_address(&a.ip().to_string(), a.port()),
            Some(INBOUND_PASSTHROUGH_BIND_V4),
        ),
        IngressEndpoint::Workload(port) => (
            super::blocks::socket_address(
                &proxy
                    .ip_addresses
                    .first()
                    .map_or("127.0.0.1".to_string(), ToString::to_string),
                *port,
            ),
            Some(INBOUND_PASSTHROUGH_BIND_V4),
        ),
        IngressEndpoint::Unix(path) => (
            Address {
                address: Some(address::Address::Pipe(Pipe {
                    path: path.clone(),
                    mode: 0,
                })),
            },
            None,
        ),
    };
    Cluster {
        upstream_bind_config: bind.map(bind_to),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.clone(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(target),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..base(name, cluster::DiscoveryType::Static)
    }
}

fn own(push: &PushContext, proxy: &Proxy) -> Vec<Named> {
    let mut clusters = Vec::new();
    for (port, (_, endpoint)) in push.inbound_ports(proxy) {
        let name = inbound_cluster_name(port);
        let mut c = match endpoint {
            Some(to) => ingress_endpoint(name, proxy, &to),
            None => original_dst(name, Some(INBOUND_PASSTHROUGH_BIND_V4)),
        };
        // The service the port serves (the first of the proxy's that maps a port to it).
        if let Some(svc) = push.services.iter().find(|s| {
            s.endpoints
                .iter()
                .any(|e| proxy.owns(e) && s.ports.iter().any(|p| e.target_port(p) == port))
        }) {
            with_module_service(&mut c, svc);
        }
        clusters.push(c);
    }
    clusters.push(original_dst(PASSTHROUGH_CLUSTER.to_string(), None));
    clusters.push(original_dst(
        INBOUND_PASSTHROUGH_CLUSTER.to_string(),
        Some(INBOUND_PASSTHROUGH_BIND_V4),
    ));
    clusters.push(base(
        BLACKHOLE_CLUSTER.to_string(),
        cluster::DiscoveryType::Static,
    ));
    named(clusters)
}
