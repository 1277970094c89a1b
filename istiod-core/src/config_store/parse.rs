//! One document as a typed resource: its kind checked against the API group it is served in,
//! its metadata and spec read, fields a typed spec does not know kept as warnings, the spec
//! validated; `parse_file` for every document of a file.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::authorization::validate_authorization_policy;
use super::destination_rule::validate_destination_rule;
use super::kubernetes::{endpoint_slice, pod_info};
use super::mesh_config::config_map_mesh;
use super::metadata::{parse_metadata, unknown_fields};
use super::peer_authentication::validate_peer_authentication;
use super::request_authentication::validate_request_authentication;
use super::service_entry::{validate_service_entry, validate_workload_group};
use super::sidecar::validate_sidecar;
use super::virtual_service::validate_virtual_service;
use super::*;

#[derive(Deserialize)]
pub(super) struct Envelope {
    #[serde(default, rename = "apiVersion")]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
    #[serde(default)]
    spec: Option<serde_json::Value>,
    #[serde(default)]
    subsets: Option<serde_json::Value>,
    #[serde(default)]
    endpoints: Option<serde_json::Value>,
    #[serde(default)]
    ports: Option<serde_json::Value>,
    #[serde(default, rename = "addressType")]
    address_type: Option<String>,
    #[serde(default)]
    data: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "stringData")]
    string_data: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "type")]
    secret_type: Option<String>,
    #[serde(default)]
    status: Option<serde_json::Value>,
}

/// One document as a resource; `None`: an empty document, or one that is no config of ours (a
/// Secret without TLS material, a ConfigMap other than Istio's).
pub(crate) fn parse_document(value: serde_json::Value) -> Result<Option<Resource>, String> {
    if value.is_null() {
        return Ok(None);
    }
    let Envelope {
        api_version,
        kind,
        metadata,
        spec,
        subsets,
        endpoints,
        ports,
        address_type,
        data,
        string_data,
        secret_type,
        status,
    } = serde_json::from_value(value).map_err(|e| e.to_string())?;
    let kind = kind.ok_or("missing field `kind`")?;
    if gateway_api::in_group(api_version.as_deref()) && gateway_api::is_kind(&kind) {
        let av = api_version.as_deref().unwrap_or_default();
        let version = av.rsplit_once('/').map(|(_, v)| v).unwrap_or_default();
        if !gateway_api::VERSIONS.contains(&version) {
            return Err(format!(
                "apiVersion {av:?}: {kind} is served in {} versions {}",
                gateway_api::GROUP,
                gateway_api::VERSIONS.join(", ")
            ));
        }
        let meta = parse_metadata(&metadata.ok_or("missing field `metadata`")?)?;
        let object = gateway_api::parse(&kind, spec.unwrap_or(serde_json::Value::Null))
            .map_err(|e| format!("{kind} {}: {e}", meta.name))?;
        return Ok(Some(Resource::GatewayApi(meta, Box::new(object))));
    }
    check_api_version(&kind, api_version.as_deref())?;
    let raw_meta = metadata.ok_or("missing field `metadata`")?;
    let mut meta = parse_metadata(&raw_meta)?;
    let spec = spec.unwrap_or(serde_json::Value::Null);
    let meta_name = meta.name.clone();
    let typed = |what: &str| format!("{kind} {meta_name}: invalid {what}");
    let resource = match kind.as_str() {
        "ServiceEntry" => {
            let mut spec: ServiceEntrySpec = plain_spec(spec, &typed, validate_service_entry)?;
            // Unparsable entries are left out, as istiod reads them.
            spec.status_addresses = status
                .as_ref()
                .and_then(|s| s.get("addresses"))
                .and_then(|a| a.as_array())
                .into_iter()
                .flatten()
                .filter_map(|a| {
                    let host = a.get("host")?.as_str()?.to_string();
                    let value = a.get("value")?.as_str()?.parse().ok()?;
                    Some((host, value))
                })
                .collect();
            Resource::ServiceEntry(meta, Box::new(spec))
        }
        "WorkloadEntry" => Resource::WorkloadEntry(meta, plain_spec(spec, &typed, |_| Ok(()))?),
        "Service" => {
            let external: Vec<String> = spec["externalIPs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|ip| ip.as_str().map(str::to_string))
                .collect();
            let mut svc: super::ServiceSpec = plain_spec(spec, &typed, |_| Ok(()))?;
            svc.published_ips = status
                .as_ref()
                .and_then(|s| s["loadBalancer"]["ingress"].as_array())
                .into_iter()
                .flatten()
                .filter_map(|i| i["ip"].as_str().map(str::to_string))
                .collect();
            if svc.published_ips.is_empty() {
                svc.published_ips = external;
            }
            Resource::Service(meta, svc)
        }
        "Endpoints" => {
            let subsets: Vec<EndpointSubset> =
                serde_json::from_value(subsets.unwrap_or(serde_json::Value::Array(vec![])))
                    .map_err(|e| format!("{}: {e}", typed("subsets")))?;
            Resource::Endpoints(meta, subsets)
        }
        "PeerAuthentication" => {
            let spec = plain_spec(spec, &typed, validate_peer_authentication)?;
            Resource::PeerAuthentication(meta, spec)
        }
        "Sidecar" => Resource::Sidecar(meta, plain_spec(spec, &typed, validate_sidecar)?),
        "EndpointSlice" => {
            let slice = endpoint_slice(address_type, endpoints, ports, &meta, &typed)?;
            Resource::EndpointSlice(meta, slice)
        }
        "VirtualService" => {
            let spec = checked_spec(spec, &typed, validate_virtual_service, &mut meta)?;
            Resource::VirtualService(meta, spec)
        }
        "DestinationRule" => {
            let spec = checked_spec(spec, &typed, validate_destination_rule, &mut meta)?;
            Resource::DestinationRule(meta, Box::new(spec))
        }
        "Gateway" => {
            let spec = checked_spec(spec, &typed, gateway::validate_gateway, &mut meta)?;
            Resource::Gateway(meta, spec)
        }
        "AuthorizationPolicy" => {
            let mut spec = checked_spec(spec, &typed, validate_authorization_policy, &mut meta)?;
            spec.dry_run = dry_run(&raw_meta, spec.action, &typed)?;
            warn_if_targeted(spec.targeted(), &mut meta);
            Resource::AuthorizationPolicy(meta, Box::new(spec))
        }
        "RequestAuthentication" => {
            let spec = checked_spec(spec, &typed, validate_request_authentication, &mut meta)?;
            warn_if_targeted(spec.targeted(), &mut meta);
            Resource::RequestAuthentication(meta, Box::new(spec))
        }
        "Telemetry" => {
            let spec = checked_spec(spec, &typed, telemetry::validate_telemetry, &mut meta)?;
            warn_if_targeted(spec.targeted(), &mut meta);
            Resource::Telemetry(meta, Box::new(spec))
        }
        "EnvoyFilter" => {
            let spec: envoy_filter::EnvoyFilterSpec =
                checked_spec(spec, &typed, |_| Ok(()), &mut meta)?;
            let mut warnings = Vec::new();
            envoy_filter::validate(&spec, &mut warnings)
                .map_err(|e| format!("{}: spec.{e}", typed("spec")))?;
            meta.warnings.extend(warnings);
            Resource::EnvoyFilter(meta, Box::new(spec))
        }
        "Namespace" => Resource::Namespace(meta),
        "Pod" => {
            let mut pod = pod_info(&spec, status.as_ref(), &typed)?;
            pod.workload_name = pod_workload_name(&raw_meta, &meta);
            Resource::Pod(meta, pod)
        }
        "Node" => Resource::Node(meta),
        // Secrets with TLS material (a Gateway's credentialName); other Secrets are not ours.
        "Secret" => {
            let secret = gateway::tls_secret(
                secret_type.as_deref(),
                data.as_ref().unwrap_or(&BTreeMap::new()),
                string_data.as_ref().unwrap_or(&BTreeMap::new()),
            )
            .map_err(|e| format!("Secret {}: {e}", meta.name))?;
            match secret {
                Some(s) => Resource::Secret(meta, s),
                None => return Ok(None),
            }
        }
        // Istio's mesh config lives in the `mesh` key of the `istio` (or `istio-<revision>`)
        // ConfigMap; other ConfigMaps are not config of ours.
        "ConfigMap" if meta.name == "istio" || meta.name.starts_with("istio-") => {
            match config_map_mesh(data.as_ref(), &mut meta)? {
                Some(spec) => Resource::MeshConfig(meta, Box::new(spec)),
                None => return Ok(None),
            }
        }
        "ConfigMap" => return Ok(None),
        "MeshConfig" => {
            let spec = if spec.is_null() {
                serde_json::json!({})
            } else {
                spec
            };
            let spec = checked_spec(spec, &typed, MeshConfigSpec::validate, &mut meta)?;
            Resource::MeshConfig(meta, Box::new(spec))
        }
        "WorkloadGroup" => {
            let spec = plain_spec(spec, &typed, validate_workload_group)?;
            Resource::WorkloadGroup(meta, Box::new(spec))
        }
        other => {
            return Err(match api_version {
                Some(av) => format!("unsupported kind {other:?} ({av})"),
                None => format!("unsupported kind {other:?}"),
            });
        }
    };
    Ok(Some(resource))
}

/// The API group and versions a kind of ours is served in (Istio's CRDs, Kubernetes' kinds);
/// `None` for kinds that are not ours, and for `MeshConfig`, which is this project's own.
pub(super) fn served_in(kind: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match kind {
        "ServiceEntry" | "WorkloadEntry" | "WorkloadGroup" | "VirtualService"
        | "DestinationRule" | "Gateway" | "Sidecar" => {
            ("networking.istio.io", &["v1", "v1beta1", "v1alpha3"])
        }
        "PeerAuthentication" | "AuthorizationPolicy" | "RequestAuthentication" => {
            ("security.istio.io", &["v1", "v1beta1"])
        }
        "Telemetry" => ("telemetry.istio.io", &["v1", "v1alpha1"]),
        "EnvoyFilter" => ("networking.istio.io", &["v1alpha3"]),
        "Service" | "Endpoints" | "Namespace" | "Secret" | "ConfigMap" | "Pod" | "Node" => {
            ("", &["v1"])
        }
        "EndpointSlice" => ("discovery.k8s.io", &["v1"]),
        _ => return None,
    })
}

/// A kind is ours only in its own API group: a `gateway.networking.k8s.io` Gateway is not an
/// Istio Gateway. A document without `apiVersion` is read as the kind of that name.
pub(super) fn check_api_version(kind: &str, api_version: Option<&str>) -> Result<(), String> {
    let (Some(av), Some((group, versions))) = (api_version, served_in(kind)) else {
        return Ok(());
    };
    let (g, v) = av.rsplit_once('/').unwrap_or(("", av));
    let named = if group.is_empty() { "core" } else { group };
    if g != group {
        return Err(format!(
            "unsupported kind {kind:?} ({av}): only the {named} {kind} is served here"
        ));
    }
    if !versions.contains(&v) {
        return Err(format!(
            "apiVersion {av:?}: {kind} is served in {named} versions {}",
            versions.join(", ")
        ));
    }
    Ok(())
}

/// The spec as `T`, then `check`ed; errors name the kind and the resource (`typed`). Unlike
/// [`checked_spec`], fields `T` does not know pass without a warning.
pub(super) fn plain_spec<T: serde::de::DeserializeOwned>(
    spec: serde_json::Value,
    typed: &dyn Fn(&str) -> String,
    check: fn(&T) -> Result<(), String>,
) -> Result<T, String> {
    let parsed: T = serde_json::from_value(spec).map_err(|e| format!("{}: {e}", typed("spec")))?;
    check(&parsed).map_err(|e| format!("{}: {e}", typed("spec")))?;
    Ok(parsed)
}

/// The spec as `T`, then `check`ed; errors name the kind, the resource and the field.
/// Fields the typed spec does not know are warnings on `meta`, naming each.
pub(super) fn checked_spec<T: serde::de::DeserializeOwned + serde::Serialize>(
    spec: serde_json::Value,
    typed: &dyn Fn(&str) -> String,
    check: fn(&T) -> Result<(), String>,
    meta: &mut Metadata,
) -> Result<T, String> {
    let parsed: T = serde_path_to_error::deserialize(&spec).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            "spec".to_string()
        } else {
            format!("spec.{path}")
        };
        format!("{}: {at}: {}", typed("spec"), e.inner())
    })?;
    check(&parsed).map_err(|e| format!("{}: spec.{e}", typed("spec")))?;
    if let Ok(back) = serde_json::to_value(&parsed) {
        unknown_fields(&spec, &back, "spec", &mut meta.warnings);
    }
    Ok(parsed)
}

/// An AuthorizationPolicy's dry-run annotation: `"true"` or `"false"` (absent: false), and
/// never on a CUSTOM policy (as in Istio).
pub(super) fn dry_run(
    raw_meta: &serde_json::Value,
    action: authorization::Action,
    typed: &dyn Fn(&str) -> String,
) -> Result<bool, String> {
    let annotation = raw_meta
        .get("annotations")
        .and_then(|a| a.get(authorization::DRY_RUN_ANNOTATION));
    let dry_run = match annotation.map(|v| (v.as_str(), v)) {
        None => false,
        Some((Some("true"), _)) => true,
        Some((Some("false"), _)) => false,
        Some((_, v)) => {
            return Err(format!(
                "{}: metadata.annotations.{}: {v} is not \"true\" or \"false\"",
                typed("metadata"),
                authorization::DRY_RUN_ANNOTATION
            ));
        }
    };
    if dry_run && action == authorization::Action::Custom {
        return Err(format!(
            "{}: metadata.annotations.{}: a CUSTOM policy cannot be a dry run (as in Istio)",
            typed("metadata"),
            authorization::DRY_RUN_ANNOTATION
        ));
    }
    Ok(dry_run)
}

/// A security policy bound by targetRef applies to gateways and waypoints, never to a sidecar
/// (as in Istio): accepted, with a warning saying so.
pub(super) fn warn_if_targeted(targeted: bool, meta: &mut Metadata) {
    if targeted {
        meta.warnings.push(
            "spec.targetRef(s): a policy bound by targetRef applies to gateways and waypoints, \
             never to a sidecar (as in Istio); this policy applies to no sidecar here"
                .to_string(),
        );
    }
}

/// A spec from YAML, then `validate`d (for the typed resources' unit tests).
#[cfg(test)]
pub(crate) fn check_spec<T: serde::de::DeserializeOwned>(
    yaml: &str,
    validate: fn(&T) -> Result<(), String>,
) -> Result<(), String> {
    let spec: T = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
    validate(&spec)
}
