//! NDS: the DNS name table for the agent's DNS proxy (type
//! `istio.networking.nds.v1.NameTable`): every service hostname with its virtual IPs (for a
//! proxy that captures DNS, an address-less ServiceEntry host's auto-allocated ones of the
//! proxy's families, as `External`), and for
//! Kubernetes services the short name and namespace so the agent can answer `name`,
//! `name.namespace` and `name.namespace.svc` within the cluster domain.

use envoy_types::pb::google::protobuf::Any;
use istio_proto::nds::{NameTable, name_table::NameInfo};
use prost::Message;

use crate::model::Proxy;
use crate::push_context::PushContext;
use crate::resource::Named;

/// The table for `proxy`: under a Sidecar resource, only its egress hosts.
pub fn generate(push: &PushContext, proxy: &Proxy) -> Vec<Named> {
    let scope = push.sidecar_scope(proxy);
    let mut table = NameTable::default();
    for (svc, ips) in push
        .services
        .iter()
        .filter(|s| scope.as_ref().is_none_or(|sc| sc.sees(s)))
        .map(|s| (s, s.addresses_for(Some(proxy))))
        .filter(|(_, ips)| !ips.is_empty())
    {
        let kube_suffix = format!(".{}.svc.", svc.namespace);
        let (registry, shortname) = match svc.hostname.find(&kube_suffix) {
            Some(i) => ("Kubernetes", svc.hostname[..i].to_string()),
            None => ("External", String::new()),
        };
        table.table.insert(
            svc.hostname.clone(),
            NameInfo {
                ips: ips.iter().map(ToString::to_string).collect(),
                registry: registry.to_string(),
                shortname,
                namespace: svc.namespace.clone(),
                alt_hosts: Vec::new(),
            },
        );
    }
    vec![Named::new(
        String::new(),
        Any {
            type_url: istio_proto::nds::TYPE_URL.to_string(),
            value: table.encode_to_vec(),
        },
    )]
}
