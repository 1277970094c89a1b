//! A control plane stand-in for readiness tests: serves state-of-the-world ADS on the given
//! address, accepting clusters (an empty set) but sending a listener Envoy must reject.
//!   bad-ads 127.0.0.1:15010
//! With `good-then-bad`, a working config first: cluster `app` (127.0.0.1:8080) and listener
//! `app-in` (127.0.0.1:18080, TCP proxy to `app`), version 1; once Envoy ACKs that listener
//! (printing `ACK listener 1`), version 2 of `app-in` whose filter config does not decode, which
//! Envoy must NACK while keeping version 1.
//!   bad-ads 127.0.0.1:15010 good-then-bad

use std::pin::Pin;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{Address, SocketAddress, address, socket_address};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

struct BadAds {
    good_then_bad: bool,
}

fn socket(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.into(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// Cluster `app`: the workload on 127.0.0.1:8080.
fn app_cluster() -> Cluster {
    Cluster {
        name: "app".into(),
        connect_timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 1,
            nanos: 0,
        }),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static as i32,
        )),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: "app".into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(socket("127.0.0.1", 8080)),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Listener `app-in` on 127.0.0.1:18080 with `tcp_proxy` as its filter config.
fn app_listener(tcp_proxy: Any) -> Listener {
    Listener {
        name: "app-in".into(),
        address: Some(socket("127.0.0.1", 18080)),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.tcp_proxy".into(),
                config_type: Some(filter::ConfigType::TypedConfig(tcp_proxy)),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn good_tcp_proxy() -> Any {
    pack_any(TcpProxy {
        stat_prefix: "app".into(),
        cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster("app".into())),
        ..Default::default()
    })
}

/// The type of a TCP proxy config, bytes that are not one.
fn broken_tcp_proxy() -> Any {
    Any {
        type_url: good_tcp_proxy().type_url,
        value: vec![0xff, 0xff, 0xff],
    }
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for BadAds {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let good_then_bad = self.good_then_bad;
        let out = request.into_inner().filter_map(move |req| async move {
            let req = req.ok()?;
            if !req.response_nonce.is_empty() {
                if let Some(e) = &req.error_detail {
                    println!("NACK {} {}", req.type_url, e.message);
                    return None;
                }
                if good_then_bad && req.type_url == LISTENER && req.response_nonce == "n1" {
                    println!("ACK listener 1");
                    return Some(Ok(DiscoveryResponse {
                        version_info: "2".into(),
                        resources: vec![pack_any(app_listener(broken_tcp_proxy()))],
                        type_url: req.type_url,
                        nonce: "n2".into(),
                        ..Default::default()
                    }));
                }
                return None;
            }
            let resources = if good_then_bad && req.type_url == LISTENER {
                vec![pack_any(app_listener(good_tcp_proxy()))]
            } else if good_then_bad && req.type_url == CLUSTER {
                vec![pack_any(app_cluster())]
            } else if req.type_url == LISTENER {
                // A listener without an address: Envoy must reject the whole LDS update.
                vec![pack_any(Listener {
                    name: "broken".into(),
                    ..Default::default()
                })]
            } else {
                Vec::new()
            };
            Some(Ok(DiscoveryResponse {
                version_info: "1".into(),
                resources,
                type_url: req.type_url,
                nonce: "n1".into(),
                ..Default::default()
            }))
        });
        Ok(Response::new(Box::pin(out)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:15010".into())
        .parse()?;
    let good_then_bad = std::env::args().nth(2).as_deref() == Some("good-then-bad");
    println!("serving");
    tonic::transport::Server::builder()
        .add_service(AggregatedDiscoveryServiceServer::new(BadAds {
            good_then_bad,
        }))
        .serve(addr)
        .await?;
    Ok(())
}
