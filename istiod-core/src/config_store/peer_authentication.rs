//! security.istio.io PeerAuthentication: the mTLS mode of a workload, namespace or mesh, and of
//! single ports.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::selector::PolicySelector;

/// security.istio.io PeerAuthentication: which mTLS mode the selected workloads accept.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct PeerAuthenticationSpec {
    pub selector: Option<PolicySelector>,
    pub mtls: Option<MtlsSpec>,
    /// Workload port → mode; only meaningful with a selector, as in Istio.
    pub port_level_mtls: BTreeMap<u16, MtlsSpec>,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct MtlsSpec {
    pub mode: Option<MtlsMode>,
}

/// PeerAuthentication's mTLS modes. UNSET inherits from the enclosing scope.
#[derive(Debug, Clone, Copy, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum MtlsMode {
    #[default]
    Unset,
    Disable,
    Permissive,
    Strict,
}

/// Port-level modes need a workload selector (as in Istio).
pub(super) fn validate_peer_authentication(spec: &PeerAuthenticationSpec) -> Result<(), String> {
    if !spec.port_level_mtls.is_empty() && spec.selector.is_none() {
        return Err("portLevelMtls requires a workload selector".to_string());
    }
    Ok(())
}
