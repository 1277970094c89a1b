//! Access loggers as istiod builds them (`pilot/pkg/networking/core/accesslog.go`,
//! `model/telemetry_logging.go`): MeshConfig `accessLogFile` with `accessLogFormat` and
//! `accessLogEncoding`, and the Telemetry API's providers (`envoyFileAccessLog`, `envoyOtelAls`,
//! `envoyHttpAls`, `envoyTcpAls`), each with its CEL filter.

use envoy_types::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, ExtensionFilter, access_log, access_log_filter,
};
use envoy_types::pb::envoy::config::core::v3::{
    ApiVersion, DataSource, SubstitutionFormatString, data_source, substitution_format_string,
};
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
    FileAccessLog, file_access_log,
};
use envoy_types::pb::envoy::extensions::access_loggers::filters::cel::v3::ExpressionFilter;
use envoy_types::pb::envoy::extensions::access_loggers::grpc::v3::{
    CommonGrpcAccessLogConfig, HttpGrpcAccessLogConfig, TcpGrpcAccessLogConfig,
};
use envoy_types::pb::envoy::extensions::access_loggers::open_telemetry::v3::OpenTelemetryAccessLogConfig;
use envoy_types::pb::google::protobuf::{Struct, Value, value};
use envoy_types::pb::opentelemetry::proto::common::v1::{
    AnyValue, KeyValue, KeyValueList, any_value,
};
use envoy_types::util::pack_any;

use crate::config_store::MeshConfigSpec;
use crate::config_store::providers::{ExtensionProvider, LogEncoding, LogFormat};

use super::provider::Resolved;

/// Istio's default text format (`EnvoyTextLogFormat`).
pub const TEXT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% \"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%\n";

/// Istio's default JSON labels (`EnvoyJSONLogFormatIstio`).
pub const JSON_LABELS: [(&str, &str); 24] = [
    ("start_time", "%START_TIME%"),
    ("route_name", "%ROUTE_NAME%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    (
        "connection_termination_details",
        "%CONNECTION_TERMINATION_DETAILS%",
    ),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("duration", "%DURATION%"),
    (
        "upstream_service_time",
        "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    ),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("authority", "%REQ(:AUTHORITY)%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"),
    ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    (
        "upstream_transport_failure_reason",
        "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
    ),
];

const FILE: &str = "envoy.access_loggers.file";
const HTTP_GRPC: &str = "envoy.access_loggers.http_grpc";
const TCP_GRPC: &str = "envoy.tcp_grpc_access_log";
const OTEL: &str = "envoy.access_loggers.open_telemetry";
const CEL: &str = "envoy.access_loggers.extension_filters.cel";

/// A text format as Istio writes it: Istio's default when empty, a newline added when missing.
fn text_line(format: Option<&str>) -> String {
    match format {
        None | Some("") => TEXT_FORMAT.to_string(),
        Some(f) if f.ends_with('\n') => f.to_string(),
        Some(f) => format!("{f}\n"),
    }
}

fn text(format: Option<&str>, omit_empty_values: bool) -> SubstitutionFormatString {
    SubstitutionFormatString {
        format: Some(substitution_format_string::Format::TextFormatSource(
            DataSource {
                specifier: Some(data_source::Specifier::InlineString(text_line(format))),
                ..Default::default()
            },
        )),
        omit_empty_values,
        ..Default::default()
    }
}

fn json_value(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::String(s) => value::Kind::StringValue(s.clone()),
        serde_json::Value::Number(n) => value::Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::Bool(b) => value::Kind::BoolValue(*b),
        serde_json::Value::Null => value::Kind::NullValue(0),
        serde_json::Value::Array(a) => {
            value::Kind::ListValue(envoy_types::pb::google::protobuf::ListValue {
                values: a.iter().map(json_value).collect(),
            })
        }
        serde_json::Value::Object(o) => value::Kind::StructValue(Struct {
            fields: o.iter().map(|(k, v)| (k.clone(), json_value(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

fn json(
    labels: Option<&serde_json::Map<String, serde_json::Value>>,
    omit: bool,
) -> SubstitutionFormatString {
    let fields = match labels {
        Some(l) if !l.is_empty() => l.iter().map(|(k, v)| (k.clone(), json_value(v))).collect(),
        _ => JSON_LABELS
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_string(),
                    Value {
                        kind: Some(value::Kind::StringValue((*v).to_string())),
                    },
                )
            })
            .collect(),
    };
    SubstitutionFormatString {
        format: Some(substitution_format_string::Format::JsonFormat(Struct {
            fields,
        })),
        omit_empty_values: omit,
        ..Default::default()
    }
}

fn file_logger(path: &str, format: SubstitutionFormatString) -> AccessLog {
    AccessLog {
        name: FILE.to_string(),
        config_type: Some(access_log::ConfigType::TypedConfig(pack_any(
            FileAccessLog {
                path: path.to_string(),
                access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(format)),
            },
        ))),
        ..Default::default()
    }
}

/// The mesh config's file logger (`accessLogFile`, `accessLogFormat`, `accessLogEncoding`),
/// writing to `path`. A JSON `accessLogFormat` that is no JSON object keeps the default labels,
/// as in Istio (the config check reports it).
pub fn mesh_file(path: &str, mesh: &MeshConfigSpec) -> AccessLog {
    let format = match mesh.access_log_encoding.unwrap_or_default() {
        LogEncoding::Text => text(mesh.access_log_format.as_deref(), false),
        LogEncoding::Json => {
            let labels = mesh
                .access_log_format
                .as_deref()
                .filter(|f| !f.trim().is_empty())
                .and_then(|f| serde_json::from_str::<serde_json::Value>(f).ok())
                .and_then(|v| v.as_object().cloned());
            json(labels.as_ref(), false)
        }
    };
    file_logger(path, format)
}

/// Istio's peer filter-state objects (logged by the gRPC loggers; absent here, so empty).
fn filter_state(configured: &[String]) -> Vec<String> {
    if configured.is_empty() {
        vec!["upstream_peer".to_string(), "downstream_peer".to_string()]
    } else {
        configured.to_vec()
    }
}

fn format_fields(
    format: Option<&LogFormat>,
) -> (
    Option<&str>,
    Option<serde_json::Map<String, serde_json::Value>>,
) {
    let text = format.and_then(|f| f.text.as_deref());
    let labels = format
        .and_then(|f| f.labels.as_ref())
        .map(|l| l.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    (text, labels)
}

/// A Telemetry provider's logger for an HCM (`http`) or a tcp_proxy, `None` for a provider
/// of another kind or one the HCM/tcp_proxy kind does not take (`envoyTcpAls` on HTTP).
pub fn provider_logger(
    provider: &Resolved<'_>,
    mesh: &MeshConfigSpec,
    http: bool,
) -> Option<AccessLog> {
    let p: &ExtensionProvider = provider.provider;
    if let Some(f) = &p.envoy_file_access_log {
        let path = if f.path.is_empty() {
            "/dev/stdout"
        } else {
            &f.path
        };
        // Istio's built-in `envoy` without a format follows the mesh config's format.
        if p.name == "envoy" && f.log_format.is_none() {
            return Some(mesh_file(path, mesh));
        }
        let (text_fmt, labels) = format_fields(f.log_format.as_ref());
        let format = match labels {
            Some(l) => json(Some(&l), false),
            None => text(text_fmt, false),
        };
        return Some(file_logger(path, format));
    }
    let (cluster, host) = (provider.cluster.as_deref()?, provider.host.as_deref()?);
    if let Some(o) = &p.envoy_otel_als {
        let (text_fmt, labels) = format_fields(o.log_format.as_ref());
        let mut attrs: Vec<KeyValue> = labels
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| KeyValue {
                key: k,
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(match v {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    })),
                }),
                ..Default::default()
            })
            .collect();
        attrs.sort_by(|a, b| a.key.cmp(&b.key));
        // The logger's own `grpc_service` and `log_name` (its `common_config` is deprecated in
        // upstream Envoy; Istio's peer filter states, which it would name, do not exist here).
        let config = OpenTelemetryAccessLogConfig {
            grpc_service: Some(mesh_common::envoy::envoy_grpc(cluster, host)),
            log_name: o
                .log_name
                .clone()
                .unwrap_or_else(|| "otel_envoy_accesslog".into()),
            disable_builtin_labels: true,
            body: Some(AnyValue {
                value: Some(any_value::Value::StringValue(
                    text_fmt.unwrap_or(TEXT_FORMAT).to_string(),
                )),
            }),
            attributes: (!attrs.is_empty()).then_some(KeyValueList { values: attrs }),
            ..Default::default()
        };
        return Some(logger(OTEL, pack_any(config)));
    }
    let common = |a: &crate::config_store::providers::GrpcAls, default_name: &str| {
        CommonGrpcAccessLogConfig {
            log_name: a
                .log_name
                .clone()
                .unwrap_or_else(|| default_name.to_string()),
            grpc_service: Some(mesh_common::envoy::envoy_grpc(cluster, host)),
            transport_api_version: ApiVersion::V3 as i32,
            filter_state_objects_to_log: filter_state(&a.filter_state_objects_to_log),
            ..Default::default()
        }
    };
    if let Some(a) = &p.envoy_http_als
        && http
    {
        let config = HttpGrpcAccessLogConfig {
            common_config: Some(common(a, "http_envoy_accesslog")),
            additional_request_headers_to_log: a.additional_request_headers_to_log.clone(),
            additional_response_headers_to_log: a.additional_response_headers_to_log.clone(),
            additional_response_trailers_to_log: a.additional_response_trailers_to_log.clone(),
        };
        return Some(logger(HTTP_GRPC, pack_any(config)));
    }
    if let Some(a) = &p.envoy_tcp_als
        && !http
    {
        let config = TcpGrpcAccessLogConfig {
            common_config: Some(common(a, "tcp_envoy_accesslog")),
        };
        return Some(logger(TCP_GRPC, pack_any(config)));
    }
    None
}

fn logger(name: &str, any: envoy_types::pb::google::protobuf::Any) -> AccessLog {
    AccessLog {
        name: name.to_string(),
        config_type: Some(access_log::ConfigType::TypedConfig(any)),
        ..Default::default()
    }
}

/// `logger` logging only what the CEL `expression` accepts (Envoy's CEL access-log filter).
pub fn filtered(mut logger: AccessLog, expression: Option<&str>) -> AccessLog {
    if let Some(expression) = expression {
        logger.filter = Some(AccessLogFilter {
            filter_specifier: Some(access_log_filter::FilterSpecifier::ExtensionFilter(
                ExtensionFilter {
                    name: CEL.to_string(),
                    config_type: Some(
                        envoy_types::pb::envoy::config::accesslog::v3::extension_filter::ConfigType::TypedConfig(
                            pack_any(ExpressionFilter {
                                expression: expression.to_string(),
                                ..Default::default()
                            }),
                        ),
                    ),
                },
            )),
        });
    }
    logger
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::grpc_service;
    use prost::Message;

    fn format_of(log: &AccessLog) -> SubstitutionFormatString {
        let Some(access_log::ConfigType::TypedConfig(any)) = &log.config_type else {
            panic!("untyped")
        };
        let f = FileAccessLog::decode(any.value.as_slice()).unwrap();
        let Some(file_access_log::AccessLogFormat::LogFormat(s)) = f.access_log_format else {
            panic!("no format")
        };
        s
    }

    fn provider(yaml: &str) -> ExtensionProvider {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    fn resolved(p: &ExtensionProvider) -> Resolved<'_> {
        Resolved {
            provider: p,
            host: Some("als.obs.svc.cluster.local".into()),
            cluster: Some("outbound|9000||als.obs.svc.cluster.local".into()),
        }
    }

    #[test]
    fn grpc_loggers_reach_their_service_as_istio_names_them() {
        let mesh = MeshConfigSpec::default();
        let http = provider(
            "name: h\nenvoyHttpAls: {service: als.obs.svc.cluster.local, port: 9000, additionalRequestHeadersToLog: [x-a]}",
        );
        let log = provider_logger(&resolved(&http), &mesh, true).unwrap();
        assert_eq!(log.name, HTTP_GRPC);
        let Some(access_log::ConfigType::TypedConfig(any)) = &log.config_type else {
            panic!()
        };
        let c = HttpGrpcAccessLogConfig::decode(any.value.as_slice()).unwrap();
        let common = c.common_config.unwrap();
        assert_eq!(common.log_name, "http_envoy_accesslog");
        assert_eq!(
            common.filter_state_objects_to_log,
            ["upstream_peer", "downstream_peer"]
        );
        let Some(grpc_service::TargetSpecifier::EnvoyGrpc(g)) =
            common.grpc_service.unwrap().target_specifier
        else {
            panic!()
        };
        assert_eq!(g.cluster_name, "outbound|9000||als.obs.svc.cluster.local");
        assert_eq!(g.authority, "als.obs.svc.cluster.local");
        assert_eq!(c.additional_request_headers_to_log, ["x-a"]);
        // An HTTP ALS on a tcp_proxy, a TCP ALS on a connection manager: none.
        assert!(provider_logger(&resolved(&http), &mesh, false).is_none());
        let tcp =
            provider("name: t\nenvoyTcpAls: {service: als.obs.svc.cluster.local, port: 9000}");
        assert!(provider_logger(&resolved(&tcp), &mesh, true).is_none());
        assert_eq!(
            provider_logger(&resolved(&tcp), &mesh, false).unwrap().name,
            TCP_GRPC
        );
        // OTLP: Istio's text line as the body, labels as sorted attributes.
        let otel = provider(
            "name: o\nenvoyOtelAls: {service: als.obs.svc.cluster.local, port: 9000, logFormat: {labels: {b: '%RESPONSE_CODE%', a: '%REQ(:PATH)%'}}}",
        );
        let log = provider_logger(&resolved(&otel), &mesh, true).unwrap();
        let Some(access_log::ConfigType::TypedConfig(any)) = &log.config_type else {
            panic!()
        };
        let c = OpenTelemetryAccessLogConfig::decode(any.value.as_slice()).unwrap();
        assert_eq!(c.log_name, "otel_envoy_accesslog");
        let keys: Vec<String> = c
            .attributes
            .unwrap()
            .values
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        assert_eq!(keys, ["a", "b"]);
        // Unreachable (no cluster): no logger.
        let gone = Resolved {
            provider: &otel,
            host: None,
            cluster: None,
        };
        assert!(provider_logger(&gone, &mesh, true).is_none());
    }

    #[test]
    fn a_filter_is_envoys_cel_filter() {
        let log = filtered(
            mesh_file("/dev/stdout", &MeshConfigSpec::default()),
            Some("response.code >= 400"),
        );
        let Some(access_log_filter::FilterSpecifier::ExtensionFilter(f)) =
            log.filter.unwrap().filter_specifier
        else {
            panic!()
        };
        assert_eq!(f.name, CEL);
    }

    #[test]
    fn mesh_formats_as_istio_writes_them() {
        let mesh: MeshConfigSpec = serde_yaml_ng::from_str("accessLogFile: /dev/stdout").unwrap();
        let s = format_of(&mesh_file("/dev/stdout", &mesh));
        let Some(substitution_format_string::Format::TextFormatSource(d)) = s.format else {
            panic!()
        };
        assert_eq!(
            d.specifier,
            Some(data_source::Specifier::InlineString(TEXT_FORMAT.into()))
        );
        assert_eq!(TEXT_FORMAT.len(), 530);
        let mesh: MeshConfigSpec =
            serde_yaml_ng::from_str("accessLogFormat: '%REQ(:METHOD)%'").unwrap();
        let Some(substitution_format_string::Format::TextFormatSource(d)) =
            format_of(&mesh_file("/tmp/x", &mesh)).format
        else {
            panic!()
        };
        assert_eq!(
            d.specifier,
            Some(data_source::Specifier::InlineString(
                "%REQ(:METHOD)%\n".into()
            ))
        );
        let mesh: MeshConfigSpec = serde_yaml_ng::from_str(
            "accessLogEncoding: JSON\naccessLogFormat: '{\"code\": \"%RESPONSE_CODE%\"}'",
        )
        .unwrap();
        let Some(substitution_format_string::Format::JsonFormat(j)) =
            format_of(&mesh_file("/tmp/x", &mesh)).format
        else {
            panic!()
        };
        assert_eq!(j.fields.keys().collect::<Vec<_>>(), vec!["code"]);
        let mesh: MeshConfigSpec = serde_yaml_ng::from_str("accessLogEncoding: JSON").unwrap();
        let Some(substitution_format_string::Format::JsonFormat(j)) =
            format_of(&mesh_file("/tmp/x", &mesh)).format
        else {
            panic!()
        };
        assert_eq!(j.fields.len(), 24);
    }
}
