//! CLUSTER patches (istiod's `cluster_patch.go`).

use envoy_types::pb::envoy::config::cluster::v3::Cluster;

use super::{CompiledPatch, Named, adds_to, merge_into, merge_transport_socket, patch_named};
use crate::config_store::envoy_filter::{ApplyTo, Operation, PatchContext};
use crate::resource::INBOUND_PASSTHROUGH_CLUSTER;

const CLUSTER: &str = "envoy.config.cluster.v3.Cluster";

pub(super) fn apply(router: bool, patches: &[&CompiledPatch], resources: &mut Vec<Named>) {
    let patches: Vec<&CompiledPatch> = patches
        .iter()
        .copied()
        .filter(|p| p.apply_to == ApplyTo::Cluster)
        .collect();
    if patches.is_empty() {
        return;
    }
    let mut out = Vec::with_capacity(resources.len());
    for named in resources.iter() {
        out.extend(patch_named::<Cluster>(named, |c| {
            patch_cluster(c, context(router, &c.name), &patches)
        }));
    }
    let lists: &[PatchContext] = if router {
        &[PatchContext::Gateway]
    } else {
        &[PatchContext::SidecarOutbound, PatchContext::SidecarInbound]
    };
    for p in patches.iter().filter(|p| p.operation == Operation::Add) {
        if !lists.iter().any(|l| adds_to(p.context(), *l)) {
            continue;
        }
        if let Some(c) = p.value_as::<Cluster>()
            && !out.iter().any(|n| n.name == c.name)
        {
            out.push(Named::new(c.name.clone(), envoy_types::util::pack_any(c)));
        }
    }
    *resources = out;
}

/// A router's clusters are GATEWAY; a sidecar's inbound ones SIDECAR_INBOUND, the rest
/// SIDECAR_OUTBOUND.
fn context(router: bool, name: &str) -> PatchContext {
    if router {
        return PatchContext::Gateway;
    }
    super::sidecar_context(name.starts_with("inbound|") || name == INBOUND_PASSTHROUGH_CLUSTER)
}

/// `match.cluster`: a name matches it alone; else the parts of `dir|port|subset|host`.
fn cluster_matches(name: &str, p: &CompiledPatch) -> bool {
    let Some(m) = &p.matches.cluster else {
        return true;
    };
    if let Some(n) = &m.name {
        return n == name;
    }
    let parts: Vec<&str> = name.split('|').collect();
    let (port, subset, host) = match parts[..] {
        [_, port, subset, host] => (port.parse::<u32>().unwrap_or(0), subset, host),
        _ => (0, "", ""),
    };
    m.subset.as_deref().is_none_or(|s| s == subset)
        && m.service.as_deref().is_none_or(|s| s == host)
        && (m.port_number == 0 || m.port_number == port)
}

/// One cluster patched; `false`: removed.
fn patch_cluster(c: &mut Cluster, ctx: PatchContext, patches: &[&CompiledPatch]) -> bool {
    for p in patches {
        if !(p.in_context(ctx) && cluster_matches(&c.name, p)) {
            continue;
        }
        match p.operation {
            Operation::Remove => return false,
            Operation::Merge | Operation::MergeAndReplaceList => merge_cluster(c, p),
            _ => {}
        }
    }
    true
}

/// A cluster MERGE: a transport socket in the patch merges into the socket of that name (the
/// rest of the patch is not applied, as in istiod); otherwise the whole value is merged.
fn merge_cluster(c: &mut Cluster, p: &CompiledPatch) {
    let Some(src) = p.value_as::<Cluster>().and_then(|v| v.transport_socket) else {
        merge_into(c, CLUSTER, p);
        return;
    };
    if !c.transport_socket_matches.is_empty() {
        match c
            .transport_socket_matches
            .iter_mut()
            .filter_map(|m| m.transport_socket.as_mut())
            .find(|ts| ts.name == src.name)
        {
            Some(ts) => merge_transport_socket(ts, &src, p),
            None => p.skipped("no transport socket of that name in the cluster's matches"),
        }
        return;
    }
    match &mut c.transport_socket {
        Some(ts) if ts.name == src.name => merge_transport_socket(ts, &src, p),
        _ => c.transport_socket = Some(src.clone()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cluster_matches_by_name_alone_or_by_its_parts() {
        let c = crate::push_context::envoy_filters::compiled_for_tests(
            "configPatches:\n- {applyTo: CLUSTER, match: {cluster: {subset: v1, portNumber: 9080}}, patch: {operation: REMOVE}}\n- {applyTo: CLUSTER, match: {cluster: {name: exact, service: ignored}}, patch: {operation: REMOVE}}\n",
        );
        let (parts, name) = (&c[0], &c[1]);
        assert!(cluster_matches(
            "outbound|9080|v1|r.ns.svc.cluster.local",
            parts
        ));
        assert!(!cluster_matches(
            "outbound|9080|v2|r.ns.svc.cluster.local",
            parts
        ));
        assert!(!cluster_matches(
            "outbound|9081|v1|r.ns.svc.cluster.local",
            parts
        ));
        assert!(cluster_matches("exact", name));
        assert!(!cluster_matches("outbound|9080||ignored", name));
        assert_eq!(
            context(false, "inbound|9080||"),
            PatchContext::SidecarInbound
        );
        assert_eq!(
            context(false, "outbound|9080||x"),
            PatchContext::SidecarOutbound
        );
        assert_eq!(context(true, "inbound|9080||"), PatchContext::Gateway);
    }
}
