#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Golden generation tests: each `tests/golden/NAME.yaml` (first line `# proxy: <node id>`) is
//! turned into CDS, LDS, RDS (the route names LDS refers to), EDS (every EDS cluster) and NDS for
//! that proxy, printed as the decoded protos, and compared with `NAME.golden`.
//! `UPDATE_GOLDENS=1 cargo test -p istiod-core --test goldens` rewrites them.

use std::fmt::Write;
use std::path::Path;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager, http_filter,
};
use istiod_core::config_store::{ConfigSet, parse_file};
use istiod_core::generators::{cds, eds, nds};
use istiod_core::model::Proxy;
use istiod_core::push_context::PushContext;
use istiod_core::resource::Named;
use prost::Message;

/// Decodes and pretty-prints. (prost prints map fields in hash order; every map the
/// generators emit has a single entry, so the output is stable.)
fn show<M: Message + Default + std::fmt::Debug>(named: &[Named]) -> String {
    let mut out = String::new();
    for n in named {
        let m = M::decode(n.resource.value.as_slice()).unwrap();
        let text = collapse_bytes(&format!("{m:#?}"));
        let lines: Vec<&str> = text.lines().collect();
        writeln!(out, "--- {}", n.name).unwrap();
        for l in sorted_maps(&lines) {
            writeln!(out, "{l}").unwrap();
        }
    }
    out
}

/// Pretty Debug output with each byte list (an encoded `Any` the generators nest, one number
/// a line) on one line in hex: every byte still compared, in a file a reader can scroll.
fn collapse_bytes(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        if line.ends_with('[') {
            let mut bytes = Vec::new();
            let mut j = i;
            while j < lines.len() {
                match lines[j].trim().trim_end_matches(',').parse::<u8>() {
                    Ok(b) => bytes.push(b),
                    Err(_) => break,
                }
                j += 1;
            }
            if !bytes.is_empty() && j < lines.len() && lines[j].trim().starts_with(']') {
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                writeln!(out, "{line}{hex}{}", lines[j].trim()).unwrap();
                i = j + 1;
                continue;
            }
        }
        writeln!(out, "{line}").unwrap();
    }
    out
}

/// Pretty Debug output with the entries of every map (protobuf maps are HashMaps, printed in
/// hash order) sorted, so a golden does not depend on the hasher's seed. A map is a `{` block
/// whose entries start with a quoted key.
fn sorted_maps(lines: &[&str]) -> Vec<String> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        out.push(line.to_string());
        i += 1;
        if !line.ends_with('{') || i >= lines.len() {
            continue;
        }
        let inner = indent(line) + 4;
        if !(indent(lines[i]) == inner && lines[i].trim_start().starts_with('"')) {
            continue;
        }
        // Collect the map's entries up to its closing brace.
        let mut entries: Vec<Vec<&str>> = Vec::new();
        while i < lines.len() && indent(lines[i]) >= inner {
            if indent(lines[i]) == inner && lines[i].trim_start().starts_with('"') {
                entries.push(Vec::new());
            }
            if let Some(e) = entries.last_mut() {
                e.push(lines[i]);
            }
            i += 1;
        }
        let mut rendered: Vec<Vec<String>> = entries.iter().map(|e| sorted_maps(e)).collect();
        rendered.sort();
        out.extend(rendered.into_iter().flatten());
    }
    out
}

fn render(yaml_path: &Path) -> String {
    let text = std::fs::read_to_string(yaml_path).unwrap();
    let node = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# proxy: "))
        .expect("first line: # proxy: <node id>");
    let mut proxy = Proxy::from_node_id(node).unwrap();
    // As the embedded control plane trusts its agent.
    proxy.reads_secrets = true;
    let set = ConfigSet {
        resources: parse_file(yaml_path, &text).unwrap(),
    };
    let mut push = PushContext::build(Arc::new(set), "cluster.local", "golden".into()).unwrap();
    push.cache = istiod_core::push_context::GenCache::checked();
    let clusters = cds::generate(&push, &proxy);
    let listeners = istiod_core::generators::listeners(&push, &proxy);
    // A second proxy's read of the shared resources, in the cache's checked mode: each is
    // generated again and must come out the same.
    assert_eq!(cds::generate(&push, &proxy), clusters);
    assert_eq!(istiod_core::generators::listeners(&push, &proxy), listeners);
    let eds_names: Vec<String> = clusters
        .iter()
        .filter(|n| {
            Cluster::decode(n.resource.value.as_slice())
                .unwrap()
                .eds_cluster_config
                .is_some()
        })
        .map(|n| n.name.clone())
        .collect();
    // The route configurations the listeners ask for over RDS, as Envoy would.
    let mut route_names: Vec<String> = listeners
        .iter()
        .flat_map(|n| {
            Listener::decode(n.resource.value.as_slice())
                .unwrap()
                .filter_chains
        })
        .flat_map(|c| c.filters)
        .filter_map(|f| match f.config_type {
            Some(
                envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any),
            ) if f.name == "envoy.filters.network.http_connection_manager" => {
                HttpConnectionManager::decode(any.value.as_slice()).ok()
            }
            _ => None,
        })
        .filter_map(|hcm| match hcm.route_specifier {
            Some(http_connection_manager::RouteSpecifier::Rds(rds)) => Some(rds.route_config_name),
            _ => None,
        })
        .collect();
    route_names.sort();
    route_names.dedup();
    let mut out = String::new();
    writeln!(out, "### CDS").unwrap();
    out.push_str(&show::<Cluster>(&clusters));
    writeln!(out, "### EDS").unwrap();
    let assignments = eds::generate(&push, &proxy, &eds_names);
    assert_eq!(eds::generate(&push, &proxy, &eds_names), assignments);
    out.push_str(&show::<ClusterLoadAssignment>(&assignments));
    writeln!(out, "### LDS").unwrap();
    out.push_str(&show::<Listener>(&listeners));
    writeln!(out, "### RDS").unwrap();
    let routes = istiod_core::generators::routes(&push, &proxy, &route_names);
    assert_eq!(
        istiod_core::generators::routes(&push, &proxy, &route_names),
        routes
    );
    out.push_str(&show::<RouteConfiguration>(&routes));
    let authz = istiod_core::generators::authz::inbound(
        &push,
        &proxy,
        &proxy.workload_labels(&push.services),
    );
    if authz != Default::default() {
        // The inbound RBAC filters decoded (in LDS they are bytes inside each chain).
        use envoy_types::pb::envoy::extensions::filters::{http, network};
        writeln!(
            out,
            "### AUTHZ (inbound JWT and RBAC filters, HTTP then TCP)"
        )
        .unwrap();
        let pretty = |text: String| {
            let text = collapse_bytes(&text);
            let lines: Vec<&str> = text.lines().collect();
            sorted_maps(&lines).join("\n")
        };
        for f in &authz.http {
            let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                panic!("{f:?}")
            };
            let bytes = any.value.as_slice();
            let text = match f.name.as_str() {
                "envoy.filters.http.jwt_authn" => format!(
                    "{:#?}",
                    http::jwt_authn::v3::JwtAuthentication::decode(bytes).unwrap()
                ),
                "envoy.filters.http.ext_authz" => {
                    format!(
                        "{:#?}",
                        http::ext_authz::v3::ExtAuthz::decode(bytes).unwrap()
                    )
                }
                _ => format!("{:#?}", http::rbac::v3::Rbac::decode(bytes).unwrap()),
            };
            writeln!(out, "{}", pretty(text)).unwrap();
        }
        for f in &authz.tcp {
            let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                panic!("{f:?}")
            };
            let bytes = any.value.as_slice();
            let text = match f.name.as_str() {
                "envoy.filters.network.ext_authz" => format!(
                    "{:#?}",
                    network::ext_authz::v3::ExtAuthz::decode(bytes).unwrap()
                ),
                _ => format!("{:#?}", network::rbac::v3::Rbac::decode(bytes).unwrap()),
            };
            writeln!(out, "{}", pretty(text)).unwrap();
        }
    }
    writeln!(out, "### WARNINGS").unwrap();
    for w in &push.warnings {
        writeln!(out, "{w}").unwrap();
    }
    if proxy.is_router() {
        // The credentials the listeners ask for over SDS (ADS), as Envoy would.
        let dump = format!("{:?}", listeners_text(&listeners));
        let mut names: Vec<String> = dump
            .match_indices("kubernetes://")
            .map(|(i, _)| {
                dump[i..]
                    .split(['"', '\\'])
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        names.sort();
        names.dedup();
        writeln!(out, "### SDS").unwrap();
        let secrets = istiod_core::generators::gateway::secrets(&push, &proxy, &names);
        out.push_str(&show::<
            envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret,
        >(&secrets));
    }
    writeln!(out, "### NDS").unwrap();
    for n in nds::generate(&push, &proxy) {
        let table = istio_proto::nds::NameTable::decode(n.resource.value.as_slice()).unwrap();
        let mut names: Vec<_> = table.table.iter().collect();
        names.sort_by(|a, b| a.0.cmp(b.0));
        for (name, info) in names {
            writeln!(out, "{name} -> {:?}", info.ips).unwrap();
        }
    }
    out
}

/// The listeners decoded, transport sockets included, as one text.
fn listeners_text(listeners: &[Named]) -> String {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
    let mut out = String::new();
    for n in listeners {
        let l = Listener::decode(n.resource.value.as_slice()).unwrap();
        for c in l.filter_chains {
            if let Some(ts) = c.transport_socket
                && let Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(any)) = ts.config_type
            {
                let tls = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
                writeln!(out, "{tls:?}").unwrap();
            }
        }
    }
    out
}

#[test]
fn generated_config_matches_goldens() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 5,
        "golden cases missing in {}",
        dir.display()
    );
    let update = std::env::var("UPDATE_GOLDENS").is_ok_and(|v| v == "1");
    let mut mismatched = Vec::new();
    for case in cases {
        let got = render(&case);
        let golden = case.with_extension("golden");
        if update {
            std::fs::write(&golden, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&golden).unwrap_or_default();
        if got != want {
            mismatched.push(golden.display().to_string());
        }
    }
    assert!(
        mismatched.is_empty(),
        "generated config differs from {mismatched:?}; review and rerun with UPDATE_GOLDENS=1"
    );
}
