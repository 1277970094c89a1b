//! The status server on :15020 (Istio's `pilot/cmd/pilot-agent/status/server.go`):
//! `/healthz/ready` (what Envoy's 15021 listener forwards to) and `POST /quitquitquit`.
//! Control endpoints answer only to loopback peers.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;

use crate::admin;
use crate::drain::{Drain, Shutdown};

/// The DNS table readiness waits for: outer `None` while the DNS proxy is off.
use crate::identity::CertWatch;

pub type DnsReadiness = tokio::sync::watch::Receiver<Option<crate::dns::TableWatch>>;

/// Why the proxy is not ready, as the 503 body names it.
pub async fn readiness(
    admin_port: u16,
    drain: &Drain,
    dns: &DnsReadiness,
    certs: &CertWatch,
) -> Result<(), String> {
    if drain.is_draining() {
        return Err("the proxy is shutting down".into());
    }
    let dns_pending = dns
        .borrow()
        .as_ref()
        .is_some_and(|table| table.borrow().is_none());
    if dns_pending {
        return Err("DNS name table not received from the control plane yet".into());
    }
    let filter = admin::encode_query(
        r"^(cluster_manager\.cds|listener_manager\.lds)\.(update_success|update_rejected)$",
    );
    let stats = admin::get(admin_port, &format!("/stats?usedonly&filter={filter}"))
        .await
        .map_err(|e| format!("Envoy is not answering yet: {e}"))?;
    let stats = admin::parse_stats(&stats);
    let get = |name: &str| stats.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let cds = get("cluster_manager.cds.update_success").unwrap_or(0);
    let lds = get("listener_manager.lds.update_success").unwrap_or(0);
    // Envoy asks for listeners only once its clusters have their certificates: a missing
    // certificate is then the cause of missing config, so it is named first.
    let cert_pending = if certs.borrow().is_none() {
        "workload certificate not issued yet (is the CA reachable?); "
    } else {
        ""
    };
    if cds == 0 || lds == 0 {
        return Err(format!(
            "{cert_pending}config not received from XDS server (is the control plane running?): cds updates: {cds} successful, {} rejected; lds updates: {lds} successful, {} rejected",
            get("cluster_manager.cds.update_rejected").unwrap_or(0),
            get("listener_manager.lds.update_rejected").unwrap_or(0),
        ));
    }
    if !cert_pending.is_empty() {
        return Err(cert_pending.trim_end_matches("; ").to_string());
    }
    let filter = admin::encode_query(r"^(server\.state|listener_manager\.workers_started)$");
    let state = admin::get(admin_port, &format!("/stats?usedonly&filter={filter}"))
        .await
        .map_err(|e| e.to_string())?;
    let state = admin::parse_stats(&state);
    let server_state = state
        .iter()
        .find(|(n, _)| n == "server.state")
        .map(|(_, v)| *v);
    let workers = state
        .iter()
        .find(|(n, _)| n == "listener_manager.workers_started")
        .map(|(_, v)| *v);
    if server_state != Some(0) || workers != Some(1) {
        return Err(format!(
            "Envoy is not live yet: server.state {server_state:?} (0 = LIVE), workers_started {workers:?}"
        ));
    }
    Ok(())
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    r
}

/// `/stats/prometheus`: the merged exposition, streamed.
fn stats(state: &Arc<State>, req: &Request<hyper::body::Incoming>) -> Response<Body> {
    let timeout = req
        .headers()
        .get("x-prometheus-scrape-timeout-seconds")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|t| t.is_finite() && *t > 0.0)
        .map_or(std::time::Duration::from_secs(10), |t| {
            std::time::Duration::from_secs_f64(t.min(300.0))
        });
    let openmetrics = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(crate::metrics::merged(
        state.metrics.clone(),
        crate::metrics::Sources {
            envoy_port: crate::bootstrap::PROMETHEUS_PORT,
            envoy: state.merge_envoy_stats,
            query: req.uri().query().map(str::to_string),
            app: state.app_metrics.clone(),
        },
        timeout,
        openmetrics,
        tx,
    ));
    let body = http_body_util::StreamBody::new(
        tokio_stream::wrappers::ReceiverStream::new(rx)
            .map(|b| Ok::<_, Infallible>(hyper::body::Frame::data(b))),
    );
    let mut r = Response::new(BodyExt::boxed(body));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(if openmetrics {
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        } else {
            "text/plain; version=0.0.4; charset=utf-8"
        }),
    );
    r
}

/// What the status server needs: Envoy's admin port, the shutdown trigger, and the agent's
/// parsed config for `/debug/config`.
pub struct State {
    admin_port: u16,
    drain: Drain,
    config_dump: String,
    probes: std::collections::BTreeMap<String, crate::config::probes::Probe>,
    probe_target: std::net::IpAddr,
    metrics: Arc<crate::metrics::Metrics>,
    app_metrics: Option<crate::config::metrics::AppMetrics>,
    merge_envoy_stats: bool,
    dns: DnsReadiness,
    certs: CertWatch,
    xds_adapt: Option<Arc<crate::xds_adapt::Adapter>>,
}

impl State {
    pub fn new(
        cfg: &crate::config::Config,
        drain: Drain,
        metrics: Arc<crate::metrics::Metrics>,
        dns: DnsReadiness,
        certs: CertWatch,
    ) -> State {
        State {
            admin_port: cfg.admin_port,
            drain,
            config_dump: format!("{cfg:#?}\n"),
            probes: cfg.app_probes.clone(),
            probe_target: cfg.probe_target,
            metrics,
            app_metrics: cfg.app_metrics.clone(),
            merge_envoy_stats: cfg.merge_envoy_stats,
            dns,
            certs,
            xds_adapt: None,
        }
    }

    /// Serves the xDS adaptation's report on `/debug/xds_adapt`.
    pub fn with_xds_adapt(mut self, adapt: Option<Arc<crate::xds_adapt::Adapter>>) -> State {
        self.xds_adapt = adapt;
        self
    }
}

/// Every answer of the status port, gzip- or zstd-encoded when the client asks (as Istio's
/// agent since 1.30).
async fn handle(
    state: Arc<State>,
    peer: SocketAddr,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let encoding = crate::compress::negotiate(
        req.headers()
            .get(hyper::header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    );
    crate::compress::apply(route(state, peer, req).await, encoding)
}

async fn route(
    state: Arc<State>,
    peer: SocketAddr,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    // IPv4 peers arrive as ::ffff:a.b.c.d on the dual-stack socket.
    let local = peer.ip().to_canonical().is_loopback();
    // Only the configured probes run; nothing in the request changes what is dialled.
    if let Some(probe) = state.probes.get(req.uri().path()) {
        return match crate::probes::run(probe, state.probe_target).await {
            Ok(()) => text(StatusCode::OK, ""),
            Err(why) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")),
        };
    }
    let path = req.uri().path();
    // Every debug page, present or future, is loopback-only: a peer gets 403, never a hint of
    // which pages exist (there is no pprof: `--profiling` is accepted and ignored).
    let control =
        matches!(path, "/quitquitquit" | "/drain" | "/debug") || path.starts_with("/debug/");
    if control && !local {
        return text(StatusCode::FORBIDDEN, "only from localhost\n");
    }
    match (req.method(), path) {
        (&Method::GET, "/stats/prometheus" | "/metrics") => stats(&state, &req),
        (&Method::GET, "/healthz/ready") => {
            match readiness(state.admin_port, &state.drain, &state.dns, &state.certs).await {
                Ok(()) => {
                    state.metrics.mark_ready();
                    text(StatusCode::OK, "")
                }
                Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, why),
            }
        }
        (&Method::POST, "/quitquitquit") => {
            state.drain.trigger(Shutdown::Immediate);
            text(StatusCode::OK, "")
        }
        (&Method::POST, "/drain") => {
            // Drain for good and never exit on Envoy's side; the later SIGTERM stops at once.
            state.drain.mark_drained();
            match admin::post(
                state.admin_port,
                "/drain_listeners?inboundonly&graceful&skip_exit",
            )
            .await
            {
                Ok(_) => text(StatusCode::OK, ""),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
            }
        }
        (_, "/quitquitquit" | "/drain") => text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n"),
        (&Method::GET, "/debug/config") => text(StatusCode::OK, state.config_dump.clone()),
        (&Method::GET, "/debug/certs") => match state.certs.borrow().as_deref() {
            Some(c) => text(
                StatusCode::OK,
                format!("{:#}\n", crate::identity::summary(c)),
            ),
            None => text(StatusCode::NOT_FOUND, "no workload certificate yet\n"),
        },
        (&Method::GET, "/debug/xds_adapt") => match &state.xds_adapt {
            Some(a) => text(StatusCode::OK, a.report_json() + "\n"),
            None => text(StatusCode::NOT_FOUND, "xDS adaptation off (XDS_ADAPT)\n"),
        },
        (&Method::GET, "/debug/ndsz") => {
            let table = state.dns.borrow().as_ref().and_then(|t| t.borrow().clone());
            match table {
                Some(t) => text(StatusCode::OK, format!("{:#}\n", t.to_json())),
                None => text(
                    StatusCode::NOT_FOUND,
                    "no DNS name table (DNS proxy off or not received)\n",
                ),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// Binds the status port.
/// Binds the status port on all interfaces, IPv6 and IPv4 (one dual-stack socket), or IPv4 only
/// where the host has no IPv6.
pub async fn bind(port: u16) -> std::io::Result<TcpListener> {
    let dual = || -> std::io::Result<TcpListener> {
        let socket = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None)?;
        socket.set_only_v6(false)?;
        socket.set_reuse_address(true)?;
        socket.bind(&SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)).into())?;
        socket.listen(1024)?;
        socket.set_nonblocking(true)?;
        TcpListener::from_std(socket.into())
    };
    match dual() {
        Ok(l) => Ok(l),
        Err(_) => TcpListener::bind(("0.0.0.0", port)).await,
    }
}

/// Serves until the drain completes, within the side-port limits (request head in 3 s, at most
/// 64 KiB of it, a body of at most 64 KiB; 32 connections a peer, 256 in all, 64 more from
/// loopback, the oldest unfinished one giving way to a new one).
pub async fn serve(listener: TcpListener, state: State) {
    let drain = state.drain.clone();
    let state = Arc::new(state);
    mesh_common::side_port::serve(
        "status port",
        listener,
        mesh_common::side_port::Limits::default(),
        move |peer, req| handle(state.clone(), peer, req),
        async move { drain.finished().await },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(request).await;
        let mut text = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut text))
            .await;
        String::from_utf8_lossy(&text).into_owned()
    }

    /// 15020 is served within the side-port limits: an oversized head gets 431, and a control
    /// request with an oversized body is refused (413) before it acts.
    #[tokio::test]
    async fn the_status_port_enforces_request_limits() {
        let cfg = crate::config::Config::from_env(
            &crate::config::ProxyArgs {
                proxy_type: "sidecar".into(),
                config_dir: Some("/m".into()),
                ..Default::default()
            },
            &|_| None,
            &[],
            &|_| None,
        )
        .unwrap();
        let drain = Drain::default();
        let (_dns_tx, dns) = tokio::sync::watch::channel(None);
        let (_certs_tx, certs) = tokio::sync::watch::channel(None);
        let state = State::new(
            &cfg,
            drain.clone(),
            Arc::new(crate::metrics::Metrics::new()),
            dns,
            certs,
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, state));

        let text = exchange(
            addr,
            b"POST /quitquitquit HTTP/1.1\r\nHost: x\r\nContent-Length: 10485760\r\n\r\n",
        )
        .await;
        assert!(text.starts_with("HTTP/1.1 413"), "{text}");
        assert!(
            !drain.is_draining(),
            "the refused request stopped the agent"
        );

        let head = format!(
            "GET /debug/config HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(mesh_common::side_port::Limits::default().max_head_bytes)
        );
        let text = exchange(addr, head.as_bytes()).await;
        assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    }
}
