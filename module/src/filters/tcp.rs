//! Istio's TCP filters: the metadata exchange at the start of a mesh connection
//! (istio/proxy `metadata_exchange`, config `envoy.tcp.metadataexchange.config.MetadataExchange`)
//! and the TCP standard metrics (`istio_stats`' network filter).
//!
//! The exchange: each side writes one frame ([`crate::peer::encode_frame`]) ahead of its first
//! bytes and strips the peer's from the other direction. Istio runs the client side as a
//! cluster filter that sees the negotiated ALPN; a dynamic module is no cluster filter in Envoy
//! 1.40, so the client side here runs on the outbound listener and speaks only toward an
//! upstream that presented a mesh certificate (a SPIFFE URI SAN), to which the cluster offered
//! `istio-peer-exchange` (the agent and istiod-core only configure it so). The server side
//! speaks only to a downstream that presented a mesh certificate and sent a frame: it answers
//! with its own; on a chain that takes only connections that negotiated the exchange's ALPN
//! (`negotiated`) it also announces itself ahead of the server's first bytes, as Istio's does. Either side takes bytes that are not a frame as the application's and passes
//! them on untouched, so a peer without the exchange is never fed a frame it would not strip.
//!
//! The metrics: a connection is counted opened once its peer is known (or at its close, if it
//! never is), its bytes as they pass, closed at its close, all through
//! [`crate::tcp_metrics`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_common::module::{Stats as StatsConfigJson, TCP_METRICS, TcpExchange};

use super::stats::{Tag, configured_reporter, reporter, shape, tcp_labels};
use super::{ConfigResult, DOWNSTREAM_PEER, UPSTREAM_PEER};
use crate::envoy::attribute;
use crate::envoy::{Connection, Flow};
use crate::labels::{Facts, Reporter, ServiceMeta, UNKNOWN, peer_labels, security_policy};
use crate::logging::{Level, log};
use crate::node::Own;
use crate::peer::{FRAME_HEADER_BYTES, Frame, decode_frame, encode_frame};

const SPIFFE: &[u8] = b"spiffe://";

pub struct ExchangeConfig {
    frame: Vec<u8>,
    additional: Vec<String>,
    /// The server's chain took only connections that negotiated the exchange.
    negotiated: bool,
    /// The client side (an outbound listener), else the server side (an inbound chain).
    client: bool,
}

impl ExchangeConfig {
    pub fn new(c: TcpExchange, own: &Own, client: bool) -> ExchangeConfig {
        ExchangeConfig {
            frame: encode_frame(&own.announced(&c.additional_labels), &own.id),
            additional: c.additional_labels,
            negotiated: c.negotiated,
            client,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing seen yet.
    Start,
    /// Waiting for the rest of the peer's frame.
    Reading,
    /// The exchange is over (done, or not to be had).
    Done,
}

pub struct Exchange<'c> {
    config: &'c ExchangeConfig,
    read: State,
    write: State,
}

/// What reading a frame at the start of some bytes came to.
enum Read {
    Wait,
    Pass,
    /// A frame of this many bytes, with the peer's announcement (base64, as the HTTP header).
    Frame(usize, Option<String>),
}

fn read_frame(prefix: &dyn Fn(usize) -> Vec<u8>, additional: &[String]) -> Read {
    let head = prefix(FRAME_HEADER_BYTES);
    match decode_frame(&head, additional) {
        Frame::NotAFrame => return Read::Pass,
        Frame::NeedMore if head.len() < FRAME_HEADER_BYTES => return Read::Wait,
        _ => {}
    }
    let len = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) as usize;
    match decode_frame(&prefix(FRAME_HEADER_BYTES + len), additional) {
        Frame::NeedMore => Read::Wait,
        Frame::NotAFrame => Read::Pass,
        Frame::Frame { len, peer } => Read::Frame(len, peer.map(|p| p.0.header_value())),
    }
}

impl<'c> Exchange<'c> {
    pub fn new(config: &'c ExchangeConfig) -> Exchange<'c> {
        Exchange {
            config,
            read: State::Start,
            write: State::Start,
        }
    }

    fn mesh_upstream(conn: &dyn Connection) -> bool {
        conn.attribute_string(attribute::UPSTREAM_URI_SAN_PEER)
            .is_some_and(|s| s.starts_with(SPIFFE))
    }

    /// Bytes from the downstream.
    pub fn on_read(&mut self, conn: &mut dyn Connection, end: bool) -> Flow {
        let c = self.config;
        if c.client {
            // The client announces itself ahead of its first bytes toward a mesh upstream.
            if self.read == State::Start {
                self.read = State::Done;
                if Self::mesh_upstream(conn) {
                    conn.prepend_read(&c.frame);
                }
            }
            return Flow::Continue;
        }
        if self.read == State::Done {
            return Flow::Continue;
        }
        if self.read == State::Start {
            let mesh = conn
                .peer_uri_san()
                .is_some_and(|s| s.as_bytes().starts_with(SPIFFE));
            if !mesh {
                self.read = State::Done;
                return Flow::Continue;
            }
            self.read = State::Reading;
        }
        match read_frame(&|n| conn.read_prefix(n), &c.additional) {
            Read::Wait if !end => Flow::Stop,
            Read::Wait | Read::Pass => {
                self.read = State::Done;
                Flow::Continue
            }
            Read::Frame(len, peer) => {
                self.read = State::Done;
                match peer {
                    Some(p) => {
                        conn.drain_read(len);
                        conn.set_filter_state_bytes(DOWNSTREAM_PEER, p.as_bytes());
                        // A client that spoke the exchange hears ours, ahead of any reply.
                        if self.write == State::Start {
                            self.write = State::Done;
                            conn.inject_write(&c.frame);
                        }
                    }
                    // Istio leaves a frame it cannot read in the stream.
                    None => log(Level::Debug, "istio module: a TCP peer frame did not parse"),
                }
                Flow::Continue
            }
        }
    }

    /// Bytes toward the downstream.
    pub fn on_write(&mut self, conn: &mut dyn Connection, end: bool) -> Flow {
        let c = self.config;
        if !c.client {
            // A client that negotiated the exchange hears the server first, as from Istio's;
            // otherwise the server's frame only answers a client's (on_read), and bytes the
            // server writes first carry none.
            if self.write == State::Start && c.negotiated {
                conn.prepend_write(&c.frame);
            }
            self.write = State::Done;
            return Flow::Continue;
        }
        if self.write == State::Done {
            return Flow::Continue;
        }
        if self.write == State::Start {
            if !Self::mesh_upstream(conn) {
                self.write = State::Done;
                return Flow::Continue;
            }
            self.write = State::Reading;
        }
        match read_frame(&|n| conn.write_prefix(n), &c.additional) {
            Read::Wait if !end => Flow::Stop,
            Read::Wait | Read::Pass => {
                self.write = State::Done;
                Flow::Continue
            }
            Read::Frame(len, peer) => {
                self.write = State::Done;
                if let Some(p) = peer {
                    conn.drain_write(len);
                    conn.set_filter_state_bytes(UPSTREAM_PEER, p.as_bytes());
                }
                Flow::Continue
            }
        }
    }
}

/// The network `istio.stats`.
pub struct StatsConfig {
    reporter: Option<Reporter>,
    own: &'static Own,
    /// Per TCP metric: counted or dropped by the config.
    counted: [bool; 4],
    /// Values of standard tags set by the config (the tag's index, its value).
    set: Vec<(usize, Tag)>,
}

impl StatsConfig {
    pub fn new(c: StatsConfigJson, own: &'static Own) -> ConfigResult<StatsConfig> {
        let reporter = configured_reporter(&c)?;
        let standard = tcp_labels();
        let mut counted = [false; 4];
        let mut set = Vec::new();
        for (i, short) in TCP_METRICS.iter().enumerate() {
            let Some(tags) = shape(short, &standard, &c.metrics) else {
                continue;
            };
            counted[i] = true;
            let names: Vec<&str> = tags.iter().map(|(n, _)| n.as_str()).collect();
            if names != standard {
                log(
                    Level::Warn,
                    &format!(
                        "istio module: {} keeps Istio's standard labels: tags added to or \
                         removed from TCP metrics are not reported by this module",
                        super::stats::metric_name(short)
                    ),
                );
            }
            for (n, t) in tags {
                if let Some(idx) = standard.iter().position(|s| *s == n)
                    && !matches!(t, Tag::Standard(_))
                    && !set.iter().any(|(have, _)| *have == idx)
                {
                    set.push((idx, t));
                }
            }
        }
        Ok(StatsConfig {
            reporter,
            own,
            counted,
            set,
        })
    }
}

/// How often a connection's byte counts move to the shared table, at most.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

pub struct Stats<'c> {
    config: &'c StatsConfig,
    labels: Option<Arc<Vec<String>>>,
    /// Counts not yet published: opened, closed, sent, received.
    pending: [u64; 4],
    published: Option<Instant>,
    reads: bool,
}

/// The service of a cluster named as Istio names outbound clusters
/// (`outbound|PORT|SUBSET|HOST`): the host; for a Kubernetes service host
/// (`NAME.NAMESPACE.svc...`) its name and namespace, else the host as the name.
pub fn service_of_cluster(cluster: &str) -> Option<ServiceMeta> {
    let mut parts = cluster.split('|');
    let (_, _, _, host) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if host.is_empty() {
        return None;
    }
    let (name, namespace) = mesh_common::module::cluster::name_of(host);
    Some(ServiceMeta {
        host: host.to_string(),
        name: name.to_string(),
        namespace: namespace.to_string(),
    })
}

fn text(v: Option<Vec<u8>>) -> Option<String> {
    v.map(|b| String::from_utf8_lossy(&b).into_owned())
        .filter(|s| !s.is_empty())
}

impl<'c> Stats<'c> {
    pub fn new(config: &'c StatsConfig) -> Stats<'c> {
        Stats {
            config,
            labels: None,
            pending: [1, 0, 0, 0],
            published: None,
            reads: false,
        }
    }

    pub fn on_new_connection(&mut self, _conn: &mut dyn Connection) {}

    pub fn on_read(&mut self, conn: &mut dyn Connection, len: usize) {
        self.reads = true;
        self.pending[3] += len as u64;
        self.progress(conn, false);
    }

    pub fn on_write(&mut self, conn: &mut dyn Connection, len: usize) {
        self.pending[2] += len as u64;
        self.progress(conn, false);
    }

    pub fn on_close(&mut self, conn: &mut dyn Connection) {
        self.pending[1] += 1;
        self.progress(conn, true);
    }

    fn progress(&mut self, conn: &dyn Connection, closing: bool) {
        if self.labels.is_none() {
            let reporter = reporter(
                self.config.reporter,
                conn.attribute_int(attribute::XDS_LISTENER_DIRECTION),
            );
            let known = match reporter {
                // The server's exchange ran on the first bytes read, before this filter.
                Reporter::Destination => self.reads,
                // The client's learns the server from its reply.
                Reporter::Source => {
                    conn.filter_state_bytes(UPSTREAM_PEER).is_some()
                        || !conn
                            .attribute_string(attribute::UPSTREAM_URI_SAN_PEER)
                            .is_some_and(|s| s.starts_with(SPIFFE))
                }
            };
            if !known && !closing {
                return;
            }
            self.labels = Some(Arc::new(self.compute(reporter, conn)));
        }
        let due = self.published.is_none_or(|t| t.elapsed() >= PUBLISH_EVERY);
        if closing || due {
            if let Some(l) = &self.labels {
                let mut counts = std::mem::take(&mut self.pending);
                for (c, counted) in counts.iter_mut().zip(self.config.counted) {
                    if !counted {
                        *c = 0;
                    }
                }
                crate::tcp_metrics::add(l, counts);
            }
            self.published = Some(Instant::now());
        }
    }

    fn compute(&self, reporter: Reporter, conn: &dyn Connection) -> Vec<String> {
        let server = reporter == Reporter::Destination;
        let announcement = conn.filter_state_bytes(if server {
            DOWNSTREAM_PEER
        } else {
            UPSTREAM_PEER
        });
        let peer = announcement.as_deref().and_then(|a| super::peer(a, &[]));
        let (peer_san, local_san) = if server {
            (
                conn.peer_uri_san().filter(|s| !s.is_empty()),
                text(conn.attribute_string(attribute::CONNECTION_URI_SAN_LOCAL)),
            )
        } else {
            (
                text(conn.attribute_string(attribute::UPSTREAM_URI_SAN_PEER)),
                text(conn.attribute_string(attribute::UPSTREAM_URI_SAN_LOCAL)),
            )
        };
        let cluster = text(conn.attribute_string(attribute::XDS_CLUSTER_NAME));
        let facts = Facts {
            peer: peer.as_deref(),
            peer_san: peer_san.as_deref(),
            local_san: local_san.as_deref(),
            cluster: cluster.as_deref(),
            route: None,
            service: cluster.as_deref().and_then(service_of_cluster),
            endpoint_workload: None,
            host: None,
        };
        let mut labels = peer_labels(&self.config.own.workload, reporter, &facts);
        labels.push("tcp".to_string());
        labels.push(super::stats::response_flags(
            conn.attribute_int(crate::envoy::attribute::RESPONSE_FLAGS)
                .unwrap_or(0),
        ));
        labels.push(security_policy(reporter, &facts).to_string());
        for (i, t) in &self.config.set {
            let v = match t {
                Tag::Value(mesh_common::module::TagValue::Literal(l)) => l.clone(),
                _ => UNKNOWN.to_string(),
            };
            if let Some(slot) = labels.get_mut(*i) {
                *slot = v;
            }
        }
        labels
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::filters::fake::{FakeConnection, own};
    use crate::peer::Workload;

    #[test]
    fn client_and_server_exchange_frames_and_strip_them() {
        let client_cfg = ExchangeConfig::new(TcpExchange::istio(), own("sleep"), true);
        let server_cfg = ExchangeConfig::new(TcpExchange::istio(), own("tcp-echo"), false);
        let mut client = Exchange::new(&client_cfg);
        let mut server = Exchange::new(&server_cfg);
        // The client's app writes "hello" toward a mesh upstream.
        let mut cc = FakeConnection::default();
        cc.strings.insert(
            attribute::UPSTREAM_URI_SAN_PEER,
            "spiffe://cluster.local/ns/demo/sa/tcp-echo".into(),
        );
        cc.read = b"hello".to_vec();
        assert_eq!(client.on_read(&mut cc, false), Flow::Continue);
        let on_wire = cc.read.clone();
        assert!(on_wire.ends_with(b"hello") && on_wire.len() > 5 + FRAME_HEADER_BYTES);
        // The server's sidecar reads it in two pieces: it waits for the whole frame.
        let mut sc = FakeConnection {
            peer_san: Some("spiffe://cluster.local/ns/demo/sa/sleep".into()),
            read: on_wire[..10].to_vec(),
            ..FakeConnection::default()
        };
        assert_eq!(server.on_read(&mut sc, false), Flow::Stop);
        sc.read = on_wire.clone();
        assert_eq!(server.on_read(&mut sc, false), Flow::Continue);
        assert_eq!(sc.read, b"hello");
        let learnt = sc.state[DOWNSTREAM_PEER].clone();
        assert_eq!(
            crate::filters::peer(&learnt, &[]).unwrap().workload,
            "sleep"
        );
        // It answers with its own frame, which the client strips.
        assert!(!sc.injected.is_empty());
        cc.write = [sc.injected.clone(), b"hello".to_vec()].concat();
        assert_eq!(client.on_write(&mut cc, false), Flow::Continue);
        assert_eq!(cc.write, b"hello");
        let learnt = cc.state[UPSTREAM_PEER].clone();
        assert_eq!(
            crate::filters::peer(&learnt, &[]).unwrap().workload,
            "tcp-echo"
        );
    }

    #[test]
    fn a_negotiated_server_announces_itself_on_its_first_bytes() {
        let mut cfg = TcpExchange::istio();
        cfg.negotiated = true;
        let server_cfg = ExchangeConfig::new(cfg, own("tcp-echo"), false);
        let mut server = Exchange::new(&server_cfg);
        let mut sc = FakeConnection {
            peer_san: Some("spiffe://cluster.local/ns/demo/sa/sleep".into()),
            write: b"hi\n".to_vec(),
            ..FakeConnection::default()
        };
        server.on_write(&mut sc, false);
        assert!(sc.write.len() > 3 + FRAME_HEADER_BYTES && sc.write.ends_with(b"hi\n"));
        // The client's frame later is read, and not answered twice.
        let client_cfg = ExchangeConfig::new(TcpExchange::istio(), own("sleep"), true);
        sc.read = client_cfg.frame.clone();
        server.on_read(&mut sc, false);
        assert!(sc.read.is_empty() && sc.injected.is_empty());
        // Without negotiation a server writing first sends no frame.
        let plain = ExchangeConfig::new(TcpExchange::istio(), own("tcp-echo"), false);
        let mut server = Exchange::new(&plain);
        let mut sc = FakeConnection {
            write: b"hi\n".to_vec(),
            ..FakeConnection::default()
        };
        server.on_write(&mut sc, false);
        assert_eq!(sc.write, b"hi\n");
    }

    #[test]
    fn no_frame_toward_or_from_a_peer_outside_the_mesh() {
        let client_cfg = ExchangeConfig::new(TcpExchange::istio(), own("sleep"), true);
        let mut client = Exchange::new(&client_cfg);
        let mut cc = FakeConnection {
            read: b"GET / HTTP/1.1\r\n".to_vec(),
            ..FakeConnection::default()
        };
        client.on_read(&mut cc, false);
        assert_eq!(cc.read, b"GET / HTTP/1.1\r\n");
        // A server's bytes that look like a frame's start still pass (no mesh upstream).
        cc.write = crate::peer::FRAME_MAGIC.to_be_bytes().to_vec();
        assert_eq!(client.on_write(&mut cc, false), Flow::Continue);
        assert_eq!(cc.write.len(), 4);
        // A server sidecar whose client is not in the mesh passes bytes as they come.
        let server_cfg = ExchangeConfig::new(TcpExchange::istio(), own("tcp-echo"), false);
        let mut server = Exchange::new(&server_cfg);
        let mut sc = FakeConnection {
            read: crate::peer::FRAME_MAGIC.to_be_bytes().to_vec(),
            ..FakeConnection::default()
        };
        assert_eq!(server.on_read(&mut sc, false), Flow::Continue);
        assert_eq!(sc.read.len(), 4);
        assert!(sc.injected.is_empty());
        // A mesh client that sends no frame gets none back.
        let mut server = Exchange::new(&server_cfg);
        let mut sc = FakeConnection {
            peer_san: Some("spiffe://cluster.local/ns/demo/sa/sleep".into()),
            read: b"ping".to_vec(),
            ..FakeConnection::default()
        };
        assert_eq!(server.on_read(&mut sc, false), Flow::Continue);
        assert_eq!(sc.read, b"ping");
        assert!(sc.injected.is_empty());
    }

    #[test]
    fn a_server_counts_its_connection_with_the_peers_labels() {
        let config = StatsConfig::new(StatsConfigJson::default(), own("tcp-echo")).unwrap();
        let mut s = Stats::new(&config);
        let mut conn = FakeConnection {
            peer_san: Some("spiffe://cluster.local/ns/demo/sa/sleep-tcp-test".into()),
            ..FakeConnection::default()
        };
        conn.ints.insert(attribute::XDS_LISTENER_DIRECTION, 1);
        let peer = Workload {
            workload: "sleep-tcp-test".into(),
            namespace: "demo".into(),
            ..Workload::default()
        };
        conn.state
            .insert(DOWNSTREAM_PEER.into(), peer.header_value().into_bytes());
        s.on_read(&mut conn, 5);
        s.on_write(&mut conn, 7);
        s.on_close(&mut conn);
        let mine: Vec<_> = crate::tcp_metrics::drain()
            .into_iter()
            .filter(|(l, _)| l[1] == "sleep-tcp-test")
            .collect();
        assert_eq!(mine.len(), 1);
        let (labels, counts) = &mine[0];
        assert_eq!(labels[0], "destination");
        assert_eq!(labels[9], "tcp-echo");
        assert_eq!(labels[20], "tcp");
        assert_eq!(*counts, [1, 1, 7, 5]);
    }

    #[test]
    fn services_from_outbound_cluster_names() {
        let s = service_of_cluster("outbound|9000||tcp-echo.demo.svc.cluster.local").unwrap();
        assert_eq!(
            (s.name.as_str(), s.namespace.as_str()),
            ("tcp-echo", "demo")
        );
        let s = service_of_cluster("outbound|443||httpbin.org").unwrap();
        assert_eq!((s.name.as_str(), s.namespace.as_str()), ("httpbin.org", ""));
        assert!(service_of_cluster("inbound|9000||").is_none());
        assert!(service_of_cluster("PassthroughCluster").is_none());
    }
}
