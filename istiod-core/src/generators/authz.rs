//! AuthorizationPolicy → Envoy's RBAC filters on a sidecar's inbound chains, as istiod builds
//! them (`pilot/pkg/security/authz/builder`): one filter per action, in the order AUDIT, DENY,
//! ALLOW, ahead of the router (HTTP) or tcp_proxy (TCP); CUSTOM policies come first, as a shadow
//! RBAC filter that switches on their provider's ext_authz filter (`ext_authz`) for the requests
//! their rules match. Each rule becomes one Envoy policy
//! `ns[NS]-policy[NAME]-rule[I]` whose principal is `from` (any entry) AND the source-side
//! `when` conditions, and whose permission is `to` (any entry) AND the rest of `when`.
//!
//! Istio's semantics, which decide whether anything fails open:
//! - no ALLOW policy selects the workload: no ALLOW filter, everything is allowed; some ALLOW
//!   policy does: only requests matching one of their rules pass (a policy with no rules,
//!   `spec: {}`, matches nothing, so on its own it denies everything);
//! - DENY is checked before ALLOW and wins;
//! - on a TCP chain a rule that needs the HTTP request (methods, paths, hosts, request
//!   principals, request headers or claims) cannot be evaluated: an ALLOW rule using such a
//!   field is left out (it allows nothing), a DENY or AUDIT rule is kept without those fields
//!   (it denies more, never less).

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{CidrRange, TypedExtensionConfig};
use envoy_types::pb::envoy::config::listener::v3::{Filter, filter};
use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, Rbac, permission, principal, rbac,
};
use envoy_types::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_types::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    ListMatcher, MetadataMatcher, PathMatcher, RegexMatcher, StringMatcher, ValueMatcher,
    list_matcher, metadata_matcher, path_matcher, string_matcher, value_matcher,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;

use crate::config_store::Metadata;
use crate::config_store::authorization::{
    Action, AuthorizationPolicySpec, Condition, ConditionKey, Operation, Rule, Source,
    condition_key, parse_cidr,
};
use crate::model::Proxy;
use crate::push_context::PushContext;
use crate::push_context::policy::{selects, target};
use crate::resource::{HTTP_RBAC, JWT_AUTHN, NETWORK_RBAC};

use super::ext_authz::{EXT_AUTHZ_POLICY_PREFIX, EXT_AUTHZ_SHADOW_PREFIX};

const HTTP_RBAC_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";
const NETWORK_RBAC_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC";
/// The RBAC filters for a proxy's inbound chains, in the order they run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InboundFilters {
    pub http: Vec<HttpFilter>,
    pub tcp: Vec<Filter>,
}

/// The inbound security filters for `proxy`, whose workload carries `labels`: CUSTOM's, JWT
/// verification (RequestAuthentication), then the RBAC filters (none when no policy selects
/// the workload).
pub fn inbound(
    push: &PushContext,
    proxy: &Proxy,
    labels: &BTreeMap<String, String>,
) -> InboundFilters {
    let policies: Vec<&(Metadata, AuthorizationPolicySpec)> = push
        .authorization_policies
        .iter()
        .filter(|(m, s)| {
            selects(
                push,
                &proxy.namespace,
                labels,
                m,
                s.selector.as_ref(),
                s.targeted(),
            )
        })
        .collect();
    let mut out = InboundFilters::default();
    let trust_domains = trust_domains(push);
    // CUSTOM first (ahead of JWT verification, as Istio), then tokens are verified, so the RBAC
    // filters see what a valid token says.
    custom(push, &policies, &trust_domains, &mut out);
    out.http
        .extend(super::authn::jwt_filter(push, proxy, labels));
    for action in [Action::Audit, Action::Deny, Action::Allow] {
        let envoy_action = match action {
            Action::Allow => rbac::Action::Allow,
            Action::Deny | Action::Custom => rbac::Action::Deny,
            Action::Audit => rbac::Action::Log,
        };
        for dry_run in [false, true] {
            let of_action: Vec<_> = policies
                .iter()
                .filter(|(_, s)| s.action == action && s.dry_run == dry_run)
                .collect();
            if of_action.is_empty() {
                continue;
            }
            let (http, tcp) = rule_policies(&of_action, &trust_domains, action, "", "");
            // A dry run is only recorded (Istio's shadow prefixes): it decides nothing, so an
            // ALLOW dry run does not turn "no ALLOW policy, allow all" into "deny the rest".
            let enforce = match (dry_run, action) {
                (false, _) => Enforce::Rules,
                (true, Action::Allow) => Enforce::Shadow("istio_dry_run_allow_"),
                (true, _) => Enforce::Shadow("istio_dry_run_deny_"),
            };
            out.http.push(http_rbac(envoy_action, &http, enforce));
            out.tcp.push(tcp_rbac(envoy_action, &tcp, enforce));
        }
    }
    out
}

/// Whether an RBAC filter enforces its policies or only records which one matched.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Enforce {
    Rules,
    /// `shadow_rules` with this stat prefix: nothing is denied; the matched policy's name goes
    /// to the filter's dynamic metadata (`PREFIXshadow_effective_policy_id`).
    Shadow(&'static str),
}

impl Enforce {
    /// The field the policies go in (1: `rules`, 2: `shadow_rules`) and the shadow stat prefix.
    fn field_and_prefix(self) -> (u32, String) {
        match self {
            Enforce::Rules => (1, String::new()),
            Enforce::Shadow(prefix) => (2, prefix.to_string()),
        }
    }
}

/// The HTTP RBAC filter for `action` with these policies.
fn http_rbac(
    action: rbac::Action,
    policies: &BTreeMap<String, Policy>,
    enforce: Enforce,
) -> HttpFilter {
    let (field, shadow_rules_stat_prefix) = enforce.field_and_prefix();
    let rest = envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac {
        shadow_rules_stat_prefix,
        ..Default::default()
    };
    HttpFilter {
        name: HTTP_RBAC.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(rbac_any(
            HTTP_RBAC_TYPE,
            action,
            policies,
            field,
            &prost::Message::encode_to_vec(&rest),
        ))),
        ..Default::default()
    }
}

/// The network RBAC filter for `action` with these policies (its stat_prefix is required).
fn tcp_rbac(action: rbac::Action, policies: &BTreeMap<String, Policy>, enforce: Enforce) -> Filter {
    let (field, shadow_rules_stat_prefix) = enforce.field_and_prefix();
    let rest = envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac {
        stat_prefix: "tcp.".to_string(),
        shadow_rules_stat_prefix,
        ..Default::default()
    };
    Filter {
        name: NETWORK_RBAC.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(rbac_any(
            NETWORK_RBAC_TYPE,
            action,
            policies,
            field,
            &prost::Message::encode_to_vec(&rest),
        ))),
    }
}

/// The Envoy policies of `policies`' rules for HTTP and for TCP chains, each named
/// `PREFIXns[NS]-policy[NAME]-rule[I]SUFFIX`. On TCP an ALLOW rule using an HTTP-only field
/// is left out; other actions keep the rule without those fields.
fn rule_policies(
    policies: &[&&(Metadata, AuthorizationPolicySpec)],
    trust_domains: &[String],
    action: Action,
    prefix: &str,
    suffix: &str,
) -> (BTreeMap<String, Policy>, BTreeMap<String, Policy>) {
    let mut http = BTreeMap::new();
    let mut tcp = BTreeMap::new();
    for (meta, spec) in policies.iter().map(|p| (&p.0, &p.1)) {
        for (i, rule) in spec.rules.iter().flatten().enumerate() {
            let name = format!(
                "{prefix}ns[{}]-policy[{}]-rule[{i}]{suffix}",
                meta.namespace(),
                meta.name
            );
            let ctx = Ctx {
                trust_domains,
                tcp: false,
            };
            http.insert(name.clone(), policy(ctx, rule));
            if action == Action::Allow && needs_http(rule) {
                tracing::debug!(policy = %name, "ALLOW rule with HTTP-only fields left out on TCP chains");
                continue;
            }
            tcp.insert(name, policy(Ctx { tcp: true, ..ctx }, rule));
        }
    }
    (http, tcp)
}

/// CUSTOM policies, per provider: a shadow RBAC filter that records whether a rule matched,
/// then the provider's ext_authz filter, enabled by that record. A provider that is not in the
/// mesh config (or names no service) cannot be asked, so its rules deny instead (fail closed,
/// as Istio does); so do HTTP providers on TCP chains (Istio skips them there, which fails
/// open; there is no HTTP request on TCP to send to an HTTP authorizer).
fn custom(
    push: &PushContext,
    policies: &[&(Metadata, AuthorizationPolicySpec)],
    trust_domains: &[String],
    out: &mut InboundFilters,
) {
    let mut by_provider: BTreeMap<&str, Vec<&&(Metadata, AuthorizationPolicySpec)>> =
        BTreeMap::new();
    for p in policies.iter().filter(|(_, s)| s.action == Action::Custom) {
        let name = p.1.provider.as_ref().map_or("", |pr| pr.name.as_str());
        by_provider.entry(name).or_default().push(p);
    }
    let is_service = |host: &str| push.service(host).is_some();
    for (name, of_provider) in by_provider {
        let Ok(target) = target(&push.mesh, name, &is_service) else {
            // Warned in the snapshot (`push_context::security_warnings`).
            let (http, tcp) = rule_policies(
                &of_provider,
                trust_domains,
                Action::Deny,
                "",
                "-deny-due-to-bad-CUSTOM-action",
            );
            out.http
                .push(http_rbac(rbac::Action::Deny, &http, Enforce::Rules));
            out.tcp
                .push(tcp_rbac(rbac::Action::Deny, &tcp, Enforce::Rules));
            continue;
        };
        let prefix = format!("{EXT_AUTHZ_POLICY_PREFIX}-{name}-");
        let (http, tcp) = rule_policies(&of_provider, trust_domains, Action::Custom, &prefix, "");
        let shadow = Enforce::Shadow(EXT_AUTHZ_SHADOW_PREFIX);
        out.http.push(http_rbac(rbac::Action::Deny, &http, shadow));
        out.http.push(super::ext_authz::http_filter(&target));
        if target.grpc {
            out.tcp.push(tcp_rbac(rbac::Action::Deny, &tcp, shadow));
            out.tcp.push(super::ext_authz::network_filter(&target));
        } else {
            out.tcp
                .push(tcp_rbac(rbac::Action::Deny, &tcp, Enforce::Rules));
        }
    }
}

/// The local trust domain and its aliases: a principal in any of them is the same identity.
fn trust_domains(push: &PushContext) -> Vec<String> {
    let mut out = vec![push.trust_domain.clone()];
    for alias in &push.mesh.trust_domain_aliases {
        if !out.contains(alias) {
            out.push(alias.clone());
        }
    }
    out
}

/// An RBAC filter config as an Any, its policies in name order (see
/// `super::encode_map_in_order`): the rules message is written as `field` of the filter config
/// (1: `rules`, 2: `shadow_rules`), then `rest` (the filter's other fields, encoded).
fn rbac_any(
    type_url: &str,
    action: rbac::Action,
    policies: &BTreeMap<String, Policy>,
    field: u32,
    rest: &[u8],
) -> Any {
    let rules = super::blocks::encode_map_in_order(
        &Rbac {
            action: action as i32,
            ..Default::default()
        },
        policies.iter().map(|(name, p)| Rbac {
            policies: [(name.clone(), p.clone())].into_iter().collect(),
            ..Default::default()
        }),
    );
    // Fields 1 and 2 of both filter messages are `rules` and `shadow_rules`.
    let mut value = Vec::with_capacity(rules.len() + rest.len() + 8);
    prost::encoding::encode_key(
        field,
        prost::encoding::WireType::LengthDelimited,
        &mut value,
    );
    prost::encoding::encode_varint(rules.len() as u64, &mut value);
    value.extend_from_slice(&rules);
    value.extend_from_slice(rest);
    Any {
        type_url: type_url.to_string(),
        value,
    }
}

#[derive(Clone, Copy)]
struct Ctx<'a> {
    trust_domains: &'a [String],
    /// Building for a TCP chain: HTTP-only fields are dropped.
    tcp: bool,
}

/// Whether a rule uses anything only an HTTP request has.
fn needs_http(rule: &Rule) -> bool {
    let source = rule
        .from
        .iter()
        .filter_map(|f| f.source.as_ref())
        .any(|s| !s.request_principals.is_empty() || !s.not_request_principals.is_empty());
    let operation = rule
        .to
        .iter()
        .filter_map(|t| t.operation.as_ref())
        .any(|o| {
            !(o.hosts.is_empty()
                && o.not_hosts.is_empty()
                && o.methods.is_empty()
                && o.not_methods.is_empty()
                && o.paths.is_empty()
                && o.not_paths.is_empty())
        });
    let when = rule
        .when
        .iter()
        .any(|c| condition_key(&c.key).is_ok_and(|k| k.http_only()));
    source || operation || when
}

fn policy(ctx: Ctx, rule: &Rule) -> Policy {
    let mut principals = Vec::new();
    if !rule.from.is_empty() {
        principals.push(or_ids(
            rule.from
                .iter()
                .filter_map(|f| f.source.as_ref())
                .map(|s| source(ctx, s))
                .collect(),
        ));
    }
    let mut permissions = Vec::new();
    if !rule.to.is_empty() {
        permissions.push(or_rules(
            rule.to
                .iter()
                .filter_map(|t| t.operation.as_ref())
                .map(|o| operation(ctx, o))
                .collect(),
        ));
    }
    for c in &rule.when {
        let Ok(key) = condition_key(&c.key) else {
            continue; // refused when the config is read
        };
        if ctx.tcp && key.http_only() {
            continue;
        }
        match condition(ctx, &key, c) {
            Side::Principal(p) => principals.push(p),
            Side::Permission(p) => permissions.push(p),
        }
    }
    Policy {
        principals: vec![and_ids(principals)],
        permissions: vec![and_rules(permissions)],
        ..Default::default()
    }
}

fn source(ctx: Ctx, s: &Source) -> Principal {
    let mut all = Vec::new();
    let mut field = |values: &[String], negate: bool, f: &dyn Fn(&str) -> Vec<Principal>| {
        if values.is_empty() {
            return;
        }
        let any = or_ids(values.iter().flat_map(|v| f(v)).collect());
        all.push(if negate { not_id(any) } else { any });
    };
    let principal = |v: &str| principal_names(ctx, v);
    field(&s.principals, false, &principal);
    field(&s.not_principals, true, &principal);
    if !ctx.tcp {
        field(&s.request_principals, false, &|v| {
            vec![request_principal(v)]
        });
        field(&s.not_request_principals, true, &|v| {
            vec![request_principal(v)]
        });
    }
    let namespace = |v: &str| vec![authenticated(namespace_matcher(v))];
    field(&s.namespaces, false, &namespace);
    field(&s.not_namespaces, true, &namespace);
    field(&s.service_accounts, false, &service_account);
    field(&s.not_service_accounts, true, &service_account);
    let direct = |v: &str| vec![id(principal::Identifier::DirectRemoteIp(cidr(v)))];
    field(&s.ip_blocks, false, &direct);
    field(&s.not_ip_blocks, true, &direct);
    let remote = |v: &str| vec![id(principal::Identifier::RemoteIp(cidr(v)))];
    field(&s.remote_ip_blocks, false, &remote);
    field(&s.not_remote_ip_blocks, true, &remote);
    and_ids(all)
}

fn operation(ctx: Ctx, o: &Operation) -> Permission {
    let mut all = Vec::new();
    let mut field = |values: Vec<Permission>, negate: bool| {
        if values.is_empty() {
            return;
        }
        let any = or_rules(values);
        all.push(if negate { not_rule(any) } else { any });
    };
    let ports = |ps: &[crate::config_store::authorization::PortValue]| -> Vec<Permission> {
        ps.iter()
            .filter_map(|p| p.number())
            .map(|p| rule(permission::Rule::DestinationPort(u32::from(p))))
            .collect()
    };
    // Envoy evaluates an AND in order and stops at the first miss, and a request is checked
    // against every rule until one matches: the most selective checks go first (the port,
    // then the path, which differ most between rules), header lookups last.
    field(ports(&o.ports), false);
    field(ports(&o.not_ports), true);
    if !ctx.tcp {
        let paths = |ps: &[String]| ps.iter().map(|p| path_rule(p)).collect();
        field(paths(&o.paths), false);
        field(paths(&o.not_paths), true);
        let methods = |ms: &[String]| {
            ms.iter()
                .map(|m| rule(permission::Rule::Header(header(":method", exact(m)))))
                .collect()
        };
        field(methods(&o.methods), false);
        field(methods(&o.not_methods), true);
        let hosts = |hs: &[String]| hs.iter().map(|h| host_rule(h)).collect();
        field(hosts(&o.hosts), false);
        field(hosts(&o.not_hosts), true);
    }
    and_rules(all)
}

enum Side {
    Principal(Principal),
    Permission(Permission),
}

fn condition(ctx: Ctx, key: &ConditionKey, c: &Condition) -> Side {
    let principal_side = |f: &dyn Fn(&str) -> Vec<Principal>| {
        let mut parts = Vec::new();
        if !c.values.is_empty() {
            parts.push(or_ids(c.values.iter().flat_map(|v| f(v)).collect()));
        }
        if !c.not_values.is_empty() {
            parts.push(not_id(or_ids(
                c.not_values.iter().flat_map(|v| f(v)).collect(),
            )));
        }
        Side::Principal(and_ids(parts))
    };
    let permission_side = |f: &dyn Fn(&str) -> Permission| {
        let mut parts = Vec::new();
        if !c.values.is_empty() {
            parts.push(or_rules(c.values.iter().map(|v| f(v)).collect()));
        }
        if !c.not_values.is_empty() {
            parts.push(not_rule(or_rules(
                c.not_values.iter().map(|v| f(v)).collect(),
            )));
        }
        Side::Permission(and_rules(parts))
    };
    match key {
        ConditionKey::RequestHeader(name) => principal_side(&|v| {
            vec![id(principal::Identifier::Header(if v == "*" {
                present(name)
            } else {
                header(name, wildcard_matcher(v))
            }))]
        }),
        ConditionKey::SourceIp => {
            principal_side(&|v| vec![id(principal::Identifier::DirectRemoteIp(cidr(v)))])
        }
        ConditionKey::RemoteIp => {
            principal_side(&|v| vec![id(principal::Identifier::RemoteIp(cidr(v)))])
        }
        ConditionKey::SourceNamespace => {
            principal_side(&|v| vec![authenticated(namespace_matcher(v))])
        }
        ConditionKey::SourcePrincipal => principal_side(&|v| principal_names(ctx, v)),
        ConditionKey::SourceServiceAccount => principal_side(&service_account),
        ConditionKey::RequestAuthPrincipal => principal_side(&|v| vec![request_principal(v)]),
        ConditionKey::RequestAuthAudiences => principal_side(&|v| vec![jwt_claim(&["aud"], v)]),
        ConditionKey::RequestAuthPresenter => principal_side(&|v| vec![jwt_claim(&["azp"], v)]),
        ConditionKey::RequestAuthClaim(path) => principal_side(&|v| vec![jwt_claim(path, v)]),
        ConditionKey::DestinationIp => {
            permission_side(&|v| rule(permission::Rule::DestinationIp(cidr(v))))
        }
        ConditionKey::DestinationPort => {
            permission_side(&|v| rule(permission::Rule::DestinationPort(v.parse().unwrap_or(0))))
        }
        ConditionKey::ConnectionSni => {
            permission_side(&|v| rule(permission::Rule::RequestedServerName(wildcard_matcher(v))))
        }
    }
}

// --- Matchers --------------------------------------------------------------------------

fn string(m: string_matcher::MatchPattern) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(m),
        ..Default::default()
    }
}

fn exact(v: &str) -> StringMatcher {
    string(string_matcher::MatchPattern::Exact(v.to_string()))
}

fn regex(re: &str) -> StringMatcher {
    string(string_matcher::MatchPattern::SafeRegex(RegexMatcher {
        regex: re.to_string(),
        ..Default::default()
    }))
}

/// Istio's value matching: `*` is any non-empty value, `*x` a suffix, `x*` a prefix, else
/// exact.
fn wildcard_matcher(v: &str) -> StringMatcher {
    if v == "*" {
        regex(".+")
    } else if let Some(suffix) = v.strip_prefix('*') {
        string(string_matcher::MatchPattern::Suffix(suffix.to_string()))
    } else if let Some(prefix) = v.strip_suffix('*') {
        string(string_matcher::MatchPattern::Prefix(prefix.to_string()))
    } else {
        exact(v)
    }
}

/// A principal (`TD/ns/NS/sa/SA`, with `*` wildcards) as matchers of the peer's verified
/// identity `spiffe://…`. A principal in `cluster.local`, the local trust domain or one of its
/// aliases matches in each of them (Istio's trust-domain bundle).
fn principal_names(ctx: Ctx, v: &str) -> Vec<Principal> {
    if v == "*" {
        return vec![authenticated(regex(".+"))];
    }
    if let Some(suffix) = v.strip_prefix('*') {
        return vec![authenticated(regex(&format!(
            "spiffe://.*{}",
            regex_syntax::escape(suffix)
        )))];
    }
    let spellings: Vec<String> = match v.split_once('/') {
        Some((td, rest))
            if v.split('/').count() == 5
                && (td == crate::push_context::DEFAULT_TRUST_DOMAIN
                    || ctx.trust_domains.iter().any(|t| t == td)) =>
        {
            ctx.trust_domains
                .iter()
                .map(|t| format!("{t}/{rest}"))
                .collect()
        }
        _ => vec![v.to_string()],
    };
    spellings
        .iter()
        .map(|s| {
            authenticated(match s.strip_suffix('*') {
                Some(prefix) => string(string_matcher::MatchPattern::Prefix(format!(
                    "spiffe://{prefix}"
                ))),
                None => exact(&format!("spiffe://{s}")),
            })
        })
        .collect()
}

/// `NS/SA` as that service account's identity in any trust domain.
fn service_account(v: &str) -> Vec<Principal> {
    let Some((ns, sa)) = v.split_once('/') else {
        return vec![];
    };
    let q = |s: &str| regex_syntax::escape(s);
    vec![authenticated(regex(&format!(
        "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?",
        q(ns),
        q(sa)
    )))]
}

/// A namespace (each `*` any text) as a match on the peer identity's `/ns/NS/` part.
fn namespace_matcher(v: &str) -> StringMatcher {
    let pattern: Vec<String> = v.split('*').map(regex_syntax::escape).collect();
    regex(&format!(".*/ns/{}/.*", pattern.join(".*")))
}

/// `ISSUER/SUBJECT` (split at the last `/`; `*` any verified token) as matches on the payload.
fn request_principal(v: &str) -> Principal {
    if v == "*" {
        return jwt_claim(&["iss"], "*");
    }
    match v.rsplit_once('/') {
        Some((iss, sub)) => and_ids(vec![jwt_claim(&["iss"], iss), jwt_claim(&["sub"], sub)]),
        None => and_ids(vec![jwt_claim(&["iss"], v), jwt_claim_exact(&["sub"], "")]),
    }
}

fn jwt_claim(path: &[&str], v: &str) -> Principal {
    jwt_value(path, wildcard_matcher(v))
}

fn jwt_claim_exact(path: &[&str], v: &str) -> Principal {
    jwt_value(path, exact(v))
}

/// A claim at `payload.PATH` equal to `m`, or a list claim containing such a value.
fn jwt_value(path: &[&str], m: StringMatcher) -> Principal {
    let at = |value: value_matcher::MatchPattern| {
        let matcher = MetadataMatcher {
            filter: JWT_AUTHN.to_string(),
            path: std::iter::once(super::authn::PAYLOAD_KEY)
                .chain(path.iter().copied())
                .map(|k| metadata_matcher::PathSegment {
                    segment: Some(metadata_matcher::path_segment::Segment::Key(k.to_string())),
                })
                .collect(),
            value: Some(ValueMatcher {
                match_pattern: Some(value),
            }),
            ..Default::default()
        };
        #[allow(deprecated)]
        id(principal::Identifier::Metadata(matcher))
    };
    or_ids(vec![
        at(value_matcher::MatchPattern::StringMatch(m.clone())),
        at(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(ValueMatcher {
                    match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
                }))),
            },
        ))),
    ])
}

fn header(name: &str, m: StringMatcher) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(m)),
        ..Default::default()
    }
}

/// A host as a match on the request's authority, ignoring case (`*` any authority; as in
/// Istio, `example.com` does not match `example.com:8080`, `example.com:*` does).
fn host_rule(h: &str) -> Permission {
    let m = if h == "*" {
        present(":authority")
    } else {
        header(
            ":authority",
            StringMatcher {
                ignore_case: true,
                ..wildcard_matcher(h)
            },
        )
    };
    rule(permission::Rule::Header(m))
}

fn present(name: &str) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::PresentMatch(true)),
        ..Default::default()
    }
}

/// A path: a template (`{*}` one segment, `{**}` the rest) by Envoy's URI-template matcher,
/// else Istio's wildcard matching on the path without its query.
fn path_rule(p: &str) -> Permission {
    if p.contains('{') {
        let template = p.replace("{**}", "**").replace("{*}", "*");
        return rule(permission::Rule::UriTemplate(TypedExtensionConfig {
            name: "uri-template".to_string(),
            typed_config: Some(pack_any(UriTemplateMatchConfig {
                path_template: template,
            })),
        }));
    }
    rule(permission::Rule::UrlPath(PathMatcher {
        rule: Some(path_matcher::Rule::Path(wildcard_matcher(p))),
    }))
}

fn cidr(v: &str) -> CidrRange {
    // Checked when the config was read.
    let (ip, len) = parse_cidr(v).unwrap_or((std::net::Ipv4Addr::UNSPECIFIED.into(), 32));
    CidrRange {
        address_prefix: ip.to_string(),
        prefix_len: Some(envoy_types::pb::google::protobuf::UInt32Value { value: len }),
    }
}

// --- Combinators -----------------------------------------------------------------------

fn id(i: principal::Identifier) -> Principal {
    Principal {
        identifier: Some(i),
    }
}

fn rule(r: permission::Rule) -> Permission {
    Permission { rule: Some(r) }
}

fn authenticated(m: StringMatcher) -> Principal {
    id(principal::Identifier::Authenticated(
        principal::Authenticated {
            principal_name: Some(m),
        },
    ))
}

/// All of `ids`; none at all is "any".
fn and_ids(mut ids: Vec<Principal>) -> Principal {
    match ids.len() {
        0 => id(principal::Identifier::Any(true)),
        1 => ids.remove(0),
        _ => id(principal::Identifier::AndIds(principal::Set { ids })),
    }
}

/// One of `ids`; an empty list matches nothing.
fn or_ids(mut ids: Vec<Principal>) -> Principal {
    match ids.len() {
        1 => ids.remove(0),
        _ => id(principal::Identifier::OrIds(principal::Set { ids })),
    }
}

fn not_id(p: Principal) -> Principal {
    id(principal::Identifier::NotId(Box::new(p)))
}

fn and_rules(mut rules: Vec<Permission>) -> Permission {
    match rules.len() {
        0 => rule(permission::Rule::Any(true)),
        1 => rules.remove(0),
        _ => rule(permission::Rule::AndRules(permission::Set { rules })),
    }
}

fn or_rules(mut rules: Vec<Permission>) -> Permission {
    match rules.len() {
        1 => rules.remove(0),
        _ => rule(permission::Rule::OrRules(permission::Set { rules })),
    }
}

fn not_rule(p: Permission) -> Permission {
    rule(permission::Rule::NotRule(Box::new(p)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
    use prost::Message;

    fn filters(yaml: &str) -> InboundFilters {
        let push = crate::push_context::from_yaml(yaml);
        let proxy = Proxy::from_node_id("sidecar~10.0.0.1~p.shop~shop.svc.cluster.local").unwrap();
        inbound(&push, &proxy, &proxy.workload_labels(&push.services))
    }

    fn http_rules(f: &HttpFilter) -> Rbac {
        let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
            panic!("{f:?}")
        };
        HttpRbac::decode(any.value.as_slice())
            .unwrap()
            .rules
            .unwrap()
    }

    #[test]
    fn allow_nothing_is_an_allow_filter_with_no_policies() {
        let f =
            filters("kind: AuthorizationPolicy\nmetadata: {name: p, namespace: shop}\nspec: {}\n");
        assert_eq!(f.http.len(), 1);
        let rules = http_rules(&f.http[0]);
        assert_eq!(rules.action, rbac::Action::Allow as i32);
        assert!(rules.policies.is_empty());
    }

    fn tcp_rules(f: &Filter) -> Rbac {
        use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetRbac;
        let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
            panic!("{f:?}")
        };
        let net = NetRbac::decode(any.value.as_slice()).unwrap();
        assert_eq!(net.stat_prefix, "tcp.");
        net.rules.unwrap()
    }

    const WORKLOAD: &str = "kind: ServiceEntry\nmetadata: {name: w, namespace: shop}\nspec: {hosts: [w.shop.svc.cluster.local], ports: [{number: 80, name: http}], workloadSelector: {labels: {app: w}}}\n---\nkind: WorkloadEntry\nmetadata: {name: w, namespace: shop}\nspec: {address: 10.0.0.1, labels: {app: w}}\n";

    #[test]
    fn order_scope_and_tcp_semantics() {
        let f = filters(&format!(
            "{WORKLOAD}---\nkind: AuthorizationPolicy\nmetadata: {{name: allow, namespace: shop}}\nspec:\n  selector: {{matchLabels: {{app: w}}}}\n  rules:\n  - to: [{{operation: {{paths: [/a]}}}}]\n  - to: [{{operation: {{ports: ['9000']}}}}]\n---\nkind: AuthorizationPolicy\nmetadata: {{name: deny, namespace: istio-system}}\nspec: {{action: DENY, rules: [{{to: [{{operation: {{methods: [DELETE], ports: ['80']}}}}]}}]}}\n---\nkind: AuthorizationPolicy\nmetadata: {{name: audit, namespace: shop}}\nspec: {{action: AUDIT, rules: [{{}}]}}\n---\nkind: AuthorizationPolicy\nmetadata: {{name: elsewhere, namespace: other}}\nspec: {{action: DENY, rules: [{{}}]}}\n---\nkind: AuthorizationPolicy\nmetadata: {{name: not-me, namespace: shop}}\nspec: {{selector: {{matchLabels: {{app: x}}}}, action: DENY, rules: [{{}}]}}\n"
        ));
        let actions: Vec<i32> = f.http.iter().map(|h| http_rules(h).action).collect();
        let want = [rbac::Action::Log, rbac::Action::Deny, rbac::Action::Allow].map(|a| a as i32);
        assert_eq!(
            actions, want,
            "AUDIT, DENY, ALLOW; other namespaces and selectors excluded"
        );
        let names = |r: &Rbac| {
            let mut n: Vec<String> = r.policies.keys().cloned().collect();
            n.sort();
            n
        };
        // HTTP: both ALLOW rules; TCP: the path rule (HTTP-only) is left out.
        assert_eq!(
            names(&http_rules(&f.http[2])),
            [
                "ns[shop]-policy[allow]-rule[0]",
                "ns[shop]-policy[allow]-rule[1]"
            ]
        );
        let tcp_allow = tcp_rules(&f.tcp[2]);
        assert_eq!(names(&tcp_allow), ["ns[shop]-policy[allow]-rule[1]"]);
        // The DENY keeps its port on TCP and loses the method (it denies more, never less).
        let tcp_deny = tcp_rules(&f.tcp[1]);
        let p = &tcp_deny.policies["ns[istio-system]-policy[deny]-rule[0]"];
        assert_eq!(
            p.permissions[0].rule,
            Some(permission::Rule::DestinationPort(80)),
            "{p:?}"
        );
        let http_deny = http_rules(&f.http[1]);
        let p = &http_deny.policies["ns[istio-system]-policy[deny]-rule[0]"];
        assert!(
            matches!(&p.permissions[0].rule, Some(permission::Rule::AndRules(s)) if s.rules.len() == 2),
            "{p:?}"
        );
    }

    #[test]
    fn principals_expand_to_trust_domain_aliases() {
        let f = filters(
            "kind: MeshConfig\nmetadata: {name: m}\nspec: {trustDomainAliases: [old.example]}\n---\nkind: AuthorizationPolicy\nmetadata: {name: p, namespace: shop}\nspec: {rules: [{from: [{source: {principals: [cluster.local/ns/a/sa/b, other.example/ns/a/sa/b, '*/sa/b']}}]}]}\n",
        );
        let r = http_rules(&f.http[0]);
        let text = format!("{:?}", r.policies["ns[shop]-policy[p]-rule[0]"]);
        for want in [
            "Exact(\"spiffe://cluster.local/ns/a/sa/b\")",
            "Exact(\"spiffe://old.example/ns/a/sa/b\")",
            "Exact(\"spiffe://other.example/ns/a/sa/b\")",
            "regex: \"spiffe://.*/sa/b\"",
        ] {
            assert!(text.contains(want), "{want} not in {text}");
        }
        assert_eq!(
            text.matches("other.example").count(),
            1,
            "unknown domains are not expanded"
        );
    }

    #[test]
    fn encoding_is_the_same_every_time() {
        let yaml = "kind: AuthorizationPolicy\nmetadata: {name: p, namespace: shop}\nspec: {rules: [{to: [{operation: {paths: [/a]}}]}, {to: [{operation: {paths: [/b]}}]}, {to: [{operation: {paths: [/c]}}]}, {}]}\n";
        let bytes = |f: &InboundFilters| match &f.http[0].config_type {
            Some(http_filter::ConfigType::TypedConfig(any)) => any.value.clone(),
            _ => panic!(),
        };
        let first = bytes(&filters(yaml));
        for _ in 0..20 {
            assert_eq!(
                bytes(&filters(yaml)),
                first,
                "policy map order must not vary"
            );
        }
    }

    #[test]
    fn a_dry_run_is_only_recorded() {
        use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
        let f = filters(
            "kind: AuthorizationPolicy\nmetadata: {name: p, namespace: shop, annotations: {istio.io/dry-run: \"true\"}}\nspec: {rules: [{to: [{operation: {paths: [/a]}}]}]}\n",
        );
        assert_eq!(f.http.len(), 1);
        let Some(http_filter::ConfigType::TypedConfig(any)) = &f.http[0].config_type else {
            panic!()
        };
        let rbac = HttpRbac::decode(any.value.as_slice()).unwrap();
        assert!(rbac.rules.is_none(), "a dry run enforces nothing: {rbac:?}");
        assert_eq!(rbac.shadow_rules_stat_prefix, "istio_dry_run_allow_");
        assert_eq!(rbac.shadow_rules.unwrap().policies.len(), 1);
    }
}
