//! The agent's own metrics (Istio's `istio_agent_*` names) and the merged Prometheus exposition
//! served on 15020: agent metrics, then Envoy's `localhost:15090/stats/prometheus` (unless
//! PILOT_AGENT_MERGE_ENVOY_STATS=false), then the application's metrics named by
//! ISTIO_PROMETHEUS_ANNOTATIONS, one target or several (Istio 1.31's scrape-targets: fetched
//! concurrently, merged in their order) (Istio's standard metrics are in Envoy's part, from the
//! proxy module) (Istio's `status/server.go` `handleStats`). Envoy's part is streamed through,
//! never held whole; each app target is capped at 10 MiB; a failed source is counted in
//! `istio_agent_scrape_failures_total{type}` and left out, the others still answer.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use crate::config::metrics::{AppMetrics, Target};

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
    /// Scrapes of 15020's merged exposition, and sources that failed in one (by `type`:
    /// `envoy`, `application`, `agent`), as Istio's agent counts them.
    scrapes: Counter,
    scrape_failures: Family<Vec<(String, String)>, Counter>,
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
        let scrapes = Counter::default();
        registry.register(
            "scrapes",
            "The total number of scrapes of the merged metrics",
            scrapes.clone(),
        );
        let scrape_failures = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "scrape_failures",
            "The total number of failed scrapes, by the part that failed (envoy, application, agent)",
            scrape_failures.clone(),
        );
        Metrics {
            registry,
            scrapes,
            scrape_failures,
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

    /// Counts one failed part of a merged scrape (`envoy`, `application`, `agent`).
    fn scrape_failed(&self, kind: &str) {
        self.scrape_failures
            .get_or_create(&vec![("type".to_string(), kind.to_string())])
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

/// One application target's exposition: at most `MAX_APP_METRICS` bytes, without `# EOF`,
/// ending in a newline.
async fn scrape_app(target: &Target, timeout: Duration) -> Result<String, String> {
    let scrape = async {
        let resp = get(target.port, &target.path).await?;
        if resp.status() != hyper::StatusCode::OK {
            return Err(format!("status code {}", resp.status().as_u16()));
        }
        let body = http_body_util::Limited::new(resp.into_body(), MAX_APP_METRICS)
            .collect()
            .await
            .map_err(|e| format!("over {MAX_APP_METRICS} bytes or unreadable: {e}"))?
            .to_bytes();
        Ok::<String, String>(strip_eof(&String::from_utf8_lossy(&body)))
    };
    tokio::time::timeout(timeout, scrape)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

/// What one scrape of 15020 merges, besides the agent's own metrics.
pub struct Sources {
    pub envoy_port: u16,
    /// PILOT_AGENT_MERGE_ENVOY_STATS.
    pub envoy: bool,
    /// Passed on to Envoy.
    pub query: Option<String>,
    pub app: Option<AppMetrics>,
}

/// Streams the merged exposition into `tx`. Each source is bounded by `timeout` (the scraper's
/// X-Prometheus-Scrape-Timeout-Seconds, else 10 s). With `openmetrics` (the scraper asked for
/// it) the exposition ends with the one `# EOF`.
pub async fn merged(
    metrics: std::sync::Arc<Metrics>,
    sources: Sources,
    timeout: Duration,
    openmetrics: bool,
    tx: mpsc::Sender<Bytes>,
) {
    metrics.scrapes.inc();
    // The app's targets are fetched while Envoy's part streams, all at once, as Istio's.
    let apps: Vec<_> = sources
        .app
        .iter()
        .flat_map(|a| a.targets.iter().cloned())
        .map(|t| tokio::spawn(async move { (scrape_app(&t, timeout).await, t) }))
        .collect();
    let agent = metrics.encode();
    if agent.is_empty() {
        metrics.scrape_failed("agent");
    }
    if tx.send(Bytes::from(agent)).await.is_err() {
        return;
    }
    if sources.envoy {
        let envoy_path = match &sources.query {
            Some(q) if !q.is_empty() => format!("/stats/prometheus?{q}"),
            _ => "/stats/prometheus".to_string(),
        };
        let envoy = async {
            let resp = get(sources.envoy_port, &envoy_path).await?;
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
            metrics.scrape_failed("envoy");
            tracing::warn!(error = %e, "could not read Envoy's metrics");
        }
    }
    for app in apps {
        match app.await {
            Ok((Ok(text), _)) => {
                let _ = tx.send(Bytes::from(text)).await;
            }
            Ok((Err(e), t)) => {
                metrics.scrape_failed("application");
                tracing::warn!(error = %e, port = t.port, path = %t.path, "could not read the app's metrics");
            }
            Err(_) => metrics.scrape_failed("application"),
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
