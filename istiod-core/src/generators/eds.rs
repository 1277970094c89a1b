//! EDS: a ClusterLoadAssignment for each requested `outbound|PORT||HOST` cluster.

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
    let lb_endpoints = svc
        .endpoints
        .iter()
        .filter(|ep| subset.is_none_or(|s| s.selects(ep)))
        .map(|ep| LbEndpoint {
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
        })
        .collect();
    Some(ClusterLoadAssignment {
        cluster_name: cluster.to_string(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints,
            ..Default::default()
        }],
        ..Default::default()
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
