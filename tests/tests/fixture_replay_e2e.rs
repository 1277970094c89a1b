#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Recorded istiod output replayed through the agent to a real, upstream Envoy: config dumps
//! from istio/istio's test data (tests/fixtures/istio, see SOURCE.md) are served by
//! `fixture-ads` as the agent's remote control plane. With the xDS adaptation on, Envoy accepts
//! every listener, cluster and route the agent forwards (all of the dump's but the HBONE
//! listeners, which the agent removes) and traffic goes where the dump's listeners send it; with
//! `XDS_ADAPT=false` the same replay is rejected.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use harness::{
    Network, Pod, binary, istio_iptables, pod_ipv4, require_envoy, require_root, wait_until,
};

const AUTHZ_DUMP: &str = "authz_configdump.yaml";
const DESCRIBE_DUMP: &str = "describe_http_config.json";

/// The recorded outbound TCP listener `10.96.0.1_443` sends to this cluster (istio.stats removed,
/// tcp_proxy kept); the dump recorded listeners only, so fixture-ads adds the cluster as a plain
/// EDS cluster (`--cluster`) whose one endpoint is the backend pod.
const KUBERNETES_VIP: &str = "10.96.0.1:443";
const KUBERNETES_CLUSTER: &str = "outbound|443||kubernetes.default.svc.cluster.local";
/// The backend listens elsewhere than the VIP's port: an answer proves the listener's cluster
/// was used, not a passthrough to the original destination.
const BACKEND_PORT: u16 = 8080;

/// Listeners of the authz dump that need Istio's HBONE filters: removed by the agent.
const HBONE_LISTENERS: [&str; 3] = ["connect_originate", "connect_terminate", "main_internal"];

/// The Istio extension types of the authz dump the proxy module runs, as the agent names them.
const MAPPED_TYPES: [&str; 4] = [
    "stats.PluginConfig",
    "istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig",
    "envoy.tcp.metadataexchange.config.MetadataExchange",
    "null-vm:envoy.wasm.metadata_exchange",
];

/// The Istio-only extension types of the authz dump the agent removes, as it names them.
const REMOVED_TYPES: [&str; 4] = [
    "io.istio.network.authn.Config",
    "istio.set_internal_dst_address.v1.Config",
    "io.istio.http.connect_authority.Config",
    "io.istio.http.connect_baggage.Config",
];

const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/istio")
        .join(name)
        .display()
        .to_string()
}

fn read_dump(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The names of a dump's dynamic listeners.
fn dump_listener_names(dump: &serde_json::Value) -> BTreeSet<String> {
    dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["dynamic_listeners"].as_array().into_iter().flatten())
        .filter_map(|l| l["name"].as_str().map(str::to_string))
        .collect()
}

/// How often each extension type occurs in a dump's dynamic listeners, named as the agent
/// names them: a TypedStruct by its inner type, a null-VM Wasm filter `null-vm:<plugin>`.
fn extension_types(dump: &serde_json::Value) -> BTreeMap<String, u64> {
    fn walk(v: &serde_json::Value, out: &mut BTreeMap<String, u64>) {
        match v {
            serde_json::Value::Object(o) => {
                if let (Some(_), Some(tc)) = (o.get("name"), o.get("typed_config")) {
                    let short = |url: &str| url.rsplit('/').next().unwrap_or(url).to_string();
                    let mut kind = short(tc["@type"].as_str().unwrap_or_default());
                    if kind.ends_with("TypedStruct") {
                        kind = short(tc["type_url"].as_str().unwrap_or_default());
                    }
                    let vm = &tc["config"]["vm_config"];
                    if kind.ends_with("wasm.v3.Wasm") && vm["runtime"] == "envoy.wasm.runtime.null"
                    {
                        let plugin = vm["code"]["local"]["inline_string"].as_str();
                        kind = format!("null-vm:{}", plugin.unwrap_or_default());
                    }
                    *out.entry(kind).or_default() += 1;
                }
                o.values().for_each(|v| walk(v, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    for config in dump["configs"].as_array().into_iter().flatten() {
        walk(&config["dynamic_listeners"], &mut out);
    }
    out
}

/// A workload certificate with a SPIFFE identity and its root, mounted where
/// `FILE_MOUNTED_CERTS=true` makes the agent read them (no CA is called).
fn mount_certs(pod: &Pod) {
    let root_key = rcgen::KeyPair::generate().unwrap();
    let mut root = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    root.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    root.distinguished_name
        .push(rcgen::DnType::CommonName, "replay root");
    let root_pem = root.self_signed(&root_key).unwrap().pem();
    let issuer = rcgen::Issuer::new(root, root_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut leaf = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf.subject_alt_names = vec![rcgen::SanType::URI(
        rcgen::string::Ia5String::try_from("spiffe://cluster.local/ns/default/sa/sleep").unwrap(),
    )];
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let dir = pod.dir.join("etc/certs");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cert-chain.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("root-cert.pem"), root_pem).unwrap();
}

/// A client pod (2) whose agent's control plane is fixture-ads replaying `dumps` (in the same
/// pod, 127.0.0.1:15010), with traffic capture, and a backend pod (3) answering HTTP on
/// BACKEND_PORT. `agent_env` is added to the agent's environment.
fn replay(dumps: &[&str], ads_args: &[&str], agent_env: &[(&str, &str)]) -> Network {
    let mut net = Network::new().unwrap();
    let client = net.add_pod("client", 2).unwrap();
    let backend = net.add_pod("backend", 3).unwrap();
    let probe = binary("netprobe");
    net.pods[backend]
        .spawn(
            "http-echo",
            0,
            0,
            &[],
            &[
                probe.to_str().unwrap(),
                "http-echo",
                &BACKEND_PORT.to_string(),
            ],
        )
        .unwrap();

    let pod = &mut net.pods[client];
    mount_certs(pod);
    istio_iptables(pod, &[]).unwrap();
    // The dump's service VIPs (10.96.0.0/12) get a route, so the capture sees the connection.
    let out = pod
        .exec(&["ip", "route", "add", "10.96.0.0/12", "dev", "eth0"])
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let ads = binary("fixture-ads");
    let mut args = vec![ads.to_str().unwrap(), "--listen", "127.0.0.1:15010"];
    let paths: Vec<String> = dumps.iter().map(|d| fixture(d)).collect();
    for p in &paths {
        args.extend(["--dump", p.as_str()]);
    }
    args.extend(ads_args);
    pod.spawn("fixture-ads", 0, 0, &[], &args).unwrap();
    assert!(
        pod.wait_log("fixture-ads", "serving", Duration::from_secs(20)),
        "{}",
        pod.logs()
    );

    let agent = binary("pilot-agent");
    let mut env = vec![
        ("POD_NAME", "sleep-replay"),
        ("POD_NAMESPACE", "default"),
        ("INSTANCE_IP", "10.233.0.2"),
        ("SERVICE_ACCOUNT", "sleep"),
        ("FILE_MOUNTED_CERTS", "true"),
        (
            "PROXY_CONFIG",
            "{\"discoveryAddress\": \"127.0.0.1:15010\", \"controlPlaneAuthPolicy\": \"NONE\", \
             \"terminationDrainDuration\": \"1s\"}",
        ),
    ];
    env.extend(agent_env);
    pod.spawn(
        "pilot-agent",
        0,
        0,
        &env,
        &[agent.to_str().unwrap(), "proxy", "sidecar"],
    )
    .unwrap();
    net
}

/// The agent's own counter `name{labels}` from 15020's Prometheus text; 0 if absent.
fn agent_metric(pod: &Pod, series: &str) -> u64 {
    let (code, body) = pod
        .http_get(0, "http://127.0.0.1:15020/stats/prometheus")
        .unwrap();
    assert_eq!(code, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Envoy accepted every LDS, CDS and RDS update (at least one each of LDS and CDS) and rejected
/// none; the control plane saw no NACK; the proxy is ready.
fn assert_all_accepted(net: &Network) {
    let pod = &net.pods[0];
    let ready = pod.wait_http_ok(
        "http://127.0.0.1:15020/healthz/ready",
        Duration::from_secs(60),
    );
    assert!(ready.is_ok(), "{ready:?}\n{}", net.logs());
    assert!(
        pod.logs_of("fixture-ads")
            .contains(&format!("ACK {LISTENER}")),
        "{}",
        net.logs()
    );
    for stat in [
        "listener_manager.lds.update_success",
        "cluster_manager.cds.update_success",
    ] {
        assert!(pod.envoy_stat(stat).unwrap() > 0, "{stat}\n{}", net.logs());
    }
    let (code, rejected) = pod
        .http_get(0, "http://127.0.0.1:15000/stats?filter=update_rejected")
        .unwrap();
    assert_eq!(code, 200);
    let nonzero: Vec<&str> = rejected
        .lines()
        .filter(|l| !l.trim_end().ends_with(": 0"))
        .collect();
    assert!(nonzero.is_empty(), "{nonzero:?}\n{}", net.logs());
    assert!(
        !pod.logs_of("fixture-ads").contains("NACK"),
        "{}",
        net.logs()
    );
}

/// The authz dump (Istio 1.18 with HBONE on: every outbound and inbound listener with
/// `istio.stats`, `istio.metadata_exchange` as null-VM Wasm and network filter, `istio.alpn`,
/// ALPN `istio-peer-exchange`, `istio_authn` feeding RBAC principals, three HBONE listeners)
/// over Delta xDS: all accepted (Istio's filters run by the proxy module, the HBONE listeners
/// removed by the agent, every other one active), the mappings and removals counted by type, the
/// RBAC principals rewritten, and a connection to a recorded VIP reaches the backend through the
/// recorded listener and shows in the module's TCP metrics.
#[test]
fn authz_dump_is_accepted_and_routes_traffic() {
    if !require_root("authz_dump_is_accepted_and_routes_traffic")
        || !require_envoy("authz_dump_is_accepted_and_routes_traffic")
    {
        return;
    }
    replay_authz_dump(&[]);
}

/// The same over state-of-the-world xDS.
#[test]
fn authz_dump_is_accepted_and_routes_traffic_over_state_of_the_world() {
    let test = "authz_dump_is_accepted_and_routes_traffic_over_state_of_the_world";
    if !require_root(test) || !require_envoy(test) {
        return;
    }
    replay_authz_dump(&[("ISTIO_DELTA_XDS", "false")]);
}

fn replay_authz_dump(agent_env: &[(&str, &str)]) {
    let endpoints = format!("{KUBERNETES_CLUSTER}={}:{BACKEND_PORT}", pod_ipv4(3));
    let net = replay(
        &[AUTHZ_DUMP],
        &["--cluster", KUBERNETES_CLUSTER, "--endpoints", &endpoints],
        agent_env,
    );
    assert_all_accepted(&net);
    let pod = &net.pods[0];
    let dump = read_dump(AUTHZ_DUMP);

    // Every dynamic listener of the dump is active in Envoy but the three HBONE ones, which
    // the agent removes whole.
    let (_, active) = pod.http_get(0, "http://127.0.0.1:15000/listeners").unwrap();
    let active: BTreeSet<&str> = active
        .lines()
        .filter_map(|l| l.split_once("::").map(|(name, _)| name))
        .collect();
    let mut expected = dump_listener_names(&dump);
    for hbone in HBONE_LISTENERS {
        assert!(expected.remove(hbone), "{hbone} not in the dump");
    }
    assert_eq!(expected.len(), 24);
    let dynamic: BTreeSet<&str> = active
        .into_iter()
        .filter(|n| expected.contains(*n) || HBONE_LISTENERS.contains(n))
        .collect();
    assert_eq!(
        dynamic,
        expected.iter().map(String::as_str).collect(),
        "{}",
        net.logs()
    );

    // Each removed extension counted at least as often as the dump holds it.
    let occurrences = extension_types(&dump);
    for kind in REMOVED_TYPES {
        let expected = occurrences.get(kind).copied().unwrap_or(0);
        assert!(expected > 0, "{kind} not in the dump");
        let removed = agent_metric(
            pod,
            &format!("istio_agent_xds_adapt_removed_total{{type=\"{kind}\"}}"),
        );
        assert!(
            removed >= expected,
            "{kind}: {removed} < {expected}\n{}",
            net.logs()
        );
    }
    let (_, report) = pod
        .http_get(0, "http://127.0.0.1:15020/debug/xds_adapt")
        .unwrap();
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    // Each of Istio's filters the dump holds was handed to the module.
    for kind in MAPPED_TYPES {
        assert!(
            occurrences.get(kind).copied().unwrap_or(0) > 0,
            "{kind} not in the dump"
        );
        let mapped: u64 = report["mapped"][kind]
            .as_object()
            .map(|by_name| by_name.values().filter_map(|s| s["count"].as_u64()).sum())
            .unwrap_or(0);
        assert!(mapped >= 1, "{kind} not mapped: {report}");
    }
    assert!(
        report["principals_rewritten"]["resources"]
            .as_array()
            .is_some_and(|r| r.iter().any(|n| n == "virtualInbound")),
        "{report}"
    );
    assert_eq!(report["unknown"], serde_json::json!({}), "{report}");

    // The app (uid 1000, captured) connects to the VIP; the dump's listener sends it to its
    // cluster, whose endpoint is the backend on another port.
    let url = format!("http://{KUBERNETES_VIP}/replayed");
    let mut last = (0, String::new());
    let answered = wait_until(Duration::from_secs(20), || {
        last = pod.http_get(1000, &url).unwrap();
        last.0 == 200
    });
    assert!(answered, "{last:?}\n{}", net.logs());
    assert!(last.1.starts_with("GET /replayed HTTP/1.1"), "{last:?}");
    assert!(
        // The scaffolding cluster names its stats as istiod does: `NAME;`.
        pod.envoy_stat(&format!("cluster.{KUBERNETES_CLUSTER};.upstream_cx_total"))
            .unwrap()
            > 0,
        "{}",
        net.logs()
    );

    // The listener's `istio.stats` runs in the proxy module: the connection shows in Istio's
    // standard TCP metrics, reported by this (the client's) sidecar.
    let mut exposition = String::new();
    let counted = wait_until(Duration::from_secs(20), || {
        exposition = pod
            .http_get(0, "http://127.0.0.1:15020/stats/prometheus")
            .unwrap()
            .1;
        exposition.lines().any(|l| {
            l.starts_with("istio_tcp_connections_closed_total{")
                && l.contains("reporter=\"source\"")
                && l.contains("destination_service=\"kubernetes.default.svc.cluster.local\"")
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(1.0)
        })
    });
    let istio: Vec<&str> = exposition
        .lines()
        .filter(|l| l.starts_with("istio_tcp") || l.starts_with("istio_request"))
        .collect();
    assert!(
        counted,
        "no closed connection counted: {istio:#?}\n{}",
        net.logs()
    );
}

/// The describe test dump (Istio 1.13 era: a cluster with the `istio.metadata_exchange` cluster
/// filter and `istio-peer-exchange` ALPN in its mTLS transport socket match) over state-of-the-
/// world xDS: accepted, and the removals counted. Its route configuration is served but never
/// asked for (the dump has no listener naming it), so only its cluster reaches Envoy.
#[test]
fn describe_dump_is_accepted_over_state_of_the_world() {
    if !require_root("describe_dump_is_accepted_over_state_of_the_world")
        || !require_envoy("describe_dump_is_accepted_over_state_of_the_world")
    {
        return;
    }
    let net = replay(&[DESCRIBE_DUMP], &[], &[("ISTIO_DELTA_XDS", "false")]);
    assert_all_accepted(&net);
    let pod = &net.pods[0];
    // The recorded cluster is active in Envoy, without its cluster filter (the module runs the
    // exchange's client side on the listener) and with its peer-exchange ALPN.
    let (_, clusters) = pod
        .http_get(
            0,
            "http://127.0.0.1:15000/config_dump?resource=dynamic_active_clusters",
        )
        .unwrap();
    assert!(
        clusters.contains("\"outbound|9080|v1|productpage.default.svc.cluster.local\""),
        "{clusters}"
    );
    assert!(!clusters.contains("istio.metadata_exchange"), "{clusters}");
    assert!(clusters.contains("istio-peer-exchange"), "{clusters}");
    let removed = agent_metric(
        pod,
        "istio_agent_xds_adapt_removed_total{type=\"envoy.tcp.metadataexchange.config.MetadataExchange\"}",
    );
    assert!(removed >= 1, "{}", net.logs());
}

/// The negative: the same replays without the adaptation are rejected by Envoy, naming an
/// Istio-only type. Fails if the adaptation stops mattering (i.e. Envoy would load these).
#[test]
fn without_adaptation_envoy_rejects_the_dumps() {
    if !require_root("without_adaptation_envoy_rejects_the_dumps")
        || !require_envoy("without_adaptation_envoy_rejects_the_dumps")
    {
        return;
    }
    for (dump, type_url, stat) in [
        (AUTHZ_DUMP, LISTENER, "listener_manager.lds.update_rejected"),
        (
            DESCRIBE_DUMP,
            CLUSTER,
            "cluster_manager.cds.update_rejected",
        ),
    ] {
        let net = replay(&[dump], &[], &[("XDS_ADAPT", "false")]);
        let pod = &net.pods[0];
        assert!(
            pod.wait_log(
                "fixture-ads",
                &format!("NACK {type_url}"),
                Duration::from_secs(30)
            ),
            "{dump}\n{}",
            net.logs()
        );
        let nack = pod.logs_of("fixture-ads");
        assert!(
            nack.contains("Didn't find a registered implementation"),
            "{dump}\n{nack}"
        );
        assert!(pod.envoy_stat(stat).unwrap() > 0, "{dump}\n{}", net.logs());
        let (code, body) = pod
            .http_get(0, "http://127.0.0.1:15020/healthz/ready")
            .unwrap();
        assert_eq!(code, 503, "{dump}: {body}");
    }
}
