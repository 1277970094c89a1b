//! EnvoyFilter, applied as istiod applies it (`pilot/pkg/networking/core/envoyfilter`): after
//! the generators, each proxy's listeners, clusters and route configurations are patched by
//! the EnvoyFilters that select it.
//!
//! - Which filters: those of the mesh's root namespace and of the proxy's namespace whose
//!   `workloadSelector` its labels satisfy (none: every proxy there); a filter with
//!   `targetRefs` applies to the Gateway API router of the Gateway it names only. Ordered by
//!   `priority`, then root namespace first, then creation time, then name.
//! - Which patches: `match.context` against the object (a router's are GATEWAY; a sidecar's
//!   inbound listeners and clusters SIDECAR_INBOUND, the rest SIDECAR_OUTBOUND) and
//!   `match.proxy` (`proxyVersion`, searched in the node's `ISTIO_VERSION`, and `metadata`).
//! - Names match exactly, as in istiod; the names we generate are Istio's (`virtualInbound`,
//!   `0.0.0.0_PORT`, `inbound|PORT||`, `outbound|PORT||HOST`, route `PORT`, vhost
//!   `inbound|http|PORT`, filter names).
//! - INSERT_BEFORE/AFTER/FIRST are ADD except for filters and routes (istiod's rewrite).
//!
//! A patch that cannot apply (a MERGE of a typed config of another type) leaves the object as
//! it was and is logged with the EnvoyFilter's name.

mod cluster;
mod extension;
mod listener;
mod route;

use std::collections::BTreeMap;
use std::sync::Arc;

use prost_reflect::DynamicMessage;

use crate::config_store::Resource;
use crate::config_store::envoy_filter::{
    ApplyTo, EnvoyFilterSpec, Operation, PatchContext, PatchMatch,
};
use crate::gateway_api::GATEWAY_NAME_LABEL;
use crate::generators::{CLUSTER_TYPE, EXTENSION_CONFIG_TYPE, LISTENER_TYPE, Named, ROUTE_TYPE};
use crate::model::Proxy;
use crate::push_context::PushContext;

/// One patch, ready to apply.
#[derive(Debug, Clone)]
pub struct CompiledPatch {
    /// `namespace/name configPatches[i]`: what logs name.
    pub from: Arc<str>,
    /// `namespace/name` of its EnvoyFilter.
    pub filter: Arc<str>,
    pub apply_to: ApplyTo,
    pub matches: PatchMatch,
    /// INSERT_* rewritten to ADD where istiod does.
    pub operation: Operation,
    pub value: Option<DynamicMessage>,
    proxy_version: Option<regex::Regex>,
}

impl CompiledPatch {
    fn context(&self) -> PatchContext {
        self.matches.context
    }

    /// The patch's context admits an object of context `ctx`.
    fn in_context(&self, ctx: PatchContext) -> bool {
        self.context() == PatchContext::Any || self.context() == ctx
    }

    /// The value as the generated message `M`.
    fn value_as<M: prost::Message + Default>(&self) -> Option<M> {
        let v = self.value.as_ref()?;
        match crate::envoy_proto::from_dynamic(v) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(envoy_filter = %self.from, error = %e, "EnvoyFilter patch value not applied");
                None
            }
        }
    }

    fn skipped(&self, why: &str) {
        tracing::warn!(envoy_filter = %self.from, why, "EnvoyFilter patch not applied");
    }
}

/// An EnvoyFilter ready to select and apply.
#[derive(Debug, Clone)]
pub struct Compiled {
    namespace: String,
    name: String,
    created: Option<Box<str>>,
    spec_selector: Option<BTreeMap<String, String>>,
    /// Gateway API Gateways (by name) its `targetRefs` name.
    gateways: Vec<String>,
    targeted: bool,
    priority: i32,
    /// Shared: a snapshot built after this one reuses them when the object is unchanged.
    patches: Arc<[CompiledPatch]>,
    /// What it was compiled from (two snapshots hold the same filters when these are equal).
    source: Arc<EnvoyFilterSpec>,
}

impl Eq for Compiled {}

impl PartialEq for Compiled {
    fn eq(&self, other: &Self) -> bool {
        (&self.namespace, &self.name, &self.created, &self.source)
            == (&other.namespace, &other.name, &other.created, &other.source)
    }
}

/// Every EnvoyFilter of `resources`, compiled. One that `previous` (the last snapshot's)
/// holds unchanged is taken from there, so values are decoded once per change of the object,
/// not once per snapshot (endpoint changes build snapshots too).
pub fn compile(resources: &[Resource], previous: &[Compiled]) -> Vec<Compiled> {
    let mut out = Vec::new();
    for r in resources {
        let Resource::EnvoyFilter(m, spec) = r else {
            continue;
        };
        let unchanged = previous.iter().find(|c| {
            c.namespace == m.namespace()
                && c.name == m.name
                && c.created == m.creation_timestamp
                && *c.source == **spec
        });
        out.push(match unchanged {
            Some(c) => c.clone(),
            None => compile_one(m.namespace(), &m.name, m.creation_timestamp.clone(), spec),
        });
    }
    out
}

fn compile_one(
    namespace: &str,
    name: &str,
    created: Option<Box<str>>,
    spec: &EnvoyFilterSpec,
) -> Compiled {
    let mut patches = Vec::new();
    let filter: Arc<str> = format!("{namespace}/{name}").into();
    for (i, p) in spec.config_patches.iter().enumerate() {
        let from: Arc<str> = format!("{namespace}/{name} configPatches[{i}]").into();
        let Some(patch) = &p.patch else { continue };
        let value = match (&patch.value, p.apply_to.message()) {
            (Some(v), Some(message)) => match crate::envoy_proto::from_json(message, v) {
                Ok(m) => Some(m),
                Err(e) => {
                    // Refused at load; a value that stops decoding is left out, not guessed.
                    tracing::warn!(envoy_filter = %from, error = %e, "EnvoyFilter patch value does not decode; left out");
                    continue;
                }
            },
            _ => None,
        };
        let relative = matches!(
            patch.operation,
            Operation::InsertBefore | Operation::InsertAfter | Operation::InsertFirst
        );
        let keeps_order = matches!(
            p.apply_to,
            ApplyTo::HttpFilter
                | ApplyTo::NetworkFilter
                | ApplyTo::HttpRoute
                | ApplyTo::ListenerFilter
        );
        let operation = if relative && !keeps_order {
            Operation::Add
        } else {
            patch.operation
        };
        let matches = p.matches.clone().unwrap_or_default();
        let proxy_version = matches
            .proxy
            .as_ref()
            .and_then(|p| p.proxy_version.as_deref())
            .and_then(|v| regex::Regex::new(v).ok());
        patches.push(CompiledPatch {
            from,
            filter: filter.clone(),
            apply_to: p.apply_to,
            matches,
            operation,
            value,
            proxy_version,
        });
    }
    Compiled {
        namespace: namespace.to_string(),
        name: name.to_string(),
        created,
        spec_selector: spec.workload_selector.as_ref().map(|s| s.labels.clone()),
        gateways: spec
            .target_refs
            .iter()
            .filter(|r| {
                r.kind == "Gateway" && matches!(r.group.as_str(), "gateway.networking.k8s.io" | "")
            })
            .map(|r| r.name.clone())
            .collect(),
        targeted: !spec.target_refs.is_empty(),
        priority: spec.priority,
        patches: patches.into(),
        source: Arc::new(spec.clone()),
    }
}

/// The patches for `proxy` (workload labels `labels`), in istiod's order.
pub fn for_proxy<'a>(
    filters: &'a [Compiled],
    proxy: &Proxy,
    labels: &BTreeMap<String, String>,
    root: &str,
) -> Vec<&'a CompiledPatch> {
    let mut chosen: Vec<&Compiled> = filters
        .iter()
        .filter(|f| f.namespace == root || f.namespace == proxy.namespace)
        .filter(|f| {
            let gateway = labels.get(GATEWAY_NAME_LABEL);
            if f.targeted {
                // Only a Gateway API router of a Gateway it names, in its namespace.
                return f.namespace == proxy.namespace
                    && gateway.is_some_and(|g| f.gateways.contains(g));
            }
            f.spec_selector
                .as_ref()
                .is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
        })
        .collect();
    chosen.sort_by(|a, b| {
        (
            a.priority,
            a.namespace != root,
            &a.created,
            &a.name,
            &a.namespace,
        )
            .cmp(&(
                b.priority,
                b.namespace != root,
                &b.created,
                &b.name,
                &b.namespace,
            ))
    });
    chosen
        .into_iter()
        .flat_map(|f| f.patches.iter())
        .filter(|p| proxy_matches(p, proxy))
        .collect()
}

/// `match.proxy`: `proxyVersion` found in `ISTIO_VERSION` (a search, as istiod's), every
/// `metadata` entry equal.
fn proxy_matches(p: &CompiledPatch, proxy: &Proxy) -> bool {
    let Some(m) = &p.matches.proxy else {
        return true;
    };
    if m.proxy_version.is_some() {
        let version = proxy.metadata.get("ISTIO_VERSION").map(String::as_str);
        match (&p.proxy_version, version) {
            (Some(re), Some(v)) if !v.is_empty() && re.is_match(v) => {}
            _ => return false,
        }
    }
    m.metadata
        .iter()
        .all(|(k, v)| proxy.metadata.get(k) == Some(v))
}

/// Patches `resources` (of `type_url`, generated for `proxy`) with the EnvoyFilters that apply.
pub fn apply(push: &PushContext, proxy: &Proxy, type_url: &str, resources: &mut Vec<Named>) {
    if push.envoy_filters.is_empty()
        || !matches!(type_url, LISTENER_TYPE | CLUSTER_TYPE | ROUTE_TYPE)
    {
        return;
    }
    let labels = proxy.workload_labels(&push.services);
    let patches = for_proxy(&push.envoy_filters, proxy, &labels, push.root_namespace());
    if patches.is_empty() {
        return;
    }
    let router = crate::generators::gateway::is_router(proxy);
    apply_patches(router, &patches, type_url, resources);
}

fn apply_patches(
    router: bool,
    patches: &[&CompiledPatch],
    type_url: &str,
    resources: &mut Vec<Named>,
) {
    match type_url {
        LISTENER_TYPE => listener::apply(router, patches, resources),
        CLUSTER_TYPE => cluster::apply(router, patches, resources),
        ROUTE_TYPE => route::apply_rds(router, patches, resources),
        _ => {}
    }
}

/// The EnvoyFilters (`namespace/name`) that change what `proxy` is sent of `type_url`, given
/// `generated` (the resources before any patch, of the names it asked for): whom a rejection
/// of that type by the proxy is reported against. Each filter is tried on its own, so this is
/// only done when a proxy rejects a response.
pub fn blame(
    push: &PushContext,
    proxy: &Proxy,
    type_url: &str,
    names: &[Arc<str>],
    generated: &[Named],
) -> Vec<String> {
    if push.envoy_filters.is_empty() {
        return Vec::new();
    }
    let labels = proxy.workload_labels(&push.services);
    let patches = for_proxy(&push.envoy_filters, proxy, &labels, push.root_namespace());
    let router = crate::generators::gateway::is_router(proxy);
    let mut filters: Vec<&Arc<str>> = patches.iter().map(|p| &p.filter).collect();
    filters.dedup();
    filters
        .into_iter()
        .filter(|f| {
            let own: Vec<&CompiledPatch> = patches
                .iter()
                .copied()
                .filter(|p| p.filter == **f)
                .collect();
            if type_url == EXTENSION_CONFIG_TYPE {
                return !extension::generate(&own, names).is_empty();
            }
            let mut patched = generated.to_vec();
            apply_patches(router, &own, type_url, &mut patched);
            patched != generated
        })
        .map(|f| f.to_string())
        .collect()
}

/// The extension configs (ECDS) among `names` that the EnvoyFilters selecting `proxy` add.
pub fn extension_configs(push: &PushContext, proxy: &Proxy, names: &[Arc<str>]) -> Vec<Named> {
    if push.envoy_filters.is_empty() || names.is_empty() {
        return Vec::new();
    }
    let labels = proxy.workload_labels(&push.services);
    let patches = for_proxy(&push.envoy_filters, proxy, &labels, push.root_namespace());
    extension::generate(&patches, names)
}

/// `resource` (an Any of `M`) decoded, patched by `f` (`None`: removed), encoded again.
fn patch_named<M: prost::Message + prost::Name + Default>(
    named: &Named,
    f: impl FnOnce(&mut M) -> bool,
) -> Option<Named> {
    let Ok(mut m) = M::decode(named.resource.value.as_slice()) else {
        return Some(named.clone());
    };
    if !f(&mut m) {
        return None;
    }
    Some(Named::new(
        named.name.clone(),
        envoy_types::util::pack_any(m),
    ))
}

/// The MERGE of `p`'s value into `target` (a generated message of Envoy type `full_name`).
fn merge_into<M: prost::Message + Default>(target: &mut M, full_name: &str, p: &CompiledPatch) {
    let Some(value) = &p.value else { return };
    let replace = p.operation == Operation::MergeAndReplaceList;
    let merged = crate::envoy_proto::to_dynamic(target, full_name).and_then(|mut d| {
        crate::envoy_proto::merge(&mut d, value, replace);
        crate::envoy_proto::from_dynamic::<M>(&d)
    });
    match merged {
        Ok(m) => *target = m,
        Err(e) => p.skipped(&e),
    }
}

/// The MERGE of a filter's typed config (`dst`, an Any) with a patch's (`src`).
fn merge_typed_config(
    dst: &envoy_types::pb::google::protobuf::Any,
    src: &envoy_types::pb::google::protobuf::Any,
    p: &CompiledPatch,
) -> Option<envoy_types::pb::google::protobuf::Any> {
    const ANY: &str = "google.protobuf.Any";
    let merged = crate::envoy_proto::to_dynamic(dst, ANY).and_then(|d| {
        let s = crate::envoy_proto::to_dynamic(src, ANY)?;
        let m = crate::envoy_proto::merge_any(&d, &s)?;
        crate::envoy_proto::from_dynamic(&m)
    });
    match merged {
        Ok(a) => Some(a),
        Err(e) => {
            p.skipped(&e);
            None
        }
    }
}

/// A transport socket MERGE: the typed config of the patch's socket `src` merged into `dst`'s
/// (the same socket by name; istiod applies nothing else of such a patch).
fn merge_transport_socket(
    dst: &mut envoy_types::pb::envoy::config::core::v3::TransportSocket,
    src: &envoy_types::pb::envoy::config::core::v3::TransportSocket,
    p: &CompiledPatch,
) {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    if let (Some(ConfigType::TypedConfig(s)), Some(ConfigType::TypedConfig(d))) =
        (&src.config_type, &dst.config_type)
        && let Some(m) = merge_typed_config(d, s, p)
    {
        dst.config_type = Some(ConfigType::TypedConfig(m));
    }
}

/// Where an object of a sidecar goes: inbound or outbound.
fn sidecar_context(inbound: bool) -> PatchContext {
    if inbound {
        PatchContext::SidecarInbound
    } else {
        PatchContext::SidecarOutbound
    }
}

/// Whether an ADD of context `add` goes to the objects of context `list` (an ANY ADD goes to
/// the outbound and gateway lists only, as in istiod).
fn adds_to(add: PatchContext, list: PatchContext) -> bool {
    add == list
        || (add == PatchContext::Any
            && matches!(list, PatchContext::SidecarOutbound | PatchContext::Gateway))
}

/// The patches of an EnvoyFilter spec written as YAML (namespace `ns`), for the tests.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
fn compiled_for_tests(yaml: &str) -> Vec<CompiledPatch> {
    let spec: EnvoyFilterSpec = serde_yaml_ng::from_str(yaml).unwrap();
    compile_one("ns", "f", None, &spec).patches.to_vec()
}

#[cfg(test)]
mod tests;
