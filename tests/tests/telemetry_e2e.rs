#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Istio's standard metrics with upstream Envoy and the proxy module: a client sidecar calls a
//! server sidecar over mutual TLS (HTTP and TCP), and each agent's 15020 exposition shows
//! `istio_requests_total`, the duration histogram and the `istio_tcp_*` counters with Istio's
//! labels: the destination reports the client's SPIFFE identity, workload (from Istio's
//! metadata exchange, over HTTP headers and in the TCP stream) and `mutual_tls`, the source the
//! server's identity and workload and the service it called. The series are Envoy's own (its
//! port 15090 shows them): the agent keeps no per-request state.

use std::time::Duration;

use harness::{Network, Pod, binary, require_envoy, require_root, wait_ready, wait_until};

const APP_UID: u32 = 1000;
const NS: &str = "demo";
const HTTP_VIP: &str = "10.234.0.20";
const TCP_VIP: &str = "10.234.0.21";
const HTTP_HOST: &str = "httpbin.demo.svc.cluster.local";
const TCP_HOST: &str = "echo.demo.svc.cluster.local";
const CLIENT_ID: &str = "spiffe://cluster.local/ns/demo/sa/sleep";
const SERVER_ID: &str = "spiffe://cluster.local/ns/demo/sa/httpbin";

fn mesh_config(dir: &std::path::Path, server_ip: &str) {
    let echo = format!(
        r#"---
kind: ServiceEntry
metadata: {{name: echo, namespace: {NS}}}
spec:
  hosts: [{TCP_HOST}]
  addresses: [{TCP_VIP}]
  ports: [{{number: 9000, name: tcp, protocol: TCP}}]
  workloadSelector: {{labels: {{app: httpbin}}}}
"#
    );
    let yaml = harness::httpbin_entries(NS, HTTP_HOST, HTTP_VIP, 8000, server_ip) + &echo;
    std::fs::write(dir.join("mesh.yaml"), yaml).unwrap();
}

/// The agent as the injector starts it: workload name in the node metadata, pod labels in the
/// downward-API file.
fn start_agent(pod: &mut Pod, sa: &str, workload: &str, labels: &str, mesh: &std::path::Path) {
    let workload = harness::Workload {
        namespace: NS,
        service_account: sa,
        name: workload,
        labels,
        cluster: "Kubernetes",
        proxy_config: "{\"terminationDrainDuration\": \"1s\"}",
    };
    pod.spawn_workload_agent(mesh, &workload).unwrap();
}

/// The value of the first series of `name` whose line has every one of `labels`.
fn value(text: &str, name: &str, labels: &[String]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want.as_str())))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn label(name: &str, value: &str) -> String {
    format!("{name}=\"{value}\"")
}

fn scrape(pod: &Pod) -> String {
    pod.http_get(0, "http://127.0.0.1:15020/stats/prometheus")
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// Waits (histograms appear after Envoy's stats flush) until `pod`'s series `name` with `labels`
/// reaches `at_least`; fails naming what was there.
fn expect(net: &Network, pod: &Pod, name: &str, labels: &[String], at_least: f64) {
    let mut last = String::new();
    let ok = wait_until(Duration::from_secs(30), || {
        last = scrape(pod);
        value(&last, name, labels).is_some_and(|v| v >= at_least)
    });
    let ours: Vec<&str> = last.lines().filter(|l| l.starts_with("istio_")).collect();
    assert!(
        ok,
        "{} has no {name} >= {at_least} with {labels:?}; its istio_ series:\n{}\n{}",
        pod.ns,
        ours.join("\n"),
        net.logs()
    );
}

#[test]
fn standard_metrics_carry_both_identities_over_mtls() {
    if !require_root("standard_metrics_carry_both_identities_over_mtls")
        || !require_envoy("standard_metrics_carry_both_identities_over_mtls")
    {
        return;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("client", 2).unwrap();
    net.add_pod("server", 3).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    mesh_config(&mesh, &net.pods[1].ip.to_string());
    let probe = binary("netprobe");
    let probe = probe.to_str().unwrap();
    net.pods[1]
        .spawn(
            "http-echo",
            APP_UID,
            APP_UID,
            &[],
            &[probe, "http-echo", "8000"],
        )
        .unwrap();
    net.pods[1]
        .spawn(
            "tcp-echo",
            APP_UID,
            APP_UID,
            &[],
            &[probe, "listen", "9000"],
        )
        .unwrap();
    for pod in &net.pods {
        harness::istio_iptables(pod, &[]).unwrap();
    }
    start_agent(&mut net.pods[0], "sleep", "sleep", "app=\"sleep\"\n", &mesh);
    start_agent(
        &mut net.pods[1],
        "httpbin",
        "httpbin-v1",
        "app=\"httpbin\"\nversion=\"v1\"\n",
        &mesh,
    );
    wait_ready(&net);
    let (client, server) = (&net.pods[0], &net.pods[1]);

    for _ in 0..3 {
        let out = client
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
                    &format!("Host: {HTTP_HOST}:8000"),
                    &format!("http://{HTTP_VIP}:8000/"),
                ],
            )
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "200",
            "{}",
            net.logs()
        );
    }
    let tcp = client
        .exec_as(
            APP_UID,
            APP_UID,
            &[probe, "connect", &format!("{TCP_VIP}:9000")],
        )
        .unwrap();
    assert!(tcp.status.success(), "{}", net.logs());

    // The server's sidecar: the client's identity from its certificate, its own workload.
    let destination = [
        label("reporter", "destination"),
        label("source_principal", CLIENT_ID),
        label("source_workload_namespace", NS),
        label("destination_principal", SERVER_ID),
        label("destination_workload", "httpbin-v1"),
        label("destination_workload_namespace", NS),
        label("destination_app", "httpbin"),
        label("destination_version", "v1"),
        label("destination_cluster", "Kubernetes"),
        label("connection_security_policy", "mutual_tls"),
    ];
    let mut http = destination.to_vec();
    // HTTP: the client's sidecar announced its workload (the peer exchange), and its
    // certificate vouches for the announcement's namespace and service account.
    http.extend([
        label("source_workload", "sleep"),
        label("source_app", "sleep"),
        label("source_canonical_service", "sleep"),
        label("source_cluster", "Kubernetes"),
        label("destination_service", HTTP_HOST),
        label("destination_service_name", "httpbin"),
        label("request_protocol", "http"),
        label("response_code", "200"),
    ]);
    expect(&net, server, "istio_requests_total", &http, 3.0);
    expect(
        &net,
        server,
        "istio_request_duration_milliseconds_count",
        &http,
        3.0,
    );
    expect(&net, server, "istio_response_bytes_sum", &http, 1.0);
    let mut tcp = destination.to_vec();
    // TCP: the client's sidecar sent Istio's metadata frame ahead of the app's bytes.
    tcp.extend([
        label("request_protocol", "tcp"),
        label("source_workload", "sleep"),
        label("source_app", "sleep"),
    ]);
    expect(
        &net,
        server,
        "istio_tcp_connections_opened_total",
        &tcp,
        1.0,
    );
    expect(
        &net,
        server,
        "istio_tcp_connections_closed_total",
        &tcp,
        1.0,
    );
    // The echo server writes three bytes to the client.
    expect(&net, server, "istio_tcp_sent_bytes_total", &tcp, 3.0);

    // The client's sidecar: the server's identity from its certificate, the service it called.
    let source = [
        label("reporter", "source"),
        label("source_principal", CLIENT_ID),
        label("source_workload", "sleep"),
        label("source_app", "sleep"),
        label("source_workload_namespace", NS),
        label("destination_principal", SERVER_ID),
        label("destination_workload_namespace", NS),
        label("destination_service_namespace", NS),
        label("connection_security_policy", "unknown"),
    ];
    let mut http = source.to_vec();
    // HTTP: the server's sidecar announced its workload on the response.
    http.extend([
        label("destination_service", HTTP_HOST),
        label("destination_service_name", "httpbin"),
        label("destination_workload", "httpbin-v1"),
        label("destination_app", "httpbin"),
        label("destination_version", "v1"),
        label("destination_canonical_service", "httpbin"),
        label("response_code", "200"),
    ]);
    expect(&net, client, "istio_requests_total", &http, 3.0);
    let mut tcp = source.to_vec();
    // TCP: the server's sidecar answered the client's frame with its own.
    tcp.extend([
        label("destination_service", TCP_HOST),
        label("destination_service_name", "echo"),
        label("destination_workload", "httpbin-v1"),
        label("request_protocol", "tcp"),
    ]);
    expect(
        &net,
        client,
        "istio_tcp_connections_closed_total",
        &tcp,
        1.0,
    );
    expect(&net, client, "istio_tcp_sent_bytes_total", &tcp, 3.0);

    // Envoy's own exposition has them: the proxy module counted them inside Envoy.
    let envoy = server
        .http_get(0, "http://127.0.0.1:15090/stats/prometheus")
        .map(|(_, body)| body)
        .unwrap_or_default();
    assert!(
        value(
            &envoy,
            "istio_requests_total",
            &[label("reporter", "destination")]
        )
        .is_some(),
        "Envoy's 15090 has no istio_requests_total:\n{envoy}"
    );
}
