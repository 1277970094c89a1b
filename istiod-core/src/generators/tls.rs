//! Istio mutual TLS as Envoy config: the SDS references to the agent's `default` certificate
//! and `ROOTCA` bundle, the client side for outbound clusters (auto mTLS by endpoint tlsMode),
//! and the server side for inbound filter chains. Names and structure follow what istiod writes.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch;
use envoy_types::pb::envoy::config::core::v3::{
    ApiConfigSource, ApiVersion, ConfigSource, GrpcService, Metadata, TransportSocket,
    api_config_source, config_source, grpc_service, transport_socket,
};
use envoy_types::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
    SubjectAltNameMatcher, TlsParameters, UpstreamTlsContext, common_tls_context,
    subject_alt_name_matcher, tls_parameters,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::{BoolValue, Duration, Struct, Value, value};
use envoy_types::util::pack_any;

use crate::config_store::gateway::{ServerTls, TlsMode as GatewayTlsMode, TlsVersion};

/// The agent's SDS resource names and the bootstrap cluster that reaches its socket.
pub const SDS_DEFAULT: &str = "default";
pub const SDS_ROOT: &str = "ROOTCA";
pub const SDS_CLUSTER: &str = "sds-grpc";

/// Endpoint metadata key Envoy matches `transport_socket_matches` against.
pub const TRANSPORT_SOCKET_MATCH: &str = "envoy.transport_socket_match";
/// ALPN a sidecar offers so the peer's inbound chain recognises Istio mTLS.
pub const ALPN_ISTIO: [&str; 2] = ["istio-peer-exchange", "istio"];
/// ALPN an inbound mutual-TLS TCP chain offers (Istio's server context): a peer sidecar that
/// offers the TCP metadata exchange gets it, HTTP over TLS its own protocol.
pub const ALPN_TCP_SERVER: [&str; 3] = ["istio-peer-exchange", "h2", "http/1.1"];
/// ALPN values an inbound mTLS filter chain matches (Istio's list, TCP and HTTP clients).
pub const ALPN_INBOUND_MATCH: [&str; 5] = [
    "istio-peer-exchange",
    "istio",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];

/// The ALPN of a sidecar's Istio mTLS toward a cluster, as Istio's `istio.alpn` overrides it
/// per request: HTTP/1.x and HTTP/2 name themselves (`istio-http/1.1`, `istio-h2`, so the
/// peer's sidecar takes them to its HTTP chain), anything else offers the TCP metadata
/// exchange. A cluster's protocol is fixed here, so the list goes into its TLS context.
pub fn istio_alpn(http: bool, h2: bool) -> &'static [&'static str] {
    match (http, h2) {
        (_, true) => &["istio-h2", "istio", "h2"],
        (true, false) => &["istio-http/1.1", "istio", "http/1.1"],
        (false, false) => &ALPN_ISTIO,
    }
}

/// Sets `alpn` in every Istio mTLS context of `c` (those offering `istio`): its auto-mTLS
/// match and an ISTIO_MUTUAL socket.
pub fn set_istio_alpn(c: &mut envoy_types::pb::envoy::config::cluster::v3::Cluster, alpn: &[&str]) {
    use prost::Message;
    let set = |socket: &mut TransportSocket| {
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &mut socket.config_type else {
            return;
        };
        let Ok(mut tls) = UpstreamTlsContext::decode(any.value.as_slice()) else {
            return;
        };
        let Some(common) = tls.common_tls_context.as_mut() else {
            return;
        };
        if !common.alpn_protocols.iter().any(|a| a == "istio") {
            return;
        }
        common.alpn_protocols = alpn.iter().map(|s| s.to_string()).collect();
        any.value = tls.encode_to_vec();
    };
    for m in &mut c.transport_socket_matches {
        if let Some(s) = m.transport_socket.as_mut() {
            set(s);
        }
    }
    if let Some(s) = c.transport_socket.as_mut() {
        set(s);
    }
}

pub(crate) fn sds(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::ApiConfigSource(
                ApiConfigSource {
                    api_type: api_config_source::ApiType::Grpc as i32,
                    transport_api_version: ApiVersion::V3 as i32,
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: SDS_CLUSTER.to_string(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    set_node_on_first_message_only: true,
                    ..Default::default()
                },
            )),
            initial_fetch_timeout: Some(Duration {
                seconds: 0,
                nanos: 0,
            }),
            resource_api_version: ApiVersion::V3 as i32,
            ..Default::default()
        }),
    }
}

/// TLS 1.2 to 1.3, as Istio's contexts allow.
pub(crate) fn tls_1_2_to_1_3() -> TlsParameters {
    TlsParameters {
        tls_minimum_protocol_version: tls_parameters::TlsProtocol::TlSv12 as i32,
        tls_maximum_protocol_version: tls_parameters::TlsProtocol::TlSv13 as i32,
        ..Default::default()
    }
}

/// Certificate `default` and trust bundle `ROOTCA` over SDS; `peer_sans` (SPIFFE URIs), when
/// given, are the only peer identities accepted.
fn common(peer_sans: &[String], alpn: &[&str]) -> CommonTlsContext {
    let default_validation_context = CertificateValidationContext {
        match_typed_subject_alt_names: peer_sans
            .iter()
            .map(|san| SubjectAltNameMatcher {
                san_type: subject_alt_name_matcher::SanType::Uri as i32,
                matcher: Some(StringMatcher {
                    match_pattern: Some(string_matcher::MatchPattern::Exact(san.clone())),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    CommonTlsContext {
        tls_params: Some(tls_1_2_to_1_3()),
        tls_certificate_sds_secret_configs: vec![sds(SDS_DEFAULT)],
        validation_context_type: Some(
            common_tls_context::ValidationContextType::CombinedValidationContext(
                common_tls_context::CombinedCertificateValidationContext {
                    default_validation_context: Some(default_validation_context),
                    validation_context_sds_secret_config: Some(sds(SDS_ROOT)),
                    ..Default::default()
                },
            ),
        ),
        alpn_protocols: alpn.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

pub(crate) fn socket(
    name: &str,
    config: envoy_types::pb::google::protobuf::Any,
) -> TransportSocket {
    TransportSocket {
        name: name.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(config)),
    }
}

/// Istio's auto mTLS for an outbound cluster: endpoints labelled `tlsMode: istio` get mutual
/// TLS checked against the service's identities; all others plaintext.
pub fn auto_mtls_matches(sni: String, peer_sans: &[String]) -> Vec<TransportSocketMatch> {
    let tls = UpstreamTlsContext {
        common_tls_context: Some(common(peer_sans, &ALPN_ISTIO)),
        sni,
        ..Default::default()
    };
    vec![
        TransportSocketMatch {
            name: "tlsMode-istio".to_string(),
            r#match: Some(tls_mode_struct()),
            transport_socket: Some(socket("envoy.transport_sockets.tls", pack_any(tls))),
        },
        TransportSocketMatch {
            name: "tlsMode-disabled".to_string(),
            r#match: Some(Struct::default()),
            transport_socket: Some(socket(
                "envoy.transport_sockets.raw_buffer",
                pack_any(RawBuffer::default()),
            )),
        },
    ]
}

/// The server side of Istio mTLS: a client certificate chaining to ROOTCA is required.
pub fn inbound_mtls_socket(alpn: &[&str]) -> TransportSocket {
    let tls = DownstreamTlsContext {
        common_tls_context: Some(common(&[], alpn)),
        require_client_certificate: Some(BoolValue { value: true }),
        ..Default::default()
    };
    socket("envoy.transport_sockets.tls", pack_any(tls))
}

fn tls_mode_struct() -> Struct {
    Struct {
        fields: HashMap::from([(
            "tlsMode".to_string(),
            Value {
                kind: Some(value::Kind::StringValue("istio".to_string())),
            },
        )]),
    }
}

/// Endpoint metadata marking a workload whose sidecar accepts Istio mTLS.
pub fn istio_endpoint_metadata() -> Metadata {
    Metadata {
        filter_metadata: HashMap::from([(TRANSPORT_SOCKET_MATCH.to_string(), tls_mode_struct())]),
        ..Default::default()
    }
}

/// An explicit `ISTIO_MUTUAL` DestinationRule: Istio mTLS to every endpoint (no match on the
/// endpoint's tlsMode).
pub fn istio_mutual_socket(sni: String, peer_sans: &[String], alpn: &[&str]) -> TransportSocket {
    let tls = UpstreamTlsContext {
        common_tls_context: Some(common(peer_sans, alpn)),
        sni,
        ..Default::default()
    };
    socket("envoy.transport_sockets.tls", pack_any(tls))
}

/// A DestinationRule's `SIMPLE` or `MUTUAL` TLS with files, served by the agent's SDS as Istio's
/// agent serves them: `file-root:<caCertificates>` (`file-root:system` for the system roots) and,
/// for MUTUAL, `file-cert:<clientCertificate>~<privateKey>`. `sans` (DNS or URI) are the only
/// server names accepted; with none and no `sni`, Envoy checks the server against the request's
/// host (auto SNI and SAN validation, set on the cluster's HTTP options by the caller).
pub struct OriginatedTls<'a> {
    pub sni: &'a str,
    pub sans: &'a [String],
    pub ca: Option<&'a str>,
    pub client: Option<(&'a str, &'a str)>,
    pub insecure_skip_verify: bool,
    pub alpn: &'a [&'a str],
}

/// Exact matchers for `sans`: URI SANs (`scheme://...`) and DNS names.
fn san_matchers(sans: &[String]) -> Vec<SubjectAltNameMatcher> {
    sans.iter()
        .map(|san| SubjectAltNameMatcher {
            san_type: if san.contains("://") {
                subject_alt_name_matcher::SanType::Uri
            } else {
                subject_alt_name_matcher::SanType::Dns
            } as i32,
            matcher: Some(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(san.clone())),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect()
}

/// A `file-cert:`/`file-root:` resource of the agent's SDS, with Envoy's default initial
/// fetch timeout (a missing file does not hold the listener or cluster forever).
fn sds_file(name: String) -> SdsSecretConfig {
    let mut s = sds(&name);
    if let Some(c) = &mut s.sds_config {
        c.initial_fetch_timeout = None;
    }
    s
}

pub fn originated_socket(o: &OriginatedTls) -> TransportSocket {
    let validation = (!o.insecure_skip_verify).then(|| {
        common_tls_context::ValidationContextType::CombinedValidationContext(
            common_tls_context::CombinedCertificateValidationContext {
                default_validation_context: Some(CertificateValidationContext {
                    match_typed_subject_alt_names: san_matchers(o.sans),
                    ..Default::default()
                }),
                validation_context_sds_secret_config: Some(sds_file(format!(
                    "file-root:{}",
                    o.ca.unwrap_or("system")
                ))),
                ..Default::default()
            },
        )
    });
    let tls = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params: Some(tls_1_2_to_1_3()),
            tls_certificate_sds_secret_configs: o
                .client
                .map(|(cert, key)| sds_file(format!("file-cert:{cert}~{key}")))
                .into_iter()
                .collect(),
            validation_context_type: validation,
            alpn_protocols: o.alpn.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }),
        sni: o.sni.to_string(),
        ..Default::default()
    };
    socket("envoy.transport_sockets.tls", pack_any(tls))
}

/// SDS over the ADS stream: how a router gets a `credentialName` (`kubernetes://NAME`) from the
/// control plane, as istiod serves it.
fn sds_ads(name: String) -> SdsSecretConfig {
    SdsSecretConfig {
        name,
        sds_config: Some(super::blocks::ads_config_source()),
    }
}

/// The TLS a gateway server ends: its certificate from `credentialName` (SDS over ADS) or
/// from files (`file-cert:`/`file-root:`, the agent's SDS), or the mesh certificate
/// (ISTIO_MUTUAL); clients verified for MUTUAL and ISTIO_MUTUAL (required) and
/// OPTIONAL_MUTUAL (when they present one); `http` offers h2 and http/1.1 by ALPN.
pub fn gateway_socket(t: &ServerTls, http: bool) -> TransportSocket {
    let alpn: &[&str] = if http { &["h2", "http/1.1"] } else { &[] };
    let verifies = matches!(
        t.mode,
        GatewayTlsMode::Mutual | GatewayTlsMode::OptionalMutual | GatewayTlsMode::IstioMutual
    );
    let mut context = if t.mode == GatewayTlsMode::IstioMutual {
        common(&[], alpn)
    } else {
        let (cert, ca) = match &t.credential_name {
            Some(c) => {
                // `kubernetes-gateway://NS/NAME` is an SDS name as written; a bare name is the
                // router's namespace's `kubernetes://NAME`.
                let sds = if c.starts_with(crate::gateway_conversion::GATEWAY_CREDENTIAL_PREFIX) {
                    c.clone()
                } else {
                    format!("kubernetes://{c}")
                };
                (sds_ads(sds.clone()), sds_ads(format!("{sds}-cacert")))
            }
            None => (
                sds_file(format!(
                    "file-cert:{}~{}",
                    t.server_certificate.as_deref().unwrap_or_default(),
                    t.private_key.as_deref().unwrap_or_default()
                )),
                sds_file(format!(
                    "file-root:{}",
                    t.ca_certificates.as_deref().unwrap_or_default()
                )),
            ),
        };
        CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![cert],
            validation_context_type: verifies.then(|| {
                common_tls_context::ValidationContextType::CombinedValidationContext(
                    common_tls_context::CombinedCertificateValidationContext {
                        default_validation_context: Some(CertificateValidationContext::default()),
                        validation_context_sds_secret_config: Some(ca),
                        ..Default::default()
                    },
                )
            }),
            alpn_protocols: alpn.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    };
    let version = |v: Option<TlsVersion>, default: tls_parameters::TlsProtocol| match v {
        None => default,
        Some(TlsVersion::Auto) => tls_parameters::TlsProtocol::TlsAuto,
        Some(TlsVersion::V1_0) => tls_parameters::TlsProtocol::TlSv10,
        Some(TlsVersion::V1_1) => tls_parameters::TlsProtocol::TlSv11,
        Some(TlsVersion::V1_2) => tls_parameters::TlsProtocol::TlSv12,
        Some(TlsVersion::V1_3) => tls_parameters::TlsProtocol::TlSv13,
    };
    context.tls_params = Some(TlsParameters {
        tls_minimum_protocol_version: version(
            t.min_protocol_version,
            tls_parameters::TlsProtocol::TlSv12,
        ) as i32,
        tls_maximum_protocol_version: version(
            t.max_protocol_version,
            tls_parameters::TlsProtocol::TlSv13,
        ) as i32,
        cipher_suites: t.cipher_suites.clone(),
        ..Default::default()
    });
    if let Some(common_tls_context::ValidationContextType::CombinedValidationContext(c)) =
        &mut context.validation_context_type
        && let Some(v) = &mut c.default_validation_context
    {
        v.match_typed_subject_alt_names = san_matchers(&t.subject_alt_names);
        v.verify_certificate_spki = t.verify_certificate_spki.clone();
        v.verify_certificate_hash = t.verify_certificate_hash.clone();
    }
    let tls = DownstreamTlsContext {
        common_tls_context: Some(context),
        require_client_certificate: Some(BoolValue {
            value: matches!(t.mode, GatewayTlsMode::Mutual | GatewayTlsMode::IstioMutual),
        }),
        ..Default::default()
    };
    socket("envoy.transport_sockets.tls", pack_any(tls))
}
