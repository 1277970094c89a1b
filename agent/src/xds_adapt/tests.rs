use super::*;
use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster, Filter as ClusterFilter, cluster::TransportSocketMatch,
};
use envoy_types::pb::envoy::config::core::v3::{
    ExtensionConfigSource, TransportSocket, TypedExtensionConfig, transport_socket,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, UpstreamTlsContext,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::{Any, Struct};

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
const TCP_PROXY: &str = "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";

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

fn tls_socket(kind: &str, alpn: &[&str]) -> TransportSocket {
    let common = Some(CommonTlsContext {
        alpn_protocols: alpn.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    });
    let value = if kind == DOWNSTREAM_TLS {
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

/// A sidecar inbound listener as istiod 1.24–1.28 writes it (prometheus telemetry on).
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
            network_filter("envoy.filters.network.tcp_proxy", any(TCP_PROXY, vec![])),
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
                network_filter("envoy.filters.network.tcp_proxy", any(TCP_PROXY, vec![])),
            ],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A connection manager with these filters and the agent's inbound access logger and peer
/// exchange before its router (what an HCM whose `istio.stats` was removed becomes).
fn logged_hcm(mut filters: Vec<HttpFilter>) -> Filter {
    let at = filters.len() - 1;
    for (i, f) in peer::filters(false).into_iter().enumerate() {
        filters.insert(at + i, f);
    }
    let mut f = hcm(filters);
    if let Some(filter::ConfigType::TypedConfig(a)) = &mut f.config_type {
        let mut m = HttpConnectionManager::decode(a.value.as_slice()).unwrap();
        m.access_log.push(http_access_log(
            Reporter::Destination,
            &MetricsPlan::default(),
        ));
        a.value = m.encode_to_vec();
    }
    f
}

/// The same listener as Envoy should get it: where `istio.stats` was, the agent's access
/// logger reporting as `destination` (the listener is Istio's inbound one).
fn adapted_inbound_listener() -> Listener {
    let mut l = istio_inbound_listener();
    l.filter_chains[0].filters = vec![logged_hcm(vec![
        http_filter("envoy.filters.http.rbac", any(RBAC, vec![])),
        http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
    ])];
    l.filter_chains[0].transport_socket = Some(tls_socket(DOWNSTREAM_TLS, &["h2", "http/1.1"]));
    l.filter_chains[1].filters.drain(..2);
    if let Some(d) = &mut l.default_filter_chain {
        d.filters.remove(0);
    }
    let logged_tcp = any(
        TCP_PROXY,
        TcpProxy {
            access_log: vec![tcp_access_log(
                Reporter::Destination,
                &MetricsPlan::default(),
            )],
            access_log_options: Some(tcp_access_log_options(&MetricsPlan::default())),
            ..Default::default()
        }
        .encode_to_vec(),
    );
    l.filter_chains[1].filters[0] =
        network_filter("envoy.filters.network.tcp_proxy", logged_tcp.clone());
    if let Some(d) = &mut l.default_filter_chain {
        d.filters[0] = network_filter("envoy.filters.network.tcp_proxy", logged_tcp);
    }
    l
}

fn istio_cluster() -> Cluster {
    Cluster {
        name: "outbound|8080||a.ns.svc.cluster.local".into(),
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

#[test]
fn sotw_listeners_lose_the_istio_only_filters_and_alpn() {
    let plain = Listener {
        name: "plain".into(),
        filter_chains: vec![FilterChain {
            filters: vec![network_filter(
                "envoy.filters.network.tcp_proxy",
                any(TCP_PROXY, vec![]),
            )],
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
    let resp = DiscoveryResponse::decode(bytes).unwrap();
    assert_eq!(resp.nonce, "nonce-7");
    assert_eq!(resp.version_info, "2026-01-01T00:00:00Z/7");
    assert_eq!(resp.resources.len(), 2);
    let got = Listener::decode(resp.resources[0].value.as_slice()).unwrap();
    assert_eq!(got, adapted_inbound_listener());
    // The untouched listener is the same bytes.
    assert_eq!(resp.resources[1], listener_any(&plain));
    let removed: Vec<(&str, &str)> = found
        .removed
        .iter()
        .map(|f| (f.filter.as_str(), f.type_name.as_str()))
        .collect();
    assert_eq!(
        removed,
        vec![
            ("istio.metadata_exchange", PEER_METADATA),
            ("istio.alpn", ALPN_OVERRIDE),
            ("istio.stats", ISTIO_STATS),
            ("istio.metadata_exchange", TCP_METADATA_EXCHANGE),
            ("istio.stats", ISTIO_STATS),
            ("istio.stats", ISTIO_STATS),
        ]
    );
    assert!(found.removed.iter().all(|f| f.resource == "virtualInbound"));
    assert_eq!(found.alpn_stripped, vec!["virtualInbound".to_string()]);
    assert!(found.refused.is_empty() && found.unknown.is_empty());
}

#[test]
fn delta_clusters_lose_the_cluster_filter_and_peer_exchange_alpn() {
    let msg = delta(
        CLUSTER_TYPE,
        vec![(
            "outbound|8080||a.ns.svc.cluster.local".into(),
            cluster_any(&istio_cluster()),
        )],
    );
    let (bytes, found) = changed(adapt(true, &msg).unwrap());
    let resp = DeltaDiscoveryResponse::decode(bytes).unwrap();
    assert_eq!(resp.removed_resources, vec!["gone".to_string()]);
    assert_eq!(resp.nonce, "nonce-7");
    let r = &resp.resources[0];
    assert_eq!(r.version, "v7");
    let got = Cluster::decode(r.resource.as_ref().unwrap().value.as_slice()).unwrap();
    let mut want = istio_cluster();
    want.filters.clear();
    want.transport_socket_matches[0].transport_socket = Some(tls_socket(UPSTREAM_TLS, &["istio"]));
    assert_eq!(got, want);
    assert_eq!(found.removed.len(), 1);
    assert_eq!(
        found.removed[0].resource,
        "outbound|8080||a.ns.svc.cluster.local"
    );
    assert_eq!(found.alpn_stripped.len(), 1);
}

#[test]
fn a_cluster_transport_socket_loses_peer_exchange_alpn() {
    let mut c = istio_cluster();
    c.transport_socket_matches.clear();
    c.filters.clear();
    c.transport_socket = Some(tls_socket(UPSTREAM_TLS, &[PEER_EXCHANGE_ALPN, "istio"]));
    let (bytes, _) = changed(adapt(false, &sotw(CLUSTER_TYPE, vec![cluster_any(&c)])).unwrap());
    let resp = DiscoveryResponse::decode(bytes).unwrap();
    let got = Cluster::decode(resp.resources[0].value.as_slice()).unwrap();
    c.transport_socket = Some(tls_socket(UPSTREAM_TLS, &["istio"]));
    assert_eq!(got, c);
}

#[test]
fn responses_with_nothing_istio_only_pass_untouched() {
    let mut l = adapted_inbound_listener();
    l.filter_chains[0].transport_socket = Some(tls_socket(DOWNSTREAM_TLS, &["h2"]));
    for msg in [
        sotw(LISTENER_TYPE, vec![listener_any(&l)]),
        delta(
            CLUSTER_TYPE,
            vec![("c".into(), cluster_any(&Cluster::default()))],
        ),
    ] {
        assert!(!needs_adapting(&msg));
        assert_eq!(adapt(false, &msg).unwrap(), Adapted::Unchanged);
    }
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
    let Adapted::Refused(why, found) = adapt(false, &msg).unwrap() else {
        panic!("expected a refusal");
    };
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

#[test]
fn ecds_configs_and_their_references_are_removed() {
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
    let got = Listener::decode(
        DiscoveryResponse::decode(bytes).unwrap().resources[0]
            .value
            .as_slice(),
    )
    .unwrap();
    assert_eq!(got, adapted_inbound_listener_with_router_only());
    assert_eq!(found.removed[0].filter, "istio-system.stats");

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

fn adapted_inbound_listener_with_router_only() -> Listener {
    let mut l = adapted_inbound_listener();
    l.filter_chains[0].filters = vec![logged_hcm(vec![http_filter(
        "envoy.filters.http.router",
        any(ROUTER, vec![]),
    )])];
    l
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
    assert!(!needs_adapting(&out));
    assert!(rx.try_recv().is_err(), "no NACK for an adapted response");

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
    assert_eq!(report["removed"][ISTIO_STATS]["istio.stats"]["count"], 3);
    assert_eq!(
        report["refused"][0]["filters"][0]["filter"],
        "envoy.filters.http.jwt_authn"
    );
    assert_eq!(report["alpn_stripped"]["resources"][0], "virtualInbound");
    let text = metrics.encode();
    assert!(
        text.contains("istio_agent_xds_adapt_removed_total{type=\"stats.PluginConfig\"} 3"),
        "{text}"
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

#[test]
fn null_vm_wasm_filters_of_old_istiods_are_removed() {
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
            wasm(NULL_VM, "envoy.wasm.metadata_exchange"),
        ),
        http_filter("istio.stats", wasm(NULL_VM, "envoy.wasm.stats")),
        http_filter("vendor.plugin", wasm("envoy.wasm.runtime.v8", "x")),
        http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
    ])];
    let (bytes, found) =
        changed(adapt(false, &sotw(LISTENER_TYPE, vec![listener_any(&l)])).unwrap());
    let got = Listener::decode(
        DiscoveryResponse::decode(bytes).unwrap().resources[0]
            .value
            .as_slice(),
    )
    .unwrap();
    let mut want = adapted_inbound_listener();
    want.filter_chains[0].filters = vec![logged_hcm(vec![
        http_filter("vendor.plugin", wasm("envoy.wasm.runtime.v8", "x")),
        http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
    ])];
    assert_eq!(got, want);
    let types: Vec<&str> = found.removed.iter().map(|f| f.type_name.as_str()).collect();
    assert_eq!(types, vec![NULL_VM_METADATA_EXCHANGE, NULL_VM_STATS]);
}

/// A removed `istio.stats` leaves its place to the agent's access logger, reporting as the
/// listener's traffic direction says; a listener that had no stats filter gets none.
#[test]
fn removed_stats_are_replaced_by_the_agents_access_logger() {
    let outbound = |direction: i32, name: &str, stats: bool| {
        let mut filters = vec![http_filter(
            "envoy.filters.http.router",
            any(ROUTER, vec![]),
        )];
        if stats {
            filters.insert(0, http_filter("istio.stats", any(ISTIO_STATS, vec![])));
        }
        Listener {
            name: name.into(),
            traffic_direction: direction,
            filter_chains: vec![FilterChain {
                filters: vec![hcm(filters)],
                ..Default::default()
            }],
            ..Default::default()
        }
    };
    let logs = |l: &Listener| -> Vec<_> {
        let Some(filter::ConfigType::TypedConfig(a)) = &l.filter_chains[0].filters[0].config_type
        else {
            panic!("untyped");
        };
        HttpConnectionManager::decode(a.value.as_slice())
            .unwrap()
            .access_log
    };
    let msg = sotw(
        LISTENER_TYPE,
        vec![
            listener_any(&outbound(2, "0.0.0.0_8080", true)),
            listener_any(&outbound(0, "10.0.0.1_80", true)),
            listener_any(&outbound(1, "in", true)),
            listener_any(&outbound(2, "nostats", false)),
        ],
    );
    let (bytes, found) = changed(adapt(false, &msg).unwrap());
    let resp = DiscoveryResponse::decode(bytes).unwrap();
    let got: Vec<Listener> = resp
        .resources
        .iter()
        .map(|a| Listener::decode(a.value.as_slice()).unwrap())
        .collect();
    assert_eq!(
        logs(&got[0]),
        vec![http_access_log(Reporter::Source, &MetricsPlan::default())]
    );
    assert_eq!(
        logs(&got[1]),
        vec![http_access_log(Reporter::Source, &MetricsPlan::default())]
    );
    assert_eq!(
        logs(&got[2]),
        vec![http_access_log(
            Reporter::Destination,
            &MetricsPlan::default()
        )]
    );
    assert!(logs(&got[3]).is_empty());
    assert_eq!(
        found.metrics_added,
        vec!["0.0.0.0_8080", "10.0.0.1_80", "in"]
    );
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
        assert_eq!(
            found
                .removed
                .iter()
                .map(|f| (f.filter.as_str(), f.type_name.as_str()))
                .collect::<Vec<_>>(),
            vec![("istio_authn", PEER_AUTHN)]
        );
        assert_eq!(
            found.principals_rewritten,
            vec!["virtualInbound".to_string()]
        );
        assert!(found.unknown.is_empty() && found.refused.is_empty());
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

#[test]
fn istiods_stats_config_shapes_the_agents_metrics() {
    // stats.PluginConfig { metrics: [ {dimensions: {request_host: "request.host"},
    //   name: "requests_total", tags_to_remove: ["request_protocol"]}, {name:
    //   "request_bytes", drop: true} ], tcp_reporting_duration: 10s }
    let mut dim = Vec::new();
    wire::put_len(&mut dim, 1, b"request_host");
    wire::put_len(&mut dim, 2, b"request.host");
    let mut count = Vec::new();
    wire::put_len(&mut count, 1, &dim);
    wire::put_len(&mut count, 2, b"requests_total");
    wire::put_len(&mut count, 3, b"request_protocol");
    let mut bytes = Vec::new();
    wire::put_len(&mut bytes, 2, b"request_bytes");
    bytes.extend([5 << 3, 1]);
    let mut config = Vec::new();
    wire::put_len(&mut config, 8, &count);
    wire::put_len(&mut config, 8, &bytes);
    wire::put_len(&mut config, 7, &[1 << 3, 10]);
    let plan = stats_plan(&config).unwrap();
    assert_eq!(
        plan.reporting_interval,
        Some(std::time::Duration::from_secs(10))
    );
    assert_eq!(plan.metrics.len(), 2);
    assert_eq!(plan.metrics[0].name, "requests_total");
    assert_eq!(
        plan.metrics[0].tags_to_remove,
        vec!["request_protocol".to_string()]
    );
    assert_eq!(plan.metrics[0].dimensions["request_host"], "request.host");
    assert!(plan.metrics[1].drop);

    // In a listener: the agent's logger carries that shape.
    let listener = Listener {
        name: "0.0.0.0_8080".into(),
        traffic_direction: 2,
        filter_chains: vec![FilterChain {
            filters: vec![hcm(vec![
                http_filter("istio.stats", any(ISTIO_STATS, config.clone())),
                http_filter("envoy.filters.http.router", any(ROUTER, vec![])),
            ])],
            ..Default::default()
        }],
        ..Default::default()
    };
    let msg = sotw(LISTENER_TYPE, vec![listener_any(&listener)]);
    let (out, _) = changed(adapt(false, &msg).unwrap());
    let resp = DiscoveryResponse::decode(out).unwrap();
    let l = Listener::decode(resp.resources[0].value.as_slice()).unwrap();
    let Some(filter::ConfigType::TypedConfig(a)) = &l.filter_chains[0].filters[0].config_type
    else {
        panic!("untyped");
    };
    let logs = HttpConnectionManager::decode(a.value.as_slice())
        .unwrap()
        .access_log;
    assert_eq!(logs, vec![http_access_log(Reporter::Source, &plan)]);
}
