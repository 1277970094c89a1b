//! What an Istio filter is set to do that the proxy module does not, once the filter is mapped
//! onto it or removed: settings beyond what istiod writes (an EnvoyFilter patch on the filter,
//! or an Istio filter an EnvoyFilter adds), and what goes with a filter the module has nothing
//! for. The agent reports them by name (`/debug/xds_adapt` `settings_lost`, a warning) rather
//! than drop them silently.
//!
//! istiod's own configs (release-1.31, as recorded in `tests/fixtures/istiod-1.31`) report
//! nothing: the module reads every setting of them. `workload_discovery`, which istiod writes
//! in every HTTP exchange, finds nothing in the module, as in Istio's own sidecars (whose node
//! turns metadata discovery off), so it is not reported.

use mesh_common::module::{MetricConfig, PEER_EXCHANGE_ALPN, PeerMetadata, TagValue, TcpExchange};

use super::{NULL_VM_METADATA_EXCHANGE, NULL_VM_STATS, PEER_AUTHN, Place};

/// The peer metadata exchange's discovery and propagation methods the module does not run
/// (`baggage` and `upstream_filter_state` serve Istio's waypoints), and `shared_with_upstream`.
pub fn peer_metadata(c: &PeerMetadata) -> Vec<String> {
    let mut lost = Vec::new();
    for (dir, methods) in [
        ("downstream", &c.downstream_discovery),
        ("upstream", &c.upstream_discovery),
    ] {
        for m in methods {
            if m.baggage.is_some() {
                lost.push(format!("{dir}_discovery baggage"));
            }
            if m.upstream_filter_state.is_some() {
                lost.push(format!("{dir}_discovery upstream_filter_state"));
            }
        }
    }
    for (dir, methods) in [
        ("downstream", &c.downstream_propagation),
        ("upstream", &c.upstream_propagation),
    ] {
        if methods.iter().any(|m| m.baggage.is_some()) {
            lost.push(format!("{dir}_propagation baggage"));
        }
    }
    if c.shared_with_upstream {
        lost.push("shared_with_upstream".to_string());
    }
    lost.dedup();
    lost
}

/// The TCP exchange's `protocol`: Istio's exchanges only over a connection that negotiated that
/// ALPN; the module exchanges with any mesh peer (a SPIFFE certificate), as over
/// `istio-peer-exchange`.
pub fn tcp_exchange(c: &TcpExchange) -> Vec<String> {
    if c.protocol.is_empty() || c.protocol == PEER_EXCHANGE_ALPN {
        Vec::new()
    } else {
        vec![format!("protocol {:?}", c.protocol)]
    }
}

/// Tags whose CEL value the module cannot compute: it reports them `unknown`.
pub fn stats_dimensions(metrics: &[MetricConfig]) -> Vec<String> {
    let mut lost = Vec::new();
    for m in metrics {
        for (tag, expr) in &m.dimensions {
            if TagValue::parse(expr).is_err() {
                let which = if m.name.is_empty() {
                    "every metric"
                } else {
                    m.name.as_str()
                };
                lost.push(format!(
                    "dimensions.{tag} of {which} (the module cannot compute {expr}: reported unknown)"
                ));
            }
        }
    }
    lost
}

/// What goes with an Istio filter of type `t` at `place` that is removed, not mapped.
pub fn removed(t: &str, place: Place) -> Vec<String> {
    match (t, place) {
        // Its principals are rewritten to what upstream Envoy matches.
        (PEER_AUTHN, _) => Vec::new(),
        (NULL_VM_STATS, _) => vec![
            "standard metrics (the null-VM Wasm plugin of old istiods is not mapped)".to_string(),
        ],
        (NULL_VM_METADATA_EXCHANGE, _) => vec![
            "metadata exchange (the null-VM Wasm plugin is mapped only as an HTTP filter)"
                .to_string(),
        ],
        // The exchange's cluster filter: its client side runs on the outbound listeners
        // instead (what it loses there is `cluster_exchange`'s).
        (_, Place::Cluster) => Vec::new(),
        (_, Place::Ecds) => {
            vec!["the filter (delivered by extension config discovery: not mapped)".to_string()]
        }
        _ => vec!["the filter (the proxy module has none for it here)".to_string()],
    }
}

/// A cluster's exchange goes; the outbound listeners' client side runs istiod's config
/// (`TcpExchange::istio()`) in its place, so what differs from it is lost.
pub fn cluster_exchange(c: &TcpExchange) -> Vec<String> {
    let mut lost = tcp_exchange(c);
    if !c.additional_labels.is_empty() {
        lost.push(format!("additional_labels {:?}", c.additional_labels));
    }
    lost
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_common::module::{Discovery, Empty, Propagation};

    #[test]
    fn istiods_own_configs_lose_nothing() {
        assert!(peer_metadata(&PeerMetadata::client()).is_empty());
        assert!(peer_metadata(&PeerMetadata::server()).is_empty());
        assert!(tcp_exchange(&TcpExchange::istio()).is_empty());
        assert!(cluster_exchange(&TcpExchange::istio()).is_empty());
        assert!(removed(super::super::TCP_METADATA_EXCHANGE, Place::Cluster).is_empty());
        assert!(removed(PEER_AUTHN, Place::Network).is_empty());
        let istio = MetricConfig {
            dimensions: [
                ("request_host".to_string(), "request.host".to_string()),
                ("user".to_string(), "request.headers['x-user']".to_string()),
            ]
            .into(),
            ..MetricConfig::default()
        };
        assert!(stats_dimensions(&[istio]).is_empty());
    }

    #[test]
    fn what_the_module_does_not_do_is_named() {
        let waypoint = PeerMetadata {
            downstream_discovery: vec![
                Discovery {
                    baggage: Some(Empty {}),
                    ..Discovery::default()
                },
                Discovery::workload(),
            ],
            downstream_propagation: vec![Propagation {
                baggage: Some(Empty {}),
                ..Propagation::default()
            }],
            shared_with_upstream: true,
            ..PeerMetadata::default()
        };
        assert_eq!(
            peer_metadata(&waypoint),
            [
                "downstream_discovery baggage",
                "downstream_propagation baggage",
                "shared_with_upstream"
            ]
        );
        let labelled = TcpExchange {
            protocol: "custom".into(),
            additional_labels: vec!["team".into()],
            ..TcpExchange::default()
        };
        assert_eq!(
            cluster_exchange(&labelled),
            ["protocol \"custom\"", "additional_labels [\"team\"]"]
        );
        assert_eq!(removed(NULL_VM_STATS, Place::Http).len(), 1);
        assert!(removed(super::super::ISTIO_STATS, Place::Ecds)[0].contains("discovery"));
        assert!(removed(super::super::ALPN_OVERRIDE, Place::Network)[0].contains("none for it"));
    }
}
