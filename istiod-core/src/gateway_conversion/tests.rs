//! The translation, fed the upstream conformance suite's own manifests as the suite applies them
//! with class `istio`: those of the conformance module `scripts/install-gateway-conformance.sh`
//! installs (`$GATEWAY_CONFORMANCE_HOME/manifests`, default
//! `/opt/gateway-conformance/v1.6.0/manifests`), the version the test cluster runs.

use super::*;
use crate::config_store::virtual_service::VirtualServiceSpec;

/// The conformance manifests' folder; missing, the test fails naming the set-up step.
fn manifests() -> std::path::PathBuf {
    let home = std::env::var_os("GATEWAY_CONFORMANCE_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/opt/gateway-conformance/v1.6.0".into());
    let dir = home.join("manifests");
    assert!(
        dir.join("base-manifests.yaml").is_file(),
        "{} has no conformance manifests: run scripts/install-gateway-conformance.sh \
         (or scripts/setup.sh --tests)",
        dir.display()
    );
    dir
}

fn shared(rel: &str) -> String {
    let path = manifests().join(rel);
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
                .any(|g| g.contains(&format!("/{gateway}-{GENERATED}-")))
        })
        .map(|(_, s)| s)
        .collect()
}

const INFRA: &str = "gateway-conformance-infra";

#[test]
fn every_gateway_api_document_of_the_suite_is_read() {
    let mut texts = vec![shared("base-manifests.yaml"), shared("mesh-manifests.yaml")];
    for e in std::fs::read_dir(manifests().join("tests")).unwrap() {
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
    // What the suite writes to be refused (gateway-invalid-tls-configuration.yaml: certificate
    // references of another group and of another kind) is refused for that reason; nothing else
    // is, but for what is not supported yet.
    let meant = |p: &str| {
        p.starts_with("Gateway gateway-conformance-infra/gateway-certificate-unsupported-")
            && p.contains("not a core Secret")
    };
    assert_eq!(
        problems.iter().filter(|p| meant(p)).count(),
        2,
        "{problems:#?}"
    );
    let unexpected: Vec<&String> = problems
        .iter()
        .filter(|p| !p.contains("not supported yet") && !meant(p))
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:#?}");
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
            // One Istio Gateway per listener (the base Gateway's one listener is `http`).
            Resource::Gateway(m, s) if m.name == format!("same-namespace-{GENERATED}-http") => {
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

/// The http routes of every VirtualService of `out`, by their first URI match.
fn http_by_uri(out: &[Resource]) -> Vec<(String, crate::config_store::virtual_service::HttpRoute)> {
    virtual_services(out)
        .into_iter()
        .flat_map(|(_, s)| s.http.clone())
        .map(|h| {
            let uri = h
                .matches
                .first()
                .and_then(|m| m.uri.as_ref())
                .map(|u| format!("{u:?}"))
                .unwrap_or_default();
            (uri, h)
        })
        .collect()
}

fn route_for<'a>(
    http: &'a [(String, crate::config_store::virtual_service::HttpRoute)],
    needle: &str,
) -> &'a crate::config_store::virtual_service::HttpRoute {
    &http
        .iter()
        .find(|(u, _)| u.contains(needle))
        .unwrap_or_else(|| panic!("no route matches {needle}: {http:#?}"))
        .1
}

#[test]
fn a_prefix_redirect_replaces_the_matched_prefix_keeping_the_segment_boundary() {
    let (out, problems) = translated("httproute-redirect-path.yaml");
    assert!(problems.is_empty(), "{problems:?}");
    let http = http_by_uri(&out);
    // `/original-prefix` is split into the exact path and the `/original-prefix/` prefix.
    let exact = route_for(&http, "\"/original-prefix\"");
    let prefix = route_for(&http, "\"/original-prefix/\"");
    let r = exact.redirect.as_ref().unwrap();
    assert_eq!(r.prefix_rewrite.as_deref(), Some("/replacement-prefix"));
    assert_eq!(r.uri, None);
    let r = prefix.redirect.as_ref().unwrap();
    assert_eq!(r.prefix_rewrite.as_deref(), Some("/replacement-prefix/"));
    // A full-path replacement is the whole path.
    let full = route_for(&http, "\"/full/\"").redirect.as_ref().unwrap();
    assert_eq!(full.uri.as_deref(), Some("/full-path-replacement"));
    assert_eq!(full.prefix_rewrite, None);
}

#[test]
fn a_redirect_without_a_port_keeps_the_requests_port_unless_the_scheme_changes() {
    let (out, problems) = translated("httproute-redirect-port-and-scheme.yaml");
    assert!(problems.is_empty(), "{problems:?}");
    let http = http_by_uri(&out);
    let red = |path: &str| route_for(&http, path).redirect.clone().unwrap();
    let nil = red("/scheme-nil-and-port-nil/");
    assert_eq!(nil.derive_port.as_deref(), Some("FROM_REQUEST_PORT"));
    assert_eq!(nil.port, None);
    let https = red("/scheme-https-and-port-nil/");
    assert_eq!(https.derive_port.as_deref(), Some("FROM_PROTOCOL_DEFAULT"));
    assert_eq!(https.scheme.as_deref(), Some("https"));
    let explicit = red("/scheme-nil-and-port-8080/");
    assert_eq!(explicit.port.map(|p| p.0), Some(8080));
    assert_eq!(explicit.derive_port, None);
}

#[test]
fn retries_retry_connection_errors_and_the_codes_and_a_backend_timeout_is_per_try() {
    let (out, problems) = translated("httproute-retry.yaml");
    assert!(problems.is_empty(), "{problems:?}");
    let http = http_by_uri(&out);
    let r = route_for(&http, "/retry/code-500-attempts-3/")
        .retries
        .clone()
        .unwrap();
    assert_eq!(r.attempts, 3);
    let on = r.retry_on.unwrap();
    assert!(
        on.contains("connect-failure") && on.ends_with(",500"),
        "{on}"
    );
    // A retry and both timeouts on one rule (conformance v1.6.0 has no such manifest).
    let (resources, refused) = load(&[
        shared("base-manifests.yaml"),
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: retry-and-timeouts, namespace: gateway-conformance-infra}
spec:
  parentRefs: [{name: same-namespace}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /retry/request-timeout-200ms}}]
    retry: {codes: [500], attempts: 5}
    timeouts: {request: 400ms, backendRequest: 200ms}
    backendRefs: [{name: infra-backend-v3, port: 8080}]
"#
        .to_string(),
    ]);
    assert!(refused.is_empty(), "{refused:?}");
    let (out, problems) = translate(&resources, "cluster.local");
    assert!(problems.is_empty(), "{problems:?}");
    let http = http_by_uri(&out);
    let both = route_for(&http, "/retry/request-timeout-200ms/");
    let retries = both.retries.clone().unwrap();
    assert_eq!(
        retries.per_try_timeout.map(|t| t.value),
        Some(std::time::Duration::from_millis(200))
    );
    assert_eq!(
        both.timeout.as_ref().map(|t| t.value),
        Some(std::time::Duration::from_millis(400))
    );
    // Without a retry stanza a backend timeout is the request's.
    let (out, _) = translated("httproute-timeout-backend-request.yaml");
    let http = http_by_uri(&out);
    assert!(
        http.iter()
            .any(|(_, h)| h.timeout.is_some() && h.retries.is_none()),
        "{http:#?}"
    );
}

#[test]
fn a_tls_route_on_a_terminating_listener_is_tcp_after_tls_per_hostname() {
    let (out, problems) = translated("tlsroute-mixed-termination-same-namespace.yaml");
    assert!(problems.is_empty(), "{problems:?}");
    let vs = routes_of(&out, "gateway-tlsroute-mixed-termination");
    let terminated = vs
        .iter()
        .find(|v| v.hosts == ["tls.example.com"])
        .unwrap_or_else(|| panic!("{vs:#?}"));
    assert_eq!(terminated.tcp.len(), 1, "{terminated:#?}");
    assert!(terminated.tls.is_empty());
    // The passthrough listener's route stays an SNI route.
    assert!(
        vs.iter().any(|v| v
            .tls
            .iter()
            .any(|t| format!("{t:?}").contains("abc.example.com"))),
        "{vs:#?}"
    );
}

#[test]
fn conflicting_tcp_routes_go_oldest_first() {
    let yaml = |name: &str, created: &str, backend: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {{name: {name}, namespace: {INFRA}, creationTimestamp: \"{created}\"}}\nspec:\n  parentRefs: [{{name: tcp-multi-route-attach-gateway, sectionName: tcp}}]\n  rules: [{{backendRefs: [{{name: {backend}, port: 3000}}]}}]\n"
        )
    };
    let manifests = shared("tests/tcproute-multiple-routes-attachment.yaml");
    // Only the Gateway and Services of the suite's file: the routes are written here with
    // their creation times (the newer sorts first by name).
    let without_routes: String = manifests
        .split("\n---")
        .filter(|d| !d.lines().any(|l| l == "kind: TCPRoute"))
        .collect::<Vec<_>>()
        .join("\n---");
    let (resources, refused) = load(&[
        shared("base-manifests.yaml"),
        without_routes,
        yaml(
            "tcproute-attach-older",
            "2026-11-25T10:00:00Z",
            "tcp-attach-backend-1",
        ),
        yaml(
            "tcproute-attach-newer",
            "2026-11-25T10:00:01Z",
            "tcp-attach-backend-2",
        ),
    ]);
    assert!(refused.is_empty(), "{refused:?}");
    let (out, problems) = translate(&resources, "cluster.local");
    assert!(problems.is_empty(), "{problems:?}");
    let vs = routes_of(&out, "tcp-multi-route-attach-gateway");
    let tcp: Vec<_> = vs.iter().flat_map(|v| v.tcp.clone()).collect();
    assert_eq!(tcp.len(), 2, "{tcp:#?}");
    assert!(
        format!("{:?}", tcp[0].route).contains("tcp-attach-backend-1"),
        "{tcp:#?}"
    );
}

#[test]
fn a_certificate_of_another_namespace_needs_a_reference_grant() {
    let pair = rcgen::generate_simple_self_signed(vec!["gw.example".to_string()]).unwrap();
    let (crt, key) = (pair.cert.pem(), pair.signing_key.serialize_pem());
    let secret = |ns: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: certificate, namespace: {ns}}}\ntype: kubernetes.io/tls\nstringData: {{tls.crt: {crt:?}, tls.key: {key:?}}}\n"
        )
    };
    let gateway = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: {INFRA}}}\nspec:\n  gatewayClassName: istio\n  listeners:\n  - name: https\n    port: 443\n    protocol: HTTPS\n    tls: {{certificateRefs: [{{name: certificate, namespace: web}}]}}\n"
    );
    let grant = format!(
        "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {{name: g, namespace: web}}\nspec:\n  from: [{{group: gateway.networking.k8s.io, kind: Gateway, namespace: {INFRA}}}]\n  to: [{{group: \"\", kind: Secret}}]\n"
    );
    let credential = |texts: &[String]| {
        let mut resources = Vec::new();
        for t in texts {
            for doc in serde_yaml_ng::Deserializer::from_str(t) {
                use serde::Deserialize as _;
                let v = serde_json::Value::deserialize(doc).unwrap();
                if let Some(r) = crate::config_store::parse_document(v).unwrap() {
                    resources.push(r);
                }
            }
        }
        let (out, problems) = translate(&resources, "cluster.local");
        let gw = out.iter().find_map(|r| match r {
            Resource::Gateway(_, g) => Some(g.clone()),
            _ => None,
        });
        let none = |_: &str, _: &str| Vec::new();
        let listener = status::statuses(&resources, "cluster.local", &none)
            .into_iter()
            .find(|s| s.kind == "KubernetesGateway")
            .map(|s| s.status["listeners"][0]["conditions"].clone())
            .unwrap();
        (
            gw.unwrap().servers[0]
                .tls
                .as_ref()
                .and_then(|t| t.credential_name.clone()),
            problems,
            condition(&listener, "ResolvedRefs").1.to_string(),
            resources,
        )
    };
    let (name, problems, reason, _) = credential(&[secret("web"), gateway.clone()]);
    assert_eq!(name, None);
    assert!(problems[0].contains("not permitted"), "{problems:?}");
    assert_eq!(reason, "RefNotPermitted");
    let (name, problems, reason, resources) =
        credential(&[secret("web"), gateway.clone(), grant.clone()]);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        name.as_deref(),
        Some("kubernetes-gateway://web/certificate")
    );
    assert_eq!(reason, "ResolvedRefs");
    // What a router of the Gateway's namespace may read: the granted Secret, not another
    // namespace's without a grant.
    let grants: Vec<_> = resources
        .iter()
        .filter_map(|r| match r {
            Resource::GatewayApi(m, o) => match o.as_ref() {
                GatewayApiObject::ReferenceGrant(g) => Some((m.clone(), g.clone())),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert!(secret_granted(&grants, INFRA, "web", "certificate"));
    assert!(!secret_granted(&grants, "other", "web", "certificate"));
}

#[test]
fn each_listener_serves_only_the_routes_attached_to_it() {
    // The shape of the suite's GatewayHTTPListenerIsolation (v1.6.0): listeners on one port,
    // without a hostname and for `*.example.com`, each with its own route.
    let route = |listener: &str| {
        format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: attaches-to-{listener}, namespace: {INFRA}}}\nspec:\n  parentRefs: [{{name: http-listener-isolation, sectionName: {listener}}}]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: /{listener}}}}}], backendRefs: [{{name: infra-backend-v1, port: 8080}}]}}]\n"
        )
    };
    let manifests = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: http-listener-isolation, namespace: {INFRA}}}\nspec:\n  gatewayClassName: istio\n  listeners:\n  - {{name: empty-hostname, port: 80, protocol: HTTP}}\n  - {{name: wildcard-example-com, port: 80, protocol: HTTP, hostname: '*.example.com'}}\n  - {{name: wildcard-foo-example-com, port: 80, protocol: HTTP, hostname: '*.foo.example.com'}}\n  - {{name: abc-foo-example-com, port: 80, protocol: HTTP, hostname: abc.foo.example.com}}\n{}{}",
        route("empty-hostname"),
        route("wildcard-example-com")
    );
    let (resources, refused) = load(&[shared("base-manifests.yaml"), manifests]);
    assert!(refused.is_empty(), "{refused:?}");
    let (out, problems) = translate(&resources, "cluster.local");
    assert!(problems.is_empty(), "{problems:?}");
    let gateways: Vec<_> = out
        .iter()
        .filter_map(|r| match r {
            Resource::Gateway(m, s) if m.name.starts_with("http-listener-isolation-") => {
                Some((m.name.clone(), s.servers.len()))
            }
            _ => None,
        })
        .collect();
    // Four listeners, four Istio Gateways of one server each.
    assert_eq!(gateways.len(), 4, "{gateways:?}");
    assert!(gateways.iter().all(|(_, n)| *n == 1));
    // The route on the listener without a hostname is bound to that listener alone, so a
    // server of `*.example.com` never takes it.
    let vs = virtual_services(&out);
    let empty = vs
        .iter()
        .find(|(_, s)| format!("{:?}", s.http).contains("/empty-hostname"))
        .unwrap();
    assert_eq!(
        empty.1.gateways,
        [format!(
            "{INFRA}/http-listener-isolation-{GENERATED}-empty-hostname"
        )]
    );
}

#[test]
fn a_route_host_a_more_specific_listener_covers_is_left_to_that_listener() {
    let l = |name: &str, hostname: Option<&str>| crate::config_store::gateway_api::Listener {
        name: name.into(),
        port: 80,
        protocol: "HTTP".into(),
        hostname: hostname.map(Into::into),
        ..Default::default()
    };
    let spec = GatewaySpec {
        gateway_class_name: "istio".into(),
        listeners: vec![
            l("empty", None),
            l("wild", Some("*.example.com")),
            l("wild-foo", Some("*.foo.example.com")),
            l("abc", Some("abc.foo.example.com")),
        ],
        ..Default::default()
    };
    let gw = Gateway {
        ns: INFRA.into(),
        name: "g".into(),
        spec: &spec,
    };
    let held = |listener: usize, h: &str| held_elsewhere(&gw, &spec.listeners[listener], h);
    // The listener without a hostname keeps only what no other listener covers.
    assert!(!held(0, "bar.com"));
    for h in [
        "*.example.com",
        "*.foo.example.com",
        "abc.foo.example.com",
        "x.example.com",
    ] {
        assert!(held(0, h), "{h}");
    }
    // `*.example.com` keeps its own wildcard, not the more specific listeners' names.
    assert!(!held(1, "*.example.com"));
    assert!(held(1, "*.foo.example.com"));
    assert!(held(1, "abc.foo.example.com"));
    assert!(!held(2, "*.foo.example.com"));
    assert!(held(2, "abc.foo.example.com"));
    // The most specific listener keeps everything of its own.
    assert!(!held(3, "abc.foo.example.com"));
}
