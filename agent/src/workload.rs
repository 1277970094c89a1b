//! This proxy's workload as Istio's labels name it: the canonical service and revision (the
//! injector's labels, else the app's, else the workload's name and `latest`), which Envoy's
//! span tags and the proxy module's node description carry.

use crate::config::Config;

pub const CANONICAL_NAME: &str = "service.istio.io/canonical-name";
pub const CANONICAL_REVISION: &str = "service.istio.io/canonical-revision";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub name: String,
    pub canonical_service: String,
    pub canonical_revision: String,
}

impl Workload {
    /// This proxy's workload, from its node metadata and labels.
    pub fn own(cfg: &Config) -> Workload {
        let label = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| cfg.labels.get(*k).filter(|v| !v.is_empty()).cloned())
        };
        let name = cfg
            .metadata
            .iter()
            .find(|(n, v)| n == "WORKLOAD_NAME" && !v.is_empty())
            .map_or_else(|| "unknown".to_string(), |(_, v)| v.clone());
        Workload {
            canonical_service: label(&[CANONICAL_NAME, "app.kubernetes.io/name", "app"])
                .unwrap_or_else(|| name.clone()),
            canonical_revision: label(&[
                CANONICAL_REVISION,
                "app.kubernetes.io/version",
                "version",
            ])
            .unwrap_or_else(|| "latest".to_string()),
            name,
        }
    }
}
