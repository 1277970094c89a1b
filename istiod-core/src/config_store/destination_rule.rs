//! networking.istio.io DestinationRule, typed field by field (istio/api
//! `networking/v1alpha3/destination_rule.proto`) and checked as Istio's `pkg/config/validation`
//! checks it, each error naming the field (`trafficPolicy.outlierDetection.interval`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::values::GoDuration;

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct DestinationRuleSpec {
    pub host: String,
    pub traffic_policy: Option<TrafficPolicy>,
    pub subsets: Vec<Subset>,
    pub export_to: Vec<String>,
    pub workload_selector: Option<super::selector::WorkloadSelector>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct TrafficPolicy {
    pub load_balancer: Option<LoadBalancer>,
    pub connection_pool: Option<ConnectionPool>,
    pub outlier_detection: Option<OutlierDetection>,
    pub tls: Option<ClientTls>,
    pub port_level_settings: Vec<PortTrafficPolicy>,
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// `portLevelSettings[]`: the four blocks, for one port.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct PortTrafficPolicy {
    pub port: Option<super::virtual_service::PortSelector>,
    pub load_balancer: Option<LoadBalancer>,
    pub connection_pool: Option<ConnectionPool>,
    pub outlier_detection: Option<OutlierDetection>,
    pub tls: Option<ClientTls>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct LoadBalancer {
    pub simple: Option<String>,
    pub consistent_hash: Option<ConsistentHash>,
    pub locality_lb_setting: Option<super::locality::LocalityLbSetting>,
    pub warmup_duration_secs: Option<GoDuration>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ConsistentHash {
    pub http_header_name: Option<String>,
    pub http_cookie: Option<HttpCookie>,
    pub use_source_ip: Option<bool>,
    pub http_query_parameter_name: Option<String>,
    pub ring_hash: Option<RingHash>,
    pub maglev: Option<Maglev>,
    /// Deprecated: ringHash.minimumRingSize.
    pub minimum_ring_size: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct HttpCookie {
    pub name: String,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub ttl: Option<GoDuration>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct RingHash {
    pub minimum_ring_size: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct Maglev {
    pub table_size: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct ConnectionPool {
    pub tcp: Option<TcpSettings>,
    pub http: Option<HttpSettings>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct TcpSettings {
    pub max_connections: Option<i32>,
    pub connect_timeout: Option<GoDuration>,
    pub tcp_keepalive: Option<TcpKeepalive>,
    pub max_connection_duration: Option<GoDuration>,
    pub idle_timeout: Option<GoDuration>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct TcpKeepalive {
    pub probes: Option<u32>,
    pub time: Option<GoDuration>,
    pub interval: Option<GoDuration>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpSettings {
    pub http1_max_pending_requests: Option<i32>,
    pub http2_max_requests: Option<i32>,
    pub max_requests_per_connection: Option<i32>,
    pub max_retries: Option<i32>,
    pub idle_timeout: Option<GoDuration>,
    pub h2_upgrade_policy: Option<String>,
    pub use_client_protocol: Option<bool>,
    pub max_concurrent_streams: Option<i32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct OutlierDetection {
    pub consecutive_5xx_errors: Option<u32>,
    pub consecutive_gateway_errors: Option<u32>,
    pub split_external_local_origin_errors: Option<bool>,
    pub consecutive_local_origin_failures: Option<u32>,
    pub interval: Option<GoDuration>,
    pub base_ejection_time: Option<GoDuration>,
    pub max_ejection_percent: Option<i32>,
    pub min_health_percent: Option<i32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ClientTls {
    pub mode: Option<String>,
    pub client_certificate: Option<String>,
    pub private_key: Option<String>,
    pub ca_certificates: Option<String>,
    pub credential_name: Option<String>,
    pub subject_alt_names: Vec<String>,
    pub sni: Option<String>,
    pub insecure_skip_verify: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct ProxyProtocol {
    pub version: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct Subset {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub traffic_policy: Option<TrafficPolicy>,
}

/// The TLS modes of `ClientTLSSettings.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    Disable,
    Simple,
    Mutual,
    IstioMutual,
}

impl ClientTls {
    pub fn mode(&self) -> TlsMode {
        match self.mode.as_deref() {
            Some("SIMPLE") => TlsMode::Simple,
            Some("MUTUAL") => TlsMode::Mutual,
            Some("ISTIO_MUTUAL") => TlsMode::IstioMutual,
            _ => TlsMode::Disable,
        }
    }
}

fn check_tls(field: &str, tls: &ClientTls) -> Result<(), String> {
    match tls.mode.as_deref().unwrap_or("DISABLE") {
        "DISABLE" | "SIMPLE" | "ISTIO_MUTUAL" => {}
        "MUTUAL" => {
            if tls.credential_name.is_none()
                && (tls.client_certificate.is_none() || tls.private_key.is_none())
            {
                return Err(format!(
                    "{field}: MUTUAL needs credentialName, or clientCertificate and privateKey"
                ));
            }
        }
        other => {
            return Err(format!(
                "{field}.mode: {other:?} is not DISABLE, SIMPLE, MUTUAL or ISTIO_MUTUAL"
            ));
        }
    }
    if tls.credential_name.is_some() {
        return Err(format!(
            "{field}.credentialName: Kubernetes secrets are not available to this control plane; \
             use clientCertificate/privateKey/caCertificates files"
        ));
    }
    for (name, path) in [
        ("clientCertificate", &tls.client_certificate),
        ("privateKey", &tls.private_key),
        ("caCertificates", &tls.ca_certificates),
    ] {
        if let Some(p) = path
            && (!p.starts_with('/') || p.contains('~') || p.contains(".."))
        {
            return Err(format!(
                "{field}.{name}: {p:?} must be an absolute file path without '~' or '..'"
            ));
        }
    }
    Ok(())
}

fn check_load_balancer(field: &str, lb: &LoadBalancer) -> Result<(), String> {
    if let Some(simple) = lb.simple.as_deref()
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
            "{field}.simple: {simple:?} is not a load balancer \
             (ROUND_ROBIN, LEAST_REQUEST, RANDOM, PASSTHROUGH)"
        ));
    }
    if let Some(l) = &lb.locality_lb_setting {
        l.check(&format!("{field}.localityLbSetting"))?;
    }
    if lb.simple.is_some() && lb.consistent_hash.is_some() {
        return Err(format!(
            "{field}: simple and consistentHash exclude each other"
        ));
    }
    if let Some(ch) = &lb.consistent_hash {
        let keys = [
            ch.http_header_name.is_some(),
            ch.http_cookie.is_some(),
            ch.use_source_ip == Some(true),
            ch.http_query_parameter_name.is_some(),
        ];
        if keys.iter().filter(|k| **k).count() != 1 {
            return Err(format!(
                "{field}.consistentHash: exactly one of httpHeaderName, httpCookie, useSourceIp \
                 or httpQueryParameterName is required"
            ));
        }
        if ch.ring_hash.is_some() && ch.maglev.is_some() {
            return Err(format!(
                "{field}.consistentHash: ringHash and maglev exclude each other"
            ));
        }
        if let Some(c) = &ch.http_cookie
            && c.name.is_empty()
        {
            return Err(format!("{field}.consistentHash.httpCookie.name: required"));
        }
        let ring = ch
            .ring_hash
            .as_ref()
            .and_then(|r| r.minimum_ring_size)
            .or(ch.minimum_ring_size);
        if ring.is_some_and(|r| r > 8_388_608) {
            return Err(format!(
                "{field}.consistentHash: a ring of more than 8M entries is not allowed"
            ));
        }
        if let Some(t) = ch.maglev.as_ref().and_then(|m| m.table_size)
            && !is_prime(t)
        {
            return Err(format!(
                "{field}.consistentHash.maglev.tableSize: {t} must be a prime number"
            ));
        }
    }
    Ok(())
}

fn is_prime(n: u64) -> bool {
    if !(2..=5_000_011).contains(&n) {
        return false;
    }
    let mut d = 2;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

fn check_connection_pool(field: &str, cp: &ConnectionPool) -> Result<(), String> {
    let non_negative = |name: &str, v: Option<i32>| match v {
        Some(n) if n < 0 => Err(format!("{field}.{name}: {n} must not be negative")),
        _ => Ok(()),
    };
    if let Some(tcp) = &cp.tcp {
        non_negative("tcp.maxConnections", tcp.max_connections)?;
        if tcp
            .connect_timeout
            .as_ref()
            .is_some_and(|t| t.value.is_zero())
        {
            return Err(format!(
                "{field}.tcp.connectTimeout: must be greater than 0"
            ));
        }
    }
    if let Some(http) = &cp.http {
        non_negative(
            "http.http1MaxPendingRequests",
            http.http1_max_pending_requests,
        )?;
        non_negative("http.http2MaxRequests", http.http2_max_requests)?;
        non_negative(
            "http.maxRequestsPerConnection",
            http.max_requests_per_connection,
        )?;
        non_negative("http.maxRetries", http.max_retries)?;
        non_negative("http.maxConcurrentStreams", http.max_concurrent_streams)?;
        if let Some(p) = &http.h2_upgrade_policy
            && !matches!(p.as_str(), "DEFAULT" | "DO_NOT_UPGRADE" | "UPGRADE")
        {
            return Err(format!(
                "{field}.http.h2UpgradePolicy: {p:?} is not DEFAULT, DO_NOT_UPGRADE or UPGRADE"
            ));
        }
    }
    Ok(())
}

fn check_outlier(field: &str, od: &OutlierDetection) -> Result<(), String> {
    for (name, v) in [
        ("maxEjectionPercent", od.max_ejection_percent),
        ("minHealthPercent", od.min_health_percent),
    ] {
        if let Some(v) = v
            && !(0..=100).contains(&v)
        {
            return Err(format!("{field}.{name}: {v} must be 0-100"));
        }
    }
    if od.interval.as_ref().is_some_and(|t| t.value.is_zero()) {
        return Err(format!("{field}.interval: must be greater than 0"));
    }
    Ok(())
}

fn check_policy(field: &str, p: &TrafficPolicy) -> Result<(), String> {
    check_blocks(
        field,
        p.load_balancer.as_ref(),
        p.connection_pool.as_ref(),
        p.outlier_detection.as_ref(),
        p.tls.as_ref(),
    )?;
    let mut ports = BTreeSet::new();
    for (i, pl) in p.port_level_settings.iter().enumerate() {
        let at = format!("{field}.portLevelSettings[{i}]");
        let port = pl
            .port
            .ok_or_else(|| format!("{at}.port: a port number is required"))?;
        if !ports.insert(port.number) {
            return Err(format!("{at}.port: port {} is set twice", port.number.0));
        }
        check_blocks(
            &at,
            pl.load_balancer.as_ref(),
            pl.connection_pool.as_ref(),
            pl.outlier_detection.as_ref(),
            pl.tls.as_ref(),
        )?;
    }
    if let Some(v) = p
        .proxy_protocol
        .as_ref()
        .and_then(|pp| pp.version.as_deref())
        && !matches!(v, "V1" | "V2")
    {
        return Err(format!(
            "{field}.proxyProtocol.version: {v:?} is not V1 or V2"
        ));
    }
    Ok(())
}

fn check_blocks(
    field: &str,
    lb: Option<&LoadBalancer>,
    cp: Option<&ConnectionPool>,
    od: Option<&OutlierDetection>,
    tls: Option<&ClientTls>,
) -> Result<(), String> {
    if let Some(lb) = lb {
        check_load_balancer(&format!("{field}.loadBalancer"), lb)?;
    }
    if let Some(cp) = cp {
        check_connection_pool(&format!("{field}.connectionPool"), cp)?;
    }
    if let Some(od) = od {
        check_outlier(&format!("{field}.outlierDetection"), od)?;
    }
    if let Some(tls) = tls {
        check_tls(&format!("{field}.tls"), tls)?;
    }
    Ok(())
}

pub fn validate_destination_rule(spec: &DestinationRuleSpec) -> Result<(), String> {
    if spec.host.is_empty() {
        return Err("host: required".into());
    }
    if let Some(p) = &spec.traffic_policy {
        check_policy("trafficPolicy", p)?;
    }
    let mut seen = BTreeSet::new();
    for (i, s) in spec.subsets.iter().enumerate() {
        let at = format!("subsets[{i}]");
        if !super::traffic::is_dns1123_label(&s.name) {
            return Err(format!(
                "{at}.name: {:?} is not a valid subset name (DNS-1123 label)",
                s.name
            ));
        }
        if !seen.insert(&s.name) {
            return Err(format!("{at}.name: subset {:?} is defined twice", s.name));
        }
        if let Some(p) = &s.traffic_policy {
            check_policy(&format!("{at}.trafficPolicy"), p)?;
        }
    }
    Ok(())
}
