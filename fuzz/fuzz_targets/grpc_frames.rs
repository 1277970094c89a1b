//! gRPC message framing (`mesh_common::grpc::FrameDecoder`) and xDS response encoding
//! (`istiod_core::wire::Outgoing`).
//!
//! The decoder, fed the stream in pieces of any size, yields the same messages as one reading
//! of the whole stream, and stops at the first refused header. Each message that decodes as a
//! `DiscoveryRequest` has its names echoed in an `Outgoing` response, whose encoding must equal
//! prost's encoding of the same `DiscoveryResponse` / `DeltaDiscoveryResponse`.
//!
//! Input: one byte (the piece size, 0: all at once), then the stream.
#![no_main]

use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use istiod_core::wire::Outgoing;
use libfuzzer_sys::fuzz_target;
use mesh_common::grpc::{FRAME_HEADER_LEN, FrameDecoder, FrameError};
use prost::Message;

const MAX: usize = 64 * 1024;

/// The stream read in one go, by the protocol's definition.
fn reference(mut stream: &[u8]) -> (Vec<Bytes>, Option<FrameError>) {
    let mut out = Vec::new();
    while stream.len() >= FRAME_HEADER_LEN {
        let len = u32::from_be_bytes([stream[1], stream[2], stream[3], stream[4]]) as usize;
        if stream[0] != 0 {
            return (out, Some(FrameError::Compressed(stream[0])));
        }
        if len > MAX {
            return (out, Some(FrameError::TooLarge { len, max: MAX }));
        }
        let Some(body) = stream.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
            break;
        };
        out.push(Bytes::copy_from_slice(body));
        stream = &stream[FRAME_HEADER_LEN + len..];
    }
    (out, None)
}

fn echo(req: &DiscoveryRequest) {
    let resources: Vec<Any> = req
        .resource_names
        .iter()
        .map(|n| Any {
            type_url: req.type_url.clone(),
            value: n.as_bytes().to_vec(),
        })
        .collect();
    let shared: Vec<Arc<Any>> = resources.iter().cloned().map(Arc::new).collect();
    let sotw = Outgoing::sotw(
        &req.version_info,
        &req.type_url,
        &req.response_nonce,
        shared,
    );
    let want = DiscoveryResponse {
        version_info: req.version_info.clone(),
        resources: resources.clone(),
        type_url: req.type_url.clone(),
        nonce: req.response_nonce.clone(),
        ..Default::default()
    };
    assert_eq!(sotw.encoded_len(), want.encoded_len());
    assert_eq!(&sotw.to_bytes()[..], &want.encode_to_vec()[..]);
    let framed: Vec<u8> = sotw.chunks(true, 7).flat_map(|c| c.to_vec()).collect();
    assert_eq!(framed.len(), FRAME_HEADER_LEN + want.encoded_len());

    let named: Vec<(String, String, Arc<Any>)> = req
        .resource_names
        .iter()
        .zip(&resources)
        .map(|(n, a)| (n.clone(), req.version_info.clone(), Arc::new(a.clone())))
        .collect();
    let delta = Outgoing::delta(
        &req.version_info,
        &req.type_url,
        &req.response_nonce,
        named,
        &req.resource_names,
    );
    let want = DeltaDiscoveryResponse {
        system_version_info: req.version_info.clone(),
        resources: req
            .resource_names
            .iter()
            .zip(&resources)
            .map(|(n, a)| Resource {
                name: n.clone(),
                version: req.version_info.clone(),
                resource: Some(a.clone()),
                ..Default::default()
            })
            .collect(),
        type_url: req.type_url.clone(),
        nonce: req.response_nonce.clone(),
        removed_resources: req.resource_names.clone(),
        ..Default::default()
    };
    // The name is written before the resource (wire.rs says why), so compare decoded.
    assert_eq!(delta.encoded_len(), want.encoded_len());
    let got = DeltaDiscoveryResponse::decode(delta.to_bytes()).expect("our encoding decodes");
    assert_eq!(got, want);
}

fuzz_target!(|data: &[u8]| {
    let Some((&piece, stream)) = data.split_first() else {
        return;
    };
    let piece = if piece == 0 {
        stream.len().max(1)
    } else {
        usize::from(piece)
    };
    let (want, want_err) = reference(stream);
    let mut decoder = FrameDecoder::new(MAX);
    let mut got = Vec::new();
    let mut err = None;
    'feed: for chunk in stream.chunks(piece) {
        decoder.extend(chunk);
        loop {
            match decoder.next_message() {
                Ok(Some(m)) => got.push(m),
                Ok(None) => break,
                Err(e) => {
                    err = Some(e);
                    break 'feed;
                }
            }
        }
    }
    assert_eq!(got, want);
    assert_eq!(err, want_err);
    for message in &got {
        if let Ok(req) = DiscoveryRequest::decode(message.clone()) {
            echo(&req);
        }
    }
});
