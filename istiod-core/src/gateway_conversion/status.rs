//! The status the Gateway API asks a controller to write, as istiod writes it for its classes:
//! a GatewayClass `Accepted`; a Gateway `Accepted`, `Programmed` (once its Service has an
//! address) with `addresses` and, per listener, its supported kinds, attached routes and
//! conditions; a route, per parent of ours, `Accepted` (or why not: `NotAllowedByListeners`,
//! `NoMatchingListenerHostname`, `NoMatchingParent`) and `ResolvedRefs` (or `BackendNotFound`,
//! `RefNotPermitted`, `InvalidKind`). Pure: the writer (`crate::kube::gateway_status`) adds
//! `observedGeneration` and times.

use serde_json::{Value, json};

use super::{CONTROLLER, Route, World, hostnames};
use crate::config_store::Resource;
use crate::config_store::gateway_api::{BackendRef, GatewayApiObject, Listener, ParentRef};

/// The status of one object: its key kind (`GatewayClass`, `KubernetesGateway`, `HTTPRoute`,
/// ...), namespace (empty for a GatewayClass), name, and `status` without generations.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectStatus {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub status: Value,
}

fn condition(kind: &str, ok: bool, reason: &str, message: &str) -> Value {
    json!({"type": kind, "status": if ok { "True" } else { "False" }, "reason": reason, "message": message})
}

/// The statuses of every Gateway API object this control plane controls among `resources`.
/// `addresses(namespace, gateway)`: the addresses its Service was given.
pub fn statuses(
    resources: &[Resource],
    domain_suffix: &str,
    addresses: &dyn Fn(&str, &str) -> Vec<String>,
) -> Vec<ObjectStatus> {
    let world = World::of(resources, domain_suffix);
    let mut out = Vec::new();
    for r in resources {
        if let Resource::GatewayApi(m, o) = r
            && let GatewayApiObject::GatewayClass(c) = o.as_ref()
            && c.controller_name == CONTROLLER
        {
            out.push(ObjectStatus {
                kind: "GatewayClass",
                namespace: String::new(),
                name: m.name.clone(),
                status: json!({"conditions": [
                    condition("Accepted", true, "Accepted", "Handled by the istio-rs control plane"),
                ]}),
            });
        }
    }
    for gw in &world.gateways {
        let addrs = addresses(&gw.ns, &gw.name);
        let mut listeners = Vec::new();
        for l in &gw.spec.listeners {
            listeners.push(listener_status(&world, gw, l, !addrs.is_empty()));
        }
        let programmed = if addrs.is_empty() {
            condition(
                "Programmed",
                false,
                "AddressNotAssigned",
                "its Service has no address yet",
            )
        } else {
            condition("Programmed", true, "Programmed", "Resource programmed")
        };
        out.push(ObjectStatus {
            kind: crate::config_store::gateway_api::GATEWAY_KIND,
            namespace: gw.ns.clone(),
            name: gw.name.clone(),
            status: json!({
                "addresses": addrs.iter().map(|a| json!({"type": "IPAddress", "value": a})).collect::<Vec<_>>(),
                "conditions": [accepted(gw.spec), programmed],
                "listeners": listeners,
            }),
        });
    }
    for route in &world.routes {
        let resolved = resolved_refs(&world, route);
        let mut parents = Vec::new();
        for p in route.parents() {
            let accepted = if p.is_service() {
                Some(condition("Accepted", true, "Accepted", "Route was valid"))
            } else if p.is_gateway() {
                parent_accepted(&world, route, p)
            } else {
                None
            };
            let Some(accepted) = accepted else { continue };
            parents.push(json!({
                "parentRef": parent_ref_json(p),
                "controllerName": CONTROLLER,
                "conditions": [accepted, resolved.clone()],
            }));
        }
        if parents.is_empty() {
            continue;
        }
        out.push(ObjectStatus {
            kind: route.kind(),
            namespace: route.meta_ns(),
            name: route.meta.name.clone(),
            status: json!({"parents": parents}),
        });
    }
    out
}

/// The route kinds a listener of `protocol` can take.
fn kinds_for(l: &Listener) -> &'static [&'static str] {
    match l.protocol.to_uppercase().as_str() {
        "HTTP" | "HTTPS" => &["HTTPRoute", "GRPCRoute"],
        "TLS" if l.tls.as_ref().and_then(|t| t.mode.as_deref()) == Some("Passthrough") => {
            &["TLSRoute"]
        }
        "TLS" => &["TLSRoute", "TCPRoute"],
        "TCP" => &["TCPRoute"],
        _ => &[],
    }
}

/// A Gateway's `Accepted`: its parametersRef, when it has one, must be a ConfigMap (the only
/// kind Istio takes; its content is not applied here).
fn accepted(spec: &crate::config_store::gateway_api::GatewaySpec) -> Value {
    match spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    {
        Some(p) if !(p.group.is_empty() && p.kind == "ConfigMap") => condition(
            "Accepted",
            false,
            "InvalidParameters",
            &format!(
                "infrastructure.parametersRef {}/{} {}: only a ConfigMap is supported",
                p.group, p.kind, p.name
            ),
        ),
        _ => condition("Accepted", true, "Accepted", "Resource accepted"),
    }
}

fn listener_status(world: &World, gw: &super::Gateway, l: &Listener, programmed: bool) -> Value {
    let possible = kinds_for(l);
    let asked: Vec<&str> = l
        .allowed_routes
        .as_ref()
        .map(|a| {
            a.kinds
                .iter()
                .filter(|k| {
                    k.group
                        .as_deref()
                        .unwrap_or(crate::config_store::gateway_api::GROUP)
                        == crate::config_store::gateway_api::GROUP
                })
                .map(|k| k.kind.as_str())
                .collect()
        })
        .unwrap_or_default();
    let invalid_kinds = l.allowed_routes.as_ref().is_some_and(|a| {
        a.kinds.len() != asked.len() || asked.iter().any(|k| !possible.contains(k))
    });
    let supported: Vec<&str> = if asked.is_empty() && !invalid_kinds {
        possible.to_vec()
    } else {
        asked
            .iter()
            .copied()
            .filter(|k| possible.contains(k))
            .collect()
    };
    let attached = world
        .routes
        .iter()
        .filter(|r| {
            r.parents().iter().any(|p| {
                p.is_gateway()
                    && p.namespace.clone().unwrap_or(r.meta_ns()) == gw.ns
                    && p.name == gw.name
                    && p.section_name.as_ref().is_none_or(|s| *s == l.name)
                    && p.port.is_none_or(|port| port == l.port)
                    && world.allows(gw, l, r)
                    && hostnames(r.hostnames(), l.hostname.as_deref()).is_some()
            })
        })
        .count();
    let mut resolved = condition("ResolvedRefs", true, "ResolvedRefs", "No errors found");
    if invalid_kinds {
        resolved = condition(
            "ResolvedRefs",
            false,
            "InvalidRouteKinds",
            "a kind in allowedRoutes is not one this listener's protocol carries",
        );
    }
    if let Some(tls) = &l.tls
        && tls.mode.as_deref().unwrap_or("Terminate") == "Terminate"
    {
        let unusable = |c: &crate::config_store::gateway_api::ObjectRef| {
            world.credential(&gw.ns, c).err().or_else(|| {
                let ns = c.namespace.as_deref().unwrap_or(&gw.ns);
                (!world.secrets.contains(&(ns.to_string(), c.name.clone()))).then(|| {
                    (
                        "InvalidCertificateRef",
                        format!("certificateRef {ns}/{} is not a TLS Secret", c.name),
                    )
                })
            })
        };
        if let Some((reason, why)) = tls.certificate_refs.iter().find_map(unusable) {
            resolved = condition("ResolvedRefs", false, reason, &why);
        }
    }
    let accepted = if possible.is_empty() {
        condition(
            "Accepted",
            false,
            "UnsupportedProtocol",
            &format!("protocol {} is not supported", l.protocol),
        )
    } else {
        condition("Accepted", true, "Accepted", "No errors found")
    };
    let ok = !possible.is_empty() && resolved["status"] == "True";
    json!({
        "name": l.name,
        "supportedKinds": supported.iter().map(|k| json!({"group": crate::config_store::gateway_api::GROUP, "kind": k})).collect::<Vec<_>>(),
        "attachedRoutes": attached,
        "conditions": [
            accepted,
            if ok && programmed { condition("Programmed", true, "Programmed", "No errors found") }
            else { condition("Programmed", false, if ok { "Pending" } else { "Invalid" }, "not programmed") },
            resolved,
            condition("Conflicted", false, "NoConflicts", "No errors found"),
        ],
    })
}

/// The `Accepted` condition of a route on Gateway parent `p`; `None` for a Gateway that is not
/// this control plane's.
fn parent_accepted(world: &World, route: &Route, p: &ParentRef) -> Option<Value> {
    let ns = p.namespace.clone().unwrap_or(route.meta_ns());
    let gw = world
        .gateways
        .iter()
        .find(|g| g.ns == ns && g.name == p.name)?;
    let named: Vec<&Listener> = gw
        .spec
        .listeners
        .iter()
        .filter(|l| {
            p.section_name.as_ref().is_none_or(|s| *s == l.name)
                && p.port.is_none_or(|x| x == l.port)
        })
        .collect();
    if named.is_empty() {
        return Some(condition(
            "Accepted",
            false,
            "NoMatchingParent",
            "no listener matches the parentRef",
        ));
    }
    let allowed: Vec<&&Listener> = named
        .iter()
        .filter(|l| world.allows(gw, l, route))
        .collect();
    if allowed.is_empty() {
        return Some(condition(
            "Accepted",
            false,
            "NotAllowedByListeners",
            "no listener of the parent allows this route",
        ));
    }
    if !allowed
        .iter()
        .any(|l| hostnames(route.hostnames(), l.hostname.as_deref()).is_some())
    {
        return Some(condition(
            "Accepted",
            false,
            "NoMatchingListenerHostname",
            "no listener hostname matches the route's",
        ));
    }
    Some(condition("Accepted", true, "Accepted", "Route was valid"))
}

fn backends<'a>(route: &Route<'a>) -> Vec<&'a BackendRef> {
    match route.object {
        GatewayApiObject::HttpRoute(r) => r
            .rules
            .iter()
            .flat_map(|rule| {
                rule.backend_refs.iter().chain(
                    rule.filters
                        .iter()
                        .filter_map(|f| f.request_mirror.as_ref().map(|m| &m.backend_ref)),
                )
            })
            .collect(),
        GatewayApiObject::GrpcRoute(r) => r.rules.iter().flat_map(|x| &x.backend_refs).collect(),
        GatewayApiObject::TcpRoute(r) | GatewayApiObject::TlsRoute(r) => {
            r.rules.iter().flat_map(|x| &x.backend_refs).collect()
        }
        _ => Vec::new(),
    }
}

/// `ResolvedRefs` of a route: the first backend that cannot be used, and why.
fn resolved_refs(world: &World, route: &Route) -> Value {
    let ns = route.meta_ns();
    for b in backends(route) {
        let group = b.group.as_deref().unwrap_or("");
        let kind = b.kind.as_deref().unwrap_or("Service");
        if !group.is_empty() || kind != "Service" {
            return condition(
                "ResolvedRefs",
                false,
                "InvalidKind",
                &format!("backendRef {}: kind {kind} is not supported", b.name),
            );
        }
        let target = b.namespace.clone().unwrap_or_else(|| ns.clone());
        if target != ns && !world.granted(&ns, route.kind(), &target, &b.name) {
            return condition(
                "ResolvedRefs",
                false,
                "RefNotPermitted",
                &format!(
                    "backendRef {target}/{}: no ReferenceGrant allows it",
                    b.name
                ),
            );
        }
        if !world.services.contains(&(target.clone(), b.name.clone())) {
            return condition(
                "ResolvedRefs",
                false,
                "BackendNotFound",
                &format!("backendRef {target}/{}: no such Service", b.name),
            );
        }
    }
    condition(
        "ResolvedRefs",
        true,
        "ResolvedRefs",
        "Resolved all references",
    )
}

/// A parentRef as the route wrote it (fields it left out stay out).
fn parent_ref_json(p: &ParentRef) -> Value {
    let mut v = json!({"name": p.name});
    if let Some(g) = &p.group {
        v["group"] = json!(g);
    }
    if let Some(k) = &p.kind {
        v["kind"] = json!(k);
    }
    if let Some(n) = &p.namespace {
        v["namespace"] = json!(n);
    }
    if let Some(s) = &p.section_name {
        v["sectionName"] = json!(s);
    }
    if let Some(port) = p.port {
        v["port"] = json!(port);
    }
    v
}
