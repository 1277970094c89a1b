#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! The sidecar path end to end, with real iptables, real Envoy and the real binaries given the
//! args and env Istio's injector writes: a client pod calls a server pod by its service VIP and
//! the request must pass through the client's outbound and the server's inbound listener.

use std::path::Path;
use std::time::Duration;

use harness::{Network, Pod, binary, require_envoy, require_root};

const APP_UID: u32 = 1000;
const NAMESPACE: &str = "demo";
const VIP: &str = "10.234.0.10";
const PORT: u16 = 8000;

/// The injector's init container args.
const INIT_ARGS: [&str; 17] = [
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-m",
    "REDIRECT",
    "-i",
    "*",
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
    "--log_output_level=default:info",
];

fn mesh_config(dir: &Path, server_ip: &str) {
    let yaml = format!(
        r#"apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: httpbin, namespace: {NAMESPACE}}}
spec:
  hosts: [httpbin.{NAMESPACE}.svc.cluster.local]
  addresses: [{VIP}]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: {PORT}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: httpbin}}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {{name: httpbin-1, namespace: {NAMESPACE}}}
spec: {{address: {server_ip}, labels: {{app: httpbin}}, serviceAccount: httpbin}}
"#
    );
    std::fs::write(dir.join("mesh.yaml"), yaml).unwrap();
}

fn capture(pod: &Pod) {
    let init = binary("istio-iptables");
    let mut args = vec![init.to_str().unwrap()];
    args.extend_from_slice(&INIT_ARGS);
    let out = pod.exec(&args).unwrap();
    assert!(
        out.status.success(),
        "istio-iptables failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `delta`: Delta xDS (Istio's default) or state of the world (ISTIO_DELTA_XDS=false).
fn start_agent(pod: &mut Pod, name: &str, config_dir: &Path, delta: bool) {
    let agent = binary("pilot-agent");
    let ip = pod.ip.to_string();
    let config_dir = config_dir.to_str().unwrap().to_string();
    pod.spawn(
        "pilot-agent",
        0,
        0,
        &[
            ("POD_NAME", name),
            ("POD_NAMESPACE", NAMESPACE),
            ("INSTANCE_IP", &ip),
            ("SERVICE_ACCOUNT", name),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
            ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"1s\"}"),
            ("ISTIO_DELTA_XDS", if delta { "true" } else { "false" }),
        ],
        &[
            agent.to_str().unwrap(),
            "proxy",
            "sidecar",
            "--domain",
            &format!("{NAMESPACE}.svc.cluster.local"),
            "--proxyLogLevel=warning",
            "--proxyComponentLogLevel=misc:error",
            "--log_output_level=default:info",
            "--configDir",
            &config_dir,
        ],
    )
    .unwrap();
}

#[test]
fn request_passes_through_both_sidecars() {
    if !require_root("request_passes_through_both_sidecars")
        || !require_envoy("request_passes_through_both_sidecars")
    {
        return;
    }
    let mut net = Network::new().unwrap();
    let client = net.add_pod("client", 2).unwrap();
    let server = net.add_pod("server", 3).unwrap();
    let config_dir = net.dir().join("mesh");
    std::fs::create_dir_all(&config_dir).unwrap();
    mesh_config(&config_dir, &net.pods[server].ip.to_string());

    // The app: serves a file with a token only this test knows.
    let token = format!("token-{}", std::process::id());
    let www = net.pods[server].dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), &token).unwrap();
    let www = www.to_str().unwrap().to_string();
    net.pods[server]
        .spawn(
            "app",
            APP_UID,
            APP_UID,
            &[],
            &[
                "/usr/bin/python3",
                "-m",
                "http.server",
                &PORT.to_string(),
                "--bind",
                "0.0.0.0",
                "--directory",
                &www,
            ],
        )
        .unwrap();

    for idx in [client, server] {
        capture(&net.pods[idx]);
    }
    // The client speaks state-of-the-world xDS, the server Delta: both paths are exercised.
    start_agent(&mut net.pods[client], "sleep", &config_dir, false);
    start_agent(&mut net.pods[server], "httpbin", &config_dir, true);
    for idx in [client, server] {
        let ready = net.pods[idx].wait_http_ok(
            "http://127.0.0.1:15021/healthz/ready",
            Duration::from_secs(60),
        );
        assert!(ready.is_ok(), "{ready:?}\n{}", net.logs());
    }

    let url = format!("http://{VIP}:{PORT}/");
    let (code, body) = net.pods[client].http_get(APP_UID, &url).unwrap();
    assert_eq!(code, 200, "body: {body}\n{}", net.logs());
    assert_eq!(body, token);

    let out = net.pods[client]
        .envoy_stat(&format!("http.outbound_0.0.0.0_{PORT}.downstream_rq_2xx"))
        .unwrap();
    let inb = net.pods[server]
        .envoy_stat(&format!("http.inbound_0.0.0.0_{PORT}.downstream_rq_2xx"))
        .unwrap();
    assert!(
        out >= 1,
        "client outbound listener saw no request\n{}",
        net.logs()
    );
    assert!(
        inb >= 1,
        "server inbound listener saw no request\n{}",
        net.logs()
    );

    // Every generated resource was accepted, over both protocols.
    for idx in [client, server] {
        for stat in [
            "cluster_manager.cds.update_rejected",
            "listener_manager.lds.update_rejected",
        ] {
            assert_eq!(
                net.pods[idx].envoy_stat(stat).unwrap(),
                0,
                "{stat}\n{}",
                net.logs()
            );
        }
    }
    assert!(
        net.pods[client]
            .logs_of("pilot-agent")
            .contains("(state of the world)")
    );
    assert!(net.pods[server].logs_of("pilot-agent").contains("(delta)"));

    // The app's own traffic to the server, bypassing the VIP, is captured too (no escape).
    let direct = format!("http://{}:{PORT}/", net.pods[server].ip);
    let (code, _) = net.pods[client].http_get(APP_UID, &direct).unwrap();
    assert_eq!(code, 200);
    let inb_after = net.pods[server]
        .envoy_stat(&format!("http.inbound_0.0.0.0_{PORT}.downstream_rq_2xx"))
        .unwrap();
    assert!(
        inb_after > inb,
        "a direct call bypassed the server's inbound capture"
    );

    // SIGTERM: the agent drains Envoy, stops it and exits 0.
    for idx in [client, server] {
        let pod = &mut net.pods[idx];
        let agent = pod.proc("pilot-agent").unwrap();
        agent.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = agent.wait_timeout(Duration::from_secs(30)).unwrap();
        assert!(status.success(), "agent exit {status}\n{}", agent.logs());
        let left = harness::pids_named(&pod.ns, "envoy");
        assert!(
            left.is_empty(),
            "Envoy still running after agent exit: {left:?}"
        );
    }
}
