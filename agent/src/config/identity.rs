//! Workload identity settings (Istio's TRUST_DOMAIN, SECRET_*, ECC_*, CA_* and mounted-cert
//! env vars), for `crate::identity`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mesh_common::identity::Identity;

use super::xds_client::XdsClientConfig;
use super::{ConfigError, ControlPlaneSource, env, err, parse_bool, parse_duration};

/// The key type of workload certificates. ECDSA P-256 is the default (as ztunnel; Istio's
/// default is RSA 2048): smaller keys, cheaper handshakes and a keygen in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAlgorithm {
    EcdsaP256,
    EcdsaP384,
    Rsa(usize),
}

/// Where the workload certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertSource {
    /// The embedded control plane's CA, with its root kept in this directory.
    Embedded { ca_dir: PathBuf },
    /// A remote CA (istiod or `istiod-core serve`) at `host:port`.
    Remote {
        address: String,
        client: XdsClientConfig,
    },
    /// Certificates mounted as files (FILE_MOUNTED_CERTS, workload-spiffe-credentials, /etc/certs).
    Files(MountedFiles),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedFiles {
    pub cert_chain: PathBuf,
    pub key: PathBuf,
    pub root: PathBuf,
}

impl MountedFiles {
    pub fn in_dir(dir: &Path) -> MountedFiles {
        MountedFiles {
            cert_chain: dir.join("cert-chain.pem"),
            key: dir.join("key.pem"),
            root: dir.join("root-cert.pem"),
        }
    }

    pub fn all_exist(&self) -> bool {
        self.cert_chain.is_file() && self.key.is_file() && self.root.is_file()
    }
}

/// Identity settings, parsed from Istio's env vars by `config`.
#[derive(Debug, Clone, PartialEq)]
pub struct IdentityConfig {
    pub identity: Identity,
    pub key: KeyAlgorithm,
    /// SECRET_TTL: the lifetime asked of the CA.
    pub ttl: Duration,
    /// SECRET_GRACE_PERIOD_RATIO and _JITTER: rotate at expiry − (ratio ± jitter) × lifetime.
    pub grace_ratio: f64,
    pub grace_jitter: f64,
    pub source: CertSource,
    /// OUTPUT_CERTS: also write key.pem, cert-chain.pem and root-cert.pem here.
    pub output_dir: Option<PathBuf>,
    /// Directories whose files SDS `file-cert:`/`file-root:` resources may name.
    pub file_allow_dirs: Vec<PathBuf>,
}

/// Directories `file-cert:`/`file-root:` may read from, unless configured otherwise.
pub fn default_file_dirs() -> Vec<PathBuf> {
    [
        "./etc/certs",
        "./var/run/secrets/workload-spiffe-credentials",
        "./var/run/secrets/istio",
        "/etc/certs",
        "/etc/istio",
        "/etc/ssl/certs",
    ]
    .iter()
    .map(PathBuf::from)
    .collect()
}

/// Where mounted certificates are looked for when FILE_MOUNTED_CERTS is unset (Istio's order).
pub const SPIFFE_CREDENTIALS_DIR: &str = "./var/run/secrets/workload-spiffe-credentials";
pub const ETC_CERTS_DIR: &str = "/etc/certs";

/// Which of the mounted-certificate directories hold all three files, looked at once by
/// `Inputs::read`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MountedCerts {
    pub spiffe_credentials: bool,
    pub etc_certs: bool,
}

impl MountedCerts {
    pub fn look() -> MountedCerts {
        MountedCerts {
            spiffe_credentials: MountedFiles::in_dir(Path::new(SPIFFE_CREDENTIALS_DIR)).all_exist(),
            etc_certs: MountedFiles::in_dir(Path::new(ETC_CERTS_DIR)).all_exist(),
        }
    }
}

/// The pod's identity as named by the config: `service_account` in `namespace`.
pub struct Workload<'a> {
    pub namespace: &'a str,
    pub service_account: &'a str,
    pub control_plane: &'a ControlPlaneSource,
    pub mounted: MountedCerts,
    /// `--trust-domain`, which wins over TRUST_DOMAIN.
    pub trust_domain_flag: Option<&'a str>,
}

impl IdentityConfig {
    /// Istio's identity env vars. Stricter and different where documented: ECDSA P-256 is the
    /// default key (ECC_SIGNATURE_ALGORITHM=RSA for RSA), and odd ratios or key sizes are refused.
    pub fn from_env(
        lookup: &dyn Fn(&str) -> Option<String>,
        env_vars: &[(String, String)],
        workload: &Workload<'_>,
    ) -> Result<IdentityConfig, ConfigError> {
        let set = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let (td_input, trust_domain) = match workload.trust_domain_flag {
            Some(flag) => ("--trust-domain", flag.to_string()),
            None => (
                env::TRUST_DOMAIN,
                set(env::TRUST_DOMAIN).unwrap_or_else(|| "cluster.local".to_string()),
            ),
        };
        let (namespace, service_account) = (workload.namespace, workload.service_account);
        let identity = Identity::new(&trust_domain, namespace, service_account).map_err(|e| {
            err(
                &format!("{td_input}/POD_NAMESPACE/SERVICE_ACCOUNT"),
                &format!("{trust_domain}/{namespace}/{service_account}"),
                &e.to_string(),
            )
        })?;
        let key = key_algorithm(&set)?;
        let ttl = match set(env::SECRET_TTL) {
            Some(raw) => parse_duration(env::SECRET_TTL, &raw)?,
            None => Duration::from_secs(24 * 3600),
        };
        if ttl < Duration::from_secs(10) {
            return Err(err(env::SECRET_TTL, &format!("{ttl:?}"), "at least 10s"));
        }
        let ratio = |name: &str, default: f64, max: f64| -> Result<f64, ConfigError> {
            match set(name) {
                None => Ok(default),
                Some(raw) => raw
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..max).contains(r))
                    .ok_or_else(|| err(name, &raw, &format!("a number from 0 to below {max}"))),
            }
        };
        let grace_ratio = ratio(env::SECRET_GRACE_PERIOD_RATIO, 0.5, 1.0)?;
        let grace_jitter =
            ratio(env::SECRET_GRACE_PERIOD_RATIO_JITTER, 0.01, 1.0)?.min(grace_ratio);
        let output_dir = set(env::OUTPUT_CERTS).map(PathBuf::from);
        let source = cert_source(lookup, env_vars, workload, output_dir.as_deref())?;
        let mut file_allow_dirs = default_file_dirs();
        file_allow_dirs.extend(output_dir.clone());
        Ok(IdentityConfig {
            identity,
            key,
            ttl,
            grace_ratio,
            grace_jitter,
            source,
            output_dir,
            file_allow_dirs,
        })
    }
}

/// ECC_SIGNATURE_ALGORITHM with ECC_CURVE or WORKLOAD_RSA_KEY_SIZE.
fn key_algorithm(set: &dyn Fn(&str) -> Option<String>) -> Result<KeyAlgorithm, ConfigError> {
    Ok(match set(env::ECC_SIGNATURE_ALGORITHM).as_deref() {
        None | Some("ECDSA") => match set(env::ECC_CURVE).as_deref() {
            None | Some("P256") => KeyAlgorithm::EcdsaP256,
            Some("P384") => KeyAlgorithm::EcdsaP384,
            Some(other) => return Err(err(env::ECC_CURVE, other, "P256 or P384")),
        },
        Some("RSA") => match set(env::WORKLOAD_RSA_KEY_SIZE).as_deref() {
            None | Some("2048") => KeyAlgorithm::Rsa(2048),
            Some("3072") => KeyAlgorithm::Rsa(3072),
            Some("4096") => KeyAlgorithm::Rsa(4096),
            Some(other) => {
                return Err(err(env::WORKLOAD_RSA_KEY_SIZE, other, "2048, 3072 or 4096"));
            }
        },
        Some(other) => return Err(err(env::ECC_SIGNATURE_ALGORITHM, other, "ECDSA or RSA")),
    })
}

/// Mounted files (FILE_MOUNTED_CERTS, then the SPIFFE credentials, then /etc/certs unless it is
/// OUTPUT_CERTS), else CA_ADDR, else the control plane's CA.
fn cert_source(
    lookup: &dyn Fn(&str) -> Option<String>,
    env_vars: &[(String, String)],
    workload: &Workload<'_>,
    output_dir: Option<&Path>,
) -> Result<CertSource, ConfigError> {
    let file_mounted = parse_bool(
        env::FILE_MOUNTED_CERTS,
        lookup(env::FILE_MOUNTED_CERTS),
        false,
    )?;
    if file_mounted {
        return Ok(CertSource::Files(MountedFiles::in_dir(Path::new(
            "./etc/certs",
        ))));
    }
    if workload.mounted.spiffe_credentials {
        return Ok(CertSource::Files(MountedFiles::in_dir(Path::new(
            SPIFFE_CREDENTIALS_DIR,
        ))));
    }
    if workload.mounted.etc_certs && output_dir != Some(Path::new(ETC_CERTS_DIR)) {
        return Ok(CertSource::Files(MountedFiles::in_dir(Path::new(
            ETC_CERTS_DIR,
        ))));
    }
    let remote = |address: String| -> Result<CertSource, ConfigError> {
        Ok(CertSource::Remote {
            client: XdsClientConfig::for_service(
                &address,
                lookup,
                env_vars,
                env::CA_ROOT_CA,
                env::CA_HEADER_PREFIX,
            )?,
            address,
        })
    };
    let ca_addr = lookup(env::CA_ADDR).filter(|v| !v.trim().is_empty());
    match (ca_addr, workload.control_plane) {
        (Some(address), _) => remote(address),
        (None, ControlPlaneSource::Remote { address }) => remote(address.clone()),
        (None, ControlPlaneSource::Embedded { config_dir, .. }) => Ok(CertSource::Embedded {
            ca_dir: config_dir.join("cacerts"),
        }),
    }
}
