use super::map::tests::typed_struct as typed_struct_of;
use super::*;
use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster, Filter as ClusterFilter, cluster::TransportSocketMatch,
};
use envoy_types::pb::envoy::config::core::v3::{
    ExtensionConfigSource, Metadata, TransportSocket, TypedExtensionConfig, transport_socket,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::extensions::filters::http::dynamic_modules::v3::DynamicModuleFilter;
use envoy_types::pb::envoy::extensions::filters::network::dynamic_modules::v3::DynamicModuleNetworkFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_filter,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, UpstreamTlsContext,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::{Any, ListValue, StringValue, Struct, Value, value};
use mesh_common::module::filter as module_filter;
use mesh_common::module::{Alpn, AlpnOverride, PEER_EXCHANGE_ALPN, PeerMetadata, Stats};
use mesh_common::telemetry::module_filters::{HTTP_TYPE, http_config, network_config};

fn any(type_name: &str, value: Vec<u8>) -> Any {
    Any {
        type_url: format!("type.googleapis.com/{type_name}"),
        value,
    }
}

fn typed_struct(outer: &str, inner: &str) -> Any {
    any(
        outer,
        TypedStruct {
            type_url: format!("type.googleapis.com/{inner}"),
            value: Some(Struct::default()),
        }
        .encode_to_vec(),
    )
}

/// A TypedStruct's Struct as the module is given it: a `google.protobuf.Struct` Any.
fn struct_of(typed: &Any) -> Any {
    let ts = TypedStruct::decode(typed.value.as_slice()).unwrap();
    any(
        "google.protobuf.Struct",
        ts.value.unwrap_or_default().encode_to_vec(),
    )
}

/// A TypedStruct of `inner` holding `config`, as an Any.
fn typed_json(inner: &str, config: serde_json::Value) -> Any {
    Any::decode(typed_struct_of(inner, config).as_slice()).unwrap()
}

fn http_filter(name: &str, config: Any) -> HttpFilter {
    HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(config)),
        ..Default::default()
    }
}

fn network_filter(name: &str, config: Any) -> Filter {
    Filter {
        name: name.into(),
        config_type: Some(filter::ConfigType::TypedConfig(config)),
    }
}

const ROUTER: &str = "envoy.extensions.filters.http.router.v3.Router";
const RBAC: &str = "envoy.extensions.filters.http.rbac.v3.RBAC";

fn hcm(filters: Vec<HttpFilter>) -> Filter {
    network_filter(
        "envoy.filters.network.http_connection_manager",
        any(
            HCM,
            HttpConnectionManager {
                stat_prefix: "inbound_0.0.0.0_8080".into(),
                http_filters: filters,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    )
}

fn tcp_proxy() -> Filter {
    network_filter("envoy.filters.network.tcp_proxy", any(TCP_PROXY, vec![]))
}

fn tls_socket(kind: &str, alpn: &[&str]) -> TransportSocket {
    let common = Some(CommonTlsContext {
        alpn_protocols: alpn.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    });
    let value = if kind.ends_with("DownstreamTlsContext") {
        DownstreamTlsContext {
            common_tls_context: common,
            ..Default::default()
        }
        .encode_to_vec()
    } else {
        UpstreamTlsContext {
            common_tls_context: common,
            sni: "outbound_.8080_._.a.ns.svc.cluster.local".into(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any(kind, value))),
    }
}

const DOWNSTREAM_TLS: &str = "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
const UPSTREAM_TLS: &str = "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// The module's JSON config of `config`, as a StringValue.
fn json(config: &impl serde::Serialize) -> Any {
    json_config(config)
}

fn stats_for(side: &str) -> Any {
    json(&Stats {
        side: Some(side.into()),
        ..Stats::default()
    })
}

/// A sidecar inbound listener as istiod 1.24+ writes it (prometheus telemetry on), with an
/// `istio.alpn` of one empty override (EnvoyFilter-shaped) and a TypedStruct-wrapped stats.
fn istio_inbound_listener() -> Listener {
    let http_chain = FilterChain {
        name: "0.0.0.0_8080".into(),
        filters: vec![hcm(vec![
            http_filter(
                "istio.metadata_exchange",
                typed_struct("udpa.type.v1.TypedStruct", PEER_METADATA),
            ),
            http_filter("envoy.filters.http.rbac", any(RBAC, vec![])),
            http_filter("istio.alpn", any(ALPN_OVERRIDE, vec![0x0a, 0x00])),
            http_filter("istio.stats", any(ISTIO_STATS, vec![])),
            http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
        ])],
        transport_socket: Some(tls_socket(
            DOWNSTREAM_TLS,
            &[PEER_EXCHANGE_ALPN, "h2", "http/1.1"],
        )),
        ..Default::default()
    };
    let tcp_chain = FilterChain {
        name: "0.0.0.0_9000".into(),
        filters: vec![
            network_filter(
                "istio.metadata_exchange",
                typed_struct("udpa.type.v1.TypedStruct", TCP_METADATA_EXCHANGE),
            ),
            network_filter("istio.stats", any(ISTIO_STATS, vec![])),
            tcp_proxy(),
        ],
        ..Default::default()
    };
    Listener {
        name: "virtualInbound".into(),
        filter_chains: vec![http_chain, tcp_chain],
        default_filter_chain: Some(FilterChain {
            filters: vec![
                network_filter(
                    "istio.stats",
                    typed_struct("xds.type.v3.TypedStruct", ISTIO_STATS),
                ),
                tcp_proxy(),
            ],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The same listener as Envoy should get it: each Istio filter the module's, same name, same
/// place, reporting as `destination` (the listener is Istio's inbound one); TLS as it was.
fn adapted_inbound_listener() -> Listener {
    let mut l = istio_inbound_listener();
    l.filter_chains[0].filters = vec![hcm(vec![
        http_filter(
            "istio.metadata_exchange",
            http_config(
                module_filter::METADATA_EXCHANGE,
                struct_of(&typed_struct("udpa.type.v1.TypedStruct", PEER_METADATA)),
            ),
        ),
        http_filter("envoy.filters.http.rbac", any(RBAC, vec![])),
        http_filter(
            "istio.alpn",
            http_config(
                module_filter::ALPN,
                json(&Alpn {
                    alpn_override: vec![AlpnOverride::default()],
                }),
            ),
        ),
        http_filter(
            "istio.stats",
            http_config(module_filter::STATS, stats_for("destination")),
        ),
        http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
    ])];
    l.filter_chains[1].filters[0] = network_filter(
        "istio.metadata_exchange",
        network_config(
            module_filter::METADATA_EXCHANGE,
            struct_of(&typed_struct(
                "udpa.type.v1.TypedStruct",
                TCP_METADATA_EXCHANGE,
            )),
        ),
    );
    let stats = network_filter(
        "istio.stats",
        network_config(module_filter::STATS, stats_for("destination")),
    );
    l.filter_chains[1].filters[1] = stats.clone();
    if let Some(d) = &mut l.default_filter_chain {
        d.filters[0] = stats;
    }
    l
}

/// istiod's `istio` cluster metadata naming `host` (name and namespace its labels).
fn istio_services(host: &str) -> Metadata {
    let s = |v: &str| Value {
        kind: Some(value::Kind::StringValue(v.into())),
    };
    let mut labels = host.split('.');
    let (name, ns) = (labels.next().unwrap(), labels.next().unwrap());
    let service = Value {
        kind: Some(value::Kind::StructValue(Struct {
            fields: [
                ("host".to_string(), s(host)),
                ("name".to_string(), s(name)),
                ("namespace".to_string(), s(ns)),
            ]
            .into(),
        })),
    };
    Metadata {
        filter_metadata: [(
            "istio".to_string(),
            Struct {
                fields: [(
                    "services".to_string(),
                    Value {
                        kind: Some(value::Kind::ListValue(ListValue {
                            values: vec![service],
                        })),
                    },
                )]
                .into(),
            },
        )]
        .into(),
        ..Default::default()
    }
}

fn istio_cluster() -> Cluster {
    Cluster {
        name: "outbound|8080||a.ns.svc.cluster.local".into(),
        metadata: Some(istio_services("a.ns.svc.cluster.local")),
        filters: vec![ClusterFilter {
            name: "istio.metadata_exchange".into(),
            typed_config: Some(typed_struct(
                "udpa.type.v1.TypedStruct",
                TCP_METADATA_EXCHANGE,
            )),
            config_discovery: None,
        }],
        transport_socket_matches: vec![
            TransportSocketMatch {
                name: "tlsMode-istio".into(),
                transport_socket: Some(tls_socket(UPSTREAM_TLS, &[PEER_EXCHANGE_ALPN, "istio"])),
                ..Default::default()
            },
            TransportSocketMatch {
                name: "tlsMode-disabled".into(),
                transport_socket: Some(TransportSocket {
                    name: "envoy.transport_sockets.raw_buffer".into(),
                    config_type: Some(transport_socket::ConfigType::TypedConfig(any(
                        "envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer",
                        vec![],
                    ))),
                }),
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

fn sotw(type_url: &str, resources: Vec<Any>) -> Vec<u8> {
    DiscoveryResponse {
        version_info: "2026-01-01T00:00:00Z/7".into(),
        resources,
        type_url: type_url.into(),
        nonce: "nonce-7".into(),
        ..Default::default()
    }
    .encode_to_vec()
}

fn delta(type_url: &str, resources: Vec<(String, Any)>) -> Vec<u8> {
    DeltaDiscoveryResponse {
        system_version_info: "v7".into(),
        resources: resources
            .into_iter()
            .map(|(name, any)| Resource {
                name,
                version: "v7".into(),
                resource: Some(any),
                ..Default::default()
            })
            .collect(),
        type_url: type_url.into(),
        nonce: "nonce-7".into(),
        removed_resources: vec!["gone".into()],
        ..Default::default()
    }
    .encode_to_vec()
}

fn listener_any(l: &Listener) -> Any {
    any("envoy.config.listener.v3.Listener", l.encode_to_vec())
}

fn cluster_any(c: &Cluster) -> Any {
    any("envoy.config.cluster.v3.Cluster", c.encode_to_vec())
}

fn changed(out: Adapted) -> (Bytes, Findings) {
    match out {
        Adapted::Changed(b, f) => (b, f),
        other => panic!("expected a change, got {other:?}"),
    }
}

fn refused(out: Adapted) -> (String, Findings) {
    match out {
        Adapted::Refused(why, f) => (why, f),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn sotw_listeners(bytes: Bytes) -> Vec<Listener> {
    DiscoveryResponse::decode(bytes)
        .unwrap()
        .resources
        .iter()
        .map(|a| Listener::decode(a.value.as_slice()).unwrap())
        .collect()
}

fn pairs(found: &[Finding]) -> Vec<(&str, &str)> {
    found
        .iter()
        .map(|f| (f.filter.as_str(), f.type_name.as_str()))
        .collect()
}

#[test]
fn sotw_listeners_get_istios_filters_from_the_module() {
    let plain = Listener {
        name: "plain".into(),
        filter_chains: vec![FilterChain {
            filters: vec![tcp_proxy()],
            ..Default::default()
        }],
        ..Default::default()
    };
    let msg = sotw(
        LISTENER_TYPE,
        vec![
            listener_any(&istio_inbound_listener()),
            listener_any(&plain),
        ],
    );
    let (bytes, found) = changed(adapt(false, &msg).unwrap());
    let resp = DiscoveryResponse::decode(bytes.clone()).unwrap();
    assert_eq!(resp.nonce, "nonce-7");
    assert_eq!(resp.version_info, "2026-01-01T00:00:00Z/7");
    assert_eq!(resp.resources.len(), 2);
    let got = Listener::decode(resp.resources[0].value.as_slice()).unwrap();
    assert_eq!(got, adapted_inbound_listener());
    // istio-peer-exchange is still offered: the module speaks the exchange.
    assert_eq!(
        got.filter_chains[0].transport_socket,
        Some(tls_socket(
            DOWNSTREAM_TLS,
            &[PEER_EXCHANGE_ALPN, "h2", "http/1.1"]
        ))
    );
    // The untouched listener is the same bytes (not outbound: no exchange added).
    assert_eq!(resp.resources[1], listener_any(&plain));
    assert_eq!(
        pairs(&found.mapped),
        vec![
            ("istio.metadata_exchange", PEER_METADATA),
            ("istio.alpn", ALPN_OVERRIDE),
            ("istio.stats", ISTIO_STATS),
            ("istio.metadata_exchange", TCP_METADATA_EXCHANGE),
            ("istio.stats", ISTIO_STATS),
            ("istio.stats", ISTIO_STATS),
        ]
    );
    assert!(found.mapped.iter().all(|f| f.resource == "virtualInbound"));
    assert!(found.removed.is_empty() && found.exchange_added.is_empty());
    assert!(found.refused.is_empty() && found.invalid.is_empty() && found.unknown.is_empty());
    assert!(found.settings_lost.is_empty(), "{:?}", found.settings_lost);
    // What the adapter wrote needs nothing more.
    assert_eq!(adapt(false, &bytes).unwrap(), Adapted::Unchanged);
}

#[test]
fn delta_clusters_lose_the_exchange_filter_keep_their_alpn_and_get_the_modules_metadata() {
    let msg = delta(
        CLUSTER_TYPE,
        vec![(
            "outbound|8080||a.ns.svc.cluster.local".into(),
            cluster_any(&istio_cluster()),
        )],
    );
    let (bytes, found) = changed(adapt(true, &msg).unwrap());
    let resp = DeltaDiscoveryResponse::decode(bytes.clone()).unwrap();
    assert_eq!(resp.removed_resources, vec!["gone".to_string()]);
    assert_eq!(resp.nonce, "nonce-7");
    let r = &resp.resources[0];
    assert_eq!(r.version, "v7");
    let got = Cluster::decode(r.resource.as_ref().unwrap().value.as_slice()).unwrap();
    let mut want = istio_cluster();
    want.filters.clear();
    want.metadata.as_mut().unwrap().filter_metadata.insert(
        mesh_common::module::cluster::NAMESPACE.into(),
        Struct {
            fields: [(
                mesh_common::module::cluster::SERVICE.to_string(),
                Value {
                    kind: Some(value::Kind::StringValue(
                        "a.ns.svc.cluster.local;a;ns".into(),
                    )),
                },
            )]
            .into(),
        },
    );
    assert_eq!(got, want);
    assert_eq!(
        pairs(&found.removed),
        vec![("istio.metadata_exchange", TCP_METADATA_EXCHANGE)]
    );
    assert_eq!(
        found.removed[0].resource,
        "outbound|8080||a.ns.svc.cluster.local"
    );
    assert_eq!(
        found.cluster_metadata_added,
        ["outbound|8080||a.ns.svc.cluster.local"]
    );
    assert!(found.settings_lost.is_empty(), "{:?}", found.settings_lost);
    // Once adapted, a cluster needs nothing more.
    assert_eq!(adapt(true, &bytes).unwrap(), Adapted::Unchanged);
}

#[test]
fn a_cluster_without_istiods_services_is_left_as_it_came() {
    // The module's ALPN leaves such a cluster its own: nothing to tell it, whatever the
    // protocol.
    let mut c = istio_cluster();
    c.metadata = None;
    c.filters.clear();
    let plain = sotw(CLUSTER_TYPE, vec![cluster_any(&c)]);
    assert_eq!(adapt(false, &plain).unwrap(), Adapted::Unchanged);
    #[allow(deprecated)]
    {
        c.protocol_selection = 1;
    }
    let downstream = sotw(CLUSTER_TYPE, vec![cluster_any(&c)]);
    assert_eq!(adapt(false, &downstream).unwrap(), Adapted::Unchanged);
}

#[test]
fn responses_with_nothing_to_adapt_pass_untouched() {
    // An HTTP listener of Envoy's own filters: not even decoded.
    let http = Listener {
        name: "0.0.0.0_8080".into(),
        traffic_direction: 2,
        filter_chains: vec![FilterChain {
            filters: vec![hcm(vec![http_filter(
                "envoy.filters.http.router",
                any(ROUTER, vec![]),
            )])],
            transport_socket: Some(tls_socket(DOWNSTREAM_TLS, &[PEER_EXCHANGE_ALPN, "h2"])),
            ..Default::default()
        }],
        ..Default::default()
    };
    let msg = sotw(LISTENER_TYPE, vec![listener_any(&http)]);
    assert!(!needs_adapting(&msg));
    assert_eq!(adapt(false, &msg).unwrap(), Adapted::Unchanged);
    // Already adapted: read, found complete.
    let msg = sotw(
        LISTENER_TYPE,
        vec![listener_any(&adapted_inbound_listener())],
    );
    assert_eq!(adapt(false, &msg).unwrap(), Adapted::Unchanged);
    let msg = delta(
        CLUSTER_TYPE,
        vec![("c".into(), cluster_any(&Cluster::default()))],
    );
    assert_eq!(adapt(true, &msg).unwrap(), Adapted::Unchanged);
    // Route and endpoint responses are never decoded.
    let routes = sotw(
        "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        vec![any("stats.PluginConfig", vec![])],
    );
    assert_eq!(adapt(false, &routes).unwrap(), Adapted::Unchanged);
}

#[test]
fn unknown_fields_survive_the_edit() {
    // Field 999 of the Listener and of the response: unknown to our types, kept as they were.
    let mut value = istio_inbound_listener().encode_to_vec();
    wire::put_len(&mut value, 999, b"future");
    let mut msg = sotw(
        LISTENER_TYPE,
        vec![any("envoy.config.listener.v3.Listener", value)],
    );
    wire::put_len(&mut msg, 998, b"later");
    let (bytes, _) = changed(adapt(false, &msg).unwrap());
    assert!(memchr::memmem::find(&bytes, b"future").is_some());
    assert!(memchr::memmem::find(&bytes, b"later").is_some());
    let got = DiscoveryResponse::decode(bytes).unwrap();
    let l = Listener::decode(got.resources[0].value.as_slice()).unwrap();
    assert_eq!(l, adapted_inbound_listener());
}

#[test]
fn a_security_filter_of_an_unknown_type_refuses_the_response() {
    let mut l = istio_inbound_listener();
    l.filter_chains[0].filters = vec![hcm(vec![
        http_filter(
            "envoy.filters.http.rbac",
            typed_struct("udpa.type.v1.TypedStruct", "istio.rbac.v1.Custom"),
        ),
        http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
    ])];
    let msg = sotw(LISTENER_TYPE, vec![listener_any(&l)]);
    let (why, found) = refused(adapt(false, &msg).unwrap());
    assert!(
        why.contains("envoy.filters.http.rbac in virtualInbound"),
        "{why}"
    );
    assert!(why.contains("istio.rbac.v1.Custom"), "{why}");
    assert_eq!(found.refused.len(), 1);
    let request = DiscoveryRequest::decode(nack(false, &msg, &why).unwrap()).unwrap();
    assert_eq!(request.response_nonce, "nonce-7");
    assert_eq!(request.type_url, LISTENER_TYPE);
    assert_eq!(request.error_detail.unwrap().message, why);

    // Network ext_authz in Delta, and a security filter named like one but holding Istio stats.
    let mut l = istio_inbound_listener();
    l.filter_chains[1].filters[1] =
        network_filter("envoy.filters.network.ext_authz", any(ISTIO_STATS, vec![]));
    let msg = delta(
        LISTENER_TYPE,
        vec![("virtualInbound".into(), listener_any(&l))],
    );
    assert!(matches!(adapt(true, &msg).unwrap(), Adapted::Refused(..)));
    let request = DeltaDiscoveryRequest::decode(nack(true, &msg, "x").unwrap()).unwrap();
    assert_eq!(request.response_nonce, "nonce-7");
}

/// An `istio.metadata_exchange` whose Struct is not a peer_metadata Config the module reads
/// (a misspelt field, as an EnvoyFilter could patch in) is NACKed, the filter named.
#[test]
fn a_peer_metadata_config_the_module_cannot_read_is_nacked_with_the_filter_named() {
    let mut l = istio_inbound_listener();
    l.filter_chains[0].filters = vec![hcm(vec![
        http_filter(
            "istio.metadata_exchange",
            typed_json(
                PEER_METADATA,
                serde_json::json!({"downstream_discovery": [{"istio_headers": {}}], "downstream_propagaton": []}),
            ),
        ),
        http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
    ])];
    let msg = sotw(LISTENER_TYPE, vec![listener_any(&l)]);
    let (why, found) = refused(adapt(false, &msg).unwrap());
    assert!(
        why.starts_with(
            "refused by the agent: istio.metadata_exchange in virtualInbound (type io.istio.http.peer_metadata.Config): the proxy module would refuse its config:"
        ),
        "{why}"
    );
    assert!(why.contains("downstream_propagaton"), "{why}");
    assert_eq!(found.invalid.len(), 1);
    assert_eq!(found.invalid[0].0.filter, "istio.metadata_exchange");
    // The other filters of the response (the TCP chain's exchange and stats, the default
    // chain's stats) were judged as usual; none is forwarded.
    assert_eq!(found.mapped.len(), 3);

    // A config that reads is passed on as it came.
    let config = serde_json::json!({"downstream_discovery": [{"istio_headers": {}}], "additional_labels": ["team"]});
    l.filter_chains[0].filters = vec![hcm(vec![
        http_filter(
            "istio.metadata_exchange",
            typed_json(PEER_METADATA, config.clone()),
        ),
        http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
    ])];
    let (bytes, _) = changed(adapt(false, &sotw(LISTENER_TYPE, vec![listener_any(&l)])).unwrap());
    let got = &sotw_listeners(bytes)[0];
    let Some(filter::ConfigType::TypedConfig(a)) = &got.filter_chains[0].filters[0].config_type
    else {
        panic!("untyped")
    };
    let h = HttpConnectionManager::decode(a.value.as_slice()).unwrap();
    let Some(http_filter::ConfigType::TypedConfig(mx)) = &h.http_filters[0].config_type else {
        panic!("untyped")
    };
    assert_eq!(mx.type_url, HTTP_TYPE);
    let m = DynamicModuleFilter::decode(mx.value.as_slice()).unwrap();
    assert_eq!(m.filter_name, module_filter::METADATA_EXCHANGE);
    let given = m.filter_config.unwrap();
    assert_eq!(given.type_url, "type.googleapis.com/google.protobuf.Struct");
    assert_eq!(
        map::json(&Struct::decode(given.value.as_slice()).unwrap()),
        config
    );
}

#[test]
fn a_waypoints_stats_reporter_is_nacked() {
    let mut l = istio_inbound_listener();
    // stats.PluginConfig { reporter: SERVER_GATEWAY }
    l.filter_chains[1].filters[1] =
        network_filter("istio.stats", any(ISTIO_STATS, vec![10 << 3, 1]));
    let msg = sotw(LISTENER_TYPE, vec![listener_any(&l)]);
    let (why, found) = refused(adapt(false, &msg).unwrap());
    assert!(
        why.contains("istio.stats in virtualInbound (type stats.PluginConfig)"),
        "{why}"
    );
    assert!(why.contains("reporter SERVER_GATEWAY"), "{why}");
    assert_eq!(found.invalid.len(), 1);
}

#[test]
fn other_unknown_types_are_kept_and_named() {
    let mut l = adapted_inbound_listener();
    l.filter_chains[1].filters.insert(
        0,
        network_filter(
            "vendor.network",
            typed_struct("udpa.type.v1.TypedStruct", "vendor.network.Config"),
        ),
    );
    let mut optional = http_filter("vendor.optional", any("vendor.Thing", vec![]));
    optional.is_optional = true;
    l.filter_chains[0].filters = vec![hcm(vec![
        optional,
        http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
    ])];
    let msg = sotw(LISTENER_TYPE, vec![listener_any(&l)]);
    let (bytes, found) = changed(adapt(false, &msg).unwrap());
    assert_eq!(
        bytes.as_ref(),
        msg.as_slice(),
        "nothing removed, nothing changed"
    );
    assert_eq!(
        found.unknown,
        vec![Finding {
            resource: "virtualInbound".into(),
            filter: "vendor.network".into(),
            type_name: "vendor.network.Config".into(),
        }],
        "the optional filter Envoy skips itself is not reported"
    );
}

/// The listener with only a router in its HTTP chain.
fn adapted_inbound_listener_with_router_only() -> Listener {
    let mut l = adapted_inbound_listener();
    l.filter_chains[0].filters = vec![hcm(vec![http_filter(
        "envoy.filters.http.router",
        any(ROUTER, vec![]),
    )])];
    l
}

#[test]
fn ecds_configs_and_their_references_are_removed_and_reported_lost() {
    let discovered = HttpFilter {
        name: "istio-system.stats".into(),
        config_type: Some(http_filter::ConfigType::ConfigDiscovery(
            ExtensionConfigSource {
                type_urls: vec![format!("type.googleapis.com/{ISTIO_STATS}")],
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    let mut l = adapted_inbound_listener();
    l.filter_chains[0].filters = vec![hcm(vec![
        discovered,
        http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
    ])];
    let (bytes, found) =
        changed(adapt(false, &sotw(LISTENER_TYPE, vec![listener_any(&l)])).unwrap());
    assert_eq!(
        sotw_listeners(bytes),
        vec![adapted_inbound_listener_with_router_only()]
    );
    assert_eq!(found.removed[0].filter, "istio-system.stats");
    assert!(found.mapped.is_empty());
    assert_eq!(found.settings_lost.len(), 1);
    assert!(
        found.settings_lost[0].1[0].contains("extension config discovery"),
        "{:?}",
        found.settings_lost
    );

    let config = |name: &str, typed: Any| {
        any(
            "envoy.config.core.v3.TypedExtensionConfig",
            TypedExtensionConfig {
                name: name.into(),
                typed_config: Some(typed),
            }
            .encode_to_vec(),
        )
    };
    let keep = config(
        "istio-system.lua",
        any("envoy.extensions.filters.http.lua.v3.Lua", vec![]),
    );
    for delta_xds in [false, true] {
        let resources = vec![
            config("istio-system.stats", any(ISTIO_STATS, vec![])),
            keep.clone(),
        ];
        let msg = if delta_xds {
            delta(
                EXTENSION_CONFIG_TYPE,
                vec![
                    ("istio-system.stats".into(), resources[0].clone()),
                    ("istio-system.lua".into(), keep.clone()),
                ],
            )
        } else {
            sotw(EXTENSION_CONFIG_TYPE, resources)
        };
        let (bytes, found) = changed(adapt(delta_xds, &msg).unwrap());
        assert_eq!(found.removed[0].resource, "istio-system.stats");
        if delta_xds {
            let r = DeltaDiscoveryResponse::decode(bytes).unwrap();
            assert_eq!(r.resources.len(), 1);
            assert_eq!(r.resources[0].resource.as_ref(), Some(&keep));
        } else {
            assert_eq!(
                DiscoveryResponse::decode(bytes).unwrap().resources,
                vec![keep.clone()]
            );
        }
    }
}

#[test]
fn the_adapter_nacks_upstream_and_reports() {
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let adapter = Adapter::new(metrics.clone());
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let good = Bytes::from(sotw(
        LISTENER_TYPE,
        vec![listener_any(&istio_inbound_listener())],
    ));
    let out = adapter.response(false, good, &tx).expect("forwarded");
    assert_eq!(adapt(false, &out).unwrap(), Adapted::Unchanged);
    assert!(rx.try_recv().is_err(), "no NACK for an adapted response");
    let clusters = Bytes::from(sotw(CLUSTER_TYPE, vec![cluster_any(&istio_cluster())]));
    assert!(adapter.response(false, clusters, &tx).is_some());

    let mut l = istio_inbound_listener();
    l.filter_chains[0].filters = vec![hcm(vec![http_filter(
        "envoy.filters.http.jwt_authn",
        any("istio.jwt.Custom", vec![]),
    )])];
    let bad = Bytes::from(sotw(LISTENER_TYPE, vec![listener_any(&l)]));
    assert!(adapter.response(false, bad, &tx).is_none());
    let nack = DiscoveryRequest::decode(rx.try_recv().unwrap()).unwrap();
    assert!(
        nack.error_detail
            .unwrap()
            .message
            .contains("envoy.filters.http.jwt_authn")
    );

    let report: serde_json::Value = serde_json::from_str(&adapter.report_json()).unwrap();
    assert_eq!(report["mapped"][ISTIO_STATS]["istio.stats"]["count"], 3);
    assert_eq!(
        report["mapped"][PEER_METADATA]["istio.metadata_exchange"]["resources"][0],
        "virtualInbound"
    );
    assert_eq!(
        report["removed"][TCP_METADATA_EXCHANGE]["istio.metadata_exchange"]["count"],
        1
    );
    assert_eq!(report["cluster_metadata_added"]["count"], 1);
    assert_eq!(
        report["refused"][0]["filters"][0]["filter"],
        "envoy.filters.http.jwt_authn"
    );
    assert!(report.get("alpn_stripped").is_none() && report.get("metrics_added").is_none());
    let text = metrics.encode();
    assert!(
        text.contains(
            "istio_agent_xds_adapt_removed_total{type=\"envoy.tcp.metadataexchange.config.MetadataExchange\"} 1"
        ),
        "{text}"
    );
    assert!(
        !text.contains("istio_agent_xds_adapt_removed_total{type=\"stats.PluginConfig\"}"),
        "mapped filters are not removals: {text}"
    );
    assert!(
        text.contains("istio_agent_xds_adapt_refused_total 1"),
        "{text}"
    );

    // Off: everything passes as it is.
    let bad = Bytes::from(sotw(LISTENER_TYPE, vec![listener_any(&l)]));
    assert_eq!(
        apply(None, false, Ok(bad.clone()), &tx).unwrap().unwrap(),
        bad
    );
}

#[test]
fn garbage_is_forwarded_not_a_panic() {
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let adapter = Adapter::new(Arc::new(crate::metrics::Metrics::new()));
    let mut msg = sotw(LISTENER_TYPE, vec![listener_any(&istio_inbound_listener())]);
    msg.truncate(msg.len() - 3);
    let msg = Bytes::from(msg);
    assert_eq!(adapter.response(false, msg.clone(), &tx), Some(msg));
}

/// The null-VM Wasm exchange istiod 1.18 writes becomes the module's, for the listener's side;
/// null-VM stats go (reported lost); another Wasm plugin stays.
#[test]
fn null_vm_wasm_filters_of_old_istiods() {
    use envoy_types::pb::envoy::config::core::v3::{
        AsyncDataSource, DataSource, async_data_source, data_source,
    };
    use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
    use envoy_types::pb::envoy::extensions::wasm::v3::{PluginConfig, VmConfig, plugin_config};
    let wasm = |runtime: &str, plugin: &str| {
        any(
            "envoy.extensions.filters.http.wasm.v3.Wasm",
            Wasm {
                config: Some(PluginConfig {
                    vm: Some(plugin_config::Vm::VmConfig(VmConfig {
                        runtime: runtime.into(),
                        code: Some(AsyncDataSource {
                            specifier: Some(async_data_source::Specifier::Local(DataSource {
                                specifier: Some(data_source::Specifier::InlineString(
                                    plugin.into(),
                                )),
                                ..Default::default()
                            })),
                        }),
                        ..Default::default()
                    })),
                    ..Default::default()
                }),
            }
            .encode_to_vec(),
        )
    };
    let mut l = adapted_inbound_listener();
    l.filter_chains[0].filters = vec![hcm(vec![
        http_filter(
            "istio.metadata_exchange",
            Any::decode(map::tests::null_vm_exchange_filter(&[]).as_slice()).unwrap(),
        ),
        http_filter("istio.stats", wasm(NULL_VM, "envoy.wasm.stats")),
        http_filter("vendor.plugin", wasm("envoy.wasm.runtime.v8", "x")),
        http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
    ])];
    let (bytes, found) =
        changed(adapt(false, &sotw(LISTENER_TYPE, vec![listener_any(&l)])).unwrap());
    let mut want = adapted_inbound_listener();
    want.filter_chains[0].filters = vec![hcm(vec![
        http_filter(
            "istio.metadata_exchange",
            http_config(
                module_filter::METADATA_EXCHANGE,
                json(&PeerMetadata::server()),
            ),
        ),
        http_filter("vendor.plugin", wasm("envoy.wasm.runtime.v8", "x")),
        http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
    ])];
    assert_eq!(sotw_listeners(bytes), vec![want]);
    assert_eq!(
        pairs(&found.mapped)[0],
        ("istio.metadata_exchange", NULL_VM_METADATA_EXCHANGE)
    );
    assert_eq!(pairs(&found.removed), vec![("istio.stats", NULL_VM_STATS)]);
    assert_eq!(found.settings_lost.len(), 1);
    assert!(
        found.settings_lost[0].1[0].starts_with("standard metrics"),
        "{:?}",
        found.settings_lost
    );
}

/// `istio.stats` says the side it reports for: the listener's traffic direction, else Istio's
/// inbound listener name; its settings ride along.
#[test]
fn stats_report_for_the_listeners_side() {
    // stats.PluginConfig { disable_host_header_fallback: true, metrics: [{name:
    // "request_bytes", drop: true}] }
    let mut drop_bytes = Vec::new();
    wire::put_len(&mut drop_bytes, 2, b"request_bytes");
    drop_bytes.extend([5 << 3, 1]);
    let mut config = vec![6 << 3, 1];
    wire::put_len(&mut config, 8, &drop_bytes);
    let listener = |direction: i32, name: &str| Listener {
        name: name.into(),
        traffic_direction: direction,
        filter_chains: vec![FilterChain {
            filters: vec![hcm(vec![
                http_filter("istio.stats", any(ISTIO_STATS, config.clone())),
                http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
            ])],
            ..Default::default()
        }],
        ..Default::default()
    };
    let msg = sotw(
        LISTENER_TYPE,
        vec![
            listener_any(&listener(2, "0.0.0.0_8080")),
            listener_any(&listener(0, "10.0.0.1_80")),
            listener_any(&listener(1, "in")),
            listener_any(&listener(0, "virtualInbound")),
        ],
    );
    let (bytes, found) = changed(adapt(false, &msg).unwrap());
    let stats: Vec<Stats> = sotw_listeners(bytes)
        .iter()
        .map(|l| {
            let Some(filter::ConfigType::TypedConfig(a)) =
                &l.filter_chains[0].filters[0].config_type
            else {
                panic!("untyped");
            };
            let h = HttpConnectionManager::decode(a.value.as_slice()).unwrap();
            assert!(h.access_log.is_empty(), "no access logger of the agent's");
            assert_eq!(h.http_filters.len(), 2);
            let Some(http_filter::ConfigType::TypedConfig(s)) = &h.http_filters[0].config_type
            else {
                panic!("untyped");
            };
            let m = DynamicModuleFilter::decode(s.value.as_slice()).unwrap();
            assert_eq!(m.filter_name, module_filter::STATS);
            let json = StringValue::decode(m.filter_config.unwrap().value.as_slice()).unwrap();
            serde_json::from_str(&json.value).unwrap()
        })
        .collect();
    let sides: Vec<&str> = stats.iter().map(|s| s.side.as_deref().unwrap()).collect();
    assert_eq!(sides, ["source", "source", "destination", "destination"]);
    assert!(stats.iter().all(|s| s.disable_host_header_fallback));
    assert!(
        stats
            .iter()
            .all(|s| s.metrics.len() == 1 && s.metrics[0].drop)
    );
    assert_eq!(found.mapped.len(), 4);
}

/// The exchange's client side goes just before tcp_proxy (after the metrics, which count the
/// app's bytes) in every chain of an outbound listener that ends in tcp_proxy, once; not in
/// connection managers' chains nor in inbound listeners.
#[test]
fn outbound_tcp_chains_get_the_exchanges_client_side() {
    let stats = || network_filter("istio.stats", any(ISTIO_STATS, vec![]));
    let chain = |filters: Vec<Filter>| FilterChain {
        filters,
        ..Default::default()
    };
    let outbound = Listener {
        name: "10.96.0.1_443".into(),
        traffic_direction: 2,
        filter_chains: vec![
            chain(vec![stats(), tcp_proxy()]),
            chain(vec![hcm(vec![http_filter(
                "envoy.filters.http.router",
                any(ROUTER, vec![]),
            )])]),
            chain(vec![tcp_proxy()]),
        ],
        default_filter_chain: Some(chain(vec![stats(), tcp_proxy()])),
        ..Default::default()
    };
    let mut inbound = outbound.clone();
    inbound.name = "in".into();
    inbound.traffic_direction = 1;
    let msg = sotw(
        LISTENER_TYPE,
        vec![listener_any(&outbound), listener_any(&inbound)],
    );
    let (bytes, found) = changed(adapt(false, &msg).unwrap());
    let got = sotw_listeners(bytes.clone());
    let names =
        |c: &FilterChain| -> Vec<String> { c.filters.iter().map(|f| f.name.clone()).collect() };
    let up = METADATA_EXCHANGE_UPSTREAM;
    let tcp = "envoy.filters.network.tcp_proxy";
    let out = &got[0];
    assert_eq!(names(&out.filter_chains[0]), ["istio.stats", up, tcp]);
    assert_eq!(
        names(&out.filter_chains[1]),
        ["envoy.filters.network.http_connection_manager"]
    );
    assert_eq!(names(&out.filter_chains[2]), [up, tcp]);
    assert_eq!(
        names(out.default_filter_chain.as_ref().unwrap()),
        ["istio.stats", up, tcp]
    );
    let Some(filter::ConfigType::TypedConfig(a)) = &out.filter_chains[0].filters[1].config_type
    else {
        panic!("untyped")
    };
    assert_eq!(*a, network_config(up, json(&TcpExchange::istio())));
    let m = DynamicModuleNetworkFilter::decode(a.value.as_slice()).unwrap();
    let config = StringValue::decode(m.filter_config.unwrap().value.as_slice()).unwrap();
    let read: TcpExchange = serde_json::from_str(&config.value).unwrap();
    assert_eq!(read, TcpExchange::istio());
    assert_eq!(found.exchange_added, ["10.96.0.1_443"; 3]);
    // Inbound: none.
    assert!(
        chains_of(&got[1]).all(|c| c.filters.iter().all(|f| f.name != up)),
        "{:?}",
        got[1]
    );
    // Not twice.
    assert_eq!(adapt(false, &bytes).unwrap(), Adapted::Unchanged);
}

fn chains_of(l: &Listener) -> impl Iterator<Item = &FilterChain> {
    l.filter_chains.iter().chain(l.default_filter_chain.iter())
}

/// The recorded istiod 1.31 outbound listener `0.0.0.0_9080` (Bookinfo productpage): every
/// Istio HTTP filter in its place, the module's, with a config the module's types read.
#[test]
fn istiod_1_31s_outbound_http_listener() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/istiod-1.31/bookinfo-productpage/sotw/lds.pb"
    );
    let recorded = std::fs::read(path).unwrap();
    let (bytes, _) = changed(adapt(false, &recorded).unwrap());
    let l = sotw_listeners(bytes)
        .into_iter()
        .find(|l| l.name == "0.0.0.0_9080")
        .unwrap();
    let Some(filter::ConfigType::TypedConfig(a)) = &l.filter_chains[0].filters[0].config_type
    else {
        panic!("untyped")
    };
    let h = HttpConnectionManager::decode(a.value.as_slice()).unwrap();
    let got: Vec<(String, String)> = h
        .http_filters
        .iter()
        .map(|f| {
            let Some(http_filter::ConfigType::TypedConfig(a)) = &f.config_type else {
                panic!("untyped")
            };
            let module = if a.type_url == HTTP_TYPE {
                let m = DynamicModuleFilter::decode(a.value.as_slice()).unwrap();
                let config = m.filter_config.unwrap();
                match m.filter_name.as_str() {
                    module_filter::METADATA_EXCHANGE => {
                        assert_eq!(
                            config.type_url,
                            "type.googleapis.com/google.protobuf.Struct"
                        );
                        let c: PeerMetadata = serde_json::from_value(map::json(
                            &Struct::decode(config.value.as_slice()).unwrap(),
                        ))
                        .unwrap();
                        assert_eq!(c, PeerMetadata::client());
                    }
                    module_filter::ALPN => {
                        let s = StringValue::decode(config.value.as_slice()).unwrap();
                        assert_eq!(
                            serde_json::from_str::<Alpn>(&s.value).unwrap(),
                            Alpn::istio()
                        );
                    }
                    module_filter::STATS => {
                        let s = StringValue::decode(config.value.as_slice()).unwrap();
                        assert_eq!(
                            serde_json::from_str::<Stats>(&s.value).unwrap(),
                            Stats {
                                side: Some("source".into()),
                                ..Stats::default()
                            }
                        );
                    }
                    other => panic!("{other}"),
                }
                m.filter_name
            } else {
                type_name(&a.type_url).to_string()
            };
            (f.name.clone(), module)
        })
        .collect();
    let want = [
        ("istio.metadata_exchange", module_filter::METADATA_EXCHANGE),
        (
            "envoy.filters.http.grpc_stats",
            "envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
        ),
        ("istio.alpn", module_filter::ALPN),
        (
            "envoy.filters.http.fault",
            "envoy.extensions.filters.http.fault.v3.HTTPFault",
        ),
        (
            "envoy.filters.http.cors",
            "envoy.extensions.filters.http.cors.v3.Cors",
        ),
        ("istio.stats", module_filter::STATS),
        ("envoy.filters.http.router", ROUTER),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(got, want);
    assert!(h.access_log.is_empty());
}

mod istiod_1_18 {
    //! What istiod 1.17–1.19 adds (seen in istio/istio's recorded authz config dump,
    //! tests/fixtures/istio/authz_configdump.yaml): `istio_authn` with RBAC principals on its
    //! filter state, and HBONE listeners.
    use super::*;
    use envoy_types::pb::envoy::config::listener::v3::{ListenerFilter, listener_filter};
    use envoy_types::pb::envoy::config::rbac::v3::{
        Policy, Principal, Rbac as RbacRules, principal,
    };
    use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
    use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        FilterStateMatcher, StringMatcher, filter_state_matcher, string_matcher,
    };

    const HTTP_RBAC: &str = "envoy.extensions.filters.http.rbac.v3.RBAC";
    const NETWORK_RBAC: &str = "envoy.extensions.filters.network.rbac.v3.RBAC";

    fn exact(s: &str) -> StringMatcher {
        StringMatcher {
            match_pattern: Some(string_matcher::MatchPattern::Exact(s.into())),
            ..Default::default()
        }
    }

    fn filter_state(key: &str, m: StringMatcher) -> Principal {
        Principal {
            identifier: Some(principal::Identifier::FilterState(FilterStateMatcher {
                key: key.into(),
                matcher: Some(filter_state_matcher::Matcher::StringMatch(m)),
            })),
        }
    }

    fn authenticated(m: StringMatcher) -> Principal {
        Principal {
            identifier: Some(principal::Identifier::Authenticated(
                principal::Authenticated {
                    principal_name: Some(m),
                },
            )),
        }
    }

    fn or_ids(ids: Vec<Principal>) -> Principal {
        Principal {
            identifier: Some(principal::Identifier::OrIds(principal::Set { ids })),
        }
    }

    fn not_id(p: Principal) -> Principal {
        Principal {
            identifier: Some(principal::Identifier::NotId(Box::new(p))),
        }
    }

    /// DENY rules as istiod 1.18 writes them: a peer principal (nested as istiod nests it), a
    /// negated one, and another filter state key that must stay.
    fn rules(peer: impl Fn(StringMatcher) -> Principal) -> RbacRules {
        let principals = vec![
            or_ids(vec![peer(exact(
                "spiffe://cluster.local/ns/default/sa/sleep",
            ))]),
            not_id(or_ids(vec![peer(exact(
                "spiffe://cluster.local/ns/test/sa/x",
            ))])),
            filter_state("other.key", exact("v")),
        ];
        RbacRules {
            action: 1,
            policies: [(
                "ns[default]-policy[deny]-rule[0]".to_string(),
                Policy {
                    principals,
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        }
    }

    fn inbound(peer: impl Fn(StringMatcher) -> Principal + Copy, authn: bool) -> Listener {
        let http = HttpRbac {
            rules: Some(rules(peer)),
            shadow_rules: Some(rules(peer)),
            ..Default::default()
        };
        let network = NetworkRbac {
            rules: Some(rules(peer)),
            stat_prefix: "tcp.".into(),
            ..Default::default()
        };
        let mut filters = Vec::new();
        if authn {
            filters.push(network_filter(
                "istio_authn",
                typed_struct("udpa.type.v1.TypedStruct", PEER_AUTHN),
            ));
        }
        filters.push(network_filter(
            "envoy.filters.network.rbac",
            any(NETWORK_RBAC, network.encode_to_vec()),
        ));
        filters.push(hcm(vec![
            http_filter(
                "envoy.filters.http.rbac",
                any(HTTP_RBAC, http.encode_to_vec()),
            ),
            http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
        ]));
        Listener {
            name: "virtualInbound".into(),
            filter_chains: vec![FilterChain {
                filters,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn istio_authn_goes_and_peer_principals_become_authenticated() {
        let key = |m| filter_state("io.istio.peer_principal", m);
        let msg = sotw(LISTENER_TYPE, vec![listener_any(&inbound(key, true))]);
        let (bytes, found) = changed(adapt(false, &msg).unwrap());
        let resp = DiscoveryResponse::decode(bytes).unwrap();
        let got = Listener::decode(resp.resources[0].value.as_slice()).unwrap();
        assert_eq!(got, inbound(authenticated, false));
        assert_eq!(pairs(&found.removed), vec![("istio_authn", PEER_AUTHN)]);
        assert!(found.settings_lost.is_empty());
        assert_eq!(
            found.principals_rewritten,
            vec!["virtualInbound".to_string()]
        );
        assert!(found.unknown.is_empty() && found.refused.is_empty());
    }

    /// Without `istio_authn` in the listener (istiod 1.31's HBONE `main_internal`, whose peer
    /// principal is the filter state `connect_terminate` shares with the internal connection),
    /// the principals match as istiod wrote them: rewritten, a DENY would never match there.
    #[test]
    fn peer_principals_without_istio_authn_stay() {
        let key = |m| filter_state("io.istio.peer_principal", m);
        let msg = sotw(LISTENER_TYPE, vec![listener_any(&inbound(key, false))]);
        assert_eq!(adapt(false, &msg).unwrap(), Adapted::Unchanged);
    }

    #[test]
    fn hbone_listeners_are_removed_whole_in_both_protocols() {
        let set_dst = ListenerFilter {
            name: "set_dst_address".into(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(typed_struct(
                "udpa.type.v1.TypedStruct",
                HBONE_ONLY[0],
            ))),
            ..Default::default()
        };
        let main_internal = Listener {
            name: "main_internal".into(),
            listener_filters: vec![set_dst],
            ..Default::default()
        };
        let connect_terminate = Listener {
            name: "connect_terminate".into(),
            filter_chains: vec![FilterChain {
                filters: vec![hcm(vec![
                    http_filter(
                        "connect_authority",
                        typed_struct("udpa.type.v1.TypedStruct", HBONE_ONLY[1]),
                    ),
                    http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
                ])],
                ..Default::default()
            }],
            ..Default::default()
        };
        let kept = adapted_inbound_listener();
        let msg = sotw(
            LISTENER_TYPE,
            vec![
                listener_any(&main_internal),
                listener_any(&kept),
                listener_any(&connect_terminate),
            ],
        );
        let (bytes, found) = changed(adapt(false, &msg).unwrap());
        let resp = DiscoveryResponse::decode(bytes).unwrap();
        assert_eq!(resp.resources, vec![listener_any(&kept)]);
        let removed: Vec<(&str, &str)> = found
            .removed
            .iter()
            .map(|f| (f.resource.as_str(), f.type_name.as_str()))
            .collect();
        assert_eq!(
            removed,
            vec![
                ("main_internal", HBONE_ONLY[0]),
                ("connect_terminate", HBONE_ONLY[1]),
            ]
        );

        let msg = delta(
            LISTENER_TYPE,
            vec![
                ("main_internal".into(), listener_any(&main_internal)),
                ("virtualInbound".into(), listener_any(&kept)),
            ],
        );
        let (bytes, _) = changed(adapt(true, &msg).unwrap());
        let resp = DeltaDiscoveryResponse::decode(bytes).unwrap();
        let names: Vec<&str> = resp.resources.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, vec!["virtualInbound"]);
        // An earlier version of the dropped listener, if Envoy has one, goes too.
        assert_eq!(
            resp.removed_resources,
            vec!["gone".to_string(), "main_internal".to_string()]
        );
    }
}

/// istiod 1.31's HBONE inbound listener `connect_terminate` keeps its set_filter_state, with its
/// factory `istio.hashable_string` (istio/proxy's) respelled as upstream Envoy's
/// `envoy.hashable_string`; the other values and the rest of the listener are kept.
#[test]
fn hbone_connect_authority_gets_upstreams_hashable_string() {
    use envoy_types::pb::envoy::config::core::v3::{
        SubstitutionFormatString, substitution_format_string,
    };
    use envoy_types::pb::envoy::extensions::filters::common::set_filter_state::v3::{
        FilterStateValue, filter_state_value,
    };
    use envoy_types::pb::envoy::extensions::filters::http::set_filter_state::v3::Config;
    let value = |key: &str, factory: &str, format: &str| {
        FilterStateValue {
        key: Some(filter_state_value::Key::ObjectKey(key.into())),
        factory_key: factory.into(),
        value: Some(filter_state_value::Value::FormatString(SubstitutionFormatString {
            format: Some(substitution_format_string::Format::TextFormatSource(
                envoy_types::pb::envoy::config::core::v3::DataSource {
                    specifier: Some(
                        envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineString(
                            format.into(),
                        ),
                    ),
                    ..Default::default()
                },
            )),
            ..Default::default()
        })),
        shared_with_upstream: 1,
        ..Default::default()
    }
    };
    let config = |factory: &str| Config {
        on_request_headers: vec![
            value(
                "envoy.filters.listener.original_dst.local_ip",
                "",
                "%REQ(:AUTHORITY)%",
            ),
            value("io.istio.connect_authority", factory, "%REQ(:AUTHORITY)%"),
            value(
                "io.istio.peer_principal",
                factory,
                "%DOWNSTREAM_PEER_URI_SAN%",
            ),
        ],
        ..Default::default()
    };
    let listener = |factory: &str| Listener {
        name: "connect_terminate".into(),
        filter_chains: vec![FilterChain {
            filters: vec![hcm(vec![http_filter(
                "connect_authority",
                any(
                    "envoy.extensions.filters.http.set_filter_state.v3.Config",
                    config(factory).encode_to_vec(),
                ),
            )])],
            ..Default::default()
        }],
        ..Default::default()
    };
    let msg = sotw(
        LISTENER_TYPE,
        vec![listener_any(&listener("istio.hashable_string"))],
    );
    let (bytes, found) = changed(adapt(false, &msg).unwrap());
    assert_eq!(
        sotw_listeners(bytes),
        vec![listener("envoy.hashable_string")]
    );
    assert_eq!(
        pairs(&found.mapped),
        vec![("connect_authority", "istio.hashable_string")]
    );
    assert!(found.removed.is_empty() && found.refused.is_empty() && found.unknown.is_empty());
    // Upstream's spelling needs nothing.
    let msg = sotw(
        LISTENER_TYPE,
        vec![listener_any(&listener("envoy.hashable_string"))],
    );
    assert_eq!(adapt(false, &msg).unwrap(), Adapted::Unchanged);
}
