//! security.istio.io AuthorizationPolicy, typed whole and checked with the rules of Istio's
//! `ValidateAuthorizationPolicy`, each error naming the field (`rules[0].to[1].operation.ports[0]`).
//!
//! Stricter than Istio on one point: a field this control plane does not know is an error, not
//! a warning. In a policy, an ignored field could only change what a rule matches (a misspelt
//! `path:` would leave an ALLOW rule matching every path), so it is never silently dropped.

use serde::{Deserialize, Serialize};

use super::selector::PolicySelector;

/// What a matching rule does.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "UPPERCASE")]
pub enum Action {
    #[default]
    Allow,
    Deny,
    Audit,
    Custom,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthorizationPolicySpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<PolicySelector>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<TargetRef>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<TargetRef>,
    pub action: Action,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<Provider>,
    /// `None`: no `rules` key at all; `Some(empty)`: `rules: []`. Both match nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<Rule>>,
    /// The `istio.io/dry-run: "true"` annotation: the rules are evaluated and logged (Envoy's
    /// shadow rules), never enforced. Set from the metadata, not the spec.
    #[serde(skip)]
    pub dry_run: bool,
}

impl AuthorizationPolicySpec {
    /// Bound by targetRef(s): it applies to gateways and waypoints, never to a sidecar.
    pub fn targeted(&self) -> bool {
        self.target_ref.is_some() || !self.target_refs.is_empty()
    }
}

/// The annotation that makes a policy a dry run.
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TargetRef {
    pub group: String,
    pub kind: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Provider {
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Rule {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<From>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<To>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Condition>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct From {
    pub source: Option<Source>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct To {
    pub operation: Option<Operation>,
}

/// Each field is a list of alternatives (any one matches); the fields of a source must all
/// match; a `not*` field matches when none of its values does.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Source {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub request_principals: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_request_principals: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ip_blocks: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_ip_blocks: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub remote_ip_blocks: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_remote_ip_blocks: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Operation {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_hosts: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortValue>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_ports: Vec<PortValue>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_methods: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_paths: Vec<String>,
}

/// A port as Istio's API takes it: a string (`"8080"`); a YAML number is taken too.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum PortValue {
    Text(String),
    Number(i64),
}

impl PortValue {
    /// The port, if it is one (1-65535).
    pub fn number(&self) -> Option<u16> {
        match self {
            PortValue::Text(s) => s.parse::<u16>().ok(),
            PortValue::Number(n) => u16::try_from(*n).ok(),
        }
        .filter(|p| *p > 0)
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Condition {
    pub key: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_values: Vec<String>,
}

/// What a `when` key names (Istio's "Authorization Policy Conditions").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConditionKey<'a> {
    RequestHeader(&'a str),
    SourceIp,
    RemoteIp,
    SourceNamespace,
    SourcePrincipal,
    SourceServiceAccount,
    RequestAuthPrincipal,
    RequestAuthAudiences,
    RequestAuthPresenter,
    /// `request.auth.claims[a][b]`: the path into the token's claims.
    RequestAuthClaim(Vec<&'a str>),
    DestinationIp,
    DestinationPort,
    ConnectionSni,
}

impl ConditionKey<'_> {
    /// Keys only an HTTP request carries (on a TCP port a rule using one cannot be evaluated).
    pub fn http_only(&self) -> bool {
        matches!(
            self,
            ConditionKey::RequestHeader(_)
                | ConditionKey::RequestAuthPrincipal
                | ConditionKey::RequestAuthAudiences
                | ConditionKey::RequestAuthPresenter
                | ConditionKey::RequestAuthClaim(_)
        )
    }
}

/// Parses a `when` key; the error says what is expected.
pub fn condition_key(key: &str) -> Result<ConditionKey<'_>, String> {
    let bracketed = |prefix: &str| -> Option<Vec<&str>> {
        let rest = key.strip_prefix(prefix)?;
        let mut parts = Vec::new();
        let mut rest = rest;
        while !rest.is_empty() {
            let inner = rest.strip_prefix('[')?;
            let (part, after) = inner.split_once(']')?;
            if part.is_empty() {
                return None;
            }
            parts.push(part);
            rest = after;
        }
        (!parts.is_empty()).then_some(parts)
    };
    Ok(match key {
        "source.ip" => ConditionKey::SourceIp,
        "remote.ip" => ConditionKey::RemoteIp,
        "source.namespace" => ConditionKey::SourceNamespace,
        "source.principal" => ConditionKey::SourcePrincipal,
        "source.serviceAccount" => ConditionKey::SourceServiceAccount,
        "request.auth.principal" => ConditionKey::RequestAuthPrincipal,
        "request.auth.audiences" => ConditionKey::RequestAuthAudiences,
        "request.auth.presenter" => ConditionKey::RequestAuthPresenter,
        "destination.ip" => ConditionKey::DestinationIp,
        "destination.port" => ConditionKey::DestinationPort,
        "connection.sni" => ConditionKey::ConnectionSni,
        _ => {
            if let Some(parts) = bracketed("request.headers") {
                match parts.as_slice() {
                    [name] => ConditionKey::RequestHeader(name),
                    _ => return Err(format!("{key:?}: request.headers takes one [name]")),
                }
            } else if let Some(parts) = bracketed("request.auth.claims") {
                ConditionKey::RequestAuthClaim(parts)
            } else if key.starts_with("experimental.envoy.filters.") {
                return Err(format!(
                    "{key:?}: experimental.envoy.filters.* conditions are not supported"
                ));
            } else {
                return Err(format!(
                    "{key:?} is not a condition key (source.ip, remote.ip, source.namespace, \
                     source.principal, source.serviceAccount, request.headers[NAME], \
                     request.auth.principal, request.auth.audiences, request.auth.presenter, \
                     request.auth.claims[NAME], destination.ip, destination.port, connection.sni)"
                ));
            }
        }
    })
}

/// An IPv4/IPv6 address or CIDR (`10.0.0.0/8`, `fd00::1`): the address and prefix length.
pub fn parse_cidr(s: &str) -> Result<(std::net::IpAddr, u32), String> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip: std::net::IpAddr = addr
        .parse()
        .map_err(|_| format!("{s:?} is not an IP address or CIDR"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => max,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| format!("{s:?}: prefix length must be 0-{max}"))?,
    };
    Ok((ip, len))
}

/// Istio's rule for a path with a template (`/a/{*}/b`, `/a/{**}`): `{*}` is one segment,
/// `{**}` any number and only last; each operator is a whole segment.
pub fn check_path_template(path: &str) -> Result<(), String> {
    if !path.contains('{') && !path.contains('}') {
        return Ok(());
    }
    if !path.starts_with('/') {
        return Err(format!("{path:?}: a path template must start with /"));
    }
    let segments: Vec<&str> = path[1..].split('/').collect();
    for (i, seg) in segments.iter().enumerate() {
        let operator = *seg == "{*}" || *seg == "{**}";
        if !operator && (seg.contains('{') || seg.contains('}')) {
            return Err(format!(
                "{path:?}: {seg:?} is not a template operator (a whole segment {{*}} or {{**}})"
            ));
        }
        if *seg == "{**}" && i + 1 != segments.len() {
            return Err(format!("{path:?}: {{**}} may only be the last segment"));
        }
    }
    Ok(())
}

/// A value with `*` only as its whole, its first or its last character (Istio's rule for
/// principals, namespaces, hosts and paths without templates).
fn check_wildcard(field: &str, v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err(format!("{field}: empty value"));
    }
    let inner = v.trim_start_matches('*').trim_end_matches('*');
    let stars = v.matches('*').count();
    if v != "*" && (inner.contains('*') || stars > 1) {
        return Err(format!(
            "{field}: {v:?}: `*` may only be the whole value, its prefix or its suffix"
        ));
    }
    Ok(())
}

/// Principals, namespaces and service accounts become RE2 regexes in the generated RBAC
/// filter; a value too long for one would have Envoy refuse the whole listener configuration.
fn check_regex_value(field: &str, v: &str) -> Result<(), String> {
    use mesh_common::re2::MAX_REGEX_BYTES;
    if v.len() > MAX_REGEX_BYTES {
        return Err(format!(
            "{field}: value of {} bytes is longer than the {MAX_REGEX_BYTES}-byte limit \
             (it becomes a regex in Envoy's RBAC filter)",
            v.len()
        ));
    }
    Ok(())
}

fn each(
    field: &str,
    values: &[String],
    check: impl Fn(&str, &str) -> Result<(), String>,
) -> Result<(), String> {
    values
        .iter()
        .enumerate()
        .try_for_each(|(i, v)| check(&format!("{field}[{i}]"), v))
}

fn check_source(at: &str, s: &Source) -> Result<(), String> {
    for (name, values) in [
        ("principals", &s.principals),
        ("notPrincipals", &s.not_principals),
        ("requestPrincipals", &s.request_principals),
        ("notRequestPrincipals", &s.not_request_principals),
        ("namespaces", &s.namespaces),
        ("notNamespaces", &s.not_namespaces),
    ] {
        each(&format!("{at}.{name}"), values, |f, v| {
            check_wildcard(f, v)?;
            check_regex_value(f, v)
        })?;
    }
    for (name, values) in [
        ("serviceAccounts", &s.service_accounts),
        ("notServiceAccounts", &s.not_service_accounts),
    ] {
        each(&format!("{at}.{name}"), values, |f, v| {
            check_regex_value(f, v)?;
            match v.split_once('/') {
                Some((ns, sa))
                    if !ns.is_empty()
                        && !sa.is_empty()
                        && !sa.contains('/')
                        && !v.contains('*') =>
                {
                    Ok(())
                }
                _ => Err(format!(
                    "{f}: {v:?} is not NAMESPACE/SERVICE_ACCOUNT (no wildcards)"
                )),
            }
        })?;
    }
    let accounts = !s.service_accounts.is_empty() || !s.not_service_accounts.is_empty();
    let identities = !s.principals.is_empty()
        || !s.not_principals.is_empty()
        || !s.namespaces.is_empty()
        || !s.not_namespaces.is_empty();
    if accounts && identities {
        return Err(format!(
            "{at}: serviceAccounts cannot be set with principals or namespaces"
        ));
    }
    if *s == Source::default() {
        return Err(format!("{at}: empty (name at least one field)"));
    }
    for (name, values) in [
        ("ipBlocks", &s.ip_blocks),
        ("notIpBlocks", &s.not_ip_blocks),
        ("remoteIpBlocks", &s.remote_ip_blocks),
        ("notRemoteIpBlocks", &s.not_remote_ip_blocks),
    ] {
        each(&format!("{at}.{name}"), values, |f, v| {
            parse_cidr(v).map(|_| ()).map_err(|e| format!("{f}: {e}"))
        })?;
    }
    Ok(())
}

fn check_operation(at: &str, o: &Operation) -> Result<(), String> {
    if *o == Operation::default() {
        return Err(format!("{at}: empty (name at least one field)"));
    }
    for (name, values) in [("hosts", &o.hosts), ("notHosts", &o.not_hosts)] {
        each(&format!("{at}.{name}"), values, check_wildcard)?;
    }
    for (name, values) in [("methods", &o.methods), ("notMethods", &o.not_methods)] {
        each(&format!("{at}.{name}"), values, |f, v| {
            if v.is_empty() {
                Err(format!("{f}: empty value"))
            } else {
                Ok(())
            }
        })?;
    }
    for (name, values) in [("paths", &o.paths), ("notPaths", &o.not_paths)] {
        each(&format!("{at}.{name}"), values, |f, v| {
            if v.contains('{') || v.contains('}') {
                check_path_template(v).map_err(|e| format!("{f}: {e}"))
            } else {
                check_wildcard(f, v)
            }
        })?;
    }
    for (name, values) in [("ports", &o.ports), ("notPorts", &o.not_ports)] {
        for (i, p) in values.iter().enumerate() {
            if p.number().is_none() {
                return Err(format!(
                    "{at}.{name}[{i}]: {} is not a port (1-65535)",
                    serde_json::to_string(p).unwrap_or_default()
                ));
            }
        }
    }
    Ok(())
}

fn check_condition(at: &str, c: &Condition) -> Result<(), String> {
    let key = condition_key(&c.key).map_err(|e| format!("{at}.key: {e}"))?;
    if c.values.is_empty() && c.not_values.is_empty() {
        return Err(format!("{at}: values or notValues is required"));
    }
    for (name, values) in [("values", &c.values), ("notValues", &c.not_values)] {
        each(&format!("{at}.{name}"), values, |f, v| match key {
            ConditionKey::SourceIp | ConditionKey::RemoteIp | ConditionKey::DestinationIp => {
                parse_cidr(v).map(|_| ()).map_err(|e| format!("{f}: {e}"))
            }
            ConditionKey::DestinationPort => v
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .map(|_| ())
                .ok_or_else(|| format!("{f}: {v:?} is not a port (1-65535)")),
            _ if v.is_empty() => Err(format!("{f}: empty value")),
            _ => Ok(()),
        })?;
    }
    Ok(())
}

pub fn validate_authorization_policy(spec: &AuthorizationPolicySpec) -> Result<(), String> {
    check_provider(spec)?;
    check_binding(spec)?;
    if matches!(spec.action, Action::Deny | Action::Custom)
        && spec.rules.as_ref().is_none_or(Vec::is_empty)
    {
        return Err(format!(
            "rules: a {} policy needs at least one rule",
            if spec.action == Action::Deny {
                "DENY"
            } else {
                "CUSTOM"
            }
        ));
    }
    if spec.action == Action::Custom {
        check_custom_rules(spec)?;
    }
    for (i, rule) in spec.rules.iter().flatten().enumerate() {
        check_rule(&format!("rules[{i}]"), rule)?;
    }
    Ok(())
}

/// A CUSTOM policy names its provider; no other action names one.
fn check_provider(spec: &AuthorizationPolicySpec) -> Result<(), String> {
    match spec.action {
        Action::Custom => {
            if spec.provider.as_ref().is_none_or(|p| p.name.is_empty()) {
                return Err("provider.name: a CUSTOM policy must name its provider".into());
            }
        }
        action => {
            if spec.provider.is_some() {
                return Err(format!(
                    "provider: only a CUSTOM policy names a provider (action is {})",
                    serde_json::to_string(&action).unwrap_or_default()
                ));
            }
        }
    }
    Ok(())
}

/// What the policy applies to: a workload selector or targetRef(s), not both, each well formed.
fn check_binding(spec: &AuthorizationPolicySpec) -> Result<(), String> {
    let targets = usize::from(spec.target_ref.is_some()) + spec.target_refs.len();
    if spec.selector.is_some() && targets > 0 {
        return Err("selector and targetRef(s): only one of them may be set".into());
    }
    if spec.target_ref.is_some() && !spec.target_refs.is_empty() {
        return Err("targetRef and targetRefs: only one of them may be set".into());
    }
    if let Some(sel) = &spec.selector {
        for (k, v) in &sel.match_labels {
            if k.is_empty() || k.contains('*') || v.contains('*') {
                return Err(format!(
                    "selector.matchLabels: {k:?}: {v:?}: keys must be non-empty, and neither may hold `*`"
                ));
            }
        }
    }
    let refs = spec.target_ref.iter().map(|r| ("targetRef".to_string(), r));
    let many = spec
        .target_refs
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("targetRefs[{i}]"), r));
    for (at, r) in refs.chain(many) {
        if !matches!(
            r.kind.as_str(),
            "Service" | "ServiceEntry" | "Gateway" | "GatewayClass"
        ) {
            return Err(format!(
                "{at}.kind: {:?} is not Service, ServiceEntry, Gateway or GatewayClass",
                r.kind
            ));
        }
        if r.name.is_empty() {
            return Err(format!("{at}.name: required"));
        }
        if r.namespace.is_some() {
            return Err(format!(
                "{at}.namespace: not allowed (a policy targets its own namespace)"
            ));
        }
    }
    Ok(())
}

/// Istio's rule: the authorizer runs before JWT verification, and identities are its to check,
/// so a CUSTOM rule names none.
fn check_custom_rules(spec: &AuthorizationPolicySpec) -> Result<(), String> {
    for (i, rule) in spec.rules.iter().flatten().enumerate() {
        for (j, f) in rule.from.iter().enumerate() {
            if let Some(s) = &f.source
                && !(s.principals.is_empty()
                    && s.not_principals.is_empty()
                    && s.namespaces.is_empty()
                    && s.not_namespaces.is_empty()
                    && s.service_accounts.is_empty()
                    && s.not_service_accounts.is_empty()
                    && s.request_principals.is_empty()
                    && s.not_request_principals.is_empty())
            {
                return Err(format!(
                    "rules[{i}].from[{j}].source: a CUSTOM rule cannot match principals, namespaces, serviceAccounts or requestPrincipals"
                ));
            }
        }
        for (j, c) in rule.when.iter().enumerate() {
            if c.key.starts_with("source.namespace")
                || c.key.starts_with("source.principal")
                || c.key.starts_with("source.serviceAccount")
                || c.key.starts_with("request.auth.")
            {
                return Err(format!(
                    "rules[{i}].when[{j}].key: {:?} cannot be used in a CUSTOM rule",
                    c.key
                ));
            }
        }
    }
    Ok(())
}

fn check_rule(at: &str, rule: &Rule) -> Result<(), String> {
    for (j, f) in rule.from.iter().enumerate() {
        let source = f
            .source
            .as_ref()
            .ok_or_else(|| format!("{at}.from[{j}].source: required"))?;
        check_source(&format!("{at}.from[{j}].source"), source)?;
    }
    for (j, t) in rule.to.iter().enumerate() {
        let op = t
            .operation
            .as_ref()
            .ok_or_else(|| format!("{at}.to[{j}].operation: required"))?;
        check_operation(&format!("{at}.to[{j}].operation"), op)?;
    }
    for (j, c) in rule.when.iter().enumerate() {
        check_condition(&format!("{at}.when[{j}]"), c)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str) -> Result<(), String> {
        crate::config_store::check_spec::<AuthorizationPolicySpec>(
            yaml,
            validate_authorization_policy,
        )
    }

    #[test]
    fn valid_policies_pass() {
        for ok in [
            "{}",
            "{action: DENY, rules: [{}]}",
            "rules: [{}]",
            "{action: CUSTOM, provider: {name: ext}, rules: [{to: [{operation: {paths: [/admin/*]}}]}]}",
            "{action: CUSTOM, provider: {name: ext}, rules: [{from: [{source: {ipBlocks: [10.0.0.0/8]}}]}]}",
            "rules: [{from: [{source: {principals: [cluster.local/ns/a/sa/b, '*', '*/sa/b', 'cluster.local/*']}}]}]",
            "rules: [{from: [{source: {serviceAccounts: [shop/cart]}}]}]",
            "rules: [{to: [{operation: {ports: ['8080', 9090], paths: ['/a/{*}/b', '/x/{**}', '*.png']}}]}]",
            "rules: [{when: [{key: 'request.headers[x-id]', values: ['1']}, {key: 'request.auth.claims[groups][0]', notValues: [a]}, {key: source.ip, values: [10.0.0.0/8, 'fd00::1']}, {key: destination.port, values: ['80']}]}]",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn invalid_policies_name_the_field() {
        for (bad, expect) in [
            ("{action: PERMIT}", "unknown variant `PERMIT`"),
            (
                "{action: CUSTOM, rules: [{}]}",
                "provider.name: a CUSTOM policy",
            ),
            (
                "{action: DENY, provider: {name: x}}",
                "provider: only a CUSTOM",
            ),
            (
                "rules: [{to: [{operation: {path: [/admin]}}]}]",
                "unknown field `path`",
            ),
            ("rules: [{from: [{}]}]", "rules[0].from[0].source: required"),
            (
                "rules: [{from: [{source: {principals: ['a*b']}}]}]",
                "rules[0].from[0].source.principals[0]",
            ),
            (
                format!(
                    "rules: [{{from: [{{source: {{namespaces: ['{}*']}}}}]}}]",
                    "n".repeat(100 * 1024)
                )
                .as_str(),
                "namespaces[0]: value of 102401 bytes is longer than the 1024-byte limit",
            ),
            (
                format!(
                    "rules: [{{from: [{{source: {{principals: ['*{}']}}}}]}}]",
                    "/a".repeat(600)
                )
                .as_str(),
                "principals[0]: value of 1201 bytes",
            ),
            (
                format!(
                    "rules: [{{from: [{{source: {{serviceAccounts: ['ns/{}']}}}}]}}]",
                    "a".repeat(2000)
                )
                .as_str(),
                "serviceAccounts[0]: value of 2003 bytes",
            ),
            (
                "rules: [{from: [{source: {ipBlocks: [10.0.0.0/33]}}]}]",
                "ipBlocks[0]: \"10.0.0.0/33\": prefix length",
            ),
            (
                "rules: [{from: [{source: {remoteIpBlocks: [nope]}}]}]",
                "remoteIpBlocks[0]",
            ),
            (
                "rules: [{from: [{source: {serviceAccounts: [cart]}}]}]",
                "serviceAccounts[0]",
            ),
            (
                "rules: [{to: [{operation: {ports: ['0']}}]}]",
                "ports[0]: \"0\" is not a port",
            ),
            (
                "rules: [{to: [{operation: {ports: [70000]}}]}]",
                "ports[0]: 70000",
            ),
            (
                "rules: [{to: [{operation: {paths: ['/a/{**}/b']}}]}]",
                "may only be the last",
            ),
            (
                "rules: [{to: [{operation: {paths: ['/a/x{*}']}}]}]",
                "not a template operator",
            ),
            (
                "rules: [{to: [{operation: {methods: ['']}}]}]",
                "methods[0]: empty",
            ),
            (
                "rules: [{when: [{key: request.auth.claims, values: [a]}]}]",
                "rules[0].when[0].key",
            ),
            (
                "rules: [{when: [{key: source.ip, values: [x]}]}]",
                "when[0].values[0]",
            ),
            (
                "rules: [{when: [{key: source.ip}]}]",
                "values or notValues is required",
            ),
            (
                "rules: [{when: [{key: destination.port, values: ['99999']}]}]",
                "not a port",
            ),
            (
                "{selector: {matchLabels: {a: b}}, targetRef: {kind: Gateway, name: g}}",
                "only one of them",
            ),
            ("{action: DENY}", "rules: a DENY policy needs"),
            (
                "{action: CUSTOM, provider: {name: e}, rules: [{from: [{source: {namespaces: [a]}}]}]}",
                "a CUSTOM rule cannot match principals",
            ),
            (
                "{action: CUSTOM, provider: {name: e}, rules: [{when: [{key: request.auth.principal, values: [a]}]}]}",
                "cannot be used in a CUSTOM rule",
            ),
            ("rules: [{from: [{source: {}}]}]", "from[0].source: empty"),
            ("rules: [{to: [{operation: {}}]}]", "to[0].operation: empty"),
            (
                "rules: [{from: [{source: {namespaces: [a], serviceAccounts: [a/b]}}]}]",
                "serviceAccounts cannot",
            ),
            (
                "{targetRef: {kind: Pod, name: p}}",
                "targetRef.kind: \"Pod\"",
            ),
            (
                "{selector: {matchLabels: {app: '*'}}}",
                "selector.matchLabels",
            ),
        ] {
            let err = check(bad).expect_err(bad);
            assert!(err.contains(expect), "{bad}: {err}");
        }
    }
}
