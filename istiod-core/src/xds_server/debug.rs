//! The `istio.io/debug` types answered on a stream (istioctl's syncz and config_dump over
//! xDS), and a stream's sync state for /debug/syncz.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::Status;

use crate::model::Proxy;
use crate::push_context::PushContext;
use crate::resource::ENDPOINT_TYPE;
use crate::wire::Outgoing;

use super::*;

use super::node::*;

/// What a config dump shows of `proxy`'s `type_url`: what it is sent, EnvoyFilters applied.
pub(super) fn dump_resources(
    push: &PushContext,
    proxy: &Proxy,
    type_url: &str,
    names: &[Arc<str>],
) -> Option<Vec<Arc<envoy_types::pb::google::protobuf::Any>>> {
    generate(push, proxy, type_url, names).map(|v| v.into_iter().map(|n| n.resource).collect())
}

/// The answer to an `istio.io/debug` request (`xds_debug`) from the caller of `scope`.
pub(super) fn debug_answer(
    shared: &Shared,
    scope: &CallerScope,
    push: &PushContext,
    type_url: &str,
    names: &[Arc<str>],
    nonce: &str,
    identifier: &str,
) -> Result<Outgoing, Status> {
    let viewer = match scope {
        CallerScope::InProcess => crate::xds_debug::Viewer::All,
        CallerScope::Verified(id) => {
            crate::xds_debug::Viewer::of(id.as_ref(), false, push.root_namespace())?
        }
    };
    let syncs: Vec<ProxySync> = shared
        .syncs
        .lock()
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    let generate =
        |proxy: &Proxy, t: &str, names: &[Arc<str>]| dump_resources(push, proxy, t, names);
    crate::xds_debug::answer(
        type_url,
        names,
        &viewer,
        &syncs,
        crate::xds_debug::Stamp {
            version: &push.version,
            nonce,
            identifier,
        },
        &generate,
    )
}

/// A stream's sync state for /debug/syncz, once the proxy is known.
/// The subscribed names are kept for the types a config dump generates by name (routes,
/// secrets, extension configs): not for EDS, whose names (a proxy's every cluster) a dump
/// leaves out, so the sync state costs no copy of them.
pub(super) fn proxy_sync<W>(
    proxy: Option<&Arc<Proxy>>,
    delta: bool,
    watches: &HashMap<String, W>,
    sync: impl Fn(&W) -> &TypeSync,
    names: impl Fn(&W) -> Vec<Arc<str>>,
) -> Option<ProxySync> {
    let proxy = proxy?;
    Some(ProxySync {
        proxy: proxy.id.clone(),
        delta,
        types: watches
            .iter()
            .map(|(t, w)| {
                let mut sync = sync(w).clone();
                if t != ENDPOINT_TYPE {
                    sync.names = names(w);
                }
                (t.clone(), sync)
            })
            .collect(),
        node: Some(proxy.clone()),
    })
}
