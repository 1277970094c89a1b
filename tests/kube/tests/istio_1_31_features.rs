#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! What istiod 1.28–1.31 writes into sidecar config for its newer settings, loaded by our
//! sidecars (upstream Envoy through our agent): the FIPS 140-3 compliance policy
//! (`COMPLIANCE_POLICY=fips-140-3`: istiod's TLS parameters on every mesh TLS context, and its
//! own servers FIPS-only, which our agent's TLS to istiod must pass), `ALLOW_ANY_DYNAMIC_DNS`
//! outbound (istiod's dynamic forward proxy cluster), and ProxyConfig `proxyHeaders` with
//! X-Forwarded-Host/Port. The proof: the pods get ready through istiod, no update is rejected,
//! requests between them succeed over mTLS, and the settings show where istiod puts them.

use std::time::Duration;

use cluster::Cluster;
use cluster::apply;
use cluster::bookinfo::{
    apply_text, curl, details_and_curl, no_update_rejected, pod_local, pod_named, wait_pods_ready,
};

#[test]
fn istiods_newer_settings_load_on_our_sidecars() {
    if !harness::require_root("istiods_newer_settings_load_on_our_sidecars")
        || !harness::require_envoy("istiods_newer_settings_load_on_our_sidecars")
    {
        return;
    }
    let mut c = Cluster::start().expect("start the cluster");
    cluster::istio::install(
        &mut c,
        &[
            "values.pilot.env.COMPLIANCE_POLICY=fips-140-3",
            "meshConfig.outboundTrafficPolicy.mode=ALLOW_ANY_DYNAMIC_DNS",
            "meshConfig.defaultConfig.proxyHeaders.xForwardedHost.enabled=true",
            "meshConfig.defaultConfig.proxyHeaders.xForwardedPort.enabled=true",
        ],
    )
    .expect("install Istio");
    let ns = "newer";
    apply_text(&c, &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    istio-injection: enabled\n"), ns).unwrap();
    let objects = details_and_curl().unwrap();
    c.block_on(apply::apply_all(&c.client, &objects, Some(ns)))
        .unwrap();
    let ready = wait_pods_ready(&c, ns, 2, Duration::from_secs(120)).unwrap();
    let url = format!("http://details.{ns}:9080/details/0");
    let mut last = (0, String::new());
    let answered = harness::wait_until(Duration::from_secs(30), || {
        last = curl(&c, ns, &url, &[]).unwrap_or_default();
        last.0 == 200
    });
    assert!(answered, "curl -> details under the FIPS policy: {last:?}");
    no_update_rejected(&c, ns, &ready).unwrap();
    let (client, server) = (
        pod_named(&c, ns, "curl-").unwrap(),
        pod_named(&c, ns, "details-").unwrap(),
    );
    // Where istiod puts them, as Envoy holds them.
    let dump = |pod: &str| pod_local(&c, ns, pod, "http://127.0.0.1:15000/config_dump").unwrap();
    let (client_dump, server_dump) = (dump(&client), dump(&server));
    assert!(
        server_dump.contains("FIPS_202205"),
        "no FIPS 140-3 policy on the server's mTLS contexts"
    );
    assert!(
        client_dump.contains("AllowAnyDynamicDNSCluster")
            || client_dump.contains("envoy.clusters.dynamic_forward_proxy"),
        "no dynamic forward proxy cluster for ALLOW_ANY_DYNAMIC_DNS"
    );
    for field in ["append_x_forwarded_host", "append_x_forwarded_port"] {
        assert!(
            client_dump.contains(field) || server_dump.contains(field),
            "proxyHeaders' {field} not in either sidecar's config"
        );
    }
    eprintln!(
        "STEP istiod 1.28-1.31 settings on our sidecars: FIPS 140-3 TLS, ALLOW_ANY_DYNAMIC_DNS, X-Forwarded-Host/Port; curl -> details 200, no update rejected"
    );
}
