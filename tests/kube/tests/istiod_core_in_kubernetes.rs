#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Istio's Bookinfo with istiod-core as the cluster's only control plane: Istio's install
//! (CRDs, mesh and injector ConfigMaps, RBAC, the istiod Service) without istiod or its
//! webhooks, `istiod-core serve --kubeconfig` on the node, and the samples injected by Istio's
//! own injector offline (`istioctl kube-inject` fed the cluster's ConfigMaps). The same checks
//! as with Istio's istiod (`in_kubernetes.rs`), and how long each change takes to be in effect.

use std::time::{Duration, Instant};

use cluster::Cluster;
use cluster::bookinfo::{
    self, Timings, apply_text, full_page, pod_named, reviews_version, wait_page, wait_pods_ready,
};
use cluster::istioctl;
use cluster::istiod_core::{self, IstiodCore};
use cluster::standard_metrics;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, Patch, PatchParams};

/// What "within a second" is held to: generous, so a busy machine does not fail it; the
/// measured figures are printed.
const IN_EFFECT: Duration = Duration::from_secs(5);

#[test]
fn bookinfo_with_istiod_core_as_the_control_plane() {
    if !harness::require_root("bookinfo_with_istiod_core_as_the_control_plane")
        || !harness::require_envoy("bookinfo_with_istiod_core_as_the_control_plane")
    {
        return;
    }
    let mut c = Cluster::start().expect("start the cluster");
    let core = istiod_core::install(&mut c, &[]).expect("install Istio's config and istiod-core");

    // Bookinfo and the curl client, injected by `istioctl kube-inject` and applied as they come
    // out of it; `default` has no injection label and no webhook runs.
    let started = Instant::now();
    for rel in ["bookinfo/platform/kube/bookinfo.yaml", "curl/curl.yaml"] {
        let injected = istiod_core::kube_inject(&c, &bookinfo::sample(rel).unwrap()).unwrap();
        apply_text(&c, &injected, "default").unwrap();
    }
    let inject_took = started.elapsed();
    let default_pods = wait_pods_ready(&c, "default", 7, Duration::from_secs(120)).unwrap();
    eprintln!(
        "STEP pods ready: 7 pods injected by kube-inject ({:.1} s) and Ready {:.1} s after the first apply",
        inject_took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let form = injected_form(&default_pods);
    eprintln!("STEP kube-inject wrote {form} sidecars");

    // Every sidecar's agent is connected to istiod-core, the only control plane.
    let mut proxies = Vec::new();
    assert!(
        harness::wait_until(Duration::from_secs(20), || {
            proxies = core.proxies(&c).unwrap_or_default();
            proxies.len() == 7
        }),
        "istiod-core's connected proxies: {proxies:?}"
    );

    // Bookinfo answers through the mesh: curl → productpage → details and reviews.
    let took = wait_page(
        &c,
        &[],
        "the product page with details and reviews",
        1,
        full_page,
    )
    .unwrap();
    eprintln!("STEP traffic: productpage answered with details and reviews ({took:?} after ready)");

    // Nothing rejected: istiod-core saw no NACK, and every Envoy rejected no update.
    let nacks = core.nacks(&c).unwrap();
    assert!(nacks.is_empty(), "istiod-core saw NACKs: {nacks:#?}");
    bookinfo::no_update_rejected(&c, "default", &default_pods).unwrap();
    eprintln!("STEP no NACK, no update_rejected");

    let (serial, took) = bookinfo::certificates_and_mtls(&c).unwrap();
    root_is_istiod_cores(&c, &serial);
    eprintln!(
        "STEP certificates from istiod-core's CA ({serial}); STRICT mTLS in effect in {took:?}"
    );

    // The names EnvoyFilters match on are istiod's: what productpage's Envoy holds beside what
    // istiod 1.31 gave the same sidecar.
    let (missing, extra) = bookinfo::names_beside_istiod(&c).unwrap();
    assert!(
        missing.is_empty(),
        "names istiod gives productpage's sidecar that istiod-core does not: {missing:?}"
    );
    eprintln!(
        "STEP names: every Bookinfo listener, filter chain, cluster and route name istiod 1.31 gives productpage's sidecar is there; beyond them: {extra:?}"
    );

    // Debugged as Istio's users debug: Istio's istioctl against istiod-core and the sidecars.
    istioctl_debugging(&c, &core);

    // An EnvoyFilter read from the API server, applied by istiod-core, as traffic.
    let took = bookinfo::productpage_lua(&c).unwrap();
    eprintln!("STEP EnvoyFilter: a Lua filter on productpage's inbound in effect in {took:?}");

    let mut timings = bookinfo::routing_samples(&c).unwrap();
    timings.extend(bookinfo::scaling(&c).unwrap());
    timings.extend(label_edits(&c));
    eprintln!("STEP in effect after the change (kubectl apply, scale, label):");
    for (what, took) in &timings {
        eprintln!("  {what}: {:.0} ms", took.as_secs_f64() * 1000.0);
    }
    let slow: Vec<&(String, Duration)> = timings.iter().filter(|(_, t)| *t > IN_EFFECT).collect();
    assert!(slow.is_empty(), "over {IN_EFFECT:?}: {slow:?}");
    let nacks = core.nacks(&c).unwrap();
    assert!(nacks.is_empty(), "istiod-core saw NACKs: {nacks:#?}");

    // Istio's standard metrics from the proxy module, configured by istiod-core: Bookinfo's HTTP
    // series, then Istio's tcp-echo sample (kube-injected beside curl) over TCP.
    standard_metrics::bookinfo_http(&c).unwrap();
    let injected =
        istiod_core::kube_inject(&c, &bookinfo::sample("tcp-echo/tcp-echo.yaml").unwrap()).unwrap();
    apply_text(&c, &injected, "default").unwrap();
    bookinfo::wait_named_ready(&c, "default", "tcp-echo-", Duration::from_secs(60)).unwrap();
    standard_metrics::tcp_echo(&c, "default").unwrap();
}

/// Which injection `istioctl kube-inject` chose offline (no Node to read a kubelet version
/// from), the same for every pod: "native" (istio-proxy an init container that restarts
/// Always) or "classic" (istio-init, then istio-proxy among the containers). Either way the
/// proxy image is ours.
fn injected_form(pods: &[Pod]) -> &'static str {
    let mut forms = Vec::new();
    for p in pods {
        let spec = p.spec.as_ref().unwrap();
        let inits: Vec<&str> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        let proxy = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .find(|c| c.name == "istio-proxy")
            .unwrap_or_else(|| panic!("{:?} has no istio-proxy", p.metadata.name));
        assert_eq!(
            proxy.image.as_deref(),
            Some("localhost/istio-rs/proxyv2:test")
        );
        let form = if inits == ["istio-init", "istio-proxy"]
            && proxy.restart_policy.as_deref() == Some("Always")
        {
            "native"
        } else if inits == ["istio-init"] && spec.containers.iter().any(|c| c.name == "istio-proxy")
        {
            "classic"
        } else {
            panic!(
                "{:?}: neither form: init containers {inits:?}",
                p.metadata.name
            )
        };
        forms.push(form);
    }
    forms.dedup();
    assert_eq!(forms.len(), 1, "mixed forms: {forms:?}");
    forms[0]
}

/// The root the sidecars trust (published in `istio-ca-root-cert`, `serial`) is the one
/// istiod-core keeps in the cluster: Secret `istio-ca-secret` of istio-system, which it created
/// (no `cacerts` is installed).
fn root_is_istiod_cores(c: &Cluster, serial: &str) {
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), "istio-system");
    let secret = c.block_on(secrets.get("istio-ca-secret")).unwrap();
    let pem = secret.data.unwrap()["ca-cert.pem"].0.clone();
    let file = c.dir.join("istio-ca-secret.pem");
    std::fs::write(&file, pem).unwrap();
    let out = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-in"])
        .arg(&file)
        .output()
        .unwrap();
    let kept = String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("serial=")
        .to_lowercase();
    assert_eq!(kept, serial, "istio-ca-secret's root");
}

/// A subset chosen by a pod label: reviews routed to subset `canary` (label `track: canary`),
/// which no pod has; labelling reviews-v3's pod puts it in the subset, taking the label off
/// empties it again. How long each edit took to be in effect.
fn label_edits(c: &Cluster) -> Timings {
    let dr = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: reviews\nspec:\n  host: reviews\n  subsets:\n  - name: canary\n    labels:\n      track: canary\n";
    let vs = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: reviews\nspec:\n  hosts:\n  - reviews\n  http:\n  - route:\n    - destination:\n        host: reviews\n        subset: canary\n";
    apply_text(c, dr, "default").unwrap();
    apply_text(c, vs, "default").unwrap();
    let unavailable = |_: u16, p: &str| p.contains("reviews are currently unavailable");
    wait_page(c, &[], "the empty canary subset", 3, unavailable).unwrap();

    let pod = pod_named(c, "default", "reviews-v3-").unwrap();
    let api: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let label = |value: serde_json::Value| {
        let patch = serde_json::json!({"metadata": {"labels": {"track": value}}});
        c.block_on(api.patch(&pod, &PatchParams::default(), &Patch::Merge(&patch)))
            .unwrap();
    };
    let mut timings = Timings::new();
    // From the edit to the first page of a streak that shows it in effect.
    let started = Instant::now();
    label("canary".into());
    let patched = started.elapsed();
    let took = patched
        + wait_page(c, &[], "reviews-v3 in the canary subset", 5, |code, p| {
            code == 200 && reviews_version(p).as_deref() == Some("v3")
        })
        .unwrap();
    eprintln!("STEP label: track=canary on {pod} in effect in {took:?}");
    timings.push((format!("label track=canary on {pod}"), took));

    let started = Instant::now();
    label(serde_json::Value::Null);
    let patched = started.elapsed();
    let took =
        patched + wait_page(c, &[], "the canary subset empty again", 3, unavailable).unwrap();
    eprintln!("STEP label: track removed from {pod} in effect in {took:?}");
    timings.push((format!("label track removed from {pod}"), took));

    for text in [vs, dr] {
        c.block_on(cluster::apply::delete_yaml(
            &c.client,
            text,
            Some("default"),
        ))
        .unwrap();
    }
    wait_page(c, &[], "every reviews pod again", 3, full_page).unwrap();
    timings
}

/// Istio's `istioctl` 1.31 against istiod-core and Bookinfo's sidecars:
/// - `proxy-status --xds-address` (the `istio.io/debug/syncz` xDS type, over TLS with the
///   bearer token istioctl asks the API server for, istio-system's `default`): every sidecar
///   listed with its subscribed types, each SYNCED;
/// - `proxy-status POD --file` (`istio.io/debug/config_dump` beside the Envoy's own dump):
///   what istiod-core sends is what Envoy holds;
/// - `proxy-config cluster|listener|route --file` on productpage's Envoy dump, beside the same
///   command on what Istio's istiod 1.31 sent the same sidecar (the recorded fixture);
///   `endpoint`, `secret` and `bootstrap` on the sidecar's own.
fn istioctl_debugging(c: &Cluster, core: &IstiodCore) {
    let xds = format!("127.0.0.1:{}", istiod_core::GRPC_PORT);
    let ps = istioctl::ok(c, &["proxy-status", "--xds-address", &xds]).unwrap();
    let rows = istioctl::table(&ps);
    assert_eq!(
        rows.first().map(Vec::as_slice),
        Some(&["NAME", "CLUSTER", "ISTIOD", "VERSION", "SUBSCRIBED TYPES"].map(String::from)[..]),
        "{ps}"
    );
    let proxies = core.proxies(c).unwrap();
    for proxy in &proxies {
        let row = rows
            .iter()
            .find(|r| r.first() == Some(proxy))
            .unwrap_or_else(|| panic!("{proxy} not listed by istioctl proxy-status:\n{ps}"));
        let types = row.last().unwrap();
        assert!(
            types.contains("CDS")
                && types.contains("LDS")
                && types.contains("EDS")
                && types.contains("RDS"),
            "{proxy}: {row:?}"
        );
        assert!(!row.contains(&"MISSING".to_string()), "{row:?}");
    }
    assert_eq!(rows.len(), proxies.len() + 1, "{ps}");
    let verbose = istioctl::ok(
        c,
        &["proxy-status", "--xds-address", &xds, "--verbosity", "1"],
    )
    .unwrap();
    let table = istioctl::table(&verbose);
    let header = &table[0];
    for row in &table[1..] {
        for t in ["CDS", "LDS", "EDS", "RDS"] {
            let i = header
                .iter()
                .position(|h| h == t)
                .unwrap_or_else(|| panic!("no {t}: {header:?}"));
            assert!(
                row[i].starts_with("SYNCED"),
                "{t} of {}: {row:?}\n{verbose}",
                row[0]
            );
        }
    }
    eprintln!(
        "STEP istioctl proxy-status --xds-address: {} proxies, each SYNCED:\n{ps}",
        proxies.len()
    );

    // The config of the mesh istiod 1.31's responses were recorded in (the fixture's SOURCE.md):
    // Bookinfo's destination-rule-all and virtual-service-reviews-v2-v3, STRICT mTLS and
    // authorization on productpage; in effect once productpage's Envoy has the subsets.
    let recorded = [
        bookinfo::sample("bookinfo/networking/destination-rule-all.yaml").unwrap(),
        bookinfo::sample("bookinfo/networking/virtual-service-reviews-v2-v3.yaml").unwrap(),
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../fixtures/istiod-1.31/policy.yaml"),
        )
        .unwrap(),
    ];
    for text in &recorded {
        apply_text(c, text, "default").unwrap();
    }
    let pp = bookinfo::productpage(c).unwrap();
    assert!(
        harness::wait_until(Duration::from_secs(30), || {
            let dump = bookinfo::pod_local(c, "default", &pp, "http://127.0.0.1:15000/config_dump")
                .unwrap_or_default();
            dump.contains("outbound|9080|v3|reviews.default.svc.cluster.local")
                && dump.contains("/virtual-service/reviews")
                && dump.contains("productpage-viewer")
        }),
        "the recorded mesh's config not in productpage's Envoy"
    );

    // istiod's HTTP debug endpoints in istiod's shapes, beside what istiod 1.31 answered for
    // the same mesh: the endpoint shards (every field but the cluster's addresses) and the
    // last push's status (nothing wrong with this config: `{}`).
    let endpointz = core.debug(c, "/debug/endpointz").unwrap();
    let diffs = bookinfo::endpointz_beside_istiod(&endpointz).unwrap();
    assert!(
        diffs.is_empty(),
        "/debug/endpointz beside istiod 1.31's:\n{}",
        diffs.join("\n")
    );
    assert_eq!(core.debug(c, "/debug/endpointShardz").unwrap(), endpointz);
    let push_status = core.debug(c, "/debug/push_status").unwrap();
    assert_eq!(
        push_status,
        bookinfo::istiod_debug_recorded("push_status.json").unwrap()
    );
    eprintln!(
        "STEP /debug/endpointz: Bookinfo's hosts as istiod 1.31 shows them ({} hosts with endpoints in all); /debug/push_status {push_status}",
        endpointz.as_object().map_or(0, |o| o.len())
    );

    // One proxy: istiod-core's config dump of it beside its Envoy's.
    let dump = istioctl::admin_file(c, "default", &pp, "config_dump").unwrap();
    let diff = istioctl::ok(
        c,
        &[
            "proxy-status",
            &format!("{pp}.default"),
            "--xds-address",
            &xds,
            "--file",
            &dump.display().to_string(),
        ],
    )
    .unwrap();
    for kind in ["Listeners Match", "Routes Match"] {
        assert!(
            diff.contains(kind),
            "istioctl proxy-status {pp}.default:\n{diff}"
        );
    }
    // Clusters match: the agent's adaptation to upstream Envoy leaves istiod-core's clusters as
    // they are (the proxy module speaks the exchange their ALPN offers).
    assert!(
        diff.contains("Clusters Match"),
        "istioctl proxy-status {pp}.default:\n{diff}"
    );
    eprintln!(
        "STEP istioctl proxy-status {pp}.default --file: {}",
        diff.lines()
            .filter(|l| l.contains("Match"))
            .collect::<Vec<_>>()
            .join("; ")
    );

    // proxy-config on our sidecar's dump beside istiod's config for the same sidecar.
    let theirs = istioctl::istiod_dump(&c.dir.join("istioctl")).unwrap();
    // Beside the Bookinfo rows: the sidecar's bootstrap (static clusters, the 15021/15090
    // listeners and their routes: in Istio's sidecars too, not in the recorded xDS), the curl
    // sample (not in the recorded mesh) and the cluster's own services.
    let bookinfo_row = |row: &String| {
        !row.contains("STATIC")
            && !row.contains("curl")
            && !row.starts_with("backend ")
            && !row.contains(" 15021 ")
            && !row.contains(" 15090 ")
            && !row.starts_with("0.0.0.0 80 ")
            && !row.starts_with("80 ")
            // Route configurations inline in a listener, which Envoy lists as static.
            && !row.starts_with("inbound|")
            && !row.contains(" inbound|http|")
            && !row.contains("istio-system")
            && !row.contains("kubernetes.default")
            && !row.contains("10.96.")
            && !row.contains("15010")
            && !row.contains("15014")
    };
    for kind in ["cluster", "listener", "route"] {
        let ours = istioctl::proxy_config_rows(c, kind, &dump).unwrap();
        let istiods = istioctl::proxy_config_rows(c, kind, &theirs).unwrap();
        let missing: Vec<&String> = istiods
            .difference(&ours)
            .filter(|r| bookinfo_row(r))
            .collect();
        let extra: Vec<&String> = ours
            .difference(&istiods)
            .filter(|r| bookinfo_row(r))
            .collect();
        eprintln!(
            "STEP istioctl proxy-config {kind} --file: {} rows; beside istiod 1.31's for the same sidecar, missing {missing:?}, extra {extra:?}",
            ours.len()
        );
        assert!(
            missing.is_empty() && extra.is_empty(),
            "istioctl proxy-config {kind}: rows istiod's has and ours lacks {missing:?}, rows ours has beyond istiod's {extra:?}"
        );
    }
    let clusters = istioctl::admin_file(c, "default", &pp, "clusters?format=json").unwrap();
    let endpoints = istioctl::proxy_config_rows(c, "endpoint", &clusters).unwrap();
    assert!(
        endpoints.iter().any(|r| r.contains("HEALTHY")
            && r.ends_with("outbound|9080||reviews.default.svc.cluster.local")),
        "{endpoints:#?}"
    );
    let secrets = istioctl::proxy_config_rows(c, "secret", &dump).unwrap();
    for name in ["default Cert Chain ACTIVE true", "ROOTCA CA ACTIVE true"] {
        assert!(
            secrets.iter().any(|r| r.starts_with(name)),
            "{name}: {secrets:#?}"
        );
    }
    // Without --file: istioctl reaches the pod's admin port through the API server's
    // pods/portforward (the test kubelet's port forwarding), as against a real cluster.
    let pod = format!("{pp}.default");
    let live = istioctl::proxy_config_rows_of(c, "cluster", &pod).unwrap();
    let filed = istioctl::proxy_config_rows(c, "cluster", &dump).unwrap();
    assert_eq!(
        live, filed,
        "istioctl proxy-config cluster {pod}, live beside --file"
    );
    let live_diff = istioctl::ok(c, &["proxy-status", &pod, "--xds-address", &xds]).unwrap();
    assert!(
        live_diff.contains("Listeners Match") && live_diff.contains("Routes Match"),
        "{live_diff}"
    );
    // istioctl prints what Envoy's POST /logging answers: every logger's level after the change.
    let level_of = |out: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix("rbac: ").map(str::to_string))
            .unwrap_or_default()
    };
    let levels = istioctl::ok(c, &["proxy-config", "log", &pod, "--level", "rbac:debug"]).unwrap();
    assert_eq!(level_of(&levels), "debug", "{levels}");
    let levels =
        istioctl::ok(c, &["proxy-config", "log", &pod, "--level", "rbac:warning"]).unwrap();
    assert_eq!(level_of(&levels), "warning", "{levels}");
    // x describe: the pod, its service and port, the DestinationRule and subset that select
    // it, its authorization policies and mTLS mode, read from the cluster and its Envoy.
    let describe = istioctl::ok(c, &["x", "describe", "pod", &pp, "-n", "default"]).unwrap();
    for line in [
        format!("Pod: {pp}"),
        "Service: productpage".to_string(),
        "Port: http 9080/HTTP targets pod port 9080".to_string(),
        "DestinationRule: productpage for \"productpage\"".to_string(),
        "Matching subsets: v1".to_string(),
        "RBAC policies: ns[default]-policy[deny-legacy]-rule[0]".to_string(),
        "Workload mTLS mode: STRICT".to_string(),
    ] {
        assert!(
            describe.lines().any(|l| l.trim() == line),
            "istioctl x describe pod {pp}: no {line:?}:\n{describe}"
        );
    }
    assert!(!describe.contains("NOT READY"), "{describe}");
    eprintln!("STEP istioctl x describe pod {pp}:\n{describe}");
    eprintln!(
        "STEP istioctl through pods/portforward: proxy-config cluster ({} rows, as --file), proxy-status {pod} ({}), proxy-config log --level rbac:debug in Envoy's /logging",
        live.len(),
        live_diff
            .lines()
            .filter(|l| l.contains("Match"))
            .collect::<Vec<_>>()
            .join("; ")
    );

    let bootstrap = istioctl::ok(
        c,
        &[
            "proxy-config",
            "bootstrap",
            "--file",
            &dump.display().to_string(),
            "-o",
            "short",
        ],
    )
    .unwrap();
    eprintln!(
        "STEP istioctl proxy-config endpoint/secret/bootstrap --file: {} endpoints, secrets {secrets:?}, bootstrap {bootstrap:?}",
        endpoints.len()
    );
    bug_report(c);
    for text in &recorded {
        c.block_on(cluster::apply::delete_yaml(
            &c.client,
            text,
            Some("default"),
        ))
        .unwrap();
    }
}

/// `istioctl bug-report` as a user runs it to file an issue: it finishes, and its archive holds,
/// for every sidecar, what it takes from the Envoy through the API server's port forwarding
/// (`config_dump?include_eds`, `clusters`, `certs`, `server_info`, `stats/prometheus`), the
/// proxy container's log (the agent's own lines) and `netstat` run in that container by
/// `pods/exec`; the cluster's resources; and its log says no error but one. Core dumps are skipped
/// (`--skip-coredumps`): what bug-report runs for them, `find /var/lib/istio/data` in the proxy
/// container, finds no such directory under the test kubelet, which gives the proxy its volumes
/// relative to its working directory rather than at their absolute paths (our image has the
/// directory). The one error: `unable to find any Istiod instances`. istiod's own section
/// (`istiod/`: `pilot-discovery request GET debug/...` exec'd in the `discovery` container of
/// an `app=istiod` pod in istio-system) is not there: istiod-core runs on the node, not as a
/// pod of the test cluster.
fn bug_report(c: &Cluster) {
    let t = Instant::now();
    let (root, out) = istioctl::bug_report(c, &["--skip-coredumps"]).unwrap();
    let pods = bookinfo::pods(c, "default");
    assert_eq!(pods.len(), 7, "{out}");
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let dir = root.join("proxies/default").join(&name);
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .unwrap_or_else(|e| panic!("bug-report: {name}/{f}: {e}\n{out}"))
        };
        let dump: serde_json::Value = serde_json::from_str(&read("config_dump?include_eds"))
            .unwrap_or_else(|e| panic!("{name} config_dump: {e}"));
        let types: Vec<&str> = dump["configs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["@type"].as_str())
            .collect();
        assert!(
            types.iter().any(|t| t.ends_with("EndpointsConfigDump"))
                && types.iter().any(|t| t.ends_with("ListenersConfigDump")),
            "{name}: {types:?}"
        );
        assert!(read("clusters").contains("outbound|9080||reviews.default.svc.cluster.local"));
        assert!(
            read("certs").contains("bookinfo-") || name.starts_with("curl"),
            "{name} certs"
        );
        assert!(
            read("stats/prometheus").contains("envoy_server_live"),
            "{name} stats"
        );
        assert!(
            read("server_info").contains("\"state\": \"LIVE\""),
            "{name} server_info"
        );
        assert!(
            read("istio-proxy.log").contains("pilot_agent"),
            "{name} log"
        );
        assert!(
            read("netstat")
                .lines()
                .any(|l| l.contains(":15001") && l.contains("LISTEN")),
            "{name} netstat"
        );
    }
    let resources = std::fs::read_to_string(root.join("cluster/k8s-resources")).unwrap();
    assert!(
        resources.contains("productpage-v1"),
        "cluster/k8s-resources"
    );
    let log = std::fs::read_to_string(root.join("bug-report.log")).unwrap();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("\terror\t") && !l.ends_with("unable to find any Istiod instances"))
        .collect();
    assert!(errors.is_empty(), "bug-report's errors: {errors:#?}");
    assert!(!root.join("istiod").exists());
    eprintln!(
        "STEP istioctl bug-report: {} sidecars' Envoy config, clusters, certs, stats, logs and netstat, the cluster's resources, no error but no istiod pod, in {:.1} s",
        pods.len(),
        t.elapsed().as_secs_f64()
    );
}
