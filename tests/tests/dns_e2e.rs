#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! DNS end to end: istio-iptables captures the app's port-53 traffic to the agent's DNS proxy,
//! which answers mesh names from the table istiod-core pushes over NDS and forwards the rest to
//! the pod's real resolver (dnsmasq in another namespace).

use std::time::Duration;

use harness::{Network, require_envoy, require_root};

const MESH: &str = r#"
kind: ServiceEntry
metadata: {name: httpbin, namespace: demo}
spec:
  hosts: [httpbin.demo.svc.cluster.local]
  addresses: [10.234.0.10]
  ports: [{number: 8000, name: http, protocol: HTTP}]
  endpoints: [{address: 10.233.0.9}]
"#;

fn resolve(pod: &harness::Pod, name: &str) -> String {
    let out = pod
        .exec_as(1000, 1000, &["getent", "ahostsv4", name])
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn app_resolves_mesh_names_through_the_agent() {
    if !require_root("app_resolves_mesh_names_through_the_agent")
        || !require_envoy("app_resolves_mesh_names_through_the_agent")
    {
        return;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("app", 2).unwrap();
    net.add_pod("dns", 3).unwrap();
    if !net.pods[1].spawn_dnsmasq(&["/upstream.example/10.9.9.9"]) {
        return;
    }
    let app = &net.pods[0];
    app.set_resolv_conf("nameserver 10.233.0.3\nsearch demo.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n")
        .unwrap();
    harness::istio_iptables(app, &["--redirect-dns"]).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    std::fs::write(mesh.join("mesh.yaml"), MESH).unwrap();
    net.pods[0]
        .spawn_embedded_agent(
            &mesh,
            &[
                ("POD_NAME", "app"),
                ("POD_NAMESPACE", "demo"),
                ("INSTANCE_IP", "10.233.0.2"),
                ("ISTIO_META_DNS_CAPTURE", "true"),
                ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"1s\"}"),
            ],
        )
        .unwrap();
    let app = &net.pods[0];
    // Readiness includes the DNS table.
    let ready = app.wait_http_ok(
        "http://127.0.0.1:15021/healthz/ready",
        Duration::from_secs(60),
    );
    assert!(ready.is_ok(), "{ready:?}\n{}", net.logs());
    assert!(
        app.logs_of("pilot-agent")
            .contains("DNS name table received")
    );

    // Mesh names, in full and through the search path, come from the agent's table; dnsmasq does
    // not know them, so an answer proves the capture and the proxy.
    assert_eq!(
        resolve(app, "httpbin.demo.svc.cluster.local"),
        "10.234.0.10",
        "{}",
        net.logs()
    );
    assert_eq!(resolve(app, "httpbin"), "10.234.0.10");
    assert_eq!(resolve(app, "httpbin.demo"), "10.234.0.10");
    // The queries were counted by the agent.
    let (_, stats) = app
        .http_get(0, "http://127.0.0.1:15020/stats/prometheus")
        .unwrap();
    let counted = stats
        .lines()
        .find_map(|l| l.strip_prefix("istio_agent_dns_requests_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(counted >= 3.0, "istio_agent_dns_requests_total = {counted}");
    // The name table is visible to loopback on /debug/ndsz.
    let (code, ndsz) = app
        .http_get(0, "http://127.0.0.1:15020/debug/ndsz")
        .unwrap();
    assert_eq!(code, 200);
    assert!(
        ndsz.contains("\"httpbin.demo.svc.cluster.local.\""),
        "{ndsz}"
    );
    assert!(ndsz.contains("10.234.0.10"));
    // Anything else is forwarded to the pod's resolver.
    assert_eq!(
        resolve(app, "upstream.example"),
        "10.9.9.9",
        "{}",
        net.logs()
    );
}
