//! The EnvoyFilter pass, as istiod applies EnvoyFilters (`pilot/pkg/networking/core/envoyfilter`):
//! after the generators, each proxy's listeners, clusters and route configurations are patched
//! by the EnvoyFilters that select it (compiled and selected in the snapshot,
//! `push_context::envoy_filters`).
//!
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

use std::sync::Arc;

use crate::config_store::envoy_filter::{Operation, PatchContext};
use crate::model::Proxy;
use crate::push_context::PushContext;
use crate::push_context::envoy_filters::{CompiledPatch, for_proxy};
use crate::resource::{CLUSTER_TYPE, EXTENSION_CONFIG_TYPE, LISTENER_TYPE, Named, ROUTE_TYPE};

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
    let router = proxy.is_router();
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
    let router = proxy.is_router();
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

#[cfg(test)]
mod tests;
