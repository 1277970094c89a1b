//! The debug HTTP port of `istiod-core serve` (istiod's 15014 `/debug/*`):
//! - `/debug/syncz`: per connected proxy and type, the version last sent and last ACKed, and the
//!   last NACK's error; with istiod's fields beside them (`cluster_id`, `proxy_type`,
//!   `istio_version`, `cluster_sent`/`_acked` and the other types', `resources` by type URL with
//!   `sent`, `acked`, `sentTime`, `lastError`);
//! - `/debug/config_dump?proxyID=POD.NAMESPACE`: what that proxy is sent now, as Envoy's admin
//!   `ConfigDump` in istiod's sections (`xds_debug`; secrets' keys redacted); 400 without a
//!   proxyID, 404 when it is not connected here;
//! - `/debug/adsz`: the connected proxies (`totalClients`, `clients` with `connectionId`,
//!   `address`, `labels`, `metadata` and `watches`: the names subscribed, by type URL, EDS's left
//!   out);
//! - `/debug/configz`: the config resources in force (kind, metadata, spec, and `origin`: the
//!   source it came from, `kubernetes`, `file:DIR`, `memory`), then what the last load refused
//!   (`{"rejected": {file, document, object, reason, last_good_kept}, "message"}`); an
//!   EnvoyFilter whose patches a proxy rejects now carries `rejected_by_proxies` (proxy, type,
//!   Envoy's error);
//! - `/debug/registryz`: the services and endpoints built from them;
//! - `/debug/endpointz` (and `/debug/endpointShardz`, the same): istiod's endpoint shards, host →
//!   namespace → `Shards` (`PROVIDER/CLUSTER` → one endpoint per workload and service port, in
//!   istiod's field names) and `ServiceAccounts`;
//! - `/debug/push_status`: istiod's push status, metric → key → `{message}` (`{}`: nothing wrong).
//!
//! JSON only, read only; bind it to loopback unless the network is trusted.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use tokio::net::TcpListener;

use crate::xds_server::XdsServer;
use crate::{ControlPlane, config_store};

fn json(value: serde_json::Value) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(&value).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(format!("{body}\n"))));
    *resp.status_mut() = status;
    resp
}

/// One query parameter's value.
fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn route(uri: &hyper::Uri, cp: &ControlPlane, xds: &XdsServer) -> Response<Full<Bytes>> {
    let push = cp.snapshot();
    match uri.path() {
        "/debug/syncz" => json(serde_json::Value::Array(
            xds.syncz().iter().map(syncz_entry).collect(),
        )),
        "/debug/config_dump" => match query_param(uri.query(), "proxyID").filter(|p| !p.is_empty())
        {
            None => text(
                StatusCode::BAD_REQUEST,
                "You must provide a proxyID in the query string",
            ),
            Some(id) => match xds.config_dump(id) {
                None => text(
                    StatusCode::NOT_FOUND,
                    "Proxy not connected to this Pilot instance. It may be connected to another instance.",
                ),
                Some(sections) => {
                    let configs: Result<Vec<serde_json::Value>, String> =
                        sections.iter().map(crate::envoy_proto::any_json).collect();
                    match configs {
                        Ok(configs) => json(serde_json::json!({ "configs": configs })),
                        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e),
                    }
                }
            },
        },
        "/debug/adsz" => {
            let clients: Vec<serde_json::Value> = xds.syncz().iter().map(adsz_client).collect();
            json(serde_json::json!({ "totalClients": clients.len(), "clients": clients }))
        }
        // Each resource with the warnings about it: what it asks for and is not acted on.
        "/debug/configz" => {
            let rejections = envoy_filter_rejections(xds);
            let mut all: Vec<serde_json::Value> = push
                .config
                .resources
                .iter()
                .map(|r| {
                    let mut v = r.to_json();
                    if let Some(origin) = cp.origin_of(r) {
                        v["origin"] = origin.into();
                    }
                    let m = r.metadata();
                    let prefix = format!("{} {}/{}: ", r.kind(), m.namespace(), m.name);
                    let warnings: Vec<&str> = push
                        .warnings
                        .iter()
                        .filter_map(|w| w.strip_prefix(&prefix))
                        .collect();
                    if !warnings.is_empty() {
                        v["warnings"] = serde_json::json!(warnings);
                    }
                    if let config_store::Resource::EnvoyFilter(..) = r
                        && let Some(nacks) =
                            rejections.get(&format!("{}/{}", m.namespace(), m.name))
                    {
                        v["rejected_by_proxies"] = serde_json::json!(nacks);
                    }
                    v
                })
                .collect();
            // What was refused, after what is in force: file, document, object, reason and
            // whether its last good version is among the above.
            all.extend(
                cp.rejected()
                    .iter()
                    .map(|r| serde_json::json!({ "rejected": r, "message": r.to_string() })),
            );
            json(serde_json::Value::Array(all))
        }
        "/debug/registryz" => json(serde_json::json!({
            "version": push.version,
            "services": push.services,
        })),
        "/debug/endpointz" | "/debug/endpointShardz" => json(endpoint_shards(&push)),
        // Ours: the auto-registered WorkloadEntries, their health reports and whether each is
        // an endpoint now (istiod keeps this in the entries' `Healthy` condition).
        "/debug/autoregistrationz" => json(serde_json::json!(cp.auto_registration().entries())),
        "/debug/push_status" => json(push_status(&push)),
        _ => {
            let mut resp = Response::new(Full::new(Bytes::from_static(
                b"not found: /debug/syncz, /debug/config_dump?proxyID=, /debug/adsz, /debug/configz, /debug/registryz, /debug/endpointz, /debug/endpointShardz, /debug/push_status, /debug/autoregistrationz\n",
            )));
            *resp.status_mut() = StatusCode::NOT_FOUND;
            resp
        }
    }
}

/// istiod's `/debug/endpointz` (= `endpointShardz`): service host → namespace → `Shards`
/// (`PROVIDER/CLUSTER` → one endpoint per workload and service port, in istiod's field names)
/// and `ServiceAccounts` (a set, as Go writes one: name → `{}`). A service without endpoints has
/// no shard, so no entry.
fn endpoint_shards(push: &crate::push_context::PushContext) -> serde_json::Value {
    let (trust_domain, cluster_id) = (push.trust_domain.as_str(), push.cluster_id.as_str());
    use crate::model::{Registry, TlsMode};
    let mut out = serde_json::Map::new();
    for svc in push.services.iter().filter(|s| !s.endpoints.is_empty()) {
        let provider = match svc.registry {
            Registry::Kubernetes => "Kubernetes",
            Registry::External => "External",
        };
        let mut accounts = serde_json::Map::new();
        let mut endpoints = Vec::new();
        for ep in &svc.endpoints {
            // A Kubernetes endpoint without its pod (no workload namespace) has no identity.
            let account = if ep.workload.namespace.is_empty() {
                String::new()
            } else {
                crate::model::spiffe_id(trust_domain, &ep.workload.namespace, &ep.service_account)
            };
            if !account.is_empty() {
                accounts.insert(account.clone(), serde_json::json!({}));
            }
            let labels = crate::model::endpoint_labels(ep, cluster_id);
            for port in &svc.ports {
                endpoints.push(serde_json::json!({
                    "Labels": labels,
                    "Addresses": [ep.address.to_string()],
                    "ServicePortName": port.name,
                    "LegacyClusterPortKey": 0,
                    "ServiceAccount": account,
                    "Network": "",
                    "Locality": {"Label": ep.locality, "ClusterID": cluster_id},
                    "EndpointPort": ep.target_port(port),
                    "LbWeight": 0,
                    "TLSMode": match ep.tls_mode {
                        TlsMode::Istio => "istio",
                        TlsMode::Disabled => "disabled",
                    },
                    "Namespace": ep.workload.namespace,
                    "WorkloadName": ep.workload.name,
                    "HostName": "",
                    "SubDomain": "",
                    // Only ready endpoints are kept: each is healthy (istiod's `Healthy`, 1).
                    "HealthStatus": 1,
                    "SendUnhealthyEndpoints": false,
                    "NodeName": ep.workload.node,
                }));
            }
        }
        let shard = serde_json::json!({
            "Shards": { format!("{provider}/{cluster_id}"): endpoints },
            "ServiceAccounts": accounts,
        });
        let by_ns = out
            .entry(svc.hostname.clone())
            .or_insert_with(|| serde_json::json!({}));
        by_ns[&svc.namespace] = shard;
    }
    serde_json::Value::Object(out)
}

/// istiod's `/debug/push_status`: what the last push found wrong, by istiod's metric name, then
/// by key: `{proxy, message}` (`{}` when nothing is).
fn push_status(push: &crate::push_context::PushContext) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for st in &push.status {
        let by_key = out
            .entry(st.metric.to_string())
            .or_insert_with(|| serde_json::json!({}));
        by_key[&st.key] = serde_json::json!({ "message": st.message });
    }
    serde_json::Value::Object(out)
}

/// The short names istiod's syncz gives the four main types (`cluster_sent` ...).
const SYNCZ_SHORT: [(&str, &str); 5] = [
    (crate::resource::CLUSTER_TYPE, "cluster"),
    (crate::resource::LISTENER_TYPE, "listener"),
    (crate::resource::ROUTE_TYPE, "route"),
    (crate::resource::ENDPOINT_TYPE, "endpoint"),
    (crate::resource::EXTENSION_CONFIG_TYPE, "extensionconfig"),
];

/// One proxy of `/debug/syncz`: ours (`proxy`, `delta`, `types`) and istiod's fields.
fn syncz_entry(p: &crate::xds_server::ProxySync) -> serde_json::Value {
    let mut v = serde_json::to_value(p).unwrap_or_default();
    let Some(obj) = v.as_object_mut() else {
        return v;
    };
    if let Some(node) = &p.node {
        if let Some(c) = node.metadata.get("CLUSTER_ID") {
            obj.insert("cluster_id".into(), c.clone().into());
        }
        if let Some(ver) = node.metadata.get("ISTIO_VERSION") {
            obj.insert("istio_version".into(), ver.clone().into());
        }
        obj.insert("proxy_type".into(), node.kind.clone().into());
    }
    for (type_url, short) in SYNCZ_SHORT {
        if let Some(t) = p.types.get(type_url) {
            for (suffix, value) in [("sent", &t.sent), ("acked", &t.acked)] {
                if let Some(value) = value {
                    obj.insert(format!("{short}_{suffix}"), value.clone().into());
                }
            }
        }
    }
    let resources: serde_json::Map<String, serde_json::Value> = p
        .types
        .iter()
        .map(|(type_url, t)| {
            let mut r = serde_json::Map::new();
            r.insert("sent".into(), t.sent.clone().unwrap_or_default().into());
            r.insert("acked".into(), t.acked.clone().unwrap_or_default().into());
            if let Some(at) = t.sent_at {
                r.insert("sentTime".into(), rfc3339(at).into());
            }
            if let Some(e) = t.nacked.as_ref().filter(|_| t.rejecting) {
                r.insert("lastError".into(), e.clone().into());
            }
            (type_url.clone(), serde_json::Value::Object(r))
        })
        .collect();
    obj.insert("resources".into(), serde_json::Value::Object(resources));
    v
}

/// One connected proxy of `/debug/adsz`, in istiod's shape.
fn adsz_client(p: &crate::xds_server::ProxySync) -> serde_json::Value {
    let watches: serde_json::Map<String, serde_json::Value> = p
        .types
        .iter()
        .map(|(t, s)| {
            (
                t.clone(),
                serde_json::json!(s.names.iter().map(|n| &**n).collect::<Vec<_>>()),
            )
        })
        .collect();
    let node = p.node.as_deref();
    serde_json::json!({
        "connectionId": p.proxy,
        "address": node.and_then(|n| n.ip_addresses.first()).map(|a| a.to_string()),
        "labels": node.map(|n| &n.labels),
        "metadata": node.map(|n| &n.metadata),
        "watches": watches,
    })
}

/// `t` as RFC 3339 UTC (`2026-11-27T07:01:02.123Z`).
fn rfc3339(t: std::time::SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The proxies that reject what an EnvoyFilter patched, by `namespace/name`: proxy, type and
/// Envoy's error.
fn envoy_filter_rejections(
    xds: &XdsServer,
) -> std::collections::BTreeMap<String, Vec<serde_json::Value>> {
    let mut out: std::collections::BTreeMap<String, Vec<serde_json::Value>> = Default::default();
    for p in xds.syncz() {
        for (type_url, t) in &p.types {
            for f in &t.nacked_envoy_filters {
                out.entry(f.clone()).or_default().push(serde_json::json!({
                    "proxy": p.proxy,
                    "type": type_url,
                    "error": t.nacked,
                }));
            }
        }
    }
    out
}

/// Serves on the side-port server (its limits, and no spin on accept errors) until `shutdown`
/// resolves.
pub async fn serve(
    listener: TcpListener,
    cp: Arc<ControlPlane>,
    xds: XdsServer,
    shutdown: impl std::future::Future<Output = ()>,
) {
    mesh_common::side_port::serve(
        "debug port",
        listener,
        mesh_common::side_port::Limits::default(),
        move |_, req| {
            let resp = route(req.uri(), &cp, &xds);
            async move { resp }
        },
        shutdown,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(request).await;
        let mut text = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut text))
            .await;
        String::from_utf8_lossy(&text).into_owned()
    }

    /// The debug port is served within the side-port limits: an oversized head gets 431 and an
    /// oversized body 413; a normal request is answered.
    #[tokio::test]
    async fn the_debug_port_enforces_request_limits() {
        let cp = ControlPlane::in_memory("cluster.local").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let xds = cp.xds();
        tokio::spawn(serve(listener, cp, xds, std::future::pending()));

        let head = format!(
            "GET /debug/syncz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(mesh_common::side_port::Limits::default().max_head_bytes)
        );
        let text = exchange(addr, head.as_bytes()).await;
        assert!(text.starts_with("HTTP/1.1 431"), "{text}");
        let text = exchange(
            addr,
            b"GET /debug/syncz HTTP/1.1\r\nHost: x\r\nContent-Length: 10485760\r\n\r\n",
        )
        .await;
        assert!(text.starts_with("HTTP/1.1 413"), "{text}");
        let text = exchange(
            addr,
            b"GET /debug/syncz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    }
}
