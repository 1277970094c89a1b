//! A control plane stand-in for readiness tests: serves state-of-the-world ADS on the given
//! address, accepting clusters (an empty set) but sending a listener Envoy must reject.
//!   bad-ads 127.0.0.1:15010

use std::pin::Pin;

use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::util::pack_any;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

struct BadAds;

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for BadAds {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let out = request.into_inner().filter_map(|req| async move {
            let req = req.ok()?;
            if !req.response_nonce.is_empty() {
                if let Some(e) = &req.error_detail {
                    println!("NACK {} {}", req.type_url, e.message);
                }
                return None;
            }
            // A listener without an address: Envoy must reject the whole LDS update.
            let resources = if req.type_url == LISTENER {
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
    println!("serving");
    tonic::transport::Server::builder()
        .add_service(AggregatedDiscoveryServiceServer::new(BadAds))
        .serve(addr)
        .await?;
    Ok(())
}
