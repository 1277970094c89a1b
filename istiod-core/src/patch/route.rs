//! ROUTE_CONFIGURATION, VIRTUAL_HOST and HTTP_ROUTE patches (istiod's `rc_patch.go`).

use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost, route};

use super::{CompiledPatch, Named, merge_into, patch_named};
use crate::config_store::envoy_filter::{ApplyTo, Operation, PatchContext, RouteAction};

const ROUTE_CONFIGURATION: &str = "envoy.config.route.v3.RouteConfiguration";
const VIRTUAL_HOST: &str = "envoy.config.route.v3.VirtualHost";
const ROUTE: &str = "envoy.config.route.v3.Route";

/// The route configurations sent over RDS: a router's are GATEWAY, a sidecar's (outbound)
/// SIDECAR_OUTBOUND.
pub(super) fn apply_rds(router: bool, patches: &[&CompiledPatch], resources: &mut [Named]) {
    let ctx = if router {
        PatchContext::Gateway
    } else {
        PatchContext::SidecarOutbound
    };
    for named in resources.iter_mut() {
        if let Some(p) = patch_named::<RouteConfiguration>(named, |rc| {
            patch_config(rc, ctx, router, patches);
            true
        }) {
            *named = p;
        }
    }
}

/// Port, port name and Gateway (`ns/name`) of a route configuration's name: `inbound|P||`,
/// `P`, or a router's `http.P` / `https.P.PORTNAME.GATEWAY.NS`.
fn parse_name(name: &str, gateway: bool) -> (u32, &str, Option<String>) {
    if gateway {
        let parts: Vec<&str> = name.split('.').collect();
        return match parts[..] {
            ["http", p] => (p.parse().unwrap_or(0), "", None),
            ["https", p, port_name, gw, ns] => (
                p.parse().unwrap_or(0),
                port_name,
                Some(format!("{ns}/{gw}")),
            ),
            _ => (0, "", None),
        };
    }
    let port = match name.strip_prefix("inbound|") {
        Some(rest) => rest.split('|').next().and_then(|p| p.parse().ok()),
        None => name.parse().ok(),
    };
    (port.unwrap_or(0), "", None)
}

fn config_matches(rc: &RouteConfiguration, gateway: bool, p: &CompiledPatch) -> bool {
    let Some(m) = &p.matches.route_configuration else {
        return true;
    };
    if m.name.as_deref().is_some_and(|n| n != rc.name) {
        return false;
    }
    let (port, port_name, gw) = parse_name(&rc.name, gateway);
    if m.port_number != 0 && m.port_number != port {
        return false;
    }
    if gateway {
        if m.port_name.as_deref().is_some_and(|n| n != port_name) {
            return false;
        }
        if m.gateway.is_some() && m.gateway != gw {
            return false;
        }
    }
    true
}

fn vhost_matches(vh: &VirtualHost, p: &CompiledPatch) -> bool {
    let Some(m) = p
        .matches
        .route_configuration
        .as_ref()
        .and_then(|r| r.vhost.as_ref())
    else {
        return true;
    };
    m.name.as_deref().is_none_or(|n| n == vh.name)
        && m.domain_name
            .as_deref()
            .is_none_or(|d| vh.domains.iter().any(|x| x == d))
}

fn route_matches(r: &Route, p: &CompiledPatch) -> bool {
    let Some(m) = p
        .matches
        .route_configuration
        .as_ref()
        .and_then(|rc| rc.vhost.as_ref())
        .and_then(|v| v.route.as_ref())
    else {
        return true;
    };
    if m.name.as_deref().is_some_and(|n| n != r.name) {
        return false;
    }
    match (m.action, &r.action) {
        (RouteAction::Any, _) => true,
        (RouteAction::Route, Some(route::Action::Route(_)))
        | (RouteAction::Redirect, Some(route::Action::Redirect(_)))
        | (RouteAction::DirectResponse, Some(route::Action::DirectResponse(_))) => true,
        (_, Some(route::Action::Route(_)))
        | (_, Some(route::Action::Redirect(_)))
        | (_, Some(route::Action::DirectResponse(_))) => false,
        _ => true,
    }
}

fn has_route_match(p: &CompiledPatch) -> bool {
    p.matches
        .route_configuration
        .as_ref()
        .and_then(|rc| rc.vhost.as_ref())
        .is_some_and(|v| v.route.is_some())
}

/// One route configuration patched (context `ctx`; `gateway`: a router's, named as routers'
/// are).
pub(super) fn patch_config(
    rc: &mut RouteConfiguration,
    ctx: PatchContext,
    gateway: bool,
    patches: &[&CompiledPatch],
) {
    let mine: Vec<&CompiledPatch> = patches
        .iter()
        .copied()
        .filter(|p| p.in_context(ctx) && config_matches(rc, gateway, p))
        .collect();
    for p in mine
        .iter()
        .filter(|p| p.apply_to == ApplyTo::RouteConfiguration)
    {
        if matches!(
            p.operation,
            Operation::Merge | Operation::MergeAndReplaceList
        ) {
            merge_into(rc, ROUTE_CONFIGURATION, p);
        }
    }
    let mut hosts = std::mem::take(&mut rc.virtual_hosts);
    hosts.retain_mut(|vh| patch_vhost(vh, &mine));
    for p in mine
        .iter()
        .filter(|p| p.apply_to == ApplyTo::VirtualHost && p.operation == Operation::Add)
    {
        hosts.extend(p.value_as::<VirtualHost>());
    }
    rc.virtual_hosts = hosts;
}

/// One virtual host patched; `false`: removed.
fn patch_vhost(vh: &mut VirtualHost, patches: &[&CompiledPatch]) -> bool {
    for p in patches {
        if !(p.apply_to == ApplyTo::VirtualHost && vhost_matches(vh, p)) {
            continue;
        }
        match p.operation {
            Operation::Remove => return false,
            Operation::Merge | Operation::MergeAndReplaceList => merge_into(vh, VIRTUAL_HOST, p),
            Operation::Replace => {
                if let Some(v) = p.value_as::<VirtualHost>() {
                    *vh = v;
                }
            }
            _ => {}
        }
    }
    let route_patches: Vec<&CompiledPatch> = patches
        .iter()
        .copied()
        .filter(|p| p.apply_to == ApplyTo::HttpRoute && vhost_matches(vh, p))
        .collect();
    let mut routes = std::mem::take(&mut vh.routes);
    routes.retain_mut(|r| {
        for p in &route_patches {
            if !route_matches(r, p) {
                continue;
            }
            match p.operation {
                Operation::Remove => return false,
                Operation::Merge | Operation::MergeAndReplaceList => merge_into(r, ROUTE, p),
                _ => {}
            }
        }
        true
    });
    for p in &route_patches {
        let matched = || routes.iter().position(|r| route_matches(r, p));
        let Some(value) = p.value_as::<Route>() else {
            continue;
        };
        match p.operation {
            Operation::Add => routes.push(value),
            Operation::InsertAfter => match (has_route_match(p), matched()) {
                (false, _) => routes.push(value),
                (true, Some(i)) => routes.insert(i + 1, value),
                (true, None) => {}
            },
            Operation::InsertBefore => match (has_route_match(p), matched()) {
                (false, _) => routes.insert(0, value),
                (true, Some(i)) => routes.insert(i, value),
                (true, None) => {}
            },
            Operation::InsertFirst if !has_route_match(p) || matched().is_some() => {
                routes.insert(0, value);
            }
            _ => {}
        }
    }
    vh.routes = routes;
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use envoy_types::pb::envoy::config::route::v3::{DirectResponseAction, RouteAction as Forward};

    use super::*;
    use crate::push_context::envoy_filters::compiled_for_tests as compiled;

    fn config(name: &str) -> RouteConfiguration {
        let r = |name: &str, action: route::Action| Route {
            name: name.into(),
            action: Some(action),
            ..Default::default()
        };
        RouteConfiguration {
            name: name.into(),
            virtual_hosts: vec![VirtualHost {
                name: "a.example:80".into(),
                domains: vec!["a.example".into(), "a.example:80".into()],
                routes: vec![
                    r("fwd", route::Action::Route(Forward::default())),
                    r(
                        "direct",
                        route::Action::DirectResponse(DirectResponseAction::default()),
                    ),
                ],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// The routes left after a REMOVE matching `route_configuration` on `name` (router or not).
    fn left(route_configuration: &str, name: &str, gateway: bool) -> Vec<String> {
        let patches = compiled(&format!(
            "configPatches: [{{applyTo: HTTP_ROUTE, match: {{routeConfiguration: {route_configuration}}}, patch: {{operation: REMOVE}}}}]"
        ));
        let refs: Vec<&CompiledPatch> = patches.iter().collect();
        let mut rc = config(name);
        let ctx = if gateway {
            PatchContext::Gateway
        } else {
            PatchContext::SidecarOutbound
        };
        patch_config(&mut rc, ctx, gateway, &refs);
        rc.virtual_hosts[0]
            .routes
            .iter()
            .map(|r| r.name.clone())
            .collect()
    }

    #[test]
    fn route_configuration_vhost_and_route_matches() {
        assert_eq!(
            left("{vhost: {route: {action: DIRECT_RESPONSE}}}", "80", false),
            ["fwd"]
        );
        assert_eq!(
            left("{vhost: {route: {action: ROUTE}}}", "80", false),
            ["direct"]
        );
        assert_eq!(
            left("{vhost: {route: {name: fwd}}}", "80", false),
            ["direct"]
        );
        assert_eq!(
            left("{vhost: {domainName: a.example}}", "80", false),
            Vec::<String>::new()
        );
        assert_eq!(
            left("{vhost: {domainName: b.example}}", "80", false),
            ["fwd", "direct"]
        );
        assert_eq!(left("{portNumber: 81}", "80", false), ["fwd", "direct"]);
        assert_eq!(
            left("{portNumber: 9080}", "inbound|9080||", false),
            Vec::<String>::new()
        );
        assert_eq!(left("{name: other}", "80", false), ["fwd", "direct"]);
        // A router's HTTPS routes carry the port name and the Gateway.
        let https = "https.443.web.gw.istio-system";
        assert_eq!(
            left(
                "{gateway: istio-system/gw, portName: web, portNumber: 443}",
                https,
                true
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            left("{gateway: istio-system/other}", https, true),
            ["fwd", "direct"]
        );
        assert_eq!(left("{portName: other}", https, true), ["fwd", "direct"]);
    }
}
