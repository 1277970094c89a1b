#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! The merged Prometheus exposition on 15020: the agent's metrics, Envoy's (via 15090) and the
//! app's (ISTIO_PROMETHEUS_ANNOTATIONS, OpenMetrics with `# EOF`), as one valid text exposition.

use std::time::Duration;

use harness::{Network, require_envoy, require_root};

const APP: &str = r##"
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"# HELP myapp_jobs Jobs done.\n# TYPE myapp_jobs counter\nmyapp_jobs_total{kind=\"a\"} 42\n# EOF\n"
        self.send_response(200 if self.path == "/custom-metrics" else 404)
        self.send_header("Content-Type", "application/openmetrics-text; version=1.0.0")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 9100), H).serve_forever()
"##;

/// Checks the text exposition format line by line: comments, or `name{labels} value`.
fn assert_valid_exposition(text: &str) {
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(comment) = line.strip_prefix('#') {
            assert!(
                comment.starts_with(" HELP ")
                    || comment.starts_with(" TYPE ")
                    || comment.starts_with(' '),
                "{line}"
            );
            assert_ne!(
                line.trim(),
                "# EOF",
                "an # EOF in the middle of the merged output"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let value = value.trim();
        assert!(
            value.parse::<f64>().is_ok() || ["NaN", "+Inf", "-Inf"].contains(&value),
            "bad value in {line:?}"
        );
        let name = series.split('{').next().unwrap();
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        if series.contains('{') {
            assert!(series.ends_with('}'), "unterminated labels in {line:?}");
        }
    }
}

/// A pod (10.233.0.2, `web` of `demo`) running the embedded agent with `env` added to its own,
/// and `app` (a Python program, as uid 1000) beside it when given; ready. The second pod
/// (10.233.0.3) is the scraper. Returns them and the mesh directory (the embedded CA's home).
fn scraped_pod(app: Option<&str>, env: &[(&str, &str)]) -> (Network, std::path::PathBuf) {
    let mut net = Network::new().unwrap();
    net.add_pod("pod", 2).unwrap();
    net.add_pod("prometheus", 3).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    if let Some(app) = app {
        net.pods[0]
            .spawn("app", 1000, 1000, &[], &["/usr/bin/python3", "-c", app])
            .unwrap();
    }
    let mut all = vec![
        ("POD_NAME", "web"),
        ("POD_NAMESPACE", "demo"),
        ("INSTANCE_IP", "10.233.0.2"),
        ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"1s\"}"),
    ];
    all.extend_from_slice(env);
    net.pods[0].spawn_embedded_agent(&mesh, &all).unwrap();
    let ready = net.pods[0].wait_http_ok(
        "http://127.0.0.1:15021/healthz/ready",
        Duration::from_secs(60),
    );
    assert!(ready.is_ok(), "{ready:?}\n{}", net.logs());
    (net, mesh)
}

#[test]
fn merged_stats_hold_agent_envoy_and_app_metrics() {
    if !require_root("merged_stats_hold_agent_envoy_and_app_metrics")
        || !require_envoy("merged_stats_hold_agent_envoy_and_app_metrics")
    {
        return;
    }
    let (net, _) = scraped_pod(
        Some(APP),
        &[(
            "ISTIO_PROMETHEUS_ANNOTATIONS",
            "{\"scrape\":\"true\",\"path\":\"/custom-metrics\",\"port\":\"9100\"}",
        )],
    );

    let (code, text) = net.pods[1]
        .http_get(0, "http://10.233.0.2:15020/stats/prometheus")
        .unwrap();
    assert_eq!(code, 200);
    assert!(
        text.contains("istio_agent_xds_proxy_requests_total"),
        "agent metrics missing:\n{text}"
    );
    assert!(
        text.contains("istio_agent_startup_duration_seconds"),
        "{text}"
    );
    assert!(
        text.contains("envoy_cluster_manager_cds_update_success"),
        "Envoy metrics missing"
    );
    assert!(
        text.contains("myapp_jobs_total{kind=\"a\"} 42"),
        "app metrics missing:\n{text}"
    );
    assert_valid_exposition(&text);
    // /metrics is the same endpoint; the query goes to Envoy (here: only used metrics).
    let (code, used) = net.pods[1]
        .http_get(0, "http://10.233.0.2:15020/metrics?usedonly")
        .unwrap();
    assert_eq!(code, 200);
    assert!(used.len() < text.len(), "usedonly was not passed to Envoy");
    assert_valid_exposition(&used);
    // A scraper that asks for OpenMetrics gets exactly one `# EOF`, at the end.
    let out = net.pods[1]
        .exec(&[
            "curl",
            "-s",
            "-H",
            "Accept: application/openmetrics-text; version=1.0.0",
            "http://10.233.0.2:15020/stats/prometheus",
        ])
        .unwrap();
    let om = String::from_utf8_lossy(&out.stdout);
    assert_eq!(om.matches("# EOF").count(), 1);
    assert!(om.ends_with("# EOF\n"));
}

/// Two app servers for Istio 1.31's `prometheus.istio.io/scrape-targets`: 9101 and 9102, each
/// its own metric, as text format.
const TWO_APPS: &str = r##"
import http.server, threading
def serve(port, body):
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
threading.Thread(target=serve, args=(9101, b"app_one_total 1\n"), daemon=True).start()
serve(9102, b"# TYPE app_two gauge\napp_two 2")
"##;

/// Istio 1.30-1.31's merged metrics: the targets of `prometheus.istio.io/scrape-targets` (as the
/// injector passes them in ISTIO_PROMETHEUS_ANNOTATIONS) merged in their order, a target that
/// does not answer counted in `istio_agent_scrape_failures_total{type="application"}` and left
/// out; `PILOT_AGENT_MERGE_ENVOY_STATS=false` leaves Envoy's metrics out; the answer gzip- or
/// zstd-encoded as the scraper asks.
#[test]
fn scrape_targets_merge_envoy_stats_and_compression() {
    if !require_root("scrape_targets_merge_envoy_stats_and_compression")
        || !require_envoy("scrape_targets_merge_envoy_stats_and_compression")
    {
        return;
    }
    let annotations = r#"{"scrape":"true","path":"/metrics","port":"9101","targets":[{"port":"9101","path":"/metrics"},{"port":"9103","path":"/down"},{"port":"9102","path":"/metrics"}]}"#;
    let (net, _) = scraped_pod(
        Some(TWO_APPS),
        &[
            ("ISTIO_PROMETHEUS_ANNOTATIONS", annotations),
            ("PILOT_AGENT_MERGE_ENVOY_STATS", "false"),
        ],
    );
    let url = "http://10.233.0.2:15020/stats/prometheus";
    let (code, text) = net.pods[1].http_get(0, url).unwrap();
    assert_eq!(code, 200);
    let (one, two) = (
        text.find("app_one_total 1\n").expect(&text),
        text.find("app_two 2\n").expect(&text),
    );
    assert!(one < two, "targets out of their order:\n{text}");
    // The agent's own part comes first, so the next scrape shows this one's failure.
    let (_, again) = net.pods[1].http_get(0, url).unwrap();
    assert!(
        again.contains("istio_agent_scrape_failures_total{type=\"application\"} 1"),
        "the target that does not answer is not counted:\n{again}"
    );
    assert!(again.contains("istio_agent_scrapes_total 2"), "{again}");
    assert!(
        !text.contains("envoy_cluster_manager"),
        "Envoy's metrics despite PILOT_AGENT_MERGE_ENVOY_STATS=false"
    );
    assert_valid_exposition(&text);
    // Compressed as asked: curl decodes gzip; zstd is checked by its frame's magic number.
    let out = net.pods[1]
        .exec(&[
            "curl",
            "-s",
            "-D",
            "-",
            "--compressed",
            "-H",
            "Accept-Encoding: gzip",
            url,
        ])
        .unwrap();
    let gz = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(gz.contains("content-encoding: gzip"), "{gz}");
    assert!(gz.contains("vary: accept-encoding"), "{gz}");
    assert!(gz.contains("app_two 2"), "{gz}");
    let out = net.pods[1]
        .exec(&["curl", "-s", "-H", "Accept-Encoding: gzip;q=0.5, zstd", url])
        .unwrap();
    assert_eq!(
        out.stdout.get(..4),
        Some(&[0x28, 0xb5, 0x2f, 0xfd][..]),
        "not a zstd frame"
    );
}

/// Istio 1.31's ENVOY_SECURE_METRICS_PORT and ENVOY_SECURE_MERGED_METRICS_PORT: Envoy's metrics
/// and the merged ones over mTLS, to a scraper with a certificate of the mesh only.
#[test]
fn secure_metrics_ports_take_only_mesh_clients() {
    if !require_root("secure_metrics_ports_take_only_mesh_clients")
        || !require_envoy("secure_metrics_ports_take_only_mesh_clients")
    {
        return;
    }
    let (net, mesh) = scraped_pod(
        None,
        &[
            ("ENVOY_SECURE_METRICS_PORT", "15091"),
            ("ENVOY_SECURE_MERGED_METRICS_PORT", "15092"),
        ],
    );
    // A scraper's certificate from the mesh's CA (the embedded control plane's, in the mesh
    // directory), and one from a CA of its own.
    let dir = net.dir().join("scraper");
    std::fs::create_dir_all(&dir).unwrap();
    let ca = mesh.join("cacerts");
    let sh = |script: &str| {
        let out = std::process::Command::new("sh")
            .args(["-ec", script])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (ca_cert, ca_key) = if ca.join("ca-key.pem").exists() {
        (ca.join("ca-cert.pem"), ca.join("ca-key.pem"))
    } else {
        (ca.join("root-cert.pem"), ca.join("root-key.pem"))
    };
    sh(&format!(
        "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout mesh.key -subj /O=scraper -out mesh.csr 2>/dev/null
         printf 'subjectAltName=URI:spiffe://cluster.local/ns/monitoring/sa/prometheus\\nextendedKeyUsage=clientAuth\\n' > ext
         openssl x509 -req -in mesh.csr -CA {} -CAkey {} -CAcreateserial -days 1 -extfile ext -out leaf.pem 2>/dev/null
         cat leaf.pem {} > mesh.pem
         openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout other.key -subj /O=other -days 1 -out other.pem 2>/dev/null",
        ca_cert.display(),
        ca_key.display(),
        ca_cert.display()
    ));
    let curl = |port: u16, path: &str, cert: Option<&str>| {
        let url = format!("https://10.233.0.2:{port}{path}");
        let mut args: Vec<String> = ["curl", "-sk", "-m", "5", "-o", "-", "-w", "\n%{http_code}"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        if let Some(c) = cert {
            let d = dir.display();
            args.extend([
                "--cert".into(),
                format!("{d}/{c}.pem"),
                "--key".into(),
                format!("{d}/{c}.key"),
            ]);
        }
        args.push(url);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = net.pods[1].exec(&args).unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let envoy = curl(15091, "/stats/prometheus", Some("mesh"));
    assert!(envoy.ends_with("\n200"), "{envoy}");
    assert!(
        envoy.contains("envoy_cluster_manager_cds_update_success"),
        "{envoy}"
    );
    assert!(!envoy.contains("istio_agent_"), "15091 is Envoy's alone");
    let merged = curl(15092, "/stats/prometheus", Some("mesh"));
    assert!(merged.ends_with("\n200"), "{merged}");
    assert!(merged.contains("istio_agent_scrapes_total"), "{merged}");
    for (port, cert) in [
        (15091, None),
        (15092, None),
        (15091, Some("other")),
        (15092, Some("other")),
    ] {
        let refused = curl(port, "/stats/prometheus", cert);
        assert!(
            refused.ends_with("\n000"),
            "port {port} with {cert:?} answered: {refused}"
        );
    }
}

/// Envoy's stats as Istio's inclusion list keeps them: with 20 services, 15090 serves Envoy's
/// server, cluster-manager, listener-manager and xds-grpc series (tagged `cluster_name`, from the
/// bootstrap's `alt_stat_name`), and none of the services' clusters; a pod annotated with
/// `sidecar.istio.io/statsInclusionPrefixes` gets those too.
#[test]
fn envoy_keeps_istios_stats_by_default_and_what_the_pod_asks_for() {
    if !require_root("envoy_keeps_istios_stats_by_default_and_what_the_pod_asks_for")
        || !require_envoy("envoy_keeps_istios_stats_by_default_and_what_the_pod_asks_for")
    {
        return;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("default", 2).unwrap();
    net.add_pod("annotated", 3).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    let services: String = (0..20)
        .map(|i| {
            format!(
                "---\nkind: ServiceEntry\nmetadata: {{name: svc{i}, namespace: demo}}\nspec:\n  \
                 hosts: [svc{i}.demo.svc.cluster.local]\n  addresses: [10.234.1.{i}]\n  \
                 ports: [{{number: 8080, name: http, protocol: HTTP}}]\n  \
                 endpoints: [{{address: 10.233.0.9}}]\n"
            )
        })
        .collect();
    std::fs::write(mesh.join("mesh.yaml"), services).unwrap();
    // The harness's pods keep all stats (harness::ALL_ENVOY_STATS); these two say what they want.
    let annotations = |i: usize| net.pods[i].dir.join("etc/istio/pod/annotations");
    std::fs::write(annotations(0), "").unwrap();
    std::fs::write(
        annotations(1),
        "sidecar.istio.io/statsInclusionPrefixes=\"cluster.outbound|8080||svc1.\"\n",
    )
    .unwrap();
    for (i, name) in [(0, "default"), (1, "annotated")] {
        let ip = format!("10.233.0.{}", i + 2);
        net.pods[i]
            .spawn_embedded_agent(
                &mesh,
                &[
                    ("POD_NAME", name),
                    ("POD_NAMESPACE", "demo"),
                    ("INSTANCE_IP", &ip),
                    ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"1s\"}"),
                ],
            )
            .unwrap();
    }
    for pod in &net.pods {
        let ready = pod.wait_http_ok(
            "http://127.0.0.1:15021/healthz/ready",
            Duration::from_secs(60),
        );
        assert!(ready.is_ok(), "{ready:?}\n{}", net.logs());
    }
    let scrape = |i: usize| {
        let (code, text) = net.pods[i]
            .http_get(0, "http://127.0.0.1:15090/stats/prometheus")
            .unwrap();
        assert_eq!(code, 200);
        assert_valid_exposition(&text);
        text
    };
    let series = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                l.rsplit_once(' ')
                    .unwrap()
                    .0
                    .trim_end_matches("{}")
                    .to_string()
            })
            .collect()
    };
    let default = scrape(0);
    let all = series(&default);
    for want in [
        "envoy_server_live",
        "envoy_cluster_manager_cds_update_success",
        "envoy_listener_manager_lds_update_success",
        "envoy_cluster_upstream_cx_total{cluster_name=\"xds-grpc\"}",
    ] {
        assert!(all.iter().any(|s| s == want), "{want} missing:\n{default}");
    }
    assert!(
        !default.contains("svc1") && !default.contains("outbound|"),
        "a service's stats without being asked for:\n{default}"
    );
    // Every series comes from an included prefix (Istio's list; `reporter=` has none here).
    let included = [
        "envoy_server_",
        "envoy_cluster_manager_",
        "envoy_listener_manager_",
        "envoy_cluster_",
        "envoy_wasm_",
    ];
    for s in &all {
        assert!(
            included.iter().any(|p| s.starts_with(p)),
            "{s} is outside Istio's inclusion list"
        );
        if s.starts_with("envoy_cluster_") && !s.starts_with("envoy_cluster_manager_") {
            assert!(s.contains("cluster_name=\"xds-grpc\""), "{s}");
        }
    }
    assert!(
        all.len() < 600,
        "{} series with Istio's list (Istio's own sidecar serves ~424)",
        all.len()
    );
    let (_, admin) = net.pods[1]
        .http_get(0, "http://127.0.0.1:15000/stats?filter=svc")
        .unwrap();
    assert!(
        // (Traffic stats come with the first use: Istio's deferred stats creation.)
        admin.contains("cluster.outbound|8080||svc1.demo.svc.cluster.local.circuit_breakers."),
        "the annotated prefix was not kept:\n{admin}"
    );
    assert!(
        !admin.contains("svc2."),
        "stats of a cluster the annotation does not name:\n{admin}"
    );
}
