#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Istio's Telemetry API examples, as istio.io writes them, through two sidecars with a real
//! collector (Jaeger v2: Zipkin spans in, OTLP logs in, its query API out):
//! - mesh-default (root namespace): access logging to the built-in `envoy` provider
//!   (/dev/stdout in Istio's format), Zipkin tracing at 0% for workloads that do not say
//!   otherwise, and the metrics overrides of the "Customizing Istio Metrics with Telemetry API"
//!   task (REQUEST_COUNT without `grpc_response_status`, REQUEST_SIZE off);
//! - per namespace: `namespace-metrics` (request_host and destination_port on REQUEST_COUNT);
//! - per workload: the client samples 100% with the three kinds of custom tags; the server
//!   logs only to the OTLP collector (`envoyOtelAls`), and only responses >= 400.
//!
//! The client's span and the server's join one trace, the server's a child of the client's.

use std::time::Duration;

use harness::collector::{self, Span};
use harness::{Network, Pod, binary, require_envoy, require_root, wait_ready, wait_until};

const APP_UID: u32 = 1000;
const NS: &str = "demo";
const VIP: &str = "10.234.0.30";
const HOST: &str = "httpbin.demo.svc.cluster.local";

/// The httpbin service (a VIP on port 8000) and its one endpoint, the server pod.
fn write_httpbin(dir: &std::path::Path, server_ip: &str) {
    let yaml = harness::httpbin_entries(NS, HOST, VIP, 8000, server_ip);
    std::fs::write(dir.join("httpbin.yaml"), yaml).unwrap();
}

/// The OTLP collector's service (gRPC on 4317, the collector pod), a YAML document.
fn otel_collector(collector_ip: &str) -> String {
    format!(
        r#"---
kind: ServiceEntry
metadata: {{name: opentelemetry-collector, namespace: observability}}
spec:
  hosts: [opentelemetry-collector.observability.svc.cluster.local]
  ports: [{{number: 4317, name: grpc-otlp, protocol: GRPC}}]
  resolution: STATIC
  endpoints: [{{address: {collector_ip}}}]
"#
    )
}

fn mesh_config(dir: &std::path::Path, server_ip: &str, collector_ip: &str) {
    write_httpbin(dir, server_ip);
    let collector = otel_collector(collector_ip);
    let yaml = format!(
        r#"kind: MeshConfig
metadata: {{name: mesh, namespace: istio-system}}
spec:
  enableTracing: true
  defaultConfig:
    tracing: {{}} # disable legacy MeshConfig tracing options
  extensionProviders:
  - name: "zipkin"
    zipkin:
      service: zipkin.istio-system.svc.cluster.local
      port: 9411
  - name: otel
    envoyOtelAls:
      service: opentelemetry-collector.observability.svc.cluster.local
      port: 4317
---
kind: ServiceEntry
metadata: {{name: zipkin, namespace: istio-system}}
spec:
  hosts: [zipkin.istio-system.svc.cluster.local]
  ports: [{{number: 9411, name: http-query, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: {collector_ip}}}]
{collector}---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: deny-forbidden, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: httpbin}}}}
  action: DENY
  rules: [{{to: [{{operation: {{paths: ["/forbidden"]}}}}]}}]
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata:
  name: mesh-default
  namespace: istio-system
spec:
  accessLogging:
    - providers:
      - name: envoy
  tracing:
  - providers:
    - name: "zipkin"
    randomSamplingPercentage: 0
  metrics:
    - providers:
        - name: prometheus
      overrides:
        - match:
            mode: CLIENT_AND_SERVER
            metric: REQUEST_COUNT
          tagOverrides:
            grpc_response_status:
              operation: REMOVE
        - disabled: true
          match:
            mode: CLIENT_AND_SERVER
            metric: REQUEST_SIZE
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata:
  name: namespace-metrics
  namespace: {NS}
spec:
  metrics:
  - providers:
    - name: prometheus
    overrides:
    - match:
        metric: REQUEST_COUNT
      tagOverrides:
        destination_port:
          value: "string(destination.port)"
        request_host:
          value: "request.host"
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata:
  name: sleep-tracing
  namespace: {NS}
spec:
  selector:
    matchLabels:
      app: sleep
  tracing:
  - randomSamplingPercentage: 100.00
    customTags:
      "provider":
        literal:
          value: "zipkin"
      "cluster_id":
        environment:
          name: ISTIO_META_CLUSTER_ID
          defaultValue: Kubernetes # optional
      my_tag_header:
        header:
          name: x-custom
          defaultValue: none
---
apiVersion: telemetry.istio.io/v1alpha1
kind: Telemetry
metadata:
  name: filter-httpbin-logging
  namespace: {NS}
spec:
  selector:
    matchLabels:
      app: httpbin
  accessLogging:
  - providers:
    - name: otel
    filter:
      expression: response.code >= 400
"#
    );
    std::fs::write(dir.join("mesh.yaml"), yaml).unwrap();
}

fn start_agent(
    pod: &mut Pod,
    sa: &str,
    workload: &str,
    labels: &str,
    mesh: &std::path::Path,
    proxy_config: &str,
) {
    let workload = harness::Workload {
        namespace: NS,
        service_account: sa,
        name: workload,
        labels,
        cluster: "cluster-a",
        proxy_config,
    };
    pod.spawn_workload_agent(mesh, &workload).unwrap();
}

fn curl(net: &Network, path: &str) -> String {
    let out = net.pods[0]
        .exec_as(
            APP_UID,
            APP_UID,
            &[
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "5",
                "-H",
                &format!("Host: {HOST}:8000"),
                "-H",
                "x-custom: from-client",
                &format!("http://{VIP}:8000{path}"),
            ],
        )
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn scrape(pod: &Pod) -> String {
    pod.http_get(0, "http://127.0.0.1:15020/stats/prometheus")
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// The client span and the server span of one call to `path`: the trace of `client` (a Jaeger
/// service) with a span of `server` whose parent is the client's span.
fn joined(collector: &Pod, client: &str, server: &str, path: &str) -> Option<(Span, Span)> {
    for trace in collector::traces(collector, client).ok()? {
        let spans = collector::spans(&trace);
        for c in spans
            .iter()
            .filter(|s| s.service == client && s.tag("http.url").is_some_and(|u| u.ends_with(path)))
        {
            if let Some(s) = spans
                .iter()
                .find(|s| s.service == server && s.parent.as_deref() == Some(&c.span_id))
            {
                return Some((c.clone(), s.clone()));
            }
        }
    }
    None
}

const DRAIN: &str = "{\"terminationDrainDuration\": \"1s\"}";

/// The sleep (client) and httpbin (server) agents, ready.
fn start_agents(net: &mut Network, mesh: &std::path::Path, proxy_config: &str) {
    let labels = "app=\"sleep\"\n";
    start_agent(
        &mut net.pods[0],
        "sleep",
        "sleep",
        labels,
        mesh,
        proxy_config,
    );
    let labels = "app=\"httpbin\"\nversion=\"v1\"\n";
    start_agent(
        &mut net.pods[1],
        "httpbin",
        "httpbin-v1",
        labels,
        mesh,
        proxy_config,
    );
    wait_ready(net);
}

/// Three pods (sleep, httpbin with an HTTP echo app, the collector with Jaeger), traffic
/// captured in the first two; the mesh config directory, empty.
fn pods() -> (Network, std::path::PathBuf) {
    let mut net = Network::new().unwrap();
    net.add_pod("sleep", 2).unwrap();
    net.add_pod("httpbin", 3).unwrap();
    net.add_pod("collector", 4).unwrap();
    collector::start_jaeger(&mut net.pods[2]).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    let probe = binary("netprobe");
    net.pods[1]
        .spawn(
            "http-echo",
            APP_UID,
            APP_UID,
            &[],
            &[probe.to_str().unwrap(), "http-echo", "8000"],
        )
        .unwrap();
    for pod in &net.pods[..2] {
        harness::istio_iptables(pod, &[]).unwrap();
    }
    (net, mesh)
}

#[test]
fn istios_telemetry_examples_with_a_real_collector() {
    let test = "istios_telemetry_examples_with_a_real_collector";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let (mut net, mesh) = pods();
    let (server_ip, collector_ip) = (net.pods[1].ip.to_string(), net.pods[2].ip.to_string());
    mesh_config(&mesh, &server_ip, &collector_ip);
    start_agents(&mut net, &mesh, DRAIN);
    for _ in 0..3 {
        assert_eq!(curl(&net, "/hello"), "200", "{}", net.logs());
    }
    assert_eq!(curl(&net, "/forbidden"), "403", "{}", net.logs());
    let (client, server, jaeger) = (&net.pods[0], &net.pods[1], &net.pods[2]);

    // Tracing: the client's Telemetry samples every request; the server's sidecar follows the
    // client's decision (its own rate is 0%) and reports a child span in the same trace.
    let services = |pod: &Pod| {
        pod.http_get(0, "http://127.0.0.1:16686/api/services")
            .map(|(_, b)| b)
            .unwrap_or_default()
    };
    let mut pair = None;
    let found = wait_until(Duration::from_secs(30), || {
        pair = joined(jaeger, "sleep.demo", "httpbin.demo", "/hello");
        pair.is_some()
    });
    assert!(
        found,
        "no trace with a sleep.demo span and an httpbin.demo child span; Jaeger's services: {}\n{}",
        services(jaeger),
        net.logs()
    );
    let (c, s) = pair.unwrap();
    assert_eq!(c.trace_id, s.trace_id);
    assert_eq!(c.tag("provider"), Some("zipkin"), "{c:?}");
    assert_eq!(c.tag("cluster_id"), Some("cluster-a"), "{c:?}");
    assert_eq!(c.tag("my_tag_header"), Some("from-client"), "{c:?}");
    assert_eq!(c.tag("istio.canonical_service"), Some("sleep"), "{c:?}");
    assert_eq!(c.tag("istio.namespace"), Some(NS), "{c:?}");
    // The server's spans carry no client-only tags.
    assert_eq!(s.tag("provider"), None, "{s:?}");
    assert_eq!(s.tag("istio.canonical_service"), Some("httpbin"), "{s:?}");

    // Access logs: the client's sidecar writes Istio's format to its stdout (mesh-default's
    // `envoy` provider); the server's replaces it with the OTLP collector, errors only.
    let logged = wait_until(Duration::from_secs(10), || {
        client
            .logs_of("pilot-agent")
            .contains("\"GET /hello HTTP/1.1\" 200")
    });
    let client_log = client.logs_of("pilot-agent");
    assert!(
        logged
            && client_log
                .lines()
                .any(|l| l.contains("\"GET /hello HTTP/1.1\" 200")
                    && l.contains(&format!("outbound|8000||{HOST}"))),
        "no access log line of the client's call:\n{}",
        harness::tail(&client_log, 40)
    );
    let to_collector = wait_until(Duration::from_secs(15), || {
        jaeger.logs_of("jaeger").contains("GET /forbidden")
    });
    let jaeger_log = jaeger.logs_of("jaeger");
    assert!(
        to_collector,
        "the server's 403 never reached the OTLP collector:\n{}\n{}",
        harness::tail(&jaeger_log, 40),
        net.logs()
    );
    assert!(
        !jaeger_log.contains("GET /hello"),
        "the server's filter (response.code >= 400) let a 200 through:\n{}",
        harness::tail(&jaeger_log, 40)
    );
    assert!(
        !server.logs_of("pilot-agent").contains("\"GET /hello"),
        "the server's workload Telemetry replaces the envoy provider; its stdout has a log line"
    );

    // Metrics: REQUEST_COUNT without grpc_response_status and with the namespace's two tags;
    // REQUEST_SIZE off; the other metrics as Istio labels them.
    for (pod, reporter) in [(client, "source"), (server, "destination")] {
        let mut text = String::new();
        // The peer exchange: each side knows the other's workload (HTTP).
        let want = format!("reporter=\"{reporter}\",source_workload=\"sleep\"");
        let peer = if reporter == "source" {
            "destination_workload=\"httpbin-v1\""
        } else {
            "source_app=\"sleep\""
        };
        let ok = wait_until(Duration::from_secs(20), || {
            text = scrape(pod);
            text.lines().any(|l| {
                l.starts_with("istio_requests_total{")
                    && l.contains(&want)
                    && l.contains(peer)
                    && l.contains(&format!("request_host=\"{HOST}:8000\""))
                    && l.contains("destination_port=\"8000\"")
                    && !l.contains("grpc_response_status")
            })
        });
        let ours: Vec<&str> = text.lines().filter(|l| l.starts_with("istio_")).collect();
        assert!(
            ok,
            "{reporter}: istio_requests_total is not shaped:\n{}",
            ours.join("\n")
        );
        assert!(
            !text.contains("istio_request_bytes"),
            "{reporter}: REQUEST_SIZE is disabled:\n{}",
            ours.join("\n")
        );
        assert!(
            text.lines().any(
                |l| l.starts_with("istio_request_duration_milliseconds_bucket{")
                    && l.contains("grpc_response_status")
                    && !l.contains("request_host")
            ),
            "{reporter}: the duration keeps Istio's labels:\n{}",
            ours.join("\n")
        );
    }
}

/// Without any Telemetry: MeshConfig `accessLogFile` with `accessLogEncoding: JSON` and a format
/// of the user's, and ProxyConfig `tracing.zipkin.address` (the bootstrap's tracer, Istio's
/// legacy path) at the proxy's own ProxyConfig `tracing.sampling` (over the mesh's 0.01%).
#[test]
fn mesh_config_access_log_and_the_bootstrap_tracer() {
    let test = "mesh_config_access_log_and_the_bootstrap_tracer";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let (mut net, mesh) = pods();
    let (server_ip, collector_ip) = (net.pods[1].ip.to_string(), net.pods[2].ip.to_string());
    let yaml = r#"kind: MeshConfig
metadata: {name: mesh, namespace: istio-system}
spec:
  accessLogFile: /dev/stdout
  accessLogEncoding: JSON
  accessLogFormat: '{"code": "%RESPONSE_CODE%", "path": "%REQ(:PATH)%", "peer": "%DOWNSTREAM_PEER_URI_SAN%"}'
  defaultConfig:
    tracing:
      sampling: 0.01 # the proxies' own ProxyConfig says 100
"#;
    std::fs::write(mesh.join("mesh.yaml"), yaml).unwrap();
    write_httpbin(&mesh, &server_ip);
    let proxy_config = format!(
        "{{\"terminationDrainDuration\": \"1s\", \"tracing\": {{\"sampling\": 100, \"zipkin\": {{\"address\": \"{collector_ip}:9411\"}}}}}}"
    );
    start_agents(&mut net, &mesh, &proxy_config);
    assert_eq!(curl(&net, "/hello"), "200", "{}", net.logs());
    let (server, jaeger) = (&net.pods[1], &net.pods[2]);

    // The server's line, as JSON with the user's keys.
    let mut line = None;
    let logged = wait_until(Duration::from_secs(10), || {
        line = server
            .logs_of("pilot-agent")
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["path"] == "/hello");
        line.is_some()
    });
    assert!(
        logged,
        "no JSON access log line on the server:\n{}",
        harness::tail(&server.logs_of("pilot-agent"), 40)
    );
    let line = line.unwrap();
    assert_eq!(line["code"], 200, "{line}");
    assert_eq!(
        line["peer"], "spiffe://cluster.local/ns/demo/sa/sleep",
        "{line}"
    );
    assert_eq!(line.as_object().unwrap().len(), 3, "{line}");

    // The bootstrap's Zipkin tracer: both sidecars report, at the proxies' own 100%.
    let found = wait_until(Duration::from_secs(30), || {
        joined(jaeger, "sleep.demo", "httpbin.demo", "/hello").is_some()
    });
    assert!(
        found,
        "no joined trace from the bootstrap tracers\n{}",
        net.logs()
    );

    // Then a Telemetry naming an `opentelemetry` provider (OTLP over gRPC, Jaeger's receiver):
    // the sidecars follow the config change, `traceparent` joins the two spans, and each span's
    // service is its sidecar's (`app.namespace`, from Envoy's environment).
    let collector = otel_collector(&collector_ip);
    let otel = format!(
        r#"kind: MeshConfig
metadata: {{name: mesh-otel, namespace: istio-system}}
spec:
  extensionProviders:
  - name: otel-tracing
    opentelemetry:
      port: 4317
      service: opentelemetry-collector.observability.svc.cluster.local
{collector}---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata:
  name: mesh-default
  namespace: istio-system
spec:
  tracing:
  - providers:
    - name: otel-tracing
    randomSamplingPercentage: 100
"#
    );
    std::fs::write(mesh.join("otel.yaml"), otel).unwrap();
    let mut pair = None;
    let found = wait_until(Duration::from_secs(45), || {
        let _ = curl(&net, "/otel");
        pair = joined(jaeger, "sleep.demo", "httpbin.demo", "/otel");
        pair.is_some()
    });
    let services = jaeger
        .http_get(0, "http://127.0.0.1:16686/api/services")
        .map(|(_, b)| b)
        .unwrap_or_default();
    assert!(
        found,
        "no joined OpenTelemetry trace for /otel; Jaeger's services: {services}\n{}",
        net.logs()
    );
    let (c, _) = pair.unwrap();
    assert_eq!(c.tag("istio.canonical_service"), Some("sleep"), "{c:?}");
}
