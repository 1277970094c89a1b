//! MeshConfig `discoverySelectors`: which namespaces the control plane sees, as istiod's
//! discovery namespace filter. With none every namespace is seen; with some, a namespaced
//! object (a Service, a Pod, an EndpointSlice, and Istio's config kinds: istiod's enhanced
//! resource scoping) is seen only when its namespace's labels match one of the selectors.
//! Cluster-scoped objects (Nodes, Namespaces) and the mesh config itself are always seen.

use super::Resource;
use super::selector::LabelSelector;

/// Keeps what `selectors` let the control plane see; returns how many objects were dropped.
pub fn retain_selected(resources: &mut Vec<Resource>, selectors: &[LabelSelector]) -> usize {
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
        let sel = |yaml: &str| -> Vec<LabelSelector> {
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
            let s: LabelSelector = serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}"));
            let e = s.check().unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }
}
