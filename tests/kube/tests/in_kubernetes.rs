//! Istio's Bookinfo in a real Kubernetes control plane: Istio's istiod and its sidecar injector
//! (installed as `istioctl manifest generate` renders it, the proxy image ours) mutate every pod
//! of an `istio-injection=enabled` namespace, and the test kubelet runs exactly what the
//! injector wrote: our `istio-iptables` and our `pilot-agent proxy sidecar`, with Istio's args,
//! env and volumes. One cluster for the whole test (a few seconds to start); each step says
//! what it proves.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cluster::Cluster;
use cluster::apply;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

fn samples() -> std::path::PathBuf {
    harness::istio::istio_home().join("samples")
}

fn sample(rel: &str) -> String {
    let path = samples().join(rel);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup.sh --tests)", path.display()))
}

/// Pods of `namespace` (not being deleted).
fn pods(c: &Cluster, namespace: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), namespace);
    c.block_on(api.list(&ListParams::default()))
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until `namespace` has `count` pods, all Ready.
fn wait_pods_ready(
    c: &Cluster,
    namespace: &str,
    count: usize,
    limit: Duration,
) -> Result<Vec<Pod>> {
    let deadline = Instant::now() + limit;
    loop {
        let ps = pods(c, namespace);
        if ps.len() == count && ps.iter().all(is_ready) {
            return Ok(ps);
        }
        if Instant::now() > deadline {
            let states: Vec<String> = ps
                .iter()
                .map(|p| {
                    format!(
                        "{} ready={} phase={:?} message={:?}",
                        p.metadata.name.clone().unwrap_or_default(),
                        is_ready(p),
                        p.status.as_ref().and_then(|s| s.phase.clone()),
                        p.status.as_ref().and_then(|s| s.message.clone())
                    )
                })
                .collect();
            bail!(
                "{namespace}: want {count} ready pods after {limit:?}, have:\n{}\nkubelet log:\n{}",
                states.join("\n"),
                cluster::cluster::tail(&c.kubelet.log(), 40)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn pod_named(c: &Cluster, namespace: &str, prefix: &str) -> Result<String> {
    pods(c, namespace)
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .find(|n| n.starts_with(prefix))
        .with_context(|| format!("no pod {prefix}* in {namespace}"))
}

/// `curl` from the curl sample's app container (its traffic captured by its sidecar): the status
/// and body of one GET.
fn curl(c: &Cluster, namespace: &str, url: &str, headers: &[&str]) -> Result<(u16, String)> {
    let pod = pod_named(c, namespace, "curl-")?;
    let mut args = vec!["curl", "-s", "-m", "20", "-w", "\n%{http_code}"];
    for h in headers {
        args.extend(["-H", h]);
    }
    args.push(url);
    let out = c.kubelet.exec(namespace, &pod, "curl", &args)?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Ok((code.trim().parse().unwrap_or(0), body.to_string()))
}

/// What a pod's sidecar serves on a local port (Envoy's admin, its Prometheus endpoint), fetched
/// from inside the pod.
fn pod_local(c: &Cluster, namespace: &str, pod: &str, url: &str) -> Result<String> {
    let run = c
        .kubelet
        .pod(namespace, pod)
        .with_context(|| format!("no running pod {pod}"))?;
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &run.netns, "curl", "-s", "-m", "5", url])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// Sum of an Envoy counter (admin /stats) in a pod, and whether Envoy has it at all.
fn envoy_counter(c: &Cluster, namespace: &str, pod: &str, name: &str) -> Result<Option<u64>> {
    let text = pod_local(
        c,
        namespace,
        pod,
        &format!("http://127.0.0.1:15000/stats?filter=^{name}$"),
    )?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(": "))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().parse::<u64>().unwrap_or(0))
        .reduce(|a, b| a + b))
}

/// The `istio_requests_total` series of a pod's sidecar (15090), as label maps with values.
fn requests_total(
    c: &Cluster,
    namespace: &str,
    pod: &str,
) -> Result<Vec<(BTreeMap<String, String>, f64)>> {
    let text = pod_local(c, namespace, pod, "http://127.0.0.1:15090/stats/prometheus")?;
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("istio_requests_total{"))
    {
        let Some((labels, value)) = line["istio_requests_total{".len()..].rsplit_once("} ") else {
            continue;
        };
        let mut map = BTreeMap::new();
        for kv in labels.split("\",") {
            if let Some((k, v)) = kv.split_once("=\"") {
                map.insert(k.to_string(), v.trim_end_matches('"').to_string());
            }
        }
        out.push((map, value.trim().parse().unwrap_or(0.0)));
    }
    Ok(out)
}

fn apply_sample(c: &Cluster, rel: &str, namespace: &str) -> Result<()> {
    let text = sample(rel);
    c.block_on(apply::apply_yaml(&c.client, &text, Some(namespace)))
        .with_context(|| format!("apply {rel}"))
}

fn apply_text(c: &Cluster, text: &str, namespace: &str) -> Result<()> {
    c.block_on(apply::apply_yaml(&c.client, text, Some(namespace)))
}

/// Polls the productpage through the mesh until `check` holds for a page, or fails with the
/// last page seen.
fn wait_page(
    c: &Cluster,
    headers: &[&str],
    what: &str,
    check: impl Fn(u16, &str) -> bool,
) -> Result<Duration> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    let mut last = (0, String::new());
    while Instant::now() < deadline {
        last = curl(c, "default", "http://productpage:9080/productpage", headers)?;
        if check(last.0, &last.1) {
            return Ok(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!(
        "{what}: not seen in 30 s; last page ({}): {}",
        last.0,
        last.1
    )
}

fn reviews_version(page: &str) -> Option<String> {
    let at = page.find("\"version\": \"")? + "\"version\": \"".len();
    Some(page[at..at + 2].to_string())
}

#[test]
fn bookinfo_through_istios_injector() {
    if !harness::require_root("bookinfo_through_istios_injector")
        || !harness::require_envoy("bookinfo_through_istios_injector")
    {
        return;
    }
    let mut c = Cluster::start().expect("start the cluster");
    let istiod = cluster::istio::install(&mut c, &[]).expect("install Istio");

    // The injection-enabled namespace, Bookinfo and the curl client as Istio's samples have them.
    apply_text(&c, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n  labels:\n    istio-injection: enabled\n", "default").unwrap();
    // The classic form (istio-init + istio-proxy container) beside the native one: the curl
    // sample again, in a namespace of its own, its pods annotated sidecar.istio.io/nativeSidecar=false.
    apply_text(&c, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: classic\n  labels:\n    istio-injection: enabled\n", "classic").unwrap();
    let started = Instant::now();
    apply_sample(&c, "bookinfo/platform/kube/bookinfo.yaml", "default").unwrap();
    apply_sample(&c, "curl/curl.yaml", "default").unwrap();
    let mut classic = apply::parse_objects(&sample("curl/curl.yaml")).unwrap();
    for o in classic.iter_mut().filter(|o| o["kind"] == "Deployment") {
        o["spec"]["template"]["metadata"]["annotations"]["sidecar.istio.io/nativeSidecar"] =
            "false".into();
    }
    c.block_on(apply::apply_all(&c.client, &classic, Some("classic")))
        .unwrap();

    let default_pods = wait_pods_ready(&c, "default", 7, Duration::from_secs(120)).unwrap();
    wait_pods_ready(&c, "classic", 1, Duration::from_secs(60)).unwrap();
    eprintln!(
        "STEP pods ready: 8 pods through the injector in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // What the injector wrote: native sidecars here (the Node's kubelet is 1.36), classic there.
    for p in &default_pods {
        let spec = p.spec.as_ref().unwrap();
        let inits: Vec<&str> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            inits,
            ["istio-init", "istio-proxy"],
            "{:?}",
            p.metadata.name
        );
        let proxy = &spec.init_containers.as_ref().unwrap()[1];
        assert_eq!(proxy.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            proxy.image.as_deref(),
            Some("localhost/istio-rs/proxyv2:test")
        );
    }
    let classic_pod = pods(&c, "classic").remove(0);
    let spec = classic_pod.spec.as_ref().unwrap();
    assert!(spec.containers.iter().any(|c| c.name == "istio-proxy"));
    assert_eq!(
        spec.init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["istio-init"]
    );

    // Bookinfo answers through the mesh: curl → productpage → details and reviews.
    let took = wait_page(
        &c,
        &[],
        "the product page with details and reviews",
        |code, page| {
            code == 200 && page.contains("William Shakespeare") && page.contains("\"version\": \"v")
        },
    )
    .unwrap();
    eprintln!("STEP traffic: productpage answered with details and reviews ({took:?} after ready)");
    let (code, _) = curl(
        &c,
        "classic",
        "http://productpage.default:9080/productpage",
        &[],
    )
    .unwrap();
    assert_eq!(code, 200, "from the classic-form client");

    // Nothing rejected: istiod saw no NACK, and every Envoy rejected no update.
    let metrics = c
        .block_on(cluster::kubelet::http_get_text(
            "127.0.0.1",
            15014,
            "/metrics",
        ))
        .unwrap();
    let rejects: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("pilot_total_xds_rejects"))
        .collect();
    assert!(rejects.is_empty(), "istiod counted NACKs: {rejects:?}");
    for p in &default_pods {
        let name = p.metadata.name.clone().unwrap();
        for stat in [
            "cluster_manager.cds.update_rejected",
            "listener_manager.lds.update_rejected",
        ] {
            let v = envoy_counter(&c, "default", &name, stat).unwrap();
            assert_eq!(v, Some(0), "{name}: {stat}");
        }
    }
    eprintln!("STEP no NACK, no update_rejected");

    let _ = istiod;
}
