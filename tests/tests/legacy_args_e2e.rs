#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! pilot-agent started with the exact args Istio 1.5's injector gave the istio-proxy container
//! (only the paths a test must change: the Envoy binary, the config directory in the pod, and
//! the control plane, an `istiod-core serve` started here). The proxy gets ready and Envoy runs
//! with what the flags say: admin on --proxyAdminPort, --concurrency and --drainDuration on
//! its command line (--parentShutdownDuration is checked and, as by Istio's 1.31 agent, not
//! passed on: Envoy keeps its default), --serviceCluster, --connectTimeout on the
//! xds-grpc cluster, the --zipkinAddress tracer refreshed at --dnsRefreshRate, the trust domain
//! in the workload certificate, and --controlPlaneAuthPolicy NONE as plaintext xDS on a port
//! that is otherwise dialled over TLS.

use std::time::Duration;

use harness::{Network, TestCa, binary, envoy_path, require_envoy, require_root};

const SERVICE: &str = r#"
kind: ServiceEntry
metadata: {name: web, namespace: default}
spec:
  hosts: [web.default.svc.cluster.local]
  addresses: [10.234.0.20]
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 10.233.0.9}]
"#;

/// The istio-proxy args of an Istio 1.5.0 pod (`kubectl describe pod`), `$(POD_NAMESPACE)`
/// expanded; CONFIG_PATH, BINARY_PATH and DISCOVERY are replaced by the test.
const ISTIO_1_5_ARGS: &str = "proxy sidecar --domain default.svc.cluster.local \
    --configPath CONFIG_PATH --binaryPath BINARY_PATH \
    --serviceCluster sidecar-test.default --drainDuration 45s --parentShutdownDuration 1m0s \
    --discoveryAddress DISCOVERY --zipkinAddress zipkin.istio-system:9411 \
    --proxyLogLevel=warning --proxyComponentLogLevel=misc:error --connectTimeout 10s \
    --proxyAdminPort 15000 --concurrency 2 --controlPlaneAuthPolicy NONE \
    --dnsRefreshRate 300s --statusPort 15020 --trust-domain=cluster.local \
    --controlPlaneBootstrap=false";

/// Plaintext xDS, on a port that is not 15010: without the auth policy the agent would dial it
/// over TLS and never get config.
const XDS_ADDR: &str = "127.0.0.1:15013";
/// The CA (and a second control plane nobody asks for xDS), plaintext as on Istio's 15010.
const CA_ADDR: &str = "127.0.0.1:15010";

fn static_cluster<'a>(dump: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    dump["configs"][0]["bootstrap"]["static_resources"]["clusters"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no static cluster {name} in the bootstrap"))
}

#[test]
fn istio_1_5_injector_args_take_effect() {
    if !require_root("istio_1_5_injector_args_take_effect")
        || !require_envoy("istio_1_5_injector_args_take_effect")
    {
        return;
    }
    let mut net = Network::new().unwrap();
    let idx = net.add_pod("pod", 2).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    std::fs::write(mesh.join("web.yaml"), SERVICE).unwrap();
    let ca = TestCa::new(&net.dir().join("ca")).unwrap();
    let pod = &mut net.pods[idx];
    // Nothing answers DNS in the pod: the zipkin host stays unresolved, as a mesh without
    // Zipkin's service would leave it, and no query leaves the namespace.
    pod.set_resolv_conf("nameserver 127.0.0.1\n").unwrap();
    ca.give_token(pod, "default", "default").unwrap();
    let ca_cmd = ca.serve_command(&mesh, CA_ADDR, &[]);
    let ca_cmd: Vec<&str> = ca_cmd.iter().map(String::as_str).collect();
    pod.spawn("istiod-ca", 0, 0, &[], &ca_cmd).unwrap();
    let istiod = binary("istiod-core");
    let mesh_dir = mesh.display().to_string();
    pod.spawn(
        "istiod-core",
        0,
        0,
        &[],
        &[
            istiod.to_str().unwrap(),
            "serve",
            "--config-dir",
            &mesh_dir,
            "--grpc-addr",
            XDS_ADDR,
        ],
    )
    .unwrap();

    let config_path = pod.dir.join("etc/istio/proxy");
    let args = ISTIO_1_5_ARGS
        .replace("CONFIG_PATH", config_path.to_str().unwrap())
        .replace("BINARY_PATH", &envoy_path())
        .replace("DISCOVERY", XDS_ADDR);
    let agent = binary("pilot-agent");
    let mut argv = vec![agent.to_str().unwrap()];
    argv.extend(args.split_whitespace());
    let ip = pod.ip.to_string();
    pod.spawn(
        "pilot-agent",
        0,
        0,
        &[
            ("POD_NAME", "sidecar-test"),
            ("POD_NAMESPACE", "default"),
            ("INSTANCE_IP", &ip),
            ("SERVICE_ACCOUNT", "default"),
            ("CA_ADDR", CA_ADDR),
        ],
        &argv,
    )
    .unwrap();

    let ready = pod.wait_http_ok(
        "http://127.0.0.1:15021/healthz/ready",
        Duration::from_secs(60),
    );
    assert!(ready.is_ok(), "{ready:?}\n{}", pod.logs());
    let agent_log = pod.logs_of("pilot-agent");
    assert!(
        !agent_log.contains("ignoring unknown flag"),
        "a 1.5 flag was ignored\n{agent_log}"
    );
    // --statusPort: the agent's readiness.
    assert_eq!(
        pod.http_get(0, "http://127.0.0.1:15020/healthz/ready")
            .unwrap()
            .0,
        200
    );
    // --controlPlaneAuthPolicy NONE: config arrived over plaintext from XDS_ADDR.
    let (_, clusters) = pod.http_get(0, "http://127.0.0.1:15000/clusters").unwrap();
    assert!(
        clusters.contains("outbound|80||web.default.svc.cluster.local"),
        "{clusters}\n{}",
        pod.logs()
    );
    // --configPath: the bootstrap is written there.
    assert!(config_path.join("envoy-rev.json").exists());

    // --proxyAdminPort, --concurrency, --drainDuration and --serviceCluster, as Envoy reports
    // its command line; --parentShutdownDuration is not on it (Istio's 1.31 agent stopped
    // passing it; with hot restart off it has no effect): Envoy's default.
    let (code, info) = pod
        .http_get(0, "http://127.0.0.1:15000/server_info")
        .unwrap();
    assert_eq!(code, 200, "{info}");
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let opts = &info["command_line_options"];
    assert_eq!(opts["concurrency"], 2, "{opts}");
    assert_eq!(opts["drain_time"], "45s", "{opts}");
    assert_eq!(opts["parent_shutdown_time"], "900s", "{opts}");
    assert_eq!(info["node"]["cluster"], "sidecar-test.default", "{info}");

    // --connectTimeout on xds-grpc; --zipkinAddress and --dnsRefreshRate as the zipkin cluster
    // and tracer of Istio 1.5's bootstrap.
    let (_, dump) = pod
        .http_get(0, "http://127.0.0.1:15000/config_dump")
        .unwrap();
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    assert_eq!(static_cluster(&dump, "xds-grpc")["connect_timeout"], "10s");
    let zipkin = static_cluster(&dump, "zipkin");
    assert_eq!(zipkin["dns_refresh_rate"], "300s", "{zipkin}");
    assert_eq!(
        zipkin["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"],
        serde_json::json!({"address": "zipkin.istio-system", "port_value": 9411}),
        "{zipkin}"
    );
    let tracing = &dump["configs"][0]["bootstrap"]["tracing"]["http"];
    assert_eq!(tracing["name"], "envoy.tracers.zipkin", "{tracing}");
    assert_eq!(tracing["typed_config"]["collector_cluster"], "zipkin");

    // --trust-domain: the SPIFFE identity of the workload certificate the CA issued.
    let (_, certs) = pod
        .http_get(0, "http://127.0.0.1:15020/debug/certs")
        .unwrap();
    assert!(
        certs.contains("spiffe://cluster.local/ns/default/sa/default"),
        "{certs}"
    );

    let agent = pod.proc("pilot-agent").unwrap();
    agent.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = agent.wait_timeout(Duration::from_secs(60)).unwrap();
    assert!(status.success(), "agent exit {status}\n{}", agent.logs());
}
