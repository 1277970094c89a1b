//! `istio.v1.auth.IstioCertificateService/CreateCertificate`: who is asking comes only from a
//! verified credential, a Kubernetes service-account token checked by an [`Authenticator`]:
//! here a JWT verified against a configured public key (`sub`
//! `system:serviceaccount:<namespace>:<name>`, audience `istio-ca`, issuer and signature), or
//! in a cluster a TokenReview by the API server (`kube::identity`), as istiod does. Headers,
//! metadata and the source address never name the caller (CVE-2022-39388), and a missing or
//! broken key fails closed: no certificate is issued.

use std::sync::Arc;

use futures::future::BoxFuture;
use istio_proto::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use istio_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use tonic::{Request, Response, Status};

use crate::ca::Ca;
use mesh_common::identity::Identity;

/// The audience Istio's agents request their tokens for.
pub const AUDIENCE: &str = "istio-ca";

#[derive(Debug, thiserror::Error)]
#[error("JWT public key {path}: {reason}")]
pub struct KeyError {
    pub path: String,
    pub reason: String,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
}

/// Verifies service-account tokens and turns them into identities.
pub struct JwtAuthenticator {
    keys: Vec<(DecodingKey, Algorithm)>,
    issuer: String,
    trust_domain: String,
}

impl JwtAuthenticator {
    /// From a PEM public key (EC P-256 or RSA), the expected issuer and the mesh trust domain.
    pub fn from_pem(
        pem: &[u8],
        path: &str,
        issuer: &str,
        trust_domain: &str,
    ) -> Result<Self, KeyError> {
        let keys = if let Ok(k) = DecodingKey::from_ec_pem(pem) {
            vec![(k, Algorithm::ES256)]
        } else if let Ok(k) = DecodingKey::from_rsa_pem(pem) {
            vec![(k, Algorithm::RS256)]
        } else {
            return Err(KeyError {
                path: path.to_string(),
                reason: "not an EC (P-256) or RSA public key in PEM".into(),
            });
        };
        Ok(JwtAuthenticator {
            keys,
            issuer: issuer.to_string(),
            trust_domain: trust_domain.to_string(),
        })
    }

    /// From a JWKS file (`{"keys": [...]}`): EC P-256 (ES256) and RSA (RS256) keys. Any key
    /// that cannot be used is an error, so a broken file fails closed at start.
    pub fn from_jwks(
        json: &[u8],
        path: &str,
        issuer: &str,
        trust_domain: &str,
    ) -> Result<Self, KeyError> {
        use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
        let fail = |reason: String| KeyError {
            path: path.to_string(),
            reason,
        };
        let set: JwkSet =
            serde_json::from_slice(json).map_err(|e| fail(format!("not a JWKS document: {e}")))?;
        if set.keys.is_empty() {
            return Err(fail("the key set is empty".into()));
        }
        let mut keys = Vec::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            let alg = match &jwk.algorithm {
                AlgorithmParameters::EllipticCurve(_) => Algorithm::ES256,
                AlgorithmParameters::RSA(_) => Algorithm::RS256,
                _ => {
                    return Err(fail(format!(
                        "key {i}: only EC P-256 and RSA keys are accepted"
                    )));
                }
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| fail(format!("key {i}: {e}")))?;
            keys.push((key, alg));
        }
        Ok(JwtAuthenticator {
            keys,
            issuer: issuer.to_string(),
            trust_domain: trust_domain.to_string(),
        })
    }

    /// The identity a token proves, or why it proves nothing.
    pub fn authenticate(&self, token: &str) -> Result<Identity, String> {
        let mut last = "no key".to_string();
        for (key, alg) in &self.keys {
            let mut v = Validation::new(*alg);
            v.set_audience(&[AUDIENCE]);
            v.set_issuer(&[&self.issuer]);
            v.set_required_spec_claims(&["exp", "aud", "iss", "sub"]);
            v.leeway = 30;
            match jsonwebtoken::decode::<Claims>(token, key, &v) {
                Ok(data) => {
                    let parts: Vec<&str> = data.claims.sub.split(':').collect();
                    return match parts[..] {
                        ["system", "serviceaccount", ns, sa] => {
                            Identity::new(&self.trust_domain, ns, sa).map_err(|e| e.to_string())
                        }
                        _ => Err(format!(
                            "subject {:?} is not a service account",
                            data.claims.sub
                        )),
                    };
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
    }
}

/// Turns a caller's bearer token into the identity it proves, or says why it proves nothing.
/// Anything that cannot decide (a key that does not load, an API server that does not answer)
/// is a refusal: the CA fails closed.
pub trait Authenticator: Send + Sync {
    fn identify<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Identity, String>>;
}

impl Authenticator for JwtAuthenticator {
    fn identify<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Identity, String>> {
        Box::pin(std::future::ready(self.authenticate(token)))
    }
}

/// The SPIFFE identity of the client certificate the TLS layer verified, from the peer chain
/// (leaf first) it hands over; `None` when the peer showed none.
pub(crate) fn peer_identity(
    certs: Option<std::sync::Arc<Vec<tonic::transport::CertificateDer<'static>>>>,
) -> Option<Result<Identity, String>> {
    certs?
        .first()
        .map(|leaf| identity_of_client_cert(leaf.as_ref()))
}

/// The SPIFFE identity of a client certificate the TLS layer has verified: its only URI SAN.
fn identity_of_client_cert(der: &[u8]) -> Result<Identity, String> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| e.to_string())?;
    let uris = mesh_common::identity::uri_sans(&cert);
    match uris.as_slice() {
        [uri] => Identity::parse(uri).map_err(|e| e.to_string()),
        _ => Err(format!(
            "expected exactly one SPIFFE URI SAN, found {uris:?}"
        )),
    }
}

/// The gRPC service.
pub struct CaService {
    ca: Arc<Ca>,
    auth: Arc<dyn Authenticator>,
}

impl CaService {
    /// The service signing with `ca` for the callers `auth` identifies.
    pub fn new<A: Authenticator + 'static>(
        ca: Arc<Ca>,
        auth: Arc<A>,
    ) -> IstioCertificateServiceServer<CaService> {
        Self::with_authenticator(ca, auth)
    }

    pub fn with_authenticator(
        ca: Arc<Ca>,
        auth: Arc<dyn Authenticator>,
    ) -> IstioCertificateServiceServer<CaService> {
        IstioCertificateServiceServer::new(CaService { ca, auth })
            .max_decoding_message_size(64 * 1024)
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let identity = match token {
            Some(token) => self
                .auth
                .identify(token)
                .await
                .map_err(|why| Status::unauthenticated(format!("token rejected: {why}")))?,
            // A mesh client certificate (verified against our root by the TLS layer) renews
            // the identity it already has.
            None => match peer_identity(request.peer_certs()) {
                Some(identity) => identity
                    .map_err(|why| Status::unauthenticated(format!("client certificate: {why}")))?,
                None => {
                    return Err(Status::unauthenticated(
                        "no bearer token or client certificate: the CA issues certificates only to authenticated callers",
                    ));
                }
            },
        };
        let req = request.into_inner();
        let chain = self
            .ca
            .sign(&req.csr, &identity, req.validity_duration)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        tracing::info!(%identity, "issued a workload certificate");
        Ok(Response::new(IstioCertificateResponse {
            cert_chain: chain,
        }))
    }
}
