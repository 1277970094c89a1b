//! Envoy's typed config read from JSON and merged as istiod merges it (its `pkg/proto/merge`):
//! the descriptor set `istio-proto` compiles from Envoy's own protos turns a JSON value
//! (`@type` for every `Any`) into the message it says it is, or names what does not fit.
//!
//! Stricter than istiod: a value is decoded with unknown fields refused (istiod drops them at
//! run time), and a TypedStruct's `value` must decode as the `type_url` it names (istiod keeps
//! it opaque, so a mistake there surfaces only as Envoy's NACK).

use std::sync::OnceLock;

use prost::Message;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, Kind, MessageDescriptor, ReflectMessage,
    Value,
};

/// The Any type URLs of the TypedStruct messages Envoy accepts for a typed config.
pub const TYPED_STRUCTS: [&str; 2] = [
    "type.googleapis.com/udpa.type.v1.TypedStruct",
    "type.googleapis.com/xds.type.v3.TypedStruct",
];
const TYPE_PREFIX: &str = "type.googleapis.com/";
const ANY: &str = "google.protobuf.Any";
const DURATION: &str = "google.protobuf.Duration";

/// Envoy's v3 API (decoded once).
pub fn pool() -> Result<&'static DescriptorPool, String> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(istio_proto::ENVOY_DESCRIPTORS)
            .map_err(|e| format!("Envoy's descriptor set does not decode: {e}"))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// The message `full_name` (`envoy.config.listener.v3.Listener`).
pub fn message(full_name: &str) -> Result<MessageDescriptor, String> {
    pool()?
        .get_message_by_name(full_name)
        .ok_or_else(|| format!("{full_name} is not a message of Envoy's v3 API"))
}

/// `value` (JSON, proto or camelCase field names, `@type` in every Any) as a `full_name`,
/// every Any inside it resolved and decoded, every TypedStruct's `value` checked against its
/// `type_url`; an error names the field that does not fit.
pub fn from_json(full_name: &str, value: &serde_json::Value) -> Result<DynamicMessage, String> {
    let desc = message(full_name)?;
    let options = DeserializeOptions::new().deny_unknown_fields(true);
    let msg = DynamicMessage::deserialize_with_options(desc, value, &options)
        .map_err(|e| e.to_string())?;
    check_typed_structs(&msg)?;
    Ok(msg)
}

/// Every TypedStruct in `msg` (at any depth, inside Anys too) stands for a message of its
/// `type_url` whose fields its `value` fits.
fn check_typed_structs(msg: &DynamicMessage) -> Result<(), String> {
    for (field, value) in msg.fields() {
        let check = |v: &Value| -> Result<(), String> {
            match v {
                Value::Message(m) => check_typed_structs(m),
                _ => Ok(()),
            }
        };
        match value {
            Value::List(items) => items.iter().try_for_each(check),
            Value::Map(map) => map.values().try_for_each(check),
            Value::Message(m) if m.descriptor().full_name() == ANY => {
                let inner = unpack(m).map_err(|e| format!("{}: {e}", field.name()))?;
                if TYPED_STRUCTS.contains(&type_url(m).as_str()) {
                    check_typed_struct(&inner).map_err(|e| format!("{}: {e}", field.name()))
                } else {
                    check_typed_structs(&inner)
                }
            }
            v => check(v).map_err(|e| format!("{}: {e}", field.name())),
        }?;
    }
    Ok(())
}

/// A TypedStruct's `value` decodes as its `type_url`.
fn check_typed_struct(ts: &DynamicMessage) -> Result<(), String> {
    let url = ts
        .get_field_by_name("type_url")
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let name = url
        .strip_prefix(TYPE_PREFIX)
        .ok_or_else(|| format!("TypedStruct type_url {url:?} is not type.googleapis.com/NAME"))?;
    let json = ts
        .get_field_by_name("value")
        .map(|v| match &*v {
            Value::Message(m) => struct_json(m),
            _ => Ok(serde_json::json!({})),
        })
        .transpose()?
        .unwrap_or_else(|| serde_json::json!({}));
    from_json(name, &json)
        .map(|_| ())
        .map_err(|e| format!("TypedStruct value for {name}: {e}"))
}

/// A `google.protobuf.Struct` as the JSON it holds.
fn struct_json(m: &DynamicMessage) -> Result<serde_json::Value, String> {
    serde_json::to_value(m).map_err(|e| e.to_string())
}

/// The type URL of an Any.
pub fn type_url(any: &DynamicMessage) -> String {
    any.get_field_by_name("type_url")
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The message an Any holds.
pub fn unpack(any: &DynamicMessage) -> Result<DynamicMessage, String> {
    let url = type_url(any);
    let name = url.rsplit('/').next().unwrap_or_default();
    let desc = message(name).map_err(|_| format!("unknown Any type {url:?}"))?;
    let bytes = any
        .get_field_by_name("value")
        .and_then(|v| v.as_bytes().cloned())
        .unwrap_or_default();
    DynamicMessage::decode(desc, bytes).map_err(|e| format!("{url}: {e}"))
}

/// `msg` packed as an Any.
pub fn pack(msg: &DynamicMessage) -> Result<DynamicMessage, String> {
    let mut any = DynamicMessage::new(message(ANY)?);
    any.set_field_by_name(
        "type_url",
        Value::String(format!("{TYPE_PREFIX}{}", msg.descriptor().full_name())),
    );
    any.set_field_by_name("value", Value::Bytes(msg.encode_to_vec().into()));
    Ok(any)
}

/// A packed message as proto JSON (`@type` and the message's fields, camelCase, nested Anys
/// unpacked), as Envoy's admin and istiod's debug endpoints show config.
pub fn any_json(any: &envoy_types::pb::google::protobuf::Any) -> Result<serde_json::Value, String> {
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    let desc = message(name).map_err(|_| format!("unknown Any type {:?}", any.type_url))?;
    let msg = DynamicMessage::decode(desc, any.value.as_slice())
        .map_err(|e| format!("{}: {e}", any.type_url))?;
    let mut json = serde_json::to_value(&msg).map_err(|e| e.to_string())?;
    if let serde_json::Value::Object(fields) = &mut json {
        fields.insert("@type".into(), any.type_url.clone().into());
    }
    Ok(json)
}

/// A generated (prost) message as the dynamic message `full_name`.
pub fn to_dynamic<M: Message>(msg: &M, full_name: &str) -> Result<DynamicMessage, String> {
    DynamicMessage::decode(message(full_name)?, msg.encode_to_vec().as_slice())
        .map_err(|e| format!("{full_name}: {e}"))
}

/// A dynamic message as the generated (prost) message `M`.
pub fn from_dynamic<M: Message + Default>(msg: &DynamicMessage) -> Result<M, String> {
    M::decode(msg.encode_to_vec().as_slice()).map_err(|e| e.to_string())
}

/// istiod's MERGE: every field `src` sets is merged into `dst`. A scalar replaces `dst`'s only
/// when it is not its default (zero, false and "" cannot be written by a merge); a message is
/// merged field by field, but a Duration is replaced whole; a list is appended to (replaced
/// when `replace_lists` and `src`'s is not empty); a map is replaced key by key. An Any is a
/// plain message here (its type and bytes replaced): `merge_any` merges what two Anys hold.
pub fn merge(dst: &mut DynamicMessage, src: &DynamicMessage, replace_lists: bool) {
    for (field, value) in src.fields() {
        match value {
            Value::List(items) => {
                let slot = dst.get_field_mut(&field);
                if let Value::List(existing) = slot {
                    if replace_lists && !items.is_empty() {
                        existing.clear();
                    }
                    existing.extend(items.iter().cloned());
                }
            }
            Value::Map(map) => {
                if let Value::Map(existing) = dst.get_field_mut(&field) {
                    for (k, v) in map {
                        existing.insert(k.clone(), v.clone());
                    }
                }
            }
            Value::Message(m) => {
                let whole = m.descriptor().full_name() == DURATION;
                if !whole && dst.has_field(&field) {
                    if let Value::Message(existing) = dst.get_field_mut(&field) {
                        merge(existing, m, replace_lists);
                    }
                } else {
                    dst.set_field(&field, value.clone());
                }
            }
            scalar => {
                let explicit =
                    field.supports_presence() && !matches!(field.kind(), Kind::Message(_));
                if explicit || !scalar.is_default_for_field(&field) {
                    dst.set_field(&field, scalar.clone());
                }
            }
        }
    }
}

/// istiod's MERGE of a filter's typed config: the messages both Anys hold merged (`merge`),
/// packed again. Anys of different types do not merge (istiod leaves the filter as it was).
pub fn merge_any(dst: &DynamicMessage, src: &DynamicMessage) -> Result<DynamicMessage, String> {
    let (d, s) = (type_url(dst), type_url(src));
    if d != s {
        return Err(format!("a {s} does not merge into a {d}"));
    }
    let mut inner = unpack(dst)?;
    merge(&mut inner, &unpack(src)?, false);
    pack(&inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    const LISTENER: &str = "envoy.config.listener.v3.Listener";
    const ROUTE: &str = "envoy.config.route.v3.Route";

    #[test]
    fn json_decodes_as_the_named_message_and_unknown_fields_are_refused() {
        let l = from_json(LISTENER, &json!({"name": "l", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}}})).unwrap();
        assert_eq!(l.get_field_by_name("name").unwrap().as_str(), Some("l"));
        let e = from_json(LISTENER, &json!({"nmae": "l"})).unwrap_err();
        assert!(e.contains("nmae"), "{e}");
        let e = from_json(LISTENER, &json!({"name": 7})).unwrap_err();
        assert!(e.contains("string"), "{e}");
    }

    #[test]
    fn an_any_is_decoded_as_its_type_and_a_typed_struct_is_checked_against_its_type_url() {
        let lua = json!({"name": "envoy.lua", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "inlineCode": "function envoy_on_request(h) end"}});
        let f = "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter";
        from_json(f, &lua).unwrap();
        let bad = json!({"name": "envoy.lua", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "inline_kode": "x"}});
        assert!(from_json(f, &bad).unwrap_err().contains("inline_kode"));
        let unknown =
            json!({"name": "x", "typed_config": {"@type": "type.googleapis.com/envoy.Nope"}});
        assert!(from_json(f, &unknown).is_err());
        let ts = |value: serde_json::Value| {
            json!({"name": "envoy.filters.http.local_ratelimit", "typed_config": {
                "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
                "type_url": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
                "value": value}})
        };
        from_json(f, &ts(json!({"stat_prefix": "http_local_rate_limiter", "token_bucket": {"max_tokens": 4, "fill_interval": "60s"}}))).unwrap();
        let e = from_json(f, &ts(json!({"stat_prefix": "x", "token_bukket": {}}))).unwrap_err();
        assert!(
            e.contains("token_bukket") && e.contains("LocalRateLimit"),
            "{e}"
        );
    }

    /// The dynamic forward proxy cluster (whose shipped proto names its DNS cache by a relative
    /// name that resolves wrongly; `istio-proto` mends it) is in the descriptor set.
    #[test]
    fn a_dynamic_forward_proxy_cluster_decodes() {
        let cluster = json!({"name": "dynamic_forward_proxy_cluster", "lb_policy": "CLUSTER_PROVIDED",
            "cluster_type": {"name": "envoy.clusters.dynamic_forward_proxy", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.clusters.dynamic_forward_proxy.v3.ClusterConfig",
                "dns_cache_config": {"name": "dynamic_forward_proxy_cache_config", "dns_lookup_family": "V4_ONLY"}}}});
        from_json("envoy.config.cluster.v3.Cluster", &cluster).unwrap();
        let typo = json!({"name": "c", "cluster_type": {"name": "x", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.clusters.dynamic_forward_proxy.v3.ClusterConfig",
            "dns_cache_confg": {}}}});
        let e = from_json("envoy.config.cluster.v3.Cluster", &typo).unwrap_err();
        assert!(e.contains("dns_cache_confg"), "{e}");
    }

    #[test]
    fn merge_replaces_set_scalars_appends_lists_replaces_durations_and_map_entries() {
        let mut dst = from_json(ROUTE, &json!({
            "name": "r", "match": {"prefix": "/"},
            "route": {"cluster": "c", "timeout": "15s", "retry_policy": {"num_retries": 2}},
            "request_headers_to_add": [{"header": {"key": "a", "value": "1"}}],
            "typed_per_filter_config": {"x": {"@type": "type.googleapis.com/google.protobuf.Struct", "value": {}}}
        })).unwrap();
        let src = from_json(
            ROUTE,
            &json!({
                "name": "", "route": {"timeout": "4s", "retry_policy": {"retry_on": "5xx"}},
                "request_headers_to_add": [{"header": {"key": "b", "value": "2"}}],
            }),
        )
        .unwrap();
        merge(&mut dst, &src, false);
        let j = serde_json::to_value(&dst).unwrap();
        assert_eq!(j["name"], "r", "an empty string does not overwrite");
        assert_eq!(j["route"]["timeout"], "4s");
        assert_eq!(j["route"]["cluster"], "c");
        assert_eq!(j["route"]["retryPolicy"]["numRetries"], 2);
        assert_eq!(j["route"]["retryPolicy"]["retryOn"], "5xx");
        assert_eq!(j["requestHeadersToAdd"].as_array().unwrap().len(), 2);
        merge(&mut dst, &src, true);
        let j = serde_json::to_value(&dst).unwrap();
        assert_eq!(j["requestHeadersToAdd"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn anys_of_one_type_merge_and_of_two_types_do_not() {
        let f = "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter";
        let any = |v: serde_json::Value| {
            let m = from_json(f, &json!({"name": "n", "typed_config": v})).unwrap();
            match &*m.get_field_by_name("typed_config").unwrap() {
                Value::Message(a) => a.clone(),
                _ => unreachable!(),
            }
        };
        let lua = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua";
        let merged = merge_any(
            &any(json!({"@type": lua, "stat_prefix": "a", "default_source_code": {"inline_string": "x"}})),
            &any(json!({"@type": lua, "stat_prefix": "b"})),
        )
        .unwrap();
        let inner = serde_json::to_value(unpack(&merged).unwrap()).unwrap();
        assert_eq!(inner["statPrefix"], "b");
        assert_eq!(inner["defaultSourceCode"]["inlineString"], "x");
        let router = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
        assert!(merge_any(&any(json!({"@type": lua})), &any(json!({"@type": router}))).is_err());
    }
}
