//! Telemetry on a proxy's listeners, as Istio puts it there: standard metrics (`metrics`),
//! access logs (`access_log`) and tracing (`tracing`), from what `push_context::telemetry`
//! merged for the proxy (Telemetry resources, MeshConfig defaults and legacy switches). One
//! pass over finished listeners: every HTTP connection manager and tcp_proxy, plus the
//! listener's own "no route" log, on the sidecar's inbound (server) and outbound (client)
//! listeners and a gateway's (client, as in Istio).

pub mod access_log;
pub mod provider;
pub mod tracing;

use mesh_common::telemetry::{
    MetricsPlan, Reporter, http_access_log, peer, tcp_access_log, tcp_access_log_options,
};

use envoy_types::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, ResponseFlagFilter, access_log_filter,
};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use prost::Message;

use crate::config_store::MeshConfigSpec;
use crate::model::Proxy;
use crate::push_context::PushContext;
use crate::push_context::telemetry::Side;
use provider::{Resolved, resolve};

/// What to add to one side's listeners, worked out once per side.
pub struct Instruments {
    reporter: Reporter,
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
            metrics: side.metrics.clone(),
            http_logs,
            tcp_logs,
            listener_logs,
            tracing,
        }
    }

    /// Adds the loggers and tracing to every HTTP connection manager and tcp_proxy of
    /// `listener`, and its own no-route log.
    pub fn apply(&self, listener: &mut Listener) {
        listener
            .access_log
            .extend(self.listener_logs.iter().cloned());
        let chains = listener
            .filter_chains
            .iter_mut()
            .chain(listener.default_filter_chain.as_mut());
        for chain in chains {
            for f in &mut chain.filters {
                let Some(filter::ConfigType::TypedConfig(any)) = &mut f.config_type else {
                    continue;
                };
                let edited = match f.name.as_str() {
                    "envoy.filters.network.http_connection_manager" => {
                        HttpConnectionManager::decode(any.value.as_slice())
                            .ok()
                            .map(|mut hcm| {
                                if let Some(m) = &self.metrics {
                                    hcm.access_log.push(http_access_log(self.reporter, m));
                                    with_peer_exchange(&mut hcm, self.reporter == Reporter::Source);
                                }
                                hcm.access_log.extend(self.http_logs.iter().cloned());
                                if hcm.tracing.is_none() {
                                    hcm.tracing.clone_from(&self.tracing);
                                }
                                hcm.encode_to_vec()
                            })
                    }
                    "envoy.filters.network.tcp_proxy" => {
                        TcpProxy::decode(any.value.as_slice()).ok().map(|mut tcp| {
                            if let Some(m) = &self.metrics {
                                tcp.access_log.push(tcp_access_log(self.reporter, m));
                                tcp.access_log_options = Some(tcp_access_log_options(m));
                            }
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
        }
    }
}

/// The peer exchange's filters (`peer`) before the connection manager's last filter (its
/// router), once.
fn with_peer_exchange(hcm: &mut HttpConnectionManager, client: bool) {
    if hcm
        .http_filters
        .iter()
        .any(|f| peer::is_peer_filter(&f.name))
    {
        return;
    }
    let at = hcm.http_filters.len().saturating_sub(1);
    for (i, f) in peer::filters(client).into_iter().enumerate() {
        hcm.http_filters.insert(at + i, f);
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
