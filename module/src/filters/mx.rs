//! Istio's HTTP peer metadata exchange (istio/proxy `peer_metadata`, config
//! `io.istio.http.peer_metadata.Config`): a client announces its workload on requests and
//! learns the server's from the response; a server learns the client's from the request and
//! answers with its own only to a client that announced itself. The exchange's headers never
//! reach the application on either side: every configured discovery removes them.
//!
//! Discovery by `istio_headers` is what a sidecar can do; `workload_discovery` needs Istio's
//! ambient workload xDS and `baggage` and `upstream_filter_state` serve waypoints, so they find
//! nothing here (as in a sidecar of Istio's, whose node says `METADATA_DISCOVERY: "false"`).

use mesh_common::module::PeerMetadata;

use super::{DOWNSTREAM_PEER, UPSTREAM_PEER};
use crate::envoy::{HttpStream, Phase};
use crate::node::Own;
use crate::peer::{ID_HEADER, METADATA_HEADER};

/// Cluster metadata Istio's control plane sets (`filter_metadata.istio`).
const ISTIO: &str = "istio";

pub struct Config {
    downstream_headers: bool,
    upstream_headers: bool,
    announce_downstream: bool,
    announce_upstream: bool,
    skip_external: bool,
    /// Our announcement, computed once (`x-envoy-peer-metadata`).
    metadata: String,
    id: String,
}

impl Config {
    pub fn new(c: PeerMetadata, own: &Own) -> Config {
        let headers =
            |d: &[mesh_common::module::Discovery]| d.iter().any(|m| m.istio_headers.is_some());
        fn announce(
            p: &[mesh_common::module::Propagation],
        ) -> Option<&mesh_common::module::IstioHeaders> {
            p.iter().find_map(|m| m.istio_headers.as_ref())
        }
        let upstream = announce(&c.upstream_propagation);
        Config {
            downstream_headers: headers(&c.downstream_discovery),
            upstream_headers: headers(&c.upstream_discovery),
            announce_downstream: announce(&c.downstream_propagation).is_some(),
            announce_upstream: upstream.is_some(),
            skip_external: upstream.is_some_and(|h| h.skip_external_clusters),
            metadata: own.announced(&c.additional_labels).header_value(),
            id: own.id.clone(),
        }
    }
}

pub struct Filter<'c> {
    config: &'c Config,
    /// The request carried the id / the metadata header (a server answers in kind).
    had_id: bool,
    had_metadata: bool,
}

fn text(v: Option<Vec<u8>>) -> Option<Vec<u8>> {
    v.filter(|v| !v.is_empty())
}

impl<'c> Filter<'c> {
    pub fn new(config: &'c Config) -> Filter<'c> {
        Filter {
            config,
            had_id: false,
            had_metadata: false,
        }
    }

    pub fn on(&mut self, phase: Phase, s: &mut dyn HttpStream) {
        let c = self.config;
        match phase {
            Phase::RequestHeaders => {
                if c.downstream_headers {
                    let id = text(s.request_header(ID_HEADER));
                    let metadata = text(s.request_header(METADATA_HEADER));
                    self.had_id = id.is_some();
                    self.had_metadata = metadata.is_some();
                    if let Some(m) = metadata {
                        s.set_filter_state_bytes(DOWNSTREAM_PEER, &m);
                    }
                    if self.had_id || self.had_metadata {
                        s.set_request_header(ID_HEADER, None);
                        s.set_request_header(METADATA_HEADER, None);
                    }
                }
                if c.announce_upstream && !self.skip(s) {
                    s.set_request_header(
                        ID_HEADER,
                        Some(&c.id).filter(|i| !i.is_empty()).map(|i| i.as_str()),
                    );
                    s.set_request_header(METADATA_HEADER, Some(&c.metadata));
                }
            }
            Phase::ResponseHeaders => {
                if c.upstream_headers {
                    let id = text(s.response_header(ID_HEADER));
                    let metadata = text(s.response_header(METADATA_HEADER));
                    if let Some(m) = &metadata {
                        s.set_filter_state_bytes(UPSTREAM_PEER, m);
                    }
                    if id.is_some() || metadata.is_some() {
                        s.set_response_header(ID_HEADER, None);
                        s.set_response_header(METADATA_HEADER, None);
                    }
                }
                if c.announce_downstream {
                    if self.had_id && !c.id.is_empty() {
                        s.set_response_header(ID_HEADER, Some(&c.id));
                    }
                    if self.had_metadata {
                        s.set_response_header(METADATA_HEADER, Some(&c.metadata));
                    }
                }
            }
            Phase::Complete => {}
        }
    }

    /// Istio's rule for not announcing upstream: a cluster marked `disable_mx`, or with
    /// `skip_external_clusters` the passthrough cluster and clusters marked `external`.
    fn skip(&self, s: &dyn HttpStream) -> bool {
        if s.cluster_metadata_bool(ISTIO, "disable_mx") == Some(true) {
            return true;
        }
        if !self.config.skip_external {
            return false;
        }
        s.attribute_string(crate::envoy::attribute::XDS_CLUSTER_NAME)
            .is_some_and(|c| c == b"PassthroughCluster")
            || s.cluster_metadata_bool(ISTIO, "external") == Some(true)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::filters::fake::{FakeStream, own};
    use crate::peer::Workload;

    #[test]
    fn a_request_and_its_response_through_both_sides() {
        let client = Config::new(PeerMetadata::client(), own("sleep"));
        let server = Config::new(PeerMetadata::server(), own("httpbin"));
        let mut s = FakeStream::default();
        s.request.insert("x-app".into(), "1".into());
        // Client side, request.
        Filter::new(&client).on(Phase::RequestHeaders, &mut s);
        let announced = s.request[METADATA_HEADER].clone();
        assert_eq!(s.request[ID_HEADER], client.id);
        assert_eq!(
            Workload::from_header(&announced, &[]).unwrap().workload,
            "sleep"
        );
        // Server side, request: learnt, and gone before the app.
        let mut server_stream = FakeStream {
            request: s.request.clone(),
            ..FakeStream::default()
        };
        let mut f = Filter::new(&server);
        f.on(Phase::RequestHeaders, &mut server_stream);
        assert!(!server_stream.request.contains_key(METADATA_HEADER));
        assert!(!server_stream.request.contains_key(ID_HEADER));
        assert_eq!(server_stream.state[DOWNSTREAM_PEER], announced.as_bytes());
        // Server side, response: answered in kind.
        f.on(Phase::ResponseHeaders, &mut server_stream);
        assert_eq!(server_stream.response[ID_HEADER], server.id);
        // Client side, response: learnt, and gone before the app.
        s.response = server_stream.response.clone();
        let mut cf = Filter::new(&client);
        cf.on(Phase::ResponseHeaders, &mut s);
        assert!(!s.response.contains_key(METADATA_HEADER));
        let learnt = s.state[UPSTREAM_PEER].clone();
        assert_eq!(
            crate::filters::peer(&learnt, &[]).unwrap().workload,
            "httpbin"
        );
    }

    #[test]
    fn a_client_outside_the_mesh_gets_nothing_back() {
        let server = Config::new(PeerMetadata::server(), own("httpbin"));
        let mut s = FakeStream::default();
        let mut f = Filter::new(&server);
        f.on(Phase::RequestHeaders, &mut s);
        f.on(Phase::ResponseHeaders, &mut s);
        assert!(s.response.is_empty());
        assert!(s.state.is_empty());
    }

    #[test]
    fn external_clusters_are_skipped_when_asked() {
        let mut cfg = PeerMetadata::client();
        cfg.upstream_propagation[0]
            .istio_headers
            .as_mut()
            .unwrap()
            .skip_external_clusters = true;
        let client = Config::new(cfg, own("sleep"));
        let mut s = FakeStream::default();
        s.cluster_bools
            .insert(("istio".into(), "external".into()), true);
        Filter::new(&client).on(Phase::RequestHeaders, &mut s);
        assert!(!s.request.contains_key(METADATA_HEADER));
        // disable_mx skips whatever the config says.
        let client = Config::new(PeerMetadata::client(), own("sleep"));
        let mut s = FakeStream::default();
        s.cluster_bools
            .insert(("istio".into(), "disable_mx".into()), true);
        Filter::new(&client).on(Phase::RequestHeaders, &mut s);
        assert!(!s.request.contains_key(METADATA_HEADER));
    }
}
