//! DestinationRule traffic policy on outbound clusters, as istiod applies it
//! (`pilot/pkg/networking/core/cluster_traffic_policy.go`, `cluster_tls.go`,
//! `networking/util/util.go` MergeSubsetTrafficPolicy):
//! - precedence: a subset's port-level settings, else the subset's blocks, over the rule's
//!   port-level settings, else the rule's blocks; a matching port-level entry replaces all four
//!   blocks (loadBalancer, connectionPool, outlierDetection, tls), a subset block replaces the
//!   same block of the rule (never merged field by field);
//! - every cluster gets Istio's defaults: LEAST_REQUEST, connect timeout 10s, one circuit-breaker
//!   threshold with every limit at 2^32-1;
//! - consistent hashing is split: RING_HASH/MAGLEV on the cluster, the hash key on the routes
//!   that send to it (`hash_policy`).

use envoy_types::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection, UpstreamConnectionOptions, circuit_breakers,
    cluster,
};
use envoy_types::pb::envoy::config::core::v3::{
    HttpProtocolOptions as CommonHttpOptions, ProxyProtocolConfig, TcpKeepalive, TransportSocket,
    proxy_protocol_config, transport_socket,
};
use envoy_types::pb::envoy::config::route::v3::route_action::{HashPolicy, hash_policy};
use envoy_types::pb::envoy::extensions::transport_sockets::proxy_protocol::v3::ProxyProtocolUpstreamTransport;
use envoy_types::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;
use prost::Message;

use super::tls;
use crate::config_store::destination_rule::{
    ClientTls, ConnectionPool, LoadBalancer, OutlierDetection as DrOutlier, TlsMode, TrafficPolicy,
};
use crate::config_store::virtual_service::Destination;
use crate::model::Protocol;
use crate::push_context::{AppliedRule, PushContext};

pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// The four blocks (and proxyProtocol) in force for one cluster.
#[derive(Debug, Default, Clone, Copy)]
pub struct Effective<'a> {
    pub load_balancer: Option<&'a LoadBalancer>,
    pub connection_pool: Option<&'a ConnectionPool>,
    pub outlier_detection: Option<&'a DrOutlier>,
    pub tls: Option<&'a ClientTls>,
    pub proxy_protocol: Option<&'a crate::config_store::destination_rule::ProxyProtocol>,
}

/// A policy's blocks for `port`: its port-level entry for the port replaces all four (and
/// drops proxyProtocol), else the policy itself. The bool says a port-level entry matched.
fn for_port(p: &TrafficPolicy, port: u16) -> (Effective<'_>, bool) {
    match p
        .port_level_settings
        .iter()
        .find(|pl| pl.port.is_some_and(|s| s.number.0 == port))
    {
        Some(pl) => (
            Effective {
                load_balancer: pl.load_balancer.as_ref(),
                connection_pool: pl.connection_pool.as_ref(),
                outlier_detection: pl.outlier_detection.as_ref(),
                tls: pl.tls.as_ref(),
                proxy_protocol: None,
            },
            true,
        ),
        None => (
            Effective {
                load_balancer: p.load_balancer.as_ref(),
                connection_pool: p.connection_pool.as_ref(),
                outlier_detection: p.outlier_detection.as_ref(),
                tls: p.tls.as_ref(),
                proxy_protocol: p.proxy_protocol.as_ref(),
            },
            false,
        ),
    }
}

/// What applies to the cluster of `subset` (None: the service's own) on `port`.
pub fn effective<'a>(rule: &'a AppliedRule, subset: Option<&str>, port: u16) -> Effective<'a> {
    let base = rule
        .policy
        .as_ref()
        .map(|p| for_port(p, port).0)
        .unwrap_or_default();
    let Some(sp) = subset
        .and_then(|s| rule.subset(s))
        .and_then(|s| s.traffic_policy.as_ref())
    else {
        return base;
    };
    let (own, port_level) = for_port(sp, port);
    if port_level {
        return Effective {
            proxy_protocol: base.proxy_protocol,
            ..own
        };
    }
    Effective {
        load_balancer: own.load_balancer.or(base.load_balancer),
        connection_pool: own.connection_pool.or(base.connection_pool),
        outlier_detection: own.outlier_detection.or(base.outlier_detection),
        tls: own.tls.or(base.tls),
        proxy_protocol: own.proxy_protocol.or(base.proxy_protocol),
    }
}

/// The route-side half of consistent hashing for a destination: the hash key of its subset's
/// load balancer, else the rule's (port-level entries count only when the destination names
/// its port, as in Istio).
pub fn hash_policy(push: &PushContext, d: &Destination) -> Vec<HashPolicy> {
    let Some(rule) = push.destination_rules.get(&d.host) else {
        return Vec::new();
    };
    let explicit = d.port.map(|p| p.number.0);
    fn lb_of(p: &TrafficPolicy, explicit: Option<u16>) -> Option<&LoadBalancer> {
        match explicit {
            Some(port) => for_port(p, port).0.load_balancer,
            None => p.load_balancer.as_ref(),
        }
    }
    let subset_lb = d
        .subset
        .as_deref()
        .and_then(|s| rule.subset(s))
        .and_then(|s| s.traffic_policy.as_ref())
        .and_then(|p| lb_of(p, explicit));
    let lb = subset_lb.or_else(|| rule.policy.as_ref().and_then(|p| lb_of(p, explicit)));
    let Some(ch) = lb.and_then(|lb| lb.consistent_hash.as_ref()) else {
        return Vec::new();
    };
    let specifier = if let Some(h) = &ch.http_header_name {
        hash_policy::PolicySpecifier::Header(hash_policy::Header {
            header_name: h.to_ascii_lowercase(),
            ..Default::default()
        })
    } else if let Some(c) = &ch.http_cookie {
        hash_policy::PolicySpecifier::Cookie(hash_policy::Cookie {
            name: c.name.clone(),
            ttl: c.ttl.as_ref().map(|t| t.proto()),
            path: c.path.clone().unwrap_or_default(),
            ..Default::default()
        })
    } else if ch.use_source_ip == Some(true) {
        hash_policy::PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties {
            source_ip: true,
        })
    } else if let Some(q) = &ch.http_query_parameter_name {
        hash_policy::PolicySpecifier::QueryParameter(hash_policy::QueryParameter {
            name: q.clone(),
        })
    } else {
        return Vec::new();
    };
    vec![HashPolicy {
        policy_specifier: Some(specifier),
        terminal: false,
    }]
}

/// Istio's defaults for every outbound cluster, whether or not a rule applies (the 10 s connect
/// timeout every cluster gets from `cds::base`).
pub fn defaults(c: &mut Cluster) {
    c.lb_policy = cluster::LbPolicy::LeastRequest as i32;
    c.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![circuit_breakers::Thresholds {
            max_connections: Some(UInt32Value { value: u32::MAX }),
            max_pending_requests: Some(UInt32Value { value: u32::MAX }),
            max_requests: Some(UInt32Value { value: u32::MAX }),
            max_retries: Some(UInt32Value { value: u32::MAX }),
            ..Default::default()
        }],
        ..Default::default()
    });
}

/// Whether `c` speaks HTTP/2 upstream (its protocol options say so).
pub fn speaks_h2(c: &Cluster) -> bool {
    use http_protocol_options::explicit_http_config::ProtocolConfig;
    matches!(
        http_options(c).upstream_protocol_options,
        Some(
            http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(_)),
                }
            )
        )
    )
}

fn http_options(c: &Cluster) -> HttpProtocolOptions {
    c.typed_extension_protocol_options
        .get(HTTP_PROTOCOL_OPTIONS)
        .and_then(|a| HttpProtocolOptions::decode(a.value.as_slice()).ok())
        .unwrap_or_default()
}

fn set_http_options(c: &mut Cluster, mut o: HttpProtocolOptions) {
    if o.upstream_protocol_options.is_none() {
        o.upstream_protocol_options = Some(
            http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config: Some(
                        http_protocol_options::explicit_http_config::ProtocolConfig::HttpProtocolOptions(
                            Default::default(),
                        ),
                    ),
                },
            ),
        );
    }
    c.typed_extension_protocol_options
        .insert(HTTP_PROTOCOL_OPTIONS.to_string(), pack_any(o));
}

/// The cluster sends each connection where the app sent it (Istio's PASSTHROUGH load balancer
/// and ServiceEntry resolution NONE): ORIGINAL_DST, no endpoints of its own.
pub fn to_original_dst(c: &mut Cluster) {
    c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
        cluster::DiscoveryType::OriginalDst as i32,
    ));
    c.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
    c.eds_cluster_config = None;
    c.load_assignment = None;
}

fn load_balancer(c: &mut Cluster, lb: &LoadBalancer) {
    match lb.simple.as_deref() {
        Some("ROUND_ROBIN") => c.lb_policy = cluster::LbPolicy::RoundRobin as i32,
        Some("RANDOM") => c.lb_policy = cluster::LbPolicy::Random as i32,
        Some("PASSTHROUGH") => {
            to_original_dst(c);
            return;
        }
        _ => c.lb_policy = cluster::LbPolicy::LeastRequest as i32,
    }
    if let Some(w) = &lb.warmup_duration_secs {
        let slow_start = cluster::SlowStartConfig {
            slow_start_window: Some(w.proto()),
            ..Default::default()
        };
        if c.lb_policy == cluster::LbPolicy::RoundRobin as i32 {
            c.lb_config = Some(cluster::LbConfig::RoundRobinLbConfig(
                cluster::RoundRobinLbConfig {
                    slow_start_config: Some(slow_start),
                },
            ));
        } else if c.lb_policy == cluster::LbPolicy::LeastRequest as i32 {
            c.lb_config = Some(cluster::LbConfig::LeastRequestLbConfig(
                cluster::LeastRequestLbConfig {
                    slow_start_config: Some(slow_start),
                    ..Default::default()
                },
            ));
        }
    }
    if let Some(ch) = &lb.consistent_hash {
        if let Some(m) = &ch.maglev {
            c.lb_policy = cluster::LbPolicy::Maglev as i32;
            c.lb_config = m.table_size.filter(|t| *t > 0).map(|t| {
                cluster::LbConfig::MaglevLbConfig(cluster::MaglevLbConfig {
                    table_size: Some(envoy_types::pb::google::protobuf::UInt64Value { value: t }),
                })
            });
        } else {
            c.lb_policy = cluster::LbPolicy::RingHash as i32;
            let size = ch
                .ring_hash
                .as_ref()
                .and_then(|r| r.minimum_ring_size)
                .or(ch.minimum_ring_size)
                .filter(|s| *s > 0)
                .unwrap_or(1024);
            c.lb_config = Some(cluster::LbConfig::RingHashLbConfig(
                cluster::RingHashLbConfig {
                    minimum_ring_size: Some(envoy_types::pb::google::protobuf::UInt64Value {
                        value: size,
                    }),
                    ..Default::default()
                },
            ));
        }
    }
}

fn connection_pool(c: &mut Cluster, cp: &ConnectionPool, http_port: bool) {
    let positive = |v: Option<i32>| v.filter(|n| *n > 0).map(|n| n.unsigned_abs());
    if let Some(th) = c
        .circuit_breakers
        .as_mut()
        .and_then(|cb| cb.thresholds.first_mut())
    {
        if let Some(n) = positive(cp.tcp.as_ref().and_then(|t| t.max_connections)) {
            th.max_connections = Some(UInt32Value { value: n });
        }
        if let Some(h) = &cp.http {
            if let Some(n) = positive(h.http1_max_pending_requests) {
                th.max_pending_requests = Some(UInt32Value { value: n });
            }
            if let Some(n) = positive(h.http2_max_requests) {
                th.max_requests = Some(UInt32Value { value: n });
            }
            if let Some(n) = positive(h.max_retries) {
                th.max_retries = Some(UInt32Value { value: n });
            }
        }
    }
    if let Some(tcp) = &cp.tcp {
        if let Some(t) = &tcp.connect_timeout {
            c.connect_timeout = Some(t.proto());
        }
        if let Some(k) = &tcp.tcp_keepalive {
            c.upstream_connection_options = Some(UpstreamConnectionOptions {
                tcp_keepalive: Some(TcpKeepalive {
                    keepalive_probes: k
                        .probes
                        .filter(|p| *p > 0)
                        .map(|value| UInt32Value { value }),
                    keepalive_time: k.time.as_ref().map(|t| UInt32Value {
                        value: u32::try_from(t.value.as_secs()).unwrap_or(u32::MAX),
                    }),
                    keepalive_interval: k.interval.as_ref().map(|t| UInt32Value {
                        value: u32::try_from(t.value.as_secs()).unwrap_or(u32::MAX),
                    }),
                }),
                ..Default::default()
            });
        }
    }
    let http = cp.http.as_ref();
    let idle = http
        .and_then(|h| h.idle_timeout.as_ref())
        .or(cp.tcp.as_ref().and_then(|t| t.idle_timeout.as_ref()));
    let per_conn = positive(http.and_then(|h| h.max_requests_per_connection));
    let duration = cp
        .tcp
        .as_ref()
        .and_then(|t| t.max_connection_duration.as_ref());
    let upgrade = http.and_then(|h| h.h2_upgrade_policy.as_deref()) == Some("UPGRADE") && http_port;
    let streams = positive(http.and_then(|h| h.max_concurrent_streams));
    if idle.is_some() || per_conn.is_some() || duration.is_some() || upgrade || streams.is_some() {
        let mut o = http_options(c);
        let common = o
            .common_http_protocol_options
            .get_or_insert_with(CommonHttpOptions::default);
        if let Some(t) = idle {
            common.idle_timeout = Some(t.proto());
        }
        if let Some(n) = per_conn {
            common.max_requests_per_connection = Some(UInt32Value { value: n });
        }
        if let Some(t) = duration {
            common.max_connection_duration = Some(t.proto());
        }
        let h2 = matches!(
            o.upstream_protocol_options,
            Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config: Some(
                        http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(_)
                    )
                }
            ))
        );
        if upgrade || (h2 && streams.is_some()) {
            o.upstream_protocol_options = Some(
                http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    http_protocol_options::ExplicitHttpConfig {
                        protocol_config: Some(
                            http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                                envoy_types::pb::envoy::config::core::v3::Http2ProtocolOptions {
                                    max_concurrent_streams: streams.map(|value| UInt32Value { value }),
                                    ..Default::default()
                                },
                            ),
                        ),
                    },
                ),
            );
        }
        set_http_options(c, o);
    }
}

fn outlier_detection(c: &mut Cluster, od: &DrOutlier) {
    let mut out = OutlierDetection {
        enforcing_success_rate: Some(UInt32Value { value: 0 }),
        ..Default::default()
    };
    if let Some(n) = od.consecutive_5xx_errors {
        out.consecutive_5xx = Some(UInt32Value { value: n });
        out.enforcing_consecutive_5xx = Some(UInt32Value {
            value: if n > 0 { 100 } else { 0 },
        });
    }
    if let Some(n) = od.consecutive_gateway_errors {
        out.consecutive_gateway_failure = Some(UInt32Value { value: n });
        out.enforcing_consecutive_gateway_failure = Some(UInt32Value {
            value: if n > 0 { 100 } else { 0 },
        });
    }
    if od.split_external_local_origin_errors == Some(true) {
        out.split_external_local_origin_errors = true;
        out.enforcing_local_origin_success_rate = Some(UInt32Value { value: 0 });
        if let Some(n) = od.consecutive_local_origin_failures.filter(|n| *n > 0) {
            out.consecutive_local_origin_failure = Some(UInt32Value { value: n });
            out.enforcing_consecutive_local_origin_failure = Some(UInt32Value { value: 100 });
        }
    }
    out.interval = od.interval.as_ref().map(|t| t.proto());
    out.base_ejection_time = od.base_ejection_time.as_ref().map(|t| t.proto());
    if let Some(p) = od.max_ejection_percent.filter(|p| *p > 0) {
        out.max_ejection_percent = Some(UInt32Value {
            value: p.unsigned_abs(),
        });
    }
    c.outlier_detection = Some(out);
    let lb = c.common_lb_config.get_or_insert_with(Default::default);
    lb.healthy_panic_threshold = Some(envoy_types::pb::envoy::r#type::v3::Percent {
        value: f64::from(od.min_health_percent.unwrap_or(0)),
    });
}

/// What the caller knows of the cluster for TLS: its SNI, the service's identities (auto mTLS)
/// and whether the port is HTTP/2.
pub struct TlsInputs<'a> {
    pub istio_sni: String,
    pub sans: &'a [String],
    pub h2: bool,
}

/// TLS from the rule: DISABLE (plaintext, no auto mTLS), SIMPLE/MUTUAL (origination with
/// files through the agent's SDS), ISTIO_MUTUAL (Istio mTLS to every endpoint).
fn tls_policy(c: &mut Cluster, t: &ClientTls, inputs: &TlsInputs) {
    c.transport_socket_matches.clear();
    c.transport_socket = None;
    let h2_alpn: &[&str] = if inputs.h2 { &["h2"] } else { &[] };
    match t.mode() {
        TlsMode::Disable => {}
        TlsMode::IstioMutual => {
            let mut alpn: Vec<&str> = tls::ALPN_ISTIO.to_vec();
            alpn.extend_from_slice(h2_alpn);
            let sans: Vec<String> = if t.subject_alt_names.is_empty() {
                inputs.sans.to_vec()
            } else {
                t.subject_alt_names.clone()
            };
            c.transport_socket = Some(tls::istio_mutual_socket(
                t.sni.clone().unwrap_or_else(|| inputs.istio_sni.clone()),
                &sans,
                &alpn,
            ));
        }
        TlsMode::Simple | TlsMode::Mutual => {
            let client = match (t.mode(), &t.client_certificate, &t.private_key) {
                (TlsMode::Mutual, Some(cert), Some(key)) => Some((cert.as_str(), key.as_str())),
                _ => None,
            };
            let sni = t.sni.as_deref().unwrap_or("");
            c.transport_socket = Some(tls::originated_socket(&tls::OriginatedTls {
                sni,
                sans: &t.subject_alt_names,
                ca: t.ca_certificates.as_deref(),
                client,
                insecure_skip_verify: t.insecure_skip_verify == Some(true),
                alpn: h2_alpn,
            }));
            // No SNI named: send the request's host, and check the server against it.
            if sni.is_empty() {
                let mut o = http_options(c);
                let upstream = o
                    .upstream_http_protocol_options
                    .get_or_insert_with(Default::default);
                upstream.auto_sni = true;
                upstream.auto_san_validation =
                    t.subject_alt_names.is_empty() && t.insecure_skip_verify != Some(true);
                set_http_options(c, o);
            }
        }
    }
}

fn proxy_protocol(c: &mut Cluster, version: &str) {
    let wrap = |inner: Option<TransportSocket>| TransportSocket {
        name: "envoy.transport_sockets.upstream_proxy_protocol".to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(
            ProxyProtocolUpstreamTransport {
                config: Some(ProxyProtocolConfig {
                    version: if version == "V2" {
                        proxy_protocol_config::Version::V2
                    } else {
                        proxy_protocol_config::Version::V1
                    } as i32,
                    ..Default::default()
                }),
                transport_socket: Some(inner.unwrap_or_else(|| TransportSocket {
                    name: "raw_buffer".to_string(),
                    config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(
                        RawBuffer::default(),
                    ))),
                })),
                ..Default::default()
            },
        ))),
    };
    if c.transport_socket_matches.is_empty() {
        c.transport_socket = Some(wrap(c.transport_socket.take()));
    } else {
        for m in &mut c.transport_socket_matches {
            m.transport_socket = Some(wrap(m.transport_socket.take()));
        }
    }
}

/// Applies `eff` to a cluster already carrying Istio's defaults and auto mTLS; an explicit
/// `tls` replaces auto mTLS (DISABLE included), as in Istio.
pub fn apply(c: &mut Cluster, eff: &Effective, protocol: Protocol, tls_inputs: &TlsInputs) {
    if let Some(cp) = eff.connection_pool {
        connection_pool(c, cp, protocol.is_http());
    }
    if let Some(od) = eff.outlier_detection {
        outlier_detection(c, od);
    }
    if let Some(lb) = eff.load_balancer {
        load_balancer(c, lb);
    }
    if let Some(t) = eff.tls {
        tls_policy(c, t, tls_inputs);
    }
    if let Some(v) = eff.proxy_protocol.and_then(|p| p.version.as_deref()) {
        proxy_protocol(c, v);
    }
}

/// `metadata.filter_metadata.istio`: the rule's `config` and, for a subset cluster, `subset`.
pub fn metadata(
    rule: &AppliedRule,
    subset: Option<&str>,
) -> envoy_types::pb::envoy::config::core::v3::Metadata {
    use envoy_types::pb::google::protobuf::{Value, value};
    let mut m = super::blocks::istio_metadata(&rule.config);
    if let (Some(s), Some(istio)) = (subset, m.filter_metadata.get_mut("istio")) {
        istio.fields.insert(
            "subset".to_string(),
            Value {
                kind: Some(value::Kind::StringValue(s.to_string())),
            },
        );
    }
    m
}
