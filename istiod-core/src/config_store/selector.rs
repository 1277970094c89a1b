//! The selectors of config documents, one type per kind of selector:
//! - [`WorkloadSelector`]: networking.istio.io's (`labels`: Sidecar, ServiceEntry, EnvoyFilter);
//! - [`PolicySelector`]: `istio.type.v1beta1.WorkloadSelector` (`matchLabels`: the security and
//!   telemetry policies, and DestinationRule's `workloadSelector`);
//! - [`LabelSelector`]: Kubernetes' (`matchLabels` and `matchExpressions`: MeshConfig
//!   `discoverySelectors`, the Gateway API's namespace selectors).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// networking.istio.io's WorkloadSelector: the workloads whose labels hold every pair.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct WorkloadSelector {
    pub labels: BTreeMap<String, String>,
}

/// Istio's policy selector (`istio.type.v1beta1.WorkloadSelector`): the workloads whose labels
/// hold every pair. An unknown field is refused: a misspelt selector must not select every
/// workload of the namespace.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySelector {
    pub match_labels: BTreeMap<String, String>,
}

/// Kubernetes' LabelSelector (MeshConfig `discoverySelectors`, the Gateway API's namespace
/// selectors): every `matchLabels` pair and every expression must hold.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<Requirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Kubernetes' rules for a selector: `In`/`NotIn` need values, `Exists`/`DoesNotExist`
    /// take none; nothing else is an operator.
    pub fn check(&self) -> Result<(), String> {
        for (i, r) in self.match_expressions.iter().enumerate() {
            match (r.operator.as_str(), r.values.is_empty()) {
                ("In" | "NotIn", false) | ("Exists" | "DoesNotExist", true) => {}
                ("In" | "NotIn", true) => {
                    return Err(format!(
                        "matchExpressions[{i}]: operator {} needs values",
                        r.operator
                    ));
                }
                ("Exists" | "DoesNotExist", false) => {
                    return Err(format!(
                        "matchExpressions[{i}]: operator {} takes no values",
                        r.operator
                    ));
                }
                (other, _) => {
                    return Err(format!(
                        "matchExpressions[{i}].operator: {other:?} is not In, NotIn, Exists or DoesNotExist"
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => value.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }
}
