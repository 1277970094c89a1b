//! A control plane stand-in that replays recorded Envoy config dumps (`/config_dump` output of
//! an istiod-fed sidecar, JSON or YAML): the dumps' dynamic listeners (active), clusters (active
//! and warming) and route configurations are served as LDS, CDS and RDS exactly as recorded,
//! Istio-only extension configs included, over Delta and state-of-the-world ADS.
//!
//!   fixture-ads --listen 127.0.0.1:15010 --dump FILE [--dump FILE]...
//!       [--endpoints 'CLUSTER=IP:PORT[,IP:PORT]']... [--cluster CLUSTER]...
//!
//! Test scaffolding, never taken from the dumps and logged as such: EDS answers with the
//! `--endpoints` given (no labels, so a cluster's `tlsMode: istio` transport socket match does not
//! apply and the endpoint is plaintext), an empty assignment for other clusters; `--cluster`
//! adds a plain EDS cluster a dump refers to but did not record; a route configuration a
//! listener asks for that no dump recorded is answered empty, so the listener can warm.
//!
//! Prints `serving` once up, `ACK <type>` and `NACK <type> <message>` for Envoy's answers.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, address, config_source, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::{Any, Duration};
use envoy_types::util::pack_any;
use futures::Stream;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One recorded resource (a JSON object with its `@type`) encoded as the Any istiod sent. The
/// encoding is checked by decoding it back to JSON: it must give the recorded JSON again (no
/// field unknown to the descriptors, none lost).
fn encode(pool: &DescriptorPool, json: &serde_json::Value) -> Result<Any, Error> {
    let any = pool
        .get_message_by_name("google.protobuf.Any")
        .ok_or("google.protobuf.Any is not in the descriptor set")?;
    let name = json.get("name").and_then(|n| n.as_str()).unwrap_or("?");
    let msg = DynamicMessage::deserialize(any.clone(), json)
        .map_err(|e| format!("resource {name}: {e}"))?;
    let bytes = msg.encode_to_vec();
    let back = DynamicMessage::decode(any, bytes.as_slice())?.serialize_with_options(
        serde_json::value::Serializer,
        &SerializeOptions::new().use_proto_field_name(true),
    )?;
    if let Some(at) = first_difference(json, &back, String::new()) {
        return Err(format!("resource {name}: encoding does not round-trip at {at}").into());
    }
    Ok(Any::decode(bytes.as_slice())?)
}

/// Where two JSON values first differ (numbers compared by value), as a path.
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(v), Some(w)) => first_difference(v, w, format!("{at}/{k}")),
                _ => Some(format!("{at}/{k}")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (v, w))| first_difference(v, w, format!("{at}/{i}"))),
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(at),
    }
}

/// The resources of each type, by name.
#[derive(Default)]
struct Resources {
    by_type: HashMap<&'static str, BTreeMap<String, Any>>,
    /// Cluster name → endpoint addresses.
    endpoints: BTreeMap<String, Vec<SocketAddr>>,
}

impl Resources {
    fn add(&mut self, type_url: &'static str, name: String, any: Any) {
        self.by_type.entry(type_url).or_default().insert(name, any);
    }

    /// The dynamic resources of one `/config_dump` file.
    fn load_dump(&mut self, pool: &DescriptorPool, path: &str) -> Result<(), Error> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let dump: serde_json::Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(_) => serde_yaml_ng::from_str(&text).map_err(|e| format!("{path}: {e}"))?,
        };
        let configs = dump["configs"]
            .as_array()
            .ok_or_else(|| format!("{path}: no `configs` list (not an Envoy config dump?)"))?;
        let field = |config: &serde_json::Value, list: &str, inner: &[&str]| -> Vec<_> {
            config[list]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|entry| inner.iter().try_fold(entry, |v, key| v.get(key)).cloned())
                .collect()
        };
        for config in configs {
            let kind = config["@type"].as_str().unwrap_or_default();
            let (type_url, found) = match kind.rsplit('.').next().unwrap_or_default() {
                "ListenersConfigDump" => (
                    LISTENER,
                    field(config, "dynamic_listeners", &["active_state", "listener"]),
                ),
                "ClustersConfigDump" => {
                    let mut all = field(config, "dynamic_active_clusters", &["cluster"]);
                    all.extend(field(config, "dynamic_warming_clusters", &["cluster"]));
                    (CLUSTER, all)
                }
                "RoutesConfigDump" => (
                    ROUTE,
                    field(config, "dynamic_route_configs", &["route_config"]),
                ),
                _ => continue,
            };
            println!("loaded {} {type_url} from {path}", found.len());
            for json in found {
                let name = json["name"].as_str().unwrap_or_default().to_string();
                let any = encode(pool, &json)?;
                self.add(type_url, name, any);
            }
        }
        Ok(())
    }

    /// What answers a request for `names` of `type_url` (all of it for a wildcard type).
    fn answer(&self, type_url: &str, names: &BTreeSet<String>) -> Vec<(String, Any)> {
        let recorded = self.by_type.get(type_url);
        if type_url == LISTENER || type_url == CLUSTER {
            return recorded
                .into_iter()
                .flatten()
                .map(|(n, a)| (n.clone(), a.clone()))
                .collect();
        }
        names
            .iter()
            .map(|name| {
                let any = match recorded.and_then(|r| r.get(name)) {
                    Some(any) => any.clone(),
                    None if type_url == ROUTE => {
                        println!("scaffolding: empty route configuration {name}");
                        pack_any(RouteConfiguration {
                            name: name.clone(),
                            ..Default::default()
                        })
                    }
                    None => pack_any(self.assignment(name)),
                };
                (name.clone(), any)
            })
            .collect()
    }

    fn assignment(&self, cluster: &str) -> ClusterLoadAssignment {
        let lb_endpoints = self
            .endpoints
            .get(cluster)
            .into_iter()
            .flatten()
            .map(|addr| LbEndpoint {
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(envoy_types::pb::envoy::config::core::v3::Address {
                        address: Some(address::Address::SocketAddress(
                            envoy_types::pb::envoy::config::core::v3::SocketAddress {
                                address: addr.ip().to_string(),
                                port_specifier: Some(socket_address::PortSpecifier::PortValue(
                                    u32::from(addr.port()),
                                )),
                                ..Default::default()
                            },
                        )),
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            })
            .collect();
        ClusterLoadAssignment {
            cluster_name: cluster.to_string(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints,
                ..Default::default()
            }],
            ..Default::default()
        }
    }
}

/// A plain EDS cluster over ADS, for a cluster a dump refers to but did not record.
fn scaffold_cluster(name: &str) -> Cluster {
    Cluster {
        name: name.to_string(),
        // As istiod names every cluster's stats (`util.DelimitedStatsPrefix`): `NAME;`.
        alt_stat_name: format!("{name};"),
        connect_timeout: Some(Duration {
            seconds: 5,
            nanos: 0,
        }),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: Some(ConfigSource {
                config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
                    AggregatedConfigSource {},
                )),
                resource_api_version: ApiVersion::V3 as i32,
                ..Default::default()
            }),
            service_name: name.to_string(),
        }),
        ..Default::default()
    }
}

fn report(type_url: &str, nonce: &str, error: Option<&str>) {
    if nonce.is_empty() {
        return;
    }
    match error {
        Some(message) => println!("NACK {type_url} {message}"),
        None => println!("ACK {type_url}"),
    }
}

struct FixtureAds {
    resources: Arc<Resources>,
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for FixtureAds {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut requests = request.into_inner();
        let resources = self.resources.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            // What each type was last answered with: a request asking for the same is an ACK.
            let mut sent: HashMap<String, BTreeSet<String>> = HashMap::new();
            let mut nonce = 0u64;
            while let Ok(Some(req)) = requests.message().await {
                let error = req.error_detail.as_ref().map(|e| e.message.as_str());
                report(&req.type_url, &req.response_nonce, error);
                let names: BTreeSet<String> = req.resource_names.iter().cloned().collect();
                if error.is_some() || sent.get(&req.type_url) == Some(&names) {
                    continue;
                }
                sent.insert(req.type_url.clone(), names.clone());
                nonce += 1;
                let response = DiscoveryResponse {
                    version_info: nonce.to_string(),
                    resources: resources
                        .answer(&req.type_url, &names)
                        .into_iter()
                        .map(|(_, any)| any)
                        .collect(),
                    type_url: req.type_url,
                    nonce: nonce.to_string(),
                    ..Default::default()
                };
                if tx.send(Ok(response)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let mut requests = request.into_inner();
        let resources = self.resources.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            // The names each type has been sent; wildcard types are sent once, whole.
            let mut sent: HashMap<String, BTreeSet<String>> = HashMap::new();
            let mut nonce = 0u64;
            while let Ok(Some(req)) = requests.message().await {
                let error = req.error_detail.as_ref().map(|e| e.message.as_str());
                report(&req.type_url, &req.response_nonce, error);
                let first = !sent.contains_key(&req.type_url);
                let have = sent.entry(req.type_url.clone()).or_default();
                let wanted: BTreeSet<String> = req
                    .resource_names_subscribe
                    .iter()
                    .filter(|n| !have.contains(*n))
                    .cloned()
                    .collect();
                let wildcard = req.type_url == LISTENER || req.type_url == CLUSTER;
                if (wildcard && !first) || (!wildcard && wanted.is_empty()) {
                    continue;
                }
                let answer = resources.answer(&req.type_url, &wanted);
                have.extend(answer.iter().map(|(n, _)| n.clone()));
                nonce += 1;
                let response = DeltaDiscoveryResponse {
                    system_version_info: nonce.to_string(),
                    resources: answer
                        .into_iter()
                        .map(|(name, any)| Resource {
                            name,
                            version: "1".into(),
                            resource: Some(any),
                            ..Default::default()
                        })
                        .collect(),
                    type_url: req.type_url,
                    nonce: nonce.to_string(),
                    ..Default::default()
                };
                if tx.send(Ok(response)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

fn usage(why: &str) -> Error {
    format!(
        "{why}\nusage: fixture-ads --listen ADDR --dump FILE [--dump FILE]... \
         [--endpoints CLUSTER=IP:PORT[,IP:PORT]]... [--cluster CLUSTER]..."
    )
    .into()
}

fn parse_args(pool: &DescriptorPool) -> Result<(SocketAddr, Resources), Error> {
    let mut listen = None;
    let mut resources = Resources::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| usage(&format!("{flag} needs a value")))?;
        match flag.as_str() {
            "--listen" => {
                listen = Some(
                    value
                        .parse()
                        .map_err(|e| usage(&format!("--listen {value}: {e}")))?,
                );
            }
            "--dump" => resources.load_dump(pool, &value)?,
            "--endpoints" => {
                let (cluster, addrs) = value.rsplit_once('=').ok_or_else(|| {
                    usage(&format!("--endpoints {value}: expected CLUSTER=IP:PORT"))
                })?;
                let addrs = addrs
                    .split(',')
                    .map(|a| a.parse::<SocketAddr>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| usage(&format!("--endpoints {value}: {e}")))?;
                resources.endpoints.insert(cluster.to_string(), addrs);
            }
            "--cluster" => {
                println!("scaffolding: cluster {value}");
                resources.add(CLUSTER, value.clone(), pack_any(scaffold_cluster(&value)));
            }
            _ => return Err(usage(&format!("unknown flag {flag}"))),
        }
    }
    let listen = listen.ok_or_else(|| usage("--listen is required"))?;
    Ok((listen, resources))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let pool = harness::xds_descriptors::descriptor_pool()?;
    let (listen, resources) = parse_args(&pool)?;
    let server = AggregatedDiscoveryServiceServer::new(FixtureAds {
        resources: Arc::new(resources),
    })
    .max_decoding_message_size(64 << 20)
    .max_encoding_message_size(64 << 20);
    let incoming = tokio::net::TcpListener::bind(listen).await?;
    println!("serving");
    tonic::transport::Server::builder()
        .add_service(server)
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(incoming))
        .await?;
    Ok(())
}
