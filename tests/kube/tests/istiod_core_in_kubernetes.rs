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
use cluster::istiod_core;
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
