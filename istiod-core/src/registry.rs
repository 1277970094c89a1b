//! Service discovery: turns config resources into services and their endpoints.
//! Mirrors istiod's `serviceregistry` (kube: Service + Endpoints; serviceentry: ServiceEntry with
//! inline endpoints or a workloadSelector over WorkloadEntry).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use crate::config_store::{
    ConfigSet, EndpointPort, EndpointSliceSpec, EndpointSubset, Metadata, PodInfo, Resource,
    SERVICE_NAME_LABEL, ServiceEntrySpec, ServiceSpec, SliceEndpoint, WorkloadEntrySpec,
};
use crate::model::{
    DnsTarget, Endpoint, Protocol, Registry, Resolution, Service, ServicePort, TlsMode, WorkloadRef,
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{kind} {namespace}/{name}: {reason}")]
pub struct RegistryError {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub reason: String,
}

fn error(kind: &'static str, meta: &Metadata, reason: String) -> RegistryError {
    RegistryError {
        kind,
        namespace: meta.namespace().to_string(),
        name: meta.name.clone(),
        reason,
    }
}

fn parse_ip(kind: &'static str, meta: &Metadata, raw: &str) -> Result<IpAddr, RegistryError> {
    raw.parse()
        .map_err(|_| error(kind, meta, format!("{raw:?} is not an IP address")))
}

fn workload_endpoint(
    kind: &'static str,
    meta: &Metadata,
    we: &WorkloadEntrySpec,
) -> Result<Endpoint, RegistryError> {
    Ok(Endpoint {
        address: parse_ip(kind, meta, &we.address)?,
        ports: we.ports.clone(),
        labels: we.labels.clone(),
        service_account: we
            .service_account
            .clone()
            .unwrap_or_else(|| "default".to_string()),
        tls_mode: TlsMode::of_workload(&we.labels, we.service_account.is_some()),
        // The entry's `locality`, else its locality label (Istio's serviceentry conversion).
        locality: we
            .locality
            .clone()
            .or_else(|| {
                LOCALITY_LABELS
                    .iter()
                    .find_map(|k| we.labels.get(*k))
                    .map(|l| sanitize_locality(l))
            })
            .unwrap_or_default(),
        workload: WorkloadRef {
            namespace: meta.namespace().to_string(),
            // A WorkloadEntry is a workload of its own; an entry's inline endpoint is not one.
            name: if kind == SERVICE_ENTRY {
                String::new()
            } else {
                we.labels
                    .get(WORKLOAD_NAME_LABEL)
                    .cloned()
                    .unwrap_or_else(|| meta.name.clone())
            },
            node: String::new(),
        },
        weight: we.weight.filter(|w| *w > 0).unwrap_or(1),
        network: we.network.as_deref().cloned().unwrap_or_default(),
    })
}

/// The label that names a workload over what its controller says (istiod's
/// `service.istio.io/workload-name`).
pub const WORKLOAD_NAME_LABEL: &str = "service.istio.io/workload-name";

use crate::model::{LOCALITY_LABELS, REGION_LABEL, SUBZONE_LABEL, ZONE_LABEL, sanitize_locality};

/// A pod as the index holds it.
type PodRef<'a> = (&'a Metadata, &'a PodInfo);
/// An object's key in the index: namespace and name.
type NsName<'a> = (&'a str, &'a str);

/// What the Kubernetes objects of a config set say about endpoints, indexed once per build:
/// pods by name and by address, nodes by name, and the Endpoints and EndpointSlices of each
/// service.
#[derive(Default)]
struct KubeIndex<'a> {
    pods_by_name: HashMap<NsName<'a>, PodRef<'a>>,
    pods_by_ip: HashMap<&'a str, PodRef<'a>>,
    nodes: HashMap<&'a str, &'a Metadata>,
    endpoints: HashMap<NsName<'a>, Vec<(&'a Metadata, &'a [EndpointSubset])>>,
    slices: HashMap<NsName<'a>, Vec<(&'a Metadata, &'a EndpointSliceSpec)>>,
    /// The cluster's network: the system namespace's `topology.istio.io/network` label (as
    /// istiod reads it), empty when unlabelled.
    network: String,
}

impl<'a> KubeIndex<'a> {
    fn of(config: &'a ConfigSet) -> KubeIndex<'a> {
        let mut index = KubeIndex::default();
        for r in &config.resources {
            match r {
                Resource::Pod(m, p) => {
                    // A finished pod's address may already be another pod's.
                    if matches!(p.phase.as_deref(), Some("Succeeded" | "Failed")) {
                        continue;
                    }
                    index
                        .pods_by_name
                        .insert((m.namespace(), m.name.as_str()), (m, p));
                    for ip in &p.ips {
                        index.pods_by_ip.insert(ip.as_str(), (m, p));
                    }
                }
                Resource::Node(m) => {
                    index.nodes.insert(m.name.as_str(), m);
                }
                Resource::Namespace(m) if m.name == crate::config::DEFAULT_POD_NAMESPACE => {
                    if let Some(n) = m.labels.get(crate::model::NETWORK_LABEL) {
                        index.network = n.clone();
                    }
                }
                Resource::Endpoints(m, subsets) => index
                    .endpoints
                    .entry((m.namespace(), m.name.as_str()))
                    .or_default()
                    .push((m, subsets)),
                Resource::EndpointSlice(m, slice) => {
                    if let Some(service) = m.labels.get(SERVICE_NAME_LABEL) {
                        index
                            .slices
                            .entry((m.namespace(), service.as_str()))
                            .or_default()
                            .push((m, slice));
                    }
                }
                _ => {}
            }
        }
        index
    }

    /// The pod behind an endpoint: the slice's `targetRef`, else the pod with that address.
    fn pod(
        &self,
        namespace: &str,
        target: Option<&SliceEndpoint>,
        address: &str,
    ) -> Option<(&'a Metadata, &'a PodInfo)> {
        let by_ref = target
            .and_then(|e| e.target_ref.as_ref())
            .filter(|r| r.kind == "Pod")
            .and_then(|r| {
                let ns = r.namespace.as_deref().unwrap_or(namespace);
                self.pods_by_name.get(&(ns, r.name.as_str())).copied()
            });
        by_ref.or_else(|| self.pods_by_ip.get(address).copied())
    }

    /// A pod's locality: its `istio-locality` label, else its node's topology labels.
    fn locality(&self, pod: &PodInfo, labels: &BTreeMap<String, String>) -> String {
        if let Some(l) = LOCALITY_LABELS.iter().find_map(|k| labels.get(*k)) {
            return sanitize_locality(l);
        }
        let Some(node) = pod.node_name.as_deref().and_then(|n| self.nodes.get(n)) else {
            return String::new();
        };
        let get = |k: &str| node.labels.get(k).map(String::as_str).unwrap_or("");
        // As istiod: `region/zone/subzone` with every part (`us/us-1a/`), none when all three
        // are unset.
        let parts = [get(REGION_LABEL), get(ZONE_LABEL), get(SUBZONE_LABEL)];
        if parts.iter().all(|p| p.is_empty()) {
            return String::new();
        }
        parts.join("/")
    }
}

/// A Kubernetes endpoint (from Endpoints or an EndpointSlice): each service port maps to the
/// endpoint port of the same name, or to the only one there is. With its pod known, the
/// endpoint has the pod's labels, service account, `security.istio.io/tlsMode` and locality, as
/// istiod builds it; without, the service's selector stands for the labels and no sidecar is
/// assumed.
fn kube_endpoint(
    address: IpAddr,
    service_ports: &[ServicePort],
    endpoint_ports: &[EndpointPort],
    spec: &ServiceSpec,
    pod: Option<(&Metadata, &PodInfo)>,
    index: &KubeIndex,
) -> Endpoint {
    // A pod's network label, else the cluster's.
    let network = pod
        .and_then(|(m, _)| m.labels.get(crate::model::NETWORK_LABEL))
        .unwrap_or(&index.network)
        .clone();
    let mut named = BTreeMap::new();
    for sp in service_ports {
        let target = endpoint_ports
            .iter()
            .find(|ep| ep.name == sp.name)
            .or_else(|| (endpoint_ports.len() == 1).then(|| &endpoint_ports[0]));
        if let Some(t) = target {
            named.insert(sp.name.clone(), t.port);
        }
    }
    match pod {
        Some((meta, pod)) => Endpoint {
            address,
            ports: named,
            labels: meta.labels.clone(),
            service_account: pod.service_account.clone(),
            tls_mode: TlsMode::of_workload(&meta.labels, false),
            locality: index.locality(pod, &meta.labels),
            workload: WorkloadRef {
                namespace: meta.namespace().to_string(),
                name: meta
                    .labels
                    .get(WORKLOAD_NAME_LABEL)
                    .unwrap_or(&pod.workload_name)
                    .clone(),
                node: pod.node_name.clone().unwrap_or_default(),
            },
            weight: 1,
            network,
        },
        None => Endpoint {
            address,
            ports: named,
            labels: spec.selector.clone(),
            service_account: "default".to_string(),
            // Without the pod (its tlsMode label) the sidecar is not known.
            tls_mode: TlsMode::Disabled,
            locality: String::new(),
            workload: WorkloadRef::default(),
            weight: 1,
            network,
        },
    }
}

/// The port a network's gateway takes cross-network mTLS on (istiod's default; Istio's
/// `networking.istio.io/gatewayPort` annotation is not read).
pub const NETWORK_GATEWAY_PORT: u16 = 15443;

/// Each network's gateways, as istiod finds them: the load balancer addresses (else the external
/// IPs) of the Services labelled `topology.istio.io/network` (the east-west gateway's).
pub fn network_gateways(config: &ConfigSet) -> BTreeMap<String, Vec<IpAddr>> {
    let mut out: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    for r in &config.resources {
        if let Resource::Service(m, spec) = r
            && let Some(net) = m.labels.get(crate::model::NETWORK_LABEL)
            && !net.is_empty()
        {
            let addrs = out.entry(net.clone()).or_default();
            addrs.extend(
                spec.published_ips
                    .iter()
                    .filter_map(|ip| ip.parse::<IpAddr>().ok()),
            );
            addrs.sort();
            addrs.dedup();
        }
    }
    out.retain(|_, a| !a.is_empty());
    out
}

/// Whether `labels` carry every label of `selector` (an empty selector selects everything): a
/// Kubernetes equality label selector, as every Istio resource's workload selector is.
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Builds all services from a config set. `domain_suffix` is the mesh's DNS suffix (`cluster.local`).
pub fn services(config: &ConfigSet, domain_suffix: &str) -> Result<Vec<Service>, RegistryError> {
    let mut out = Vec::new();
    let index = KubeIndex::of(config);
    let workload_entries: Vec<(&Metadata, &WorkloadEntrySpec)> = config
        .resources
        .iter()
        .filter_map(|r| match r {
            Resource::WorkloadEntry(m, s) => Some((m, s)),
            _ => None,
        })
        .collect();
    for r in &config.resources {
        match r {
            Resource::ServiceEntry(meta, spec) => {
                out.extend(service_entry_services(meta, spec, &workload_entries)?);
            }
            Resource::Service(meta, spec) => {
                out.push(kube_service(
                    &index,
                    meta,
                    spec,
                    domain_suffix,
                    &workload_entries,
                )?);
            }
            Resource::WorkloadEntry(..)
            | Resource::Endpoints(..)
            | Resource::EndpointSlice(..)
            | Resource::Sidecar(..)
            | Resource::PeerAuthentication(..)
            | Resource::VirtualService(..)
            | Resource::DestinationRule(..)
            | Resource::Gateway(..)
            | Resource::Secret(..)
            | Resource::AuthorizationPolicy(..)
            | Resource::RequestAuthentication(..)
            | Resource::Telemetry(..)
            | Resource::EnvoyFilter(..)
            | Resource::Namespace(..)
            | Resource::Pod(..)
            | Resource::Node(..)
            | Resource::WorkloadGroup(..)
            | Resource::GatewayApi(..)
            | Resource::MeshConfig(..) => {}
        }
    }
    out.sort_by(|a, b| a.hostname.cmp(&b.hostname));
    Ok(out)
}

const SERVICE_ENTRY: &str = "ServiceEntry";

/// The addresses a ServiceEntry's status gives `host`: the last IPv4 and the last IPv6.
fn claimed(status: &[(String, IpAddr)], host: &str) -> Vec<IpAddr> {
    let last = |v4: bool| {
        status
            .iter()
            .rev()
            .find(|(h, a)| h == host && a.is_ipv4() == v4)
            .map(|(_, a)| *a)
    };
    last(true).into_iter().chain(last(false)).collect()
}
/// The ServiceEntry label that opts it out of address auto-allocation (`"false"`).
pub const AUTO_ALLOCATE_LABEL: &str = "networking.istio.io/enable-autoallocate-ip";

/// One service per host of a ServiceEntry, all with the same addresses, ports and endpoints.
fn service_entry_services(
    meta: &Metadata,
    spec: &ServiceEntrySpec,
    workload_entries: &[(&Metadata, &WorkloadEntrySpec)],
) -> Result<Vec<Service>, RegistryError> {
    let addresses = spec
        .addresses
        .iter()
        .map(|a| parse_ip(SERVICE_ENTRY, meta, a.split('/').next().unwrap_or(a)))
        .collect::<Result<Vec<_>, _>>()?;
    let ports: Vec<ServicePort> = spec
        .ports
        .iter()
        .map(|p| ServicePort {
            name: p.name.clone(),
            port: p.number,
            protocol: Protocol::infer(p.protocol.as_deref(), &p.name),
        })
        .collect();
    let resolution = resolution(meta, spec)?;
    // Istio's DNS auto-allocation (V2 eligibility): no addresses of its own, resolution not
    // NONE, and not opted out by the label `networking.istio.io/enable-autoallocate-ip: false`.
    let allocatable = addresses.is_empty()
        && resolution != Resolution::Passthrough
        && !meta
            .labels
            .get(AUTO_ALLOCATE_LABEL)
            .is_some_and(|v| v.eq_ignore_ascii_case("false"));
    let dns = matches!(resolution, Resolution::Dns | Resolution::DnsRoundRobin);
    let (mut endpoints, mut dns_targets) =
        service_entry_endpoints(meta, spec, resolution, workload_entries)?;
    for ep in &mut endpoints {
        default_target_ports(spec, &mut ep.ports);
    }
    for t in &mut dns_targets {
        default_target_ports(spec, &mut t.ports);
    }
    let services = spec
        .hosts
        .iter()
        .map(|host| {
            // A DNS entry without endpoints resolves its own host.
            let targets = if dns && dns_targets.is_empty() && spec.workload_selector.is_none() {
                let mut ports = BTreeMap::new();
                default_target_ports(spec, &mut ports);
                vec![DnsTarget {
                    host: host.clone(),
                    ports,
                    labels: BTreeMap::new(),
                }]
            } else {
                dns_targets.clone()
            };
            Service {
                hostname: host.clone(),
                namespace: meta.namespace().to_string(),
                addresses: addresses.clone(),
                ports: ports.clone(),
                endpoints: endpoints.clone(),
                resolution,
                mesh_external: spec.location.as_deref() == Some("MESH_EXTERNAL"),
                dns_targets: targets,
                registry: Registry::External,
                allocatable: allocatable && !host.starts_with('*'),
                auto_addresses: Vec::new(),
                claimed_addresses: if allocatable {
                    claimed(&spec.status_addresses, host)
                } else {
                    Vec::new()
                },
                source_name: meta.name.clone(),
            }
        })
        .collect();
    Ok(services)
}

/// A ServiceEntry's resolution (STATIC when unset).
fn resolution(meta: &Metadata, spec: &ServiceEntrySpec) -> Result<Resolution, RegistryError> {
    match spec.resolution.as_deref() {
        None | Some("STATIC") => Ok(Resolution::Static),
        Some("DNS") => Ok(Resolution::Dns),
        Some("DNS_ROUND_ROBIN") => Ok(Resolution::DnsRoundRobin),
        Some("NONE") => Ok(Resolution::Passthrough),
        Some(other) => Err(error(
            SERVICE_ENTRY,
            meta,
            format!("spec.resolution: {other:?} is not NONE, STATIC, DNS or DNS_ROUND_ROBIN"),
        )),
    }
}

/// A ServiceEntry's endpoints, inline and selected WorkloadEntries of its namespace, as
/// (addresses, names Envoy resolves): under DNS resolution every one is something Envoy resolves.
fn service_entry_endpoints(
    meta: &Metadata,
    spec: &ServiceEntrySpec,
    resolution: Resolution,
    workload_entries: &[(&Metadata, &WorkloadEntrySpec)],
) -> Result<(Vec<Endpoint>, Vec<DnsTarget>), RegistryError> {
    let dns = matches!(resolution, Resolution::Dns | Resolution::DnsRoundRobin);
    // Endpoints Envoy resolves itself (DNS) may be names; the others are addresses.
    let mut dns_targets: Vec<DnsTarget> = Vec::new();
    let mut endpoints = Vec::new();
    for e in &spec.endpoints {
        if dns && e.address.parse::<IpAddr>().is_err() {
            dns_targets.push(DnsTarget {
                host: e.address.clone(),
                ports: e.ports.clone(),
                labels: e.labels.clone(),
            });
        } else {
            endpoints.push(workload_endpoint(SERVICE_ENTRY, meta, e)?);
        }
    }
    if let Some(selector) = &spec.workload_selector {
        for (wm, we) in workload_entries {
            if wm.namespace() == meta.namespace() && selects(&selector.labels, &we.labels) {
                endpoints.push(workload_endpoint("WorkloadEntry", wm, we)?);
            }
        }
    }
    // Under DNS every endpoint, inline or selected, is something Envoy resolves.
    if dns {
        for e in endpoints.drain(..) {
            dns_targets.push(DnsTarget {
                host: e.address.to_string(),
                ports: e.ports,
                labels: e.labels,
            });
        }
        if resolution == Resolution::DnsRoundRobin && dns_targets.len() > 1 {
            return Err(error(
                SERVICE_ENTRY,
                meta,
                "spec.endpoints: DNS_ROUND_ROBIN takes at most one endpoint".to_string(),
            ));
        }
    }
    Ok((endpoints, dns_targets))
}

/// A ServiceEntry port's targetPort applies to endpoints that do not name the port.
fn default_target_ports(spec: &ServiceEntrySpec, ports: &mut BTreeMap<String, u16>) {
    for p in &spec.ports {
        if let Some(t) = p.target_port {
            ports.entry(p.name.clone()).or_insert(t);
        }
    }
}

/// A Kubernetes Service `NAME.NAMESPACE.svc.<domain_suffix>`, with the endpoints of its
/// Endpoints and EndpointSlices, and the WorkloadEntries of its namespace its selector selects
/// (istiod's `PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES`, on by default: VMs behind a Service).
fn kube_service(
    index: &KubeIndex,
    meta: &Metadata,
    spec: &ServiceSpec,
    domain_suffix: &str,
    workload_entries: &[(&Metadata, &WorkloadEntrySpec)],
) -> Result<Service, RegistryError> {
    let addresses = match spec.cluster_ip.as_deref() {
        None | Some("") | Some("None") => Vec::new(),
        Some(ip) => vec![parse_ip("Service", meta, ip)?],
    };
    let ports: Vec<ServicePort> = spec
        .ports
        .iter()
        .map(|p| ServicePort {
            name: p.name.clone(),
            port: p.port,
            protocol: Protocol::infer(p.app_protocol.as_deref(), &p.name),
        })
        .collect();
    let mut endpoints = kube_endpoints(index, meta, spec, &ports)?;
    if !spec.selector.is_empty() {
        for (wm, we) in workload_entries {
            if wm.namespace() != meta.namespace() || !selects(&spec.selector, &we.labels) {
                continue;
            }
            let mut e = workload_endpoint("WorkloadEntry", wm, we)?;
            if endpoints.iter().any(|x| x.address == e.address) {
                continue;
            }
            // Each Service port on the entry's port of that name, else the numeric targetPort,
            // else the Service port itself.
            e.ports = spec
                .ports
                .iter()
                .map(|p| {
                    let target = we.ports.get(&p.name).copied().or_else(|| {
                        p.target_port
                            .as_ref()
                            .and_then(|t| t.as_u64())
                            .and_then(|t| u16::try_from(t).ok())
                    });
                    (p.name.clone(), target.unwrap_or(p.port))
                })
                .collect();
            endpoints.push(e);
        }
    }
    Ok(Service {
        hostname: format!("{}.{}.svc.{domain_suffix}", meta.name, meta.namespace()),
        namespace: meta.namespace().to_string(),
        addresses,
        ports,
        endpoints,
        source_name: meta.name.clone(),
        ..Default::default()
    })
}

/// The endpoints of the Service `meta` names: from its Endpoints, then from its EndpointSlices
/// (label kubernetes.io/service-name); an address already known from Endpoints is not added
/// twice.
fn kube_endpoints(
    index: &KubeIndex,
    meta: &Metadata,
    spec: &ServiceSpec,
    ports: &[ServicePort],
) -> Result<Vec<Endpoint>, RegistryError> {
    let mut endpoints = Vec::new();
    let key = (meta.namespace(), meta.name.as_str());
    for (em, subsets) in index.endpoints.get(&key).into_iter().flatten() {
        for subset in subsets.iter() {
            for addr in &subset.addresses {
                let address = parse_ip("Endpoints", em, &addr.ip)?;
                let pod = index.pod(meta.namespace(), None, &addr.ip);
                endpoints.push(kube_endpoint(
                    address,
                    ports,
                    &subset.ports,
                    spec,
                    pod,
                    index,
                ));
            }
        }
    }
    for (sm, slice) in index.slices.get(&key).into_iter().flatten() {
        if slice.address_type.as_deref().is_some_and(|t| t == "FQDN") {
            continue;
        }
        for ep in slice
            .endpoints
            .iter()
            .filter(|e| e.conditions.ready != Some(false))
        {
            for addr in &ep.addresses {
                let address = parse_ip("EndpointSlice", sm, addr)?;
                if endpoints.iter().any(|e: &Endpoint| e.address == address) {
                    continue;
                }
                let pod = index.pod(meta.namespace(), Some(ep), addr);
                endpoints.push(kube_endpoint(
                    address,
                    ports,
                    &slice.ports,
                    spec,
                    pod,
                    index,
                ));
            }
        }
    }
    Ok(endpoints)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_entry_resolution() {
        use crate::config_store::parse_file;
        let set = |yaml: &str| ConfigSet {
            resources: parse_file(std::path::Path::new("r.yaml"), yaml).unwrap(),
        };
        let dns = set(
            "kind: ServiceEntry\nmetadata: {name: e, namespace: n}\nspec: {hosts: [a.example, b.example], location: MESH_EXTERNAL, resolution: DNS, ports: [{number: 80, name: http}], endpoints: [{address: x.example, ports: {http: 8080}}, {address: 10.0.0.9}]}\n",
        );
        let out = services(&dns, "cluster.local").unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].resolution, Resolution::Dns);
        assert!(out[0].mesh_external && out[0].endpoints.is_empty());
        let hosts: Vec<&str> = out[0].dns_targets.iter().map(|t| t.host.as_str()).collect();
        assert_eq!(hosts, ["x.example", "10.0.0.9"]);
        assert_eq!(out[0].dns_targets[0].ports.get("http"), Some(&8080));
        // No endpoints: each host resolves itself.
        let own = set(
            "kind: ServiceEntry\nmetadata: {name: e, namespace: n}\nspec: {hosts: [a.example], resolution: DNS_ROUND_ROBIN, ports: [{number: 80, name: http}]}\n",
        );
        let out = services(&own, "cluster.local").unwrap();
        assert_eq!(out[0].dns_targets[0].host, "a.example");
        // Selected WorkloadEntries are resolved too, not left as EDS endpoints of a DNS cluster.
        let selected = set(
            "kind: ServiceEntry\nmetadata: {name: e, namespace: n}\nspec: {hosts: [a.example], resolution: DNS, ports: [{number: 80, name: http}], workloadSelector: {labels: {app: a}}}\n---\nkind: WorkloadEntry\nmetadata: {name: w, namespace: n}\nspec: {address: 10.0.0.7, labels: {app: a}}\n",
        );
        let out = services(&selected, "cluster.local").unwrap();
        let hosts: Vec<&str> = out[0].dns_targets.iter().map(|t| t.host.as_str()).collect();
        assert_eq!(hosts, ["10.0.0.7"]);
        assert!(out[0].endpoints.is_empty());
        for (yaml, expected) in [
            (
                "spec: {hosts: [a.example], resolution: DNZ, ports: [{number: 80, name: http}]}",
                "spec.resolution: \"DNZ\"",
            ),
            (
                "spec: {hosts: [a.example], resolution: DNS_ROUND_ROBIN, ports: [{number: 80, name: http}], endpoints: [{address: x.example}, {address: y.example}]}",
                "at most one endpoint",
            ),
            (
                "spec: {hosts: [a.example], resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: x.example}]}",
                "\"x.example\" is not an IP address",
            ),
        ] {
            let doc = format!("kind: ServiceEntry\nmetadata: {{name: e, namespace: n}}\n{yaml}\n");
            let err = services(&set(&doc), "cluster.local")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(expected) && err.contains("ServiceEntry n/e"),
                "{err}"
            );
        }
    }
    use crate::config_store::parse_file;
    use std::path::Path;

    #[test]
    fn kubernetes_service_with_endpoints() {
        let yaml = r#"
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.1.1
  ports: [{name: http, port: 80, targetPort: 8080}]
---
kind: Endpoints
metadata: {name: web, namespace: shop}
subsets:
- addresses: [{ip: 10.1.0.5}, {ip: 10.1.0.6}]
  ports: [{name: http, port: 8080}]
"#;
        let set = ConfigSet {
            resources: parse_file(Path::new("k.yaml"), yaml).unwrap(),
        };
        let s = services(&set, "cluster.local").unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].hostname, "web.shop.svc.cluster.local");
        assert_eq!(s[0].ports[0].protocol, Protocol::Http);
        assert_eq!(s[0].endpoints.len(), 2);
        assert_eq!(s[0].endpoints[0].target_port(&s[0].ports[0]), 8080);
    }

    #[test]
    fn endpoint_slices_add_ready_endpoints_of_their_service() {
        let yaml = r#"
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.1.1
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
- addresses: [10.1.0.5]
- addresses: [10.1.0.6]
  conditions: {ready: false}
- addresses: [10.1.0.7]
  conditions: {ready: true}
ports: [{name: http, port: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: other, namespace: shop, labels: {kubernetes.io/service-name: api}}
addressType: IPv4
endpoints: [{addresses: [10.1.0.9]}]
"#;
        let set = ConfigSet {
            resources: parse_file(Path::new("k.yaml"), yaml).unwrap(),
        };
        let s = services(&set, "cluster.local").unwrap();
        let ips: Vec<String> = s[0]
            .endpoints
            .iter()
            .map(|e| e.address.to_string())
            .collect();
        assert_eq!(ips, vec!["10.1.0.5", "10.1.0.7"]);
        assert_eq!(s[0].endpoints[0].target_port(&s[0].ports[0]), 8080);
        let e = parse_file(
            Path::new("k.yaml"),
            "kind: EndpointSlice\nmetadata: {name: x, namespace: shop}\nendpoints: []\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("kubernetes.io/service-name"), "{e}");
    }

    /// A Kubernetes endpoint is its pod: the pod's labels, service account, tlsMode and
    /// locality (its `istio-locality` label, else its node's topology labels), found by the
    /// slice's targetRef or by address; an address with no pod known keeps the selector.
    #[test]
    fn kubernetes_endpoints_carry_their_pods_labels_account_and_locality() {
        let yaml = r#"
kind: Service
metadata: {name: reviews, namespace: shop}
spec:
  clusterIP: 10.96.1.2
  selector: {app: reviews}
  ports: [{name: http, port: 9080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: reviews-x, namespace: shop, labels: {kubernetes.io/service-name: reviews}}
addressType: IPv4
endpoints:
- addresses: [10.1.0.5]
  targetRef: {kind: Pod, name: reviews-v2-abc, namespace: shop}
- addresses: [10.1.0.6]
- addresses: [10.1.0.7]
ports: [{name: http, port: 9080}]
---
kind: Pod
metadata: {name: reviews-v2-abc, namespace: shop, labels: {app: reviews, version: v2, security.istio.io/tlsMode: istio}}
spec: {serviceAccountName: bookinfo-reviews, nodeName: node-a}
status: {phase: Running, podIP: 10.1.0.5, podIPs: [{ip: 10.1.0.5}]}
---
kind: Pod
metadata: {name: reviews-v3-def, namespace: shop, labels: {app: reviews, version: v3, istio-locality: eu.west-1.rack9}}
spec: {nodeName: node-a}
status: {phase: Running, podIP: 10.1.0.6}
---
kind: Pod
metadata: {name: old, namespace: shop, labels: {app: reviews, version: v0}}
status: {phase: Succeeded, podIP: 10.1.0.7}
---
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/region: us, topology.kubernetes.io/zone: us-1a}}
"#;
        let set = ConfigSet {
            resources: parse_file(Path::new("k.yaml"), yaml).unwrap(),
        };
        let s = services(&set, "cluster.local").unwrap();
        let eps = &s[0].endpoints;
        assert_eq!(eps.len(), 3);
        assert_eq!(eps[0].labels.get("version").map(String::as_str), Some("v2"));
        assert_eq!(eps[0].service_account, "bookinfo-reviews");
        assert_eq!(eps[0].tls_mode, TlsMode::Istio);
        assert_eq!(eps[0].locality, "us/us-1a/");
        assert_eq!(
            eps[0].workload,
            WorkloadRef {
                namespace: "shop".into(),
                name: "reviews-v2-abc".into(),
                node: "node-a".into(),
            }
        );
        assert_eq!(eps[1].labels.get("version").map(String::as_str), Some("v3"));
        assert_eq!(eps[1].service_account, "default");
        assert_eq!(eps[1].tls_mode, TlsMode::Disabled);
        assert_eq!(eps[1].locality, "eu/west-1/rack9");
        // The finished pod is no one's: the selector stands in.
        assert_eq!(eps[2].labels.get("version"), None);
        assert_eq!(
            eps[2].labels.get("app").map(String::as_str),
            Some("reviews")
        );
        assert_eq!(eps[2].locality, "");
    }

    #[test]
    fn kubernetes_service_selects_workload_entries_in_its_namespace() {
        let yaml = "kind: Service\nmetadata: {name: vm, namespace: n}\nspec: {clusterIP: 10.96.0.9, selector: {app: vm}, ports: [{name: http, port: 80, targetPort: 8080}, {name: grpc, port: 90}]}\n---\nkind: WorkloadEntry\nmetadata: {name: a, namespace: n}\nspec: {address: 10.0.0.7, labels: {app: vm}, serviceAccount: vm, ports: {grpc: 9090}}\n---\nkind: WorkloadEntry\nmetadata: {name: b, namespace: other}\nspec: {address: 10.0.0.8, labels: {app: vm}}\n---\nkind: WorkloadEntry\nmetadata: {name: c, namespace: n}\nspec: {address: 10.0.0.9, labels: {app: web}}\n";
        let set = ConfigSet {
            resources: parse_file(Path::new("s.yaml"), yaml).unwrap(),
        };
        let svcs = services(&set, "cluster.local").unwrap();
        let eps = &svcs[0].endpoints;
        assert_eq!(eps.len(), 1, "{eps:?}");
        assert_eq!(eps[0].address.to_string(), "10.0.0.7");
        assert_eq!(
            eps[0].ports,
            BTreeMap::from([("grpc".to_string(), 9090), ("http".to_string(), 8080)])
        );
        assert_eq!(eps[0].service_account, "vm");
        assert_eq!(eps[0].workload.name, "a");
    }

    #[test]
    fn service_entry_selects_workload_entries_in_its_namespace() {
        let yaml = r#"
kind: ServiceEntry
metadata: {name: db, namespace: a}
spec:
  hosts: [db.example]
  ports: [{number: 5432, name: tcp-pg}]
  workloadSelector: {labels: {app: db}}
---
kind: WorkloadEntry
metadata: {name: db1, namespace: a}
spec: {address: 10.2.0.1, labels: {app: db}}
---
kind: WorkloadEntry
metadata: {name: db2, namespace: b}
spec: {address: 10.2.0.2, labels: {app: db}}
---
kind: WorkloadEntry
metadata: {name: other, namespace: a}
spec: {address: 10.2.0.3, labels: {app: other}}
"#;
        let set = ConfigSet {
            resources: parse_file(Path::new("s.yaml"), yaml).unwrap(),
        };
        let s = services(&set, "cluster.local").unwrap();
        let ips: Vec<String> = s[0]
            .endpoints
            .iter()
            .map(|e| e.address.to_string())
            .collect();
        assert_eq!(ips, vec!["10.2.0.1"]);
    }

    #[test]
    fn bad_address_is_named() {
        let yaml = "kind: WorkloadEntry\nmetadata: {name: w, namespace: n}\nspec: {address: not-an-ip, labels: {app: x}}\n---\nkind: ServiceEntry\nmetadata: {name: s, namespace: n}\nspec: {hosts: [h], workloadSelector: {labels: {app: x}}}\n";
        let set = ConfigSet {
            resources: parse_file(Path::new("s.yaml"), yaml).unwrap(),
        };
        let e = services(&set, "cluster.local").unwrap_err();
        assert_eq!(
            e.to_string(),
            "WorkloadEntry n/w: \"not-an-ip\" is not an IP address"
        );
    }
}
