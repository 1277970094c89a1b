//! Istio's Bookinfo and curl samples in a test cluster, seen as Istio's tasks see them: the
//! samples applied as `kubectl apply` does, the pods' readiness, the product page fetched by the
//! curl sample's app through its sidecar, what a sidecar's Envoy holds, and the checks every
//! control plane under test must pass (certificates and mTLS, the routing samples, scaling).
//! Shared by the tests with Istio's istiod and with istiod-core as the control plane.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};

use crate::Cluster;
use crate::apply;

/// The product page as the curl sample in `default` asks for it.
pub const PRODUCTPAGE_URL: &str = "http://productpage:9080/productpage";
/// What productpage sends for a signed-in jason (the routing samples match on it).
pub const JASON: &str = "Cookie: user=jason";

/// Istio's samples directory of the installed Istio.
pub fn samples() -> PathBuf {
    harness::istio::istio_home().join("samples")
}

/// The text of sample `rel` (e.g. `bookinfo/platform/kube/bookinfo.yaml`).
pub fn sample(rel: &str) -> Result<String> {
    let path = samples().join(rel);
    std::fs::read_to_string(&path)
        .with_context(|| format!("{} (run scripts/setup.sh --tests)", path.display()))
}

/// `kubectl apply -f` of sample `rel` in `namespace`.
pub fn apply_sample(c: &Cluster, rel: &str, namespace: &str) -> Result<()> {
    let text = sample(rel)?;
    c.block_on(apply::apply_yaml(&c.client, &text, Some(namespace)))
        .with_context(|| format!("apply {rel}"))
}

/// `kubectl apply -f` of `text` in `namespace`.
pub fn apply_text(c: &Cluster, text: &str, namespace: &str) -> Result<()> {
    c.block_on(apply::apply_yaml(&c.client, text, Some(namespace)))
}

/// `kubectl delete -f` of sample `rel` in `default`.
pub fn delete_sample(c: &Cluster, rel: &str) -> Result<()> {
    let text = sample(rel)?;
    c.block_on(apply::delete_yaml(&c.client, &text, Some("default")))
        .with_context(|| format!("delete {rel}"))
}

/// Pods of `namespace` (not being deleted).
pub fn pods(c: &Cluster, namespace: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), namespace);
    c.block_on(api.list(&ListParams::default()))
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until `namespace` has `count` pods, all Ready.
pub fn wait_pods_ready(
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
                harness::tail(&c.kubelet.log(), 40)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until a pod of `namespace` whose name starts with `prefix` is Ready.
pub fn wait_named_ready(c: &Cluster, namespace: &str, prefix: &str, limit: Duration) -> Result<()> {
    let ready = harness::wait_until(limit, || {
        pods(c, namespace).iter().any(|p| {
            is_ready(p)
                && p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(prefix))
        })
    });
    ensure!(
        ready,
        "{namespace}: no ready pod {prefix}* after {limit:?}; kubelet log:\n{}",
        harness::tail(&c.kubelet.log(), 40)
    );
    Ok(())
}

/// The name of a pod of `namespace` whose name starts with `prefix`.
pub fn pod_named(c: &Cluster, namespace: &str, prefix: &str) -> Result<String> {
    pods(c, namespace)
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .find(|n| n.starts_with(prefix))
        .with_context(|| format!("no pod {prefix}* in {namespace}"))
}

/// The productpage pod of `default`.
pub fn productpage(c: &Cluster) -> Result<String> {
    pod_named(c, "default", "productpage-v1-")
}

/// `curl` from the curl sample's app container (its traffic captured by its sidecar): the status
/// and body of one GET.
pub fn curl(c: &Cluster, namespace: &str, url: &str, headers: &[&str]) -> Result<(u16, String)> {
    let pod = pod_named(c, namespace, "curl-")?;
    let mut args = vec!["curl", "-s", "-m", "20", "-w", "\n%{http_code}"];
    for h in headers {
        args.extend(["-H", h]);
    }
    args.push(url);
    let out = c.kubelet.exec(namespace, &pod, "curl", &args)?;
    Ok(status_and_body(&out.stdout))
}

/// One request from the node (outside the mesh, as a user's browser) to `url`: its status (0
/// when none came) and body.
pub fn node_get(url: &str) -> Result<(u16, String)> {
    let out = std::process::Command::new("curl")
        .args(["-s", "-m", "10", "-w", "\n%{http_code}", url])
        .output()
        .context("run curl")?;
    Ok(status_and_body(&out.stdout))
}

/// What `curl -w "\n%{http_code}"` printed, as (status, body).
pub fn status_and_body(stdout: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Bookinfo's details (its Service, ServiceAccount and Deployment) and Istio's curl sample, as
/// objects to apply: the smallest client and server pair of Istio's samples.
pub fn details_and_curl() -> Result<Vec<serde_json::Value>> {
    let mut objects: Vec<serde_json::Value> =
        apply::parse_objects(&sample("bookinfo/platform/kube/bookinfo.yaml")?)?
            .into_iter()
            .filter(|o| {
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                name.starts_with("details") || name == "bookinfo-details"
            })
            .collect();
    objects.extend(apply::parse_objects(&sample("curl/curl.yaml")?)?);
    Ok(objects)
}

/// What a pod's sidecar serves on a local port (Envoy's admin, its Prometheus endpoint), fetched
/// from inside the pod.
pub fn pod_local(c: &Cluster, namespace: &str, pod: &str, url: &str) -> Result<String> {
    let run = c
        .kubelet
        .pod(namespace, pod)
        .with_context(|| format!("no running pod {pod}"))?;
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &run.netns, "curl", "-s", "-m", "5", url])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// The connections the Envoy of pod `namespace/pod` opened to the hosts of its clusters whose
/// `/clusters` lines contain `matching` (the hosts' `cx_total`, summed).
pub fn host_connections(c: &Cluster, namespace: &str, pod: &str, matching: &str) -> Result<u64> {
    Ok(
        pod_local(c, namespace, pod, "http://127.0.0.1:15000/clusters")?
            .lines()
            .filter(|l| l.contains(matching) && l.contains("::cx_total::"))
            .filter_map(|l| l.rsplit("::").next()?.parse::<u64>().ok())
            .sum(),
    )
}

/// Sum of an Envoy counter (admin /stats) in a pod, and whether Envoy has it at all.
pub fn envoy_counter(c: &Cluster, namespace: &str, pod: &str, name: &str) -> Result<Option<u64>> {
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

/// Every pod's Envoy has CDS and LDS update_rejected counters, both 0.
pub fn no_update_rejected(c: &Cluster, namespace: &str, pods: &[Pod]) -> Result<()> {
    for p in pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        for stat in [
            "cluster_manager.cds.update_rejected",
            "listener_manager.lds.update_rejected",
        ] {
            let v = envoy_counter(c, namespace, &name, stat)?;
            ensure!(v == Some(0), "{name}: {stat} is {v:?}");
        }
    }
    Ok(())
}

/// Polls the productpage through the mesh until `check` holds for `streak` pages in a row (a
/// route chosen by chance must not pass for one in effect), or fails with the last page seen;
/// returns when the streak began.
pub fn wait_page(
    c: &Cluster,
    headers: &[&str],
    what: &str,
    streak: usize,
    check: impl Fn(u16, &str) -> bool,
) -> Result<Duration> {
    wait_answers(c, "default", PRODUCTPAGE_URL, headers, what, streak, check)
}

/// `wait_page` from `namespace`'s curl to `url`.
pub fn wait_answers(
    c: &Cluster,
    namespace: &str,
    url: &str,
    headers: &[&str],
    what: &str,
    streak: usize,
    check: impl Fn(u16, &str) -> bool,
) -> Result<Duration> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    let mut last = (0, String::new());
    let mut run: Option<Duration> = None;
    let mut n = 0;
    while Instant::now() < deadline {
        let at = started.elapsed();
        last = curl(c, namespace, url, headers)?;
        if check(last.0, &last.1) {
            let first = *run.get_or_insert(at);
            n += 1;
            if n >= streak {
                return Ok(first);
            }
            continue;
        }
        run = None;
        n = 0;
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "{what}: not seen {streak} times in a row in 30 s; last page ({}): {}",
        last.0,
        last.1
    )
}

/// The reviews version (`v1`, `v2`, `v3`) a product page shows.
pub fn reviews_version(page: &str) -> Option<String> {
    let at = page.find("\"version\": \"")? + "\"version\": \"".len();
    page.get(at..at + 2).map(str::to_string)
}

/// The product page shows details and reviews.
pub fn full_page(code: u16, page: &str) -> bool {
    code == 200 && page.contains("William Shakespeare") && page.contains("\"version\": \"v")
}

/// The endpoints (address:port) productpage's Envoy has for `service` of `default`, each with
/// whether Envoy counts it healthy (an endpoint a control plane sends as not ready is listed
/// with `/failed_eds_health`, and no request goes to it).
pub fn envoy_endpoints(c: &Cluster, service: &str) -> BTreeMap<String, bool> {
    let clusters = productpage(c)
        .and_then(|pp| pod_local(c, "default", &pp, "http://127.0.0.1:15000/clusters"))
        .unwrap_or_default();
    let prefix = format!("outbound|9080||{service}.default.svc.cluster.local::");
    let mut out = BTreeMap::new();
    for rest in clusters.lines().filter_map(|l| l.strip_prefix(&prefix)) {
        let mut parts = rest.split("::");
        let (Some(host), Some(stat), Some(value)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if host.contains(':') {
            let healthy = out.entry(host.to_string()).or_insert(true);
            if stat == "health_flags" {
                *healthy = value == "healthy";
            }
        }
    }
    out
}

/// The endpoints (address:port) productpage's Envoy has for `service` of `default`.
pub fn envoy_hosts(c: &Cluster, service: &str) -> BTreeSet<String> {
    envoy_endpoints(c, service).into_keys().collect()
}

/// `kubectl scale deployment/NAME --replicas N` in `default`.
pub fn scale(c: &Cluster, deployment: &str, replicas: i32) -> Result<()> {
    let api: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(c.client.clone(), "default");
    let patch = serde_json::json!({"spec": {"replicas": replicas}});
    c.block_on(api.patch(deployment, &PatchParams::default(), &Patch::Merge(&patch)))
        .with_context(|| format!("scale {deployment} to {replicas}"))?;
    Ok(())
}

/// How long something took to be in effect, by what it was.
pub type Timings = Vec<(String, Duration)>;

/// Records and prints that `what` was in effect `took` after its apply.
fn note(timings: &mut Timings, what: &str, took: Duration) {
    eprintln!("STEP routing: {what} in effect in {took:?}");
    timings.push((what.to_string(), took));
}

/// Workload certificates come from the control plane's CA (the root it publishes as ConfigMap
/// `istio-ca-root-cert`), and traffic between sidecars is mutual TLS: with a STRICT
/// PeerAuthentication, plain text from outside the mesh is refused. Returns the root's serial
/// and how long STRICT took.
pub fn certificates_and_mtls(c: &Cluster) -> Result<(String, Duration)> {
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), "default");
    let root = c
        .block_on(api.get("istio-ca-root-cert"))?
        .data
        .and_then(|d| d.get("root-cert.pem").cloned())
        .context("istio-ca-root-cert without root-cert.pem")?;
    let root_file = c.dir.join("root-cert.pem");
    std::fs::write(&root_file, &root)?;
    let out = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-in"])
        .arg(&root_file)
        .output()?;
    let serial = String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("serial=")
        .to_lowercase();
    ensure!(!serial.is_empty(), "no serial in the published root");
    let certs = pod_local(
        c,
        "default",
        &productpage(c)?,
        "http://127.0.0.1:15000/certs",
    )?;
    let certs: serde_json::Value =
        serde_json::from_str(&certs).with_context(|| format!("Envoy's /certs: {certs}"))?;
    let mut cas = Vec::new();
    let mut spiffe = Vec::new();
    for cert in certs["certificates"].as_array().into_iter().flatten() {
        for ca in cert["ca_cert"].as_array().into_iter().flatten() {
            cas.push(
                ca["serial_number"]
                    .as_str()
                    .unwrap_or_default()
                    .to_lowercase(),
            );
        }
        for chain in cert["cert_chain"].as_array().into_iter().flatten() {
            for san in chain["subject_alt_names"].as_array().into_iter().flatten() {
                spiffe.push(san["uri"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    ensure!(
        cas.contains(&serial),
        "the sidecar's CA is not the published root {serial}: {cas:?}"
    );
    let want = "spiffe://cluster.local/ns/default/sa/bookinfo-productpage";
    ensure!(
        spiffe.iter().any(|s| s == want),
        "productpage's certificate is not {want}: {spiffe:?}"
    );

    // Plain text from the node (outside the mesh) reaches details while the mesh is PERMISSIVE...
    let details = pods(c, "default")
        .into_iter()
        .find(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("details-"))
        })
        .context("no details pod")?;
    let ip = details
        .status
        .and_then(|s| s.pod_ip)
        .context("details has no pod IP")?;
    let plain = || c.block_on(crate::http::http_get_text(&ip, 9080, "/details/0"));
    ensure!(plain().is_ok(), "PERMISSIVE: plain text refused");
    // ... and not once it is STRICT, while mesh traffic goes on.
    let strict = "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata:\n  name: default\nspec:\n  mtls:\n    mode: STRICT\n";
    apply_text(c, strict, "istio-system")?;
    let started = Instant::now();
    ensure!(
        harness::wait_until(Duration::from_secs(20), || plain().is_err()),
        "STRICT: plain text still accepted"
    );
    let took = started.elapsed();
    let (code, page) = curl(c, "default", PRODUCTPAGE_URL, &[])?;
    ensure!(
        code == 200 && page.contains("William Shakespeare"),
        "mesh traffic under STRICT: {code} {page}"
    );
    c.block_on(apply::delete_yaml(&c.client, strict, Some("istio-system")))?;
    Ok((serial, took))
}

/// The samples' VirtualServices and DestinationRules, each in effect within seconds of apply:
/// all to v1, jason to v2, fault abort and delay, a route timeout, retries, 50/50 weights.
pub fn routing_samples(c: &Cluster) -> Result<Timings> {
    let mut timings = Timings::new();
    apply_sample(
        c,
        "bookinfo/networking/destination-rule-all.yaml",
        "default",
    )?;
    apply_sample(
        c,
        "bookinfo/networking/virtual-service-all-v1.yaml",
        "default",
    )?;
    let took = wait_page(c, &[], "all traffic to reviews v1", 8, |code, p| {
        code == 200 && reviews_version(p).as_deref() == Some("v1")
    })?;
    for _ in 0..10 {
        let (_, page) = curl(c, "default", PRODUCTPAGE_URL, &[])?;
        ensure!(
            reviews_version(&page).as_deref() == Some("v1"),
            "virtual-service-all-v1: {page}"
        );
    }
    note(&mut timings, "virtual-service-all-v1", took);

    // Header match: jason (the end-user header productpage sends) to v2, everyone else v1.
    apply_sample(
        c,
        "bookinfo/networking/virtual-service-reviews-test-v2.yaml",
        "default",
    )?;
    let took = wait_page(c, &[JASON], "jason to reviews v2", 8, |_, p| {
        reviews_version(p).as_deref() == Some("v2")
    })?;
    let (_, page) = curl(c, "default", PRODUCTPAGE_URL, &[])?;
    ensure!(
        reviews_version(&page).as_deref() == Some("v1"),
        "not jason: {page}"
    );
    let (_, jasons) = curl(c, "default", PRODUCTPAGE_URL, &[JASON])?;
    ensure!(
        jasons.contains("black"),
        "reviews v2 for jason shows black stars: {jasons}"
    );
    note(&mut timings, "header match (jason -> v2)", took);

    // Fault injection: an abort for jason's calls to ratings, then a 7 s delay that the product
    // page's 3 s timeout (and one retry) does not wait for.
    apply_sample(
        c,
        "bookinfo/networking/virtual-service-ratings-test-abort.yaml",
        "default",
    )?;
    let took = wait_page(c, &[JASON], "ratings aborted for jason", 3, |_, p| {
        p.contains("Ratings service is currently unavailable")
    })?;
    let (_, page) = curl(c, "default", PRODUCTPAGE_URL, &[])?;
    ensure!(
        !page.contains("Ratings service is currently unavailable"),
        "only jason is aborted: {page}"
    );
    note(&mut timings, "fault abort", took);
    apply_sample(
        c,
        "bookinfo/networking/virtual-service-ratings-test-delay.yaml",
        "default",
    )?;
    let took = wait_page(c, &[JASON], "ratings delayed 7 s for jason", 1, |_, p| {
        p.contains("reviews are currently unavailable")
    })?;
    // The check itself waits out productpage's timeouts (about 6 s): not a measure of the push.
    eprintln!("STEP routing: fault delay in effect in {took:?}");
    delete_sample(
        c,
        "bookinfo/networking/virtual-service-ratings-test-delay.yaml",
    )?;

    // Request timeouts, as Istio's task: ratings delayed 2 s, reviews (v2) given 0.5 s.
    apply_text(
        c,
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: ratings\nspec:\n  hosts:\n  - ratings\n  http:\n  - fault:\n      delay:\n        percentage:\n          value: 100\n        fixedDelay: 2s\n    route:\n    - destination:\n        host: ratings\n        subset: v1\n",
        "default",
    )?;
    apply_text(
        c,
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: reviews\nspec:\n  hosts:\n  - reviews\n  http:\n  - route:\n    - destination:\n        host: reviews\n        subset: v2\n    timeout: 0.5s\n",
        "default",
    )?;
    let took = wait_page(c, &[], "reviews timing out after 0.5 s", 3, |_, p| {
        p.contains("reviews are currently unavailable")
    })?;
    let started = Instant::now();
    let (_, page) = curl(c, "default", PRODUCTPAGE_URL, &[])?;
    let one = started.elapsed();
    ensure!(page.contains("reviews are currently unavailable"), "{page}");
    // Not a speed check: without the 0.5 s route timeout the page waits out productpage's own
    // 3 s timeout twice (6 s); with it, two tries of 0.5 s.
    ensure!(
        one < Duration::from_millis(3500),
        "two 0.5 s timeouts took {one:?}"
    );
    eprintln!("STEP routing: a page under the 0.5 s timeout in {one:?}");
    note(&mut timings, "route timeout", took);

    // Retries: the route's retry policy reaches the client's Envoy.
    apply_text(
        c,
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: ratings\nspec:\n  hosts:\n  - ratings\n  http:\n  - route:\n    - destination:\n        host: ratings\n        subset: v1\n    retries:\n      attempts: 4\n      perTryTimeout: 2s\n      retryOn: 5xx,connect-failure\n",
        "default",
    )?;
    let reviews_v2 = pod_named(c, "default", "reviews-v2-")?;
    let started = Instant::now();
    ensure!(
        harness::wait_until(Duration::from_secs(20), || {
            pod_local(
                c,
                "default",
                &reviews_v2,
                "http://127.0.0.1:15000/config_dump?resource=dynamic_route_configs",
            )
            .is_ok_and(|d| {
                d.contains("\"num_retries\": 4")
                    && d.contains("\"retry_on\": \"5xx,connect-failure\"")
            })
        }),
        "reviews-v2's Envoy never got ratings' retry policy"
    );
    note(&mut timings, "retries", started.elapsed());

    // Weights: reviews 50% v1, 50% v3.
    apply_sample(
        c,
        "bookinfo/networking/virtual-service-reviews-50-v3.yaml",
        "default",
    )?;
    delete_sample(
        c,
        "bookinfo/networking/virtual-service-ratings-test-abort.yaml",
    )?;
    let took = wait_page(c, &[], "reviews v3 under 50/50", 1, |_, p| {
        reviews_version(p).as_deref() == Some("v3")
    })?;
    let mut seen = BTreeMap::new();
    for _ in 0..30 {
        let (_, page) = curl(c, "default", PRODUCTPAGE_URL, &[])?;
        *seen
            .entry(reviews_version(&page).unwrap_or_default())
            .or_insert(0) += 1;
    }
    ensure!(
        seen.get("v1").is_some_and(|n| *n >= 5)
            && seen.get("v3").is_some_and(|n| *n >= 5)
            && seen.len() == 2,
        "50/50 v1/v3: {seen:?}"
    );
    eprintln!("STEP routing: weights 50/50 gave {seen:?}");
    note(&mut timings, "weights 50/50 v1/v3", took);
    for rel in [
        "bookinfo/networking/virtual-service-reviews-50-v3.yaml",
        "bookinfo/networking/virtual-service-all-v1.yaml",
    ] {
        delete_sample(c, rel)?;
    }
    Ok(timings)
}

/// Scaling reviews-v1 up to 3 replicas and back to 1 changes the reviews endpoints
/// productpage's Envoy routes to (3 → 5 → 3): how long each took after the scale request until
/// every endpoint Envoy has is one it routes to (healthy), and the count is right. Istio's istiod
/// sends a new pod's endpoint before the pod is Ready, as not healthy; the first time the count
/// was right is printed too.
pub fn scaling(c: &Cluster) -> Result<Timings> {
    let mut timings = Timings::new();
    let now = envoy_hosts(c, "reviews").len();
    ensure!(now == 3, "reviews: {now} hosts before scaling, want 3");
    for (replicas, hosts) in [(3, 5), (1, 3)] {
        let started = Instant::now();
        scale(c, "reviews-v1", replicas)?;
        let mut listed = None;
        let mut last = BTreeMap::new();
        let routed = harness::wait_until(Duration::from_secs(60), || {
            last = envoy_endpoints(c, "reviews");
            if last.len() == hosts {
                listed.get_or_insert(started.elapsed());
            }
            last.len() == hosts && last.values().all(|h| *h)
        });
        ensure!(
            routed,
            "reviews: {last:?} (healthy or not), want {hosts} healthy"
        );
        let took = started.elapsed();
        eprintln!(
            "STEP scaling: reviews-v1 to {replicas}, productpage's Envoy has {hosts} reviews endpoints after {:?}, all healthy after {took:?}",
            listed.unwrap_or(took)
        );
        timings.push((format!("reviews-v1 scaled to {replicas}"), took));
    }
    Ok(timings)
}

/// A Lua EnvoyFilter on productpage's inbound HTTP (before the router), as Istio's users write
/// them: every answer of productpage carries `x-envoy-filter: lua`.
pub const PRODUCTPAGE_LUA: &str = r#"apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata:
  name: productpage-lua
spec:
  workloadSelector:
    labels:
      app: productpage
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_INBOUND
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter:
              name: envoy.filters.http.router
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          inlineCode: |
            function envoy_on_response(response_handle)
              response_handle:headers():add("x-envoy-filter", "lua")
            end
"#;

/// Applies `PRODUCTPAGE_LUA` in `default` (`kubectl apply`) and returns how long until the curl
/// sample's answers from productpage carry its header; the filter is deleted again after.
pub fn productpage_lua(c: &Cluster) -> Result<Duration> {
    apply_text(c, PRODUCTPAGE_LUA, "default")?;
    let started = Instant::now();
    let curl_pod = pod_named(c, "default", "curl-")?;
    let mut last = String::new();
    let applied = harness::wait_until(Duration::from_secs(30), || {
        let args = [
            "curl",
            "-s",
            "-m",
            "10",
            "-o",
            "/dev/null",
            "-D",
            "-",
            PRODUCTPAGE_URL,
        ];
        last = c
            .kubelet
            .exec("default", &curl_pod, "curl", &args)
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        last.to_ascii_lowercase().contains("x-envoy-filter: lua")
    });
    let took = started.elapsed();
    c.block_on(apply::delete_yaml(
        &c.client,
        PRODUCTPAGE_LUA,
        Some("default"),
    ))?;
    ensure!(applied, "the Lua EnvoyFilter is not in effect: {last}");
    Ok(took)
}

/// The names of what productpage's Envoy holds (dynamic listeners with their filter chains,
/// clusters, route configurations), beside those Istio's istiod 1.31 gave the same sidecar of
/// the same sample (`tests/fixtures/istiod-1.31/bookinfo-productpage`), limited to Bookinfo's
/// own (the control plane's services and the cluster's addresses differ by install):
/// `(missing, extra)`, the recorded names productpage's Envoy lacks and the ones it has beyond.
pub fn names_beside_istiod(c: &Cluster) -> Result<(Vec<String>, Vec<String>)> {
    let pp = productpage(c)?;
    let dump: serde_json::Value = serde_json::from_str(&pod_local(
        c,
        "default",
        &pp,
        "http://127.0.0.1:15000/config_dump",
    )?)?;
    let mut ours = BTreeSet::new();
    for config in dump["configs"].as_array().into_iter().flatten() {
        for key in [
            "dynamic_listeners",
            "dynamic_active_clusters",
            "dynamic_route_configs",
        ] {
            for r in config[key].as_array().into_iter().flatten() {
                let any = ["active_state", "cluster", "route_config"]
                    .iter()
                    .map(|k| &r[k])
                    .find(|v| !v.is_null())
                    .unwrap_or(&serde_json::Value::Null);
                let inner = if any["listener"].is_object() {
                    &any["listener"]
                } else {
                    any
                };
                names_of(key, inner, &mut ours);
            }
        }
    }
    let mut theirs = BTreeSet::new();
    for (file, key) in [
        ("lds.json", "dynamic_listeners"),
        ("cds.json", "dynamic_active_clusters"),
        ("rds.json", "dynamic_route_configs"),
    ] {
        for r in istiod_recorded(file)? {
            names_of(key, &r, &mut theirs);
        }
    }
    let bookinfo = |n: &&String| {
        !n.contains("istio-system")
            && !n.contains("kubernetes.default")
            && !n.starts_with("10.")
            && !["0.0.0.0_15010", "0.0.0.0_15014", "15010", "15014"].contains(&n.as_str())
            // Subsets come and go with the DestinationRules the routing samples apply.
            && n.split('|').nth(2).is_none_or(str::is_empty)
    };
    let missing = theirs.difference(&ours).filter(bookinfo).cloned().collect();
    let extra = ours.difference(&theirs).filter(bookinfo).cloned().collect();
    Ok((missing, extra))
}

/// The resources of one response Istio's istiod 1.31 sent Bookinfo's productpage sidecar
/// (`tests/fixtures/istiod-1.31/bookinfo-productpage/sotw/FILE`: `cds.json`, `lds.json`, ...).
pub fn istiod_recorded(file: &str) -> Result<Vec<serde_json::Value>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/istiod-1.31/bookinfo-productpage/sotw")
        .join(file);
    let recorded: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| path.display().to_string())?,
    )?;
    Ok(recorded["resources"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// `kind name`, and for a listener `listener NAME chain CHAIN` for each named filter chain
/// (the default chain among them).
fn names_of(key: &str, r: &serde_json::Value, out: &mut BTreeSet<String>) {
    let Some(name) = r["name"].as_str() else {
        return;
    };
    out.insert(name.to_string());
    if key == "dynamic_listeners" {
        let chains = r["filter_chains"].as_array().into_iter().flatten();
        for fc in chains.chain(Some(&r["default_filter_chain"])) {
            if let Some(chain) = fc["name"].as_str() {
                out.insert(format!("{name} chain {chain}"));
            }
        }
    }
}

/// istiod 1.31's `/debug/endpointz` for the recorded Bookinfo mesh
/// (`tests/fixtures/istiod-1.31/bookinfo-productpage/debug/FILE`).
pub fn istiod_debug_recorded(file: &str) -> Result<serde_json::Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/istiod-1.31/bookinfo-productpage/debug")
        .join(file);
    Ok(serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| path.display().to_string())?,
    )?)
}

/// `ours` (a control plane's `/debug/endpointz`) beside istiod 1.31's for the same Bookinfo
/// (the recorded one), for each Bookinfo host istiod's has: the differences, each naming the
/// host and what differs. Addresses are the cluster's and left out, as is the
/// `pod-template-hash` label's value (a hash of the pod template, which names the image).
/// `SendUnhealthyEndpoints` is left out: istiod 1.31 sends not-ready endpoints as UNHEALTHY
/// (`PILOT_AUTO_SEND_UNHEALTHY_ENDPOINTS`, on by default) and says `true`; istiod-core leaves
/// them out and says `false`. `kubernetes.default` is left out: the test cluster's API server
/// runs without an endpoint reconciler, so the Service has no endpoints here. Everything else
/// (the shards' keys, service accounts, and per endpoint every field istiod writes: labels,
/// locality, ports, identity, TLS mode, workload, node) must be the same.
pub fn endpointz_beside_istiod(ours: &serde_json::Value) -> Result<Vec<String>> {
    let theirs = istiod_debug_recorded("endpointz.json")?;
    let normal = |shard: &serde_json::Value| -> serde_json::Value {
        let mut shard = shard.clone();
        for eps in shard["Shards"]
            .as_object_mut()
            .into_iter()
            .flat_map(|s| s.values_mut())
        {
            if let Some(list) = eps.as_array_mut() {
                for ep in list.iter_mut() {
                    ep["Addresses"] = serde_json::json!(["*"]);
                    if ep["Labels"].get("pod-template-hash").is_some() {
                        ep["Labels"]["pod-template-hash"] = "*".into();
                    }
                    ep["SendUnhealthyEndpoints"] = "*".into();
                }
                list.sort_by_key(|ep| ep.to_string());
            }
        }
        shard
    };
    let mut diffs = Vec::new();
    let bookinfo = |host: &&String| !host.starts_with("kubernetes.");
    for (host, by_ns) in theirs
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(h, _)| bookinfo(h))
    {
        for (ns, shard) in by_ns.as_object().into_iter().flatten() {
            let want = normal(shard);
            let got = normal(&ours[host][ns]);
            if got != want {
                diffs.push(format!(
                    "{host} in {ns}:\n  istiod:      {want}\n  ours:        {got}"
                ));
            }
        }
    }
    Ok(diffs)
}
