#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! App-probe rewrite end to end: kubelet (a peer namespace) calls the agent's /app-health paths
//! on 15020 of a captured pod; the agent runs the app's own probes from 127.0.0.6 with kubelet's
//! rules, and nothing in a request (or a redirect) can make it dial elsewhere.

use std::time::Duration;

use harness::{Network, binary, require_envoy, require_root};

const APP: &str = r#"
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print(self.client_address[0], self.path, flush=True)
        routes = {"/ok": (200, None), "/same": (302, "/ok"), "/other": (302, "http://10.233.0.3:9/"),
                  "/loop": (302, "/loop"), "/big": (200, None)}
        code, location = routes.get(self.path, (500, None))
        self.send_response(code)
        if location:
            self.send_header("Location", location)
        self.end_headers()
        if self.path == "/big":
            self.wfile.write(b"x" * (1 << 20))
    def log_message(self, *a):
        pass
import ssl, threading
tls = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"#;

/// Every probe gets 10 s: CI runs many tests at once on 2 cores, and a slow answer is not what
/// these cases are about.
const PROBERS: &str = r#"{
  "/app-health/app/livez": {"httpGet": {"path": "/ok", "port": 8080, "scheme": "HTTP"}, "timeoutSeconds": 10},
  "/app-health/app/readyz": {"httpGet": {"path": "/same", "port": 8080}, "timeoutSeconds": 10},
  "/app-health/app/startupz": {"httpGet": {"path": "/other", "port": 8080}, "timeoutSeconds": 10},
  "/app-health/loop/livez": {"httpGet": {"path": "/loop", "port": 8080}, "timeoutSeconds": 10},
  "/app-health/big/livez": {"httpGet": {"path": "/big", "port": 8080}, "timeoutSeconds": 10},
  "/app-health/fail/livez": {"httpGet": {"path": "/nope", "port": 8080}, "timeoutSeconds": 10},
  "/app-health/tcp/livez": {"tcpSocket": {"port": 8080}, "timeoutSeconds": 10},
  "/app-health/closed/livez": {"tcpSocket": {"port": 8081}, "timeoutSeconds": 10},
  "/app-health/tls/livez": {"httpGet": {"path": "/ok", "port": 8443, "scheme": "HTTPS"}, "timeoutSeconds": 10}
}"#;

#[test]
fn app_probes_run_with_kubelet_semantics_from_127_0_0_6() {
    if !require_root("app_probes_run_with_kubelet_semantics_from_127_0_0_6")
        || !require_envoy("app_probes_run_with_kubelet_semantics_from_127_0_0_6")
    {
        return;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("pod", 2).unwrap();
    net.add_pod("kubelet", 3).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    let np = binary("netprobe");
    // Pod b listens on 9: a followed cross-host redirect would show up there.
    net.pods[1]
        .spawn("sink", 0, 0, &[], &[np.to_str().unwrap(), "listen", "9"])
        .unwrap();
    harness::istio_iptables(&net.pods[0], &[]).unwrap();
    // A self-signed certificate for the app's HTTPS port (probes do not verify it, as kubelet).
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["app.local".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_path, key_path) = (net.dir().join("app.pem"), net.dir().join("app-key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let app_args = [
        "/usr/bin/python3",
        "-c",
        APP,
        cert_path.to_str().unwrap(),
        key_path.to_str().unwrap(),
    ];
    net.pods[0]
        .spawn("app", 1000, 1000, &[], &app_args)
        .unwrap();
    net.pods[0]
        .spawn_embedded_agent(
            &mesh,
            &[
                ("POD_NAME", "web"),
                ("POD_NAMESPACE", "demo"),
                ("INSTANCE_IP", "10.233.0.2"),
                ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"1s\"}"),
                ("ISTIO_KUBE_APP_PROBERS", PROBERS),
            ],
        )
        .unwrap();
    assert!(net.pods[0].wait_log("pilot-agent", "starting Envoy", Duration::from_secs(30)));
    let kubelet = &net.pods[1];
    let probe = |path: &str| {
        let url = format!("http://10.233.0.2:15020{path}");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (code, body) = kubelet.http_get(0, &url).unwrap();
            if code != 0 || std::time::Instant::now() > deadline {
                return (code, body);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // The app needs a moment to listen.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while probe("/app-health/tcp/livez").0 != 200 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let cases = [
        ("/app-health/app/livez", 200),
        ("/app-health/app/readyz", 200), // same-host redirect followed
        ("/app-health/app/startupz", 200), // cross-host redirect not followed: success, as kubelet
        ("/app-health/loop/livez", 500), // more than 10 redirects
        ("/app-health/big/livez", 200),  // 1 MiB body read up to the cap
        ("/app-health/fail/livez", 500),
        ("/app-health/tcp/livez", 200),
        ("/app-health/closed/livez", 500),
        ("/app-health/tls/livez", 200), // HTTPS without certificate verification
        ("/app-health/unknown/livez", 404), // only configured probes answer
    ];
    for (path, want) in cases {
        let (code, body) = probe(path);
        assert_eq!(code, want, "{path}: {body}\n{}", net.logs());
    }
    let app_log = net.pods[0].logs_of("app");
    assert!(
        app_log.contains("127.0.0.6 /ok"),
        "probes must come from 127.0.0.6: {app_log}"
    );
    // Every request line names its peer; other lines (a traceback when the probe stops reading
    // the big body at its cap) are not requests.
    assert!(
        app_log
            .lines()
            .filter(|l| l
                .split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<std::net::IpAddr>().is_ok()))
            .all(|l| l.starts_with("127.0.0.6 ")),
        "{app_log}"
    );
    // Each run of the loop probe makes exactly 11 requests (the first and 10 redirects), even if a
    // slow machine made the kubelet side retry.
    let loops = app_log.matches("/loop").count();
    assert!(
        loops > 0 && loops.is_multiple_of(11),
        "{loops} /loop requests: {app_log}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !net.pods[1].logs_of("sink").contains("accept"),
        "a cross-host redirect was followed\n{}",
        net.logs()
    );
}
