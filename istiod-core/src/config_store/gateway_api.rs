//! The Kubernetes Gateway API kinds (`gateway.networking.k8s.io`, v1 and the older versions
//! the CRDs still serve): GatewayClass, Gateway, HTTPRoute, GRPCRoute, TCPRoute, TLSRoute and
//! ReferenceGrant, as typed specs. What they mean for proxies is `crate::gateway_api`'s: it
//! translates them into Istio Gateways and VirtualServices, as istiod's gateway controller does.
//!
//! A Gateway API `Gateway` is keyed as kind `KubernetesGateway` (Istio's own name for it), so it
//! never collides with an Istio Gateway of the same name.

use serde::{Deserialize, Serialize};

use super::selector::LabelSelector;

/// The API group of the Gateway API.
pub const GROUP: &str = "gateway.networking.k8s.io";
/// The versions of that group read here (the CRDs serve v1; v1beta1/v1alpha2 are older names of
/// the same schemas).
pub const VERSIONS: &[&str] = &["v1", "v1beta1", "v1alpha2", "v1alpha3"];
/// The key kind of a Gateway API Gateway.
pub const GATEWAY_KIND: &str = "KubernetesGateway";

/// The kinds of the group this store reads.
pub fn is_kind(kind: &str) -> bool {
    matches!(
        kind,
        "GatewayClass"
            | "Gateway"
            | "HTTPRoute"
            | "GRPCRoute"
            | "TCPRoute"
            | "TLSRoute"
            | "ReferenceGrant"
    )
}

/// Whether `api_version` is of the Gateway API group.
pub fn in_group(api_version: Option<&str>) -> bool {
    api_version.is_some_and(|av| av.rsplit_once('/').is_some_and(|(g, _)| g == GROUP))
}

/// One Gateway API object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum GatewayApiObject {
    GatewayClass(GatewayClassSpec),
    Gateway(GatewaySpec),
    HttpRoute(HttpRouteSpec),
    /// GRPCRoute: matches on the gRPC service and method; otherwise an HTTPRoute's shape.
    GrpcRoute(GrpcRouteSpec),
    TcpRoute(L4RouteSpec),
    TlsRoute(L4RouteSpec),
    ReferenceGrant(ReferenceGrantSpec),
}

impl GatewayApiObject {
    /// The kind the object is keyed by.
    pub fn kind(&self) -> &'static str {
        match self {
            GatewayApiObject::GatewayClass(_) => "GatewayClass",
            GatewayApiObject::Gateway(_) => GATEWAY_KIND,
            GatewayApiObject::HttpRoute(_) => "HTTPRoute",
            GatewayApiObject::GrpcRoute(_) => "GRPCRoute",
            GatewayApiObject::TcpRoute(_) => "TCPRoute",
            GatewayApiObject::TlsRoute(_) => "TLSRoute",
            GatewayApiObject::ReferenceGrant(_) => "ReferenceGrant",
        }
    }

    /// The kind as written in a document.
    pub fn document_kind(&self) -> &'static str {
        match self {
            GatewayApiObject::Gateway(_) => "Gateway",
            other => other.kind(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassSpec {
    pub controller_name: String,
    #[serde(default)]
    pub description: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    pub gateway_class_name: String,
    #[serde(default)]
    pub listeners: Vec<Listener>,
    #[serde(default)]
    pub addresses: Vec<GatewayAddress>,
    #[serde(default)]
    pub infrastructure: Option<GatewayInfrastructure>,
}

/// What a Gateway asks of its deployment.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewayInfrastructure {
    /// Labels and annotations for every object deployed for the Gateway.
    pub labels: std::collections::BTreeMap<String, String>,
    pub annotations: std::collections::BTreeMap<String, String>,
    pub parameters_ref: Option<ParametersRef>,
}

/// A Gateway's implementation-specific parameters (Istio's: a ConfigMap).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ParametersRef {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewayAddress {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    /// Optional since Gateway API v1.3: without one the implementation picks the address.
    pub value: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    pub name: String,
    #[serde(default)]
    pub hostname: Option<String>,
    pub port: u16,
    pub protocol: String,
    #[serde(default)]
    pub tls: Option<ListenerTls>,
    #[serde(default)]
    pub allowed_routes: Option<AllowedRoutes>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ListenerTls {
    /// `Terminate` (the default) or `Passthrough`.
    pub mode: Option<String>,
    pub certificate_refs: Vec<ObjectRef>,
}

/// A reference to an object by group, kind, name and (optionally) namespace.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct AllowedRoutes {
    pub namespaces: Option<RouteNamespaces>,
    pub kinds: Vec<RouteGroupKind>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// `Same` (the default), `All` or `Selector`.
    pub from: Option<String>,
    pub selector: Option<LabelSelector>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    #[serde(default)]
    pub group: Option<String>,
    pub kind: String,
}

/// A route's parent: a Gateway (optionally one listener, by `sectionName` or `port`) or, for
/// the mesh (GAMMA), a Service.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default)]
    pub section_name: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
}

impl ParentRef {
    /// A Service parent (GAMMA): group `""` (core) and kind `Service`.
    pub fn is_service(&self) -> bool {
        self.kind.as_deref() == Some("Service") && self.group.as_deref().unwrap_or("").is_empty()
    }

    /// A Gateway parent (the default group and kind).
    pub fn is_gateway(&self) -> bool {
        self.kind.as_deref().unwrap_or("Gateway") == "Gateway"
            && self.group.as_deref().unwrap_or(GROUP) == GROUP
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteSpec {
    pub parent_refs: Vec<ParentRef>,
    pub hostnames: Vec<String>,
    pub rules: Vec<HttpRouteRule>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteRule {
    pub name: Option<String>,
    pub matches: Vec<HttpRouteMatch>,
    pub filters: Vec<HttpRouteFilter>,
    pub backend_refs: Vec<BackendRef>,
    pub timeouts: Option<HttpRouteTimeouts>,
    pub retry: Option<HttpRouteRetry>,
}

/// A rule's retries: on connection errors and on `codes`, `attempts` times (the
/// implementation's default when unset), `backoff` between them.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteRetry {
    pub codes: Vec<u32>,
    pub attempts: Option<i64>,
    pub backoff: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteMatch {
    pub path: Option<PathMatch>,
    pub headers: Vec<ValueMatch>,
    pub query_params: Vec<ValueMatch>,
    pub method: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct PathMatch {
    /// `Exact`, `PathPrefix` (the default) or `RegularExpression`.
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub value: Option<String>,
}

/// A header or query parameter match.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ValueMatch {
    /// `Exact` (the default) or `RegularExpression`.
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteFilter {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub request_header_modifier: Option<HeaderModifier>,
    #[serde(default)]
    pub response_header_modifier: Option<HeaderModifier>,
    #[serde(default)]
    pub request_redirect: Option<RequestRedirect>,
    #[serde(default)]
    pub url_rewrite: Option<UrlRewrite>,
    #[serde(default)]
    pub request_mirror: Option<RequestMirror>,
    #[serde(default)]
    pub cors: Option<CorsFilter>,
}

/// The CORS filter: origins (`*` wildcards), methods, headers, credentials, max age (seconds).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct CorsFilter {
    pub allow_origins: Vec<String>,
    pub allow_credentials: Option<bool>,
    pub allow_methods: Vec<String>,
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    pub max_age: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HeaderModifier {
    pub set: Vec<NameValue>,
    pub add: Vec<NameValue>,
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct NameValue {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct RequestRedirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<u16>,
    pub status_code: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct UrlRewrite {
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch`.
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub replace_full_path: Option<String>,
    #[serde(default)]
    pub replace_prefix_match: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RequestMirror {
    pub backend_ref: BackendRef,
    #[serde(default)]
    pub percent: Option<u32>,
    #[serde(default)]
    pub fraction: Option<Fraction>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct Fraction {
    pub numerator: u32,
    #[serde(default)]
    pub denominator: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub filters: Vec<HttpRouteFilter>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteTimeouts {
    pub request: Option<String>,
    pub backend_request: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcRouteSpec {
    pub parent_refs: Vec<ParentRef>,
    pub hostnames: Vec<String>,
    pub rules: Vec<GrpcRouteRule>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcRouteRule {
    pub matches: Vec<GrpcRouteMatch>,
    pub filters: Vec<HttpRouteFilter>,
    pub backend_refs: Vec<BackendRef>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcRouteMatch {
    pub method: Option<GrpcMethodMatch>,
    pub headers: Vec<ValueMatch>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcMethodMatch {
    /// `Exact` (the default) or `RegularExpression`.
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub service: Option<String>,
    pub method: Option<String>,
}

/// TCPRoute and TLSRoute: parents, (TLS) SNI hostnames and backends.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct L4RouteSpec {
    pub parent_refs: Vec<ParentRef>,
    pub hostnames: Vec<String>,
    pub rules: Vec<L4RouteRule>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct L4RouteRule {
    pub backend_refs: Vec<BackendRef>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct ReferenceGrantSpec {
    pub from: Vec<GrantFrom>,
    pub to: Vec<GrantTo>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct GrantFrom {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct GrantTo {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
}

/// Parses the spec of Gateway API kind `kind`, naming what is wrong.
pub fn parse(kind: &str, spec: serde_json::Value) -> Result<GatewayApiObject, String> {
    fn typed<T: serde::de::DeserializeOwned>(spec: serde_json::Value) -> Result<T, String> {
        serde_json::from_value(spec).map_err(|e| e.to_string())
    }
    let object = match kind {
        "GatewayClass" => GatewayApiObject::GatewayClass(typed(spec)?),
        "Gateway" => {
            let g: GatewaySpec = typed(spec)?;
            validate_gateway(&g)?;
            GatewayApiObject::Gateway(g)
        }
        "HTTPRoute" => {
            let r: HttpRouteSpec = typed(spec)?;
            for (i, rule) in r.rules.iter().enumerate() {
                validate_rule(i, &rule.matches, &rule.filters)?;
            }
            GatewayApiObject::HttpRoute(r)
        }
        "GRPCRoute" => GatewayApiObject::GrpcRoute(typed(spec)?),
        "TCPRoute" => GatewayApiObject::TcpRoute(typed(spec)?),
        "TLSRoute" => GatewayApiObject::TlsRoute(typed(spec)?),
        "ReferenceGrant" => GatewayApiObject::ReferenceGrant(typed(spec)?),
        other => return Err(format!("unsupported Gateway API kind {other:?}")),
    };
    Ok(object)
}

fn validate_gateway(g: &GatewaySpec) -> Result<(), String> {
    if g.gateway_class_name.is_empty() {
        return Err("spec.gatewayClassName: required".into());
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, l) in g.listeners.iter().enumerate() {
        if !names.insert(l.name.as_str()) {
            return Err(format!(
                "spec.listeners[{i}].name: {:?} names two listeners",
                l.name
            ));
        }
        if l.port == 0 {
            return Err(format!("spec.listeners[{i}].port: must be 1 to 65535"));
        }
    }
    Ok(())
}

fn validate_rule(
    i: usize,
    matches: &[HttpRouteMatch],
    filters: &[HttpRouteFilter],
) -> Result<(), String> {
    for (j, m) in matches.iter().enumerate() {
        if let Some(p) = &m.path {
            let t = p.type_.as_deref().unwrap_or("PathPrefix");
            let v = p.value.as_deref().unwrap_or("/");
            if !matches!(t, "Exact" | "PathPrefix" | "RegularExpression") {
                return Err(format!(
                    "spec.rules[{i}].matches[{j}].path.type: {t:?} is not Exact, PathPrefix or RegularExpression"
                ));
            }
            if t != "RegularExpression" && !v.starts_with('/') {
                return Err(format!(
                    "spec.rules[{i}].matches[{j}].path.value: {v:?} must start with /"
                ));
            }
        }
    }
    for (j, f) in filters.iter().enumerate() {
        let present = match f.type_.as_str() {
            "RequestHeaderModifier" => f.request_header_modifier.is_some(),
            "ResponseHeaderModifier" => f.response_header_modifier.is_some(),
            "RequestRedirect" => f.request_redirect.is_some(),
            "URLRewrite" => f.url_rewrite.is_some(),
            "RequestMirror" => f.request_mirror.is_some(),
            "CORS" => f.cors.is_some(),
            _ => true,
        };
        if !present {
            return Err(format!(
                "spec.rules[{i}].filters[{j}]: type {} without its field",
                f.type_
            ));
        }
    }
    Ok(())
}
