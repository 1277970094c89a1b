//! What Istio 1.27–1.31's agent added to Envoy's bootstrap and command line, read from the
//! env (or ProxyConfig `proxyMetadata`, which Istio's agent applies as env) and ProxyConfig:
//! file flushing, 15090's compression, the mTLS metrics ports, self discovery for zone-aware
//! load balancing, PROXY protocol on 15021, the compliance policy and Envoy's log and core-dump
//! flags. Each as Istio's `pkg/bootstrap` and `pkg/envoy` use it; a value that is not what the
//! setting takes is an error naming it (Istio warns and uses its default).

use std::time::Duration;

use super::proxy_config::ProxyConfigOverlay;
use super::{ConfigError, err, parse_bool, parse_duration};

/// Istio's `COMPLIANCE_POLICY` (pkg/features `CompliancePolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompliancePolicy {
    Fips1402,
    Fips1403,
    /// Post-quantum key exchange (Istio 1.27, experimental): TLS 1.3 with X25519MLKEM768.
    Pqc,
}

impl CompliancePolicy {
    fn parse(raw: &str) -> Result<Option<CompliancePolicy>, ConfigError> {
        match raw {
            "" => Ok(None),
            "fips-140-2" => Ok(Some(CompliancePolicy::Fips1402)),
            "fips-140-3" => Ok(Some(CompliancePolicy::Fips1403)),
            "pqc" => Ok(Some(CompliancePolicy::Pqc)),
            other => Err(err(
                "COMPLIANCE_POLICY",
                other,
                "fips-140-2, fips-140-3, pqc or empty",
            )),
        }
    }

    /// The TLS 1.2 suites FIPS allows, as Istio gives them to Envoy's gRPC clients
    /// (`GRPC_SSL_CIPHER_SUITES`) under both FIPS policies.
    pub fn grpc_cipher_suites(self) -> Option<&'static str> {
        matches!(
            self,
            CompliancePolicy::Fips1402 | CompliancePolicy::Fips1403
        )
        .then_some(
            "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:\
             ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384",
        )
    }
}

/// Istio 1.27–1.31's settings for Envoy's bootstrap and command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyFeatures {
    /// ProxyConfig fileFlushInterval: Envoy's `--file-flush-interval-msec` (1s).
    pub file_flush_interval: Duration,
    /// ProxyConfig fileFlushMinSizeKb, when above 0: `--file-flush-min-size-kb`.
    pub file_flush_min_size_kb: Option<u32>,
    /// ProxyConfig statsCompression (default on): brotli, zstd and gzip on 15090.
    pub stats_compression: bool,
    /// ENVOY_SECURE_METRICS_PORT: Envoy's metrics over mTLS (client certificates of the mesh).
    pub secure_metrics_port: Option<u16>,
    /// ENVOY_SECURE_MERGED_METRICS_PORT: the agent's merged metrics over mTLS.
    pub secure_merged_metrics_port: Option<u16>,
    /// ISTIO_META_ENABLE_SELF_DISCOVERY: a `local_cluster` (the proxy's own service, from
    /// istiod's EDS) for zone-aware load balancing.
    pub self_discovery: bool,
    /// ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL: 15021 takes a PROXY protocol header (optional).
    pub status_port_proxy_protocol: bool,
    /// COMPLIANCE_POLICY.
    pub compliance: Option<CompliancePolicy>,
    /// ENVOY_SKIP_DEPRECATED_LOGS (default on): Envoy's `--skip-deprecated-logs`.
    pub skip_deprecated_logs: bool,
    /// ISTIO_ENVOY_ENABLE_CORE_DUMP: Envoy's `--enable-core-dump`.
    pub enable_core_dump: bool,
    /// ProxyConfig statsdUdpAddress (`host:port`): Envoy's statsd sink.
    pub statsd_udp_address: Option<(String, u16)>,
    /// ProxyConfig envoyAccessLogService: the `envoy_accesslog_service` cluster istiod's
    /// gRPC access loggers name.
    pub access_log_service: Option<Service>,
    /// ProxyConfig envoyMetricsService: the `envoy_metrics_service` cluster and a
    /// metrics_service stats sink.
    pub metrics_service: Option<Service>,
}

/// A remote gRPC service of ProxyConfig, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub host: String,
    pub port: u16,
    /// TCP keepalive: probes, time and interval in seconds, each when set.
    pub keepalive: Option<(Option<u32>, Option<u64>, Option<u64>)>,
}

/// `host:port` (a DNS name or an IP, IPv6 in brackets), or an error naming `input`.
fn host_port(input: &str, raw: &str) -> Result<(String, u16), ConfigError> {
    let bad = || err(input, raw, "host:port");
    let (host, port) = raw.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(bad)?;
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

fn service(
    field: &str,
    s: &Option<super::proxy_config::RemoteService>,
) -> Result<Option<Service>, ConfigError> {
    let Some(s) = s else { return Ok(None) };
    if s.address.is_empty() {
        return Ok(None);
    }
    let input = format!("ProxyConfig.{field}");
    if s.tls_settings.is_some() {
        // Never downgraded to plaintext: refused until the TLS client is written.
        return Err(err(
            &format!("{input}.tlsSettings"),
            "(set)",
            "no tlsSettings: TLS to this service is not supported yet, and plaintext is not \
             substituted for it",
        ));
    }
    let (host, port) = host_port(&format!("{input}.address"), &s.address)?;
    let keepalive = match &s.tcp_keepalive {
        None => None,
        Some(k) => {
            let secs = |name: &str, v: &Option<String>| {
                v.as_deref()
                    .map(|raw| {
                        parse_duration(&format!("{input}.tcpKeepalive.{name}"), raw)
                            .map(|d| d.as_secs())
                    })
                    .transpose()
            };
            Some((
                k.probes,
                secs("time", &k.time)?,
                secs("interval", &k.interval)?,
            ))
        }
    };
    Ok(Some(Service {
        host,
        port,
        keepalive,
    }))
}

impl EnvoyFeatures {
    pub(super) fn parse(
        lookup: &dyn Fn(&str) -> Option<String>,
        pc: &ProxyConfigOverlay,
    ) -> Result<EnvoyFeatures, ConfigError> {
        // The env, else proxyMetadata (Istio's agent sets proxyMetadata as its env).
        let setting = |name: &str| {
            lookup(name).or_else(|| {
                pc.proxy_metadata
                    .as_ref()
                    .and_then(|m| m.get(name).cloned())
            })
        };
        let port = |name: &str| -> Result<Option<u16>, ConfigError> {
            match setting(name).as_deref().map(str::trim) {
                None | Some("") | Some("0") => Ok(None),
                Some(raw) => raw
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .map(Some)
                    .ok_or_else(|| err(name, raw, "a port 1-65535, or 0 for none")),
            }
        };
        let flag = |name: &str, default: bool| parse_bool(name, setting(name), default);
        let file_flush_interval = match &pc.file_flush_interval {
            Some(raw) => parse_duration("ProxyConfig.fileFlushInterval", raw)?,
            None => Duration::from_secs(1),
        };
        let secure_metrics_port = port("ENVOY_SECURE_METRICS_PORT")?;
        let secure_merged_metrics_port = port("ENVOY_SECURE_MERGED_METRICS_PORT")?;
        // Against each other and the proxy's other ports: `config::check_ports`.
        Ok(EnvoyFeatures {
            file_flush_interval,
            file_flush_min_size_kb: pc.file_flush_min_size_kb.filter(|kb| *kb > 0),
            stats_compression: pc.stats_compression.unwrap_or(true),
            secure_metrics_port,
            secure_merged_metrics_port,
            self_discovery: flag("ISTIO_META_ENABLE_SELF_DISCOVERY", false)?,
            status_port_proxy_protocol: flag("ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL", false)?,
            compliance: CompliancePolicy::parse(
                setting("COMPLIANCE_POLICY").as_deref().unwrap_or_default(),
            )?,
            skip_deprecated_logs: flag("ENVOY_SKIP_DEPRECATED_LOGS", true)?,
            enable_core_dump: flag("ISTIO_ENVOY_ENABLE_CORE_DUMP", false)?,
            statsd_udp_address: pc
                .statsd_udp_address
                .as_deref()
                .filter(|a| !a.is_empty())
                .map(|a| host_port("ProxyConfig.statsdUdpAddress", a))
                .transpose()?,
            access_log_service: service("envoyAccessLogService", &pc.envoy_access_log_service)?,
            metrics_service: service("envoyMetricsService", &pc.envoy_metrics_service)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(env: &[(&str, &str)], pc: ProxyConfigOverlay) -> Result<EnvoyFeatures, ConfigError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EnvoyFeatures::parse(
            &|k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            &pc,
        )
    }

    #[test]
    fn defaults_are_istios() {
        let f = parse(&[], ProxyConfigOverlay::default()).unwrap();
        assert_eq!(f.file_flush_interval, Duration::from_secs(1));
        assert!(f.stats_compression && f.skip_deprecated_logs);
        assert!(!f.self_discovery && !f.enable_core_dump && !f.status_port_proxy_protocol);
        assert_eq!(
            (f.secure_metrics_port, f.secure_merged_metrics_port),
            (None, None)
        );
        assert_eq!(f.compliance, None);
    }

    #[test]
    fn proxy_metadata_counts_as_env() {
        let pc = ProxyConfigOverlay {
            proxy_metadata: Some(
                [("ENVOY_SECURE_METRICS_PORT".to_string(), "15091".to_string())].into(),
            ),
            ..Default::default()
        };
        assert_eq!(parse(&[], pc).unwrap().secure_metrics_port, Some(15091));
    }

    #[test]
    fn bad_values_are_named() {
        for (name, value, says) in [
            ("COMPLIANCE_POLICY", "fips", "fips-140-2, fips-140-3, pqc"),
            ("ENVOY_SECURE_METRICS_PORT", "70000", "a port 1-65535"),
            ("ISTIO_META_ENABLE_SELF_DISCOVERY", "yes", "a boolean"),
        ] {
            let e = parse(&[(name, value)], ProxyConfigOverlay::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(name) && e.contains(says), "{e}");
        }
    }
}
