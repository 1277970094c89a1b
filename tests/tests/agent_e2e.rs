#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! pilot-agent with a real Envoy against a standalone istiod-core: readiness stays 503 (with the
//! reason) while the control plane is down, turns 200 once it serves, config edits reach Envoy
//! without a restart, and a bad edit keeps the last good config; an app running as the proxy's
//! uid is reported.

use std::time::Duration;

use harness::{Network, Pod, TestCa, binary, require_envoy, require_root, wait_until};

const SERVICE: &str = r#"
kind: ServiceEntry
metadata: {name: web, namespace: demo}
spec:
  hosts: [web.demo.svc.cluster.local]
  addresses: [10.234.0.20]
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 10.233.0.9}]
"#;

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
    let net_dir = net.dir().to_path_buf();
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

    let ca = TestCa::new(&net_dir.join("ca")).unwrap();
    ca.give_token(pod, "demo", "default").unwrap();
    ca.spawn_control_plane(pod, &mesh, "127.0.0.1:15010", &[])
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

/// A test CA and a server certificate for `istiod.istio-system.svc` signed by it (PEM files).
fn write_server_certs(dir: &std::path::Path) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::OrganizationName, "test mesh");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["istiod.istio-system.svc".to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("root-cert.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("istiod.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("istiod-key.pem"), key.serialize_pem()).unwrap();
}

#[test]
fn remote_control_plane_over_tls_with_bearer_token() {
    if !require_root("remote_control_plane_over_tls_with_bearer_token")
        || !require_envoy("remote_control_plane_over_tls_with_bearer_token")
    {
        return;
    }
    let mut net = Network::new().unwrap();
    let idx = net.add_pod("pod", 2).unwrap();
    let mesh = net.dir().join("mesh");
    let certs = net.dir().join("certs");
    std::fs::create_dir_all(&mesh).unwrap();
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::write(mesh.join("web.yaml"), SERVICE).unwrap();
    write_server_certs(&certs);
    // One projected token serves both xDS (compared with --token-file) and the CA (a JWT).
    let ca = TestCa::new(&net.dir().join("ca")).unwrap();
    let token = ca.token("demo", "default").unwrap();
    std::fs::write(certs.join("token"), format!("{token}\n")).unwrap();
    let path = |name: &str| certs.join(name).to_str().unwrap().to_string();
    let agent = binary("pilot-agent");
    let pod = &mut net.pods[idx];
    ca.spawn_control_plane(
        pod,
        &mesh,
        "127.0.0.1:15012",
        &[
            "--tls-cert",
            &path("istiod.pem"),
            "--tls-key",
            &path("istiod-key.pem"),
            "--token-file",
            &path("token"),
        ],
    )
    .unwrap();
    let root = path("root-cert.pem");
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
                "{\"discoveryAddress\": \"127.0.0.1:15012\", \"terminationDrainDuration\": \"1s\"}",
            ),
            ("XDS_ROOT_CA", &root),
            ("CA_ROOT_CA", &root),
            ("ISTIOD_SAN", "istiod.istio-system.svc"),
            ("XDS_HEADER_TENANT", "blue"),
        ],
        &[agent.to_str().unwrap(), "proxy", "sidecar"],
    )
    .unwrap();

    // No token yet: the control plane refuses the stream and the proxy stays unready.
    assert!(
        pod.wait_log(
            "istiod-core",
            "missing or wrong bearer token",
            Duration::from_secs(30)
        ),
        "{}",
        pod.logs()
    );
    let (code, _) = pod
        .http_get(0, "http://127.0.0.1:15020/healthz/ready")
        .unwrap();
    assert_eq!(code, 503);

    // The token appears (as a projected token would): the next connect carries it.
    let tokens = pod.dir.join("var/run/secrets/tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    std::fs::write(tokens.join("istio-token"), format!("{token}\n")).unwrap();
    let ready = pod.wait_http_ok(
        "http://127.0.0.1:15021/healthz/ready",
        Duration::from_secs(60),
    );
    assert!(ready.is_ok(), "{ready:?}\n{}", pod.logs());
    let (_, clusters) = pod.http_get(0, "http://127.0.0.1:15000/clusters").unwrap();
    assert!(clusters.contains("outbound|80||web.demo.svc.cluster.local"));
}

/// A control plane whose serving certificate does not chain to the agent's XDS_ROOT_CA gets no
/// ADS stream: the agent logs the refusal with the root file and the server name, 15020 and
/// Envoy's 15021 stay unready. Once the root file is replaced by the right one, the next dial
/// uses it and the proxy becomes ready, without a restart.
#[test]
fn an_untrusted_control_plane_keeps_the_proxy_unready_until_the_root_is_swapped() {
    let test = "an_untrusted_control_plane_keeps_the_proxy_unready_until_the_root_is_swapped";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let mut net = Network::new().unwrap();
    let idx = net.add_pod("pod", 2).unwrap();
    let mesh = net.dir().join("mesh");
    let certs = net.dir().join("certs");
    std::fs::create_dir_all(&mesh).unwrap();
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::write(mesh.join("web.yaml"), SERVICE).unwrap();
    write_server_certs(&certs);
    let other =
        rcgen::generate_simple_self_signed(vec!["istiod.istio-system.svc".to_string()]).unwrap();
    let xds_root = certs.join("xds-root.pem");
    std::fs::write(&xds_root, other.cert.pem()).unwrap();
    let ca = TestCa::new(&net.dir().join("ca")).unwrap();
    let path = |name: &str| certs.join(name).to_str().unwrap().to_string();
    let agent = binary("pilot-agent");
    let pod = &mut net.pods[idx];
    ca.give_token(pod, "demo", "default").unwrap();
    ca.spawn_control_plane(
        pod,
        &mesh,
        "127.0.0.1:15012",
        &[
            "--tls-cert",
            &path("istiod.pem"),
            "--tls-key",
            &path("istiod-key.pem"),
        ],
    )
    .unwrap();
    let root = path("root-cert.pem");
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
                "{\"discoveryAddress\": \"127.0.0.1:15012\", \"terminationDrainDuration\": \"1s\"}",
            ),
            ("XDS_ROOT_CA", xds_root.to_str().unwrap()),
            // The CA (same server) is trusted: only the xDS dial is refused.
            ("CA_ROOT_CA", &root),
            ("ISTIOD_SAN", "istiod.istio-system.svc"),
        ],
        &[agent.to_str().unwrap(), "proxy", "sidecar"],
    )
    .unwrap();

    let refused = format!(
        "verified against the root in {} for the server name istiod.istio-system.svc",
        xds_root.display()
    );
    assert!(
        pod.wait_log("pilot-agent", &refused, Duration::from_secs(30)),
        "{}",
        pod.logs()
    );
    assert!(
        pod.logs_of("pilot-agent")
            .contains("invalid peer certificate")
    );
    for _ in 0..10 {
        let (code, body) = pod
            .http_get(0, "http://127.0.0.1:15020/healthz/ready")
            .unwrap();
        assert_eq!(code, 503, "{body}");
        assert_ne!(
            pod.http_get(0, "http://127.0.0.1:15021/healthz/ready")
                .unwrap()
                .0,
            200
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The root is replaced on disk (by rename, as a mounted secret is): the next dial trusts it.
    let tmp = certs.join(".xds-root.pem.new");
    std::fs::copy(&root, &tmp).unwrap();
    std::fs::rename(&tmp, &xds_root).unwrap();
    let ready = pod.wait_http_ok(
        "http://127.0.0.1:15021/healthz/ready",
        Duration::from_secs(60),
    );
    assert!(ready.is_ok(), "{ready:?}\n{}", pod.logs());
    let (_, clusters) = pod.http_get(0, "http://127.0.0.1:15000/clusters").unwrap();
    assert!(clusters.contains("outbound|80||web.demo.svc.cluster.local"));
}

#[test]
fn rejected_listeners_keep_the_proxy_unready() {
    if !require_root("rejected_listeners_keep_the_proxy_unready")
        || !require_envoy("rejected_listeners_keep_the_proxy_unready")
    {
        return;
    }
    let mut net = Network::new().unwrap();
    let idx = net.add_pod("pod", 2).unwrap();
    let bad = binary("bad-ads");
    let agent = binary("pilot-agent");
    let pod = &mut net.pods[idx];
    pod.spawn(
        "bad-ads",
        0,
        0,
        &[],
        &[bad.to_str().unwrap(), "127.0.0.1:15010"],
    )
    .unwrap();
    assert!(pod.wait_log("bad-ads", "serving", Duration::from_secs(10)));
    pod.spawn(
        "pilot-agent",
        0,
        0,
        &[
            ("POD_NAME", "client"),
            ("POD_NAMESPACE", "demo"),
            ("INSTANCE_IP", "10.233.0.2"),
            ("ISTIO_DELTA_XDS", "false"),
            (
                "PROXY_CONFIG",
                "{\"discoveryAddress\": \"127.0.0.1:15010\", \"terminationDrainDuration\": \"1s\"}",
            ),
        ],
        &[agent.to_str().unwrap(), "proxy", "sidecar"],
    )
    .unwrap();
    // Envoy NACKs the listener; readiness must stay 503 and say so.
    assert!(
        pod.wait_log(
            "bad-ads",
            "NACK type.googleapis.com/envoy.config.listener.v3.Listener",
            Duration::from_secs(30)
        ),
        "{}",
        pod.logs()
    );
    for _ in 0..10 {
        let (code, body) = pod
            .http_get(0, "http://127.0.0.1:15020/healthz/ready")
            .unwrap();
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("lds updates: 0 successful"), "{body}");
        assert!(
            !body.contains("lds updates: 0 successful, 0 rejected"),
            "{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A good listener, then an invalid version of it: Envoy NACKs the second
/// (`listener_manager.lds.update_rejected`), keeps the first, and traffic through it flows.
#[test]
fn an_invalid_listener_update_is_rejected_and_the_old_listener_keeps_serving() {
    let test = "an_invalid_listener_update_is_rejected_and_the_old_listener_keeps_serving";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let mut net = Network::new().unwrap();
    let idx = net.add_pod("pod", 2).unwrap();
    let bad = binary("bad-ads");
    let agent = binary("pilot-agent");
    let probe = binary("netprobe");
    let probe = probe.to_str().unwrap();
    let pod = &mut net.pods[idx];
    pod.spawn("app", 0, 0, &[], &[probe, "listen", "8080"])
        .unwrap();
    pod.spawn(
        "bad-ads",
        0,
        0,
        &[],
        &[bad.to_str().unwrap(), "127.0.0.1:15010", "good-then-bad"],
    )
    .unwrap();
    assert!(pod.wait_log("bad-ads", "serving", Duration::from_secs(10)));
    pod.spawn(
        "pilot-agent",
        0,
        0,
        &[
            ("POD_NAME", "client"),
            ("POD_NAMESPACE", "demo"),
            ("INSTANCE_IP", "10.233.0.2"),
            ("ISTIO_DELTA_XDS", "false"),
            (
                "PROXY_CONFIG",
                "{\"discoveryAddress\": \"127.0.0.1:15010\", \"terminationDrainDuration\": \"1s\"}",
            ),
        ],
        &[agent.to_str().unwrap(), "proxy", "sidecar"],
    )
    .unwrap();
    for step in [
        "ACK listener 1",
        "NACK type.googleapis.com/envoy.config.listener.v3.Listener",
    ] {
        assert!(
            pod.wait_log("bad-ads", step, Duration::from_secs(30)),
            "{step}\n{}",
            pod.logs()
        );
    }
    assert!(
        pod.envoy_stat("listener_manager.lds.update_rejected")
            .unwrap()
            >= 1
    );
    assert!(
        pod.envoy_stat("listener_manager.lds.update_success")
            .unwrap()
            >= 1
    );
    let (_, dump) = pod
        .http_get(
            0,
            "http://127.0.0.1:15000/config_dump?resource=dynamic_listeners",
        )
        .unwrap();
    assert!(dump.contains("\"app-in\""), "{dump}");
    assert!(dump.contains("\"version_info\": \"1\""), "{dump}");
    assert!(!dump.contains("\"version_info\": \"2\""), "{dump}");
    // The old listener carries traffic: every connection through it reaches the app.
    for i in 0..5 {
        let out = pod.exec(&[probe, "connect", "127.0.0.1:18080"]).unwrap();
        assert!(
            out.status.success(),
            "connection {i}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            pod.logs()
        );
    }
}

/// The resource names of one section (`### CDS`, `### LDS`, ...) of a golden file.
fn golden_names(golden: &str, section: &str) -> std::collections::BTreeSet<String> {
    golden
        .split("### ")
        .find(|s| s.starts_with(section))
        .map(|s| {
            s.lines()
                .filter_map(|l| l.strip_prefix("--- "))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Names of Envoy's dynamic clusters or listeners, from its admin config_dump.
fn dumped_names(pod: &Pod, resource: &str, field: &str) -> std::collections::BTreeSet<String> {
    let (code, body) = pod
        .http_get(
            0,
            &format!("http://127.0.0.1:15000/config_dump?resource={resource}"),
        )
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
    dump["configs"]
        .as_array()
        .map(|configs| {
            configs
                .iter()
                .filter_map(|c| {
                    c.get(field)
                        .and_then(|inner| inner.get("name"))
                        .or_else(|| c.get("name"))
                        .and_then(|n| n.as_str())
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every golden config of istiod-core's generator tests, served to a real Envoy through the
/// agent over Delta and over state-of-the-world xDS from its embedded control plane, and over
/// Delta from `istiod-core serve`: Envoy accepts all of it (CDS and LDS updated, nothing
/// rejected), becomes ready, and its config_dump holds exactly the golden's clusters and
/// listeners.
#[test]
fn envoy_accepts_every_golden_config() {
    if !require_root("envoy_accepts_every_golden_config")
        || !require_envoy("envoy_accepts_every_golden_config")
    {
        return;
    }
    let goldens =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../istiod-core/tests/golden");
    let mut cases: Vec<_> = std::fs::read_dir(&goldens)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 6);
    let agent = binary("pilot-agent");
    // (case, Delta xDS, through `istiod-core serve` rather than the embedded control plane)
    let runs = cases.iter().flat_map(|c| {
        [
            (c.clone(), "true", false),
            (c.clone(), "false", false),
            (c.clone(), "true", true),
        ]
    });
    for (case, delta, remote) in runs {
        let text = std::fs::read_to_string(&case).unwrap();
        let golden = std::fs::read_to_string(case.with_extension("golden")).unwrap();
        // `# proxy: sidecar~IP~POD.NS~NS.svc.cluster.local`
        let node = text.lines().next().unwrap().trim_start_matches("# proxy: ");
        let parts: Vec<&str> = node.split('~').collect();
        let (kind, ip, pod_ns) = (parts[0], parts[1], parts[2]);
        let router = kind == "router";
        let (pod, ns) = pod_ns.split_once('.').unwrap();
        let mut net = Network::new().unwrap();
        let idx = net.add_pod("pod", 2).unwrap();
        let mesh = net.dir().join("mesh");
        std::fs::create_dir_all(&mesh).unwrap();
        std::fs::copy(&case, mesh.join("mesh.yaml")).unwrap();
        let ca = TestCa::new(&net.dir().join("ca")).unwrap();
        let pod_ref = &mut net.pods[idx];
        if router {
            // A gateway binds its servers' ports (80, 443) and reads the seed's certificate
            // files at /etc/certs.
            pod_ref.allow_low_ports().unwrap();
            let c = rcgen::generate_simple_self_signed(vec!["bookinfo.com".to_string()]).unwrap();
            pod_ref
                .etc_file("certs/servercert.pem", c.cert.pem().as_bytes())
                .unwrap();
            pod_ref
                .etc_file(
                    "certs/privatekey.pem",
                    c.signing_key.serialize_pem().as_bytes(),
                )
                .unwrap();
        }
        let mut args = vec![agent.to_str().unwrap(), "proxy", kind];
        let proxy_config = if remote {
            ca.give_token(pod_ref, ns, "web").unwrap();
            ca.spawn_control_plane(pod_ref, &mesh, "127.0.0.1:15010", &[])
                .unwrap();
            "{\"terminationDrainDuration\": \"0s\", \"discoveryAddress\": \"127.0.0.1:15010\"}"
        } else {
            args.extend(["--configDir", mesh.to_str().unwrap()]);
            "{\"terminationDrainDuration\": \"0s\"}"
        };
        pod_ref
            .spawn(
                "pilot-agent",
                0,
                0,
                &[
                    ("POD_NAME", pod),
                    ("POD_NAMESPACE", ns),
                    ("INSTANCE_IP", ip),
                    ("SERVICE_ACCOUNT", "web"),
                    ("ISTIO_DELTA_XDS", delta),
                    ("PROXY_CONFIG", proxy_config),
                ],
                &args,
            )
            .unwrap();
        let ready = pod_ref.wait_http_ok(
            "http://127.0.0.1:15021/healthz/ready",
            Duration::from_secs(60),
        );
        assert!(
            ready.is_ok(),
            "{}: {ready:?}\n{}",
            case.display(),
            pod_ref.logs()
        );
        for stat in [
            "cluster_manager.cds.update_rejected",
            "listener_manager.lds.update_rejected",
        ] {
            assert_eq!(
                pod_ref.envoy_stat(stat).unwrap(),
                0,
                "{}: {stat}",
                case.display()
            );
        }
        for stat in [
            "cluster_manager.cds.update_success",
            "listener_manager.lds.update_success",
        ] {
            assert!(
                pod_ref.envoy_stat(stat).unwrap() >= 1,
                "{}: {stat}",
                case.display()
            );
        }
        let flavour = match (delta, remote) {
            (_, true) => "delta from istiod-core serve",
            ("true", _) => "delta",
            _ => "sotw",
        };
        assert!(golden_names(&golden, "CDS").contains("BlackHoleCluster"));
        assert!(router || golden_names(&golden, "LDS").contains("virtualInbound"));
        if router {
            // Every credential the listeners name is served (SDS over ADS, and the agent's
            // file-cert for the seed's files).
            // Over plaintext xDS (`istiod-core serve` here) the caller's namespace is not
            // verified: no Secret is served, and the servers that need one are left out.
            let want = if remote {
                Default::default()
            } else {
                golden_names(&golden, "SDS")
            };
            assert!(remote || !want.is_empty());
            let secrets_in = wait_until(Duration::from_secs(20), || {
                let have = dumped_names(pod_ref, "dynamic_active_secrets", "secret");
                want.is_subset(&have) && have.iter().any(|n| n.starts_with("file-cert:/etc/certs/"))
            });
            assert!(
                secrets_in,
                "{}: secrets {:?}, expected {want:?} and the seed's file-cert",
                case.display(),
                dumped_names(pod_ref, "dynamic_active_secrets", "secret")
            );
        }
        assert_eq!(
            dumped_names(pod_ref, "dynamic_active_clusters", "cluster"),
            golden_names(&golden, "CDS"),
            "{} ({flavour}): Envoy's clusters",
            case.display()
        );
        if remote && router {
            let have = dumped_names(pod_ref, "dynamic_active_secrets", "secret");
            assert!(
                !have.iter().any(|n| n.starts_with("kubernetes://")),
                "{}: a Secret reached an unverified router: {have:?}",
                case.display()
            );
        }
        assert_eq!(
            dumped_names(pod_ref, "dynamic_listeners", "active_state"),
            golden_names(&golden, "LDS"),
            "{} ({flavour}): Envoy's listeners",
            case.display()
        );
        // Every route configuration the listeners ask for arrives and is accepted (a rejected
        // one never shows in the dump, and counts in an `rds.*.update_rejected` stat).
        let mut want = golden_names(&golden, "RDS");
        if remote && router {
            // gateway.yaml's one credentialName server, left out for an unverified caller.
            assert!(want.remove("https.8443.https-api.edge.istio-system"));
        }
        let routes_in = wait_until(Duration::from_secs(20), || {
            dumped_names(pod_ref, "dynamic_route_configs", "route_config") == want
        });
        assert!(
            routes_in,
            "{} ({flavour}): Envoy's route configurations {:?}, expected {want:?}",
            case.display(),
            dumped_names(pod_ref, "dynamic_route_configs", "route_config")
        );
        let (_, stats) = pod_ref
            .http_get(0, "http://127.0.0.1:15000/stats?filter=update_rejected")
            .unwrap();
        for line in stats.lines() {
            assert!(
                line.ends_with(": 0"),
                "{} ({flavour}): {line}",
                case.display()
            );
        }
    }
}

/// An application listening as the proxy's uid (1337) on a port the pod declares
/// (ISTIO_META_POD_PORTS) talks past Envoy: the agent's log says so, naming the port. An app
/// listening as another uid on another declared port is not reported. Both apps start after the
/// proxy, as they usually do.
#[test]
fn an_app_running_as_the_proxy_uid_is_reported() {
    let test = "an_app_running_as_the_proxy_uid_is_reported";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    let mut net = Network::new().unwrap();
    net.add_pod("pod", 2).unwrap();
    let mesh = net.dir().join("mesh");
    std::fs::create_dir_all(&mesh).unwrap();
    std::fs::write(mesh.join("web.yaml"), SERVICE).unwrap();
    let pod = &mut net.pods[0];
    pod.spawn_embedded_agent(
        &mesh,
        &[
            ("POD_NAME", "web"),
            ("POD_NAMESPACE", "demo"),
            ("INSTANCE_IP", "10.233.0.2"),
            ("PROXY_CONFIG", "{\"terminationDrainDuration\": \"1s\"}"),
            (
                "ISTIO_META_POD_PORTS",
                r#"[{"name":"http","containerPort":8080,"protocol":"TCP"},{"name":"metrics","containerPort":9090,"protocol":"TCP"}]"#,
            ),
        ],
    )
    .unwrap();
    assert!(pod.wait_log("pilot-agent", "starting Envoy", Duration::from_secs(30)));
    let np = binary("netprobe");
    let np = np.to_str().unwrap();
    pod.spawn("app", 1337, 1337, &[], &[np, "listen", "8080"])
        .unwrap();
    pod.spawn("metrics", 1000, 1000, &[], &[np, "listen", "9090"])
        .unwrap();
    for name in ["app", "metrics"] {
        assert!(pod.wait_log(name, "listening", Duration::from_secs(10)));
    }
    let warning = "the application listens on its port 8080 as uid 1337";
    assert!(
        pod.wait_log("pilot-agent", warning, Duration::from_secs(20)),
        "no warning about the app running as 1337\n{}",
        pod.logs_of("pilot-agent")
    );
    // The pass that found 8080 saw 9090 too (both listened before it); one more pass (5 s)
    // for good measure: only the 1337 app is reported, once.
    std::thread::sleep(Duration::from_secs(6));
    let logs = pod.logs_of("pilot-agent");
    assert_eq!(logs.matches(warning).count(), 1, "{logs}");
    assert!(!logs.contains("port 9090"), "{logs}");
    assert!(!logs.contains("as uid 1000"), "{logs}");
}
