//! The routing half of a snapshot: which DestinationRule applies to each service, and the
//! VirtualServices sidecars apply (gateways `mesh`), with short names resolved, delegates merged
//! into their roots and the order Istio uses (`pilot/pkg/model/virtualservice.go`,
//! `push_context.go` initVirtualServices / setDestinationRules).
//!
//! Not per proxy: a DestinationRule is picked per host (the service's namespace first, then
//! the root namespace, then any other, exact host before the longest wildcard), which is what
//! Istio picks whenever no rule for the host lives in the client's own namespace.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::config_store::destination_rule::{
    DestinationRuleSpec, Subset as RuleSubset, TrafficPolicy,
};
use crate::config_store::virtual_service::{
    Destination, HttpMatch, HttpRoute, MESH_GATEWAY, TcpRoute, TlsRoute, VirtualServiceSpec,
};
use crate::config_store::{ConfigSet, Metadata, Resource};
use crate::model::{Service, Subset};

/// The `istio.config` metadata Istio puts on what a resource produced, so a route or cluster
/// can be traced back to its YAML (Istio 1.24+ writes the `v1` API version).
pub fn config_path(kind: &str, meta: &Metadata) -> String {
    format!(
        "/apis/networking.istio.io/v1/namespaces/{}/{kind}/{}",
        meta.namespace(),
        meta.name
    )
}

/// A host as written in a resource of namespace `ns`: a short name (no dot, not `*`, not an IP)
/// is `name.ns.svc.<suffix>`, as Istio resolves it. Lowercased, as Istio matches hosts.
pub fn resolve_host(host: &str, ns: &str, domain_suffix: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    if host.contains('.') || host == "*" || host.parse::<std::net::IpAddr>().is_ok() {
        host
    } else {
        format!("{host}.{ns}.svc.{domain_suffix}")
    }
}

/// Whether `pattern` (a host or `*.suffix` / `*`) matches `host`.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    pattern == "*"
        || pattern == host
        || pattern
            .strip_prefix('*')
            .is_some_and(|suffix| host.ends_with(suffix))
}

/// The DestinationRule that applies to one service: rules for the same host merged as Istio
/// merges them (subsets concatenated, a repeated name ignored; the first traffic policy wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedRule {
    /// `istio.config` of the first rule merged.
    pub config: String,
    pub policy: Option<TrafficPolicy>,
    pub subsets: Vec<RuleSubset>,
}

impl AppliedRule {
    pub fn subset(&self, name: &str) -> Option<&RuleSubset> {
        self.subsets.iter().find(|s| s.name == name)
    }
}

/// The applied rule of each service, by hostname; and each subset a merge dropped because an
/// earlier rule for the host in that namespace has one of that name (istiod's
/// `pilot_destrule_subsets`).
pub fn destination_rules(
    config: &ConfigSet,
    domain_suffix: &str,
    root_namespace: &str,
    services: &[Service],
    status: &mut Vec<super::PushStatus>,
) -> HashMap<String, Arc<AppliedRule>> {
    let mut rules: Vec<_> = config
        .resources
        .iter()
        .filter_map(|r| match r {
            // A rule with a workloadSelector applies to some clients only: refused by a
            // warning at load (see `not_applied`), not used here.
            Resource::DestinationRule(m, s) if s.workload_selector.is_none() => Some((m, s)),
            _ => None,
        })
        .collect();
    rules.sort_by(|a, b| (a.0.namespace(), &a.0.name).cmp(&(b.0.namespace(), &b.0.name)));
    // (host, rule namespace) → merged rule.
    let mut by_host: BTreeMap<(String, String), AppliedRule> = BTreeMap::new();
    for (meta, spec) in rules {
        let host = resolve_host(&spec.host, meta.namespace(), domain_suffix);
        let merged = by_host
            .entry((host.clone(), meta.namespace().to_string()))
            .or_insert_with(|| AppliedRule {
                config: config_path("destination-rule", meta),
                policy: None,
                subsets: Vec::new(),
            });
        if merged.policy.is_none() {
            merged.policy = spec.traffic_policy.clone();
        }
        for s in &spec.subsets {
            if merged.subset(&s.name).is_none() {
                merged.subsets.push(s.clone());
            } else {
                status.push(super::PushStatus {
                    metric: "pilot_destrule_subsets",
                    key: host.clone(),
                    message: format!(
                        "Duplicate subset {} found while merging destination rules for {host}",
                        s.name
                    ),
                });
            }
        }
    }
    let mut out = HashMap::new();
    for svc in services {
        // Exact host before the longest wildcard; then the service's namespace, the root
        // namespace, any other (by name).
        let rank = |(host, ns): &(String, String)| {
            let specificity = if *host == svc.hostname {
                usize::MAX
            } else {
                host.len()
            };
            let place = if *ns == svc.namespace {
                0
            } else if ns == root_namespace {
                1
            } else {
                2
            };
            (std::cmp::Reverse(specificity), place)
        };
        let best = by_host
            .iter()
            .filter(|((host, _), _)| host_matches(host, &svc.hostname))
            .min_by_key(|(k, _)| rank(k));
        if let Some((_, rule)) = best {
            out.insert(svc.hostname.clone(), Arc::new(rule.clone()));
        }
    }
    out
}

/// Each service's subsets, as EDS and the cluster index take them.
pub fn subsets(rules: &HashMap<String, Arc<AppliedRule>>) -> HashMap<String, Vec<Subset>> {
    rules
        .iter()
        .filter(|(_, r)| !r.subsets.is_empty())
        .map(|(host, r)| {
            let subsets = r
                .subsets
                .iter()
                .map(|s| Subset {
                    name: s.name.clone(),
                    labels: s.labels.clone(),
                })
                .collect();
            (host.clone(), subsets)
        })
        .collect()
}

/// One VirtualService as sidecars apply it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshRoute {
    pub name: String,
    pub namespace: String,
    /// `istio.config` of the (root) VirtualService.
    pub config: String,
    /// Resolved hosts (FQDN, lowercased; wildcards kept).
    pub hosts: Vec<String>,
    /// `exportTo`: empty or `*` is every namespace, `.` its own.
    pub export_to: Vec<String>,
    pub http: Vec<HttpRoute>,
    pub tcp: Vec<TcpRoute>,
    pub tls: Vec<TlsRoute>,
    /// `spec.gateways` resolved: `mesh` or `namespace/name` (empty: `mesh`). Match blocks'
    /// `gateways` are resolved the same way.
    pub gateways: Vec<String>,
}

impl MeshRoute {
    pub fn visible_in(&self, namespace: &str) -> bool {
        exported_to(&self.export_to, &self.namespace, namespace)
    }
}

/// Istio's `exportTo` for a resource of namespace `own`: empty or `*` is every namespace, `.`
/// its own, a name that namespace.
fn exported_to(export_to: &[String], own: &str, namespace: &str) -> bool {
    export_to.is_empty()
        || export_to
            .iter()
            .any(|e| e == "*" || e == namespace || (e == "." && own == namespace))
}

/// The VirtualServices sidecars apply, in Istio's order (here by namespace and name, as the
/// config carries no creation times), delegates merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    pub virtual_services: Vec<Arc<MeshRoute>>,
    /// Exact host → the VirtualServices naming it (indices, in order).
    exact: HashMap<String, Vec<usize>>,
    /// (`*.suffix` host, VirtualService index), in order.
    wildcards: Vec<(String, usize)>,
    /// Whether a route depends on the proxy asking (sourceLabels, sourceNamespace, exportTo):
    /// then route configurations are generated per proxy, not shared.
    pub per_proxy: bool,
    /// The VirtualServices bound to a Gateway (`namespace/name` in `gateways`), in order.
    pub gateway_routes: Vec<Arc<MeshRoute>>,
}

/// A gateway name as a VirtualService in namespace `ns` writes it, resolved as Istio's
/// ResolveGatewayName does: `mesh`; `ns/name` (`./name` is the VirtualService's namespace);
/// the legacy `name.ns.svc...` form; a bare name is in the VirtualService's namespace.
pub fn resolve_gateway(g: &str, ns: &str) -> String {
    let g = gateway_name(g);
    if g == MESH_GATEWAY {
        return g.to_string();
    }
    if let Some((gns, name)) = g.split_once('/') {
        let gns = if gns == "." { ns } else { gns };
        return format!("{gns}/{name}");
    }
    if let Some((name, rest)) = g.split_once('.') {
        let gns = rest.split('.').next().unwrap_or(ns);
        return format!("{gns}/{name}");
    }
    format!("{ns}/{g}")
}

/// A gateway name as written; `mesh#comment` (a YAML comment without its space, as in some
/// published examples) is read as `mesh` with a warning by `gateway_name_warnings`.
pub(crate) fn gateway_name(g: &str) -> &str {
    g.split('#').next().unwrap_or(g).trim()
}

fn binds_mesh(gateways: &[String]) -> bool {
    gateways.is_empty() || gateways.iter().any(|g| gateway_name(g) == MESH_GATEWAY)
}

fn resolve_destination(d: &mut Destination, ns: &str, suffix: &str) {
    d.host = resolve_host(&d.host, ns, suffix);
}

fn resolve_http(r: &mut HttpRoute, ns: &str, suffix: &str) {
    for d in &mut r.route {
        resolve_destination(&mut d.destination, ns, suffix);
    }
    if let Some(m) = &mut r.mirror {
        resolve_destination(m, ns, suffix);
    }
    for m in &mut r.mirrors {
        resolve_destination(&mut m.destination, ns, suffix);
    }
}

/// VirtualServices without hosts (delegates), by (namespace, name).
type Delegates<'a> = HashMap<(&'a str, &'a str), (&'a Metadata, &'a VirtualServiceSpec)>;

impl Routing {
    pub fn build(config: &ConfigSet, domain_suffix: &str) -> Routing {
        let mut all: Vec<(&Metadata, &VirtualServiceSpec)> = config
            .resources
            .iter()
            .filter_map(|r| match r {
                Resource::VirtualService(m, s) => Some((m, s)),
                _ => None,
            })
            .collect();
        all.sort_by(|a, b| (a.0.namespace(), &a.0.name).cmp(&(b.0.namespace(), &b.0.name)));
        let delegates: Delegates = all
            .iter()
            .filter(|(_, s)| s.hosts.is_empty())
            .map(|(m, s)| ((m.namespace(), m.name.as_str()), (*m, *s)))
            .collect();
        let mut virtual_services = Vec::new();
        let mut per_proxy = false;
        let mut gateway_routes = Vec::new();
        for (meta, spec) in all.iter().filter(|(_, s)| !s.hosts.is_empty()) {
            let route = Arc::new(mesh_route(meta, spec, &delegates, domain_suffix));
            let to_mesh = route.gateways.iter().any(|g| g == MESH_GATEWAY);
            let to_gateway = route.gateways.iter().any(|g| g != MESH_GATEWAY);
            if to_mesh {
                per_proxy |= matches_on_source(&route) || !route.export_to.iter().all(|e| e == "*");
            }
            if to_gateway {
                gateway_routes.push(route.clone());
            }
            if to_mesh {
                virtual_services.push(route);
            }
        }
        let (exact, wildcards) = host_index(&virtual_services);
        Routing {
            virtual_services,
            exact,
            wildcards,
            per_proxy,
            gateway_routes,
        }
    }

    /// The VirtualService that routes `host` for a proxy in `namespace`: the earliest visible
    /// one naming it exactly, else the one with the most specific wildcard (earliest on a tie).
    pub fn for_host(&self, host: &str, namespace: &str) -> Option<&Arc<MeshRoute>> {
        let visible = |i: usize| self.virtual_services[i].visible_in(namespace);
        if let Some(i) = self
            .exact
            .get(host)
            .and_then(|ids| ids.iter().copied().find(|i| visible(*i)))
        {
            return Some(&self.virtual_services[i]);
        }
        // The longest matching wildcard; on a tie the earliest VirtualService.
        let mut best: Option<(usize, usize)> = None;
        for (pattern, i) in &self.wildcards {
            if host_matches(pattern, host)
                && visible(*i)
                && best
                    .is_none_or(|(len, j)| pattern.len() > len || (pattern.len() == len && *i < j))
            {
                best = Some((pattern.len(), *i));
            }
        }
        best.map(|(_, i)| &self.virtual_services[i])
    }
}

/// One VirtualService with hosts as sidecars and gateways apply it: delegates merged, hosts,
/// destinations and gateway names resolved.
fn mesh_route(
    meta: &Metadata,
    spec: &VirtualServiceSpec,
    delegates: &Delegates,
    domain_suffix: &str,
) -> MeshRoute {
    let ns = meta.namespace();
    let mut http = http_routes(ns, spec, delegates, domain_suffix);
    let (mut tcp, mut tls) = (spec.tcp.clone(), spec.tls.clone());
    let l4_routes = tcp
        .iter_mut()
        .flat_map(|r| &mut r.route)
        .chain(tls.iter_mut().flat_map(|r| &mut r.route));
    for d in l4_routes {
        resolve_destination(&mut d.destination, ns, domain_suffix);
    }
    let gateways: Vec<String> = if spec.gateways.is_empty() {
        vec![MESH_GATEWAY.to_string()]
    } else {
        spec.gateways
            .iter()
            .map(|g| resolve_gateway(g, ns))
            .collect()
    };
    let resolve_all = |gs: &mut Vec<String>| {
        for g in gs.iter_mut() {
            *g = resolve_gateway(g, ns);
        }
    };
    http.iter_mut()
        .flat_map(|r| &mut r.matches)
        .for_each(|m| resolve_all(&mut m.gateways));
    tcp.iter_mut()
        .flat_map(|r| &mut r.matches)
        .for_each(|m| resolve_all(&mut m.gateways));
    tls.iter_mut()
        .flat_map(|r| &mut r.matches)
        .for_each(|m| resolve_all(&mut m.gateways));
    MeshRoute {
        name: meta.name.clone(),
        namespace: ns.to_string(),
        config: config_path("virtual-service", meta),
        hosts: spec
            .hosts
            .iter()
            .map(|h| resolve_host(h, ns, domain_suffix))
            .collect(),
        export_to: spec.export_to.clone(),
        http,
        tcp,
        tls,
        gateways,
    }
}

/// The HTTP routes of a VirtualService in `ns`, each delegate entry replaced by the delegate's
/// routes merged into it (when the delegate exists and is exported to `ns`).
fn http_routes(
    ns: &str,
    spec: &VirtualServiceSpec,
    delegates: &Delegates,
    domain_suffix: &str,
) -> Vec<HttpRoute> {
    let mut http = Vec::new();
    for route in &spec.http {
        let Some(delegate) = &route.delegate else {
            let mut r = route.clone();
            resolve_http(&mut r, ns, domain_suffix);
            http.push(r);
            continue;
        };
        let dns = delegate.namespace.as_deref().unwrap_or(ns);
        let Some((dmeta, dspec)) = delegates.get(&(dns, delegate.name.as_str())) else {
            // Istio drops the entry; the load warned about it (`not_applied`).
            continue;
        };
        if !exported_to(&dspec.export_to, dmeta.namespace(), ns) {
            continue;
        }
        for leaf in &dspec.http {
            if let Some(mut merged) = merge_delegate(route, leaf) {
                resolve_http(&mut merged, dmeta.namespace(), domain_suffix);
                http.push(merged);
            }
        }
    }
    http
}

/// Whether a match of `route` is on the client (labels or namespace): then its routes differ
/// per proxy.
fn matches_on_source(route: &MeshRoute) -> bool {
    let on_source =
        |labels: &BTreeMap<String, String>, ns: &Option<String>| !labels.is_empty() || ns.is_some();
    route
        .http
        .iter()
        .flat_map(|r| &r.matches)
        .any(|m| on_source(&m.source_labels, &m.source_namespace))
        || route
            .tcp
            .iter()
            .flat_map(|r| &r.matches)
            .any(|m| on_source(&m.source_labels, &m.source_namespace))
        || route
            .tls
            .iter()
            .flat_map(|r| &r.matches)
            .any(|m| on_source(&m.source_labels, &m.source_namespace))
}

/// The hosts of `virtual_services`: exact ones → the VirtualServices naming them (in order),
/// and the wildcards with their VirtualService, in order.
type HostIndex = (HashMap<String, Vec<usize>>, Vec<(String, usize)>);

fn host_index(virtual_services: &[Arc<MeshRoute>]) -> HostIndex {
    let mut exact: HashMap<String, Vec<usize>> = HashMap::new();
    let mut wildcards = Vec::new();
    for (i, vs) in virtual_services.iter().enumerate() {
        for h in &vs.hosts {
            if h.starts_with('*') {
                wildcards.push((h.clone(), i));
            } else {
                exact.entry(h.clone()).or_default().push(i);
            }
        }
    }
    (exact, wildcards)
}

/// A delegate's route merged into its root's (Istio's mergeHTTPRoute): matches are crossed
/// (each delegate match must fit inside a root match), and what the delegate leaves unset is
/// inherited from the root. `None` when no delegate match fits.
fn merge_delegate(root: &HttpRoute, leaf: &HttpRoute) -> Option<HttpRoute> {
    let mut out = leaf.clone();
    out.delegate = None;
    out.matches = match (root.matches.is_empty(), leaf.matches.is_empty()) {
        (true, _) => leaf.matches.clone(),
        (false, true) => root.matches.clone(),
        (false, false) => {
            let mut merged = Vec::new();
            for l in &leaf.matches {
                for r in &root.matches {
                    if let Some(m) = merge_match(r, l) {
                        merged.push(m);
                    }
                }
            }
            if merged.is_empty() {
                return None;
            }
            merged
        }
    };
    out.name = match (&root.name, &leaf.name) {
        (Some(r), Some(l)) => Some(format!("{r}-{l}")),
        (r, l) => l.clone().or_else(|| r.clone()),
    };
    macro_rules! inherit {
        ($($f:ident),*) => { $( if out.$f.is_none() { out.$f = root.$f.clone(); } )* };
    }
    inherit!(
        rewrite,
        direct_response,
        timeout,
        retries,
        fault,
        mirror,
        mirror_percentage,
        mirror_percent,
        cors_policy,
        headers
    );
    if out.mirrors.is_empty() {
        out.mirrors = root.mirrors.clone();
    }
    Some(out)
}

/// `leaf` narrowed by `root`, or `None` when they conflict (a regex on either side, different
/// exact values, a root prefix the leaf does not extend, different ports or case handling).
fn merge_match(root: &HttpMatch, leaf: &HttpMatch) -> Option<HttpMatch> {
    use crate::config_store::values::StringMatch;
    fn fits(root: &Option<StringMatch>, leaf: &Option<StringMatch>) -> Option<Option<StringMatch>> {
        match (root, leaf) {
            (None, l) => Some(l.clone()),
            (r, None) => Some(r.clone()),
            (Some(r), Some(l)) => {
                if r.regex.is_some() || l.regex.is_some() {
                    return None;
                }
                let ok = match (&r.exact, &r.prefix, &l.exact, &l.prefix) {
                    (Some(re), _, Some(le), _) => re == le,
                    (Some(_), _, None, Some(_)) => false,
                    (None, Some(rp), Some(le), _) => le.starts_with(rp.as_str()),
                    (None, Some(rp), None, Some(lp)) => lp.starts_with(rp.as_str()),
                    _ => true,
                };
                ok.then(|| Some(l.clone()))
            }
        }
    }
    if root.ignore_uri_case != leaf.ignore_uri_case {
        return None;
    }
    if let (Some(a), Some(b)) = (root.port, leaf.port)
        && a != b
    {
        return None;
    }
    if let (Some(a), Some(b)) = (&root.source_namespace, &leaf.source_namespace)
        && a != b
    {
        return None;
    }
    for (k, v) in &leaf.source_labels {
        if root.source_labels.get(k).is_some_and(|rv| rv != v) {
            return None;
        }
    }
    let mut m = leaf.clone();
    m.uri = fits(&root.uri, &leaf.uri)?;
    m.scheme = fits(&root.scheme, &leaf.scheme)?;
    m.method = fits(&root.method, &leaf.method)?;
    m.authority = fits(&root.authority, &leaf.authority)?;
    for (mine, theirs) in [
        (&mut m.headers, &root.headers),
        (&mut m.query_params, &root.query_params),
        (&mut m.without_headers, &root.without_headers),
    ] {
        for (k, v) in theirs {
            if v.regex.is_some() {
                return None;
            }
            mine.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    for (k, v) in &root.source_labels {
        m.source_labels
            .entry(k.clone())
            .or_insert_with(|| v.clone());
    }
    if m.port.is_none() {
        m.port = root.port;
    }
    if m.source_namespace.is_none() {
        m.source_namespace = root.source_namespace.clone();
    }
    if m.gateways.is_empty() {
        m.gateways = root.gateways.clone();
    }
    Some(m)
}

/// Warnings for what a load accepts but does not act on, each naming the resource and field.
/// They are attached to the resources' metadata (logged, and shown by /debug/configz).
pub fn not_applied(
    resource: &Resource,
    config: &ConfigSet,
    services: &[Service],
    domain_suffix: &str,
) -> Vec<String> {
    match resource {
        Resource::VirtualService(meta, spec) => {
            virtual_service_not_applied(meta, spec, config, services, domain_suffix)
        }
        Resource::DestinationRule(_, spec) => destination_rule_not_applied(spec),
        _ => Vec::new(),
    }
}

/// A VirtualService's gateway names with a comment glued on, hosts no sidecar can route,
/// Gateways and delegates that do not exist.
fn virtual_service_not_applied(
    meta: &Metadata,
    spec: &VirtualServiceSpec,
    config: &ConfigSet,
    services: &[Service],
    domain_suffix: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    for (i, g) in spec.gateways.iter().enumerate() {
        if g.contains('#') {
            out.push(format!(
                "spec.gateways[{i}]: {g:?} read as {:?}: a YAML comment needs a space before '#'",
                gateway_name(g)
            ));
        }
    }
    let ns = meta.namespace();
    if !spec.hosts.is_empty() && binds_mesh(&spec.gateways) {
        for (i, h) in spec.hosts.iter().enumerate() {
            let host = resolve_host(h, ns, domain_suffix);
            if !services.iter().any(|s| host_matches(&host, &s.hostname)) {
                out.push(format!(
                    "spec.hosts[{i}]: {host:?} is no service of the mesh: sidecars route it only on port 80 (where some service serves HTTP on 80)"
                ));
            }
        }
    }
    // A subset no DestinationRule of the host defines (istioctl analyze's IST0101): requests
    // routed to it fail with 503 (no such cluster).
    let mut destinations: Vec<(String, &crate::config_store::virtual_service::Destination)> =
        Vec::new();
    for (i, r) in spec.http.iter().enumerate() {
        for (j, d) in r.route.iter().enumerate() {
            destinations.push((format!("spec.http[{i}].route[{j}]"), &d.destination));
        }
    }
    for (kind, routes) in [
        ("tcp", spec.tcp.iter().map(|r| &r.route).collect::<Vec<_>>()),
        ("tls", spec.tls.iter().map(|r| &r.route).collect()),
    ] {
        for (i, r) in routes.into_iter().enumerate() {
            for (j, d) in r.iter().enumerate() {
                destinations.push((format!("spec.{kind}[{i}].route[{j}]"), &d.destination));
            }
        }
    }
    for (at, d) in destinations {
        let Some(subset) = d.subset.as_deref().filter(|s| !s.is_empty()) else {
            continue;
        };
        let host = resolve_host(&d.host, ns, domain_suffix);
        let defined = config.resources.iter().any(|r| {
            matches!(r, Resource::DestinationRule(m, dr)
                if resolve_host(&dr.host, m.namespace(), domain_suffix) == host
                    && dr.subsets.iter().any(|s| s.name == subset))
        });
        if !defined {
            out.push(format!(
                "{at}.destination: subset {subset:?} of {host:?} is in no DestinationRule: requests routed to it fail (503)"
            ));
        }
    }
    for (i, g) in spec.gateways.iter().enumerate() {
        let name = resolve_gateway(g, ns);
        if name == MESH_GATEWAY {
            continue;
        }
        let (gns, gname) = name.split_once('/').unwrap_or_default();
        let found = config.resources.iter().any(
            |r| matches!(r, Resource::Gateway(m, _) if m.namespace() == gns && m.name == gname),
        );
        if !found {
            out.push(format!(
                "spec.gateways[{i}]: no Gateway {name}: no gateway applies this VirtualService for it"
            ));
        }
    }
    for (i, r) in spec.http.iter().enumerate() {
        if let Some(d) = &r.delegate {
            let dns = d.namespace.as_deref().unwrap_or(ns);
            let found = config.resources.iter().any(|r| {
                matches!(r, Resource::VirtualService(m, s)
                    if s.hosts.is_empty() && m.namespace() == dns && m.name == d.name)
            });
            if !found {
                out.push(format!(
                    "spec.http[{i}].delegate: no delegate VirtualService {dns}/{} (one without hosts); this route is dropped",
                    d.name
                ));
            }
        }
        for (j, m) in r.matches.iter().enumerate() {
            for (k, g) in m.gateways.iter().enumerate() {
                if g.contains('#') {
                    out.push(format!(
                        "spec.http[{i}].match[{j}].gateways[{k}]: {g:?} read as {:?}",
                        gateway_name(g)
                    ));
                }
            }
        }
    }
    out
}

/// A DestinationRule's fields accepted but not applied yet.
fn destination_rule_not_applied(spec: &DestinationRuleSpec) -> Vec<String> {
    let mut out = Vec::new();
    if spec.workload_selector.is_some() {
        out.push(
            "spec.workloadSelector: rules for some clients only are not applied yet; this rule is ignored"
                .to_string(),
        );
    }
    if !spec.export_to.is_empty() {
        out.push(
            "spec.exportTo: not applied yet (the rule is visible to every namespace)".to_string(),
        );
    }
    let mut policies = Vec::new();
    if let Some(p) = &spec.traffic_policy {
        policies.push(("spec.trafficPolicy".to_string(), p));
    }
    for (i, s) in spec.subsets.iter().enumerate() {
        if let Some(p) = &s.traffic_policy {
            policies.push((format!("spec.subsets[{i}].trafficPolicy"), p));
        }
    }
    for (at, p) in policies {
        traffic_policy_not_applied(&at, p, &mut out);
    }
    out
}

/// The fields of the traffic policy at `at` (and its port-level settings) not applied yet.
fn traffic_policy_not_applied(at: &str, p: &TrafficPolicy, out: &mut Vec<String>) {
    let blocks = std::iter::once((at.to_string(), &p.load_balancer, &p.outlier_detection)).chain(
        p.port_level_settings.iter().enumerate().map(|(j, pl)| {
            (
                format!("{at}.portLevelSettings[{j}]"),
                &pl.load_balancer,
                &pl.outlier_detection,
            )
        }),
    );
    // Istio's warning: failover happens only when outlier detection finds endpoints failing.
    for (lat, lb, od) in blocks {
        if let Some(l) = lb.as_ref().and_then(|lb| lb.locality_lb_setting.as_ref())
            && l.fails_over()
            && od.is_none()
        {
            out.push(format!(
                "{lat}.loadBalancer.localityLbSetting: failover needs outlierDetection in the same policy: not applied"
            ));
        }
    }
    let pools = p.connection_pool.iter().map(|c| (at.to_string(), c)).chain(
        p.port_level_settings
            .iter()
            .enumerate()
            .filter_map(|(j, pl)| {
                pl.connection_pool
                    .as_ref()
                    .map(|c| (format!("{at}.portLevelSettings[{j}]"), c))
            }),
    );
    for (cat, c) in pools {
        if c.http
            .as_ref()
            .and_then(|h| h.use_client_protocol)
            .is_some()
        {
            out.push(format!(
                "{cat}.connectionPool.http.useClientProtocol: not applied yet"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_resolve_and_match_as_istio() {
        assert_eq!(
            resolve_host("Reviews", "book", "cluster.local"),
            "reviews.book.svc.cluster.local"
        );
        assert_eq!(resolve_host("a.b", "book", "cluster.local"), "a.b");
        assert_eq!(
            resolve_host("10.0.0.1", "book", "cluster.local"),
            "10.0.0.1"
        );
        assert!(host_matches(
            "*.book.svc.cluster.local",
            "r.book.svc.cluster.local"
        ));
        assert!(!host_matches(
            "*.book.svc.cluster.local",
            "r.other.svc.cluster.local"
        ));
        assert_eq!(gateway_name("mesh#모든 사이드카 의미"), "mesh");
        assert!(binds_mesh(&[
            "mesh#x".to_string(),
            "book-gateway".to_string()
        ]));
        assert!(!binds_mesh(&["book-gateway".to_string()]));
    }
}
