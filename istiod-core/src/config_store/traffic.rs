//! The traffic and policy kinds: VirtualService, DestinationRule, Gateway and
//! AuthorizationPolicy, typed where a field is checked or used, the rest kept as written (so
//! /debug/configz shows the resource whole). Validation follows the checks of Istio's
//! `pkg/config/validation`, and every error names the field (`http[0].route[1].destination.host`).
//!
//! Of these, the control plane acts on DestinationRule subsets (subset clusters); routing,
//! gateways and authorization are validated only.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Fields we do not type, kept as written.
type Rest = BTreeMap<String, Value>;

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualServiceSpec {
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub gateways: Vec<String>,
    #[serde(default)]
    pub http: Vec<HttpRoute>,
    #[serde(default)]
    pub tcp: Vec<L4Route>,
    #[serde(default)]
    pub tls: Vec<L4Route>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRoute {
    #[serde(default, rename = "match")]
    pub matches: Vec<Value>,
    #[serde(default)]
    pub route: Vec<RouteDestination>,
    #[serde(default)]
    pub redirect: Option<Value>,
    #[serde(default)]
    pub direct_response: Option<Value>,
    #[serde(default)]
    pub delegate: Option<Value>,
    #[serde(default)]
    pub timeout: Option<String>,
    #[serde(default)]
    pub mirror: Option<Destination>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// A TCP or TLS route.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct L4Route {
    #[serde(default, rename = "match")]
    pub matches: Vec<Value>,
    #[serde(default)]
    pub route: Vec<RouteDestination>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct RouteDestination {
    pub destination: Destination,
    #[serde(default)]
    pub weight: Option<i64>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct Destination {
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub subset: Option<String>,
    #[serde(default)]
    pub port: Option<PortSelector>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct PortSelector {
    pub number: i64,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DestinationRuleSpec {
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub traffic_policy: Option<TrafficPolicy>,
    #[serde(default)]
    pub subsets: Vec<Subset>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicy {
    #[serde(default)]
    pub tls: Option<ClientTls>,
    #[serde(default)]
    pub load_balancer: Option<LoadBalancer>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClientTls {
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub credential_name: Option<String>,
    #[serde(default)]
    pub client_certificate: Option<String>,
    #[serde(default)]
    pub private_key: Option<String>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct LoadBalancer {
    #[serde(default)]
    pub simple: Option<String>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Subset {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub traffic_policy: Option<TrafficPolicy>,
}

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

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    #[serde(default)]
    pub selector: Option<Value>,
    #[serde(default)]
    pub target_ref: Option<Value>,
    #[serde(default)]
    pub action: Option<String>,
    #[serde(default)]
    pub provider: Option<Value>,
    #[serde(default)]
    pub rules: Vec<AuthzRule>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct AuthzRule {
    #[serde(default)]
    pub from: Vec<Value>,
    #[serde(default)]
    pub to: Vec<Value>,
    #[serde(default)]
    pub when: Vec<Condition>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub values: Vec<String>,
    #[serde(default)]
    pub not_values: Vec<String>,
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

fn check_destination(field: &str, d: &Destination) -> Result<(), String> {
    if d.host.is_empty() {
        return Err(format!("{field}.host: a destination host is required"));
    }
    if let Some(subset) = &d.subset
        && !is_dns1123_label(subset)
    {
        return Err(format!(
            "{field}.subset: {subset:?} is not a valid subset name (DNS-1123 label)"
        ));
    }
    if let Some(port) = &d.port {
        check_port(&format!("{field}.port"), port.number)?;
    }
    Ok(())
}

fn check_routes(field: &str, routes: &[RouteDestination]) -> Result<(), String> {
    for (i, r) in routes.iter().enumerate() {
        let at = format!("{field}[{i}]");
        check_destination(&format!("{at}.destination"), &r.destination)?;
        // Weights are relative (a destination gets weight / sum of weights).
        if let Some(w) = r.weight
            && !(0..=i64::from(u32::MAX)).contains(&w)
        {
            return Err(format!("{at}.weight: {w} must not be negative"));
        }
    }
    if routes.len() > 1 {
        let total: i64 = routes.iter().map(|r| r.weight.unwrap_or(0)).sum();
        if total == 0 {
            return Err(format!(
                "{field}: with several destinations, the weights must not all be zero"
            ));
        }
    }
    Ok(())
}

pub fn validate_virtual_service(spec: &VirtualServiceSpec) -> Result<(), String> {
    if spec.hosts.is_empty() && !spec.gateways.is_empty() {
        return Err("gateways: a delegate VirtualService (no hosts) must not name gateways".into());
    }
    for (i, h) in spec.hosts.iter().enumerate() {
        if h.is_empty() {
            return Err(format!("hosts[{i}]: must not be empty"));
        }
    }
    if spec.http.is_empty() && spec.tcp.is_empty() && spec.tls.is_empty() {
        return Err("http, tcp or tls: at least one route is required".into());
    }
    for (i, r) in spec.http.iter().enumerate() {
        let at = format!("http[{i}]");
        let actions = [
            !r.route.is_empty(),
            r.redirect.is_some(),
            r.direct_response.is_some(),
            r.delegate.is_some(),
        ];
        match actions.iter().filter(|a| **a).count() {
            0 => {
                return Err(format!(
                    "{at}: one of route, redirect, directResponse or delegate is required"
                ));
            }
            1 => {}
            _ => {
                return Err(format!(
                    "{at}: route, redirect, directResponse and delegate exclude each other"
                ));
            }
        }
        check_routes(&format!("{at}.route"), &r.route)?;
        if let Some(t) = &r.timeout
            && let Err(e) = crate::parse_go_duration(t)
        {
            return Err(format!(
                "{at}.timeout: {t:?} is not a duration such as 1.5s: {e}"
            ));
        }
        if let Some(m) = &r.mirror {
            check_destination(&format!("{at}.mirror"), m)?;
        }
    }
    for (kind, routes) in [("tcp", &spec.tcp), ("tls", &spec.tls)] {
        for (i, r) in routes.iter().enumerate() {
            let at = format!("{kind}[{i}]");
            if r.route.is_empty() {
                return Err(format!("{at}.route: at least one destination is required"));
            }
            if kind == "tls" && r.matches.is_empty() {
                return Err(format!(
                    "{at}.match: a TLS route needs a match with sniHosts"
                ));
            }
            check_routes(&format!("{at}.route"), &r.route)?;
        }
    }
    Ok(())
}

fn check_traffic_policy(field: &str, p: &TrafficPolicy) -> Result<(), String> {
    if let Some(tls) = &p.tls {
        let mode = tls.mode.as_deref().unwrap_or("DISABLE");
        match mode {
            "DISABLE" | "SIMPLE" | "ISTIO_MUTUAL" => {}
            "MUTUAL" => {
                if tls.credential_name.is_none()
                    && (tls.client_certificate.is_none() || tls.private_key.is_none())
                {
                    return Err(format!(
                        "{field}.tls: MUTUAL needs credentialName, or clientCertificate and privateKey"
                    ));
                }
            }
            other => {
                return Err(format!(
                    "{field}.tls.mode: {other:?} is not DISABLE, SIMPLE, MUTUAL or ISTIO_MUTUAL"
                ));
            }
        }
    }
    if let Some(simple) = p.load_balancer.as_ref().and_then(|l| l.simple.as_deref())
        && !matches!(
            simple,
            "UNSPECIFIED"
                | "RANDOM"
                | "PASSTHROUGH"
                | "ROUND_ROBIN"
                | "LEAST_REQUEST"
                | "LEAST_CONN"
        )
    {
        return Err(format!(
            "{field}.loadBalancer.simple: {simple:?} is not a load balancer \
             (ROUND_ROBIN, LEAST_REQUEST, RANDOM, PASSTHROUGH)"
        ));
    }
    Ok(())
}

pub fn validate_destination_rule(spec: &DestinationRuleSpec) -> Result<(), String> {
    if spec.host.is_empty() {
        return Err("host: required".into());
    }
    if let Some(p) = &spec.traffic_policy {
        check_traffic_policy("trafficPolicy", p)?;
    }
    let mut seen = BTreeSet::new();
    for (i, s) in spec.subsets.iter().enumerate() {
        let at = format!("subsets[{i}]");
        if !is_dns1123_label(&s.name) {
            return Err(format!(
                "{at}.name: {:?} is not a valid subset name (DNS-1123 label)",
                s.name
            ));
        }
        if !seen.insert(&s.name) {
            return Err(format!("{at}.name: subset {:?} is defined twice", s.name));
        }
        if let Some(p) = &s.traffic_policy {
            check_traffic_policy(&format!("{at}.trafficPolicy"), p)?;
        }
    }
    Ok(())
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

pub fn validate_authorization_policy(spec: &AuthorizationPolicySpec) -> Result<(), String> {
    let action = spec.action.as_deref().unwrap_or("ALLOW");
    match action {
        "ALLOW" | "DENY" | "AUDIT" => {
            if spec.provider.is_some() {
                return Err(format!(
                    "provider: only a CUSTOM policy names a provider (action is {action})"
                ));
            }
        }
        "CUSTOM" => {
            if spec.provider.is_none() {
                return Err("provider: a CUSTOM policy must name its provider".into());
            }
        }
        other => {
            return Err(format!(
                "action: {other:?} is not ALLOW, DENY, AUDIT or CUSTOM"
            ));
        }
    }
    if spec.selector.is_some() && spec.target_ref.is_some() {
        return Err("selector and targetRef: only one of them may be set".into());
    }
    for (i, rule) in spec.rules.iter().enumerate() {
        for (j, c) in rule.when.iter().enumerate() {
            let at = format!("rules[{i}].when[{j}]");
            if c.key.is_empty() {
                return Err(format!("{at}.key: required"));
            }
            if c.values.is_empty() && c.not_values.is_empty() {
                return Err(format!("{at}: values or notValues is required"));
            }
        }
    }
    Ok(())
}
