//! networking.istio.io ServiceEntry, WorkloadEntry and WorkloadGroup: the registry's own
//! services and workloads.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::selector::WorkloadSelector;

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
    /// The network it is on (unset: the cluster's). Behind a thin pointer: a Resource stays
    /// within its size bound (`size_tests`), and few entries name a network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[allow(clippy::box_collection)] // one word instead of three, on every WorkloadEntry
    pub network: Option<Box<String>>,
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
#[serde(default)]
pub struct WorkloadGroupMetadata {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// A WorkloadEntry without its address (each registering proxy brings its own).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkloadTemplate {
    pub address: Option<String>,
    pub ports: BTreeMap<String, u16>,
    pub labels: BTreeMap<String, String>,
    pub service_account: Option<String>,
    pub network: Option<String>,
}

/// A ServiceEntry names at least one host.
pub(super) fn validate_service_entry(spec: &ServiceEntrySpec) -> Result<(), String> {
    if spec.hosts.is_empty() {
        return Err("at least one host is required".to_string());
    }
    Ok(())
}

/// A WorkloadGroup's template has no address: each proxy registers its own.
pub(super) fn validate_workload_group(spec: &WorkloadGroupSpec) -> Result<(), String> {
    if spec.template.address.is_some() {
        return Err(
            "spec.template.address: not allowed (each proxy registers its own address)".to_string(),
        );
    }
    Ok(())
}
