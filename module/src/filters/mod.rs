//! One filter per Istio extension, chosen by the `filter_name` of its Envoy config
//! ([`mesh_common::module::filter`]), each config in the JSON of Istio's own proto.
//!
//! The filters of one stream or connection meet in its filter state: the exchange stores the
//! peer's announcement (the base64 Struct, as `x-envoy-peer-metadata` carries it) under
//! [`DOWNSTREAM_PEER`] or [`UPSTREAM_PEER`], and the metrics read it back through [`peer`], a
//! per-worker cache of decoded announcements (Istio's exchange keeps one too).

pub mod alpn;
pub mod mx;
pub mod stats;
pub mod tcp;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use mesh_common::module::filter;

use crate::envoy::{Connection, Flow, HttpConfig, HttpStream, Phase};
use crate::peer::Workload;

/// Filter state: the announcement of the peer downstream (set by a server's exchange).
pub const DOWNSTREAM_PEER: &str = "io.istio.module.downstream_peer";
/// Filter state: the announcement of the peer upstream (set by a client's exchange).
pub const UPSTREAM_PEER: &str = "io.istio.module.upstream_peer";

/// Most announcements a worker keeps decoded (Istio's bound).
const PEER_CACHE: usize = 500;

thread_local! {
    static PEERS: RefCell<HashMap<Vec<u8>, Rc<Workload>>> = RefCell::new(HashMap::new());
}

/// The workload an announcement describes (`None` when it is not Istio's encoding), decoded
/// once per worker while it stays among the last [`PEER_CACHE`].
pub fn peer(announcement: &[u8], additional: &[String]) -> Option<Rc<Workload>> {
    if let Some(w) = PEERS.with(|p| p.borrow().get(announcement).cloned()) {
        return Some(w);
    }
    let w = Rc::new(Workload::from_header(
        std::str::from_utf8(announcement).ok()?,
        additional,
    )?);
    PEERS.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() >= PEER_CACHE {
            // As Istio's cache: a quarter goes, in no particular order.
            let drop: Vec<Vec<u8>> = p.keys().take(PEER_CACHE / 4).cloned().collect();
            for k in drop {
                p.remove(&k);
            }
        }
        p.insert(announcement.to_vec(), w.clone());
    });
    Some(w)
}

/// A filter config, or why Envoy must refuse it.
pub type ConfigResult<T> = Result<T, String>;

fn parse<T: serde::de::DeserializeOwned + Default>(name: &str, json: &str) -> ConfigResult<T> {
    if json.trim().is_empty() {
        return Ok(T::default());
    }
    serde_json::from_str(json)
        .map_err(|e| format!("filter {name}: config {json:?} is not valid: {e}"))
}

/// An HTTP filter's config.
pub enum HttpFilterConfig {
    Exchange(mx::Config),
    Stats(stats::Config),
    Alpn(alpn::Config),
    Flush(stats::FlushConfig),
}

impl HttpFilterConfig {
    pub fn new(
        name: &str,
        json: &str,
        envoy: &mut dyn HttpConfig,
    ) -> ConfigResult<HttpFilterConfig> {
        Ok(match name {
            filter::METADATA_EXCHANGE => {
                HttpFilterConfig::Exchange(mx::Config::new(parse(name, json)?, crate::node::own()))
            }
            filter::STATS => HttpFilterConfig::Stats(stats::Config::new(
                parse(name, json)?,
                crate::node::own(),
                envoy,
            )?),
            filter::ALPN => HttpFilterConfig::Alpn(alpn::Config::new(parse(name, json)?)),
            filter::STATS_FLUSH => HttpFilterConfig::Flush(stats::FlushConfig::new(envoy)?),
            other => {
                return Err(format!(
                    "no HTTP filter {other:?} in this module (it has {}, {}, {}, {})",
                    filter::METADATA_EXCHANGE,
                    filter::STATS,
                    filter::ALPN,
                    filter::STATS_FLUSH
                ));
            }
        })
    }
}

/// One stream's filter.
pub enum HttpFilter<'c> {
    Exchange(mx::Filter<'c>),
    Stats(stats::Filter<'c>),
    Alpn(&'c alpn::Config),
    Flush(&'c stats::FlushConfig),
}

impl<'c> HttpFilter<'c> {
    pub fn new(config: &'c HttpFilterConfig) -> HttpFilter<'c> {
        match config {
            HttpFilterConfig::Exchange(c) => HttpFilter::Exchange(mx::Filter::new(c)),
            HttpFilterConfig::Stats(c) => HttpFilter::Stats(stats::Filter::new(c)),
            HttpFilterConfig::Alpn(c) => HttpFilter::Alpn(c),
            HttpFilterConfig::Flush(c) => HttpFilter::Flush(c),
        }
    }

    pub fn on(&mut self, phase: Phase, stream: &mut dyn HttpStream) {
        match self {
            HttpFilter::Exchange(f) => f.on(phase, stream),
            HttpFilter::Stats(f) => f.on(phase, stream),
            HttpFilter::Alpn(c) => {
                if phase == Phase::RequestHeaders {
                    c.on_request(stream);
                }
            }
            HttpFilter::Flush(c) => {
                if phase == Phase::RequestHeaders {
                    c.flush(stream);
                }
            }
        }
    }
}

/// A network filter's config.
pub enum NetworkFilterConfig {
    Exchange(tcp::ExchangeConfig),
    Stats(tcp::StatsConfig),
}

impl NetworkFilterConfig {
    pub fn new(name: &str, json: &str) -> ConfigResult<NetworkFilterConfig> {
        Ok(match name {
            filter::METADATA_EXCHANGE => NetworkFilterConfig::Exchange(tcp::ExchangeConfig::new(
                parse(name, json)?,
                crate::node::own(),
                false,
            )),
            filter::METADATA_EXCHANGE_UPSTREAM => NetworkFilterConfig::Exchange(
                tcp::ExchangeConfig::new(parse(name, json)?, crate::node::own(), true),
            ),
            filter::STATS => NetworkFilterConfig::Stats(tcp::StatsConfig::new(
                parse(name, json)?,
                crate::node::own(),
            )?),
            other => {
                return Err(format!(
                    "no network filter {other:?} in this module (it has {}, {}, {})",
                    filter::METADATA_EXCHANGE,
                    filter::METADATA_EXCHANGE_UPSTREAM,
                    filter::STATS
                ));
            }
        })
    }
}

/// One connection's filter.
pub enum NetworkFilter<'c> {
    Exchange(tcp::Exchange<'c>),
    Stats(tcp::Stats<'c>),
}

impl<'c> NetworkFilter<'c> {
    pub fn new(config: &'c NetworkFilterConfig) -> NetworkFilter<'c> {
        match config {
            NetworkFilterConfig::Exchange(c) => NetworkFilter::Exchange(tcp::Exchange::new(c)),
            NetworkFilterConfig::Stats(c) => NetworkFilter::Stats(tcp::Stats::new(c)),
        }
    }

    pub fn on_new_connection(&mut self, conn: &mut dyn Connection) {
        if let NetworkFilter::Stats(s) = self {
            s.on_new_connection(conn);
        }
    }

    pub fn on_read(&mut self, conn: &mut dyn Connection, len: usize, end: bool) -> Flow {
        match self {
            NetworkFilter::Exchange(x) => x.on_read(conn, end),
            NetworkFilter::Stats(s) => {
                s.on_read(conn, len);
                Flow::Continue
            }
        }
    }

    pub fn on_write(&mut self, conn: &mut dyn Connection, len: usize, end: bool) -> Flow {
        match self {
            NetworkFilter::Exchange(x) => x.on_write(conn, end),
            NetworkFilter::Stats(s) => {
                s.on_write(conn, len);
                Flow::Continue
            }
        }
    }

    pub fn on_close(&mut self, conn: &mut dyn Connection) {
        if let NetworkFilter::Stats(s) = self {
            s.on_close(conn);
        }
    }
}

#[cfg(test)]
pub mod fake;
