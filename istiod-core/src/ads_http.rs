//! The ADS gRPC service with our own response framing.
//!
//! tonic's response encoder writes every message of a stream into one buffer that it keeps and
//! reuses, so each long-lived xDS stream holds a buffer as large as the largest message it ever
//! sent (about 1 MB per proxy for a 1000-service CDS; heaptrack put most of `istiod-core
//! serve`'s memory there). Here each response is encoded once into its own exactly-sized
//! frame, which is freed when it has been written; requests are decoded from their own frames
//! too, and the receive buffer is let go whenever it empties (tonic's decoder likewise kept a
//! buffer as large as the largest request, such as an EDS subscription to every cluster).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use futures::{Stream, StreamExt};
use http_body::Frame;
use mesh_common::grpc::{ADS_DELTA_PATH, ADS_SERVICE, ADS_SOTW_PATH, FrameDecoder, FrameError};
use prost::Message;
use tonic::Status;
use tonic::server::NamedService;

use crate::autoregister::Caller;
use crate::wire::{self, Outgoing};
use crate::xds_server::{MAX_REQUEST_BYTES, Requests, XdsServer};

/// `AggregatedDiscoveryService` over HTTP/2, for `tonic::transport::Server::add_service`.
#[derive(Clone)]
pub struct AdsHttp {
    pub server: XdsServer,
    /// Identifies a stream that shows no client certificate by its bearer token (istiod
    /// authenticates xDS callers by their JWT the same way); `None`: certificates only.
    pub token_auth: Option<std::sync::Arc<dyn crate::ca_server::Authenticator>>,
}

impl NamedService for AdsHttp {
    const NAME: &'static str = ADS_SERVICE;
}

fn trailers(status: &Status) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    map
}

/// The status a refused request frame ends its stream with.
fn refused(e: FrameError) -> Status {
    match e {
        FrameError::Compressed(_) => {
            Status::unimplemented("compressed xDS requests are not accepted")
        }
        FrameError::TooLarge { len, max } => Status::resource_exhausted(format!(
            "xDS request of {len} bytes is over the {max}-byte limit"
        )),
    }
}

/// The requests of one stream, decoded from gRPC frames (uncompressed; Envoy does not compress).
fn requests<M: Message + Default + 'static>(
    body: tonic::body::Body,
) -> impl Stream<Item = Result<M, Status>> + Send + 'static {
    let frames = http_body_util::BodyStream::new(body);
    futures::stream::unfold(
        (frames, FrameDecoder::new(MAX_REQUEST_BYTES), false),
        |(mut frames, mut decoder, failed)| async move {
            if failed {
                return None;
            }
            loop {
                match decoder.next_message() {
                    Ok(Some(msg)) => {
                        return Some(match M::decode(msg) {
                            Ok(m) => (Ok(m), (frames, decoder, false)),
                            Err(e) => (
                                Err(Status::invalid_argument(format!(
                                    "undecodable xDS request: {e}"
                                ))),
                                (frames, decoder, true),
                            ),
                        });
                    }
                    Ok(None) => {}
                    Err(e) => return Some((Err(refused(e)), (frames, decoder, true))),
                }
                match frames.next().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            decoder.extend(&data);
                        }
                    }
                    Some(Err(e)) => {
                        return Some((
                            Err(Status::unavailable(format!("request stream: {e}"))),
                            (frames, decoder, true),
                        ));
                    }
                    None => return None,
                }
            }
        },
    )
}

/// The response body: each message in pieces of about `wire::CHUNK` bytes, each encoded only
/// when the connection asks for more, then the trailers with the stream's status.
fn body<S>(responses: S) -> tonic::body::Body
where
    S: Stream<Item = Result<Outgoing, Status>> + Send + 'static,
{
    let frames = responses
        .flat_map(|item| match item {
            Ok(out) => futures::stream::iter(out.chunks(true, wire::CHUNK))
                .map(|piece| Some(Ok(piece)))
                .left_stream(),
            Err(status) => futures::stream::once(async { Some(Err(status)) }).right_stream(),
        })
        .chain(futures::stream::once(async { None }))
        .scan(false, |done, item| {
            let out = match (*done, item) {
                (true, _) => None,
                (false, Some(Ok(piece))) => Some(Frame::data(piece)),
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

/// The peer of a request: the identity of its mesh client certificate, when the TLS layer
/// verified one.
fn caller<B>(req: &http::Request<B>) -> Caller {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    Caller::peer(
        req.extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|info| info.peer_certs()),
    )
}

/// Whether the request came over a TLS connection.
fn over_tls<B>(req: &http::Request<B>) -> bool {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    req.extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .is_some()
}

/// The token of `authorization: Bearer TOKEN`.
fn bearer_token<B>(req: &http::Request<B>) -> Option<String> {
    let value = req
        .headers()
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))?;
    Some(token.trim().to_string())
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
        let token_auth = self.token_auth.clone();
        Box::pin(async move {
            let path = req.uri().path().to_string();
            let mut caller = caller(&req);
            // A token counts only over TLS: sent in the clear it proves nothing (it could be
            // anyone's replay), so a plaintext stream stays unverified and gets no Secrets.
            if let (Caller::Peer(None), Some(auth)) = (&caller, &token_auth)
                && over_tls(&req)
                && let Some(token) = bearer_token(&req)
            {
                match auth.identify(&token).await {
                    Ok(identity) => caller = Caller::Peer(Some(identity)),
                    // Not verified: the stream stays one of an unknown peer.
                    Err(e) => tracing::debug!(error = %e, "xDS bearer token not verified"),
                }
            }
            let remote = crate::transport::remote_addr(&req);
            let body = req.into_body();
            let requests = match path.as_str() {
                ADS_SOTW_PATH => Requests::Sotw(Box::pin(requests::<DiscoveryRequest>(body))),
                ADS_DELTA_PATH => {
                    Requests::Delta(Box::pin(requests::<DeltaDiscoveryRequest>(body)))
                }
                _ => return Ok(Status::unimplemented(format!("no method {path}")).into_http()),
            };
            Ok(grpc_response(self::body(
                server.open_from(requests, caller, remote),
            )))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use mesh_common::grpc::frame_header;

    /// One gRPC message frame: compression flag 0, big-endian length, the message.
    fn frame<M: Message>(msg: &M) -> Bytes {
        let mut buf = BytesMut::from(&frame_header(msg.encoded_len())[..]);
        buf.extend_from_slice(&msg.encode_to_vec());
        buf.freeze()
    }

    fn body(chunks: Vec<Bytes>) -> tonic::body::Body {
        let frames = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, Infallible>(Frame::data(c))),
        );
        tonic::body::Body::new(http_body_util::StreamBody::new(frames))
    }

    fn request(names: usize) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: "t".into(),
            resource_names: (0..names).map(|i| format!("cluster-{i}")).collect(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn requests_split_across_frames_decode_and_limits_hold() {
        // Two messages, cut at awkward places (inside the header, inside the body).
        let a = frame(&request(3));
        let b = frame(&request(500));
        let mut all = BytesMut::new();
        all.extend_from_slice(&a);
        all.extend_from_slice(&b);
        let all = all.freeze();
        let cuts = [2, a.len() + 7, all.len()];
        let mut chunks = Vec::new();
        let mut at = 0;
        for c in cuts {
            chunks.push(all.slice(at..c));
            at = c;
        }
        let got: Vec<DiscoveryRequest> = requests::<DiscoveryRequest>(body(chunks))
            .map(|r| r.unwrap())
            .collect()
            .await;
        assert_eq!(got, vec![request(3), request(500)]);

        // A length over the limit is refused before anything is buffered for it.
        let huge = Bytes::copy_from_slice(&frame_header(MAX_REQUEST_BYTES + 1));
        let got: Vec<_> = requests::<DiscoveryRequest>(body(vec![huge]))
            .collect()
            .await;
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].as_ref().unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );

        // Compressed messages are refused with a reason.
        let mut compressed = BytesMut::from(&a[..]);
        compressed[0] = 1;
        let got: Vec<_> = requests::<DiscoveryRequest>(body(vec![compressed.freeze()]))
            .collect()
            .await;
        assert_eq!(
            got[0].as_ref().unwrap_err().code(),
            tonic::Code::Unimplemented
        );
    }

    /// A response larger than a piece goes out as several data frames that a gRPC reader
    /// joins into the same message the typed stream gives.
    #[tokio::test]
    async fn large_responses_go_out_in_pieces_of_one_message() {
        use envoy_types::pb::envoy::config::core::v3::Node;
        use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
        use tower::Service;

        let dir = tempfile::tempdir().unwrap();
        let mut yaml = String::new();
        for i in 0..2000 {
            yaml.push_str(&format!(
                "---\nkind: ServiceEntry\nmetadata: {{name: s{i}, namespace: n}}\nspec: {{hosts: [s{i}.n.svc.cluster.local], ports: [{{number: 80, name: http}}], endpoints: [{{address: 10.0.{}.{}}}]}}\n",
                i / 256,
                i % 256
            ));
        }
        std::fs::write(dir.path().join("mesh.yaml"), yaml).unwrap();
        let cp = crate::ControlPlane::load(dir.path(), "cluster.local").unwrap();
        let request = DiscoveryRequest {
            node: Some(Node {
                id: "sidecar~10.9.0.1~p.n~n.svc.cluster.local".into(),
                ..Default::default()
            }),
            type_url: crate::resource::CLUSTER_TYPE.into(),
            ..Default::default()
        };

        let mut service = AdsHttp {
            server: cp.xds(),
            token_auth: None,
        };
        let http_request = http::Request::builder()
            .uri(ADS_SOTW_PATH)
            .body(body(vec![frame(&request)]))
            .unwrap();
        let response = service.call(http_request).await.unwrap();
        let mut frames = http_body_util::BodyStream::new(response.into_body());
        let mut data = BytesMut::new();
        let mut pieces = 0;
        let mut status = None;
        while let Some(frame) = frames.next().await {
            let frame = frame.unwrap();
            if frame.is_data() {
                pieces += 1;
                data.extend_from_slice(&frame.into_data().unwrap());
            } else if let Ok(trailers) = frame.into_trailers() {
                status = trailers.get("grpc-status").cloned();
            }
        }
        assert_eq!(status.unwrap(), "0");
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        assert_eq!(data[0], 0);
        assert_eq!(
            len,
            data.len() - 5,
            "one message, as long as its header says"
        );
        assert!(
            len > 3 * wire::CHUNK,
            "the mesh makes a large CDS ({len} bytes)"
        );
        assert!(pieces > 3, "sent in pieces, got {pieces}");
        let got = DiscoveryResponse::decode(&data[5..]).unwrap();

        let typed: Vec<DiscoveryResponse> = cp
            .xds()
            .open(
                Requests::Sotw(Box::pin(futures::stream::iter([Ok(request)]))),
                Caller::InProcess,
            )
            .map(|r| r.unwrap().decode().unwrap())
            .collect()
            .await;
        assert_eq!(typed.len(), 1);
        assert_eq!(got, typed[0]);
        assert_eq!(
            got.resources.len(),
            2003,
            "2000 outbound clusters and 3 of its own"
        );
    }
}
