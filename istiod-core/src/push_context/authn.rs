//! PeerAuthentication and auto mTLS: the mTLS mode a workload accepts, by Istio's precedence
//! (`pilot/pkg/model/authentication.go`), and whether a client sends Istio mTLS to an endpoint
//! (auto mTLS).

use std::collections::BTreeMap;

use super::PushContext;
use crate::config_store::{Metadata, MtlsMode, PeerAuthenticationSpec};
use crate::model::{Endpoint, Service, ServicePort, TlsMode};
use crate::registry::selects;

/// The effective mTLS mode of a workload: the default mode and per-port overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundMtls {
    pub default: MtlsMode,
    pub ports: BTreeMap<u16, MtlsMode>,
}

impl InboundMtls {
    /// Mode on `port`; never `Unset` (which means PERMISSIVE, Istio's default).
    pub fn on_port(&self, port: u16) -> MtlsMode {
        self.ports.get(&port).copied().unwrap_or(self.default)
    }
}

impl PushContext {
    /// Whether auto mTLS is on (MeshConfig enableAutoMtls, default true).
    pub fn auto_mtls(&self) -> bool {
        self.mesh.enable_auto_mtls.unwrap_or(true)
    }

    /// Auto mTLS: whether a client sends Istio mutual TLS to `ep` on service port `port`: the
    /// endpoint has a sidecar and its PeerAuthentication does not disable mTLS on that port.
    pub fn endpoint_mtls(&self, svc: &Service, ep: &Endpoint, port: &ServicePort) -> bool {
        self.auto_mtls()
            && ep.tls_mode == TlsMode::Istio
            && self
                .inbound_mtls(&svc.namespace, &ep.labels)
                .on_port(ep.target_port(port))
                != MtlsMode::Disable
    }

    /// The mTLS mode a workload in `namespace` with `labels` accepts, by Istio's precedence:
    /// workload selector over namespace-wide over mesh-wide (root namespace), each inheriting
    /// from the next when UNSET; PERMISSIVE when nothing says otherwise.
    pub fn inbound_mtls(&self, namespace: &str, labels: &BTreeMap<String, String>) -> InboundMtls {
        let mode_of = |s: &PeerAuthenticationSpec| {
            s.mtls
                .as_ref()
                .and_then(|m| m.mode)
                .unwrap_or(MtlsMode::Unset)
        };
        let first = |pred: &dyn Fn(&Metadata, &PeerAuthenticationSpec) -> bool| {
            self.peer_authentications
                .iter()
                .find(|(m, s)| pred(m, s))
                .map(|(_, s)| s)
        };
        let root = self.root_namespace();
        let mesh = first(&|m, s| m.namespace() == root && s.selector.is_none());
        let ns = first(&|m, s| m.namespace() == namespace && s.selector.is_none());
        let workload = first(&|m, s| {
            m.namespace() == namespace
                && s.selector
                    .as_ref()
                    .is_some_and(|sel| selects(&sel.match_labels, labels))
        });
        let mut mode = MtlsMode::Permissive;
        for scope in [mesh, ns, workload].into_iter().flatten() {
            match mode_of(scope) {
                MtlsMode::Unset => {}
                m => mode = m,
            }
        }
        let ports = workload
            .map(|w| {
                w.port_level_mtls
                    .iter()
                    .filter_map(|(port, m)| match m.mode {
                        None | Some(MtlsMode::Unset) => None,
                        Some(mode) => Some((*port, mode)),
                    })
                    .collect()
            })
            .unwrap_or_default();
        InboundMtls {
            default: mode,
            ports,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_store::parse_file;
    use crate::push_context::from_yaml as push;
    use std::path::Path;

    #[test]
    fn peer_authentication_precedence() {
        let p = push(
            r#"
kind: PeerAuthentication
metadata: {name: mesh, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
---
kind: PeerAuthentication
metadata: {name: ns, namespace: legacy}
spec: {mtls: {mode: PERMISSIVE}}
---
kind: PeerAuthentication
metadata: {name: db, namespace: legacy}
spec:
  selector: {matchLabels: {app: db}}
  mtls: {mode: UNSET}
  portLevelMtls:
    5432: {mode: DISABLE}
"#,
        );
        let labels = |app: &str| BTreeMap::from([("app".to_string(), app.to_string())]);
        assert_eq!(
            p.inbound_mtls("shop", &labels("web")).default,
            MtlsMode::Strict
        );
        assert_eq!(
            p.inbound_mtls("legacy", &labels("web")).default,
            MtlsMode::Permissive
        );
        let db = p.inbound_mtls("legacy", &labels("db"));
        assert_eq!(db.default, MtlsMode::Permissive);
        assert_eq!(db.on_port(5432), MtlsMode::Disable);
        assert_eq!(db.on_port(5433), MtlsMode::Permissive);
        assert_eq!(
            push("").inbound_mtls("x", &BTreeMap::new()).default,
            MtlsMode::Permissive
        );
    }

    #[test]
    fn port_level_without_selector_is_rejected() {
        let e = parse_file(
            Path::new("pa.yaml"),
            "kind: PeerAuthentication\nmetadata: {name: p, namespace: n}\nspec:\n  portLevelMtls:\n    80: {mode: STRICT}\n",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("portLevelMtls requires a workload selector"),
            "{e}"
        );
        let e = parse_file(
            Path::new("pa.yaml"),
            "kind: PeerAuthentication\nmetadata: {name: p, namespace: n}\nspec: {mtls: {mode: STRIKT}}\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("pa.yaml: document 1"), "{e}");
    }
}
