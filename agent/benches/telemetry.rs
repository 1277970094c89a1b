#![allow(clippy::unwrap_used)] // bench code
//! The agent's cost per standard-metrics record: an export request of 100 inbound HTTP records as
//! an Envoy sidecar sends them (the record attributes of `istiod_core::generators::telemetry`,
//! the reporter and kind once a batch), decoded and counted, against decoding alone in the same
//! run (the least an agent that decodes the request pays).
//!   cargo bench -p pilot-agent --bench telemetry
//! Prints the median µs per record of each.

mod common;

use common::median_us;
use istio_proto::otlp_logs::{
    AnyValue, ExportLogsServiceRequest, KeyValue, LogRecord, Resource, ResourceLogs, ScopeLogs,
    any_value,
};
use mesh_common::telemetry::attr;
use pilot_agent::telemetry::{StandardMetrics, Workload};
use prost::Message;

const RECORDS: usize = 100;

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
    }
}

/// An export request as Envoy encodes it: `RECORDS` requests from one client, alike but for
/// their durations and sizes (and one in ten a 503).
fn request() -> Vec<u8> {
    let records = (0..RECORDS)
        .map(|i| LogRecord {
            time_unix_nano: 1,
            body: None,
            attributes: vec![
                kv(attr::PEER_SAN, "spiffe://cluster.local/ns/bench/sa/client"),
                kv(attr::LOCAL_SAN, "spiffe://cluster.local/ns/bench/sa/app"),
                kv(attr::CLUSTER, "inbound|8000||"),
                kv(
                    attr::SERVICES,
                    r#"[{"host":"app.bench.svc.cluster.local","name":"app","namespace":"bench"}]"#,
                ),
                kv(attr::RESPONSE_FLAGS, "-"),
                kv(attr::RECEIVED_BYTES, &(300 + i).to_string()),
                kv(attr::SENT_BYTES, &(1200 + i % 7).to_string()),
                kv(attr::AUTHORITY, "app.bench.svc.cluster.local:8000"),
                kv(
                    attr::PEER,
                    "n=client,ns=bench,sa=client,app=client,ver=v1,cs=client,cr=v1,cl=Kubernetes",
                ),
                kv(attr::CONTENT_TYPE, "-"),
                kv(attr::RESPONSE_CODE, if i % 10 == 9 { "503" } else { "200" }),
                kv(attr::GRPC_STATUS, "-"),
                kv(attr::DURATION_MS, &(i % 13).to_string()),
            ],
        })
        .collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![kv(attr::REPORTER, "destination"), kv(attr::KIND, "http")],
            }),
            scope_logs: vec![ScopeLogs {
                log_records: records,
            }],
        }],
    }
    .encode_to_vec()
}

/// Median µs per record of `f` (one request of `RECORDS` records).
fn per_record_us(f: impl FnMut() -> usize) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let records = RECORDS as f64;
    median_us(f) / records
}

fn main() {
    let bytes = request();
    let own = Workload {
        name: "app".into(),
        namespace: "bench".into(),
        canonical_service: "app".into(),
        canonical_revision: "v1".into(),
        app: "app".into(),
        version: "v1".into(),
        cluster: "Kubernetes".into(),
    };
    let metrics = StandardMetrics::new(own);
    let decode = per_record_us(|| {
        ExportLogsServiceRequest::decode(bytes.as_slice())
            .unwrap()
            .resource_logs
            .len()
    });
    let counted = per_record_us(|| {
        let r = ExportLogsServiceRequest::decode(bytes.as_slice()).unwrap();
        metrics.record(&r);
        r.resource_logs.len()
    });
    assert_eq!(metrics.label_sets(), 2, "a 200 and a 503 series");
    println!(
        "{RECORDS} records a request ({} bytes): decode {decode:.2} µs a record; decode and count {counted:.2} µs a record ({:.2}x decode)",
        bytes.len(),
        counted / decode
    );
}
