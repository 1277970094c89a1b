//! EDS: a ClusterLoadAssignment for each requested `outbound|PORT||HOST` cluster.

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;

use super::blocks::socket_address;
use super::{locality, tls};
use crate::model::{Proxy, Service, ServicePort, Subset};
use crate::push_context::PushContext;
use crate::resource::Named;

/// The service, port and subset `cluster` is of.
fn resolve<'a>(
    push: &'a PushContext,
    cluster: &str,
) -> Option<(&'a Service, &'a ServicePort, Option<&'a Subset>)> {
    let at = push.clusters.get(cluster)?;
    let svc = push.services.get(at.service)?;
    let port = svc.ports.get(at.port)?;
    let subset = match at.subset {
        Some(i) => Some(push.subsets.get(&svc.hostname)?.get(i)?),
        None => None,
    };
    Some((svc, port, subset))
}

/// The endpoints of `cluster` (its service's, or its subset's) as EDS sends them, each with its
/// weight, `HEALTHY` (only ready endpoints are known) and its TLS metadata.
fn members<'a>(
    push: &'a PushContext,
    cluster: &str,
) -> Option<impl Iterator<Item = locality::Member<'a>> + 'a> {
    let (svc, port, subset) = resolve(push, cluster)?;
    let members = svc
        .endpoints
        .iter()
        .filter(move |ep| subset.is_none_or(|s| s.selects(ep)))
        .map(move |ep| locality::Member {
            endpoint: ep,
            lb: LbEndpoint {
                metadata: push
                    .endpoint_mtls(svc, ep, port)
                    .then(tls::istio_endpoint_metadata),
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(socket_address(
                        &ep.address.to_string(),
                        ep.target_port(port),
                    )),
                    ..Default::default()
                })),
                health_status: HealthStatus::Healthy.into(),
                load_balancing_weight: Some(UInt32Value {
                    value: ep.weight.max(1),
                }),
            },
        });
    Some(members)
}

/// The locality plan of `cluster` (None: its assignment is the same for every proxy).
fn plan<'a>(push: &'a PushContext, cluster: &str) -> Option<locality::Plan<'a>> {
    let (svc, port, subset) = resolve(push, cluster)?;
    locality::plan(push, svc, port.port, subset.map(|s| s.name.as_str()))
}

/// The assignment every proxy gets: one group per locality, in locality order (the endpoints'
/// order within each), all at priority 0.
fn assignment(push: &PushContext, cluster: &str) -> Option<ClusterLoadAssignment> {
    let mut endpoints = locality::group(members(push, cluster)?.map(|m| (m, 0)));
    if endpoints.is_empty() {
        endpoints.push(LocalityLbEndpoints::default());
    }
    Some(ClusterLoadAssignment {
        cluster_name: cluster.to_string(),
        endpoints,
        ..Default::default()
    })
}

/// One cluster's assignment as the snapshot's cache holds it.
fn named(push: &PushContext, name: &str) -> Option<(String, Named)> {
    let cla = assignment(push, name)?;
    Some((
        name.to_string(),
        Named::new(name.to_string(), pack_any(cla)),
    ))
}

/// Every cluster's assignment, as the snapshot's cache holds them.
fn all_assignments(push: &PushContext) -> std::collections::HashMap<String, Named> {
    push.clusters
        .keys()
        .filter_map(|name| named(push, name))
        .collect()
}

/// After an endpoints-only change (`Change::Endpoints(changed)`, from `old` to `push`): fills
/// `push`'s cache of assignments, sharing `old`'s for every cluster whose service is not in
/// `changed` (its endpoints, subsets and TLS are the same, by what that change means) and
/// generating only the others, as istiod updates the changed services' endpoints alone. Without
/// this, the first EDS request after a pod change generated every cluster's assignment again
/// (1000 services: most of the time from the change to the first push). Nothing is done when
/// `old` had not generated its assignments. The checked cache mode compares the result with a
/// full generation on every read.
pub fn carry_over(
    push: &PushContext,
    old: &PushContext,
    changed: &std::collections::BTreeSet<String>,
) {
    let Some(before) = old.cache.endpoints.get() else {
        return;
    };
    let all = push
        .clusters
        .iter()
        .filter_map(|(name, at)| {
            let host = &push.services.get(at.service)?.hostname;
            if !changed.contains(host)
                && let Some(kept) = before.get(name)
            {
                return Some((name.clone(), kept.clone()));
            }
            named(push, name)
        })
        .collect();
    let _ = push.cache.endpoints.set(all);
}

/// The assignment of `cluster` for a proxy on network `net`, when some of its endpoints are on
/// another network (None otherwise: the shared or locality assignment holds), as istiod's
/// network filter makes it: endpoints on the proxy's network (or on none) as they are; those of
/// another network replaced by that network's east-west gateways at
/// `registry::NETWORK_GATEWAY_PORT`, each weighted by the endpoints it stands for and carrying
/// their TLS metadata (mTLS goes end to end, the gateway passes it through by SNI); those of a
/// network without a gateway left out (unreachable). One locality group (locality load
/// balancing does not apply across networks here).
fn network_view(push: &PushContext, cluster: &str, net: &str) -> Option<Named> {
    let (svc, _, subset) = resolve(push, cluster)?;
    let remote = |ep: &crate::model::Endpoint| !ep.network.is_empty() && ep.network != net;
    if !svc
        .endpoints
        .iter()
        .filter(|ep| subset.is_none_or(|s| s.selects(ep)))
        .any(remote)
    {
        return None;
    }
    let key = format!("{cluster}\0network\0{net}");
    Some(push.cache.localized(&key, || {
        let mut lb = Vec::new();
        let mut others: std::collections::BTreeMap<&str, (u32, bool)> = Default::default();
        for m in members(push, cluster).into_iter().flatten() {
            if remote(m.endpoint) {
                let e = others.entry(m.endpoint.network.as_str()).or_default();
                e.0 += m.endpoint.weight.max(1);
                e.1 |= m.lb.metadata.is_some();
            } else {
                lb.push(m.lb);
            }
        }
        for (network, (weight, mtls)) in others {
            for gw in push.network_gateways.get(network).into_iter().flatten() {
                lb.push(LbEndpoint {
                    metadata: mtls.then(tls::istio_endpoint_metadata),
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(socket_address(
                            &gw.to_string(),
                            crate::registry::NETWORK_GATEWAY_PORT,
                        )),
                        ..Default::default()
                    })),
                    health_status: HealthStatus::Healthy.into(),
                    load_balancing_weight: Some(UInt32Value { value: weight }),
                });
            }
        }
        let weight: u32 = lb
            .iter()
            .map(|e| e.load_balancing_weight.as_ref().map_or(1, |w| w.value))
            .sum();
        let cla = ClusterLoadAssignment {
            cluster_name: cluster.to_string(),
            endpoints: vec![LocalityLbEndpoints {
                load_balancing_weight: (weight > 0).then_some(UInt32Value { value: weight }),
                lb_endpoints: lb,
                ..Default::default()
            }],
            ..Default::default()
        };
        Named::new(cluster.to_string(), pack_any(cla))
    }))
}

/// The requested assignments for `proxy`; an unknown cluster gets an empty assignment so Envoy
/// stops waiting. A cluster under locality load balancing gets the proxy's own (see
/// `locality`), cached by what it depends on.
pub fn generate(push: &PushContext, proxy: &Proxy, names: &[impl AsRef<str>]) -> Vec<Named> {
    // The shared assignments, made on the first cluster that is not the proxy's own.
    let mut shared = None;
    // The proxy's locality and labels, worked out on the first planned cluster.
    let mut whereabouts: Option<(String, std::collections::BTreeMap<String, String>)> = None;
    names
        .iter()
        .map(|name| {
            let name = name.as_ref();
            if !proxy.network().is_empty()
                && let Some(view) = network_view(push, name, proxy.network())
            {
                return view;
            }
            if let Some(plan) = plan(push, name) {
                let (loc, labels) = whereabouts.get_or_insert_with(|| {
                    let loc = locality::proxy_locality(push, proxy);
                    let labels = locality::proxy_labels(push, proxy, &loc);
                    (loc, labels)
                });
                let key = format!("{name}\0{}", locality::key(&plan, loc, labels));
                let make = || {
                    let members = members(push, name).into_iter().flatten().collect();
                    let cla =
                        locality::assignment(&plan, name, members, loc, labels, &push.cluster_id);
                    Named::new(name.to_string(), pack_any(cla))
                };
                return push.cache.localized(&key, make);
            }
            let all = shared.get_or_insert_with(|| {
                push.cache
                    .get(&push.cache.endpoints, "endpoint assignments", || {
                        all_assignments(push)
                    })
            });
            all.get(name).cloned().unwrap_or_else(|| {
                Named::new(
                    name.to_string(),
                    pack_any(ClusterLoadAssignment {
                        cluster_name: name.to_string(),
                        ..Default::default()
                    }),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_store::{ConfigSet, parse_file};

    fn snapshot(second_ip: &str) -> PushContext {
        let yaml = format!(
            "kind: Service\nmetadata: {{name: a, namespace: n}}\nspec: {{clusterIP: 10.96.0.1, ports: [{{name: http, port: 80}}]}}\n---\nkind: Endpoints\nmetadata: {{name: a, namespace: n}}\nsubsets: [{{addresses: [{{ip: 10.1.0.1}}], ports: [{{name: http, port: 8080}}]}}]\n---\nkind: Service\nmetadata: {{name: b, namespace: n}}\nspec: {{clusterIP: 10.96.0.2, ports: [{{name: http, port: 80}}]}}\n---\nkind: Endpoints\nmetadata: {{name: b, namespace: n}}\nsubsets: [{{addresses: [{{ip: {second_ip}}}], ports: [{{name: http, port: 8080}}]}}]\n"
        );
        let set = ConfigSet {
            resources: parse_file(std::path::Path::new("e.yaml"), &yaml)
                .unwrap_or_else(|e| panic!("{e}")),
        };
        let mut push = PushContext::build(std::sync::Arc::new(set), "cluster.local", "1".into())
            .unwrap_or_else(|e| panic!("{e}"));
        push.cache = crate::push_context::GenCache::checked();
        push
    }

    /// An endpoints-only change shares the unchanged clusters' assignments with the old
    /// snapshot and generates the changed one; the checked cache compares it all with a full
    /// generation.
    #[test]
    fn an_endpoint_change_regenerates_only_its_clusters() {
        let old = snapshot("10.1.0.2");
        let a = "outbound|80||a.n.svc.cluster.local";
        let b = "outbound|80||b.n.svc.cluster.local";
        let proxy = Proxy::from_node_id("sidecar~10.1.0.50~c.n~n.svc.cluster.local").unwrap();
        let before = generate(&old, &proxy, &[a, b]);
        let new = snapshot("10.1.0.9");
        let crate::push_context::Change::Endpoints(hosts) = new.change_from(&old) else {
            panic!("not an endpoints-only change");
        };
        assert_eq!(hosts.iter().collect::<Vec<_>>(), ["b.n.svc.cluster.local"]);
        carry_over(&new, &old, &hosts);
        let after = generate(&new, &proxy, &[a, b]);
        assert!(
            std::sync::Arc::ptr_eq(&before[0].resource, &after[0].resource),
            "a shared"
        );
        assert!(!std::sync::Arc::ptr_eq(
            &before[1].resource,
            &after[1].resource
        ));
        let cla =
            <ClusterLoadAssignment as prost::Message>::decode(after[1].resource.value.as_slice())
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(format!("{cla:?}").contains("10.1.0.9"), "{cla:?}");
    }

    /// Endpoints on another network than the proxy's go through that network's east-west
    /// gateway (weighted by the endpoints it stands for, with their mTLS metadata); a network
    /// without a gateway is unreachable; a proxy of no network, or of theirs, gets them as they
    /// are.
    #[test]
    fn endpoints_of_other_networks_go_through_their_gateways() {
        let yaml = "kind: ServiceEntry\nmetadata: {name: s, namespace: n}\nspec: {hosts: [s.example], addresses: [240.0.0.1], ports: [{number: 80, name: http}], workloadSelector: {labels: {app: s}}}\n---\nkind: WorkloadEntry\nmetadata: {name: here, namespace: n}\nspec: {address: 10.0.0.1, labels: {app: s}, serviceAccount: s, network: n1}\n---\nkind: WorkloadEntry\nmetadata: {name: there, namespace: n}\nspec: {address: 10.0.0.2, labels: {app: s}, serviceAccount: s, network: n2}\n---\nkind: WorkloadEntry\nmetadata: {name: there2, namespace: n}\nspec: {address: 10.0.0.3, labels: {app: s}, serviceAccount: s, network: n2}\n---\nkind: Service\nmetadata: {name: eastwest, namespace: istio-system, labels: {topology.istio.io/network: n2}}\nspec: {clusterIP: 10.96.0.9, externalIPs: [192.0.2.20], ports: [{name: tls, port: 15443}]}\n";
        let set = ConfigSet {
            resources: parse_file(std::path::Path::new("e.yaml"), yaml)
                .unwrap_or_else(|e| panic!("{e}")),
        };
        let mut push = PushContext::build(std::sync::Arc::new(set), "cluster.local", "1".into())
            .unwrap_or_else(|e| panic!("{e}"));
        push.cache = crate::push_context::GenCache::checked();
        let cluster = "outbound|80||s.example";
        let view = |network: &str| {
            let mut proxy =
                Proxy::from_node_id("sidecar~10.0.0.50~c.n~n.svc.cluster.local").unwrap();
            if !network.is_empty() {
                proxy.metadata.insert("NETWORK".into(), network.into());
            }
            let named = generate(&push, &proxy, &[cluster]);
            let cla = <ClusterLoadAssignment as prost::Message>::decode(
                named[0].resource.value.as_slice(),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let mut out: Vec<String> = cla
                .endpoints
                .iter()
                .flat_map(|g| &g.lb_endpoints)
                .map(|e| {
                    let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                        panic!("{e:?}")
                    };
                    let a = format!("{:?}", ep.address);
                    let ip = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "192.0.2.20"]
                        .into_iter()
                        .find(|ip| a.contains(ip))
                        .unwrap_or("?");
                    let port = if a.contains("15443") { ":15443" } else { "" };
                    let w = e.load_balancing_weight.as_ref().map_or(1, |w| w.value);
                    let tls = if e.metadata.is_some() { " mtls" } else { "" };
                    format!("{ip}{port} w{w}{tls}")
                })
                .collect();
            out.sort();
            out
        };
        assert_eq!(
            view(""),
            ["10.0.0.1 w1 mtls", "10.0.0.2 w1 mtls", "10.0.0.3 w1 mtls"]
        );
        assert_eq!(
            view("n2"),
            ["10.0.0.2 w1 mtls", "10.0.0.3 w1 mtls"],
            "n1 has no gateway"
        );
        assert_eq!(view("n1"), ["10.0.0.1 w1 mtls", "192.0.2.20:15443 w2 mtls"]);
        assert_eq!(view("n3"), ["192.0.2.20:15443 w2 mtls"]);
    }
}
