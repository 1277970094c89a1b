//! Istio's proxy extensions for upstream Envoy, as an Envoy dynamic module
//! (`libistio_module.so`): the peer metadata exchange over HTTP headers and at the start of TCP
//! streams, Istio's standard metrics with their labels, and the upstream ALPN by protocol, in
//! Istio's wire formats and with Istio's semantics (istio/proxy's `peer_metadata`,
//! `metadata_exchange`, `istio_stats` and `alpn` filters), so a pod with this module and a pod
//! with Istio's own proxy read each other.
//!
//! Layers: [`ffi`] is Envoy's C ABI and the only `unsafe` code; it hands the filters an
//! [`envoy`] trait object per call. [`filters`] holds one filter per Istio extension, built on
//! [`peer`] (the wire formats), [`labels`] (the metrics' labels) and [`node`] (this proxy).

#![deny(unsafe_code)]

pub mod envoy;
#[cfg(all(feature = "envoy", not(test)))]
mod ffi;
pub mod filters;
pub mod labels;
pub mod logging;
pub mod node;
pub mod peer;
pub mod tcp_metrics;
