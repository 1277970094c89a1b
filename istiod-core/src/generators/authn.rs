//! RequestAuthentication → Envoy's `jwt_authn` filter on a sidecar's inbound HTTP chains, as
//! istiod builds it: one provider per issuer (`origins-N`-style names are Istio's; ours are
//! the issuer itself), all rules of every policy that selects the workload, and one requirement
//! for every path: a valid token of any provider, or no token at all. So a request with an
//! invalid token (bad signature, expired, wrong audience, unknown issuer) gets 401, and a
//! request without one passes on to the RBAC filters, where an AuthorizationPolicy on
//! `requestPrincipals` or `request.auth.*` decides. A verified token's payload is written to
//! the filter's metadata under `payload`, where those rules read it.

use envoy_types::pb::envoy::config::core::v3::{DataSource, HttpUri, data_source, http_uri};
use envoy_types::pb::envoy::config::route::v3::{RouteMatch, route_match};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement,
    JwtRequirementOrList, RemoteJwks, RequirementRule, jwt_provider, jwt_requirement,
    requirement_rule,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_types::pb::google::protobuf::{Any, Empty};

use crate::config_store::request_authentication::{JwksSource, JwtRule};
use crate::model::{Proxy, outbound_cluster_name};
use crate::push_context::PushContext;
use crate::resource::JWT_AUTHN;

const JWT_AUTHN_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication";
/// Where a verified token's payload goes in the filter's dynamic metadata (what the RBAC
/// rules of `authz` read).
pub const PAYLOAD_KEY: &str = "payload";
/// Keys no token can match: what a rule whose key source cannot be reached gets, so its
/// tokens are refused rather than trusted (Istio fails closed the same way). Envoy refuses a
/// key set with no usable key, so this is one real P-256 public key whose private key was
/// discarded when it was made (never written anywhere).
const NO_KEYS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","alg":"ES256","kid":"no-key-reachable","x":"gwK2cGIhiZ9bwaEBeJFV3TM0e8bQpcBOGYsHVUbjoew","y":"c5seC0IjLdQobgFFRX4pTRvwgwoRhVp9a1EYfSf5uHQ"}]}"#;

/// The JWT filter for `proxy`'s inbound HTTP chains (its workload carrying `labels`), if any
/// RequestAuthentication selects it.
pub fn jwt_filter(
    push: &PushContext,
    proxy: &Proxy,
    labels: &std::collections::BTreeMap<String, String>,
) -> Option<HttpFilter> {
    let rules: Vec<&JwtRule> = push
        .request_authentications
        .iter()
        .filter(|(m, s)| {
            crate::push_context::policy::selects(
                push,
                &proxy.namespace,
                labels,
                m,
                s.selector.as_ref(),
                s.targeted(),
            )
        })
        .flat_map(|(_, s)| &s.jwt_rules)
        .collect();
    if rules.is_empty() {
        return None;
    }
    // One provider per issuer (the first rule for an issuer wins, in policy name order).
    let mut providers: std::collections::BTreeMap<&str, JwtProvider> = Default::default();
    for rule in rules {
        providers
            .entry(rule.issuer.as_str())
            .or_insert_with(|| provider(push, rule));
    }
    let mut any_of: Vec<JwtRequirement> = providers
        .keys()
        .map(|name| JwtRequirement {
            requires_type: Some(jwt_requirement::RequiresType::ProviderName(
                name.to_string(),
            )),
        })
        .collect();
    any_of.push(JwtRequirement {
        requires_type: Some(jwt_requirement::RequiresType::AllowMissing(Empty {})),
    });
    let base = JwtAuthentication {
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix("/".to_string())),
                ..Default::default()
            }),
            requirement_type: Some(requirement_rule::RequirementType::Requires(
                JwtRequirement {
                    requires_type: Some(jwt_requirement::RequiresType::RequiresAny(
                        JwtRequirementOrList {
                            requirements: any_of,
                        },
                    )),
                },
            )),
        }],
        ..Default::default()
    };
    let value = super::blocks::encode_map_in_order(
        &base,
        providers.into_iter().map(|(name, p)| JwtAuthentication {
            providers: [(name.to_string(), p)].into_iter().collect(),
            ..Default::default()
        }),
    );
    Some(HttpFilter {
        name: JWT_AUTHN.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(Any {
            type_url: JWT_AUTHN_TYPE.to_string(),
            value,
        })),
        ..Default::default()
    })
}

fn provider(push: &PushContext, rule: &JwtRule) -> JwtProvider {
    let inline = |s: &str| {
        jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::InlineString(s.to_string())),
            ..Default::default()
        })
    };
    let jwks = match rule.jwks_source() {
        Some(JwksSource::Inline(keys)) => inline(keys),
        Some(JwksSource::File(path)) => jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::Filename(path.to_string())),
            ..Default::default()
        }),
        Some(JwksSource::Http { host, port }) => match push.service(host) {
            Some(svc) => jwt_provider::JwksSourceSpecifier::RemoteJwks(RemoteJwks {
                http_uri: Some(HttpUri {
                    uri: rule.jwks_uri.clone().unwrap_or_default(),
                    timeout: Some(
                        rule.timeout
                            .as_ref()
                            .map_or(super::blocks::seconds(5), |t| t.proto()),
                    ),
                    http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(
                        outbound_cluster_name(port, &svc.hostname),
                    )),
                }),
                ..Default::default()
            }),
            // Not a service of the mesh: no keys (refused tokens; warned in the snapshot).
            None => inline(NO_KEYS),
        },
        None => inline(NO_KEYS),
    };
    JwtProvider {
        issuer: rule.issuer.clone(),
        audiences: rule.audiences.clone(),
        forward: rule.forward_original_token,
        from_headers: rule
            .from_headers
            .iter()
            .map(|h| JwtHeader {
                name: h.name.clone(),
                value_prefix: h.prefix.clone(),
            })
            .collect(),
        from_params: rule.from_params.clone(),
        from_cookies: rule.from_cookies.clone(),
        forward_payload_header: rule.output_payload_to_header.clone().unwrap_or_default(),
        payload_in_metadata: PAYLOAD_KEY.to_string(),
        claim_to_headers: rule
            .output_claim_to_headers
            .iter()
            .map(|c| JwtClaimToHeader {
                header_name: c.header.clone(),
                claim_name: c.claim.clone(),
                ..Default::default()
            })
            .collect(),
        jwks_source_specifier: Some(jwks),
        ..Default::default()
    }
}
