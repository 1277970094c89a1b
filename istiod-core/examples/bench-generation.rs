//! Generation benchmarks modelled on istiod's `pilot/pkg/xds/bench_test.go`, run by
//! `scripts/bench-istiod.sh`. Per case: PushContext build (InitPushContext), then CDS, LDS, RDS
//! and EDS generation for a sidecar at 1.1.1.1 in `default` (as Istio's `v0.default`), with the
//! per-snapshot cache emptied before each run (Istio's benchmarks also run uncached), plus CDS as
//! every further proxy of the same snapshot pays it (cached). Prints time per op (median of many runs), kB and resources per message, Markdown.
//!
//! Cases (Istio's inputs): `http` / `tcp`: 100 ServiceEntries with one port (HTTP 80 / TCP 7070)
//! and one STATIC endpoint with tlsMode istio, plus the proxy's own (example.com); `virtualservice`: Istio's input as written (100
//! ServiceEntries, each with a VirtualService: a prefix and a regex match, a rewrite);
//! `virtualservice-rich` (ours): `http` plus a VirtualService (prefix + rewrite, regex, header
//! match to a weighted subset split, default) and a DestinationRule (two subsets, connection
//! pool, outlier detection) per service; `1000`: 1000 ServiceEntries, HTTP 8080 + TCP 9090,
//! two endpoints each; EDS grid endpoints/services 1/100, 10/10, 100/10, 1000/1.

use std::path::Path;
use std::time::{Duration, Instant};

// The allocator `istiod-core serve` runs with, so the figures are the server's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use istiod_core::config_store::{ConfigSet, parse_file};
use istiod_core::generators::{Named, cds, eds, lds, route};
use istiod_core::model::Proxy;
use istiod_core::push_context::{GenCache, PushContext};

fn ip(prefix: &str, i: usize) -> String {
    format!("{prefix}.{}.{}", (i / 256) % 256, i % 256)
}

fn services(n: usize, ports: &str, endpoints: usize) -> ConfigSet {
    parsed(&services_yaml(n, ports, endpoints))
}

/// Istio's `http`/`tcp` inputs also hold the proxy's own service (example.com at 1.1.1.1).
fn with_proxy_service(n: usize, ports: &str) -> ConfigSet {
    let mut yaml = services_yaml(n, ports, 1);
    yaml.push_str(&format!(
        "---\nkind: ServiceEntry\nmetadata: {{name: proxy-service-instance}}\nspec:\n  hosts: [example.com]\n  ports: {ports}\n  resolution: STATIC\n  endpoints: [{{address: 1.1.1.1, labels: {{security.istio.io/tlsMode: istio}}}}]\n"
    ));
    parsed(&yaml)
}

fn parsed(yaml: &str) -> ConfigSet {
    ConfigSet {
        resources: parse_file(Path::new("bench.yaml"), yaml).expect("bench config parses"),
    }
}

/// Istio's `virtualservice` case as its `testdata/benchmarks/virtualservice.yaml` writes it: the
/// proxy's own ServiceEntry, then per service a ServiceEntry without addresses and a
/// VirtualService with one route (a prefix and a regex match block, a rewrite) to that host.
fn istio_virtual_services(n: usize) -> ConfigSet {
    let mut yaml = String::from(
        "kind: ServiceEntry\nmetadata: {name: proxy-service-instance}\nspec:\n  hosts: [example.com]\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  resolution: STATIC\n  endpoints: [{address: 1.1.1.1}]\n",
    );
    for i in 0..n {
        yaml.push_str(&format!(
            r#"---
kind: VirtualService
metadata: {{name: vs-{i}}}
spec:
  hosts: [random-{i}.host.example]
  http:
  - name: match-route
    match: [{{uri: {{prefix: /foo}}}}, {{uri: {{regex: /bar}}}}]
    rewrite: {{uri: /new-url}}
    route: [{{destination: {{host: random-{i}.host.example}}}}]
---
kind: ServiceEntry
metadata: {{name: service-{i}}}
spec:
  hosts: [random-{i}.host.example]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 1.2.3.4}}]
"#
        ));
    }
    parsed(&yaml)
}

/// Our richer routing case (not Istio's): each service gets a VirtualService with a prefix
/// match and rewrite, a regex match, a header match to a subset split and a default route, and
/// a DestinationRule with two subsets and a connection pool.
fn virtual_services(n: usize) -> ConfigSet {
    let mut yaml = services_yaml(n, "[{number: 80, name: http, protocol: HTTP}]", 1);
    for i in 0..n {
        yaml.push_str(&format!(
            r#"---
kind: VirtualService
metadata: {{name: vs{i}, namespace: default}}
spec:
  hosts: [svc{i}.example.com]
  http:
  - name: prefix
    match: [{{uri: {{prefix: /foo}}}}]
    rewrite: {{uri: /bar}}
    route: [{{destination: {{host: svc{i}.example.com}}}}]
    timeout: 5s
  - name: regex
    match: [{{uri: {{regex: "/item/[0-9]+"}}}}]
    route: [{{destination: {{host: svc{i}.example.com}}}}]
    retries: {{attempts: 3, perTryTimeout: 1s, retryOn: "5xx,gateway-error"}}
  - name: canary
    match: [{{headers: {{x-canary: {{exact: "1"}}}}}}]
    route:
    - {{destination: {{host: svc{i}.example.com, subset: v1}}, weight: 90}}
    - {{destination: {{host: svc{i}.example.com, subset: v2}}, weight: 10}}
  - route: [{{destination: {{host: svc{i}.example.com}}}}]
---
kind: DestinationRule
metadata: {{name: dr{i}, namespace: default}}
spec:
  host: svc{i}.example.com
  trafficPolicy: {{connectionPool: {{tcp: {{maxConnections: 100}}}}, outlierDetection: {{consecutive5xxErrors: 5}}}}
  subsets: [{{name: v1, labels: {{version: v1}}}}, {{name: v2, labels: {{version: v2}}}}]
"#
        ));
    }
    parsed(&yaml)
}

fn services_yaml(n: usize, ports: &str, endpoints: usize) -> String {
    let mut yaml = String::new();
    for i in 0..n {
        let eps: Vec<String> = (0..endpoints)
            .map(|e| {
                let k = i * endpoints + e;
                format!(
                    "{{address: 10.{}.{}.{}, labels: {{security.istio.io/tlsMode: istio}}, serviceAccount: sa{i}}}",
                    (k / 65536) % 256,
                    (k / 256) % 256,
                    k % 256
                )
            })
            .collect();
        yaml.push_str(&format!(
            "---\nkind: ServiceEntry\nmetadata: {{name: svc{i}, namespace: default}}\nspec:\n  hosts: [svc{i}.example.com]\n  addresses: [{}]\n  resolution: STATIC\n  ports: {ports}\n  endpoints: [{}]\n",
            ip("240.240", i),
            eps.join(", ")
        ));
    }
    yaml
}

/// Median time of `f` over at least 0.5 s and 15 runs.
fn time<T>(mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut samples = Vec::new();
    let start = Instant::now();
    let mut last;
    loop {
        let t = Instant::now();
        last = f();
        samples.push(t.elapsed());
        if samples.len() >= 15 && start.elapsed() > Duration::from_millis(500) {
            break;
        }
    }
    samples.sort();
    (samples[samples.len() / 2], last)
}

fn size(named: &[Named]) -> (f64, usize) {
    let bytes: usize = named.iter().map(|n| n.resource.value.len()).sum();
    (bytes as f64 / 1024.0, named.len())
}

fn fmt(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

fn row(case: &str, what: &str, d: Duration, named: Option<&[Named]>, istio: &str) {
    let (kb, n) = named.map(size).unwrap_or((0.0, 0));
    let sz = if named.is_some() {
        format!("{kb:.1} | {n}")
    } else {
        "- | -".to_string()
    };
    println!("| {case} | {what} | {} | {sz} | {istio} |", fmt(d));
}

fn main() {
    let proxy = Proxy::from_node_id("sidecar~1.1.1.1~v0.default~default.svc.cluster.local")
        .expect("node id");
    println!(
        "| case | generator | time/op (median) | kB/msg | resources/msg | Istio's published time/op |"
    );
    println!("|---|---|---|---|---|---|");
    let cases = [
        (
            "http",
            with_proxy_service(100, "[{number: 80, name: http, protocol: HTTP}]"),
            "330 µs (Route, 16 procs)",
            "~165 µs (48 procs)",
        ),
        (
            "virtualservice",
            istio_virtual_services(100),
            "1.03 ms (Route, 16 procs)",
            "-",
        ),
        ("virtualservice-rich", virtual_services(100), "-", "-"),
        (
            "tcp",
            with_proxy_service(100, "[{number: 7070, name: tcp, protocol: TCP}]"),
            "-",
            "~165 µs (48 procs)",
        ),
        (
            "1000 services",
            services(
                1000,
                "[{number: 8080, name: http, protocol: HTTP}, {number: 9090, name: tcp, protocol: TCP}]",
                2,
            ),
            "-",
            "-",
        ),
    ];
    // Optional arguments pick cases by name (`eds` for the EDS grid), for profiling one case.
    let only: Vec<String> = std::env::args().skip(1).collect();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    for (name, config, istio_route, istio_init) in cases {
        if !wanted(name) {
            continue;
        }
        let config = std::sync::Arc::new(config);
        let (d, mut push) = time(|| {
            PushContext::build(config.clone(), "cluster.local", "1".into()).expect("build")
        });
        row(name, "PushContext build", d, None, istio_init);
        let (d, c) = time(|| {
            push.cache = GenCache::default();
            cds::generate(&push, &proxy)
        });
        row(name, "CDS", d, Some(&c), "-");
        let (d, c) = time(|| cds::generate(&push, &proxy));
        row(name, "CDS, cached (every further proxy)", d, Some(&c), "-");
        let (d, l) = time(|| {
            push.cache = GenCache::default();
            lds::generate(&push, &proxy)
        });
        row(name, "LDS", d, Some(&l), "-");
        let routes = push.route_names();
        if !routes.is_empty() {
            let (d, r) = time(|| {
                push.cache = GenCache::default();
                route::generate(&push, &proxy, &routes)
            });
            row(name, "RDS", d, Some(&r), istio_route);
        }
        let clusters: Vec<String> = push.clusters.keys().cloned().collect();
        let (d, e) = time(|| {
            push.cache = GenCache::default();
            eds::generate(&push, &clusters)
        });
        row(name, "EDS (all clusters)", d, Some(&e), "-");
    }
    if !wanted("eds") {
        return;
    }
    for (eps, svcs, istio) in [
        (1, 100, "451 µs (8 procs)"),
        (10, 10, "250 µs (8 procs)"),
        (100, 10, "2.04 ms (8 procs)"),
        (1000, 1, "2.10 ms (8 procs)"),
    ] {
        let config = services(svcs, "[{number: 80, name: http, protocol: HTTP}]", eps);
        let mut push = PushContext::build(std::sync::Arc::new(config), "cluster.local", "1".into())
            .expect("build");
        let clusters: Vec<String> = push.clusters.keys().cloned().collect();
        let (d, e) = time(|| {
            push.cache = GenCache::default();
            eds::generate(&push, &clusters)
        });
        row(&format!("EDS {eps}/{svcs}"), "EDS", d, Some(&e), istio);
    }
}
