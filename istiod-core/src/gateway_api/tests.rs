//! The translation, fed the upstream conformance suite's own manifests (read from
//! `../shared/conformance/gateway-api/` at test time, as the suite applies them with class
//! `istio`).

use super::*;
use crate::config_store::virtual_service::VirtualServiceSpec;

fn shared(rel: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/conformance/gateway-api")
        .join(rel);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (the conformance manifests)", path.display()))
        .replace("{GATEWAY_CLASS_NAME}", "istio")
}

/// Every document of `texts` this store reads (Gateway API kinds, Services, Namespaces), and
/// the refusals of Gateway API documents.
fn load(texts: &[String]) -> (Vec<Resource>, Vec<String>) {
    use serde::Deserialize as _;
    let mut out = Vec::new();
    let mut refused = Vec::new();
    for text in texts {
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            let v = serde_json::Value::deserialize(doc).unwrap();
            if v.is_null() {
                continue;
            }
            let kind = v["kind"].as_str().unwrap_or_default().to_string();
            let ours = crate::config_store::gateway_api::in_group(v["apiVersion"].as_str());
            if !(ours || matches!(kind.as_str(), "Service" | "Namespace")) {
                continue;
            }
            match crate::config_store::parse_document(v) {
                Ok(Some(r)) => out.push(r),
                Ok(None) => {}
                Err(e) if ours => refused.push(e),
                Err(_) => {}
            }
        }
    }
    (out, refused)
}

fn translated(test: &str) -> (Vec<Resource>, Vec<String>) {
    let (resources, refused) = load(&[
        shared("base-manifests.yaml"),
        shared(&format!("tests/{test}")),
    ]);
    assert!(refused.is_empty(), "{refused:?}");
    translate(&resources, "cluster.local")
}

fn virtual_services(out: &[Resource]) -> Vec<(&Metadata, &VirtualServiceSpec)> {
    out.iter()
        .filter_map(|r| match r {
            Resource::VirtualService(m, s) => Some((m, s)),
            _ => None,
        })
        .collect()
}

fn routes_of<'a>(out: &'a [Resource], gateway: &str) -> Vec<&'a VirtualServiceSpec> {
    virtual_services(out)
        .into_iter()
        .filter(|(_, s)| {
            s.gateways
                .iter()
                .any(|g| g.ends_with(&format!("/{gateway}-{GENERATED}")))
        })
        .map(|(_, s)| s)
        .collect()
}

const INFRA: &str = "gateway-conformance-infra";

#[test]
fn every_gateway_api_document_of_the_suite_is_read() {
    let mut texts = vec![shared("base-manifests.yaml"), shared("mesh-manifests.yaml")];
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/conformance/gateway-api/tests");
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        texts.push(
            std::fs::read_to_string(p)
                .unwrap()
                .replace("{GATEWAY_CLASS_NAME}", "istio"),
        );
    }
    let (resources, refused) = load(&texts);
    // Kinds this store does not read yet are named as such, nothing else is refused.
    for r in &refused {
        assert!(r.contains("unsupported kind"), "{r}");
    }
    let gateways = resources
        .iter()
        .filter(|r| r.kind() == "KubernetesGateway")
        .count();
    let routes = resources.iter().filter(|r| r.kind() == "HTTPRoute").count();
    assert!(
        gateways > 10 && routes > 50,
        "{gateways} gateways, {routes} routes"
    );
    let (out, problems) = translate(&resources, "cluster.local");
    assert!(!out.is_empty());
    for p in &problems {
        assert!(p.contains("not supported yet"), "{p}");
    }
}

#[test]
fn a_gateway_is_an_istio_gateway_of_its_namespace_routers() {
    // The suite's HTTPRouteSimpleSameNamespace route (its file here is the mesh test's).
    let route = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: gateway-conformance-infra-test, namespace: gateway-conformance-infra}\nspec:\n  parentRefs: [{name: same-namespace}]\n  rules: [{backendRefs: [{name: infra-backend-v1, port: 8080}]}]\n";
    let (resources, refused) = load(&[shared("base-manifests.yaml"), route.to_string()]);
    assert!(refused.is_empty(), "{refused:?}");
    let (out, problems) = translate(&resources, "cluster.local");
    assert!(problems.is_empty(), "{problems:?}");
    let gw = out
        .iter()
        .find_map(|r| match r {
            Resource::Gateway(m, s) if m.name == format!("same-namespace-{GENERATED}") => {
                Some((m, s))
            }
            _ => None,
        })
        .expect("the same-namespace Gateway");
    assert_eq!(gw.0.namespace(), INFRA);
    assert!(gw.1.own_namespace_only);
    assert_eq!(
        gw.1.selector.get(GATEWAY_NAME_LABEL).map(String::as_str),
        Some("same-namespace")
    );
    let port = gw.1.servers[0].port.as_ref().unwrap();
    assert_eq!((port.number, port.protocol.as_str()), (80, "HTTP"));
    assert_eq!(gw.1.servers[0].hosts, ["*/*"]);

    let vs = routes_of(&out, "same-namespace");
    assert_eq!(vs.len(), 1);
    assert_eq!(vs[0].hosts, ["*"]);
    let dest = &vs[0].http[0].route[0].destination;
    assert_eq!(
        dest.host,
        format!("infra-backend-v1.{INFRA}.svc.cluster.local")
    );
    assert_eq!(dest.port.as_ref().map(|p| p.number.0), Some(8080));
}

/// The backend (short name) the first http route matching `path` sends to, as Envoy picks
/// the first matching route.
fn first_backend(http: &[crate::config_store::virtual_service::HttpRoute], path: &str) -> String {
    use crate::config_store::values::StringMatchKind;
    let hit = http
        .iter()
        .find(|h| {
            h.matches
                .iter()
                .any(|m| match m.uri.as_ref().map(|u| u.kind()) {
                    Some(StringMatchKind::Exact(e)) => path == e,
                    Some(StringMatchKind::Prefix(p)) => path.starts_with(p),
                    _ => true,
                })
        })
        .unwrap_or_else(|| panic!("no route for {path}"));
    hit.route[0]
        .destination
        .host
        .split('.')
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn matches_are_ordered_as_the_api_orders_them() {
    let (out, _) = translated("httproute-path-match-order.yaml");
    let http: Vec<_> = routes_of(&out, "same-namespace")
        .into_iter()
        .flat_map(|v| v.http.clone())
        .collect();
    // The suite's HTTPRoutePathMatchOrder expectations.
    for (path, backend) in [
        ("/match/exact/one", "infra-backend-v3"),
        ("/match/exact", "infra-backend-v2"),
        ("/match", "infra-backend-v1"),
        ("/match/prefix/one/any", "infra-backend-v2"),
        ("/match/prefix/any", "infra-backend-v1"),
        ("/match/any", "infra-backend-v3"),
    ] {
        assert_eq!(first_backend(&http, path), backend, "{path}");
    }
}

#[test]
fn a_backend_that_cannot_be_used_answers_500() {
    for test in [
        "httproute-invalid-nonexistent-backendref.yaml",
        "httproute-invalid-backendref-unknown-kind.yaml",
        "httproute-invalid-cross-namespace-backend-ref.yaml",
    ] {
        let (out, _) = translated(test);
        let all: Vec<_> = virtual_services(&out)
            .into_iter()
            .flat_map(|(_, s)| s.http.clone())
            .collect();
        assert!(
            !all.is_empty()
                && all
                    .iter()
                    .all(|h| h.direct_response.as_ref().map(|d| d.status) == Some(500)),
            "{test}: {all:#?}"
        );
    }
    // The same cross-namespace reference with a ReferenceGrant is routed.
    let (out, _) = translated("httproute-reference-grant.yaml");
    let all: Vec<_> = virtual_services(&out)
        .into_iter()
        .flat_map(|(_, s)| s.http.clone())
        .collect();
    assert!(
        all.iter().any(|h| h.route.iter().any(|d| d
            .destination
            .host
            .contains("gateway-conformance-web-backend"))),
        "{all:#?}"
    );
}

#[test]
fn a_service_parent_is_a_mesh_route() {
    let (resources, refused) = load(&[
        shared("mesh-manifests.yaml"),
        shared("tests/mesh-split.yaml"),
    ]);
    assert!(refused.is_empty(), "{refused:?}");
    let (out, _) = translate(&resources, "cluster.local");
    let vs = virtual_services(&out);
    let mesh: Vec<_> = vs.iter().filter(|(_, s)| s.gateways == ["mesh"]).collect();
    assert!(!mesh.is_empty());
    assert!(
        mesh.iter()
            .all(|(_, s)| s.hosts[0].ends_with(".gateway-conformance-mesh.svc.cluster.local"))
    );
}

#[test]
fn a_gateway_of_another_class_is_left_alone() {
    let (resources, _) = load(&[
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: other, namespace: a}\nspec:\n  gatewayClassName: not-ours\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n".to_string(),
    ]);
    let (out, _) = translate(&resources, "cluster.local");
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn a_gateway_api_gateway_is_keyed_apart_from_an_istio_gateway() {
    let doc = serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "g", "namespace": "a"},
        "spec": {"gatewayClassName": "istio", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}});
    let r = crate::config_store::parse_document(doc).unwrap().unwrap();
    assert_eq!(r.kind(), "KubernetesGateway");
    let bad = serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "g", "namespace": "a"},
        "spec": {"gatewayClassName": "istio", "listeners": [{"name": "x", "port": 80, "protocol": "HTTP"}, {"name": "x", "port": 81, "protocol": "HTTP"}]}});
    let err = crate::config_store::parse_document(bad).unwrap_err();
    assert!(
        err.contains("Gateway g") && err.contains("names two listeners"),
        "{err}"
    );
}

fn status_of<'a>(all: &'a [status::ObjectStatus], kind: &str, name: &str) -> &'a serde_json::Value {
    &all.iter()
        .find(|o| o.kind == kind && o.name == name)
        .unwrap_or_else(|| panic!("no status for {kind} {name}: {all:#?}"))
        .status
}

fn condition<'a>(conditions: &'a serde_json::Value, kind: &str) -> (&'a str, &'a str) {
    let c = conditions
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {conditions}"));
    (c["status"].as_str().unwrap(), c["reason"].as_str().unwrap())
}

#[test]
fn statuses_say_what_attached_and_why_not() {
    let routes = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: good, namespace: gateway-conformance-infra}\nspec:\n  parentRefs: [{name: same-namespace}]\n  rules: [{backendRefs: [{name: infra-backend-v1, port: 8080}]}]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: missing-backend, namespace: gateway-conformance-infra}\nspec:\n  parentRefs: [{name: same-namespace}]\n  rules: [{backendRefs: [{name: nonexistent, port: 8080}]}]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: other-namespace, namespace: gateway-conformance-web-backend}\nspec:\n  parentRefs: [{name: same-namespace, namespace: gateway-conformance-infra}]\n  rules: [{backendRefs: [{name: web-backend, port: 8080}]}]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: wrong-section, namespace: gateway-conformance-infra}\nspec:\n  parentRefs: [{name: same-namespace, sectionName: nope}]\n  rules: [{backendRefs: [{name: infra-backend-v1, port: 8080}]}]\n";
    let (resources, refused) = load(&[shared("base-manifests.yaml"), routes.to_string()]);
    assert!(refused.is_empty(), "{refused:?}");
    let none = |_: &str, _: &str| Vec::new();
    let all = status::statuses(&resources, "cluster.local", &none);
    let gw = status_of(&all, "KubernetesGateway", "same-namespace");
    assert_eq!(
        condition(&gw["conditions"], "Accepted"),
        ("True", "Accepted")
    );
    assert_eq!(
        condition(&gw["conditions"], "Programmed"),
        ("False", "AddressNotAssigned")
    );
    // Attached: good and missing-backend (a route with a bad backend still attaches).
    assert_eq!(gw["listeners"][0]["attachedRoutes"], 2, "{gw}");
    let parent =
        |name: &str| status_of(&all, "HTTPRoute", name)["parents"][0]["conditions"].clone();
    assert_eq!(condition(&parent("good"), "Accepted"), ("True", "Accepted"));
    assert_eq!(
        condition(&parent("good"), "ResolvedRefs"),
        ("True", "ResolvedRefs")
    );
    assert_eq!(
        condition(&parent("missing-backend"), "ResolvedRefs"),
        ("False", "BackendNotFound")
    );
    assert_eq!(
        condition(&parent("other-namespace"), "Accepted"),
        ("False", "NotAllowedByListeners")
    );
    assert_eq!(
        condition(&parent("wrong-section"), "Accepted"),
        ("False", "NoMatchingParent")
    );
    // With an address from its Service, the Gateway is programmed and says where.
    let addr = |_: &str, name: &str| {
        if name == "same-namespace" {
            vec!["10.0.0.9".to_string()]
        } else {
            vec![]
        }
    };
    let all = status::statuses(&resources, "cluster.local", &addr);
    let gw = status_of(&all, "KubernetesGateway", "same-namespace");
    assert_eq!(
        condition(&gw["conditions"], "Programmed"),
        ("True", "Programmed")
    );
    assert_eq!(gw["addresses"][0]["value"], "10.0.0.9");
}

#[test]
fn a_cors_filter_is_a_cors_policy() {
    let (out, problems) = translated("httproute-cors.yaml");
    assert!(problems.is_empty(), "{problems:?}");
    let http: Vec<_> = routes_of(&out, "same-namespace")
        .into_iter()
        .flat_map(|v| v.http.clone())
        .collect();
    let cors: Vec<_> = http.iter().filter_map(|h| h.cors_policy.clone()).collect();
    assert!(
        !cors.is_empty() && http.iter().all(|h| h.direct_response.is_none()),
        "{http:#?}"
    );
    let first = cors
        .iter()
        .find(|c| c.allow_headers.iter().any(|h| h == "x-header-1"))
        .unwrap();
    assert_eq!(first.allow_credentials, Some(true));
    assert_eq!(first.allow_origins.len(), 2);
    assert!(
        format!("{:?}", first.allow_origins[1]).contains("bar"),
        "{first:?}"
    );
}
