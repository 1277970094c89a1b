//! Config ingestion: Kubernetes-style YAML or JSON documents from a directory, turned into typed
//! resources. Mirrors istiod's file config source (`pilot/pkg/config/file`), where one directory of
//! manifests stands in for the Kubernetes API server.
//!
//! The watched directory is read document by document (`dir`): a document that is invalid or of
//! a kind not served here is refused alone, its last good version kept. `parse_file`,
//! `load_dir` and `validate_dir` are the strict forms (`istiod-core validate`, tests): the first
//! error fails them, naming the file and the document.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub mod authorization;
pub mod destination_rule;
pub mod dir;
pub mod discovery;
pub mod envoy_filter;
pub mod gateway;
pub mod gateway_api;
pub mod locality;
pub mod providers;
pub mod request_authentication;
pub mod telemetry;
pub mod traffic;
pub mod values;
pub mod virtual_service;
pub use authorization::AuthorizationPolicySpec;
pub use destination_rule::DestinationRuleSpec;
pub use gateway::{GatewaySpec, TlsSecret};
pub use request_authentication::RequestAuthenticationSpec;
pub use virtual_service::VirtualServiceSpec;

use authorization::validate_authorization_policy;
use destination_rule::validate_destination_rule;
use request_authentication::validate_request_authentication;
use virtual_service::validate_virtual_service;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config directory {dir}: {source}")]
    ReadDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {file}: {source}")]
    ReadFile {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: document {doc}: {reason}")]
    Invalid {
        file: PathBuf,
        doc: usize,
        reason: String,
    },
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct Metadata {
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// When the API server created the object (RFC 3339, so it sorts as text): the Gateway
    /// API orders conflicting routes oldest first.
    #[serde(
        default,
        rename = "creationTimestamp",
        skip_serializing_if = "Option::is_none"
    )]
    pub creation_timestamp: Option<Box<str>>,
    /// What was accepted but is not acted on (unknown fields, fields not applied), each naming
    /// the field: logged on load and shown by /debug/configz, never silently dropped.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// Metadata fields Kubernetes sets or users write that mean nothing here but are no mistake.
const KNOWN_METADATA: &[&str] = &[
    "name",
    "namespace",
    "labels",
    "annotations",
    "creationTimestamp",
    "uid",
    "resourceVersion",
    "generation",
    "managedFields",
    "ownerReferences",
    "finalizers",
    "generateName",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

impl Metadata {
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }
}

/// networking.istio.io ServiceEntry (the fields the registry uses).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEntrySpec {
    pub hosts: Vec<String>,
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub ports: Vec<SePort>,
    #[serde(default)]
    pub location: Option<String>,
    #[serde(default)]
    pub resolution: Option<String>,
    #[serde(default)]
    pub endpoints: Vec<WorkloadEntrySpec>,
    #[serde(default)]
    pub workload_selector: Option<WorkloadSelector>,
    /// `status.addresses`: the addresses an allocation controller gave its hosts (host,
    /// address), as istiod's or istiod-core's writes them.
    #[serde(skip)]
    pub status_addresses: Vec<(String, std::net::IpAddr)>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SePort {
    pub number: u16,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub target_port: Option<u16>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct WorkloadSelector {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// networking.istio.io WorkloadEntry, also the shape of ServiceEntry's inline endpoints.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadEntrySpec {
    pub address: String,
    #[serde(default)]
    pub ports: BTreeMap<String, u16>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub service_account: Option<String>,
    /// `region/zone/subzone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<String>,
    /// The endpoint's load-balancing weight (unset or 0: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// networking.istio.io WorkloadGroup: the template of the WorkloadEntries that proxies of the
/// group register for themselves when they connect (auto-registration, for VMs).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct WorkloadGroupSpec {
    #[serde(default)]
    pub metadata: WorkloadGroupMetadata,
    pub template: WorkloadTemplate,
    #[serde(default)]
    pub probe: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct WorkloadGroupMetadata {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// A WorkloadEntry without its address (each registering proxy brings its own).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadTemplate {
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub ports: BTreeMap<String, u16>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub service_account: Option<String>,
    #[serde(default)]
    pub network: Option<String>,
}

/// The mesh-wide settings istiod reads from its mesh config (the `mesh` key of the `istio`
/// ConfigMap, or the `--meshConfig` file). Acted on: trustDomain (checked against the control
/// plane's), trustDomainAliases, rootNamespace, enableAutoMtls, outboundTrafficPolicy and the
/// ext_authz entries of extensionProviders; the rest is kept as written.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MeshConfigSpec {
    #[serde(default)]
    pub trust_domain: Option<String>,
    #[serde(default)]
    pub root_namespace: Option<String>,
    /// Other trust domains whose identities are this mesh's (AuthorizationPolicy principals).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trust_domain_aliases: Vec<String>,
    #[serde(default)]
    pub enable_auto_mtls: Option<bool>,
    #[serde(default)]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
    /// External authorizers (and other providers, kept as written) that CUSTOM
    /// AuthorizationPolicies name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extension_providers: Vec<providers::ExtensionProvider>,
    /// The legacy access log: a file (`/dev/stdout`) every sidecar and gateway writes, when no
    /// Telemetry or default provider configures access logging.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log_format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log_encoding: Option<providers::LogEncoding>,
    /// Tracing through the bootstrap's tracer (ProxyConfig `tracing`) when no Telemetry or
    /// default provider configures it; Istio's default is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_tracing: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_providers: Option<providers::DefaultProviders>,
    /// The namespaces the control plane sees (`config_store::discovery`); none: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discovery_selectors: Vec<discovery::NamespaceSelector>,
    /// Locality load balancing for every service no DestinationRule sets it for (unset: Istio's
    /// default, on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality_lb_setting: Option<locality::LocalityLbSetting>,
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

impl MeshConfigSpec {
    /// `other`'s fields over ours (a later source overrides an earlier one field by field).
    pub fn merge(&mut self, other: &MeshConfigSpec) {
        if other.trust_domain.is_some() {
            self.trust_domain.clone_from(&other.trust_domain);
        }
        if other.root_namespace.is_some() {
            self.root_namespace.clone_from(&other.root_namespace);
        }
        if !other.extension_providers.is_empty() {
            self.extension_providers
                .clone_from(&other.extension_providers);
        }
        if !other.trust_domain_aliases.is_empty() {
            self.trust_domain_aliases
                .clone_from(&other.trust_domain_aliases);
        }
        if other.enable_auto_mtls.is_some() {
            self.enable_auto_mtls = other.enable_auto_mtls;
        }
        if other.outbound_traffic_policy.is_some() {
            self.outbound_traffic_policy
                .clone_from(&other.outbound_traffic_policy);
        }
        if other.access_log_file.is_some() {
            self.access_log_file.clone_from(&other.access_log_file);
        }
        if other.access_log_format.is_some() {
            self.access_log_format.clone_from(&other.access_log_format);
        }
        if other.access_log_encoding.is_some() {
            self.access_log_encoding = other.access_log_encoding;
        }
        if other.enable_tracing.is_some() {
            self.enable_tracing = other.enable_tracing;
        }
        if other.default_providers.is_some() {
            self.default_providers.clone_from(&other.default_providers);
        }
        if !other.discovery_selectors.is_empty() {
            self.discovery_selectors
                .clone_from(&other.discovery_selectors);
        }
        if other.locality_lb_setting.is_some() {
            self.locality_lb_setting
                .clone_from(&other.locality_lb_setting);
        }
        self.rest
            .extend(other.rest.iter().map(|(k, v)| (k.clone(), v.clone())));
    }

    fn validate(&self) -> Result<(), String> {
        OutboundTrafficPolicy::check(self.outbound_traffic_policy.as_ref())?;
        for (i, p) in self.extension_providers.iter().enumerate() {
            p.check()
                .map_err(|e| format!("extensionProviders[{i}]{e}"))?;
        }
        for (i, s) in self.discovery_selectors.iter().enumerate() {
            s.check()
                .map_err(|e| format!("discoverySelectors[{i}].{e}"))?;
        }
        if let Some(l) = &self.locality_lb_setting {
            l.check("localityLbSetting")?;
        }
        if let Some(ns) = &self.root_namespace
            && !traffic::is_dns1123_label(ns)
        {
            return Err(format!("rootNamespace: {ns:?} is not a namespace name"));
        }
        if let Some(td) = &self.trust_domain
            && (td.is_empty() || td.contains('/') || td.contains(char::is_whitespace))
        {
            return Err(format!("trustDomain: {td:?} is not a trust domain"));
        }
        Ok(())
    }
}

/// Parses a mesh config file (plain MeshConfig YAML, as istiod's `--meshConfig`).
pub fn parse_mesh_config(path: &Path, contents: &str) -> Result<MeshConfigSpec, ConfigError> {
    let (spec, warnings) = parse_mesh_config_warned(path, contents)?;
    for w in warnings {
        tracing::warn!(file = %path.display(), "mesh config: {w}");
    }
    Ok(spec)
}

/// [`parse_mesh_config`], with the fields it does not know (inside typed parts such as an
/// extension provider's) named rather than logged.
fn parse_mesh_config_warned(
    path: &Path,
    contents: &str,
) -> Result<(MeshConfigSpec, Vec<String>), ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid {
        file: path.to_path_buf(),
        doc: 1,
        reason,
    };
    let value: serde_json::Value = if contents.trim().is_empty() {
        serde_json::Value::Object(Default::default())
    } else {
        serde_yaml_ng::from_str(contents).map_err(|e| invalid(e.to_string()))?
    };
    let spec: MeshConfigSpec =
        serde_json::from_value(value.clone()).map_err(|e| invalid(format!("MeshConfig: {e}")))?;
    spec.validate()
        .map_err(|e| invalid(format!("MeshConfig: {e}")))?;
    let mut warnings = Vec::new();
    if let Ok(back) = serde_json::to_value(&spec) {
        unknown_fields(&value, &back, "mesh", &mut warnings);
    }
    Ok((spec, warnings))
}

/// core/v1 Service.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(default, rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    #[serde(default)]
    pub ports: Vec<ServicePortSpec>,
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
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
pub struct EndpointSubset {
    #[serde(default)]
    pub addresses: Vec<EndpointAddress>,
    #[serde(default)]
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

/// One typed config resource. The specs over ~150 bytes are boxed: a Resource is as large as
/// its largest variant, and a cluster's Pods and EndpointSlices (most of its objects) each carried
/// a DestinationRule's 1 KiB in every copy (the Kubernetes source's, the snapshot's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    ServiceEntry(Metadata, Box<ServiceEntrySpec>),
    WorkloadEntry(Metadata, WorkloadEntrySpec),
    Service(Metadata, ServiceSpec),
    Endpoints(Metadata, Vec<EndpointSubset>),
    PeerAuthentication(Metadata, PeerAuthenticationSpec),
    EndpointSlice(Metadata, EndpointSliceSpec),
    Sidecar(Metadata, SidecarSpec),
    VirtualService(Metadata, VirtualServiceSpec),
    DestinationRule(Metadata, Box<DestinationRuleSpec>),
    Gateway(Metadata, GatewaySpec),
    /// A Kubernetes Secret holding TLS material (a Gateway's `credentialName`).
    Secret(Metadata, TlsSecret),
    AuthorizationPolicy(Metadata, Box<AuthorizationPolicySpec>),
    RequestAuthentication(Metadata, Box<RequestAuthenticationSpec>),
    Telemetry(Metadata, Box<telemetry::TelemetrySpec>),
    /// networking.istio.io EnvoyFilter: patches to the generated Envoy config (`crate::envoy_filter`).
    EnvoyFilter(Metadata, Box<envoy_filter::EnvoyFilterSpec>),
    Namespace(Metadata),
    /// core/v1 Pod: what an endpoint takes from its pod (labels, service account, node).
    Pod(Metadata, PodInfo),
    /// core/v1 Node: its labels (topology: the locality of its pods' endpoints).
    Node(Metadata),
    WorkloadGroup(Metadata, Box<WorkloadGroupSpec>),
    MeshConfig(Metadata, Box<MeshConfigSpec>),
    /// A Kubernetes Gateway API object (`gateway_api`), translated by `crate::gateway_api`.
    GatewayApi(Metadata, Box<gateway_api::GatewayApiObject>),
}

/// networking.istio.io Sidecar: which services a workload's sidecar sees (egress hosts) and
/// what happens to traffic for anything else.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSpec {
    #[serde(default)]
    pub workload_selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub egress: Vec<SidecarEgress>,
    #[serde(default)]
    pub ingress: Vec<SidecarIngress>,
    #[serde(default)]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct SidecarEgress {
    pub hosts: Vec<String>,
    /// Only this port's traffic goes by this listener's hosts (a port-less listener covers
    /// the other ports).
    #[serde(default)]
    pub port: Option<SidecarPort>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct SidecarPort {
    pub number: u32,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub name: String,
}

/// A Sidecar ingress listener: inbound traffic to `port` goes to `defaultEndpoint`
/// (`127.0.0.1:PORT`, `[::1]:PORT`, `0.0.0.0:PORT` (the workload's address), `[::]:PORT` or
/// `unix:///path`).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SidecarIngress {
    pub port: SidecarPort,
    #[serde(default)]
    pub default_endpoint: Option<String>,
}

/// Where a Sidecar ingress listener forwards.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum IngressEndpoint {
    /// A fixed address (loopback).
    Address(std::net::SocketAddr),
    /// The workload's own address (`0.0.0.0:PORT` / `[::]:PORT`) on this port.
    Workload(u16),
    /// A unix domain socket.
    Unix(String),
}

impl IngressEndpoint {
    pub fn parse(raw: &str) -> Result<IngressEndpoint, String> {
        if let Some(path) = raw.strip_prefix("unix://") {
            return if path.starts_with('/') {
                Ok(IngressEndpoint::Unix(path.to_string()))
            } else {
                Err(format!("{raw:?}: a unix socket path must be absolute"))
            };
        }
        let addr: std::net::SocketAddr = raw.parse().map_err(|_| {
            format!(
                "{raw:?} is not 127.0.0.1:PORT, [::1]:PORT, 0.0.0.0:PORT, [::]:PORT or unix:///path"
            )
        })?;
        if addr.port() == 0 {
            return Err(format!("{raw:?}: port 0"));
        }
        if addr.ip().is_unspecified() {
            Ok(IngressEndpoint::Workload(addr.port()))
        } else if addr.ip().is_loopback() {
            Ok(IngressEndpoint::Address(addr))
        } else {
            Err(format!(
                "{raw:?}: only a loopback or unspecified (0.0.0.0, [::]) address may be named"
            ))
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct OutboundTrafficPolicy {
    /// `REGISTRY_ONLY` or `ALLOW_ANY` (the default).
    #[serde(default)]
    pub mode: Option<String>,
}

impl OutboundTrafficPolicy {
    /// `Some(true)` for REGISTRY_ONLY, `Some(false)` for ALLOW_ANY, `None` when unset.
    pub fn registry_only(policy: Option<&Self>) -> Option<bool> {
        policy
            .and_then(|p| p.mode.as_deref())
            .map(|m| m == "REGISTRY_ONLY")
    }

    /// The mode is one Istio knows.
    fn check(policy: Option<&Self>) -> Result<(), String> {
        match policy.and_then(|p| p.mode.as_deref()) {
            None | Some("REGISTRY_ONLY" | "ALLOW_ANY") => Ok(()),
            Some(mode) => Err(format!(
                "outboundTrafficPolicy.mode: {mode:?} is not REGISTRY_ONLY or ALLOW_ANY"
            )),
        }
    }
}

/// discovery.k8s.io/v1 EndpointSlice (top-level `endpoints` and `ports`, as Kubernetes has them).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSliceSpec {
    #[serde(default)]
    pub address_type: Option<String>,
    #[serde(default)]
    pub endpoints: Vec<SliceEndpoint>,
    #[serde(default)]
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
pub struct ObjectReference {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
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
pub struct SliceConditions {
    /// Absent means ready, as Kubernetes defines it.
    #[serde(default)]
    pub ready: Option<bool>,
}

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// security.istio.io PeerAuthentication: which mTLS mode the selected workloads accept.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeerAuthenticationSpec {
    #[serde(default)]
    pub selector: Option<LabelSelector>,
    #[serde(default)]
    pub mtls: Option<MtlsSpec>,
    /// Workload port → mode; only meaningful with a selector, as in Istio.
    #[serde(default)]
    pub port_level_mtls: BTreeMap<u16, MtlsSpec>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MtlsSpec {
    #[serde(default)]
    pub mode: Option<MtlsMode>,
}

/// PeerAuthentication's mTLS modes. UNSET inherits from the enclosing scope.
#[derive(Debug, Clone, Copy, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum MtlsMode {
    #[default]
    Unset,
    Disable,
    Permissive,
    Strict,
}

impl Resource {
    pub fn kind(&self) -> &'static str {
        match self {
            Resource::ServiceEntry(..) => "ServiceEntry",
            Resource::WorkloadEntry(..) => "WorkloadEntry",
            Resource::Service(..) => "Service",
            Resource::Endpoints(..) => "Endpoints",
            Resource::PeerAuthentication(..) => "PeerAuthentication",
            Resource::EndpointSlice(..) => "EndpointSlice",
            Resource::Sidecar(..) => "Sidecar",
            Resource::VirtualService(..) => "VirtualService",
            Resource::DestinationRule(..) => "DestinationRule",
            Resource::Gateway(..) => "Gateway",
            Resource::Secret(..) => "Secret",
            Resource::AuthorizationPolicy(..) => "AuthorizationPolicy",
            Resource::RequestAuthentication(..) => "RequestAuthentication",
            Resource::Telemetry(..) => "Telemetry",
            Resource::EnvoyFilter(..) => "EnvoyFilter",
            Resource::Namespace(..) => "Namespace",
            Resource::Pod(..) => "Pod",
            Resource::Node(..) => "Node",
            Resource::WorkloadGroup(..) => "WorkloadGroup",
            Resource::MeshConfig(..) => "MeshConfig",
            Resource::GatewayApi(_, o) => o.kind(),
        }
    }

    pub fn metadata(&self) -> &Metadata {
        match self {
            Resource::ServiceEntry(m, _)
            | Resource::WorkloadEntry(m, _)
            | Resource::Service(m, _)
            | Resource::Endpoints(m, _)
            | Resource::PeerAuthentication(m, _)
            | Resource::EndpointSlice(m, _)
            | Resource::Sidecar(m, _)
            | Resource::VirtualService(m, _)
            | Resource::DestinationRule(m, _)
            | Resource::Gateway(m, _)
            | Resource::Secret(m, _)
            | Resource::AuthorizationPolicy(m, _)
            | Resource::RequestAuthentication(m, _)
            | Resource::Telemetry(m, _)
            | Resource::EnvoyFilter(m, _)
            | Resource::WorkloadGroup(m, _)
            | Resource::MeshConfig(m, _)
            | Resource::Pod(m, _)
            | Resource::GatewayApi(m, _)
            | Resource::Node(m)
            | Resource::Namespace(m) => m,
        }
    }

    /// The resource as /debug/configz shows it: kind, metadata and spec.
    pub fn to_json(&self) -> serde_json::Value {
        let (kind, meta, spec) = match self {
            Resource::ServiceEntry(m, s) => ("ServiceEntry", m, serde_json::to_value(s)),
            Resource::WorkloadEntry(m, s) => ("WorkloadEntry", m, serde_json::to_value(s)),
            Resource::Service(m, s) => ("Service", m, serde_json::to_value(s)),
            Resource::Endpoints(m, s) => ("Endpoints", m, serde_json::to_value(s)),
            Resource::PeerAuthentication(m, s) => {
                ("PeerAuthentication", m, serde_json::to_value(s))
            }
            Resource::EndpointSlice(m, s) => ("EndpointSlice", m, serde_json::to_value(s)),
            Resource::Sidecar(m, s) => ("Sidecar", m, serde_json::to_value(s)),
            Resource::VirtualService(m, s) => ("VirtualService", m, serde_json::to_value(s)),
            Resource::DestinationRule(m, s) => ("DestinationRule", m, serde_json::to_value(s)),
            Resource::Gateway(m, s) => ("Gateway", m, serde_json::to_value(s)),
            Resource::Secret(m, s) => ("Secret", m, serde_json::to_value(s)),
            Resource::AuthorizationPolicy(m, s) => {
                ("AuthorizationPolicy", m, serde_json::to_value(s))
            }
            Resource::RequestAuthentication(m, s) => {
                ("RequestAuthentication", m, serde_json::to_value(s))
            }
            Resource::Telemetry(m, s) => ("Telemetry", m, serde_json::to_value(s)),
            Resource::EnvoyFilter(m, s) => ("EnvoyFilter", m, serde_json::to_value(s)),
            Resource::Namespace(m) => ("Namespace", m, Ok(serde_json::Value::Null)),
            Resource::Pod(m, s) => ("Pod", m, serde_json::to_value(s)),
            Resource::Node(m) => ("Node", m, Ok(serde_json::Value::Null)),
            Resource::WorkloadGroup(m, s) => ("WorkloadGroup", m, serde_json::to_value(s)),
            Resource::MeshConfig(m, s) => ("MeshConfig", m, serde_json::to_value(s)),
            Resource::GatewayApi(m, o) => {
                return serde_json::json!({
                    "apiVersion": format!("{}/v1", gateway_api::GROUP),
                    "kind": o.document_kind(),
                    "metadata": m,
                    "spec": serde_json::to_value(o).unwrap_or_default(),
                });
            }
        };
        serde_json::json!({
            "kind": kind,
            "metadata": meta,
            "spec": spec.unwrap_or_default(),
        })
    }
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default, rename = "apiVersion")]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
    #[serde(default)]
    spec: Option<serde_json::Value>,
    #[serde(default)]
    subsets: Option<serde_json::Value>,
    #[serde(default)]
    endpoints: Option<serde_json::Value>,
    #[serde(default)]
    ports: Option<serde_json::Value>,
    #[serde(default, rename = "addressType")]
    address_type: Option<String>,
    #[serde(default)]
    data: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "stringData")]
    string_data: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "type")]
    secret_type: Option<String>,
    #[serde(default)]
    status: Option<serde_json::Value>,
}

/// The parsed contents of a config directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigSet {
    pub resources: Vec<Resource>,
}

/// One document as a resource; `None`: an empty document, or one that is no config of ours (a
/// Secret without TLS material, a ConfigMap other than Istio's).
pub(crate) fn parse_document(value: serde_json::Value) -> Result<Option<Resource>, String> {
    if value.is_null() {
        return Ok(None);
    }
    let Envelope {
        api_version,
        kind,
        metadata,
        spec,
        subsets,
        endpoints,
        ports,
        address_type,
        data,
        string_data,
        secret_type,
        status,
    } = serde_json::from_value(value).map_err(|e| e.to_string())?;
    let kind = kind.ok_or("missing field `kind`")?;
    if gateway_api::in_group(api_version.as_deref()) && gateway_api::is_kind(&kind) {
        let av = api_version.as_deref().unwrap_or_default();
        let version = av.rsplit_once('/').map(|(_, v)| v).unwrap_or_default();
        if !gateway_api::VERSIONS.contains(&version) {
            return Err(format!(
                "apiVersion {av:?}: {kind} is served in {} versions {}",
                gateway_api::GROUP,
                gateway_api::VERSIONS.join(", ")
            ));
        }
        let meta = parse_metadata(&metadata.ok_or("missing field `metadata`")?)?;
        let object = gateway_api::parse(&kind, spec.unwrap_or(serde_json::Value::Null))
            .map_err(|e| format!("{kind} {}: {e}", meta.name))?;
        return Ok(Some(Resource::GatewayApi(meta, Box::new(object))));
    }
    check_api_version(&kind, api_version.as_deref())?;
    let raw_meta = metadata.ok_or("missing field `metadata`")?;
    let mut meta = parse_metadata(&raw_meta)?;
    let spec = spec.unwrap_or(serde_json::Value::Null);
    let meta_name = meta.name.clone();
    let typed = |what: &str| format!("{kind} {meta_name}: invalid {what}");
    let resource = match kind.as_str() {
        "ServiceEntry" => {
            let mut spec: ServiceEntrySpec = plain_spec(spec, &typed, validate_service_entry)?;
            // Unparsable entries are left out, as istiod reads them.
            spec.status_addresses = status
                .as_ref()
                .and_then(|s| s.get("addresses"))
                .and_then(|a| a.as_array())
                .into_iter()
                .flatten()
                .filter_map(|a| {
                    let host = a.get("host")?.as_str()?.to_string();
                    let value = a.get("value")?.as_str()?.parse().ok()?;
                    Some((host, value))
                })
                .collect();
            Resource::ServiceEntry(meta, Box::new(spec))
        }
        "WorkloadEntry" => Resource::WorkloadEntry(meta, plain_spec(spec, &typed, |_| Ok(()))?),
        "Service" => Resource::Service(meta, plain_spec(spec, &typed, |_| Ok(()))?),
        "Endpoints" => {
            let subsets: Vec<EndpointSubset> =
                serde_json::from_value(subsets.unwrap_or(serde_json::Value::Array(vec![])))
                    .map_err(|e| format!("{}: {e}", typed("subsets")))?;
            Resource::Endpoints(meta, subsets)
        }
        "PeerAuthentication" => {
            let spec = plain_spec(spec, &typed, validate_peer_authentication)?;
            Resource::PeerAuthentication(meta, spec)
        }
        "Sidecar" => Resource::Sidecar(meta, plain_spec(spec, &typed, validate_sidecar)?),
        "EndpointSlice" => {
            let slice = endpoint_slice(address_type, endpoints, ports, &meta, &typed)?;
            Resource::EndpointSlice(meta, slice)
        }
        "VirtualService" => {
            let spec = checked_spec(spec, &typed, validate_virtual_service, &mut meta)?;
            Resource::VirtualService(meta, spec)
        }
        "DestinationRule" => {
            let spec = checked_spec(spec, &typed, validate_destination_rule, &mut meta)?;
            Resource::DestinationRule(meta, Box::new(spec))
        }
        "Gateway" => {
            let spec = checked_spec(spec, &typed, gateway::validate_gateway, &mut meta)?;
            Resource::Gateway(meta, spec)
        }
        "AuthorizationPolicy" => {
            let mut spec = checked_spec(spec, &typed, validate_authorization_policy, &mut meta)?;
            spec.dry_run = dry_run(&raw_meta, spec.action, &typed)?;
            warn_if_targeted(spec.targeted(), &mut meta);
            Resource::AuthorizationPolicy(meta, Box::new(spec))
        }
        "RequestAuthentication" => {
            let spec = checked_spec(spec, &typed, validate_request_authentication, &mut meta)?;
            warn_if_targeted(spec.targeted(), &mut meta);
            Resource::RequestAuthentication(meta, Box::new(spec))
        }
        "Telemetry" => {
            let spec = checked_spec(spec, &typed, telemetry::validate_telemetry, &mut meta)?;
            warn_if_targeted(spec.targeted(), &mut meta);
            Resource::Telemetry(meta, Box::new(spec))
        }
        "EnvoyFilter" => {
            let spec: envoy_filter::EnvoyFilterSpec =
                checked_spec(spec, &typed, |_| Ok(()), &mut meta)?;
            let mut warnings = Vec::new();
            envoy_filter::validate(&spec, &mut warnings)
                .map_err(|e| format!("{}: spec.{e}", typed("spec")))?;
            meta.warnings.extend(warnings);
            Resource::EnvoyFilter(meta, Box::new(spec))
        }
        "Namespace" => Resource::Namespace(meta),
        "Pod" => {
            let mut pod = pod_info(&spec, status.as_ref(), &typed)?;
            pod.workload_name = pod_workload_name(&raw_meta, &meta);
            Resource::Pod(meta, pod)
        }
        "Node" => Resource::Node(meta),
        // Secrets with TLS material (a Gateway's credentialName); other Secrets are not ours.
        "Secret" => {
            let secret = gateway::tls_secret(
                secret_type.as_deref(),
                data.as_ref().unwrap_or(&BTreeMap::new()),
                string_data.as_ref().unwrap_or(&BTreeMap::new()),
            )
            .map_err(|e| format!("Secret {}: {e}", meta.name))?;
            match secret {
                Some(s) => Resource::Secret(meta, s),
                None => return Ok(None),
            }
        }
        // Istio's mesh config lives in the `mesh` key of the `istio` (or `istio-<revision>`)
        // ConfigMap; other ConfigMaps are not config of ours.
        "ConfigMap" if meta.name == "istio" || meta.name.starts_with("istio-") => {
            match config_map_mesh(data.as_ref(), &mut meta)? {
                Some(spec) => Resource::MeshConfig(meta, Box::new(spec)),
                None => return Ok(None),
            }
        }
        "ConfigMap" => return Ok(None),
        "MeshConfig" => {
            let spec = if spec.is_null() {
                serde_json::json!({})
            } else {
                spec
            };
            let spec = checked_spec(spec, &typed, MeshConfigSpec::validate, &mut meta)?;
            Resource::MeshConfig(meta, Box::new(spec))
        }
        "WorkloadGroup" => {
            let spec = plain_spec(spec, &typed, validate_workload_group)?;
            Resource::WorkloadGroup(meta, Box::new(spec))
        }
        other => {
            return Err(match api_version {
                Some(av) => format!("unsupported kind {other:?} ({av})"),
                None => format!("unsupported kind {other:?}"),
            });
        }
    };
    Ok(Some(resource))
}

/// The API group and versions a kind of ours is served in (Istio's CRDs, Kubernetes' kinds);
/// `None` for kinds that are not ours, and for `MeshConfig`, which is this project's own.
fn served_in(kind: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match kind {
        "ServiceEntry" | "WorkloadEntry" | "WorkloadGroup" | "VirtualService"
        | "DestinationRule" | "Gateway" | "Sidecar" => {
            ("networking.istio.io", &["v1", "v1beta1", "v1alpha3"])
        }
        "PeerAuthentication" | "AuthorizationPolicy" | "RequestAuthentication" => {
            ("security.istio.io", &["v1", "v1beta1"])
        }
        "Telemetry" => ("telemetry.istio.io", &["v1", "v1alpha1"]),
        "EnvoyFilter" => ("networking.istio.io", &["v1alpha3"]),
        "Service" | "Endpoints" | "Namespace" | "Secret" | "ConfigMap" | "Pod" | "Node" => {
            ("", &["v1"])
        }
        "EndpointSlice" => ("discovery.k8s.io", &["v1"]),
        _ => return None,
    })
}

/// A kind is ours only in its own API group: a `gateway.networking.k8s.io` Gateway is not an
/// Istio Gateway. A document without `apiVersion` is read as the kind of that name.
fn check_api_version(kind: &str, api_version: Option<&str>) -> Result<(), String> {
    let (Some(av), Some((group, versions))) = (api_version, served_in(kind)) else {
        return Ok(());
    };
    let (g, v) = av.rsplit_once('/').unwrap_or(("", av));
    let named = if group.is_empty() { "core" } else { group };
    if g != group {
        return Err(format!(
            "unsupported kind {kind:?} ({av}): only the {named} {kind} is served here"
        ));
    }
    if !versions.contains(&v) {
        return Err(format!(
            "apiVersion {av:?}: {kind} is served in {named} versions {}",
            versions.join(", ")
        ));
    }
    Ok(())
}

/// What an endpoint needs of a Pod: its service account, node, addresses and phase (the rest of
/// the Pod is not kept).
fn pod_info(
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
fn endpoint_slice(
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

/// The mesh config in the `mesh` key of Istio's ConfigMap; `None` when it has no such key.
fn config_map_mesh(
    data: Option<&BTreeMap<String, String>>,
    meta: &mut Metadata,
) -> Result<Option<MeshConfigSpec>, String> {
    let Some(text) = data.and_then(|d| d.get("mesh")) else {
        return Ok(None);
    };
    let (spec, warnings) = parse_mesh_config_warned(Path::new(""), text).map_err(|e| match e {
        ConfigError::Invalid { reason, .. } => {
            format!("ConfigMap {}: data.mesh: {reason}", meta.name)
        }
        other => other.to_string(),
    })?;
    meta.warnings
        .extend(warnings.into_iter().map(|w| format!("data.{w}")));
    Ok(Some(spec))
}

/// A document's metadata, with a warning for each field that is neither ours nor one
/// Kubernetes sets; the name is required.
fn parse_metadata(raw_meta: &serde_json::Value) -> Result<Metadata, String> {
    let mut meta = Metadata::deserialize(raw_meta).map_err(|e| format!("metadata: {e}"))?;
    if let Some(fields) = raw_meta.as_object() {
        for key in fields
            .keys()
            .filter(|k| !KNOWN_METADATA.contains(&k.as_str()))
        {
            meta.warnings.push(format!(
                "metadata.{key}: unknown field, ignored (the resource is in namespace {:?})",
                meta.namespace()
            ));
        }
    }
    if meta.name.is_empty() {
        return Err("metadata.name must not be empty".into());
    }
    Ok(meta)
}

/// The spec as `T`, then `check`ed; errors name the kind and the resource (`typed`). Unlike
/// [`checked_spec`], fields `T` does not know pass without a warning.
fn plain_spec<T: serde::de::DeserializeOwned>(
    spec: serde_json::Value,
    typed: &dyn Fn(&str) -> String,
    check: fn(&T) -> Result<(), String>,
) -> Result<T, String> {
    let parsed: T = serde_json::from_value(spec).map_err(|e| format!("{}: {e}", typed("spec")))?;
    check(&parsed).map_err(|e| format!("{}: {e}", typed("spec")))?;
    Ok(parsed)
}

/// The spec as `T`, then `check`ed; errors name the kind, the resource and the field.
/// Fields the typed spec does not know are warnings on `meta`, naming each.
fn checked_spec<T: serde::de::DeserializeOwned + serde::Serialize>(
    spec: serde_json::Value,
    typed: &dyn Fn(&str) -> String,
    check: fn(&T) -> Result<(), String>,
    meta: &mut Metadata,
) -> Result<T, String> {
    let parsed: T = serde_path_to_error::deserialize(&spec).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            "spec".to_string()
        } else {
            format!("spec.{path}")
        };
        format!("{}: {at}: {}", typed("spec"), e.inner())
    })?;
    check(&parsed).map_err(|e| format!("{}: spec.{e}", typed("spec")))?;
    if let Ok(back) = serde_json::to_value(&parsed) {
        unknown_fields(&spec, &back, "spec", &mut meta.warnings);
    }
    Ok(parsed)
}

/// A ServiceEntry names at least one host.
fn validate_service_entry(spec: &ServiceEntrySpec) -> Result<(), String> {
    if spec.hosts.is_empty() {
        return Err("at least one host is required".to_string());
    }
    Ok(())
}

/// Port-level modes need a workload selector (as in Istio).
fn validate_peer_authentication(spec: &PeerAuthenticationSpec) -> Result<(), String> {
    if !spec.port_level_mtls.is_empty() && spec.selector.is_none() {
        return Err("portLevelMtls requires a workload selector".to_string());
    }
    Ok(())
}

/// A WorkloadGroup's template has no address: each proxy registers its own.
fn validate_workload_group(spec: &WorkloadGroupSpec) -> Result<(), String> {
    if spec.template.address.is_some() {
        return Err(
            "spec.template.address: not allowed (each proxy registers its own address)".to_string(),
        );
    }
    Ok(())
}

/// A Sidecar's egress hosts are `<namespace>/<dns name>`, its ports in range, its ingress
/// ports distinct and its default endpoints well formed.
fn validate_sidecar(spec: &SidecarSpec) -> Result<(), String> {
    for host in spec.egress.iter().flat_map(|e| &e.hosts) {
        if host
            .split_once('/')
            .is_none_or(|(ns, name)| ns.is_empty() || name.is_empty())
        {
            return Err(format!(
                "egress host {host:?} must be <namespace>/<dns name> (namespace may be *, . or ~)"
            ));
        }
    }
    OutboundTrafficPolicy::check(spec.outbound_traffic_policy.as_ref())
        .map_err(|e| format!("spec.{e}"))?;
    let port_ok = |n: u32| (1..=65535).contains(&n);
    for (i, e) in spec.egress.iter().enumerate() {
        if let Some(p) = &e.port
            && !port_ok(p.number)
        {
            return Err(format!(
                "spec.egress[{i}].port.number {} is not in 1-65535",
                p.number
            ));
        }
    }
    let mut ingress_ports = std::collections::BTreeSet::new();
    for (i, ing) in spec.ingress.iter().enumerate() {
        let at = format!("spec.ingress[{i}]");
        if !port_ok(ing.port.number) {
            return Err(format!(
                "{at}.port.number {} is not in 1-65535",
                ing.port.number
            ));
        }
        if !ingress_ports.insert(ing.port.number) {
            return Err(format!(
                "{at}.port.number {} is used by an earlier ingress listener",
                ing.port.number
            ));
        }
        if let Some(ep) = &ing.default_endpoint {
            IngressEndpoint::parse(ep).map_err(|e| format!("{at}.defaultEndpoint: {e}"))?;
        }
    }
    Ok(())
}

/// An AuthorizationPolicy's dry-run annotation: `"true"` or `"false"` (absent: false), and
/// never on a CUSTOM policy (as in Istio).
fn dry_run(
    raw_meta: &serde_json::Value,
    action: authorization::Action,
    typed: &dyn Fn(&str) -> String,
) -> Result<bool, String> {
    let annotation = raw_meta
        .get("annotations")
        .and_then(|a| a.get(authorization::DRY_RUN_ANNOTATION));
    let dry_run = match annotation.map(|v| (v.as_str(), v)) {
        None => false,
        Some((Some("true"), _)) => true,
        Some((Some("false"), _)) => false,
        Some((_, v)) => {
            return Err(format!(
                "{}: metadata.annotations.{}: {v} is not \"true\" or \"false\"",
                typed("metadata"),
                authorization::DRY_RUN_ANNOTATION
            ));
        }
    };
    if dry_run && action == authorization::Action::Custom {
        return Err(format!(
            "{}: metadata.annotations.{}: a CUSTOM policy cannot be a dry run (as in Istio)",
            typed("metadata"),
            authorization::DRY_RUN_ANNOTATION
        ));
    }
    Ok(dry_run)
}

/// A security policy bound by targetRef applies to gateways and waypoints, never to a sidecar
/// (as in Istio): accepted, with a warning saying so.
fn warn_if_targeted(targeted: bool, meta: &mut Metadata) {
    if targeted {
        meta.warnings.push(
            "spec.targetRef(s): a policy bound by targetRef applies to gateways and waypoints, \
             never to a sidecar (as in Istio); this policy applies to no sidecar here"
                .to_string(),
        );
    }
}

/// A spec from YAML, then `validate`d (for the typed resources' unit tests).
#[cfg(test)]
pub(crate) fn check_spec<T: serde::de::DeserializeOwned>(
    yaml: &str,
    validate: fn(&T) -> Result<(), String>,
) -> Result<(), String> {
    let spec: T = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
    validate(&spec)
}

/// Parses every document in one file's contents (YAML, which includes JSON).
pub fn parse_file(path: &Path, contents: &str) -> Result<Vec<Resource>, ConfigError> {
    let mut out = Vec::new();
    for (doc, text) in dir::documents(contents) {
        let resource = dir::parse_document_text(text).map_err(|reason| ConfigError::Invalid {
            file: path.to_path_buf(),
            doc,
            reason,
        })?;
        out.extend(resource);
    }
    Ok(out)
}

/// Adds a warning for each field of `written` that `understood` (the typed value written back)
/// lacks: a field this control plane does not know, so does not act on.
fn unknown_fields(
    written: &serde_json::Value,
    understood: &serde_json::Value,
    at: &str,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    match (written, understood) {
        (Value::Object(w), Value::Object(u)) => {
            for (k, v) in w {
                match u.get(k) {
                    Some(uv) => unknown_fields(v, uv, &format!("{at}.{k}"), out),
                    None => out.push(format!("{at}.{k}: unknown field, ignored")),
                }
            }
        }
        (Value::Array(w), Value::Array(u)) => {
            for (i, (wv, uv)) in w.iter().zip(u).enumerate() {
                unknown_fields(wv, uv, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The config files of `dir`: every `.yaml`, `.yml` and `.json` file (not recursive), in name order.
fn config_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|source| ConfigError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                )
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Largest config file read: far above any real one (Kubernetes caps an object at 1.5 MiB), small
/// enough that a stray dump or a file still growing cannot take the control plane's memory.
pub const MAX_CONFIG_FILE_BYTES: u64 = 64 << 20;

/// One config file's text, refused past `MAX_CONFIG_FILE_BYTES`.
fn read_config_file(file: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let fail = |source| ConfigError::ReadFile {
        file: file.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(file).map_err(fail)?;
    // Sized once from the file's length (within the limit): growing by doubling would hold
    // two buffers at the end, twice the file.
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut text =
        String::with_capacity(usize::try_from(len.min(MAX_CONFIG_FILE_BYTES) + 1).unwrap_or(0));
    f.take(MAX_CONFIG_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(fail)?;
    if text.len() as u64 > MAX_CONFIG_FILE_BYTES {
        return Err(fail(std::io::Error::other(format!(
            "larger than {} MiB",
            MAX_CONFIG_FILE_BYTES >> 20
        ))));
    }
    Ok(text)
}

/// Checks every file of `dir` and returns every error (not only the first), with the resources
/// of the files that did load.
pub fn validate_dir(dir: &Path) -> (ConfigSet, Vec<ConfigError>) {
    let mut set = ConfigSet::default();
    let mut errors = Vec::new();
    let files = match config_files(dir) {
        Ok(f) => f,
        Err(e) => return (set, vec![e]),
    };
    for file in files {
        match read_config_file(&file).and_then(|contents| parse_file(&file, &contents)) {
            Ok(resources) => set.resources.extend(resources),
            Err(e) => errors.push(e),
        }
    }
    (set, errors)
}

/// Loads every `.yaml`, `.yml` and `.json` file of `dir` (not recursive), in name order.
pub fn load_dir(dir: &Path) -> Result<ConfigSet, ConfigError> {
    let files = config_files(dir)?;
    let mut set = ConfigSet::default();
    for file in files {
        let contents = read_config_file(&file)?;
        set.resources.extend(parse_file(&file, &contents)?);
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_multi_document_yaml() {
        let yaml = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: httpbin, namespace: demo}
spec:
  hosts: [httpbin.demo.svc.cluster.local]
  addresses: [10.96.0.10]
  ports: [{number: 8000, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: httpbin}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: httpbin-1, namespace: demo}
spec: {address: 10.0.0.2, labels: {app: httpbin}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: httpbin, namespace: demo}
spec:
  hosts: [httpbin]
  http:
  - route: [{destination: {host: httpbin, subset: v1}}]
    timeout: 2s
    corsPolicy: {allowOrigins: [{exact: "https://a.example"}]}
---
kind: MeshConfig
metadata: {name: mesh}
---
kind: ConfigMap
metadata: {name: not-ours}
data: {mesh: "whatever: 1"}
"#;
        let r = parse_file(Path::new("x.yaml"), yaml).unwrap();
        assert_eq!(r.len(), 4);
        // Fields we do not type are kept as written.
        let shown = r[2].to_json();
        assert_eq!(
            shown["spec"]["http"][0]["corsPolicy"]["allowOrigins"][0]["exact"],
            "https://a.example"
        );
        assert!(
            matches!(&r[0], Resource::ServiceEntry(m, s) if m.name == "httpbin" && s.ports[0].number == 8000)
        );
    }

    #[test]
    fn bad_document_names_file_and_document() {
        let yaml = "kind: ServiceEntry\nmetadata: {name: a}\nspec: {hosts: [a]}\n---\nkind: ServiceEntry\nmetadata: {name: b}\nspec: {hosts: [], ports: []}\n";
        let e = parse_file(Path::new("mesh/bad.yaml"), yaml).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("mesh/bad.yaml: document 2"), "{msg}");
        assert!(msg.contains("at least one host"), "{msg}");
        let e = parse_file(Path::new("y.yaml"), "kind: [unclosed").unwrap_err();
        assert!(e.to_string().starts_with("y.yaml: document 1"));
        let e = parse_file(
            Path::new("z.yaml"),
            "kind: Frobnicator\nmetadata: {name: a}\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("unsupported kind \"Frobnicator\""));
    }

    /// Each traffic kind's checks, by the field they name.
    #[test]
    fn traffic_kinds_are_checked_and_errors_name_the_field() {
        let cases: &[(&str, &str)] = &[
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a]}",
                "spec.http, tcp or tls: at least one route",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: \"\"}}]}]}",
                "spec.http[0].route[0].destination.host",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}, weight: -5}]}]}",
                "spec.http[0].route[0].weight: invalid value: integer `-5`",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], redirect: {uri: /x}}]}",
                "spec.http[0]: route, redirect, directResponse and delegate exclude each other",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], timeout: soon}]}",
                "spec.http[0].timeout",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], tcp: [{route: [{destination: {host: a, port: {number: 70000}}}]}]}",
                "spec.tcp[0].route[0].destination.port.number: port 70000 is not in 1-65535",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], tls: [{route: [{destination: {host: a}}]}]}",
                "spec.tls[0].match",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {gateways: [gw], http: [{route: [{destination: {host: a}}]}]}",
                "spec.gateways: a delegate",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], retries: {attempts: 3, perTryTimeout: 99999999999999h}}]}",
                "spec.http[0].retries.perTryTimeout: \"99999999999999h\" is not a duration",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], retries: {attempts: 3, retryOn: \"5xx,sometimes\"}}]}",
                "spec.http[0].retries.retryOn: \"sometimes\"",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], fault: {abort: {httpStatus: 700}}}]}",
                "spec.http[0].fault.abort.httpStatus: 700",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], fault: {delay: {fixedDelay: 1s, percentage: {value: 150}}}}]}",
                "spec.http[0].fault.delay.percentage: percentage 150",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], fault: {delay: {fixedDelay: 1s, percentage: {value: .nan}}}}]}",
                "spec.http[0].fault.delay.percentage",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{match: [{uri: {regex: \"(a\"}}], route: [{destination: {host: a}}]}]}",
                "spec.http[0].match[0].uri: \"(a\" is not an RE2",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{match: [{uri: {exact: /a, prefix: /b}}], route: [{destination: {host: a}}]}]}",
                "spec.http[0].match[0].uri: exact, prefix and regex exclude",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{redirect: {uri: /x, redirectCode: 200}}]}",
                "spec.http[0].redirect.redirectCode: 200",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{directResponse: {status: 99}}]}",
                "spec.http[0].directResponse.status: 99",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a, port: {number: 0}}}]}]}",
                "spec.http[0].route[0].destination.port.number: port 0",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: \"*.a\"}}]}]}",
                "spec.http[0].route[0].destination.host: \"*.a\"",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], headers: {request: {set: {\":path\": x}}}}]}",
                "spec.http[0].headers.request: \":path\" is not a header name",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], mirror: {host: b}, mirrors: [{destination: {host: c}}]}]}",
                "spec.http[0]: mirror and mirrors exclude",
            ),
            (
                "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], timeout: 1e400}]}",
                "spec.http[0].timeout: \"1e400\" is not a duration",
            ),
            (
                "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {outlierDetection: {maxEjectionPercent: 120}}}",
                "spec.trafficPolicy.outlierDetection.maxEjectionPercent: 120",
            ),
            (
                "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {connectionPool: {tcp: {connectTimeout: NaNs}}}}",
                "spec.trafficPolicy.connectionPool.tcp.connectTimeout: \"NaNs\"",
            ),
            (
                "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {loadBalancer: {consistentHash: {}}}}",
                "spec.trafficPolicy.loadBalancer.consistentHash: exactly one",
            ),
            (
                "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {portLevelSettings: [{port: {number: 80}}, {port: {number: 80}}]}}",
                "spec.trafficPolicy.portLevelSettings[1].port: port 80 is set twice",
            ),
            (
                "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {tls: {mode: SIMPLE, caCertificates: etc/ca.pem}}}",
                "spec.trafficPolicy.tls.caCertificates: \"etc/ca.pem\" must be an absolute",
            ),
            (
                "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {tls: {mode: SIMPLE, credentialName: secret}}}",
                "spec.trafficPolicy.tls.credentialName: Kubernetes secrets",
            ),
            (
                "kind: DestinationRule\nmetadata: {name: d}\nspec: {subsets: []}",
                "spec.host: required",
            ),
            (
                "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, subsets: [{name: V1, labels: {version: v1}}]}",
                "spec.subsets[0].name: \"V1\" is not a valid subset name",
            ),
            (
                "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, subsets: [{name: v1}, {name: v1}]}",
                "spec.subsets[1].name: subset \"v1\" is defined twice",
            ),
            (
                "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {tls: {mode: MUTUAL}}}",
                "spec.trafficPolicy.tls: MUTUAL needs",
            ),
            (
                "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, subsets: [{name: v1, trafficPolicy: {loadBalancer: {simple: FASTEST}}}]}",
                "spec.subsets[0].trafficPolicy.loadBalancer.simple: \"FASTEST\"",
            ),
            (
                "kind: Gateway\nmetadata: {name: g}\nspec: {selector: {istio: ingressgateway}}",
                "spec.servers: at least one server",
            ),
            (
                "kind: Gateway\nmetadata: {name: g}\nspec: {servers: [{port: {number: 80, name: http, protocol: HTTP}}]}",
                "spec.servers[0].hosts: at least one host",
            ),
            (
                "kind: Gateway\nmetadata: {name: g}\nspec: {servers: [{port: {number: 0, name: http, protocol: HTTP}, hosts: [\"*\"]}]}",
                "spec.servers[0].port.number: port number 0",
            ),
            (
                "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {action: PERMIT}",
                "spec.action: unknown variant `PERMIT`",
            ),
            (
                "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {action: CUSTOM}",
                "spec.provider.name: a CUSTOM policy must name its provider",
            ),
            (
                "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {rules: [{when: [{key: \"request.auth.claims[iss]\"}]}]}",
                "spec.rules[0].when[0]: values or notValues is required",
            ),
            (
                "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {rules: \"all\"}",
                "AuthorizationPolicy p: invalid spec",
            ),
            (
                "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {rules: [{to: [{operation: {path: [/admin]}}]}]}",
                "spec.rules[0].to[0].operation.path: unknown field `path`",
            ),
            (
                "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {action: CUSTOM, provider: {name: ext}}",
                "spec.rules: a CUSTOM policy needs at least one rule",
            ),
        ];
        let sidecar = |spec: &str| format!("kind: Sidecar\nmetadata: {{name: s}}\nspec: {spec}");
        let sidecar_cases = [
            (
                sidecar("{ingress: [{port: {number: 0}}]}"),
                "spec.ingress[0].port.number 0 is not in 1-65535",
            ),
            (
                sidecar("{ingress: [{port: {number: 80}}, {port: {number: 80}}]}"),
                "spec.ingress[1].port.number 80 is used by an earlier ingress listener",
            ),
            (
                sidecar("{ingress: [{port: {number: 80}, defaultEndpoint: \"10.0.0.1:8080\"}]}"),
                "spec.ingress[0].defaultEndpoint: \"10.0.0.1:8080\": only a loopback",
            ),
            (
                sidecar("{ingress: [{port: {number: 80}, defaultEndpoint: \"unix://sock\"}]}"),
                "must be absolute",
            ),
            (
                sidecar("{ingress: [{port: {number: 80}, defaultEndpoint: localhost}]}"),
                "is not 127.0.0.1:PORT",
            ),
            (
                sidecar("{egress: [{port: {number: 70000}, hosts: [\"./*\"]}]}"),
                "spec.egress[0].port.number 70000",
            ),
        ];
        let cases: Vec<(&str, &str)> = cases
            .iter()
            .copied()
            .chain(sidecar_cases.iter().map(|(d, e)| (d.as_str(), *e)))
            .collect();
        for (doc, expected) in cases {
            let err = parse_file(Path::new("t.yaml"), doc)
                .expect_err(doc)
                .to_string();
            assert!(
                err.contains(expected),
                "{doc}\n  gave: {err}\n  expected: {expected}"
            );
            assert!(err.starts_with("t.yaml: document 1"), "{err}");
        }
        // The valid forms of each kind load.
        let good = "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a, subset: v1}, weight: 90}, {destination: {host: a, subset: v2}, weight: 10}]}]}\n---\nkind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}, loadBalancer: {simple: LEAST_REQUEST}}, subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]}\n---\nkind: Gateway\nmetadata: {name: g}\nspec: {selector: {istio: ingressgateway}, servers: [{port: {number: 443, name: https, protocol: HTTPS}, hosts: [\"ns/*.example.com\"], tls: {mode: SIMPLE, credentialName: c}}]}\n---\nkind: Namespace\nmetadata: {name: shop, labels: {istio-injection: enabled}}\n";
        let kinds: Vec<&str> = parse_file(Path::new("g.yaml"), good)
            .unwrap()
            .iter()
            .map(Resource::kind)
            .collect();
        assert_eq!(
            kinds,
            ["VirtualService", "DestinationRule", "Gateway", "Namespace"]
        );
        // The dry-run annotation is read (and only "true"/"false" are taken).
        let dry = |v: &str| {
            format!(
                "kind: AuthorizationPolicy\nmetadata: {{name: p, annotations: {{istio.io/dry-run: {v}}}}}\nspec: {{action: DENY, rules: [{{}}]}}\n"
            )
        };
        match parse_file(Path::new("d.yaml"), &dry("\"true\""))
            .unwrap()
            .as_slice()
        {
            [Resource::AuthorizationPolicy(_, spec)] => assert!(spec.dry_run),
            other => panic!("{other:?}"),
        }
        let err = parse_file(Path::new("d.yaml"), &dry("yes-please"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("metadata.annotations.istio.io/dry-run"),
            "{err}"
        );
        // A valid ALLOW/DENY/AUDIT AuthorizationPolicy loads, typed whole.
        let policy = "kind: AuthorizationPolicy\nmetadata: {name: p, namespace: shop}\nspec: {action: DENY, rules: [{from: [{source: {notNamespaces: [x]}}], when: [{key: \"request.headers[x]\", values: [\"1\"]}]}]}\n";
        match parse_file(Path::new("p.yaml"), policy).unwrap().as_slice() {
            [Resource::AuthorizationPolicy(m, spec)] => {
                assert_eq!(spec.action, authorization::Action::Deny);
                assert!(m.warnings.is_empty(), "{:?}", m.warnings);
            }
            other => panic!("{other:?}"),
        }
    }

    /// A tracer's or logger's field this control plane does not apply is named, not fatal.
    /// A pod is named after its workload as istiod names it: a Deployment's pod (generated
    /// name, controlled by a ReplicaSet ending in its `pod-template-hash`) by the Deployment;
    /// another controller's by the controller; a pod of its own by itself.
    #[test]
    fn a_pods_workload_is_named_as_istiod_names_it() {
        let pod = |meta: &str| -> String {
            let yaml = format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {meta}\nspec: {{serviceAccountName: s}}\n"
            );
            match &parse_file(Path::new("p.yaml"), &yaml).unwrap()[0] {
                Resource::Pod(_, p) => p.workload_name.clone(),
                other => panic!("{other:?}"),
            }
        };
        let owned = |kind: &str, owner: &str| {
            format!(
                "{{name: reviews-v1-5d9f-x7k2p, generateName: reviews-v1-5d9f-, labels: {{pod-template-hash: 5d9f}}, ownerReferences: [{{apiVersion: apps/v1, kind: {kind}, name: {owner}, uid: u, controller: true}}]}}"
            )
        };
        assert_eq!(pod(&owned("ReplicaSet", "reviews-v1-5d9f")), "reviews-v1");
        assert_eq!(pod(&owned("StatefulSet", "db")), "db");
        // A ReplicaSet not named after the hash is the workload itself.
        assert_eq!(pod(&owned("ReplicaSet", "other")), "other");
        assert_eq!(pod("{name: solo}"), "solo");
        // Not generated: its own name, whatever controls it.
        assert_eq!(
            pod(
                "{name: fixed, ownerReferences: [{apiVersion: apps/v1, kind: StatefulSet, name: db, uid: u, controller: true}]}"
            ),
            "fixed"
        );
    }

    #[test]
    fn unknown_provider_fields_are_warnings() {
        let cm = "kind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |-\n    extensionProviders:\n    - name: zipkin\n      zipkin: {service: z.istio-system.svc.cluster.local, port: 9411, timeout: 5s}\n";
        let r = parse_file(Path::new("cm.yaml"), cm).unwrap();
        assert_eq!(
            r[0].metadata().warnings,
            ["data.mesh.extensionProviders[0].zipkin.timeout: unknown field, ignored"]
        );
    }

    /// Istio's mesh config: the `mesh` key of the `istio` ConfigMap, a MeshConfig document, or
    /// a plain file; checked field by field.
    #[test]
    fn mesh_config_sources_and_checks() {
        let cm = "kind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |-\n    rootNamespace: mesh-root\n    enableAutoMtls: false\n    outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n    defaultConfig: {discoveryAddress: istiod:15012}\n";
        let r = parse_file(Path::new("cm.yaml"), cm).unwrap();
        let Resource::MeshConfig(_, mesh) = &r[0] else {
            panic!("{r:?}")
        };
        assert_eq!(mesh.root_namespace.as_deref(), Some("mesh-root"));
        assert_eq!(mesh.enable_auto_mtls, Some(false));
        assert!(mesh.rest.contains_key("defaultConfig"), "kept as written");

        let bad = cm.replace("REGISTRY_ONLY", "DENY_ALL");
        let e = parse_file(Path::new("cm.yaml"), &bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "ConfigMap istio: data.mesh: MeshConfig: outboundTrafficPolicy.mode: \"DENY_ALL\""
            ),
            "{e}"
        );
        let e = parse_mesh_config(
            Path::new("/etc/istio/config/mesh"),
            "rootNamespace: Not_A_Name\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("/etc/istio/config/mesh: document 1: MeshConfig: rootNamespace"),
            "{e}"
        );
        assert_eq!(
            parse_mesh_config(Path::new("m"), "").unwrap(),
            MeshConfigSpec::default()
        );
        let e = parse_file(
            Path::new("d.yaml"),
            "kind: MeshConfig\nmetadata: {name: m}\nspec: {enableAutoMtls: sometimes}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("MeshConfig m: invalid spec"), "{e}");
    }
}

#[cfg(test)]
mod size_tests {
    /// The bound that keeps a cluster's many small objects small: a Resource is its largest
    /// unboxed variant (a VirtualService's, a Pod's), not a DestinationRule's 1 KiB.
    #[test]
    fn a_resource_is_small() {
        let size = std::mem::size_of::<super::Resource>();
        assert!(size <= 256, "Resource is {size} bytes");
    }
}
