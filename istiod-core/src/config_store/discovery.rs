//! MeshConfig `discoverySelectors`: which namespaces the control plane sees, as istiod's
//! discovery namespace filter. With none every namespace is seen; with some, a namespaced
//! object (a Service, a Pod, an EndpointSlice, and Istio's config kinds: istiod's enhanced
//! resource scoping) is seen only when its namespace's labels match one of the selectors.
//! Cluster-scoped objects (Nodes, Namespaces) and the mesh config itself are always seen.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::Resource;

/// A Kubernetes label selector: every `matchLabels` pair and every expression must hold.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
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

impl NamespaceSelector {
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

/// Keeps what `selectors` let the control plane see; returns how many objects were dropped.
pub fn retain_selected(resources: &mut Vec<Resource>, selectors: &[NamespaceSelector]) -> usize {
    if selectors.is_empty() {
        return 0;
    }
    let seen: std::collections::BTreeSet<String> = resources
        .iter()
        .filter_map(|r| match r {
            Resource::Namespace(m) if selectors.iter().any(|s| s.selects(&m.labels)) => {
                Some(m.name.clone())
            }
            _ => None,
        })
        .collect();
    let before = resources.len();
    resources.retain(|r| match r {
        Resource::Namespace(..) | Resource::Node(..) | Resource::MeshConfig(..) => true,
        // Cluster-scoped.
        Resource::GatewayApi(_, o)
            if matches!(
                o.as_ref(),
                super::gateway_api::GatewayApiObject::GatewayClass(_)
            ) =>
        {
            true
        }
        other => seen.contains(other.metadata().namespace()),
    });
    before - resources.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_store::parse_file;

    #[test]
    fn only_selected_namespaces_are_seen() {
        let set = parse_file(
            std::path::Path::new("d.yaml"),
            r#"
kind: Namespace
metadata: {name: shop, labels: {mesh: "on", tier: web}}
---
kind: Namespace
metadata: {name: lab, labels: {tier: test}}
---
kind: Namespace
metadata: {name: ops}
---
kind: Node
metadata: {name: node-a}
---
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
kind: Service
metadata: {name: api, namespace: lab}
spec: {ports: [{name: http, port: 80}]}
---
kind: Service
metadata: {name: mon, namespace: ops}
spec: {ports: [{name: http, port: 80}]}
"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let names = |rs: &[Resource]| -> Vec<String> {
            rs.iter()
                .filter(|r| r.kind() == "Service")
                .map(|r| r.metadata().name.clone())
                .collect()
        };
        let sel = |yaml: &str| -> Vec<NamespaceSelector> {
            serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}"))
        };
        let mut all = set.clone();
        assert_eq!(
            retain_selected(&mut all, &[]),
            0,
            "no selectors: everything"
        );
        let mut rs = set.clone();
        assert_eq!(
            retain_selected(&mut rs, &sel("[{matchLabels: {mesh: 'on'}}]")),
            2
        );
        assert_eq!(names(&rs), ["web"]);
        assert!(
            rs.iter().any(|r| r.kind() == "Node"),
            "cluster-scoped stays"
        );
        assert_eq!(rs.iter().filter(|r| r.kind() == "Namespace").count(), 3);
        // Selectors are OR'ed; expressions are AND'ed within one.
        let mut rs = set.clone();
        retain_selected(
            &mut rs,
            &sel(
                "[{matchLabels: {mesh: 'on'}}, {matchExpressions: [{key: tier, operator: In, values: [test]}]}]",
            ),
        );
        assert_eq!(names(&rs), ["web", "api"]);
        let mut rs = set.clone();
        retain_selected(
            &mut rs,
            &sel("[{matchExpressions: [{key: tier, operator: DoesNotExist}]}]"),
        );
        assert_eq!(names(&rs), ["mon"]);
        let mut rs = set;
        retain_selected(
            &mut rs,
            &sel("[{matchExpressions: [{key: tier, operator: NotIn, values: [web]}]}]"),
        );
        assert_eq!(names(&rs), ["api", "mon"]);
        for (yaml, want) in [
            (
                "{matchExpressions: [{key: a, operator: In}]}",
                "needs values",
            ),
            (
                "{matchExpressions: [{key: a, operator: Exists, values: [x]}]}",
                "takes no values",
            ),
            (
                "{matchExpressions: [{key: a, operator: Equals, values: [x]}]}",
                "\"Equals\" is not",
            ),
        ] {
            let s: NamespaceSelector =
                serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}"));
            let e = s.check().unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }
}
