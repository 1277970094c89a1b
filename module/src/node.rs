//! This proxy, as the agent describes it to the module in Envoy's environment
//! ([`mesh_common::module::NODE_ENV`]): Envoy's node id and the node metadata Istio's filters
//! read. Read once per process; a proxy without it (or with a description that does not parse)
//! has an empty workload, which the metrics report as `unknown`, and announces nothing.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use mesh_common::module::{NODE_ENV, Node};
use prost_types::{Struct, Value, value::Kind};

use crate::logging::{Level, log};
use crate::peer::Workload;

/// This proxy's identity in the exchange.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Own {
    /// Envoy's node id (`x-envoy-peer-metadata-id`).
    pub id: String,
    /// The workload as exchanged (all of the node's labels kept, for `additional_labels`).
    pub workload: Workload,
    /// The node metadata's `LABELS`, for the labels a config adds to the exchange.
    pub labels: BTreeMap<String, String>,
    /// `ISTIO_VERSION`, for `istio_build`.
    pub istio_version: String,
}

fn json_to_value(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }),
    };
    Value { kind: Some(kind) }
}

impl Own {
    /// The proxy `node` describes.
    pub fn from_node(node: &Node) -> Own {
        let s = Struct {
            fields: node
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        };
        let labels: BTreeMap<String, String> = node
            .metadata
            .get("LABELS")
            .and_then(|l| l.as_object())
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let mut workload = Workload::from_struct(&s, &[]);
        if workload.region.is_empty() {
            workload.region.clone_from(&node.region);
        }
        if workload.zone.is_empty() {
            workload.zone.clone_from(&node.zone);
        }
        Own {
            id: node.id.clone(),
            workload,
            labels,
            istio_version: node
                .metadata
                .get("ISTIO_VERSION")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string(),
        }
    }

    /// The workload announced to peers, with the node's labels among `additional`.
    pub fn announced(&self, additional: &[String]) -> Workload {
        let mut w = self.workload.clone();
        for k in additional {
            if let Some(v) = self.labels.get(k).filter(|v| !v.is_empty()) {
                w.labels.insert(k.clone(), v.clone());
            }
        }
        w
    }
}

/// This process's proxy, read from the environment the first time it is asked for.
pub fn own() -> &'static Own {
    static OWN: OnceLock<Own> = OnceLock::new();
    OWN.get_or_init(|| match std::env::var(NODE_ENV) {
        Ok(text) => match serde_json::from_str::<Node>(&text) {
            Ok(node) => Own::from_node(&node),
            Err(e) => {
                log(
                    Level::Error,
                    &format!("istio module: {NODE_ENV} is not a node description ({e}); this proxy's workload is unknown"),
                );
                Own::default()
            }
        },
        Err(_) => {
            log(
                Level::Warn,
                &format!("istio module: {NODE_ENV} is not set; this proxy's workload is unknown"),
            );
            Own::default()
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::peer::WorkloadType;

    #[test]
    fn a_node_as_istios_bootstrap_describes_it() {
        // The productpage node of tests/fixtures/istiod-1.31 (its metadata, trimmed).
        let node: Node = serde_json::from_str(
            r#"{"id":"sidecar~10.244.0.11~productpage-v1-b9879c6d-f9xbg.default~default.svc.cluster.local",
                "metadata":{"NAME":"productpage-v1-b9879c6d-f9xbg","NAMESPACE":"default",
                "WORKLOAD_NAME":"productpage-v1","CLUSTER_ID":"Kubernetes","ISTIO_VERSION":"1.31.0",
                "OWNER":"kubernetes://apis/apps/v1/namespaces/default/deployments/productpage-v1",
                "LABELS":{"app":"productpage","version":"v1","security.istio.io/tlsMode":"istio",
                  "service.istio.io/canonical-name":"productpage","service.istio.io/canonical-revision":"v1"},
                "APP_CONTAINERS":"productpage","MESH_ID":"cluster.local"}}"#,
        )
        .unwrap();
        let own = Own::from_node(&node);
        assert_eq!(own.workload.workload, "productpage-v1");
        assert_eq!(own.workload.workload_type, WorkloadType::Deployment);
        assert_eq!(own.workload.canonical_revision, "v1");
        assert_eq!(own.istio_version, "1.31.0");
        assert!(own.workload.labels.is_empty());
        let more = own.announced(&["security.istio.io/tlsMode".to_string()]);
        assert_eq!(more.labels["security.istio.io/tlsMode"], "istio");
    }
}
