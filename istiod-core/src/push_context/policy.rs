//! Which security policies apply to a workload, and the ext_authz providers their CUSTOM rules
//! name: decided once in the snapshot, for the authorization and authentication generators
//! alike, as istiod's `model/authorization.go` and `model/policyattachment.go` select them.

use std::collections::BTreeMap;

use crate::config_store::providers::ExtensionProvider;
use crate::config_store::selector::PolicySelector;
use crate::config_store::{MeshConfigSpec, Metadata};

use super::PushContext;

/// Whether a security policy (AuthorizationPolicy, RequestAuthentication) in `meta`'s
/// namespace with `selector` applies to a workload in `namespace` with `labels`: those of the
/// root namespace apply mesh-wide, others to their own namespace, narrowed by the selector. A
/// policy bound by targetRef applies to gateways and waypoints only.
pub fn selects(
    push: &PushContext,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    meta: &Metadata,
    selector: Option<&PolicySelector>,
    targeted: bool,
) -> bool {
    (meta.namespace() == push.root_namespace() || meta.namespace() == namespace)
        && !targeted
        && selector.is_none_or(|sel| crate::registry::selects(&sel.match_labels, labels))
}

/// A CUSTOM policy's provider, resolved: its mesh config entry, the host of its service, the
/// outbound cluster that reaches it, and whether it speaks gRPC.
pub struct Target<'a> {
    pub provider: &'a ExtensionProvider,
    pub host: &'a str,
    pub cluster: String,
    pub grpc: bool,
}

/// Why a CUSTOM policy's provider cannot be asked (the policy's rules then deny).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("no extensionProviders entry is named {name:?}")]
    Unknown { name: String },
    #[error("extension provider {name:?} is no ext_authz provider")]
    NotExtAuthz { name: String },
    #[error("extension provider {name:?}: {host:?} is no service of the mesh")]
    NotAService { name: String, host: String },
}

/// The provider named `name` in `mesh`, if it can be asked: an ext_authz entry whose service
/// `is_service` knows.
pub fn target<'a>(
    mesh: &'a MeshConfigSpec,
    name: &str,
    is_service: &dyn Fn(&str) -> bool,
) -> Result<Target<'a>, ProviderError> {
    let provider = mesh
        .extension_providers
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| ProviderError::Unknown {
            name: name.to_string(),
        })?;
    let (host, port, grpc) = provider
        .ext_authz()
        .ok_or_else(|| ProviderError::NotExtAuthz {
            name: name.to_string(),
        })?;
    if !is_service(host) {
        return Err(ProviderError::NotAService {
            name: name.to_string(),
            host: host.to_string(),
        });
    }
    Ok(Target {
        provider,
        host,
        cluster: crate::model::outbound_cluster_name(port, host),
        grpc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_that_cannot_be_asked_says_why() {
        let push = super::super::from_yaml(
            r#"
kind: MeshConfig
metadata: {name: mesh}
spec:
  extensionProviders:
  - name: http-authz
    envoyExtAuthzHttp: {service: authz.shop.svc.cluster.local, port: 8000}
"#,
        );
        let known = |host: &str| host == "authz.shop.svc.cluster.local";
        let cluster = target(&push.mesh, "http-authz", &known).map(|t| t.cluster);
        assert_eq!(
            cluster,
            Ok("outbound|8000||authz.shop.svc.cluster.local".to_string())
        );
        let err = target(&push.mesh, "other", &known).err();
        assert_eq!(
            err,
            Some(ProviderError::Unknown {
                name: "other".into()
            })
        );
        let err = target(&push.mesh, "http-authz", &|_| false).err();
        assert_eq!(
            err.map(|e| e.to_string()).as_deref(),
            Some(
                "extension provider \"http-authz\": \"authz.shop.svc.cluster.local\" is no service of the mesh"
            )
        );
    }
}
