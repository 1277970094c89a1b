//! Telemetry on a proxy's listeners, as Istio puts it there: the peer metadata exchange and
//! standard metrics (the proxy module's `istio.metadata_exchange`, `istio.alpn` and
//! `istio.stats`, where istiod puts Istio's own), access logs (`access_log`) and tracing
//! (`tracing`), from what `push_context::telemetry` merged for the proxy (Telemetry resources,
//! MeshConfig defaults and legacy switches). One pass over finished listeners: every HTTP
//! connection manager and TCP chain, plus the listener's own "no route" log, on the sidecar's
//! inbound (server) and outbound (client) listeners and a gateway's (client, as in Istio).

pub mod access_log;
pub mod provider;
pub mod tracing;

use mesh_common::module::{self, PeerMetadata, TcpExchange, filter as module_filter};
use mesh_common::telemetry::module_filters::{self, json_config};
use mesh_common::telemetry::{MetricsPlan, Reporter};

use envoy_types::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, ResponseFlagFilter, access_log_filter,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use crate::config_store::MeshConfigSpec;
use crate::model::Proxy;
use crate::push_context::PushContext;
use crate::push_context::telemetry::Side;
use provider::{Resolved, resolve};

/// What to add to one side's listeners, worked out once per side.
pub struct Instruments {
    reporter: Reporter,
    router: bool,
    metrics: Option<MetricsPlan>,
    http_logs: Vec<AccessLog>,
    tcp_logs: Vec<AccessLog>,
    /// The listener's own log (connections no filter chain took): the file loggers only.
    listener_logs: Vec<AccessLog>,
    tracing: Option<envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing>,
}

impl Instruments {
    /// One side of `proxy` (`client`: outbound listeners and gateways; `router`: a gateway).
    pub fn new(
        push: &PushContext,
        proxy: &Proxy,
        side: &Side,
        client: bool,
        router: bool,
    ) -> Instruments {
        let mesh: &MeshConfigSpec = &push.mesh;
        let mut http_logs = Vec::new();
        let mut tcp_logs = Vec::new();
        let mut listener_logs = Vec::new();
        let plan = side.access_logs.as_ref();
        let telemetry_logs: Vec<(Resolved<'_>, Option<&str>)> = plan
            .iter()
            .flat_map(|p| &p.on)
            .filter_map(|(name, filter)| resolve(push, name).map(|r| (r, filter.as_deref())))
            .collect();
        // Disabled providers count as configured (no fallback), as in Istio.
        let disabled = plan
            .iter()
            .flat_map(|p| &p.disabled)
            .any(|name| resolve(push, name).is_some());
        for (provider, filter) in &telemetry_logs {
            if let Some(l) = access_log::provider_logger(provider, mesh, true) {
                http_logs.push(access_log::filtered(l, *filter));
            }
            if let Some(l) = access_log::provider_logger(provider, mesh, false) {
                if provider.provider.envoy_file_access_log.is_some() {
                    listener_logs.push(no_route(l.clone()));
                }
                tcp_logs.push(access_log::filtered(l, *filter));
            }
        }
        if telemetry_logs.is_empty()
            && !disabled
            && let Some(path) = mesh.access_log_file.as_deref().filter(|p| !p.is_empty())
        {
            // No Telemetry configures access logging (or every provider it names is
            // unusable): the mesh config's file, as Istio falls back to it.
            let l = access_log::mesh_file(path, mesh);
            http_logs.push(l.clone());
            tcp_logs.push(l.clone());
            listener_logs.push(no_route(l));
        }
        let provider = side
            .tracing
            .as_ref()
            .and_then(|t| t.provider.as_deref())
            .and_then(|name| resolve(push, name));
        let tracing = match tracing::hcm_tracing(
            side.tracing.as_ref(),
            provider.as_ref(),
            mesh,
            proxy.tracing_sampling.map(|p| p.0),
            router,
        ) {
            Ok(t) => t,
            Err(e) => {
                ::tracing::debug!(error = %e, "tracing off");
                None
            }
        };
        Instruments {
            reporter: if client {
                Reporter::Source
            } else {
                Reporter::Destination
            },
            router,
            metrics: side.metrics.clone(),
            http_logs,
            tcp_logs,
            listener_logs,
            tracing,
        }
    }

    /// The standard metrics' config (Istio's `stats.PluginConfig`) for this side, or `None`
    /// when metrics are off.
    fn stats(&self) -> Option<Any> {
        let m = self.metrics.as_ref()?;
        Some(json_config(&module::Stats {
            // Istio's rule: the Host header names the service on the client side only.
            disable_host_header_fallback: self.reporter == Reporter::Destination || self.router,
            tcp_reporting_duration: m
                .reporting_interval
                .map(|d| format!("{}s", d.as_secs_f64())),
            metrics: m
                .metrics
                .iter()
                .map(|c| module::MetricConfig {
                    dimensions: c.dimensions.clone(),
                    name: c.name.clone(),
                    tags_to_remove: c.tags_to_remove.clone(),
                    drop: c.drop,
                    ..Default::default()
                })
                .collect(),
            side: Some(self.reporter.label().to_string()),
            ..Default::default()
        }))
    }

    /// Adds the exchange, the metrics, the loggers and tracing to every HTTP connection manager
    /// and TCP chain of `listener`, and its own no-route log.
    pub fn apply(&self, listener: &mut Listener) {
        listener
            .access_log
            .extend(self.listener_logs.iter().cloned());
        let client = self.reporter == Reporter::Source;
        let stats = self.stats();
        let chains = listener
            .filter_chains
            .iter_mut()
            .chain(listener.default_filter_chain.as_mut());
        for chain in chains {
            let mut tcp = false;
            for f in &mut chain.filters {
                let Some(filter::ConfigType::TypedConfig(any)) = &mut f.config_type else {
                    continue;
                };
                let edited = match f.name.as_str() {
                    "envoy.filters.network.http_connection_manager" => {
                        HttpConnectionManager::decode(any.value.as_slice())
                            .ok()
                            .map(|mut hcm| {
                                with_module(&mut hcm, client, stats.as_ref());
                                hcm.access_log.extend(self.http_logs.iter().cloned());
                                if hcm.tracing.is_none() {
                                    hcm.tracing.clone_from(&self.tracing);
                                }
                                hcm.encode_to_vec()
                            })
                    }
                    "envoy.filters.network.tcp_proxy" => {
                        tcp = true;
                        TcpProxy::decode(any.value.as_slice()).ok().map(|mut tcp| {
                            tcp.access_log.extend(self.tcp_logs.iter().cloned());
                            tcp.encode_to_vec()
                        })
                    }
                    _ => None,
                };
                if let Some(value) = edited {
                    any.value = value;
                }
            }
            if tcp {
                with_tcp_module(chain, client, stats.as_ref());
            }
        }
        if !client {
            listener.filter_chains = std::mem::take(&mut listener.filter_chains)
                .into_iter()
                .flat_map(negotiated_split)
                .collect();
        }
    }
}

/// A server's mutual-TLS TCP chain with the exchange, split in two: the connections that
/// negotiated the exchange's ALPN (a chain of their own, whose exchange announces this side on
/// its first bytes as Istio's does) and the rest (whose exchange only answers a client's frame).
/// The passthrough chain (no service port) stays one chain, as istiod's listener has it (what
/// `istioctl proxy-config listener` compares): there the exchange answers a client's frame only.
fn negotiated_split(mut chain: FilterChain) -> Vec<FilterChain> {
    if to_passthrough(&chain) {
        return vec![chain];
    }
    const ALPN: &str = module::PEER_EXCHANGE_ALPN;
    let protocols = chain
        .filter_chain_match
        .as_ref()
        .map(|m| m.application_protocols.clone())
        .unwrap_or_default();
    let exchange = chain
        .filters
        .iter()
        .position(|f| f.name == module_filter::METADATA_EXCHANGE);
    let Some(at) = exchange else {
        return vec![chain];
    };
    if chain.transport_socket.is_none()
        || !(protocols.is_empty() || protocols.iter().any(|p| p == ALPN))
    {
        return vec![chain];
    }
    let mut negotiated = chain.clone();
    negotiated.name = format!("{}-{ALPN}", chain.name);
    negotiated
        .filter_chain_match
        .get_or_insert_with(Default::default)
        .application_protocols = vec![ALPN.to_string()];
    negotiated.filters[at] = module_filters::network_filter(
        module_filter::METADATA_EXCHANGE,
        json_config(&TcpExchange {
            negotiated: true,
            ..TcpExchange::istio()
        }),
    );
    if protocols.iter().any(|p| p == ALPN) {
        let rest: Vec<String> = protocols.into_iter().filter(|p| p != ALPN).collect();
        if rest.is_empty() {
            return vec![negotiated];
        }
        if let Some(m) = chain.filter_chain_match.as_mut() {
            m.application_protocols = rest;
        }
    }
    vec![negotiated, chain]
}

/// Whether `chain` ends in a tcp_proxy to the inbound passthrough cluster.
fn to_passthrough(chain: &FilterChain) -> bool {
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier;
    chain.filters.iter().any(|f| {
        let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
            return false;
        };
        f.name == "envoy.filters.network.tcp_proxy"
            && TcpProxy::decode(any.value.as_slice()).is_ok_and(|t| {
                matches!(&t.cluster_specifier, Some(ClusterSpecifier::Cluster(c))
                    if c.starts_with(crate::resource::INBOUND_PASSTHROUGH_CLUSTER))
            })
    })
}

fn has(filters: &[Filter], name: &str) -> bool {
    filters.iter().any(|f| f.name == name)
}

/// The module's network filters in a TCP chain, as istiod places Istio's: the server's exchange
/// first on mutual-TLS chains (it strips the client's frame before anything reads the stream),
/// the metrics just before tcp_proxy; the client's exchange (on the cluster in Istio) between
/// the metrics and tcp_proxy, so the metrics count the app's bytes, not the frames.
fn with_tcp_module(chain: &mut FilterChain, client: bool, stats: Option<&Any>) {
    let tcp_proxy = |chain: &FilterChain| {
        chain
            .filters
            .iter()
            .position(|f| f.name == "envoy.filters.network.tcp_proxy")
            .unwrap_or(chain.filters.len())
    };
    if let Some(stats) = stats
        && !has(&chain.filters, module_filter::STATS)
    {
        let at = tcp_proxy(chain);
        chain.filters.insert(
            at,
            module_filters::network_filter(module_filter::STATS, stats.clone()),
        );
    }
    let exchange = json_config(&TcpExchange::istio());
    if client {
        if !has(&chain.filters, module_filter::METADATA_EXCHANGE_UPSTREAM) {
            let at = tcp_proxy(chain);
            chain.filters.insert(
                at,
                module_filters::network_filter(module_filter::METADATA_EXCHANGE_UPSTREAM, exchange),
            );
        }
    } else if chain.transport_socket.is_some()
        && !has(&chain.filters, module_filter::METADATA_EXCHANGE)
    {
        chain.filters.insert(
            0,
            module_filters::network_filter(module_filter::METADATA_EXCHANGE, exchange),
        );
    }
}

/// The module's HTTP filters in a connection manager, as istiod places Istio's: the exchange
/// first, then (a client's) the ALPN, then the metrics just before the router.
fn with_module(hcm: &mut HttpConnectionManager, client: bool, stats: Option<&Any>) {
    let has =
        |hcm: &HttpConnectionManager, name: &str| hcm.http_filters.iter().any(|f| f.name == name);
    let before_router = |hcm: &HttpConnectionManager| hcm.http_filters.len().saturating_sub(1);
    if !has(hcm, module_filter::METADATA_EXCHANGE) {
        let config = if client {
            PeerMetadata::client()
        } else {
            PeerMetadata::server()
        };
        hcm.http_filters.insert(
            0,
            module_filters::http_filter(module_filter::METADATA_EXCHANGE, json_config(&config)),
        );
    }
    if client && !has(hcm, module_filter::ALPN) {
        let at = before_router(hcm);
        hcm.http_filters.insert(
            at,
            module_filters::http_filter(module_filter::ALPN, json_config(&module::Alpn::istio())),
        );
    }
    if let Some(stats) = stats
        && !has(hcm, module_filter::STATS)
    {
        let at = before_router(hcm);
        hcm.http_filters.insert(
            at,
            module_filters::http_filter(module_filter::STATS, stats.clone()),
        );
    }
}

/// `logger` for the listener itself: only connections no filter chain matched (`NR`).
fn no_route(mut logger: AccessLog) -> AccessLog {
    logger.filter = Some(AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::ResponseFlagFilter(
            ResponseFlagFilter {
                flags: vec!["NR".to_string()],
            },
        )),
    });
    logger
}
