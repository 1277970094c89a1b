//! A real trace and log collector for the observability tests: Jaeger v2 (installed by
//! scripts/install-collectors.sh) in a pod of its own, receiving Zipkin spans on 9411 and OTLP
//! (traces and logs) on 4317/4318, and answering its query API on 16686. OTLP logs go to its
//! `debug` exporter, so each log record received is a line of its log.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{Pod, install_home, installed_bin, wait_until};

/// The Jaeger binary; a test failure naming the set-up step when missing.
pub fn jaeger_bin() -> Result<PathBuf> {
    installed_bin(
        &install_home("COLLECTORS_HOME", "/opt/collectors-test/jaeger-v1.76.0"),
        "jaeger",
        "Jaeger (the trace collector)",
        "scripts/install-collectors.sh",
    )
}

/// Jaeger's configuration: every receiver on the pod's addresses, traces kept in memory.
const CONFIG: &str = r#"service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp, zipkin]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
    logs:
      receivers: [otlp]
      exporters: [debug]
  telemetry:
    metrics:
      level: none
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 0.0.0.0:16686
    grpc:
      endpoint: 0.0.0.0:16685
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc: {endpoint: "0.0.0.0:4317"}
      http: {endpoint: "0.0.0.0:4318"}
  zipkin:
    endpoint: 0.0.0.0:9411
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
  debug:
    verbosity: detailed
"#;

/// Starts Jaeger in `pod` (as an unprivileged user) and waits for its query API.
pub fn start_jaeger(pod: &mut Pod) -> Result<()> {
    let bin = jaeger_bin()?;
    let config = pod.dir.join("jaeger.yaml");
    crate::write_readable(&config, CONFIG)?;
    let (bin, config) = (bin.to_string_lossy(), format!("file:{}", config.display()));
    pod.spawn("jaeger", 1000, 1000, &[], &[&bin, "--config", &config])?;
    let url = "http://127.0.0.1:16686/api/services";
    if !wait_until(Duration::from_secs(60), || {
        pod.http_get(0, url).is_ok_and(|(code, _)| code == 200)
    }) {
        bail!("Jaeger did not answer {url}:\n{}", pod.logs_of("jaeger"));
    }
    Ok(())
}

/// The traces Jaeger holds for `service` (its query API's `data`).
pub fn traces(pod: &Pod, service: &str) -> Result<Vec<Value>> {
    let (code, body) = pod.http_get(
        0,
        &format!("http://127.0.0.1:16686/api/traces?service={service}&limit=100&lookback=1h"),
    )?;
    if code != 200 {
        bail!("Jaeger answered {code} for the traces of {service}: {body}");
    }
    let v: Value = serde_json::from_str(&body).context("Jaeger's traces are no JSON")?;
    Ok(v["data"].as_array().cloned().unwrap_or_default())
}

/// A span of a trace, flattened: its service (process), ids, parent and tags.
#[derive(Debug, Clone)]
pub struct Span {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent: Option<String>,
    pub operation: String,
    pub tags: Vec<(String, String)>,
}

impl Span {
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The spans of one trace of the query API.
pub fn spans(trace: &Value) -> Vec<Span> {
    let processes = &trace["processes"];
    trace["spans"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| Span {
            service: processes[s["processID"].as_str().unwrap_or_default()]["serviceName"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            trace_id: s["traceID"].as_str().unwrap_or_default().to_string(),
            span_id: s["spanID"].as_str().unwrap_or_default().to_string(),
            parent: s["references"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["refType"] == "CHILD_OF")
                .and_then(|r| r["spanID"].as_str())
                .map(str::to_string),
            operation: s["operationName"].as_str().unwrap_or_default().to_string(),
            tags: s["tags"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    let v = match &t["value"] {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    (t["key"].as_str().unwrap_or_default().to_string(), v)
                })
                .collect(),
        })
        .collect()
}
