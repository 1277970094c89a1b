//! The config store (`istiod_core::config_store::parse_file`, YAML and JSON, one or many
//! documents), then what a parsed file feeds: the snapshot and the generators. Any text is a set
//! of resources or an error naming the document, never a panic; a set that passes validation
//! builds a snapshot (or a named error) whose CDS, LDS, RDS, EDS and NDS generate for a
//! sidecar and a gateway without a panic (STYLE.md: a value that passed validation cannot
//! panic a generator).
//!
//! Input: a config file. A first line `# proxy: <node id>` (as in the goldens) adds that proxy.
//!
//! `istiod-core/tests/fuzz_seeds.rs` replays the seeds through a copy of this body on stable:
//! keep the two in step.
#![no_main]

use std::path::Path;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use istiod_core::config_store::{ConfigError, ConfigSet, parse_file};
use istiod_core::generators::{cds, eds, nds};
use istiod_core::model::Proxy;
use istiod_core::push_context::PushContext;
use libfuzzer_sys::fuzz_target;
use prost::Message;

const PROXIES: [&str; 2] = [
    "sidecar~10.1.0.50~client-1.default~default.svc.cluster.local",
    "router~10.1.0.60~ingress-1.istio-system~istio-system.svc.cluster.local",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let resources = match parse_file(Path::new("fuzz.yaml"), text) {
        Ok(r) => r,
        Err(ConfigError::Invalid { doc, reason, .. }) => {
            assert!(doc >= 1 && !reason.is_empty());
            return;
        }
        Err(e) => panic!("parse_file reads no files, yet: {e}"),
    };
    if resources.is_empty() {
        return;
    }
    let config = Arc::new(ConfigSet { resources });
    let Ok(push) = PushContext::build(config, "cluster.local", "fuzz".into()) else {
        return;
    };
    let named = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# proxy: "))
        .map(str::trim);
    for id in PROXIES.iter().copied().chain(named) {
        let Ok(proxy) = Proxy::from_node_id(id) else {
            continue;
        };
        let clusters = cds::generate(&push, &proxy);
        let _ = istiod_core::generators::listeners(&push, &proxy);
        let eds_names: Vec<String> = clusters
            .iter()
            .filter_map(|n| Cluster::decode(n.resource.value.as_slice()).ok())
            .map(|c| c.name)
            .collect();
        let _ = eds::generate(&push, &proxy, &eds_names);
        let _ = istiod_core::generators::routes(&push, &proxy, &push.route_names());
        let _ = nds::generate(&push, &proxy);
    }
});
