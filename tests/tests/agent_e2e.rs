#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! pilot-agent with a real Envoy against a standalone istiod-core: readiness stays 503 (with the
//! reason) while the control plane is down, turns 200 once it serves, config edits reach Envoy
//! without a restart, and a bad edit keeps the last good config.

use std::time::{Duration, Instant};

use harness::{Network, binary, require_envoy, require_root};

const SERVICE: &str = r#"
kind: ServiceEntry
metadata: {name: web, namespace: demo}
spec:
  hosts: [web.demo.svc.cluster.local]
  addresses: [10.234.0.20]
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 10.233.0.9}]
"#;

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

#[test]
fn readiness_follows_the_control_plane_and_config_edits() {
    if !require_root("readiness_follows_the_control_plane_and_config_edits")
        || !require_envoy("readiness_follows_the_control_plane_and_config_edits")
    {
        return;
    }
    let mut net = Network::new().unwrap();
    let idx = net.add_pod("pod", 2).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    std::fs::write(mesh.join("web.yaml"), SERVICE).unwrap();
    let agent = binary("pilot-agent");
    let istiod = binary("istiod-core");
    let pod = &mut net.pods[idx];
    pod.spawn(
        "pilot-agent",
        0,
        0,
        &[
            ("POD_NAME", "client"),
            ("POD_NAMESPACE", "demo"),
            ("INSTANCE_IP", "10.233.0.2"),
            (
                "PROXY_CONFIG",
                "{\"discoveryAddress\": \"127.0.0.1:15010\", \"terminationDrainDuration\": \"1s\"}",
            ),
        ],
        &[agent.to_str().unwrap(), "proxy", "sidecar"],
    )
    .unwrap();

    // Control plane down: Envoy is up but has no config; the agent's readiness says why, and
    // Envoy's 15021 (what kubelet probes) is not 200.
    let ready = "http://127.0.0.1:15021/healthz/ready";
    let agent_ready = "http://127.0.0.1:15020/healthz/ready";
    let saw_503 = wait_until(Duration::from_secs(30), || {
        let (code, body) = pod.http_get(0, agent_ready).unwrap();
        code == 503 && body.contains("config not received")
    });
    assert_ne!(pod.http_get(0, ready).unwrap().0, 200);
    assert!(
        saw_503,
        "no 503 with a reason while istiod is down\n{}",
        pod.logs()
    );

    let mesh_arg = mesh.to_str().unwrap().to_string();
    pod.spawn(
        "istiod-core",
        0,
        0,
        &[],
        &[
            istiod.to_str().unwrap(),
            "serve",
            "--config-dir",
            &mesh_arg,
            "--grpc-addr",
            "127.0.0.1:15010",
        ],
    )
    .unwrap();
    let became_ready = pod.wait_http_ok(ready, Duration::from_secs(60));
    assert!(became_ready.is_ok(), "{became_ready:?}\n{}", pod.logs());

    let has_cluster = |name: &str| {
        let (_, body) = pod.http_get(0, "http://127.0.0.1:15000/clusters").unwrap();
        body.contains(name)
    };
    assert!(has_cluster("outbound|80||web.demo.svc.cluster.local"));

    // An edit is pushed without a restart.
    std::fs::write(
        mesh.join("api.yaml"),
        SERVICE
            .replace("web", "api")
            .replace("10.234.0.20", "10.234.0.21"),
    )
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || has_cluster(
            "outbound|80||api.demo.svc.cluster.local"
        )),
        "new service never reached Envoy\n{}",
        pod.logs()
    );

    // A broken file is rejected by name and the last good config stays.
    std::fs::write(
        mesh.join("broken.yaml"),
        "kind: ServiceEntry\nmetadata: {name: x}\nspec: {hosts: []}\n",
    )
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || pod
            .logs_of("istiod-core")
            .contains("broken.yaml")),
        "bad config was not reported by file name\n{}",
        pod.logs()
    );
    assert!(has_cluster("outbound|80||api.demo.svc.cluster.local"));
    assert_eq!(pod.http_get(0, ready).unwrap().0, 200);

    let agent = pod.proc("pilot-agent").unwrap();
    agent.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = agent.wait_timeout(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "agent exit {status}\n{}", agent.logs());
}
