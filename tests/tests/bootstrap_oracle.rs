//! Istio's own pilot-agent (the release-1.31 build `scripts/install-istio.sh` installs) as the
//! oracle for our bootstrap. Each case runs both agents the same way, in a pod (network
//! namespace) of its own, with the same env, ProxyConfig, pod files and mesh config, and Envoy
//! replaced by a script that copies the bootstrap it is given (`envoy-rev.json`) and its argv.
//! Then:
//! - `stats_config` and the stats intervals are compared exactly: which stats exist, and their
//!   tags, decide what 15090 serves and much of Envoy's memory;
//! - the whole document and Envoy's argv are compared field by field, and every difference must
//!   be one of `KNOWN` (each with its reason; docs/conformance.md "Istio's pilot-agent as the oracle"), with
//!   the values it names: a new difference, or a known one that changed, fails the test, and so
//!   does a known one no case shows any more.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use harness::istio::istio_bin;
use harness::{Network, binary, require_root};
use serde_json::{Value, json};

/// The fake Envoy both agents start: copies its bootstrap (`-c PATH`, its 2nd argument) and argv
/// into `$OUT` and exits 0, which ends either agent.
/// Writes the bootstrap and argv it is given where the test reads them; `--version` is the real
/// Envoy's (our agent starts only the Envoy build its proxy module was made for).
fn fake_envoy() -> String {
    format!(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then exec '{}' --version; fi\n\
         cp \"$2\" \"$OUT/envoy-rev.json\"\nprintf '%s\\n' \"$@\" > \"$OUT/argv\"\n",
        harness::envoy_path()
    )
}

struct Case {
    name: &'static str,
    proxy_type: &'static str,
    env: Vec<(&'static str, String)>,
    /// ProxyConfig fields given as PROXY_CONFIG (binaryPath is added).
    proxy_config: Value,
    labels: Vec<(&'static str, &'static str)>,
    annotations: Vec<(&'static str, String)>,
    /// `./etc/istio/config/mesh`, read by both agents.
    mesh: Option<&'static str>,
}

fn case(name: &'static str) -> Case {
    Case {
        name,
        proxy_type: "sidecar",
        env: vec![
            ("POD_NAME", format!("{name}-6d4cf56db6-x2x7k")),
            ("POD_NAMESPACE", "bookinfo".into()),
            ("SERVICE_ACCOUNT", "bookinfo-reviews".into()),
            ("ISTIO_META_CLUSTER_ID", "Kubernetes".into()),
            ("ISTIO_META_MESH_ID", "cluster.local".into()),
        ],
        proxy_config: json!({}),
        labels: vec![("app", "reviews"), ("version", "v1")],
        annotations: vec![("sidecar.istio.io/status", "{}".into())],
        mesh: None,
    }
}

fn cases() -> Vec<Case> {
    let mut v = vec![case("default")];
    let mut c = case("stats-annotations");
    c.annotations.extend([
        (
            "sidecar.istio.io/statsInclusionPrefixes",
            "http.{pod_ip}_,cluster.outbound".into(),
        ),
        (
            "sidecar.istio.io/statsInclusionSuffixes",
            "upstream_rq_total,upstream_cx_active".into(),
        ),
        (
            "sidecar.istio.io/statsInclusionRegexps",
            r"http\.[0-9.]+_8080\..*,.*_cx_.*".into(),
        ),
        ("sidecar.istio.io/extraStatTags", "request_host,dlp".into()),
        ("traffic.sidecar.istio.io/excludeInterfaces", "eth0".into()),
    ]);
    v.push(c);
    let mut c = case("stats-proxy-config");
    c.proxy_config = json!({
        "proxyStatsMatcher": {
            "inclusionPrefixes": ["tcp.", "cluster.inbound"],
            "inclusionSuffixes": ["upstream_rq_timeout"],
            "inclusionRegexps": [".*circuit_breakers.*"]
        },
        "extraStatTags": ["dlp_success", ""]
    });
    c.annotations
        .push((EXTRA, "dlp_status,dlp_success,dlp_error".into()));
    v.push(c);
    let mut c = case("stats-annotation-wins-per-list");
    c.proxy_config = json!({ "proxyStatsMatcher": {
        "inclusionPrefixes": ["from_proxy_config"],
        "inclusionSuffixes": ["suffix_from_proxy_config"]
    } });
    // `{pod_ip}` is one entry per instance IP. Istio's agent adds the pod's interface addresses
    // to INSTANCE_IP (see KNOWN): with the interface excluded both agents have INSTANCE_IP alone.
    c.annotations.extend([
        (PREFIXES, "from_annotation,{pod_ip}".into()),
        ("traffic.sidecar.istio.io/excludeInterfaces", "eth0".into()),
    ]);
    v.push(c);
    let mut c = case("stats-mesh-then-pod-annotation");
    c.mesh = Some(
        "defaultConfig:\n  proxyStatsMatcher:\n    inclusionPrefixes: [\"from_mesh\"]\n    inclusionRegexps: [\"mesh.*\"]\n",
    );
    // A ProxyConfig field set by the pod replaces the mesh's whole field.
    c.annotations.push((
        "proxy.istio.io/config",
        "proxyStatsMatcher:\n  inclusionSuffixes: [\"from_pod\"]\n".into(),
    ));
    v.push(c);
    let mut c = case("stats-histograms-and-intervals");
    c.annotations.extend([
        (
            "sidecar.istio.io/statsHistogramBuckets",
            r#"{"istiocustom":[1,5,10,50,100,500,1000,5000,10000],"cluster.xds-grpc":[1,5,10,25,50,100,250,500,1000,2500,5000,10000]}"#.into(),
        ),
        ("sidecar.istio.io/statsFlushInterval", "10s".into()),
        ("sidecar.istio.io/statsEvictionInterval", "30s".into()),
    ]);
    v.push(c);
    let mut c = case("stats-eviction-not-a-multiple");
    c.annotations
        .push(("sidecar.istio.io/statsEvictionInterval", "11s".into()));
    v.push(c);
    let mut c = case("exit-on-zero-active-connections");
    c.env
        .push(("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "true".into()));
    v.push(c);
    let mut c = case("router");
    c.proxy_type = "router";
    c.labels = vec![("istio", "ingressgateway"), ("app", "istio-ingressgateway")];
    c.annotations.clear();
    v.push(c);
    let mut c = case("runtime-values-and-service-cluster");
    c.proxy_config = json!({
        "runtimeValues": {
            "overload.global_downstream_max_connections": "5000",
            "envoy.reloadable_features.http_reject_path_with_fragment": "",
            "envoy.reloadable_features.some_feature": "true",
            "custom.key": "value"
        },
        "serviceCluster": "reviews-tracing"
    });
    v.push(c);
    let mut c = case("workload-name-without-app-label");
    c.labels = vec![("version", "v2")];
    c.env
        .push(("ISTIO_META_WORKLOAD_NAME", "reviews-v2".into()));
    v.push(c);
    let mut c = case("zipkin-tracing");
    c.proxy_config = json!({ "tracing": { "zipkin": { "address": "zipkin.istio-system:9411" } } });
    v.push(c);
    let mut c = case("state-of-the-world-xds");
    c.env.push(("ISTIO_DELTA_XDS", "false".into()));
    v.push(c);
    // Istio 1.28-1.31's agent features that change Envoy's bootstrap or command line.
    let mut c = case("file-flush-and-stats-compression-off");
    c.proxy_config = json!({
        "fileFlushInterval": "2.5s",
        "fileFlushMinSizeKb": 128,
        "statsCompression": false
    });
    v.push(c);
    let mut c = case("secure-metrics-ports");
    c.env.extend([
        ("ENVOY_SECURE_METRICS_PORT", "15091".into()),
        ("ENVOY_SECURE_MERGED_METRICS_PORT", "15092".into()),
    ]);
    v.push(c);
    let mut c = case("self-discovery-and-connection-limit");
    c.env.extend([
        ("ISTIO_META_ENABLE_SELF_DISCOVERY", "true".into()),
        ("ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL", "true".into()),
    ]);
    c.proxy_config = json!({ "proxyMetadata": {
        "ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS": "20000"
    } });
    v.push(c);
    let mut c = case("tracing-service-name-canonical");
    c.proxy_config = json!({ "tracingServiceName": "CANONICAL_NAME_AND_NAMESPACE" });
    c.labels = vec![
        ("app", "reviews"),
        ("version", "v1"),
        ("service.istio.io/canonical-name", "reviews-canonical"),
    ];
    v.push(c);
    let mut c = case("tracing-service-name-canonical-only");
    c.proxy_config = json!({ "tracingServiceName": "CANONICAL_NAME_ONLY" });
    v.push(c);
    let mut c = case("statsd-als-and-metrics-service");
    c.proxy_config = json!({
        "statsdUdpAddress": "10.233.0.1:8125",
        "envoyAccessLogService": { "address": "als.monitoring:9000", "tcpKeepalive": { "probes": 3, "time": "10s", "interval": "5s" } },
        "envoyMetricsService": { "address": "metrics.monitoring:9001" }
    });
    v.push(c);
    let mut c = case("fips-140-2-and-envoy-flags");
    c.env.extend([
        ("COMPLIANCE_POLICY", "fips-140-2".into()),
        ("ENVOY_SKIP_DEPRECATED_LOGS", "false".into()),
        ("ISTIO_ENVOY_ENABLE_CORE_DUMP", "true".into()),
    ]);
    v.push(c);
    v
}

const PREFIXES: &str = "sidecar.istio.io/statsInclusionPrefixes";
const EXTRA: &str = "sidecar.istio.io/extraStatTags";

/// A difference we keep, and why. `path` is a JSON pointer into envoy-rev.json (`argv/...` for
/// Envoy's command line); `istio`/`ours` are the values each side has there (`null`: absent).
struct Known {
    path: &'static str,
    istio: Value,
    ours: Value,
    why: &'static str,
}

/// The 15090 listener's HTTP filters as Istio's template writes them (three compressors, then
/// the router), with ours: the proxy module's `istio.stats_flush` first.
fn stats_listener_filters(ours: bool) -> Value {
    let compressor = |name: &str, lib: &str, ty: &str| {
        json!({
            "name": format!("envoy.filters.http.compressor.{name}"),
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor",
                "compressor_library": {
                    "name": lib,
                    "typed_config": {"@type": format!("type.googleapis.com/envoy.extensions.compression.{name}.compressor.v3.{ty}")}
                },
                "response_direction_config": {"common_config": {"content_type": [
                    "text/plain", "application/vnd.google.protobuf",
                    "application/openmetrics-text", "application/openmetrics-protobuf"
                ]}}
            }
        })
    };
    let mut filters = vec![
        compressor("brotli", "stats_brotli", "Brotli"),
        compressor("zstd", "stats_zstd", "Zstd"),
        compressor("gzip", "stats_gzip", "Gzip"),
        json!({"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}),
    ];
    if ours {
        filters.insert(
            0,
            json!({"name": "istio.stats_flush", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
                "dynamic_module_config": {"do_not_close": true, "metrics_namespace": "istiocustom", "name": "istio_module"},
                "filter_name": "istio.stats_flush"
            }}),
        );
    }
    Value::Array(filters)
}

fn known() -> Vec<Known> {
    let k = |path, istio, ours, why| Known {
        path,
        istio,
        ours,
        why,
    };
    vec![
        k(
            "/layered_runtime/layers/0/static_layer/envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix",
            Value::Null,
            json!(true),
            "the proxy module's metrics keep Istio's names (istio_requests_total, not envoy_dynamicmodulescustom_...); Istio's Envoy build has its stats filter built in",
        ),
        k(
            "/static_resources/listeners/0.0.0.0_15090/filter_chains/0/filters/0/typed_config/http_filters",
            stats_listener_filters(false),
            stats_listener_filters(true),
            "the proxy module's istio.stats_flush moves the TCP metrics into labelled counters before a scrape is answered (network filters cannot label metrics in Envoy 1.40)",
        ),
        k(
            "/static_resources/listeners/0.0.0.0_15090/filter_chains/0/filters/0/typed_config/http_filters",
            json!([stats_listener_filters(false)[3]]),
            json!([
                stats_listener_filters(true)[0],
                stats_listener_filters(true)[4]
            ]),
            "with statsCompression off, the same: the proxy module's istio.stats_flush ahead of the router",
        ),
        k(
            "/node/metadata/ISTIO_VERSION",
            json!("1.31-eed52ebb66ad"),
            json!("1.31.0"),
            "Istio's is its build's version (-ldflags); ours names the Istio release we are proven against",
        ),
        k(
            "/node/metadata/INSTANCE_IPS",
            json!("10.233.0.1,fd00:233::1"),
            json!("10.233.0.1"),
            "Istio's agent adds every address of the pod's interfaces to INSTANCE_IP (so `{pod_ip}` in a stats pattern expands to each); ours takes INSTANCE_IP (comma-separated) only",
        ),
    ]
}

/// Runs one agent (Istio's or ours) for case `c` in `pod`, from the working directory `work`
/// (its pod files), and returns the bootstrap and argv the fake Envoy kept.
fn run_agent(
    pod: &mut harness::Pod,
    work: &Path,
    agent: &Path,
    c: &Case,
    fake: &Path,
    istio: bool,
) -> Result<(Value, Vec<String>)> {
    let _ = std::fs::remove_dir_all(work);
    for d in ["etc/istio/pod", "etc/istio/config", "out"] {
        std::fs::create_dir_all(work.join(d))?;
    }
    harness::write_readable(&work.join("etc/istio/pod/labels"), downward(&c.labels))?;
    let annotations: Vec<(&str, &str)> = c
        .annotations
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    harness::write_readable(
        &work.join("etc/istio/pod/annotations"),
        downward(&annotations),
    )?;
    if let Some(mesh) = c.mesh {
        harness::write_readable(&work.join("etc/istio/config/mesh"), mesh)?;
    }
    // Envoy runs as 1337 under our agent: the fake must be able to write its output.
    let out = work.join("out");
    std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    for d in [work.to_path_buf(), work.join("etc"), work.join("etc/istio")] {
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    }
    let mut proxy_config = c.proxy_config.clone();
    proxy_config["binaryPath"] = json!(fake);
    let (out_dir, instance_ip, proxy_config) = (
        out.display().to_string(),
        pod.ip.to_string(),
        proxy_config.to_string(),
    );
    let template = harness::istio::istio_home()
        .join("envoy_bootstrap_tmpl.json")
        .display()
        .to_string();
    let mut env: Vec<(&str, &str)> = vec![
        ("OUT", &out_dir),
        ("INSTANCE_IP", &instance_ip),
        ("PROXY_CONFIG", &proxy_config),
        // Istio's agent: no cloud metadata lookups, no root certificate needed to start.
        ("CLOUD_PLATFORM", "none"),
        ("CA_ROOT_CA", "SYSTEM"),
        ("XDS_ROOT_CA", "SYSTEM"),
    ];
    if istio {
        env.push(("ISTIO_BOOTSTRAP", &template));
    }
    env.extend(c.env.iter().map(|(k, v)| (*k, v.as_str())));
    let name = if istio { "istio-agent" } else { "our-agent" };
    let agent = agent.display().to_string();
    let proc = pod.spawn_in(work, name, 0, 0, &env, &[&agent, "proxy", c.proxy_type])?;
    proc.wait_timeout(Duration::from_secs(60))?;
    let doc = std::fs::read_to_string(out.join("envoy-rev.json")).with_context(|| {
        format!(
            "{name} wrote no bootstrap for case {}: {}",
            c.name,
            proc.logs()
        )
    })?;
    let argv = std::fs::read_to_string(out.join("argv"))?
        .lines()
        .map(str::to_string)
        .collect();
    // Istio's template can leave a trailing comma (its secure metrics listeners end with one):
    // Envoy reads its bootstrap as YAML, which takes it, and so does this test.
    let parsed = match serde_json::from_str(&doc) {
        Ok(v) => v,
        Err(_) if istio => serde_yaml_ng::from_str(&doc)
            .with_context(|| format!("Istio's bootstrap for case {}", c.name))?,
        Err(e) => return Err(e).with_context(|| format!("our bootstrap for case {}", c.name)),
    };
    Ok((parsed, argv))
}

/// The kubelet's downward-API file format: `key="value"` per line, sorted.
fn downward(pairs: &[(&str, &str)]) -> String {
    let sorted: BTreeMap<&str, &str> = pairs.iter().copied().collect();
    sorted
        .iter()
        .map(|(k, v)| format!("{k}={}\n", serde_json::to_string(v).unwrap_or_default()))
        .collect()
}

/// Lists are compared element by element, except the static clusters and listeners, which are
/// keyed by name (ours has one more cluster).
fn diff(path: &str, istio: &Value, ours: &Value, out: &mut Vec<(String, Value, Value)>) {
    match (istio, ours) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let (x, y) = (
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                );
                diff(&format!("{path}/{k}"), x, y, out);
            }
        }
        (Value::Array(a), Value::Array(b))
            if path.ends_with("/clusters") || path.ends_with("/listeners") =>
        {
            let by_name = |v: &Vec<Value>| -> BTreeMap<String, Value> {
                v.iter()
                    .map(|e| {
                        (
                            e["name"].as_str().unwrap_or_default().to_string(),
                            e.clone(),
                        )
                    })
                    .collect()
            };
            let (a, b) = (by_name(a), by_name(b));
            let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for n in names {
                match (a.get(n), b.get(n)) {
                    (Some(x), Some(y)) => diff(&format!("{path}/{n}"), x, y, out),
                    (x, y) => out.push((
                        format!("{path}/{n}"),
                        x.map_or(Value::Null, |_| json!("present")),
                        y.map_or(Value::Null, |_| json!("present")),
                    )),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}/{i}"), x, y, out);
            }
        }
        (a, b) if a != b => out.push((path.to_string(), a.clone(), b.clone())),
        _ => {}
    }
}

/// Envoy's argv as `flag → value` (a flag with no value maps to `true`).
fn argv_map(argv: &[String]) -> Value {
    let mut m = serde_json::Map::new();
    let mut i = 0;
    while i < argv.len() {
        let flag = argv[i].clone();
        match argv.get(i + 1).filter(|v| !v.starts_with('-')) {
            Some(v) => {
                // Both name the same file; one writes it `./etc/...`.
                let v = v.trim_start_matches("./").to_string();
                m.insert(flag, json!(v));
                i += 2;
            }
            None => {
                m.insert(flag, json!(true));
                i += 1;
            }
        }
    }
    Value::Object(m)
}

#[test]
fn our_bootstrap_matches_istios_but_for_the_known_differences() -> Result<()> {
    if !require_root("bootstrap_oracle") {
        return Ok(());
    }
    let Ok(istio_agent) = istio_bin("pilot-agent") else {
        return Ok(());
    };
    let our_agent = binary("pilot-agent");
    let mut net = Network::new()?;
    let i = net.add_pod("oracle", 1)?;
    let fake = net.dir().join("fake-envoy");
    harness::write_readable(&fake, fake_envoy())?;
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;

    let known = known();
    let mut seen = BTreeSet::new();
    let mut failures = Vec::new();
    let cases = cases();
    for c in &cases {
        let (istio_work, our_work) = (net.dir().join("istio"), net.dir().join("ours"));
        let pod = &mut net.pods[i];
        let (istio_doc, istio_argv) = run_agent(pod, &istio_work, &istio_agent, c, &fake, true)?;
        let (our_doc, our_argv) = run_agent(pod, &our_work, &our_agent, c, &fake, false)?;
        for key in [
            "stats_config",
            "stats_flush_interval",
            "stats_eviction_interval",
        ] {
            if istio_doc.get(key) != our_doc.get(key) {
                failures.push(format!(
                    "{}: {key} differs\n  Istio: {}\n  ours:  {}",
                    c.name,
                    istio_doc.get(key).unwrap_or(&Value::Null),
                    our_doc.get(key).unwrap_or(&Value::Null)
                ));
            }
        }
        let mut diffs = Vec::new();
        diff("", &istio_doc, &our_doc, &mut diffs);
        diff(
            "argv",
            &argv_map(&istio_argv),
            &argv_map(&our_argv),
            &mut diffs,
        );
        if let Some(dir) = std::env::var_os("BOOTSTRAP_ORACLE_DUMP") {
            // For a look at both documents: BOOTSTRAP_ORACLE_DUMP=DIR.
            let dir = Path::new(&dir);
            std::fs::create_dir_all(dir)?;
            for (who, doc) in [("istio", &istio_doc), ("ours", &our_doc)] {
                std::fs::write(
                    dir.join(format!("{}-{who}.json", c.name)),
                    serde_json::to_string_pretty(doc)?,
                )?;
            }
        }
        for (path, istio, ours) in diffs {
            let same = |k: &Known| k.path == path && k.istio == istio && k.ours == ours;
            if let Some(n) = known.iter().position(same) {
                seen.insert(n);
                continue;
            }
            match known.iter().position(|k| k.path == path) {
                Some(n) => failures.push(format!(
                    "{}: known difference at {path} changed: Istio {istio}, ours {ours} (expected Istio {}, ours {}; {})",
                    c.name, known[n].istio, known[n].ours, known[n].why
                )),
                None => failures.push(format!(
                    "{}: new difference at {path}: Istio {istio}, ours {ours}",
                    c.name
                )),
            }
        }
    }
    for (n, k) in known.iter().enumerate() {
        if !seen.contains(&n) {
            failures.push(format!(
                "known difference {} ({}) no longer seen in any case: remove it from KNOWN and docs/conformance.md",
                k.path, k.why
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from Istio's pilot-agent:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    Ok(())
}
