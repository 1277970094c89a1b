//! MeshConfig `extensionProviders` (istio/api `mesh/v1alpha1/config.proto`
//! `MeshConfig.ExtensionProvider`): the external authorizers CUSTOM AuthorizationPolicies name
//! and the access loggers, tracers and metrics providers Telemetry resources name.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::values::GoDuration;

/// A mesh config `extensionProviders` entry. The kinds this control plane acts on are typed:
/// ext_authz (CUSTOM AuthorizationPolicies), access loggers, tracers and Prometheus (the
/// Telemetry API); other kinds (Lightstep, Datadog, Stackdriver, SkyWalking, SDS) are kept as
/// written, and a Telemetry naming one is told so.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionProvider {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_ext_authz_http: Option<ExtAuthzHttp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_ext_authz_grpc: Option<ExtAuthzGrpc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_file_access_log: Option<FileAccessLog>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_otel_als: Option<OtelAls>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_http_als: Option<GrpcAls>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_tcp_als: Option<GrpcAls>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zipkin: Option<Zipkin>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opentelemetry: Option<OpenTelemetry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<serde_json::Value>,
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

/// Istio's EnvoyExternalAuthorizationHttpProvider.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct ExtAuthzHttp {
    pub service: String,
    pub port: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GoDuration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    pub fail_open: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_on_error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub include_request_headers_in_check: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub include_additional_headers_in_check: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers_to_upstream_on_allow: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers_to_downstream_on_deny: Vec<String>,
}

/// Istio's EnvoyExternalAuthorizationGrpcProvider.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct ExtAuthzGrpc {
    pub service: String,
    pub port: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GoDuration>,
    pub fail_open: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_on_error: Option<String>,
}

impl ExtensionProvider {
    /// Checks the ext_authz kinds; the error starts with the field (`.envoyExtAuthzHttp.port`).
    pub fn check(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err(".name: required".into());
        }
        let service = |kind: &str, service: &str, port: u32, status: &Option<String>| {
            if service.is_empty() {
                return Err(format!(".{kind}.service: required"));
            }
            if !(1..=65535).contains(&port) {
                return Err(format!(".{kind}.port: {port} is not in 1-65535"));
            }
            if let Some(s) = status
                && !s.parse::<u16>().is_ok_and(|c| (100..=599).contains(&c))
            {
                return Err(format!(
                    ".{kind}.statusOnError: {s:?} is not an HTTP status"
                ));
            }
            Ok(())
        };
        if self.kinds() > 1 {
            return Err(": one provider kind per entry".into());
        }
        if let Some(h) = &self.envoy_ext_authz_http {
            service("envoyExtAuthzHttp", &h.service, h.port, &h.status_on_error)?;
        }
        if let Some(g) = &self.envoy_ext_authz_grpc {
            service("envoyExtAuthzGrpc", &g.service, g.port, &g.status_on_error)?;
        }
        if let Some((host, port)) = self.telemetry_service() {
            service(self.kind_name(), host, port, &None)?;
        }
        if let Some(f) = &self.envoy_file_access_log {
            if f.path.is_empty() {
                return Err(".envoyFileAccessLog.path: required".into());
            }
            if let Some(l) = &f.log_format {
                l.check(".envoyFileAccessLog.logFormat")?;
            }
        }
        if let Some(l) = self
            .envoy_otel_als
            .as_ref()
            .and_then(|a| a.log_format.as_ref())
        {
            l.check(".envoyOtelAls.logFormat")?;
        }
        Ok(())
    }

    /// How many provider kinds the entry sets (one is expected).
    fn kinds(&self) -> usize {
        [
            self.envoy_ext_authz_http.is_some(),
            self.envoy_ext_authz_grpc.is_some(),
            self.envoy_file_access_log.is_some(),
            self.envoy_otel_als.is_some(),
            self.envoy_http_als.is_some(),
            self.envoy_tcp_als.is_some(),
            self.zipkin.is_some(),
            self.opentelemetry.is_some(),
            self.prometheus.is_some(),
        ]
        .iter()
        .filter(|k| **k)
        .count()
            + self.rest.len()
    }

    /// The kind's name as MeshConfig writes it (for messages).
    pub fn kind_name(&self) -> &str {
        let typed = [
            (self.envoy_ext_authz_http.is_some(), "envoyExtAuthzHttp"),
            (self.envoy_ext_authz_grpc.is_some(), "envoyExtAuthzGrpc"),
            (self.envoy_file_access_log.is_some(), "envoyFileAccessLog"),
            (self.envoy_otel_als.is_some(), "envoyOtelAls"),
            (self.envoy_http_als.is_some(), "envoyHttpAls"),
            (self.envoy_tcp_als.is_some(), "envoyTcpAls"),
            (self.zipkin.is_some(), "zipkin"),
            (self.opentelemetry.is_some(), "opentelemetry"),
            (self.prometheus.is_some(), "prometheus"),
        ];
        typed
            .iter()
            .find(|(set, _)| *set)
            .map(|(_, n)| *n)
            .or_else(|| self.rest.keys().next().map(String::as_str))
            .unwrap_or("none")
    }

    /// The mesh service (as written: `NAMESPACE/HOST` or `HOST`) and port a logger or tracer
    /// sends to (`envoyOtelAls`, `envoyHttpAls`, `envoyTcpAls`, `zipkin`, `opentelemetry`).
    pub fn telemetry_service(&self) -> Option<(&str, u32)> {
        [
            self.envoy_otel_als.as_ref().map(|a| (&a.service, a.port)),
            self.envoy_http_als.as_ref().map(|a| (&a.service, a.port)),
            self.envoy_tcp_als.as_ref().map(|a| (&a.service, a.port)),
            self.zipkin.as_ref().map(|z| (&z.service, z.port)),
            self.opentelemetry.as_ref().map(|o| (&o.service, o.port)),
        ]
        .into_iter()
        .flatten()
        .next()
        .map(|(service, port)| (service.as_str(), port))
    }

    /// The service host (without the `NAMESPACE/` prefix Istio allows) and port of an
    /// ext_authz provider, and whether it speaks gRPC.
    pub fn ext_authz(&self) -> Option<(&str, u16, bool)> {
        let port = |p: u32| u16::try_from(p).ok();
        if let Some(h) = &self.envoy_ext_authz_http {
            return Some((without_namespace(&h.service), port(h.port)?, false));
        }
        let g = self.envoy_ext_authz_grpc.as_ref()?;
        Some((without_namespace(&g.service), port(g.port)?, true))
    }
}

/// The entry of `providers` named `name`, compared as Istio's Telemetry lookup compares them
/// (ignoring case).
pub fn find<'a>(providers: &'a [ExtensionProvider], name: &str) -> Option<&'a ExtensionProvider> {
    providers.iter().find(|p| p.name.eq_ignore_ascii_case(name))
}

/// `NAMESPACE/HOST` as `HOST` (a plain host as it is).
pub fn without_namespace(service: &str) -> &str {
    service.split_once('/').map_or(service, |(_, h)| h)
}

/// Istio's EnvoyFileAccessLogProvider: a file (`/dev/stdout`) and its format.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct FileAccessLog {
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
}

/// An access-log format: a text line of Envoy command operators, or JSON labels (each a
/// command operator); Istio's default text line when neither is set.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct LogFormat {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, serde_json::Value>>,
}

impl LogFormat {
    fn check(&self, at: &str) -> Result<(), String> {
        if self.text.is_some() && self.labels.is_some() {
            return Err(format!("{at}: text or labels, not both"));
        }
        Ok(())
    }
}

/// Istio's OpenTelemetryLogProvider (`envoyOtelAls`): OTLP logs over gRPC to a mesh service.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct OtelAls {
    pub service: String,
    pub port: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
}

/// Istio's EnvoyHttpGrpcV3LogProvider / EnvoyTcpGrpcV3LogProvider: Envoy's gRPC access-log
/// service (ALS) to a mesh service.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcAls {
    pub service: String,
    pub port: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_name: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filter_state_objects_to_log: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub additional_request_headers_to_log: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub additional_response_headers_to_log: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub additional_response_trailers_to_log: Vec<String>,
}

/// Istio's ZipkinTracingProvider.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct Zipkin {
    pub service: String,
    pub port: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tag_length: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_64bit_trace_id: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// Istio's OpenTelemetryTracingProvider: OTLP spans over gRPC (the default) or HTTP.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct OpenTelemetry {
    pub service: String,
    pub port: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tag_length: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<OtelHttp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc: Option<OtelGrpc>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct OtelHttp {
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GoDuration>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HttpHeader>,
}

/// A header the HTTP exporter adds: a literal value (`envoyHeader`, a value of the request,
/// is not applied and is a warning).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpHeader {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct OtelGrpc {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GoDuration>,
}

/// MeshConfig `accessLogEncoding`.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum LogEncoding {
    #[default]
    Text,
    Json,
}

/// MeshConfig `defaultProviders`: the providers used where no Telemetry names one.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct DefaultProviders {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracing: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_logging: Option<Vec<String>>,
}
