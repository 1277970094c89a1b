//! The PushContext: an immutable snapshot of everything the generators read, rebuilt from config
//! on every change and shared with all streams through a `watch` channel (istiod's
//! `pilot/pkg/model/push_context.go`). Generators never see a half-updated mesh.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config_store::{
    ConfigSet, MeshConfigSpec, Metadata, OutboundTrafficPolicy, PeerAuthenticationSpec, Resource,
    SidecarSpec,
};
use crate::model::{Service, Subset};
use crate::registry::{self, RegistryError};

mod authn;
pub mod auto_ip;
mod change;
pub mod envoy_filters;
pub mod policy;
pub mod routing;
mod sidecar_scope;
pub mod telemetry;
pub use authn::InboundMtls;
pub use change::Change;
pub use routing::{AppliedRule, MeshRoute, Routing};
pub use sidecar_scope::{ScopeEgress, ScopeIngress, ScopeMemo, SidecarScope};

/// Istio's root namespace: a PeerAuthentication here without a selector is mesh-wide.
pub const ROOT_NAMESPACE: &str = "istio-system";
/// The trust domain of workload identities unless the mesh config says otherwise.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// One finding of istiod's push status: its metric (`pilot_destrule_subsets`, ...), the key it
/// is about (a host, a cluster) and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushStatus {
    pub metric: &'static str,
    pub key: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushContext {
    /// Changes on every rebuild; sent as the xDS `version_info`.
    pub version: String,
    /// Counts snapshots; `change` is relative to generation − 1.
    pub generation: u64,
    pub change: Change,
    pub services: Vec<Service>,
    /// Each network's east-west gateways (`registry::network_gateways`): where a proxy on
    /// another network sends the network's endpoints.
    pub network_gateways: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    pub peer_authentications: Vec<(Metadata, PeerAuthenticationSpec)>,
    /// Every AuthorizationPolicy, by (namespace, name) (generators::authz picks a proxy's).
    pub authorization_policies: Vec<(Metadata, crate::config_store::AuthorizationPolicySpec)>,
    /// Every RequestAuthentication, by (namespace, name).
    pub request_authentications: Vec<(Metadata, crate::config_store::RequestAuthenticationSpec)>,
    /// Every Telemetry, by (namespace, name).
    pub telemetries: Vec<(Metadata, crate::config_store::telemetry::TelemetrySpec)>,
    pub sidecars: Vec<(Metadata, SidecarSpec)>,
    /// Every Gateway, by (namespace, name) (generators::gateway picks a router's).
    pub gateways: Vec<(Metadata, crate::config_store::GatewaySpec)>,
    /// Every Secret holding TLS material, by (namespace, name): `kubernetes://NAME` over SDS.
    pub secrets: Vec<(Metadata, crate::config_store::TlsSecret)>,
    /// Every ReferenceGrant, by (namespace, name): which Secrets a router of another namespace
    /// may read (`gateway_api::secret_granted`), looked up here rather than in every resource.
    pub reference_grants: Vec<(
        Metadata,
        crate::config_store::gateway_api::ReferenceGrantSpec,
    )>,
    /// PILOT_SCOPE_GATEWAY_TO_NAMESPACE: a Gateway selects routers of its own namespace only.
    pub scope_gateway_to_namespace: bool,
    /// The cluster the registry's endpoints are in (istiod's `CLUSTER_ID`).
    pub cluster_id: String,
    /// Where DNS auto-allocation continues in the next snapshot.
    pub auto_ip_cursor: auto_ip::Cursor,
    /// Identities are `spiffe://<trust_domain>/ns/<ns>/sa/<sa>`.
    pub trust_domain: String,
    /// The config this snapshot was built from (/debug/configz).
    pub config: std::sync::Arc<ConfigSet>,
    /// The mesh config: every MeshConfig source merged, later over earlier.
    pub mesh: MeshConfigSpec,
    /// Each service's DestinationRule subsets, by hostname.
    pub subsets: HashMap<String, Vec<Subset>>,
    /// The DestinationRule that applies to each service, by hostname.
    pub destination_rules: HashMap<String, Arc<AppliedRule>>,
    /// The VirtualServices sidecars apply.
    pub routing: Routing,
    /// What the config asks for that is not acted on, each naming the resource and field
    /// (logged on load, shown by /debug/configz).
    pub warnings: Vec<String>,
    /// What istiod's push status (`/debug/push_status`) would report of this config.
    pub status: Vec<PushStatus>,
    /// `outbound|PORT|SUBSET|HOST` → which service, port and subset, for EDS lookups.
    pub clusters: HashMap<String, ClusterRef>,
    /// Encoded resources that are the same for every proxy of this snapshot.
    pub cache: GenCache,
    /// Every EnvoyFilter, its patch values decoded (`crate::envoy_filter`).
    pub envoy_filters: Vec<envoy_filters::Compiled>,
}

/// What an outbound cluster name stands for (indices into the snapshot's services, their
/// ports and their subsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterRef {
    pub service: usize,
    pub port: usize,
    pub subset: Option<usize>,
}

/// Resources generated once per snapshot and shared by every proxy's push: outbound clusters
/// and listeners, and each EDS assignment and route configuration. The key of every entry is
/// (this snapshot, resource name): a new config is a new snapshot with an empty cache, so an
/// entry can never be stale, and entries are written once (`OnceLock`), never replaced.
#[derive(Default)]
pub struct GenCache {
    pub outbound_clusters: std::sync::OnceLock<Vec<crate::resource::Named>>,
    pub outbound_listeners: std::sync::OnceLock<Vec<crate::resource::Named>>,
    pub endpoints: std::sync::OnceLock<std::collections::HashMap<String, crate::resource::Named>>,
    pub routes: std::sync::OnceLock<std::collections::HashMap<String, crate::resource::Named>>,
    /// Each proxy's Sidecar scope (by proxy id and node labels), worked out once per snapshot
    /// rather than once per generator.
    pub scopes: std::sync::Mutex<ScopeMemo>,
    /// Assignments under locality load balancing, by cluster and what they depend on (the
    /// proxy's locality, labels): [`GenCache::localized`].
    localized: std::sync::Mutex<std::collections::HashMap<String, crate::resource::Named>>,
    /// The checked mode (`Settings::cache_check`, ISTIOD_CACHE_CHECK): every read of a cached
    /// resource generates it again and panics, naming the entry, if the value differs. An
    /// entry's key is (snapshot, name) and its value must depend on the snapshot alone; this
    /// catches a generator that reads anything else (the proxy, the clock) or encodes
    /// nondeterministically (map order).
    checked: bool,
}

impl GenCache {
    /// An empty cache in the checked mode.
    pub fn checked() -> GenCache {
        GenCache {
            checked: true,
            ..GenCache::default()
        }
    }

    /// `cell`'s value, made by `make` on first use (see `checked` for the checked mode).
    pub fn get<'a, T: PartialEq>(
        &self,
        cell: &'a std::sync::OnceLock<T>,
        entry: &str,
        make: impl Fn() -> T,
    ) -> &'a T {
        let mut made_now = false;
        let value = cell.get_or_init(|| {
            made_now = true;
            make()
        });
        if !made_now && self.checked && make() != *value {
            panic!("generator cache: entry {entry} was written again with a different value");
        }
        value
    }
}

impl GenCache {
    /// The resource cached under `key`, made by `make` on first use (the checked mode makes
    /// it again on every read and panics, naming the key, if it differs).
    pub fn localized(
        &self,
        key: &str,
        make: impl FnOnce() -> crate::resource::Named,
    ) -> crate::resource::Named {
        let mut map = self
            .localized
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(v) = map.get(key) {
            if self.checked && make() != *v {
                panic!(
                    "generator cache: entry {} was written again with a different value",
                    key.replace('\0', " ")
                );
            }
            return v.clone();
        }
        let v = make();
        map.insert(key.to_string(), v.clone());
        v
    }
}

impl Clone for GenCache {
    /// A copied snapshot starts with an empty cache (it may be modified), in the same mode.
    fn clone(&self) -> Self {
        GenCache {
            checked: self.checked,
            ..GenCache::default()
        }
    }
}

impl PartialEq for GenCache {
    /// Derived data: never part of a snapshot's identity.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for GenCache {}

impl std::fmt::Debug for GenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GenCache")
    }
}

/// What a security policy asks for that cannot be done as written, and what happens instead:
/// a CUSTOM policy whose provider cannot be asked (its rules deny), a JWT rule whose key source
/// is no service of the mesh (its tokens are refused).
fn security_warnings(
    resource: &Resource,
    mesh: &MeshConfigSpec,
    services: &[Service],
) -> Vec<String> {
    use crate::config_store::authorization::Action;
    use crate::config_store::request_authentication::JwksSource;
    let is_service = |host: &str| services.iter().any(|s| s.hostname == host);
    match resource {
        Resource::AuthorizationPolicy(_, spec) if spec.action == Action::Custom => {
            let name = spec.provider.as_ref().map_or("", |p| p.name.as_str());
            match policy::target(mesh, name, &is_service) {
                Ok(_) => Vec::new(),
                Err(why) => vec![format!(
                    "spec.provider: {why}; the policy's rules deny instead (fail closed, as Istio)"
                )],
            }
        }
        Resource::RequestAuthentication(_, spec) => spec
            .jwt_rules
            .iter()
            .enumerate()
            .filter_map(|(i, rule)| match rule.jwks_source() {
                Some(JwksSource::Http { host, .. }) if !is_service(host) => Some(format!(
                    "spec.jwtRules[{i}].jwksUri: {host:?} is no service of the mesh: its keys cannot be fetched, so every token of issuer {:?} is refused (401)",
                    rule.issuer
                )),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The mesh config: every MeshConfig source merged, later over earlier.
pub fn merged_mesh(config: &ConfigSet) -> MeshConfigSpec {
    let mut mesh = MeshConfigSpec::default();
    for r in &config.resources {
        if let Resource::MeshConfig(_, m) = r {
            mesh.merge(m);
        }
    }
    mesh
}

/// Every warning of the config, each prefixed with its resource: the ones found on parsing and
/// the routing ones first, resource by resource, then the security ones.
fn warnings(
    config: &ConfigSet,
    mesh: &MeshConfigSpec,
    services: &[Service],
    domain_suffix: &str,
) -> Vec<String> {
    let mut warnings = Vec::new();
    for r in &config.resources {
        let m = r.metadata();
        let found = routing::not_applied(r, config, services, domain_suffix);
        for w in m.warnings.iter().chain(&found) {
            warnings.push(format!("{} {}/{}: {w}", r.kind(), m.namespace(), m.name));
        }
    }
    for r in &config.resources {
        let m = r.metadata();
        for w in security_warnings(r, mesh, services) {
            warnings.push(format!("{} {}/{}: {w}", r.kind(), m.namespace(), m.name));
        }
    }
    let telemetries = by_name(config, |r| match r {
        Resource::Telemetry(m, s) => Some((m, &**s)),
        _ => None,
    });
    let is_service = |host: &str| {
        services
            .binary_search_by(|s| s.hostname.as_str().cmp(host))
            .is_ok()
    };
    for (m, s) in &telemetries {
        for w in telemetry::not_applied(m, s, &telemetries, mesh, &is_service) {
            warnings.push(format!("Telemetry {}/{}: {w}", m.namespace(), m.name));
        }
    }
    warnings
}

/// Each outbound cluster name of `services` (one per port, and per port and subset) → where
/// it points.
fn cluster_index(
    services: &[Service],
    subsets: &HashMap<String, Vec<Subset>>,
) -> HashMap<String, ClusterRef> {
    let mut clusters = HashMap::new();
    for (si, s) in services.iter().enumerate() {
        let own = subsets
            .get(&s.hostname)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for (pi, p) in s.ports.iter().enumerate() {
            for (subset, name) in crate::model::port_clusters(p.port, &s.hostname, own) {
                let at = ClusterRef {
                    service: si,
                    port: pi,
                    subset,
                };
                clusters.insert(name, at);
            }
        }
    }
    clusters
}

/// The resources `pick` selects from `config`, copied, in (namespace, name) order.
fn by_name<T: Clone>(
    config: &ConfigSet,
    pick: impl Fn(&Resource) -> Option<(&Metadata, &T)>,
) -> Vec<(Metadata, T)> {
    let mut out: Vec<(Metadata, T)> = config
        .resources
        .iter()
        .filter_map(|r| pick(r).map(|(m, s)| (m.clone(), s.clone())))
        .collect();
    out.sort_by(|a, b| (a.0.namespace(), &a.0.name).cmp(&(b.0.namespace(), &b.0.name)));
    out
}

impl Default for PushContext {
    fn default() -> Self {
        PushContext {
            version: String::new(),
            generation: 0,
            change: Change::Full,
            services: Vec::new(),
            network_gateways: Default::default(),
            peer_authentications: Vec::new(),
            authorization_policies: Vec::new(),
            request_authentications: Vec::new(),
            telemetries: Vec::new(),
            sidecars: Vec::new(),
            gateways: Vec::new(),
            secrets: Vec::new(),
            scope_gateway_to_namespace: false,
            cluster_id: crate::config::DEFAULT_CLUSTER_ID.to_string(),
            auto_ip_cursor: auto_ip::Cursor::default(),
            trust_domain: DEFAULT_TRUST_DOMAIN.to_string(),
            config: Default::default(),
            clusters: Default::default(),
            subsets: Default::default(),
            destination_rules: Default::default(),
            routing: Default::default(),
            warnings: Vec::new(),
            status: Vec::new(),
            mesh: Default::default(),
            cache: GenCache::default(),
            envoy_filters: Vec::new(),
            reference_grants: Vec::new(),
        }
    }
}

impl PushContext {
    /// The mesh config's rootNamespace (Istio's default: istio-system): where mesh-wide
    /// PeerAuthentication and the default Sidecar live.
    pub fn root_namespace(&self) -> &str {
        self.mesh
            .root_namespace
            .as_deref()
            .unwrap_or(ROOT_NAMESPACE)
    }

    /// The telemetry of a workload in `namespace` with `labels` (both sides).
    pub fn telemetry(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> telemetry::ProxyTelemetry {
        let specs =
            telemetry::applicable(&self.telemetries, self.root_namespace(), namespace, labels);
        telemetry::merge(&specs, self.mesh.default_providers.as_ref())
    }

    /// Whether a workload of `namespace` may have telemetry of its own, beyond the mesh-wide
    /// Telemetry of the root namespace: a Telemetry of its namespace (in the root namespace,
    /// one with a selector) could apply to it.
    pub fn telemetry_varies_in(&self, namespace: &str) -> bool {
        let root = namespace == self.root_namespace();
        self.telemetries
            .iter()
            .any(|(m, s)| m.namespace() == namespace && (!root || s.selector.is_some()))
    }

    /// Every port some service declares HTTP on, in order (one route configuration each).
    pub fn http_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .services
            .iter()
            .flat_map(|s| {
                s.ports
                    .iter()
                    .filter(|p| p.protocol.is_http())
                    .map(|p| p.port)
            })
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// The service named `hostname` (services are sorted by hostname).
    pub fn service(&self, hostname: &str) -> Option<&Service> {
        self.services
            .binary_search_by(|s| s.hostname.as_str().cmp(hostname))
            .ok()
            .map(|i| &self.services[i])
    }

    /// Every route configuration name: `"PORT"` for each HTTP port, and `"HOST:PORT"` for each
    /// port with no declared protocol on a service with a VIP (sniffed HTTP).
    pub fn route_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.http_ports().iter().map(u16::to_string).collect();
        for s in self.services.iter().filter(|s| !s.addresses.is_empty()) {
            for p in s
                .ports
                .iter()
                .filter(|p| p.protocol == crate::model::Protocol::Unknown)
            {
                names.push(format!("{}:{}", s.hostname, p.port));
            }
        }
        names
    }

    /// The mesh's outboundTrafficPolicy: unknown destinations blocked (REGISTRY_ONLY) rather
    /// than passed through (ALLOW_ANY, the default). A Sidecar's own policy overrides it.
    pub fn mesh_registry_only(&self) -> bool {
        OutboundTrafficPolicy::registry_only(self.mesh.outbound_traffic_policy.as_ref())
            .unwrap_or(false)
    }

    /// Builds a snapshot from `config`, which it keeps (shared, not copied) for /debug/configz.
    pub fn build(
        config: std::sync::Arc<ConfigSet>,
        domain_suffix: &str,
        version: String,
    ) -> Result<Self, RegistryError> {
        Self::build_after(config, domain_suffix, version, None)
    }

    /// `build`, reusing what `previous` compiled from objects that have not changed (the
    /// EnvoyFilters' decoded patch values).
    pub fn build_after(
        config: std::sync::Arc<ConfigSet>,
        domain_suffix: &str,
        version: String,
        previous: Option<&PushContext>,
    ) -> Result<Self, RegistryError> {
        // Istio resolves conflicts at one level by the oldest policy; without creation times,
        // by name, so the outcome does not depend on file order.
        let peer_authentications = by_name(&config, |r| match r {
            Resource::PeerAuthentication(m, s) => Some((m, s)),
            _ => None,
        });
        let services = registry::services(&config, domain_suffix)?;
        let mesh = merged_mesh(&config);
        let root_namespace = mesh.root_namespace.as_deref().unwrap_or(ROOT_NAMESPACE);
        let mut status = Vec::new();
        let destination_rules = routing::destination_rules(
            &config,
            domain_suffix,
            root_namespace,
            &services,
            &mut status,
        );
        let subsets = routing::subsets(&destination_rules);
        let routing = Routing::build(&config, domain_suffix);
        let warnings = warnings(&config, &mesh, &services, domain_suffix);
        let clusters = cluster_index(&services, &subsets);
        let sidecars = by_name(&config, |r| match r {
            Resource::Sidecar(m, s) => Some((m, s)),
            _ => None,
        });
        let authorization_policies = by_name(&config, |r| match r {
            Resource::AuthorizationPolicy(m, s) => Some((m, &**s)),
            _ => None,
        });
        let request_authentications = by_name(&config, |r| match r {
            Resource::RequestAuthentication(m, s) => Some((m, &**s)),
            _ => None,
        });
        let telemetries = by_name(&config, |r| match r {
            Resource::Telemetry(m, s) => Some((m, &**s)),
            _ => None,
        });
        let gateways = by_name(&config, |r| match r {
            Resource::Gateway(m, s) => Some((m, s)),
            _ => None,
        });
        let secrets = by_name(&config, |r| match r {
            Resource::Secret(m, s) => Some((m, s)),
            _ => None,
        });
        let reference_grants = by_name(&config, |r| match r {
            Resource::GatewayApi(m, o) => match o.as_ref() {
                crate::config_store::gateway_api::GatewayApiObject::ReferenceGrant(g) => {
                    Some((m, g))
                }
                _ => None,
            },
            _ => None,
        });
        let envoy_filters = envoy_filters::compile(
            &config.resources,
            previous.map_or(&[][..], |p| &p.envoy_filters),
        );
        let network_gateways = registry::network_gateways(&config);
        Ok(PushContext {
            network_gateways,
            envoy_filters,
            reference_grants,
            gateways,
            secrets,
            scope_gateway_to_namespace: false,
            cluster_id: crate::config::DEFAULT_CLUSTER_ID.to_string(),
            auto_ip_cursor: auto_ip::Cursor::default(),
            authorization_policies,
            request_authentications,
            telemetries,
            mesh,
            version,
            sidecars,
            generation: 0,
            change: Change::Full,
            clusters,
            subsets,
            destination_rules,
            routing,
            warnings,
            status,
            cache: GenCache::default(),
            services,
            peer_authentications,
            trust_domain: DEFAULT_TRUST_DOMAIN.to_string(),
            config,
        })
    }
}

/// The snapshot of one YAML document set, for unit tests of the generators.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn from_yaml(yaml: &str) -> PushContext {
    let set = ConfigSet {
        resources: crate::config_store::parse_file(std::path::Path::new("t.yaml"), yaml).unwrap(),
    };
    PushContext::build(std::sync::Arc::new(set), "cluster.local", "1".into()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(yaml: &str) -> PushContext {
        from_yaml(yaml)
    }

    /// Two DestinationRules for one host in one namespace are merged as istiod merges them: a
    /// subset the earlier one (by name) has is not taken from the later, and the push status
    /// says so under istiod's metric `pilot_destrule_subsets`, keyed by the host.
    #[test]
    fn a_subset_defined_twice_for_a_host_is_in_the_push_status() {
        let rule = |name: &str, version: &str| {
            format!(
                "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  host: reviews\n  subsets: [{{name: v1, labels: {{version: {version}}}}}]\n"
            )
        };
        let clean = push(&rule("a", "v1"));
        assert!(clean.status.is_empty(), "{:?}", clean.status);
        let twice = push(&format!("{}---\n{}", rule("a", "v1"), rule("b", "one")));
        assert_eq!(
            twice.status,
            vec![PushStatus {
                metric: "pilot_destrule_subsets",
                key: "reviews.shop.svc.cluster.local".into(),
                message: "Duplicate subset v1 found while merging destination rules for reviews.shop.svc.cluster.local".into(),
            }]
        );
        let applied = &twice.destination_rules;
        assert!(applied.is_empty(), "no such service, no applied rule");
    }

    /// A ReferenceGrant changes which Secrets routers may read: a new one is a change to push.
    #[test]
    fn a_reference_grant_is_a_change() {
        let grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: web}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}]\n  to: [{group: \"\", kind: Secret}]\n";
        let without = push("apiVersion: v1\nkind: Namespace\nmetadata: {name: web}\n");
        let with = push(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: web}}\n---\n{grant}"
        ));
        assert_eq!(with.reference_grants.len(), 1);
        assert!(!with.same_content(&without));
        assert!(crate::gateway_conversion::secret_granted(
            &with.reference_grants,
            "infra",
            "web",
            "any"
        ));
    }

    #[test]
    #[should_panic(expected = "entry counter was written again with a different value")]
    fn checked_cache_fails_loudly_on_a_different_value() {
        let cache = GenCache::checked();
        let cell = std::sync::OnceLock::new();
        let calls = std::sync::atomic::AtomicU32::new(0);
        let make = || calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(*cache.get(&cell, "counter", make), 0);
        // A generator whose value is not a function of the snapshot alone.
        cache.get(&cell, "counter", make);
    }

    #[test]
    fn checked_cache_passes_a_stable_value() {
        let cache = GenCache::checked();
        let cell = std::sync::OnceLock::new();
        for _ in 0..3 {
            assert_eq!(cache.get(&cell, "stable", || vec![1, 2, 3]), &vec![1, 2, 3]);
        }
    }

    #[test]
    fn destination_rule_subsets_by_host() {
        let p = push(
            r#"
kind: ServiceEntry
metadata: {name: a, namespace: shop}
spec: {hosts: [a.shop.svc.cluster.local], ports: [{number: 80, name: http}]}
---
kind: ServiceEntry
metadata: {name: ext, namespace: shop}
spec: {hosts: [api.example.com], ports: [{number: 443, name: tls}]}
---
kind: DestinationRule
metadata: {name: a1, namespace: shop}
spec: {host: a, subsets: [{name: v1, labels: {version: v1}}]}
---
kind: DestinationRule
metadata: {name: a2, namespace: shop}
spec: {host: a.shop.svc.cluster.local, subsets: [{name: v1, labels: {version: other}}, {name: v2, labels: {version: v2}}]}
---
kind: DestinationRule
metadata: {name: a-other-ns, namespace: blog}
spec: {host: a, subsets: [{name: blog, labels: {x: y}}]}
---
kind: DestinationRule
metadata: {name: some-clients, namespace: shop}
spec: {host: a, workloadSelector: {matchLabels: {app: c}}, subsets: [{name: only-c}]}
---
kind: DestinationRule
metadata: {name: wild, namespace: shop}
spec: {host: "*.example.com", subsets: [{name: eu, labels: {region: eu}}]}
"#,
        );
        let names = |host: &str| -> Vec<(String, String)> {
            p.subsets[host]
                .iter()
                .map(|s| {
                    (
                        s.name.clone(),
                        s.labels.values().cloned().collect::<Vec<_>>().join(","),
                    )
                })
                .collect()
        };
        // The short host in shop and the full one merge; the first definition of v1 stands;
        // the rule in blog means a.blog, and the per-client rule is not used.
        assert_eq!(
            names("a.shop.svc.cluster.local"),
            [("v1".into(), "v1".into()), ("v2".into(), "v2".into())]
        );
        assert_eq!(names("api.example.com"), [("eu".into(), "eu".into())]);
        assert!(
            p.clusters
                .contains_key("outbound|80|v2|a.shop.svc.cluster.local")
        );
        assert!(p.clusters.contains_key("outbound|443|eu|api.example.com"));
        assert!(
            !p.clusters
                .contains_key("outbound|80|only-c|a.shop.svc.cluster.local")
        );
    }
}
