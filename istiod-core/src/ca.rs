//! The mesh CA: a root (generated and kept in a directory, or plugged in from Istio's `cacerts`
//! files) that signs workload certificates. Mirrors istiod's `security/pkg/pki/ca` and the
//! `IstioCertificateService.CreateCertificate` rules, stricter where Istio trusts the request:
//! - the issued certificate's only SAN is the caller's verified identity, whatever the CSR asks;
//! - the CSR's size is capped before parsing and its signature is verified;
//! - the TTL is capped, and never outlives the CA; the certificate is never a CA.
//!
//! Who the caller is (a JWT or a mesh client certificate) is decided by the server before
//! `sign` is called; this module never reads identities from the request.

use std::path::Path;
use std::time::Duration;

use mesh_common::identity::{Identity, IdentityError, split_pem};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

/// Largest CSR accepted (PEM bytes), checked before parsing.
pub const MAX_CSR_BYTES: usize = 16 * 1024;
/// Istio's default workload certificate lifetime (SECRET_TTL).
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
const ROOT_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Issued certificates start a little in the past, for clock skew between machines.
const BACKDATE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CaError {
    #[error("CSR of {0} bytes is larger than the {MAX_CSR_BYTES}-byte limit")]
    CsrTooLarge(usize),
    #[error("CSR is not a valid PEM certificate request with a correct signature")]
    BadCsr,
    #[error("requested lifetime {requested}s is not allowed: at most {max}s")]
    TtlTooLong { requested: i64, max: u64 },
    #[error(transparent)]
    BadIdentity(#[from] IdentityError),
    #[error("CA files in {dir}: {reason}")]
    Files { dir: String, reason: String },
    #[error("signing failed: {0}")]
    Sign(String),
}

/// The signing CA.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The trust bundle sent with every chain (root last).
    root_pem: String,
    /// Intermediates between the signing certificate and the root (Istio's cert-chain.pem).
    chain_pem: Vec<String>,
    not_after: OffsetDateTime,
    max_ttl: Duration,
}

impl Ca {
    /// Loads the CA from `dir`: Istio's plug-in files (`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`,
    /// optional `cert-chain.pem`), else our own `root-cert.pem` + `root-key.pem`, else generates a
    /// root there (10 years, key file 0600). Agents sharing the directory share the trust root.
    pub fn load_or_create(
        dir: &Path,
        trust_domain: &str,
        max_ttl: Duration,
    ) -> Result<Ca, CaError> {
        let files = |reason: String| CaError::Files {
            dir: dir.display().to_string(),
            reason,
        };
        // Agents starting together on one directory: one creates the root, the others load it.
        std::fs::create_dir_all(dir).map_err(|e| files(e.to_string()))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(".lock"))
            .map_err(|e| files(format!(".lock: {e}")))?;
        let _guard = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| files(format!(".lock: {e}")))?;
        Self::load_or_create_locked(dir, trust_domain, max_ttl)
    }

    fn load_or_create_locked(
        dir: &Path,
        trust_domain: &str,
        max_ttl: Duration,
    ) -> Result<Ca, CaError> {
        let files = |reason: String| CaError::Files {
            dir: dir.display().to_string(),
            reason,
        };
        let read = |name: &str| std::fs::read_to_string(dir.join(name));
        if let (Ok(cert), Ok(key), Ok(root)) = (
            read("ca-cert.pem"),
            read("ca-key.pem"),
            read("root-cert.pem"),
        ) {
            let chain = read("cert-chain.pem").ok();
            return Ca::from_plugged(&cert, &key, &root, chain.as_deref(), max_ttl).map_err(files);
        }
        if let (Ok(root), Ok(key)) = (read("root-cert.pem"), read("root-key.pem")) {
            let key = KeyPair::from_pem(&key).map_err(|e| files(format!("root-key.pem: {e}")))?;
            let issuer = Issuer::from_ca_cert_pem(&root, key)
                .map_err(|e| files(format!("root-cert.pem: {e}")))?;
            let not_after = not_after_of(&root).map_err(files)?;
            return Ok(Ca {
                issuer,
                root_pem: root,
                chain_pem: Vec::new(),
                not_after,
                max_ttl,
            });
        }
        let (ca, key_pem) = Ca::self_signed(trust_domain, max_ttl)?;
        std::fs::create_dir_all(dir).map_err(|e| files(e.to_string()))?;
        // The key is created 0600 from the start: no moment where others could read it.
        let mut key_file = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dir.join("root-key.pem"))
                .map_err(|e| files(format!("root-key.pem: {e}")))?
        };
        std::io::Write::write_all(&mut key_file, key_pem.as_bytes())
            .map_err(|e| files(e.to_string()))?;
        std::fs::write(dir.join("root-cert.pem"), ca.root_pem())
            .map_err(|e| files(e.to_string()))?;
        Ok(ca)
    }

    /// Istio's plug-in form, wherever it was read from (files, a Secret): the signing
    /// certificate `ca-cert.pem` and its key `ca-key.pem`, the root `root-cert.pem`, and the
    /// chain `cert-chain.pem` (signing certificate up to the root; when absent, the signing
    /// certificate alone). The error names the item that is wrong.
    pub fn from_plugged(
        cert: &str,
        key: &str,
        root: &str,
        chain: Option<&str>,
        max_ttl: Duration,
    ) -> Result<Ca, String> {
        let key = KeyPair::from_pem(key).map_err(|e| format!("ca-key.pem: {e}"))?;
        let issuer =
            Issuer::from_ca_cert_pem(cert, key).map_err(|e| format!("ca-cert.pem: {e}"))?;
        let not_after = not_after_of(cert).map_err(|e| format!("ca-cert.pem: {e}"))?;
        if split_pem(root).is_empty() {
            return Err("root-cert.pem: no PEM certificate in it".into());
        }
        let mut chain_pem = match chain {
            Some(chain) => split_pem(chain),
            None => vec![cert.to_string()],
        };
        chain_pem.retain(|c| c.trim() != root.trim());
        Ok(Ca {
            issuer,
            root_pem: root.to_string(),
            chain_pem,
            not_after,
            max_ttl,
        })
    }

    /// A new self-signed root for `trust_domain` (10 years) and its key in PEM, for the caller
    /// to keep (a directory, a Secret).
    pub fn self_signed(trust_domain: &str, max_ttl: Duration) -> Result<(Ca, String), CaError> {
        let key = KeyPair::generate().map_err(|e| CaError::Sign(e.to_string()))?;
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| CaError::Sign(e.to_string()))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::OrganizationName, trust_domain);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + ROOT_LIFETIME;
        let cert = params
            .self_signed(&key)
            .map_err(|e| CaError::Sign(e.to_string()))?;
        let key_pem = key.serialize_pem();
        Ok((
            Ca {
                issuer: Issuer::new(params, key),
                root_pem: cert.pem(),
                chain_pem: Vec::new(),
                not_after: now + ROOT_LIFETIME,
                max_ttl,
            },
            key_pem,
        ))
    }

    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// `now + ttl`, never past the root's own expiry; a lifetime too long for a date is the root's.
    fn expiry_after(&self, now: OffsetDateTime, ttl: Duration) -> OffsetDateTime {
        time::Duration::try_from(ttl)
            .ok()
            .and_then(|ttl| now.checked_add(ttl))
            .map_or(self.not_after, |t| t.min(self.not_after))
    }

    /// A serving certificate for the control plane itself (DNS SANs such as
    /// `istiod.istio-system.svc`), with a fresh key: (chain PEM, key PEM).
    pub fn serving_cert(
        &self,
        dns_names: &[&str],
        ttl: Duration,
    ) -> Result<(String, String), CaError> {
        let key = KeyPair::generate().map_err(|e| CaError::Sign(e.to_string()))?;
        let mut params =
            CertificateParams::new(dns_names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map_err(|e| CaError::Sign(e.to_string()))?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = self.expiry_after(now, ttl);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| CaError::Sign(e.to_string()))?;
        let mut chain = cert.pem();
        for c in &self.chain_pem {
            chain.push_str(c);
        }
        Ok((chain, key.serialize_pem()))
    }

    /// Signs `csr_pem` for `identity` with a lifetime of `ttl_seconds` (0 or less: the default).
    /// Returns the chain, leaf first and root last, as IstioCertificateResponse carries it.
    pub fn sign(
        &self,
        csr_pem: &str,
        identity: &Identity,
        ttl_seconds: i64,
    ) -> Result<Vec<String>, CaError> {
        if csr_pem.len() > MAX_CSR_BYTES {
            return Err(CaError::CsrTooLarge(csr_pem.len()));
        }
        let ttl = if ttl_seconds <= 0 {
            DEFAULT_TTL.min(self.max_ttl)
        } else {
            let ttl = Duration::from_secs(ttl_seconds.unsigned_abs());
            if ttl > self.max_ttl {
                return Err(CaError::TtlTooLong {
                    requested: ttl_seconds,
                    max: self.max_ttl.as_secs(),
                });
            }
            ttl
        };
        let csr =
            CertificateSigningRequestParams::from_pem(csr_pem).map_err(|_| CaError::BadCsr)?;
        // Nothing of the CSR but its public key is used: subject, SANs and extensions are ours.
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| CaError::Sign(e.to_string()))?;
        let uri = identity.to_string();
        params.subject_alt_names = vec![SanType::URI(
            uri.clone()
                .try_into()
                .map_err(|_| CaError::BadIdentity(IdentityError(uri)))?,
        )];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = self.expiry_after(now, ttl);
        let cert = params
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(|e| CaError::Sign(e.to_string()))?;
        let mut chain = vec![cert.pem()];
        chain.extend(self.chain_pem.iter().cloned());
        chain.push(self.root_pem.clone());
        Ok(chain)
    }
}

fn not_after_of(pem: &str) -> Result<OffsetDateTime, String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| e.to_string())?;
    let cert = pem.parse_x509().map_err(|e| e.to_string())?;
    Ok(cert.validity().not_after.to_datetime())
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::{FromDer, X509Certificate};

    fn csr(sans: Vec<String>, ca: bool) -> (String, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(sans).unwrap();
        if ca {
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        (p.serialize_request(&key).unwrap().pem().unwrap(), key)
    }

    fn ca(dir: &Path) -> Ca {
        Ca::load_or_create(dir, "cluster.local", Duration::from_secs(48 * 3600)).unwrap()
    }

    fn id() -> Identity {
        Identity::new("cluster.local", "shop", "web").unwrap()
    }

    /// (not_before, not_after) of the leaf in `chain`, in Unix seconds.
    fn validity(chain: &[String]) -> (i64, i64) {
        let der = ::pem::parse(&chain[0]).unwrap();
        let (_, cert) = X509Certificate::from_der(der.contents()).unwrap();
        (
            cert.validity().not_before.timestamp(),
            cert.validity().not_after.timestamp(),
        )
    }

    #[test]
    fn issues_only_the_callers_identity_and_never_a_ca() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(dir.path());
        // Every SAN kind a CSR can ask for, and a CA's basic constraints and key usages.
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec!["evil.example".to_string()]).unwrap();
        p.subject_alt_names.extend([
            SanType::URI(
                "spiffe://cluster.local/ns/kube-system/sa/admin"
                    .try_into()
                    .unwrap(),
            ),
            SanType::IpAddress(std::net::IpAddr::from([10, 0, 0, 1])),
            SanType::IpAddress(std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST)),
            SanType::Rfc822Name("admin@cluster.local".try_into().unwrap()),
        ]);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.distinguished_name.push(
            DnType::CommonName,
            "spiffe://cluster.local/ns/kube-system/sa/admin",
        );
        let req = p.serialize_request(&key).unwrap().pem().unwrap();
        let chain = ca.sign(&req, &id(), 3600).unwrap();
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1], ca.root_pem());
        let der = ::pem::parse(&chain[0]).unwrap();
        let (_, cert) = X509Certificate::from_der(der.contents()).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap().value;
        let names: Vec<String> = san.general_names.iter().map(|n| n.to_string()).collect();
        assert_eq!(
            names,
            vec!["URI(spiffe://cluster.local/ns/shop/sa/web)".to_string()]
        );
        assert!(!cert.is_ca());
        // Basic constraints present and saying "not a CA", no certificate signing, and nothing
        // of the CSR's subject.
        let bc = cert.basic_constraints().unwrap().unwrap().value;
        assert!(!bc.ca);
        let ku = cert.key_usage().unwrap().unwrap().value;
        assert!(!ku.key_cert_sign() && !ku.crl_sign(), "{ku:?}");
        assert!(
            !cert.subject().to_string().contains("kube-system"),
            "{}",
            cert.subject()
        );
        assert_eq!(
            cert.public_key().raw,
            x509_parser::certification_request::X509CertificationRequest::from_der(
                ::pem::parse(&req).unwrap().contents()
            )
            .unwrap()
            .1
            .certification_request_info
            .subject_pki
            .raw,
            "the leaf carries the CSR's key"
        );
        let lifetime =
            cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        assert!((3600..=3600 + 61).contains(&lifetime), "{lifetime}");
        // The leaf chains to the root.
        let root = ::pem::parse(&chain[1]).unwrap();
        let (_, root) = X509Certificate::from_der(root.contents()).unwrap();
        assert!(cert.verify_signature(Some(root.public_key())).is_ok());
    }

    #[test]
    fn rejects_bad_requests() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(dir.path());
        let (req, _) = csr(vec![], false);
        assert_eq!(
            ca.sign(&"x".repeat(MAX_CSR_BYTES + 1), &id(), 0),
            Err(CaError::CsrTooLarge(MAX_CSR_BYTES + 1))
        );
        assert!(matches!(
            ca.sign(&req, &id(), 49 * 3600),
            Err(CaError::TtlTooLong { .. })
        ));
        assert_eq!(
            ca.sign(
                "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
                &id(),
                0
            ),
            Err(CaError::BadCsr)
        );
        // A CSR whose signature does not match: flip a byte inside the signed body.
        let mut der = ::pem::parse(&req).unwrap().contents().to_vec();
        let n = der.len();
        der[n - 10] ^= 0xff;
        let tampered = ::pem::encode(&::pem::Pem::new("CERTIFICATE REQUEST", der));
        assert_eq!(ca.sign(&tampered, &id(), 0), Err(CaError::BadCsr));
    }

    /// Istio's `IstioCA.Sign` (security/pkg/pki/ca/ca.go): a requested TTL of 0 or less takes
    /// the default, one over the maximum is an error (`TTLError`), whatever the CSR. We go as far
    /// and keep the default within the maximum.
    #[test]
    fn a_ttl_of_zero_or_less_is_the_default_and_one_over_the_max_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(dir.path());
        let (req, _) = csr(vec![], false);
        for ttl in [0, -1, -3600, i64::MIN] {
            let (from, to) = validity(&ca.sign(&req, &id(), ttl).unwrap());
            assert_eq!(
                to - from,
                (DEFAULT_TTL + BACKDATE).as_secs() as i64,
                "requested {ttl}"
            );
        }
        // Exactly the maximum is allowed; a second more, ten years or i64::MAX is refused by name.
        let (from, to) = validity(&ca.sign(&req, &id(), 48 * 3600).unwrap());
        assert_eq!(to - from, 48 * 3600 + BACKDATE.as_secs() as i64);
        for ttl in [48 * 3600 + 1, 10 * 365 * 24 * 3600, i64::MAX] {
            assert_eq!(
                ca.sign(&req, &id(), ttl),
                Err(CaError::TtlTooLong {
                    requested: ttl,
                    max: 48 * 3600
                }),
                "requested {ttl}"
            );
        }
        // A maximum under the default: a default request gets the maximum, not an error
        // (Istio would issue the default, past its own maximum).
        let short =
            Ca::load_or_create(dir.path(), "cluster.local", Duration::from_secs(3600)).unwrap();
        let (from, to) = validity(&short.sign(&req, &id(), 0).unwrap());
        assert_eq!(to - from, 3600 + BACKDATE.as_secs() as i64);
    }

    /// A lifetime within the maximum but past the signing certificate's own expiry ends with
    /// it. Istio's `IstioCA.Sign` does not clamp (`GenCertFromCSR` sets `now + ttl`), issuing a
    /// leaf that outlives its issuer and stops verifying when the issuer expires; we clamp
    /// rather than refuse, so workloads keep getting certificates while the root is rotated.
    #[test]
    fn a_ttl_past_the_ca_expiry_ends_with_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        // A plugged-in CA (Istio's cacerts files) that expires in two hours.
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        p.not_before = now - Duration::from_secs(3600);
        p.not_after = now + Duration::from_secs(2 * 3600);
        let root = p.self_signed(&key).unwrap();
        std::fs::write(dir.path().join("ca-cert.pem"), root.pem()).unwrap();
        std::fs::write(dir.path().join("root-cert.pem"), root.pem()).unwrap();
        std::fs::write(dir.path().join("ca-key.pem"), key.serialize_pem()).unwrap();
        let ca = ca(dir.path());
        let root_expiry = not_after_of(&root.pem()).unwrap().unix_timestamp();
        let (req, _) = csr(vec![], false);
        for ttl in [0, 3 * 3600, 48 * 3600] {
            let (_, to) = validity(&ca.sign(&req, &id(), ttl).unwrap());
            assert_eq!(to, root_expiry, "requested {ttl}");
        }
        // Shorter than what is left: as asked.
        let (from, to) = validity(&ca.sign(&req, &id(), 600).unwrap());
        assert_eq!(to - from, 600 + BACKDATE.as_secs() as i64);
        assert!(to < root_expiry);
        // Over the maximum is still an error, not a clamp.
        assert!(matches!(
            ca.sign(&req, &id(), 49 * 3600),
            Err(CaError::TtlTooLong { .. })
        ));
    }

    #[test]
    fn identities_are_strict() {
        assert_eq!(
            Identity::parse("spiffe://cluster.local/ns/shop/sa/web").unwrap(),
            id()
        );
        for bad in [
            "spiffe://cluster.local/ns/shop/sa/web/extra",
            "spiffe://cluster.local/ns/Shop/sa/web",
            "spiffe://cluster.local/ns/sh\0op/sa/web",
            "https://cluster.local/ns/shop/sa/web",
            "spiffe://cluster.local/ns//sa/web",
        ] {
            assert!(Identity::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn agents_sharing_the_directory_share_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let a = ca(dir.path());
        let b = ca(dir.path());
        assert_eq!(a.root_pem(), b.root_pem());
        let (req, _) = csr(vec![], false);
        let chain = b.sign(&req, &id(), 0).unwrap();
        let root = ::pem::parse(a.root_pem()).unwrap();
        let (_, root) = X509Certificate::from_der(root.contents()).unwrap();
        let leaf = ::pem::parse(&chain[0]).unwrap();
        let (_, leaf) = X509Certificate::from_der(leaf.contents()).unwrap();
        assert!(leaf.verify_signature(Some(root.public_key())).is_ok());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("root-key.pem"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }
}
