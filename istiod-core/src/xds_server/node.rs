//! Who is on a stream: the proxy its node says it is (id, metadata, labels, tracing sampling),
//! checked against the caller's verified identity, and what that caller may see.

use std::sync::Arc;

use tonic::Status;

use crate::model::Proxy;

use super::*;

/// Who a stream's caller is known to be: in process (trusted: its node's namespace), or the
/// identity of a verified client certificate (none without one, e.g. over plaintext or with a
/// bearer token only). A certificate binds the stream to its namespace (`identify`), and a
/// router reads the Secrets of its namespace only with one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum CallerScope {
    #[default]
    InProcess,
    Verified(Option<mesh_common::identity::Identity>),
}

impl CallerScope {
    pub(super) fn of(caller: &Caller) -> CallerScope {
        match caller {
            Caller::InProcess => CallerScope::InProcess,
            Caller::Peer(identity) => CallerScope::Verified(identity.clone()),
        }
    }
}

/// On a stream's first request, learns which proxy is on the other end from its node id.
pub(super) fn identify(
    proxy: &mut Option<Arc<Proxy>>,
    node: Option<&envoy_types::pb::envoy::config::core::v3::Node>,
    scope: &CallerScope,
) -> Result<(), Status> {
    if proxy.is_none() {
        let node = node.ok_or_else(|| Status::invalid_argument("first request carries no node"))?;
        let mut p =
            Proxy::from_node_id(&node.id).map_err(|e| Status::invalid_argument(e.to_string()))?;
        p.labels = node_labels(node);
        let l = node.locality.as_ref();
        p.locality = Proxy::stated_locality(
            &p.labels,
            [
                l.map(|l| l.region.as_str()).unwrap_or_default(),
                l.map(|l| l.zone.as_str()).unwrap_or_default(),
                l.map(|l| l.sub_zone.as_str()).unwrap_or_default(),
            ],
        );
        p.auto_register_group = node_string(node, "AUTO_REGISTER_GROUP");
        p.health_checked = node_has_readiness_probe(node);
        p.tracing_sampling = node_tracing_sampling(node);
        p.metadata = node_strings(node);
        // Istio's checkConnectionIdentity: a client certificate speaks for its namespace only,
        // so a workload of namespace A cannot ask for B's config (and B's Secrets) by naming B
        // in its node id.
        if let CallerScope::Verified(Some(id)) = scope
            && id.namespace != p.namespace
        {
            tracing::warn!(
                caller = %id,
                proxy = %node.id,
                caller_namespace = %id.namespace,
                proxy_namespace = %p.namespace,
                "xDS stream refused: the client certificate's namespace is not the node id's"
            );
            return Err(Status::permission_denied(format!(
                "the client certificate is {id} (namespace {}), but node id {} names namespace {}",
                id.namespace, node.id, p.namespace
            )));
        }
        p.reads_secrets = match scope {
            CallerScope::InProcess => true,
            CallerScope::Verified(id) => id.is_some(),
        };
        tracing::info!(proxy = %node.id, "xds stream connected");
        *proxy = Some(Arc::new(p));
    }
    Ok(())
}

/// One field of the node metadata.
pub(super) fn node_field<'a>(
    node: &'a envoy_types::pb::envoy::config::core::v3::Node,
    key: &str,
) -> Option<&'a envoy_types::pb::google::protobuf::value::Kind> {
    node.metadata
        .as_ref()
        .and_then(|m| m.fields.get(key))
        .and_then(|v| v.kind.as_ref())
}

/// Whether the node metadata's `PROXY_CONFIG` has a `readinessProbe` (istiod checks only that
/// it is there).
pub(super) fn node_has_readiness_probe(
    node: &envoy_types::pb::envoy::config::core::v3::Node,
) -> bool {
    use envoy_types::pb::google::protobuf::value::Kind;
    matches!(
        node_field(node, "PROXY_CONFIG"),
        Some(Kind::StructValue(pc)) if pc.fields.get("readinessProbe").is_some_and(|v| !matches!(v.kind, None | Some(Kind::NullValue(_))))
    )
}

/// ProxyConfig `tracing.sampling` of the node metadata's `PROXY_CONFIG`, when set (0 or unset:
/// the mesh's, as Istio reads it).
pub(super) fn node_tracing_sampling(
    node: &envoy_types::pb::envoy::config::core::v3::Node,
) -> Option<crate::config_store::values::Percentage> {
    use envoy_types::pb::google::protobuf::value::Kind;
    let Some(Kind::StructValue(pc)) = node_field(node, "PROXY_CONFIG") else {
        return None;
    };
    let Some(Kind::StructValue(tracing)) = pc.fields.get("tracing").and_then(|v| v.kind.as_ref())
    else {
        return None;
    };
    match tracing.fields.get("sampling").and_then(|v| v.kind.as_ref()) {
        // Over 100 is 1%, as Istio reads it.
        Some(Kind::NumberValue(n)) if n.is_finite() && *n > 0.0 => {
            Some(crate::config_store::values::Percentage(if *n > 100.0 {
                1.0
            } else {
                *n
            }))
        }
        _ => None,
    }
}

/// A string field of the node metadata.
pub(super) fn node_string(
    node: &envoy_types::pb::envoy::config::core::v3::Node,
    key: &str,
) -> Option<String> {
    use envoy_types::pb::google::protobuf::value::Kind;
    match node_field(node, key) {
        Some(Kind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// Every string field of the node metadata.
pub(super) fn node_strings(
    node: &envoy_types::pb::envoy::config::core::v3::Node,
) -> std::collections::BTreeMap<String, String> {
    use envoy_types::pb::google::protobuf::value::Kind;
    node.metadata
        .iter()
        .flat_map(|m| &m.fields)
        .filter_map(|(k, v)| match &v.kind {
            Some(Kind::StringValue(s)) => Some((k.clone(), s.clone())),
            _ => None,
        })
        .collect()
}

/// The workload labels the agent puts in its node metadata (`LABELS`, a map of strings).
pub(super) fn node_labels(
    node: &envoy_types::pb::envoy::config::core::v3::Node,
) -> std::collections::BTreeMap<String, String> {
    use envoy_types::pb::google::protobuf::value::Kind;
    let Some(Kind::StructValue(labels)) = node_field(node, "LABELS") else {
        return Default::default();
    };
    labels
        .fields
        .iter()
        .filter_map(|(k, v)| match &v.kind {
            Some(Kind::StringValue(s)) => Some((k.clone(), s.clone())),
            _ => None,
        })
        .collect()
}

/// A gRPC interceptor that, given a token, admits only streams carrying
/// `authorization: Bearer <token>` (compared in constant time); without one it admits all.
pub fn bearer_check(
    token: Option<String>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| {
        let Some(expected) = &token else {
            return Ok(req);
        };
        let got = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let same = got.len() == expected.len()
            && got
                .bytes()
                .zip(expected.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(req)
        } else {
            tracing::warn!("xDS stream refused: missing or wrong bearer token");
            Err(Status::unauthenticated("a valid bearer token is required"))
        }
    }
}
