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

/// The app pod (pod 0, 10.233.0.2 in `demo`) with its DNS captured to its agent, whose
/// embedded control plane reads `mesh_yaml`; returns once it is ready (which includes the DNS
/// table). Its resolver is the dnsmasq of pod 1 (10.233.0.3).
fn start_app(net: &mut Network, mesh_yaml: &str) {
    let app = &net.pods[0];
    app.set_resolv_conf("nameserver 10.233.0.3\nsearch demo.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n")
        .unwrap();
    harness::istio_iptables(app, &["--redirect-dns"]).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    std::fs::write(mesh.join("mesh.yaml"), mesh_yaml).unwrap();
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
    let ready = net.pods[0].wait_http_ok(
        "http://127.0.0.1:15021/healthz/ready",
        Duration::from_secs(60),
    );
    assert!(ready.is_ok(), "{ready:?}\n{}", net.logs());
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
    start_app(&mut net, MESH);
    let app = &net.pods[0];
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

/// The DNS-proxy docs' address-less ServiceEntries (istio.io `ops/configuration/
/// traffic-management/dns-proxy`, "External TCP services without VIPs"), as written but for
/// inline endpoints so the test stays in its own network: two TCP services on the same port
/// 9000, neither with an address. istiod-core gives each host an address of its own
/// (240.240.0.1 and 240.240.0.2, in host order, as Istio's allocation controller hands them
/// out); the app, whose DNS the agent answers, resolves each name to its own address; the
/// client's Envoy has a listener per address (`240.240.0.1_9000`); and a connection to each
/// name reaches its own backend, though both are on port 9000.
const ADDRESSLESS: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: external-svc-1
  namespace: demo
spec:
  hosts:
  - tcp-echo.external-1.svc.cluster.local
  ports:
  - name: external-svc-1
    number: 9000
    protocol: TCP
  resolution: DNS
  endpoints: [{address: 10.233.0.4}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: external-svc-2
  namespace: demo
spec:
  hosts:
  - tcp-echo.external-2.svc.cluster.local
  ports:
  - name: external-svc-2
    number: 9000
    protocol: TCP
  resolution: DNS
  endpoints: [{address: 10.233.0.5}]
"#;

/// A TCP server on 9000 that answers its name to the first line.
const ECHO: &str = "import socketserver, sys\nclass T(socketserver.StreamRequestHandler):\n    def handle(self):\n        self.rfile.readline()\n        self.wfile.write((sys.argv[1] + '\\n').encode())\nsocketserver.ThreadingTCPServer.allow_reuse_address = True\nsocketserver.ThreadingTCPServer(('0.0.0.0', 9000), T).serve_forever()\n";

#[test]
fn addressless_service_entries_get_addresses_of_their_own() {
    if !require_root("addressless_service_entries_get_addresses_of_their_own")
        || !require_envoy("addressless_service_entries_get_addresses_of_their_own")
    {
        return;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("app", 2).unwrap();
    net.add_pod("dns", 3).unwrap();
    net.add_pod("external-1", 4).unwrap();
    net.add_pod("external-2", 5).unwrap();
    if !net.pods[1].spawn_dnsmasq(&["/upstream.example/10.9.9.9"]) {
        return;
    }
    let echo = net.dir().join("echo.py");
    std::fs::write(&echo, ECHO).unwrap();
    for (i, name) in [(2, "external-1"), (3, "external-2")] {
        net.pods[i]
            .spawn(
                "echo",
                1000,
                1000,
                &[],
                &["/usr/bin/python3", echo.to_str().unwrap(), name],
            )
            .unwrap();
    }
    start_app(&mut net, ADDRESSLESS);
    let app = &net.pods[0];

    let one = resolve(app, "tcp-echo.external-1.svc.cluster.local");
    let two = resolve(app, "tcp-echo.external-2.svc.cluster.local");
    assert_eq!(
        (one.as_str(), two.as_str()),
        ("240.240.0.1", "240.240.0.2"),
        "{}",
        net.logs()
    );
    // The client's Envoy has a (non-binding) listener on each address.
    let (_, dump) = app
        .http_get(
            0,
            "http://127.0.0.1:15000/config_dump?resource=dynamic_listeners",
        )
        .unwrap();
    for name in ["240.240.0.1_9000", "240.240.0.2_9000"] {
        assert!(
            dump.contains(&format!("\"name\": \"{name}\"")),
            "{name} not among the client's listeners:\n{dump}"
        );
    }
    // Each name reaches its own backend on the shared port, through the client's Envoy.
    let line = |host: &str| {
        let out = app
            .exec_as(
                1000,
                1000,
                &[
                    "/usr/bin/python3",
                    "-c",
                    &format!(
                        "import socket\ns=socket.create_connection(('{host}',9000),5)\ns.sendall(b'hi\\n')\nprint(s.makefile().readline().strip())"
                    ),
                ],
            )
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(
        line("tcp-echo.external-1.svc.cluster.local"),
        "external-1",
        "{}",
        net.logs()
    );
    assert_eq!(
        line("tcp-echo.external-2.svc.cluster.local"),
        "external-2",
        "{}",
        net.logs()
    );
    let (_, stats) = app.http_get(0, "http://127.0.0.1:15000/stats").unwrap();
    for host in ["tcp-echo.external-1", "tcp-echo.external-2"] {
        let key = format!("cluster.outbound|9000||{host}.svc.cluster.local.upstream_cx_total: ");
        let total = stats
            .lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        assert!(total >= 1, "{key}{total}: not through its cluster");
    }
}
