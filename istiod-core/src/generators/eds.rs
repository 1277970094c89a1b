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
}
