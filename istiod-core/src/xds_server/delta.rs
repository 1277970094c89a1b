//! Delta ADS: per type, the resources the proxy holds and their versions, wildcard
//! subscriptions, and the changes a snapshot makes to what it holds.

use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use mesh_common::xds::answer;
use tonic::Status;

use crate::intern;
use crate::model::Proxy;
use crate::push_context::PushContext;
use crate::resource::{ENDPOINT_TYPE, Named};
use crate::wire::Outgoing;

use super::*;

use super::node::*;

/// A Delta request as a stream keeps it (names interned).
pub(super) struct DeltaRequest {
    pub(super) node: Option<envoy_types::pb::envoy::config::core::v3::Node>,
    pub(super) type_url: String,
    pub(super) subscribe: Vec<Arc<str>>,
    pub(super) unsubscribe: Vec<Arc<str>>,
    /// What Envoy already holds (on reconnection): name and our version, if it is one of ours.
    pub(super) initial: Vec<(Arc<str>, Option<u64>)>,
    pub(super) nonce: String,
    pub(super) error: Option<envoy_types::pb::google::rpc::Status>,
}

impl From<DeltaDiscoveryRequest> for DeltaRequest {
    fn from(req: DeltaDiscoveryRequest) -> Self {
        DeltaRequest {
            node: req.node,
            type_url: req.type_url,
            subscribe: intern::intern_all(req.resource_names_subscribe),
            unsubscribe: intern::intern_all(req.resource_names_unsubscribe),
            initial: req
                .initial_resource_versions
                .iter()
                .map(|(name, version)| {
                    (intern::intern(name), u64::from_str_radix(version, 16).ok())
                })
                .collect(),
            nonce: req.response_nonce,
            error: req.error_detail,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct DeltaWatch {
    pub(super) wildcard: bool,
    pub(super) names: std::collections::BTreeSet<Arc<str>>,
    /// What Envoy holds: name → version (`None`: a version that is not ours, from before a
    /// reconnection).
    pub(super) sent: HashMap<Arc<str>, Option<u64>>,
    pub(super) nonce_sent: String,
    /// The first response for a type is sent even when empty, so Envoy's init completes.
    pub(super) responded: bool,
    pub(super) sync: TypeSync,
}

#[derive(Default)]
pub(super) struct DeltaConnection {
    pub(super) proxy: Option<Arc<Proxy>>,
    pub(super) scope: CallerScope,
    pub(super) watches: HashMap<String, DeltaWatch>,
    pub(super) next_nonce: u64,
}

impl StreamState for DeltaConnection {
    type Request = DeltaRequest;
    fn on_request(
        &mut self,
        push: &PushContext,
        req: DeltaRequest,
        stats: &XdsStats,
    ) -> Result<Vec<Outgoing>, Status> {
        self.handle(push, req, stats)
    }
    /// Delta sends only what changed anyway: `only` adds nothing.
    fn on_push(
        &mut self,
        push: &PushContext,
        type_url: &str,
        _only: Option<&Names>,
    ) -> Option<Outgoing> {
        self.response(push, type_url, false)
    }
    fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_deref()
    }
    fn health_report(&self, req: &DeltaRequest) -> Option<Result<(), String>> {
        super::health_report(&req.type_url, req.error.as_ref())
    }
    /// istioctl asks its debug types over state of the world only.
    fn debug_ask(&self, _: &DeltaRequest) -> Option<(String, Vec<Arc<str>>)> {
        None
    }
    fn scope(&self) -> &CallerScope {
        &self.scope
    }
    fn watches_any(&self, type_url: &str, names: &std::collections::BTreeSet<String>) -> bool {
        self.watches.get(type_url).is_some_and(|w| {
            w.names
                .iter()
                .chain(w.sent.keys())
                .any(|n| names.contains(&**n))
        })
    }
    fn sync(&self) -> Option<ProxySync> {
        proxy_sync(
            self.proxy.as_ref(),
            true,
            &self.watches,
            |w| &w.sync,
            |w| w.names.iter().cloned().collect(),
        )
    }
}

impl DeltaConnection {
    pub(super) fn handle(
        &mut self,
        push: &PushContext,
        req: DeltaRequest,
        stats: &XdsStats,
    ) -> Result<Vec<Outgoing>, Status> {
        identify(&mut self.proxy, req.node.as_ref(), &self.scope)?;
        let first = !self.watches.contains_key(&req.type_url);
        let watch = self.watches.entry(req.type_url.clone()).or_default();
        if first {
            watch.wildcard = wildcard_by_default(&req.type_url) && req.subscribe.is_empty();
            watch.sent = req.initial.into_iter().collect();
        }
        let error = req.error.as_ref().map(|e| e.message.as_str());
        let answer = answer(&req.nonce, &watch.nonce_sent, error);
        let proxy = self.proxy.as_deref();
        let subscribed = &watch.names;
        if !watch.sync.record(&answer, &req.type_url, stats, || {
            let names: Vec<Arc<str>> = subscribed.iter().cloned().collect();
            blame(push, proxy, &req.type_url, &names)
        }) {
            return Ok(Vec::new());
        }
        let mut changed = first;
        for name in req.subscribe {
            if &*name == "*" {
                changed |= !watch.wildcard;
                watch.wildcard = true;
            } else {
                changed |= watch.names.insert(name);
            }
        }
        for name in req.unsubscribe {
            if &*name == "*" {
                watch.wildcard = false;
            } else {
                watch.names.remove(&name);
            }
            // Envoy dropped it; forget that it holds it so a resubscribe resends it.
            watch.sent.remove(&name);
        }
        if !changed {
            return Ok(Vec::new());
        }
        let mut out: Vec<Outgoing> = self
            .response(push, &req.type_url, true)
            .into_iter()
            .collect();
        // Clusters re-sent here wait for their endpoints (`forget_endpoints_of`).
        if req.type_url == CLUSTER_TYPE {
            out.extend(self.response(push, ENDPOINT_TYPE, false));
        }
        Ok(out)
    }

    pub(super) fn response(
        &mut self,
        push: &PushContext,
        type_url: &str,
        requested: bool,
    ) -> Option<Outgoing> {
        let proxy = self.proxy.as_ref()?;
        let watch = self.watches.get_mut(type_url)?;
        let names: Vec<Arc<str>> = watch.names.iter().cloned().collect();
        let generated = generate(push, proxy, type_url, &names)?;
        let wanted = |name: &str| watch.wildcard || watch.names.contains(name);
        let generated: Vec<Named> = generated.into_iter().filter(|n| wanted(&n.name)).collect();
        // What Envoy holds and we no longer generate goes away.
        let mut removed: Vec<Arc<str>> = {
            let present: std::collections::HashSet<&str> =
                generated.iter().map(|n| n.name.as_str()).collect();
            watch
                .sent
                .keys()
                .filter(|n| !present.contains(&***n))
                .cloned()
                .collect()
        };
        removed.sort();
        for name in &removed {
            watch.sent.remove(name);
        }
        // Only what changed is sent. A name is interned when Envoy first gets it, not on
        // every push.
        let mut resources = Vec::new();
        for named in generated {
            let version = resource_version(&named.resource);
            match watch.sent.get_mut(named.name.as_str()) {
                Some(held) if *held == Some(version) => continue,
                Some(held) => *held = Some(version),
                None => {
                    watch
                        .sent
                        .insert(intern::intern(&named.name), Some(version));
                }
            }
            resources.push((named.name, format!("{version:016x}"), named.resource));
        }
        if resources.is_empty() && removed.is_empty() && (watch.responded || !requested) {
            return None;
        }
        watch.responded = true;
        if type_url == CLUSTER_TYPE {
            let names: Vec<&str> = resources.iter().map(|(name, ..)| name.as_str()).collect();
            forget_endpoints_of(&mut self.watches, &names);
        }
        let watch = self.watches.get_mut(type_url)?;
        self.next_nonce += 1;
        let nonce = format!("{}-{}", push.version, self.next_nonce);
        let out = Outgoing::delta(&push.version, type_url, &nonce, resources, &removed);
        watch.nonce_sent = nonce;
        watch.sync.sent = Some(push.version.clone());
        watch.sync.sent_at = Some(std::time::SystemTime::now());
        Some(out)
    }
}

/// Envoy finishes warming an updated EDS cluster only when it receives the cluster's
/// ClusterLoadAssignment again, changed or not (Envoy's xDS protocol notes on resource warming);
/// until then it keeps the previous cluster, and the new settings never apply. So whenever
/// `clusters` are sent, what Envoy holds of their endpoints is forgotten, and the next EDS
/// response (the one that follows in the same push, or with the request's answer) re-sends
/// them. Only the clusters sent: an unchanged cluster keeps its endpoints unsent. Our EDS
/// clusters name their endpoints after themselves (empty `service_name`, or the same name).
pub(super) fn forget_endpoints_of(watches: &mut HashMap<String, DeltaWatch>, clusters: &[&str]) {
    let Some(eds) = watches.get_mut(ENDPOINT_TYPE) else {
        return;
    };
    for name in clusters {
        if let Some(held) = eds.sent.get_mut(*name) {
            *held = None;
        }
    }
}

/// Types for which an empty subscription means "everything" (Envoy's legacy wildcard).
pub(super) fn wildcard_by_default(type_url: &str) -> bool {
    matches!(
        type_url,
        CLUSTER_TYPE | LISTENER_TYPE | istio_proto::nds::TYPE_URL
    )
}

/// A resource's version: a digest of its encoded bytes, so an unchanged resource is not resent.
/// Sent to Envoy as 16 hex digits.
pub(super) fn resource_version(resource: &envoy_types::pb::google::protobuf::Any) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    resource.value.hash(&mut h);
    h.finish()
}
