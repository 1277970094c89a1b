//! Config ingestion: Kubernetes-style YAML or JSON documents, turned into typed resources. An
//! index of the kinds: each family of kinds has its file (its types, defaults and checks), the
//! selectors theirs (`selector`), and a document becomes a [`Resource`] in `parse`. Mirrors
//! istiod's file config source (`pilot/pkg/config/file`), where one directory of manifests
//! stands in for the Kubernetes API server.
//!
//! The watched directory is read document by document (`dir`): a document that is invalid or of
//! a kind not served here is refused alone, its last good version kept. `parse_file`,
//! `load_dir` and `validate_dir` are the strict forms (`istiod-core validate`, tests): the first
//! error fails them, naming the file and the document.

use std::path::PathBuf;

pub mod authorization;
pub mod destination_rule;
pub mod dir;
pub mod discovery;
pub mod envoy_filter;
pub mod gateway;
pub mod gateway_api;
pub mod kubernetes;
pub mod locality;
pub mod mesh_config;
pub mod metadata;
pub mod parse;
pub mod peer_authentication;
pub mod providers;
pub mod request_authentication;
pub mod selector;
pub mod service_entry;
pub mod sidecar;
pub mod telemetry;
pub mod traffic;
pub mod values;
pub mod virtual_service;

pub use authorization::AuthorizationPolicySpec;
pub use destination_rule::DestinationRuleSpec;
pub use dir::{MAX_CONFIG_FILE_BYTES, load_dir, parse_file, validate_dir};
pub use gateway::{GatewaySpec, TlsSecret};
pub use kubernetes::{
    EndpointAddress, EndpointPort, EndpointSliceSpec, EndpointSubset, ObjectReference, PodInfo,
    SERVICE_NAME_LABEL, ServicePortSpec, ServiceSpec, SliceConditions, SliceEndpoint,
    pod_workload_name,
};
pub use mesh_config::{MeshConfigSpec, OutboundTrafficPolicy, parse_mesh_config};
pub use metadata::Metadata;
#[cfg(test)]
pub(crate) use parse::check_spec;
pub(crate) use parse::parse_document;
pub use peer_authentication::{MtlsMode, MtlsSpec, PeerAuthenticationSpec};
pub use request_authentication::RequestAuthenticationSpec;
pub use selector::{LabelSelector, PolicySelector, WorkloadSelector};
pub use service_entry::{
    SePort, ServiceEntrySpec, WorkloadEntrySpec, WorkloadGroupMetadata, WorkloadGroupSpec,
    WorkloadTemplate,
};
pub use sidecar::{IngressEndpoint, SidecarEgress, SidecarIngress, SidecarPort, SidecarSpec};
pub use virtual_service::VirtualServiceSpec;

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

/// The parsed contents of a config directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigSet {
    pub resources: Vec<Resource>,
}

#[cfg(test)]
mod tests;
