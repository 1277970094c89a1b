//! networking.istio.io Gateway and the Kubernetes TLS Secrets its servers name
//! (`credentialName`), typed field by field. Validation follows Istio's
//! `pkg/config/validation` (validateGateway, validateServer, validateTLSOptions); every error
//! names its field (`servers[1].tls.privateKey: ...`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::traffic::{check_port, is_dns1123_label};

/// The credentialName form of a Secret in another namespace than the Gateway's (Istio's:
/// what the Gateway API's cross-namespace certificateRefs become).
pub const GATEWAY_CREDENTIAL_PREFIX: &str = "kubernetes-gateway://";

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewaySpec {
    pub selector: BTreeMap<String, String>,
    pub servers: Vec<Server>,
    /// Selects routers of its own namespace only (a Gateway API Gateway's translation).
    #[serde(skip)]
    pub own_namespace_only: bool,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct Server {
    pub port: Option<GatewayPort>,
    /// The address the listener binds (default: every address).
    pub bind: Option<String>,
    pub hosts: Vec<String>,
    pub tls: Option<ServerTls>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewayPort {
    pub number: i64,
    pub name: String,
    pub protocol: String,
    /// The port the gateway pod listens on, when it differs from `number`.
    pub target_port: Option<i64>,
}

impl GatewayPort {
    /// The port the listener binds: `targetPort` when set, else `number`.
    pub fn listen_port(&self) -> u16 {
        u16::try_from(self.target_port.unwrap_or(self.number)).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TlsMode {
    #[default]
    Passthrough,
    Simple,
    Mutual,
    AutoPassthrough,
    IstioMutual,
    OptionalMutual,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ServerTls {
    pub https_redirect: bool,
    pub mode: TlsMode,
    pub server_certificate: Option<String>,
    pub private_key: Option<String>,
    pub ca_certificates: Option<String>,
    pub credential_name: Option<String>,
    pub subject_alt_names: Vec<String>,
    pub verify_certificate_spki: Vec<String>,
    pub verify_certificate_hash: Vec<String>,
    pub min_protocol_version: Option<TlsVersion>,
    pub max_protocol_version: Option<TlsVersion>,
    pub cipher_suites: Vec<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    #[serde(rename = "TLS_AUTO")]
    Auto,
    #[serde(rename = "TLSV1_0")]
    V1_0,
    #[serde(rename = "TLSV1_1")]
    V1_1,
    #[serde(rename = "TLSV1_2")]
    V1_2,
    #[serde(rename = "TLSV1_3")]
    V1_3,
}

/// What a server carries, from its port's protocol (Istio's `protocol.Parse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerProtocol {
    Http,
    Https,
    Http2,
    Grpc,
    Tcp,
    Tls,
    Mongo,
}

impl ServerProtocol {
    pub fn parse(s: &str) -> Option<ServerProtocol> {
        Some(match s.to_ascii_uppercase().as_str() {
            "HTTP" => ServerProtocol::Http,
            "HTTPS" => ServerProtocol::Https,
            "HTTP2" => ServerProtocol::Http2,
            "GRPC" => ServerProtocol::Grpc,
            "TCP" => ServerProtocol::Tcp,
            "TLS" => ServerProtocol::Tls,
            "MONGO" => ServerProtocol::Mongo,
            _ => return None,
        })
    }
}

impl Server {
    pub fn protocol(&self) -> Option<ServerProtocol> {
        ServerProtocol::parse(&self.port.as_ref()?.protocol)
    }

    /// Whether the gateway ends TLS and then speaks HTTP (an HTTPS server not passed through).
    pub fn terminates_http(&self) -> bool {
        self.protocol() == Some(ServerProtocol::Https) && !self.passes_through()
    }

    /// TLS handed on untouched (PASSTHROUGH / AUTO_PASSTHROUGH).
    pub fn passes_through(&self) -> bool {
        matches!(
            self.tls.as_ref().map(|t| t.mode),
            Some(TlsMode::Passthrough | TlsMode::AutoPassthrough)
        ) && matches!(
            self.protocol(),
            Some(ServerProtocol::Https | ServerProtocol::Tls)
        )
    }

    /// Plain HTTP (HTTP, HTTP2, GRPC).
    pub fn is_plain_http(&self) -> bool {
        matches!(
            self.protocol(),
            Some(ServerProtocol::Http | ServerProtocol::Http2 | ServerProtocol::Grpc)
        )
    }
}

/// `ns/host` as written in a server's `hosts`: (namespace filter, host). No `/` is `*/host`.
pub fn split_host(h: &str) -> (&str, &str) {
    h.split_once('/').unwrap_or(("*", h))
}

fn check_host(at: &str, h: &str) -> Result<(), String> {
    let (ns, host) = split_host(h);
    if !(ns == "*" || ns == "." || ns == "~" || is_dns1123_label(ns)) {
        return Err(format!(
            "{at}: {h:?}: the namespace part must be *, ., or a namespace name"
        ));
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    let valid_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host != "*" && (name.len() > 253 || !name.split('.').all(valid_label)) {
        return Err(format!(
            "{at}: {h:?}: expected `*`, `*.suffix` or a DNS name, optionally after `namespace/`"
        ));
    }
    Ok(())
}

fn check_tls(at: &str, protocol: ServerProtocol, tls: &ServerTls) -> Result<(), String> {
    let tls_protocol = matches!(protocol, ServerProtocol::Https | ServerProtocol::Tls);
    if !tls_protocol {
        if tls.https_redirect
            && tls
                == &(ServerTls {
                    https_redirect: true,
                    ..Default::default()
                })
        {
            return Ok(());
        }
        return Err(format!(
            "{at}: TLS settings on a {protocol:?} server: only `httpsRedirect` is allowed here (use protocol HTTPS or TLS)"
        ));
    }
    let files = tls.server_certificate.is_some() || tls.private_key.is_some();
    match tls.mode {
        TlsMode::Simple | TlsMode::Mutual | TlsMode::OptionalMutual => {
            if tls.credential_name.is_none() {
                if tls.server_certificate.as_deref().is_none_or(str::is_empty) {
                    return Err(format!(
                        "{at}.serverCertificate: required for mode {:?} without credentialName",
                        tls.mode
                    ));
                }
                if tls.private_key.as_deref().is_none_or(str::is_empty) {
                    return Err(format!(
                        "{at}.privateKey: required for mode {:?} without credentialName",
                        tls.mode
                    ));
                }
                if tls.mode != TlsMode::Simple
                    && tls.ca_certificates.as_deref().is_none_or(str::is_empty)
                {
                    return Err(format!(
                        "{at}.caCertificates: required for mode {:?} without credentialName (clients are verified against it)",
                        tls.mode
                    ));
                }
            } else if files {
                return Err(format!(
                    "{at}: credentialName and serverCertificate/privateKey are both set: name one source of the certificate"
                ));
            }
        }
        TlsMode::IstioMutual => {
            if files || tls.credential_name.is_some() || tls.ca_certificates.is_some() {
                return Err(format!(
                    "{at}: ISTIO_MUTUAL uses the gateway's mesh certificate: credentialName, serverCertificate, privateKey and caCertificates must be unset"
                ));
            }
        }
        TlsMode::Passthrough | TlsMode::AutoPassthrough => {
            if files || tls.credential_name.is_some() {
                return Err(format!(
                    "{at}: mode {:?} does not end TLS: no certificate may be set",
                    tls.mode
                ));
            }
        }
    }
    if tls.mode == TlsMode::AutoPassthrough && protocol != ServerProtocol::Tls {
        return Err(format!("{at}.mode: AUTO_PASSTHROUGH needs protocol TLS"));
    }
    if let Some(c) = &tls.credential_name {
        // A Secret name, or another namespace's Secret as `kubernetes-gateway://NS/NAME` (what
        // the Gateway API's cross-namespace certificateRefs become, as in Istio).
        let ok = match c.strip_prefix(GATEWAY_CREDENTIAL_PREFIX) {
            Some(rest) => rest
                .split_once('/')
                .is_some_and(|(ns, name)| is_dns1123_subdomain(ns) && is_dns1123_subdomain(name)),
            None => is_dns1123_subdomain(c),
        };
        if !ok {
            return Err(format!(
                "{at}.credentialName: {c:?} is not a Secret name (a DNS-1123 subdomain) or kubernetes-gateway://NAMESPACE/NAME"
            ));
        }
    }
    if let (Some(min), Some(max)) = (tls.min_protocol_version, tls.max_protocol_version)
        && min != TlsVersion::Auto
        && max != TlsVersion::Auto
        && min > max
    {
        return Err(format!(
            "{at}: minProtocolVersion is above maxProtocolVersion"
        ));
    }
    for (i, h) in tls.verify_certificate_hash.iter().enumerate() {
        let hex: String = h.chars().filter(|c| *c != ':').collect();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "{at}.verifyCertificateHash[{i}]: {h:?} is not a SHA-256 hex digest"
            ));
        }
    }
    Ok(())
}

/// A Kubernetes object name: DNS-1123 subdomain.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

pub fn validate_gateway(spec: &GatewaySpec) -> Result<(), String> {
    if spec.servers.is_empty() {
        return Err("servers: at least one server is required".into());
    }
    let mut port_names: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, s) in spec.servers.iter().enumerate() {
        let at = format!("servers[{i}]");
        let port = s
            .port
            .as_ref()
            .ok_or_else(|| format!("{at}.port: required"))?;
        check_port(&format!("{at}.port.number"), port.number)?;
        if let Some(t) = port.target_port {
            check_port(&format!("{at}.port.targetPort"), t)?;
        }
        if port.protocol.is_empty() {
            return Err(format!("{at}.port.protocol: required"));
        }
        let protocol = ServerProtocol::parse(&port.protocol).ok_or_else(|| {
            format!(
                "{at}.port.protocol: {:?} is not one of HTTP, HTTPS, HTTP2, GRPC, TCP, TLS, MONGO",
                port.protocol
            )
        })?;
        if port.name.is_empty() {
            return Err(format!("{at}.port.name: required"));
        }
        if let Some(j) = port_names.insert(&port.name, i)
            && spec.servers[j].port.as_ref().map(|p| p.number) != Some(port.number)
        {
            return Err(format!(
                "{at}.port.name: {:?} is already the name of servers[{j}]'s port (another number)",
                port.name
            ));
        }
        if s.hosts.is_empty() {
            return Err(format!("{at}.hosts: at least one host is required"));
        }
        for (j, h) in s.hosts.iter().enumerate() {
            check_host(&format!("{at}.hosts[{j}]"), h)?;
        }
        if let Some(b) = &s.bind
            && b.parse::<std::net::IpAddr>().is_err()
        {
            return Err(format!(
                "{at}.bind: {b:?} is not an IP address (unix sockets are not served)"
            ));
        }
        match (&s.tls, protocol) {
            (None, ServerProtocol::Https | ServerProtocol::Tls) => {
                return Err(format!(
                    "{at}.tls: required for protocol {} (mode SIMPLE, MUTUAL, ISTIO_MUTUAL, PASSTHROUGH or AUTO_PASSTHROUGH)",
                    port.protocol
                ));
            }
            (Some(tls), _) => check_tls(&format!("{at}.tls"), protocol, tls)?,
            (None, _) => {}
        }
    }
    Ok(())
}

/// A Kubernetes Secret holding a certificate and key and/or a CA bundle, as Istio reads one
/// for `credentialName` (`pilot/pkg/credentials/kube`): `tls.crt`/`tls.key`/`ca.crt`
/// (type kubernetes.io/tls) or `cert`/`key`/`cacert` (generic). Keys are kept as bytes and
/// never shown (`/debug/configz` lists which keys are present).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct TlsSecret {
    pub cert: Option<Vec<u8>>,
    pub key: Option<Vec<u8>>,
    pub ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSecret")
            .field("cert", &self.cert.as_ref().map(Vec::len))
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("ca", &self.ca.as_ref().map(Vec::len))
            .finish()
    }
}

impl Serialize for TlsSecret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let shown: BTreeMap<&str, String> = [
            (
                "cert",
                self.cert.as_ref().map(|c| format!("{} bytes", c.len())),
            ),
            ("key", self.key.as_ref().map(|_| "<redacted>".to_string())),
            ("ca", self.ca.as_ref().map(|c| format!("{} bytes", c.len()))),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
        shown.serialize(s)
    }
}

fn pem_blocks(bytes: &[u8]) -> Vec<x509_parser::pem::Pem> {
    x509_parser::pem::Pem::iter_from_buffer(bytes)
        .map_while(Result::ok)
        .collect()
}

fn check_certs(field: &str, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let blocks = pem_blocks(bytes);
    let certs: Vec<_> = blocks.iter().filter(|p| p.label == "CERTIFICATE").collect();
    if certs.is_empty() {
        return Err(format!("{field}: no PEM CERTIFICATE block"));
    }
    for (i, p) in certs.iter().enumerate() {
        p.parse_x509()
            .map_err(|e| format!("{field}: certificate {i} does not parse: {e}"))?;
    }
    // The public key of the first (leaf) certificate.
    let leaf = certs[0].parse_x509().map_err(|e| format!("{field}: {e}"))?;
    Ok(leaf.tbs_certificate.subject_pki.raw.to_vec())
}

/// A Secret's data (`data` base64, `stringData` as is) as a TLS secret; `None` for a Secret
/// that holds neither a certificate and key nor a CA bundle (other Secrets are not ours).
pub fn tls_secret(
    kind_type: Option<&str>,
    data: &BTreeMap<String, String>,
    string_data: &BTreeMap<String, String>,
) -> Result<Option<TlsSecret>, String> {
    let get = |k: &str| -> Result<Option<Vec<u8>>, String> {
        if let Some(v) = string_data.get(k) {
            return Ok(Some(v.as_bytes().to_vec()));
        }
        match data.get(k) {
            None => Ok(None),
            Some(v) => super::virtual_service::base64_decode(v.trim())
                .map(Some)
                .ok_or_else(|| format!("data.{k}: not base64")),
        }
    };
    let (cert_key, key_key, ca_key) =
        if get("tls.crt")?.is_some() || kind_type == Some("kubernetes.io/tls") {
            ("tls.crt", "tls.key", "ca.crt")
        } else if get("cert")?.is_some() || get("cacert")?.is_some() {
            ("cert", "key", "cacert")
        } else {
            ("tls.crt", "tls.key", "ca.crt")
        };
    let secret = TlsSecret {
        cert: get(cert_key)?,
        key: get(key_key)?,
        ca: get(ca_key)?,
    };
    if secret.cert.is_none() && secret.key.is_none() && secret.ca.is_none() {
        if kind_type == Some("kubernetes.io/tls") {
            return Err(format!(
                "type kubernetes.io/tls: data.{cert_key} and data.{key_key} are required"
            ));
        }
        return Ok(None);
    }
    match (&secret.cert, &secret.key) {
        (Some(cert), Some(key)) => {
            let spki = check_certs(&format!("data.{cert_key}"), cert)?;
            let blocks = pem_blocks(key);
            let Some(k) = blocks.iter().find(|p| p.label.ends_with("PRIVATE KEY")) else {
                return Err(format!("data.{key_key}: no PEM PRIVATE KEY block"));
            };
            // Where the key's type is one we can read, it must be the certificate's.
            let pem = String::from_utf8_lossy(key);
            if k.label == "PRIVATE KEY"
                && let Ok(pair) = rcgen::KeyPair::from_pem(&pem)
                && rcgen::PublicKeyData::subject_public_key_info(&pair) != spki
            {
                return Err(format!(
                    "data.{key_key}: the key does not belong to the certificate in data.{cert_key}"
                ));
            }
        }
        (Some(_), None) => return Err(format!("data.{key_key}: required with data.{cert_key}")),
        (None, Some(_)) => return Err(format!("data.{cert_key}: required with data.{key_key}")),
        (None, None) => {}
    }
    if let Some(ca) = &secret.ca {
        check_certs(&format!("data.{ca_key}"), ca)?;
    }
    Ok(Some(secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gw(yaml: &str) -> Result<(), String> {
        let spec: GatewaySpec = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        validate_gateway(&spec)
    }

    #[test]
    fn the_seed_gateway_is_valid() {
        gw("selector: {app: istio-ingress-gateway}\nservers:\n- port: {number: 80, name: http, protocol: HTTP}\n  hosts: [bookinfo.com]\n  tls: {httpsRedirect: true}\n- port: {number: 443, name: https-443, protocol: HTTPS}\n  hosts: [bookinfo.com]\n  tls: {mode: SIMPLE, serverCertificate: /etc/certs/servercert.pem, privateKey: /etc/certs/privatekey.pem}\n").unwrap();
    }

    #[test]
    fn invalid_servers_are_named() {
        for (yaml, want) in [
            (
                "servers: [{port: {number: 443, name: h, protocol: HTTPS}, hosts: [a.com]}]",
                "servers[0].tls: required",
            ),
            (
                "servers: [{port: {number: 443, name: h, protocol: HTTPS}, hosts: [a.com], tls: {mode: SIMPLE}}]",
                "servers[0].tls.serverCertificate: required",
            ),
            (
                "servers: [{port: {number: 443, name: h, protocol: HTTPS}, hosts: [a.com], tls: {mode: MUTUAL, serverCertificate: /a, privateKey: /b}}]",
                "servers[0].tls.caCertificates: required",
            ),
            (
                "servers: [{port: {number: 80, name: h, protocol: HTTP}, hosts: [a.com], tls: {mode: SIMPLE, credentialName: x}}]",
                "servers[0].tls: TLS settings on a Http server",
            ),
            (
                "servers: [{port: {number: 80, name: h, protocol: UDP}, hosts: [a.com]}]",
                "servers[0].port.protocol",
            ),
            (
                "servers: [{port: {number: 80, name: h, protocol: HTTP}, hosts: [\"bad ns/a.com\"]}]",
                "servers[0].hosts[0]",
            ),
            (
                "servers: [{port: {number: 443, name: h, protocol: HTTPS}, hosts: [a.com], tls: {mode: ISTIO_MUTUAL, credentialName: c}}]",
                "ISTIO_MUTUAL",
            ),
            (
                "servers: [{port: {number: 443, name: h, protocol: HTTPS}, hosts: [a.com], tls: {mode: SIMPLE, credentialName: c, minProtocolVersion: TLSV1_3, maxProtocolVersion: TLSV1_2}}]",
                "minProtocolVersion",
            ),
        ] {
            let err = gw(yaml).expect_err(yaml);
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }

    #[test]
    fn secrets_are_checked_and_never_shown() {
        let pair = |host: &str| {
            let c = rcgen::generate_simple_self_signed(vec![host.to_string()]).unwrap();
            (c.cert.pem(), c.signing_key.serialize_pem())
        };
        let (cert, key) = pair("bookinfo.com");
        let data: BTreeMap<String, String> = [
            ("tls.crt".to_string(), cert.clone()),
            ("tls.key".to_string(), key.clone()),
        ]
        .into_iter()
        .collect();
        let s = tls_secret(Some("kubernetes.io/tls"), &BTreeMap::new(), &data)
            .unwrap()
            .unwrap();
        let shown = serde_json::to_string(&s).unwrap();
        assert!(!shown.contains("PRIVATE"), "{shown}");
        assert!(shown.contains("<redacted>"));
        assert!(!format!("{s:?}").contains("PRIVATE"));
        // A key of another certificate is refused.
        let (_, other_key) = pair("x.com");
        let mut wrong = data.clone();
        wrong.insert("tls.key".into(), other_key);
        let err = tls_secret(None, &BTreeMap::new(), &wrong).unwrap_err();
        assert!(err.contains("does not belong"), "{err}");
        let mut garbage = data.clone();
        garbage.insert("tls.crt".into(), "hello".into());
        assert!(
            tls_secret(None, &BTreeMap::new(), &garbage)
                .unwrap_err()
                .contains("data.tls.crt")
        );
        // Base64 data.
        let mut b64 = BTreeMap::new();
        b64.insert("tls.crt".to_string(), "%%%".to_string());
        assert!(
            tls_secret(None, &b64, &BTreeMap::new())
                .unwrap_err()
                .contains("not base64")
        );
        // A Secret that is not TLS material is not ours.
        let mut other = BTreeMap::new();
        other.insert("password".to_string(), "aGk=".to_string());
        assert_eq!(
            tls_secret(Some("Opaque"), &other, &BTreeMap::new()),
            Ok(None)
        );
    }
}
