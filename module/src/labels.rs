//! The labels of Istio's standard metrics, in Istio's order, computed as istio/proxy's
//! `istio_stats` filter computes them: this proxy's own workload from its node metadata, the
//! peer's from the metadata exchange (checked against the peer's certificate), the service from
//! the cluster's `istio.services` metadata or the Host header, `unknown` (and `latest` for a
//! canonical revision) for what is not known.

use crate::peer::Workload;

pub const UNKNOWN: &str = "unknown";
pub const LATEST: &str = "latest";

/// The labels every metric has, in Istio's order.
pub const PEER_LABELS: [&str; 20] = [
    "reporter",
    "source_workload",
    "source_canonical_service",
    "source_canonical_revision",
    "source_workload_namespace",
    "source_principal",
    "source_app",
    "source_version",
    "source_cluster",
    "destination_workload",
    "destination_workload_namespace",
    "destination_principal",
    "destination_app",
    "destination_version",
    "destination_service",
    "destination_canonical_service",
    "destination_canonical_revision",
    "destination_service_name",
    "destination_service_namespace",
    "destination_cluster",
];

/// The labels of the HTTP metrics after [`PEER_LABELS`].
pub const HTTP_LABELS: [&str; 5] = [
    "request_protocol",
    "response_code",
    "grpc_response_status",
    "response_flags",
    "connection_security_policy",
];

/// The labels of the TCP metrics after [`PEER_LABELS`].
pub const TCP_LABELS: [&str; 3] = [
    "request_protocol",
    "response_flags",
    "connection_security_policy",
];

pub use mesh_common::module::Reporter;

/// The first entry of a cluster's `istio.services` metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceMeta {
    pub host: String,
    pub name: String,
    pub namespace: String,
}

/// What one request or connection tells the labels.
#[derive(Debug, Clone, Default)]
pub struct Facts<'a> {
    /// The peer from the metadata exchange, if any.
    pub peer: Option<&'a Workload>,
    /// The first URI SAN of the peer's certificate on this connection (the downstream's on a
    /// server, the upstream's on a client).
    pub peer_san: Option<&'a str>,
    /// The first URI SAN of this proxy's own certificate on that connection.
    pub local_san: Option<&'a str>,
    /// The upstream cluster's name.
    pub cluster: Option<&'a str>,
    /// The route's name (Istio's `block_all` and `allow_any`).
    pub route: Option<&'a str>,
    /// The cluster's `istio.services` metadata.
    pub service: Option<ServiceMeta>,
    /// The upstream host's `istio.workload` metadata (`name;namespace;service;revision;cluster`):
    /// a client's fallback for the peer when no exchange happened.
    pub endpoint_workload: Option<&'a str>,
    /// The request's Host, where host-header fallback applies.
    pub host: Option<&'a str>,
}

/// The namespace of a SPIFFE id `spiffe://TD/ns/NS/sa/SA`.
pub fn spiffe_namespace(id: &str) -> Option<&str> {
    let rest = id.strip_prefix("spiffe://")?.split_once("/ns/")?.1;
    let ns = rest.split('/').next()?;
    (!ns.is_empty()).then_some(ns)
}

/// A peer's announcement is believed only for the namespace its certificate names (Istio's
/// exchange takes the header as it comes; here a peer cannot claim another namespace's
/// workload). With no certificate (plaintext) nothing is believed.
pub fn believed<'a>(peer: Option<&'a Workload>, peer_san: Option<&str>) -> Option<&'a Workload> {
    let ns = spiffe_namespace(peer_san?)?;
    peer.filter(|p| p.namespace == ns)
}

/// The peer from the upstream host's `istio.workload` metadata.
pub fn from_endpoint(value: &str) -> Option<Workload> {
    let mut parts = value.split(';');
    let mut next = || parts.next().unwrap_or_default().to_string();
    let w = Workload {
        workload: next(),
        namespace: next(),
        canonical_name: next(),
        canonical_revision: next(),
        cluster: next(),
        ..Workload::default()
    };
    (value.split(';').count() >= 5 && !w.workload.is_empty()).then_some(w)
}

fn or<'a>(v: &'a str, default: &'a str) -> &'a str {
    if v.is_empty() { default } else { v }
}

/// The special clusters whose name is the service name.
fn special_cluster(cluster: &str) -> bool {
    matches!(
        cluster,
        "BlackHoleCluster"
            | "PassthroughCluster"
            | "InboundPassthroughCluster"
            | "InboundPassthroughClusterIpv4"
            | "InboundPassthroughClusterIpv6"
    )
}

/// A Host header without its port.
pub fn without_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority
            .split_once(']')
            .map_or(authority, |(h, _)| &authority[..h.len() + 1]);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// The values of [`PEER_LABELS`] for a request or connection `facts` reported by `reporter`,
/// whose own workload is `own`.
pub fn peer_labels(own: &Workload, reporter: Reporter, facts: &Facts<'_>) -> Vec<String> {
    let server = reporter == Reporter::Destination;
    let endpoint = if server {
        None
    } else {
        facts.endpoint_workload.and_then(from_endpoint)
    };
    let peer = believed(facts.peer, facts.peer_san).or(endpoint.as_ref());
    let peer_ns = facts
        .peer_san
        .and_then(spiffe_namespace)
        .or(peer.map(|p| p.namespace.as_str()).filter(|n| !n.is_empty()));
    let p = |f: fn(&Workload) -> &str, default: &'static str| -> String {
        peer.map(f)
            .filter(|v| !v.is_empty())
            .unwrap_or(default)
            .to_string()
    };
    let peer_side = [
        p(|w| &w.workload, UNKNOWN),
        p(|w| &w.canonical_name, UNKNOWN),
        p(|w| &w.canonical_revision, LATEST),
        peer_ns.unwrap_or(UNKNOWN).to_string(),
        p(|w| &w.app, UNKNOWN),
        p(|w| &w.version, UNKNOWN),
        p(|w| &w.cluster, UNKNOWN),
    ];
    let own_side = [
        own.workload.clone(),
        own.canonical_name.clone(),
        own.canonical_revision.clone(),
        own.namespace.clone(),
        own.app.clone(),
        own.version.clone(),
        own.cluster.clone(),
    ];
    let peer_principal = facts
        .peer_san
        .map(str::to_string)
        .or_else(|| peer.map(|w| w.identity.clone()).filter(|i| !i.is_empty()))
        .unwrap_or_else(|| UNKNOWN.to_string());
    let local_principal = facts.local_san.unwrap_or(UNKNOWN).to_string();
    // The service: the special clusters by name, else the cluster's `istio.services`, else the
    // request's Host.
    let route_special = match facts.route {
        Some("block_all") => Some("BlackHoleCluster"),
        Some("allow_any") => Some("PassthroughCluster"),
        _ => None,
    };
    let cluster_special = facts.cluster.filter(|c| special_cluster(c));
    let (mut service_host, mut service_name, mut service_ns) =
        (String::new(), String::new(), String::new());
    if let Some(h) = facts.host {
        service_host = without_port(h).to_string();
        service_name = service_host.clone();
    }
    if let Some(special) = route_special.or(cluster_special) {
        service_name = special.to_string();
    } else if let Some(m) = &facts.service {
        service_host.clone_from(&m.host);
        service_ns.clone_from(&m.namespace);
        service_name = if m.name.is_empty() {
            m.host.split('.').next().unwrap_or_default().to_string()
        } else {
            m.name.clone()
        };
    }
    let (source, destination) = if server {
        (peer_side, own_side)
    } else {
        (own_side, peer_side)
    };
    let [
        dst_workload,
        dst_canonical,
        dst_revision,
        dst_ns,
        dst_app,
        dst_version,
        dst_cluster,
    ] = destination;
    let [
        src_workload,
        src_canonical,
        src_revision,
        src_ns,
        src_app,
        src_version,
        src_cluster,
    ] = source;
    let (src_principal, dst_principal) = if server {
        (peer_principal, local_principal)
    } else {
        (local_principal, peer_principal)
    };
    let service = if server {
        or(&service_host, &own.canonical_name).to_string()
    } else {
        or(&service_host, UNKNOWN).to_string()
    };
    let service_name = if server {
        or(&service_name, &own.canonical_name).to_string()
    } else {
        or(&service_name, UNKNOWN).to_string()
    };
    let service_namespace = if server {
        own.namespace.clone()
    } else {
        or(&service_ns, &dst_ns).to_string()
    };
    vec![
        reporter.label().to_string(),
        src_workload,
        src_canonical,
        src_revision,
        src_ns,
        src_principal,
        src_app,
        src_version,
        src_cluster,
        dst_workload,
        dst_ns,
        dst_principal,
        dst_app,
        dst_version,
        service,
        dst_canonical,
        dst_revision,
        service_name,
        service_namespace,
        dst_cluster,
    ]
}

/// Istio's `connection_security_policy`: a server knows whether its peer presented a
/// certificate; a client reports `unknown`.
pub fn security_policy(reporter: Reporter, facts: &Facts<'_>) -> &'static str {
    match reporter {
        Reporter::Source => UNKNOWN,
        Reporter::Destination if facts.peer_san.is_some() && facts.local_san.is_some() => {
            "mutual_tls"
        }
        Reporter::Destination => "none",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::filters::fake::workload;

    fn sleep() -> Workload {
        Workload {
            namespace: "demo".into(),
            workload: "sleep".into(),
            canonical_name: "sleep".into(),
            canonical_revision: "latest".into(),
            app: "sleep".into(),
            cluster: "Kubernetes".into(),
            ..Workload::default()
        }
    }

    fn by_name(values: &[String]) -> std::collections::BTreeMap<&'static str, &str> {
        PEER_LABELS
            .iter()
            .copied()
            .zip(values.iter().map(String::as_str))
            .collect()
    }

    #[test]
    fn a_server_reports_the_peer_its_certificate_vouches_for() {
        let peer = sleep();
        let facts = Facts {
            peer: Some(&peer),
            peer_san: Some("spiffe://cluster.local/ns/demo/sa/sleep"),
            local_san: Some("spiffe://cluster.local/ns/demo/sa/httpbin"),
            cluster: Some("inbound|8000||"),
            service: Some(ServiceMeta {
                host: "httpbin.demo.svc.cluster.local".into(),
                name: "httpbin".into(),
                namespace: "demo".into(),
            }),
            host: Some("httpbin:8000"),
            ..Facts::default()
        };
        let l = peer_labels(&workload("httpbin"), Reporter::Destination, &facts);
        let m = by_name(&l);
        assert_eq!(m["reporter"], "destination");
        assert_eq!(m["source_workload"], "sleep");
        assert_eq!(m["source_version"], "unknown");
        assert_eq!(
            m["source_principal"],
            "spiffe://cluster.local/ns/demo/sa/sleep"
        );
        assert_eq!(m["destination_workload"], "httpbin");
        assert_eq!(m["destination_service"], "httpbin.demo.svc.cluster.local");
        assert_eq!(m["destination_service_name"], "httpbin");
        assert_eq!(security_policy(Reporter::Destination, &facts), "mutual_tls");
        // A peer claiming another namespace than its certificate's is not believed.
        let liar = Workload {
            namespace: "prod".into(),
            ..sleep()
        };
        let facts = Facts {
            peer: Some(&liar),
            ..facts
        };
        let m = peer_labels(&workload("httpbin"), Reporter::Destination, &facts);
        assert_eq!(by_name(&m)["source_workload"], "unknown");
        assert_eq!(by_name(&m)["source_workload_namespace"], "demo");
    }

    #[test]
    fn a_client_falls_back_on_the_endpoints_metadata_and_the_host() {
        let facts = Facts {
            peer_san: Some("spiffe://cluster.local/ns/demo/sa/httpbin"),
            local_san: Some("spiffe://cluster.local/ns/demo/sa/sleep"),
            cluster: Some("outbound|8000||httpbin.demo.svc.cluster.local"),
            endpoint_workload: Some("httpbin;demo;httpbin;v1;Kubernetes"),
            host: Some("httpbin.demo:8000"),
            ..Facts::default()
        };
        let l = peer_labels(&sleep(), Reporter::Source, &facts);
        let m = by_name(&l);
        assert_eq!(m["reporter"], "source");
        assert_eq!(m["destination_workload"], "httpbin");
        assert_eq!(m["destination_canonical_revision"], "v1");
        assert_eq!(m["destination_app"], "unknown");
        assert_eq!(m["destination_service"], "httpbin.demo");
        assert_eq!(m["destination_service_namespace"], "demo");
        assert_eq!(security_policy(Reporter::Source, &facts), "unknown");
        // Nothing known: unknown, and latest for the revision.
        let l = peer_labels(&sleep(), Reporter::Source, &Facts::default());
        let m = by_name(&l);
        assert_eq!(m["destination_workload"], "unknown");
        assert_eq!(m["destination_canonical_revision"], "latest");
        assert_eq!(m["destination_service"], "unknown");
    }

    #[test]
    fn special_clusters_name_the_service() {
        let facts = Facts {
            cluster: Some("PassthroughCluster"),
            host: Some("example.com"),
            ..Facts::default()
        };
        let l = peer_labels(&sleep(), Reporter::Source, &facts);
        assert_eq!(
            by_name(&l)["destination_service_name"],
            "PassthroughCluster"
        );
        assert_eq!(by_name(&l)["destination_service"], "example.com");
    }
}
