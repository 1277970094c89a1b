//! An HTTP connection manager's `tracing` as istiod builds it
//! (`pilot/pkg/networking/core/tracing.go`): with a Telemetry (or default) provider, the
//! provider's tracer (Zipkin, OpenTelemetry over gRPC or HTTP) to its service's outbound
//! cluster; without one, MeshConfig `enableTracing` (on by default) turns on the bootstrap's
//! tracer (ProxyConfig `tracing.zipkin`). Sampling: Telemetry `randomSamplingPercentage`, else
//! ProxyConfig `tracing.sampling`, else 1% (PILOT_TRACE_SAMPLING's default).
//!
//! Istio's own span tags (`istio.canonical_service`, `istio.namespace`, ...) are literals per
//! proxy in istiod; here they are environment tags the agent sets for its Envoy (`ENV_*`), so
//! the connection managers stay the same for every proxy of a namespace and are generated once.

use envoy_types::pb::envoy::config::core::v3::{HttpService, HttpUri, http_uri};
use envoy_types::pb::envoy::config::trace::v3::{
    OpenTelemetryConfig, ZipkinConfig, tracing::Http, tracing::http, zipkin_config,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;
use envoy_types::pb::envoy::r#type::tracing::v3::{CustomTag, custom_tag};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_types::util::pack_any;

use crate::config_store::MeshConfigSpec;
use crate::config_store::telemetry::CustomTag as TagSpec;
use crate::push_context::telemetry::TracingPlan;

use super::provider::Resolved;
use mesh_common::names::{ENV_CANONICAL_REVISION, ENV_CANONICAL_SERVICE};

/// Istio's default sampling percentage (PILOT_TRACE_SAMPLING).
const DEFAULT_SAMPLING: f64 = 1.0;

fn percent(value: f64) -> Percent {
    Percent { value }
}

/// ProxyConfig `tracing` of the mesh's `defaultConfig` (a field of it, when set).
fn proxy_tracing<'a>(mesh: &'a MeshConfigSpec, field: &str) -> Option<&'a serde_json::Value> {
    mesh.rest
        .get("defaultConfig")
        .and_then(|d| d.get("tracing"))
        .and_then(|t| t.get(field))
}

/// ProxyConfig's sampling as Istio reads it (the proxy's own, else the mesh's `defaultConfig`):
/// unset or 0 → the default; over 100 → 1.0.
fn proxy_sampling(mesh: &MeshConfigSpec, own: Option<f64>) -> f64 {
    match own.or_else(|| proxy_tracing(mesh, "sampling").and_then(serde_json::Value::as_f64)) {
        Some(s) if s > 100.0 => 1.0,
        Some(s) if s > 0.0 => s,
        _ => DEFAULT_SAMPLING,
    }
}

fn env_tag(tag: &str, name: &str, default: &str) -> CustomTag {
    CustomTag {
        tag: tag.to_string(),
        r#type: Some(custom_tag::Type::Environment(custom_tag::Environment {
            name: name.to_string(),
            default_value: default.to_string(),
        })),
    }
}

/// Istio's tags on every span.
fn istio_tags() -> Vec<CustomTag> {
    vec![
        env_tag("istio.canonical_revision", ENV_CANONICAL_REVISION, "latest"),
        env_tag("istio.canonical_service", ENV_CANONICAL_SERVICE, "unknown"),
        env_tag("istio.cluster_id", "ISTIO_META_CLUSTER_ID", "unknown"),
        env_tag("istio.mesh_id", "ISTIO_META_MESH_ID", "unknown"),
        env_tag("istio.namespace", "POD_NAMESPACE", "default"),
    ]
}

fn user_tag(name: &str, spec: &TagSpec) -> Option<CustomTag> {
    let r#type = if let Some(l) = &spec.literal {
        custom_tag::Type::Literal(custom_tag::Literal {
            value: l.value.clone(),
        })
    } else if let Some(e) = &spec.environment {
        custom_tag::Type::Environment(custom_tag::Environment {
            name: e.name.clone(),
            default_value: e.default_value.clone(),
        })
    } else {
        let h = spec.header.as_ref()?;
        custom_tag::Type::RequestHeader(custom_tag::Header {
            name: h.name.clone(),
            default_value: h.default_value.clone(),
        })
    };
    Some(CustomTag {
        tag: name.to_string(),
        r#type: Some(r#type),
    })
}

/// The tags: Istio's, then the user's (a user tag of the same name wins), sorted by name.
fn tags(user: &std::collections::BTreeMap<String, TagSpec>) -> Vec<CustomTag> {
    let mut all: std::collections::BTreeMap<String, CustomTag> = istio_tags()
        .into_iter()
        .map(|t| (t.tag.clone(), t))
        .collect();
    for (name, spec) in user {
        if let Some(t) = user_tag(name, spec) {
            all.insert(name.clone(), t);
        }
    }
    all.into_values().collect()
}

/// Why a Telemetry's tracing provider cannot be used (tracing is then off, as in Istio).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TracingError {
    #[error(
        "extension provider {0:?} is no tracing provider this proxy has (zipkin, opentelemetry)"
    )]
    NotATracer(String),
    #[error("extension provider {0:?}: its service is no service of the mesh")]
    NoService(String),
}

fn provider_config(provider: &Resolved<'_>) -> Result<Http, TracingError> {
    let p = provider.provider;
    let unreachable = || TracingError::NoService(p.name.clone());
    if let Some(z) = &p.zipkin {
        let (cluster, host) = (
            provider.cluster.as_deref().ok_or_else(unreachable)?,
            provider.host.as_deref().ok_or_else(unreachable)?,
        );
        let config = ZipkinConfig {
            collector_cluster: cluster.to_string(),
            collector_endpoint: z.path.clone().unwrap_or_else(|| "/api/v2/spans".into()),
            collector_hostname: host.to_string(),
            collector_endpoint_version: zipkin_config::CollectorEndpointVersion::HttpJson as i32,
            trace_id_128bit: !z.enable_64bit_trace_id.unwrap_or(false),
            shared_span_context: Some(BoolValue { value: false }),
            ..Default::default()
        };
        return Ok(Http {
            name: "envoy.tracers.zipkin".into(),
            config_type: Some(http::ConfigType::TypedConfig(pack_any(config))),
        });
    }
    if let Some(o) = &p.opentelemetry {
        let (cluster, host) = (
            provider.cluster.as_deref().ok_or_else(unreachable)?,
            provider.host.as_deref().ok_or_else(unreachable)?,
        );
        // The service name from the environment (`OTEL_RESOURCE_ATTRIBUTES`, which the agent
        // sets to the node's service cluster, `app.namespace`, as istiod writes `service_name`),
        // so the tracer is the same for every proxy.
        let mut config = OpenTelemetryConfig {
            resource_detectors: vec![envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig {
                name: "envoy.tracers.opentelemetry.resource_detectors.environment".into(),
                typed_config: Some(pack_any(
                    envoy_types::pb::envoy::extensions::tracers::opentelemetry::resource_detectors::v3::EnvironmentResourceDetectorConfig {},
                )),
            }],
            ..OpenTelemetryConfig::default()
        };
        if let Some(h) = &o.http {
            config.http_service = Some(HttpService {
                http_uri: Some(HttpUri {
                    uri: format!("{host}/{}", h.path.trim_start_matches('/')),
                    http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(
                        cluster.to_string(),
                    )),
                    timeout: Some(
                        h.timeout
                            .as_ref()
                            .map_or(super::super::blocks::seconds(5), |t| t.proto()),
                    ),
                }),
                request_headers_to_add: h
                    .headers
                    .iter()
                    .filter_map(|h| Some((&h.name, h.value.as_ref()?)))
                    .map(
                        |(k, v)| envoy_types::pb::envoy::config::core::v3::HeaderValueOption {
                            header: Some(envoy_types::pb::envoy::config::core::v3::HeaderValue {
                                key: k.clone(),
                                value: v.clone(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    )
                    .collect(),
                ..Default::default()
            });
        } else {
            config.grpc_service = Some(envoy_types::pb::envoy::config::core::v3::GrpcService {
                timeout: o
                    .grpc
                    .as_ref()
                    .and_then(|g| g.timeout.as_ref())
                    .map(|t| t.proto()),
                ..mesh_common::envoy::envoy_grpc(cluster, host)
            });
        }
        return Ok(Http {
            name: "envoy.tracers.opentelemetry".into(),
            config_type: Some(http::ConfigType::TypedConfig(pack_any(config))),
        });
    }
    Err(TracingError::NotATracer(p.name.clone()))
}

fn max_tag_length(provider: Option<&Resolved<'_>>, mesh: &MeshConfigSpec) -> Option<UInt32Value> {
    let from_provider = provider.and_then(|p| {
        p.provider
            .zipkin
            .as_ref()
            .and_then(|z| z.max_tag_length)
            .or_else(|| {
                p.provider
                    .opentelemetry
                    .as_ref()
                    .and_then(|o| o.max_tag_length)
            })
    });
    from_provider
        .filter(|n| *n > 0)
        .or_else(|| {
            proxy_tracing(mesh, "maxPathTagLength")
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n > 0)
        })
        .map(|value| UInt32Value { value })
}

/// The HCM's tracing: `plan` from the Telemetries (`None`: the legacy bootstrap tracer when
/// `enableTracing`), `provider` its resolved provider, `router` whether a gateway (whose
/// upstream calls get spans of their own). `Ok(None)`: no tracing.
pub fn hcm_tracing(
    plan: Option<&TracingPlan>,
    provider: Option<&Resolved<'_>>,
    mesh: &MeshConfigSpec,
    own_sampling: Option<f64>,
    router: bool,
) -> Result<Option<Tracing>, TracingError> {
    let base = |sampling: f64, user: &std::collections::BTreeMap<String, TagSpec>| Tracing {
        client_sampling: Some(percent(100.0)),
        random_sampling: Some(percent(sampling)),
        overall_sampling: Some(percent(100.0)),
        custom_tags: tags(user),
        ..Default::default()
    };
    let Some(plan) = plan else {
        if !mesh.enable_tracing.unwrap_or(true) {
            return Ok(None);
        }
        let user: std::collections::BTreeMap<String, TagSpec> = proxy_tracing(mesh, "custom_tags")
            .or_else(|| proxy_tracing(mesh, "customTags"))
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default();
        let mut t = base(proxy_sampling(mesh, own_sampling), &user);
        t.max_path_tag_length = max_tag_length(None, mesh);
        return Ok(Some(t));
    };
    if plan.disable_span_reporting || plan.provider.is_none() {
        return Ok(None);
    }
    let Some(provider) = provider else {
        return Ok(None);
    };
    let http = provider_config(provider)?;
    let sampling = plan
        .sampling
        .map_or_else(|| proxy_sampling(mesh, own_sampling), |p| p.0);
    let mut t = base(sampling, &plan.custom_tags);
    t.provider = Some(http);
    t.max_path_tag_length = max_tag_length(Some(provider), mesh);
    if router {
        t.spawn_upstream_span = Some(BoolValue { value: true });
    }
    Ok(Some(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_store::providers::ExtensionProvider;
    use envoy_types::pb::envoy::config::trace::v3::tracing::http::ConfigType;
    use prost::Message;

    fn provider(yaml: &str) -> ExtensionProvider {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    fn resolved(p: &ExtensionProvider) -> Resolved<'_> {
        Resolved {
            provider: p,
            host: Some("otel.obs.svc.cluster.local".into()),
            cluster: Some("outbound|4318||otel.obs.svc.cluster.local".into()),
        }
    }

    fn plan(yaml: &str) -> TracingPlan {
        let t: crate::config_store::telemetry::Tracing = serde_yaml_ng::from_str(yaml).unwrap();
        TracingPlan {
            provider: t.providers.first().map(|p| p.name.clone()),
            sampling: t.random_sampling_percentage,
            custom_tags: t.custom_tags,
            ..Default::default()
        }
    }

    #[test]
    fn opentelemetry_over_http_and_sampling() {
        let mesh = MeshConfigSpec::default();
        let p = provider(
            "name: otel\nopentelemetry: {service: otel.obs.svc.cluster.local, port: 4318, http: {path: /v1/traces}}",
        );
        let t = hcm_tracing(
            Some(&plan(
                "providers: [{name: otel}]\nrandomSamplingPercentage: 10",
            )),
            Some(&resolved(&p)),
            &mesh,
            Some(50.0),
            false,
        )
        .unwrap()
        .unwrap();
        // The Telemetry's rate over the proxy's own.
        assert_eq!(t.random_sampling.unwrap().value, 10.0);
        let http = t.provider.unwrap();
        assert_eq!(http.name, "envoy.tracers.opentelemetry");
        let Some(ConfigType::TypedConfig(any)) = http.config_type else {
            panic!()
        };
        let c = OpenTelemetryConfig::decode(any.value.as_slice()).unwrap();
        let uri = c.http_service.unwrap().http_uri.unwrap();
        // Istio's URI has no scheme.
        assert_eq!(uri.uri, "otel.obs.svc.cluster.local/v1/traces");
        assert!(c.grpc_service.is_none());
        assert_eq!(c.resource_detectors.len(), 1);
        // The sampling default: 1%, or the mesh's defaultConfig.tracing.sampling.
        let t = hcm_tracing(
            Some(&plan("providers: [{name: otel}]")),
            Some(&resolved(&p)),
            &mesh,
            None,
            true,
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.random_sampling.unwrap().value, 1.0);
        assert_eq!(t.spawn_upstream_span.map(|b| b.value), Some(true));
        let mesh: MeshConfigSpec =
            serde_yaml_ng::from_str("defaultConfig: {tracing: {sampling: 25}}").unwrap();
        let t = hcm_tracing(None, None, &mesh, None, false)
            .unwrap()
            .unwrap();
        assert_eq!(t.random_sampling.unwrap().value, 25.0);
        assert!(t.provider.is_none());
        // enableTracing: false and no Telemetry: no tracing.
        let off: MeshConfigSpec = serde_yaml_ng::from_str("enableTracing: false").unwrap();
        assert!(
            hcm_tracing(None, None, &off, None, false)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_provider_that_is_no_tracer_is_an_error() {
        let p = provider("name: envoy\nenvoyFileAccessLog: {path: /dev/stdout}");
        let e = hcm_tracing(
            Some(&plan("providers: [{name: envoy}]")),
            Some(&resolved(&p)),
            &MeshConfigSpec::default(),
            None,
            false,
        )
        .unwrap_err();
        assert_eq!(e, TracingError::NotATracer("envoy".into()));
    }

    #[test]
    fn custom_tags_follow_istios_and_win_by_name() {
        let t = tags(&plan("customTags: {istio.namespace: {literal: {value: mine}}, env: {environment: {name: X, defaultValue: d}}, h: {header: {name: x-h}}}").custom_tags);
        let names: Vec<&str> = t.iter().map(|t| t.tag.as_str()).collect();
        assert_eq!(
            names,
            [
                "env",
                "h",
                "istio.canonical_revision",
                "istio.canonical_service",
                "istio.cluster_id",
                "istio.mesh_id",
                "istio.namespace"
            ]
        );
        let ns = t.iter().find(|t| t.tag == "istio.namespace").unwrap();
        assert!(matches!(&ns.r#type, Some(custom_tag::Type::Literal(l)) if l.value == "mine"));
    }
}
