//! The PushContext: an immutable snapshot of everything the generators read, rebuilt from config
//! on every change and shared with all streams through a `watch` channel (istiod's
//! `pilot/pkg/model/push_context.go`). Generators never see a half-updated mesh.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::config_store::{
    ConfigSet, MeshConfigSpec, Metadata, MtlsMode, OutboundTrafficPolicy, PeerAuthenticationSpec,
    Resource, SidecarSpec,
};
use crate::model::{Endpoint, Service, ServicePort, Subset, TlsMode};
use crate::registry::{self, RegistryError};

pub mod routing;
pub use routing::{AppliedRule, MeshRoute, Routing};

/// Istio's root namespace: a PeerAuthentication here without a selector is mesh-wide.
pub const ROOT_NAMESPACE: &str = "istio-system";
/// The trust domain of workload identities unless the mesh config says otherwise.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// What changed from the previous snapshot (generation − 1) to this one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Change {
    /// Anything may have changed: every type is regenerated and pushed.
    #[default]
    Full,
    /// Only the endpoints of these services (by hostname), in ways that leave clusters,
    /// listeners and routes as they were: the EDS fast path.
    Endpoints(std::collections::BTreeSet<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushContext {
    /// Changes on every rebuild; sent as the xDS `version_info`.
    pub version: String,
    /// Counts snapshots; `change` is relative to generation − 1.
    pub generation: u64,
    pub change: Change,
    pub services: Vec<Service>,
    pub peer_authentications: Vec<(Metadata, PeerAuthenticationSpec)>,
    /// Every AuthorizationPolicy, by (namespace, name) (generators::authz picks a proxy's).
    pub authorization_policies: Vec<(Metadata, crate::config_store::AuthorizationPolicySpec)>,
    /// Every RequestAuthentication, by (namespace, name).
    pub request_authentications: Vec<(Metadata, crate::config_store::RequestAuthenticationSpec)>,
    pub sidecars: Vec<(Metadata, SidecarSpec)>,
    /// Every Gateway, by (namespace, name) (generators::gateway picks a router's).
    pub gateways: Vec<(Metadata, crate::config_store::GatewaySpec)>,
    /// Every Secret holding TLS material, by (namespace, name): `kubernetes://NAME` over SDS.
    pub secrets: Vec<(Metadata, crate::config_store::TlsSecret)>,
    /// PILOT_SCOPE_GATEWAY_TO_NAMESPACE: a Gateway selects routers of its own namespace only.
    pub scope_gateway_to_namespace: bool,
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
    /// `outbound|PORT|SUBSET|HOST` → which service, port and subset, for EDS lookups.
    pub clusters: HashMap<String, ClusterRef>,
    /// Encoded resources that are the same for every proxy of this snapshot.
    pub cache: GenCache,
}

/// What an outbound cluster name stands for (indices into the snapshot's services, their
/// ports and their subsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterRef {
    pub service: usize,
    pub port: usize,
    pub subset: Option<usize>,
}

/// Sidecar scopes by (proxy id, node labels).
pub type ScopeMemo = HashMap<(String, BTreeMap<String, String>), Option<Arc<SidecarScope>>>;

/// Resources generated once per snapshot and shared by every proxy's push: outbound clusters
/// and listeners, and each EDS assignment and route configuration. The key of every entry is
/// (this snapshot, resource name): a new config is a new snapshot with an empty cache, so an
/// entry can never be stale, and entries are written once (`OnceLock`), never replaced.
#[derive(Default)]
pub struct GenCache {
    pub outbound_clusters: std::sync::OnceLock<Vec<crate::generators::Named>>,
    pub outbound_listeners: std::sync::OnceLock<Vec<crate::generators::Named>>,
    pub endpoints: std::sync::OnceLock<std::collections::HashMap<String, crate::generators::Named>>,
    pub routes: std::sync::OnceLock<std::collections::HashMap<String, crate::generators::Named>>,
    /// Each proxy's Sidecar scope (by proxy id and node labels), worked out once per snapshot
    /// rather than once per generator.
    pub scopes: std::sync::Mutex<ScopeMemo>,
}

/// Checked mode of the generator cache (`ISTIOD_CACHE_CHECK=true`, or `set_cache_check` in
/// tests): every read of a cached resource generates it again and panics, naming the entry,
/// if the value differs. An entry's key is (snapshot, name) and its value must depend on the
/// snapshot alone; this catches a generator that reads anything else (the proxy, the clock)
/// or encodes nondeterministically (map order).
static CACHE_CHECK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn set_cache_check(on: bool) {
    CACHE_CHECK.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Turns the checked mode on when `ISTIOD_CACHE_CHECK` is `true` or `1`; says whether it did.
pub fn cache_check_from_env(get: &dyn Fn(&str) -> Option<String>) -> bool {
    let on = get("ISTIOD_CACHE_CHECK").is_some_and(|v| v == "true" || v == "1");
    if on {
        set_cache_check(true);
    }
    on
}

pub fn cache_check() -> bool {
    CACHE_CHECK.load(std::sync::atomic::Ordering::Relaxed)
}

impl GenCache {
    /// `cell`'s value, made by `make` on first use (see `CACHE_CHECK` for the checked mode).
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
        if !made_now && cache_check() && make() != *value {
            panic!("generator cache: entry {entry} was written again with a different value");
        }
        value
    }
}

impl Clone for GenCache {
    /// A copied snapshot starts with an empty cache (it may be modified).
    fn clone(&self) -> Self {
        GenCache::default()
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
            match crate::generators::ext_authz::target(mesh, name, &is_service) {
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
            peer_authentications: Vec::new(),
            authorization_policies: Vec::new(),
            request_authentications: Vec::new(),
            sidecars: Vec::new(),
            gateways: Vec::new(),
            secrets: Vec::new(),
            scope_gateway_to_namespace: false,
            trust_domain: DEFAULT_TRUST_DOMAIN.to_string(),
            config: Default::default(),
            clusters: Default::default(),
            subsets: Default::default(),
            destination_rules: Default::default(),
            routing: Default::default(),
            warnings: Vec::new(),
            mesh: Default::default(),
            cache: GenCache::default(),
        }
    }
}

/// The effective mTLS mode of a workload: the default mode and per-port overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundMtls {
    pub default: MtlsMode,
    pub ports: BTreeMap<u16, MtlsMode>,
}

impl InboundMtls {
    /// Mode on `port`; never `Unset` (which means PERMISSIVE, Istio's default).
    pub fn on_port(&self, port: u16) -> MtlsMode {
        self.ports.get(&port).copied().unwrap_or(self.default)
    }
}

/// What a Sidecar resource lets one proxy see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarScope {
    /// `namespace/name` of the Sidecar.
    pub name: String,
    /// Egress listeners, each for one port or (None) for every port no other one names.
    pub egress: Vec<ScopeEgress>,
    /// Ingress listeners: the workload's inbound ports, each with where it forwards. Empty:
    /// the inbound ports come from the services that select the workload.
    pub ingress: Vec<ScopeIngress>,
    /// outboundTrafficPolicy REGISTRY_ONLY: unknown destinations go to the BlackHoleCluster.
    pub registry_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeEgress {
    pub port: Option<u16>,
    /// (namespace or `*`/`~`, DNS name or `*`/`*.suffix`).
    pub hosts: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeIngress {
    pub port: u16,
    pub protocol: crate::model::Protocol,
    pub endpoint: crate::config_store::IngressEndpoint,
}

fn host_matches(hosts: &[(String, String)], svc: &Service) -> bool {
    hosts.iter().any(|(ns, name)| {
        let ns_ok = ns == "*" || (ns != "~" && *ns == svc.namespace);
        let name_ok = name == "*"
            || *name == svc.hostname
            || name
                .strip_prefix('*')
                .is_some_and(|suffix| svc.hostname.ends_with(suffix));
        ns_ok && name_ok
    })
}

impl SidecarScope {
    /// Whether the proxy sees `svc` on any port (its DNS names, for NDS).
    pub fn sees(&self, svc: &Service) -> bool {
        svc.ports.iter().any(|p| self.sees_port(svc, p.port))
    }

    /// Whether the proxy sees `svc` on `port`: by the egress listeners for that port if any
    /// names it, else by the port-less ones.
    pub fn sees_port(&self, svc: &Service, port: u16) -> bool {
        let for_port: Vec<&ScopeEgress> = self
            .egress
            .iter()
            .filter(|e| e.port == Some(port))
            .collect();
        let listeners = if for_port.is_empty() {
            self.egress.iter().filter(|e| e.port.is_none()).collect()
        } else {
            for_port
        };
        listeners.iter().any(|e| host_matches(&e.hosts, svc))
    }
}

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
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

    /// Whether auto mTLS is on (MeshConfig enableAutoMtls, default true).
    pub fn auto_mtls(&self) -> bool {
        self.mesh.enable_auto_mtls.unwrap_or(true)
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
        // Istio resolves conflicts at one level by the oldest policy; without creation times,
        // by name, so the outcome does not depend on file order.
        let peer_authentications = by_name(&config, |r| match r {
            Resource::PeerAuthentication(m, s) => Some((m, s)),
            _ => None,
        });
        let services = registry::services(&config, domain_suffix)?;
        let mut mesh = MeshConfigSpec::default();
        for r in &config.resources {
            if let Resource::MeshConfig(_, m) = r {
                mesh.merge(m);
            }
        }
        let root_namespace = mesh.root_namespace.as_deref().unwrap_or(ROOT_NAMESPACE);
        let destination_rules =
            routing::destination_rules(&config, domain_suffix, root_namespace, &services);
        let subsets = routing::subsets(&destination_rules);
        let routing = Routing::build(&config, domain_suffix);
        let mut warnings = Vec::new();
        for r in &config.resources {
            let m = r.metadata();
            let found = routing::not_applied(r, &config, &services, domain_suffix);
            for w in m.warnings.iter().chain(&found) {
                warnings.push(format!("{} {}/{}: {w}", r.kind(), m.namespace(), m.name));
            }
        }
        for r in &config.resources {
            let m = r.metadata();
            for w in security_warnings(r, &mesh, &services) {
                warnings.push(format!("{} {}/{}: {w}", r.kind(), m.namespace(), m.name));
            }
        }
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
        let sidecars = by_name(&config, |r| match r {
            Resource::Sidecar(m, s) => Some((m, s)),
            _ => None,
        });
        let authorization_policies = by_name(&config, |r| match r {
            Resource::AuthorizationPolicy(m, s) => Some((m, s)),
            _ => None,
        });
        let request_authentications = by_name(&config, |r| match r {
            Resource::RequestAuthentication(m, s) => Some((m, s)),
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
        Ok(PushContext {
            gateways,
            secrets,
            scope_gateway_to_namespace: false,
            authorization_policies,
            request_authentications,
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
            cache: GenCache::default(),
            services,
            peer_authentications,
            trust_domain: DEFAULT_TRUST_DOMAIN.to_string(),
            config,
        })
    }

    /// Everything but the version: two snapshots with equal content push nothing new.
    pub fn same_content(&self, other: &PushContext) -> bool {
        self.services == other.services && self.same_policies(other)
    }

    /// Everything but the services and the version.
    fn same_policies(&self, other: &PushContext) -> bool {
        self.mesh == other.mesh
            && self.subsets == other.subsets
            && self.destination_rules == other.destination_rules
            && self.routing == other.routing
            && self.peer_authentications == other.peer_authentications
            && self.authorization_policies == other.authorization_policies
            && self.request_authentications == other.request_authentications
            && self.sidecars == other.sidecars
            && self.gateways == other.gateways
            && self.secrets == other.secrets
            && self.scope_gateway_to_namespace == other.scope_gateway_to_namespace
            && self.trust_domain == other.trust_domain
    }

    /// Classifies the change from `old` to `self`: endpoint-only when every service is the same
    /// but for its endpoints, and those still have the same identities and TLS modes (which
    /// clusters carry), and the policies are unchanged.
    pub fn change_from(&self, old: &PushContext) -> Change {
        if self.services.len() != old.services.len() || !self.same_policies(old) {
            return Change::Full;
        }
        let identities = |s: &Service| {
            let mut v: Vec<(String, bool)> = s
                .endpoints
                .iter()
                .map(|e| (e.service_account.clone(), e.tls_mode == TlsMode::Istio))
                .collect();
            v.sort();
            v.dedup();
            v
        };
        let mut hosts = std::collections::BTreeSet::new();
        for (new, old) in self.services.iter().zip(&old.services) {
            if new.hostname != old.hostname
                || new.namespace != old.namespace
                || new.addresses != old.addresses
                || new.ports != old.ports
            {
                return Change::Full;
            }
            if new.endpoints != old.endpoints {
                if identities(new) != identities(old) {
                    return Change::Full;
                }
                hosts.insert(new.hostname.clone());
            }
        }
        Change::Endpoints(hosts)
    }

    /// The Sidecar that applies to `proxy`, as Istio picks it: one in the proxy's namespace
    /// whose workload selector matches, else one there without a selector, else the root
    /// namespace's default. `None`: the proxy sees every service (no Sidecar applies).
    pub fn sidecar_scope(&self, proxy: &crate::model::Proxy) -> Option<Arc<SidecarScope>> {
        if self.sidecars.is_empty() {
            return None;
        }
        let key = (proxy.id.clone(), proxy.labels.clone());
        if let Some(known) = self
            .cache
            .scopes
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return known;
        }
        let scope = self.find_sidecar_scope(proxy).map(Arc::new);
        if let Ok(mut m) = self.cache.scopes.lock() {
            m.insert(key, scope.clone());
        }
        scope
    }

    fn find_sidecar_scope(&self, proxy: &crate::model::Proxy) -> Option<SidecarScope> {
        let labels = proxy.workload_labels(&self.services);
        let own_ns = proxy.namespace.as_str();
        let chosen = self
            .sidecars
            .iter()
            .find(|(m, s)| {
                m.namespace() == own_ns
                    && s.workload_selector
                        .as_ref()
                        .is_some_and(|sel| !sel.labels.is_empty() && selects(&sel.labels, &labels))
            })
            .or_else(|| {
                self.sidecars
                    .iter()
                    .find(|(m, s)| m.namespace() == own_ns && s.workload_selector.is_none())
            })
            .or_else(|| {
                self.sidecars.iter().find(|(m, s)| {
                    m.namespace() == self.root_namespace() && s.workload_selector.is_none()
                })
            })?;
        let (meta, spec) = chosen;
        let egress = spec
            .egress
            .iter()
            .map(|e| ScopeEgress {
                port: e.port.as_ref().and_then(|p| u16::try_from(p.number).ok()),
                hosts: e
                    .hosts
                    .iter()
                    .filter_map(|h| h.split_once('/'))
                    .map(|(ns, name)| {
                        let ns = match ns {
                            "." => proxy.namespace.clone(),
                            other => other.to_string(),
                        };
                        (ns, name.to_string())
                    })
                    .collect(),
            })
            .collect();
        let ingress = spec
            .ingress
            .iter()
            .filter_map(|i| {
                let port = u16::try_from(i.port.number).ok()?;
                let endpoint = match &i.default_endpoint {
                    Some(raw) => crate::config_store::IngressEndpoint::parse(raw).ok()?,
                    None => crate::config_store::IngressEndpoint::Workload(port),
                };
                Some(ScopeIngress {
                    port,
                    protocol: crate::model::Protocol::infer(
                        i.port.protocol.as_deref(),
                        &i.port.name,
                    ),
                    endpoint,
                })
            })
            .collect();
        Some(SidecarScope {
            name: format!("{}/{}", meta.namespace(), meta.name),
            egress,
            ingress,
            // The Sidecar's own policy, else the mesh's.
            registry_only: OutboundTrafficPolicy::registry_only(
                spec.outbound_traffic_policy.as_ref(),
            )
            .unwrap_or_else(|| self.mesh_registry_only()),
        })
    }

    /// The proxy's inbound ports: its Sidecar's ingress listeners when it has any, else every
    /// target port of the services whose endpoints it is (HTTP wins if two disagree).
    /// `endpoint` is where a Sidecar ingress listener forwards; `None`: the original
    /// destination.
    pub fn inbound_ports(
        &self,
        proxy: &crate::model::Proxy,
    ) -> BTreeMap<
        u16,
        (
            crate::model::Protocol,
            Option<crate::config_store::IngressEndpoint>,
        ),
    > {
        if let Some(scope) = self.sidecar_scope(proxy)
            && !scope.ingress.is_empty()
        {
            return scope
                .ingress
                .iter()
                .map(|i| (i.port, (i.protocol, Some(i.endpoint.clone()))))
                .collect();
        }
        let mut ports = BTreeMap::new();
        for svc in &self.services {
            for ep in svc.endpoints.iter().filter(|e| proxy.owns(e)) {
                for port in &svc.ports {
                    let entry = ports
                        .entry(ep.target_port(port))
                        .or_insert((port.protocol, None));
                    if port.protocol.is_http() {
                        entry.0 = port.protocol;
                    }
                }
            }
        }
        ports
    }

    /// Auto mTLS: whether a client sends Istio mutual TLS to `ep` on service port `port`: the
    /// endpoint has a sidecar and its PeerAuthentication does not disable mTLS on that port.
    pub fn endpoint_mtls(&self, svc: &Service, ep: &Endpoint, port: &ServicePort) -> bool {
        self.auto_mtls()
            && ep.tls_mode == TlsMode::Istio
            && self
                .inbound_mtls(&svc.namespace, &ep.labels)
                .on_port(ep.target_port(port))
                != MtlsMode::Disable
    }

    /// The mTLS mode a workload in `namespace` with `labels` accepts, by Istio's precedence:
    /// workload selector over namespace-wide over mesh-wide (root namespace), each inheriting
    /// from the next when UNSET; PERMISSIVE when nothing says otherwise.
    pub fn inbound_mtls(&self, namespace: &str, labels: &BTreeMap<String, String>) -> InboundMtls {
        let mode_of = |s: &PeerAuthenticationSpec| {
            s.mtls
                .as_ref()
                .and_then(|m| m.mode)
                .unwrap_or(MtlsMode::Unset)
        };
        let first = |pred: &dyn Fn(&Metadata, &PeerAuthenticationSpec) -> bool| {
            self.peer_authentications
                .iter()
                .find(|(m, s)| pred(m, s))
                .map(|(_, s)| s)
        };
        let root = self.root_namespace();
        let mesh = first(&|m, s| m.namespace() == root && s.selector.is_none());
        let ns = first(&|m, s| m.namespace() == namespace && s.selector.is_none());
        let workload = first(&|m, s| {
            m.namespace() == namespace
                && s.selector
                    .as_ref()
                    .is_some_and(|sel| selects(&sel.match_labels, labels))
        });
        let mut mode = MtlsMode::Permissive;
        for scope in [mesh, ns, workload].into_iter().flatten() {
            match mode_of(scope) {
                MtlsMode::Unset => {}
                m => mode = m,
            }
        }
        let ports = workload
            .map(|w| {
                w.port_level_mtls
                    .iter()
                    .filter_map(|(port, m)| match m.mode {
                        None | Some(MtlsMode::Unset) => None,
                        Some(mode) => Some((*port, mode)),
                    })
                    .collect()
            })
            .unwrap_or_default();
        InboundMtls {
            default: mode,
            ports,
        }
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
    use crate::config_store::parse_file;
    use std::path::Path;

    fn push(yaml: &str) -> PushContext {
        from_yaml(yaml)
    }

    #[test]
    fn peer_authentication_precedence() {
        let p = push(
            r#"
kind: PeerAuthentication
metadata: {name: mesh, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
---
kind: PeerAuthentication
metadata: {name: ns, namespace: legacy}
spec: {mtls: {mode: PERMISSIVE}}
---
kind: PeerAuthentication
metadata: {name: db, namespace: legacy}
spec:
  selector: {matchLabels: {app: db}}
  mtls: {mode: UNSET}
  portLevelMtls:
    5432: {mode: DISABLE}
"#,
        );
        let labels = |app: &str| BTreeMap::from([("app".to_string(), app.to_string())]);
        assert_eq!(
            p.inbound_mtls("shop", &labels("web")).default,
            MtlsMode::Strict
        );
        assert_eq!(
            p.inbound_mtls("legacy", &labels("web")).default,
            MtlsMode::Permissive
        );
        let db = p.inbound_mtls("legacy", &labels("db"));
        assert_eq!(db.default, MtlsMode::Permissive);
        assert_eq!(db.on_port(5432), MtlsMode::Disable);
        assert_eq!(db.on_port(5433), MtlsMode::Permissive);
        assert_eq!(
            push("").inbound_mtls("x", &BTreeMap::new()).default,
            MtlsMode::Permissive
        );
    }

    #[test]
    #[should_panic(expected = "entry counter was written again with a different value")]
    fn checked_cache_fails_loudly_on_a_different_value() {
        set_cache_check(true);
        let cache = GenCache::default();
        let cell = std::sync::OnceLock::new();
        let calls = std::sync::atomic::AtomicU32::new(0);
        let make = || calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(*cache.get(&cell, "counter", make), 0);
        // A generator whose value is not a function of the snapshot alone.
        cache.get(&cell, "counter", make);
    }

    #[test]
    fn checked_cache_passes_a_stable_value() {
        set_cache_check(true);
        let cache = GenCache::default();
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

    #[test]
    fn sidecar_scope_precedence() {
        let p = push(
            r#"
kind: Sidecar
metadata: {name: mesh, namespace: istio-system}
spec: {egress: [{hosts: ["./*"]}]}
---
kind: Sidecar
metadata: {name: ns, namespace: shop}
spec: {egress: [{hosts: ["*/*"]}]}
---
kind: Sidecar
metadata: {name: web, namespace: shop}
spec:
  workloadSelector: {labels: {app: web}}
  egress: [{hosts: ["db/*"]}]
  outboundTrafficPolicy: {mode: REGISTRY_ONLY}
"#,
        );
        let proxy = |ns: &str, app: &str| {
            let mut p = crate::model::Proxy::from_node_id(&format!(
                "sidecar~10.0.0.1~p.{ns}~{ns}.svc.cluster.local"
            ))
            .unwrap();
            p.labels.insert("app".into(), app.into());
            p
        };
        let web = p.sidecar_scope(&proxy("shop", "web")).unwrap();
        assert_eq!(web.name, "shop/web");
        assert!(web.registry_only);
        // Worked out once per snapshot: the generators of one push share it.
        assert!(Arc::ptr_eq(
            &web,
            &p.sidecar_scope(&proxy("shop", "web")).unwrap()
        ));
        assert_eq!(
            p.sidecar_scope(&proxy("shop", "cart")).unwrap().name,
            "shop/ns"
        );
        let other = p.sidecar_scope(&proxy("blog", "x")).unwrap();
        assert_eq!(other.name, "istio-system/mesh");
        // "./*" means the proxy's own namespace.
        assert_eq!(
            other.egress[0].hosts,
            vec![("blog".to_string(), "*".to_string())]
        );
        assert!(push("").sidecar_scope(&proxy("shop", "web")).is_none());
        let bad = parse_file(
            Path::new("s.yaml"),
            "kind: Sidecar\nmetadata: {name: s, namespace: n}\nspec: {egress: [{hosts: [web]}]}\n",
        )
        .unwrap_err();
        assert!(bad.to_string().contains("<namespace>/<dns name>"), "{bad}");
    }

    #[test]
    fn port_level_without_selector_is_rejected() {
        let e = parse_file(
            Path::new("pa.yaml"),
            "kind: PeerAuthentication\nmetadata: {name: p, namespace: n}\nspec:\n  portLevelMtls:\n    80: {mode: STRICT}\n",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("portLevelMtls requires a workload selector"),
            "{e}"
        );
        let e = parse_file(
            Path::new("pa.yaml"),
            "kind: PeerAuthentication\nmetadata: {name: p, namespace: n}\nspec: {mtls: {mode: STRIKT}}\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("pa.yaml: document 1"), "{e}");
    }
}
