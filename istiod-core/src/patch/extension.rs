//! EXTENSION_CONFIG: the `TypedExtensionConfig`s EnvoyFilters ADD, served over ECDS to a proxy
//! that asks for them by name (a filter whose `config_discovery` names them), as istiod's
//! `InsertedExtensionConfigurations`: no match but `match.proxy` (the context and the listener,
//! route and cluster matches do not apply to them), ADD only (INSERT_* are ADD).
//!
//! Stricter than istiod, which sends every ADD of a requested name and so makes Envoy reject
//! the response when two filters add the same one: one config per name, the last in patch order
//! (the EnvoyFilter applied last wins, as with the other patches), and the others are logged.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;

use super::CompiledPatch;
use crate::config_store::envoy_filter::{ApplyTo, Operation};
use crate::resource::Named;

/// The ECDS resources of `patches` (a proxy's, in order) among `names`.
pub fn generate(patches: &[&CompiledPatch], names: &[Arc<str>]) -> Vec<Named> {
    let mut chosen: BTreeMap<String, (&CompiledPatch, TypedExtensionConfig)> = BTreeMap::new();
    for p in patches {
        if p.apply_to != ApplyTo::ExtensionConfig || p.operation != Operation::Add {
            continue;
        }
        let Some(config) = p.value_as::<TypedExtensionConfig>() else {
            continue;
        };
        if !names.iter().any(|n| **n == config.name) {
            continue;
        }
        if let Some((earlier, _)) = chosen.get(&config.name) {
            tracing::warn!(envoy_filter = %p.from, overrides = %earlier.from, name = %config.name,
                "two EnvoyFilters add this extension config; the later one is served");
        }
        chosen.insert(config.name.clone(), (p, config));
    }
    chosen
        .into_iter()
        .map(|(name, (_, config))| Named::new(name, envoy_types::util::pack_any(config)))
        .collect()
}
