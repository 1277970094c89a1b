#![allow(clippy::unwrap_used)]
//! The operations and matches, on what the generators make for a sidecar and a router.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, route};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use prost::Message;

use super::*;
use crate::gateway_conversion::GATEWAY_NAME_LABEL;
use crate::push_context::envoy_filters::compile;
use crate::push_context::from_yaml;

const MESH: &str = "\
kind: ServiceEntry
metadata: {name: productpage, namespace: default}
spec:
  hosts: [productpage.default.svc.cluster.local]
  addresses: [10.0.0.9]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.1.1.1, labels: {app: productpage}}]
---
kind: ServiceEntry
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  addresses: [10.0.0.10]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.1.1.2, labels: {app: reviews}}]
";

fn proxy(labels: &[(&str, &str)]) -> Proxy {
    let mut p =
        Proxy::from_node_id("sidecar~10.1.1.1~productpage-1.default~default.svc.cluster.local")
            .unwrap();
    p.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    p.metadata.insert("ISTIO_VERSION".into(), "1.31.0".into());
    p
}

fn generate(filters: &str, type_url: &str, p: &Proxy) -> Vec<Named> {
    let push = from_yaml(&format!("{MESH}---\n{filters}"));
    let names: Vec<Arc<str>> = vec!["9080".into()];
    let mut out = match type_url {
        LISTENER_TYPE => crate::generators::listeners(&push, p),
        CLUSTER_TYPE => crate::generators::cds::generate(&push, p),
        _ => crate::generators::routes(&push, p, &names),
    };
    apply(&push, p, type_url, &mut out);
    out
}

fn listeners(filters: &str, p: &Proxy) -> Vec<Listener> {
    generate(filters, LISTENER_TYPE, p)
        .iter()
        .map(|n| Listener::decode(n.resource.value.as_slice()).unwrap())
        .collect()
}

/// The HTTP filter names of every HCM of listener `name`.
fn http_filters(ls: &[Listener], name: &str) -> Vec<Vec<String>> {
    let l = ls.iter().find(|l| l.name == name).unwrap();
    l.filter_chains
        .iter()
        .flat_map(|fc| &fc.filters)
        .filter(|f| f.name == crate::config_store::envoy_filter::HCM)
        .map(|f| {
            let Some(filter::ConfigType::TypedConfig(a)) = &f.config_type else {
                unreachable!()
            };
            HttpConnectionManager::decode(a.value.as_slice())
                .unwrap()
                .http_filters
                .iter()
                .map(|h| h.name.clone())
                .collect()
        })
        .collect()
}

fn inbound_hcm(ls: &[Listener]) -> HttpConnectionManager {
    let l = ls.iter().find(|l| l.name == "virtualInbound").unwrap();
    l.filter_chains
        .iter()
        .filter(|fc| {
            fc.filter_chain_match
                .as_ref()
                .and_then(|m| m.destination_port)
                .map(|d| d.value)
                == Some(9080)
        })
        .flat_map(|fc| &fc.filters)
        .find_map(|f| match &f.config_type {
            Some(filter::ConfigType::TypedConfig(a))
                if f.name == crate::config_store::envoy_filter::HCM =>
            {
                Some(HttpConnectionManager::decode(a.value.as_slice()).unwrap())
            }
            _ => None,
        })
        .unwrap()
}

/// istio.io's local rate limit task (its EnvoyFilter as published, in the workload's namespace).
const LOCAL_RATE_LIMIT: &str = r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: filter-local-ratelimit-svc, namespace: default}
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
    - applyTo: HTTP_ROUTE
      match:
        context: SIDECAR_INBOUND
        routeConfiguration:
          vhost:
            name: "inbound|http|9080"
            route:
              action: ANY
      patch:
        operation: MERGE
        value:
          typed_per_filter_config:
            envoy.filters.http.local_ratelimit:
              "@type": type.googleapis.com/udpa.type.v1.TypedStruct
              type_url: type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              value:
                stat_prefix: http_local_rate_limiter
                token_bucket:
                  max_tokens: 4
                  tokens_per_fill: 4
                  fill_interval: 60s
"#;

#[test]
fn the_local_rate_limit_task_patches_the_selected_workloads_inbound_http() {
    let ls = listeners(LOCAL_RATE_LIMIT, &proxy(&[("app", "productpage")]));
    let hcm = inbound_hcm(&ls);
    assert_eq!(
        hcm.http_filters[0].name,
        "envoy.filters.http.local_ratelimit"
    );
    let Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) = &hcm.route_specifier
    else {
        panic!("inline inbound routes");
    };
    let vh = rc
        .virtual_hosts
        .iter()
        .find(|v| v.name == "inbound|http|9080")
        .unwrap();
    assert!(vh.routes.iter().all(|r| {
        r.typed_per_filter_config
            .contains_key("envoy.filters.http.local_ratelimit")
    }));
    // Outbound HTTP is SIDECAR_OUTBOUND: untouched.
    for chain in http_filters(&ls, "0.0.0.0_9080") {
        assert!(
            !chain.iter().any(|n| n.contains("local_ratelimit")),
            "{chain:?}"
        );
    }
    // Another workload is not selected.
    let other = listeners(LOCAL_RATE_LIMIT, &proxy(&[("app", "reviews")]));
    assert!(
        inbound_hcm(&other)
            .http_filters
            .iter()
            .all(|f| !f.name.contains("local_ratelimit"))
    );
}

#[test]
fn a_lua_filter_goes_before_the_router_of_outbound_http() {
    let lua = r#"
kind: EnvoyFilter
metadata: {name: outbound, namespace: default}
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
"#;
    let ls = listeners(lua, &proxy(&[]));
    let chains = http_filters(&ls, "0.0.0.0_9080");
    assert!(!chains.is_empty());
    for chain in chains {
        let n = chain.len();
        assert_eq!(
            &chain[n - 2..],
            ["envoy.lua", "envoy.filters.http.router"],
            "{chain:?}"
        );
    }
    assert!(
        inbound_hcm(&ls)
            .http_filters
            .iter()
            .all(|f| f.name != "envoy.lua")
    );
}

#[test]
fn http_route_merge_sets_a_timeout_and_route_removal_and_insertion_work() {
    let merge = r#"
kind: EnvoyFilter
metadata: {name: timeouts, namespace: default}
spec:
  configPatches:
  - applyTo: HTTP_ROUTE
    match: {context: SIDECAR_OUTBOUND, routeConfiguration: {portNumber: 9080, vhost: {name: "reviews.default.svc.cluster.local:9080"}}}
    patch: {operation: MERGE, value: {route: {timeout: 4s}}}
  - applyTo: HTTP_ROUTE
    match: {context: SIDECAR_OUTBOUND, routeConfiguration: {vhost: {name: "reviews.default.svc.cluster.local:9080"}}}
    patch: {operation: INSERT_FIRST, value: {name: teapot, match: {prefix: /teapot}, direct_response: {status: 418}}}
"#;
    let rcs: Vec<RouteConfiguration> = generate(merge, ROUTE_TYPE, &proxy(&[]))
        .iter()
        .map(|n| RouteConfiguration::decode(n.resource.value.as_slice()).unwrap())
        .collect();
    let rc = rcs.iter().find(|r| r.name == "9080").unwrap();
    let reviews = rc
        .virtual_hosts
        .iter()
        .find(|v| v.name == "reviews.default.svc.cluster.local:9080")
        .unwrap();
    assert_eq!(reviews.routes[0].name, "teapot");
    let Some(route::Action::Route(a)) = &reviews.routes[1].action else {
        panic!()
    };
    assert_eq!(a.timeout.as_ref().map(|d| d.seconds), Some(4));
    let product = rc
        .virtual_hosts
        .iter()
        .find(|v| v.name.starts_with("productpage"))
        .unwrap();
    let Some(route::Action::Route(a)) = &product.routes[0].action else {
        panic!()
    };
    assert_ne!(
        a.timeout.as_ref().map(|d| d.seconds),
        Some(4),
        "another vhost"
    );
}

#[test]
fn clusters_merge_remove_and_add() {
    let f = r#"
kind: EnvoyFilter
metadata: {name: clusters, namespace: default}
spec:
  configPatches:
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {service: reviews.default.svc.cluster.local}}
    patch: {operation: MERGE, value: {connect_timeout: 7s}}
  - applyTo: CLUSTER
    match: {cluster: {name: BlackHoleCluster}}
    patch: {operation: REMOVE}
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND}
    patch: {operation: ADD, value: {name: lua_cluster, type: STRICT_DNS, connect_timeout: 0.5s, load_assignment: {cluster_name: lua_cluster}}}
"#;
    let cs: Vec<Cluster> = generate(f, CLUSTER_TYPE, &proxy(&[]))
        .iter()
        .map(|n| Cluster::decode(n.resource.value.as_slice()).unwrap())
        .collect();
    let reviews = cs
        .iter()
        .find(|c| c.name == "outbound|9080||reviews.default.svc.cluster.local")
        .unwrap();
    assert_eq!(reviews.connect_timeout.as_ref().map(|d| d.seconds), Some(7));
    let product = cs
        .iter()
        .find(|c| c.name == "outbound|9080||productpage.default.svc.cluster.local")
        .unwrap();
    assert_ne!(product.connect_timeout.as_ref().map(|d| d.seconds), Some(7));
    assert!(!cs.iter().any(|c| c.name == "BlackHoleCluster"));
    assert_eq!(cs.iter().filter(|c| c.name == "lua_cluster").count(), 1);
}

#[test]
fn listener_remove_and_add_network_filter_ops_and_proxy_matches() {
    let f = r#"
kind: EnvoyFilter
metadata: {name: l, namespace: default}
spec:
  configPatches:
  - applyTo: LISTENER
    match: {context: SIDECAR_OUTBOUND, listener: {name: "0.0.0.0_9080"}}
    patch: {operation: REMOVE}
  - applyTo: LISTENER
    match: {proxy: {proxyVersion: '^1\.31'}}
    patch: {operation: ADD, value: {name: extra, address: {socket_address: {address: 0.0.0.0, port_value: 9999}}}}
  - applyTo: LISTENER
    match: {proxy: {proxyVersion: '^1\.30'}}
    patch: {operation: ADD, value: {name: not-this-version, address: {socket_address: {address: 0.0.0.0, port_value: 9998}}}}
  - applyTo: LISTENER
    match: {proxy: {metadata: {CLUSTER_ID: other}}}
    patch: {operation: ADD, value: {name: not-this-cluster, address: {socket_address: {address: 0.0.0.0, port_value: 9997}}}}
"#;
    let ls = listeners(f, &proxy(&[]));
    let names: Vec<&str> = ls.iter().map(|l| l.name.as_str()).collect();
    assert!(!names.contains(&"0.0.0.0_9080"), "{names:?}");
    assert_eq!(
        names.iter().filter(|n| **n == "extra").count(),
        1,
        "{names:?}"
    );
    assert!(!names.contains(&"not-this-version") && !names.contains(&"not-this-cluster"));
}

#[test]
fn filters_apply_by_priority_then_root_namespace_first() {
    // Two INSERT_FIRSTs: the one applied last ends first.
    let ef = |name: &str, ns: &str, priority: i32, filter: &str| {
        format!(
            "---\nkind: EnvoyFilter\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  priority: {priority}\n  configPatches:\n  - applyTo: HTTP_FILTER\n    match: {{context: SIDECAR_INBOUND, listener: {{filterChain: {{filter: {{name: envoy.filters.network.http_connection_manager}}}}}}}}\n    patch: {{operation: INSERT_FIRST, value: {{name: {filter}, typed_config: {{'@type': type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua}}}}}}\n"
        )
    };
    let config = format!(
        "{}{}{}",
        ef("a", "default", 0, "ns-p0"),
        ef("b", "istio-system", 0, "root-p0"),
        ef("c", "default", -1, "ns-pminus1")
    );
    let hcm = inbound_hcm(&listeners(&config, &proxy(&[])));
    let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    // Applied: ns-pminus1, root-p0, ns-p0 (each inserted first).
    assert_eq!(&names[..3], ["ns-p0", "root-p0", "ns-pminus1"], "{names:?}");
}

const GATEWAY: &str = "\
kind: Gateway
metadata: {name: gw, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]
---
kind: VirtualService
metadata: {name: front, namespace: default}
spec:
  hosts: ['*']
  gateways: [istio-system/gw]
  http:
  - name: to-product
    route: [{destination: {host: productpage.default.svc.cluster.local, port: {number: 9080}}}]
";

fn router() -> Proxy {
    let mut p =
        Proxy::from_node_id("router~10.1.1.5~gw-1.istio-system~istio-system.svc.cluster.local")
            .unwrap();
    p.labels = [("istio".to_string(), "ingressgateway".to_string())].into();
    p
}

#[test]
fn the_gateway_context_patches_a_routers_routes_and_filters_only() {
    let f = format!(
        r#"{GATEWAY}---
kind: EnvoyFilter
metadata: {{name: gw, namespace: istio-system}}
spec:
  workloadSelector: {{labels: {{istio: ingressgateway}}}}
  configPatches:
  - applyTo: HTTP_ROUTE
    match: {{context: GATEWAY, routeConfiguration: {{portNumber: 80, vhost: {{route: {{name: to-product, action: ROUTE}}}}}}}}
    patch: {{operation: MERGE, value: {{route: {{timeout: 9s}}}}}}
  - applyTo: NETWORK_FILTER
    match: {{context: GATEWAY, listener: {{portNumber: 80}}}}
    patch:
      operation: INSERT_FIRST
      value: {{name: envoy.filters.network.local_ratelimit, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit, stat_prefix: gw, token_bucket: {{max_tokens: 100, fill_interval: 1s}}}}}}
  - applyTo: VIRTUAL_HOST
    match: {{context: GATEWAY}}
    patch: {{operation: ADD, value: {{name: added, domains: [added.example], routes: [{{match: {{prefix: /}}, direct_response: {{status: 200}}}}]}}}}
"#
    );
    let gw = router();
    let push = from_yaml(&format!("{MESH}---\n{f}"));
    let mut rds = crate::generators::routes(&push, &gw, &["http.80"]);
    apply(&push, &gw, ROUTE_TYPE, &mut rds);
    let rc = RouteConfiguration::decode(rds[0].resource.value.as_slice()).unwrap();
    let route = rc
        .virtual_hosts
        .iter()
        .flat_map(|v| &v.routes)
        .find(|r| r.name == "to-product")
        .unwrap();
    let Some(route::Action::Route(a)) = &route.action else {
        panic!()
    };
    assert_eq!(a.timeout.as_ref().map(|d| d.seconds), Some(9));
    assert!(rc.virtual_hosts.iter().any(|v| v.name == "added"));
    let mut lds = crate::generators::listeners(&push, &gw);
    apply(&push, &gw, LISTENER_TYPE, &mut lds);
    let l = lds
        .iter()
        .map(|n| Listener::decode(n.resource.value.as_slice()).unwrap())
        .find(|l| l.name == "0.0.0.0_80")
        .unwrap();
    assert_eq!(
        l.filter_chains[0].filters[0].name,
        "envoy.filters.network.local_ratelimit"
    );
    // A sidecar is not in the GATEWAY context (nor selected).
    let ls = listeners(&f, &proxy(&[]));
    assert!(
        ls.iter()
            .flat_map(|l| &l.filter_chains)
            .flat_map(|fc| &fc.filters)
            .all(|f| !f.name.contains("local_ratelimit"))
    );
}

#[test]
fn filter_chain_and_network_filter_operations() {
    let f = r#"
kind: EnvoyFilter
metadata: {name: chains, namespace: default}
spec:
  configPatches:
  - applyTo: FILTER_CHAIN
    match: {context: SIDECAR_INBOUND, listener: {portNumber: 9080}}
    patch: {operation: MERGE, value: {name: merged-chain}}
  - applyTo: NETWORK_FILTER
    match: {context: SIDECAR_INBOUND, listener: {portNumber: 9080, filterChain: {filter: {name: envoy.filters.network.http_connection_manager}}}}
    patch: {operation: INSERT_BEFORE, value: {name: before-hcm, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit, stat_prefix: x, token_bucket: {max_tokens: 1, fill_interval: 1s}}}}
  - applyTo: HTTP_FILTER
    match: {context: SIDECAR_INBOUND, listener: {portNumber: 9080, filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}}
    patch: {operation: MERGE, value: {name: envoy.filters.http.router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router, suppress_envoy_headers: true}}}
"#;
    let ls = listeners(f, &proxy(&[]));
    let vi = ls.iter().find(|l| l.name == "virtualInbound").unwrap();
    let chains: Vec<_> = vi
        .filter_chains
        .iter()
        .filter(|fc| {
            fc.filter_chain_match
                .as_ref()
                .and_then(|m| m.destination_port)
                .map(|d| d.value)
                == Some(9080)
        })
        .collect();
    assert!(!chains.is_empty());
    for fc in &chains {
        assert_eq!(fc.name, "merged-chain");
        let hcm_at = fc
            .filters
            .iter()
            .position(|f| f.name == crate::config_store::envoy_filter::HCM)
            .unwrap();
        assert_eq!(fc.filters[hcm_at - 1].name, "before-hcm");
    }
    let router = inbound_hcm(&ls).http_filters.last().cloned().unwrap();
    let Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(a)) = router.config_type else { panic!() };
    let r = envoy_types::pb::envoy::extensions::filters::http::router::v3::Router::decode(
        a.value.as_slice(),
    )
    .unwrap();
    assert!(r.suppress_envoy_headers);
    // Other ports' chains are untouched.
    assert!(vi.filter_chains.iter().any(|fc| fc.name != "merged-chain"));
}

#[test]
fn target_refs_select_the_routers_of_the_named_gateway_only() {
    let push = from_yaml(
        "kind: EnvoyFilter\nmetadata: {name: t, namespace: default}\nspec:\n  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: g}]\n  configPatches: [{applyTo: CLUSTER, patch: {operation: REMOVE}}]\n",
    );
    let with = |labels: &[(&str, &str)]| {
        let p = proxy(labels);
        let labels = p.labels.clone();
        for_proxy(&push.envoy_filters, &p, &labels, push.root_namespace()).len()
    };
    assert_eq!(with(&[(GATEWAY_NAME_LABEL, "g")]), 1);
    assert_eq!(with(&[(GATEWAY_NAME_LABEL, "other")]), 0);
    // A sidecar (no Gateway label) ignores a targeted filter, as in istiod.
    assert_eq!(with(&[("app", "productpage")]), 0);
}

/// An ECDS Lua filter: the config on its own, and an HTTP filter that asks for it by name.
const ECDS_LUA: &str = r#"
kind: EnvoyFilter
metadata: {name: ecds-lua, namespace: default}
spec:
  workloadSelector: {labels: {app: productpage}}
  configPatches:
  - applyTo: EXTENSION_CONFIG
    patch:
      operation: ADD
      value:
        name: hello-lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          default_source_code: {inline_string: "function envoy_on_request(h) h:headers():add('x-lua', 'ecds') end"}
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: hello-lua
        config_discovery:
          config_source: {ads: {}}
          type_urls: [type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua]
"#;

#[test]
fn extension_configs_are_served_by_name_to_the_selected_proxies() {
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    let push = from_yaml(&format!("{MESH}---\n{ECDS_LUA}"));
    let p = proxy(&[("app", "productpage")]);
    let asked: Vec<Arc<str>> = vec!["hello-lua".into(), "unknown".into()];
    let served = extension_configs(&push, &p, &asked);
    assert_eq!(served.len(), 1);
    assert_eq!(served[0].name, "hello-lua");
    let config = TypedExtensionConfig::decode(served[0].resource.value.as_slice()).unwrap();
    assert_eq!(config.name, "hello-lua");
    assert!(
        config
            .typed_config
            .unwrap()
            .type_url
            .ends_with("filters.http.lua.v3.Lua")
    );
    // Only what is asked for, only to the workloads the filter selects.
    assert!(extension_configs(&push, &p, &["unknown".into()]).is_empty());
    assert!(extension_configs(&push, &proxy(&[("app", "reviews")]), &asked).is_empty());
    // The listener side: the HTTP filter referring to it, before the router.
    let ls = listeners(ECDS_LUA, &p);
    let chains = http_filters(&ls, "0.0.0.0_9080");
    assert!(
        chains
            .iter()
            .all(|c| c.ends_with(&["hello-lua".to_string(), "envoy.filters.http.router".into()])),
        "{chains:?}"
    );
}

#[test]
fn of_two_extension_configs_of_one_name_the_later_is_served() {
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    let second = ECDS_LUA
        .replace("name: ecds-lua", "name: ecds-lua-2")
        .replace("'ecds'", "'second'");
    let push = from_yaml(&format!("{MESH}---\n{ECDS_LUA}---\n{second}"));
    let served = extension_configs(
        &push,
        &proxy(&[("app", "productpage")]),
        &["hello-lua".into()],
    );
    assert_eq!(served.len(), 1);
    let config = TypedExtensionConfig::decode(served[0].resource.value.as_slice()).unwrap();
    let lua = String::from_utf8_lossy(&config.typed_config.unwrap().value).to_string();
    assert!(lua.contains("second"), "{lua}");
}

#[test]
fn an_unchanged_envoy_filter_is_not_compiled_again() {
    let push = from_yaml(&format!("{MESH}---\n{ECDS_LUA}"));
    let again = compile(&push.config.resources, &push.envoy_filters);
    assert!(Arc::ptr_eq(
        &again[0].patches,
        &push.envoy_filters[0].patches
    ));
    // A changed spec is compiled anew.
    let changed = from_yaml(&format!(
        "{MESH}---\n{}",
        ECDS_LUA.replace("'ecds'", "'new'")
    ));
    let recompiled = compile(&changed.config.resources, &push.envoy_filters);
    assert!(!Arc::ptr_eq(
        &recompiled[0].patches,
        &push.envoy_filters[0].patches
    ));
    assert_ne!(recompiled[0], push.envoy_filters[0]);
}

#[test]
fn a_rejection_is_blamed_on_the_filters_that_changed_that_type() {
    let filters = "\
kind: EnvoyFilter
metadata: {name: clusters, namespace: default}
spec:
  configPatches:
  - applyTo: CLUSTER
    match: {cluster: {service: reviews.default.svc.cluster.local}}
    patch: {operation: MERGE, value: {connect_timeout: 0s}}
---
kind: EnvoyFilter
metadata: {name: no-op, namespace: default}
spec:
  configPatches:
  - applyTo: CLUSTER
    match: {cluster: {service: nowhere.default.svc.cluster.local}}
    patch: {operation: REMOVE}
---
kind: EnvoyFilter
metadata: {name: listeners, namespace: default}
spec:
  configPatches:
  - applyTo: LISTENER
    match: {listener: {portNumber: 9080}}
    patch: {operation: MERGE, value: {per_connection_buffer_limit_bytes: 1024}}
";
    let push = from_yaml(&format!("{MESH}---\n{filters}"));
    let p = proxy(&[("app", "productpage")]);
    let blamed = |type_url: &str, names: &[Arc<str>]| {
        let generated = match type_url {
            CLUSTER_TYPE => crate::generators::cds::generate(&push, &p),
            LISTENER_TYPE => crate::generators::listeners(&push, &p),
            _ => crate::generators::routes(&push, &p, names),
        };
        blame(&push, &p, type_url, names, &generated)
    };
    assert_eq!(blamed(CLUSTER_TYPE, &[]), ["default/clusters"]);
    assert_eq!(blamed(LISTENER_TYPE, &[]), ["default/listeners"]);
    assert!(blamed(ROUTE_TYPE, &["9080".into()]).is_empty());
    let ecds = from_yaml(&format!("{MESH}---\n{ECDS_LUA}"));
    assert_eq!(
        blame(&ecds, &p, EXTENSION_CONFIG_TYPE, &["hello-lua".into()], &[]),
        ["default/ecds-lua"]
    );
}
