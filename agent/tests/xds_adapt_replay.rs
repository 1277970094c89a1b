//! Replays what a real istiod sent a sidecar through the agent's xDS adaptation: the responses
//! Istio's release-1.31 istiod gave the Bookinfo productpage sidecar
//! (`tests/fixtures/istiod-1.31/bookinfo-productpage`, recorded by `scripts/record-istiod.sh`;
//! CDS, EDS, LDS and RDS, over state of the world and Delta). Each response goes through
//! `xds_adapt::adapt` exactly as recorded, and the tests check what upstream Envoy gets: each
//! Istio filter the recording holds (found by a walk of the recording independent of the
//! adapter) in its place as the proxy module's, with a config the module's own types read as
//! istiod meant it; the exchange's cluster filters gone and its client side leading the outbound
//! TCP chains; the module's cluster metadata; every resource kept; what the sidecar needs (the
//! four services' clusters, the inbound listener, mTLS with `istio-peer-exchange`, RBAC) intact;
//! and Envoy's own `--mode validate` accepting the adapted listeners and clusters (with the
//! module) and rejecting the recorded ones.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use envoy_types::pb::envoy::config::bootstrap::v3::{Bootstrap, bootstrap::StaticResources};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::address;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as TlsConfig;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::rbac::v3::principal;
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, route, route_action};
use envoy_types::pb::envoy::extensions::filters::http::dynamic_modules::v3::DynamicModuleFilter;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::dynamic_modules::v3::DynamicModuleNetworkFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, UpstreamTlsContext,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::protobuf::{StringValue, Struct, value};
use mesh_common::module::{self, PEER_EXCHANGE_ALPN, cluster as module_cluster};
use mesh_common::telemetry::module_filters;
use pilot_agent::xds_adapt::TypedStruct;
use pilot_agent::xds_adapt::{
    self, ALPN_OVERRIDE, Adapted, Findings, ISTIO_STATS, PEER_METADATA, TCP_METADATA_EXCHANGE,
};
use prost::Message;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const HCM: &str =
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const TCP_PROXY: &str = "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const HTTP_RBAC: &str = "envoy.extensions.filters.http.rbac.v3.RBAC";
const NETWORK_RBAC: &str = "envoy.extensions.filters.network.rbac.v3.RBAC";

/// The Bookinfo services, each with its outbound cluster on 9080, and the subsets Istio's
/// `destination-rule-all.yaml` gives them.
const SERVICES: [(&str, &[&str]); 4] = [
    ("productpage", &["v1"]),
    ("details", &["v1", "v2"]),
    ("ratings", &["v1", "v2", "v2-mysql", "v2-mysql-vm"]),
    ("reviews", &["v1", "v2", "v3"]),
];
/// The principal `tests/fixtures/istiod-1.31/policy.yaml` allows to GET productpage.
const GATEWAY_PRINCIPAL: &str =
    "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account";

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/istiod-1.31/bookinfo-productpage")
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Stream {
    Sotw,
    Delta,
}

impl Stream {
    const BOTH: [Stream; 2] = [Stream::Sotw, Stream::Delta];

    fn delta(self) -> bool {
        self == Stream::Delta
    }
}

/// One recorded response, as istiod sent it.
fn recorded(stream: Stream, file: &str) -> Vec<u8> {
    let dir = if stream.delta() { "delta" } else { "sotw" };
    let path = fixture_dir().join(dir).join(format!("{file}.pb"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Listener, Cluster, RouteConfiguration and ClusterLoadAssignment all have their name first.
#[derive(Clone, PartialEq, prost::Message)]
struct Named {
    #[prost(string, tag = "1")]
    name: String,
}

/// A response's type URL and resources (name, Any), in order; Delta's removed names.
struct Response {
    type_url: String,
    nonce: String,
    resources: Vec<(String, Any)>,
    removed: Vec<String>,
}

fn response(stream: Stream, msg: &[u8]) -> Response {
    if stream.delta() {
        let r = DeltaDiscoveryResponse::decode(msg).expect("a DeltaDiscoveryResponse");
        let resources = r
            .resources
            .into_iter()
            .map(|res| {
                let any = res.resource.expect("a Delta resource with its value");
                assert_eq!(decode::<Named>(&any).name, res.name);
                (res.name, any)
            })
            .collect();
        Response {
            type_url: r.type_url,
            nonce: r.nonce,
            resources,
            removed: r.removed_resources,
        }
    } else {
        let r = DiscoveryResponse::decode(msg).expect("a DiscoveryResponse");
        let resources = r
            .resources
            .into_iter()
            .map(|any| (decode::<Named>(&any).name, any))
            .collect();
        Response {
            type_url: r.type_url,
            nonce: r.nonce,
            resources,
            removed: Vec::new(),
        }
    }
}

/// The adapted response and what the adapter reports; fails unless the response was changed.
fn adapted(stream: Stream, file: &str) -> (Vec<u8>, Findings) {
    match xds_adapt::adapt(stream.delta(), &recorded(stream, file)).expect("readable") {
        Adapted::Changed(bytes, found) => (bytes.to_vec(), found),
        other => panic!("{stream:?} {file}: expected the response changed, got {other:?}"),
    }
}

fn type_name(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// The type Envoy would look an extension up by (a TypedStruct's inner one).
fn extension_type(any: &Any) -> String {
    let name = type_name(&any.type_url);
    if name == "udpa.type.v1.TypedStruct" || name == "xds.type.v3.TypedStruct" {
        let inner = TypedStruct::decode(any.value.as_slice()).expect("a TypedStruct");
        return type_name(&inner.type_url).to_string();
    }
    name.to_string()
}

/// One filter found in a resource: (resource, filter name, type).
type Extension = (String, String, String);

/// Every network and HTTP filter of a listener's chains, by a walk of the typed messages.
fn listener_extensions(listener: &Listener) -> Vec<Extension> {
    let mut out = Vec::new();
    for chain in chains(listener) {
        for f in &chain.filters {
            let Some(any) = typed(f) else { continue };
            out.push((listener.name.clone(), f.name.clone(), extension_type(any)));
            if type_name(&any.type_url) == HCM {
                let hcm: HttpConnectionManager = decode(any);
                for h in hcm.http_filters {
                    if let Some(http_filter::ConfigType::TypedConfig(any)) = &h.config_type {
                        out.push((listener.name.clone(), h.name.clone(), extension_type(any)));
                    }
                }
            }
        }
    }
    out
}

fn cluster_extensions(cluster: &Cluster) -> Vec<Extension> {
    cluster
        .filters
        .iter()
        .filter_map(|f| {
            let any = f.typed_config.as_ref()?;
            Some((cluster.name.clone(), f.name.clone(), extension_type(any)))
        })
        .collect()
}

fn chains(listener: &Listener) -> impl Iterator<Item = &FilterChain> {
    listener
        .filter_chains
        .iter()
        .chain(listener.default_filter_chain.iter())
}

fn typed(f: &Filter) -> Option<&Any> {
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any)) => Some(any),
        _ => None,
    }
}

fn extensions(file: &str, resources: &[(String, Any)]) -> Vec<Extension> {
    resources
        .iter()
        .flat_map(|(_, any)| match file {
            "lds" => listener_extensions(&decode(any)),
            "cds" => cluster_extensions(&decode(any)),
            _ => Vec::new(),
        })
        .collect()
}

const ISTIO_ONLY: [&str; 4] = [
    PEER_METADATA,
    TCP_METADATA_EXCHANGE,
    ALPN_OVERRIDE,
    ISTIO_STATS,
];

/// Strings that name an Istio extension or its ALPN anywhere in a message (as recorded).
const ISTIO_ONLY_BYTES: [&str; 8] = [
    "istio.metadata_exchange",
    "istio.stats",
    "istio.alpn",
    "io.istio.http.peer_metadata",
    "envoy.tcp.metadataexchange",
    "stats.PluginConfig",
    "istio.envoy.config.filter",
    PEER_EXCHANGE_ALPN,
];

fn istio_only_strings(msg: &[u8]) -> Vec<&'static str> {
    ISTIO_ONLY_BYTES
        .into_iter()
        .filter(|s| msg.windows(s.len()).any(|w| w == s.as_bytes()))
        .collect()
}

fn count_by_type(found: &[Extension]) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for (_, _, t) in found {
        *by.entry(t.clone()).or_default() += 1;
    }
    by
}

fn decode<M: Message + Default>(any: &Any) -> M {
    M::decode(any.value.as_slice()).expect("decodes as its type")
}

fn names(r: &Response) -> Vec<String> {
    r.resources.iter().map(|(n, _)| n.clone()).collect()
}

#[test]
fn the_recording_is_a_bookinfo_productpage_sidecar() {
    let node: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture_dir().join("node.json")).unwrap()).unwrap();
    let id = node["id"].as_str().unwrap();
    assert!(
        id.starts_with("sidecar~10.244.0.11~productpage-v1-")
            && id.ends_with(".default~default.svc.cluster.local"),
        "{id}"
    );
    assert_eq!(node["metadata"]["ISTIO_VERSION"], "1.31.0");
    assert_eq!(
        node["metadata"]["LABELS"]["security.istio.io/tlsMode"],
        "istio"
    );
    for stream in Stream::BOTH {
        let count = |file: &str, type_url: &str| {
            let r = response(stream, &recorded(stream, file));
            assert_eq!(r.type_url, type_url, "{stream:?} {file}");
            assert!(!r.nonce.is_empty());
            r
        };
        let cds = count("cds", CDS);
        let eds = count("eds", EDS);
        let lds = count("lds", LDS);
        let rds = count("rds", RDS);
        assert_eq!(
            [
                cds.resources.len(),
                eds.resources.len(),
                lds.resources.len(),
                rds.resources.len()
            ],
            [23, 19, 8, 3],
            "{stream:?}: CDS, EDS, LDS, RDS resources"
        );
        let clusters = names(&cds);
        for (service, subsets) in SERVICES {
            let host = format!("{service}.default.svc.cluster.local");
            assert!(
                clusters.contains(&format!("outbound|9080||{host}")),
                "{service}"
            );
            for s in subsets {
                assert!(
                    clusters.contains(&format!("outbound|9080|{s}|{host}")),
                    "{service} {s}"
                );
            }
        }
        for c in [
            "inbound|9080||",
            "BlackHoleCluster",
            "PassthroughCluster",
            "InboundPassthroughCluster",
        ] {
            assert!(clusters.contains(&c.to_string()), "{c}");
        }
        // Endpoints: reviews has its three pods, v2 its one; a subset with no pods is empty.
        let endpoints = |name: &str| -> Vec<String> {
            let (_, any) = eds.resources.iter().find(|(n, _)| n == name).unwrap();
            let cla: ClusterLoadAssignment = decode(any);
            let mut ips: Vec<String> = cla
                .endpoints
                .iter()
                .flat_map(|l| &l.lb_endpoints)
                .filter_map(|e| match e.host_identifier.as_ref()? {
                    HostIdentifier::Endpoint(e) => match e.address.as_ref()?.address.as_ref()? {
                        address::Address::SocketAddress(s) => Some(s.address.clone()),
                        _ => None,
                    },
                    _ => None,
                })
                .collect();
            ips.sort();
            ips
        };
        assert_eq!(
            endpoints("outbound|9080||reviews.default.svc.cluster.local"),
            ["10.244.0.14", "10.244.0.15", "10.244.0.16"]
        );
        assert_eq!(
            endpoints("outbound|9080|v2|reviews.default.svc.cluster.local"),
            ["10.244.0.15"]
        );
        assert!(endpoints("outbound|9080|v2|details.default.svc.cluster.local").is_empty());
        // Routes: the reviews VirtualService splits 50/50 between v2 and v3.
        let mut routes = names(&rds);
        routes.sort();
        assert_eq!(routes, ["15010", "15014", "9080"]);
        let (_, any) = rds.resources.iter().find(|(n, _)| n == "9080").unwrap();
        let rc: RouteConfiguration = decode(any);
        let reviews = rc
            .virtual_hosts
            .iter()
            .find(|v| v.name == "reviews.default.svc.cluster.local:9080")
            .expect("the reviews virtual host");
        let Some(route::Action::Route(action)) = &reviews.routes[0].action else {
            panic!("reviews routes")
        };
        let Some(route_action::ClusterSpecifier::WeightedClusters(w)) = &action.cluster_specifier
        else {
            panic!("reviews is split by weight")
        };
        let split: Vec<(String, u32)> = w
            .clusters
            .iter()
            .map(|c| (c.name.clone(), c.weight.map_or(0, |w| w.value)))
            .collect();
        assert_eq!(
            split,
            [
                (
                    "outbound|9080|v2|reviews.default.svc.cluster.local".to_string(),
                    50
                ),
                (
                    "outbound|9080|v3|reviews.default.svc.cluster.local".to_string(),
                    50
                )
            ]
        );
    }
}

#[test]
fn delta_and_state_of_the_world_recorded_the_same_resources() {
    for file in ["cds", "eds", "lds", "rds"] {
        let sotw = response(Stream::Sotw, &recorded(Stream::Sotw, file));
        let delta = response(Stream::Delta, &recorded(Stream::Delta, file));
        let by_name: BTreeMap<_, _> = delta.resources.into_iter().collect();
        assert_eq!(by_name.len(), sotw.resources.len(), "{file}");
        for (name, any) in &sotw.resources {
            assert_eq!(by_name.get(name), Some(any), "{file} {name}");
        }
    }
}

/// What the recording holds of Istio-only extensions, by type, from a walk of the typed
/// messages; the same counts over both streams.
#[test]
fn the_recording_holds_istio_only_extensions() {
    for stream in Stream::BOTH {
        let lds = response(stream, &recorded(stream, "lds"));
        let cds = response(stream, &recorded(stream, "cds"));
        let istio = |found: Vec<Extension>| {
            count_by_type(
                &found
                    .into_iter()
                    .filter(|(_, _, t)| ISTIO_ONLY.contains(&t.as_str()))
                    .collect::<Vec<_>>(),
            )
        };
        let expect = |pairs: &[(&str, usize)]| -> BTreeMap<String, usize> {
            pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect()
        };
        assert_eq!(
            istio(extensions("lds", &lds.resources)),
            expect(&[
                (ALPN_OVERRIDE, 3),
                (PEER_METADATA, 5),
                (ISTIO_STATS, 15),
                (TCP_METADATA_EXCHANGE, 4),
            ]),
            "{stream:?} LDS"
        );
        assert_eq!(
            istio(extensions("cds", &cds.resources)),
            expect(&[(TCP_METADATA_EXCHANGE, 20)]),
            "{stream:?} CDS"
        );
        for file in ["lds", "cds"] {
            let found = istio_only_strings(&recorded(stream, file));
            assert_eq!(
                found.len(),
                if file == "lds" { 8 } else { 3 },
                "{stream:?} {file}: {found:?}"
            );
        }
    }
}

#[test]
fn adaptation_maps_every_istio_filter_onto_the_module_and_keeps_every_resource() {
    for stream in Stream::BOTH {
        for file in ["lds", "cds"] {
            let before = response(stream, &recorded(stream, file));
            let (bytes, found) = adapted(stream, file);
            let after = response(stream, &bytes);
            // Each Istio filter the recording holds is reported, in that resource: the
            // listeners' mapped onto the module, the clusters' (the exchange's cluster filter,
            // which a module cannot be) removed.
            let mut expected: Vec<Extension> = extensions(file, &before.resources)
                .into_iter()
                .filter(|(_, _, t)| ISTIO_ONLY.contains(&t.as_str()))
                .collect();
            let listed = |f: &[xds_adapt::Finding]| -> Vec<Extension> {
                let mut v: Vec<Extension> = f
                    .iter()
                    .map(|f| (f.resource.clone(), f.filter.clone(), f.type_name.clone()))
                    .collect();
                v.sort();
                v
            };
            expected.sort();
            let (mapped, removed) = (listed(&found.mapped), listed(&found.removed));
            if file == "lds" {
                assert_eq!(mapped, expected, "{stream:?} {file}");
                assert!(removed.is_empty(), "{stream:?} {file}: {removed:?}");
            } else {
                assert_eq!(removed, expected, "{stream:?} {file}");
                assert!(mapped.is_empty(), "{stream:?} {file}: {mapped:?}");
            }
            assert!(
                found.refused.is_empty() && found.invalid.is_empty(),
                "{stream:?} {file}: {:?} {:?}",
                found.refused,
                found.invalid
            );
            assert!(
                found.unknown.is_empty(),
                "{stream:?} {file}: {:?}",
                found.unknown
            );
            // istiod's own configs carry nothing the module does not apply.
            assert!(
                found.settings_lost.is_empty(),
                "{stream:?} {file}: {:?}",
                found.settings_lost
            );
            // No extension of a type upstream Envoy lacks is left, and no Any names Istio's
            // binary configs.
            let left: Vec<_> = extensions(file, &after.resources)
                .into_iter()
                .filter(|(_, _, t)| {
                    !t.starts_with("envoy.") || t.starts_with("envoy.tcp.metadataexchange")
                })
                .collect();
            assert!(left.is_empty(), "{stream:?} {file}: {left:?}");
            for t in [ISTIO_STATS, ALPN_OVERRIDE] {
                let url = format!("type.googleapis.com/{t}");
                assert!(
                    !bytes.windows(url.len()).any(|w| w == url.as_bytes()),
                    "{stream:?} {file}: {url}"
                );
            }
            // Every resource is kept, in order, under its name; nothing is removed in Delta.
            assert_eq!(names(&after), names(&before), "{stream:?} {file}");
            assert!(
                after.removed.is_empty(),
                "{stream:?} {file}: {:?}",
                after.removed
            );
            assert_eq!(
                (after.type_url, after.nonce),
                (before.type_url, before.nonce)
            );
            // Adapted once is enough.
            assert_eq!(
                xds_adapt::adapt(stream.delta(), &bytes).unwrap(),
                Adapted::Unchanged,
                "{stream:?} {file}"
            );
        }
    }
}

#[test]
fn endpoints_and_routes_pass_untouched() {
    for stream in Stream::BOTH {
        for file in ["eds", "rds"] {
            assert_eq!(
                xds_adapt::adapt(stream.delta(), &recorded(stream, file)).unwrap(),
                Adapted::Unchanged,
                "{stream:?} {file}"
            );
        }
    }
}

/// A string Value of a Struct.
fn struct_string(s: &Struct, key: &str) -> Option<String> {
    match &s.fields.get(key)?.kind {
        Some(value::Kind::StringValue(v)) => Some(v.clone()),
        _ => None,
    }
}

/// What the module is to read of a recorded cluster, worked out from its typed message:
/// `istio.services[0]` and the HTTP protocol its options say.
fn expected_module_metadata(c: &Cluster) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let service = c
        .metadata
        .as_ref()
        .and_then(|m| m.filter_metadata.get("istio"))
        .and_then(|istio| match &istio.fields.get("services")?.kind {
            Some(value::Kind::ListValue(l)) => match &l.values.first()?.kind {
                Some(value::Kind::StructValue(s)) => Some(s.clone()),
                _ => None,
            },
            _ => None,
        });
    // Only a cluster with istiod's services is told anything.
    let s = service?;
    let field = |k: &str| struct_string(&s, k).unwrap_or_default();
    out.insert(
        module_cluster::SERVICE.to_string(),
        format!("{};{};{}", field("host"), field("name"), field("namespace")),
    );
    if let Some(any) = c
        .typed_extension_protocol_options
        .get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions")
    {
        use http_protocol_options::UpstreamProtocolOptions as P;
        use http_protocol_options::explicit_http_config::ProtocolConfig;
        let o: HttpProtocolOptions = decode(any);
        let protocol = match o.upstream_protocol_options {
            Some(P::ExplicitHttpConfig(e)) => match e.protocol_config {
                Some(ProtocolConfig::Http2ProtocolOptions(_)) => Some("HTTP2"),
                _ => None,
            },
            Some(P::UseDownstreamProtocolConfig(_)) => Some("downstream"),
            Some(P::AutoConfig(_)) => Some("HTTP2"),
            None => None,
        };
        if let Some(p) = protocol {
            out.insert(module_cluster::UPSTREAM_PROTOCOL.to_string(), p.to_string());
        }
    }
    (!out.is_empty()).then_some(out)
}

#[test]
fn clusters_keep_mtls_and_the_peer_exchange_alpn_and_tell_the_module_their_service() {
    for stream in Stream::BOTH {
        let before = response(stream, &recorded(stream, "cds"));
        let (bytes, found) = adapted(stream, "cds");
        let after = response(stream, &bytes);
        let mut told = Vec::new();
        for ((name, was), (_, is)) in before.resources.iter().zip(&after.resources) {
            let was: Cluster = decode(was);
            let is: Cluster = decode(is);
            // The module's metadata as worked out from the recording; istiod's `istio`
            // metadata as it was.
            let module: Option<BTreeMap<String, String>> = is.metadata.as_ref().and_then(|m| {
                let s = m.filter_metadata.get(module_cluster::NAMESPACE)?;
                Some(
                    s.fields
                        .keys()
                        .map(|k| (k.clone(), struct_string(s, k).expect("a string")))
                        .collect(),
                )
            });
            assert_eq!(module, expected_module_metadata(&was), "{stream:?} {name}");
            if module.is_some() {
                told.push(name.clone());
            }
            assert_eq!(
                is.metadata
                    .as_ref()
                    .and_then(|m| m.filter_metadata.get("istio")),
                was.metadata
                    .as_ref()
                    .and_then(|m| m.filter_metadata.get("istio")),
                "{stream:?} {name}"
            );
            // Nothing else changes but the exchange's cluster filter.
            let (mut was, mut is) = (was, is);
            was.filters.clear();
            was.metadata = None;
            is.metadata = None;
            assert_eq!(is, was, "{stream:?} {name}");
        }
        assert_eq!(found.cluster_metadata_added, told, "{stream:?}");
        // The 19 outbound clusters and inbound|9080|| (the services istiod names for them); not
        // the passthrough clusters nor BlackHoleCluster, which name no service.
        assert_eq!(told.len(), 20, "{stream:?}: {told:?}");
        for special in [
            "BlackHoleCluster",
            "PassthroughCluster",
            "InboundPassthroughCluster",
        ] {
            assert!(!told.contains(&special.to_string()), "{special}");
        }
        for (service, _) in SERVICES {
            let host = format!("{service}.default.svc.cluster.local");
            let name = format!("outbound|9080||{host}");
            let (_, any) = after.resources.iter().find(|(n, _)| *n == name).unwrap();
            let c: Cluster = decode(any);
            assert!(matches!(
                c.cluster_discovery_type,
                Some(cluster::ClusterDiscoveryType::Type(t)) if t == cluster::DiscoveryType::Eds as i32
            ));
            assert!(c.filters.is_empty(), "{name}: {:?}", c.filters);
            let module = &c.metadata.as_ref().unwrap().filter_metadata[module_cluster::NAMESPACE];
            assert_eq!(
                struct_string(module, module_cluster::SERVICE).as_deref(),
                Some(format!("{host};{service};default").as_str()),
                "{name}"
            );
            assert_eq!(module.fields.len(), 1, "{name}: HTTP/1.1 says no protocol");
            let tls = c
                .transport_socket_matches
                .iter()
                .find(|m| m.name == "tlsMode-istio")
                .and_then(|m| m.transport_socket.as_ref())
                .and_then(|t| t.config_type.as_ref())
                .map(|TlsConfig::TypedConfig(a)| a)
                .expect("the mTLS transport socket match");
            let ctx: UpstreamTlsContext = decode(tls);
            let common = ctx.common_tls_context.unwrap();
            assert_eq!(
                common.alpn_protocols,
                [PEER_EXCHANGE_ALPN, "istio"],
                "{name}"
            );
            assert_eq!(
                ctx.sni,
                format!("outbound_.9080_._.{service}.default.svc.cluster.local")
            );
            assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
        }
        let module_of = |name: &str| -> Struct {
            let (_, any) = after.resources.iter().find(|(n, _)| n == name).unwrap();
            let c: Cluster = decode(any);
            c.metadata.unwrap().filter_metadata[module_cluster::NAMESPACE].clone()
        };
        let istiod = module_of("outbound|15010||istiod.istio-system.svc.cluster.local");
        assert_eq!(
            struct_string(&istiod, module_cluster::UPSTREAM_PROTOCOL).as_deref(),
            Some("HTTP2")
        );
        assert_eq!(
            struct_string(&module_of("inbound|9080||"), module_cluster::SERVICE).as_deref(),
            Some("productpage.default.svc.cluster.local;productpage;default")
        );
    }
}

/// The module's filter name and config of a module filter's typed config.
fn module_filter(any: &Any) -> Option<(String, Any)> {
    if any.type_url == module_filters::HTTP_TYPE {
        let m: DynamicModuleFilter = decode(any);
        let loaded = m.dynamic_module_config.expect("the module's config");
        assert_eq!(loaded.name, module::NAME);
        return Some((m.filter_name, m.filter_config.expect("the filter's config")));
    }
    if any.type_url == module_filters::NETWORK_TYPE {
        let m: DynamicModuleNetworkFilter = decode(any);
        let loaded = m.dynamic_module_config.expect("the module's config");
        assert_eq!(loaded.name, module::NAME);
        return Some((m.filter_name, m.filter_config.expect("the filter's config")));
    }
    None
}

/// The JSON the module is handed: a StringValue's, or a Struct's.
fn module_json(config: &Any) -> serde_json::Value {
    match type_name(&config.type_url) {
        "google.protobuf.StringValue" => {
            serde_json::from_str(&decode::<StringValue>(config).value).expect("JSON")
        }
        // Envoy hands the module a Struct's JSON (a TypedStruct would reach it as protobuf).
        "google.protobuf.Struct" => struct_json(&decode::<Struct>(config)),
        other => panic!("a module config of type {other}"),
    }
}

/// A Struct as JSON (as Envoy hands a TypedStruct's to the module).
fn struct_json(s: &Struct) -> serde_json::Value {
    fn value_json(v: &envoy_types::pb::google::protobuf::Value) -> serde_json::Value {
        match &v.kind {
            None | Some(value::Kind::NullValue(_)) => serde_json::Value::Null,
            Some(value::Kind::NumberValue(n)) => serde_json::json!(n),
            Some(value::Kind::StringValue(s)) => s.clone().into(),
            Some(value::Kind::BoolValue(b)) => (*b).into(),
            Some(value::Kind::StructValue(s)) => struct_json(s),
            Some(value::Kind::ListValue(l)) => l.values.iter().map(value_json).collect(),
        }
    }
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

/// Every Istio filter of the listener (named `istio.*`), HTTP or network, with what the module
/// reads of it: (listener, chain, filter name, module filter name, config JSON).
fn module_filters_of(l: &Listener) -> Vec<(String, String, String, String, serde_json::Value)> {
    let mut out = Vec::new();
    let mut one = |chain: &str, name: &str, any: &Any| {
        if !name.starts_with("istio.") {
            return;
        }
        let (module_name, config) = module_filter(any).unwrap_or_else(|| {
            panic!(
                "{} {chain} {name}: not the module's: {}",
                l.name, any.type_url
            )
        });
        out.push((
            l.name.clone(),
            chain.to_string(),
            name.to_string(),
            module_name,
            module_json(&config),
        ));
    };
    for c in chains(l) {
        for f in &c.filters {
            let any = typed(f).expect("a typed filter");
            one(&c.name, &f.name, any);
            if type_name(&any.type_url) == HCM {
                let hcm: HttpConnectionManager = decode(any);
                for h in &hcm.http_filters {
                    if let Some(http_filter::ConfigType::TypedConfig(a)) = &h.config_type {
                        one(&c.name, &h.name, a);
                    }
                }
            }
        }
    }
    out
}

#[test]
fn listeners_keep_routes_and_rbac_and_run_istios_filters_in_the_module() {
    for stream in Stream::BOTH {
        let before = response(stream, &recorded(stream, "lds"));
        let (bytes, found) = adapted(stream, "lds");
        let after = response(stream, &bytes);
        let listener = |r: &Response, name: &str| -> Listener {
            decode(&r.resources.iter().find(|(n, _)| n == name).unwrap().1)
        };

        // The outbound HTTP listener keeps its route and every filter in its place, Istio's
        // run by the module.
        let outbound = listener(&after, "0.0.0.0_9080");
        let hcm: HttpConnectionManager =
            decode(typed(&outbound.filter_chains[0].filters[0]).unwrap());
        let http: Vec<(&str, String)> = hcm
            .http_filters
            .iter()
            .map(|f| {
                let Some(http_filter::ConfigType::TypedConfig(a)) = &f.config_type else {
                    panic!("{}: untyped", f.name)
                };
                let kind =
                    module_filter(a).map_or_else(|| type_name(&a.type_url).to_string(), |(n, _)| n);
                (f.name.as_str(), kind)
            })
            .collect();
        assert_eq!(
            http,
            [
                (
                    "istio.metadata_exchange",
                    "istio.metadata_exchange".to_string()
                ),
                (
                    "envoy.filters.http.grpc_stats",
                    "envoy.extensions.filters.http.grpc_stats.v3.FilterConfig".to_string()
                ),
                ("istio.alpn", "istio.alpn".to_string()),
                (
                    "envoy.filters.http.fault",
                    "envoy.extensions.filters.http.fault.v3.HTTPFault".to_string()
                ),
                (
                    "envoy.filters.http.cors",
                    "envoy.extensions.filters.http.cors.v3.Cors".to_string()
                ),
                ("istio.stats", "istio.stats".to_string()),
                (
                    "envoy.filters.http.router",
                    "envoy.extensions.filters.http.router.v3.Router".to_string()
                ),
            ]
        );
        assert!(
            matches!(&hcm.route_specifier, Some(RouteSpecifier::Rds(r)) if r.route_config_name == "9080")
        );

        // Every Istio filter: the module's filter of its name, with a config the module's own
        // types read as istiod meant it, reporting for the listener's side.
        let mut seen = BTreeMap::<String, usize>::new();
        for (_, any) in &after.resources {
            let l: Listener = decode(any);
            let inbound = l.traffic_direction == 1;
            for (listener_name, chain, name, module_name, json) in module_filters_of(&l) {
                let at = format!("{stream:?} {listener_name} {chain} {name}");
                *seen.entry(module_name.clone()).or_default() += 1;
                match module_name.as_str() {
                    module::filter::METADATA_EXCHANGE if name == module_name => {
                        if json.get("protocol").is_some() {
                            let c: module::TcpExchange = serde_json::from_value(json).expect(&at);
                            assert_eq!(c, module::TcpExchange::istio(), "{at}");
                            assert!(inbound, "{at}");
                        } else {
                            let c: module::PeerMetadata = serde_json::from_value(json).expect(&at);
                            let want = if inbound {
                                module::PeerMetadata::server()
                            } else {
                                module::PeerMetadata::client()
                            };
                            assert_eq!(c, want, "{at}");
                        }
                    }
                    module::filter::METADATA_EXCHANGE_UPSTREAM if name == module_name => {
                        let c: module::TcpExchange = serde_json::from_value(json).expect(&at);
                        assert_eq!(c, module::TcpExchange::istio(), "{at}");
                        assert!(!inbound, "{at}");
                    }
                    module::filter::ALPN if name == module_name => {
                        let c: module::Alpn = serde_json::from_value(json).expect(&at);
                        assert_eq!(c, module::Alpn::istio(), "{at}");
                    }
                    module::filter::STATS if name == module_name => {
                        let c: module::Stats = serde_json::from_value(json).expect(&at);
                        assert_eq!(
                            c,
                            module::Stats {
                                disable_host_header_fallback: inbound,
                                side: Some(if inbound { "destination" } else { "source" }.into()),
                                ..module::Stats::default()
                            },
                            "{at}"
                        );
                    }
                    other => panic!("{at}: module filter {other}"),
                }
            }
        }
        // 15 stats, 5 HTTP and 4 TCP exchanges, 3 ALPN (the recording's), and the exchange's
        // client side on the 8 outbound chains that end in tcp_proxy.
        let expect: BTreeMap<String, usize> = [
            (module::filter::STATS, 15),
            (module::filter::METADATA_EXCHANGE, 9),
            (module::filter::ALPN, 3),
            (module::filter::METADATA_EXCHANGE_UPSTREAM, 8),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(seen, expect, "{stream:?}");

        // The exchange's client side leads exactly the outbound chains that end in tcp_proxy,
        // as the recording has them.
        let mut want_exchange = Vec::new();
        for (name, any) in &before.resources {
            let l: Listener = decode(any);
            if l.traffic_direction != 2 {
                continue;
            }
            for c in chains(&l) {
                if c.filters
                    .last()
                    .is_some_and(|f| f.name == "envoy.filters.network.tcp_proxy")
                {
                    want_exchange.push(name.clone());
                }
            }
        }
        assert_eq!(found.exchange_added, want_exchange, "{stream:?}");
        for (_, any) in &after.resources {
            let l: Listener = decode(any);
            for c in chains(&l) {
                let names: Vec<&str> = c.filters.iter().map(|f| f.name.as_str()).collect();
                let has = names.contains(&module::filter::METADATA_EXCHANGE_UPSTREAM);
                if has {
                    // Just before tcp_proxy, after the metrics.
                    assert_eq!(
                        names[names.len() - 2..],
                        [
                            module::filter::METADATA_EXCHANGE_UPSTREAM,
                            "envoy.filters.network.tcp_proxy"
                        ],
                        "{}",
                        l.name
                    );
                }
            }
        }

        // The inbound listener: the same chains; RBAC as istiod wrote it, byte for byte.
        let inbound_before = listener(&before, "virtualInbound");
        let inbound = listener(&after, "virtualInbound");
        let chain_names = |l: &Listener| {
            l.filter_chains
                .iter()
                .map(|c| c.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(chain_names(&inbound), chain_names(&inbound_before));
        assert_eq!(
            chain_names(&inbound),
            [
                "virtualInbound-blackhole",
                "virtualInbound-catchall-http",
                "virtualInbound",
                "0.0.0.0_9080"
            ]
        );
        let rbac = |l: &Listener| -> Vec<Any> {
            let mut out = Vec::new();
            for c in &l.filter_chains {
                for f in &c.filters {
                    let any = typed(f).unwrap();
                    if type_name(&any.type_url) == NETWORK_RBAC {
                        out.push(any.clone());
                    }
                    if type_name(&any.type_url) == HCM {
                        let hcm: HttpConnectionManager = decode(any);
                        for h in hcm.http_filters {
                            if let Some(http_filter::ConfigType::TypedConfig(a)) = h.config_type
                                && type_name(&a.type_url) == HTTP_RBAC
                            {
                                out.push(a);
                            }
                        }
                    }
                }
            }
            out
        };
        let rbac_after = rbac(&inbound);
        assert_eq!(rbac_after, rbac(&inbound_before));
        assert_eq!(
            rbac_after.len(),
            6,
            "2 network RBAC (TCP chain), 2 HTTP RBAC in each of the 2 HTTP chains"
        );
        assert!(
            found.principals_rewritten.is_empty(),
            "1.31 matches authenticated principals already"
        );
        // The ALLOW policy names the gateway's identity as an authenticated principal.
        let allowed: Vec<String> = rbac_after
            .iter()
            .filter(|a| type_name(&a.type_url) == HTTP_RBAC)
            .filter_map(|a| decode::<HttpRbac>(a).rules)
            .flat_map(|r| r.policies.into_values())
            .flat_map(|p| p.principals)
            .flat_map(|p| principal_names(&p))
            .collect();
        assert!(
            allowed.contains(&GATEWAY_PRINCIPAL.to_string()),
            "{allowed:?}"
        );
        let network_deny = rbac_after
            .iter()
            .filter(|a| type_name(&a.type_url) == NETWORK_RBAC)
            .filter_map(|a| decode::<NetworkRbac>(a).rules)
            .any(|r| {
                r.policies
                    .contains_key("ns[default]-policy[deny-legacy]-rule[0]")
            });
        assert!(network_deny);

        // TLS as istiod wrote it: the inbound TCP chain still offers istio-peer-exchange.
        for (c, was) in inbound
            .filter_chains
            .iter()
            .zip(&inbound_before.filter_chains)
        {
            assert_eq!(c.transport_socket, was.transport_socket, "{}", c.name);
        }
        let tcp = inbound
            .filter_chains
            .iter()
            .find(|c| c.name == "virtualInbound")
            .unwrap();
        let Some(TlsConfig::TypedConfig(a)) = tcp
            .transport_socket
            .as_ref()
            .and_then(|t| t.config_type.as_ref())
        else {
            panic!("the TCP chain's TLS")
        };
        let ctx: DownstreamTlsContext = decode(a);
        assert_eq!(
            ctx.common_tls_context.unwrap().alpn_protocols,
            [PEER_EXCHANGE_ALPN, "h2", "http/1.1"]
        );

        // No access logger was added: connection managers and tcp_proxy log as istiod said
        // (here, not at all).
        for (_, any) in &after.resources {
            let l: Listener = decode(any);
            for c in chains(&l) {
                for f in &c.filters {
                    let a = typed(f).unwrap();
                    match type_name(&a.type_url) {
                        HCM => assert!(
                            decode::<HttpConnectionManager>(a).access_log.is_empty(),
                            "{}",
                            l.name
                        ),
                        TCP_PROXY => {
                            let t: TcpProxy = decode(a);
                            assert!(t.access_log.is_empty() && t.access_log_options.is_none());
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

/// The principal names of an RBAC principal, through and/or/not.
fn principal_names(p: &envoy_types::pb::envoy::config::rbac::v3::Principal) -> Vec<String> {
    use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
    match &p.identifier {
        Some(principal::Identifier::AndIds(s) | principal::Identifier::OrIds(s)) => {
            s.ids.iter().flat_map(principal_names).collect()
        }
        Some(principal::Identifier::NotId(p)) => principal_names(p),
        Some(principal::Identifier::Authenticated(a)) => match a
            .principal_name
            .as_ref()
            .and_then(|m| m.match_pattern.as_ref())
        {
            Some(MatchPattern::Exact(s)) => vec![s.clone()],
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// A bootstrap with the agent's own static clusters and ADS (as it renders for this pod) and the
/// given listeners and clusters as static resources: `-c` the resources as a binary Bootstrap,
/// `--config-yaml` the agent's bootstrap, which Envoy merges into it.
fn envoy_validate(
    envoy: &Path,
    tag: &str,
    listeners: Vec<Listener>,
    clusters: Vec<Cluster>,
) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("xds-adapt-replay-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let resources = Bootstrap {
        static_resources: Some(StaticResources {
            listeners,
            clusters,
            ..Default::default()
        }),
        ..Default::default()
    };
    let pb = dir.join("resources.pb");
    std::fs::write(&pb, resources.encode_to_vec()).expect("write the resources");
    let base = pilot_agent::bootstrap::render(&support::sidecar_config(
        "default.svc.cluster.local",
        &[
            ("POD_NAME", "productpage-v1-b9879c6d-k9tff"),
            ("POD_NAMESPACE", "default"),
            ("INSTANCE_IP", "10.244.0.11"),
            ("SERVICE_ACCOUNT", "bookinfo-productpage"),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ],
        Default::default(),
    ));
    let out = std::process::Command::new(envoy)
        .args(["--mode", "validate", "--log-level", "warning", "-c"])
        .arg(&pb)
        .arg("--config-yaml")
        .arg(base.to_string())
        .env(module::SEARCH_PATH_ENV, module_dir())
        .output()
        .expect("run envoy");
    let _ = std::fs::remove_dir_all(&dir);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Where the proxy module was built (`target/debug` or its `deps`, beside this test): Envoy
/// loads it to validate the module's filters, each of which parses its config.
fn module_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.ancestors()
        .skip(1)
        .take(2)
        .find(|d| d.join(module::LIBRARY).exists())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| {
            panic!(
                "{} not found beside {}: build the proxy module first (cargo build -p istio-module)",
                module::LIBRARY,
                exe.display()
            )
        })
}

fn typed_resources<M: Message + Default>(stream: Stream, msg: &[u8]) -> Vec<M> {
    response(stream, msg)
        .resources
        .iter()
        .map(|(_, a)| decode(a))
        .collect()
}

#[test]
fn envoy_accepts_the_adapted_listeners_and_clusters_and_rejects_the_recorded_ones() {
    let Some(envoy) = support::envoy() else {
        return;
    };
    for stream in Stream::BOTH {
        let listeners = typed_resources::<Listener>(stream, &adapted(stream, "lds").0);
        let clusters = typed_resources::<Cluster>(stream, &adapted(stream, "cds").0);
        let (nl, nc) = (listeners.len(), clusters.len());
        assert_eq!((nl, nc), (8, 23));
        if let Err(e) = envoy_validate(&envoy, "adapted", listeners, clusters) {
            panic!("{stream:?}: envoy --mode validate refused the adapted config:\n{e}");
        }
    }
    // As istiod sent them, upstream Envoy cannot load them.
    let stream = Stream::Sotw;
    let listeners = typed_resources::<Listener>(stream, &recorded(stream, "lds"));
    let clusters = typed_resources::<Cluster>(stream, &recorded(stream, "cds"));
    let err = envoy_validate(&envoy, "recorded", listeners, clusters)
        .expect_err("Envoy refuses Istio-only extensions");
    assert!(
        err.contains("Didn't find a registered implementation"),
        "{err}"
    );
}
