//! Small pieces of Envoy config every generator builds with: the ADS config source, socket
//! addresses, durations, and maps encoded in a fixed order.

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, SocketAddress, address, config_source,
    socket_address,
};
use envoy_types::pb::google::protobuf::{Duration, Struct, Value, value};

pub(crate) fn ads_config_source() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        resource_api_version: ApiVersion::V3 as i32,
        // Do not block Envoy's startup on a resource that may never come.
        initial_fetch_timeout: Some(Duration {
            seconds: 0,
            nanos: 0,
        }),
        ..Default::default()
    }
}

pub(crate) fn socket_address(
    ip: &str,
    port: u16,
) -> envoy_types::pb::envoy::config::core::v3::Address {
    envoy_types::pb::envoy::config::core::v3::Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    }
}

pub(crate) fn seconds(s: i64) -> Duration {
    Duration {
        seconds: s,
        nanos: 0,
    }
}

/// `base` encoded, then each of `entries`: protobuf merges concatenated encodings of one
/// message, so a map field given as single-entry messages in `entries` decodes as the whole map
/// with its entries written in the order given. prost writes a protobuf map (a HashMap) in hash
/// order, which would make each generation of the same config differ in its bytes.
pub(crate) fn encode_map_in_order<M: prost::Message>(
    base: &M,
    entries: impl IntoIterator<Item = M>,
) -> Vec<u8> {
    let mut out = base.encode_to_vec();
    for e in entries {
        e.encode_raw(&mut out);
    }
    out
}

/// `metadata.filter_metadata.istio.config`: the resource a route or cluster came from.
pub fn istio_metadata(config: &str) -> Metadata {
    let fields = [(
        "config".to_string(),
        Value {
            kind: Some(value::Kind::StringValue(config.to_string())),
        },
    )]
    .into_iter()
    .collect();
    Metadata {
        filter_metadata: [("istio".to_string(), Struct { fields })]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}
