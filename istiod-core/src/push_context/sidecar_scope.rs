//! Sidecar scope: which Sidecar resource applies to a proxy and what it lets the proxy see
//! (istiod's `pilot/pkg/model/sidecar.go`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::PushContext;
use crate::config_store::OutboundTrafficPolicy;
use crate::model::Service;
use crate::registry::selects;

/// Sidecar scopes by (proxy id, node labels).
pub type ScopeMemo = HashMap<(String, BTreeMap<String, String>), Option<Arc<SidecarScope>>>;

/// What a Sidecar resource lets one proxy see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarScope {
    /// `namespace/name` of the Sidecar.
    pub name: String,
    /// Egress listeners, each for one port or (None) for every port no other one names.
    pub egress: Vec<ScopeEgress>,
    /// Ingress listeners: the workload's inbound ports, each with where it forwards. Empty:
    /// the inbound ports come from the services that select the workload.
    pub ingress: Vec<ScopeIngress>,
    /// outboundTrafficPolicy REGISTRY_ONLY: unknown destinations go to the BlackHoleCluster.
    pub registry_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeEgress {
    pub port: Option<u16>,
    /// (namespace or `*`/`~`, DNS name or `*`/`*.suffix`).
    pub hosts: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeIngress {
    pub port: u16,
    pub protocol: crate::model::Protocol,
    pub endpoint: crate::config_store::IngressEndpoint,
}

fn host_matches(hosts: &[(String, String)], svc: &Service) -> bool {
    hosts.iter().any(|(ns, name)| {
        let ns_ok = ns == "*" || (ns != "~" && *ns == svc.namespace);
        let name_ok = name == "*"
            || *name == svc.hostname
            || name
                .strip_prefix('*')
                .is_some_and(|suffix| svc.hostname.ends_with(suffix));
        ns_ok && name_ok
    })
}

impl SidecarScope {
    /// Whether the proxy sees `svc` on any port (its DNS names, for NDS).
    pub fn sees(&self, svc: &Service) -> bool {
        svc.ports.iter().any(|p| self.sees_port(svc, p.port))
    }

    /// Whether the proxy sees `svc` on `port`: by the egress listeners for that port if any
    /// names it, else by the port-less ones.
    pub fn sees_port(&self, svc: &Service, port: u16) -> bool {
        let for_port: Vec<&ScopeEgress> = self
            .egress
            .iter()
            .filter(|e| e.port == Some(port))
            .collect();
        let listeners = if for_port.is_empty() {
            self.egress.iter().filter(|e| e.port.is_none()).collect()
        } else {
            for_port
        };
        listeners.iter().any(|e| host_matches(&e.hosts, svc))
    }
}

impl PushContext {
    /// The Sidecar that applies to `proxy`, as Istio picks it: one in the proxy's namespace
    /// whose workload selector matches, else one there without a selector, else the root
    /// namespace's default. `None`: the proxy sees every service (no Sidecar applies).
    pub fn sidecar_scope(&self, proxy: &crate::model::Proxy) -> Option<Arc<SidecarScope>> {
        if self.sidecars.is_empty() {
            return None;
        }
        let key = (proxy.id.clone(), proxy.labels.clone());
        if let Some(known) = self
            .cache
            .scopes
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return known;
        }
        let scope = self.find_sidecar_scope(proxy).map(Arc::new);
        if let Ok(mut m) = self.cache.scopes.lock() {
            m.insert(key, scope.clone());
        }
        scope
    }

    fn find_sidecar_scope(&self, proxy: &crate::model::Proxy) -> Option<SidecarScope> {
        let labels = proxy.workload_labels(&self.services);
        let own_ns = proxy.namespace.as_str();
        let chosen = self
            .sidecars
            .iter()
            .find(|(m, s)| {
                m.namespace() == own_ns
                    && s.workload_selector
                        .as_ref()
                        .is_some_and(|sel| !sel.labels.is_empty() && selects(&sel.labels, &labels))
            })
            .or_else(|| {
                self.sidecars
                    .iter()
                    .find(|(m, s)| m.namespace() == own_ns && s.workload_selector.is_none())
            })
            .or_else(|| {
                self.sidecars.iter().find(|(m, s)| {
                    m.namespace() == self.root_namespace() && s.workload_selector.is_none()
                })
            })?;
        let (meta, spec) = chosen;
        let egress = spec
            .egress
            .iter()
            .map(|e| ScopeEgress {
                port: e.port.as_ref().and_then(|p| u16::try_from(p.number).ok()),
                hosts: e
                    .hosts
                    .iter()
                    .filter_map(|h| h.split_once('/'))
                    .map(|(ns, name)| {
                        let ns = match ns {
                            "." => proxy.namespace.clone(),
                            other => other.to_string(),
                        };
                        (ns, name.to_string())
                    })
                    .collect(),
            })
            .collect();
        let ingress = spec
            .ingress
            .iter()
            .filter_map(|i| {
                let port = u16::try_from(i.port.number).ok()?;
                let endpoint = match &i.default_endpoint {
                    Some(raw) => crate::config_store::IngressEndpoint::parse(raw).ok()?,
                    None => crate::config_store::IngressEndpoint::Workload(port),
                };
                Some(ScopeIngress {
                    port,
                    protocol: crate::model::Protocol::infer(
                        i.port.protocol.as_deref(),
                        &i.port.name,
                    ),
                    endpoint,
                })
            })
            .collect();
        Some(SidecarScope {
            name: format!("{}/{}", meta.namespace(), meta.name),
            egress,
            ingress,
            // The Sidecar's own policy, else the mesh's.
            registry_only: OutboundTrafficPolicy::registry_only(
                spec.outbound_traffic_policy.as_ref(),
            )
            .unwrap_or_else(|| self.mesh_registry_only()),
        })
    }

    /// The proxy's inbound ports: its Sidecar's ingress listeners when it has any, else every
    /// target port of the services whose endpoints it is (HTTP wins if two disagree).
    /// `endpoint` is where a Sidecar ingress listener forwards; `None`: the original
    /// destination.
    pub fn inbound_ports(
        &self,
        proxy: &crate::model::Proxy,
    ) -> BTreeMap<
        u16,
        (
            crate::model::Protocol,
            Option<crate::config_store::IngressEndpoint>,
        ),
    > {
        if let Some(scope) = self.sidecar_scope(proxy)
            && !scope.ingress.is_empty()
        {
            return scope
                .ingress
                .iter()
                .map(|i| (i.port, (i.protocol, Some(i.endpoint.clone()))))
                .collect();
        }
        let mut ports = BTreeMap::new();
        for svc in &self.services {
            for ep in svc.endpoints.iter().filter(|e| proxy.owns(e)) {
                for port in &svc.ports {
                    let entry = ports
                        .entry(ep.target_port(port))
                        .or_insert((port.protocol, None));
                    if port.protocol.is_http() {
                        entry.0 = port.protocol;
                    }
                }
            }
        }
        ports
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_store::parse_file;
    use crate::push_context::from_yaml as push;
    use std::path::Path;

    #[test]
    fn sidecar_scope_precedence() {
        let p = push(
            r#"
kind: Sidecar
metadata: {name: mesh, namespace: istio-system}
spec: {egress: [{hosts: ["./*"]}]}
---
kind: Sidecar
metadata: {name: ns, namespace: shop}
spec: {egress: [{hosts: ["*/*"]}]}
---
kind: Sidecar
metadata: {name: web, namespace: shop}
spec:
  workloadSelector: {labels: {app: web}}
  egress: [{hosts: ["db/*"]}]
  outboundTrafficPolicy: {mode: REGISTRY_ONLY}
"#,
        );
        let proxy = |ns: &str, app: &str| {
            let mut p = crate::model::Proxy::from_node_id(&format!(
                "sidecar~10.0.0.1~p.{ns}~{ns}.svc.cluster.local"
            ))
            .unwrap();
            p.labels.insert("app".into(), app.into());
            p
        };
        let web = p.sidecar_scope(&proxy("shop", "web")).unwrap();
        assert_eq!(web.name, "shop/web");
        assert!(web.registry_only);
        // Worked out once per snapshot: the generators of one push share it.
        assert!(Arc::ptr_eq(
            &web,
            &p.sidecar_scope(&proxy("shop", "web")).unwrap()
        ));
        assert_eq!(
            p.sidecar_scope(&proxy("shop", "cart")).unwrap().name,
            "shop/ns"
        );
        let other = p.sidecar_scope(&proxy("blog", "x")).unwrap();
        assert_eq!(other.name, "istio-system/mesh");
        // "./*" means the proxy's own namespace.
        assert_eq!(
            other.egress[0].hosts,
            vec![("blog".to_string(), "*".to_string())]
        );
        assert!(push("").sidecar_scope(&proxy("shop", "web")).is_none());
        let bad = parse_file(
            Path::new("s.yaml"),
            "kind: Sidecar\nmetadata: {name: s, namespace: n}\nspec: {egress: [{hosts: [web]}]}\n",
        )
        .unwrap_err();
        assert!(bad.to_string().contains("<namespace>/<dns name>"), "{bad}");
    }
}
