#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! The agent's lifecycle with a real Envoy: Envoy dying takes the agent down (non-zero), the
//! agent dying takes Envoy down, /quitquitquit stops at once, /drain makes the later SIGTERM
//! immediate, and control endpoints answer only loopback peers.

use std::time::{Duration, Instant};

use harness::{Network, Pod, pids_named, require_envoy, require_root};
use nix::sys::signal::Signal;

const SERVICE: &str = r#"
kind: ServiceEntry
metadata: {name: web, namespace: demo}
spec:
  hosts: [web.demo.svc.cluster.local]
  addresses: [10.234.0.20]
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 10.233.0.3}]
"#;

/// The app's one rewritten probe: a TCP check of its port 8080.
const PROBERS: &str =
    r#"{"/app-health/app/livez": {"tcpSocket": {"port": 8080}, "timeoutSeconds": 5}}"#;

/// A pod running pilot-agent (embedded control plane) and Envoy, ready; plus a peer pod.
fn ready_pod(test: &str, termination_drain: &str) -> Option<Network> {
    if !require_root(test) || !require_envoy(test) {
        return None;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("pod", 2).unwrap();
    net.add_pod("peer", 3).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    std::fs::write(mesh.join("web.yaml"), SERVICE).unwrap();
    let proxy_config = format!("{{\"terminationDrainDuration\": \"{termination_drain}\"}}");
    let pod = &mut net.pods[0];
    pod.spawn_embedded_agent(
        &mesh,
        &[
            ("POD_NAME", "web"),
            ("POD_NAMESPACE", "demo"),
            ("INSTANCE_IP", "10.233.0.2"),
            ("PROXY_CONFIG", &proxy_config),
            ("ISTIO_KUBE_APP_PROBERS", PROBERS),
        ],
    )
    .unwrap();
    let ready = pod.wait_http_ok(
        "http://127.0.0.1:15021/healthz/ready",
        Duration::from_secs(60),
    );
    assert!(ready.is_ok(), "{ready:?}\n{}", pod.logs());
    Some(net)
}

fn post(pod: &Pod, url: &str) -> u16 {
    let out = pod
        .exec(&[
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "POST",
            url,
        ])
        .unwrap();
    String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0)
}

fn wait_no_envoy(pod: &Pod, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if pids_named(&pod.ns, "envoy").is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn envoy_dying_takes_the_agent_down_nonzero() {
    let Some(mut net) = ready_pod("envoy_dying_takes_the_agent_down_nonzero", "5s") else {
        return;
    };
    let pod = &mut net.pods[0];
    let envoy = pids_named(&pod.ns, "envoy");
    assert_eq!(envoy.len(), 1, "{envoy:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(envoy[0]), Signal::SIGKILL).unwrap();
    let agent = pod.proc("pilot-agent").unwrap();
    let status = agent.wait_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        !status.success(),
        "agent exited 0 after Envoy died\n{}",
        agent.logs()
    );
    assert!(
        agent.logs().contains("Envoy exited unexpectedly"),
        "{}",
        agent.logs()
    );
}

#[test]
fn agent_dying_takes_envoy_down() {
    let Some(mut net) = ready_pod("agent_dying_takes_envoy_down", "5s") else {
        return;
    };
    let pod = &mut net.pods[0];
    pod.proc("pilot-agent")
        .unwrap()
        .signal(Signal::SIGKILL)
        .unwrap();
    assert!(
        wait_no_envoy(pod, Duration::from_secs(5)),
        "Envoy orphaned after the agent was killed"
    );
}

#[test]
fn quitquitquit_stops_at_once_and_only_from_loopback() {
    let Some(mut net) = ready_pod("quitquitquit_stops_at_once_and_only_from_loopback", "60s")
    else {
        return;
    };
    // A peer namespace is refused; GET is not allowed.
    assert_eq!(
        post(&net.pods[1], "http://10.233.0.2:15020/quitquitquit"),
        403
    );
    assert_eq!(post(&net.pods[1], "http://10.233.0.2:15020/drain"), 403);
    // The same from the peer's IPv6 address, and for the debug pages (certificates included).
    assert_eq!(
        post(&net.pods[1], "http://[fd00:233::2]:15020/quitquitquit"),
        403
    );
    for page in ["debug/config", "debug/certs", "debug/ndsz"] {
        for host in ["10.233.0.2", "[fd00:233::2]"] {
            let (code, _) = net.pods[1]
                .http_get(0, &format!("http://{host}:15020/{page}"))
                .unwrap();
            assert_eq!(code, 403, "{host} {page}");
        }
    }
    // Every /debug/ path is refused to a peer, pages that do not exist (pprof) included, and
    // so is a GET on the control endpoints.
    for page in [
        "debug/xds_adapt",
        "debug/pprof/",
        "debug/pprof/heap",
        "debug",
    ] {
        for host in ["10.233.0.2", "[fd00:233::2]"] {
            let (code, _) = net.pods[1]
                .http_get(0, &format!("http://{host}:15020/{page}"))
                .unwrap();
            assert_eq!(code, 403, "{host} {page}");
        }
    }
    for page in ["quitquitquit", "drain"] {
        let (code, _) = net.pods[1]
            .http_get(0, &format!("http://10.233.0.2:15020/{page}"))
            .unwrap();
        assert_eq!(code, 403, "GET {page} from a peer");
    }
    // Profiling is not served at all, not even to loopback (`--profiling` is accepted and
    // ignored): no pprof route exists.
    for page in ["debug/pprof/", "debug/pprof/profile", "debug/pprof/heap"] {
        let (code, _) = net.pods[0]
            .http_get(0, &format!("http://127.0.0.1:15020/{page}"))
            .unwrap();
        assert_eq!(code, 404, "{page}");
    }
    // Loopback over IPv6 is local.
    let (code, _) = net.pods[0]
        .http_get(0, "http://[::1]:15020/debug/certs")
        .unwrap();
    assert_eq!(code, 200);
    for page in ["quitquitquit", "drain"] {
        let (code, _) = net.pods[0]
            .http_get(0, &format!("http://127.0.0.1:15020/{page}"))
            .unwrap();
        assert_eq!(code, 405, "GET {page} from loopback");
    }
    // The GET /drain above did not drain: the proxy is still ready.
    let (code, body) = net.pods[0]
        .http_get(0, "http://127.0.0.1:15020/healthz/ready")
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, body) = net.pods[0]
        .http_get(0, "http://127.0.0.1:15020/debug/config")
        .unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("termination_drain_duration: 60s"), "{body}");
    // Readiness and the app probes are open to the peer (kubelet probes come from outside),
    // on 15021 (Envoy) and on 15020 itself, over IPv4 and IPv6.
    let np = harness::binary("netprobe");
    net.pods[0]
        .spawn(
            "app",
            1000,
            1000,
            &[],
            &[np.to_str().unwrap(), "listen", "8080"],
        )
        .unwrap();
    assert!(net.pods[0].wait_log("app", "listening", Duration::from_secs(10)));
    for url in [
        "http://10.233.0.2:15021/healthz/ready",
        "http://10.233.0.2:15020/healthz/ready",
        "http://[fd00:233::2]:15020/healthz/ready",
        "http://10.233.0.2:15020/app-health/app/livez",
        "http://[fd00:233::2]:15020/app-health/app/livez",
    ] {
        let (code, body) = net.pods[1].http_get(0, url).unwrap();
        assert_eq!(code, 200, "{url}: {body}");
    }

    let pod = &mut net.pods[0];
    let start = Instant::now();
    assert_eq!(post(pod, "http://127.0.0.1:15020/quitquitquit"), 200);
    let agent = pod.proc("pilot-agent").unwrap();
    let status = agent.wait_timeout(Duration::from_secs(10)).unwrap();
    assert!(status.success(), "{}", agent.logs());
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "quit waited for the 60s drain"
    );
    assert!(wait_no_envoy(pod, Duration::from_secs(5)));
}

#[test]
fn drain_then_sigterm_is_immediate() {
    let Some(mut net) = ready_pod("drain_then_sigterm_is_immediate", "60s") else {
        return;
    };
    let pod = &mut net.pods[0];
    assert_eq!(post(pod, "http://127.0.0.1:15020/drain"), 200);
    let (code, body) = pod
        .http_get(0, "http://127.0.0.1:15020/healthz/ready")
        .unwrap();
    assert_eq!(code, 503, "{body}");
    let start = Instant::now();
    let agent = pod.proc("pilot-agent").unwrap();
    agent.signal(Signal::SIGTERM).unwrap();
    let status = agent.wait_timeout(Duration::from_secs(20)).unwrap();
    assert!(status.success(), "{}", agent.logs());
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "SIGTERM after /drain waited for the 60s drain"
    );
}

#[test]
fn a_dead_background_task_takes_the_agent_down_nonzero() {
    let test = "a_dead_background_task_takes_the_agent_down_nonzero";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("pod", 2).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    std::fs::write(mesh.join("web.yaml"), SERVICE).unwrap();
    let pod = &mut net.pods[0];
    // Something else holds the DNS proxy's TCP port: its task fails as it starts.
    pod.spawn(
        "squatter",
        0,
        0,
        &[],
        &[
            "/usr/bin/python3",
            "-c",
            "import socket,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('127.0.0.1', 15053))\ns.listen()\nprint('bound', flush=True)\ntime.sleep(600)",
        ],
    )
    .unwrap();
    assert!(pod.wait_log("squatter", "bound", Duration::from_secs(10)));
    pod.spawn_embedded_agent(
        &mesh,
        &[
            ("POD_NAME", "web"),
            ("POD_NAMESPACE", "demo"),
            ("INSTANCE_IP", "10.233.0.2"),
            ("ISTIO_META_DNS_CAPTURE", "true"),
        ],
    )
    .unwrap();
    let agent = pod.proc("pilot-agent").unwrap();
    let status = agent.wait_timeout(Duration::from_secs(30)).unwrap();
    let logs = agent.logs();
    assert!(!status.success(), "agent exited 0\n{logs}");
    assert!(
        logs.contains("background task \"dns\" ended") && logs.contains("container restarts"),
        "{logs}"
    );
    assert!(
        wait_no_envoy(pod, Duration::from_secs(5)),
        "Envoy left running after the agent exited"
    );
}
