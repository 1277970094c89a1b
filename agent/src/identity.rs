//! Workload identity: the agent's key and CSR, the CA it asks (the embedded istiod-core CA or a
//! remote `IstioCertificateService`), the checks on what comes back, and rotation. Mirrors
//! Istio's `security/pkg/nodeagent/cache/secretcache.go` and its Citadel CA client.
//!
//! The current certificate is published on a `watch` channel; the SDS server, readiness, the
//! metrics and OUTPUT_CERTS all read it from there. A failed renewal keeps the valid certificate
//! and retries with capped backoff; a response that fails the checks never replaces it. Trust
//! bundles keep their usable roots and are never served empty; a change of the mesh root file
//! asks for a certificate at once (Istio's secretcache rotates ROOTCA when the root changes).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mesh_common::identity::{Identity, TrustBundle, split_pem};
use mesh_common::watch::{FileWatch, Watched};
use rcgen::{CertificateParams, KeyPair, SanType};
use tokio::sync::watch;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::config::{IdentityConfig, KeyAlgorithm, MountedFiles, RootCa, XdsClientConfig};
use crate::grpc_client::{Backoff, dial, unit_random};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadCert {
    /// Leaf first, then intermediates; no root.
    pub chain_pem: String,
    pub key_pem: String,
    /// The trust bundle (ROOTCA).
    pub root_pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// Hex serial of the leaf, for logs and debug output.
    pub serial: String,
}

pub type CertWatch = watch::Receiver<Option<Arc<WorkloadCert>>>;

/// Signs CSRs for the agent's identity.
pub trait Signer: Send + Sync + 'static {
    /// Returns the chain, leaf first and root last, or why not.
    fn sign(
        &self,
        csr_pem: String,
        ttl: Duration,
    ) -> impl Future<Output = Result<Vec<String>, String>> + Send;

    /// The mesh's root bundle files this signer's CA is trusted by (Istio's order, the first
    /// present one counts): when the roots in them change, a new certificate is asked for at
    /// once, so that a root rotation reaches the workload certificate and ROOTCA without
    /// waiting for the next renewal.
    fn trust_files(&self) -> Vec<PathBuf> {
        Vec::new()
    }
}

/// How long the CA has to answer a CSR once connected (the dial has its own bound,
/// `connect_timeout`, for the TCP connect and again for the TLS handshake). A CA that drops
/// packets instead of refusing costs at most both, then the request is retried with backoff.
pub const CA_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A remote `IstioCertificateService`: TLS (unless :15010), `authorization: Bearer` with the
/// token re-read for every request, ClusterID and CA_HEADER_* metadata.
pub struct RemoteSigner {
    pub address: String,
    pub client: XdsClientConfig,
}

impl Signer for RemoteSigner {
    async fn sign(&self, csr_pem: String, ttl: Duration) -> Result<Vec<String>, String> {
        use istio_proto::ca::IstioCertificateRequest;
        use istio_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
        let channel = dial(&self.address, &self.client)
            .await
            .map_err(|s| format!("CA {}: {}", self.address, s.message()))?;
        let mut client = IstioCertificateServiceClient::new(channel);
        let request = IstioCertificateRequest {
            csr: csr_pem,
            validity_duration: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
            metadata: None,
        };
        let response = tokio::time::timeout(CA_REQUEST_TIMEOUT, client.create_certificate(request))
            .await
            .map_err(|_| {
                format!(
                    "CA {}: no answer within {CA_REQUEST_TIMEOUT:?}",
                    self.address
                )
            })?
            .map_err(|s| format!("CA {}: {:?}: {}", self.address, s.code(), s.message()))?;
        Ok(response.into_inner().cert_chain)
    }

    fn trust_files(&self) -> Vec<PathBuf> {
        match &self.client.root_ca {
            RootCa::Files(files) => files.clone(),
            RootCa::System => Vec::new(),
        }
    }
}

fn generate_key(alg: KeyAlgorithm) -> Result<KeyPair, String> {
    match alg {
        KeyAlgorithm::EcdsaP256 => {
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())
        }
        KeyAlgorithm::EcdsaP384 => {
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).map_err(|e| e.to_string())
        }
        KeyAlgorithm::Rsa(bits) => {
            use rsa::pkcs8::EncodePrivateKey;
            let mut rng = rand_core::OsRng;
            let key = rsa::RsaPrivateKey::new(&mut rng, bits).map_err(|e| e.to_string())?;
            let pem = key
                .to_pkcs8_pem(rsa::pkcs8::LineEnding::LF)
                .map_err(|e| e.to_string())?;
            KeyPair::from_pem_and_sign_algo(&pem, &rcgen::PKCS_RSA_SHA256)
                .map_err(|e| e.to_string())
        }
    }
}

/// A new key and a CSR carrying our SPIFFE URI (the CA decides the SAN regardless).
pub fn key_and_csr(alg: KeyAlgorithm, identity: &Identity) -> Result<(KeyPair, String), String> {
    let key = generate_key(alg)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    let uri = identity.to_string();
    params.subject_alt_names = vec![SanType::URI(
        uri.clone()
            .try_into()
            .map_err(|_| format!("bad identity {uri}"))?,
    )];
    let csr = params
        .serialize_request(&key)
        .and_then(|c| c.pem())
        .map_err(|e| e.to_string())?;
    Ok((key, csr))
}

fn parse_pem_chain(chain: &[String]) -> Result<Vec<Vec<u8>>, String> {
    chain
        .iter()
        .enumerate()
        .map(|(i, pem)| {
            x509_parser::pem::parse_x509_pem(pem.as_bytes())
                .map(|(_, p)| p.contents)
                .map_err(|e| format!("certificate {i} of the chain is not PEM: {e}"))
        })
        .collect()
}

fn parse_ders<'a>(what: &str, ders: &'a [Vec<u8>]) -> Result<Vec<X509Certificate<'a>>, String> {
    ders.iter()
        .enumerate()
        .map(|(i, der)| {
            X509Certificate::from_der(der)
                .map(|(_, c)| c)
                .map_err(|e| format!("{what} {i} does not parse: {e}"))
        })
        .collect()
}

fn to_system_time(t: x509_parser::time::ASN1Time) -> SystemTime {
    let secs = t.timestamp();
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        SystemTime::UNIX_EPOCH
    }
}

/// Checks a chain (leaf first, then intermediates, then the trust bundle) before it may replace
/// what Envoy has: every link is signed by the next, the last by a self-signed root of the
/// bundle, the leaf is in date, is not a CA, carries the key we hold and (when `identity` is
/// given) exactly our SPIFFE identity. The bundle (Istio's CA sends its whole root-cert.pem, two
/// roots during a rotation) is kept to its usable roots; expired or unparsable ones are dropped.
pub fn verify_chain(
    chain: &[String],
    key_pem: &str,
    identity: Option<&Identity>,
) -> Result<WorkloadCert, String> {
    if chain.len() < 2 {
        return Err(format!(
            "the CA returned {} certificate(s); expected the leaf and at least the root",
            chain.len()
        ));
    }
    let last = chain.len() - 1;
    let bundle = TrustBundle::parse(&chain[last], SystemTime::now());
    if bundle.roots.is_empty() {
        return Err(format!(
            "the root bundle holds no usable certificate: {}",
            bundle.dropped.join("; ")
        ));
    }
    let ders = parse_pem_chain(&chain[..last])?;
    let root_ders = parse_pem_chain(&bundle.roots)?;
    let certs = parse_ders("certificate", &ders)?;
    let roots = parse_ders("root", &root_ders)?;
    for (i, pair) in certs.windows(2).enumerate() {
        pair[0]
            .verify_signature(Some(pair[1].public_key()))
            .map_err(|_| format!("certificate {i} is not signed by certificate {}", i + 1))?;
    }
    let top = &certs[certs.len() - 1];
    let anchored = roots.iter().any(|root| {
        root.is_ca()
            && root.verify_signature(None).is_ok()
            && top.verify_signature(Some(root.public_key())).is_ok()
    });
    if !anchored {
        let dropped = if bundle.dropped.is_empty() {
            String::new()
        } else {
            format!(" (left out of the bundle: {})", bundle.dropped.join("; "))
        };
        return Err(format!(
            "certificate {} is not signed by a self-signed CA root of the bundle{dropped}",
            certs.len() - 1
        ));
    }
    let leaf = &certs[0];
    if leaf.is_ca() {
        return Err("the leaf certificate is a CA".into());
    }
    let key = KeyPair::from_pem(key_pem).map_err(|e| format!("private key: {e}"))?;
    if leaf.public_key().raw != rcgen::PublicKeyData::subject_public_key_info(&key).as_slice() {
        return Err("the leaf certificate is not for our private key".into());
    }
    let now = SystemTime::now();
    let not_before = to_system_time(leaf.validity().not_before);
    let not_after = to_system_time(leaf.validity().not_after);
    if not_after <= now {
        return Err("the leaf certificate has expired".into());
    }
    if let Some(identity) = identity {
        let want = identity.to_string();
        let uris = mesh_common::identity::uri_sans(leaf);
        if uris != [want.clone()] {
            return Err(format!(
                "the leaf certificate names {uris:?}; expected exactly {want}"
            ));
        }
    }
    Ok(WorkloadCert {
        chain_pem: chain[..last].concat(),
        key_pem: key_pem.to_string(),
        root_pem: bundle.roots.concat(),
        not_before,
        not_after,
        serial: leaf.raw_serial_as_string(),
    })
}

/// One issuance: key, CSR, signature by the CA, checks.
pub async fn issue<S: Signer>(cfg: &IdentityConfig, signer: &S) -> Result<WorkloadCert, String> {
    let alg = cfg.key;
    let identity = cfg.identity.clone();
    // RSA keygen takes tens of milliseconds: off the (single-threaded) runtime.
    let (key, csr) = if matches!(alg, KeyAlgorithm::Rsa(_)) {
        tokio::task::spawn_blocking(move || key_and_csr(alg, &identity))
            .await
            .map_err(|e| e.to_string())??
    } else {
        key_and_csr(alg, &identity)?
    };
    let chain = signer.sign(csr, cfg.ttl).await?;
    verify_chain(&chain, &key.serialize_pem(), Some(&cfg.identity))
}

/// When to renew: at expiry − (ratio ± jitter) × lifetime, counted from `now`. `unit` in
/// [0, 1) picks the point within the jitter. The lifetime counts from `issued` when the CA
/// backdated `not_before` (for clock skew), so a short-lived certificate is not renewed at once.
pub fn renew_after(
    cert: &WorkloadCert,
    issued: SystemTime,
    now: SystemTime,
    ratio: f64,
    jitter: f64,
    unit: f64,
) -> Duration {
    let lifetime = cert
        .not_after
        .duration_since(cert.not_before.max(issued))
        .unwrap_or_default();
    let grace = (ratio + jitter * (2.0 * unit - 1.0)).clamp(0.0, 1.0);
    let renew_at = cert.not_after - lifetime.mul_f64(grace);
    renew_at.duration_since(now).unwrap_or_default()
}

/// Retry delay after `failures` failed renewals: 1 s doubling to 30 s, but never so long that
/// a still-valid certificate expires before the next try.
pub fn retry_after(failures: u32, remaining: Option<Duration>) -> Duration {
    let backoff = Backoff::CA.after(failures);
    match remaining {
        Some(r) => backoff.min((r / 4).max(Duration::from_secs(1))),
        None => backoff,
    }
}

/// Keeps the agent's certificate-expiry gauge on the current certificate's notAfter (0 while
/// there is none). Runs until the process ends.
pub async fn export_expiry(mut certs: CertWatch, metrics: Arc<crate::metrics::Metrics>) {
    certs.mark_changed();
    while certs.changed().await.is_ok() {
        let expiry = certs.borrow().as_ref().map(|c| {
            c.not_after
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or_default()
        });
        metrics
            .cert_expiry_timestamp
            .set(expiry.unwrap_or_default());
    }
}

/// Keeps a certificate published on `tx`: the first one as soon as possible, then renewals on
/// schedule. Runs until the process ends.
pub async fn run_rotation<S: Signer>(
    cfg: Arc<IdentityConfig>,
    signer: S,
    tx: watch::Sender<Option<Arc<WorkloadCert>>>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    let mut failures = 0u32;
    let mut trust = TrustWatch::new(signer.trust_files(), metrics);
    loop {
        let delay = match issue(&cfg, &signer).await {
            Ok(cert) => {
                failures = 0;
                let now = SystemTime::now();
                let delay = renew_after(
                    &cert,
                    now,
                    now,
                    cfg.grace_ratio,
                    cfg.grace_jitter,
                    unit_random(),
                );
                tracing::info!(
                    identity = %cfg.identity,
                    serial = %cert.serial,
                    renew_in = ?delay,
                    "workload certificate issued"
                );
                publish(&cfg, &tx, cert);
                delay
            }
            Err(e) => {
                failures += 1;
                let remaining = tx
                    .borrow()
                    .as_ref()
                    .and_then(|c| c.not_after.duration_since(SystemTime::now()).ok());
                let delay = retry_after(failures, remaining);
                tracing::warn!(
                    error = %e,
                    failures,
                    retry_in = ?delay,
                    keeping_current = remaining.is_some(),
                    "workload certificate request failed"
                );
                if let crate::config::CertSource::Remote { client, .. } = &cfg.source
                    && let Some(why) =
                        crate::grpc_client::expired_token(&client.token_path, SystemTime::now())
                {
                    tracing::error!("{why}");
                }
                delay
            }
        };
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            file = trust.changed() => {
                tracing::info!(
                    file = %file.display(),
                    "the mesh root bundle changed; asking for a certificate from the new root"
                );
                failures = 0;
            }
        }
    }
}

/// How often the mesh root bundle file is looked at.
const TRUST_POLL: Duration = Duration::from_secs(1);

/// The mesh root bundle file (the first present of a signer's `trust_files`) and the usable
/// roots last seen in it.
struct TrustWatch {
    files: Vec<PathBuf>,
    watch: FileWatch,
    roots: Option<Vec<String>>,
    /// Counts each refused bundle (`root_bundle_errors`).
    metrics: Arc<crate::metrics::Metrics>,
}

impl TrustWatch {
    fn new(files: Vec<PathBuf>, metrics: Arc<crate::metrics::Metrics>) -> TrustWatch {
        let watch = FileWatch::new(files.iter().cloned().map(Watched::File).collect());
        let mut trust = TrustWatch {
            files,
            watch,
            roots: None,
            metrics,
        };
        trust.roots = trust.current().and_then(|(_, roots)| roots.ok());
        trust
    }

    /// The first present file and its usable roots, or why there are none.
    fn current(&self) -> Option<(PathBuf, Result<Vec<String>, String>)> {
        self.files
            .iter()
            .find_map(|f| match std::fs::read_to_string(f) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => Some((f.clone(), Err(format!("cannot read {}: {e}", f.display())))),
                Ok(text) => Some((f.clone(), usable_roots(&text, f))),
            })
    }

    /// Resolves with the file when its usable roots differ from the last seen. A file with no
    /// usable root (garbage, every root expired) is logged and changes nothing: the current
    /// certificate and ROOTCA stay.
    async fn changed(&mut self) -> PathBuf {
        if self.files.is_empty() {
            return std::future::pending().await;
        }
        loop {
            let seen = self.watch.next_change(TRUST_POLL).await;
            self.watch.mark_seen(seen);
            match self.current() {
                Some((file, Ok(roots))) if self.roots.as_ref() != Some(&roots) => {
                    self.roots = Some(roots);
                    return file;
                }
                Some((file, Err(e))) => {
                    self.metrics.root_bundle_errors.inc();
                    tracing::error!(
                        file = %file.display(),
                        error = %e,
                        "mesh root bundle not usable; keeping the current certificate and roots"
                    )
                }
                _ => {}
            }
            tokio::time::sleep(TRUST_POLL).await;
        }
    }
}

fn publish(
    cfg: &IdentityConfig,
    tx: &watch::Sender<Option<Arc<WorkloadCert>>>,
    cert: WorkloadCert,
) {
    if let Some(dir) = &cfg.output_dir
        && let Err(e) = write_output(dir, &cert)
    {
        tracing::error!(dir = %dir.display(), error = %e, "cannot write OUTPUT_CERTS");
    }
    tx.send_replace(Some(Arc::new(cert)));
}

/// Writes one file atomically (temporary file in the same directory, then rename).
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// OUTPUT_CERTS: key.pem (0600), cert-chain.pem and root-cert.pem, each replaced atomically.
pub fn write_output(dir: &Path, cert: &WorkloadCert) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    write_atomic(&dir.join("key.pem"), cert.key_pem.as_bytes(), 0o600)?;
    write_atomic(
        &dir.join("cert-chain.pem"),
        cert.chain_pem.as_bytes(),
        0o644,
    )?;
    write_atomic(&dir.join("root-cert.pem"), cert.root_pem.as_bytes(), 0o644)
}

/// Reads mounted certificate files into a checked certificate (any identity: the files are the
/// operator's choice). The root file is the trust bundle Envoy gets as ROOTCA: its expired or
/// unparsable entries are left out (and logged, naming the file); with none usable the files
/// are refused, so the bundle served is never empty.
pub fn read_mounted(files: &MountedFiles) -> Result<WorkloadCert, String> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
    };
    let chain_text = read(&files.cert_chain)?;
    let key = read(&files.key)?;
    let bundle = usable_roots(&read(&files.root)?, &files.root)?;
    let mut chain: Vec<String> = split_pem(&chain_text);
    if chain.is_empty() {
        return Err(format!("{}: no certificate", files.cert_chain.display()));
    }
    // A chain file that ends with its root: the root is the bundle's to give.
    if chain.len() > 1
        && let Some(top) = chain.last()
        && bundle.iter().any(|r| r.trim() == top.trim())
    {
        chain.pop();
    }
    chain.push(bundle.concat());
    verify_chain(&chain, &key, None).map_err(|e| {
        format!(
            "{} with the roots of {}: {e}",
            files.cert_chain.display(),
            files.root.display()
        )
    })
}

/// The usable roots of the bundle `text` read from `path`: each entry left out is logged with
/// the file's name; none usable is an error naming the file.
pub fn usable_roots(text: &str, path: &Path) -> Result<Vec<String>, String> {
    let bundle = TrustBundle::parse(text, SystemTime::now());
    if bundle.roots.is_empty() {
        return Err(format!(
            "root bundle {}: no usable certificate ({})",
            path.display(),
            bundle.dropped.join("; ")
        ));
    }
    for why in &bundle.dropped {
        tracing::error!(file = %path.display(), entry = %why, "root bundle entry left out");
    }
    Ok(bundle.roots)
}

/// How often mounted certificate files are looked at.
const MOUNTED_POLL: Duration = Duration::from_millis(500);

/// File-mounted mode: publishes the files, and again whenever they change. A change that does
/// not pass the checks (a half-written file, a bundle that does not verify) is logged and the
/// last good certificate stays.
pub async fn run_mounted(
    cfg: Arc<IdentityConfig>,
    files: MountedFiles,
    tx: watch::Sender<Option<Arc<WorkloadCert>>>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    let paths = [&files.cert_chain, &files.key, &files.root].map(|p| Watched::File(p.clone()));
    let mut watch = FileWatch::unseen(paths.to_vec());
    // The files as last refused: a bad change is retried every poll but counted once.
    let mut refused = None;
    loop {
        let now = watch.next_change(MOUNTED_POLL).await;
        match read_mounted(&files) {
            Ok(cert) => {
                tracing::info!(serial = %cert.serial, "mounted workload certificate loaded");
                watch.mark_seen(now);
                publish(&cfg, &tx, cert);
            }
            Err(e) => {
                let root_refused = std::fs::read_to_string(&files.root)
                    .is_ok_and(|text| usable_roots(&text, &files.root).is_err());
                if root_refused && refused.as_ref() != Some(&now) {
                    metrics.root_bundle_errors.inc();
                }
                refused = Some(now);
                tracing::warn!(error = %e, "mounted certificate not usable; keeping the last good one")
            }
        }
        tokio::time::sleep(MOUNTED_POLL).await;
    }
}

/// What `/debug/certs` shows: never the key.
pub fn summary(cert: &WorkloadCert) -> serde_json::Value {
    let unix = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default()
    };
    let names = |pem: &str| -> Vec<String> {
        split_pem(pem)
            .iter()
            .filter_map(|p| x509_parser::pem::parse_x509_pem(p.as_bytes()).ok())
            .filter_map(|(_, p)| {
                X509Certificate::from_der(&p.contents)
                    .ok()
                    .map(|(_, c)| c.subject().to_string())
            })
            .collect()
    };
    // The leaf's URI SANs: the SPIFFE identity the CA granted.
    let uri_sans: Vec<String> = split_pem(&cert.chain_pem)
        .first()
        .and_then(|p| x509_parser::pem::parse_x509_pem(p.as_bytes()).ok())
        .and_then(|(_, p)| {
            let (_, c) = X509Certificate::from_der(&p.contents).ok()?;
            let san = c.subject_alternative_name().ok()??;
            Some(
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
                        _ => None,
                    })
                    .collect(),
            )
        })
        .unwrap_or_default();
    serde_json::json!({
        "serial": cert.serial,
        "uri_sans": uri_sans,
        "not_before_unix": unix(cert.not_before),
        "not_after_unix": unix(cert.not_after),
        "seconds_left": seconds_left(cert),
        "chain_subjects": names(&cert.chain_pem),
        "roots": names(&cert.root_pem),
    })
}

/// Seconds until `cert` expires (negative once expired), for `istio_agent_cert_expiry_seconds`.
pub fn seconds_left(cert: &WorkloadCert) -> f64 {
    match cert.not_after.duration_since(SystemTime::now()) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CertSource;
    use crate::embedded::EmbeddedSigner;
    use istiod_core::ca::Ca;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn identity() -> Identity {
        Identity::new("cluster.local", "shop", "web").unwrap()
    }

    fn config(ttl: Duration) -> IdentityConfig {
        IdentityConfig {
            identity: identity(),
            key: KeyAlgorithm::EcdsaP256,
            ttl,
            grace_ratio: 0.5,
            grace_jitter: 0.01,
            source: CertSource::Embedded {
                ca_dir: PathBuf::new(),
            },
            output_dir: None,
            file_allow_dirs: vec![],
        }
    }

    /// The real CA, with a switch to make it fail and a log of when it was asked.
    struct Switchable {
        ca: Arc<Ca>,
        down: Arc<AtomicBool>,
        calls: Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
        identity: Identity,
    }

    impl Signer for Switchable {
        async fn sign(&self, csr: String, ttl: Duration) -> Result<Vec<String>, String> {
            self.calls.lock().unwrap().push(tokio::time::Instant::now());
            if self.down.load(Ordering::SeqCst) {
                return Err("CA unavailable".into());
            }
            EmbeddedSigner {
                ca: self.ca.clone(),
                identity: self.identity.clone(),
            }
            .sign(csr, ttl)
            .await
        }
    }

    fn ca(dir: &Path) -> Arc<Ca> {
        Arc::new(Ca::load_or_create(dir, "cluster.local", Duration::from_secs(48 * 3600)).unwrap())
    }

    #[test]
    fn schedule_is_half_the_lifetime_within_the_jitter() {
        let now = SystemTime::now();
        let cert = WorkloadCert {
            chain_pem: String::new(),
            key_pem: String::new(),
            root_pem: String::new(),
            not_before: now,
            not_after: now + Duration::from_secs(1000),
            serial: String::new(),
        };
        assert_eq!(
            renew_after(&cert, now, now, 0.5, 0.01, 0.5),
            Duration::from_secs(500)
        );
        // The grace period is 49% to 51% of the lifetime: renew 490 to 510 s from now.
        assert_eq!(
            renew_after(&cert, now, now, 0.5, 0.01, 0.0),
            Duration::from_secs(510)
        );
        let early = renew_after(&cert, now, now, 0.5, 0.01, 0.999_999);
        assert!(early >= Duration::from_secs(490) && early < Duration::from_secs(491));
        // Already past the point: renew now.
        let later = now + Duration::from_secs(900);
        assert_eq!(
            renew_after(&cert, now, later, 0.5, 0.01, 0.5),
            Duration::ZERO
        );
        // A backdated certificate: the lifetime counts from issuance (100 s, renew at 50 s).
        let backdated = WorkloadCert {
            not_before: now - Duration::from_secs(60),
            not_after: now + Duration::from_secs(100),
            ..cert.clone()
        };
        assert_eq!(
            renew_after(&backdated, now, now, 0.5, 0.0, 0.5),
            Duration::from_secs(50)
        );
        assert_eq!(retry_after(1, None), Duration::from_secs(1));
        assert_eq!(retry_after(4, None), Duration::from_secs(8));
        assert_eq!(retry_after(30, None), Duration::from_secs(30));
        assert_eq!(
            retry_after(30, Some(Duration::from_secs(20))),
            Duration::from_secs(5)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn rotates_on_schedule_and_keeps_the_cert_while_the_ca_is_down() {
        let dir = tempfile::tempdir().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let signer = Switchable {
            ca: ca(dir.path()),
            down: down.clone(),
            calls: calls.clone(),
            identity: identity(),
        };
        let (tx, mut rx) = watch::channel(None);
        let start = tokio::time::Instant::now();
        tokio::spawn(run_rotation(
            Arc::new(config(Duration::from_secs(1000))),
            signer,
            tx,
            Arc::new(crate::metrics::Metrics::new()),
        ));
        rx.changed().await.unwrap();
        let first = rx.borrow().clone().unwrap();
        // Renewal is due at (0.5 ± 0.01) of the 1000 s lifetime: 490 to 510 s after issuance.
        rx.changed().await.unwrap();
        let second = rx.borrow().clone().unwrap();
        let at = start.elapsed();
        assert!(
            at >= Duration::from_secs(489) && at <= Duration::from_secs(511),
            "{at:?}"
        );
        assert_ne!(first.serial, second.serial);
        assert_ne!(
            first.key_pem, second.key_pem,
            "every renewal uses a new key"
        );

        // CA down at the next renewal: retries with backoff, the valid cert stays published.
        down.store(true, Ordering::SeqCst);
        let before = calls.lock().unwrap().len();
        tokio::time::sleep(Duration::from_secs(560)).await;
        let failed = calls.lock().unwrap().len() - before;
        assert!(failed >= 3, "retried {failed} times");
        assert_eq!(rx.borrow().as_ref().unwrap().serial, second.serial);
        let gaps: Vec<Duration> = calls.lock().unwrap()[before..]
            .windows(2)
            .map(|w| w[1] - w[0])
            .collect();
        assert!(
            gaps.windows(2).all(|g| g[1] >= g[0]),
            "backoff grows: {gaps:?}"
        );
        assert!(
            gaps.iter().all(|g| *g <= Duration::from_secs(30)),
            "capped: {gaps:?}"
        );

        // The CA comes back: a new certificate before the old one expires.
        down.store(false, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(31), rx.changed())
            .await
            .expect("renewed within one backoff period")
            .unwrap();
        assert_ne!(rx.borrow().as_ref().unwrap().serial, second.serial);
    }

    #[test]
    fn rejects_chains_that_do_not_check_out() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(dir.path());
        let other = tempfile::tempdir().unwrap();
        let other_ca = self::ca(other.path());
        let (key, csr) = key_and_csr(KeyAlgorithm::EcdsaP256, &identity()).unwrap();
        let key_pem = key.serialize_pem();
        let chain = ca.sign(&csr, &identity(), 3600).unwrap();
        assert!(verify_chain(&chain, &key_pem, Some(&identity())).is_ok());
        // Wrong identity.
        let theirs = Identity::new("cluster.local", "shop", "admin").unwrap();
        let e = verify_chain(
            &ca.sign(&csr, &theirs, 3600).unwrap(),
            &key_pem,
            Some(&identity()),
        )
        .unwrap_err();
        assert!(
            e.contains("expected exactly spiffe://cluster.local/ns/shop/sa/web"),
            "{e}"
        );
        // A root that did not sign the leaf.
        let forged = vec![chain[0].clone(), other_ca.root_pem().to_string()];
        assert!(verify_chain(&forged, &key_pem, Some(&identity())).is_err());
        // A leaf for someone else's key.
        let (other_key, _) = key_and_csr(KeyAlgorithm::EcdsaP256, &identity()).unwrap();
        let e = verify_chain(&chain, &other_key.serialize_pem(), Some(&identity())).unwrap_err();
        assert!(e.contains("not for our private key"), "{e}");
        // Only a leaf, or garbage.
        assert!(verify_chain(&chain[..1], &key_pem, None).is_err());
        assert!(verify_chain(&["junk".into(), "junk".into()], &key_pem, None).is_err());
    }

    #[tokio::test]
    async fn rsa_keys_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(Duration::from_secs(3600));
        cfg.key = KeyAlgorithm::Rsa(2048);
        let signer = EmbeddedSigner {
            ca: ca(dir.path()),
            identity: identity(),
        };
        let cert = issue(&cfg, &signer).await.unwrap();
        assert!(cert.key_pem.contains("BEGIN PRIVATE KEY"));
        let key = KeyPair::from_pem(&cert.key_pem).unwrap();
        assert!(key.is_compatible(&rcgen::PKCS_RSA_SHA256));
    }

    #[test]
    fn output_certs_are_written_with_a_private_key_file() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(dir.path());
        let (key, csr) = key_and_csr(KeyAlgorithm::EcdsaP256, &identity()).unwrap();
        let cert = verify_chain(
            &ca.sign(&csr, &identity(), 3600).unwrap(),
            &key.serialize_pem(),
            None,
        )
        .unwrap();
        let out = dir.path().join("out");
        write_output(&out, &cert).unwrap();
        let mode = |f: &str| {
            std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(out.join(f)).unwrap().permissions(),
            ) & 0o777
        };
        assert_eq!(mode("key.pem"), 0o600);
        assert_eq!(mode("cert-chain.pem"), 0o644);
        // What was written reads back as the same certificate.
        let back = read_mounted(&MountedFiles::in_dir(&out)).unwrap();
        assert_eq!(back.serial, cert.serial);
        assert_eq!(back.root_pem, ca.root_pem());
    }

    /// OUTPUT_CERTS unset: a rotation writes the key nowhere (no file under the test's
    /// directories holds it). Set: across 50 rotations a watcher looking at the directory
    /// as fast as it can never sees a key-bearing file (key.pem, its temporary file, or any
    /// file holding a private key) with a mode other than 0600, nor a key.pem that is not a
    /// whole key (each is replaced by rename, never rewritten in place).
    #[test]
    fn key_files_are_written_only_when_asked_and_never_readable_by_others() {
        use std::io::Read;
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = tempfile::tempdir().unwrap();
        let ca = ca(ca_dir.path());
        let (tx, _rx) = watch::channel(None);

        let unset = config(Duration::from_secs(3600));
        let cert = issued_by(&ca);
        let key = cert.key_pem.clone();
        publish(&unset, &tx, cert);
        let mut written = Vec::new();
        let mut pending = vec![dir.path().to_path_buf()];
        while let Some(d) = pending.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    pending.push(path);
                } else if std::fs::read_to_string(&path).is_ok_and(|t| t.contains(key.trim())) {
                    written.push(path);
                }
            }
        }
        assert!(
            written.is_empty(),
            "key written without OUTPUT_CERTS: {written:?}"
        );

        let out = dir.path().join("out");
        let set = IdentityConfig {
            output_dir: Some(out.clone()),
            ..config(Duration::from_secs(3600))
        };
        std::fs::create_dir_all(&out).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (out, stop) = (out.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut looked, mut bad) = (0usize, Vec::new());
                while !stop.load(Ordering::SeqCst) {
                    let Ok(entries) = std::fs::read_dir(&out) else {
                        continue;
                    };
                    for entry in entries.flatten() {
                        let name = entry.file_name().to_string_lossy().into_owned();
                        // Opened, then looked at through the handle: the mode and the
                        // contents are of the same file, even if it is renamed over meanwhile.
                        let Ok(mut f) = std::fs::File::open(entry.path()) else {
                            continue;
                        };
                        let mode = f.metadata().unwrap().permissions().mode() & 0o777;
                        let mut text = String::new();
                        let _ = f.read_to_string(&mut text);
                        let key_bearing = name.starts_with("key") || text.contains("PRIVATE KEY");
                        if key_bearing {
                            looked += 1;
                            if mode != 0o600 {
                                bad.push(format!("{name} mode {mode:o}"));
                            }
                        }
                        if name == "key.pem" && !text.trim_end().ends_with("PRIVATE KEY-----") {
                            bad.push(format!("key.pem not whole: {} bytes", text.len()));
                        }
                    }
                }
                (looked, bad)
            })
        };
        let mut last = None;
        for _ in 0..50 {
            let cert = issued_by(&ca);
            last = Some(cert.key_pem.clone());
            publish(&set, &tx, cert);
        }
        stop.store(true, Ordering::SeqCst);
        let (looked, bad) = watcher.join().unwrap();
        assert!(bad.is_empty(), "{bad:?}");
        assert!(looked >= 50, "the watcher saw only {looked} key files");
        assert_eq!(
            std::fs::read_to_string(out.join("key.pem")).unwrap(),
            last.unwrap()
        );
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
    }

    #[tokio::test]
    async fn mounted_files_are_watched_and_a_bad_update_keeps_the_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(&dir.path().join("ca"));
        let issue = || {
            let (key, csr) = key_and_csr(KeyAlgorithm::EcdsaP256, &identity()).unwrap();
            verify_chain(
                &ca.sign(&csr, &identity(), 3600).unwrap(),
                &key.serialize_pem(),
                None,
            )
            .unwrap()
        };
        let mounted = dir.path().join("certs");
        let first = issue();
        write_output(&mounted, &first).unwrap();
        let (tx, mut rx) = watch::channel(None);
        let metrics = Arc::new(crate::metrics::Metrics::new());
        tokio::spawn(run_mounted(
            Arc::new(config(Duration::from_secs(60))),
            MountedFiles::in_dir(&mounted),
            tx,
            metrics.clone(),
        ));
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow().as_ref().unwrap().serial, first.serial);

        // A broken chain (as a half-finished copy would leave) is not taken.
        std::fs::write(
            mounted.join("cert-chain.pem"),
            "-----BEGIN CERTIFICATE-----\nAAAA\n",
        )
        .unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(rx.borrow().as_ref().unwrap().serial, first.serial);
        assert_eq!(
            metrics.root_bundle_errors.get(),
            0,
            "a broken chain is not a root bundle error"
        );
        write_output(&mounted, &first).unwrap();
        // Nor a root file that is garbage: ROOTCA stays what it was, never empty. It is
        // counted once, though it is looked at again on every poll.
        std::fs::write(mounted.join("root-cert.pem"), "not a certificate").unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(rx.borrow().as_ref().unwrap().root_pem, first.root_pem);
        assert_eq!(metrics.root_bundle_errors.get(), 1);
        assert!(
            metrics
                .encode()
                .contains("istio_agent_root_bundle_errors_total 1"),
            "{}",
            metrics.encode()
        );

        let second = issue();
        write_output(&mounted, &second).unwrap();
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rx.borrow().as_ref().unwrap().serial, second.serial);
    }

    /// A PEM block that is not a certificate inside.
    const GARBAGE_PEM: &str =
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";

    /// A self-signed CA certificate that expired in 2001.
    fn expired_root() -> String {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        params.self_signed(&key).unwrap().pem()
    }

    fn issued_by(ca: &Ca) -> WorkloadCert {
        let (key, csr) = key_and_csr(KeyAlgorithm::EcdsaP256, &identity()).unwrap();
        verify_chain(
            &ca.sign(&csr, &identity(), 3600).unwrap(),
            &key.serialize_pem(),
            None,
        )
        .unwrap()
    }

    fn roots_in(pem: &str) -> Vec<String> {
        split_pem(pem)
            .iter()
            .map(|c| c.trim().to_string())
            .collect()
    }

    /// ROOTCA from mounted files: a root file that is garbage, holds no certificate or only
    /// expired ones is refused by name (the last good bundle stays with the caller); a partly
    /// invalid one is served without its bad entries, never as it is and never empty.
    #[test]
    fn a_mounted_root_bundle_is_kept_to_its_usable_roots_and_never_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(&dir.path().join("ca"));
        let other = self::ca(&dir.path().join("other"));
        let mounted = dir.path().join("certs");
        write_output(&mounted, &issued_by(&ca)).unwrap();
        let files = MountedFiles::in_dir(&mounted);
        let root = ca.root_pem().trim().to_string();
        let set_root = |text: &str| std::fs::write(&files.root, text).unwrap();
        for bad in ["garbage", "", GARBAGE_PEM, &expired_root()] {
            set_root(bad);
            let e = read_mounted(&files).unwrap_err();
            assert!(
                e.contains(&files.root.display().to_string()),
                "{bad:?}: the error does not name the root file: {e}"
            );
        }
        for partly in [
            format!("{}{root}\n", expired_root()),
            format!("{root}\n{GARBAGE_PEM}"),
            format!("{GARBAGE_PEM}{root}\n"),
        ] {
            set_root(&partly);
            let cert = read_mounted(&files).unwrap_or_else(|e| panic!("{partly}: {e}"));
            assert_eq!(
                roots_in(&cert.root_pem),
                std::slice::from_ref(&root),
                "{partly}"
            );
        }
        // Two good roots (a rotation in progress): both are trusted.
        set_root(&format!("{}{}", other.root_pem(), ca.root_pem()));
        let cert = read_mounted(&files).unwrap();
        assert_eq!(
            roots_in(&cert.root_pem),
            [other.root_pem().trim().to_string(), root]
        );
    }

    /// The CA's root bundle (Istio's CA sends its whole root-cert.pem, two roots during a
    /// rotation): the chain may end at any usable root of it; expired and garbage entries are
    /// left out of ROOTCA; a bundle with nothing usable is refused.
    #[test]
    fn the_cas_root_bundle_is_kept_to_its_usable_roots() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(&dir.path().join("ca"));
        let other = self::ca(&dir.path().join("other"));
        let (key, csr) = key_and_csr(KeyAlgorithm::EcdsaP256, &identity()).unwrap();
        let key_pem = key.serialize_pem();
        let leaf = ca.sign(&csr, &identity(), 3600).unwrap().remove(0);
        let root = ca.root_pem().trim().to_string();
        let two = format!("{}{}", other.root_pem(), ca.root_pem());
        let cert = verify_chain(&[leaf.clone(), two], &key_pem, Some(&identity())).unwrap();
        assert_eq!(
            roots_in(&cert.root_pem),
            [other.root_pem().trim().to_string(), root.clone()]
        );
        let partly = format!("{}{GARBAGE_PEM}{}", expired_root(), ca.root_pem());
        let cert = verify_chain(&[leaf.clone(), partly], &key_pem, Some(&identity())).unwrap();
        assert_eq!(roots_in(&cert.root_pem), [root]);
        let e = verify_chain(&[leaf.clone(), expired_root()], &key_pem, None).unwrap_err();
        assert!(e.contains("expired"), "{e}");
        let e = verify_chain(&[leaf, GARBAGE_PEM.into()], &key_pem, None).unwrap_err();
        assert!(e.contains("no usable certificate"), "{e}");
    }

    /// The real CA whose root can be replaced mid-test, trusted through a mesh root file.
    struct RotatingCa {
        ca: Arc<std::sync::Mutex<Arc<Ca>>>,
        trust: PathBuf,
    }

    impl Signer for RotatingCa {
        async fn sign(&self, csr: String, ttl: Duration) -> Result<Vec<String>, String> {
            let ca = self.ca.lock().unwrap().clone();
            EmbeddedSigner {
                ca,
                identity: identity(),
            }
            .sign(csr, ttl)
            .await
        }

        fn trust_files(&self) -> Vec<PathBuf> {
            vec![self.trust.clone()]
        }
    }

    /// A root rotation reaches the workload certificate and ROOTCA at once: when the mesh root
    /// bundle file changes, a certificate is asked for then, not at the next renewal (hours
    /// later), and it comes from the new root. A bundle file with nothing usable in it changes
    /// nothing.
    #[tokio::test(start_paused = true)]
    async fn a_new_mesh_root_is_taken_at_once_and_a_bad_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let old = ca(&dir.path().join("old"));
        let new = ca(&dir.path().join("new"));
        let trust = dir.path().join("root-cert.pem");
        std::fs::write(&trust, old.root_pem()).unwrap();
        let current = Arc::new(std::sync::Mutex::new(old.clone()));
        let (tx, mut rx) = watch::channel(None);
        let metrics = Arc::new(crate::metrics::Metrics::new());
        tokio::spawn(run_rotation(
            Arc::new(config(Duration::from_secs(1000))),
            RotatingCa {
                ca: current.clone(),
                trust: trust.clone(),
            },
            tx,
            metrics.clone(),
        ));
        rx.changed().await.unwrap();
        let first = rx.borrow().clone().unwrap();
        assert_eq!(roots_in(&first.root_pem), roots_in(old.root_pem()));

        for bad in [GARBAGE_PEM.to_string(), expired_root(), String::new()] {
            std::fs::write(&trust, &bad).unwrap();
            let quiet = tokio::time::timeout(Duration::from_secs(30), rx.changed()).await;
            assert!(
                quiet.is_err(),
                "re-issued on an unusable root bundle {bad:?}"
            );
        }
        assert_eq!(rx.borrow().as_ref().unwrap().serial, first.serial);
        // Each unusable bundle is counted once, however long it stays.
        assert_eq!(metrics.root_bundle_errors.get(), 3);

        // The CA signs from a new root and the mesh bundle names both: well before the
        // renewal is due (490 s), a certificate from the new root with the new ROOTCA.
        *current.lock().unwrap() = new.clone();
        std::fs::write(&trust, format!("{}{}", old.root_pem(), new.root_pem())).unwrap();
        tokio::time::timeout(Duration::from_secs(10), rx.changed())
            .await
            .expect("no certificate from the new root after the root file changed")
            .unwrap();
        let second = rx.borrow().clone().unwrap();
        assert_ne!(second.serial, first.serial);
        assert_eq!(roots_in(&second.root_pem), roots_in(new.root_pem()));
        assert_eq!(
            metrics.root_bundle_errors.get(),
            3,
            "a good bundle is no error"
        );
    }

    /// The CA as `istiod-core serve` runs it (JWT-authenticated), on loopback.
    async fn jwt_ca(ca: Arc<Ca>, signer: &KeyPair) -> String {
        use istiod_core::ca_server::{CaService, JwtAuthenticator};
        let auth = JwtAuthenticator::from_pem(
            signer.public_key_pem().as_bytes(),
            "test",
            "https://issuer.test",
            "cluster.local",
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(CaService::new(ca, Arc::new(auth)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        addr
    }

    /// A service-account token for shop/web, expiring `exp_in` seconds from now (negative:
    /// already expired, past the CA's 30 s leeway).
    fn sa_token(signer: &KeyPair, exp_in: i64) -> String {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claims = serde_json::json!({
            "sub": "system:serviceaccount:shop:web",
            "aud": istiod_core::ca_server::AUDIENCE,
            "iss": "https://issuer.test",
            "exp": now.saturating_add_signed(exp_in),
        });
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256),
            &claims,
            &jsonwebtoken::EncodingKey::from_ec_pem(signer.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap()
    }

    fn remote(address: String, token_path: PathBuf) -> RemoteSigner {
        RemoteSigner {
            address,
            client: XdsClientConfig {
                tls: false,
                root_ca: RootCa::Files(vec![]),
                server_name: "istiod.istio-system.svc".into(),
                token_path,
                headers: vec![],
                connect_timeout: Duration::from_secs(5),
                max_response_bytes: 1 << 20,
            },
        }
    }

    /// Istio #26225: the token is read for every CSR. The CA accepts only an unexpired token;
    /// kubelet replaces it by swapping the projected volume's `..data` symlink, and a plain
    /// file may be overwritten in place: either way the next CSR carries the new token.
    #[tokio::test]
    async fn the_next_csr_carries_the_rotated_token() {
        let dir = tempfile::tempdir().unwrap();
        let jwt_key = KeyPair::generate().unwrap();
        let address = jwt_ca(ca(&dir.path().join("ca")), &jwt_key).await;
        let cfg = config(Duration::from_secs(3600));
        // Kubelet's layout: istio-token -> ..data/istio-token, ..data -> ..<timestamp>.
        let tokens = dir.path().join("tokens");
        let generation = |name: &str, token: &str| {
            std::fs::create_dir_all(tokens.join(name)).unwrap();
            std::fs::write(tokens.join(name).join("istio-token"), token).unwrap();
        };
        generation("..2024_01_01_00_00_00.1", &sa_token(&jwt_key, -300));
        std::os::unix::fs::symlink("..2024_01_01_00_00_00.1", tokens.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/istio-token", tokens.join("istio-token")).unwrap();
        let signer = remote(address, tokens.join("istio-token"));

        let e = issue(&cfg, &signer).await.unwrap_err();
        assert!(e.contains("token rejected"), "{e}");

        generation("..2024_01_01_01_00_00.2", &sa_token(&jwt_key, 3600));
        std::os::unix::fs::symlink("..2024_01_01_01_00_00.2", tokens.join("..data_tmp")).unwrap();
        std::fs::rename(tokens.join("..data_tmp"), tokens.join("..data")).unwrap();
        let cert = issue(&cfg, &signer).await.unwrap();
        assert!(summary(&cert)["uri_sans"][0] == "spiffe://cluster.local/ns/shop/sa/web");

        // Overwritten in place: expired, then fresh again.
        let file = dir.path().join("plain-token");
        std::fs::write(&file, sa_token(&jwt_key, -300)).unwrap();
        let signer = remote(signer.address, file.clone());
        let e = issue(&cfg, &signer).await.unwrap_err();
        assert!(e.contains("token rejected"), "{e}");
        std::fs::write(&file, format!("{}\n", sa_token(&jwt_key, 3600))).unwrap();
        issue(&cfg, &signer).await.unwrap();
    }

    /// A CA that accepts the connection and then never answers (packets dropped after the TCP
    /// handshake): the TLS handshake is bounded by the connect timeout, so the request fails
    /// in bounded time and is retried, instead of holding the rotation task forever.
    #[tokio::test]
    async fn a_ca_that_accepts_and_never_answers_fails_in_bounded_time() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(&dir.path().join("ca"));
        let root = dir.path().join("root-cert.pem");
        std::fs::write(&root, ca.root_pem()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let mut signer = remote(address, dir.path().join("no-token"));
        signer.client.tls = true;
        signer.client.root_ca = RootCa::Files(vec![root]);
        signer.client.connect_timeout = Duration::from_secs(1);
        let started = std::time::Instant::now();
        let result = tokio::time::timeout(
            Duration::from_secs(20),
            issue(&config(Duration::from_secs(3600)), &signer),
        )
        .await
        .expect("the CA request hung on a CA that never answers");
        let e = result.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{e}");
        assert!(e.contains(&signer.address), "{e}");
    }
}
