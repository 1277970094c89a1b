//! The guard of the workspace's layering, read from the sources (`layer_guard::read`):
//! - no import circle between files, in any crate (a module's child using what its ancestor
//!   module defines is part of that module, not a circle: the parent declares it);
//! - in the product crates every file has a layer, written once below, lowest first, and no file
//!   imports from a higher layer;
//! - the crates depend on each other only as listed, and the sidecar agent meets istiod-core
//!   only where it embeds the control plane;
//! - the configuration modules are leaves of their crates.
//!
//! A new module declares its layer here (the test names a file that has none). There are no
//! exceptions today; an exception would be listed here with its reason.

use std::collections::BTreeMap;

use layer_guard::{FileId, Graph, read, workspace_crates, workspace_root};

/// One layer: a name and the module paths in it (a path covers its submodules unless a longer
/// one is listed; `""` is the crate root `lib.rs`, `main` the binary's `main.rs`).
type Layer = (&'static str, &'static [&'static str]);

/// Each product crate's layers, lowest first.
const LAYERS: &[(&str, &[Layer])] = &[
    (
        "common",
        &[
            (
                "primitives",
                &[
                    "duration",
                    "go_bool",
                    "names",
                    "re2",
                    "identity",
                    "envoy",
                    "grpc",
                    "xds",
                    "tasks",
                    "watch",
                    "conn_slots",
                    "module",
                ],
            ),
            ("shared parts", &["side_port", "telemetry"]),
            ("crate", &[""]),
        ],
    ),
    (
        "init",
        &[
            ("config", &["config"]),
            ("plan", &["plan", "validation"]),
            ("render", &["render"]),
            ("apply", &["apply", "nft"]),
            ("program", &["", "main"]),
        ],
    ),
    (
        "istiod-core",
        &[
            (
                "leaves",
                &[
                    "config",
                    "intern",
                    "wire",
                    "envoy_proto",
                    "resource",
                    "ca",
                    "ca_server",
                    "transport",
                ],
            ),
            ("typed config", &["config_store"]),
            ("sources", &["store", "kube", "kube::source"]),
            ("model", &["model", "registry", "gateway_conversion"]),
            ("snapshot", &["push_context"]),
            (
                "generator blocks",
                &[
                    "generators::blocks",
                    "generators::tls",
                    "generators::route::retry",
                ],
            ),
            (
                "generator features",
                &[
                    "generators::authn",
                    "generators::ext_authz",
                    "generators::cluster_policy",
                    "generators::telemetry",
                    "generators::nds",
                ],
            ),
            (
                "generator compositions",
                &[
                    "generators::authz",
                    "generators::locality",
                    "generators::route",
                ],
            ),
            (
                "generator listener parts",
                &["generators::listener", "generators::eds"],
            ),
            (
                "generator proxies",
                &["generators::lds", "generators::gateway"],
            ),
            ("generator clusters", &["generators::cds"]),
            ("generator entry", &["generators"]),
            ("EnvoyFilter pass", &["patch"]),
            (
                "serving",
                &[
                    "xds_debug",
                    "xds_server",
                    "autoregister",
                    "ads_http",
                    "kube::status",
                    "kube::gateway_status",
                    "kube::gateway_deploy",
                    "kube::ip_allocate",
                    "kube::identity",
                ],
            ),
            ("process", &["", "debug", "serve", "main"]),
        ],
    ),
    (
        "agent",
        &[
            ("config", &["config"]),
            (
                "primitives",
                &[
                    "http_client",
                    "drain",
                    "uds",
                    "app_uid",
                    "workload",
                    "proxy_module",
                    "compress",
                ],
            ),
            ("local clients", &["admin"]),
            ("services", &["metrics", "probes", "grpc_client", "health"]),
            ("workload", &["identity", "dns"]),
            ("identity users", &["embedded", "sds"]),
            ("Envoy", &["bootstrap", "envoy", "xds_adapt"]),
            ("xDS", &["xds_proxy"]),
            ("status", &["status"]),
            ("process", &["", "cli", "main"]),
        ],
    ),
    ("proto", &[("crate", &[""])]),
    (
        "module",
        &[
            ("leaves", &["logging", "envoy", "peer", "tcp_metrics"]),
            ("model", &["labels", "node"]),
            ("filters", &["filters"]),
            ("ABI", &["ffi"]),
            ("crate", &[""]),
        ],
    ),
];

/// Which crates each crate's code may use, by folder.
const CRATE_DEPS: &[(&str, &[&str])] = &[
    ("common", &[]),
    ("proto", &[]),
    ("init", &["common"]),
    ("istiod-core", &["common", "proto"]),
    ("agent", &["common", "init", "proto", "istiod-core"]),
    ("module", &["common"]),
];

/// The agent's files that may use istiod-core: the embedded control plane and its settings.
const AGENT_EMBEDDING: &[&str] = &["agent/src/embedded.rs", "agent/src/config/embedded.rs"];

/// Modules that import nothing of their own crate outside themselves.
const LEAVES: &[(&str, &str)] = &[
    ("istiod-core", "config"),
    ("agent", "config"),
    ("init", "config"),
];

fn graph() -> Graph {
    read(&workspace_root(), &workspace_crates()).unwrap_or_else(|e| panic!("reading sources: {e}"))
}

fn module_key(g: &Graph, f: FileId) -> String {
    let n = &g.files[f];
    if n.bin && n.module.is_empty() {
        "main".to_string()
    } else {
        n.module.clone()
    }
}

/// Whether module `m` is `prefix` or inside it.
fn under(m: &str, prefix: &str) -> bool {
    if prefix.is_empty() {
        return m.is_empty();
    }
    m == prefix || m.starts_with(&format!("{prefix}::"))
}

/// The layer (index, name) of file `f`, by the longest matching prefix.
fn layer_of(g: &Graph, f: FileId) -> Option<(usize, &'static str)> {
    let n = &g.files[f];
    let layers = LAYERS.iter().find(|(c, _)| *c == n.krate)?.1;
    let m = module_key(g, f);
    let mut best: Option<(usize, usize, &'static str)> = None;
    for (i, (name, prefixes)) in layers.iter().enumerate() {
        for p in *prefixes {
            let fits = if *p == "main" {
                m == "main"
            } else {
                m != "main" && under(&m, p)
            };
            if fits && best.is_none_or(|(len, _, _)| p.len() >= len) {
                best = Some((p.len(), i, name));
            }
        }
    }
    best.map(|(_, i, name)| (i, name))
}

/// `to` is a module that `from` lies inside (a child using its ancestor), in the same tree.
fn inside(g: &Graph, from: FileId, to: FileId) -> bool {
    let (a, b) = (&g.files[from], &g.files[to]);
    a.krate == b.krate && a.bin == b.bin && a.module != b.module && under(&a.module, &b.module)
        || (a.krate == b.krate && a.bin == b.bin && b.module.is_empty() && !a.module.is_empty())
}

fn edges(g: &Graph) -> impl Iterator<Item = (FileId, FileId, &[layer_guard::Site])> {
    g.edges
        .iter()
        .flat_map(|(from, tos)| tos.iter().map(move |(to, s)| (*from, *to, s.as_slice())))
}

fn describe(g: &Graph, from: FileId, to: FileId, sites: &[layer_guard::Site]) -> String {
    let shown: Vec<String> = sites
        .iter()
        .take(3)
        .map(|s| format!("line {}: {}", s.line, s.path))
        .collect();
    format!(
        "{} -> {} ({})",
        g.files[from].path,
        g.files[to].path,
        shown.join("; ")
    )
}

#[test]
fn no_file_imports_in_a_circle() {
    let g = graph();
    let circles = layer_guard::circles_without(&g, &|from, to| inside(&g, from, to));
    let mut report = Vec::new();
    for c in &circles {
        let names: Vec<&str> = c.iter().map(|f| g.files[*f].path.as_str()).collect();
        report.push(format!("circle of {}: {}", c.len(), names.join(", ")));
        for (from, to, sites) in edges(&g) {
            if c.contains(&from) && c.contains(&to) && !inside(&g, from, to) {
                report.push(format!("  {}", describe(&g, from, to, sites)));
            }
        }
    }
    assert!(circles.is_empty(), "{}", report.join("\n"));
}

#[test]
fn every_product_file_has_a_layer_and_imports_only_downward() {
    let g = graph();
    let mut missing = Vec::new();
    for f in 0..g.files.len() {
        if LAYERS.iter().any(|(c, _)| *c == g.files[f].krate) && layer_of(&g, f).is_none() {
            missing.push(g.files[f].path.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "files with no layer (declare them in LAYERS): {missing:?}"
    );
    let mut upward = Vec::new();
    for (from, to, sites) in edges(&g) {
        if g.files[from].krate != g.files[to].krate {
            continue;
        }
        let (Some((lf, nf)), Some((lt, nt))) = (layer_of(&g, from), layer_of(&g, to)) else {
            continue;
        };
        if lt > lf {
            upward.push(format!("{nf} -> {nt}: {}", describe(&g, from, to, sites)));
        }
    }
    assert!(
        upward.is_empty(),
        "imports up the layers:\n{}",
        upward.join("\n")
    );
}

#[test]
fn crates_depend_only_as_listed_and_the_agent_meets_istiod_core_where_it_embeds_it() {
    let g = graph();
    let mut wrong = Vec::new();
    let mut embedding: BTreeMap<String, usize> = BTreeMap::new();
    for (from, to, sites) in edges(&g) {
        let (a, b) = (&g.files[from], &g.files[to]);
        if a.krate == b.krate {
            continue;
        }
        let Some((_, allowed)) = CRATE_DEPS.iter().find(|(c, _)| *c == a.krate) else {
            continue;
        };
        if !allowed.contains(&b.krate.as_str()) {
            wrong.push(format!(
                "{} may not use {}: {}",
                a.krate,
                b.krate,
                describe(&g, from, to, sites)
            ));
        }
        if a.krate == "agent" && b.krate == "istiod-core" {
            if AGENT_EMBEDDING.contains(&a.path.as_str()) {
                *embedding.entry(a.path.clone()).or_default() += 1;
            } else {
                wrong.push(format!(
                    "the agent uses istiod-core outside the embedding: {}",
                    describe(&g, from, to, sites)
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The embedding is where the guard says it is (a renamed file would make the list stale).
    for path in AGENT_EMBEDDING {
        assert!(
            embedding.contains_key(*path),
            "{path} no longer uses istiod-core: update AGENT_EMBEDDING"
        );
    }
}

#[test]
fn configuration_modules_are_leaves() {
    let g = graph();
    let mut wrong = Vec::new();
    for (from, to, sites) in edges(&g) {
        let (a, b) = (&g.files[from], &g.files[to]);
        for (krate, module) in LEAVES {
            if a.krate == *krate
                && !a.bin
                && under(&a.module, module)
                && b.krate == *krate
                && !under(&b.module, module)
            {
                wrong.push(describe(&g, from, to, sites));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a configuration module imports its crate:\n{}",
        wrong.join("\n")
    );
}

/// The reader itself: it must see what a circle and an upward import look like, or the tests
/// above pass on nothing.
#[test]
fn the_reader_sees_imports_through_use_paths_macros_and_reexports() {
    let g = graph();
    let find = |path: &str| {
        g.files
            .iter()
            .position(|f| f.path == path)
            .unwrap_or_else(|| panic!("{path} not read"))
    };
    let has = |from: &str, to: &str| {
        g.edges
            .get(&find(from))
            .is_some_and(|e| e.contains_key(&find(to)))
    };
    // A `use` item.
    assert!(has(
        "istiod-core/src/generators/lds.rs",
        "istiod-core/src/generators/listener.rs"
    ));
    // A path in code (`proxy.is_router()` is a method; `generators::listeners` a call).
    assert!(has(
        "istiod-core/src/xds_server/mod.rs",
        "istiod-core/src/generators/mod.rs"
    ));
    // Through the config_store index's re-export to the defining file.
    assert!(has(
        "istiod-core/src/registry.rs",
        "istiod-core/src/config_store/metadata.rs"
    ));
    // Across crates.
    assert!(has(
        "agent/src/embedded.rs",
        "istiod-core/src/xds_server/mod.rs"
    ));
    assert!(g.files.len() > 150, "only {} files read", g.files.len());
}
