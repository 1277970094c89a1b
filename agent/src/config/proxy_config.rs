//! ProxyConfig overlays (istio/api `mesh/v1alpha1/proxy.proto`): the mesh config file's
//! `defaultConfig`, PROXY_CONFIG and the pod's `proxy.istio.io/config` annotation, in that order.

use serde::Deserialize;

use super::{ConfigError, err};

/// The subset of Istio's ProxyConfig we honour, in its YAML/JSON field names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ProxyConfigOverlay {
    pub(super) config_path: Option<String>,
    pub(super) binary_path: Option<String>,
    pub(super) service_cluster: Option<String>,
    pub(super) drain_duration: Option<String>,
    pub(super) termination_drain_duration: Option<String>,
    pub(super) proxy_admin_port: Option<u16>,
    pub(super) discovery_address: Option<String>,
    pub(super) status_port: Option<u16>,
    pub(super) concurrency: Option<u32>,
    pub(super) control_plane_auth_policy: Option<String>,
    pub(super) stat_name_length: Option<u32>,
    pub(super) proxy_metadata: Option<std::collections::BTreeMap<String, String>>,
    pub(super) parent_shutdown_duration: Option<String>,
    pub(super) connect_timeout: Option<String>,
    pub(super) tracing: Option<Tracing>,
    pub(super) proxy_stats_matcher: Option<super::stats::ProxyStatsMatcher>,
    pub(super) extra_stat_tags: Option<Vec<String>>,
    pub(super) runtime_values: Option<std::collections::BTreeMap<String, String>>,
    pub(super) readiness_probe: Option<serde_json::Value>,
    pub(super) tracing_service_name: Option<String>,
    pub(super) statsd_udp_address: Option<String>,
    pub(super) envoy_access_log_service: Option<RemoteService>,
    pub(super) envoy_metrics_service: Option<RemoteService>,
    pub(super) file_flush_interval: Option<String>,
    pub(super) file_flush_min_size_kb: Option<u32>,
    pub(super) stats_compression: Option<bool>,
    /// Which input last set each field (`env PROXY_CONFIG proxyAdminPort`, `--statusPort`), so
    /// a check that spans fields can name it.
    #[serde(skip)]
    pub(super) set_by: std::collections::BTreeMap<String, String>,
}

/// ProxyConfig `envoyAccessLogService` / `envoyMetricsService`: a gRPC service Envoy reaches by
/// DNS name (`host:port`), kept alive as asked.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RemoteService {
    pub address: String,
    #[serde(default)]
    pub tcp_keepalive: Option<TcpKeepalive>,
    /// `tlsSettings`: refused by name (see `config::features`).
    #[serde(default)]
    pub tls_settings: Option<serde_json::Value>,
}

/// ProxyConfig's `tcpKeepalive` (networking `ConnectionPoolSettings.TCPSettings.TcpKeepalive`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct TcpKeepalive {
    #[serde(default)]
    pub probes: Option<u32>,
    #[serde(default)]
    pub time: Option<String>,
    #[serde(default)]
    pub interval: Option<String>,
}

/// ProxyConfig `tracing`: of its tracers only Zipkin is acted on (written into the bootstrap).
#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct Tracing {
    pub(super) zipkin: Option<Zipkin>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct Zipkin {
    pub(super) address: Option<String>,
}

/// ProxyConfig fields (istio/api mesh/v1alpha1/proxy.proto) that are not the agent's to act
/// on, accepted as Istio's agent accepts them: istiod's and the injector's fields, and the
/// deprecated ones Istio's 1.31 agent ignores too.
const NOT_THE_AGENTS: [&str; 13] = [
    // istiod's (listeners, routes, gateways) and the injector's.
    "gatewayTopology",
    "proxyHeaders",
    "connectionSettings",
    "interceptionMode",
    "holdApplicationUntilProxyStarts",
    "image",
    "meshId",
    // Deprecated: Istio's agent reads none of them.
    "discoveryRefreshDelay",
    "zipkinAddress",
    "availabilityZone",
    "sds",
    "envoyMetricsServiceAddress",
    // The oneof's name, not a field of its JSON form.
    "clusterName",
];

/// ProxyConfig fields Istio's agent acts on that this agent does not yet: accepted with a
/// warning naming what is missing.
const NOT_YET: [(&str, &str); 2] = [
    (
        "privateKeyProvider",
        "CryptoMB/QAT private key providers are contrib extensions upstream Envoy does not ship",
    ),
    (
        "caCertificatesPem",
        "Istio's agent uses it only with PROXY_CONFIG_XDS_AGENT (ProxyConfig pushed over xDS)",
    ),
];

const USED_FIELDS: [&str; 28] = [
    "readinessProbe",
    "tracingServiceName",
    "statsdUdpAddress",
    "envoyAccessLogService",
    "envoyMetricsService",
    "customConfigFile",
    "proxyBootstrapTemplatePath",
    "fileFlushInterval",
    "fileFlushMinSizeKb",
    "statsCompression",
    "configPath",
    "binaryPath",
    "serviceCluster",
    "drainDuration",
    "terminationDrainDuration",
    "proxyAdminPort",
    "discoveryAddress",
    "statusPort",
    "concurrency",
    "controlPlaneAuthPolicy",
    "statNameLength",
    "proxyMetadata",
    "parentShutdownDuration",
    "connectTimeout",
    "tracing",
    "proxyStatsMatcher",
    "extraStatTags",
    "runtimeValues",
];

/// Istio's ProxyConfig defaults (pkg/config/mesh `DefaultProxyConfig`) that the agent acts on:
/// `Config::parse` falls back to them and `defaults` writes them into the node metadata.
pub(super) const DEFAULT_CONFIG_PATH: &str = "./etc/istio/proxy";
pub(super) const DEFAULT_BINARY_PATH: &str = "/usr/local/bin/envoy";
pub(super) const DEFAULT_DRAIN_SECS: u64 = 45;
pub(super) const DEFAULT_TERMINATION_DRAIN_SECS: u64 = 5;
pub(super) const DEFAULT_ADMIN_PORT: u16 = 15000;
pub(super) const DEFAULT_STATUS_PORT: u16 = 15020;

/// The ProxyConfig fields Istio's defaults set (pkg/config/mesh `DefaultProxyConfig`, as
/// protojson writes them), which the PROXY_CONFIG node metadata starts from: istiod reads the
/// proxy's effective ProxyConfig there, not only what was overlaid.
pub(super) fn defaults() -> serde_json::Map<String, serde_json::Value> {
    let serde_json::Value::Object(map) = serde_json::json!({
        "binaryPath": DEFAULT_BINARY_PATH,
        "configPath": DEFAULT_CONFIG_PATH,
        "controlPlaneAuthPolicy": "MUTUAL_TLS",
        "discoveryAddress": super::DEFAULT_DISCOVERY_ADDRESS,
        "drainDuration": format!("{DEFAULT_DRAIN_SECS}s"),
        "proxyAdminPort": DEFAULT_ADMIN_PORT,
        "serviceCluster": "istio-proxy",
        "statNameLength": 189,
        "statusPort": DEFAULT_STATUS_PORT,
        "terminationDrainDuration": format!("{DEFAULT_TERMINATION_DRAIN_SECS}s")
    }) else {
        return serde_json::Map::new();
    };
    map
}

/// Applies one ProxyConfig source over `base`, and records its raw fields in `merged` (which
/// becomes the PROXY_CONFIG node metadata).
pub(super) fn overlay_into(
    base: &mut ProxyConfigOverlay,
    merged: &mut serde_json::Map<String, serde_json::Value>,
    input: &str,
    text: &str,
) -> Result<(), ConfigError> {
    // A mesh config file wraps ProxyConfig in `defaultConfig`; PROXY_CONFIG is the bare object.
    let value: serde_json::Value =
        serde_yaml_ng::from_str(text).map_err(|e| err(input, &e.to_string(), "YAML or JSON"))?;
    let value = match value.get("defaultConfig") {
        Some(inner) => inner.clone(),
        None if input.starts_with("mesh") => serde_json::Value::Object(Default::default()),
        None => value,
    };
    if value.is_null() {
        return Ok(());
    }
    let Some(fields) = value.as_object() else {
        return Err(err(input, text, "a ProxyConfig object"));
    };
    for key in fields.keys() {
        let not_yet = NOT_YET.iter().find(|(f, _)| f == key);
        if !USED_FIELDS.contains(&key.as_str())
            && !NOT_THE_AGENTS.contains(&key.as_str())
            && not_yet.is_none()
        {
            return Err(err(
                input,
                key,
                "a ProxyConfig field (istio/api mesh/v1alpha1/proxy.proto)",
            ));
        }
        if let Some((_, missing)) = not_yet {
            tracing::warn!(field = %key, source = input, missing, "ProxyConfig field accepted but not acted on yet");
        }
    }
    // `serviceCluster` and `tracingServiceName` are one oneof: setting one clears the other.
    for (set, cleared) in [
        ("serviceCluster", "tracingServiceName"),
        ("tracingServiceName", "serviceCluster"),
    ] {
        if fields.contains_key(set) {
            merged.remove(cleared);
            if cleared == "serviceCluster" {
                base.service_cluster = None;
            } else {
                base.tracing_service_name = None;
            }
        }
    }
    merged.extend(fields.clone());
    for key in fields.keys() {
        base.set_by.insert(key.clone(), format!("{input} {key}"));
    }
    if fields.get("tracing").is_some_and(|t| {
        t.as_object()
            .is_some_and(|t| t.keys().any(|k| k != "zipkin"))
    }) {
        tracing::warn!(
            source = input,
            "ProxyConfig tracing: only tracing.zipkin is acted on (the bootstrap's Zipkin tracer)"
        );
    }
    let o: ProxyConfigOverlay = serde_json::from_value(value)
        .map_err(|e| err(input, &e.to_string(), "a ProxyConfig with supported fields"))?;
    macro_rules! take {
        ($($f:ident),*) => { $( if o.$f.is_some() { base.$f = o.$f.clone(); } )* };
    }
    take!(
        config_path,
        binary_path,
        service_cluster,
        drain_duration,
        termination_drain_duration,
        proxy_admin_port,
        discovery_address,
        status_port,
        concurrency,
        control_plane_auth_policy,
        stat_name_length,
        proxy_metadata,
        parent_shutdown_duration,
        connect_timeout,
        tracing,
        proxy_stats_matcher,
        extra_stat_tags,
        runtime_values,
        readiness_probe,
        tracing_service_name,
        statsd_udp_address,
        envoy_access_log_service,
        envoy_metrics_service,
        file_flush_interval,
        file_flush_min_size_kb,
        stats_compression
    );

    Ok(())
}

/// ProxyConfig's duration fields, which Istio's agent writes into the PROXY_CONFIG node
/// metadata as protojson does (`2.500s` for `2.5s`, `60s` for `1m`).
const DURATION_FIELDS: [&str; 6] = [
    "drainDuration",
    "parentShutdownDuration",
    "discoveryRefreshDelay",
    "connectTimeout",
    "terminationDrainDuration",
    "fileFlushInterval",
];

/// A duration as protojson writes it: whole seconds, or 3, 6 or 9 fraction digits.
pub(super) fn protojson_duration(d: std::time::Duration) -> String {
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    match nanos {
        0 => format!("{secs}s"),
        n if n % 1_000_000 == 0 => format!("{secs}.{:03}s", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{secs}.{:06}s", n / 1_000),
        n => format!("{secs}.{n:09}s"),
    }
}

/// Rewrites the merged ProxyConfig's durations as protojson writes them; a value that does not
/// parse stays as given (the field's own reading names it).
pub(super) fn normalize_durations(merged: &mut serde_json::Map<String, serde_json::Value>) {
    for field in DURATION_FIELDS {
        let parsed = merged
            .get(field)
            .and_then(serde_json::Value::as_str)
            .and_then(|raw| mesh_common::parse_go_duration(raw).ok());
        if let Some(d) = parsed {
            merged.insert(field.into(), protojson_duration(d).into());
        }
    }
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn durations_are_written_as_protojson() {
        for (given, written) in [
            ("2.5s", "2.500s"),
            ("1m", "60s"),
            ("1m0s", "60s"),
            ("45s", "45s"),
            ("1.000001s", "1.000001s"),
            ("1ns", "0.000000001s"),
        ] {
            let mut m = serde_json::Map::new();
            m.insert("fileFlushInterval".into(), given.into());
            m.insert("binaryPath".into(), "1m".into());
            normalize_durations(&mut m);
            assert_eq!(m["fileFlushInterval"], written, "{given}");
            assert_eq!(m["binaryPath"], "1m");
        }
    }
}
