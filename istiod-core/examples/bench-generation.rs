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
//!
//! An argument `NAME=FILE` adds a case NAME whose config is the documents of FILE, generated for
//! Istio's benchmark proxy (1.1.1.1, `v0.default`, label `istio.io/benchmark: "true"`):
//! `scripts/bench-generation-istio.sh` renders Istio's own inputs
//! (`pilot/pkg/xds/testdata/benchmarks/*.yaml`) that way. Each row also gives the mean time of
//! the timed runs (Go's ns/op is a mean) and what one run allocates (Go's B/op and allocs/op),
//! counted in a run of its own after the timed ones.

use std::alloc::{GlobalAlloc, Layout};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The allocator `istiod-core serve` runs with (mimalloc), so the figures are the server's;
/// while `COUNTING` is set it also counts allocations and their bytes (a reallocation counts
/// as an allocation of its new size). Timed runs leave it unset: they pay one relaxed load.
struct Counting;
static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

fn count(size: usize) {
    if COUNTING.load(Relaxed) {
        ALLOCS.fetch_add(1, Relaxed);
        BYTES.fetch_add(size as u64, Relaxed);
    }
}

// Only forwards to mimalloc (the bench's one unsafe code: GlobalAlloc is an unsafe trait).
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract for `alloc`, passed on unchanged.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as `alloc`.
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (mimalloc) with `layout`.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: `ptr` came from this allocator (mimalloc) with `layout`.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

use istiod_core::config_store::{ConfigSet, parse_file};
use istiod_core::generators::{cds, eds};
use istiod_core::model::Proxy;
use istiod_core::push_context::{GenCache, PushContext};
use istiod_core::resource::Named;

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

/// What a run of `f` took and allocated: the median and the mean of the timed runs, and the
/// allocations (count, bytes) of one further run.
struct Timing {
    median: Duration,
    mean: Duration,
    allocs: u64,
    bytes: u64,
}

/// Times `f` over at least 0.5 s and 15 runs, then counts one more run's allocations.
fn time<T>(mut f: impl FnMut() -> T) -> (Timing, T) {
    let mut samples = Vec::new();
    let start = Instant::now();
    loop {
        let t = Instant::now();
        let out = f();
        samples.push(t.elapsed());
        drop(out);
        if samples.len() >= 15 && start.elapsed() > Duration::from_millis(500) {
            break;
        }
    }
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    samples.sort();
    ALLOCS.store(0, Relaxed);
    BYTES.store(0, Relaxed);
    COUNTING.store(true, Relaxed);
    let last = f();
    COUNTING.store(false, Relaxed);
    let timing = Timing {
        median: samples[samples.len() / 2],
        mean,
        allocs: ALLOCS.load(Relaxed),
        bytes: BYTES.load(Relaxed),
    };
    (timing, last)
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

fn row(case: &str, what: &str, t: &Timing, named: Option<&[Named]>, istio: &str) {
    let (kb, n) = named.map(size).unwrap_or((0.0, 0));
    let sz = if named.is_some() {
        format!("{kb:.1} | {n}")
    } else {
        "- | -".to_string()
    };
    println!(
        "| {case} | {what} | {} | {sz} | {istio} | {} | {} | {} |",
        fmt(t.median),
        fmt(t.mean),
        t.bytes,
        t.allocs
    );
}

/// A case read from a file (`NAME=FILE`), as Istio's benchmark reads its rendered input.
fn file_case(arg: &str) -> Option<(String, ConfigSet)> {
    let (name, file) = arg.split_once('=')?;
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
    let resources = parse_file(Path::new(file), &text).unwrap_or_else(|e| panic!("{e}"));
    Some((name.to_string(), ConfigSet { resources }))
}

fn main() {
    let proxy = Proxy::from_node_id("sidecar~1.1.1.1~v0.default~default.svc.cluster.local")
        .expect("node id");
    // Istio's benchmark proxy also carries this label (its inputs select on it).
    let mut labelled = proxy.clone();
    labelled
        .labels
        .insert("istio.io/benchmark".into(), "true".into());
    println!(
        "| case | generator | time/op (median) | kB/msg | resources/msg | Istio's published time/op | time/op (mean) | B/op | allocs/op |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let builtin = [
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
    // Optional arguments pick cases by name (`eds` for the EDS grid), for profiling one case;
    // `NAME=FILE` arguments add cases read from files.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let files: Vec<(String, ConfigSet)> = args.iter().filter_map(|a| file_case(a)).collect();
    let only: Vec<&String> = args.iter().filter(|a| !a.contains('=')).collect();
    let all = only.is_empty() && files.is_empty();
    let wanted = |name: &str| all || only.iter().any(|o| o.as_str() == name);
    let cases = builtin
        .into_iter()
        .filter(|(name, ..)| wanted(name))
        .map(|(name, config, route, init)| (name.to_string(), config, route, init, &proxy))
        .chain(
            files
                .into_iter()
                .map(|(name, config)| (name, config, "-", "-", &labelled)),
        );
    for (name, config, istio_route, istio_init, proxy) in cases {
        let name = name.as_str();
        let config = std::sync::Arc::new(config);
        let (d, mut push) = time(|| {
            PushContext::build(config.clone(), "cluster.local", "1".into()).expect("build")
        });
        row(name, "PushContext build", &d, None, istio_init);
        let (d, c) = time(|| {
            push.cache = GenCache::default();
            cds::generate(&push, proxy)
        });
        row(name, "CDS", &d, Some(&c), "-");
        let (d, c) = time(|| cds::generate(&push, proxy));
        row(name, "CDS, cached (every further proxy)", &d, Some(&c), "-");
        let (d, l) = time(|| {
            push.cache = GenCache::default();
            istiod_core::generators::listeners(&push, proxy)
        });
        row(name, "LDS", &d, Some(&l), "-");
        let routes = push.route_names();
        if !routes.is_empty() {
            let (d, r) = time(|| {
                push.cache = GenCache::default();
                istiod_core::generators::routes(&push, proxy, &routes)
            });
            row(name, "RDS", &d, Some(&r), istio_route);
        }
        let clusters: Vec<String> = push.clusters.keys().cloned().collect();
        let (d, e) = time(|| {
            push.cache = GenCache::default();
            eds::generate(&push, proxy, &clusters)
        });
        row(name, "EDS (all clusters)", &d, Some(&e), "-");
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
            eds::generate(&push, &proxy, &clusters)
        });
        row(&format!("EDS {eps}/{svcs}"), "EDS", &d, Some(&e), istio);
    }
    // Locality failover (ours): 100 services of 10 endpoints spread over four localities in
    // two regions, each with a DestinationRule setting outlier detection, so every assignment
    // is the proxy's own: without the rules (shared), for the first proxy of a locality
    // (generated), for every further proxy of that locality (cached).
    let base = services_yaml(100, "[{number: 80, name: http, protocol: HTTP}]", 10);
    let mut spread = String::new();
    for (k, part) in base.split(", serviceAccount: ").enumerate() {
        if k > 0 {
            spread.push_str(&format!(
                ", locality: region{}/zone{}, serviceAccount: ",
                k % 2,
                k % 4
            ));
        }
        spread.push_str(part);
    }
    let mut with_rules = spread.clone();
    for i in 0..100 {
        with_rules.push_str(&format!(
            "---\nkind: DestinationRule\nmetadata: {{name: svc{i}, namespace: default}}\nspec:\n  host: svc{i}.example.com\n  trafficPolicy: {{outlierDetection: {{consecutive5xxErrors: 5}}}}\n"
        ));
    }
    let mut located = proxy.clone();
    located.locality = "region0/zone0".into();
    for (what, yaml) in [
        ("no DestinationRule", spread),
        ("outlier detection", with_rules),
    ] {
        let mut push = PushContext::build(
            std::sync::Arc::new(parsed(&yaml)),
            "cluster.local",
            "1".into(),
        )
        .expect("build");
        let clusters: Vec<String> = push.clusters.keys().cloned().collect();
        let (d, e) = time(|| {
            push.cache = GenCache::default();
            eds::generate(&push, &located, &clusters)
        });
        row(
            &format!("EDS 10/100 in 4 localities, {what}"),
            "EDS, first proxy",
            &d,
            Some(&e),
            "-",
        );
        let (d, e) = time(|| eds::generate(&push, &located, &clusters));
        row(
            &format!("EDS 10/100 in 4 localities, {what}"),
            "EDS, cached (every further proxy)",
            &d,
            Some(&e),
            "-",
        );
    }
}
