//! What a removed Istio-only filter was set to do beyond what istiod writes for it: an EnvoyFilter
//! patch on the filter (a MERGE into `istio.stats`, `istio.alpn`, a metadata exchange), or an
//! Istio-only filter an EnvoyFilter adds. Upstream Envoy cannot run the filter, so the agent
//! removes it, and these settings are lost with it; the agent reports them by name rather than
//! drop them silently.
//!
//! istiod's own configs (release-1.31, as recorded in `tests/fixtures/istiod-1.31`) report
//! nothing, and neither does what the agent carries over: `istio.stats`' `metrics` and
//! `tcp_reporting_duration` (in the message form istiod writes) shape the agent's metrics.

use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use prost::Message;

use super::{
    ALPN_OVERRIDE, ISTIO_STATS, PEER_METADATA, TCP_METADATA_EXCHANGE, TYPED_STRUCTS, type_name,
    wire,
};

/// The settings of `any` (a removed filter's typed config, whose extension type is `t`) that
/// are lost with it: field names, or `config` when the whole differs from istiod's.
pub fn settings(t: &str, any: &[u8]) -> Vec<String> {
    read(t, any).unwrap_or_else(|| vec!["config (not readable)".to_string()])
}

fn read(t: &str, any: &[u8]) -> Option<Vec<String>> {
    let outer = type_name(wire::string_field(any, 1).ok()?);
    let value = wire::len_field(any, 2).ok()?.unwrap_or_default();
    if TYPED_STRUCTS.contains(&outer) {
        let fields = wire::len_field(value, 2).ok()?.unwrap_or_default();
        let config = json(&Struct::decode(fields).ok()?);
        return Some(struct_settings(t, &config));
    }
    Some(match t {
        ISTIO_STATS => stats_fields(value)?,
        ALPN_OVERRIDE => {
            if alpn_overrides(value)? == istiod_alpn() {
                Vec::new()
            } else {
                vec!["alpn_override".to_string()]
            }
        }
        // istiod writes these as TypedStructs; the message form is not compared.
        _ => Vec::new(),
    })
}

/// `stats.PluginConfig` (istio/proxy `istio_stats/config.proto`): 6 `disable_host_header_fallback`
/// (istiod sets it per direction), 7 and 8 carried over; the rest lost.
fn stats_fields(config: &[u8]) -> Option<Vec<String>> {
    let mut lost = Vec::new();
    for field in wire::fields(config) {
        let name = match field.ok()?.number {
            6..=8 => continue,
            9 => "definitions".to_string(),
            10 => "reporter".to_string(),
            11 => "rescoping_duration".to_string(),
            12 => "scope_grace_period_duration".to_string(),
            n => format!("field {n}"),
        };
        if !lost.contains(&name) {
            lost.push(name);
        }
    }
    Some(lost)
}

/// The settings of a TypedStruct-wrapped config that istiod's differ from.
fn struct_settings(t: &str, config: &serde_json::Value) -> Vec<String> {
    let keys = |keep: &dyn Fn(&str, &serde_json::Value) -> bool| -> Vec<String> {
        config
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, v)| !keep(k, v))
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default()
    };
    match t {
        // The agent reads the message form only: in a TypedStruct, every setting is lost.
        ISTIO_STATS => keys(&|k, _| k == "disable_host_header_fallback"),
        TCP_METADATA_EXCHANGE => keys(&|k, v| match k {
            "protocol" => v == "istio-peer-exchange",
            "enable_discovery" => true,
            _ => false,
        }),
        PEER_METADATA => {
            let istio = |dir: &str| {
                serde_json::json!({
                    format!("{dir}_discovery"): [{"istio_headers": {}}, {"workload_discovery": {}}],
                    format!("{dir}_propagation"): [{"istio_headers": {}}],
                })
            };
            if *config == istio("downstream") || *config == istio("upstream") {
                Vec::new()
            } else {
                vec!["config".to_string()]
            }
        }
        ALPN_OVERRIDE => {
            let default: Vec<serde_json::Value> = istiod_alpn()
                .into_iter()
                .map(|(protocol, alpn)| {
                    let mut o = serde_json::json!({ "alpn_override": alpn });
                    if protocol != 0 {
                        o["upstream_protocol"] = ["HTTP10", "HTTP11", "HTTP2"]
                            .get(usize::try_from(protocol).unwrap_or(0))
                            .copied()
                            .unwrap_or_default()
                            .into();
                    }
                    o
                })
                .collect();
            if config.get("alpn_override") == Some(&serde_json::Value::Array(default)) {
                Vec::new()
            } else {
                vec!["alpn_override".to_string()]
            }
        }
        _ => Vec::new(),
    }
}

/// istiod's `istio.alpn` overrides: (upstream protocol, ALPN list).
fn istiod_alpn() -> Vec<(u64, Vec<String>)> {
    let v = |p: u64, l: [&str; 3]| (p, l.iter().map(|s| s.to_string()).collect());
    vec![
        v(0, ["istio-http/1.0", "istio", "http/1.0"]),
        v(1, ["istio-http/1.1", "istio", "http/1.1"]),
        v(2, ["istio-h2", "istio", "h2"]),
    ]
}

/// `FilterConfig.alpn_override` (1): `AlpnOverride { upstream_protocol 1, alpn_override 2 }`.
fn alpn_overrides(config: &[u8]) -> Option<Vec<(u64, Vec<String>)>> {
    let mut out = Vec::new();
    for o in wire::repeated(config, 1).ok()? {
        let mut protocol = 0;
        let mut alpn = Vec::new();
        for f in wire::fields(o) {
            let f = f.ok()?;
            match f.number {
                1 => protocol = f.varint()?,
                2 => alpn.push(String::from_utf8_lossy(f.value).to_string()),
                _ => {}
            }
        }
        out.push((protocol, alpn));
    }
    Some(out)
}

fn json(s: &Struct) -> serde_json::Value {
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
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use envoy_types::pb::google::protobuf::Any;

    fn typed_struct(inner: &str, config: serde_json::Value) -> Vec<u8> {
        fn to_value(v: &serde_json::Value) -> Value {
            let kind = match v {
                serde_json::Value::Null => Kind::NullValue(0),
                serde_json::Value::Bool(b) => Kind::BoolValue(*b),
                serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap()),
                serde_json::Value::String(s) => Kind::StringValue(s.clone()),
                serde_json::Value::Array(a) => {
                    Kind::ListValue(envoy_types::pb::google::protobuf::ListValue {
                        values: a.iter().map(to_value).collect(),
                    })
                }
                serde_json::Value::Object(o) => Kind::StructValue(Struct {
                    fields: o.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
                }),
            };
            Value { kind: Some(kind) }
        }
        let Some(Kind::StructValue(s)) = to_value(&config).kind else {
            unreachable!()
        };
        let ts = super::super::TypedStruct {
            type_url: format!("type.googleapis.com/{inner}"),
            value: Some(s),
        };
        Any {
            type_url: "type.googleapis.com/udpa.type.v1.TypedStruct".into(),
            value: ts.encode_to_vec(),
        }
        .encode_to_vec()
    }

    #[test]
    fn istiods_own_configs_lose_nothing() {
        for dir in ["downstream", "upstream"] {
            let c = typed_struct(
                PEER_METADATA,
                serde_json::json!({
                    format!("{dir}_discovery"): [{"istio_headers": {}}, {"workload_discovery": {}}],
                    format!("{dir}_propagation"): [{"istio_headers": {}}],
                }),
            );
            assert!(settings(PEER_METADATA, &c).is_empty());
        }
        let mx = typed_struct(
            TCP_METADATA_EXCHANGE,
            serde_json::json!({"enable_discovery": true, "protocol": "istio-peer-exchange"}),
        );
        assert!(settings(TCP_METADATA_EXCHANGE, &mx).is_empty());
        let alpn = typed_struct(
            ALPN_OVERRIDE,
            serde_json::json!({"alpn_override": [
                {"alpn_override": ["istio-http/1.0", "istio", "http/1.0"]},
                {"alpn_override": ["istio-http/1.1", "istio", "http/1.1"], "upstream_protocol": "HTTP11"},
                {"alpn_override": ["istio-h2", "istio", "h2"], "upstream_protocol": "HTTP2"}]}),
        );
        assert!(settings(ALPN_OVERRIDE, &alpn).is_empty());
        // stats.PluginConfig as istiod writes it: disable_host_header_fallback (6), metrics (8).
        let mut stats = Vec::new();
        stats.extend_from_slice(&[6 << 3, 1]);
        wire::put_len(&mut stats, 8, b"");
        let any = Any {
            type_url: "type.googleapis.com/stats.PluginConfig".into(),
            value: stats,
        };
        assert!(settings(ISTIO_STATS, &any.encode_to_vec()).is_empty());
    }

    #[test]
    fn a_patched_config_names_what_is_lost() {
        let mx = typed_struct(
            TCP_METADATA_EXCHANGE,
            serde_json::json!({"protocol": "istio-peer-exchange", "additional_labels": ["x"]}),
        );
        assert_eq!(settings(TCP_METADATA_EXCHANGE, &mx), ["additional_labels"]);
        let peer = typed_struct(
            PEER_METADATA,
            serde_json::json!({"downstream_discovery": [{"istio_headers": {}}], "shared_with_upstream": true}),
        );
        assert_eq!(settings(PEER_METADATA, &peer), ["config"]);
        let alpn = typed_struct(
            ALPN_OVERRIDE,
            serde_json::json!({"alpn_override": [{"alpn_override": ["h2"], "upstream_protocol": "HTTP2"}]}),
        );
        assert_eq!(settings(ALPN_OVERRIDE, &alpn), ["alpn_override"]);
        // stats: custom metric definitions (9) and a reporter (10) are lost.
        let mut stats = Vec::new();
        wire::put_len(&mut stats, 9, b"\x0a\x01x");
        stats.extend_from_slice(&[10 << 3, 1]);
        let any = Any {
            type_url: "type.googleapis.com/stats.PluginConfig".into(),
            value: stats,
        };
        assert_eq!(
            settings(ISTIO_STATS, &any.encode_to_vec()),
            ["definitions", "reporter"]
        );
        let ts = typed_struct(ISTIO_STATS, serde_json::json!({"metrics": []}));
        assert_eq!(settings(ISTIO_STATS, &ts), ["metrics"]);
    }
}
