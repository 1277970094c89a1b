#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! The images in pods of containers (podman), as Istio's injector lays a pod out:
//! - an init container from the proxy image running `istio-iptables` with the injector's exact
//!   args, as root with only NET_ADMIN and NET_RAW;
//! - the app container (uid 1000), and the proxy container `proxy sidecar` with the injector's
//!   args and env, as uid 1337, read-only root filesystem, no capabilities, the template's
//!   volumes (emptyDirs, root's and mode 0777 as the kubelet makes them, at /etc/istio/proxy,
//!   /var/lib/istio/data and the SPIFFE socket directories; the pod's labels and annotations at
//!   /etc/istio/pod; the token at
//!   /var/run/secrets/tokens/istio-token; the root at /var/run/secrets/istio);
//! - the control plane: the istiod-core image (`serve`, CA and TLS on 15012) in its own pod.
//!
//! Each pod's containers share a network namespace the harness made (veth to a bridge).
//! The images are built by `./scripts/image.sh --debug --tag test` (scripts/test.sh does it).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use harness::podman::{ISTIOD_IMAGE, PROXY_IMAGE, PodmanPod, podman_ok, require_images};
use harness::{
    INJECTOR_INIT_ARGS, Network, Pod, TestCa, binary, require_root, wait_until, write_readable,
};

const NS: &str = "default";
const VIP: &str = "10.234.0.80";
const SERVICE: &str = "httpbin.default.svc.cluster.local";
const ISTIOD_IP: &str = "10.233.0.2";

fn can_run(test: &str) -> bool {
    require_root(test) && require_images(test)
}

fn mesh_config(dir: &Path, server_ip: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let yaml = harness::httpbin_entries(NS, SERVICE, VIP, 8000, server_ip);
    std::fs::write(dir.join("mesh.yaml"), yaml).unwrap();
}

/// The control-plane pod: the istiod-core image serving the config directory, with its CA, on
/// 15012 (TLS from that CA), as uid 1337 on a read-only root. Returns once the root exists.
fn start_istiod(net: &Network, pod: &Pod, ca: &TestCa, config: &Path) -> PodmanPod {
    std::fs::create_dir_all(&ca.dir).unwrap();
    nix::unistd::chown(
        &ca.dir,
        Some(nix::unistd::Uid::from_raw(1337)),
        Some(nix::unistd::Gid::from_raw(1337)),
    )
    .unwrap();
    let istiod = PodmanPod::create("istiod", &pod.ns).unwrap();
    let config_mount = format!("{}:/etc/istio/mesh:ro", config.display());
    let ca_mount = format!("{}:/var/lib/istio/cacerts", ca.dir.display());
    let key_mount = format!(
        "{}:/etc/istio/sa-signer.pub:ro",
        ca.jwt_public_key.display()
    );
    istiod
        .add(
            "discovery",
            false,
            &[
                "--read-only",
                "--read-only-tmpfs=false",
                "--cap-drop",
                "ALL",
                "-v",
                &config_mount,
                "-v",
                &ca_mount,
                "-v",
                &key_mount,
            ],
            &[
                ISTIOD_IMAGE,
                "serve",
                "--config-dir",
                "/etc/istio/mesh",
                "--grpc-addr",
                "0.0.0.0:15012",
                "--ca-dir",
                "/var/lib/istio/cacerts",
                "--jwt-public-key",
                "/etc/istio/sa-signer.pub",
            ],
        )
        .unwrap();
    let started = istiod.start().unwrap();
    assert!(started.status.success(), "{started:?}");
    let root = ca.root_cert();
    assert!(
        wait_until(Duration::from_secs(30), || root.exists()),
        "no root certificate from the control plane\n{}\n{}",
        istiod.all_logs(),
        net.logs()
    );
    istiod
}

/// The injector's env for the proxy container of workload `name` (service account `name`).
fn injector_env(name: &str, ip: &str) -> Vec<String> {
    let env = [
        ("JWT_POLICY", "third-party-jwt".to_string()),
        ("PILOT_CERT_PROVIDER", "istiod".into()),
        ("CA_ADDR", "istiod.istio-system.svc:15012".into()),
        ("POD_NAME", format!("{name}-7d4f8b6c9-x2v4q")),
        ("POD_NAMESPACE", NS.into()),
        ("INSTANCE_IP", ip.into()),
        ("SERVICE_ACCOUNT", name.into()),
        ("HOST_IP", "10.233.0.1".into()),
        ("ISTIO_CPU_LIMIT", "2".into()),
        (
            "PROXY_CONFIG",
            r#"{"discoveryAddress":"istiod.istio-system.svc:15012","terminationDrainDuration":"1s"}"#
                .into(),
        ),
        (
            "ISTIO_META_POD_PORTS",
            r#"[{"containerPort":8000,"protocol":"TCP"}]"#.into(),
        ),
        ("ISTIO_META_APP_CONTAINERS", "app".into()),
        ("GOMEMLIMIT", "1073741824".into()),
        ("GOMAXPROCS", "2".into()),
        ("ISTIO_META_CLUSTER_ID", "Kubernetes".into()),
        ("ISTIO_META_NODE_NAME", "node-1".into()),
        ("ISTIO_META_INTERCEPTION_MODE", "REDIRECT".into()),
        ("ISTIO_META_WORKLOAD_NAME", name.into()),
        (
            "ISTIO_META_OWNER",
            format!("kubernetes://apis/apps/v1/namespaces/{NS}/deployments/{name}"),
        ),
        ("ISTIO_META_MESH_ID", "cluster.local".into()),
        ("TRUST_DOMAIN", "cluster.local".into()),
    ];
    env.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// A pod's init container and proxy container as the injector writes them. Host-side files
/// (token, root, downward-API files) are under `pod.dir`.
fn add_init_and_proxy(p: &PodmanPod, pod: &Pod, name: &str, ca: &TestCa, init_extra: &[&str]) {
    let files = pod.dir.join("volumes");
    write_readable(
        &files.join("tokens/istio-token"),
        ca.token(NS, name).unwrap(),
    )
    .unwrap();
    let root = std::fs::read_to_string(ca.root_cert()).unwrap();
    write_readable(&files.join("istiod-ca-cert/root-cert.pem"), &root).unwrap();
    write_readable(
        &files.join("podinfo/labels"),
        format!(
            "app=\"{name}\"\npod-template-hash=\"7d4f8b6c9\"\nsecurity.istio.io/tlsMode=\"istio\"\n"
        ),
    )
    .unwrap();
    write_readable(
        &files.join("podinfo/annotations"),
        "kubectl.kubernetes.io/default-container=\"app\"\nsidecar.istio.io/status=\"{}\"\n",
    )
    .unwrap();

    let mut init: Vec<&str> = vec![PROXY_IMAGE, "istio-iptables"];
    init.extend(INJECTOR_INIT_ARGS);
    init.push("--log_output_level=default:info");
    init.extend(init_extra);
    let init_opts = [
        "--user",
        "0:0",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "NET_ADMIN,NET_RAW",
        "--security-opt",
        "no-new-privileges",
    ];
    p.add("istio-init", true, &init_opts, &init).unwrap();

    let volume = |dir: &str, at: &str| format!("{}:{at}:ro", files.join(dir).display());
    let mounts = [
        volume("tokens", "/var/run/secrets/tokens"),
        volume("istiod-ca-cert", "/var/run/secrets/istio"),
        volume("podinfo", "/etc/istio/pod"),
    ];
    // emptyDirs as the kubelet makes them: a directory of the node, mode 0777, owned by root,
    // bind-mounted (for medium Memory the node directory is a tmpfs).
    let empty_dirs = [
        ("istio-envoy", "/etc/istio/proxy"),
        ("istio-data", "/var/lib/istio/data"),
        ("workload-socket", "/var/run/secrets/workload-spiffe-uds"),
        ("credential-socket", "/var/run/secrets/credential-uds"),
        (
            "workload-certs",
            "/var/run/secrets/workload-spiffe-credentials",
        ),
    ]
    .map(|(name, at)| {
        let dir = files.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        format!("{}:{at}", dir.display())
    });
    let env = injector_env(name, &pod.ip.to_string());
    let host = format!("istiod.istio-system.svc:{ISTIOD_IP}");
    let mut opts: Vec<&str> = vec![
        "--user",
        "1337:1337",
        "--read-only",
        "--read-only-tmpfs=false",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--add-host",
        &host,
    ];
    for m in &mounts {
        opts.extend(["-v", m.as_str()]);
    }
    for m in &empty_dirs {
        opts.extend(["-v", m.as_str()]);
    }
    for e in &env {
        opts.extend(["--env", e.as_str()]);
    }
    let domain = format!("{NS}.svc.cluster.local");
    let args = [
        PROXY_IMAGE,
        "proxy",
        "sidecar",
        "--domain",
        &domain,
        "--proxyLogLevel=warning",
        "--proxyComponentLogLevel=misc:error",
        "--log_output_level=default:info",
    ];
    p.add("istio-proxy", false, &opts, &args).unwrap();
}

/// The app container: the test probe (mounted read-only) as uid 1000 on the proxy image's
/// root filesystem, which has the C library it needs.
fn add_app(p: &PodmanPod, args: &[&str]) {
    let probe = format!("{}:/app/netprobe:ro", binary("netprobe").display());
    let mut all = vec![PROXY_IMAGE];
    all.extend(args);
    p.add(
        "app",
        false,
        &[
            "--user",
            "1000:1000",
            "--read-only",
            "--read-only-tmpfs=false",
            "--cap-drop",
            "ALL",
            "-v",
            &probe,
            "--entrypoint",
            "/app/netprobe",
        ],
        &all,
    )
    .unwrap();
}

#[test]
fn injected_pods_of_containers_talk_mtls_and_the_app_waits_for_the_proxy() {
    let test = "injected_pods_of_containers_talk_mtls_and_the_app_waits_for_the_proxy";
    if !can_run(test) {
        return;
    }
    let mut net = Network::new().unwrap();
    let cp = net.add_pod("istiod", 2).unwrap();
    let server = net.add_pod("httpbin", 3).unwrap();
    let client = net.add_pod("sleep", 4).unwrap();
    let config = net.dir().join("mesh");
    mesh_config(&config, &net.pods[server].ip.to_string());
    let ca = TestCa::new(&net.dir().join("ca")).unwrap();
    let _istiod = start_istiod(&net, &net.pods[cp], &ca, &config);

    // The server pod: init container, then app and proxy together. Its capture is Istio's
    // nftables mode (the injector's `--native-nftables` with `values.global.nativeNftables`,
    // the image's own `nft`); the client's is iptables, so the request crosses both.
    let srv = PodmanPod::create("httpbin", &net.pods[server].ns).unwrap();
    add_init_and_proxy(
        &srv,
        &net.pods[server],
        "httpbin",
        &ca,
        &["--native-nftables"],
    );
    add_app(&srv, &["http-echo", "8000"]);
    let started = srv.start().unwrap();
    assert!(started.status.success(), "{started:?}\n{}", srv.all_logs());
    assert_eq!(srv.state("istio-init").unwrap(), ("exited".into(), 0));
    let tables = net.pods[server].exec(&["nft", "list", "tables"]).unwrap();
    assert!(
        String::from_utf8_lossy(&tables.stdout).contains("table inet istio-proxy-nat"),
        "no nftables capture in the server pod: {tables:?}\n{}",
        srv.all_logs()
    );
    let ready = net.pods[server].wait_http_ok(
        "http://127.0.0.1:15021/healthz/ready",
        Duration::from_secs(60),
    );
    assert!(ready.is_ok(), "{ready:?}\n{}", srv.all_logs());

    // Envoy runs as istio-proxy (1337), started by the agent on a read-only root.
    let top = podman_ok(&["top", &srv.container("istio-proxy"), "user", "comm"]).unwrap();
    assert!(
        top.lines()
            .any(|l| l.contains("envoy") && l.contains("istio-proxy")),
        "{top}"
    );

    // The client pod with holdApplicationUntilProxyStarts: the proxy container starts first and
    // its postStart hook (`pilot-agent wait`) returns before the app container is started.
    let cli = PodmanPod::create("sleep", &net.pods[client].ns).unwrap();
    add_init_and_proxy(&cli, &net.pods[client], "sleep", &ca, &[]);
    let started = cli.start().unwrap();
    assert!(started.status.success(), "{started:?}\n{}", cli.all_logs());
    let hook = cli
        .exec("istio-proxy", &["/usr/local/bin/pilot-agent", "wait"])
        .unwrap();
    assert!(
        hook.status.success(),
        "pilot-agent wait: {hook:?}\n{}",
        cli.all_logs()
    );
    // The app's very first request (no retry) goes out through the proxy, over mTLS: the
    // server's app sees the client's verified identity.
    add_app(
        &cli,
        &["http-get", &format!("{VIP}:8000"), SERVICE, "/headers"],
    );
    podman_ok(&["start", "--attach", &cli.container("app")]).ok();
    let (state, code) = cli.state("app").unwrap();
    let out = cli.logs("app").to_ascii_lowercase();
    assert_eq!(
        (state.as_str(), code),
        ("exited", 0),
        "{out}\n{}\n{}",
        cli.all_logs(),
        srv.all_logs()
    );
    assert!(
        out.contains("uri=spiffe://cluster.local/ns/default/sa/sleep"),
        "the server did not see the client's identity:\n{out}"
    );
}

#[test]
fn a_failing_init_container_keeps_the_pod_from_starting() {
    let test = "a_failing_init_container_keeps_the_pod_from_starting";
    if !can_run(test) {
        return;
    }
    let mut net = Network::new().unwrap();
    let i = net.add_pod("bad", 5).unwrap();
    let ca = TestCa::new(&net.dir().join("ca")).unwrap();
    // No control plane is needed: nothing after the init container may start. The root file
    // the proxy container would mount is a placeholder.
    write_readable(&ca.root_cert(), "unused").unwrap();
    let p = PodmanPod::create("bad", &net.pods[i].ns).unwrap();
    add_init_and_proxy(
        &p,
        &net.pods[i],
        "bad",
        &ca,
        &["--probe-timeout", "9999999999999999h"],
    );
    add_app(&p, &["http-echo", "8000"]);
    let started = p.start().unwrap();
    assert!(!started.status.success(), "the pod started: {started:?}");
    let (state, code) = p.state("istio-init").unwrap();
    assert_eq!(state, "exited");
    assert_ne!(code, 0);
    let logs = p.logs("istio-init");
    assert!(
        logs.contains("9999999999999999h"),
        "the error does not name the input: {logs}"
    );
    for c in ["istio-proxy", "app"] {
        assert_eq!(
            p.state(c).unwrap().0,
            "created",
            "{c} ran although the init container failed"
        );
    }
    // No state change: the namespace has no capture rules.
    let rules = net.pods[i]
        .exec(&["sh", "-c", "iptables-nft-save; iptables-legacy-save"])
        .unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout);
    assert!(!rules.contains("ISTIO"), "{rules}");
}
