//! Routes (HTTP, GRPC, TCP, TLS) as VirtualService entries: matches in the Gateway API's order
//! of precedence, filters as Istio's actions, backends with their weights.

use serde_json::{Value, json};

use crate::config_store::gateway_api::{
    GatewayApiObject, HttpRouteMatch, HttpRouteRule, L4RouteSpec, ParentRef, ValueMatch,
};

use super::world::*;

impl Route<'_> {
    pub(super) fn meta_ns(&self) -> String {
        self.meta.namespace().to_string()
    }

    pub(super) fn kind(&self) -> &'static str {
        self.object.kind()
    }

    pub(super) fn parents(&self) -> &[ParentRef] {
        match self.object {
            GatewayApiObject::HttpRoute(r) => &r.parent_refs,
            GatewayApiObject::GrpcRoute(r) => &r.parent_refs,
            GatewayApiObject::TcpRoute(r) | GatewayApiObject::TlsRoute(r) => &r.parent_refs,
            _ => &[],
        }
    }

    pub(super) fn hostnames(&self) -> &[String] {
        match self.object {
            GatewayApiObject::HttpRoute(r) => &r.hostnames,
            GatewayApiObject::GrpcRoute(r) => &r.hostnames,
            GatewayApiObject::TlsRoute(r) => &r.hostnames,
            _ => &[],
        }
    }

    /// The route's rules as ordered Istio http routes (one per match).
    pub(super) fn http_entries(
        &self,
        world: &World,
        order: usize,
        port: Option<u16>,
    ) -> Vec<Entry> {
        let mut out = Vec::new();
        let ns = self.meta_ns();
        match self.object {
            GatewayApiObject::HttpRoute(r) => {
                for (i, rule) in r.rules.iter().enumerate() {
                    let matches = if rule.matches.is_empty() {
                        vec![HttpRouteMatch::default()]
                    } else {
                        rule.matches.clone()
                    };
                    for m in &matches {
                        for (uri, exact_part) in path_matches(m) {
                            let mut route = http_action(world, &ns, self.kind(), rule, exact_part);
                            let mut istio_match = match_of(m, uri);
                            if let Some(p) = port {
                                istio_match["port"] = json!(p);
                            }
                            route["match"] = json!([istio_match]);
                            out.push(Entry {
                                key: precedence(m, order, i),
                                route,
                            });
                        }
                    }
                }
            }
            GatewayApiObject::GrpcRoute(r) => {
                for (i, rule) in r.rules.iter().enumerate() {
                    let http_rule = HttpRouteRule {
                        filters: rule.filters.clone(),
                        backend_refs: rule.backend_refs.clone(),
                        ..Default::default()
                    };
                    let matches = if rule.matches.is_empty() {
                        vec![Default::default()]
                    } else {
                        rule.matches.clone()
                    };
                    for m in &matches {
                        let mut route = http_action(world, &ns, self.kind(), &http_rule, false);
                        let uri = m.method.as_ref().map(|mm| {
                            let svc = mm.service.as_deref().unwrap_or("");
                            let method = mm.method.as_deref().unwrap_or("");
                            if mm.type_.as_deref() == Some("RegularExpression") {
                                let s = if svc.is_empty() { "[^/]+" } else { svc };
                                let m = if method.is_empty() { "[^/]+" } else { method };
                                json!({"regex": format!("/{s}/{m}")})
                            } else if method.is_empty() {
                                json!({"prefix": format!("/{svc}/")})
                            } else if svc.is_empty() {
                                json!({"regex": format!("/[^/]+/{}", regex_escape(method))})
                            } else {
                                json!({"exact": format!("/{svc}/{method}")})
                            }
                        });
                        let hm = HttpRouteMatch {
                            headers: m.headers.clone(),
                            ..Default::default()
                        };
                        let mut istio_match = match_of(&hm, uri);
                        if let Some(p) = port {
                            istio_match["port"] = json!(p);
                        }
                        route["match"] = json!([istio_match]);
                        let exact = m.method.as_ref().is_some_and(|mm| {
                            mm.method.is_some() && mm.type_.as_deref() != Some("RegularExpression")
                        });
                        let key = (
                            if exact { 0 } else { 1 },
                            usize::MAX,
                            0,
                            usize::MAX - m.headers.len(),
                            usize::MAX,
                            order,
                            i,
                        );
                        out.push(Entry { key, route });
                    }
                }
            }
            _ => {}
        }
        out
    }
}

/// An Istio http route and where it sorts.
pub(super) struct Entry {
    pub(super) key: (u8, usize, u8, usize, usize, usize, usize),
    pub(super) route: Value,
}

/// The Gateway API's order of matches: exact path first, then the longest prefix, a method,
/// the most header matches, the most query matches; then route order and rule order.
pub(super) fn precedence(
    m: &HttpRouteMatch,
    order: usize,
    rule: usize,
) -> (u8, usize, u8, usize, usize, usize, usize) {
    let (kind, len) = match &m.path {
        Some(p) => {
            let v = p.value.as_deref().unwrap_or("/");
            match p.type_.as_deref() {
                Some("Exact") => (0, v.len()),
                Some("RegularExpression") => (1, v.len()),
                _ => (2, v.len()),
            }
        }
        None => (2, 1),
    };
    (
        kind,
        usize::MAX - len,
        if m.method.is_some() { 0 } else { 1 },
        usize::MAX - m.headers.len(),
        usize::MAX - m.query_params.len(),
        order,
        rule,
    )
}

/// The Istio URI matches of a Gateway API path match: a prefix matches whole path segments, so
/// `/foo` is `exact /foo` or `prefix /foo/`. Each with whether it is the exact half of a prefix.
pub(super) fn path_matches(m: &HttpRouteMatch) -> Vec<(Option<Value>, bool)> {
    let Some(p) = &m.path else {
        return vec![(Some(json!({"prefix": "/"})), false)];
    };
    let v = p.value.clone().unwrap_or_else(|| "/".into());
    match p.type_.as_deref() {
        Some("Exact") => vec![(Some(json!({"exact": v})), false)],
        Some("RegularExpression") => vec![(Some(json!({"regex": v})), false)],
        _ => {
            let trimmed = v.trim_end_matches('/');
            if trimmed.is_empty() {
                vec![(Some(json!({"prefix": "/"})), false)]
            } else {
                vec![
                    (Some(json!({"exact": trimmed})), true),
                    (Some(json!({"prefix": format!("{trimmed}/")})), false),
                ]
            }
        }
    }
}

pub(super) fn string_match(v: &ValueMatch) -> Value {
    if v.type_.as_deref() == Some("RegularExpression") {
        json!({"regex": v.value})
    } else {
        json!({"exact": v.value})
    }
}

/// The Istio HTTPMatchRequest of a Gateway API match with URI match `uri`.
pub(super) fn match_of(m: &HttpRouteMatch, uri: Option<Value>) -> Value {
    let mut out = json!({});
    if let Some(u) = uri {
        out["uri"] = u;
    }
    if !m.headers.is_empty() {
        let h: serde_json::Map<String, Value> = m
            .headers
            .iter()
            .map(|h| (h.name.to_lowercase(), string_match(h)))
            .collect();
        out["headers"] = Value::Object(h);
    }
    if !m.query_params.is_empty() {
        let q: serde_json::Map<String, Value> = m
            .query_params
            .iter()
            .map(|q| (q.name.clone(), string_match(q)))
            .collect();
        out["queryParams"] = Value::Object(q);
    }
    if let Some(method) = &m.method {
        out["method"] = json!({"exact": method});
    }
    out
}

pub(super) fn header_ops(h: &crate::config_store::gateway_api::HeaderModifier) -> Value {
    let set: serde_json::Map<String, Value> = h
        .set
        .iter()
        .map(|nv| (nv.name.to_lowercase(), json!(nv.value)))
        .collect();
    let add: serde_json::Map<String, Value> = h
        .add
        .iter()
        .map(|nv| (nv.name.to_lowercase(), json!(nv.value)))
        .collect();
    json!({"set": set, "add": add, "remove": h.remove.iter().map(|r| r.to_lowercase()).collect::<Vec<_>>()})
}

/// What a rule does (everything of an Istio http route but its match). `exact_half`: the route
/// is the exact half of a split prefix match (a prefix rewrite then replaces the whole path).
pub(super) fn http_action(
    world: &World,
    ns: &str,
    kind: &str,
    rule: &HttpRouteRule,
    exact_half: bool,
) -> Value {
    let mut route = json!({});
    let mut request_headers: Option<Value> = None;
    let mut response_headers: Option<Value> = None;
    let mut unsupported = false;
    for f in &rule.filters {
        match f.type_.as_str() {
            "RequestHeaderModifier" => {
                request_headers = f.request_header_modifier.as_ref().map(header_ops)
            }
            "ResponseHeaderModifier" => {
                response_headers = f.response_header_modifier.as_ref().map(header_ops)
            }
            "RequestRedirect" => {
                let Some(r) = &f.request_redirect else {
                    continue;
                };
                let mut redirect = json!({});
                if let Some(s) = &r.scheme {
                    redirect["scheme"] = json!(s);
                }
                if let Some(h) = &r.hostname {
                    redirect["authority"] = json!(h);
                }
                // No port: the scheme's default port when the scheme changes, else the
                // request's (the API's rule; Istio's derivePort).
                match r.port {
                    Some(p) => redirect["port"] = json!(p),
                    None if r.scheme.is_some() => {
                        redirect["derivePort"] = json!("FROM_PROTOCOL_DEFAULT")
                    }
                    None => redirect["derivePort"] = json!("FROM_REQUEST_PORT"),
                }
                if let Some(p) = &r.path {
                    if let Some(full) = &p.replace_full_path {
                        redirect["uri"] = json!(full);
                    } else if let Some(prefix) = &p.replace_prefix_match {
                        redirect["prefixRewrite"] = json!(prefix_replacement(prefix, exact_half));
                    }
                }
                redirect["redirectCode"] = json!(r.status_code.unwrap_or(302));
                route["redirect"] = redirect;
            }
            "URLRewrite" => {
                let Some(r) = &f.url_rewrite else { continue };
                let mut rewrite = json!({});
                if let Some(h) = &r.hostname {
                    rewrite["authority"] = json!(h);
                }
                if let Some(p) = &r.path {
                    if let Some(full) = &p.replace_full_path {
                        rewrite["uriRegexRewrite"] = json!({"match": "/.*", "rewrite": full});
                    } else if let Some(prefix) = &p.replace_prefix_match {
                        rewrite["uri"] = json!(prefix_replacement(prefix, exact_half));
                    }
                }
                route["rewrite"] = rewrite;
            }
            "RequestMirror" => {
                let Some(m) = &f.request_mirror else { continue };
                if let Ok(dest) = world.destination(ns, kind, &m.backend_ref) {
                    let mut mirror = json!({"destination": dest});
                    let pct = match (&m.fraction, m.percent) {
                        (Some(fr), _) => Some(
                            100.0 * f64::from(fr.numerator)
                                / f64::from(fr.denominator.unwrap_or(100).max(1)),
                        ),
                        (None, Some(p)) => Some(f64::from(p)),
                        _ => None,
                    };
                    if let Some(p) = pct {
                        mirror["percentage"] = json!({"value": p});
                    }
                    match route["mirrors"].as_array_mut() {
                        Some(all) => all.push(mirror),
                        None => route["mirrors"] = json!([mirror]),
                    }
                }
            }
            "CORS" => {
                if let Some(c) = &f.cors {
                    route["corsPolicy"] = cors_policy(c);
                }
            }
            _ => unsupported = true,
        }
    }
    if request_headers.is_some() || response_headers.is_some() {
        let mut h = json!({});
        if let Some(r) = request_headers {
            h["request"] = r;
        }
        if let Some(r) = response_headers {
            h["response"] = r;
        }
        route["headers"] = h;
    }
    if let Some(r) = &rule.retry {
        // Connection errors are always retried, and the codes listed (Istio's translation).
        let attempts = r.attempts.unwrap_or(2);
        let mut retries = json!({"attempts": attempts});
        if attempts > 0 {
            let on: Vec<String> = [
                "connect-failure",
                "refused-stream",
                "unavailable",
                "cancelled",
            ]
            .into_iter()
            .map(String::from)
            .chain(r.codes.iter().map(u32::to_string))
            .collect();
            retries["retryOn"] = json!(on.join(","));
        }
        if let Some(b) = &r.backoff {
            retries["backoff"] = json!(b);
        }
        route["retries"] = retries;
    }
    let timeouts = rule.timeouts.as_ref();
    if let Some(t) = timeouts
        .and_then(|t| t.request.as_ref())
        .filter(|t| !is_zero(t))
    {
        route["timeout"] = json!(t);
    }
    if let Some(t) = timeouts
        .and_then(|t| t.backend_request.as_ref())
        .filter(|t| !is_zero(t))
    {
        // Each try's timeout when the rule retries, else the request's.
        match route.get_mut("retries") {
            Some(r) => r["perTryTimeout"] = json!(t),
            None => route["timeout"] = json!(t),
        }
    }
    if unsupported {
        // A filter this implementation does not support: the rule answers 500 (the API's rule).
        return json!({"directResponse": {"status": 500}});
    }
    if route.get("redirect").is_some() {
        return route;
    }
    let mut dests = Vec::new();
    let mut invalid = 0u32;
    for b in &rule.backend_refs {
        let weight = b.weight.unwrap_or(1);
        match world.destination(ns, kind, b) {
            Ok(d) if weight > 0 => {
                let mut dest = json!({"destination": d, "weight": weight});
                let mut bh = json!({});
                for f in &b.filters {
                    if let Some(h) = &f.request_header_modifier {
                        bh["request"] = header_ops(h);
                    }
                    if let Some(h) = &f.response_header_modifier {
                        bh["response"] = header_ops(h);
                    }
                }
                if bh != json!({}) {
                    dest["headers"] = bh;
                }
                dests.push(dest);
            }
            Ok(_) => {}
            Err(()) => invalid += weight,
        }
    }
    if dests.is_empty() {
        // No usable backend: 500 (a rule with no backends at all, too).
        route["directResponse"] = json!({"status": 500});
        route.as_object_mut().map(|o| o.remove("rewrite"));
        return route;
    }
    if invalid > 0 {
        // The share of an invalid backend answers 500 (Istio sends it to a cluster that does
        // not exist): a destination no endpoint serves carries it.
        dests.push(json!({"destination": {"host": format!("invalid-backend.{ns}.svc.{}", world.domain_suffix)}, "weight": invalid}));
    }
    route["route"] = json!(dests);
    route
}

/// A Gateway API duration that is zero (`0s`, `0ms`): no timeout.
pub(super) fn is_zero(d: &str) -> bool {
    d.trim_end_matches(|c: char| c.is_ascii_alphabetic())
        .chars()
        .all(|c| c == '0' || c == '.')
}

/// The replacement of a path prefix matched by whole segments: the exact half of a split
/// prefix match (`/foo`) is replaced whole, the prefix half (`/foo/`) keeps its slash.
pub(super) fn prefix_replacement(prefix: &str, exact_half: bool) -> String {
    if exact_half || prefix.ends_with('/') {
        prefix.to_string()
    } else {
        format!("{prefix}/")
    }
}

/// Istio's corsPolicy of a Gateway API CORS filter: an origin with `*` is a regex (`*` alone:
/// any origin), the max age in seconds, unmatched preflights answered by the gateway.
pub(super) fn cors_policy(c: &crate::config_store::gateway_api::CorsFilter) -> Value {
    let origins: Vec<Value> = c
        .allow_origins
        .iter()
        .map(|o| {
            if o.contains('*') {
                let re = o
                    .split('*')
                    .map(regex_escape)
                    .collect::<Vec<_>>()
                    .join("[^/]*");
                json!({"regex": if o == "*" { ".*".to_string() } else { re }})
            } else {
                json!({"exact": o})
            }
        })
        .collect();
    let mut p = json!({
        "allowOrigins": origins,
        "allowMethods": c.allow_methods,
        "allowHeaders": c.allow_headers,
        "exposeHeaders": c.expose_headers,
        "maxAge": format!("{}s", c.max_age.unwrap_or(5)),
        // A preflight from an origin not allowed is answered here, never forwarded (the API's
        // rule; Istio's IGNORE).
        "unmatchedPreflights": "IGNORE",
    });
    if let Some(cred) = c.allow_credentials {
        p["allowCredentials"] = json!(cred);
    }
    p
}

/// The Istio tcp or tls route (with `sni`) of an L4 route on listener port `port`.
pub(super) fn l4_entry(
    world: &World,
    route: &Route,
    r: &L4RouteSpec,
    port: u16,
    sni: Option<&Vec<String>>,
) -> Value {
    let ns = route.meta_ns();
    let mut dests = Vec::new();
    for rule in &r.rules {
        for b in &rule.backend_refs {
            if let Ok(d) = world.destination(&ns, route.kind(), b) {
                dests.push(json!({"destination": d, "weight": b.weight.unwrap_or(1)}));
            }
        }
    }
    if dests.is_empty() {
        // No usable backend: the listener still takes the connection and closes it (the
        // API's rule, as Istio does it: a destination no cluster serves).
        dests.push(json!({"destination": {
            "host": format!("invalid-backend.{ns}.svc.{}", world.domain_suffix),
            "port": {"number": 65535},
        }}));
    }
    let mut m = json!({"port": port});
    if let Some(hosts) = sni {
        m["sniHosts"] = json!(hosts);
    }
    json!({"match": [m], "route": dests})
}

pub(super) fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if "\\.+*?()|[]{}^$".contains(c) {
                vec!['\\', c]
            } else {
                vec![c]
            }
        })
        .collect()
}
