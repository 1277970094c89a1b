//! Istio's filter configs as the proxy module's (`mesh_common::module`): the typed config of an
//! `istio.metadata_exchange`, `istio.alpn` or `istio.stats` filter becomes the module's
//! DynamicModuleFilter / DynamicModuleNetworkFilter of the same name
//! (`mesh_common::telemetry::module_filters`), carrying the config in the JSON of Istio's own
//! proto, which the module reads with the same serde types. A config is read here as the module
//! will read it, so one it would refuse never reaches Envoy: it is reported as invalid instead
//! (and the response NACKed).
//!
//! istiod writes the metadata exchanges as TypedStructs and `istio.alpn` and `istio.stats` as
//! binary messages (read here at the wire level, field numbers from istio/proxy's protos);
//! either form is read. A TypedStruct's Struct is passed on as it came, as a
//! `google.protobuf.Struct`, which Envoy hands the module as JSON; a TypedStruct itself would
//! reach the module as its protobuf bytes (Envoy 1.40 turns only a StringValue, a BytesValue or a
//! Struct into the module's config string), which it cannot read.

use envoy_types::pb::google::protobuf::{Any, Struct, Value, value::Kind};
use mesh_common::module::{
    Alpn, AlpnOverride, Discovery, Empty, IstioHeaders, MetricConfig, MetricDefinition,
    PeerMetadata, Propagation, Stats, TcpExchange, UpstreamFilterState, UpstreamProtocol, filter,
};
use mesh_common::telemetry::module_filters::{http_config, json_config, network_config};
use prost::Message;

use super::{
    ALPN_OVERRIDE, ISTIO_STATS, NULL_VM_METADATA_EXCHANGE, PEER_METADATA, Place,
    TCP_METADATA_EXCHANGE, TYPED_STRUCTS, TypedStruct, lost, type_name, wire,
};

/// What became of an Istio filter's config.
pub enum Mapped {
    /// The module's typed config for the filter, and what of Istio's config the module does not
    /// apply (`lost`).
    Config(Any, Vec<String>),
    /// Why the module would refuse the config.
    Invalid(String),
}

/// The module's typed config for an Istio filter of extension type `t` whose typed config is
/// `any`, at `place` in a listener whose metrics report as `side` (`source`, `destination`);
/// `None` when the module has no filter for it there.
pub fn filter(place: Place, t: &str, any: &[u8], side: &str) -> Option<Mapped> {
    let mapped = match (place, t) {
        (Place::Http, PEER_METADATA) => peer_metadata(any),
        (Place::Http, NULL_VM_METADATA_EXCHANGE) => null_vm_exchange(any, side),
        (Place::Http, ALPN_OVERRIDE) => alpn(any),
        (Place::Http, ISTIO_STATS) => stats(any, side, http_config),
        (Place::Network, TCP_METADATA_EXCHANGE) => tcp_exchange(any),
        (Place::Network, ISTIO_STATS) => stats(any, side, network_config),
        _ => return None,
    };
    Some(match mapped {
        Ok((config, lost)) => Mapped::Config(config, lost),
        Err(why) => Mapped::Invalid(format!("the proxy module would refuse its config: {why}")),
    })
}

/// What goes with an Istio filter of type `t` at `place` that is removed, not mapped (`any`:
/// its typed config, when it has one): a cluster's exchange, the settings the listeners' client
/// side (istiod's config) does not carry; otherwise what `lost::removed` names.
pub fn lost_with_removal(t: &str, place: Place, any: Option<&[u8]>) -> Vec<String> {
    match (t, place, any) {
        (TCP_METADATA_EXCHANGE, Place::Cluster, Some(any)) => match tcp_exchange_config(any) {
            Ok(c) => lost::cluster_exchange(&c),
            Err(why) => vec![format!("config ({why})")],
        },
        _ => lost::removed(t, place),
    }
}

/// A config as it came: a TypedStruct's Struct as JSON, or the message's bytes.
enum Form<'a> {
    Json(serde_json::Value),
    Message(&'a [u8]),
}

fn form(any: &[u8]) -> Result<Form<'_>, String> {
    let outer = type_name(wire::string_field(any, 1).map_err(text)?);
    let value = wire::len_field(any, 2).map_err(text)?.unwrap_or_default();
    if !TYPED_STRUCTS.contains(&outer) {
        return Ok(Form::Message(value));
    }
    let typed =
        TypedStruct::decode(value).map_err(|e| format!("its {outer} does not decode: {e}"))?;
    Ok(Form::Json(typed.value.as_ref().map_or_else(
        || serde_json::Value::Object(serde_json::Map::new()),
        json,
    )))
}

fn text(e: wire::WireError) -> String {
    e.to_string()
}

/// `json` read as the module reads its config.
fn from_json<T: serde::de::DeserializeOwned>(json: &serde_json::Value) -> Result<T, String> {
    serde_json::from_value(json.clone()).map_err(|e| format!("{json} does not read: {e}"))
}

/// A TypedStruct's Struct (its field 2) as a `google.protobuf.Struct` Any, byte for byte.
fn struct_any(any: &[u8]) -> Result<Any, String> {
    let typed = wire::len_field(any, 2).map_err(text)?.unwrap_or_default();
    let value = wire::len_field(typed, 2).map_err(text)?.unwrap_or_default();
    Ok(Any {
        type_url: STRUCT_TYPE.to_string(),
        value: value.to_vec(),
    })
}

const STRUCT_TYPE: &str = "type.googleapis.com/google.protobuf.Struct";

/// `io.istio.http.peer_metadata.Config`.
fn peer_metadata(any: &[u8]) -> Result<(Any, Vec<String>), String> {
    let (config, module_config) = match form(any)? {
        // The Struct as it came: what the module gets is the JSON just read.
        Form::Json(json) => (from_json(&json)?, struct_any(any)?),
        Form::Message(m) => {
            let config = peer_metadata_message(m).map_err(text)?;
            let json = json_config(&config);
            (config, json)
        }
    };
    Ok((
        http_config(filter::METADATA_EXCHANGE, module_config),
        lost::peer_metadata(&config),
    ))
}

/// The metadata exchange of older istiods (1.18 still writes it for HTTP): a Wasm filter of the
/// plugin compiled into istio-proxy (the null VM), which learns and announces the peer in the
/// same headers Istio's `istio_headers` methods use, on both sides of a stream. The module runs
/// what istiod writes today for the listener's side: the server's exchange inbound, the
/// client's outbound. The plugin's own `configuration` (Wasm `config` 1 → PluginConfig
/// `configuration` 4, an Any), which istiod leaves empty, is not read.
fn null_vm_exchange(any: &[u8], side: &str) -> Result<(Any, Vec<String>), String> {
    let config = if side == "destination" {
        PeerMetadata::server()
    } else {
        PeerMetadata::client()
    };
    let plugin = wire::len_field(
        wire::len_field(any, 2).map_err(text)?.unwrap_or_default(),
        1,
    )
    .map_err(text)?
    .unwrap_or_default();
    let configured = wire::len_field(plugin, 4)
        .map_err(text)?
        .and_then(|c| wire::len_field(c, 2).ok().flatten())
        .is_some_and(|v| !v.is_empty());
    let lost = if configured {
        vec!["configuration (the null-VM plugin's, not read)".to_string()]
    } else {
        Vec::new()
    };
    Ok((
        http_config(filter::METADATA_EXCHANGE, json_config(&config)),
        lost,
    ))
}

/// The message form: discovery (downstream 1, upstream 2) and propagation (downstream 3,
/// upstream 4) methods, `shared_with_upstream` 5, `additional_labels` 6.
fn peer_metadata_message(m: &[u8]) -> Result<PeerMetadata, wire::WireError> {
    let mut c = PeerMetadata::default();
    for f in wire::fields(m) {
        let f = f?;
        match (f.number, f.is_len()) {
            (1, true) => c.downstream_discovery.push(discovery(f.value)?),
            (2, true) => c.upstream_discovery.push(discovery(f.value)?),
            (3, true) => c.downstream_propagation.push(propagation(f.value)?),
            (4, true) => c.upstream_propagation.push(propagation(f.value)?),
            (5, false) => c.shared_with_upstream = f.varint().unwrap_or(0) != 0,
            (6, true) => c.additional_labels.push(string(f.value)),
            _ => {}
        }
    }
    Ok(c)
}

fn istio_headers(m: &[u8]) -> Result<IstioHeaders, wire::WireError> {
    Ok(IstioHeaders {
        skip_external_clusters: wire::varint_field(m, 1)?.unwrap_or(0) != 0,
    })
}

/// `DiscoveryMethod`, a oneof: `baggage` 1, `workload_discovery` 2, `istio_headers` 3,
/// `upstream_filter_state` 4 (the last one set wins).
fn discovery(m: &[u8]) -> Result<Discovery, wire::WireError> {
    let mut d = Discovery::default();
    for f in wire::fields(m) {
        let f = f?;
        if !f.is_len() {
            continue;
        }
        d = match f.number {
            1 => Discovery {
                baggage: Some(Empty {}),
                ..Discovery::default()
            },
            2 => Discovery::workload(),
            3 => Discovery {
                istio_headers: Some(istio_headers(f.value)?),
                ..Discovery::default()
            },
            4 => Discovery {
                upstream_filter_state: Some(UpstreamFilterState {
                    peer_metadata_key: wire::string_field(f.value, 1)?.to_string(),
                }),
                ..Discovery::default()
            },
            _ => continue,
        };
    }
    Ok(d)
}

/// `PropagationMethod`, a oneof: `istio_headers` 1, `baggage` 2.
fn propagation(m: &[u8]) -> Result<Propagation, wire::WireError> {
    let mut p = Propagation::default();
    for f in wire::fields(m) {
        let f = f?;
        if !f.is_len() {
            continue;
        }
        p = match f.number {
            1 => Propagation {
                istio_headers: Some(istio_headers(f.value)?),
                ..Propagation::default()
            },
            2 => Propagation {
                baggage: Some(Empty {}),
                ..Propagation::default()
            },
            _ => continue,
        };
    }
    Ok(p)
}

/// `envoy.tcp.metadataexchange.config.MetadataExchange` of a listener's chain: the module's
/// server side of the exchange.
fn tcp_exchange(any: &[u8]) -> Result<(Any, Vec<String>), String> {
    let config = tcp_exchange_config(any)?;
    let module_config = match form(any)? {
        Form::Json(_) => struct_any(any)?,
        Form::Message(_) => json_config(&config),
    };
    Ok((
        network_config(filter::METADATA_EXCHANGE, module_config),
        lost::tcp_exchange(&config),
    ))
}

/// A MetadataExchange config in either form: `protocol` 1, `enable_discovery` 2,
/// `additional_labels` 3.
fn tcp_exchange_config(any: &[u8]) -> Result<TcpExchange, String> {
    match form(any)? {
        Form::Json(json) => from_json(&json),
        Form::Message(m) => (|| {
            Ok::<_, wire::WireError>(TcpExchange {
                protocol: wire::string_field(m, 1)?.to_string(),
                enable_discovery: wire::varint_field(m, 2)?.unwrap_or(0) != 0,
                additional_labels: wire::repeated(m, 3)?.into_iter().map(string).collect(),
                negotiated: false,
            })
        })()
        .map_err(text),
    }
}

/// `istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig`: `alpn_override` 1, each
/// `upstream_protocol` 1 (HTTP10 0, HTTP11 1, HTTP2 2) and `alpn_override` 2.
fn alpn(any: &[u8]) -> Result<(Any, Vec<String>), String> {
    let config: Alpn = match form(any)? {
        Form::Json(json) => from_json(&json)?,
        Form::Message(m) => {
            let mut config = Alpn::default();
            for o in wire::repeated(m, 1).map_err(text)? {
                let upstream_protocol = match wire::varint_field(o, 1).map_err(text)? {
                    None | Some(0) => UpstreamProtocol::HTTP10,
                    Some(1) => UpstreamProtocol::HTTP11,
                    Some(2) => UpstreamProtocol::HTTP2,
                    Some(n) => {
                        return Err(format!(
                            "alpn_override: upstream_protocol {n} is none of HTTP10 (0), HTTP11 \
                             (1), HTTP2 (2)"
                        ));
                    }
                };
                let alpn_override = wire::repeated(o, 2)
                    .map_err(text)?
                    .into_iter()
                    .map(string)
                    .collect();
                config.alpn_override.push(AlpnOverride {
                    upstream_protocol,
                    alpn_override,
                });
            }
            config
        }
    };
    Ok((http_config(filter::ALPN, json_config(&config)), Vec::new()))
}

/// `stats.PluginConfig`, with `side` said: the module then reports as the listener's direction
/// says without reading it. `definitions` (custom metrics, which istiod never writes) are left
/// out and reported lost: the module refuses a config with any.
fn stats(
    any: &[u8],
    side: &str,
    module_filter: fn(&str, Any) -> Any,
) -> Result<(Any, Vec<String>), String> {
    let (mut config, mut lost) = match form(any)? {
        Form::Json(json) => (from_json::<Stats>(&json)?, Vec::new()),
        Form::Message(m) => plugin_config(m).map_err(text)?,
    };
    if let Some(reporter) = config.reporter.as_deref().filter(|r| *r != "UNSPECIFIED") {
        return Err(format!(
            "reporter {reporter} (a waypoint's) is not supported: the module reports as a \
             sidecar (UNSPECIFIED: as the listener's traffic direction says)"
        ));
    }
    if !config.definitions.is_empty() {
        let names: Vec<&str> = config.definitions.iter().map(|d| d.name.as_str()).collect();
        lost.push(format!("definitions ({})", names.join(", ")));
        config.definitions.clear();
    }
    lost.extend(lost::stats_dimensions(&config.metrics));
    config.side = Some(side.to_string());
    Ok((module_filter(filter::STATS, json_config(&config)), lost))
}

/// The message form (istio/proxy `istio_stats/config.proto`): `disable_host_header_fallback`
/// 6, `tcp_reporting_duration` 7, `metrics` 8, `definitions` 9, `reporter` 10 (UNSPECIFIED 0,
/// SERVER_GATEWAY 1), `rotation_interval` 11 and `graceful_deletion_interval` 12 (deprecated,
/// unread by Istio); any other field is reported lost.
fn plugin_config(m: &[u8]) -> Result<(Stats, Vec<String>), wire::WireError> {
    let mut c = Stats::default();
    let mut lost: Vec<String> = Vec::new();
    for f in wire::fields(m) {
        let f = f?;
        match (f.number, f.is_len()) {
            (6, false) => c.disable_host_header_fallback = f.varint().unwrap_or(0) != 0,
            (7, true) => c.tcp_reporting_duration = Some(duration(f.value)?),
            (8, true) => c.metrics.push(metric_config(f.value)?),
            (9, true) => c.definitions.push(MetricDefinition {
                name: wire::string_field(f.value, 1)?.to_string(),
                value: wire::string_field(f.value, 2)?.to_string(),
                type_: None,
            }),
            (10, false) => {
                c.reporter = match f.varint().unwrap_or(0) {
                    0 => None,
                    1 => Some("SERVER_GATEWAY".to_string()),
                    n => Some(n.to_string()),
                }
            }
            (11, true) => c.rotation_interval = Some(duration(f.value)?),
            (12, true) => c.graceful_deletion_interval = Some(duration(f.value)?),
            (n, _) => {
                let name = format!("field {n}");
                if !lost.contains(&name) {
                    lost.push(name);
                }
            }
        }
    }
    Ok((c, lost))
}

/// `stats.MetricConfig`: `dimensions` 1 (a map), `name` 2, `tags_to_remove` 3, `match` 4,
/// `drop` 5.
fn metric_config(m: &[u8]) -> Result<MetricConfig, wire::WireError> {
    let mut c = MetricConfig::default();
    for f in wire::fields(m) {
        let f = f?;
        match (f.number, f.is_len()) {
            (1, true) => {
                let key = wire::string_field(f.value, 1)?.to_string();
                let value = wire::string_field(f.value, 2)?.to_string();
                c.dimensions.insert(key, value);
            }
            (2, true) => c.name = string(f.value),
            (3, true) => c.tags_to_remove.push(string(f.value)),
            (4, true) => c.match_ = string(f.value),
            (5, false) => c.drop = f.varint().unwrap_or(0) != 0,
            _ => {}
        }
    }
    Ok(c)
}

/// A `google.protobuf.Duration` (`seconds` 1, `nanos` 2) in its JSON form (`5s`, `0.250s`).
fn duration(m: &[u8]) -> Result<String, wire::WireError> {
    // int64 and int32 on the wire: two's complement in 64 bits.
    let seconds = wire::varint_field(m, 1)?.unwrap_or(0) as i64;
    let nanos = wire::varint_field(m, 2)?.unwrap_or(0) as i64;
    let sign = if seconds < 0 || nanos < 0 { "-" } else { "" };
    let (seconds, nanos) = (seconds.unsigned_abs(), nanos.unsigned_abs());
    Ok(if nanos == 0 {
        format!("{sign}{seconds}s")
    } else if nanos % 1_000_000 == 0 {
        format!("{sign}{seconds}.{:03}s", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{sign}{seconds}.{:06}s", nanos / 1_000)
    } else {
        format!("{sign}{seconds}.{nanos:09}s")
    })
}

fn string(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A Struct as the JSON Envoy gives the module for it.
pub fn json(s: &Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value(v)))
            .collect(),
    )
}

fn value(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::json!(n),
        Some(Kind::StringValue(s)) => s.clone().into(),
        Some(Kind::BoolValue(b)) => (*b).into(),
        Some(Kind::StructValue(s)) => json(s),
        Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
    }
}

#[cfg(test)]
pub(super) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use envoy_types::pb::envoy::extensions::filters::http::dynamic_modules::v3::DynamicModuleFilter;
    use envoy_types::pb::envoy::extensions::filters::network::dynamic_modules::v3::DynamicModuleNetworkFilter;
    use envoy_types::pb::google::protobuf::{ListValue, StringValue};
    use mesh_common::telemetry::module_filters::{HTTP_TYPE, NETWORK_TYPE};

    /// A TypedStruct Any of `inner` holding `config`.
    pub(crate) fn typed_struct(inner: &str, config: serde_json::Value) -> Vec<u8> {
        fn to_value(v: &serde_json::Value) -> Value {
            let kind = match v {
                serde_json::Value::Null => Kind::NullValue(0),
                serde_json::Value::Bool(b) => Kind::BoolValue(*b),
                serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap()),
                serde_json::Value::String(s) => Kind::StringValue(s.clone()),
                serde_json::Value::Array(a) => Kind::ListValue(ListValue {
                    values: a.iter().map(to_value).collect(),
                }),
                serde_json::Value::Object(o) => Kind::StructValue(Struct {
                    fields: o.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
                }),
            };
            Value { kind: Some(kind) }
        }
        let Some(Kind::StructValue(s)) = to_value(&config).kind else {
            panic!("not an object: {config}");
        };
        Any {
            type_url: "type.googleapis.com/udpa.type.v1.TypedStruct".into(),
            value: TypedStruct {
                type_url: format!("type.googleapis.com/{inner}"),
                value: Some(s),
            }
            .encode_to_vec(),
        }
        .encode_to_vec()
    }

    fn message(t: &str, value: Vec<u8>) -> Vec<u8> {
        Any {
            type_url: format!("type.googleapis.com/{t}"),
            value,
        }
        .encode_to_vec()
    }

    fn mapped(place: Place, t: &str, any: &[u8], side: &str) -> (Any, Vec<String>) {
        match filter(place, t, any, side) {
            Some(Mapped::Config(a, lost)) => (a, lost),
            Some(Mapped::Invalid(why)) => panic!("invalid: {why}"),
            None => panic!("not mapped"),
        }
    }

    fn invalid(place: Place, t: &str, any: &[u8]) -> String {
        match filter(place, t, any, "source") {
            Some(Mapped::Invalid(why)) => why,
            Some(Mapped::Config(a, _)) => panic!("mapped: {a:?}"),
            None => panic!("not mapped"),
        }
    }

    /// The module's filter name and the config it gets: a StringValue's JSON, or a TypedStruct.
    fn module_http(a: &Any) -> (String, Any) {
        assert_eq!(a.type_url, HTTP_TYPE);
        let m = DynamicModuleFilter::decode(a.value.as_slice()).unwrap();
        assert_eq!(m.dynamic_module_config.unwrap().name, "istio_module");
        (m.filter_name, m.filter_config.unwrap())
    }

    fn module_network(a: &Any) -> (String, Any) {
        assert_eq!(a.type_url, NETWORK_TYPE);
        let m = DynamicModuleNetworkFilter::decode(a.value.as_slice()).unwrap();
        (m.filter_name, m.filter_config.unwrap())
    }

    fn string_json<T: serde::de::DeserializeOwned>(a: &Any) -> T {
        assert_eq!(
            a.type_url,
            "type.googleapis.com/google.protobuf.StringValue"
        );
        serde_json::from_str(&StringValue::decode(a.value.as_slice()).unwrap().value).unwrap()
    }

    #[test]
    fn istiods_peer_metadata_passes_as_it_came() {
        let server = serde_json::json!({
            "downstream_discovery": [{"istio_headers": {}}, {"workload_discovery": {}}],
            "downstream_propagation": [{"istio_headers": {}}],
        });
        let any = typed_struct(PEER_METADATA, server);
        let (a, lost) = mapped(Place::Http, PEER_METADATA, &any, "destination");
        assert!(lost.is_empty(), "{lost:?}");
        let (name, config) = module_http(&a);
        assert_eq!(name, filter::METADATA_EXCHANGE);
        assert_eq!(config.type_url, STRUCT_TYPE);
        let typed = wire::len_field(&any, 2).unwrap().unwrap();
        assert_eq!(
            config.value,
            wire::len_field(typed, 2).unwrap().unwrap(),
            "the Struct byte for byte"
        );
        let read: PeerMetadata =
            serde_json::from_value(json(&Struct::decode(config.value.as_slice()).unwrap()))
                .unwrap();
        assert_eq!(read, PeerMetadata::server());
    }

    #[test]
    fn a_peer_metadata_the_module_cannot_read_is_invalid() {
        let any = typed_struct(
            PEER_METADATA,
            serde_json::json!({"upstream_discovery": [{"istio_headers": {}}], "shared_upstream": true}),
        );
        let why = invalid(Place::Http, PEER_METADATA, &any);
        assert!(why.contains("shared_upstream"), "{why}");
        let any = typed_struct(
            PEER_METADATA,
            serde_json::json!({"upstream_discovery": "istio_headers"}),
        );
        assert!(invalid(Place::Http, PEER_METADATA, &any).contains("upstream_discovery"));
        // The wrapper itself broken.
        let any = message("udpa.type.v1.TypedStruct", vec![0x12, 0x05, 0x0a]);
        assert!(invalid(Place::Http, PEER_METADATA, &any).contains("does not decode"));
    }

    #[test]
    fn peer_metadata_as_a_message_becomes_json_and_unsupported_methods_are_lost() {
        // upstream_discovery: [istio_headers {}, baggage {}], upstream_propagation:
        // [istio_headers {skip_external_clusters: true}], shared_with_upstream, labels ["app"].
        let mut m = Vec::new();
        wire::put_len(&mut m, 2, &[0x1a, 0x00]);
        wire::put_len(&mut m, 2, &[0x0a, 0x00]);
        wire::put_len(&mut m, 4, &[0x0a, 0x02, 0x08, 0x01]);
        m.extend([5 << 3, 1]);
        wire::put_len(&mut m, 6, b"app");
        let (a, lost) = mapped(
            Place::Http,
            PEER_METADATA,
            &message(PEER_METADATA, m),
            "source",
        );
        let (_, config) = module_http(&a);
        let read: PeerMetadata = string_json(&config);
        assert_eq!(
            read,
            PeerMetadata {
                upstream_discovery: vec![
                    Discovery::istio_headers(),
                    Discovery {
                        baggage: Some(Empty {}),
                        ..Discovery::default()
                    }
                ],
                upstream_propagation: vec![Propagation {
                    istio_headers: Some(IstioHeaders {
                        skip_external_clusters: true
                    }),
                    ..Propagation::default()
                }],
                shared_with_upstream: true,
                additional_labels: vec!["app".into()],
                ..PeerMetadata::default()
            }
        );
        assert_eq!(lost, ["upstream_discovery baggage", "shared_with_upstream"]);
    }

    #[test]
    fn the_tcp_exchange_in_both_forms() {
        let ts = typed_struct(
            TCP_METADATA_EXCHANGE,
            serde_json::json!({"enable_discovery": true, "protocol": "istio-peer-exchange"}),
        );
        let (a, lost) = mapped(Place::Network, TCP_METADATA_EXCHANGE, &ts, "destination");
        assert!(lost.is_empty());
        let (name, config) = module_network(&a);
        assert_eq!(name, filter::METADATA_EXCHANGE);
        assert_eq!(config.type_url, STRUCT_TYPE);
        let read: TcpExchange =
            serde_json::from_value(json(&Struct::decode(config.value.as_slice()).unwrap()))
                .unwrap();
        assert_eq!(read, TcpExchange::istio());

        let mut m = Vec::new();
        wire::put_len(&mut m, 1, b"istio-peer-exchange");
        m.extend([2 << 3, 1]);
        wire::put_len(&mut m, 3, b"team");
        let (a, _) = mapped(
            Place::Network,
            TCP_METADATA_EXCHANGE,
            &message(TCP_METADATA_EXCHANGE, m),
            "destination",
        );
        let (_, config) = module_network(&a);
        let read: TcpExchange = string_json(&config);
        assert_eq!(
            read,
            TcpExchange {
                additional_labels: vec!["team".into()],
                ..TcpExchange::istio()
            }
        );
        let bad = typed_struct(TCP_METADATA_EXCHANGE, serde_json::json!({"protocl": "x"}));
        assert!(invalid(Place::Network, TCP_METADATA_EXCHANGE, &bad).contains("protocl"));
    }

    /// istiod's `istio.alpn` (binary; HTTP10's protocol left out, as protobuf does for 0).
    pub(crate) fn istiod_alpn() -> Vec<u8> {
        let mut m = Vec::new();
        for (protocol, list) in [
            (0u8, ["istio-http/1.0", "istio", "http/1.0"]),
            (1, ["istio-http/1.1", "istio", "http/1.1"]),
            (2, ["istio-h2", "istio", "h2"]),
        ] {
            let mut o = Vec::new();
            if protocol != 0 {
                o.extend([1 << 3, protocol]);
            }
            for a in list {
                wire::put_len(&mut o, 2, a.as_bytes());
            }
            wire::put_len(&mut m, 1, &o);
        }
        message(ALPN_OVERRIDE, m)
    }

    #[test]
    fn alpn_becomes_the_modules_json() {
        let (a, lost) = mapped(Place::Http, ALPN_OVERRIDE, &istiod_alpn(), "source");
        assert!(lost.is_empty());
        let (name, config) = module_http(&a);
        assert_eq!(name, filter::ALPN);
        assert_eq!(string_json::<Alpn>(&config), Alpn::istio());
        // An EnvoyFilter's TypedStruct form reads too; an unknown protocol is refused.
        let ts = typed_struct(
            ALPN_OVERRIDE,
            serde_json::json!({"alpn_override": [{"upstream_protocol": "HTTP2", "alpn_override": ["h2"]}]}),
        );
        let (a, _) = mapped(Place::Http, ALPN_OVERRIDE, &ts, "source");
        let read: Alpn = string_json(&module_http(&a).1);
        assert_eq!(
            read.alpn_override[0].upstream_protocol,
            UpstreamProtocol::HTTP2
        );
        let mut o = vec![1 << 3, 7];
        wire::put_len(&mut o, 2, b"h3");
        let mut m = Vec::new();
        wire::put_len(&mut m, 1, &o);
        let why = invalid(Place::Http, ALPN_OVERRIDE, &message(ALPN_OVERRIDE, m));
        assert!(why.contains("upstream_protocol 7"), "{why}");
    }

    #[test]
    fn stats_carry_istiods_settings_and_the_listeners_side() {
        // stats.PluginConfig { disable_host_header_fallback: true, tcp_reporting_duration:
        // 10.5s, metrics: [{dimensions: {request_host: "request.host"}, name:
        // "requests_total", tags_to_remove: ["request_protocol"]}, {name: "request_bytes",
        // drop: true}] }
        let mut dim = Vec::new();
        wire::put_len(&mut dim, 1, b"request_host");
        wire::put_len(&mut dim, 2, b"request.host");
        let mut count = Vec::new();
        wire::put_len(&mut count, 1, &dim);
        wire::put_len(&mut count, 2, b"requests_total");
        wire::put_len(&mut count, 3, b"request_protocol");
        let mut bytes = Vec::new();
        wire::put_len(&mut bytes, 2, b"request_bytes");
        bytes.extend([5 << 3, 1]);
        let mut config = vec![6 << 3, 1];
        wire::put_len(
            &mut config,
            7,
            &[1 << 3, 10, 2 << 3, 0x80, 0xca, 0xb5, 0xee, 0x01],
        );
        wire::put_len(&mut config, 8, &count);
        wire::put_len(&mut config, 8, &bytes);
        let any = message(ISTIO_STATS, config);

        let (a, lost) = mapped(Place::Http, ISTIO_STATS, &any, "destination");
        assert!(lost.is_empty(), "{lost:?}");
        let (name, c) = module_http(&a);
        assert_eq!(name, filter::STATS);
        let read: Stats = string_json(&c);
        assert_eq!(
            read,
            Stats {
                disable_host_header_fallback: true,
                tcp_reporting_duration: Some("10.500s".into()),
                metrics: vec![
                    MetricConfig {
                        dimensions: [("request_host".to_string(), "request.host".to_string())]
                            .into(),
                        name: "requests_total".into(),
                        tags_to_remove: vec!["request_protocol".into()],
                        ..MetricConfig::default()
                    },
                    MetricConfig {
                        name: "request_bytes".into(),
                        drop: true,
                        ..MetricConfig::default()
                    },
                ],
                side: Some("destination".into()),
                ..Stats::default()
            }
        );
        // The network filter, from istiod's empty config.
        let (a, _) = mapped(
            Place::Network,
            ISTIO_STATS,
            &message(ISTIO_STATS, vec![]),
            "source",
        );
        let (name, c) = module_network(&a);
        assert_eq!(name, filter::STATS);
        assert_eq!(
            string_json::<Stats>(&c),
            Stats {
                side: Some("source".into()),
                ..Stats::default()
            }
        );
    }

    #[test]
    fn a_waypoints_reporter_is_refused_and_definitions_are_lost() {
        let why = invalid(
            Place::Http,
            ISTIO_STATS,
            &message(ISTIO_STATS, vec![10 << 3, 1]),
        );
        assert!(why.contains("reporter SERVER_GATEWAY"), "{why}");
        let ts = typed_struct(
            ISTIO_STATS,
            serde_json::json!({"reporter": "SERVER_GATEWAY"}),
        );
        assert!(invalid(Place::Network, ISTIO_STATS, &ts).contains("SERVER_GATEWAY"));
        let ts = typed_struct(ISTIO_STATS, serde_json::json!({"metrix": []}));
        assert!(invalid(Place::Http, ISTIO_STATS, &ts).contains("metrix"));

        // definitions (9), a dimension the module cannot compute, an unknown field (13).
        let mut def = Vec::new();
        wire::put_len(&mut def, 1, b"custom_total");
        wire::put_len(&mut def, 2, b"1");
        let mut dim = Vec::new();
        wire::put_len(&mut dim, 1, b"team");
        wire::put_len(&mut dim, 2, b"node.metadata['TEAM']");
        let mut metric = Vec::new();
        wire::put_len(&mut metric, 1, &dim);
        let mut config = Vec::new();
        wire::put_len(&mut config, 9, &def);
        wire::put_len(&mut config, 8, &metric);
        config.extend([13 << 3, 1]);
        let (a, lost) = mapped(
            Place::Http,
            ISTIO_STATS,
            &message(ISTIO_STATS, config),
            "source",
        );
        assert_eq!(
            lost,
            [
                "field 13",
                "definitions (custom_total)",
                "dimensions.team of every metric (the module cannot compute node.metadata['TEAM']: reported unknown)"
            ]
        );
        let read: Stats = string_json(&module_http(&a).1);
        assert!(
            read.definitions.is_empty(),
            "the module refuses definitions"
        );
        assert_eq!(read.metrics[0].dimensions["team"], "node.metadata['TEAM']");
    }

    #[test]
    fn a_clusters_exchange_loses_what_istiods_config_lacks() {
        let istio = typed_struct(
            TCP_METADATA_EXCHANGE,
            serde_json::json!({"enable_discovery": true, "protocol": "istio-peer-exchange"}),
        );
        assert!(lost_with_removal(TCP_METADATA_EXCHANGE, Place::Cluster, Some(&istio)).is_empty());
        let labelled = typed_struct(
            TCP_METADATA_EXCHANGE,
            serde_json::json!({"protocol": "custom", "additional_labels": ["team"]}),
        );
        assert_eq!(
            lost_with_removal(TCP_METADATA_EXCHANGE, Place::Cluster, Some(&labelled)),
            ["protocol \"custom\"", "additional_labels [\"team\"]"]
        );
        let bad = typed_struct(TCP_METADATA_EXCHANGE, serde_json::json!({"x": 1}));
        let lost = lost_with_removal(TCP_METADATA_EXCHANGE, Place::Cluster, Some(&bad));
        assert!(
            lost[0].starts_with("config (") && lost[0].contains("unknown field"),
            "{lost:?}"
        );
    }

    /// A Wasm filter of the null VM's `envoy.wasm.metadata_exchange` with this `configuration`
    /// value (istiod 1.18's: an empty MetadataExchange).
    pub(crate) fn null_vm_exchange_filter(configuration: &[u8]) -> Vec<u8> {
        use envoy_types::pb::envoy::config::core::v3::{
            AsyncDataSource, DataSource, async_data_source, data_source,
        };
        use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
        use envoy_types::pb::envoy::extensions::wasm::v3::{PluginConfig, VmConfig, plugin_config};
        let wasm = Wasm {
            config: Some(PluginConfig {
                vm: Some(plugin_config::Vm::VmConfig(VmConfig {
                    runtime: "envoy.wasm.runtime.null".into(),
                    code: Some(AsyncDataSource {
                        specifier: Some(async_data_source::Specifier::Local(DataSource {
                            specifier: Some(data_source::Specifier::InlineString(
                                "envoy.wasm.metadata_exchange".into(),
                            )),
                            ..Default::default()
                        })),
                    }),
                    ..Default::default()
                })),
                configuration: Some(Any {
                    type_url: format!("type.googleapis.com/{TCP_METADATA_EXCHANGE}"),
                    value: configuration.to_vec(),
                }),
                ..Default::default()
            }),
        };
        message(
            "envoy.extensions.filters.http.wasm.v3.Wasm",
            wasm.encode_to_vec(),
        )
    }

    #[test]
    fn the_null_vm_exchange_runs_istiods_exchange_for_the_side() {
        let istio_1_18 = null_vm_exchange_filter(&[]);
        for (side, want) in [
            ("destination", PeerMetadata::server()),
            ("source", PeerMetadata::client()),
        ] {
            let (a, lost) = mapped(Place::Http, NULL_VM_METADATA_EXCHANGE, &istio_1_18, side);
            assert!(lost.is_empty());
            let (name, config) = module_http(&a);
            assert_eq!(name, filter::METADATA_EXCHANGE);
            assert_eq!(string_json::<PeerMetadata>(&config), want);
        }
        let configured = null_vm_exchange_filter(&[0x0a, 0x01, b'x']);
        let (_, lost) = mapped(
            Place::Http,
            NULL_VM_METADATA_EXCHANGE,
            &configured,
            "source",
        );
        assert_eq!(lost, ["configuration (the null-VM plugin's, not read)"]);
    }

    #[test]
    fn the_module_has_nothing_for_other_places() {
        assert!(filter(Place::Network, PEER_METADATA, &istiod_alpn(), "source").is_none());
        assert!(filter(Place::Cluster, TCP_METADATA_EXCHANGE, &[], "source").is_none());
        assert!(filter(Place::Ecds, ISTIO_STATS, &[], "source").is_none());
        assert!(filter(Place::Http, TCP_METADATA_EXCHANGE, &[], "source").is_none());
    }

    #[test]
    fn durations_in_json() {
        let d = |s: i64, n: i32| {
            let mut m = Vec::new();
            if s != 0 {
                m.push(1 << 3);
                prost::encoding::encode_varint(s as u64, &mut m);
            }
            if n != 0 {
                m.push(2 << 3);
                prost::encoding::encode_varint(n as i64 as u64, &mut m);
            }
            duration(&m).unwrap()
        };
        assert_eq!(d(5, 0), "5s");
        assert_eq!(d(0, 0), "0s");
        assert_eq!(d(1, 250_000_000), "1.250s");
        assert_eq!(d(0, 1_000), "0.000001s");
        assert_eq!(d(0, 7), "0.000000007s");
        assert_eq!(d(-2, -500_000_000), "-2.500s");
    }
}
