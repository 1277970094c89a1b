#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! AuthorizationPolicy enforced by the server's sidecar, observed as traffic: the client pod
//! (identity `spiffe://cluster.local/ns/book/sa/client`, from its real mTLS certificate) calls
//! `reviews` over HTTP and `lines` over TCP on the same workload; policies are edited live and
//! each edit is checked with new requests.

use std::time::Duration;

use harness::wait_until;

mod mesh;
use mesh::*;

const BACKEND: &[Backend] = &[("v1", "app: reviews, version: v1", &[])];

/// An external authorizer for CUSTOM policies: 200 when the request it checks carries
/// `x-allow: yes`, else 403 `denied by ext-authz`; each checked path goes to stdout.
const EXT_AUTHZ: &str = r#"
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_GET(self):
        print(f"check {self.path} x-allow={self.headers.get('x-allow')}", flush=True)
        ok = self.headers.get("x-allow") == "yes"
        body = b"" if ok else b"denied by ext-authz\n"
        self.send_response(200 if ok else 403)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
ThreadingHTTPServer(("0.0.0.0", 9191), H).serve_forever()
"#;

fn policy(name: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n{spec}\n"
    )
}

impl Mesh {
    /// Writes `yaml` as the policy file and waits until the backend's Envoy has taken the new
    /// listeners.
    fn set_policies(&self, yaml: &str) {
        let backend = &self.net.pods[self.backends["v1"]];
        let stat = "listener_manager.lds.update_success";
        let before = backend.envoy_stat(stat).unwrap_or(0);
        std::fs::write(self.dir.join("authz.yaml"), yaml).unwrap();
        assert!(
            wait_until(Duration::from_secs(20), || backend
                .envoy_stat(stat)
                .unwrap_or(0)
                > before),
            "listener update not taken\n{}",
            self.net.logs()
        );
    }

    /// The status of one GET (with `headers`) to `path` on the HTTP service.
    fn status(&self, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let r = &self.get(path, 1, headers)[0];
        (r.code, r.body.clone())
    }
}

/// A request's path and headers, and the status it must get.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], u16);

/// `Case` with header values of its own.
type OwnedCase<'a> = (&'a str, Vec<(&'a str, String)>, u16);

/// How many answers in a row must agree before a case holds.
const IN_A_ROW: usize = 4;

/// Each case: the path (and headers) of a request, and the status it must get.
///
/// Right after an edit, the client's sidecar may still hold pooled connections to the server's
/// sidecar that the old listener accepted; Envoy drains each of them, and each serves one more
/// request under the old chain. So a case must hold for `IN_A_ROW` requests in a row within
/// 5 s of the edit (measured: well under a second).
fn expect(m: &Mesh, what: &str, cases: &[Case]) {
    for (path, headers, want) in cases {
        let needle = (*want == 403).then_some("RBAC: access denied");
        expect_reply(m, what, (path, headers), *want, needle);
    }
}

/// GET `path` with `headers` until `want` (with `needle` in the body, if given) comes back
/// `IN_A_ROW` times in a row, within 5 s.
fn expect_reply(
    m: &Mesh,
    what: &str,
    (path, headers): (&str, &[(&str, &str)]),
    want: u16,
    needle: Option<&str>,
) {
    let mut seen = Vec::new();
    let held = wait_until(Duration::from_secs(5), || {
        (0..IN_A_ROW).all(|_| {
            let (code, body) = m.status(path, headers);
            let ok = code == want && needle.is_none_or(|n| body.contains(n));
            seen.push(format!("{code} {body}"));
            ok
        })
    });
    assert!(
        held,
        "{what}: GET {path} {headers:?} wanted {want} {IN_A_ROW} times in a row, got {seen:?}\n{}",
        m.net.logs()
    );
}

/// `tcp()` until it returns `want` `IN_A_ROW` times in a row (5 s at most, as `expect`).
fn expect_tcp(m: &Mesh, what: &str, want: &str) {
    let mut seen = Vec::new();
    let held = wait_until(Duration::from_secs(5), || {
        (0..IN_A_ROW).all(|_| {
            let got = m.tcp_line();
            let ok = got == want;
            seen.push(got);
            ok
        })
    });
    assert!(
        held,
        "{what}: wanted {want:?}, got {seen:?}\n{}",
        m.net.logs()
    );
}

#[test]
fn authorization_policies_allow_deny_and_tcp_with_live_edits() {
    let Some(m) = mesh(
        "authorization_policies_allow_deny_and_tcp_with_live_edits",
        BACKEND,
        "",
    ) else {
        return;
    };
    // No policy: everything passes, HTTP and TCP.
    expect(&m, "no policy", &[("/anything", &[], 200)]);
    expect_tcp(&m, "tcp", "v1");

    // ALLOW by the client's principal (from its certificate) and path templates; the rule's
    // HTTP-only fields leave it out of the TCP chain, so TCP is denied.
    m.set_policies(&policy(
        "reviews-allow",
        "  selector: {matchLabels: {app: reviews}}\n  rules:\n  - from: [{source: {principals: [cluster.local/ns/book/sa/client]}}]\n    to: [{operation: {methods: [GET], paths: [\"/api/{*}/items\", \"/public/*\"]}}]\n",
    ));
    expect(
        &m,
        "ALLOW principal + paths",
        &[
            ("/api/7/items", &[], 200),
            ("/public/logo.png", &[], 200),
            ("/api/7/8/items", &[], 403),
            ("/private", &[], 403),
            // Normalized before it is matched: no way around a path rule with `..`.
            ("/public/../private", &[], 403),
        ],
    );
    expect_tcp(&m, "an HTTP-only ALLOW rule must not let TCP in", "");

    // A DENY on a header wins over the ALLOW.
    let allow = policy(
        "reviews-allow",
        "  selector: {matchLabels: {app: reviews}}\n  rules:\n  - from: [{source: {principals: [cluster.local/ns/book/sa/client]}}]\n    to: [{operation: {paths: [\"/api/{*}/items\"]}}]\n  - to: [{operation: {ports: [\"9000\"]}}]\n",
    );
    let deny = policy(
        "reviews-deny",
        "  action: DENY\n  rules:\n  - when: [{key: \"request.headers[x-block]\", values: [\"1\"]}]\n",
    );
    // How long a new DENY takes from the file write to being enforced (printed for the
    // record; the bound asserted is `expect`'s 5 s, a liveness bound, not a benchmark).
    let written = std::time::Instant::now();
    m.set_policies(&format!("{allow}{deny}"));
    let taken = written.elapsed();
    expect(
        &m,
        "new DENY",
        &[("/api/7/items", &[("x-block", "1")], 403)],
    );
    eprintln!(
        "a new DENY: listener taken by Envoy {taken:?} after the file was written; {IN_A_ROW} \
         denied requests in a row by {:?}",
        written.elapsed()
    );
    expect(
        &m,
        "DENY over ALLOW",
        &[
            ("/api/7/items", &[], 200),
            ("/api/7/items", &[("x-block", "1")], 403),
            ("/api/7/items", &[("x-block", "0")], 200),
        ],
    );
    // A rule on the TCP port alone lets TCP in; the DENY's header condition is HTTP-only and
    // is dropped on TCP, which makes that DENY deny all TCP (denying more, never less).
    expect_tcp(&m, "a DENY with only HTTP fields denies all TCP", "");
    m.set_policies(&allow);
    expect_tcp(&m, "ALLOW on port 9000", "v1");

    // Namespaces and principals are matched against the verified peer identity.
    m.set_policies(&policy(
        "by-namespace",
        "  rules: [{from: [{source: {namespaces: [elsewhere]}}]}]\n",
    ));
    expect(&m, "other namespace", &[("/x", &[], 403)]);
    expect_tcp(&m, "tcp", "");
    m.set_policies(&policy(
        "by-namespace",
        "  rules: [{from: [{source: {namespaces: [book]}}]}]\n",
    ));
    expect(&m, "own namespace", &[("/x", &[], 200)]);
    expect_tcp(&m, "tcp", "v1");
    m.set_policies(&policy(
        "by-namespace",
        "  rules: [{from: [{source: {principals: [\"*/sa/someone-else\"]}}]}]\n",
    ));
    expect(&m, "other service account", &[("/x", &[], 403)]);

    // A request principal needs a verified JWT: without one, an ALLOW on it allows nothing.
    m.set_policies(&policy(
        "jwt",
        "  rules: [{from: [{source: {requestPrincipals: [\"*\"]}}]}]\n",
    ));
    expect(&m, "no token", &[("/x", &[], 403)]);

    // `spec: {}` allows nothing; `rules: [{}]` allows everything.
    m.set_policies(&policy("nothing", "  {}\n"));
    expect(&m, "allow-nothing", &[("/x", &[], 403)]);
    m.set_policies(&policy("everything", "  rules: [{}]\n"));
    expect(&m, "allow-all", &[("/x", &[], 200)]);
    expect_tcp(&m, "tcp", "v1");

    // A dry run (`istio.io/dry-run: "true"`) is recorded, never enforced: neither a DENY-all nor an
    // ALLOW that matches nothing changes anything.
    m.set_policies(
        &format!(
            "{}{}",
            policy("deny-dry", "  action: DENY\n  rules: [{}]\n"),
            policy(
                "allow-dry",
                "  rules: [{to: [{operation: {paths: [/never]}}]}]\n"
            ),
        )
        .replace(
            "metadata: {name: deny-dry,",
            "metadata: {annotations: {istio.io/dry-run: \"true\"}, name: deny-dry,",
        )
        .replace(
            "metadata: {name: allow-dry,",
            "metadata: {annotations: {istio.io/dry-run: \"true\"}, name: allow-dry,",
        ),
    );
    expect(&m, "dry run", &[("/x", &[], 200)]);
    expect_tcp(&m, "dry run", "v1");

    // Removing every policy opens it again.
    m.set_policies("");
    expect(&m, "no policy again", &[("/private", &[], 200)]);
}

/// `NAME.book.svc.cluster.local`: an HTTP service on `port` at `ip`, outside the mesh (a pod
/// with no sidecar).
fn external_service(name: &str, port: u16, ip: std::net::Ipv4Addr) -> String {
    format!(
        "kind: ServiceEntry\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  hosts: [{name}.{NS}.svc.cluster.local]\n  location: MESH_EXTERNAL\n  ports: [{{number: {port}, name: http, protocol: HTTP}}]\n  resolution: STATIC\n  endpoints: [{{address: {ip}}}]\n"
    )
}

/// A signing key and the JSON Web Key Set that verifies it (ES256).
struct Signer {
    pem: String,
    jwks: String,
}

impl Signer {
    fn new(kid: &str) -> Signer {
        use base64::Engine;
        let key = rcgen::KeyPair::generate().unwrap();
        let point = key.public_key_raw(); // 0x04 || x || y
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let jwks = serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256",
            "kid": kid, "x": b64(&point[1..33]), "y": b64(&point[33..])}]});
        Signer {
            pem: key.serialize_pem(),
            jwks: jwks.to_string(),
        }
    }

    /// A token of `iss`/`sub` with `extra` claims, expiring `ttl_secs` from now (negative: past).
    fn token(&self, iss: &str, sub: &str, ttl_secs: i64, extra: serde_json::Value) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let mut claims =
            serde_json::json!({"iss": iss, "sub": sub, "exp": now + ttl_secs, "iat": now - 60});
        if let (Some(c), Some(e)) = (claims.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256),
            &claims,
            &jsonwebtoken::EncodingKey::from_ec_pem(self.pem.as_bytes()).unwrap(),
        )
        .unwrap()
    }
}

#[test]
fn request_authentication_verifies_tokens_for_authorization() {
    let Some(m) = mesh(
        "request_authentication_verifies_tokens_for_authorization",
        BACKEND,
        "",
    ) else {
        return;
    };
    let issuer = "https://issuer.test";
    let signer = Signer::new("k1");
    let stranger = Signer::new("k1"); // same kid, other key: a forged signature
    let jwks = signer.jwks.replace('\'', "''");
    m.set_policies(&format!(
        "---\napiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: {NS}}}\nspec:\n  selector: {{matchLabels: {{app: reviews}}}}\n  jwtRules:\n  - issuer: {issuer}\n    jwks: '{jwks}'\n    outputClaimToHeaders: [{{header: x-jwt-sub, claim: sub}}]\n{}",
        policy(
            "require-jwt",
            "  selector: {matchLabels: {app: reviews}}\n  rules:\n  - to: [{operation: {paths: [/open]}}]\n  - from: [{source: {requestPrincipals: [\"https://issuer.test/alice\"]}}]\n    to: [{operation: {paths: [/secure]}}]\n  - to: [{operation: {paths: [/admin]}}]\n    when: [{key: \"request.auth.claims[groups]\", values: [admins]}]\n",
        )
    ));
    let bearer = |t: &str| format!("Bearer {t}");
    let alice = bearer(&signer.token(
        issuer,
        "alice",
        600,
        serde_json::json!({"groups": ["admins", "dev"]}),
    ));
    let bob = bearer(&signer.token(issuer, "bob", 600, serde_json::json!({"groups": ["dev"]})));
    let expired = bearer(&signer.token(issuer, "alice", -600, serde_json::json!({})));
    let other_issuer =
        bearer(&signer.token("https://other.test", "alice", 600, serde_json::json!({})));
    let forged = bearer(&stranger.token(issuer, "alice", 600, serde_json::json!({})));
    let auth = |v: &str| -> Vec<(&str, String)> { vec![("authorization", v.to_string())] };
    let cases: Vec<OwnedCase> = vec![
        ("/open", vec![], 200),
        // Missing token: passes authentication, but the rule needs a request principal.
        ("/secure", vec![], 403),
        ("/secure", auth(&alice), 200),
        ("/secure", auth(&bob), 403),
        // Invalid tokens are refused by authentication itself.
        ("/secure", auth(&expired), 401),
        ("/secure", auth(&other_issuer), 401),
        ("/secure", auth(&forged), 401),
        ("/open", auth(&forged), 401),
        // A claim condition: alice is in `admins`, bob is not.
        ("/admin", auth(&alice), 200),
        ("/admin", auth(&bob), 403),
    ];
    for (path, headers, want) in &cases {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        expect(&m, "jwt", &[(path, &headers, *want)]);
    }
    // The app sees the verified subject, and not the token (forwardOriginalToken unset).
    let r = &m.get(
        "/secure",
        1,
        &[
            ("authorization", &alice),
            ("x-echo", "x-jwt-sub,authorization"),
        ],
    )[0];
    assert_eq!(r.field("x-jwt-sub"), Some("alice"), "{}", r.body);
    assert_eq!(r.field("authorization"), Some("None"), "{}", r.body);
}

#[test]
fn custom_policy_asks_the_external_authorizer() {
    // The authorizer runs in a pod outside the mesh (no sidecar), as a MESH_EXTERNAL service.
    let backends: &[Backend] = &[BACKEND[0], ("authz", "", &[])];
    let authz_ip = harness::pod_ipv4(4);
    let config = format!(
        "kind: MeshConfig\nmetadata: {{name: mesh}}\nspec:\n  extensionProviders:\n  - name: ext\n    envoyExtAuthzHttp: {{service: ext-authz.{NS}.svc.cluster.local, port: 9191, includeRequestHeadersInCheck: [x-allow]}}\n---\n{}",
        external_service("ext-authz", 9191, authz_ip)
    );
    let Some(m) = mesh_with(
        "custom_policy_asks_the_external_authorizer",
        backends,
        &config,
        |net| {
            let script = net.dir().join("ext_authz.py");
            std::fs::write(&script, EXT_AUTHZ).unwrap();
            let pod = net.pods.iter_mut().find(|p| p.ip == authz_ip).unwrap();
            pod.spawn(
                "ext-authz",
                APP_UID,
                APP_UID,
                &[],
                &["/usr/bin/python3", script.to_str().unwrap()],
            )
            .unwrap();
        },
    ) else {
        return;
    };
    let custom = |provider: &str| {
        policy(
            "ext",
            &format!(
                "  selector: {{matchLabels: {{app: reviews}}}}\n  action: CUSTOM\n  provider: {{name: {provider}}}\n  rules: [{{to: [{{operation: {{paths: [\"/guarded/*\"]}}}}]}}]\n"
            ),
        )
    };
    m.set_policies(&custom("ext"));
    expect_reply(
        &m,
        "guarded, no header",
        ("/guarded/a", &[]),
        403,
        Some("denied by ext-authz"),
    );
    expect_reply(
        &m,
        "guarded, allowed",
        ("/guarded/a", &[("x-allow", "yes")]),
        200,
        None,
    );
    expect_reply(&m, "not guarded", ("/open", &[]), 200, None);
    // Only requests a CUSTOM rule matched were sent to the authorizer.
    let authz_pod = m.net.pods.iter().find(|p| p.ip == authz_ip).unwrap();
    let checks = authz_pod.logs_of("ext-authz");
    assert!(checks.contains("check /guarded/a x-allow=yes"), "{checks}");
    assert!(!checks.contains("/open"), "{checks}");
    // A provider the mesh config does not have: its rules deny (fail closed).
    m.set_policies(&custom("missing"));
    expect(
        &m,
        "unknown provider",
        &[
            ("/guarded/a", &[("x-allow", "yes")], 403),
            ("/open", &[], 200),
        ],
    );
}

#[test]
fn request_authentication_fetches_keys_from_a_mesh_service() {
    // The key set is served by a plain HTTP server in a pod outside the mesh, named by a
    // MESH_EXTERNAL ServiceEntry; the server's sidecar fetches it through its outbound cluster.
    let backends: &[Backend] = &[BACKEND[0], ("keys", "", &[])];
    let keys_ip = harness::pod_ipv4(4);
    let signer = Signer::new("remote");
    let stranger = Signer::new("remote");
    let jwks = signer.jwks.clone();
    let config = external_service("keys", 8080, keys_ip);
    let Some(m) = mesh_with(
        "request_authentication_fetches_keys_from_a_mesh_service",
        backends,
        &config,
        |net| {
            let dir = net.dir().join("jwks");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("jwks.json"), &jwks).unwrap();
            let pod = net.pods.iter_mut().find(|p| p.ip == keys_ip).unwrap();
            pod.spawn(
                "keys",
                APP_UID,
                APP_UID,
                &[],
                &[
                    "/usr/bin/python3",
                    "-m",
                    "http.server",
                    "8080",
                    "--directory",
                    dir.to_str().unwrap(),
                ],
            )
            .unwrap();
        },
    ) else {
        return;
    };
    let issuer = "https://remote.test";
    m.set_policies(&format!(
        "---\napiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: {NS}}}\nspec:\n  jwtRules:\n  - issuer: {issuer}\n    jwksUri: http://keys.{NS}.svc.cluster.local:8080/jwks.json\n{}",
        policy(
            "any-token",
            "  rules: [{from: [{source: {requestPrincipals: [\"*\"]}}]}]\n",
        )
    ));
    let good = format!(
        "Bearer {}",
        signer.token(issuer, "carol", 600, serde_json::json!({}))
    );
    let forged = format!(
        "Bearer {}",
        stranger.token(issuer, "carol", 600, serde_json::json!({}))
    );
    expect(
        &m,
        "fetched keys",
        &[("/x", &[("authorization", &good)], 200)],
    );
    expect_reply(
        &m,
        "forged",
        ("/x", &[("authorization", &forged)]),
        401,
        None,
    );
    expect(&m, "no token", &[("/x", &[], 403)]);
    let pod = m.net.pods.iter().find(|p| p.ip == keys_ip).unwrap();
    let served = pod.logs_of("keys");
    assert!(served.contains("GET /jwks.json"), "{served}");
}

/// A gRPC external authorizer (`envoy.service.auth.v3.Authorization`): OK when the checked HTTP
/// request carries `x-allow: yes`, or, for a TCP connection (no HTTP attributes), when
/// `tcp_allowed` is set; PERMISSION_DENIED otherwise. Counts the checks it answers.
#[derive(Clone, Default)]
struct GrpcAuthorizer {
    tcp_allowed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    http_checks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tcp_checks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

#[tonic::async_trait]
impl envoy_types::pb::envoy::service::auth::v3::authorization_server::Authorization
    for GrpcAuthorizer
{
    async fn check(
        &self,
        request: tonic::Request<envoy_types::pb::envoy::service::auth::v3::CheckRequest>,
    ) -> Result<
        tonic::Response<envoy_types::pb::envoy::service::auth::v3::CheckResponse>,
        tonic::Status,
    > {
        use std::sync::atomic::Ordering::SeqCst;
        let http = request
            .into_inner()
            .attributes
            .and_then(|a| a.request)
            .and_then(|r| r.http);
        let allowed = match http {
            Some(h) => {
                self.http_checks.fetch_add(1, SeqCst);
                h.headers.get("x-allow").is_some_and(|v| v == "yes")
            }
            None => {
                self.tcp_checks.fetch_add(1, SeqCst);
                self.tcp_allowed.load(SeqCst)
            }
        };
        Ok(tonic::Response::new(
            envoy_types::pb::envoy::service::auth::v3::CheckResponse {
                status: Some(envoy_types::pb::google::rpc::Status {
                    code: if allowed { 0 } else { 7 },
                    ..Default::default()
                }),
                ..Default::default()
            },
        ))
    }
}

impl GrpcAuthorizer {
    /// Serves on `:port` inside network namespace `ns` (a thread that enters the namespace,
    /// binds there, and runs its own runtime; the socket stays in that namespace).
    fn serve_in(&self, ns: &str, port: u16) {
        let me = self.clone();
        let ns = ns.to_string();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let file = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let listener = std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();
            listener.set_nonblocking(true).unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                ready_tx.send(()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(
                        envoy_types::pb::envoy::service::auth::v3::authorization_server::AuthorizationServer::new(me),
                    )
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                    .await
                    .unwrap();
            });
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("authorizer listening");
    }
}

#[test]
fn custom_policy_with_a_grpc_authorizer_guards_http_and_tcp() {
    use std::sync::atomic::Ordering::SeqCst;
    let backends: &[Backend] = &[BACKEND[0], ("grpc-authz", "", &[])];
    let authz_ip = harness::pod_ipv4(4);
    let config = format!(
        "kind: MeshConfig\nmetadata: {{name: mesh}}\nspec:\n  extensionProviders:\n  - name: grpc\n    envoyExtAuthzGrpc: {{service: grpc-authz.{NS}.svc.cluster.local, port: 9192}}\n---\n{}",
        external_service("grpc-authz", 9192, authz_ip)
            .replace("name: http, protocol: HTTP", "name: grpc, protocol: GRPC")
    );
    let authorizer = GrpcAuthorizer::default();
    let Some(m) = mesh_with(
        "custom_policy_with_a_grpc_authorizer_guards_http_and_tcp",
        backends,
        &config,
        |net| {
            let pod = net.pods.iter().find(|p| p.ip == authz_ip).unwrap();
            authorizer.serve_in(&pod.ns, 9192);
        },
    ) else {
        return;
    };
    m.set_policies(&policy(
        "grpc",
        "  selector: {matchLabels: {app: reviews}}\n  action: CUSTOM\n  provider: {name: grpc}\n  rules:\n  - to: [{operation: {paths: [\"/guarded/*\"]}}]\n  - to: [{operation: {ports: [\"9000\"]}}]\n",
    ));
    expect_reply(&m, "grpc, no header", ("/guarded/a", &[]), 403, None);
    let backend = &m.net.pods[m.backends["v1"]];
    let (_, stats) = backend
        .http_get(
            0,
            "http://127.0.0.1:15000/stats?filter=ext_authz|grpc-authz",
        )
        .unwrap();
    eprintln!(
        "DEBUG checks={} stats={stats}",
        authorizer.http_checks.load(SeqCst)
    );
    expect_reply(
        &m,
        "grpc, allowed",
        ("/guarded/a", &[("x-allow", "yes")]),
        200,
        None,
    );
    let asked = authorizer.http_checks.load(SeqCst);
    expect_reply(&m, "not guarded", ("/open", &[]), 200, None);
    assert_eq!(
        authorizer.http_checks.load(SeqCst),
        asked,
        "a request no CUSTOM rule matches is not sent to the authorizer"
    );
    // TCP on port 9000 is checked by the network ext_authz filter.
    expect_tcp(&m, "grpc authorizer denies TCP", "");
    authorizer.tcp_allowed.store(true, SeqCst);
    expect_tcp(&m, "grpc authorizer allows TCP", "v1");
    assert!(authorizer.tcp_checks.load(SeqCst) > 0);
}
