//! The mesh config (`MeshConfigSpec`): the `mesh` key of Istio's ConfigMap, a MeshConfig
//! document, or istiod's `--meshConfig` file.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::metadata::{Metadata, unknown_fields};
use super::selector::LabelSelector;
use super::{ConfigError, locality, providers, traffic};

/// The mesh-wide settings istiod reads from its mesh config (the `mesh` key of the `istio`
/// ConfigMap, or the `--meshConfig` file). Acted on: trustDomain (checked against the control
/// plane's), trustDomainAliases, rootNamespace, enableAutoMtls, outboundTrafficPolicy and the
/// ext_authz entries of extensionProviders; the rest is kept as written.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MeshConfigSpec {
    #[serde(default)]
    pub trust_domain: Option<String>,
    #[serde(default)]
    pub root_namespace: Option<String>,
    /// Other trust domains whose identities are this mesh's (AuthorizationPolicy principals).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trust_domain_aliases: Vec<String>,
    #[serde(default)]
    pub enable_auto_mtls: Option<bool>,
    #[serde(default)]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
    /// External authorizers (and other providers, kept as written) that CUSTOM
    /// AuthorizationPolicies name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extension_providers: Vec<providers::ExtensionProvider>,
    /// The legacy access log: a file (`/dev/stdout`) every sidecar and gateway writes, when no
    /// Telemetry or default provider configures access logging.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log_format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log_encoding: Option<providers::LogEncoding>,
    /// Tracing through the bootstrap's tracer (ProxyConfig `tracing`) when no Telemetry or
    /// default provider configures it; Istio's default is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_tracing: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_providers: Option<providers::DefaultProviders>,
    /// The namespaces the control plane sees (`config_store::discovery`); none: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discovery_selectors: Vec<LabelSelector>,
    /// Locality load balancing for every service no DestinationRule sets it for (unset: Istio's
    /// default, on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality_lb_setting: Option<locality::LocalityLbSetting>,
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

impl MeshConfigSpec {
    /// `other`'s fields over ours (a later source overrides an earlier one field by field).
    pub fn merge(&mut self, other: &MeshConfigSpec) {
        if other.trust_domain.is_some() {
            self.trust_domain.clone_from(&other.trust_domain);
        }
        if other.root_namespace.is_some() {
            self.root_namespace.clone_from(&other.root_namespace);
        }
        if !other.extension_providers.is_empty() {
            self.extension_providers
                .clone_from(&other.extension_providers);
        }
        if !other.trust_domain_aliases.is_empty() {
            self.trust_domain_aliases
                .clone_from(&other.trust_domain_aliases);
        }
        if other.enable_auto_mtls.is_some() {
            self.enable_auto_mtls = other.enable_auto_mtls;
        }
        if other.outbound_traffic_policy.is_some() {
            self.outbound_traffic_policy
                .clone_from(&other.outbound_traffic_policy);
        }
        if other.access_log_file.is_some() {
            self.access_log_file.clone_from(&other.access_log_file);
        }
        if other.access_log_format.is_some() {
            self.access_log_format.clone_from(&other.access_log_format);
        }
        if other.access_log_encoding.is_some() {
            self.access_log_encoding = other.access_log_encoding;
        }
        if other.enable_tracing.is_some() {
            self.enable_tracing = other.enable_tracing;
        }
        if other.default_providers.is_some() {
            self.default_providers.clone_from(&other.default_providers);
        }
        if !other.discovery_selectors.is_empty() {
            self.discovery_selectors
                .clone_from(&other.discovery_selectors);
        }
        if other.locality_lb_setting.is_some() {
            self.locality_lb_setting
                .clone_from(&other.locality_lb_setting);
        }
        self.rest
            .extend(other.rest.iter().map(|(k, v)| (k.clone(), v.clone())));
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        OutboundTrafficPolicy::check(self.outbound_traffic_policy.as_ref())?;
        for (i, p) in self.extension_providers.iter().enumerate() {
            p.check()
                .map_err(|e| format!("extensionProviders[{i}]{e}"))?;
        }
        for (i, s) in self.discovery_selectors.iter().enumerate() {
            s.check()
                .map_err(|e| format!("discoverySelectors[{i}].{e}"))?;
        }
        if let Some(l) = &self.locality_lb_setting {
            l.check("localityLbSetting")?;
        }
        if let Some(ns) = &self.root_namespace
            && !traffic::is_dns1123_label(ns)
        {
            return Err(format!("rootNamespace: {ns:?} is not a namespace name"));
        }
        if let Some(td) = &self.trust_domain
            && (td.is_empty() || td.contains('/') || td.contains(char::is_whitespace))
        {
            return Err(format!("trustDomain: {td:?} is not a trust domain"));
        }
        Ok(())
    }
}

/// Parses a mesh config file (plain MeshConfig YAML, as istiod's `--meshConfig`).
pub fn parse_mesh_config(path: &Path, contents: &str) -> Result<MeshConfigSpec, ConfigError> {
    let (spec, warnings) = parse_mesh_config_warned(path, contents)?;
    for w in warnings {
        tracing::warn!(file = %path.display(), "mesh config: {w}");
    }
    Ok(spec)
}

/// [`parse_mesh_config`], with the fields it does not know (inside typed parts such as an
/// extension provider's) named rather than logged.
pub(super) fn parse_mesh_config_warned(
    path: &Path,
    contents: &str,
) -> Result<(MeshConfigSpec, Vec<String>), ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid {
        file: path.to_path_buf(),
        doc: 1,
        reason,
    };
    let value: serde_json::Value = if contents.trim().is_empty() {
        serde_json::Value::Object(Default::default())
    } else {
        serde_yaml_ng::from_str(contents).map_err(|e| invalid(e.to_string()))?
    };
    let spec: MeshConfigSpec =
        serde_json::from_value(value.clone()).map_err(|e| invalid(format!("MeshConfig: {e}")))?;
    spec.validate()
        .map_err(|e| invalid(format!("MeshConfig: {e}")))?;
    let mut warnings = Vec::new();
    if let Ok(back) = serde_json::to_value(&spec) {
        unknown_fields(&value, &back, "mesh", &mut warnings);
    }
    Ok((spec, warnings))
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct OutboundTrafficPolicy {
    /// `REGISTRY_ONLY` or `ALLOW_ANY` (the default).
    pub mode: Option<String>,
}

impl OutboundTrafficPolicy {
    /// `Some(true)` for REGISTRY_ONLY, `Some(false)` for ALLOW_ANY, `None` when unset.
    pub fn registry_only(policy: Option<&Self>) -> Option<bool> {
        policy
            .and_then(|p| p.mode.as_deref())
            .map(|m| m == "REGISTRY_ONLY")
    }

    /// The mode is one Istio knows.
    pub(super) fn check(policy: Option<&Self>) -> Result<(), String> {
        match policy.and_then(|p| p.mode.as_deref()) {
            None | Some("REGISTRY_ONLY" | "ALLOW_ANY") => Ok(()),
            Some(mode) => Err(format!(
                "outboundTrafficPolicy.mode: {mode:?} is not REGISTRY_ONLY or ALLOW_ANY"
            )),
        }
    }
}

/// The mesh config in the `mesh` key of Istio's ConfigMap; `None` when it has no such key.
pub(super) fn config_map_mesh(
    data: Option<&BTreeMap<String, String>>,
    meta: &mut Metadata,
) -> Result<Option<MeshConfigSpec>, String> {
    let Some(text) = data.and_then(|d| d.get("mesh")) else {
        return Ok(None);
    };
    let (spec, warnings) = parse_mesh_config_warned(Path::new(""), text).map_err(|e| match e {
        ConfigError::Invalid { reason, .. } => {
            format!("ConfigMap {}: data.mesh: {reason}", meta.name)
        }
        other => other.to_string(),
    })?;
    meta.warnings
        .extend(warnings.into_iter().map(|w| format!("data.{w}")));
    Ok(Some(spec))
}
