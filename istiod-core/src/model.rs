//! The service model every generator reads: services, their ports and instances, and the proxy
//! asking for config. Mirrors the shape of istiod's `pilot/pkg/model` (Service, ServiceInstance,
//! Proxy), reduced to what the generators use today.

use std::collections::BTreeMap;
use std::net::IpAddr;

/// Application protocol of a service port, as Istio infers it from the port name or protocol field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Protocol {
    Http,
    Http2,
    Grpc,
    Tcp,
    /// TLS or HTTPS: opaque to the proxy, routed by SNI (VirtualService `tls` routes).
    Tls,
    /// No protocol declared: Envoy sniffs each connection (HTTP or opaque TCP), as Istio does.
    Unknown,
}

impl Protocol {
    /// Istio's rule: an explicit protocol (`HTTP`, `GRPC`, ...) or a port name `<proto>` or
    /// `<proto>-<suffix>`. Anything else is detected per connection (`Unknown`).
    pub fn infer(explicit: Option<&str>, port_name: &str) -> Protocol {
        let from = |s: &str| match s.to_ascii_lowercase().as_str() {
            "http" => Some(Protocol::Http),
            // Kubernetes' standard appProtocols (KEP-3726), as Istio maps them.
            "http2" | "h2c" | "kubernetes.io/h2c" => Some(Protocol::Http2),
            "kubernetes.io/ws" => Some(Protocol::Http),
            "kubernetes.io/wss" => Some(Protocol::Tls),
            "grpc" | "grpc-web" => Some(Protocol::Grpc),
            "tls" | "https" => Some(Protocol::Tls),
            "tcp" | "mongo" | "mysql" | "redis" => Some(Protocol::Tcp),
            _ => None,
        };
        explicit
            .and_then(from)
            .or_else(|| from(port_name.split('-').next().unwrap_or_default()))
            .unwrap_or(Protocol::Unknown)
    }

    /// Declared HTTP (HTTP/1.1, HTTP/2 or gRPC).
    pub fn is_http(self) -> bool {
        !matches!(self, Protocol::Tcp | Protocol::Tls | Protocol::Unknown)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServicePort {
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
}

/// One workload endpoint of a service.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Endpoint {
    pub address: IpAddr,
    /// Service port name → port the workload listens on.
    pub ports: BTreeMap<String, u16>,
    pub labels: BTreeMap<String, String>,
    pub service_account: String,
    /// Whether the workload has a sidecar that accepts Istio mutual TLS.
    pub tls_mode: TlsMode,
    /// `region/zone/subzone` (empty: unknown): a Kubernetes endpoint's from its pod's
    /// `istio-locality` label or its node's topology labels, a WorkloadEntry's `locality`.
    pub locality: String,
    /// Where the workload is, as istiod's endpoints name it (`/debug/endpointz`): its
    /// namespace, its workload (a pod's Deployment or other controller, by istiod's heuristic;
    /// a WorkloadEntry's name) and a pod's node; empty when not known (an endpoint without its
    /// pod, a ServiceEntry's inline endpoint).
    pub workload: WorkloadRef,
    /// Its load-balancing weight among the service's endpoints (a WorkloadEntry's `weight`;
    /// Kubernetes endpoints 1).
    pub weight: u32,
    /// The network it is on (`topology.istio.io/network`): a pod's label, else the cluster's
    /// (its system namespace's label); a WorkloadEntry's `network`. Empty: the same network as
    /// every proxy.
    pub network: String,
}

/// The workload behind an endpoint (see [`Endpoint::workload`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct WorkloadRef {
    pub namespace: String,
    pub name: String,
    pub node: String,
}

/// Label Istio's injector puts on workloads with a sidecar (`istio` or `disabled`).
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";

/// Istio's endpoint `tlsMode`: auto mTLS sends mutual TLS only to `Istio` endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum TlsMode {
    Istio,
    Disabled,
}

impl TlsMode {
    /// Istio's rule for WorkloadEntry: the `security.istio.io/tlsMode` label when present,
    /// otherwise mutual TLS when the entry names a service account.
    pub fn of_workload(labels: &BTreeMap<String, String>, has_service_account: bool) -> TlsMode {
        match labels.get(TLS_MODE_LABEL).map(String::as_str) {
            Some("istio") => TlsMode::Istio,
            Some(_) => TlsMode::Disabled,
            None if has_service_account => TlsMode::Istio,
            None => TlsMode::Disabled,
        }
    }
}

impl Endpoint {
    /// The workload port behind `port`: by name, else the service port number itself.
    pub fn target_port(&self, port: &ServicePort) -> u16 {
        self.ports.get(&port.name).copied().unwrap_or(port.port)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Service {
    /// Fully qualified hostname, e.g. `httpbin.default.svc.cluster.local`.
    pub hostname: String,
    pub namespace: String,
    /// Virtual IPs; empty for services without one.
    pub addresses: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
    pub endpoints: Vec<Endpoint>,
    /// How its clusters find endpoints (ServiceEntry `resolution`).
    pub resolution: Resolution,
    /// ServiceEntry `location: MESH_EXTERNAL`: outside the mesh, so never auto mTLS.
    pub mesh_external: bool,
    /// DNS resolution: the names (or addresses) Envoy resolves, from the entry's endpoints,
    /// else its own host.
    pub dns_targets: Vec<DnsTarget>,
    /// Which registry it comes from (istiod's provider: a Kubernetes Service, a ServiceEntry).
    pub registry: Registry,
    /// A ServiceEntry host that may be given addresses of its own (Istio's DNS auto-allocation:
    /// no `addresses`, resolution not NONE, not a wildcard, not opted out).
    pub allocatable: bool,
    /// The addresses given it (`push_context::auto_ip`): one IPv4 from 240.240.0.0/16, one
    /// IPv6 from 2001:2::/48; what proxies that capture DNS use in place of a VIP.
    pub auto_addresses: Vec<IpAddr>,
    /// The addresses its ServiceEntry's `status.addresses` gives this host (the last of each
    /// family, as istiod reads them), which the allocation keeps.
    pub claimed_addresses: Vec<IpAddr>,
    /// The name of the object it comes from (the Service's, the ServiceEntry's).
    pub source_name: String,
}

impl Service {
    /// The addresses `proxy` sends this service's traffic to: its VIPs, else (for a proxy that
    /// captures DNS) its auto-allocated ones of the proxy's families.
    pub fn addresses_for(&self, proxy: Option<&Proxy>) -> Vec<IpAddr> {
        if !self.addresses.is_empty() {
            return self.addresses.clone();
        }
        match proxy {
            Some(p) if p.uses_auto_addresses() => self
                .auto_addresses
                .iter()
                .filter(|a| {
                    p.ip_addresses
                        .iter()
                        .any(|own| own.is_ipv4() == a.is_ipv4())
                })
                .copied()
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// istiod's service registry providers, as its endpoint shards are keyed (`PROVIDER/CLUSTER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum Registry {
    #[default]
    Kubernetes,
    External,
}

/// The topology labels of a locality, as Kubernetes and Istio name them.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const SUBZONE_LABEL: &str = "topology.istio.io/subzone";
/// The labels that set a workload's locality (`region.zone.subzone` or with slashes), Istio's
/// current name first.
pub const LOCALITY_LABELS: [&str; 2] = ["topology.istio.io/locality", "istio-locality"];

/// Istio's `SanitizeLocalityLabel`: `region.zone.subzone` becomes `region/zone/subzone` unless
/// it has slashes already.
pub fn sanitize_locality(label: &str) -> String {
    if label.contains('/') {
        label.to_string()
    } else {
        label.replace('.', "/")
    }
}

/// The SPIFFE identity of service account `sa` in `namespace`.
pub fn spiffe_id(trust_domain: &str, namespace: &str, sa: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}/sa/{sa}")
}

/// The labels istiod gives an endpoint (`AugmentLabels`): the workload's own, then its
/// locality's region, zone and subzone, the cluster, the node as `kubernetes.io/hostname`, and
/// the network (none here: `topology.istio.io/network` is empty) unless the workload names one.
pub fn endpoint_labels(ep: &Endpoint, cluster_id: &str) -> BTreeMap<String, String> {
    let mut labels = augmented_labels(&ep.labels, &ep.locality, cluster_id, &ep.workload.node);
    if !ep.network.is_empty() {
        labels.insert(NETWORK_LABEL.into(), ep.network.clone());
    }
    labels
}

/// The label naming a workload's (or a namespace's, a gateway Service's) network.
pub const NETWORK_LABEL: &str = "topology.istio.io/network";

/// `labels` with istiod's topology labels added (`AugmentLabels`; see [`endpoint_labels`]):
/// what subsets and `failoverPriority` match, for endpoints and proxies alike.
pub fn augmented_labels(
    labels: &BTreeMap<String, String>,
    locality: &str,
    cluster_id: &str,
    node: &str,
) -> BTreeMap<String, String> {
    let mut out = labels.clone();
    let mut parts = locality.splitn(3, '/');
    for key in [REGION_LABEL, ZONE_LABEL, SUBZONE_LABEL] {
        if let Some(v) = parts.next().filter(|v| !v.is_empty()) {
            out.insert(key.to_string(), v.to_string());
        }
    }
    out.insert("topology.istio.io/cluster".into(), cluster_id.to_string());
    if !node.is_empty() {
        out.insert("kubernetes.io/hostname".into(), node.to_string());
    }
    out.entry("topology.istio.io/network".into()).or_default();
    out
}

/// ServiceEntry `resolution`, as the cluster type Istio gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum Resolution {
    /// STATIC (and every Kubernetes Service): EDS from the known endpoints.
    #[default]
    Static,
    /// DNS: STRICT_DNS, every address of every name.
    Dns,
    /// DNS_ROUND_ROBIN: LOGICAL_DNS, one name, connections spread over its addresses.
    DnsRoundRobin,
    /// NONE: ORIGINAL_DST, to wherever the app connected.
    Passthrough,
}

/// One name Envoy resolves for a DNS ServiceEntry, with per-port targets and labels.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DnsTarget {
    pub host: String,
    pub ports: BTreeMap<String, u16>,
    pub labels: BTreeMap<String, String>,
}

/// The Envoy cluster name Istio uses for a service port: `outbound|PORT||HOST`.
pub fn outbound_cluster_name(port: u16, hostname: &str) -> String {
    format!("outbound|{port}||{hostname}")
}

/// The cluster of one DestinationRule subset of a service port: `outbound|PORT|SUBSET|HOST`.
pub fn subset_cluster_name(port: u16, subset: &str, hostname: &str) -> String {
    format!("outbound|{port}|{subset}|{hostname}")
}

/// The outbound clusters of `port` of `hostname`: the service's own (`None`) and one per
/// subset (its index in `subsets`).
pub fn port_clusters<'a>(
    port: u16,
    hostname: &'a str,
    subsets: &'a [Subset],
) -> impl Iterator<Item = (Option<usize>, String)> + 'a {
    std::iter::once((None, outbound_cluster_name(port, hostname))).chain(
        subsets
            .iter()
            .enumerate()
            .map(move |(i, s)| (Some(i), subset_cluster_name(port, &s.name, hostname))),
    )
}

/// A DestinationRule subset: the endpoints of a service that carry all of `labels`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Subset {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

impl Subset {
    pub fn selects(&self, endpoint: &Endpoint) -> bool {
        self.labels
            .iter()
            .all(|(k, v)| endpoint.labels.get(k) == Some(v))
    }
}

/// The Envoy cluster name Istio uses for a workload's inbound port: `inbound|PORT||`.
pub fn inbound_cluster_name(port: u16) -> String {
    format!("inbound|{port}||")
}

/// The proxy asking for config, parsed from its Envoy node id `type~ip~pod.namespace~domain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    pub kind: String,
    pub ip_addresses: Vec<IpAddr>,
    pub id: String,
    pub namespace: String,
    pub dns_domain: String,
    /// The workload's labels, from the node metadata `LABELS`.
    pub labels: BTreeMap<String, String>,
    /// The WorkloadGroup this proxy registers itself in (node metadata `AUTO_REGISTER_GROUP`).
    pub auto_register_group: Option<String>,
    /// Whether its ProxyConfig (node metadata `PROXY_CONFIG`) has a `readinessProbe`: the agent
    /// then reports the workload's health, and its auto-registered WorkloadEntry is an endpoint
    /// only while healthy (Istio's `proxy.istio.io/health-checks-enabled`).
    pub health_checked: bool,
    /// Whether the stream's caller is known to act for `namespace` (in process, or a verified
    /// client certificate of that namespace): only then does a router get its namespace's
    /// Secrets (`credentialName`).
    pub reads_secrets: bool,
    /// The proxy's own ProxyConfig `tracing.sampling` (node metadata `PROXY_CONFIG`), over the
    /// mesh's `defaultConfig` for its connection managers.
    pub tracing_sampling: Option<crate::config_store::values::Percentage>,
    /// The node metadata's string fields (`ISTIO_VERSION`, ...): what an EnvoyFilter's proxy
    /// match reads.
    pub metadata: BTreeMap<String, String>,
    /// Where the proxy says it is (`region/zone/subzone`, empty: unknown): from its labels'
    /// topology, else its locality label, else the node's `locality` ([`Proxy::stated_locality`]).
    /// The registry's word on its workload comes first (`PushContext::proxy_locality`).
    pub locality: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid node id {id:?}: expected <type>~<ip>~<pod>.<namespace>~<domain>")]
pub struct NodeIdError {
    pub id: String,
}

/// The proxy type of gateways in the node id.
pub const ROUTER: &str = "router";

impl Proxy {
    /// The network the proxy is on (node metadata `NETWORK`; empty: the cluster's, or unknown).
    pub fn network(&self) -> &str {
        self.metadata.get("NETWORK").map_or("", String::as_str)
    }

    /// A gateway (node id type `router`): its listeners come from the Gateways that select it.
    pub fn is_router(&self) -> bool {
        self.kind == ROUTER
    }

    pub fn from_node_id(id: &str) -> Result<Proxy, NodeIdError> {
        let fail = || NodeIdError { id: id.to_string() };
        let parts: Vec<&str> = id.split('~').collect();
        let [kind, ip, pod, domain] = parts[..] else {
            return Err(fail());
        };
        if !matches!(kind, "sidecar" | "router" | "waypoint") {
            return Err(fail());
        }
        let ip_addresses = ip
            .split(',')
            .map(|s| s.parse::<IpAddr>().map_err(|_| fail()))
            .collect::<Result<Vec<_>, _>>()?;
        let namespace = pod.split_once('.').map(|(_, ns)| ns).unwrap_or_default();
        Ok(Proxy {
            kind: kind.to_string(),
            ip_addresses,
            id: pod.to_string(),
            namespace: namespace.to_string(),
            dns_domain: domain.to_string(),
            labels: BTreeMap::new(),
            auto_register_group: None,
            health_checked: false,
            reads_secrets: false,
            tracing_sampling: None,
            metadata: BTreeMap::new(),
            locality: String::new(),
        })
    }

    /// Whether the proxy uses auto-allocated addresses: it captures DNS (node metadata
    /// `DNS_CAPTURE`, from `ISTIO_META_DNS_CAPTURE`), as Istio's sidecars with the allocation
    /// controller (on by default) do.
    pub fn uses_auto_addresses(&self) -> bool {
        self.metadata
            .get("DNS_CAPTURE")
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
    }

    /// istiod's locality of a proxy from what it sends (`localityFromProxyLabels`, then the
    /// node): any of the topology labels (`topology.kubernetes.io/region`, `zone`,
    /// `topology.istio.io/subzone`) make `region/zone/subzone`; else the locality label
    /// (`topology.istio.io/locality`, `istio-locality`, dots for slashes); else the node's
    /// `locality` (`region`, `zone`, `sub_zone`).
    pub fn stated_locality(labels: &BTreeMap<String, String>, node: [&str; 3]) -> String {
        let topology = [REGION_LABEL, ZONE_LABEL, SUBZONE_LABEL].map(|k| labels.get(k));
        if topology.iter().any(Option::is_some) {
            return topology
                .map(|v| v.map(String::as_str).unwrap_or_default())
                .join("/");
        }
        if let Some(l) = LOCALITY_LABELS.iter().find_map(|k| labels.get(*k)) {
            return sanitize_locality(l);
        }
        if node.iter().all(|p| p.is_empty()) {
            return String::new();
        }
        node.join("/")
    }

    /// The workload's labels: the node's own, else those of the endpoints it owns.
    pub fn workload_labels(&self, services: &[Service]) -> BTreeMap<String, String> {
        if !self.labels.is_empty() {
            return self.labels.clone();
        }
        let mut out = BTreeMap::new();
        for ep in services
            .iter()
            .flat_map(|s| &s.endpoints)
            .filter(|e| self.owns(e))
        {
            out.extend(ep.labels.clone());
        }
        out
    }

    /// True when `ep` is this proxy's own workload.
    pub fn owns(&self, ep: &Endpoint) -> bool {
        self.ip_addresses.contains(&ep.address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A proxy's locality from what it sends, in istiod's order: any topology label, then the
    /// locality label (dots for slashes unless it has slashes), then the node's `locality`.
    #[test]
    fn a_proxys_stated_locality_is_istiods() {
        let labels = |l: &[(&str, &str)]| -> BTreeMap<String, String> {
            l.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let node = ["nr", "nz", "ns"];
        assert_eq!(
            Proxy::stated_locality(
                &labels(&[(ZONE_LABEL, "z1"), ("istio-locality", "a.b")]),
                node
            ),
            "/z1/"
        );
        assert_eq!(
            Proxy::stated_locality(&labels(&[("istio-locality", "region1.zone1")]), node),
            "region1/zone1"
        );
        assert_eq!(
            Proxy::stated_locality(
                &labels(&[
                    ("topology.istio.io/locality", "r/z.1"),
                    ("istio-locality", "x")
                ]),
                node
            ),
            "r/z.1"
        );
        assert_eq!(Proxy::stated_locality(&labels(&[]), node), "nr/nz/ns");
        assert_eq!(Proxy::stated_locality(&labels(&[]), ["", "", ""]), "");
    }

    #[test]
    fn parses_node_id() {
        let p = Proxy::from_node_id("sidecar~10.1.2.3~app-xyz.default~default.svc.cluster.local")
            .unwrap();
        assert_eq!(p.ip_addresses, vec!["10.1.2.3".parse::<IpAddr>().unwrap()]);
        assert_eq!(p.namespace, "default");
        assert_eq!(p.id, "app-xyz.default");
        assert!(Proxy::from_node_id("sidecar~nope~a.b~c").is_err());
        assert!(Proxy::from_node_id("x~1.2.3.4~a.b~c").is_err());
        assert!(Proxy::from_node_id("sidecar~1.2.3.4~a.b").is_err());
    }

    #[test]
    fn infers_protocol_like_istio() {
        assert_eq!(Protocol::infer(None, "http-web"), Protocol::Http);
        assert_eq!(Protocol::infer(None, "grpc"), Protocol::Grpc);
        assert_eq!(Protocol::infer(Some("HTTP"), "foo"), Protocol::Http);
        assert_eq!(Protocol::infer(None, "web"), Protocol::Unknown);
        assert_eq!(Protocol::infer(None, ""), Protocol::Unknown);
        assert!(!Protocol::Unknown.is_http());
        assert_eq!(Protocol::infer(Some("TCP"), "http"), Protocol::Tcp);
        // Kubernetes' standard appProtocols.
        assert_eq!(
            Protocol::infer(Some("kubernetes.io/h2c"), "x"),
            Protocol::Http2
        );
        assert_eq!(
            Protocol::infer(Some("kubernetes.io/ws"), "x"),
            Protocol::Http
        );
        assert_eq!(
            Protocol::infer(Some("kubernetes.io/wss"), "x"),
            Protocol::Tls
        );
    }
}
