//! Records what a control plane sends one proxy: connects to an ADS server (plaintext, e.g.
//! istiod's 15010) as the node given, asks as Envoy would (CDS, then EDS for the EDS clusters it
//! got, LDS, then RDS for the route configurations its listeners name), ACKs each answer and
//! writes the first response of each type exactly as it came off the wire, once over state of
//! the world and once over Delta:
//!
//!   record-xds --addr 127.0.0.1:15010 --node NODE.json --out DIR [--timeout-secs 30]
//!
//! NODE.json is an Envoy bootstrap's `node` (proto3 JSON), as a sidecar's pilot-agent writes it
//! into `envoy-rev.json`; `user_agent_name` is set to `envoy` when absent, as Envoy does.
//! Written: DIR/{sotw,delta}/{cds,eds,lds,rds}.pb (the (Delta)DiscoveryResponse bytes) and a
//! `.json` beside each (proto3 JSON, Any resources expanded where the descriptors know the type).
//! Prints one line per response: the stream, the type, how many resources.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use mesh_common::grpc::{ADS_DELTA_PATH, ADS_SOTW_PATH};
use pilot_agent::xds_proxy::RawCodec;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

type Error = Box<dyn std::error::Error + Send + Sync>;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ENDPOINTS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

struct Args {
    addr: String,
    node: PathBuf,
    out: PathBuf,
    timeout: Duration,
}

fn usage(why: &str) -> Error {
    format!(
        "{why}\nusage: record-xds --addr HOST:PORT --node NODE.json --out DIR [--timeout-secs N]"
    )
    .into()
}

fn parse_args() -> Result<Args, Error> {
    let mut args = std::env::args().skip(1);
    let (mut addr, mut node, mut out, mut timeout) = (None, None, None, 30u64);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--addr" => addr = Some(value()?),
            "--node" => node = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--timeout-secs" => {
                let v = value()?;
                timeout = v
                    .parse()
                    .map_err(|_| usage(&format!("--timeout-secs: not a number: {v}")))?;
            }
            _ => return Err(usage(&format!("unknown flag {flag}"))),
        }
    }
    Ok(Args {
        addr: addr.ok_or_else(|| usage("--addr is required"))?,
        node: node.ok_or_else(|| usage("--node is required"))?,
        out: out.ok_or_else(|| usage("--out is required"))?,
        timeout: Duration::from_secs(timeout),
    })
}

/// The bootstrap's node JSON as the Node Envoy sends.
fn load_node(pool: &DescriptorPool, path: &Path) -> Result<Node, Error> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path)?)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let desc = pool
        .get_message_by_name("envoy.config.core.v3.Node")
        .ok_or("envoy.config.core.v3.Node is not in the descriptor set")?;
    let msg = DynamicMessage::deserialize(desc, &json)
        .map_err(|e| format!("{}: not an Envoy node: {e}", path.display()))?;
    let mut node = Node::decode(msg.encode_to_vec().as_slice())?;
    if node.user_agent_name.is_empty() {
        node.user_agent_name = "envoy".into();
    }
    Ok(node)
}

/// One ADS stream, either kind, carrying raw message bytes.
struct Stream {
    delta: bool,
    node: Option<Node>,
    tx: mpsc::Sender<Bytes>,
    rx: Option<tonic::Streaming<Bytes>>,
    timeout: Duration,
    /// The names each type was last asked for (an SotW ACK repeats them).
    asked: Vec<(String, Vec<String>)>,
}

/// What the recorder needs of a response of either kind.
struct Got {
    bytes: Bytes,
    type_url: String,
    nonce: String,
    version: String,
    resources: Vec<Any>,
}

impl Stream {
    /// Opens the stream with a first request for `first` (all of that type): a gRPC server
    /// may send its response headers only with its first message, which it sends only once
    /// asked.
    async fn open(
        addr: &str,
        delta: bool,
        node: Node,
        timeout: Duration,
        first: &str,
    ) -> Result<Self, Error> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(timeout)
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(256 << 20);
        grpc.ready().await?;
        let (tx, requests) = mpsc::channel(16);
        let mut stream = Stream {
            delta,
            node: Some(node),
            tx,
            rx: None,
            timeout,
            asked: Vec::new(),
        };
        stream.ask(first, &[]).await?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(if delta {
            ADS_DELTA_PATH
        } else {
            ADS_SOTW_PATH
        });
        let rx = tokio::time::timeout(
            timeout,
            grpc.streaming(
                tonic::Request::new(ReceiverStream::new(requests)),
                path,
                RawCodec,
            ),
        )
        .await
        .map_err(|_| format!("{addr} did not answer the stream in {timeout:?}"))??;
        stream.rx = Some(rx.into_inner());
        Ok(stream)
    }

    /// Asks for `type_url` (`names`; none: all).
    async fn ask(&mut self, type_url: &str, names: &[String]) -> Result<(), Error> {
        let req = self.request(type_url, names, "", "");
        self.asked.push((type_url.into(), names.to_vec()));
        self.tx.send(req).await?;
        Ok(())
    }

    fn request(&mut self, type_url: &str, names: &[String], nonce: &str, version: &str) -> Bytes {
        // The node goes in the first request only, as Istio's bootstrap asks of Envoy
        // (set_node_on_first_message_only).
        let node = self.node.take();
        Bytes::from(if self.delta {
            DeltaDiscoveryRequest {
                node,
                type_url: type_url.into(),
                // A Delta ACK subscribes to nothing more.
                resource_names_subscribe: if nonce.is_empty() {
                    names.to_vec()
                } else {
                    Vec::new()
                },
                response_nonce: nonce.into(),
                ..Default::default()
            }
            .encode_to_vec()
        } else {
            DiscoveryRequest {
                node,
                version_info: version.into(),
                resource_names: names.to_vec(),
                type_url: type_url.into(),
                response_nonce: nonce.into(),
                ..Default::default()
            }
            .encode_to_vec()
        })
    }

    fn decode(&self, bytes: Bytes) -> Result<Got, Error> {
        Ok(if self.delta {
            let r = DeltaDiscoveryResponse::decode(bytes.clone())?;
            Got {
                bytes,
                type_url: r.type_url,
                nonce: r.nonce,
                version: r.system_version_info,
                resources: r.resources.into_iter().filter_map(|r| r.resource).collect(),
            }
        } else {
            let r = DiscoveryResponse::decode(bytes.clone())?;
            Got {
                bytes,
                type_url: r.type_url,
                nonce: r.nonce,
                version: r.version_info,
                resources: r.resources,
            }
        })
    }

    /// Asks for `type_url` (`names`; none: all) and waits for it (`fetched`).
    async fn fetch(&mut self, type_url: &str, names: &[String]) -> Result<Got, Error> {
        self.ask(type_url, names).await?;
        self.fetched(type_url).await
    }

    /// ACKs every response until one of `type_url` comes, and returns it.
    async fn fetched(&mut self, type_url: &str) -> Result<Got, Error> {
        loop {
            let rx = self.rx.as_mut().ok_or("the stream is not open")?;
            let bytes = tokio::time::timeout(self.timeout, rx.message())
                .await
                .map_err(|_| format!("no {type_url} response in {:?}", self.timeout))??
                .ok_or("the control plane closed the stream")?;
            let got = self.decode(bytes)?;
            let asked = self
                .asked
                .iter()
                .rev()
                .find(|(t, _)| *t == got.type_url)
                .map(|(_, n)| n.clone())
                .unwrap_or_default();
            let ack = self.request(&got.type_url, &asked, &got.nonce, &got.version);
            self.tx.send(ack).await?;
            if got.type_url == type_url {
                return Ok(got);
            }
            eprintln!(
                "record-xds: also got {} ({} resources), ACKed, not recorded",
                got.type_url,
                got.resources.len()
            );
        }
    }
}

/// The EDS service names of the EDS clusters.
fn eds_names(clusters: &[Any]) -> Result<Vec<String>, Error> {
    let mut names = BTreeSet::new();
    for any in clusters {
        let c = Cluster::decode(any.value.as_slice())?;
        let eds = matches!(
            c.cluster_discovery_type,
            Some(cluster::ClusterDiscoveryType::Type(t)) if t == cluster::DiscoveryType::Eds as i32
        );
        if eds {
            let service = c
                .eds_cluster_config
                .map(|e| e.service_name)
                .filter(|s| !s.is_empty());
            names.insert(service.unwrap_or(c.name));
        }
    }
    Ok(names.into_iter().collect())
}

/// The route configurations the listeners' connection managers ask RDS for.
fn rds_names(listeners: &[Any]) -> Result<Vec<String>, Error> {
    let mut names = BTreeSet::new();
    let mut add = |filters: &[Filter]| -> Result<(), Error> {
        for f in filters {
            if let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type
                && any.type_url == HCM
            {
                let hcm = HttpConnectionManager::decode(any.value.as_slice())?;
                if let Some(RouteSpecifier::Rds(rds)) = hcm.route_specifier {
                    names.insert(rds.route_config_name);
                }
            }
        }
        Ok(())
    };
    for any in listeners {
        let l = Listener::decode(any.value.as_slice())?;
        for chain in l.filter_chains.iter().chain(l.default_filter_chain.iter()) {
            add(&chain.filters)?;
        }
    }
    Ok(names.into_iter().collect())
}

/// The response as proto3 JSON (resources expanded as their types).
fn to_json(pool: &DescriptorPool, delta: bool, bytes: &[u8]) -> Result<String, Error> {
    let name = if delta {
        "envoy.service.discovery.v3.DeltaDiscoveryResponse"
    } else {
        "envoy.service.discovery.v3.DiscoveryResponse"
    };
    let desc = pool
        .get_message_by_name(name)
        .ok_or_else(|| format!("{name} is not in the descriptor set"))?;
    let msg = DynamicMessage::decode(desc, bytes)?;
    let value = msg.serialize_with_options(
        serde_json::value::Serializer,
        &SerializeOptions::new().use_proto_field_name(true),
    )?;
    Ok(serde_json::to_string_pretty(&value)? + "\n")
}

async fn record(args: &Args, pool: &DescriptorPool, node: &Node, delta: bool) -> Result<(), Error> {
    let kind = if delta { "delta" } else { "sotw" };
    let dir = args.out.join(kind);
    std::fs::create_dir_all(&dir)?;
    let mut stream = Stream::open(&args.addr, delta, node.clone(), args.timeout, CLUSTER).await?;
    let cds = stream.fetched(CLUSTER).await?;
    let eds = stream.fetch(ENDPOINTS, &eds_names(&cds.resources)?).await?;
    let lds = stream.fetch(LISTENER, &[]).await?;
    let rds = stream.fetch(ROUTE, &rds_names(&lds.resources)?).await?;
    for (file, got) in [("cds", &cds), ("eds", &eds), ("lds", &lds), ("rds", &rds)] {
        std::fs::write(dir.join(format!("{file}.pb")), &got.bytes)?;
        match to_json(pool, delta, &got.bytes) {
            Ok(json) => std::fs::write(dir.join(format!("{file}.json")), json)?,
            Err(e) => eprintln!("record-xds: {kind}/{file}.json not written: {e}"),
        }
        println!(
            "{kind} {file}: {} resources, {} bytes, version {}",
            got.resources.len(),
            got.bytes.len(),
            got.version
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = parse_args()?;
    let pool = harness::xds_descriptors::descriptor_pool()?;
    let node = load_node(&pool, &args.node)?;
    record(&args, &pool, &node, false).await?;
    record(&args, &pool, &node, true).await?;
    Ok(())
}
