#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Workload identity end to end: real Envoys in network namespaces get their certificates from
//! the agent's SDS socket and talk mutual TLS. The server sees the client's SPIFFE identity, a
//! STRICT PeerAuthentication shuts plaintext out, certificates rotate without failing
//! connections, a CA outage during a rotation is ridden out, and no other uid can read the
//! certificates.

use std::path::Path;
use std::time::{Duration, Instant};

use harness::{Network, Pod, TestCa, binary, require_envoy, require_root, wait_ready, wait_until};

const APP_UID: u32 = 1000;
const NS: &str = "demo";
const HTTP_VIP: &str = "10.234.0.10";
const TCP_VIP: &str = "10.234.0.11";
const SERVER_SA: &str = "httpbin";
const CLIENT_SA: &str = "sleep";

fn mesh_config(dir: &Path, server_ip: &str) {
    let yaml = format!(
        r#"kind: ServiceEntry
metadata: {{name: httpbin, namespace: {NS}}}
spec:
  hosts: [httpbin.{NS}.svc.cluster.local]
  addresses: [{HTTP_VIP}]
  ports: [{{number: 8000, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: httpbin}}}}
---
kind: ServiceEntry
metadata: {{name: echo, namespace: {NS}}}
spec:
  hosts: [echo.{NS}.svc.cluster.local]
  addresses: [{TCP_VIP}]
  ports: [{{number: 9000, name: tcp, protocol: TCP}}]
  workloadSelector: {{labels: {{app: httpbin}}}}
---
kind: WorkloadEntry
metadata: {{name: httpbin-1, namespace: {NS}}}
spec: {{address: {server_ip}, labels: {{app: httpbin}}, serviceAccount: {SERVER_SA}}}
"#
    );
    std::fs::write(dir.join("mesh.yaml"), yaml).unwrap();
}

/// Where the agents get config and certificates.
enum ControlPlane<'a> {
    Embedded(&'a Path),
    Remote(&'a str),
}

fn start_agent(pod: &mut Pod, sa: &str, cp: &ControlPlane, extra_env: &[(&str, &str)]) {
    let agent = binary("pilot-agent");
    let ip = pod.ip.to_string();
    let proxy_config = match cp {
        ControlPlane::Embedded(_) => "{\"terminationDrainDuration\": \"1s\"}".to_string(),
        ControlPlane::Remote(addr) => {
            format!("{{\"terminationDrainDuration\": \"1s\", \"discoveryAddress\": \"{addr}\"}}")
        }
    };
    let mut env = vec![
        ("POD_NAME", sa),
        ("POD_NAMESPACE", NS),
        ("INSTANCE_IP", ip.as_str()),
        ("SERVICE_ACCOUNT", sa),
        ("PROXY_CONFIG", proxy_config.as_str()),
    ];
    env.extend_from_slice(extra_env);
    let mut args = vec![
        agent.to_str().unwrap().to_string(),
        "proxy".into(),
        "sidecar".into(),
        "--proxyLogLevel=warning".into(),
        "--proxyComponentLogLevel=misc:error".into(),
    ];
    if let ControlPlane::Embedded(dir) = cp {
        args.push("--configDir".into());
        args.push(dir.to_str().unwrap().into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    pod.spawn("pilot-agent", 0, 0, &env, &args).unwrap();
}

/// Client pod 2 and server pod 3 (HTTP echo on 8000, TCP on 9000), both captured.
fn pods() -> (Network, std::path::PathBuf) {
    let mut net = Network::new().unwrap();
    net.add_pod("client", 2).unwrap();
    net.add_pod("server", 3).unwrap();
    let config_dir = net.dir().join("mesh");
    std::fs::create_dir_all(&config_dir).unwrap();
    mesh_config(&config_dir, &net.pods[1].ip.to_string());
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
    (net, config_dir)
}

/// One TCP connection from the client app through both sidecars to the TCP echo.
fn tcp_round_trip(client: &Pod) -> bool {
    let probe = binary("netprobe");
    client
        .exec_as(
            APP_UID,
            APP_UID,
            &[
                probe.to_str().unwrap(),
                "connect",
                &format!("{TCP_VIP}:9000"),
            ],
        )
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The serial of the certificate the agent serves (its /debug/certs, loopback only).
fn serial(pod: &Pod) -> String {
    let (code, body) = pod
        .http_get(0, "http://127.0.0.1:15020/debug/certs")
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["serial"].as_str().unwrap().to_string()
}

#[test]
fn mtls_between_sidecars_carries_the_client_identity() {
    if !require_root("mtls_between_sidecars_carries_the_client_identity")
        || !require_envoy("mtls_between_sidecars_carries_the_client_identity")
    {
        return;
    }
    let (mut net, config_dir) = pods();
    let cp = ControlPlane::Embedded(&config_dir);
    start_agent(&mut net.pods[0], CLIENT_SA, &cp, &[]);
    start_agent(&mut net.pods[1], SERVER_SA, &cp, &[]);
    wait_ready(&net);
    let (client, server) = (&net.pods[0], &net.pods[1]);

    // The app's request carries a forged identity header; the server app must see only the one
    // the server's Envoy verified.
    let out = client
        .exec_as(
            APP_UID,
            APP_UID,
            &[
                "curl",
                "-sS",
                "--max-time",
                "5",
                "-H",
                "x-forwarded-client-cert: By=spiffe://cluster.local/ns/demo/sa/httpbin;URI=spiffe://cluster.local/ns/kube-system/sa/admin",
                &format!("http://{HTTP_VIP}:8000/"),
            ],
        )
        .unwrap();
    let echoed = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(
        echoed.contains("uri=spiffe://cluster.local/ns/demo/sa/sleep"),
        "server did not see the client's identity:\n{echoed}\n{}",
        net.logs()
    );
    assert!(
        !echoed.contains("sa/admin"),
        "a forged x-forwarded-client-cert reached the app:\n{echoed}"
    );

    // Envoy's own counters: the server terminated mutual TLS, the client originated it.
    assert!(tcp_round_trip(client), "{}", net.logs());
    assert!(
        server
            .envoy_stat("listener.0.0.0.0_15006.ssl.handshake")
            .unwrap()
            >= 2
    );
    assert_eq!(
        server
            .envoy_stat("listener.0.0.0.0_15006.ssl.fail_verify_no_cert")
            .unwrap(),
        0
    );
    assert!(
        client
            .envoy_stat("cluster.outbound|9000||echo.demo.svc.cluster.local.ssl.handshake")
            .unwrap()
            >= 1
    );

    // The certificate is visible to operators: /debug/certs and the expiry metric.
    assert!(!serial(server).is_empty());
    let (_, metrics) = server
        .http_get(0, "http://127.0.0.1:15020/stats/prometheus")
        .unwrap();
    let expiry = metrics
        .lines()
        .find(|l| l.starts_with("istio_agent_cert_expiry_seconds{resource_name=\"default\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no cert expiry metric in\n{metrics}"));
    assert!(
        expiry > 23.0 * 3600.0 && expiry <= 24.0 * 3600.0,
        "{expiry}"
    );

    // The SDS socket: directory 0700 and socket 0600, owned by the proxy uid.
    use std::os::unix::fs::MetadataExt;
    let socket = server
        .dir
        .join("var/run/secrets/workload-spiffe-uds/socket");
    let dir_meta = std::fs::metadata(socket.parent().unwrap()).unwrap();
    let sock_meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(dir_meta.mode() & 0o777, 0o700);
    assert_eq!(sock_meta.mode() & 0o777, 0o600);
    assert_eq!((dir_meta.uid(), sock_meta.uid()), (1337, 1337));

    // Another uid cannot reach the socket, and one that gets past the file permissions
    // (CAP_DAC_OVERRIDE) is refused by the peer-credential check before any byte is served.
    // The xDS socket Envoy takes its config from is guarded the same way.
    let xds = server.dir.join("etc/istio/proxy/XDS");
    let xds_meta = std::fs::metadata(&xds).unwrap();
    assert_eq!((xds_meta.mode() & 0o777, xds_meta.uid()), (0o600, 1337));
    for (path, what) in [(&socket, "SDS"), (&xds, "xDS")] {
        let script = socket_probe(path.to_str().unwrap());
        let run = |extra: &[&str]| {
            let mut args = vec![
                "setpriv",
                "--reuid",
                "1000",
                "--regid",
                "1000",
                "--clear-groups",
            ];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["--", "/usr/bin/python3", "-c", &script]);
            let out = server.exec(&args).unwrap();
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            )
        };
        assert_eq!(
            run(&[]),
            "connect 13",
            "{what}: EACCES expected for uid 1000"
        );
        let with_cap = run(&[
            "--inh-caps",
            "+dac_override",
            "--ambient-caps",
            "+dac_override",
        ]);
        assert!(
            with_cap == "read 0" || with_cap.starts_with("io-error"),
            "{what}: uid 1000 was served: {with_cap}"
        );
        assert!(
            server.wait_log(
                "pilot-agent",
                &format!("{what} connection refused"),
                Duration::from_secs(5)
            ),
            "{}",
            server.logs()
        );
        // Root (and the proxy uid, which Envoy proves) are served.
        let out = server.exec(&["/usr/bin/python3", "-c", &script]).unwrap();
        let root = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            root.starts_with("read ") && root != "read 0",
            "{what}: root was not served: {root}"
        );
    }
}

/// A Python client that connects to the Unix socket, sends an HTTP/2 preface and a SETTINGS
/// frame, and prints `read N` (bytes answered), `connect ERRNO` or `io-error ERRNO`.
fn socket_probe(sock: &str) -> String {
    format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(5)\ntry:\n    s.connect({sock:?})\nexcept OSError as e:\n    print('connect', e.errno); raise SystemExit\ntry:\n    s.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n' + bytes([0,0,0,4,0,0,0,0,0]))\n    print('read', len(s.recv(100)))\nexcept OSError as e:\n    print('io-error', e.errno)\n"
    )
}

#[test]
fn strict_peer_authentication_rejects_plaintext() {
    if !require_root("strict_peer_authentication_rejects_plaintext")
        || !require_envoy("strict_peer_authentication_rejects_plaintext")
    {
        return;
    }
    let (mut net, config_dir) = pods();
    // A pod without a sidecar.
    let legacy = net.add_pod("legacy", 4).unwrap();
    let cp = ControlPlane::Embedded(&config_dir);
    start_agent(&mut net.pods[0], CLIENT_SA, &cp, &[]);
    start_agent(&mut net.pods[1], SERVER_SA, &cp, &[]);
    wait_ready(&net);
    let server_url = format!("http://{}:8000/", net.pods[1].ip);
    let plaintext_ok = |net: &Network| {
        net.pods[legacy]
            .http_get(APP_UID, &server_url)
            .map(|(code, _)| code == 200)
            .unwrap_or(false)
    };

    // PERMISSIVE (the default): plaintext and mTLS are both accepted.
    assert!(plaintext_ok(&net), "{}", net.logs());
    assert!(tcp_round_trip(&net.pods[0]));

    std::fs::write(
        config_dir.join("strict.yaml"),
        format!(
            "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: default, namespace: {NS}}}\nspec: {{mtls: {{mode: STRICT}}}}\n"
        ),
    )
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || !plaintext_ok(&net)),
        "plaintext still accepted under STRICT\n{}",
        net.logs()
    );
    // The sidecar client still gets through, over mTLS.
    assert!(tcp_round_trip(&net.pods[0]), "{}", net.logs());
    let (code, body) = net.pods[0]
        .http_get(APP_UID, &format!("http://{HTTP_VIP}:8000/"))
        .unwrap();
    assert_eq!(code, 200, "{body}");
}

/// Runs TCP round trips from the client until `until` returns true or `limit` passes; returns
/// (attempts, failures).
fn traffic_while(client: &Pod, limit: Duration, mut until: impl FnMut() -> bool) -> (u32, u32) {
    let deadline = Instant::now() + limit;
    let (mut attempts, mut failures) = (0, 0);
    while Instant::now() < deadline && !until() {
        attempts += 1;
        if !tcp_round_trip(client) {
            failures += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (attempts, failures)
}

#[test]
fn short_lived_certificates_rotate_without_failing_connections() {
    if !require_root("short_lived_certificates_rotate_without_failing_connections")
        || !require_envoy("short_lived_certificates_rotate_without_failing_connections")
    {
        return;
    }
    let (mut net, config_dir) = pods();
    let cp = ControlPlane::Embedded(&config_dir);
    let ttl = [("SECRET_TTL", "20s")];
    start_agent(&mut net.pods[0], CLIENT_SA, &cp, &ttl);
    start_agent(&mut net.pods[1], SERVER_SA, &cp, &ttl);
    wait_ready(&net);
    let first = (serial(&net.pods[0]), serial(&net.pods[1]));
    let start = Instant::now();
    // Every round trip is a new TCP connection and so a new TLS handshake with whatever
    // certificates Envoy has at that moment. Run past the first certificates' expiry.
    let (attempts, failures) = traffic_while(&net.pods[0], Duration::from_secs(24), || false);
    assert!(start.elapsed() >= Duration::from_secs(21));
    let now = (serial(&net.pods[0]), serial(&net.pods[1]));
    assert_ne!(now.0, first.0, "client certificate never rotated");
    assert_ne!(now.1, first.1, "server certificate never rotated");
    assert!(attempts >= 20, "only {attempts} attempts");
    assert_eq!(
        failures,
        0,
        "{failures} of {attempts} connections failed\n{}",
        net.logs()
    );
    // Past the first certificates' expiry, new handshakes still succeed: Envoy has the new ones.
    assert!(tcp_round_trip(&net.pods[0]), "{}", net.logs());
    assert!(
        net.pods[1]
            .envoy_stat("listener.0.0.0.0_15006.ssl.handshake")
            .unwrap()
            >= u64::from(attempts)
    );
}

#[test]
fn ca_outage_during_rotation_keeps_traffic_and_recovers() {
    if !require_root("ca_outage_during_rotation_keeps_traffic_and_recovers")
        || !require_envoy("ca_outage_during_rotation_keeps_traffic_and_recovers")
    {
        return;
    }
    let (mut net, config_dir) = pods();
    let cp_pod = net.add_pod("cp", 5).unwrap();
    let ca = TestCa::new(&net.dir().join("ca")).unwrap();
    ca.give_token(&net.pods[0], NS, CLIENT_SA).unwrap();
    ca.give_token(&net.pods[1], NS, SERVER_SA).unwrap();
    ca.spawn_control_plane(&mut net.pods[cp_pod], &config_dir, "0.0.0.0:15010", &[])
        .unwrap();
    let cp = ControlPlane::Remote("10.233.0.5:15010");
    let ttl = [("SECRET_TTL", "24s")];
    start_agent(&mut net.pods[0], CLIENT_SA, &cp, &ttl);
    start_agent(&mut net.pods[1], SERVER_SA, &cp, &ttl);
    wait_ready(&net);
    let issued = Instant::now();
    let first = serial(&net.pods[0]);

    // The CA (and control plane) goes away before the renewal falls due (at about 12 s).
    net.pods[cp_pod]
        .proc("istiod-core")
        .unwrap()
        .signal(nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    let (attempts, failures) = traffic_while(&net.pods[0], Duration::from_secs(30), || {
        issued.elapsed() > Duration::from_secs(15)
    });
    assert_eq!(
        failures, 0,
        "{failures} of {attempts} failed while the CA was down"
    );
    assert!(
        net.pods[0].wait_log(
            "pilot-agent",
            "workload certificate request failed",
            Duration::from_secs(5)
        ),
        "renewal was never attempted\n{}",
        net.logs()
    );
    assert_eq!(
        serial(&net.pods[0]),
        first,
        "the valid certificate was dropped"
    );

    // The CA comes back: both agents renew before their certificates expire (24 s), and
    // traffic keeps flowing past that point.
    let again = ca.serve_command(&config_dir, "0.0.0.0:15010", &[]);
    let again: Vec<&str> = again.iter().map(String::as_str).collect();
    net.pods[cp_pod]
        .spawn("istiod-core-2", 0, 0, &[], &again)
        .unwrap();
    let (attempts, failures) = traffic_while(&net.pods[0], Duration::from_secs(30), || {
        issued.elapsed() > Duration::from_secs(27)
    });
    assert_eq!(
        failures,
        0,
        "{failures} of {attempts} failed around the recovery\n{}",
        net.logs()
    );
    assert_ne!(
        serial(&net.pods[0]),
        first,
        "client never renewed\n{}",
        net.logs()
    );
    assert!(tcp_round_trip(&net.pods[0]), "{}", net.logs());
}

/// `pods()` with tokens, and `istiod-core serve` with its CA in pod 5, serving TLS from the
/// CA's own root on 15012 as istiod does; returns the network, the CA and the control plane's pod.
fn pods_with_a_tls_control_plane() -> (Network, TestCa, usize) {
    let (mut net, config_dir) = pods();
    let cp_pod = net.add_pod("cp", 5).unwrap();
    let ca = TestCa::new(&net.dir().join("ca")).unwrap();
    ca.give_token(&net.pods[0], NS, CLIENT_SA).unwrap();
    ca.give_token(&net.pods[1], NS, SERVER_SA).unwrap();
    // TLS from the CA's own root on 15012, as istiod serves it.
    ca.spawn_control_plane(&mut net.pods[cp_pod], &config_dir, "0.0.0.0:15012", &[])
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || ca.root_cert().is_file()),
        "{}",
        net.logs()
    );
    (net, ca, cp_pod)
}

/// A CA that blackholes instead of refusing: its pod drops every packet to the CA port, so a
/// dial gets no answer at all (no RST, no ICMP). Each renewal attempt must give up within the
/// dial's timeouts and be retried with backoff, the valid certificate stays served (mTLS keeps
/// working on it), and once packets flow again a new certificate arrives before it expires.
#[test]
fn a_blackholed_ca_times_out_keeps_the_cert_and_recovers() {
    let test = "a_blackholed_ca_times_out_keeps_the_cert_and_recovers";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let (mut net, ca, cp_pod) = pods_with_a_tls_control_plane();
    let root = ca.root_cert().display().to_string();
    let cp = ControlPlane::Remote("10.233.0.5:15012");
    let env = [
        ("SECRET_TTL", "60s"),
        ("CA_ROOT_CA", root.as_str()),
        ("XDS_ROOT_CA", root.as_str()),
        ("ISTIOD_SAN", "istiod.istio-system.svc"),
    ];
    start_agent(&mut net.pods[0], CLIENT_SA, &cp, &env);
    start_agent(&mut net.pods[1], SERVER_SA, &cp, &env);
    wait_ready(&net);
    let issued = Instant::now();
    let first = serial(&net.pods[0]);

    let drop_rule = |op: &str| {
        let out = net.pods[cp_pod]
            .exec(&[
                "iptables", op, "INPUT", "-p", "tcp", "--dport", "15012", "-j", "DROP",
            ])
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    drop_rule("-A");
    // Renewal falls due at about 30 s. Each try costs at most the 5 s connect timeout, then 1 s,
    // 2 s... of backoff: two failed tries by about 42 s. Traffic keeps flowing meanwhile.
    let failed = |net: &Network| {
        net.pods[0]
            .logs_of("pilot-agent")
            .matches("workload certificate request failed")
            .count()
    };
    let (attempts, failures) =
        traffic_while(&net.pods[0], Duration::from_secs(50), || failed(&net) >= 2);
    let blackout = issued.elapsed();
    assert!(
        failed(&net) >= 2,
        "fewer than two failed tries in {blackout:?}: a try is stuck on the blackholed CA\n{}",
        net.logs()
    );
    assert!(
        blackout < Duration::from_secs(47),
        "two tries took until {blackout:?} after issuance"
    );
    assert_eq!(
        failures,
        0,
        "{failures} of {attempts} connections failed while the CA was blackholed\n{}",
        net.logs()
    );
    assert_eq!(
        serial(&net.pods[0]),
        first,
        "the valid certificate was dropped"
    );
    let log = net.pods[0].logs_of("pilot-agent");
    // It timed out: nothing refused the connection.
    assert!(
        log.contains("CA 10.233.0.5:15012") && log.contains("deadline has elapsed"),
        "{}",
        harness::tail(&log, 20)
    );

    // Packets flow again: a new certificate before the first expires (60 s), and mTLS on it.
    drop_rule("-D");
    assert!(
        wait_until(Duration::from_secs(15), || serial(&net.pods[0]) != first),
        "no new certificate after the CA came back ({:?} after issuance)\n{}",
        issued.elapsed(),
        net.logs()
    );
    assert!(issued.elapsed() < Duration::from_secs(60));
    assert!(tcp_round_trip(&net.pods[0]), "{}", net.logs());
}

#[test]
fn readiness_waits_for_the_workload_certificate() {
    if !require_root("readiness_waits_for_the_workload_certificate")
        || !require_envoy("readiness_waits_for_the_workload_certificate")
    {
        return;
    }
    let (mut net, config_dir) = pods();
    // Config from the embedded control plane, but a CA nobody answers on.
    let cp = ControlPlane::Embedded(&config_dir);
    start_agent(
        &mut net.pods[1],
        SERVER_SA,
        &cp,
        &[("CA_ADDR", "127.0.0.1:15010")],
    );
    let pod = &net.pods[1];
    let pending = wait_until(Duration::from_secs(30), || {
        pod.http_get(0, "http://127.0.0.1:15020/healthz/ready")
            .map(|(code, body)| code == 503 && body.contains("workload certificate not issued"))
            .unwrap_or(false)
    });
    assert!(
        pending,
        "readiness never named the certificate: {:?}\n{}",
        pod.http_get(0, "http://127.0.0.1:15020/healthz/ready"),
        net.logs()
    );
    // Envoy is up and has its clusters; they wait for the certificate.
    assert!(
        pod.envoy_stat("cluster_manager.cds.update_success")
            .unwrap()
            >= 1
    );
    // What kubelet probes is not ready either (Envoy has not opened its listeners yet).
    for _ in 0..5 {
        assert_ne!(
            pod.http_get(0, "http://127.0.0.1:15021/healthz/ready")
                .unwrap()
                .0,
            200
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, _) = pod
        .http_get(0, "http://127.0.0.1:15020/debug/certs")
        .unwrap();
    assert_eq!(code, 404);
    assert!(
        pod.logs_of("pilot-agent")
            .contains("workload certificate request failed")
    );
}

/// The root certificates Envoy holds (its admin `/certs`, `ca_cert` entries), as serials.
fn envoy_roots(pod: &Pod) -> Vec<String> {
    let (_, body) = pod.http_get(0, "http://127.0.0.1:15000/certs").unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let mut serials: Vec<String> = v["certificates"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ca_cert"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["serial_number"].as_str().map(str::to_string))
        .collect();
    serials.sort();
    serials.dedup();
    serials
}

/// §5 property 28 end to end: the mesh root file (`CA_ROOT_CA`) replaced with garbage, then
/// with an expired-free bundle again. Envoy keeps the roots it has (never an empty ROOTCA),
/// mTLS between the sidecars keeps working for new connections, and the refusal is counted in
/// `istio_agent_root_bundle_errors_total`.
#[test]
fn a_garbage_mesh_root_leaves_envoys_roots_and_mtls_in_place() {
    let test = "a_garbage_mesh_root_leaves_envoys_roots_and_mtls_in_place";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let (mut net, ca, _) = pods_with_a_tls_control_plane();
    // The client's own copy of the mesh root, as a mounted ConfigMap would be.
    let good = std::fs::read_to_string(ca.root_cert()).unwrap();
    let mesh_root = net.dir().join("client-root-cert.pem");
    harness::write_readable(&mesh_root, &good).unwrap();
    let (client_root, server_root) = (
        mesh_root.display().to_string(),
        ca.root_cert().display().to_string(),
    );
    let cp = ControlPlane::Remote("10.233.0.5:15012");
    let env_of = |root: &'static str| {
        [
            ("CA_ROOT_CA", root),
            ("XDS_ROOT_CA", root),
            ("ISTIOD_SAN", "istiod.istio-system.svc"),
        ]
    };
    let client_env = env_of(Box::leak(client_root.into_boxed_str()));
    let server_env = env_of(Box::leak(server_root.into_boxed_str()));
    start_agent(&mut net.pods[0], CLIENT_SA, &cp, &client_env);
    start_agent(&mut net.pods[1], SERVER_SA, &cp, &server_env);
    wait_ready(&net);
    assert!(
        wait_until(Duration::from_secs(20), || tcp_round_trip(&net.pods[0])),
        "no mTLS round trip before the change\n{}",
        net.logs()
    );
    let roots = envoy_roots(&net.pods[0]);
    assert!(!roots.is_empty(), "Envoy holds no root\n{}", net.logs());
    let errors = |pod: &Pod| -> u64 {
        let (_, body) = pod
            .http_get(0, "http://127.0.0.1:15020/stats/prometheus")
            .unwrap();
        body.lines()
            .find(|l| l.starts_with("istio_agent_root_bundle_errors_total "))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    assert_eq!(errors(&net.pods[0]), 0);
    std::fs::write(
        &mesh_root,
        "-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || errors(&net.pods[0]) >= 1),
        "the garbage root was not counted\n{}",
        net.logs()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(envoy_roots(&net.pods[0]), roots, "Envoy's roots changed");
    for _ in 0..3 {
        assert!(
            tcp_round_trip(&net.pods[0]),
            "an mTLS connection failed after the garbage root\n{}",
            net.logs()
        );
    }
    // The good root back: nothing more is counted, and traffic goes on.
    let counted = errors(&net.pods[0]);
    std::fs::write(&mesh_root, &good).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(errors(&net.pods[0]), counted);
    assert_eq!(envoy_roots(&net.pods[0]), roots);
    assert!(tcp_round_trip(&net.pods[0]), "{}", net.logs());
}
