//! Generators: turn the PushContext snapshot into Envoy resources for one proxy, one xDS type
//! each (istiod's `pilot/pkg/networking/core` and `pilot/pkg/xds/*gen.go`). Pure functions of
//! (snapshot, proxy, requested names); the xDS server decides when to call them.
//!
//! Each feature has its room; rooms share only what lies below them (`blocks`, `tls`,
//! `listener`), never each other's upper parts. [`generate`] is the one entry: it picks the
//! generator for a type, and makes the sidecar/router choice once (a router's listeners and
//! routes come from `gateway`, a sidecar's from `lds` and `route`).

pub mod authn;
pub mod authz;
pub mod blocks;
pub mod cds;
pub mod cluster_policy;
pub mod eds;
pub mod ext_authz;
pub mod gateway;
pub mod lds;
pub mod listener;
pub mod locality;
pub mod nds;
pub mod route;
pub mod telemetry;
pub mod tls;

use std::sync::Arc;

use crate::model::Proxy;
use crate::push_context::PushContext;
use crate::resource::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, Named, ROUTE_TYPE, SECRET_TYPE};

/// Resources of `type_url` for `proxy` (`names`: the ones it asked for, where the type is
/// named), or `None` for a type generated elsewhere or not served.
pub fn generate(
    push: &PushContext,
    proxy: &Proxy,
    type_url: &str,
    names: &[Arc<str>],
) -> Option<Vec<Named>> {
    Some(match type_url {
        CLUSTER_TYPE => cds::generate(push, proxy),
        ENDPOINT_TYPE => eds::generate(push, proxy, names),
        LISTENER_TYPE => listeners(push, proxy),
        ROUTE_TYPE => routes(push, proxy, names),
        istio_proto::nds::TYPE_URL => nds::generate(push, proxy),
        SECRET_TYPE => gateway::secrets(push, proxy, names),
        _ => return None,
    })
}

/// `proxy`'s listeners: a router's from the Gateways that select it, a sidecar's from the
/// services it sees.
pub fn listeners(push: &PushContext, proxy: &Proxy) -> Vec<Named> {
    if proxy.is_router() {
        gateway::listeners(push, proxy)
    } else {
        lds::generate(push, proxy)
    }
}

/// `proxy`'s route configurations `names`, a router's or a sidecar's.
pub fn routes(push: &PushContext, proxy: &Proxy, names: &[impl AsRef<str>]) -> Vec<Named> {
    if proxy.is_router() {
        gateway::routes(push, proxy, names)
    } else {
        route::generate(push, proxy, names)
    }
}
