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
    /// Largest message accepted from the server (XDS_MAX_RESPONSE_BYTES for the control plane).
    /// Istio's agent accepts up to 2 GiB; a finite cap keeps one bad push from taking the
    /// agent's memory.
    pub max_response_bytes: usize,
}

/// Default of XDS_MAX_RESPONSE_BYTES: 256 MiB, far above any real push (a 10 000-service
/// mesh's CDS is tens of MiB) and the size istiod-core refuses to send beyond.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;
/// The range XDS_MAX_RESPONSE_BYTES may take: at least 1 MiB, at most 2 GiB − 1 (gRPC's and
/// Istio's ceiling).
const MAX_RESPONSE_RANGE: std::ops::RangeInclusive<usize> = (1 << 20)..=(i32::MAX as usize);

/// Parses XDS_MAX_RESPONSE_BYTES (a byte count within `MAX_RESPONSE_RANGE`).
fn max_response_bytes(raw: Option<String>) -> Result<usize, ConfigError> {
    let Some(raw) = raw.filter(|v| !v.is_empty()) else {
        return Ok(DEFAULT_MAX_RESPONSE_BYTES);
    };
    raw.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| MAX_RESPONSE_RANGE.contains(n))
        .ok_or_else(|| {
            err(
                env::XDS_MAX_RESPONSE_BYTES,
                &raw,
                "a byte count from 1048576 (1 MiB) to 2147483647 (2 GiB - 1)",
            )
        })
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
        let mut client = Self::for_service(
            address,
            lookup,
            env_vars,
            env::XDS_ROOT_CA,
            env::XDS_HEADER_PREFIX,
        )?;
        client.max_response_bytes = max_response_bytes(lookup(env::XDS_MAX_RESPONSE_BYTES))?;
        Ok(client)
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
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn client(vars: &[(&str, &str)]) -> Result<XdsClientConfig, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        XdsClientConfig::from_env("istiod.istio-system.svc:15012", &lookup, &vars)
    }

    #[test]
    fn the_response_cap_is_finite_by_default_and_settable() {
        assert_eq!(
            client(&[]).unwrap().max_response_bytes,
            DEFAULT_MAX_RESPONSE_BYTES
        );
        let c = client(&[(env::XDS_MAX_RESPONSE_BYTES, "67108864")]).unwrap();
        assert_eq!(c.max_response_bytes, 64 << 20);
        for bad in ["0", "1024", "-5", "64Mi", "4294967296", "NaN"] {
            let e = client(&[(env::XDS_MAX_RESPONSE_BYTES, bad)]).unwrap_err();
            assert_eq!(e.input, env::XDS_MAX_RESPONSE_BYTES, "{bad}");
            assert_eq!(e.value, bad);
        }
    }
}
