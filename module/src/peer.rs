//! Who is at the other end, in Istio's wire formats (istio/proxy's `metadata_exchange` and
//! `peer_metadata` filters, the `WorkloadMetadataObject`):
//! - the peer's workload as both sides describe it ([`Workload`]), carried as a
//!   `google.protobuf.Struct` keyed by Istio's node-metadata names (`NAME`, `NAMESPACE`,
//!   `WORKLOAD_NAME`, `CLUSTER_ID`, `IDENTITY`, `LABELS`, `OWNER`, `REGION`,
//!   `AVAILABILITY_ZONE`), serialized deterministically (keys in order);
//! - over HTTP in the headers `x-envoy-peer-metadata` (that Struct, base64 with padding) and
//!   `x-envoy-peer-metadata-id` (the node id);
//! - over TCP in one frame at the start of each direction: magic `0x3D230467` and the length,
//!   both big-endian u32, then a `google.protobuf.Any` holding a Struct whose keys are the two
//!   header names (the metadata as a struct, the id as a string).
//!
//! Decoding is of peer input: every length is checked before it is used, and a payload that is
//! not what Istio sends is no peer, never a panic.

use std::collections::BTreeMap;

use base64::Engine as _;
use prost::Message as _;
use prost_types::{Any, Struct, Value, value::Kind};

/// The header carrying the peer's metadata.
pub const METADATA_HEADER: &str = "x-envoy-peer-metadata";
/// The header carrying the peer's node id.
pub const ID_HEADER: &str = "x-envoy-peer-metadata-id";
/// The first four bytes of a TCP metadata frame.
pub const FRAME_MAGIC: u32 = 0x3D23_0467;
/// The frame header: magic and payload length.
pub const FRAME_HEADER_BYTES: usize = 8;
/// The largest payload accepted in a TCP frame or an HTTP header (Istio's node metadata is a
/// few hundred bytes; a peer claiming more is not believed).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// The type URL of the frame's payload.
pub const STRUCT_TYPE_URL: &str = "type.googleapis.com/google.protobuf.Struct";

/// The labels Istio keeps of a workload's labels.
pub const CANONICAL_NAME: &str = "service.istio.io/canonical-name";
pub const CANONICAL_REVISION: &str = "service.istio.io/canonical-revision";

/// The kind of a workload's owner, as Istio's OWNER URL names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkloadType {
    Pod,
    Deployment,
    Job,
    CronJob,
    #[default]
    Unknown,
}

impl WorkloadType {
    pub fn name(self) -> &'static str {
        match self {
            WorkloadType::Pod => "pod",
            WorkloadType::Deployment => "deployment",
            WorkloadType::Job => "job",
            WorkloadType::CronJob => "cronjob",
            WorkloadType::Unknown => "unknown",
        }
    }

    fn parse(s: &str) -> WorkloadType {
        match s {
            "pod" => WorkloadType::Pod,
            "deployment" => WorkloadType::Deployment,
            "job" => WorkloadType::Job,
            "cronjob" => WorkloadType::CronJob,
            _ => WorkloadType::Unknown,
        }
    }
}

/// A workload as Istio's filters describe one side of a request (its `WorkloadMetadataObject`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    /// The instance (the pod's name).
    pub instance: String,
    pub namespace: String,
    pub workload: String,
    pub workload_type: WorkloadType,
    pub cluster: String,
    pub canonical_name: String,
    pub canonical_revision: String,
    pub app: String,
    pub version: String,
    pub identity: String,
    pub region: String,
    pub zone: String,
    /// The labels besides those above that the configuration asks to exchange.
    pub labels: BTreeMap<String, String>,
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

fn get_string<'a>(s: &'a Struct, key: &str) -> &'a str {
    match s.fields.get(key).and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(v)) => v,
        _ => "",
    }
}

impl Workload {
    /// The node metadata of this proxy as Istio's node-metadata keys hold it, reduced to what
    /// is exchanged (the Struct `x-envoy-peer-metadata` carries).
    pub fn to_struct(&self) -> Struct {
        let mut fields = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            if !v.is_empty() {
                fields.insert(k.to_string(), string(v));
            }
        };
        put("NAME", &self.instance);
        put("NAMESPACE", &self.namespace);
        put("WORKLOAD_NAME", &self.workload);
        put("CLUSTER_ID", &self.cluster);
        put("IDENTITY", &self.identity);
        put("REGION", &self.region);
        put("AVAILABILITY_ZONE", &self.zone);
        if self.workload_type != WorkloadType::Unknown && !self.workload.is_empty() {
            let owner = format!(
                "kubernetes://apis/apps/v1/namespaces/{}/{}s/{}",
                self.namespace,
                self.workload_type.name(),
                self.workload
            );
            fields.insert("OWNER".to_string(), string(&owner));
        }
        let mut labels = BTreeMap::new();
        for (k, v) in [
            (CANONICAL_NAME, &self.canonical_name),
            (CANONICAL_REVISION, &self.canonical_revision),
            ("app", &self.app),
            ("version", &self.version),
        ] {
            if !v.is_empty() {
                labels.insert(k.to_string(), string(v));
            }
        }
        for (k, v) in &self.labels {
            labels.insert(k.clone(), string(v));
        }
        fields.insert(
            "LABELS".to_string(),
            Value {
                kind: Some(Kind::StructValue(Struct { fields: labels })),
            },
        );
        Struct { fields }
    }

    /// A peer's Struct as Istio's filters read it: `additional` names the labels kept besides
    /// the canonical ones, `app` and `version`.
    pub fn from_struct(s: &Struct, additional: &[String]) -> Workload {
        let mut w = Workload {
            instance: get_string(s, "NAME").to_string(),
            namespace: get_string(s, "NAMESPACE").to_string(),
            workload: get_string(s, "WORKLOAD_NAME").to_string(),
            cluster: get_string(s, "CLUSTER_ID").to_string(),
            identity: get_string(s, "IDENTITY").to_string(),
            region: get_string(s, "REGION").to_string(),
            zone: get_string(s, "AVAILABILITY_ZONE").to_string(),
            ..Workload::default()
        };
        w.workload_type = owner_type(get_string(s, "OWNER"), &w.workload);
        if let Some(Kind::StructValue(labels)) =
            s.fields.get("LABELS").and_then(|v| v.kind.as_ref())
        {
            let label = |k: &str| get_string(labels, k);
            w.canonical_name = label(CANONICAL_NAME).to_string();
            w.canonical_revision = label(CANONICAL_REVISION).to_string();
            w.app = non_empty(label("app.kubernetes.io/name"), label("app")).to_string();
            w.version = non_empty(label("app.kubernetes.io/version"), label("version")).to_string();
            for k in additional {
                let v = label(k);
                if !v.is_empty() {
                    w.labels.insert(k.clone(), v.to_string());
                }
            }
        }
        w
    }

    /// The value of the header `x-envoy-peer-metadata`.
    pub fn header_value(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.to_struct().encode_to_vec())
    }

    /// A peer's `x-envoy-peer-metadata`, or `None` when it is not base64 of a Struct (padding
    /// may be missing, as Istio's decoder allows).
    pub fn from_header(value: &str, additional: &[String]) -> Option<Workload> {
        if value.len() > MAX_PAYLOAD_BYTES * 4 / 3 + 4 {
            return None;
        }
        let engine = base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        let bytes = engine.decode(value.trim()).ok()?;
        let s = Struct::decode(bytes.as_slice()).ok()?;
        Some(Workload::from_struct(&s, additional))
    }
}

fn non_empty<'a>(a: &'a str, b: &'a str) -> &'a str {
    if a.is_empty() { b } else { a }
}

/// The workload type an OWNER URL names (`.../<type>s/<workload>`), as Istio reads it.
fn owner_type(owner: &str, workload: &str) -> WorkloadType {
    let suffix = format!("s/{workload}");
    let Some(rest) = owner.strip_suffix(&suffix) else {
        return WorkloadType::Unknown;
    };
    WorkloadType::parse(rest.rsplit('/').next().unwrap_or_default())
}

/// The TCP frame carrying `metadata` and the node `id`.
pub fn encode_frame(metadata: &Workload, id: &str) -> Vec<u8> {
    let mut fields = BTreeMap::new();
    fields.insert(
        METADATA_HEADER.to_string(),
        Value {
            kind: Some(Kind::StructValue(metadata.to_struct())),
        },
    );
    if !id.is_empty() {
        fields.insert(ID_HEADER.to_string(), string(id));
    }
    let any = Any {
        type_url: STRUCT_TYPE_URL.to_string(),
        value: Struct { fields }.encode_to_vec(),
    };
    let payload = any.encode_to_vec();
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len());
    out.extend_from_slice(&FRAME_MAGIC.to_be_bytes());
    // A frame's payload is a few hundred bytes: it fits a u32.
    out.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(&payload);
    out
}

/// What the first bytes of a stream say about a TCP metadata frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Not enough bytes yet to tell.
    NeedMore,
    /// Not a frame (another protocol's first bytes, or a payload past the bound): the bytes
    /// pass on untouched.
    NotAFrame,
    /// A frame of `len` bytes; the peer in it, or `None` when its payload is not Istio's.
    Frame {
        len: usize,
        peer: Option<Box<(Workload, String)>>,
    },
}

/// Reads a frame at the start of `buf`.
pub fn decode_frame(buf: &[u8], additional: &[String]) -> Frame {
    let magic = FRAME_MAGIC.to_be_bytes();
    let seen = buf.len().min(magic.len());
    if buf[..seen] != magic[..seen] {
        return Frame::NotAFrame;
    }
    if buf.len() < FRAME_HEADER_BYTES {
        return Frame::NeedMore;
    }
    let mut len = [0u8; 4];
    len.copy_from_slice(&buf[4..8]);
    let payload = u32::from_be_bytes(len) as usize;
    if payload > MAX_PAYLOAD_BYTES {
        return Frame::NotAFrame;
    }
    let Some(body) = buf.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + payload) else {
        return Frame::NeedMore;
    };
    let peer = Any::decode(body)
        .ok()
        .filter(|a| a.type_url == STRUCT_TYPE_URL)
        .and_then(|a| Struct::decode(a.value.as_slice()).ok())
        .and_then(|s| {
            let meta = match s.fields.get(METADATA_HEADER)?.kind.as_ref()? {
                Kind::StructValue(m) => Workload::from_struct(m, additional),
                _ => return None,
            };
            Some(Box::new((meta, get_string(&s, ID_HEADER).to_string())))
        });
    Frame::Frame {
        len: FRAME_HEADER_BYTES + payload,
        peer,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Bookinfo's productpage as Istio's injector describes it (istiod 1.31's recorded node).
    fn productpage() -> Workload {
        Workload {
            instance: "productpage-v1-b9879c6d-f9xbg".into(),
            namespace: "default".into(),
            workload: "productpage-v1".into(),
            workload_type: WorkloadType::Deployment,
            cluster: "Kubernetes".into(),
            canonical_name: "productpage".into(),
            canonical_revision: "v1".into(),
            app: "productpage".into(),
            version: "v1".into(),
            ..Workload::default()
        }
    }

    /// The Struct Istio's filter sends for this node: the nine keys it keeps, in key order,
    /// the owner rebuilt from the workload's type and name.
    #[test]
    fn the_header_holds_istios_struct() {
        let s = productpage().to_struct();
        let keys: Vec<&str> = s.fields.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "CLUSTER_ID",
                "LABELS",
                "NAME",
                "NAMESPACE",
                "OWNER",
                "WORKLOAD_NAME"
            ]
        );
        assert_eq!(
            get_string(&s, "OWNER"),
            "kubernetes://apis/apps/v1/namespaces/default/deployments/productpage-v1"
        );
        let back = Workload::from_header(&productpage().header_value(), &[]).unwrap();
        assert_eq!(back, productpage());
        // Istio's decoder takes the value without its padding too.
        let unpadded = productpage()
            .header_value()
            .trim_end_matches('=')
            .to_string();
        assert_eq!(
            Workload::from_header(&unpadded, &[]).unwrap(),
            productpage()
        );
    }

    /// Protobuf's own encoding of a Struct, built by hand from the wire format (field 1, a map
    /// entry of key 1 and Value 2; a Value's string is field 3): the bytes Istio's filter
    /// decodes. The keys are written in order, so equal metadata is equal bytes.
    #[test]
    fn the_struct_is_protobufs_deterministic_encoding() {
        let w = Workload {
            namespace: "ns".into(),
            ..Workload::default()
        };
        let bytes = w.to_struct().encode_to_vec();
        let entry = |key: &str, value: &[u8]| {
            let mut e = vec![0x0a, key.len() as u8];
            e.extend_from_slice(key.as_bytes());
            e.push(0x12);
            e.push(value.len() as u8);
            e.extend_from_slice(value);
            let mut out = vec![0x0a, e.len() as u8];
            out.extend(e);
            out
        };
        // LABELS: an empty struct value (field 5, length 0); NAMESPACE: string "ns".
        let mut want = entry("LABELS", &[0x2a, 0x00]);
        want.extend(entry("NAMESPACE", &[0x1a, 0x02, b'n', b's']));
        assert_eq!(bytes, want);
    }

    #[test]
    fn app_and_version_fall_back_as_istio_reads_them() {
        let mut s = productpage().to_struct();
        let Some(Kind::StructValue(labels)) = s.fields.get_mut("LABELS").unwrap().kind.as_mut()
        else {
            panic!()
        };
        labels
            .fields
            .insert("app.kubernetes.io/name".into(), string("pp"));
        labels.fields.insert("role".into(), string("front"));
        let w = Workload::from_struct(&s, &["role".to_string()]);
        assert_eq!(w.app, "pp");
        assert_eq!(w.labels.get("role").map(String::as_str), Some("front"));
        assert_eq!(Workload::from_struct(&s, &[]).labels.len(), 0);
    }

    #[test]
    fn a_frame_round_trips_and_splits_are_waited_for() {
        let frame = encode_frame(
            &productpage(),
            "sidecar~10.0.0.1~p.default~default.svc.cluster.local",
        );
        assert_eq!(&frame[..4], &[0x3d, 0x23, 0x04, 0x67]);
        let len = u32::from_be_bytes(frame[4..8].try_into().unwrap()) as usize;
        assert_eq!(len + 8, frame.len());
        let mut with_data = frame.clone();
        with_data.extend_from_slice(b"GET / HTTP/1.1\r\n");
        match decode_frame(&with_data, &[]) {
            Frame::Frame { len, peer } => {
                assert_eq!(len, frame.len());
                let (w, id) = *peer.unwrap();
                assert_eq!(w, productpage());
                assert!(id.starts_with("sidecar~"));
            }
            other => panic!("{other:?}"),
        }
        for cut in [0, 2, 5, 8, frame.len() - 1] {
            assert_eq!(decode_frame(&frame[..cut], &[]), Frame::NeedMore, "{cut}");
        }
    }

    #[test]
    fn other_protocols_and_oversized_claims_are_no_frames() {
        assert_eq!(decode_frame(b"GET / HTTP/1.1\r\n", &[]), Frame::NotAFrame);
        assert_eq!(decode_frame(b"SSH", &[]), Frame::NotAFrame);
        let mut huge = FRAME_MAGIC.to_be_bytes().to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_frame(&huge, &[]), Frame::NotAFrame);
        // A frame whose payload is not Istio's: its length is known, the peer is not.
        let mut junk = FRAME_MAGIC.to_be_bytes().to_vec();
        junk.extend_from_slice(&3u32.to_be_bytes());
        junk.extend_from_slice(&[0xff, 0xff, 0xff]);
        assert_eq!(
            decode_frame(&junk, &[]),
            Frame::Frame {
                len: 11,
                peer: None
            }
        );
        assert!(Workload::from_header("not base64!", &[]).is_none());
        assert!(
            Workload::from_header("AAAA", &[])
                .map(|w| w.namespace)
                .unwrap_or_default()
                .is_empty()
        );
    }
}
