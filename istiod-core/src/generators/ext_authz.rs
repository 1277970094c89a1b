//! The ext_authz filters of CUSTOM AuthorizationPolicies: a mesh config extension provider
//! (`envoyExtAuthzHttp` / `envoyExtAuthzGrpc`) asked through its service's outbound cluster,
//! only for requests a CUSTOM rule matched (`authz::ext_authz_enabled`), as Istio builds it.

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
    ListStringMatcher, StringMatcher, string_matcher,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::util::pack_any;

use crate::config_store::MeshConfigSpec;
use crate::config_store::providers::ExtensionProvider;

pub const HTTP_EXT_AUTHZ: &str = "envoy.filters.http.ext_authz";
pub const NETWORK_EXT_AUTHZ: &str = "envoy.filters.network.ext_authz";

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
        timeout: Some(timeout.map_or(super::seconds(DEFAULT_TIMEOUT_SECS), |t| t.proto())),
        ..super::envoy_grpc(cluster, host)
    }
}

/// A CUSTOM policy's provider, resolved: its mesh config entry, the host of its service, the
/// outbound cluster that reaches it, and whether it speaks gRPC.
pub struct Target<'a> {
    pub provider: &'a ExtensionProvider,
    pub host: &'a str,
    pub cluster: String,
    pub grpc: bool,
}

/// Why a CUSTOM policy's provider cannot be asked (the policy's rules then deny).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("no extensionProviders entry is named {name:?}")]
    Unknown { name: String },
    #[error("extension provider {name:?} is no ext_authz provider")]
    NotExtAuthz { name: String },
    #[error("extension provider {name:?}: {host:?} is no service of the mesh")]
    NotAService { name: String, host: String },
}

/// The provider named `name` in `mesh`, if it can be asked: an ext_authz entry whose service
/// `is_service` knows.
pub fn target<'a>(
    mesh: &'a MeshConfigSpec,
    name: &str,
    is_service: &dyn Fn(&str) -> bool,
) -> Result<Target<'a>, ProviderError> {
    let provider = mesh
        .extension_providers
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| ProviderError::Unknown {
            name: name.to_string(),
        })?;
    let (host, port, grpc) = provider
        .ext_authz()
        .ok_or_else(|| ProviderError::NotExtAuthz {
            name: name.to_string(),
        })?;
    if !is_service(host) {
        return Err(ProviderError::NotAService {
            name: name.to_string(),
            host: host.to_string(),
        });
    }
    Ok(Target {
        provider,
        host,
        cluster: crate::model::outbound_cluster_name(port, host),
        grpc,
    })
}

/// The HTTP ext_authz filter for a resolved provider.
pub fn http_filter(target: &Target) -> HttpFilter {
    let (provider, cluster) = (target.provider, target.cluster.as_str());
    let mut config = ExtAuthz {
        transport_api_version: ApiVersion::V3 as i32,
        filter_enabled_metadata: Some(super::authz::ext_authz_enabled(super::authz::HTTP_RBAC)),
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
                        .map_or(super::seconds(DEFAULT_TIMEOUT_SECS), |t| t.proto()),
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
        filter_enabled_metadata: Some(super::authz::ext_authz_enabled(super::authz::NETWORK_RBAC)),
        ..Default::default()
    };
    Filter {
        name: NETWORK_EXT_AUTHZ.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(pack_any(config))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_that_cannot_be_asked_says_why() {
        let push = crate::push_context::from_yaml(
            r#"
kind: MeshConfig
metadata: {name: mesh}
spec:
  extensionProviders:
  - name: http-authz
    envoyExtAuthzHttp: {service: authz.shop.svc.cluster.local, port: 8000}
"#,
        );
        let known = |host: &str| host == "authz.shop.svc.cluster.local";
        let cluster = target(&push.mesh, "http-authz", &known).map(|t| t.cluster);
        assert_eq!(
            cluster,
            Ok("outbound|8000||authz.shop.svc.cluster.local".to_string())
        );
        let err = target(&push.mesh, "other", &known).err();
        assert_eq!(
            err,
            Some(ProviderError::Unknown {
                name: "other".into()
            })
        );
        let err = target(&push.mesh, "http-authz", &|_| false).err();
        assert_eq!(
            err.map(|e| e.to_string()).as_deref(),
            Some(
                "extension provider \"http-authz\": \"authz.shop.svc.cluster.local\" is no service of the mesh"
            )
        );
    }
}
