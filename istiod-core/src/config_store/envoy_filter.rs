//! networking.istio.io EnvoyFilter, typed field by field (istio/api `envoy_filter.proto`).
//! Validation follows istiod's (`pkg/config/validation/envoyfilter`), and is stricter where a
//! mistake would otherwise reach Envoy: every patch `value` must decode as the Envoy message its
//! `applyTo` patches (unknown fields refused, every `@type` known, a TypedStruct's value fitting
//! its `type_url`), named by patch index and field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::selector::WorkloadSelector;

/// The EnvoyFilter spec.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct EnvoyFilterSpec {
    pub workload_selector: Option<WorkloadSelector>,
    pub target_refs: Vec<TargetRef>,
    pub config_patches: Vec<ConfigPatch>,
    pub priority: i32,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct TargetRef {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ConfigPatch {
    pub apply_to: ApplyTo,
    #[serde(rename = "match")]
    pub matches: Option<PatchMatch>,
    pub patch: Option<Patch>,
}

/// What a patch applies to.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ApplyTo {
    #[default]
    Invalid,
    Listener,
    FilterChain,
    NetworkFilter,
    HttpFilter,
    RouteConfiguration,
    VirtualHost,
    HttpRoute,
    Cluster,
    ExtensionConfig,
    Bootstrap,
    ListenerFilter,
}

impl ApplyTo {
    /// The Envoy message a patch value of this kind is (istiod's `pkg/config/xds`).
    pub fn message(self) -> Option<&'static str> {
        Some(match self {
            ApplyTo::Listener => "envoy.config.listener.v3.Listener",
            ApplyTo::FilterChain => "envoy.config.listener.v3.FilterChain",
            ApplyTo::NetworkFilter => "envoy.config.listener.v3.Filter",
            ApplyTo::HttpFilter => {
                "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter"
            }
            ApplyTo::RouteConfiguration => "envoy.config.route.v3.RouteConfiguration",
            ApplyTo::VirtualHost => "envoy.config.route.v3.VirtualHost",
            ApplyTo::HttpRoute => "envoy.config.route.v3.Route",
            ApplyTo::Cluster => "envoy.config.cluster.v3.Cluster",
            ApplyTo::ExtensionConfig => "envoy.config.core.v3.TypedExtensionConfig",
            ApplyTo::Bootstrap => "envoy.config.bootstrap.v3.Bootstrap",
            ApplyTo::ListenerFilter => "envoy.config.listener.v3.ListenerFilter",
            ApplyTo::Invalid => return None,
        })
    }

    fn is_listener_class(self) -> bool {
        matches!(
            self,
            ApplyTo::Listener | ApplyTo::FilterChain | ApplyTo::NetworkFilter | ApplyTo::HttpFilter
        )
    }

    fn is_route_class(self) -> bool {
        matches!(
            self,
            ApplyTo::RouteConfiguration | ApplyTo::VirtualHost | ApplyTo::HttpRoute
        )
    }
}

/// Where a patch applies.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PatchContext {
    #[default]
    Any,
    SidecarInbound,
    SidecarOutbound,
    Gateway,
    Waypoint,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct PatchMatch {
    pub context: PatchContext,
    pub proxy: Option<ProxyMatch>,
    pub listener: Option<ListenerMatch>,
    pub route_configuration: Option<RouteConfigurationMatch>,
    pub cluster: Option<ClusterMatch>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ProxyMatch {
    pub proxy_version: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ListenerMatch {
    pub port_number: u32,
    pub port_name: Option<String>,
    pub filter_chain: Option<FilterChainMatch>,
    pub name: Option<String>,
    pub listener_filter: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct FilterChainMatch {
    pub name: Option<String>,
    pub sni: Option<String>,
    pub transport_protocol: Option<String>,
    pub application_protocols: Option<String>,
    pub filter: Option<FilterMatch>,
    pub destination_port: u32,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct FilterMatch {
    pub name: String,
    pub sub_filter: Option<SubFilterMatch>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct SubFilterMatch {
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct RouteConfigurationMatch {
    pub port_number: u32,
    pub port_name: Option<String>,
    pub gateway: Option<String>,
    pub vhost: Option<VirtualHostMatch>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct VirtualHostMatch {
    pub name: Option<String>,
    pub route: Option<RouteMatch>,
    pub domain_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct RouteMatch {
    pub name: Option<String>,
    pub action: RouteAction,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RouteAction {
    #[default]
    Any,
    Route,
    Redirect,
    DirectResponse,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ClusterMatch {
    pub port_number: u32,
    pub service: Option<String>,
    pub subset: Option<String>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct Patch {
    pub operation: Operation,
    pub value: Option<serde_json::Value>,
    pub filter_class: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Operation {
    #[default]
    Invalid,
    Merge,
    Add,
    Remove,
    InsertBefore,
    InsertAfter,
    InsertFirst,
    Replace,
    MergeAndReplaceList,
}

/// istiod's checks, then every value decoded as its message; warnings (accepted, not acted on
/// as written) go to `warnings`.
pub fn validate(spec: &EnvoyFilterSpec, warnings: &mut Vec<String>) -> Result<(), String> {
    if spec.workload_selector.is_some() && !spec.target_refs.is_empty() {
        return Err("only one of targetRefs or workloadSelector can be set".into());
    }
    if let Some(sel) = &spec.workload_selector {
        for (k, v) in &sel.labels {
            if k.is_empty() {
                return Err(format!(
                    "workloadSelector: empty key is not supported in selector: \"={v}\""
                ));
            }
            if k.contains('*') || v.contains('*') {
                return Err(format!(
                    "workloadSelector: wildcard is not supported in selector: \"{k}={v}\""
                ));
            }
        }
    }
    for (i, r) in spec.target_refs.iter().enumerate() {
        if r.namespace.as_deref().is_some_and(|n| !n.is_empty()) {
            return Err(format!(
                "targetRefs[{i}].namespace: cross namespace referencing is not currently supported"
            ));
        }
    }
    for (i, p) in spec.config_patches.iter().enumerate() {
        let at = format!("configPatches[{i}]");
        check_patch(&at, p, warnings)?;
    }
    Ok(())
}

fn check_patch(at: &str, p: &ConfigPatch, warnings: &mut Vec<String>) -> Result<(), String> {
    let Some(message) = p.apply_to.message() else {
        return Err(format!("{at}.applyTo: missing applyTo"));
    };
    let Some(patch) = &p.patch else {
        return Err(format!("{at}.patch: missing patch"));
    };
    if patch.operation == Operation::Invalid {
        return Err(format!("{at}.patch.operation: missing patch operation"));
    }
    if patch.value.is_none() && patch.operation != Operation::Remove {
        return Err(format!(
            "{at}.patch.value: missing patch value for non-remove operation"
        ));
    }
    let m = p.matches.clone().unwrap_or_default();
    if let Some(v) = m.proxy.as_ref().and_then(|p| p.proxy_version.as_ref()) {
        mesh_common::re2::check_regex(&format!("{at}.match.proxy.proxyVersion"), v)?;
    }
    if p.apply_to.is_listener_class() && (m.route_configuration.is_some() || m.cluster.is_some()) {
        return Err(format!(
            "{at}.match: applyTo for listener class objects cannot have non listener match"
        ));
    }
    if p.apply_to.is_route_class() && (m.listener.is_some() || m.cluster.is_some()) {
        return Err(format!(
            "{at}.match: applyTo for http route class objects cannot have non route configuration match"
        ));
    }
    if p.apply_to == ApplyTo::Cluster && (m.listener.is_some() || m.route_configuration.is_some()) {
        return Err(format!(
            "{at}.match: applyTo for cluster class objects cannot have non cluster match"
        ));
    }
    if let Some(f) = m
        .listener
        .as_ref()
        .and_then(|l| l.filter_chain.as_ref())
        .and_then(|fc| fc.filter.as_ref())
    {
        if f.name.is_empty() {
            return Err(format!(
                "{at}.match.listener.filterChain.filter: filter match has no name to match on"
            ));
        }
        if let Some(sub) = &f.sub_filter {
            if p.apply_to != ApplyTo::HttpFilter {
                return Err(format!(
                    "{at}.match.listener.filterChain.filter.subFilter: subfilter match can be used with applyTo HTTP_FILTER only"
                ));
            }
            if f.name != HCM {
                return Err(format!(
                    "{at}.match.listener.filterChain.filter.subFilter: subfilter match requires filter match with {HCM}"
                ));
            }
            if sub.name.is_empty() {
                return Err(format!(
                    "{at}.match.listener.filterChain.filter.subFilter: subfilter match has no name to match on"
                ));
            }
        }
        if matches!(p.apply_to, ApplyTo::Listener | ApplyTo::FilterChain) {
            warnings.push(format!(
                "{at}.match.listener.filterChain.filter: filter match has no effect when used with LISTENER or FILTER_CHAIN"
            ));
        }
    }
    if let Some(value) = &patch.value {
        crate::envoy_proto::from_json(message, value)
            .map_err(|e| format!("{at}.patch.value ({message}): {e}"))?;
        if p.apply_to == ApplyTo::ExtensionConfig {
            check_extension_config(at, value)?;
        }
    }
    // What istiod accepts but never acts on: said once, not refused.
    let inert = match (p.apply_to, patch.operation) {
        (ApplyTo::Bootstrap, _) => Some("BOOTSTRAP patches are not applied (as in Istio)"),
        (ApplyTo::RouteConfiguration, op) if !is_merge(op) => {
            Some("ROUTE_CONFIGURATION takes MERGE only; other operations do nothing (as in Istio)")
        }
        (
            ApplyTo::Listener | ApplyTo::FilterChain | ApplyTo::Cluster | ApplyTo::HttpRoute,
            Operation::Replace,
        ) => Some("REPLACE does nothing for this applyTo (as in Istio)"),
        (
            ApplyTo::NetworkFilter | ApplyTo::HttpFilter | ApplyTo::ListenerFilter,
            Operation::MergeAndReplaceList,
        ) => Some("MERGE_AND_REPLACE_LIST does nothing for filters (as in Istio)"),
        (ApplyTo::ExtensionConfig, op)
            if !matches!(
                op,
                Operation::Add
                    | Operation::InsertBefore
                    | Operation::InsertAfter
                    | Operation::InsertFirst
            ) =>
        {
            Some("EXTENSION_CONFIG takes ADD only; other operations do nothing (as in Istio)")
        }
        _ => None,
    };
    if let Some(why) = inert {
        warnings.push(format!("{at}: {why}"));
    }
    if m.context == PatchContext::Waypoint {
        warnings.push(format!(
            "{at}.match.context: WAYPOINT patches are not applied (no waypoints here)"
        ));
    }
    if patch.filter_class.is_some() {
        warnings.push(format!(
            "{at}.patch.filterClass: not applied (as in Istio, which never reads it)"
        ));
    }
    if m.listener.as_ref().is_some_and(|l| l.port_name.is_some()) {
        warnings.push(format!(
            "{at}.match.listener.portName: not applied (as in Istio)"
        ));
    }
    Ok(())
}

/// An extension config is served by its name, and is nothing without its config (Envoy would
/// reject it; istiod sends it anyway).
fn check_extension_config(at: &str, value: &serde_json::Value) -> Result<(), String> {
    let field = |a: &str, b: &str| value.get(a).or_else(|| value.get(b)).cloned();
    if field("name", "name")
        .as_ref()
        .and_then(serde_json::Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(format!(
            "{at}.patch.value.name: an extension config needs the name a filter's configDiscovery asks for"
        ));
    }
    if field("typed_config", "typedConfig").is_none() {
        return Err(format!(
            "{at}.patch.value.typed_config: an extension config needs its typed_config"
        ));
    }
    Ok(())
}

fn is_merge(op: Operation) -> bool {
    matches!(op, Operation::Merge | Operation::MergeAndReplaceList)
}

/// The name of Envoy's HTTP connection manager filter.
pub const HCM: &str = "envoy.filters.network.http_connection_manager";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn check(yaml: &str) -> Result<Vec<String>, String> {
        let spec: EnvoyFilterSpec = serde_yaml_ng::from_str(yaml).unwrap();
        let mut w = Vec::new();
        validate(&spec, &mut w).map(|()| w)
    }

    #[test]
    fn a_patch_whose_value_is_not_its_message_is_refused_by_index_and_field() {
        let e = check(
            "configPatches:\n- applyTo: HTTP_ROUTE\n  patch: {operation: MERGE, value: {route: {timeuot: 4s}}}\n",
        )
        .unwrap_err();
        assert!(
            e.starts_with("configPatches[0].patch.value (envoy.config.route.v3.Route)"),
            "{e}"
        );
        assert!(e.contains("timeuot"), "{e}");
        let e = check(
            "configPatches:\n- applyTo: HTTP_FILTER\n  patch: {operation: ADD, value: {name: x, typed_config: {'@type': type.googleapis.com/envoy.Nope}}}\n",
        )
        .unwrap_err();
        assert!(e.contains("envoy.Nope"), "{e}");
        check("configPatches:\n- applyTo: HTTP_ROUTE\n  patch: {operation: MERGE, value: {route: {timeout: 4s}}}\n").unwrap();
    }

    #[test]
    fn an_extension_config_needs_its_name_and_config() {
        let e = check(
            "configPatches:\n- applyTo: EXTENSION_CONFIG\n  patch: {operation: ADD, value: {typed_config: {'@type': type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua}}}\n",
        )
        .unwrap_err();
        assert!(e.starts_with("configPatches[0].patch.value.name"), "{e}");
        let e = check(
            "configPatches:\n- applyTo: EXTENSION_CONFIG\n  patch: {operation: ADD, value: {name: x}}\n",
        )
        .unwrap_err();
        assert!(
            e.starts_with("configPatches[0].patch.value.typed_config"),
            "{e}"
        );
        // INSERT_* is ADD for extension configs: applied, so no warning.
        let w = check("configPatches:\n- applyTo: EXTENSION_CONFIG\n  patch: {operation: INSERT_FIRST, value: {name: x, typedConfig: {'@type': type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua}}}\n").unwrap();
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn istiods_structural_checks() {
        let cases = [
            (
                "configPatches: [{patch: {operation: ADD, value: {}}}]",
                "missing applyTo",
            ),
            ("configPatches: [{applyTo: CLUSTER}]", "missing patch"),
            (
                "configPatches: [{applyTo: CLUSTER, patch: {value: {}}}]",
                "missing patch operation",
            ),
            (
                "configPatches: [{applyTo: CLUSTER, patch: {operation: ADD}}]",
                "missing patch value",
            ),
            (
                "configPatches: [{applyTo: CLUSTER, match: {listener: {}}, patch: {operation: REMOVE}}]",
                "cluster class",
            ),
            (
                "configPatches: [{applyTo: HTTP_ROUTE, match: {cluster: {}}, patch: {operation: REMOVE}}]",
                "route configuration match",
            ),
            (
                "configPatches: [{applyTo: LISTENER, match: {cluster: {}}, patch: {operation: REMOVE}}]",
                "non listener match",
            ),
            (
                "configPatches: [{applyTo: NETWORK_FILTER, match: {listener: {filterChain: {filter: {name: x, subFilter: {name: y}}}}}, patch: {operation: REMOVE}}]",
                "HTTP_FILTER only",
            ),
            (
                "configPatches: [{applyTo: HTTP_FILTER, match: {listener: {filterChain: {filter: {name: x, subFilter: {name: y}}}}}, patch: {operation: REMOVE}}]",
                "requires filter match",
            ),
            (
                "configPatches: [{applyTo: CLUSTER, match: {proxy: {proxyVersion: '('}}, patch: {operation: REMOVE}}]",
                "proxyVersion",
            ),
            (
                "workloadSelector: {labels: {a: b}}\ntargetRefs: [{kind: Gateway, name: g}]",
                "only one of",
            ),
        ];
        for (yaml, want) in cases {
            let e = check(yaml).unwrap_err();
            assert!(e.contains(want), "{yaml}: {e}");
        }
        let w =
            check("configPatches: [{applyTo: BOOTSTRAP, patch: {operation: MERGE, value: {}}}]")
                .unwrap();
        assert!(w[0].contains("not applied"), "{w:?}");
    }
}
