#![allow(clippy::unwrap_used)] // bench code
//! Cost of the xDS adaptation (`xds_adapt`) per LDS and CDS response of a 1000-service mesh, as
//! istiod writes them for a sidecar, against a typed decode of the same response in the same run.
//!   cargo bench -p pilot-agent --bench xds_adapt
//! Prints the median µs per response of each case (and ratios to the decode baseline).

mod common;

use common::median_us;
use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster, Filter as ClusterFilter, cluster::TransportSocketMatch,
};
use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, UpstreamTlsContext,
};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use envoy_types::pb::google::protobuf::{Any, Struct};
use pilot_agent::xds_adapt::TypedStruct;
use pilot_agent::xds_adapt::{self, Adapted};
use prost::Message;

const SERVICES: usize = 1000;

fn any(name: &str, value: Vec<u8>) -> Any {
    Any {
        type_url: format!("type.googleapis.com/{name}"),
        value,
    }
}

fn typed_struct(inner: &str) -> Any {
    any(
        "udpa.type.v1.TypedStruct",
        TypedStruct {
            type_url: format!("type.googleapis.com/{inner}"),
            value: Some(Struct::default()),
        }
        .encode_to_vec(),
    )
}

fn http(name: &str, config: Any) -> HttpFilter {
    HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(config)),
        ..Default::default()
    }
}

/// One outbound HTTP listener per service, as istiod 1.24+ writes it (`istio` = with the
/// Istio-only filters).
fn listener(i: usize, istio: bool) -> Listener {
    let mut filters = Vec::new();
    if istio {
        filters.push(http(
            "istio.metadata_exchange",
            typed_struct(xds_adapt::PEER_METADATA),
        ));
        filters.push(http(
            "istio.alpn",
            any(xds_adapt::ALPN_OVERRIDE, vec![0x0a, 0x02, 0x08, 0x01]),
        ));
    }
    filters.push(http(
        "envoy.filters.http.fault",
        any("envoy.extensions.filters.http.fault.v3.HTTPFault", vec![]),
    ));
    filters.push(http(
        "envoy.filters.http.cors",
        any("envoy.extensions.filters.http.cors.v3.Cors", vec![]),
    ));
    if istio {
        filters.push(http(
            "istio.stats",
            any(xds_adapt::ISTIO_STATS, vec![0x08, 0x01]),
        ));
    }
    filters.push(http(
        "envoy.filters.http.router",
        any("envoy.extensions.filters.http.router.v3.Router", vec![]),
    ));
    let route = format!("svc-{i}.ns.svc.cluster.local:8080");
    let hcm = HttpConnectionManager {
        stat_prefix: format!("outbound_10.1.{}.{}_8080", i / 256, i % 256),
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            route_config_name: route,
            ..Default::default()
        })),
        http_filters: filters,
        ..Default::default()
    };
    Listener {
        name: format!("10.1.{}.{}_8080", i / 256, i % 256),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(filter::ConfigType::TypedConfig(any(
                    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    hcm.encode_to_vec(),
                ))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn cluster(i: usize, istio: bool) -> Cluster {
    let mut alpn = vec!["istio".to_string()];
    if istio {
        alpn.insert(0, "istio-peer-exchange".into());
    }
    let tls = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            alpn_protocols: alpn,
            ..Default::default()
        }),
        sni: format!("outbound_.8080_._.svc-{i}.ns.svc.cluster.local"),
        ..Default::default()
    };
    Cluster {
        name: format!("outbound|8080||svc-{i}.ns.svc.cluster.local"),
        filters: if istio {
            vec![ClusterFilter {
                name: "istio.metadata_exchange".into(),
                typed_config: Some(typed_struct(xds_adapt::TCP_METADATA_EXCHANGE)),
                config_discovery: None,
            }]
        } else {
            Vec::new()
        },
        transport_socket_matches: vec![TransportSocketMatch {
            name: "tlsMode-istio".into(),
            transport_socket: Some(TransportSocket {
                name: "envoy.transport_sockets.tls".into(),
                config_type: Some(transport_socket::ConfigType::TypedConfig(any(
                    "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                    tls.encode_to_vec(),
                ))),
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn response(type_url: &str, resources: Vec<Any>) -> Vec<u8> {
    DiscoveryResponse {
        version_info: "v1".into(),
        resources,
        type_url: type_url.into(),
        nonce: "n1".into(),
        ..Default::default()
    }
    .encode_to_vec()
}

fn lds(istio: bool) -> Vec<u8> {
    response(
        xds_adapt::LISTENER_TYPE,
        (0..SERVICES)
            .map(|i| {
                any(
                    "envoy.config.listener.v3.Listener",
                    listener(i, istio).encode_to_vec(),
                )
            })
            .collect(),
    )
}

fn cds(istio: bool) -> Vec<u8> {
    response(
        xds_adapt::CLUSTER_TYPE,
        (0..SERVICES)
            .map(|i| {
                any(
                    "envoy.config.cluster.v3.Cluster",
                    cluster(i, istio).encode_to_vec(),
                )
            })
            .collect(),
    )
}

/// The typed decode baseline: the response, each resource, and each listener's HCM.
fn decode_listeners(msg: &[u8]) -> usize {
    let r = DiscoveryResponse::decode(msg).unwrap();
    let mut n = 0;
    for a in &r.resources {
        let l = Listener::decode(a.value.as_slice()).unwrap();
        for c in &l.filter_chains {
            for f in &c.filters {
                if let Some(filter::ConfigType::TypedConfig(t)) = &f.config_type {
                    n += HttpConnectionManager::decode(t.value.as_slice())
                        .unwrap()
                        .http_filters
                        .len();
                }
            }
        }
    }
    n
}

fn decode_clusters(msg: &[u8]) -> usize {
    let r = DiscoveryResponse::decode(msg).unwrap();
    r.resources
        .iter()
        .map(|a| Cluster::decode(a.value.as_slice()).unwrap().filters.len())
        .sum()
}

fn main() {
    for (kind, istio, plain, decode) in [
        (
            "LDS",
            lds(true),
            lds(false),
            decode_listeners as fn(&[u8]) -> usize,
        ),
        (
            "CDS",
            cds(true),
            cds(false),
            decode_clusters as fn(&[u8]) -> usize,
        ),
    ] {
        assert!(matches!(
            xds_adapt::adapt(false, &istio).unwrap(),
            Adapted::Changed(..)
        ));
        assert_eq!(xds_adapt::adapt(false, &plain).unwrap(), Adapted::Unchanged);
        let base = median_us(|| decode(&istio));
        let adapted = median_us(|| match xds_adapt::adapt(false, &istio).unwrap() {
            Adapted::Changed(b, _) => b.len(),
            _ => 0,
        });
        let passed = median_us(|| match xds_adapt::adapt(false, &plain).unwrap() {
            Adapted::Unchanged => 1,
            _ => 0,
        });
        println!(
            "{kind} of {SERVICES} services ({} KiB adapted-from, {} KiB pass-through): typed decode {base:.0} µs; adapted {adapted:.0} µs ({:.2}x decode); pass-through {passed:.0} µs ({:.3}x decode)",
            istio.len() / 1024,
            plain.len() / 1024,
            adapted / base,
            passed / base,
        );
    }
}
