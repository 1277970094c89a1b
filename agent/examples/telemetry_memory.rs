//! Memory of Istio's standard metrics in the agent (BENCHMARKS.md "Standard metrics"): the
//! process's resident memory before and after N label sets are recorded (half HTTP, half TCP,
//! each from a distinct client identity as a mesh of N/2 callers would make them), measured in one
//! run against the same process's baseline. Usage: `cargo run --release -p pilot-agent --example
//! telemetry_memory [N...]` (default 1000 10000).

use istio_proto::otlp_logs::{
    AnyValue, ExportLogsServiceRequest, KeyValue, LogRecord, ResourceLogs, ScopeLogs, any_value,
};
use pilot_agent::telemetry::{StandardMetrics, Workload};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn kv(key: &str, value: String) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value)),
        }),
    }
}

fn record(i: usize, http: bool) -> LogRecord {
    let mut attributes = vec![
        kv("reporter", "destination".into()),
        kv("kind", if http { "http" } else { "tcp" }.into()),
        kv(
            "peer_san",
            format!("spiffe://cluster.local/ns/team-{}/sa/caller-{i}", i % 50),
        ),
        kv(
            "local_san",
            "spiffe://cluster.local/ns/shop/sa/reviews".into(),
        ),
        kv("cluster", "inbound|9080||".into()),
        kv("response_flags", "-".into()),
        kv("received_bytes", "300".into()),
        kv("sent_bytes", "1200".into()),
    ];
    if http {
        attributes.extend([
            kv("authority", "reviews.shop.svc.cluster.local:9080".into()),
            kv("content_type", "application/json".into()),
            kv("response_code", "200".into()),
            kv("duration_ms", "12".into()),
        ]);
    } else {
        attributes.extend([
            kv("log_type", "TcpConnectionEnd".into()),
            kv("connection", i.to_string()),
        ]);
    }
    LogRecord {
        time_unix_nano: 0,
        body: None,
        attributes,
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1000, 10_000]
    } else {
        sizes
    };
    let own = Workload {
        name: "reviews-v1".into(),
        namespace: "shop".into(),
        canonical_service: "reviews".into(),
        canonical_revision: "v1".into(),
        app: "reviews".into(),
        version: "v1".into(),
        cluster: "Kubernetes".into(),
    };
    for n in sizes {
        // Requests are built first, so the measured difference is the aggregate alone.
        let requests: Vec<ExportLogsServiceRequest> = (0..n)
            .map(|i| ExportLogsServiceRequest {
                resource_logs: vec![ResourceLogs {
                    resource: None,
                    scope_logs: vec![ScopeLogs {
                        log_records: vec![record(i / 2, i % 2 == 0)],
                    }],
                }],
            })
            .collect();
        let metrics = StandardMetrics::new(own.clone());
        let before = rss_kib();
        for r in &requests {
            metrics.record(r);
        }
        let after = rss_kib();
        // The scrape streams the text in chunks: its size, never held whole.
        let text_bytes: usize = metrics.exposition().map(|c| c.len()).sum();
        println!(
            "label sets {}: RSS {before} KiB -> {after} KiB (+{} KiB, {} bytes per label set); exposition {} bytes",
            metrics.label_sets(),
            after.saturating_sub(before),
            after.saturating_sub(before) * 1024 / n.max(1) as u64,
            text_bytes
        );
        drop(requests);
    }
}
