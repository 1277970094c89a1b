//! The agent's own metrics (Istio's `istio_agent_*` names) and the merged Prometheus exposition
//! served on 15020: agent metrics, then Envoy's `localhost:15090/stats/prometheus`, then the
//! application's metrics named by ISTIO_PROMETHEUS_ANNOTATIONS (Istio's standard metrics are in
//! Envoy's part, from the proxy module) (Istio's `status/server.go`
//! `handleStats`). Envoy's part is streamed through, never held whole; the app's part is capped.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use crate::config::metrics::AppMetrics;

/// Largest application exposition forwarded (Istio's cap).
pub const MAX_APP_METRICS: usize = 10 * 1024 * 1024;

/// Counters and gauges the agent updates.
pub struct Metrics {
    registry: Registry,
    pub xds_proxy_requests: Counter,
    pub xds_proxy_responses: Counter,
    pub startup_duration_seconds: Gauge<f64, AtomicU64>,
    pub dns_requests: Counter,
    resident_memory_bytes: Gauge,
    /// Unix time the workload certificate expires (0 until there is one).
    pub cert_expiry_timestamp: Gauge<f64, AtomicU64>,
    cert_expiry_seconds: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>,
    /// Istio-only extensions the xDS adaptation removed, by type (`xds_adapt`).
    xds_adapt_removed: Family<Vec<(String, String)>, Counter>,
    /// xDS responses the adaptation refused (NACKed to the control plane).
    pub xds_adapt_refused: Counter,
    /// Root bundles refused for holding no usable certificate (the last good roots stay).
    pub root_bundle_errors: Counter,
    started: std::time::Instant,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("istio_agent");
        let xds_proxy_requests = Counter::default();
        let xds_proxy_responses = Counter::default();
        let startup_duration_seconds = Gauge::<f64, AtomicU64>::default();
        let resident_memory_bytes = Gauge::default();
        let dns_requests = Counter::default();
        registry.register(
            "dns_requests",
            "DNS queries received by the DNS proxy",
            dns_requests.clone(),
        );
        registry.register(
            "xds_proxy_requests",
            "xDS requests forwarded from Envoy to the control plane",
            xds_proxy_requests.clone(),
        );
        registry.register(
            "xds_proxy_responses",
            "xDS responses forwarded from the control plane to Envoy",
            xds_proxy_responses.clone(),
        );
        registry.register(
            "startup_duration_seconds",
            "Seconds from agent start to the proxy first being ready",
            startup_duration_seconds.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of the agent process",
            resident_memory_bytes.clone(),
        );
        let cert_expiry_timestamp = Gauge::<f64, AtomicU64>::default();
        let cert_expiry_seconds = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "cert_expiry_seconds",
            "The time remaining, in seconds, before the certificate chain will expire; negative once expired",
            cert_expiry_seconds.clone(),
        );
        registry.register(
            "cert_expiry_timestamp_seconds",
            "Unix time at which the workload certificate expires",
            cert_expiry_timestamp.clone(),
        );
        let xds_adapt_removed = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "xds_adapt_removed",
            "Istio-only extensions removed from xDS responses for upstream Envoy, by type",
            xds_adapt_removed.clone(),
        );
        let xds_adapt_refused = Counter::default();
        registry.register(
            "xds_adapt_refused",
            "xDS responses NACKed by the agent: a security filter of a type upstream Envoy cannot load",
            xds_adapt_refused.clone(),
        );
        let root_bundle_errors = Counter::default();
        registry.register(
            "root_bundle_errors",
            "Root bundles refused (garbage, no certificate, every root expired): the mesh root file or a mounted root-cert.pem; the last good roots and certificate stay",
            root_bundle_errors.clone(),
        );
        Metrics {
            registry,
            root_bundle_errors,
            xds_adapt_removed,
            xds_adapt_refused,
            cert_expiry_timestamp,
            cert_expiry_seconds,
            xds_proxy_requests,
            xds_proxy_responses,
            startup_duration_seconds,
            dns_requests,
            resident_memory_bytes,
            started: std::time::Instant::now(),
        }
    }

    /// Counts one extension of type `type_name` removed by the xDS adaptation.
    pub fn xds_adapt_removed(&self, type_name: &str) {
        self.xds_adapt_removed
            .get_or_create(&vec![("type".to_string(), type_name.to_string())])
            .inc();
    }

    /// Records the first time the proxy is ready.
    pub fn mark_ready(&self) {
        if self.startup_duration_seconds.get() == 0.0 {
            self.startup_duration_seconds
                .set(self.started.elapsed().as_secs_f64());
        }
    }

    /// The agent's metrics in the text exposition format (no `# EOF`).
    pub fn encode(&self) -> String {
        if let Ok(statm) = std::fs::read_to_string("/proc/self/statm")
            && let Some(pages) = statm
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<i64>().ok())
        {
            self.resident_memory_bytes.set(pages * 4096);
        }
        let expiry = self.cert_expiry_timestamp.get();
        if expiry > 0.0 {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or_default();
            self.cert_expiry_seconds
                .get_or_create(&vec![("resource_name".to_string(), "default".to_string())])
                .set(expiry - now);
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            return String::new();
        }
        strip_eof(&out)
    }
}

/// Drops OpenMetrics `# EOF` lines, so sources can be concatenated into one exposition.
pub fn strip_eof(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines().filter(|l| l.trim() != "# EOF") {
        out.push_str(line);
        out.push('\n');
    }
    out
}

async fn get(port: u16, path: &str) -> Result<hyper::Response<hyper::body::Incoming>, String> {
    let req = hyper::Request::builder()
        .uri(path)
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::ACCEPT, "text/plain")
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    crate::http_client::loopback(port, req)
        .await
        .map_err(|e| e.to_string())
}

/// Streams the merged exposition into `tx`. `query` is passed to Envoy; each source is bounded by
/// `timeout` (the scraper's X-Prometheus-Scrape-Timeout-Seconds, else 10 s). With `openmetrics`
/// (the scraper asked for it) the exposition ends with the one `# EOF`.
pub async fn merged(
    metrics: std::sync::Arc<Metrics>,
    envoy_port: u16,
    query: Option<String>,
    app: Option<AppMetrics>,
    timeout: Duration,
    openmetrics: bool,
    tx: mpsc::Sender<Bytes>,
) {
    if tx.send(Bytes::from(metrics.encode())).await.is_err() {
        return;
    }
    let envoy_path = match &query {
        Some(q) if !q.is_empty() => format!("/stats/prometheus?{q}"),
        _ => "/stats/prometheus".to_string(),
    };
    let envoy = async {
        let resp = get(envoy_port, &envoy_path).await?;
        let mut body = resp.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| e.to_string())?;
            if let Ok(data) = frame.into_data()
                && tx.send(data).await.is_err()
            {
                return Ok(());
            }
        }
        Ok::<(), String>(())
    };
    if let Err(e) = tokio::time::timeout(timeout, envoy)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
    {
        tracing::warn!(error = %e, "could not read Envoy's metrics");
    }
    if let Some(app) = app {
        let scrape = async {
            let resp = get(app.port, &app.path).await?;
            let body = http_body_util::Limited::new(resp.into_body(), MAX_APP_METRICS)
                .collect()
                .await
                .map_err(|e| format!("over {MAX_APP_METRICS} bytes or unreadable: {e}"))?
                .to_bytes();
            Ok::<String, String>(strip_eof(&String::from_utf8_lossy(&body)))
        };
        match tokio::time::timeout(timeout, scrape).await {
            Ok(Ok(text)) => {
                let _ = tx.send(Bytes::from(text)).await;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, port = app.port, "could not read the app's metrics")
            }
            Err(_) => tracing::warn!(port = app.port, "app metrics timed out"),
        }
    }
    if openmetrics {
        let _ = tx.send(Bytes::from_static(b"# EOF\n")).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_metrics_use_istio_names() {
        let m = Metrics::new();
        m.xds_proxy_requests.inc();
        let text = m.encode();
        assert!(
            text.contains("istio_agent_xds_proxy_requests_total 1"),
            "{text}"
        );
        assert!(
            text.contains("istio_agent_process_resident_memory_bytes"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
    }

    #[test]
    fn strip_eof_drops_the_marker() {
        assert_eq!(strip_eof("a 1\n# EOF\n"), "a 1\n");
    }
}
