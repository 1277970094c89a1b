#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Istio's Bookinfo with the Kubernetes Gateway API, as Istio's docs walk a user through it:
//! the Gateway API CRDs (standard channel), Istio installed, `samples/bookinfo/gateway-api`
//! applied verbatim. istiod deploys the Gateway (our `pilot-agent proxy router`), the cluster's
//! load balancer gives it an address, the product page answers there; then the GAMMA route
//! (`route-reviews-90-10.yaml`, an HTTPRoute whose parent is the reviews Service) splits the
//! sidecars' calls to reviews 90/10 between v1 and v2, and `route-reviews-v1.yaml` sends all to v1.

use std::time::{Duration, Instant};

use cluster::Cluster;
use cluster::bookinfo::{
    apply_sample, apply_text, curl, full_page, reviews_version, wait_page, wait_pods_ready,
};
use cluster::gateway_api;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;

const PRODUCTPAGE: &str = "http://productpage:9080/productpage";

/// The address the load balancer gave the Gateway's Service (istiod names it
/// `GATEWAY-CLASS`), once it has one.
fn gateway_address(c: &Cluster, service: &str) -> Option<String> {
    let api: Api<Service> = Api::namespaced(c.client.clone(), "default");
    let svc = c.block_on(api.get_opt(service)).ok().flatten()?;
    svc.status?.load_balancer?.ingress?.first()?.ip.clone()
}

/// One request from the node to `url` (`bookinfo::node_get`).
fn get(url: &str) -> (u16, String) {
    cluster::bookinfo::node_get(url).unwrap()
}

/// How many of `n` product pages show reviews `v1`, `v2`, `v3`.
fn versions(c: &Cluster, n: usize) -> [usize; 3] {
    let mut seen = [0; 3];
    for _ in 0..n {
        let (_, page) = curl(c, "default", PRODUCTPAGE, &[]).unwrap();
        match reviews_version(&page).as_deref() {
            Some("v1") => seen[0] += 1,
            Some("v2") => seen[1] += 1,
            Some("v3") => seen[2] += 1,
            _ => panic!("a page without reviews: {page}"),
        }
    }
    seen
}

#[test]
fn bookinfo_with_the_gateway_api() {
    if !harness::require_root("bookinfo_with_the_gateway_api")
        || !harness::require_envoy("bookinfo_with_the_gateway_api")
    {
        return;
    }
    let mut c = Cluster::start().expect("start the cluster");
    gateway_api::install_crds(&c, "standard").expect("install the Gateway API CRDs");
    cluster::istio::install(&mut c, &[]).expect("install Istio");
    gateway_api::start_load_balancer(&c);
    apply_text(
        &c,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n  labels:\n    istio-injection: enabled\n",
        "default",
    )
    .unwrap();
    apply_sample(&c, "bookinfo/platform/kube/bookinfo.yaml", "default").unwrap();
    apply_sample(
        &c,
        "bookinfo/platform/kube/bookinfo-versions.yaml",
        "default",
    )
    .unwrap();
    apply_sample(&c, "curl/curl.yaml", "default").unwrap();
    wait_pods_ready(&c, "default", 7, Duration::from_secs(120)).unwrap();

    // The ingress: the Gateway istiod deploys, reached at its load-balancer address.
    let started = Instant::now();
    apply_sample(&c, "bookinfo/gateway-api/bookinfo-gateway.yaml", "default").unwrap();
    let deadline = started + Duration::from_secs(90);
    let mut last = (0, String::new());
    let mut served = None;
    while Instant::now() < deadline {
        if let Some(ip) = gateway_address(&c, "bookinfo-gateway-istio") {
            last = get(&format!("http://{ip}/productpage"));
            if full_page(last.0, &last.1) {
                served = Some(ip);
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let ip = served.unwrap_or_else(|| {
        panic!(
            "the product page through the Gateway in 90 s; last answer ({}): {}\nkubelet log ends:\n{}",
            last.0,
            last.1,
            harness::tail(&c.kubelet.log(), 30)
        )
    });
    eprintln!(
        "STEP gateway: the product page at http://{ip}/productpage, {:.1} s after the Gateway was applied",
        started.elapsed().as_secs_f64()
    );
    // Only the routed paths: anything else is a 404 from the gateway.
    assert_eq!(get(&format!("http://{ip}/ratings/0")).0, 404);

    // GAMMA: an HTTPRoute whose parent is the reviews Service applies to the sidecars calling it.
    apply_sample(
        &c,
        "bookinfo/gateway-api/route-reviews-90-10.yaml",
        "default",
    )
    .unwrap();
    wait_page(&c, &[], "reviews v1 or v2 only", 10, |code, p| {
        code == 200 && matches!(reviews_version(p).as_deref(), Some("v1" | "v2"))
    })
    .unwrap();
    let [v1, v2, v3] = versions(&c, 100);
    eprintln!("STEP 90/10: v1 {v1}, v2 {v2}, v3 {v3} of 100");
    assert_eq!(v3, 0);
    // 90/10 of 100 requests: v2 between 2 and 25 is p > 0.999 for a true 10% split.
    assert!((2..=25).contains(&v2), "v1 {v1}, v2 {v2}");

    apply_sample(&c, "bookinfo/gateway-api/route-reviews-v1.yaml", "default").unwrap();
    wait_page(&c, &[], "reviews v1 only", 10, |code, p| {
        code == 200 && reviews_version(p).as_deref() == Some("v1")
    })
    .unwrap();
    assert_eq!(versions(&c, 20), [20, 0, 0]);
}
