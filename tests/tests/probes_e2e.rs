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

/// Holds the status port with half-open connections from ten source addresses (more than the
/// 256 connections the port holds for remote peers, far more than one peer's 32), opening about
/// 200 a second, each sending half a request head and nothing more.
const ATTACKER: &str = r#"
import socket, sys, time
target, sources, until = (sys.argv[1], 15020), sys.argv[2].split(","), time.time() + float(sys.argv[3])
held, opened = [], 0
while time.time() < until:
    for src in sources:
        s = socket.socket()
        s.settimeout(1)
        try:
            s.bind((src, 0))
            s.connect(target)
            s.send(b"GET /healthz/ready HTTP/1.1\r\n")
            opened += 1
        except OSError:
            s.close()
            continue
        held.append(s)
    while len(held) > 800:
        held.pop(0).close()
    time.sleep(0.05)
print("opened", opened, flush=True)
"#;

/// The attack of issue #29: a peer off the pod keeping the status port full of half-open
/// connections must not stop the kubelet's probes, neither the rewritten /app-health probes on
/// 15020 nor readiness on 15021 (Envoy, which asks 15020 over loopback), and the refusals are not
/// a flood of log lines.
#[test]
fn probes_are_answered_while_a_peer_holds_the_status_port_half_open() {
    let test = "probes_are_answered_while_a_peer_holds_the_status_port_half_open";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("pod", 2).unwrap();
    net.add_pod("kubelet", 3).unwrap();
    net.add_pod("attacker", 4).unwrap();
    let sources: Vec<String> = (101..111).map(|n| format!("10.233.0.{n}")).collect();
    for src in &sources {
        net.pods[2]
            .exec(&["ip", "addr", "add", &format!("{src}/24"), "dev", "eth0"])
            .unwrap();
    }
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    harness::istio_iptables(&net.pods[0], &[]).unwrap();
    net.pods[0]
        .spawn(
            "app",
            1000,
            1000,
            &[],
            &["/usr/bin/python3", "-m", "http.server", "8080"],
        )
        .unwrap();
    net.pods[0]
        .spawn_embedded_agent(
            &mesh,
            &[
                ("POD_NAME", "web"),
                ("POD_NAMESPACE", "demo"),
                ("INSTANCE_IP", "10.233.0.2"),
                ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"1s\"}"),
                (
                    "ISTIO_KUBE_APP_PROBERS",
                    r#"{"/app-health/app/livez": {"tcpSocket": {"port": 8080}, "timeoutSeconds": 5}}"#,
                ),
            ],
        )
        .unwrap();
    let live = "http://10.233.0.2:15020/app-health/app/livez";
    let ready = "http://10.233.0.2:15021/healthz/ready";
    for url in [live, ready] {
        net.pods[1]
            .wait_http_ok(url, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}\n{}", net.logs()));
    }
    let seconds = 15;
    net.pods[2]
        .spawn(
            "attack",
            0,
            0,
            &[],
            &[
                "/usr/bin/python3",
                "-c",
                ATTACKER,
                "10.233.0.2",
                &sources.join(","),
                &seconds.to_string(),
            ],
        )
        .unwrap();
    // Let the attack fill the port first.
    std::thread::sleep(Duration::from_secs(3));
    let kubelet = &net.pods[1];
    let mut failed = Vec::new();
    let until = std::time::Instant::now() + Duration::from_secs(seconds - 5);
    let mut probes = 0;
    while std::time::Instant::now() < until {
        for url in [live, ready] {
            probes += 1;
            let (code, body) = kubelet.http_get(0, url).unwrap();
            if code != 200 {
                failed.push(format!("{url}: {code} {body}"));
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        harness::wait_until(Duration::from_secs(15), || net.pods[2]
            .logs_of("attack")
            .contains("opened")),
        "{}",
        net.logs()
    );
    let opened: u64 = net.pods[2]
        .logs_of("attack")
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        opened > 1000,
        "the attack opened only {opened} connections: it did not fill the port"
    );
    assert!(
        failed.is_empty(),
        "{} of {probes} probes failed under the attack: {failed:?}\n{}",
        failed.len(),
        harness::tail(&net.logs(), 60)
    );
    let agent_log = net.pods[0].logs_of("pilot-agent");
    let warnings = agent_log.matches("connections over the limit").count();
    assert!(
        (1..=3).contains(&warnings),
        "{warnings} warnings about the attack in {seconds} s (one per 10 s expected)"
    );
}

/// Logs each request's peer, path and Host, and answers 200.
const ECHO_APP: &str = r#"
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print(self.client_address[0], self.path, self.headers.get("Host"), flush=True)
        self.send_response(200)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"#;

/// A kubelet request cannot point the probe elsewhere: a hostile `Host` header or an
/// absolute-URI request line naming another pod (or another port of this one) still runs only
/// the configured probe, against the app's configured port; sinks on the named addresses see no
/// connection.
#[test]
fn a_probe_request_cannot_steer_what_is_dialled() {
    let test = "a_probe_request_cannot_steer_what_is_dialled";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("pod", 2).unwrap();
    net.add_pod("kubelet", 3).unwrap();
    net.add_pod("sink", 4).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    let np = binary("netprobe");
    let np = np.to_str().unwrap();
    net.pods[2]
        .spawn("sink", 0, 0, &[], &[np, "listen", "9,8080"])
        .unwrap();
    net.pods[0]
        .spawn("sink", 0, 0, &[], &[np, "listen", "9"])
        .unwrap();
    harness::istio_iptables(&net.pods[0], &[]).unwrap();
    net.pods[0]
        .spawn(
            "app",
            1000,
            1000,
            &[],
            &["/usr/bin/python3", "-c", ECHO_APP],
        )
        .unwrap();
    net.pods[0]
        .spawn_embedded_agent(
            &mesh,
            &[
                ("POD_NAME", "web"),
                ("POD_NAMESPACE", "demo"),
                ("INSTANCE_IP", "10.233.0.2"),
                ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"1s\"}"),
                (
                    "ISTIO_KUBE_APP_PROBERS",
                    r#"{"/app-health/app/livez": {"httpGet": {"path": "/ok", "port": 8080}, "timeoutSeconds": 10}}"#,
                ),
            ],
        )
        .unwrap();
    for idx in [0, 2] {
        assert!(net.pods[idx].wait_log("sink", "listening", Duration::from_secs(10)));
    }
    let live = "http://10.233.0.2:15020/app-health/app/livez";
    net.pods[1]
        .wait_http_ok(live, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}\n{}", net.logs()));
    let probes_before = net.pods[0].logs_of("app").matches(" /ok ").count();

    // (extra curl arguments, expected status)
    let cases: [(&[&str], u16); 7] = [
        (&["-H", "Host: 10.233.0.4:9"], 200),
        (&["-H", "Host: 10.233.0.2:9"], 200),
        (&["-H", "Host: 10.233.0.4"], 200),
        (
            &[
                "--request-target",
                "http://10.233.0.4:9/app-health/app/livez",
            ],
            200,
        ),
        (
            &[
                "-H",
                "Host: 10.233.0.4:8080",
                "--request-target",
                "http://10.233.0.4:8080/app-health/app/livez?port=9&host=10.233.0.4",
            ],
            200,
        ),
        (&["--request-target", "http://10.233.0.4:9/"], 404),
        (&["--request-target", "http://10.233.0.2:9/ok"], 404),
    ];
    for (extra, want) in cases {
        let mut args = vec![
            "curl",
            "-sS",
            "--max-time",
            "15",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ];
        args.extend_from_slice(extra);
        args.push(live);
        let out = net.pods[1].exec(&args).unwrap();
        let code = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            code,
            want.to_string(),
            "{extra:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            net.logs()
        );
    }
    // Each accepted request ran the configured probe once, against the app's own address and
    // port, from 127.0.0.6; nothing of the kubelet's request reached the app.
    let app_log = net.pods[0].logs_of("app");
    let probes: Vec<&str> = app_log.lines().filter(|l| l.contains(" /ok ")).collect();
    assert_eq!(probes.len() - probes_before, 5, "{app_log}");
    assert!(
        probes.iter().all(|l| *l == "127.0.0.6 /ok 10.233.0.2:8080"),
        "{app_log}"
    );
    assert_eq!(
        app_log.lines().count(),
        probes.len(),
        "the app saw a request that was not the probe: {app_log}"
    );
    std::thread::sleep(Duration::from_millis(300));
    for idx in [0, 2] {
        let sink = net.pods[idx].logs_of("sink");
        assert!(
            !sink.contains("accept"),
            "a request steered the probe to {}: {sink}",
            net.pods[idx].ns
        );
    }
}
