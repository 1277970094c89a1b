//! EDS: a ClusterLoadAssignment for each requested `outbound|PORT||HOST` cluster.

use envoy_types::pb::envoy::config::core::v3::Locality;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::util::pack_any;

use super::{Named, socket_address, tls};
use crate::push_context::PushContext;

fn assignment(push: &PushContext, cluster: &str) -> Option<ClusterLoadAssignment> {
    let at = push.clusters.get(cluster)?;
    let svc = push.services.get(at.service)?;
    let port = svc.ports.get(at.port)?;
    let subset = match at.subset {
        Some(i) => Some(push.subsets.get(&svc.hostname)?.get(i)?),
        None => None,
    };
    // One group per locality, in locality order (the endpoints' order within each).
    let mut by_locality: std::collections::BTreeMap<&str, Vec<LbEndpoint>> = Default::default();
    for ep in svc
        .endpoints
        .iter()
        .filter(|ep| subset.is_none_or(|s| s.selects(ep)))
    {
        let lb = LbEndpoint {
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
            ..Default::default()
        };
        by_locality.entry(&ep.locality).or_default().push(lb);
    }
    let mut endpoints: Vec<LocalityLbEndpoints> = by_locality
        .into_iter()
        .map(|(locality, lb_endpoints)| LocalityLbEndpoints {
            locality: locality_of(locality),
            lb_endpoints,
            ..Default::default()
        })
        .collect();
    if endpoints.is_empty() {
        endpoints.push(LocalityLbEndpoints::default());
    }
    Some(ClusterLoadAssignment {
        cluster_name: cluster.to_string(),
        endpoints,
        ..Default::default()
    })
}

/// Envoy's locality of `region/zone/subzone` (none for an empty one).
fn locality_of(locality: &str) -> Option<Locality> {
    if locality.is_empty() {
        return None;
    }
    let mut parts = locality.splitn(3, '/');
    let mut next = || parts.next().unwrap_or_default().to_string();
    Some(Locality {
        region: next(),
        zone: next(),
        sub_zone: next(),
    })
}

/// The requested assignments; an unknown cluster gets an empty assignment so Envoy stops waiting.
pub fn generate(push: &PushContext, names: &[impl AsRef<str>]) -> Vec<Named> {
    let all = push
        .cache
        .get(&push.cache.endpoints, "endpoint assignments", || {
            push.clusters
                .keys()
                .filter_map(|name| {
                    let cla = assignment(push, name)?;
                    Some((name.clone(), Named::new(name.clone(), pack_any(cla))))
                })
                .collect()
        });
    names
        .iter()
        .map(|name| {
            let name = name.as_ref();
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
