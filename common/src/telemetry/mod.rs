//! The vocabulary of Istio's standard metrics that istiod-core and the agent share: the
//! metrics' plan as Istio's `istio.stats` config writes it (`MetricsPlan`, one `MetricConfig` per
//! metric touched) and the reporter; `module_filters` builds the proxy module's filters from them.
//! The CEL tag values are the module's ([`crate::module::TagValue`]).

pub mod module_filters;

pub use crate::module::Reporter;

use std::collections::BTreeMap;

/// The standard metrics' shape: what Istio writes into its `istio.stats` filter config, one
/// entry per metric it touches (Istio's `MetricConfig`), in Istio's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsPlan {
    pub metrics: Vec<MetricConfig>,
    /// `reportingInterval` (TCP), when set.
    pub reporting_interval: Option<std::time::Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricConfig {
    /// The Prometheus name without `istio_` (`requests_total`).
    pub name: String,
    pub drop: bool,
    pub tags_to_remove: Vec<String>,
    /// Tag → CEL value (checked when the Telemetry was read).
    pub dimensions: BTreeMap<String, String>,
}
