#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! The sidecar path end to end, with real iptables, real Envoy and the real binaries given the
//! args and env Istio's injector writes: a client pod calls a server pod by its service VIP and
//! the request must pass through the client's outbound and the server's inbound listener.

use std::path::Path;
use std::time::Duration;

use harness::{Network, Pod, binary, require_envoy, require_root, wait_ready};

const APP_UID: u32 = 1000;
const NAMESPACE: &str = "demo";
const VIP: &str = "10.234.0.10";
const PORT: u16 = 8000;

/// The httpbin service of the server pod.
fn httpbin_mesh(server_ip: &str) -> String {
    format!(
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
    )
}

fn capture(pod: &Pod) {
    harness::istio_iptables(pod, &["--log_output_level=default:info"]).unwrap();
}

/// A client pod (10.233.0.2, index 0) and a server pod (10.233.0.3, index 1), both with capture
/// on, and a config directory holding `mesh(server_ip)`.
fn two_pods(mesh: impl FnOnce(&str) -> String) -> (Network, std::path::PathBuf) {
    let mut net = Network::new().unwrap();
    net.add_pod("client", 2).unwrap();
    net.add_pod("server", 3).unwrap();
    let config_dir = net.dir().join("mesh");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(
        config_dir.join("mesh.yaml"),
        mesh(&net.pods[1].ip.to_string()),
    )
    .unwrap();
    for pod in &net.pods {
        capture(pod);
    }
    (net, config_dir)
}

/// Waits (5 s at most) for an Envoy counter to reach 1: Envoy counts a request when its
/// stream completes, which may be just after the client has the whole response.
fn counted(pod: &Pod, stat: &str) -> bool {
    harness::wait_until(Duration::from_secs(5), || {
        pod.envoy_stat(stat).is_ok_and(|n| n >= 1)
    })
}

/// Runs the pod's app as APP_UID: a static web server on `bind:port` whose page is `body`.
fn serve_page(pod: &mut Pod, bind: &str, port: u16, body: &str) {
    let www = pod.dir.join(format!("www-{port}"));
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), body).unwrap();
    let www = www.to_str().unwrap().to_string();
    pod.spawn(
        "app",
        APP_UID,
        APP_UID,
        &[],
        &[
            "/usr/bin/python3",
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            bind,
            "--directory",
            &www,
        ],
    )
    .unwrap();
}

/// Where an agent gets its config: the embedded control plane on a directory, or a remote
/// `istiod-core serve` address.
enum Upstream<'a> {
    Embedded(&'a Path),
    Remote(&'a str),
}

/// `delta`: Delta xDS (Istio's default) or state of the world (ISTIO_DELTA_XDS=false).
fn start_agent(pod: &mut Pod, name: &str, config_dir: &Path, delta: bool) {
    start_agent_with(pod, name, Upstream::Embedded(config_dir), delta, "1s");
}

fn start_agent_with(pod: &mut Pod, name: &str, upstream: Upstream, delta: bool, drain: &str) {
    let proxy_config = format!("\"terminationDrainDuration\": \"{drain}\"");
    start_agent_env(pod, name, upstream, delta, &proxy_config, &[]);
}

/// `proxy_config`: the ProxyConfig JSON fields (without braces); `env`: more of the container's
/// environment.
fn start_agent_env(
    pod: &mut Pod,
    name: &str,
    upstream: Upstream,
    delta: bool,
    proxy_config: &str,
    env: &[(&str, &str)],
) {
    let agent = binary("pilot-agent");
    let ip = pod.ip.to_string();
    let (config_dir, proxy_config) = match upstream {
        Upstream::Embedded(dir) => (
            Some(dir.to_str().unwrap().to_string()),
            format!("{{{proxy_config}}}"),
        ),
        Upstream::Remote(addr) => (
            None,
            format!("{{{proxy_config}, \"discoveryAddress\": \"{addr}\"}}"),
        ),
    };
    let env: Vec<(&str, &str)> = [
        ("POD_NAME", name),
        ("POD_NAMESPACE", NAMESPACE),
        ("INSTANCE_IP", &ip),
        ("SERVICE_ACCOUNT", name),
        ("ISTIO_META_CLUSTER_ID", "Kubernetes"),
        ("PROXY_CONFIG", &proxy_config),
        ("ISTIO_DELTA_XDS", if delta { "true" } else { "false" }),
    ]
    .into_iter()
    .chain(env.iter().copied())
    .collect();
    pod.spawn(
        "pilot-agent",
        0,
        0,
        &env,
        &[
            agent.to_str().unwrap(),
            "proxy",
            "sidecar",
            "--domain",
            &format!("{NAMESPACE}.svc.cluster.local"),
            "--proxyLogLevel=warning",
            "--proxyComponentLogLevel=misc:error",
            "--log_output_level=default:info",
        ]
        .into_iter()
        .chain(
            config_dir
                .as_deref()
                .map(|d| ["--configDir", d])
                .into_iter()
                .flatten(),
        )
        .collect::<Vec<_>>(),
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
    let (mut net, config_dir) = two_pods(httpbin_mesh);
    let (client, server) = (0, 1);

    // The app: serves a file with a token only this test knows.
    let token = format!("token-{}", std::process::id());
    serve_page(&mut net.pods[server], "0.0.0.0", PORT, &token);

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

/// A two-pod mesh (client 10.233.0.2, server 10.233.0.3 with `app` on :8000) with capture on.
fn mesh(app: &[&str]) -> (Network, std::path::PathBuf) {
    let (mut net, config_dir) = two_pods(httpbin_mesh);
    net.pods[1]
        .spawn("app", APP_UID, APP_UID, &[], app)
        .unwrap();
    (net, config_dir)
}

const SLOW_APP: &str = r#"
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(float(self.path.strip('/') or 0))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'done')
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()
"#;

#[test]
fn sigterm_lets_an_inflight_request_finish() {
    if !require_root("sigterm_lets_an_inflight_request_finish")
        || !require_envoy("sigterm_lets_an_inflight_request_finish")
    {
        return;
    }
    let (mut net, config_dir) = mesh(&["/usr/bin/python3", "-c", SLOW_APP]);
    start_agent_with(
        &mut net.pods[0],
        "sleep",
        Upstream::Embedded(&config_dir),
        true,
        "5s",
    );
    start_agent_with(
        &mut net.pods[1],
        "httpbin",
        Upstream::Embedded(&config_dir),
        true,
        "5s",
    );
    wait_ready(&net);
    let client_ns = net.pods[0].ns.clone();
    let request = std::thread::spawn(move || {
        std::process::Command::new("ip")
            .args([
                "netns", "exec", &client_ns, "setpriv", "--reuid", "1000", "--regid", "1000",
            ])
            .args([
                "--clear-groups",
                "--",
                "curl",
                "-sS",
                "--max-time",
                "20",
                "-w",
                " %{http_code}",
            ])
            .arg(format!("http://{VIP}:{PORT}/2"))
            .output()
            .unwrap()
    });
    // Let the request reach the server app, then stop the server's sidecar.
    std::thread::sleep(Duration::from_millis(700));
    let start = std::time::Instant::now();
    let agent = net.pods[1].proc("pilot-agent").unwrap();
    agent.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = request.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        text,
        "done 200",
        "in-flight request failed during drain: {text}\n{}",
        net.logs()
    );
    let agent = net.pods[1].proc("pilot-agent").unwrap();
    let status = agent.wait_timeout(Duration::from_secs(30)).unwrap();
    assert!(status.success());
    // The agent waited the configured termination drain (5s) before stopping Envoy.
    assert!(
        start.elapsed() >= Duration::from_secs(4),
        "stopped after {:?}",
        start.elapsed()
    );
}

/// During the drain that SIGTERM starts, the proxy reports itself unready on 15020 while the
/// app's outbound requests still go through Envoy (Istio drains inbound listeners only); the
/// agent exits 0 once the termination drain duration has passed.
#[test]
fn during_the_sigterm_drain_readiness_is_503_and_outbound_still_works() {
    let test = "during_the_sigterm_drain_readiness_is_503_and_outbound_still_works";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let (mut net, config_dir) = two_pods(httpbin_mesh);
    let (client, server) = (0, 1);
    let token = format!("token-{}", std::process::id());
    serve_page(&mut net.pods[server], "0.0.0.0", PORT, &token);
    start_agent_with(
        &mut net.pods[client],
        "sleep",
        Upstream::Embedded(&config_dir),
        true,
        "8s",
    );
    start_agent(&mut net.pods[server], "httpbin", &config_dir, true);
    wait_ready(&net);
    let url = format!("http://{VIP}:{PORT}/");
    let outbound = format!("http.outbound_0.0.0.0_{PORT}.downstream_rq_2xx");
    let (code, body) = net.pods[client].http_get(APP_UID, &url).unwrap();
    assert_eq!(
        (code, body.as_str()),
        (200, token.as_str()),
        "{}",
        net.logs()
    );
    let before = net.pods[client].envoy_stat(&outbound).unwrap();

    let start = std::time::Instant::now();
    let agent = net.pods[client].proc("pilot-agent").unwrap();
    agent.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(
        net.pods[client].wait_log("pilot-agent", "stopping Envoy", Duration::from_secs(5)),
        "{}",
        net.logs()
    );
    let pod = &net.pods[client];
    let (code, why) = pod
        .http_get(0, "http://127.0.0.1:15020/healthz/ready")
        .unwrap();
    assert_eq!(code, 503, "ready during the drain: {why}");
    assert!(why.contains("shutting down"), "{why}");
    for _ in 0..3 {
        let (code, body) = pod.http_get(APP_UID, &url).unwrap();
        assert_eq!(
            (code, body.as_str()),
            (200, token.as_str()),
            "outbound failed during the drain\n{}",
            net.logs()
        );
    }
    // Only inbound listeners drain: an outbound response is not marked to close its connection
    // (Envoy's immediate drain strategy marks every response of a draining listener).
    let out = pod
        .exec_as(
            APP_UID,
            APP_UID,
            &[
                "curl",
                "-sS",
                "--max-time",
                "5",
                "-D",
                "-",
                "-o",
                "/dev/null",
                &url,
            ],
        )
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        !head.contains("connection: close"),
        "the outbound listener is draining: {head}"
    );
    // The requests went through the client's Envoy, still draining.
    let after = pod.envoy_stat(&outbound).unwrap();
    assert!(after >= before + 4, "outbound 2xx {before} -> {after}");
    let during = start.elapsed();
    assert!(
        during < Duration::from_secs(7),
        "checks took {during:?}: not within the 8s drain"
    );
    let agent = net.pods[client].proc("pilot-agent").unwrap();
    assert!(agent.running(), "the agent stopped before its drain ended");
    let status = agent.wait_timeout(Duration::from_secs(20)).unwrap();
    assert!(status.success(), "agent exit {status}\n{}", agent.logs());
    assert!(
        start.elapsed() >= Duration::from_secs(7),
        "stopped after {:?}, before the 8s termination drain",
        start.elapsed()
    );
}

/// An app that says when each request arrives, then answers after `/<seconds>`.
const SLOW_APP_SAYS: &str = r#"
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("request", self.path, flush=True)
        time.sleep(float(self.path.strip('/') or 0))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'done')
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()
"#;

/// A plain (sidecar-less) client's GET from `client` to `url`, on its own thread:
/// curl's body and status.
fn get_in_background(client: &Pod, url: String) -> std::thread::JoinHandle<String> {
    let ns = client.ns.clone();
    std::thread::spawn(move || {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "curl", "-sS", "--max-time", "40"])
            .args(["-w", " %{http_code}", &url])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
}

/// EXIT_ON_ZERO_ACTIVE_CONNECTIONS: after SIGTERM the agent waits the minimum drain, then until
/// Envoy's last inbound connection has closed (not the 60s termination drain), and no longer
/// than drainDuration when a connection never closes. Two server pods: `a` serves a 6 s request,
/// `b` (drainDuration 6s) a 30 s one; a sidecar-less client calls both.
#[test]
fn exit_on_zero_active_connections_waits_for_the_last_connection_within_a_bound() {
    let test = "exit_on_zero_active_connections_waits_for_the_last_connection_within_a_bound";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("client", 2).unwrap();
    let (a, b) = (
        net.add_pod("server-a", 3).unwrap(),
        net.add_pod("server-b", 4).unwrap(),
    );
    let config_dir = net.dir().join("mesh");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(config_dir.join("mesh.yaml"), httpbin_mesh("10.233.0.3")).unwrap();
    for (idx, max) in [(a, "45s"), (b, "6s")] {
        let pod = &mut net.pods[idx];
        capture(pod);
        pod.spawn(
            "app",
            APP_UID,
            APP_UID,
            &[],
            &["/usr/bin/python3", "-c", SLOW_APP_SAYS],
        )
        .unwrap();
        start_agent_env(
            pod,
            "httpbin",
            Upstream::Embedded(&config_dir),
            true,
            &format!("\"terminationDrainDuration\": \"60s\", \"drainDuration\": \"{max}\""),
            &[
                ("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "true"),
                ("MINIMUM_DRAIN_DURATION", "2s"),
            ],
        );
    }
    wait_ready(&net);
    let short = get_in_background(&net.pods[0], format!("http://10.233.0.3:{PORT}/6"));
    let long = get_in_background(&net.pods[0], format!("http://10.233.0.4:{PORT}/30"));
    for idx in [a, b] {
        assert!(
            net.pods[idx].wait_log("app", "request", Duration::from_secs(10)),
            "{}",
            net.logs()
        );
    }
    let start = std::time::Instant::now();
    for idx in [a, b] {
        let agent = net.pods[idx].proc("pilot-agent").unwrap();
        agent.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    }
    // Past the minimum drain, the open connections keep both proxies up.
    std::thread::sleep(Duration::from_millis(3500));
    for idx in [a, b] {
        let agent = net.pods[idx].proc("pilot-agent").unwrap();
        assert!(
            agent.running(),
            "the agent exited with a connection open\n{}",
            agent.logs()
        );
    }
    // a: the request finishes through the draining proxy, which then stops soon after.
    let text = short.join().unwrap();
    let finished = start.elapsed();
    assert_eq!(text, "done 200", "{}", net.logs());
    let agent = net.pods[a].proc("pilot-agent").unwrap();
    let status = agent.wait_timeout(Duration::from_secs(10)).unwrap();
    let exited = start.elapsed();
    assert!(status.success(), "agent exit {status}\n{}", agent.logs());
    assert!(
        exited - finished < Duration::from_secs(5),
        "exited {:?} after the last connection closed",
        exited - finished
    );
    assert!(
        agent.logs().contains("waiting for connections to drain"),
        "{}",
        agent.logs()
    );
    // b: the wait ends at the bound (2s + 6s), the 30 s request still open.
    let agent = net.pods[b].proc("pilot-agent").unwrap();
    let status = agent.wait_timeout(Duration::from_secs(20)).unwrap();
    let exited = start.elapsed();
    assert!(status.success(), "agent exit {status}\n{}", agent.logs());
    assert!(
        exited >= Duration::from_secs(7) && exited < Duration::from_secs(16),
        "b exited after {exited:?}, not at its 8s bound"
    );
    let text = long.join().unwrap();
    assert_ne!(text, "done 200", "the 30 s request outlived its proxy");
}

/// How long the control plane is away (§5 property 20: istiod gone for 60 s), and how long
/// requests are sent: from a second before the kill to a few seconds after the restart.
const OUTAGE: Duration = Duration::from_secs(60);
const LOAD_FOR: Duration = Duration::from_secs(64);

/// The control plane killed (SIGKILL) and away for a minute: no request fails meanwhile (Envoy
/// keeps its last config), and once a new one serves, both proxies converge on it.
#[test]
fn control_plane_restart_fails_no_request() {
    if !require_root("control_plane_restart_fails_no_request")
        || !require_envoy("control_plane_restart_fails_no_request")
    {
        return;
    }
    let www = std::env::temp_dir().join(format!("istt-www-{}", std::process::id()));
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), "ok").unwrap();
    let (mut net, config_dir) = mesh(&[
        "/usr/bin/python3",
        "-m",
        "http.server",
        "8000",
        "--bind",
        "0.0.0.0",
        "--directory",
        www.to_str().unwrap(),
    ]);
    let cp = net.add_pod("cp", 4).unwrap();
    let ca = harness::TestCa::new(&net.dir().join("ca")).unwrap();
    ca.give_token(&net.pods[0], NAMESPACE, "sleep").unwrap();
    ca.give_token(&net.pods[1], NAMESPACE, "httpbin").unwrap();
    ca.spawn_control_plane(&mut net.pods[cp], &config_dir, "0.0.0.0:15010", &[])
        .unwrap();
    start_agent_with(
        &mut net.pods[0],
        "sleep",
        Upstream::Remote("10.233.0.4:15010"),
        true,
        "1s",
    );
    start_agent_with(
        &mut net.pods[1],
        "httpbin",
        Upstream::Remote("10.233.0.4:15010"),
        false,
        "1s",
    );
    wait_ready(&net);

    let client_ns = net.pods[0].ns.clone();
    let load = std::thread::spawn(move || {
        let mut codes = Vec::new();
        let deadline = std::time::Instant::now() + LOAD_FOR;
        while std::time::Instant::now() < deadline {
            let out = std::process::Command::new("ip")
                .args([
                    "netns", "exec", &client_ns, "setpriv", "--reuid", "1000", "--regid", "1000",
                ])
                .args([
                    "--clear-groups",
                    "--",
                    "curl",
                    "-sS",
                    "-o",
                    "/dev/null",
                    "--max-time",
                    "5",
                ])
                .args(["-w", "%{http_code}", &format!("http://{VIP}:{PORT}/")])
                .output()
                .unwrap();
            let at = std::time::Instant::now().duration_since(deadline - LOAD_FOR);
            codes.push(format!(
                "{}@{at:?} {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            std::thread::sleep(Duration::from_millis(50));
        }
        codes
    });
    std::thread::sleep(Duration::from_secs(1));
    net.pods[cp]
        .proc("istiod-core")
        .unwrap()
        .signal(nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    std::thread::sleep(OUTAGE);
    let again = ca.serve_command(&config_dir, "0.0.0.0:15010", &[]);
    let again: Vec<&str> = again.iter().map(String::as_str).collect();
    net.pods[cp]
        .spawn("istiod-core-2", 0, 0, &[], &again)
        .unwrap();
    let codes = load.join().unwrap();
    let _ = std::fs::remove_dir_all(&www);
    assert!(
        codes.len() >= 10,
        "too few requests to judge: {}",
        codes.len()
    );
    let failed: Vec<&String> = codes.iter().filter(|c| !c.starts_with("200@")).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}\n{}",
        failed.len(),
        codes.len(),
        net.logs()
    );

    // Envoy converges on the restarted control plane: a new service reaches both proxies.
    std::fs::write(
        config_dir.join("extra.yaml"),
        "kind: ServiceEntry\nmetadata: {name: extra, namespace: demo}\nspec:\n  hosts: [extra.example]\n  addresses: [10.234.0.99]\n  ports: [{number: 9090, name: tcp}]\n  endpoints: [{address: 10.233.0.3}]\n",
    )
    .unwrap();
    // After a minute away, Envoy's own redial backoff (500 ms doubling to 30 s, jittered) and
    // the agent's (to 15 s) may each take their longest wait before the new control plane is
    // dialled: convergence is given 90 s.
    for idx in [0, 1] {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let mut seen = false;
        while !seen && std::time::Instant::now() < deadline {
            let (_, body) = net.pods[idx]
                .http_get(0, "http://127.0.0.1:15000/clusters")
                .unwrap();
            seen = body.contains("outbound|9090||extra.example");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(
            seen,
            "pod {idx} never received the new service after the restart\n{}",
            net.logs()
        );
    }
}

/// WorkloadEntry auto-registration on a VM: no WorkloadEntry in the config, only a
/// WorkloadGroup; the agent runs with `ISTIO_META_AUTO_REGISTER_GROUP` (as `istioctl x workload
/// entry configure --autoregister` sets it) and its workload becomes the service's endpoint, so
/// a call to the service VIP reaches the app through both of the proxy's listeners.
#[test]
fn a_vm_registers_itself_in_its_workload_group() {
    if !require_root("a_vm_registers_itself_in_its_workload_group")
        || !require_envoy("a_vm_registers_itself_in_its_workload_group")
    {
        return;
    }
    let mut net = Network::new().unwrap();
    let vm = net.add_pod("vm", 2).unwrap();
    let config_dir = net.dir().join("mesh");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(
        config_dir.join("mesh.yaml"),
        format!(
            r#"kind: ServiceEntry
metadata: {{name: vm-svc, namespace: {NAMESPACE}}}
spec:
  hosts: [vm-svc.{NAMESPACE}.svc.cluster.local]
  addresses: [{VIP}]
  ports: [{{number: {PORT}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: vm}}}}
---
kind: WorkloadGroup
metadata: {{name: vm, namespace: {NAMESPACE}}}
spec:
  metadata: {{labels: {{app: vm}}}}
  template: {{serviceAccount: vm}}
"#
        ),
    )
    .unwrap();
    serve_page(&mut net.pods[vm], "0.0.0.0", PORT, "from the vm");
    capture(&net.pods[vm]);
    let agent = binary("pilot-agent");
    let ip = net.pods[vm].ip.to_string();
    net.pods[vm]
        .spawn(
            "pilot-agent",
            0,
            0,
            &[
                ("POD_NAME", "vm"),
                ("POD_NAMESPACE", NAMESPACE),
                ("INSTANCE_IP", &ip),
                ("SERVICE_ACCOUNT", "vm"),
                ("ISTIO_META_AUTO_REGISTER_GROUP", "vm"),
                ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"0s\"}"),
            ],
            &[
                agent.to_str().unwrap(),
                "proxy",
                "sidecar",
                "--configDir",
                config_dir.to_str().unwrap(),
            ],
        )
        .unwrap();
    wait_ready(&net);
    assert!(
        net.pods[vm].wait_log(
            "pilot-agent",
            "auto-registered workload",
            Duration::from_secs(10)
        ),
        "{}",
        net.logs()
    );
    // The registration reaches Envoy after the debounce: the service's cluster gets the
    // workload as its endpoint and virtualInbound its port. (Envoy applies clusters before
    // listeners, so for a moment a call may reach the app by the inbound passthrough; hence
    // calls until one is counted by the port's inbound HTTP listener.)
    let url = format!("http://{VIP}:{PORT}/");
    let stat = format!("http.inbound_0.0.0.0_{PORT}.downstream_rq_2xx");
    let served = harness::wait_until(Duration::from_secs(20), || {
        matches!(net.pods[vm].http_get(APP_UID, &url), Ok((200, ref body)) if body == "from the vm")
            && counted(&net.pods[vm], &stat)
    });
    assert!(
        served,
        "{:?}; {stat} = {:?}\n{}",
        net.pods[vm].http_get(APP_UID, &url),
        net.pods[vm].envoy_stat(&stat),
        net.logs()
    );
}

/// A Sidecar ingress listener: the server's app listens on 127.0.0.1:8080 only, unreachable
/// from outside the pod; the Sidecar maps the service port 9080 to it, so a client's call to
/// the VIP on 9080 arrives through the server's inbound listener at the loopback-bound app.
#[test]
fn sidecar_ingress_reaches_an_app_bound_to_loopback() {
    if !require_root("sidecar_ingress_reaches_an_app_bound_to_loopback")
        || !require_envoy("sidecar_ingress_reaches_an_app_bound_to_loopback")
    {
        return;
    }
    const INGRESS_PORT: u16 = 9080;
    let (mut net, config_dir) = two_pods(|server_ip| {
        format!(
            r#"kind: ServiceEntry
metadata: {{name: httpbin, namespace: {NAMESPACE}}}
spec:
  hosts: [httpbin.{NAMESPACE}.svc.cluster.local]
  addresses: [{VIP}]
  ports: [{{number: {INGRESS_PORT}, name: http, protocol: HTTP}}]
  workloadSelector: {{labels: {{app: httpbin}}}}
---
kind: WorkloadEntry
metadata: {{name: httpbin-1, namespace: {NAMESPACE}}}
spec: {{address: {server_ip}, labels: {{app: httpbin}}, serviceAccount: httpbin}}
---
kind: Sidecar
metadata: {{name: httpbin, namespace: {NAMESPACE}}}
spec:
  workloadSelector: {{labels: {{app: httpbin}}}}
  ingress:
  - port: {{number: {INGRESS_PORT}, protocol: HTTP, name: http}}
    defaultEndpoint: 127.0.0.1:8080
  egress:
  - hosts: ["./*"]
"#
        )
    });
    let (client, server) = (0, 1);
    serve_page(&mut net.pods[server], "127.0.0.1", 8080, "loopback app");
    start_agent(&mut net.pods[client], "sleep", &config_dir, true);
    start_agent(&mut net.pods[server], "httpbin", &config_dir, true);
    wait_ready(&net);
    let url = format!("http://{VIP}:{INGRESS_PORT}/");
    let (code, body) = net.pods[client].http_get(APP_UID, &url).unwrap();
    assert_eq!(code, 200, "body: {body}\n{}", net.logs());
    assert_eq!(body, "loopback app");
    assert!(
        counted(
            &net.pods[server],
            &format!("http.inbound_0.0.0.0_{INGRESS_PORT}.downstream_rq_2xx")
        ),
        "not through the server's inbound listener"
    );
}

/// Ports with no declared protocol are sniffed: through the same kind of port, HTTP is handled
/// as HTTP by the client's sidecar and a client-first TCP protocol passes as TCP.
#[test]
fn undeclared_ports_carry_http_and_tcp() {
    if !require_root("undeclared_ports_carry_http_and_tcp")
        || !require_envoy("undeclared_ports_carry_http_and_tcp")
    {
        return;
    }
    const LINE_PORT: u16 = 9000;
    let (mut net, config_dir) = two_pods(|server_ip| {
        format!(
            r#"kind: ServiceEntry
metadata: {{name: app, namespace: {NAMESPACE}}}
spec:
  hosts: [app.{NAMESPACE}.svc.cluster.local]
  addresses: [{VIP}]
  ports: [{{number: {PORT}, name: web}}, {{number: {LINE_PORT}}}]
  workloadSelector: {{labels: {{app: app}}}}
---
kind: WorkloadEntry
metadata: {{name: app-1, namespace: {NAMESPACE}}}
spec: {{address: {server_ip}, labels: {{app: app}}, serviceAccount: app}}
"#
        )
    });
    let (client, server) = (0, 1);
    let probe = binary("netprobe");
    let probe = probe.to_str().unwrap();
    serve_page(&mut net.pods[server], "0.0.0.0", PORT, "sniffed http");
    net.pods[server]
        .spawn(
            "line",
            APP_UID,
            APP_UID,
            &[],
            &[probe, "line-echo", &LINE_PORT.to_string()],
        )
        .unwrap();
    start_agent(&mut net.pods[client], "sleep", &config_dir, true);
    start_agent(&mut net.pods[server], "app", &config_dir, true);
    wait_ready(&net);
    let (code, body) = net.pods[client]
        .http_get(APP_UID, &format!("http://{VIP}:{PORT}/"))
        .unwrap();
    assert_eq!(code, 200, "body: {body}\n{}", net.logs());
    assert_eq!(body, "sniffed http");
    assert!(
        counted(
            &net.pods[client],
            &format!("http.outbound_{VIP}_{PORT}.downstream_rq_2xx")
        ),
        "the client's sidecar did not see HTTP"
    );

    let out = net.pods[client]
        .exec_as(
            APP_UID,
            APP_UID,
            &[probe, "say", &format!("{VIP}:{LINE_PORT}"), "hello"],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        net.logs()
    );
    assert!(
        counted(
            &net.pods[client],
            &format!(
                "tcp.outbound|{LINE_PORT}||app.{NAMESPACE}.svc.cluster.local.downstream_cx_total"
            )
        ),
        "the line protocol did not go by tcp_proxy"
    );
}
