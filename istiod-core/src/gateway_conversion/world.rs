//! What the conversion works from: the Gateways of served classes, their routes, the
//! ReferenceGrants, and what each reference may use.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::config_store::gateway_api::{BackendRef, GatewayApiObject, GatewaySpec, Listener};
use crate::config_store::{Metadata, Resource};

use super::*;

/// A Gateway of a class served here.
pub(super) struct Gateway<'a> {
    pub(super) ns: String,
    pub(super) name: String,
    pub(super) spec: &'a GatewaySpec,
}

/// A route (HTTPRoute, GRPCRoute, TCPRoute, TLSRoute) with its metadata.
pub(super) struct Route<'a> {
    pub(super) meta: &'a Metadata,
    pub(super) object: &'a GatewayApiObject,
}

/// Everything the translation looks up.
pub(super) struct World<'a> {
    pub(super) gateways: Vec<Gateway<'a>>,
    pub(super) routes: Vec<Route<'a>>,
    pub(super) grants: Vec<(
        &'a Metadata,
        &'a crate::config_store::gateway_api::ReferenceGrantSpec,
    )>,
    pub(super) services: BTreeSet<(String, String)>,
    /// TLS Secrets (namespace, name).
    pub(super) secrets: BTreeSet<(String, String)>,
    pub(super) namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub(super) domain_suffix: String,
}

impl<'a> World<'a> {
    pub(super) fn of(resources: &'a [Resource], domain_suffix: &str) -> World<'a> {
        let mut objects = Vec::new();
        let mut services = BTreeSet::new();
        let mut secrets = BTreeSet::new();
        let mut namespaces = BTreeMap::new();
        for r in resources {
            match r {
                Resource::GatewayApi(m, o) => objects.push((m, o.as_ref())),
                Resource::Service(m, _) => {
                    services.insert((m.namespace().to_string(), m.name.clone()));
                }
                // A ServiceEntry for NAME.NS.svc.DOMAIN stands for that Service (file mode).
                Resource::ServiceEntry(_, se) => {
                    let suffix = format!(".svc.{domain_suffix}");
                    for h in &se.hosts {
                        if let Some((name, ns)) =
                            h.strip_suffix(&suffix).and_then(|s| s.split_once('.'))
                        {
                            services.insert((ns.to_string(), name.to_string()));
                        }
                    }
                }
                Resource::Namespace(m) => {
                    namespaces.insert(m.name.clone(), m.labels.clone());
                }
                Resource::Secret(m, _) => {
                    secrets.insert((m.namespace().to_string(), m.name.clone()));
                }
                _ => {}
            }
        }
        let gateways = served_gateways(resources)
            .into_iter()
            .map(|(m, g)| Gateway {
                ns: m.namespace().to_string(),
                name: m.name.clone(),
                spec: g,
            })
            .collect();
        let mut routes = Vec::new();
        let mut grants = Vec::new();
        for (m, o) in objects {
            match o {
                GatewayApiObject::HttpRoute(_)
                | GatewayApiObject::GrpcRoute(_)
                | GatewayApiObject::TcpRoute(_)
                | GatewayApiObject::TlsRoute(_) => routes.push(Route { meta: m, object: o }),
                GatewayApiObject::ReferenceGrant(g) => grants.push((m, g)),
                _ => {}
            }
        }
        // The Gateway API's order of routes that conflict: the oldest first, then by
        // namespace/name (an object without a creation time, from a file, sorts first).
        routes.sort_by(|a, b| {
            (&a.meta.creation_timestamp, a.meta.namespace(), &a.meta.name).cmp(&(
                &b.meta.creation_timestamp,
                b.meta.namespace(),
                &b.meta.name,
            ))
        });
        World {
            gateways,
            routes,
            grants,
            services,
            secrets,
            namespaces,
            domain_suffix: domain_suffix.to_string(),
        }
    }

    pub(super) fn fqdn(&self, name: &str, ns: &str) -> String {
        format!("{name}.{ns}.svc.{}", self.domain_suffix)
    }

    /// Whether listener `l` of `gw` takes `route` (its namespaces and kinds).
    pub(super) fn allows(&self, gw: &Gateway, l: &Listener, route: &Route) -> bool {
        let kind = route.kind();
        let protocol = l.protocol.to_uppercase();
        let kind_fits = match protocol.as_str() {
            "HTTP" | "HTTPS" => matches!(kind, "HTTPRoute" | "GRPCRoute"),
            "TLS" => {
                let passthrough =
                    l.tls.as_ref().and_then(|t| t.mode.as_deref()) == Some("Passthrough");
                if passthrough {
                    kind == "TLSRoute"
                } else {
                    kind == "TCPRoute" || kind == "TLSRoute"
                }
            }
            "TCP" => kind == "TCPRoute",
            _ => false,
        };
        let allowed = l.allowed_routes.as_ref();
        let kinds_ok = allowed
            .map(|a| a.kinds.is_empty() || a.kinds.iter().any(|k| k.kind == kind))
            .unwrap_or(true);
        let route_ns = route.meta_ns();
        let ns_ok = match allowed.and_then(|a| a.namespaces.as_ref()) {
            None => route_ns == gw.ns,
            Some(n) => match n.from.as_deref().unwrap_or("Same") {
                "All" => true,
                "Selector" => n.selector.as_ref().is_some_and(|s| {
                    s.selects(self.namespaces.get(&route_ns).unwrap_or(&BTreeMap::new()))
                }),
                _ => route_ns == gw.ns,
            },
        };
        kind_fits && kinds_ok && ns_ok
    }

    /// The Istio destination of a backendRef from a route of `kind` in `ns`, if it is usable.
    pub(super) fn destination(&self, ns: &str, kind: &str, b: &BackendRef) -> Result<Value, ()> {
        let group = b.group.as_deref().unwrap_or("");
        let bkind = b.kind.as_deref().unwrap_or("Service");
        if !group.is_empty() || bkind != "Service" {
            return Err(());
        }
        let target_ns = b.namespace.clone().unwrap_or_else(|| ns.to_string());
        if target_ns != ns && !self.granted(ns, kind, &target_ns, &b.name) {
            return Err(());
        }
        if !self.services.contains(&(target_ns.clone(), b.name.clone())) {
            return Err(());
        }
        let port = b.port.ok_or(())?;
        Ok(json!({"host": self.fqdn(&b.name, &target_ns), "port": {"number": port}}))
    }

    /// Whether a ReferenceGrant in `to_ns` lets a `kind` of `from_ns` reference Service `name`.
    pub(super) fn granted(&self, from_ns: &str, kind: &str, to_ns: &str, name: &str) -> bool {
        self.grants
            .iter()
            .any(|(m, g)| grants(m, g, from_ns, kind, to_ns, "Service", name))
    }

    /// The credentialName of a Gateway's certificateRef `c` (a Secret of the Gateway's
    /// namespace by name, another namespace's as `kubernetes-gateway://NS/NAME`), or the
    /// listener's ResolvedRefs reason and message when it may not be used. Whether the Secret
    /// exists is the listener status's business (a credentialName whose Secret is missing
    /// leaves its server out until the Secret comes).
    pub(crate) fn credential(
        &self,
        gw_ns: &str,
        c: &crate::config_store::gateway_api::ObjectRef,
    ) -> Result<String, (&'static str, String)> {
        let kind = c.kind.as_deref().unwrap_or("Secret");
        let group = c.group.as_deref().unwrap_or("");
        if kind != "Secret" || !group.is_empty() {
            let what = if group.is_empty() {
                kind.to_string()
            } else {
                format!("{kind} of group {group}")
            };
            return Err((
                "InvalidCertificateRef",
                format!("certificateRef {} is a {what}, not a core Secret", c.name),
            ));
        }
        let ns = c.namespace.as_deref().unwrap_or(gw_ns);
        if ns != gw_ns
            && !self
                .grants
                .iter()
                .any(|(m, g)| grants(m, g, gw_ns, "Gateway", ns, "Secret", &c.name))
        {
            return Err((
                "RefNotPermitted",
                format!(
                    "certificateRef {ns}/{} is not permitted by a ReferenceGrant in {ns}",
                    c.name
                ),
            ));
        }
        Ok(if ns == gw_ns {
            c.name.clone()
        } else {
            format!("{GATEWAY_CREDENTIAL_PREFIX}{ns}/{}", c.name)
        })
    }
}

/// Whether ReferenceGrant `g` (metadata `m`) lets a Gateway API `kind` of `from_ns` reference
/// the core object `to_kind` named `name` in `to_ns`.
pub(super) fn grants(
    m: &Metadata,
    g: &crate::config_store::gateway_api::ReferenceGrantSpec,
    from_ns: &str,
    kind: &str,
    to_ns: &str,
    to_kind: &str,
    name: &str,
) -> bool {
    m.namespace() == to_ns
        && g.from.iter().any(|f| {
            f.group == crate::config_store::gateway_api::GROUP
                && f.kind == kind
                && f.namespace == from_ns
        })
        && g.to.iter().any(|t| {
            t.group.is_empty() && t.kind == to_kind && t.name.as_deref().is_none_or(|n| n == name)
        })
}

/// Whether the config lets the Gateways of `from_ns` use Secret `name` of `to_ns` (their own
/// namespace's, or another's by one of the ReferenceGrants `grants`): what a router of `from_ns`
/// may read.
pub fn secret_granted(
    reference_grants: &[(
        Metadata,
        crate::config_store::gateway_api::ReferenceGrantSpec,
    )],
    from_ns: &str,
    to_ns: &str,
    name: &str,
) -> bool {
    from_ns == to_ns
        || reference_grants
            .iter()
            .any(|(m, g)| grants(m, g, from_ns, "Gateway", to_ns, "Secret", name))
}
