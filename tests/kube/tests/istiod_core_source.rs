#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! istiod-core's Kubernetes source against a real API server: `istiod-core serve --kubeconfig`
//! builds its registry from Services, EndpointSlices (made by the real EndpointSlice
//! controller), Pods and Nodes, and its config from Istio's CRDs and the mesh ConfigMap, as
//! istiod does; every change shows in its `/debug/*` within a second; a refused object is named
//! and its last good version stays; a broken watch (the API server restarted) drops nothing.
//! Pods here are bound to a second Node no kubelet runs: their status is written by the test,
//! as REAL-ISTIO.md verified istiod takes it.

use std::time::{Duration, Instant};

use cluster::Cluster;
use cluster::apply;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const DEBUG_PORT: u16 = 15714;
/// The debug port of the replica serving now (the second one after the first stops).
static SERVING: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(DEBUG_PORT);
const HOST: &str = "reviews.shop.svc.cluster.local";

fn debug(c: &Cluster, path: &str) -> Value {
    let port = SERVING.load(std::sync::atomic::Ordering::Relaxed);
    c.block_on(cluster::kubelet::http_get_text("127.0.0.1", port, path))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

/// Waits until `check` holds for what `path` serves; returns how long it took.
fn wait_debug(c: &Cluster, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Duration {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(20);
    loop {
        let v = debug(c, path);
        if check(&v) {
            return started.elapsed();
        }
        if Instant::now() > deadline {
            panic!("{what}: not seen in {path} within 20 s; it serves:\n{v:#}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The endpoint of `HOST` at `ip`, as /debug/endpointz shows it (istiod's shape: host →
/// namespace → `Shards` → `PROVIDER/CLUSTER` → endpoints).
fn endpoint(v: &Value, ip: &str) -> Option<Value> {
    v[HOST]["shop"]["Shards"]
        .as_object()?
        .values()
        .filter_map(Value::as_array)
        .flatten()
        .find(|e| e["Addresses"][0] == ip)
        .cloned()
}

fn create_pod(c: &Cluster, name: &str, version: &str, ip: &str) {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "shop");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "app": "reviews", "version": version, "security.istio.io/tlsMode": "istio",
        }},
        "spec": {
            "nodeName": "node-b",
            "serviceAccountName": "bookinfo-reviews",
            "containers": [{"name": "reviews", "image": "reviews", "ports": [{"containerPort": 9080}]}],
        },
    }))
    .unwrap();
    c.block_on(pods.create(&PostParams::default(), &pod))
        .unwrap();
    let now = cluster::cluster::now_rfc3339();
    let status = json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "10.244.0.2",
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": [{"name": "reviews", "image": "reviews", "imageID": "", "ready": true,
            "restartCount": 0, "started": true, "state": {"running": {"startedAt": now}}}],
    }});
    c.block_on(pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)))
        .unwrap();
}

/// `istiod-core serve --kubeconfig` as the replica `name`, writing config status.
fn start_istiod_core(c: &mut Cluster, name: &str, grpc: u16, debug: u16) {
    let bin = harness::binary("istiod-core");
    let args: Vec<String> = vec![
        bin.display().to_string(),
        "serve".into(),
        format!("--kubeconfig={}", c.kubeconfig.display()),
        format!("--grpc-addr=127.0.0.1:{grpc}"),
        format!("--debug-addr=127.0.0.1:{debug}"),
    ];
    let env: Vec<(String, String)> = [
        ("POD_NAMESPACE", "istio-system"),
        ("POD_NAME", name),
        ("PILOT_ENABLE_STATUS", "true"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let cwd = c.dir.join(name);
    std::fs::create_dir_all(&cwd).unwrap();
    let log = c.logs_dir().join(format!("{name}.log"));
    let p = harness::Proc::start(name, &args, &env, &cwd, &log).unwrap();
    c.adopt(p);
}

/// The `Reconciled` condition istiod-core wrote on the DestinationRule `reviews`.
fn reconciled(c: &Cluster) -> Option<Value> {
    let ar = kube::api::ApiResource {
        group: "networking.istio.io".into(),
        version: "v1".into(),
        api_version: "networking.istio.io/v1".into(),
        kind: "DestinationRule".into(),
        plural: "destinationrules".into(),
    };
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(c.client.clone(), "shop", &ar);
    let dr = c.block_on(api.get_opt("reviews")).ok().flatten()?;
    let status = dr.data.get("status")?;
    let cond = status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Reconciled")?
        .clone();
    Some(json!({"observedGeneration": status["observedGeneration"], "condition": cond}))
}

/// `status.addresses` of the ServiceEntry `shop/NAME`, as (host, value), once it has the field.
fn entry_addresses(c: &Cluster, name: &str) -> Option<Vec<(String, String)>> {
    let ar = kube::api::ApiResource {
        group: "networking.istio.io".into(),
        version: "v1".into(),
        api_version: "networking.istio.io/v1".into(),
        kind: "ServiceEntry".into(),
        plural: "serviceentries".into(),
    };
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(c.client.clone(), "shop", &ar);
    let se = c.block_on(api.get_opt(name)).ok().flatten()?;
    let list = se.data.get("status")?.get("addresses")?.as_array()?.clone();
    Some(
        list.iter()
            .map(|a| {
                (
                    a["host"].as_str().unwrap_or_default().to_string(),
                    a["value"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect(),
    )
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(h, v)| (h.to_string(), v.to_string()))
        .collect()
}

fn lease_holder(c: &Cluster) -> Option<String> {
    let api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.client.clone(), "istio-system");
    c.block_on(api.get_opt("istio-status-leader"))
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

fn wait_for<T>(what: &str, limit: Duration, f: impl Fn() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("{what}: not within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn apply_retrying(c: &Cluster, yaml: &str) {
    // A CRD applied a moment ago may not be established yet.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match c.block_on(apply::apply_yaml(&c.client, yaml, Some("shop"))) {
            Ok(()) => return,
            Err(e) if Instant::now() < deadline => {
                eprintln!("apply: {e:#}; again");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("apply: {e:#}"),
        }
    }
}

#[test]
fn istiod_core_follows_the_api_server() {
    if !harness::require_root("istiod_core_follows_the_api_server") {
        return;
    }
    let mut c = Cluster::start().expect("start the cluster");
    // Istio's CRDs and mesh ConfigMap, as istioctl renders them for istiod.
    let istioctl = harness::istio::istio_bin("istioctl").unwrap();
    let out = std::process::Command::new(&istioctl)
        .args(cluster::istio::manifest_args(&[]))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objects = apply::parse_objects(&String::from_utf8(out.stdout).unwrap()).unwrap();
    let wanted: Vec<Value> = objects
        .into_iter()
        .filter(|o| {
            o["kind"] == "CustomResourceDefinition"
                || (o["kind"] == "ConfigMap" && o["metadata"]["name"] == "istio")
        })
        .collect();
    assert!(wanted.len() > 10, "CRDs and the mesh ConfigMap rendered");
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}});
    c.block_on(async {
        apply::apply_object(&c.client, &ns, None).await?;
        apply::apply_all(&c.client, &wanted, Some("istio-system")).await
    })
    .unwrap();
    // A second node, in another zone, that no kubelet runs.
    let nodes: Api<Node> = Api::all(c.client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-b", "labels": {
        "topology.kubernetes.io/region": "region-2", "topology.kubernetes.io/zone": "zone-2",
        "topology.istio.io/subzone": "rack-7",
    }}}))
    .unwrap();
    c.block_on(nodes.create(&PostParams::default(), &node))
        .unwrap();
    apply_retrying(
        &c,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: bookinfo-reviews, namespace: shop}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: reviews, namespace: shop}\nspec:\n  selector: {app: reviews}\n  ports: [{name: http, port: 9080}]\n",
    );
    create_pod(&c, "reviews-v1", "v1", "10.244.9.11");

    let started = Instant::now();
    start_istiod_core(&mut c, "istiod-core-a", 15710, DEBUG_PORT);

    // The pod is the endpoint: its labels, service account, tlsMode and its node's locality.
    let took = wait_debug(&c, "/debug/endpointz", "reviews-v1 as its pod", |v| {
        endpoint(v, "10.244.9.11").is_some_and(|e| {
            e["Labels"]["version"] == "v1"
                && e["ServiceAccount"] == "spiffe://cluster.local/ns/shop/sa/bookinfo-reviews"
                && e["TLSMode"] == "istio"
                && e["Locality"]["Label"] == "region-2/zone-2/rack-7"
                && e["WorkloadName"] == "reviews-v1"
        })
    });
    eprintln!(
        "STEP serving the cluster's registry {:.2} s after start ({took:?} waiting on it)",
        started.elapsed().as_secs_f64()
    );
    let configz = debug(&c, "/debug/configz");
    let mesh = configz
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "MeshConfig")
        .unwrap_or_else(|| panic!("no MeshConfig from the istio ConfigMap: {configz:#}"));
    assert_eq!(mesh["origin"], "kubernetes", "{mesh:#}");

    // Scaling: a new ready pod is an endpoint within a second of the EndpointSlice controller.
    let t = Instant::now();
    create_pod(&c, "reviews-v2", "v2", "10.244.9.12");
    wait_debug(&c, "/debug/endpointz", "reviews-v2 added", |v| {
        endpoint(v, "10.244.9.12").is_some_and(|e| e["Labels"]["version"] == "v2")
    });
    let scale = t.elapsed();
    eprintln!("STEP a new pod is an endpoint {scale:?} after its Ready status was written");

    // A label edit on the pod: the endpoint's labels follow (subsets select by them).
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "shop");
    let t = Instant::now();
    c.block_on(pods.patch(
        "reviews-v2",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"version": "v3"}}})),
    ))
    .unwrap();
    wait_debug(&c, "/debug/endpointz", "the label edit", |v| {
        endpoint(v, "10.244.9.12").is_some_and(|e| e["Labels"]["version"] == "v3")
    });
    let relabel = t.elapsed();
    eprintln!("STEP a pod's label edit is in its endpoint after {relabel:?}");

    // Istio's CRDs: a DestinationRule applied is in force, from Kubernetes.
    let t = Instant::now();
    apply_retrying(
        &c,
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: shop}\nspec:\n  host: reviews\n  subsets:\n  - {name: v1, labels: {version: v1}}\n  - {name: v3, labels: {version: v3}}\n",
    );
    wait_debug(&c, "/debug/configz", "the DestinationRule", |v| {
        v.as_array().is_some_and(|all| {
            all.iter().any(|r| {
                r["kind"] == "DestinationRule"
                    && r["metadata"]["name"] == "reviews"
                    && r["origin"] == "kubernetes"
            })
        })
    });
    let crd = t.elapsed();
    eprintln!("STEP an applied DestinationRule is in force after {crd:?}");
    // Its status says so, written by the holder of the status Lease.
    let accepted = wait_for("the accepted status", Duration::from_secs(10), || {
        reconciled(&c).filter(|s| s["condition"]["status"] == "True")
    });
    assert_eq!(accepted["observedGeneration"], 1, "{accepted:#}");
    assert_eq!(lease_holder(&c).as_deref(), Some("istiod-core-a"));
    // ... and the subset's cluster has the relabelled pod only.
    for (what, took) in [("scale", scale), ("relabel", relabel), ("apply", crd)] {
        assert!(took < Duration::from_secs(5), "{what} took {took:?}");
    }

    // An invalid edit the API server's schema lets through (Istio's validating webhook would
    // refuse it; none runs here): refused by name, the last good version stays in force.
    apply_retrying(
        &c,
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy: {outlierDetection: {maxEjectionPercent: 150}}\n",
    );
    wait_debug(&c, "/debug/configz", "the refusal", |v| {
        v.as_array().is_some_and(|all| {
            all.iter().any(|r| {
                r["rejected"]["object"] == "DestinationRule shop/reviews"
                    && r["rejected"]["last_good_kept"] == true
            })
        })
    });
    let configz = debug(&c, "/debug/configz");
    let dr = configz
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "DestinationRule")
        .unwrap();
    assert_eq!(
        dr["spec"]["subsets"].as_array().map(Vec::len),
        Some(2),
        "{dr:#}"
    );
    // ... and its status says why, for `kubectl get -o yaml`.
    let refused = wait_for("the refused status", Duration::from_secs(10), || {
        reconciled(&c).filter(|s| s["condition"]["status"] == "False")
    });
    assert_eq!(refused["observedGeneration"], 2, "{refused:#}");
    assert_eq!(refused["condition"]["reason"], "Refused", "{refused:#}");
    assert!(
        refused["condition"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("maxEjectionPercent")),
        "{refused:#}"
    );

    // DNS auto-allocation recorded as Istio's allocation controller records it: the DNS-proxy
    // docs' address-less `external-auto` gets the first addresses of both ranges in its
    // `status.addresses`.
    apply_retrying(
        &c,
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: external-auto, namespace: shop}\nspec:\n  hosts: [auto.internal]\n  ports: [{name: http, number: 80, protocol: HTTP}]\n  resolution: DNS\n",
    );
    let t = Instant::now();
    let first = pairs(&[
        ("auto.internal", "240.240.0.1"),
        ("auto.internal", "2001:2::1"),
    ]);
    wait_for(
        "external-auto's addresses recorded",
        Duration::from_secs(10),
        || entry_addresses(&c, "external-auto").filter(|a| *a == first),
    );
    eprintln!(
        "STEP an address-less ServiceEntry's allocated addresses are in its status {:?} after the apply",
        t.elapsed()
    );

    // A second replica does not write while the first holds the Lease; when the first stops,
    // it takes the Lease over and writes the next status.
    start_istiod_core(&mut c, "istiod-core-b", 15711, DEBUG_PORT + 1);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(lease_holder(&c).as_deref(), Some("istiod-core-a"));
    c.stop_component("istiod-core-a", Duration::from_secs(10));
    SERVING.store(DEBUG_PORT + 1, std::sync::atomic::Ordering::Relaxed);
    let t = Instant::now();
    wait_for(
        "istiod-core-b holding the Lease",
        Duration::from_secs(30),
        || lease_holder(&c).filter(|h| h == "istiod-core-b"),
    );
    eprintln!(
        "STEP the second replica took the status Lease {:?} after the first stopped",
        t.elapsed()
    );
    apply_retrying(
        &c,
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: shop}\nspec:\n  host: reviews\n  subsets:\n  - {name: v1, labels: {version: v1}}\n  - {name: v3, labels: {version: v3}}\n",
    );
    wait_for(
        "the fixed status from the new holder",
        Duration::from_secs(10),
        || {
            reconciled(&c)
                .filter(|s| s["condition"]["status"] == "True" && s["observedGeneration"] == 3)
        },
    );
    // The second replica, which never allocated, keeps what the record says: a new entry gets
    // the next addresses, and `external-auto` keeps its own.
    apply_retrying(
        &c,
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: external-svc-1, namespace: shop}\nspec:\n  hosts: [tcp-echo.external-1.svc.cluster.local]\n  ports: [{name: external-svc-1, number: 9000, protocol: TCP}]\n  resolution: DNS\n",
    );
    let second = pairs(&[
        ("tcp-echo.external-1.svc.cluster.local", "240.240.0.2"),
        ("tcp-echo.external-1.svc.cluster.local", "2001:2::2"),
    ]);
    wait_for(
        "external-svc-1's addresses from the new holder",
        Duration::from_secs(30),
        || entry_addresses(&c, "external-svc-1").filter(|a| *a == second),
    );
    assert_eq!(entry_addresses(&c, "external-auto"), Some(first));
    // Opted out by Istio's label: its addresses are cleared.
    apply_retrying(
        &c,
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: external-auto, namespace: shop, labels: {networking.istio.io/enable-autoallocate-ip: \"false\"}}\nspec:\n  hosts: [auto.internal]\n  ports: [{name: http, number: 80, protocol: HTTP}]\n  resolution: DNS\n",
    );
    wait_for(
        "external-auto's addresses cleared",
        Duration::from_secs(10),
        || entry_addresses(&c, "external-auto").filter(Vec::is_empty),
    );
    eprintln!(
        "STEP the next replica kept the recorded addresses, gave the next ones, and cleared an opted-out entry's"
    );

    // The mesh ConfigMap edited: the new MeshConfig is in force.
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(c.client.clone(), "istio-system");
    let mut cm = c.block_on(cms.get("istio")).unwrap();
    let mesh_text = cm.data.as_ref().unwrap()["mesh"].clone();
    cm.data.as_mut().unwrap().insert(
        "mesh".into(),
        format!("{mesh_text}\noutboundTrafficPolicy:\n  mode: REGISTRY_ONLY\n"),
    );
    cm.metadata.managed_fields = None;
    c.block_on(cms.replace("istio", &PostParams::default(), &cm))
        .unwrap();
    wait_debug(&c, "/debug/configz", "the mesh ConfigMap edit", |v| {
        v.as_array().is_some_and(|all| {
            all.iter()
                .any(|r| r["kind"] == "MeshConfig" && r.to_string().contains("REGISTRY_ONLY"))
        })
    });

    // discoverySelectors: a namespace not selected is not seen (its services gone) until its
    // labels match.
    let mut cm = c.block_on(cms.get("istio")).unwrap();
    let mesh_text = cm.data.as_ref().unwrap()["mesh"].clone();
    cm.data.as_mut().unwrap().insert(
        "mesh".into(),
        format!("{mesh_text}\ndiscoverySelectors:\n- matchLabels: {{mesh: \"on\"}}\n"),
    );
    cm.metadata.managed_fields = None;
    c.block_on(cms.replace("istio", &PostParams::default(), &cm))
        .unwrap();
    wait_debug(&c, "/debug/endpointz", "shop not selected", |v| {
        v.is_object() && v.get(HOST).is_none()
    });
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.client.clone());
    let t = Instant::now();
    c.block_on(namespaces.patch(
        "shop",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"mesh": "on"}}})),
    ))
    .unwrap();
    wait_debug(&c, "/debug/endpointz", "shop selected again", |v| {
        endpoint(v, "10.244.9.11").is_some()
    });
    eprintln!(
        "STEP a namespace labelled into discoverySelectors is seen after {:?}",
        t.elapsed()
    );

    // The API server goes away for 3 s: nothing served is dropped; once it is back, the
    // watches resume and a change made then is seen.
    let before = debug(&c, "/debug/endpointz");
    c.restart_apiserver(Duration::from_secs(3)).unwrap();
    let during = debug(&c, "/debug/endpointz");
    assert_eq!(
        before[HOST], during[HOST],
        "endpoints kept across the outage"
    );
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "shop");
    c.block_on(pods.patch(
        "reviews-v1",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"version": "v4"}}})),
    ))
    .unwrap();
    let resumed = wait_debug(&c, "/debug/endpointz", "a change after the restart", |v| {
        endpoint(v, "10.244.9.11").is_some_and(|e| e["Labels"]["version"] == "v4")
    });
    eprintln!("STEP after an API server restart, a label edit was seen in {resumed:?}");

    // A deleted pod is no endpoint.
    c.block_on(pods.delete("reviews-v2", &DeleteParams::default().grace_period(0)))
        .unwrap();
    wait_debug(&c, "/debug/endpointz", "the deleted pod gone", |v| {
        endpoint(v, "10.244.9.12").is_none() && endpoint(v, "10.244.9.11").is_some()
    });
    let log = std::fs::read_to_string(c.logs_dir().join("istiod-core-b.log")).unwrap_or_default();
    assert!(!log.contains("panicked"), "{log}");
}
