//! The ADS gRPC service with our own response framing.
//!
//! tonic's response encoder writes every message of a stream into one buffer that it keeps and
//! reuses, so each long-lived xDS stream holds a buffer as large as the largest message it ever
//! sent (about 1 MB per proxy for a 1000-service CDS; heaptrack put most of `istiod-core
//! serve`'s memory there). Here each response is encoded once into its own exactly-sized
//! frame, which is freed when it has been written. Requests are still decoded by tonic.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use futures::{Stream, StreamExt};
use http_body::Frame;
use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Streaming};
use tonic::server::NamedService;

use crate::xds_server::{MAX_REQUEST_BYTES, XdsServer};

const SOTW: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// `AggregatedDiscoveryService` over HTTP/2, for `tonic::transport::Server::add_service`.
#[derive(Clone)]
pub struct AdsHttp {
    pub server: XdsServer,
}

impl NamedService for AdsHttp {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

/// One gRPC message frame: compression flag 0, big-endian length, the message.
fn frame<M: Message>(msg: &M) -> Bytes {
    let len = msg.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // Cannot fail: the buffer has exactly the room the message needs.
    let _ = msg.encode(&mut buf);
    buf.freeze()
}

fn trailers(status: &Status) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    map
}

/// The response body: a frame per message, then the trailers with the stream's status.
fn body<M, S>(responses: S) -> tonic::body::Body
where
    M: Message + 'static,
    S: Stream<Item = Result<M, Status>> + Send + 'static,
{
    let frames = responses
        .map(Some)
        .chain(futures::stream::once(async { None }))
        .scan(false, |done, item| {
            let out = match (*done, item) {
                (true, _) => None,
                (false, Some(Ok(msg))) => Some(Frame::data(frame(&msg))),
                (false, Some(Err(status))) => {
                    *done = true;
                    Some(Frame::trailers(trailers(&status)))
                }
                (false, None) => {
                    *done = true;
                    Some(Frame::trailers(trailers(&Status::ok(""))))
                }
            };
            futures::future::ready(out)
        })
        .map(Ok::<_, Infallible>);
    tonic::body::Body::new(http_body_util::StreamBody::new(frames))
}

fn grpc_response(body: tonic::body::Body) -> http::Response<tonic::body::Body> {
    let mut resp = http::Response::new(body);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    resp
}

impl tower::Service<http::Request<tonic::body::Body>> for AdsHttp {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let server = self.server.clone();
        Box::pin(async move {
            let path = req.uri().path().to_string();
            let body = req.into_body();
            let settings = BufferSettings::default();
            Ok(match path.as_str() {
                SOTW => {
                    let requests = Streaming::<DiscoveryRequest>::new_request(
                        tonic_prost::ProstDecoder::<DiscoveryRequest>::new(settings),
                        body,
                        None,
                        Some(MAX_REQUEST_BYTES),
                    );
                    grpc_response(self::body(server.stream(requests)))
                }
                DELTA => {
                    let requests = Streaming::<DeltaDiscoveryRequest>::new_request(
                        tonic_prost::ProstDecoder::<DeltaDiscoveryRequest>::new(settings),
                        body,
                        None,
                        Some(MAX_REQUEST_BYTES),
                    );
                    grpc_response(self::body(server.delta_stream(requests)))
                }
                _ => Status::unimplemented(format!("no method {path}")).into_http(),
            })
        })
    }
}
