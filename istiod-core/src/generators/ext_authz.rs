//! The ext_authz filters of CUSTOM AuthorizationPolicies: a mesh config extension provider
//! (`envoyExtAuthzHttp` / `envoyExtAuthzGrpc`) asked through its service's outbound cluster,
//! only for requests a CUSTOM rule matched ([`ext_authz_enabled`]), as Istio builds it. The
//! provider is resolved in the snapshot (`push_context::policy::target`).

use envoy_types::pb::envoy::config::core::v3::{ApiVersion, GrpcService, HttpUri, http_uri};
use envoy_types::pb::envoy::config::listener::v3::{Filter, filter};
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{
    AuthorizationResponse, ExtAuthz, HttpService, ext_authz,
};
use envoy_types::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as NetExtAuthz;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    ListStringMatcher, MetadataMatcher, StringMatcher, ValueMatcher, metadata_matcher,
    string_matcher, value_matcher,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::util::pack_any;

use crate::push_context::policy::Target;
use crate::resource::{HTTP_RBAC, NETWORK_RBAC};

pub const HTTP_EXT_AUTHZ: &str = "envoy.filters.http.ext_authz";
pub const NETWORK_EXT_AUTHZ: &str = "envoy.filters.network.ext_authz";
/// The shadow RBAC rules of CUSTOM policies record their match under keys with this prefix, for
/// policies named with the next one (Istio's names).
pub const EXT_AUTHZ_SHADOW_PREFIX: &str = "istio_ext_authz_";
pub const EXT_AUTHZ_POLICY_PREFIX: &str = "istio-ext-authz";

/// Istio's default: the authorizer has 600 s unless the provider says otherwise.
const DEFAULT_TIMEOUT_SECS: i64 = 600;

fn exact_list(names: &[String]) -> Option<ListStringMatcher> {
    (!names.is_empty()).then(|| ListStringMatcher {
        patterns: names
            .iter()
            .map(|n| StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(n.to_lowercase())),
                ignore_case: true,
            })
            .collect(),
    })
}

fn status(s: &Option<String>) -> Option<HttpStatus> {
    s.as_ref()
        .and_then(|s| s.parse::<i32>().ok())
        .map(|code| HttpStatus { code })
}

/// The gRPC target: `cluster`, with the service's host name as `:authority`, and the check's
/// timeout.
fn grpc_target(
    cluster: &str,
    host: &str,
    timeout: Option<&crate::config_store::values::GoDuration>,
) -> GrpcService {
    GrpcService {
        timeout: Some(timeout.map_or(super::blocks::seconds(DEFAULT_TIMEOUT_SECS), |t| t.proto())),
        ..mesh_common::envoy::envoy_grpc(cluster, host)
    }
}

/// The ext_authz filters' switch: the shadow RBAC filter (`rbac_filter`, the HTTP or the
/// network one) recorded a CUSTOM rule's match.
pub fn ext_authz_enabled(rbac_filter: &str) -> MetadataMatcher {
    MetadataMatcher {
        filter: rbac_filter.to_string(),
        path: vec![metadata_matcher::PathSegment {
            segment: Some(metadata_matcher::path_segment::Segment::Key(format!(
                "{EXT_AUTHZ_SHADOW_PREFIX}shadow_effective_policy_id"
            ))),
        }],
        value: Some(ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::StringMatch(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Prefix(
                    EXT_AUTHZ_POLICY_PREFIX.to_string(),
                )),
                ..Default::default()
            })),
        }),
        ..Default::default()
    }
}

/// The HTTP ext_authz filter for a resolved provider.
pub fn http_filter(target: &Target) -> HttpFilter {
    let (provider, cluster) = (target.provider, target.cluster.as_str());
    let mut config = ExtAuthz {
        transport_api_version: ApiVersion::V3 as i32,
        filter_enabled_metadata: Some(ext_authz_enabled(HTTP_RBAC)),
        ..Default::default()
    };
    if let Some(h) = &provider.envoy_ext_authz_http {
        config.failure_mode_allow = h.fail_open;
        config.status_on_error = status(&h.status_on_error);
        config.allowed_headers = exact_list(&h.include_request_headers_in_check);
        config.services = Some(ext_authz::Services::HttpService(HttpService {
            server_uri: Some(HttpUri {
                uri: format!("http://{}", target.host),
                timeout: Some(
                    h.timeout
                        .as_ref()
                        .map_or(super::blocks::seconds(DEFAULT_TIMEOUT_SECS), |t| t.proto()),
                ),
                http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster.to_string())),
            }),
            path_prefix: h.path_prefix.clone().unwrap_or_default(),
            authorization_request: Some(
                envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::AuthorizationRequest {
                    headers_to_add: h
                        .include_additional_headers_in_check
                        .iter()
                        .map(|(k, v)| envoy_types::pb::envoy::config::core::v3::HeaderValue {
                            key: k.clone(),
                            value: v.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                },
            ),
            authorization_response: Some(AuthorizationResponse {
                allowed_upstream_headers: exact_list(&h.headers_to_upstream_on_allow),
                allowed_client_headers: exact_list(&h.headers_to_downstream_on_deny),
                ..Default::default()
            }),
            ..Default::default()
        }));
    } else if let Some(g) = &provider.envoy_ext_authz_grpc {
        config.failure_mode_allow = g.fail_open;
        config.status_on_error = status(&g.status_on_error);
        config.services = Some(ext_authz::Services::GrpcService(grpc_target(
            cluster,
            target.host,
            g.timeout.as_ref(),
        )));
    }
    HttpFilter {
        name: HTTP_EXT_AUTHZ.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(config))),
        ..Default::default()
    }
}

/// The network ext_authz filter for a resolved gRPC provider (TCP chains).
pub fn network_filter(target: &Target) -> Filter {
    let g = target.provider.envoy_ext_authz_grpc.as_ref();
    let config = NetExtAuthz {
        stat_prefix: "tcp.".to_string(),
        grpc_service: Some(grpc_target(
            &target.cluster,
            target.host,
            g.and_then(|g| g.timeout.as_ref()),
        )),
        failure_mode_allow: g.is_some_and(|g| g.fail_open),
        transport_api_version: ApiVersion::V3 as i32,
        filter_enabled_metadata: Some(ext_authz_enabled(NETWORK_RBAC)),
        ..Default::default()
    };
    Filter {
        name: NETWORK_EXT_AUTHZ.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(pack_any(config))),
    }
}
