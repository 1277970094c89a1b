#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! HBONE between two of our sidecars under Istio's istiod, as a mesh migrating to ambient runs
//! it: istiod with its ambient features (`PILOT_ENABLE_AMBIENT`) and `PILOT_PREFER_SENDING_HBONE`,
//! pods whose ProxyConfig sets `ISTIO_META_ENABLE_HBONE` (the injector then labels them
//! `networking.istio.io/tunnel: http`). istiod gives each sidecar the `connect_terminate`
//! listener on 15008 (HTTP/2 CONNECT over mTLS), the internal listener `main_internal` behind
//! it, and `connect_originate` with its cluster for sending; our agent keeps them for upstream
//! Envoy (their one istio/proxy factory respelled). The client's requests go through the
//! tunnel, the server sees the client's identity, and authorization applies to it.

use std::time::Duration;

use cluster::Cluster;
use cluster::apply;
use cluster::bookinfo::{
    apply_text, curl, details_and_curl, host_connections, pod_local, pod_named, pods,
    wait_pods_ready,
};

#[test]
fn our_sidecars_talk_hbone_under_istiod() {
    if !harness::require_root("our_sidecars_talk_hbone_under_istiod")
        || !harness::require_envoy("our_sidecars_talk_hbone_under_istiod")
    {
        return;
    }
    let mut c = Cluster::start().expect("start the cluster");
    cluster::istio::install(
        &mut c,
        &[
            "values.pilot.env.PILOT_ENABLE_AMBIENT=true",
            "values.pilot.env.PILOT_PREFER_SENDING_HBONE=true",
        ],
    )
    .expect("install Istio");
    apply_text(&c, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: hbone\n  labels:\n    istio-injection: enabled\n", "hbone").unwrap();
    let mut objects = details_and_curl().unwrap();
    for o in objects.iter_mut().filter(|o| o["kind"] == "Deployment") {
        o["spec"]["template"]["metadata"]["annotations"]["proxy.istio.io/config"] =
            "proxyMetadata:\n  ISTIO_META_ENABLE_HBONE: \"true\"\n".into();
    }
    c.block_on(apply::apply_all(&c.client, &objects, Some("hbone")))
        .unwrap();
    wait_pods_ready(&c, "hbone", 2, Duration::from_secs(120)).unwrap();
    let (client, server) = (
        pod_named(&c, "hbone", "curl-").unwrap(),
        pod_named(&c, "hbone", "details-").unwrap(),
    );
    for p in pods(&c, "hbone") {
        let labels = p.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get("networking.istio.io/tunnel").map(String::as_str),
            Some("http"),
            "{:?}: the injector did not mark it for HBONE",
            p.metadata.name
        );
    }
    let server_listeners =
        pod_local(&c, "hbone", &server, "http://127.0.0.1:15000/listeners").unwrap();
    assert!(
        server_listeners.contains("connect_terminate"),
        "the server's Envoy has no connect_terminate:\n{server_listeners}"
    );

    let url = "http://details.hbone:9080/details/0";
    let mut last = (0, String::new());
    let answered = harness::wait_until(Duration::from_secs(30), || {
        last = curl(&c, "hbone", url, &[]).unwrap_or_default();
        last.0 == 200
    });
    assert!(answered, "no answer through HBONE: {last:?}");
    // Envoy's stats of these listeners and clusters are outside Istio's inclusion list; the
    // hosts' connection counters are not.
    let originated =
        host_connections(&c, "hbone", &client, "::envoy://connect_originate/").unwrap();
    let terminated = host_connections(&c, "hbone", &server, "::envoy://main_internal/").unwrap();
    assert!(
        originated >= 1 && terminated >= 1,
        "not through the tunnel: client connections to connect_originate {originated}, server connections into main_internal {terminated}"
    );
    eprintln!(
        "STEP HBONE: curl -> details through connect_originate ({originated} connections) and connect_terminate into main_internal ({terminated})"
    );

    // Authorization on the HBONE path: the client's identity is denied, then allowed again.
    let deny = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: deny-curl\n  namespace: hbone\nspec:\n  selector:\n    matchLabels:\n      app: details\n  action: DENY\n  rules:\n  - from:\n    - source:\n        principals: [\"cluster.local/ns/hbone/sa/curl\"]\n";
    apply_text(&c, deny, "hbone").unwrap();
    let denied = harness::wait_until(Duration::from_secs(30), || {
        last = curl(&c, "hbone", url, &[]).unwrap_or_default();
        last.0 == 403
    });
    assert!(
        denied,
        "the DENY for curl's identity did not apply over HBONE: {last:?}"
    );
    eprintln!("STEP HBONE: a DENY for the client's identity answers 403");
}
