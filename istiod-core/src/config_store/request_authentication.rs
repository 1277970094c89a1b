//! security.istio.io RequestAuthentication: which JWTs a workload accepts. Typed whole and
//! checked with Istio's rules, each error naming the field (`jwtRules[0].jwksUri`). As with
//! AuthorizationPolicy, a field this control plane does not know is an error: an ignored
//! `audiences` would accept tokens meant for another service.

use serde::{Deserialize, Serialize};

use super::authorization::TargetRef;
use super::selector::PolicySelector;
use super::values::GoDuration;

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestAuthenticationSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<PolicySelector>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<TargetRef>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<TargetRef>,
    pub jwt_rules: Vec<JwtRule>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct JwtRule {
    pub issuer: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwks: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_headers: Vec<JwtHeader>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_params: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_cookies: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_payload_to_header: Option<String>,
    pub forward_original_token: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GoDuration>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct JwtHeader {
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ClaimToHeader {
    pub header: String,
    pub claim: String,
}

impl RequestAuthenticationSpec {
    /// Bound by targetRef(s): it applies to gateways and waypoints, never to a sidecar.
    pub fn targeted(&self) -> bool {
        self.target_ref.is_some() || !self.target_refs.is_empty()
    }
}

/// Where a rule's keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource<'a> {
    /// The JSON Web Key Set, inline.
    Inline(&'a str),
    /// A file on the proxy's machine (`file:///path`).
    File(&'a str),
    /// An `http://HOST[:PORT]/PATH` endpoint, HOST a mesh service (fetched by Envoy).
    Http { host: &'a str, port: u16 },
}

impl JwtRule {
    /// The key source; checked by `validate`, so `None` only for an unchecked rule.
    pub fn jwks_source(&self) -> Option<JwksSource<'_>> {
        if let Some(inline) = &self.jwks {
            return Some(JwksSource::Inline(inline));
        }
        let uri = self.jwks_uri.as_deref()?;
        if let Some(path) = uri.strip_prefix("file://") {
            return Some(JwksSource::File(path));
        }
        let rest = uri.strip_prefix("http://")?;
        let authority = rest.split('/').next().unwrap_or_default();
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().ok().filter(|p| *p > 0)?),
            None => (authority, 80),
        };
        (!host.is_empty()).then_some(JwksSource::Http { host, port })
    }
}

/// An HTTP header name as Envoy takes it (RFC 7230 token characters, lower case not required).
fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A JSON Web Key Set with at least one usable public key (Envoy refuses the whole listener
/// otherwise); each key is read as a verifier would read it.
fn check_jwks(jwks: &str) -> Result<(), String> {
    let value: serde_json::Value = serde_json::from_str(jwks)
        .map_err(|e| format!("not JSON ({e}); expected a JSON Web Key Set"))?;
    let keys = value
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or("not a JSON Web Key Set (a JSON object with a `keys` list)")?;
    if keys.is_empty() {
        return Err("no keys: a key set needs at least one public key".into());
    }
    for (i, key) in keys.iter().enumerate() {
        let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(key.clone())
            .map_err(|e| format!("keys[{i}]: not a JSON Web Key: {e}"))?;
        jsonwebtoken::DecodingKey::from_jwk(&jwk)
            .map_err(|e| format!("keys[{i}]: not a usable public key: {e}"))?;
    }
    Ok(())
}

pub fn validate_request_authentication(spec: &RequestAuthenticationSpec) -> Result<(), String> {
    if spec.selector.is_some() && (spec.target_ref.is_some() || !spec.target_refs.is_empty()) {
        return Err("selector and targetRef(s): only one of them may be set".into());
    }
    let mut issuers = std::collections::BTreeSet::new();
    for (i, rule) in spec.jwt_rules.iter().enumerate() {
        let at = format!("jwtRules[{i}]");
        if rule.issuer.is_empty() {
            return Err(format!("{at}.issuer: required"));
        }
        if !issuers.insert(rule.issuer.as_str()) {
            return Err(format!(
                "{at}.issuer: {:?} is named by an earlier rule",
                rule.issuer
            ));
        }
        match (&rule.jwks, &rule.jwks_uri) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{at}: jwks and jwksUri: only one of them may be set"
                ));
            }
            (None, None) => {
                return Err(format!(
                    "{at}: jwks or jwksUri is required (keys are not discovered from the issuer here)"
                ));
            }
            (Some(jwks), None) => check_jwks(jwks).map_err(|e| format!("{at}.jwks: {e}"))?,
            (None, Some(uri)) => {
                if rule.jwks_source().is_none() {
                    return Err(format!(
                        "{at}.jwksUri: {uri:?}: expected http://SERVICE[:PORT]/PATH (a mesh service) or file:///PATH"
                    ));
                }
            }
        }
        for (j, a) in rule.audiences.iter().enumerate() {
            if a.is_empty() {
                return Err(format!("{at}.audiences[{j}]: empty value"));
            }
        }
        for (j, h) in rule.from_headers.iter().enumerate() {
            if !is_header_name(&h.name) {
                return Err(format!(
                    "{at}.fromHeaders[{j}].name: {:?} is not a header name",
                    h.name
                ));
            }
        }
        for (j, p) in rule.from_params.iter().enumerate() {
            if p.is_empty() {
                return Err(format!("{at}.fromParams[{j}]: empty value"));
            }
        }
        for (j, c) in rule.from_cookies.iter().enumerate() {
            if c.is_empty() {
                return Err(format!("{at}.fromCookies[{j}]: empty value"));
            }
        }
        if let Some(h) = &rule.output_payload_to_header
            && !is_header_name(h)
        {
            return Err(format!(
                "{at}.outputPayloadToHeader: {h:?} is not a header name"
            ));
        }
        for (j, c) in rule.output_claim_to_headers.iter().enumerate() {
            if !is_header_name(&c.header) {
                return Err(format!(
                    "{at}.outputClaimToHeaders[{j}].header: {:?} is not a header name",
                    c.header
                ));
            }
            if c.claim.is_empty() {
                return Err(format!("{at}.outputClaimToHeaders[{j}].claim: required"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str) -> Result<(), String> {
        crate::config_store::check_spec::<RequestAuthenticationSpec>(
            yaml,
            validate_request_authentication,
        )
    }

    #[test]
    fn rules_are_checked_by_field() {
        let jwks = r#"'{"keys": [{"kty": "EC", "crv": "P-256", "x": "gwK2cGIhiZ9bwaEBeJFV3TM0e8bQpcBOGYsHVUbjoew", "y": "c5seC0IjLdQobgFFRX4pTRvwgwoRhVp9a1EYfSf5uHQ"}]}'"#;
        for ok in [
            format!("jwtRules: [{{issuer: a, jwks: {jwks}}}]"),
            "jwtRules: [{issuer: a, jwksUri: 'http://keys.auth.svc.cluster.local:8080/jwks'}, {issuer: b, jwksUri: 'file:///etc/jwks.json', fromHeaders: [{name: x-jwt, prefix: 'Bearer '}], outputClaimToHeaders: [{header: x-sub, claim: sub}]}]".to_string(),
        ] {
            assert_eq!(check(&ok), Ok(()), "{ok}");
        }
        for (bad, expect) in [
            (
                "jwtRules: [{jwks: '{}'}]".to_string(),
                "jwtRules[0].issuer: required",
            ),
            (
                "jwtRules: [{issuer: a}]".to_string(),
                "jwks or jwksUri is required",
            ),
            (
                "jwtRules: [{issuer: a, jwks: '[1]'}]".to_string(),
                "jwtRules[0].jwks: not a JSON Web Key Set",
            ),
            (
                "jwtRules: [{issuer: a, jwksUri: 'https://x/jwks'}]".to_string(),
                "jwtRules[0].jwksUri",
            ),
            (
                "jwtRules: [{issuer: a, jwksUri: 'http://x:0/j'}]".to_string(),
                "jwtRules[0].jwksUri",
            ),
            (
                format!("jwtRules: [{{issuer: a, jwks: {jwks}}}, {{issuer: a, jwks: {jwks}}}]"),
                "jwtRules[1].issuer",
            ),
            (
                format!("jwtRules: [{{issuer: a, jwks: {jwks}, audience: [x]}}]"),
                "unknown field `audience`",
            ),
            (
                format!("jwtRules: [{{issuer: a, jwks: {jwks}, fromHeaders: [{{name: 'a b'}}]}}]"),
                "fromHeaders[0].name",
            ),
            (
                format!("jwtRules: [{{issuer: a, jwks: {jwks}, timeout: 1y}}]"),
                "not a duration",
            ),
        ] {
            let err = check(&bad).expect_err(&bad);
            assert!(err.contains(expect), "{bad}: {err}");
        }
    }
}
