//! The debug HTTP port of `istiod-core serve` (istiod's 15014 `/debug/*`):
//! - `/debug/syncz`: per connected proxy and type, the version last sent and last ACKed, and the
//!   last NACK's error;
//! - `/debug/configz`: the config resources in force (kind, metadata, spec);
//! - `/debug/registryz`: the services and endpoints built from them.
//!
//! JSON only, read only; bind it to loopback unless the network is trusted.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use tokio::net::TcpListener;

use crate::ControlPlane;
use crate::xds_server::XdsServer;

fn json(value: serde_json::Value) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(&value).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn route(path: &str, cp: &ControlPlane, xds: &XdsServer) -> Response<Full<Bytes>> {
    let push = cp.snapshot();
    match path {
        "/debug/syncz" => json(serde_json::to_value(xds.syncz()).unwrap_or_default()),
        // Each resource with the warnings about it: what it asks for and is not acted on.
        "/debug/configz" => json(serde_json::Value::Array(
            push.config
                .resources
                .iter()
                .map(|r| {
                    let mut v = r.to_json();
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
                    v
                })
                .collect(),
        )),
        "/debug/registryz" => json(serde_json::json!({
            "version": push.version,
            "services": push.services,
        })),
        _ => {
            let mut resp = Response::new(Full::new(Bytes::from_static(
                b"not found: /debug/syncz, /debug/configz, /debug/registryz\n",
            )));
            *resp.status_mut() = StatusCode::NOT_FOUND;
            resp
        }
    }
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
        listener,
        mesh_common::side_port::Limits::default(),
        move |_, req| {
            let resp = route(req.uri().path(), &cp, &xds);
            async move { resp }
        },
        shutdown,
    )
    .await;
}
