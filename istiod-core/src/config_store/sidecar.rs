//! networking.istio.io Sidecar: a workload's egress hosts and ingress listeners.

use serde::Deserialize;

use super::mesh_config::OutboundTrafficPolicy;
use super::selector::WorkloadSelector;

/// networking.istio.io Sidecar: which services a workload's sidecar sees (egress hosts) and
/// what happens to traffic for anything else.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct SidecarSpec {
    pub workload_selector: Option<WorkloadSelector>,
    pub egress: Vec<SidecarEgress>,
    pub ingress: Vec<SidecarIngress>,
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

/// A Sidecar's egress hosts are `<namespace>/<dns name>`, its ports in range, its ingress
/// ports distinct and its default endpoints well formed.
pub(super) fn validate_sidecar(spec: &SidecarSpec) -> Result<(), String> {
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
