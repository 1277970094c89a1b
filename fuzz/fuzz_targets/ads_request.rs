//! ADS request streams (`istiod_core::ads_http::AdsHttp`): a gRPC request body, cut in pieces,
//! served by a control plane loaded with the demo mesh. Every stream must end (all its
//! responses and its trailers come out) with a gRPC status, never a panic; every data frame
//! carries whole, length-prefixed messages that decode as responses of the stream's flavour.
//!
//! Input: one byte (bit 0: Delta, else state of the world; bits 1-7: the piece size, 0: the body
//! in one piece), then the request body (gRPC frames of `DiscoveryRequest` /
//! `DeltaDiscoveryRequest`).
//!
//! `istiod-core/tests/fuzz_seeds.rs` replays the seeds through a copy of this body on stable:
//! keep the two in step.
#![no_main]

use std::convert::Infallible;
use std::sync::{Arc, LazyLock};

use bytes::{Buf, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use futures::StreamExt;
use http_body::Frame;
use istiod_core::ControlPlane;
use istiod_core::ads_http::AdsHttp;
use libfuzzer_sys::fuzz_target;
use mesh_common::grpc::{ADS_DELTA_PATH, ADS_SOTW_PATH};
use prost::Message;
use tower::Service;

struct World {
    runtime: tokio::runtime::Runtime,
    control_plane: Arc<ControlPlane>,
    _dir: tempfile::TempDir,
}

static WORLD: LazyLock<World> = LazyLock::new(|| {
    let dir = tempfile::tempdir().expect("temp dir");
    let mesh = include_str!("../../examples/demo-mesh/mesh.yaml");
    std::fs::write(dir.path().join("mesh.yaml"), mesh).expect("write mesh");
    let control_plane = ControlPlane::load(dir.path(), "cluster.local").expect("demo mesh loads");
    World {
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime"),
        control_plane,
        _dir: dir,
    }
});

fn check_responses<M: Message + Default>(mut data: Bytes) {
    while data.has_remaining() {
        assert!(data.len() >= 5, "a partial gRPC header: {data:?}");
        assert_eq!(data[0], 0, "uncompressed");
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        data.advance(5);
        assert!(data.len() >= len, "a message shorter than its header says");
        M::decode(data.split_to(len)).expect("our response decodes");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let delta = mode & 1 == 1;
    let piece = match usize::from(mode >> 1) {
        0 => body.len().max(1),
        n => n,
    };
    let world = &*WORLD;
    let server = world.control_plane.xds();
    let chunks: Vec<Result<Frame<Bytes>, Infallible>> = body
        .chunks(piece)
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    let request_body = tonic::body::Body::new(http_body_util::StreamBody::new(
        futures::stream::iter(chunks),
    ));
    let request = http::Request::builder()
        .uri(if delta { ADS_DELTA_PATH } else { ADS_SOTW_PATH })
        .body(request_body)
        .expect("request");
    world.runtime.block_on(async {
        let mut service = AdsHttp {
            server,
            token_auth: None,
        };
        let response = service.call(request).await.expect("infallible");
        let mut frames = http_body_util::BodyStream::new(response.into_body());
        let mut data = BytesMut::new();
        let mut status = None;
        while let Some(frame) = frames.next().await {
            let frame = frame.expect("infallible");
            if frame.is_data() {
                assert!(status.is_none(), "data after the trailers");
                data.extend_from_slice(&frame.into_data().expect("data"));
            } else if let Ok(trailers) = frame.into_trailers() {
                status = Some(trailers.get("grpc-status").cloned().expect("grpc-status"));
            }
        }
        assert!(status.is_some(), "the stream ends with its status");
        if delta {
            check_responses::<DeltaDiscoveryResponse>(data.freeze());
        } else {
            check_responses::<DiscoveryResponse>(data.freeze());
        }
    });
});
