//! networking.istio.io VirtualService, typed field by field (istio/api
//! `networking/v1alpha3/virtual_service.proto`) and checked as Istio's
//! `pkg/config/validation` checks it, each error naming the field
//! (`http[2].retries.perTryTimeout`). Values are checked as they are read (durations,
//! percentages, ports, regexes), so the route generator never meets an unchecked one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::values::{GoDuration, Percent, Port, StringMatch};

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct VirtualServiceSpec {
    pub hosts: Vec<String>,
    pub gateways: Vec<String>,
    pub http: Vec<HttpRoute>,
    pub tcp: Vec<TcpRoute>,
    pub tls: Vec<TlsRoute>,
    pub export_to: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRoute {
    pub name: Option<String>,
    #[serde(rename = "match")]
    pub matches: Vec<HttpMatch>,
    pub route: Vec<HttpRouteDestination>,
    pub redirect: Option<HttpRedirect>,
    pub direct_response: Option<DirectResponse>,
    pub delegate: Option<Delegate>,
    pub rewrite: Option<HttpRewrite>,
    pub timeout: Option<GoDuration>,
    pub retries: Option<HttpRetry>,
    pub fault: Option<HttpFault>,
    pub mirror: Option<Destination>,
    pub mirror_percentage: Option<Percent>,
    /// Deprecated integer form of mirrorPercentage.
    pub mirror_percent: Option<u32>,
    pub mirrors: Vec<HttpMirror>,
    pub cors_policy: Option<CorsPolicy>,
    pub headers: Option<Headers>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpMatch {
    pub name: Option<String>,
    pub uri: Option<StringMatch>,
    pub scheme: Option<StringMatch>,
    pub method: Option<StringMatch>,
    pub authority: Option<StringMatch>,
    pub headers: BTreeMap<String, StringMatch>,
    pub port: Option<Port>,
    pub source_labels: BTreeMap<String, String>,
    pub gateways: Vec<String>,
    pub query_params: BTreeMap<String, StringMatch>,
    pub ignore_uri_case: bool,
    pub without_headers: BTreeMap<String, StringMatch>,
    pub source_namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct HttpRouteDestination {
    pub destination: Destination,
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub headers: Option<Headers>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct Destination {
    pub host: String,
    pub subset: Option<String>,
    pub port: Option<PortSelector>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
pub struct PortSelector {
    pub number: Port,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRedirect {
    pub uri: Option<String>,
    pub authority: Option<String>,
    pub port: Option<Port>,
    pub derive_port: Option<String>,
    /// Replaces the matched prefix of the path (the Gateway API's `ReplacePrefixMatch`).
    pub prefix_rewrite: Option<String>,
    pub scheme: Option<String>,
    pub redirect_code: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct DirectResponse {
    pub status: u32,
    #[serde(default)]
    pub body: Option<HttpBody>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct HttpBody {
    pub string: Option<String>,
    /// Base64, as protobuf's JSON form of bytes.
    pub bytes: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct Delegate {
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRewrite {
    pub uri: Option<String>,
    pub authority: Option<String>,
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct RegexRewrite {
    #[serde(rename = "match")]
    pub pattern: String,
    #[serde(default)]
    pub rewrite: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRetry {
    pub attempts: i64,
    pub per_try_timeout: Option<GoDuration>,
    pub retry_on: Option<String>,
    pub retry_remote_localities: Option<bool>,
    /// The base interval of the exponential back-off between retries.
    pub backoff: Option<GoDuration>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct HttpFault {
    pub delay: Option<FaultDelay>,
    pub abort: Option<FaultAbort>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct FaultDelay {
    pub fixed_delay: Option<GoDuration>,
    pub percentage: Option<Percent>,
    /// Deprecated integer form of percentage.
    pub percent: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct FaultAbort {
    pub http_status: Option<u32>,
    pub grpc_status: Option<String>,
    pub percentage: Option<Percent>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct HttpMirror {
    pub destination: Destination,
    #[serde(default)]
    pub percentage: Option<Percent>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct CorsPolicy {
    pub allow_origins: Vec<StringMatch>,
    /// Deprecated exact-origin list.
    pub allow_origin: Vec<String>,
    pub allow_methods: Vec<String>,
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    pub max_age: Option<GoDuration>,
    pub allow_credentials: Option<bool>,
    pub unmatched_preflights: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct Headers {
    pub request: Option<HeaderOperations>,
    pub response: Option<HeaderOperations>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct HeaderOperations {
    pub set: BTreeMap<String, String>,
    pub add: BTreeMap<String, String>,
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct TcpRoute {
    #[serde(rename = "match")]
    pub matches: Vec<L4Match>,
    pub route: Vec<RouteDestination>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct TlsRoute {
    #[serde(rename = "match")]
    pub matches: Vec<TlsMatch>,
    pub route: Vec<RouteDestination>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct L4Match {
    pub destination_subnets: Vec<String>,
    pub port: Option<Port>,
    pub source_labels: BTreeMap<String, String>,
    pub gateways: Vec<String>,
    pub source_namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct TlsMatch {
    pub sni_hosts: Vec<String>,
    pub destination_subnets: Vec<String>,
    pub port: Option<Port>,
    pub source_labels: BTreeMap<String, String>,
    pub gateways: Vec<String>,
    pub source_namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct RouteDestination {
    pub destination: Destination,
    #[serde(default)]
    pub weight: Option<u32>,
}

/// The gateway name every sidecar answers to.
pub const MESH_GATEWAY: &str = "mesh";

fn check_destination(field: &str, d: &Destination) -> Result<(), String> {
    if d.host.is_empty() {
        return Err(format!("{field}.host: a destination host is required"));
    }
    if d.host.contains('*') {
        return Err(format!(
            "{field}.host: {:?}: a destination must name one host, not a wildcard",
            d.host
        ));
    }
    if let Some(subset) = &d.subset
        && !super::traffic::is_dns1123_label(subset)
    {
        return Err(format!(
            "{field}.subset: {subset:?} is not a valid subset name (DNS-1123 label)"
        ));
    }
    Ok(())
}

/// Weights are percentages in Istio's API; since 1.20 they need not add up to 100 (each
/// destination gets weight / total), but with several destinations they must not all be 0.
fn check_weights<'a>(
    field: &str,
    weights: impl Iterator<Item = Option<u32>> + Clone + 'a,
) -> Result<(), String> {
    let count = weights.clone().count();
    let total: u64 = weights.map(|w| u64::from(w.unwrap_or(0))).sum();
    if count > 1 && total == 0 {
        return Err(format!(
            "{field}: with several destinations, the weights must not all be zero"
        ));
    }
    if total > u64::from(u32::MAX) {
        return Err(format!(
            "{field}: the weights add up to more than {}",
            u32::MAX
        ));
    }
    Ok(())
}

fn check_headers(field: &str, h: &Headers) -> Result<(), String> {
    for (dir, ops) in [("request", &h.request), ("response", &h.response)] {
        let Some(ops) = ops else { continue };
        let names = ops
            .set
            .keys()
            .chain(ops.add.keys())
            .chain(ops.remove.iter());
        for name in names {
            // `:authority` (or `host`) set here rewrites the authority, as in Istio; no other
            // pseudo-header can be changed.
            let plain = name
                .strip_prefix(':')
                .is_none_or(|p| p.eq_ignore_ascii_case("authority"));
            let token = name.trim_start_matches(':');
            if token.is_empty()
                || !plain
                || !token.bytes().all(|b| b.is_ascii_graphic() && b != b':')
            {
                return Err(format!(
                    "{field}.{dir}: {name:?} is not a header name that can be changed"
                ));
            }
        }
    }
    Ok(())
}

fn check_match(at: &str, m: &HttpMatch) -> Result<(), String> {
    for (name, sm) in [
        ("uri", &m.uri),
        ("scheme", &m.scheme),
        ("method", &m.method),
        ("authority", &m.authority),
    ] {
        if let Some(sm) = sm {
            sm.check(&format!("{at}.{name}"))?;
        }
    }
    for (kind, map) in [
        ("headers", &m.headers),
        ("queryParams", &m.query_params),
        ("withoutHeaders", &m.without_headers),
    ] {
        for (k, sm) in map {
            if k.is_empty() {
                return Err(format!("{at}.{kind}: a name must not be empty"));
            }
            sm.check(&format!("{at}.{kind}.{k}"))?;
        }
    }
    for k in m.headers.keys() {
        if k.starts_with(':')
            && !matches!(k.as_str(), ":method" | ":path" | ":authority" | ":scheme")
        {
            return Err(format!(
                "{at}.headers.{k}: not a pseudo-header Envoy matches"
            ));
        }
    }
    Ok(())
}

fn check_http_route(at: &str, r: &HttpRoute) -> Result<(), String> {
    check_one_action(at, r)?;
    for (i, m) in r.matches.iter().enumerate() {
        check_match(&format!("{at}.match[{i}]"), m)?;
    }
    for (i, d) in r.route.iter().enumerate() {
        check_destination(&format!("{at}.route[{i}].destination"), &d.destination)?;
        if let Some(h) = &d.headers {
            check_headers(&format!("{at}.route[{i}].headers"), h)?;
        }
    }
    check_weights(&format!("{at}.route"), r.route.iter().map(|d| d.weight))?;
    if let Some(rw) = &r.rewrite {
        check_rewrite(at, rw, r.redirect.is_some())?;
    }
    if let Some(red) = &r.redirect {
        check_redirect(at, red)?;
    }
    if let Some(dr) = &r.direct_response {
        check_direct_response(at, dr)?;
    }
    if let Some(retry) = &r.retries {
        check_retries(at, retry)?;
    }
    if let Some(fault) = &r.fault {
        check_fault(at, fault)?;
    }
    check_mirrors(at, r)?;
    if let Some(h) = &r.headers {
        check_headers(&format!("{at}.headers"), h)?;
    }
    if let Some(c) = &r.cors_policy {
        check_cors(at, c)?;
    }
    Ok(())
}

/// Exactly one of route, redirect, directResponse and delegate.
fn check_one_action(at: &str, r: &HttpRoute) -> Result<(), String> {
    let actions = [
        !r.route.is_empty(),
        r.redirect.is_some(),
        r.direct_response.is_some(),
        r.delegate.is_some(),
    ];
    match actions.iter().filter(|a| **a).count() {
        0 => {
            return Err(format!(
                "{at}: one of route, redirect, directResponse or delegate is required"
            ));
        }
        1 => {}
        _ => {
            return Err(format!(
                "{at}: route, redirect, directResponse and delegate exclude each other"
            ));
        }
    }
    Ok(())
}

fn check_rewrite(at: &str, rw: &HttpRewrite, redirects: bool) -> Result<(), String> {
    if redirects {
        return Err(format!("{at}.rewrite: a redirect route cannot rewrite"));
    }
    if rw.uri.is_some() && rw.uri_regex_rewrite.is_some() {
        return Err(format!(
            "{at}.rewrite: uri and uriRegexRewrite exclude each other"
        ));
    }
    if let Some(re) = &rw.uri_regex_rewrite {
        mesh_common::re2::check_regex(&format!("{at}.rewrite.uriRegexRewrite.match"), &re.pattern)?;
    }
    Ok(())
}

fn check_redirect(at: &str, red: &HttpRedirect) -> Result<(), String> {
    if red.uri.is_some() && red.prefix_rewrite.is_some() {
        return Err(format!(
            "{at}.redirect: uri and prefixRewrite exclude each other"
        ));
    }
    if red.port.is_some() && red.derive_port.is_some() {
        return Err(format!(
            "{at}.redirect: port and derivePort exclude each other"
        ));
    }
    if let Some(dp) = &red.derive_port
        && dp != "FROM_PROTOCOL_DEFAULT"
        && dp != "FROM_REQUEST_PORT"
    {
        return Err(format!(
            "{at}.redirect.derivePort: {dp:?} is not FROM_PROTOCOL_DEFAULT or FROM_REQUEST_PORT"
        ));
    }
    if let Some(code) = red.redirect_code
        && !matches!(code, 301 | 302 | 303 | 307 | 308)
    {
        return Err(format!(
            "{at}.redirect.redirectCode: {code} is not 301, 302, 303, 307 or 308"
        ));
    }
    Ok(())
}

fn check_direct_response(at: &str, dr: &DirectResponse) -> Result<(), String> {
    if !(200..=599).contains(&dr.status) {
        return Err(format!(
            "{at}.directResponse.status: {} is not an HTTP status (200-599)",
            dr.status
        ));
    }
    if let Some(body) = &dr.body {
        match (&body.string, &body.bytes) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{at}.directResponse.body: string and bytes exclude each other"
                ));
            }
            (_, Some(b)) if base64_decode(b).is_none() => {
                return Err(format!("{at}.directResponse.body.bytes: not base64"));
            }
            _ => {}
        }
        let len = body.string.as_ref().map_or(0, String::len)
            + body.bytes.as_ref().map_or(0, String::len);
        if len > 1 << 20 {
            return Err(format!("{at}.directResponse.body: larger than 1 MiB"));
        }
    }
    Ok(())
}

fn check_retries(at: &str, retry: &HttpRetry) -> Result<(), String> {
    if retry.attempts < 0 {
        return Err(format!(
            "{at}.retries.attempts: {} must not be negative",
            retry.attempts
        ));
    }
    if retry.attempts > i64::from(u32::MAX) {
        return Err(format!(
            "{at}.retries.attempts: {} is too many",
            retry.attempts
        ));
    }
    if let Some(on) = &retry.retry_on {
        for (j, token) in on.split(',').map(str::trim).enumerate() {
            if !retry_on_token_ok(token) {
                return Err(format!(
                    "{at}.retries.retryOn: {token:?} (item {j}) is not an Envoy retry condition or an HTTP status"
                ));
            }
        }
    }
    if retry
        .per_try_timeout
        .as_ref()
        .is_some_and(|t| t.value.is_zero())
    {
        return Err(format!(
            "{at}.retries.perTryTimeout: must be greater than 0"
        ));
    }
    Ok(())
}

fn check_fault(at: &str, fault: &HttpFault) -> Result<(), String> {
    if fault.delay.is_none() && fault.abort.is_none() {
        return Err(format!("{at}.fault: delay or abort is required"));
    }
    if let Some(d) = &fault.delay {
        if d.fixed_delay.is_none() {
            return Err(format!("{at}.fault.delay.fixedDelay: required"));
        }
        if d.percent.is_some_and(|p| p > 100) {
            return Err(format!("{at}.fault.delay.percent: must be 0-100"));
        }
    }
    if let Some(a) = &fault.abort {
        match (a.http_status, &a.grpc_status) {
            (Some(s), None) if (200..=599).contains(&s) => {}
            (Some(s), None) => {
                return Err(format!(
                    "{at}.fault.abort.httpStatus: {s} is not an HTTP status (200-599)"
                ));
            }
            (None, Some(g)) if grpc_status_code(g).is_some() => {}
            (None, Some(g)) => {
                return Err(format!(
                    "{at}.fault.abort.grpcStatus: {g:?} is not a gRPC status name"
                ));
            }
            _ => {
                return Err(format!(
                    "{at}.fault.abort: exactly one of httpStatus or grpcStatus is required"
                ));
            }
        }
    }
    Ok(())
}

/// mirror or mirrors (not both), each a valid destination, and mirrorPercent 0-100.
fn check_mirrors(at: &str, r: &HttpRoute) -> Result<(), String> {
    if r.mirror.is_some() && !r.mirrors.is_empty() {
        return Err(format!("{at}: mirror and mirrors exclude each other"));
    }
    if let Some(m) = &r.mirror {
        check_destination(&format!("{at}.mirror"), m)?;
    }
    if r.mirror_percent.is_some_and(|p| p > 100) {
        return Err(format!("{at}.mirrorPercent: must be 0-100"));
    }
    for (i, m) in r.mirrors.iter().enumerate() {
        check_destination(&format!("{at}.mirrors[{i}].destination"), &m.destination)?;
    }
    Ok(())
}

fn check_cors(at: &str, c: &CorsPolicy) -> Result<(), String> {
    for (i, o) in c.allow_origins.iter().enumerate() {
        o.check(&format!("{at}.corsPolicy.allowOrigins[{i}]"))?;
    }
    if let Some(u) = &c.unmatched_preflights
        && !matches!(u.as_str(), "UNSPECIFIED" | "FORWARD" | "IGNORE")
    {
        return Err(format!(
            "{at}.corsPolicy.unmatchedPreflights: {u:?} is not FORWARD or IGNORE"
        ));
    }
    Ok(())
}

/// Envoy's `retry_on` conditions (router filter) and bare HTTP status codes, as Istio accepts.
fn retry_on_token_ok(token: &str) -> bool {
    const CONDITIONS: &[&str] = &[
        "5xx",
        "gateway-error",
        "reset",
        "reset-before-request",
        "connect-failure",
        "envoy-ratelimited",
        "retriable-4xx",
        "refused-stream",
        "retriable-status-codes",
        "retriable-headers",
        "http3-post-connect-failure",
        "cancelled",
        "deadline-exceeded",
        "internal",
        "resource-exhausted",
        "unavailable",
    ];
    CONDITIONS.contains(&token) || token.parse::<u16>().is_ok_and(|c| (100..=599).contains(&c))
}

/// gRPC status names (google.rpc.Code), as Istio's `grpcStatus` takes them.
pub fn grpc_status_code(name: &str) -> Option<u32> {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES.iter().position(|n| *n == name).map(|i| i as u32)
}

/// Protobuf JSON bytes: standard or URL-safe base64, padding optional.
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for b in s.bytes().filter(|b| !b.is_ascii_whitespace()) {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => continue,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

fn check_l4_route(at: &str, routes: &[RouteDestination]) -> Result<(), String> {
    if routes.is_empty() {
        return Err(format!("{at}.route: at least one destination is required"));
    }
    for (i, d) in routes.iter().enumerate() {
        check_destination(&format!("{at}.route[{i}].destination"), &d.destination)?;
    }
    check_weights(&format!("{at}.route"), routes.iter().map(|d| d.weight))
}

fn check_subnet(field: &str, s: &str) -> Result<(), String> {
    let (ip, len) = s.split_once('/').unwrap_or((s, ""));
    let ip: std::net::IpAddr = ip
        .parse()
        .map_err(|_| format!("{field}: {s:?} is not an IP address or CIDR"))?;
    if !len.is_empty() {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if !len.parse::<u8>().is_ok_and(|l| l <= max) {
            return Err(format!("{field}: {s:?} has a bad prefix length"));
        }
    }
    Ok(())
}

pub fn validate_virtual_service(spec: &VirtualServiceSpec) -> Result<(), String> {
    if spec.hosts.is_empty() && !spec.gateways.is_empty() {
        return Err("gateways: a delegate VirtualService (no hosts) must not name gateways".into());
    }
    for (i, h) in spec.hosts.iter().enumerate() {
        if h.is_empty() {
            return Err(format!("hosts[{i}]: must not be empty"));
        }
        if h.contains('/') {
            return Err(format!(
                "hosts[{i}]: {h:?} is a host name, not namespace/host"
            ));
        }
        if h == "*" && spec.gateways.iter().all(|g| g == MESH_GATEWAY) {
            return Err(format!(
                "hosts[{i}]: \"*\" is only allowed for gateways (a sidecar route must name its hosts)"
            ));
        }
    }
    if spec.http.is_empty() && spec.tcp.is_empty() && spec.tls.is_empty() {
        return Err("http, tcp or tls: at least one route is required".into());
    }
    if spec.hosts.is_empty() && (!spec.tcp.is_empty() || !spec.tls.is_empty()) {
        return Err("tcp, tls: a delegate VirtualService (no hosts) takes http routes only".into());
    }
    for (i, r) in spec.http.iter().enumerate() {
        let at = format!("http[{i}]");
        check_http_route(&at, r)?;
        if r.delegate.is_some() && spec.hosts.is_empty() {
            return Err(format!(
                "{at}.delegate: a delegate VirtualService cannot delegate again"
            ));
        }
    }
    for (i, r) in spec.tcp.iter().enumerate() {
        let at = format!("tcp[{i}]");
        check_l4_route(&at, &r.route)?;
        for (j, m) in r.matches.iter().enumerate() {
            for (k, s) in m.destination_subnets.iter().enumerate() {
                check_subnet(&format!("{at}.match[{j}].destinationSubnets[{k}]"), s)?;
            }
        }
    }
    for (i, r) in spec.tls.iter().enumerate() {
        let at = format!("tls[{i}]");
        check_l4_route(&at, &r.route)?;
        if r.matches.is_empty() || r.matches.iter().any(|m| m.sni_hosts.is_empty()) {
            return Err(format!("{at}.match: every TLS match needs sniHosts"));
        }
        for (j, m) in r.matches.iter().enumerate() {
            for (k, s) in m.destination_subnets.iter().enumerate() {
                check_subnet(&format!("{at}.match[{j}].destinationSubnets[{k}]"), s)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_forms() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert!(base64_decode("a$").is_none());
    }

    #[test]
    fn retry_on_tokens() {
        assert!(retry_on_token_ok("gateway-error"));
        assert!(retry_on_token_ok("503"));
        assert!(!retry_on_token_ok("sometimes"));
        assert!(!retry_on_token_ok("9999"));
    }
}
