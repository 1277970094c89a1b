//! The ports the proxy listens on, each its own: Envoy's admin (proxyAdminPort), the agent's
//! status port (statusPort), Envoy's readiness (15021) and Prometheus (15090) listeners, the
//! capture listeners istiod-core generates (15001, 15006), the DNS proxy (DNS_PROXY_ADDR) when it
//! runs, and the two ports Istio keeps for itself (the agent's debug port 15004, the HBONE tunnel
//! 15008). Istio checks only that proxyAdminPort and statusPort are in 1..=65535 (pkg/config/
//! validation/agent `ValidateMeshConfigProxyConfig`, and not for the `status.sidecar.istio.io/port`
//! annotation, whose 0 turns the status server off): two that collide show only when the second
//! bind fails, Envoy's admin after Envoy has started. Here the config is refused first.

use super::{ConfigError, err};

/// Envoy's outbound capture listener (`virtualOutbound`, istio-iptables' `-p`).
pub const VIRTUAL_OUTBOUND: u16 = mesh_common::names::VIRTUAL_OUTBOUND_PORT;
/// Istio's agent debug port (`pilot-agent request --debug-port`); kept for it.
pub const AGENT_DEBUG: u16 = 15004;
/// Envoy's inbound capture listener (`virtualInbound`, istio-iptables' `-z`).
pub const VIRTUAL_INBOUND: u16 = mesh_common::names::VIRTUAL_INBOUND_PORT;
/// Istio's HBONE tunnel port; kept for it.
pub const TUNNEL: u16 = 15008;
/// Envoy's readiness listener, which kubelet probes (`ENVOY_STATUS_PORT`).
pub const ENVOY_STATUS: u16 = 15021;
/// The DNS proxy's port unless DNS_PROXY_ADDR says otherwise.
pub const DNS_PROXY: u16 = 15053;
/// Envoy's Prometheus listener (`ENVOY_PROMETHEUS_PORT`).
pub const PROMETHEUS: u16 = 15090;

/// Ports of the proxy itself at Istio's defaults: an app probe or the app's metrics may not be
/// one of them.
pub const RESERVED: [u16; 9] = [
    super::proxy_config::DEFAULT_ADMIN_PORT,
    VIRTUAL_OUTBOUND,
    AGENT_DEBUG,
    VIRTUAL_INBOUND,
    TUNNEL,
    super::proxy_config::DEFAULT_STATUS_PORT,
    ENVOY_STATUS,
    DNS_PROXY,
    PROMETHEUS,
];

/// The ports no setting moves, and what each is.
const FIXED: [(u16, &str); 6] = [
    (
        VIRTUAL_OUTBOUND,
        "Envoy's outbound capture listener (virtualOutbound)",
    ),
    (AGENT_DEBUG, "Istio's agent debug port, kept free"),
    (
        VIRTUAL_INBOUND,
        "Envoy's inbound capture listener (virtualInbound)",
    ),
    (TUNNEL, "Istio's HBONE tunnel port, kept free"),
    (ENVOY_STATUS, "Envoy's readiness listener"),
    (PROMETHEUS, "Envoy's Prometheus listener"),
];

/// A port the config chose: what it is for and which input set it (`None`: the default).
#[derive(Debug, Clone)]
pub(super) struct Chosen {
    pub port: u16,
    pub what: &'static str,
    pub field: &'static str,
    pub set_by: Option<String>,
}

/// Every chosen port is in 1..=65535 and differs from the fixed ones and from each other. The
/// error names the input that set the port (a default is never blamed for a collision with a
/// value someone set) and what else uses it.
pub(super) fn check(chosen: &[Chosen]) -> Result<(), ConfigError> {
    let mut order: Vec<&Chosen> = chosen.iter().collect();
    // Defaults first, so a collision is reported on the value that was set.
    order.sort_by_key(|c| c.set_by.is_some());
    let mut taken: Vec<(u16, String)> = FIXED
        .iter()
        .map(|(port, what)| (*port, (*what).to_string()))
        .collect();
    for c in order {
        let input = c
            .set_by
            .clone()
            .unwrap_or_else(|| format!("{} (default)", c.field));
        if c.port == 0 {
            let why = if c.field == "statusPort" {
                " (Istio's status.sidecar.istio.io/port annotation turns the status server off \
                 with 0; this agent always serves it: readiness, app probes and metrics)"
            } else {
                ""
            };
            return Err(err(
                &input,
                "0",
                &format!("a port from 1 to 65535 for {}{why}", c.what),
            ));
        }
        if let Some((_, other)) = taken.iter().find(|(port, _)| *port == c.port) {
            return Err(err(
                &input,
                &c.port.to_string(),
                &format!(
                    "a port of its own for {}: {} is also {other}",
                    c.what, c.port
                ),
            ));
        }
        taken.push((c.port, format!("{} ({})", c.what, c.field)));
    }
    Ok(())
}
