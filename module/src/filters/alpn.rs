//! Istio's `istio.alpn`: the ALPN list of a request's upstream connection chosen by the HTTP
//! version the cluster speaks upstream, so the server's sidecar can tell Istio mTLS HTTP
//! (`istio-http/1.1`, `istio-h2`) from TCP. Set as the well-known filter state
//! `envoy.network.application_protocols`, which the router reads when it picks a connection
//! pool; a cluster whose metadata says `istio.alpn_override: "false"` keeps its own list.

use mesh_common::module::{Alpn, UpstreamProtocol, cluster};

use crate::envoy::HttpStream;
use crate::envoy::attribute;

const APPLICATION_PROTOCOLS: &str = "envoy.network.application_protocols";

pub struct Config {
    /// Comma-separated lists by protocol (HTTP/1.0, HTTP/1.1, HTTP/2).
    lists: [Option<String>; 3],
}

fn index(p: UpstreamProtocol) -> usize {
    match p {
        UpstreamProtocol::HTTP10 => 0,
        UpstreamProtocol::HTTP11 => 1,
        UpstreamProtocol::HTTP2 => 2,
    }
}

impl Config {
    pub fn new(c: Alpn) -> Config {
        let mut lists = [None, None, None];
        for o in c.alpn_override {
            if !o.alpn_override.is_empty() {
                lists[index(o.upstream_protocol)] = Some(o.alpn_override.join(","));
            }
        }
        Config { lists }
    }

    pub fn on_request(&self, s: &mut dyn HttpStream) {
        if s.cluster_metadata("istio", "alpn_override").as_deref() == Some(b"false") {
            return;
        }
        let said = s.cluster_metadata(cluster::NAMESPACE, cluster::UPSTREAM_PROTOCOL);
        // Envoy does not tell a module the cluster's protocol: a cluster the control plane
        // said nothing of keeps its own ALPN rather than be told a wrong one.
        if said.is_none()
            && s.cluster_metadata(cluster::NAMESPACE, cluster::SERVICE)
                .is_none()
        {
            return;
        }
        let protocol = match said.as_deref() {
            Some(b"HTTP2") => UpstreamProtocol::HTTP2,
            Some(b"downstream") => match s.attribute_string(attribute::REQUEST_PROTOCOL).as_deref()
            {
                Some(b"HTTP/2") | Some(b"HTTP/3") => UpstreamProtocol::HTTP2,
                Some(b"HTTP/1.0") => UpstreamProtocol::HTTP10,
                _ => UpstreamProtocol::HTTP11,
            },
            _ => UpstreamProtocol::HTTP11,
        };
        if let Some(list) = &self.lists[index(protocol)] {
            s.set_filter_state_typed(APPLICATION_PROTOCOLS, list.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::fake::FakeStream;

    #[test]
    fn the_list_follows_the_upstream_protocol() {
        let c = Config::new(Alpn::istio());
        let mut s = FakeStream::default();
        c.on_request(&mut s);
        assert!(
            s.typed_state.is_empty(),
            "no metadata: the cluster's own ALPN"
        );
        s.cluster.insert(
            (cluster::NAMESPACE.into(), cluster::SERVICE.into()),
            cluster::service("httpbin.demo.svc.cluster.local", "httpbin", "demo"),
        );
        c.on_request(&mut s);
        assert_eq!(
            s.typed_state[APPLICATION_PROTOCOLS],
            b"istio-http/1.1,istio,http/1.1"
        );
        let mut s = FakeStream::default();
        s.cluster.insert(
            (cluster::NAMESPACE.into(), cluster::UPSTREAM_PROTOCOL.into()),
            "HTTP2".into(),
        );
        c.on_request(&mut s);
        assert_eq!(s.typed_state[APPLICATION_PROTOCOLS], b"istio-h2,istio,h2");
        s.cluster
            .insert(("istio".into(), "alpn_override".into()), "false".into());
        s.typed_state.clear();
        c.on_request(&mut s);
        assert!(s.typed_state.is_empty());
    }
}
