#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Istio's Bookinfo Gateway API sample with istiod-core as the control plane and the Gateway's
//! controller: the Gateway API CRDs installed before istiod-core starts, Bookinfo injected
//! offline (`istioctl kube-inject`), then `samples/bookinfo/gateway-api/bookinfo-gateway.yaml`
//! applied verbatim. istiod-core creates the GatewayClass `istio`, deploys the Gateway
//! (ServiceAccount, Deployment and LoadBalancer Service `bookinfo-gateway-istio`, owned by the
//! Gateway), serves the router it runs, and the product page answers at the load balancer's
//! address; deleting the Gateway lets the garbage collector remove what was deployed.

use std::time::{Duration, Instant};

use cluster::Cluster;
use cluster::bookinfo::{self, apply_sample, apply_text, full_page, is_ready, wait_pods_ready};
use cluster::{gateway_api, istiod_core};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams};

const GATEWAY: &str = "bookinfo-gateway";
const DEPLOYED: &str = "bookinfo-gateway-istio";

fn gateway_api_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "gateway.networking.k8s.io".into(),
        version: "v1".into(),
        api_version: "gateway.networking.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// One request from the node to `url` (`bookinfo::node_get`).
fn get(url: &str) -> (u16, String) {
    cluster::bookinfo::node_get(url).unwrap()
}

/// Polls `probe` every 200 ms for up to `limit`; the value once it is `Some`.
fn wait_for<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn router_pods(c: &Cluster) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let selector = format!("gateway.networking.k8s.io/gateway-name={GATEWAY}");
    c.block_on(api.list(&ListParams::default().labels(&selector)))
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

#[test]
fn istiod_core_deploys_the_bookinfo_gateway() {
    if !harness::require_root("istiod_core_deploys_the_bookinfo_gateway")
        || !harness::require_envoy("istiod_core_deploys_the_bookinfo_gateway")
    {
        return;
    }
    let t0 = Instant::now();
    let mut c = Cluster::start().expect("start the cluster");
    gateway_api::install_crds(&c, "standard").expect("install the Gateway API CRDs");
    let core = istiod_core::install(&mut c, &[]).expect("install Istio's config and istiod-core");
    gateway_api::start_load_balancer(&c);
    eprintln!(
        "STEP cluster, Gateway API CRDs, istiod-core: {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // istiod-core creates the GatewayClass `istio` at start, as istiod does.
    let classes: Api<DynamicObject> = Api::all_with(
        c.client.clone(),
        &gateway_api_resource("GatewayClass", "gatewayclasses"),
    );
    let class = wait_for(Duration::from_secs(30), || {
        c.block_on(classes.get_opt("istio")).ok().flatten()
    })
    .unwrap_or_else(|| panic!("no GatewayClass istio 30 s after istiod-core started"));
    assert_eq!(
        class.data["spec"]["controllerName"], "istio.io/gateway-controller",
        "{class:?}"
    );
    eprintln!("STEP GatewayClass istio (controller istio.io/gateway-controller)");

    // Bookinfo, injected offline by Istio's injector.
    let started = Instant::now();
    apply_text(
        &c,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n  labels:\n    istio-injection: enabled\n",
        "default",
    )
    .unwrap();
    let injected = istiod_core::kube_inject(
        &c,
        &bookinfo::sample("bookinfo/platform/kube/bookinfo.yaml").unwrap(),
    )
    .unwrap();
    apply_text(&c, &injected, "default").unwrap();
    wait_pods_ready(&c, "default", 6, Duration::from_secs(120)).unwrap();
    eprintln!(
        "STEP Bookinfo Ready: {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The sample, verbatim: a Gateway of class istio and its HTTPRoute.
    let started = Instant::now();
    apply_sample(&c, "bookinfo/gateway-api/bookinfo-gateway.yaml", "default").unwrap();
    let gateways: Api<DynamicObject> = Api::namespaced_with(
        c.client.clone(),
        "default",
        &gateway_api_resource("Gateway", "gateways"),
    );
    let gateway = c.block_on(gateways.get(GATEWAY)).unwrap();
    let uid = gateway.metadata.uid.clone().unwrap();

    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let services: Api<Service> = Api::namespaced(c.client.clone(), "default");
    let accounts: Api<ServiceAccount> = Api::namespaced(c.client.clone(), "default");
    let deployment = wait_for(Duration::from_secs(30), || {
        c.block_on(deployments.get_opt(DEPLOYED)).ok().flatten()
    })
    .unwrap_or_else(|| {
        panic!(
            "no Deployment {DEPLOYED} 30 s after the Gateway was applied; istiod-core's log ends:\n{}",
            harness::tail(&c.component("istiod-core").map(|p| p.logs()).unwrap_or_default(), 30)
        )
    });
    let service = c.block_on(services.get(DEPLOYED)).unwrap();
    let account = c.block_on(accounts.get(DEPLOYED)).unwrap();
    eprintln!(
        "STEP Deployment, Service, ServiceAccount {DEPLOYED}: {:.1} s after the Gateway",
        started.elapsed().as_secs_f64()
    );
    for (kind, owners) in [
        ("Deployment", &deployment.metadata.owner_references),
        ("Service", &service.metadata.owner_references),
        ("ServiceAccount", &account.metadata.owner_references),
    ] {
        let owners = owners.clone().unwrap_or_default();
        assert!(
            owners.iter().any(|o| o.kind == "Gateway"
                && o.name == GATEWAY
                && o.uid == uid
                && o.controller == Some(true)),
            "{kind} {DEPLOYED} is not owned by the Gateway ({uid}): {owners:?}"
        );
    }
    let spec = service.spec.clone().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    let ports: Vec<(String, i32)> = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name.unwrap_or_default(), p.port))
        .collect();
    assert_eq!(
        ports,
        [
            ("status-port".to_string(), 15021),
            ("http-80".to_string(), 80)
        ]
    );
    let pod_spec = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod_spec.containers[0].image.as_deref(),
        Some("localhost/istio-rs/proxyv2:test"),
        "the image from the injector's values"
    );

    // The router runs our agent, connects to istiod-core and becomes Ready.
    let router = wait_for(Duration::from_secs(60), || {
        router_pods(&c).into_iter().find(is_ready)
    })
    .unwrap_or_else(|| {
        panic!(
            "no Ready router pod 60 s after the Gateway: {:?}\nkubelet log ends:\n{}",
            router_pods(&c)
                .iter()
                .map(|p| (
                    p.metadata.name.clone(),
                    p.status.clone().and_then(|s| s.conditions)
                ))
                .collect::<Vec<_>>(),
            harness::tail(&c.kubelet.log(), 30)
        )
    });
    let router_name = router.metadata.name.clone().unwrap_or_default();
    eprintln!(
        "STEP router pod {router_name} Ready: {:.1} s after the Gateway",
        started.elapsed().as_secs_f64()
    );

    // The product page from outside the mesh, at the load balancer's address.
    let mut last = (0, String::new());
    let ip = wait_for(Duration::from_secs(60), || {
        let svc = c.block_on(services.get_opt(DEPLOYED)).ok().flatten()?;
        let ip = svc.status?.load_balancer?.ingress?.first()?.ip.clone()?;
        last = get(&format!("http://{ip}/productpage"));
        full_page(last.0, &last.1).then_some(ip)
    })
    .unwrap_or_else(|| {
        panic!(
            "the product page through the Gateway in 60 s; last answer ({}): {}\nistiod-core's log ends:\n{}",
            last.0,
            last.1,
            harness::tail(&c.component("istiod-core").map(|p| p.logs()).unwrap_or_default(), 30)
        )
    });
    eprintln!(
        "STEP the full product page at http://{ip}/productpage: {:.1} s after the Gateway",
        started.elapsed().as_secs_f64()
    );
    // Only the routed paths: anything else is a 404 from the router.
    assert_eq!(get(&format!("http://{ip}/ratings/0")).0, 404);
    let nacks = core.nacks(&c).unwrap();
    assert!(nacks.is_empty(), "istiod-core saw NACKs: {nacks:#?}");
    assert!(
        core.proxies(&c)
            .unwrap()
            .iter()
            .any(|p| p.contains(&router_name)),
        "the router is not among istiod-core's proxies"
    );

    // Deleting the Gateway: the garbage collector removes what was deployed for it.
    let started = Instant::now();
    c.block_on(gateways.delete(GATEWAY, &DeleteParams::background()))
        .unwrap();
    let gone = wait_for(Duration::from_secs(60), || {
        let d = c.block_on(deployments.get_opt(DEPLOYED)).ok()?;
        let s = c.block_on(services.get_opt(DEPLOYED)).ok()?;
        (d.is_none() && s.is_none()).then_some(())
    });
    assert!(
        gone.is_some(),
        "Deployment or Service {DEPLOYED} still there 60 s after the Gateway was deleted"
    );
    eprintln!(
        "STEP Gateway deleted: Deployment and Service removed by the garbage collector in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Not deployed again from a stale listing.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        c.block_on(deployments.get_opt(DEPLOYED)).unwrap().is_none(),
        "{DEPLOYED} deployed again after the Gateway was deleted"
    );
    eprintln!("STEP total: {:.1} s", t0.elapsed().as_secs_f64());
}
