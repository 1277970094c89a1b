//! Change classification: what a new snapshot changed from the one before it, so a change of
//! endpoints alone takes the EDS fast path (istiod's incremental EDS push, `pilot/pkg/xds/eds.go`).

use super::PushContext;
use crate::model::{Service, TlsMode};

/// What changed from the previous snapshot (generation − 1) to this one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Change {
    /// Anything may have changed: every type is regenerated and pushed.
    #[default]
    Full,
    /// Only the endpoints of these services (by hostname), in ways that leave clusters,
    /// listeners and routes as they were: the EDS fast path.
    Endpoints(std::collections::BTreeSet<String>),
}

impl PushContext {
    /// Everything but the version: two snapshots with equal content push nothing new.
    pub fn same_content(&self, other: &PushContext) -> bool {
        self.services == other.services && self.same_policies(other)
    }

    /// Everything but the services and the version.
    fn same_policies(&self, other: &PushContext) -> bool {
        self.mesh == other.mesh
            && self.subsets == other.subsets
            && self.destination_rules == other.destination_rules
            && self.routing == other.routing
            && self.peer_authentications == other.peer_authentications
            && self.authorization_policies == other.authorization_policies
            && self.request_authentications == other.request_authentications
            && self.sidecars == other.sidecars
            && self.gateways == other.gateways
            && self.secrets == other.secrets
            && self.scope_gateway_to_namespace == other.scope_gateway_to_namespace
            && self.trust_domain == other.trust_domain
            && self.envoy_filters == other.envoy_filters
            && self.reference_grants == other.reference_grants
    }

    /// Classifies the change from `old` to `self`: endpoint-only when every service is the same
    /// but for its endpoints, and those still have the same identities and TLS modes (which
    /// clusters carry), and the policies are unchanged.
    pub fn change_from(&self, old: &PushContext) -> Change {
        if self.services.len() != old.services.len() || !self.same_policies(old) {
            return Change::Full;
        }
        let identities = |s: &Service| {
            let mut v: Vec<(String, bool)> = s
                .endpoints
                .iter()
                .map(|e| (e.service_account.clone(), e.tls_mode == TlsMode::Istio))
                .collect();
            v.sort();
            v.dedup();
            v
        };
        let mut hosts = std::collections::BTreeSet::new();
        for (new, old) in self.services.iter().zip(&old.services) {
            if new.hostname != old.hostname
                || new.namespace != old.namespace
                || new.addresses != old.addresses
                || new.ports != old.ports
            {
                return Change::Full;
            }
            if new.endpoints != old.endpoints {
                if identities(new) != identities(old) {
                    return Change::Full;
                }
                hosts.insert(new.hostname.clone());
            }
        }
        Change::Endpoints(hosts)
    }
}
