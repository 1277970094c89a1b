//! The node every component and pod of a test cluster lives on: its name, address, address
//! ranges and topology, the kubelet's port, and the two things every part of the node does with
//! them (join its network namespace, stamp a time as the API server writes it).

use anyhow::{Context, Result};

/// The Kubernetes release `scripts/install-kube.sh` builds (its `KUBE_VERSION`).
pub const KUBE_VERSION: &str = "v1.36.3";
/// The node's address: the pods' bridge, where host-network components (istiod) listen.
pub const NODE_IP: &str = "10.244.0.1";
/// Pods get addresses from here (the node's `spec.podCIDR`).
pub const POD_CIDR: &str = "10.244.0.0/24";
/// Services get ClusterIPs from here; only sidecars route them (no kube-proxy runs).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The port of the kubelet's server (exec, logs) on `NODE_IP`, as a kubelet's.
pub const KUBELET_PORT: u16 = 10250;
/// The Node every pod is bound to, with its topology labels.
pub const NODE_NAME: &str = "node-1";
pub const REGION: &str = "region-1";
pub const ZONE: &str = "zone-1";

/// Joins the calling thread to network namespace `ns` (a name under /var/run/netns).
pub fn enter_netns(ns: &str) -> Result<()> {
    let file = std::fs::File::open(format!("/var/run/netns/{ns}"))
        .with_context(|| format!("open network namespace {ns}"))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("join network namespace {ns}"))?;
    Ok(())
}

/// Now, as the API server writes a time (RFC 3339, seconds, UTC).
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
