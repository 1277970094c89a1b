//! How the agent dials Istio's gRPC services (the control plane, the CA): Istio's
//! `xds_proxy.go` and CA client dial options, from the env.

use std::path::PathBuf;
use std::time::Duration;

use super::legacy_flags::AuthPolicy;
use super::proxy_config::ProxyConfigOverlay;

use super::{ConfigError, env, err};

/// Where the root certificate for TLS to the control plane comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCa {
    /// The operating system's trust store (XDS_ROOT_CA=SYSTEM).
    System,
    /// The first of these files that exists when connecting (Istio's order).
    Files(Vec<PathBuf>),
}

/// How the xDS proxy connects to a remote control plane (Istio's `xds_proxy.go` dial options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsClientConfig {
    /// TLS unless the address's port is 15010 (Istio's plaintext port).
    pub tls: bool,
    pub root_ca: RootCa,
    /// TLS server name: ISTIOD_SAN, else the host of the address (`localhost` →
    /// `istiod.istio-system.svc`).
    pub server_name: String,
    /// Sent as `authorization: Bearer <token>`, re-read on every connect.
    pub token_path: PathBuf,
    /// gRPC metadata: ClusterID and the XDS_HEADER_* variables.
    pub headers: Vec<(String, String)>,
    /// How long a dial may take (ProxyConfig connectTimeout, else 5s).
    pub connect_timeout: Duration,
}

/// The dial timeout when ProxyConfig sets no connectTimeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Istio's token path for the control plane (a projected service-account token).
pub const TOKEN_PATH: &str = "./var/run/secrets/tokens/istio-token";

impl XdsClientConfig {
    pub(super) fn from_env(
        address: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
        env_vars: &[(String, String)],
    ) -> Result<XdsClientConfig, ConfigError> {
        Self::for_service(
            address,
            lookup,
            env_vars,
            env::XDS_ROOT_CA,
            env::XDS_HEADER_PREFIX,
        )
    }

    /// Dial options for the control plane (XDS_ROOT_CA, XDS_HEADER_*) or the CA (CA_ROOT_CA,
    /// CA_HEADER_*), which share the token, the server name rules and ClusterID.
    pub(super) fn for_service(
        address: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
        env_vars: &[(String, String)],
        root_var: &str,
        header_prefix: &str,
    ) -> Result<XdsClientConfig, ConfigError> {
        let (host, port) = address
            .rsplit_once(':')
            .ok_or_else(|| err("discoveryAddress", address, "host:port"))?;
        port.parse::<u16>()
            .map_err(|_| err("discoveryAddress", address, "host:port with a numeric port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let server_name = lookup(env::ISTIOD_SAN).unwrap_or_else(|| {
            if host == "localhost" {
                "istiod.istio-system.svc".to_string()
            } else {
                host.to_string()
            }
        });
        let root_ca = match lookup(root_var) {
            Some(v) if v == "SYSTEM" => RootCa::System,
            Some(v) if !v.is_empty() => RootCa::Files(vec![PathBuf::from(v)]),
            _ => {
                let mut files = vec![PathBuf::from("./etc/certs/root-cert.pem")];
                if let Some(prov) = lookup(env::PROV_CERT).filter(|p| !p.is_empty()) {
                    files.push(PathBuf::from(prov).join("root-cert.pem"));
                }
                files.push(PathBuf::from("./var/run/secrets/istio/root-cert.pem"));
                RootCa::Files(files)
            }
        };
        let mut headers = vec![(
            "clusterid".to_string(),
            lookup(env::CLUSTER_ID).unwrap_or_else(|| "Kubernetes".to_string()),
        )];
        for (k, v) in env_vars {
            if let Some(name) = k.strip_prefix(header_prefix) {
                let name = name.to_ascii_lowercase().replace('_', "-");
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                {
                    return Err(err(k, v, "a header name of letters, digits and '_'"));
                }
                headers.push((name, v.clone()));
            }
        }
        Ok(XdsClientConfig {
            tls: port != "15010",
            root_ca,
            server_name,
            token_path: PathBuf::from(TOKEN_PATH),
            headers,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        })
    }

    /// ProxyConfig's say in the control plane dial: connectTimeout bounds it, and
    /// controlPlaneAuthPolicy picks the transport as Istio 1.5's agent did: MUTUAL_TLS is TLS,
    /// NONE is plaintext except on istiod's TLS-only port 15012 (1.5's `RequireCerts`). Without a
    /// policy, TLS unless the port is 15010.
    pub(super) fn apply_proxy_config(
        &mut self,
        address: &str,
        pc: &ProxyConfigOverlay,
        connect_timeout: Option<Duration>,
    ) -> Result<(), ConfigError> {
        if let Some(t) = connect_timeout {
            self.connect_timeout = t;
        }
        if let Some(raw) = &pc.control_plane_auth_policy {
            self.tls = match AuthPolicy::parse("ProxyConfig.controlPlaneAuthPolicy", raw)? {
                AuthPolicy::MutualTls => true,
                AuthPolicy::None => address.ends_with(":15012"),
            };
        }
        Ok(())
    }
}
