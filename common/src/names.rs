//! The well-known ports and names of an Istio sidecar that more than one of our programs uses:
//! the capture listeners istio-iptables redirects to and the control plane generates, and the
//! environment variables the agent gives Envoy that generated config reads.

/// Envoy's outbound capture listener (`virtualOutbound`, istio-iptables' `-p`).
pub const VIRTUAL_OUTBOUND_PORT: u16 = 15001;
/// Envoy's inbound capture listener (`virtualInbound`, istio-iptables' `-z`).
pub const VIRTUAL_INBOUND_PORT: u16 = 15006;

/// The environment variables the agent gives Envoy for Istio's span tags.
pub const ENV_CANONICAL_SERVICE: &str = "ISTIO_CANONICAL_SERVICE";
pub const ENV_CANONICAL_REVISION: &str = "ISTIO_CANONICAL_REVISION";
/// The OpenTelemetry resource attributes of Envoy's environment (its `service.name`).
pub const ENV_OTEL_RESOURCE: &str = "OTEL_RESOURCE_ATTRIBUTES";
