//! Gateway, typed where a field is checked, the rest kept as written (so
//! /debug/configz shows the resource whole). Validation follows the checks of Istio's
//! `pkg/config/validation`, and every error names the field (`servers[0].port`).
//! VirtualService, DestinationRule and AuthorizationPolicy have rooms of their own
//! (`virtual_service`, `destination_rule`, `authorization`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Fields we do not type, kept as written.
type Rest = BTreeMap<String, Value>;

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct GatewaySpec {
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
    #[serde(default)]
    pub servers: Vec<GatewayServer>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct GatewayServer {
    #[serde(default)]
    pub port: Option<GatewayPort>,
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct GatewayPort {
    #[serde(default)]
    pub number: i64,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub protocol: String,
}

/// Kubernetes' DNS-1123 label: what Istio requires of subset names.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn check_port(field: &str, number: i64) -> Result<(), String> {
    if (1..=65535).contains(&number) {
        Ok(())
    } else {
        Err(format!("{field}: port number {number} is not in 1-65535"))
    }
}

pub fn validate_gateway(spec: &GatewaySpec) -> Result<(), String> {
    if spec.servers.is_empty() {
        return Err("servers: at least one server is required".into());
    }
    for (i, s) in spec.servers.iter().enumerate() {
        let at = format!("servers[{i}]");
        let port = s
            .port
            .as_ref()
            .ok_or_else(|| format!("{at}.port: required"))?;
        check_port(&format!("{at}.port"), port.number)?;
        if port.protocol.is_empty() {
            return Err(format!("{at}.port.protocol: required"));
        }
        if s.hosts.is_empty() {
            return Err(format!("{at}.hosts: at least one host is required"));
        }
        for (j, h) in s.hosts.iter().enumerate() {
            let name = h.split_once('/').map_or(h.as_str(), |(_, n)| n);
            if name.is_empty() {
                return Err(format!("{at}.hosts[{j}]: {h:?} names no host"));
            }
        }
    }
    Ok(())
}
