//! State-of-the-world ADS: per type, what the proxy subscribed to, the nonce last sent and
//! what it ACKed or NACKed (`mesh_common::xds`), and the response of a type for a snapshot.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use mesh_common::xds::{Answer, Step as SotwStep, Subscription};
use tonic::Status;

use crate::intern;
use crate::model::Proxy;
use crate::push_context::PushContext;
use crate::wire::Outgoing;

use super::*;

use super::node::*;

#[derive(Debug, Default)]
pub(super) struct Watch {
    pub(super) sub: Subscription<Arc<str>>,
    pub(super) sync: TypeSync,
}

impl TypeSync {
    /// Records (and counts, and logs a rejection of) the proxy's answer to our last response
    /// of `type_url`; false when the request is to be ignored (stale, or a NACK). A rejection
    /// is reported against the EnvoyFilters `blame` names.
    pub(super) fn record(
        &mut self,
        answer: &Answer,
        type_url: &str,
        stats: &XdsStats,
        blame: impl FnOnce() -> Vec<String>,
    ) -> bool {
        match answer {
            Answer::Fresh => true,
            Answer::Ack => {
                stats.acks.fetch_add(1, Ordering::Relaxed);
                self.acked = self.sent.clone();
                self.rejecting = false;
                self.nacked_envoy_filters.clear();
                true
            }
            Answer::Nack(why) => {
                stats.nacks.fetch_add(1, Ordering::Relaxed);
                self.nacked_envoy_filters = blame();
                if self.nacked_envoy_filters.is_empty() {
                    tracing::warn!(type_url, error = %why, "proxy rejected config (NACK)");
                } else {
                    tracing::warn!(envoy_filters = ?self.nacked_envoy_filters, type_url, error = %why,
                        "proxy rejected config patched by EnvoyFilters (NACK); it keeps its last accepted config");
                }
                self.nacked = Some(why.clone());
                self.rejecting = true;
                false
            }
            Answer::Stale => false,
        }
    }
}

/// A state-of-the-world request as a stream keeps it: its names interned (`crate::intern`)
/// as soon as it is read, so requests waiting for the push throttle hold no copies.
pub(super) struct SotwRequest {
    pub(super) node: Option<envoy_types::pb::envoy::config::core::v3::Node>,
    pub(super) type_url: String,
    pub(super) names: Vec<Arc<str>>,
    pub(super) nonce: String,
    pub(super) error: Option<envoy_types::pb::google::rpc::Status>,
}

impl From<DiscoveryRequest> for SotwRequest {
    fn from(req: DiscoveryRequest) -> Self {
        SotwRequest {
            node: req.node,
            type_url: req.type_url,
            names: intern::intern_all(req.resource_names),
            nonce: req.response_nonce,
            error: req.error_detail,
        }
    }
}

pub(super) struct Connection {
    pub(super) proxy: Option<Arc<Proxy>>,
    /// Who is on the other end (`CallerScope::of`).
    pub(super) scope: CallerScope,
    pub(super) watches: HashMap<String, Watch>,
    pub(super) next_nonce: u64,
}

impl Connection {
    pub(super) fn response(
        &mut self,
        push: &PushContext,
        type_url: &str,
        only: Option<&Names>,
    ) -> Option<Outgoing> {
        let proxy = self.proxy.as_ref()?;
        let watch = self.watches.get_mut(type_url)?;
        let resources = match only {
            // Envoy keeps the endpoints of the clusters a state-of-the-world EDS response
            // leaves out (EDS is not a full-state type), so the fast path sends the changed
            // ones alone, as istiod's incremental EDS does.
            Some(only) => {
                let names: Vec<Arc<str>> = watch
                    .sub
                    .names
                    .iter()
                    .filter(|n| only.contains(&***n))
                    .cloned()
                    .collect();
                generate(push, proxy, type_url, &names)?
            }
            None => generate(push, proxy, type_url, &watch.sub.names)?,
        };
        self.next_nonce += 1;
        let nonce = format!("{}-{}", push.version, self.next_nonce);
        let out = Outgoing::sotw(
            &push.version,
            type_url,
            &nonce,
            resources.into_iter().map(|n| n.resource).collect(),
        );
        watch.sub.nonce_sent = nonce;
        watch.sync.sent = Some(push.version.clone());
        watch.sync.sent_at = Some(std::time::SystemTime::now());
        Some(out)
    }
}

impl StreamState for Connection {
    type Request = SotwRequest;
    fn on_request(
        &mut self,
        push: &PushContext,
        req: SotwRequest,
        stats: &XdsStats,
    ) -> Result<Vec<Outgoing>, Status> {
        Ok(handle_request(self, push, req, stats)?
            .into_iter()
            .collect())
    }
    fn on_push(
        &mut self,
        push: &PushContext,
        type_url: &str,
        only: Option<&Names>,
    ) -> Option<Outgoing> {
        self.response(push, type_url, only)
    }
    fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_deref()
    }
    fn health_report(&self, req: &SotwRequest) -> Option<Result<(), String>> {
        super::health_report(&req.type_url, req.error.as_ref())
    }
    fn debug_ask(&self, req: &SotwRequest) -> Option<(String, Vec<Arc<str>>)> {
        crate::xds_debug::is_debug(&req.type_url).then(|| (req.type_url.clone(), req.names.clone()))
    }
    fn scope(&self) -> &CallerScope {
        &self.scope
    }
    fn watches_any(&self, type_url: &str, names: &std::collections::BTreeSet<String>) -> bool {
        self.watches
            .get(type_url)
            .is_some_and(|w| w.sub.names.iter().any(|n| names.contains(&**n)))
    }
    fn sync(&self) -> Option<ProxySync> {
        proxy_sync(
            self.proxy.as_ref(),
            false,
            &self.watches,
            |w| &w.sync,
            |w| w.sub.names.clone(),
        )
    }
}

pub(super) fn handle_request(
    conn: &mut Connection,
    push: &PushContext,
    req: SotwRequest,
    stats: &XdsStats,
) -> Result<Option<Outgoing>, Status> {
    identify(&mut conn.proxy, req.node.as_ref(), &conn.scope)?;
    let watch = conn.watches.entry(req.type_url.clone()).or_default();
    let error = req.error.as_ref().map(|e| e.message.as_str());
    let step = watch.sub.on_request(&req.nonce, error, req.names);
    let (SotwStep::Ignore(answer) | SotwStep::Respond(answer)) = &step;
    let names = &watch.sub.names;
    let proxy = conn.proxy.as_deref();
    watch.sync.record(answer, &req.type_url, stats, || {
        blame(push, proxy, &req.type_url, names)
    });
    match step {
        SotwStep::Respond(_) => Ok(conn.response(push, &req.type_url, None)),
        SotwStep::Ignore(_) => Ok(None),
    }
}
