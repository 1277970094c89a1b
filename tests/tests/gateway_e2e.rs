#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Gateways with real traffic: a gateway pod running `pilot-agent proxy router --configDir`
//! (no capture, labels from ./etc/istio/pod/labels, ports 80/443 bound by Envoy as uid 1337
//! through the pod sysctl `net.ipv4.ip_unprivileged_port_start=0`), backends in the mesh behind
//! it, and clients outside the mesh.
//! - The seed's Gateway and VirtualService as written: HTTP 80 redirects (301) to https, HTTPS
//!   443 from certificate files (/etc/certs) routes the seed's canary; an unknown host gets 404;
//!   readiness on 15021.
//! - An AuthorizationPolicy selecting the gateway pod denies a path at the gateway.
//! - Egress: a mesh client's request for an external host goes through the gateway (the
//!   VirtualService bound to `mesh` and to the egress Gateway).
//! - HTTPS MUTUAL from a Secret (`credentialName`): a client without a certificate is refused,
//!   one with a certificate gets through; the Secret's rotation is served without a restart.
//! - TLS PASSTHROUGH by SNI to a TLS server that ends the client's TLS itself.

mod mesh;

use std::time::Duration;

use harness::wait_until;
use mesh::*;

/// The gateway pod's labels (Kubernetes downward-API format).
const GATEWAY_LABELS: &str = "app=\"istio-ingress-gateway\"\ngateway.networking.k8s.io/gateway-name=\"edge\"\nistio=\"ingressgateway\"\nrole=\"egressgateway\"\n";
const GATEWAY_NS: &str = "istio-system";

/// Sends one request over TLS and prints `STATUS CERT-SHA256-PREFIX FIRST-BODY-LINE`, or
/// `ERR - reason`. Args: ip port sni path ca [cert key].
const TLS_CLIENT: &str = r#"
import hashlib, socket, ssl, sys
ip, port, sni, path, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
ctx = ssl.create_default_context(cafile=ca)
if len(sys.argv) > 7:
    ctx.load_cert_chain(sys.argv[6], sys.argv[7])
try:
    t = ctx.wrap_socket(socket.create_connection((ip, port), 5), server_hostname=sni)
    fp = hashlib.sha256(t.getpeercert(binary_form=True)).hexdigest()[:16]
    t.sendall(f"GET {path} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while True:
        b = t.recv(65536)
        if not b:
            break
        data += b
    head, _, body = data.decode(errors="replace").partition("\r\n\r\n")
    status = head.split(" ")[1] if head.startswith("HTTP/") else "0"
    print(f"{status} {fp} {(body.splitlines() or [''])[0]}")
except Exception as e:
    print(f"ERR - {type(e).__name__}: {e}")
"#;

const BACKENDS: &[Backend] = &[
    ("v1", "app: reviews, version: v1", &[]),
    ("v2", "app: reviews, version: v2", &[]),
    // Outside the mesh: the clients of the gateway, and the external server of egress.
    ("outside", "", &[]),
];

/// The mesh with a gateway pod started after it; returns the mesh and the gateway's index.
/// `etc` files are put at /etc/... in the gateway pod before its agent starts.
fn gateway_mesh(
    test: &str,
    backends: &[Backend],
    routing: &str,
    etc: &[(&str, Vec<u8>)],
) -> Option<(Mesh, usize)> {
    let mut gw = 0;
    let mut m = mesh_with(test, backends, routing, |net| {
        gw = net
            .add_pod("gw", 3 + u8::try_from(backends.len()).unwrap())
            .unwrap();
    })?;
    let ip = m.net.pods[gw].ip.to_string();
    // The gateway's own WorkloadEntry (endpoint of the egress gateway's service).
    std::fs::write(
        m.dir.join("gateway.yaml"),
        format!(
            "kind: WorkloadEntry\nmetadata: {{name: gw, namespace: {GATEWAY_NS}}}\nspec: {{address: {ip}, labels: {{role: egressgateway}}}}\n"
        ),
    )
    .unwrap();
    std::fs::write(m.net.dir().join("tls_client.py"), TLS_CLIENT).unwrap();
    let dir = m.dir.clone();
    let pod = &mut m.net.pods[gw];
    pod.allow_low_ports().unwrap();
    for (rel, contents) in etc {
        pod.etc_file(rel, contents).unwrap();
    }
    let labels = pod.dir.join("etc/istio/pod");
    std::fs::create_dir_all(&labels).unwrap();
    std::fs::write(labels.join("labels"), GATEWAY_LABELS).unwrap();
    let agent = harness::binary("pilot-agent");
    pod.spawn(
        "pilot-agent",
        0,
        0,
        &[
            ("POD_NAME", "gw"),
            ("POD_NAMESPACE", GATEWAY_NS),
            ("INSTANCE_IP", &ip),
            ("SERVICE_ACCOUNT", "istio-ingressgateway"),
            ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"0s\"}"),
        ],
        &[
            agent.to_str().unwrap(),
            "proxy",
            "router",
            "--configDir",
            dir.to_str().unwrap(),
        ],
    )
    .unwrap();
    // Readiness as Istio's gateways report it, on 15021.
    let ready = m.net.pods[gw].wait_http_ok(
        "http://127.0.0.1:15021/healthz/ready",
        Duration::from_secs(60),
    );
    assert!(ready.is_ok(), "{ready:?}\n{}", m.net.logs());
    Some((m, gw))
}

fn outside(m: &Mesh) -> usize {
    m.backends["outside"]
}

/// One TLS request from outside the mesh: `STATUS FINGERPRINT BODY` or `ERR - ...`.
fn tls_get(
    m: &Mesh,
    gw: usize,
    port: u16,
    sni: &str,
    path: &str,
    ca: &str,
    cert: &[&str],
) -> String {
    let script = m.net.dir().join("tls_client.py");
    let ip = m.net.pods[gw].ip.to_string();
    let port = port.to_string();
    let mut args = vec![script.to_str().unwrap(), &ip, &port, sni, path, ca];
    args.extend_from_slice(cert);
    let out = m.python_in(outside(m), &args);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Writes `text` where the app uid can read it (the test's shared directory).
fn shared_file(m: &Mesh, name: &str, text: &str) -> String {
    let path = m.net.dir().join(name);
    harness::write_readable(&path, text).unwrap();
    path.display().to_string()
}

fn seed_routing(outside_ip: &str) -> String {
    format!(
        r#"kind: DestinationRule
metadata: {{name: reviews, namespace: {NS}}}
spec:
  host: reviews
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
---
kind: ServiceEntry
metadata: {{name: core, namespace: {NS}}}
spec:
  hosts: [core.{NS}.svc.cluster.local]
  addresses: [10.234.0.30]
  location: MESH_INTERNAL
  ports: [{{number: {PORT}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{version: v1}}}}
---
apiVersion: networking.istio.io/v1alpha3
kind: Gateway
metadata:
  name: book-gateway
  namespace: book
spec:
  selector:
    app: istio-ingress-gateway
  servers:
  - port:
      number: 80
      name: http
      protocol: HTTP
    hosts:
    - bookinfo.com
    tls:
      httpsRedirect: true # sends 301 redirect for http requests
  - port:
      number: 443
      name: https-443
      protocol: HTTPS
    hosts:
    - bookinfo.com
    tls:
      mode: SIMPLE # enables HTTPS on this port
      serverCertificate: /etc/certs/servercert.pem
      privateKey: /etc/certs/privatekey.pem
---
apiVersion: networking.istio.io/v1alpha3
kind: VirtualService
metadata:
  name: book-route
  namespace: book
spec:
  gateways:
  - mesh#모든 사이드카 의미
  - book-gateway
  hosts:
  - bookinfo.com
  http:
  - name: "reviews-v1-v2-canary-routes"
    match:
    - uri:
        prefix: "/wpcatalog"
    - uri:
        prefix: "/consumercatalog"
    rewrite:
      uri: "/newcatalog"
    route:
    - destination:
        host: reviews.book.svc.cluster.local 
        #host: reviews #위와같은의미
        subset: v2
      weight: 50
    - destination:
        host: reviews.book.svc.cluster.local
        subset: v1
      weight: 50
  - name: "reviews-v1-route"
    route:
    - destination:
        host: core.book.svc.cluster.local
---
kind: AuthorizationPolicy
metadata: {{name: gateway-deny-admin, namespace: {GATEWAY_NS}}}
spec:
  selector: {{matchLabels: {{istio: ingressgateway}}}}
  action: DENY
  rules: [{{to: [{{operation: {{paths: ["/admin*"]}}}}]}}]
---
kind: ServiceEntry
metadata: {{name: external, namespace: {NS}}}
spec:
  hosts: [external.example]
  location: MESH_EXTERNAL
  ports: [{{number: {PORT}, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: {outside_ip}}}]
---
kind: ServiceEntry
metadata: {{name: egressgateway, namespace: {GATEWAY_NS}}}
spec:
  hosts: [istio-egressgateway.{GATEWAY_NS}.svc.cluster.local]
  addresses: [10.234.0.99]
  location: MESH_INTERNAL
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{role: egressgateway}}}}
---
kind: Gateway
metadata: {{name: istio-egressgateway, namespace: {GATEWAY_NS}}}
spec:
  selector: {{role: egressgateway}}
  servers:
  - port: {{number: 80, name: http, protocol: HTTP}}
    hosts: [external.example]
---
kind: VirtualService
metadata: {{name: external-through-egress, namespace: {NS}}}
spec:
  hosts: [external.example]
  gateways: [mesh, {GATEWAY_NS}/istio-egressgateway]
  http:
  - match: [{{gateways: [mesh], port: {PORT}}}]
    route: [{{destination: {{host: istio-egressgateway.{GATEWAY_NS}.svc.cluster.local, port: {{number: 80}}}}}}]
  - match: [{{gateways: [{GATEWAY_NS}/istio-egressgateway], port: 80}}]
    route: [{{destination: {{host: external.example, port: {{number: {PORT}}}}}}}]
"#
    )
}

#[test]
fn the_seed_gateway_redirects_serves_https_from_files_and_egress_goes_through_it() {
    let test = "the_seed_gateway_redirects_serves_https_from_files_and_egress_goes_through_it";
    let (ca, issuer) = test_ca("gateway-e2e CA");
    let (cert, key) = leaf_cert(&issuer, "bookinfo.com");
    // The outside pod's address is known once the network exists: pods are numbered in order
    // (client 2, backends from 3).
    let outside_ip = harness::pod_ipv4(3 + 2).to_string();
    let Some((m, gw)) = gateway_mesh(
        test,
        BACKENDS,
        &seed_routing(&outside_ip),
        &[
            ("certs/servercert.pem", cert.into_bytes()),
            ("certs/privatekey.pem", key.into_bytes()),
        ],
    ) else {
        return;
    };
    assert_eq!(m.net.pods[outside(&m)].ip.to_string(), outside_ip);
    let gw_ip = m.net.pods[gw].ip.to_string();
    // HTTP on 80: the seed's httpsRedirect answers 301 to https.
    let r = &m.send_from(
        outside(&m),
        &format!("http://{gw_ip}/productpage"),
        1,
        &[("host", "bookinfo.com")],
        1,
    )[0];
    assert_eq!(r.code, 301, "{r:?}\n{}", m.net.logs());
    assert_eq!(
        r.location.as_deref(),
        Some("https://bookinfo.com/productpage"),
        "{r:?}"
    );
    // A host no server or VirtualService admits: 404 from the gateway.
    let r = &m.send_from(
        outside(&m),
        &format!("http://{gw_ip}/"),
        1,
        &[("host", "unknown.example")],
        1,
    )[0];
    assert_eq!(r.code, 404, "{r:?}");
    // HTTPS on 443 with the seed's certificate files: the canary (rewrite, 50/50) and the
    // default route, as the seed's VirtualService says.
    let ca_path = shared_file(&m, "gateway-ca.pem", &ca);
    let mut versions = std::collections::BTreeMap::new();
    for _ in 0..20 {
        let line = tls_get(&m, gw, 443, "bookinfo.com", "/wpcatalog/7", &ca_path, &[]);
        assert!(
            line.starts_with("200 ") && line.contains("path=/newcatalog/7"),
            "{line}\n{}",
            m.net.logs()
        );
        let instance = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("instance="))
            .unwrap_or_default()
            .to_string();
        *versions.entry(instance).or_insert(0) += 1;
    }
    assert_eq!(
        versions.keys().cloned().collect::<Vec<_>>(),
        ["v1", "v2"],
        "{versions:?}"
    );
    let line = tls_get(&m, gw, 443, "bookinfo.com", "/reviews", &ca_path, &[]);
    assert!(
        line.starts_with("200 ") && line.contains("instance=v1 path=/reviews"),
        "{line}"
    );
    // The gateway reports Istio's standard metrics too, as a client (`reporter="source"`, Istio's
    // CLIENT mode for gateways), for the requests it routed.
    let mut scraped = String::new();
    let reported = wait_until(Duration::from_secs(20), || {
        scraped = m.net.pods[gw]
            .http_get(0, "http://127.0.0.1:15020/stats/prometheus")
            .map(|(_, body)| body)
            .unwrap_or_default();
        let ok: f64 = scraped
            .lines()
            .filter(|l| {
                l.starts_with("istio_requests_total{reporter=\"source\"")
                    && l.contains("response_code=\"200\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        ok >= 21.0
    });
    assert!(
        reported,
        "the gateway's 15020 has no istio_requests_total for its 21 routed requests:\n{}",
        scraped
            .lines()
            .filter(|l| l.starts_with("istio_requests_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // An AuthorizationPolicy selecting the gateway pod guards its routes.
    let denied = tls_get(&m, gw, 443, "bookinfo.com", "/admin/users", &ca_path, &[]);
    assert!(denied.starts_with("403 "), "{denied}");
    // Egress: the mesh client asks for external.example; its sidecar sends it to the egress
    // gateway, which sends it on to the external server.
    let replies = m.send(
        &format!("http://{VIP}:{PORT}/out"),
        3,
        &[("host", "external.example")],
        1,
    );
    assert!(
        replies
            .iter()
            .all(|r| r.code == 200 && r.instance() == "outside"),
        "{replies:?}\n{}",
        m.net.logs()
    );
    let through = m.net.pods[gw]
        .envoy_stat(&format!(
            "cluster.outbound|{PORT}||external.example.upstream_rq_2xx"
        ))
        .unwrap();
    assert!(
        through >= 3,
        "the gateway sent {through} requests to external.example"
    );
}

fn edge_routing(secret: &str, secure_ip: &str) -> String {
    format!(
        r#"kind: Gateway
metadata: {{name: edge, namespace: {GATEWAY_NS}}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: 8443, name: https-api, protocol: HTTPS}}
    hosts: [{NS}/api.example.com]
    tls: {{mode: MUTUAL, credentialName: edge-cert}}
  - port: {{number: 8443, name: tls-secure, protocol: TLS}}
    hosts: [secure.example.com]
    tls: {{mode: PASSTHROUGH}}
---
kind: VirtualService
metadata: {{name: api, namespace: {NS}}}
spec:
  hosts: [api.example.com]
  gateways: [{GATEWAY_NS}/edge]
  http:
  - route: [{{destination: {{host: reviews, subset: v1}}}}]
---
kind: DestinationRule
metadata: {{name: reviews, namespace: {NS}}}
spec:
  host: reviews
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
---
kind: ServiceEntry
metadata: {{name: secure, namespace: {NS}}}
spec:
  hosts: [secure.example.com]
  location: MESH_EXTERNAL
  ports: [{{number: 8443, name: tls, protocol: TLS}}]
  resolution: STATIC
  endpoints: [{{address: {secure_ip}, ports: {{tls: {PORT}}}}}]
---
kind: VirtualService
metadata: {{name: secure, namespace: {NS}}}
spec:
  hosts: [secure.example.com]
  gateways: [{GATEWAY_NS}/edge]
  tls:
  - match: [{{sniHosts: [secure.example.com]}}]
    route: [{{destination: {{host: secure.example.com, port: {{number: 8443}}}}}}]
---
{secret}"#
    )
}

/// A kubernetes.io/tls Secret `edge-cert` in the gateway's namespace (stringData).
fn tls_secret(cert: &str, key: &str, ca: &str) -> String {
    let block = |t: &str| t.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "apiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\nmetadata: {{name: edge-cert, namespace: {GATEWAY_NS}}}\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}  ca.crt: |\n{}",
        block(cert),
        block(key),
        block(ca)
    )
}

#[test]
fn credential_name_mutual_tls_rotation_and_sni_passthrough() {
    let test = "credential_name_mutual_tls_rotation_and_sni_passthrough";
    let (ca, issuer) = test_ca("gateway-e2e edge CA");
    let (server, server_key) = leaf_cert(&issuer, "api.example.com");
    let (client, client_key) = leaf_cert(&issuer, "client.example.com");
    // The passthrough backend (the "outside" pod's app) ends TLS with its own certificate.
    let outside_ip = harness::pod_ipv4(3 + 2).to_string();
    let secret = tls_secret(&server, &server_key, &ca);
    let shared = std::env::temp_dir().join(format!("gateway-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&shared).unwrap();
    let (backend, backend_key) = leaf_cert(&issuer, "secure.example.com");
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let backend_path = leak(shared.join("secure.pem").display().to_string());
    let backend_key_path = leak(shared.join("secure-key.pem").display().to_string());
    harness::write_readable(std::path::Path::new(backend_path), &backend).unwrap();
    harness::write_readable(std::path::Path::new(backend_key_path), &backend_key).unwrap();
    let tls_env: &'static [(&'static str, &'static str)] = Box::leak(Box::new([
        ("TLS_CERT", backend_path),
        ("TLS_KEY", backend_key_path),
    ]));
    let backends: &[Backend] = &[BACKENDS[0], BACKENDS[1], ("outside", "", tls_env)];
    let result = gateway_mesh(test, backends, &edge_routing(&secret, &outside_ip), &[]);
    let _ = std::fs::remove_dir_all(&shared);
    let Some((m, gw)) = result else {
        return;
    };
    let ca_path = shared_file(&m, "edge-ca.pem", &ca);
    let client_cert = shared_file(&m, "client.pem", &client);
    let client_key = shared_file(&m, "client-key.pem", &client_key);
    let with_cert = [client_cert.as_str(), client_key.as_str()];
    // MUTUAL: a client with a certificate of the Secret's CA gets through...
    let ok = wait_until(Duration::from_secs(20), || {
        tls_get(&m, gw, 8443, "api.example.com", "/x", &ca_path, &with_cert).starts_with("200 ")
    });
    let line = tls_get(&m, gw, 8443, "api.example.com", "/x", &ca_path, &with_cert);
    assert!(
        ok && line.contains("instance=v1"),
        "{line}\n{}",
        m.net.logs()
    );
    let first_cert = line.split_whitespace().nth(1).unwrap().to_string();
    // ...one without is refused.
    let refused = tls_get(&m, gw, 8443, "api.example.com", "/x", &ca_path, &[]);
    assert!(!refused.starts_with("200 "), "{refused}");
    // Rotation: a new certificate in the Secret is served without a restart.
    let (server2, server2_key) = leaf_cert(&issuer, "api.example.com");
    let routing = edge_routing(&tls_secret(&server2, &server2_key, &ca), &outside_ip);
    std::fs::write(m.dir.join("routing.yaml"), routing).unwrap();
    let mut last = String::new();
    let rotated = wait_until(Duration::from_secs(20), || {
        last = tls_get(&m, gw, 8443, "api.example.com", "/x", &ca_path, &with_cert);
        last.starts_with("200 ") && !last.contains(&first_cert)
    });
    assert!(
        rotated,
        "still {last} (first {first_cert})\n{}",
        m.net.logs()
    );
    // PASSTHROUGH: SNI secure.example.com goes to the backend, which ends the TLS itself: the
    // client sees the backend's certificate.
    let line = tls_get(&m, gw, 8443, "secure.example.com", "/p", &ca_path, &[]);
    assert!(
        line.starts_with("200 ") && line.contains("instance=outside path=/p"),
        "{line}\n{}",
        m.net.logs()
    );
}

/// The Kubernetes Gateway API in a config directory: a Gateway of class `istio` named `edge`
/// (its router pods carry `gateway.networking.k8s.io/gateway-name: edge`) and an HTTPRoute of
/// another namespace, which the listener allows.
fn gateway_api_routing() -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: {GATEWAY_NS}}}
spec:
  gatewayClassName: istio
  listeners:
  - name: http
    port: 80
    protocol: HTTP
    hostname: "*.example"
    allowedRoutes: {{namespaces: {{from: All}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: api, namespace: {NS}}}
spec:
  parentRefs: [{{name: edge, namespace: {GATEWAY_NS}}}]
  hostnames: [api.example]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /reviews}}}}]
    backendRefs: [{{name: reviews, port: {PORT}}}]
  - matches: [{{path: {{type: Exact, value: /old}}}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {{path: {{type: ReplaceFullPath, replaceFullPath: /new}}, statusCode: 301}}
  - matches: [{{path: {{type: Exact, value: /gone}}}}]
    backendRefs: [{{name: no-such-service, port: {PORT}}}]
"#
    )
}

#[test]
fn the_gateway_api_from_a_config_directory() {
    let test = "the_gateway_api_from_a_config_directory";
    let Some((m, gw)) = gateway_mesh(test, BACKENDS, &gateway_api_routing(), &[]) else {
        return;
    };
    let gw_ip = m.net.pods[gw].ip.to_string();
    let get = |path: &str, host: &str| {
        m.send_from(
            outside(&m),
            &format!("http://{gw_ip}{path}"),
            1,
            &[("host", host)],
            1,
        )[0]
        .clone()
    };
    // The route: a path-segment prefix to the reviews backends.
    let r = get("/reviews/1", "api.example");
    assert_eq!(r.code, 200, "{r:?}\n{}", m.net.logs());
    assert!(r.instance().starts_with('v'), "{r:?}");
    // A prefix matches whole segments only: /reviewsX is no match, nor is another host.
    assert_eq!(get("/reviewsX", "api.example").code, 404);
    assert_eq!(get("/reviews/1", "other.example").code, 404);
    // The redirect filter.
    let r = get("/old", "api.example");
    assert_eq!(r.code, 301, "{r:?}");
    assert_eq!(
        r.location.as_deref(),
        Some("http://api.example/new"),
        "{r:?}"
    );
    // A backend that does not exist answers 500, as the Gateway API requires.
    assert_eq!(get("/gone", "api.example").code, 500);
}

/// An EnvoyFilter in the GATEWAY context, attached to the Gateway API Gateway by `targetRefs`:
/// a Lua filter before the router answers /teapot at the gateway; the routes still serve, and
/// a sidecar (not a router of `edge`) is untouched.
#[test]
fn an_envoy_filter_patches_the_gateway_it_targets() {
    let test = "an_envoy_filter_patches_the_gateway_it_targets";
    let routing = format!(
        r#"{}---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: teapot, namespace: {GATEWAY_NS}}}
spec:
  targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: edge}}]
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: GATEWAY
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {{name: envoy.filters.http.router}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: teapot.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          default_source_code:
            inline_string: |
              function envoy_on_request(h)
                if h:headers():get(":path") == "/teapot" then
                  h:respond({{[":status"] = "418"}}, "short and stout")
                end
              end
"#,
        gateway_api_routing()
    );
    let Some((m, gw)) = gateway_mesh(test, BACKENDS, &routing, &[]) else {
        return;
    };
    let gw_ip = m.net.pods[gw].ip.to_string();
    let get = |path: &str| {
        m.send_from(
            outside(&m),
            &format!("http://{gw_ip}{path}"),
            1,
            &[("host", "api.example")],
            1,
        )[0]
        .clone()
    };
    let r = get("/teapot");
    assert_eq!(
        (r.code, r.body.as_str()),
        (418, "short and stout"),
        "{r:?}\n{}",
        m.net.logs()
    );
    assert_eq!(get("/reviews/1").code, 200);
    // The mesh client's sidecar is no router of `edge`: its calls are not answered by Lua.
    let r = &m.send(&format!("http://{VIP}:{PORT}/teapot"), 1, &[], 1)[0];
    assert_eq!(r.code, 200, "{r:?}");
}
