//! The proxy module's decoders of what a peer sends (`istio_module::peer`): the HTTP header
//! `x-envoy-peer-metadata` (base64 of a `google.protobuf.Struct`) and the TCP exchange's frame
//! (magic, big-endian length, `Any` of a `Struct`), both Istio's wire formats and both read in
//! Envoy's worker threads, where a panic would take the proxy down.
//!
//! Properties: neither decoder panics; a decoded peer encodes and decodes back to itself (the
//! module re-announces what it read in its filter state); a frame read from any prefix of the
//! stream is "need more" until the whole frame is there and then the same frame, so a peer
//! splitting its bytes across reads cannot change what is read; a frame never claims more bytes
//! than the stream holds.
//!
//! Input: one byte (bit 0: header, else frame), then the header value or the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../module/tests/support/peer_properties.rs"]
mod peer_properties;

fuzz_target!(|data: &[u8]| peer_properties::check(data));
