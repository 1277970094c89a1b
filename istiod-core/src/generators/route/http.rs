//! One VirtualService's `http` routes as Envoy routes, for one route configuration (a port)
//! and one proxy, as istiod translates them (`pilot/pkg/networking/core/route/route.go`,
//! `route/retry/retry.go`): first match wins, one Envoy route per match block, nothing after a
//! catch-all; matches on the proxy itself (port, sourceLabels, sourceNamespace, gateways) are
//! decided here and never reach Envoy.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{
    DataSource, HeaderValue, HeaderValueOption, Metadata, RuntimeFractionalPercent, data_source,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::config::route::v3::{
    Decorator, DirectResponseAction, HeaderMatcher, QueryParameterMatcher, RedirectAction,
    RetryPolicy, Route, RouteAction, RouteMatch, WeightedCluster, header_matcher,
    query_parameter_matcher, redirect_action, retry_policy, route, route_action, route_match,
    weighted_cluster,
};
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{FaultDelay, fault_delay};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{
    FaultAbort, HttpFault, fault_abort,
};
use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher, string_matcher};
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent};
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_types::util::pack_any;

use super::retry;
use crate::config_store::values::{Percent, StringMatch, StringMatchKind};
use crate::config_store::virtual_service::{
    Destination, HeaderOperations, Headers, HttpMatch, HttpRoute, grpc_status_code,
};
use crate::generators::cluster_policy;
use crate::model::{Proxy, subset_cluster_name};
use crate::push_context::{MeshRoute, PushContext};
use crate::resource::{CORS_FILTER, FAULT_FILTER};
use mesh_common::envoy::proto_duration;

/// What a route is built for: the snapshot, the route configuration's port and the proxy
/// (None when the routes are shared by every proxy, which `Routing::per_proxy` allows).
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub push: &'a PushContext,
    pub port: u16,
    pub proxy: Option<&'a Proxy>,
    /// The Gateway (`namespace/name`) the routes are for; `None` for sidecars (`mesh`).
    pub gateway: Option<&'a str>,
}

/// Whether a match block applies to this proxy on this port (Istio's sourceMatchHTTP).
fn applies(m: &HttpMatch, ctx: Ctx) -> bool {
    m.port.is_none_or(|p| p.0 == ctx.port)
        && super::source_applies(
            &m.gateways,
            &m.source_labels,
            m.source_namespace.as_ref(),
            ctx.proxy,
            ctx.gateway,
        )
}

fn string_matcher(m: &StringMatch, ignore_case: bool) -> Option<StringMatcher> {
    let pattern = match m.kind() {
        StringMatchKind::Exact(e) => string_matcher::MatchPattern::Exact(e.to_string()),
        StringMatchKind::Prefix(p) => string_matcher::MatchPattern::Prefix(p.to_string()),
        StringMatchKind::Regex("*") | StringMatchKind::Any => return None,
        StringMatchKind::Regex(r) => string_matcher::MatchPattern::SafeRegex(RegexMatcher {
            regex: r.to_string(),
            ..Default::default()
        }),
    };
    Some(StringMatcher {
        match_pattern: Some(pattern),
        ignore_case,
    })
}

fn header_matcher(name: &str, m: &StringMatch, invert: bool) -> HeaderMatcher {
    let spec = match string_matcher(m, false) {
        Some(sm) => header_matcher::HeaderMatchSpecifier::StringMatch(sm),
        None => header_matcher::HeaderMatchSpecifier::PresentMatch(true),
    };
    let present = matches!(spec, header_matcher::HeaderMatchSpecifier::PresentMatch(_));
    HeaderMatcher {
        name: name.to_ascii_lowercase(),
        header_match_specifier: Some(spec),
        invert_match: invert,
        treat_missing_header_as_empty: invert && !present,
    }
}

fn route_match(m: Option<&HttpMatch>) -> RouteMatch {
    let Some(m) = m else {
        return RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix("/".to_string())),
            ..Default::default()
        };
    };
    let path = match m.uri.as_ref().map(StringMatch::kind) {
        Some(StringMatchKind::Exact(p)) => route_match::PathSpecifier::Path(p.to_string()),
        Some(StringMatchKind::Prefix(p)) => route_match::PathSpecifier::Prefix(p.to_string()),
        Some(StringMatchKind::Regex(r)) => route_match::PathSpecifier::SafeRegex(RegexMatcher {
            regex: r.to_string(),
            ..Default::default()
        }),
        Some(StringMatchKind::Any) | None => route_match::PathSpecifier::Prefix("/".to_string()),
    };
    // Headers and withoutHeaders sorted by name together, then the pseudo-headers.
    let mut headers: Vec<HeaderMatcher> = m
        .headers
        .iter()
        .map(|(k, v)| header_matcher(k, v, false))
        .chain(
            m.without_headers
                .iter()
                .map(|(k, v)| header_matcher(k, v, true)),
        )
        .collect();
    headers.sort_by(|a, b| a.name.cmp(&b.name));
    for (name, sm) in [
        (":method", &m.method),
        (":authority", &m.authority),
        (":scheme", &m.scheme),
    ] {
        if let Some(sm) = sm {
            headers.push(header_matcher(name, sm, false));
        }
    }
    let query_parameters = m
        .query_params
        .iter()
        .map(|(k, v)| QueryParameterMatcher {
            name: k.clone(),
            query_parameter_match_specifier: Some(match string_matcher(v, false) {
                Some(sm) => query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(sm),
                None => query_parameter_matcher::QueryParameterMatchSpecifier::PresentMatch(true),
            }),
        })
        .collect();
    RouteMatch {
        path_specifier: Some(path),
        case_sensitive: Some(BoolValue {
            value: !m.ignore_uri_case,
        }),
        headers,
        query_parameters,
        ..Default::default()
    }
}

/// A match on everything: Istio stops emitting routes after one.
fn is_catch_all(m: &RouteMatch) -> bool {
    let any_path = match &m.path_specifier {
        Some(route_match::PathSpecifier::Prefix(p)) => p == "/",
        Some(route_match::PathSpecifier::SafeRegex(r)) => r.regex == ".*",
        _ => false,
    };
    any_path && m.headers.is_empty() && m.query_parameters.is_empty()
}

fn fraction(per_million: u32) -> FractionalPercent {
    FractionalPercent {
        numerator: per_million,
        denominator: fractional_percent::DenominatorType::Million as i32,
    }
}

fn hundredths(percent: u32) -> FractionalPercent {
    FractionalPercent {
        numerator: percent.min(100),
        denominator: fractional_percent::DenominatorType::Hundred as i32,
    }
}

/// The cluster of a destination: an explicit port, else the host's only port when it is a
/// service with one, else the route configuration's port.
pub fn destination_cluster(push: &PushContext, d: &Destination, port: u16) -> String {
    let port = d.port.map(|p| p.number.0).unwrap_or_else(|| {
        push.service(&d.host)
            .filter(|s| s.ports.len() == 1)
            .map_or(port, |s| s.ports[0].port)
    });
    subset_cluster_name(port, d.subset.as_deref().unwrap_or(""), &d.host)
}

fn header_options(
    set: &std::collections::BTreeMap<String, String>,
    action: HeaderAppendAction,
) -> impl Iterator<Item = HeaderValueOption> + '_ {
    set.iter()
        .filter(|(k, _)| !is_authority(k))
        .map(move |(k, v)| HeaderValueOption {
            header: Some(HeaderValue {
                key: k.to_ascii_lowercase(),
                value: v.clone(),
                ..Default::default()
            }),
            append_action: action as i32,
            ..Default::default()
        })
}

fn is_authority(name: &str) -> bool {
    name.eq_ignore_ascii_case(":authority") || name.eq_ignore_ascii_case("host")
}

/// Header operations in Envoy's form: (to add or set, to remove).
fn header_ops(ops: &HeaderOperations) -> (Vec<HeaderValueOption>, Vec<String>) {
    let add = header_options(&ops.set, HeaderAppendAction::OverwriteIfExistsOrAdd)
        .chain(header_options(
            &ops.add,
            HeaderAppendAction::AppendIfExistsOrAdd,
        ))
        .collect();
    let remove = ops
        .remove
        .iter()
        .filter(|k| !is_authority(k) && !k.starts_with(':'))
        .map(|k| k.to_ascii_lowercase())
        .collect();
    (add, remove)
}

/// A request authority set by header operations (set wins over add).
fn authority_of(h: &Headers) -> Option<String> {
    let req = h.request.as_ref()?;
    req.set
        .iter()
        .chain(&req.add)
        .find(|(k, _)| is_authority(k))
        .map(|(_, v)| v.clone())
}

/// Istio's retry policy: the default when `retries` is unset, none for `attempts: 0`.
fn retry_policy(r: &HttpRoute, hashed: bool) -> Option<RetryPolicy> {
    let mut policy = retry::default_retry(hashed);
    let Some(retries) = &r.retries else {
        return Some(policy);
    };
    if retries.attempts <= 0 {
        return None;
    }
    policy.num_retries = Some(UInt32Value {
        value: u32::try_from(retries.attempts).unwrap_or(u32::MAX),
    });
    if let Some(on) = retries.retry_on.as_deref().filter(|s| !s.trim().is_empty()) {
        let mut conditions = Vec::new();
        let mut codes = Vec::new();
        for token in on.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match token.parse::<u32>() {
                Ok(code) => codes.push(code),
                Err(_) => conditions.push(token.to_string()),
            }
        }
        if !codes.is_empty() && !conditions.iter().any(|c| c == "retriable-status-codes") {
            conditions.push("retriable-status-codes".to_string());
        }
        policy.retry_on = conditions.join(",");
        policy.retriable_status_codes = codes;
    }
    if let Some(t) = &retries.per_try_timeout {
        policy.per_try_timeout = Some(t.proto());
    }
    if let Some(b) = &retries.backoff {
        policy.retry_back_off = Some(retry_policy::RetryBackOff {
            base_interval: Some(b.proto()),
            ..Default::default()
        });
    }
    if retries.retry_remote_localities == Some(true) {
        policy.retry_priority = Some(retry_policy::RetryPriority {
            name: "envoy.retry_priorities.previous_priorities".to_string(),
            config_type: Some(retry_policy::retry_priority::ConfigType::TypedConfig(
                pack_any(PreviousPrioritiesConfig {
                    update_frequency: 2,
                }),
            )),
        });
    }
    Some(policy)
}

fn fault(f: &crate::config_store::virtual_service::HttpFault) -> HttpFault {
    let delay = f.delay.as_ref().and_then(|d| {
        let fixed = d.fixed_delay.as_ref()?;
        Some(FaultDelay {
            fault_delay_secifier: Some(fault_delay::FaultDelaySecifier::FixedDelay(fixed.proto())),
            percentage: Some(match (d.percentage, d.percent) {
                (Some(p), _) => fraction(p.per_million()),
                (None, Some(p)) => hundredths(p),
                (None, None) => hundredths(0),
            }),
        })
    });
    let abort = f.abort.as_ref().map(|a| FaultAbort {
        error_type: match (a.http_status, &a.grpc_status) {
            (Some(s), _) => Some(fault_abort::ErrorType::HttpStatus(s)),
            (None, Some(g)) => grpc_status_code(g).map(fault_abort::ErrorType::GrpcStatus),
            (None, None) => None,
        },
        percentage: a.percentage.map(|p| fraction(p.per_million())),
        ..Default::default()
    });
    HttpFault {
        delay,
        abort,
        ..Default::default()
    }
}

fn cors(c: &crate::config_store::virtual_service::CorsPolicy) -> CorsPolicy {
    let origins: Vec<StringMatcher> = if c.allow_origins.is_empty() {
        c.allow_origin
            .iter()
            .map(|o| StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(o.clone())),
                ignore_case: false,
            })
            .collect()
    } else {
        c.allow_origins
            .iter()
            .filter_map(|o| string_matcher(o, false))
            .collect()
    };
    CorsPolicy {
        allow_origin_string_match: origins,
        allow_methods: c.allow_methods.join(","),
        allow_headers: c.allow_headers.join(","),
        expose_headers: c.expose_headers.join(","),
        max_age: c
            .max_age
            .as_ref()
            .map(|d| d.value.as_secs().to_string())
            .unwrap_or_default(),
        allow_credentials: c.allow_credentials.map(|value| BoolValue { value }),
        filter_enabled: Some(
            envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent {
                default_value: Some(hundredths(100)),
                ..Default::default()
            },
        ),
        forward_not_matching_preflights: Some(BoolValue {
            value: c.unmatched_preflights.as_deref() != Some("IGNORE"),
        }),
        ..Default::default()
    }
}

fn mirror_policy(
    ctx: Ctx,
    d: &Destination,
    percent: Option<FractionalPercent>,
) -> Option<route_action::RequestMirrorPolicy> {
    let percent = percent.unwrap_or(hundredths(100));
    if percent.numerator == 0 {
        return None;
    }
    Some(route_action::RequestMirrorPolicy {
        cluster: destination_cluster(ctx.push, d, ctx.port),
        runtime_fraction: Some(RuntimeFractionalPercent {
            default_value: Some(percent),
            ..Default::default()
        }),
        trace_sampled: Some(BoolValue { value: false }),
        ..Default::default()
    })
}

fn route_action(ctx: Ctx, r: &HttpRoute) -> RouteAction {
    let mut action = RouteAction {
        timeout: Some(proto_duration(
            r.timeout.as_ref().map(|t| t.value).unwrap_or_default(),
        )),
        ..Default::default()
    };
    #[allow(deprecated)]
    {
        action.max_grpc_timeout = action.timeout;
    }
    let mut hash_policy = Vec::new();
    if let [only] = r.route.as_slice() {
        action.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(
            destination_cluster(ctx.push, &only.destination, ctx.port),
        ));
        hash_policy.extend(cluster_policy::hash_policy(ctx.push, &only.destination));
        if let Some(a) = only.headers.as_ref().and_then(authority_of) {
            action.host_rewrite_specifier =
                Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(a));
        }
    } else {
        let clusters = r
            .route
            .iter()
            .filter(|d| d.weight.unwrap_or(0) > 0)
            .map(|d| {
                hash_policy.extend(cluster_policy::hash_policy(ctx.push, &d.destination));
                let mut cw = weighted_cluster::ClusterWeight {
                    name: destination_cluster(ctx.push, &d.destination, ctx.port),
                    weight: Some(UInt32Value {
                        value: d.weight.unwrap_or(0),
                    }),
                    ..Default::default()
                };
                if let Some(h) = &d.headers {
                    apply_headers_to_weight(&mut cw, h);
                }
                cw
            })
            .collect();
        action.cluster_specifier = Some(route_action::ClusterSpecifier::WeightedClusters(
            WeightedCluster {
                clusters,
                ..Default::default()
            },
        ));
    }
    let hashed = r.route.len() == 1 && !hash_policy.is_empty();
    action.hash_policy = hash_policy;
    action.retry_policy = retry_policy(r, hashed);
    if let Some(rw) = &r.rewrite {
        if let Some(re) = &rw.uri_regex_rewrite {
            action.regex_rewrite = Some(
                envoy_types::pb::envoy::r#type::matcher::v3::RegexMatchAndSubstitute {
                    pattern: Some(RegexMatcher {
                        regex: re.pattern.clone(),
                        ..Default::default()
                    }),
                    substitution: re.rewrite.clone(),
                },
            );
        } else if let Some(uri) = &rw.uri {
            action.prefix_rewrite = uri.clone();
        }
        if let Some(a) = &rw.authority {
            action.host_rewrite_specifier = Some(
                route_action::HostRewriteSpecifier::HostRewriteLiteral(a.clone()),
            );
        }
    }
    if action.host_rewrite_specifier.is_none()
        && let Some(a) = r.headers.as_ref().and_then(authority_of)
    {
        action.host_rewrite_specifier =
            Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(a));
    }
    let legacy = r.mirror.as_ref().and_then(|m| {
        let percent = match (r.mirror_percentage, r.mirror_percent) {
            (Some(p), _) => Some(fraction(p.per_million())),
            (None, Some(p)) => Some(hundredths(p)),
            (None, None) => None,
        };
        mirror_policy(ctx, m, percent)
    });
    action.request_mirror_policies = legacy
        .into_iter()
        .chain(r.mirrors.iter().filter_map(|m| {
            mirror_policy(
                ctx,
                &m.destination,
                m.percentage.map(|p: Percent| fraction(p.per_million())),
            )
        }))
        .collect();
    action
}

fn apply_headers_to_weight(cw: &mut weighted_cluster::ClusterWeight, h: &Headers) {
    if let Some(req) = &h.request {
        let (add, remove) = header_ops(req);
        cw.request_headers_to_add.extend(add);
        cw.request_headers_to_remove.extend(remove);
    }
    if let Some(resp) = &h.response {
        let (add, remove) = header_ops(resp);
        cw.response_headers_to_add.extend(add);
        cw.response_headers_to_remove.extend(remove);
    }
    if let Some(a) = authority_of(h) {
        cw.host_rewrite_specifier =
            Some(weighted_cluster::cluster_weight::HostRewriteSpecifier::HostRewriteLiteral(a));
    }
}

fn redirect(red: &crate::config_store::virtual_service::HttpRedirect, port: u16) -> RedirectAction {
    let mut port_redirect = red.port.map(|p| u32::from(p.0)).unwrap_or_default();
    if red.derive_port.as_deref() == Some("FROM_REQUEST_PORT") {
        port_redirect = u32::from(port);
    }
    // No explicit :80 for http or :443 for https (a redirect without a scheme keeps the
    // request's, taken as http here, as Istio does).
    if matches!(
        (red.scheme.as_deref().unwrap_or("http"), port_redirect),
        ("http", 80) | ("https", 443)
    ) {
        port_redirect = 0;
    }
    let path = match (&red.prefix_rewrite, &red.uri) {
        (Some(p), _) => Some(redirect_action::PathRewriteSpecifier::PrefixRewrite(
            p.clone(),
        )),
        (None, Some(u)) => Some(redirect_action::PathRewriteSpecifier::PathRedirect(
            u.clone(),
        )),
        (None, None) => None,
    };
    RedirectAction {
        host_redirect: red.authority.clone().unwrap_or_default(),
        port_redirect,
        scheme_rewrite_specifier: red
            .scheme
            .clone()
            .map(redirect_action::SchemeRewriteSpecifier::SchemeRedirect),
        path_rewrite_specifier: path,
        response_code: match red.redirect_code.unwrap_or(301) {
            302 => redirect_action::RedirectResponseCode::Found,
            303 => redirect_action::RedirectResponseCode::SeeOther,
            307 => redirect_action::RedirectResponseCode::TemporaryRedirect,
            308 => redirect_action::RedirectResponseCode::PermanentRedirect,
            _ => redirect_action::RedirectResponseCode::MovedPermanently,
        } as i32,
        ..Default::default()
    }
}

fn direct_response(
    d: &crate::config_store::virtual_service::DirectResponse,
) -> DirectResponseAction {
    let body = d.body.as_ref().and_then(|b| {
        let specifier = match (&b.string, &b.bytes) {
            (Some(s), _) => data_source::Specifier::InlineString(s.clone()),
            (None, Some(b64)) => data_source::Specifier::InlineBytes(
                crate::config_store::virtual_service::base64_decode(b64)?,
            ),
            (None, None) => return None,
        };
        Some(DataSource {
            specifier: Some(specifier),
            ..Default::default()
        })
    });
    DirectResponseAction {
        status: d.status,
        body,
        ..Default::default()
    }
}

/// Istio's tracing operation: `host:port/path*` for a single cluster, else `vs:port/path*`.
fn operation(m: &RouteMatch, action: &Option<route::Action>, vs: &MeshRoute, port: u16) -> String {
    let path = match &m.path_specifier {
        Some(route_match::PathSpecifier::Prefix(p)) => format!("{p}*"),
        Some(route_match::PathSpecifier::Path(p)) => p.clone(),
        Some(route_match::PathSpecifier::SafeRegex(r)) => r.regex.clone(),
        _ => "/*".to_string(),
    };
    if let Some(route::Action::Route(RouteAction {
        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(c)),
        ..
    })) = action
    {
        let parts: Vec<&str> = c.split('|').collect();
        if let [_, p, _, host] = parts[..] {
            return format!("{host}:{p}{path}");
        }
    }
    format!("{}:{port}{path}", vs.name)
}

fn translate(
    ctx: Ctx,
    vs: &MeshRoute,
    meta: &Metadata,
    r: &HttpRoute,
    m: Option<&HttpMatch>,
) -> Route {
    let name = match (&r.name, m.and_then(|m| m.name.as_ref())) {
        (n, Some(mn)) => format!("{}.{mn}", n.as_deref().unwrap_or_default()),
        (Some(n), None) => n.clone(),
        (None, None) => String::new(),
    };
    let matcher = route_match(m);
    let action = Some(if let Some(red) = &r.redirect {
        route::Action::Redirect(redirect(red, ctx.port))
    } else if let Some(d) = &r.direct_response {
        route::Action::DirectResponse(direct_response(d))
    } else {
        route::Action::Route(route_action(ctx, r))
    });
    let mut out = Route {
        name,
        decorator: Some(Decorator {
            operation: operation(&matcher, &action, vs, ctx.port),
            ..Default::default()
        }),
        r#match: Some(matcher),
        action,
        metadata: Some(meta.clone()),
        ..Default::default()
    };
    // The route's header operations, then a single destination's own.
    let single = match r.route.as_slice() {
        [only] => only.headers.as_ref(),
        _ => None,
    };
    for h in r.headers.iter().chain(single) {
        if let Some(req) = &h.request {
            let (add, remove) = header_ops(req);
            out.request_headers_to_add.extend(add);
            out.request_headers_to_remove.extend(remove);
        }
        if let Some(resp) = &h.response {
            let (add, remove) = header_ops(resp);
            out.response_headers_to_add.extend(add);
            out.response_headers_to_remove.extend(remove);
        }
    }
    let mut per_filter = HashMap::new();
    if let Some(f) = &r.fault {
        per_filter.insert(FAULT_FILTER.to_string(), pack_any(fault(f)));
    }
    if let Some(c) = &r.cors_policy {
        per_filter.insert(CORS_FILTER.to_string(), pack_any(cors(c)));
    }
    out.typed_per_filter_config = per_filter;
    out
}

/// The Envoy routes of `vs` on this route configuration, in order; empty when none of its
/// routes applies here (then the host keeps its default route, as in Istio).
pub fn routes(ctx: Ctx, vs: &MeshRoute) -> Vec<Route> {
    let mut out = Vec::new();
    let meta = super::super::blocks::istio_metadata(&vs.config);
    for r in &vs.http {
        if r.matches.is_empty() {
            out.push(translate(ctx, vs, &meta, r, None));
            return out;
        }
        for m in r.matches.iter().filter(|m| applies(m, ctx)) {
            let route = translate(ctx, vs, &meta, r, Some(m));
            let last = route.r#match.as_ref().is_some_and(is_catch_all);
            out.push(route);
            if last {
                return out;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_store::virtual_service::HttpRedirect;

    #[test]
    fn a_redirect_keeps_the_request_port_replaces_a_prefix_and_leaves_the_scheme_alone() {
        let red = |json: &str| redirect(&serde_json::from_str::<HttpRedirect>(json).unwrap(), 8080);
        let r = red(r#"{"prefixRewrite": "/new/", "derivePort": "FROM_REQUEST_PORT"}"#);
        assert_eq!(r.port_redirect, 8080);
        assert_eq!(
            r.path_rewrite_specifier,
            Some(redirect_action::PathRewriteSpecifier::PrefixRewrite(
                "/new/".into()
            ))
        );
        // No scheme given: the request's stays (none is written).
        assert_eq!(r.scheme_rewrite_specifier, None);
        let r =
            red(r#"{"uri": "/full", "scheme": "https", "derivePort": "FROM_PROTOCOL_DEFAULT"}"#);
        assert_eq!(r.port_redirect, 0);
        assert_eq!(
            r.path_rewrite_specifier,
            Some(redirect_action::PathRewriteSpecifier::PathRedirect(
                "/full".into()
            ))
        );
        // No explicit default port.
        assert_eq!(red(r#"{"port": 443, "scheme": "https"}"#).port_redirect, 0);
        assert_eq!(red(r#"{"port": 80}"#).port_redirect, 0);
        assert_eq!(
            red(r#"{"port": 8443, "scheme": "https"}"#).port_redirect,
            8443
        );
    }
}
