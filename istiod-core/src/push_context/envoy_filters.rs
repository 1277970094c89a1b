//! The snapshot's EnvoyFilters, compiled once per change of the object (patch values decoded,
//! `proxyVersion` regexes built, INSERT_* rewritten to ADD where istiod does) and selected per
//! proxy in istiod's order (`pilot/pkg/model/envoyfilter.go`): those of the mesh's root
//! namespace and of the proxy's namespace whose `workloadSelector` its labels satisfy; one with
//! `targetRefs` applies to the Gateway API router of the Gateway it names only. Ordered by
//! `priority`, then root namespace first, then creation time, then name. The pass that applies
//! them to generated resources is `crate::patch`.

use std::collections::BTreeMap;
use std::sync::Arc;

use prost_reflect::DynamicMessage;

use crate::config_store::Resource;
use crate::config_store::envoy_filter::{
    ApplyTo, EnvoyFilterSpec, Operation, PatchContext, PatchMatch,
};
use crate::gateway_conversion::GATEWAY_NAME_LABEL;
use crate::model::Proxy;

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
    pub fn context(&self) -> PatchContext {
        self.matches.context
    }

    /// The patch's context admits an object of context `ctx`.
    pub fn in_context(&self, ctx: PatchContext) -> bool {
        self.context() == PatchContext::Any || self.context() == ctx
    }

    /// The value as the generated message `M`.
    pub fn value_as<M: prost::Message + Default>(&self) -> Option<M> {
        let v = self.value.as_ref()?;
        match crate::envoy_proto::from_dynamic(v) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(envoy_filter = %self.from, error = %e, "EnvoyFilter patch value not applied");
                None
            }
        }
    }

    pub fn skipped(&self, why: &str) {
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
    pub(crate) patches: Arc<[CompiledPatch]>,
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

/// The patches of an EnvoyFilter spec written as YAML (namespace `ns`), for the tests.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn compiled_for_tests(yaml: &str) -> Vec<CompiledPatch> {
    let spec: EnvoyFilterSpec = serde_yaml_ng::from_str(yaml).unwrap();
    compile_one("ns", "f", None, &spec).patches.to_vec()
}
