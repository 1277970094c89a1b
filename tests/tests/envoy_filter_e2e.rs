#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! EnvoyFilter as traffic: a client pod calls `reviews` through real Envoys, the embedded
//! control plane applying the EnvoyFilters as written (istio.io's local rate limit task as
//! published, a Lua filter, an HTTP_ROUTE MERGE, a CLUSTER MERGE, a REMOVE, an ECDS extension
//! config), and a patch Envoy rejects named in the log.

use std::time::Duration;

use harness::{require_envoy, require_root};

mod mesh;
use mesh::*;

const ONE_VERSION: &[Backend] = &[("v1", "app: reviews, version: v1", &[])];

/// istio.io's "Enabling Rate Limits using Envoy" local rate limit EnvoyFilter, as the task
/// publishes it (root namespace, TypedStruct, 4 tokens a minute), selecting `reviews`.
const LOCAL_RATE_LIMIT: &str = r#"apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata:
  name: filter-local-ratelimit-svc
  namespace: istio-system
spec:
  workloadSelector:
    labels:
      app: reviews
  configPatches:
    - applyTo: HTTP_FILTER
      match:
        context: SIDECAR_INBOUND
        listener:
          filterChain:
            filter:
              name: "envoy.filters.network.http_connection_manager"
      patch:
        operation: INSERT_BEFORE
        value:
          name: envoy.filters.http.local_ratelimit
          typed_config:
            "@type": type.googleapis.com/udpa.type.v1.TypedStruct
            type_url: type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
            value:
              stat_prefix: http_local_rate_limiter
              token_bucket:
                max_tokens: 4
                tokens_per_fill: 4
                fill_interval: 60s
              filter_enabled:
                runtime_key: local_rate_limit_enabled
                default_value:
                  numerator: 100
                  denominator: HUNDRED
              filter_enforced:
                runtime_key: local_rate_limit_enforced
                default_value:
                  numerator: 100
                  denominator: HUNDRED
              response_headers_to_add:
                - append: false
                  header:
                    key: x-local-rate-limit
                    value: 'true'
"#;

#[test]
fn the_local_rate_limit_task_answers_429_once_the_bucket_is_empty() {
    if !require_root("local_rate_limit") || !require_envoy("local_rate_limit") {
        return;
    }
    let Some(m) = mesh("local_rate_limit", ONE_VERSION, LOCAL_RATE_LIMIT) else {
        return;
    };
    // The bucket holds 4 tokens a minute (the mesh's own readiness check may have taken one):
    // a run of 200s, then 429s that never reach the app.
    let replies = m.get("/limited", 8, &[]);
    let served = replies.iter().take_while(|r| r.code == 200).count();
    assert!((3..=4).contains(&served), "{replies:?}");
    assert!(
        replies[served..]
            .iter()
            .all(|r| r.code == 429 && r.body == "local_rate_limited"),
        "{replies:?}"
    );
    let reached = m.app_log("v1").matches("/limited").count();
    assert_eq!(reached, served, "only the served requests reached the app");
}

#[test]
fn lua_route_merge_cluster_merge_and_remove_apply_as_traffic() {
    if !require_root("envoy_filter_ops") || !require_envoy("envoy_filter_ops") {
        return;
    }
    let filters = format!(
        r#"kind: EnvoyFilter
metadata: {{name: outbound, namespace: {NS}}}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener:
        filterChain:
          filter:
            name: "envoy.filters.network.http_connection_manager"
            subFilter:
              name: "envoy.filters.http.router"
    patch:
      operation: INSERT_BEFORE
      value:
       name: envoy.lua
       typed_config:
          "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
          inlineCode: |
            function envoy_on_request(request_handle)
              request_handle:headers():add("x-lua-outbound", "hello world")
            end
  - applyTo: HTTP_ROUTE
    match:
      context: SIDECAR_OUTBOUND
      routeConfiguration: {{portNumber: {PORT}, vhost: {{name: "reviews.{NS}.svc.cluster.local:{PORT}"}}}}
    patch: {{operation: MERGE, value: {{route: {{timeout: 0.5s}}}}}}
  - applyTo: CLUSTER
    match: {{context: SIDECAR_OUTBOUND, cluster: {{service: mirror.{NS}.svc.cluster.local}}}}
    patch: {{operation: REMOVE}}
  - applyTo: CLUSTER
    match: {{context: SIDECAR_OUTBOUND, cluster: {{service: reviews.{NS}.svc.cluster.local}}}}
    patch:
      operation: MERGE_AND_REPLACE_LIST
      value: {{circuit_breakers: {{thresholds: [{{max_connections: 1, max_pending_requests: 1, max_requests: 1}}]}}}}
"#
    );
    let backends: &[Backend] = &[ONE_VERSION[0], ("m1", "app: mirror", &[])];
    let Some(m) = mesh("envoy_filter_ops", backends, &filters) else {
        return;
    };
    // Lua: the header reaches the app (it echoes what x-echo names).
    let r = &m.get("/", 1, &[("x-echo", "x-lua-outbound")])[0];
    assert!(r.body.contains("x-lua-outbound=hello world"), "{r:?}");
    // HTTP_ROUTE MERGE: the route's timeout is 0.5 s.
    let r = &m.get("/sleep/3000", 1, &[])[0];
    assert_eq!(r.code, 504, "{r:?}");
    // CLUSTER MERGE: one request at a time to reviews; eight at once overflow.
    let replies = m.send(&format!("http://{VIP}:{PORT}/sleep/300"), 8, &[], 8);
    assert!(
        replies.iter().any(|r| r.code == 503 && r.overloaded),
        "{replies:?}"
    );
    assert!(replies.iter().any(|r| r.code == 200), "{replies:?}");
    // CLUSTER REMOVE: mirror's cluster is gone, so its route has nowhere to go (its pod is up,
    // and never sees the request).
    let r = &m.send(&format!("http://{MIRROR_VIP}:{PORT}/removed"), 1, &[], 1)[0];
    assert_eq!(r.code, 503, "{r:?}");
    assert!(!m.app_log("m1").contains("/removed"));
}

/// An ECDS Lua filter (EXTENSION_CONFIG, and an HTTP filter whose `config_discovery` names it).
const ECDS_LUA: &str = r#"apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: ecds-lua, namespace: book}
spec:
  configPatches:
  - applyTo: EXTENSION_CONFIG
    patch:
      operation: ADD
      value:
        name: hello-lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          default_source_code:
            inline_string: |
              function envoy_on_request(request_handle)
                request_handle:headers():add("x-lua-ecds", "from ECDS")
              end
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {name: envoy.filters.http.router}
    patch:
      operation: INSERT_BEFORE
      value:
        name: hello-lua
        config_discovery:
          config_source: {ads: {}}
          type_urls: [type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua]
"#;

/// A patch every field of which decodes, and which Envoy rejects (a cluster's connect timeout
/// must be above zero).
const REJECTED: &str = r#"---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: zero-timeout, namespace: book}
spec:
  configPatches:
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {service: reviews.book.svc.cluster.local}}
    patch: {operation: MERGE, value: {connect_timeout: 0s}}
"#;

#[test]
fn an_extension_config_is_served_over_ecds_and_a_rejected_patch_is_named() {
    if !require_root("envoy_filter_ecds") || !require_envoy("envoy_filter_ecds") {
        return;
    }
    let Some(m) = mesh("envoy_filter_ecds", ONE_VERSION, ECDS_LUA) else {
        return;
    };
    // ECDS: the Lua config reached the client's Envoy on its own and runs.
    let r = &m.get("/", 1, &[("x-echo", "x-lua-ecds")])[0];
    assert!(
        r.body.contains("x-lua-ecds=from ECDS"),
        "{r:?}\n{}",
        m.client().logs_of("pilot-agent")
    );
    assert!(
        m.client()
            .envoy_stat("extension_config_discovery.http_filter.hello-lua.config_reload")
            .unwrap_or(0)
            >= 1,
        "{}",
        m.net.logs()
    );
    // A patch Envoy rejects: the rejection is logged with the EnvoyFilter's name, and Envoy
    // keeps its last accepted clusters, so reviews still answers.
    let rejected_before = m
        .client()
        .envoy_stat("cluster_manager.cds.update_rejected")
        .unwrap_or(0);
    std::fs::write(m.dir.join("routing.yaml"), format!("{ECDS_LUA}{REJECTED}")).unwrap();
    assert!(
        m.client().wait_log(
            "pilot-agent",
            "envoy_filters=[\"book/zero-timeout\"]",
            Duration::from_secs(20)
        ),
        "{}",
        m.client().logs_of("pilot-agent")
    );
    assert!(
        m.client()
            .envoy_stat("cluster_manager.cds.update_rejected")
            .unwrap_or(0)
            > rejected_before
    );
    let r = &m.get("/", 1, &[])[0];
    assert_eq!(r.code, 200, "{r:?}");
}
