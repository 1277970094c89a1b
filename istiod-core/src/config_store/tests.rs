//! Reading documents: kinds, fields, checks and errors.

use std::path::Path;

use super::*;

#[test]
fn parses_multi_document_yaml() {
    let yaml = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: httpbin, namespace: demo}
spec:
  hosts: [httpbin.demo.svc.cluster.local]
  addresses: [10.96.0.10]
  ports: [{number: 8000, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: httpbin}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: httpbin-1, namespace: demo}
spec: {address: 10.0.0.2, labels: {app: httpbin}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: httpbin, namespace: demo}
spec:
  hosts: [httpbin]
  http:
  - route: [{destination: {host: httpbin, subset: v1}}]
    timeout: 2s
    corsPolicy: {allowOrigins: [{exact: "https://a.example"}]}
---
kind: MeshConfig
metadata: {name: mesh}
---
kind: ConfigMap
metadata: {name: not-ours}
data: {mesh: "whatever: 1"}
"#;
    let r = parse_file(Path::new("x.yaml"), yaml).unwrap();
    assert_eq!(r.len(), 4);
    // Fields we do not type are kept as written.
    let shown = r[2].to_json();
    assert_eq!(
        shown["spec"]["http"][0]["corsPolicy"]["allowOrigins"][0]["exact"],
        "https://a.example"
    );
    assert!(
        matches!(&r[0], Resource::ServiceEntry(m, s) if m.name == "httpbin" && s.ports[0].number == 8000)
    );
}

#[test]
fn bad_document_names_file_and_document() {
    let yaml = "kind: ServiceEntry\nmetadata: {name: a}\nspec: {hosts: [a]}\n---\nkind: ServiceEntry\nmetadata: {name: b}\nspec: {hosts: [], ports: []}\n";
    let e = parse_file(Path::new("mesh/bad.yaml"), yaml).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("mesh/bad.yaml: document 2"), "{msg}");
    assert!(msg.contains("at least one host"), "{msg}");
    let e = parse_file(Path::new("y.yaml"), "kind: [unclosed").unwrap_err();
    assert!(e.to_string().starts_with("y.yaml: document 1"));
    let e = parse_file(
        Path::new("z.yaml"),
        "kind: Frobnicator\nmetadata: {name: a}\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("unsupported kind \"Frobnicator\""));
}

/// Each traffic kind's checks, by the field they name.
#[test]
fn traffic_kinds_are_checked_and_errors_name_the_field() {
    let cases: &[(&str, &str)] = &[
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a]}",
            "spec.http, tcp or tls: at least one route",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: \"\"}}]}]}",
            "spec.http[0].route[0].destination.host",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}, weight: -5}]}]}",
            "spec.http[0].route[0].weight: invalid value: integer `-5`",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], redirect: {uri: /x}}]}",
            "spec.http[0]: route, redirect, directResponse and delegate exclude each other",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], timeout: soon}]}",
            "spec.http[0].timeout",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], tcp: [{route: [{destination: {host: a, port: {number: 70000}}}]}]}",
            "spec.tcp[0].route[0].destination.port.number: port 70000 is not in 1-65535",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], tls: [{route: [{destination: {host: a}}]}]}",
            "spec.tls[0].match",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {gateways: [gw], http: [{route: [{destination: {host: a}}]}]}",
            "spec.gateways: a delegate",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], retries: {attempts: 3, perTryTimeout: 99999999999999h}}]}",
            "spec.http[0].retries.perTryTimeout: \"99999999999999h\" is not a duration",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], retries: {attempts: 3, retryOn: \"5xx,sometimes\"}}]}",
            "spec.http[0].retries.retryOn: \"sometimes\"",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], fault: {abort: {httpStatus: 700}}}]}",
            "spec.http[0].fault.abort.httpStatus: 700",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], fault: {delay: {fixedDelay: 1s, percentage: {value: 150}}}}]}",
            "spec.http[0].fault.delay.percentage: percentage 150",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], fault: {delay: {fixedDelay: 1s, percentage: {value: .nan}}}}]}",
            "spec.http[0].fault.delay.percentage",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{match: [{uri: {regex: \"(a\"}}], route: [{destination: {host: a}}]}]}",
            "spec.http[0].match[0].uri: \"(a\" is not an RE2",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{match: [{uri: {exact: /a, prefix: /b}}], route: [{destination: {host: a}}]}]}",
            "spec.http[0].match[0].uri: exact, prefix and regex exclude",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{redirect: {uri: /x, redirectCode: 200}}]}",
            "spec.http[0].redirect.redirectCode: 200",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{directResponse: {status: 99}}]}",
            "spec.http[0].directResponse.status: 99",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a, port: {number: 0}}}]}]}",
            "spec.http[0].route[0].destination.port.number: port 0",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: \"*.a\"}}]}]}",
            "spec.http[0].route[0].destination.host: \"*.a\"",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], headers: {request: {set: {\":path\": x}}}}]}",
            "spec.http[0].headers.request: \":path\" is not a header name",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], mirror: {host: b}, mirrors: [{destination: {host: c}}]}]}",
            "spec.http[0]: mirror and mirrors exclude",
        ),
        (
            "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}], timeout: 1e400}]}",
            "spec.http[0].timeout: \"1e400\" is not a duration",
        ),
        (
            "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {outlierDetection: {maxEjectionPercent: 120}}}",
            "spec.trafficPolicy.outlierDetection.maxEjectionPercent: 120",
        ),
        (
            "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {connectionPool: {tcp: {connectTimeout: NaNs}}}}",
            "spec.trafficPolicy.connectionPool.tcp.connectTimeout: \"NaNs\"",
        ),
        (
            "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {loadBalancer: {consistentHash: {}}}}",
            "spec.trafficPolicy.loadBalancer.consistentHash: exactly one",
        ),
        (
            "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {portLevelSettings: [{port: {number: 80}}, {port: {number: 80}}]}}",
            "spec.trafficPolicy.portLevelSettings[1].port: port 80 is set twice",
        ),
        (
            "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {tls: {mode: SIMPLE, caCertificates: etc/ca.pem}}}",
            "spec.trafficPolicy.tls.caCertificates: \"etc/ca.pem\" must be an absolute",
        ),
        (
            "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {tls: {mode: SIMPLE, credentialName: secret}}}",
            "spec.trafficPolicy.tls.credentialName: Kubernetes secrets",
        ),
        (
            "kind: DestinationRule\nmetadata: {name: d}\nspec: {subsets: []}",
            "spec.host: required",
        ),
        (
            "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, subsets: [{name: V1, labels: {version: v1}}]}",
            "spec.subsets[0].name: \"V1\" is not a valid subset name",
        ),
        (
            "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, subsets: [{name: v1}, {name: v1}]}",
            "spec.subsets[1].name: subset \"v1\" is defined twice",
        ),
        (
            "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {tls: {mode: MUTUAL}}}",
            "spec.trafficPolicy.tls: MUTUAL needs",
        ),
        (
            "kind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, subsets: [{name: v1, trafficPolicy: {loadBalancer: {simple: FASTEST}}}]}",
            "spec.subsets[0].trafficPolicy.loadBalancer.simple: \"FASTEST\"",
        ),
        (
            "kind: Gateway\nmetadata: {name: g}\nspec: {selector: {istio: ingressgateway}}",
            "spec.servers: at least one server",
        ),
        (
            "kind: Gateway\nmetadata: {name: g}\nspec: {servers: [{port: {number: 80, name: http, protocol: HTTP}}]}",
            "spec.servers[0].hosts: at least one host",
        ),
        (
            "kind: Gateway\nmetadata: {name: g}\nspec: {servers: [{port: {number: 0, name: http, protocol: HTTP}, hosts: [\"*\"]}]}",
            "spec.servers[0].port.number: port number 0",
        ),
        (
            "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {action: PERMIT}",
            "spec.action: unknown variant `PERMIT`",
        ),
        (
            "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {action: CUSTOM}",
            "spec.provider.name: a CUSTOM policy must name its provider",
        ),
        (
            "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {rules: [{when: [{key: \"request.auth.claims[iss]\"}]}]}",
            "spec.rules[0].when[0]: values or notValues is required",
        ),
        (
            "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {rules: \"all\"}",
            "AuthorizationPolicy p: invalid spec",
        ),
        (
            "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {rules: [{to: [{operation: {path: [/admin]}}]}]}",
            "spec.rules[0].to[0].operation.path: unknown field `path`",
        ),
        (
            "kind: AuthorizationPolicy\nmetadata: {name: p}\nspec: {action: CUSTOM, provider: {name: ext}}",
            "spec.rules: a CUSTOM policy needs at least one rule",
        ),
    ];
    let sidecar = |spec: &str| format!("kind: Sidecar\nmetadata: {{name: s}}\nspec: {spec}");
    let sidecar_cases = [
        (
            sidecar("{ingress: [{port: {number: 0}}]}"),
            "spec.ingress[0].port.number 0 is not in 1-65535",
        ),
        (
            sidecar("{ingress: [{port: {number: 80}}, {port: {number: 80}}]}"),
            "spec.ingress[1].port.number 80 is used by an earlier ingress listener",
        ),
        (
            sidecar("{ingress: [{port: {number: 80}, defaultEndpoint: \"10.0.0.1:8080\"}]}"),
            "spec.ingress[0].defaultEndpoint: \"10.0.0.1:8080\": only a loopback",
        ),
        (
            sidecar("{ingress: [{port: {number: 80}, defaultEndpoint: \"unix://sock\"}]}"),
            "must be absolute",
        ),
        (
            sidecar("{ingress: [{port: {number: 80}, defaultEndpoint: localhost}]}"),
            "is not 127.0.0.1:PORT",
        ),
        (
            sidecar("{egress: [{port: {number: 70000}, hosts: [\"./*\"]}]}"),
            "spec.egress[0].port.number 70000",
        ),
    ];
    let cases: Vec<(&str, &str)> = cases
        .iter()
        .copied()
        .chain(sidecar_cases.iter().map(|(d, e)| (d.as_str(), *e)))
        .collect();
    for (doc, expected) in cases {
        let err = parse_file(Path::new("t.yaml"), doc)
            .expect_err(doc)
            .to_string();
        assert!(
            err.contains(expected),
            "{doc}\n  gave: {err}\n  expected: {expected}"
        );
        assert!(err.starts_with("t.yaml: document 1"), "{err}");
    }
    // The valid forms of each kind load.
    let good = "kind: VirtualService\nmetadata: {name: v}\nspec: {hosts: [a], http: [{route: [{destination: {host: a, subset: v1}, weight: 90}, {destination: {host: a, subset: v2}, weight: 10}]}]}\n---\nkind: DestinationRule\nmetadata: {name: d}\nspec: {host: a, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}, loadBalancer: {simple: LEAST_REQUEST}}, subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]}\n---\nkind: Gateway\nmetadata: {name: g}\nspec: {selector: {istio: ingressgateway}, servers: [{port: {number: 443, name: https, protocol: HTTPS}, hosts: [\"ns/*.example.com\"], tls: {mode: SIMPLE, credentialName: c}}]}\n---\nkind: Namespace\nmetadata: {name: shop, labels: {istio-injection: enabled}}\n";
    let kinds: Vec<&str> = parse_file(Path::new("g.yaml"), good)
        .unwrap()
        .iter()
        .map(Resource::kind)
        .collect();
    assert_eq!(
        kinds,
        ["VirtualService", "DestinationRule", "Gateway", "Namespace"]
    );
    // The dry-run annotation is read (and only "true"/"false" are taken).
    let dry = |v: &str| {
        format!(
            "kind: AuthorizationPolicy\nmetadata: {{name: p, annotations: {{istio.io/dry-run: {v}}}}}\nspec: {{action: DENY, rules: [{{}}]}}\n"
        )
    };
    match parse_file(Path::new("d.yaml"), &dry("\"true\""))
        .unwrap()
        .as_slice()
    {
        [Resource::AuthorizationPolicy(_, spec)] => assert!(spec.dry_run),
        other => panic!("{other:?}"),
    }
    let err = parse_file(Path::new("d.yaml"), &dry("yes-please"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("metadata.annotations.istio.io/dry-run"),
        "{err}"
    );
    // A valid ALLOW/DENY/AUDIT AuthorizationPolicy loads, typed whole.
    let policy = "kind: AuthorizationPolicy\nmetadata: {name: p, namespace: shop}\nspec: {action: DENY, rules: [{from: [{source: {notNamespaces: [x]}}], when: [{key: \"request.headers[x]\", values: [\"1\"]}]}]}\n";
    match parse_file(Path::new("p.yaml"), policy).unwrap().as_slice() {
        [Resource::AuthorizationPolicy(m, spec)] => {
            assert_eq!(spec.action, authorization::Action::Deny);
            assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        }
        other => panic!("{other:?}"),
    }
}

/// A tracer's or logger's field this control plane does not apply is named, not fatal.
/// A pod is named after its workload as istiod names it: a Deployment's pod (generated
/// name, controlled by a ReplicaSet ending in its `pod-template-hash`) by the Deployment;
/// another controller's by the controller; a pod of its own by itself.
#[test]
fn a_pods_workload_is_named_as_istiod_names_it() {
    let pod = |meta: &str| -> String {
        let yaml = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {meta}\nspec: {{serviceAccountName: s}}\n"
        );
        match &parse_file(Path::new("p.yaml"), &yaml).unwrap()[0] {
            Resource::Pod(_, p) => p.workload_name.clone(),
            other => panic!("{other:?}"),
        }
    };
    let owned = |kind: &str, owner: &str| {
        format!(
            "{{name: reviews-v1-5d9f-x7k2p, generateName: reviews-v1-5d9f-, labels: {{pod-template-hash: 5d9f}}, ownerReferences: [{{apiVersion: apps/v1, kind: {kind}, name: {owner}, uid: u, controller: true}}]}}"
        )
    };
    assert_eq!(pod(&owned("ReplicaSet", "reviews-v1-5d9f")), "reviews-v1");
    assert_eq!(pod(&owned("StatefulSet", "db")), "db");
    // A ReplicaSet not named after the hash is the workload itself.
    assert_eq!(pod(&owned("ReplicaSet", "other")), "other");
    assert_eq!(pod("{name: solo}"), "solo");
    // Not generated: its own name, whatever controls it.
    assert_eq!(
        pod(
            "{name: fixed, ownerReferences: [{apiVersion: apps/v1, kind: StatefulSet, name: db, uid: u, controller: true}]}"
        ),
        "fixed"
    );
}

#[test]
fn unknown_provider_fields_are_warnings() {
    let cm = "kind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |-\n    extensionProviders:\n    - name: zipkin\n      zipkin: {service: z.istio-system.svc.cluster.local, port: 9411, timeout: 5s}\n";
    let r = parse_file(Path::new("cm.yaml"), cm).unwrap();
    assert_eq!(
        r[0].metadata().warnings,
        ["data.mesh.extensionProviders[0].zipkin.timeout: unknown field, ignored"]
    );
}

/// Istio's mesh config: the `mesh` key of the `istio` ConfigMap, a MeshConfig document, or
/// a plain file; checked field by field.
#[test]
fn mesh_config_sources_and_checks() {
    let cm = "kind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |-\n    rootNamespace: mesh-root\n    enableAutoMtls: false\n    outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n    defaultConfig: {discoveryAddress: istiod:15012}\n";
    let r = parse_file(Path::new("cm.yaml"), cm).unwrap();
    let Resource::MeshConfig(_, mesh) = &r[0] else {
        panic!("{r:?}")
    };
    assert_eq!(mesh.root_namespace.as_deref(), Some("mesh-root"));
    assert_eq!(mesh.enable_auto_mtls, Some(false));
    assert!(mesh.rest.contains_key("defaultConfig"), "kept as written");

    let bad = cm.replace("REGISTRY_ONLY", "DENY_ALL");
    let e = parse_file(Path::new("cm.yaml"), &bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "ConfigMap istio: data.mesh: MeshConfig: outboundTrafficPolicy.mode: \"DENY_ALL\""
        ),
        "{e}"
    );
    let e = parse_mesh_config(
        Path::new("/etc/istio/config/mesh"),
        "rootNamespace: Not_A_Name\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("/etc/istio/config/mesh: document 1: MeshConfig: rootNamespace"),
        "{e}"
    );
    assert_eq!(
        parse_mesh_config(Path::new("m"), "").unwrap(),
        MeshConfigSpec::default()
    );
    let e = parse_file(
        Path::new("d.yaml"),
        "kind: MeshConfig\nmetadata: {name: m}\nspec: {enableAutoMtls: sometimes}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("MeshConfig m: invalid spec"), "{e}");
}

mod size_tests {
    /// The bound that keeps a cluster's many small objects small: a Resource is its largest
    /// unboxed variant (a VirtualService's, a Pod's), not a DestinationRule's 1 KiB.
    #[test]
    fn a_resource_is_small() {
        let size = std::mem::size_of::<super::Resource>();
        assert!(size <= 256, "Resource is {size} bytes");
    }
}
