//! Istio's default HTTP retry policy (`pilot/pkg/networking/core/route/retry/retry.go`): what a
//! route gets when its VirtualService says nothing about retries, and what `retries` starts from.

use envoy_types::pb::envoy::config::route::v3::{RetryPolicy, retry_policy};
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;

/// Istio 1.27+'s default: 2 retries on connection failures, refused streams and gRPC
/// UNAVAILABLE/CANCELLED, each on another host (5 host picks). A consistent-hash destination
/// keeps its host (no previous-hosts predicate), so the hash still decides.
pub fn default_retry(hashed: bool) -> RetryPolicy {
    // Built once: every default route carries one (a copy is cheaper than encoding it again).
    static POLICIES: std::sync::OnceLock<[RetryPolicy; 2]> = std::sync::OnceLock::new();
    POLICIES.get_or_init(|| [build(false), build(true)])[usize::from(hashed)].clone()
}

fn build(hashed: bool) -> RetryPolicy {
    RetryPolicy {
        retry_on: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
            .to_string(),
        num_retries: Some(UInt32Value { value: 2 }),
        host_selection_retry_max_attempts: 5,
        retry_host_predicate: if hashed {
            Vec::new()
        } else {
            vec![retry_policy::RetryHostPredicate {
                name: "envoy.retry_host_predicates.previous_hosts".to_string(),
                config_type: Some(retry_policy::retry_host_predicate::ConfigType::TypedConfig(
                    pack_any(PreviousHostsPredicate::default()),
                )),
            }]
        },
        ..Default::default()
    }
}
