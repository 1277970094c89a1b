//! xDS responses as they go on the wire, sharing the snapshot's generated resources.
//!
//! A generated resource (`Arc<Any>`) is shared by the snapshot's cache and by every proxy's
//! response that carries it; nothing is copied until the stream is ready to write. `chunks`
//! then encodes the response a piece at a time (about `CHUNK` bytes each), so a queued push
//! costs a pointer per resource and a stream being written holds one piece, however large the
//! response. The encoding is the one prost gives `DiscoveryResponse` / `DeltaDiscoveryResponse`
//! (fields in ascending order), which the tests check byte for byte.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use prost::encoding::{self, WireType};

/// Target size of one piece of an encoded response.
pub const CHUNK: usize = 64 * 1024;

/// Field numbers shared by `DiscoveryResponse` and `DeltaDiscoveryResponse`.
const VERSION: u32 = 1;
const RESOURCES: u32 = 2;
const TYPE_URL: u32 = 4;
const NONCE: u32 = 5;
const REMOVED: u32 = 6;
/// `DiscoveryResponse.control_plane` (state of the world; its `identifier` is field 1).
const CONTROL_PLANE: u32 = 6;
/// `Resource` (Delta): version 1, resource 2, name 3.
const RESOURCE_VERSION: u32 = 1;
const RESOURCE_ANY: u32 = 2;
const RESOURCE_NAME: u32 = 3;

/// A DiscoveryResponse or DeltaDiscoveryResponse whose resources are shared, not copied.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Fields before the resources (the version).
    head: Bytes,
    /// The resources, each encoded as field 2 (of the response, or for Delta of its
    /// `Resource` wrapper).
    resources: Vec<Arc<Any>>,
    /// Delta only, one per resource: the wrapper's key, length, version and name.
    prefixes: Vec<Bytes>,
    /// Fields after the resources (type URL, nonce and, for Delta, the removed names).
    tail: Bytes,
    len: usize,
}

/// A singular string field (proto3: left out when empty).
fn string_field(tag: u32, value: &str, buf: &mut BytesMut) {
    if !value.is_empty() {
        put_string(tag, value, buf);
    }
}

fn put_string(tag: u32, value: &str, buf: &mut BytesMut) {
    encoding::encode_key(tag, WireType::LengthDelimited, buf);
    encoding::encode_varint(value.len() as u64, buf);
    buf.put_slice(value.as_bytes());
}

fn string_len(tag: u32, value: &str) -> usize {
    if value.is_empty() {
        0
    } else {
        encoding::key_len(tag) + encoding::encoded_len_varint(value.len() as u64) + value.len()
    }
}

impl Outgoing {
    fn new(head: Bytes, resources: Vec<Arc<Any>>, prefixes: Vec<Bytes>, tail: Bytes) -> Self {
        let len = head.len()
            + tail.len()
            + prefixes.iter().map(Bytes::len).sum::<usize>()
            + resources
                .iter()
                .map(|any| encoding::message::encoded_len(RESOURCES, &**any))
                .sum::<usize>();
        Outgoing {
            head,
            resources,
            prefixes,
            tail,
            len,
        }
    }

    /// A state-of-the-world `DiscoveryResponse`.
    pub fn sotw(version: &str, type_url: &str, nonce: &str, resources: Vec<Arc<Any>>) -> Self {
        let mut head = BytesMut::new();
        string_field(VERSION, version, &mut head);
        let mut tail = BytesMut::new();
        string_field(TYPE_URL, type_url, &mut tail);
        string_field(NONCE, nonce, &mut tail);
        Outgoing::new(head.freeze(), resources, Vec::new(), tail.freeze())
    }

    /// This state-of-the-world response with `control_plane.identifier` set (what istiod
    /// puts on its debug responses).
    pub fn with_control_plane(mut self, identifier: &str) -> Self {
        let mut inner = BytesMut::new();
        string_field(1, identifier, &mut inner);
        let mut tail = BytesMut::from(&self.tail[..]);
        encoding::encode_key(CONTROL_PLANE, WireType::LengthDelimited, &mut tail);
        encoding::encode_varint(inner.len() as u64, &mut tail);
        tail.extend_from_slice(&inner);
        self.len += tail.len() - self.tail.len();
        self.tail = tail.freeze();
        self
    }

    /// A `DeltaDiscoveryResponse`; `resources` are (name, version, resource).
    pub fn delta(
        version: &str,
        type_url: &str,
        nonce: &str,
        resources: Vec<(String, String, Arc<Any>)>,
        removed: &[impl AsRef<str>],
    ) -> Self {
        let mut head = BytesMut::new();
        string_field(VERSION, version, &mut head);
        let (prefixes, resources) = resources
            .into_iter()
            .map(|(name, version, any)| {
                let body = string_len(RESOURCE_VERSION, &version)
                    + encoding::message::encoded_len(RESOURCE_ANY, &*any)
                    + string_len(RESOURCE_NAME, &name);
                let mut prefix = BytesMut::new();
                encoding::encode_key(RESOURCES, WireType::LengthDelimited, &mut prefix);
                encoding::encode_varint(body as u64, &mut prefix);
                string_field(RESOURCE_VERSION, &version, &mut prefix);
                // The name (field 3) follows the resource (field 2) in prost's order; it is
                // written here, before it, which any protobuf reader accepts, so that the
                // shared resource can end the item.
                string_field(RESOURCE_NAME, &name, &mut prefix);
                (prefix.freeze(), any)
            })
            .unzip();
        let mut tail = BytesMut::new();
        string_field(TYPE_URL, type_url, &mut tail);
        string_field(NONCE, nonce, &mut tail);
        for name in removed {
            // Repeated: an empty element is still an element.
            put_string(REMOVED, name.as_ref(), &mut tail);
        }
        Outgoing::new(head.freeze(), resources, prefixes, tail.freeze())
    }

    /// Size of the encoded message.
    pub fn encoded_len(&self) -> usize {
        self.len
    }

    /// Number of resources carried.
    pub fn resource_count(&self) -> usize {
        self.resources.len()
    }

    /// The encoded message in pieces of about `chunk` bytes (one resource larger than that is
    /// one piece), preceded by the 5-byte gRPC message header when `grpc_frame`. Each piece is
    /// encoded only when the iterator is advanced.
    pub fn chunks(self, grpc_frame: bool, chunk: usize) -> Chunks {
        let mut first = BytesMut::new();
        if grpc_frame {
            first.extend_from_slice(&mesh_common::grpc::frame_header(self.len));
        }
        first.extend_from_slice(&self.head);
        Chunks {
            chunk: chunk.max(1),
            first: Some(first),
            resources: self.resources.into_iter(),
            prefixes: self.prefixes.into_iter(),
            tail: Some(self.tail),
        }
    }

    /// The whole encoded message in one buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(self.len);
        for piece in self.clone().chunks(false, usize::MAX) {
            buf.extend_from_slice(&piece);
        }
        buf.freeze()
    }

    /// The message decoded as `M` (for in-process consumers and tests).
    pub fn decode<M: Message + Default>(&self) -> Result<M, prost::DecodeError> {
        M::decode(self.to_bytes())
    }
}

/// Iterator of `Outgoing::chunks`: each resource is encoded, and our share of it released,
/// only when its piece is taken.
pub struct Chunks {
    chunk: usize,
    /// The gRPC header and the leading fields, until the first piece is taken.
    first: Option<BytesMut>,
    resources: std::vec::IntoIter<Arc<Any>>,
    prefixes: std::vec::IntoIter<Bytes>,
    /// The trailing fields, until the last piece is taken.
    tail: Option<Bytes>,
}

impl Iterator for Chunks {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let tail = self.tail.as_ref()?;
        let first = self.first.take().unwrap_or_default();
        // This piece's resources: as many as fit in `chunk`, and at least one.
        let prefixes = self.prefixes.as_slice();
        let mut size = first.len();
        let mut count = 0;
        for (i, any) in self.resources.as_slice().iter().enumerate() {
            let len = prefixes.get(i).map_or(0, Bytes::len)
                + encoding::message::encoded_len(RESOURCES, &**any);
            if count > 0 && size + len > self.chunk {
                break;
            }
            size += len;
            count += 1;
        }
        let last = count == self.resources.len();
        if last {
            size += tail.len();
        }
        let mut buf = BytesMut::with_capacity(size);
        buf.extend_from_slice(&first);
        for any in self.resources.by_ref().take(count) {
            if let Some(prefix) = self.prefixes.next() {
                buf.extend_from_slice(&prefix);
            }
            encoding::message::encode(RESOURCES, &*any, &mut buf);
        }
        if last {
            buf.extend_from_slice(tail);
            self.tail = None;
        }
        Some(buf.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, Resource,
    };

    fn any(i: usize, size: usize) -> Arc<Any> {
        Arc::new(Any {
            type_url: format!("type.googleapis.com/t{i}"),
            value: vec![u8::try_from(i % 251).unwrap_or(0); size],
        })
    }

    fn joined(out: Outgoing, grpc: bool, chunk: usize) -> (Vec<u8>, usize) {
        let mut all = Vec::new();
        let mut pieces = 0;
        for piece in out.chunks(grpc, chunk) {
            all.extend_from_slice(&piece);
            pieces += 1;
        }
        (all, pieces)
    }

    #[test]
    fn sotw_is_prost_encoding_in_any_chunking() {
        let resources: Vec<Arc<Any>> = (0..50).map(|i| any(i, i * 97)).collect();
        let expected = DiscoveryResponse {
            version_info: "2026-11-22T18:00:00Z/7".into(),
            resources: resources.iter().map(|a| (**a).clone()).collect(),
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            nonce: "v-9".into(),
            ..Default::default()
        };
        let out = Outgoing::sotw(
            &expected.version_info,
            &expected.type_url,
            &expected.nonce,
            resources,
        );
        assert_eq!(out.encoded_len(), expected.encoded_len());
        assert_eq!(out.resource_count(), 50);
        assert_eq!(out.to_bytes(), expected.encode_to_vec());
        for chunk in [1, 100, 4096, usize::MAX] {
            let (bytes, pieces) = joined(out.clone(), false, chunk);
            assert_eq!(bytes, expected.encode_to_vec(), "chunk {chunk}");
            if chunk == 4096 {
                assert!(
                    pieces > 10,
                    "a 120 kB response comes in pieces, got {pieces}"
                );
            }
        }
        // Pieces stay within the target when every resource is smaller than it (the last
        // one may carry the trailing fields too).
        let sizes: Vec<usize> = out.clone().chunks(true, 10_000).map(|p| p.len()).collect();
        assert!(sizes.len() > 5);
        assert!(sizes.iter().all(|&n| n <= 10_000 + 100), "{sizes:?}");
        // With the gRPC header: flag 0 and the big-endian length, then the message.
        let (framed, _) = joined(out, true, 1000);
        assert_eq!(framed[0], 0);
        let len = u32::from_be_bytes([framed[1], framed[2], framed[3], framed[4]]) as usize;
        assert_eq!(len, framed.len() - 5);
        assert_eq!(
            DiscoveryResponse::decode(&framed[5..]).unwrap_or_default(),
            expected
        );
    }

    #[test]
    fn empty_sotw_and_delta_decode() {
        let out = Outgoing::sotw("", "t", "", Vec::new());
        let (bytes, pieces) = joined(out, false, CHUNK);
        assert_eq!(pieces, 1);
        assert_eq!(
            DiscoveryResponse::decode(bytes.as_slice()).unwrap_or_default(),
            DiscoveryResponse {
                type_url: "t".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn delta_decodes_to_the_same_message() {
        let resources: Vec<(String, String, Arc<Any>)> = (0..20)
            .map(|i| (format!("name-{i}"), format!("{i:016x}"), any(i, 300)))
            .collect();
        let removed = vec!["gone-a".to_string(), "gone-b".to_string()];
        let expected = DeltaDiscoveryResponse {
            system_version_info: "v3".into(),
            resources: resources
                .iter()
                .map(|(name, version, any)| Resource {
                    name: name.clone(),
                    version: version.clone(),
                    resource: Some((**any).clone()),
                    ..Default::default()
                })
                .collect(),
            type_url: "type.googleapis.com/x".into(),
            removed_resources: removed.clone(),
            nonce: "n-1".into(),
            ..Default::default()
        };
        let out = Outgoing::delta("v3", &expected.type_url, "n-1", resources, &removed);
        assert_eq!(out.encoded_len(), expected.encoded_len());
        for chunk in [1, 777, CHUNK] {
            let (bytes, _) = joined(out.clone(), false, chunk);
            assert_eq!(bytes.len(), expected.encoded_len());
            assert_eq!(
                DeltaDiscoveryResponse::decode(bytes.as_slice()).unwrap_or_default(),
                expected,
                "chunk {chunk}"
            );
        }
    }
}
