//! A workload's identity as the mesh names it and the certificates that carry it: the SPIFFE
//! `Identity` (`spiffe://<trust domain>/ns/<namespace>/sa/<service account>`), a trust bundle
//! taken certificate by certificate, PEM blocks and the URI SANs of a certificate. One copy for
//! the agent (its workload certificate, its peers) and the control plane (the CA, its callers).

use time::OffsetDateTime;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid identity {0:?}: expected spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
)]
pub struct IdentityError(pub String);

/// A workload's SPIFFE identity: `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

fn valid_segment(s: &str, dots: bool) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
        })
}

impl Identity {
    /// Builds an identity, checking every part is a Kubernetes-style name (no '/', no NUL, ...).
    pub fn new(
        trust_domain: &str,
        namespace: &str,
        service_account: &str,
    ) -> Result<Identity, IdentityError> {
        let id = Identity {
            trust_domain: trust_domain.to_string(),
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
        };
        if valid_segment(trust_domain, true)
            && valid_segment(namespace, false)
            && valid_segment(service_account, true)
        {
            Ok(id)
        } else {
            Err(IdentityError(id.to_string()))
        }
    }

    pub fn parse(uri: &str) -> Result<Identity, IdentityError> {
        let bad = || IdentityError(uri.to_string());
        let rest = uri.strip_prefix("spiffe://").ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts[..] {
            [td, "ns", ns, "sa", sa] => Identity::new(td, ns, sa).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// The PEM blocks of `text`, each with its BEGIN and END lines; text between blocks (such as
/// openssl's `subject=` lines) is dropped.
pub fn split_pem(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("-----BEGIN ") {
            inside = true;
            current.clear();
        }
        if inside {
            current.push_str(line);
            current.push('\n');
        }
        if line.starts_with("-----END ") && inside {
            inside = false;
            out.push(std::mem::take(&mut current));
        }
    }
    out
}

/// A trust bundle looked at certificate by certificate: the PEM blocks that are X.509
/// certificates in date (in their order), and why each other block was left out. A bundle is
/// kept to its usable part rather than refused whole: during a root rotation it holds the old
/// root and the new, and one bad or expired entry must not take the good ones with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustBundle {
    pub roots: Vec<String>,
    pub dropped: Vec<String>,
}

impl TrustBundle {
    pub fn parse(text: &str, now: std::time::SystemTime) -> TrustBundle {
        let now = OffsetDateTime::from(now);
        let mut bundle = TrustBundle::default();
        for (i, block) in split_pem(text).into_iter().enumerate() {
            let checked = x509_parser::pem::parse_x509_pem(block.as_bytes())
                .map_err(|e| format!("not PEM: {e}"))
                .and_then(|(_, pem)| {
                    if pem.label != "CERTIFICATE" {
                        return Err(format!("a {}, not a certificate", pem.label));
                    }
                    let cert = pem.parse_x509().map_err(|e| format!("not X.509: {e}"))?;
                    let not_after = cert.validity().not_after.to_datetime();
                    if not_after <= now {
                        return Err(format!("{} expired at {not_after}", cert.subject()));
                    }
                    Ok(())
                });
            match checked {
                Ok(()) => bundle.roots.push(block),
                Err(why) => bundle.dropped.push(format!("block {}: {why}", i + 1)),
            }
        }
        if bundle.roots.is_empty() && bundle.dropped.is_empty() {
            bundle.dropped.push("no PEM certificate in it".into());
        }
        bundle
    }
}

/// The URI SANs of a certificate, in order.
pub fn uri_sans(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    cert.subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(u) => Some(u.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}
