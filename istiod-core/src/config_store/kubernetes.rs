//! The Kubernetes kinds the registry reads: Services, EndpointSlices (and Endpoints), what a Pod
//! tells of its workload, and the workload name istiod gives a pod.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::metadata::Metadata;

/// core/v1 Service.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    pub ports: Vec<ServicePortSpec>,
    pub selector: BTreeMap<String, String>,
    /// Where the Service is published outside the cluster: its load balancer's addresses
    /// (`status.loadBalancer.ingress`), else `spec.externalIPs` (filled by the parser).
    #[serde(skip)]
    pub published_ips: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServicePortSpec {
    #[serde(default)]
    pub name: String,
    pub port: u16,
    #[serde(default)]
    pub target_port: Option<serde_json::Value>,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub app_protocol: Option<String>,
}

/// core/v1 Endpoints.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct EndpointSubset {
    pub addresses: Vec<EndpointAddress>,
    pub ports: Vec<EndpointPort>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct EndpointAddress {
    pub ip: String,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct EndpointPort {
    #[serde(default)]
    pub name: String,
    pub port: u16,
}

/// discovery.k8s.io/v1 EndpointSlice (top-level `endpoints` and `ports`, as Kubernetes has them).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct EndpointSliceSpec {
    pub address_type: Option<String>,
    pub endpoints: Vec<SliceEndpoint>,
    pub ports: Vec<EndpointPort>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SliceEndpoint {
    pub addresses: Vec<String>,
    #[serde(default)]
    pub conditions: SliceConditions,
    /// The Pod behind the address, when the EndpointSlice controller made the slice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<ObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

/// An EndpointSlice endpoint's `targetRef` (the fields read).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct ObjectReference {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

/// What the registry takes from a core/v1 Pod.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodInfo {
    /// `spec.serviceAccountName` (`default` when unset, as Kubernetes defaults it).
    pub service_account: String,
    pub node_name: Option<String>,
    /// `status.podIP` first, then the rest of `status.podIPs`.
    pub ips: Vec<String>,
    pub phase: Option<String>,
    /// The workload the pod belongs to ([`pod_workload_name`]).
    #[serde(default)]
    pub workload_name: String,
}

/// The workload a pod belongs to, by istiod's heuristic (`GetDeployMetaFromPod`): a pod whose
/// name was generated is named after its controller, a ReplicaSet's Deployment when the
/// ReplicaSet's name ends in the pod's `pod-template-hash`; any other pod by its own name.
pub fn pod_workload_name(raw_meta: &serde_json::Value, meta: &Metadata) -> String {
    let generated = raw_meta
        .get("generateName")
        .and_then(|g| g.as_str())
        .is_some_and(|g| !g.is_empty());
    let controller = raw_meta
        .get("ownerReferences")
        .and_then(|o| o.as_array())
        .into_iter()
        .flatten()
        .find(|r| r.get("controller").and_then(|c| c.as_bool()) == Some(true));
    let name = match controller {
        Some(r) if generated => {
            let owner = r.get("name").and_then(|n| n.as_str()).unwrap_or_default();
            let kind = r.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
            match meta.labels.get("pod-template-hash") {
                Some(hash) if kind == "ReplicaSet" && !hash.is_empty() => owner
                    .strip_suffix(hash.as_str())
                    .and_then(|o| o.strip_suffix('-'))
                    .unwrap_or(owner),
                _ => owner,
            }
        }
        _ => "",
    };
    if name.is_empty() {
        meta.name.clone()
    } else {
        name.to_string()
    }
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct SliceConditions {
    /// Absent means ready, as Kubernetes defines it.
    pub ready: Option<bool>,
}

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What an endpoint needs of a Pod: its service account, node, addresses and phase (the rest of
/// the Pod is not kept).
pub(super) fn pod_info(
    spec: &serde_json::Value,
    status: Option<&serde_json::Value>,
    typed: &dyn Fn(&str) -> String,
) -> Result<PodInfo, String> {
    let text = |v: &serde_json::Value, field: &str| -> Result<Option<String>, String> {
        match v.get(field) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!("{}: {other} is not a string", typed(field))),
        }
    };
    let null = serde_json::Value::Null;
    let status = status.unwrap_or(&null);
    let mut ips: Vec<String> = Vec::new();
    if let Some(list) = status.get("podIPs").and_then(|v| v.as_array()) {
        for ip in list {
            if let Some(ip) = text(ip, "ip")? {
                ips.push(ip);
            }
        }
    }
    if let Some(ip) = text(status, "podIP")?
        && !ips.contains(&ip)
    {
        ips.insert(0, ip);
    }
    Ok(PodInfo {
        service_account: text(spec, "serviceAccountName")?.unwrap_or_else(|| "default".into()),
        node_name: text(spec, "nodeName")?,
        ips,
        phase: text(status, "phase")?,
        workload_name: String::new(),
    })
}

/// An EndpointSlice's addresses and ports; it must name its service by label.
pub(super) fn endpoint_slice(
    address_type: Option<String>,
    endpoints: Option<serde_json::Value>,
    ports: Option<serde_json::Value>,
    meta: &Metadata,
    typed: &dyn Fn(&str) -> String,
) -> Result<EndpointSliceSpec, String> {
    let slice = EndpointSliceSpec {
        address_type,
        endpoints: serde_json::from_value(endpoints.unwrap_or(serde_json::Value::Array(vec![])))
            .map_err(|e| format!("{}: {e}", typed("endpoints")))?,
        ports: serde_json::from_value(ports.unwrap_or(serde_json::Value::Array(vec![])))
            .map_err(|e| format!("{}: {e}", typed("ports")))?,
    };
    if !meta.labels.contains_key(SERVICE_NAME_LABEL) {
        return Err(format!(
            "EndpointSlice {}: missing label {SERVICE_NAME_LABEL}",
            meta.name
        ));
    }
    Ok(slice)
}
