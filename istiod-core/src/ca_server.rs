//! `istio.v1.auth.IstioCertificateService/CreateCertificate`: who is asking comes only from a
//! verified credential, here a Kubernetes-style service-account JWT (`sub`
//! `system:serviceaccount:<namespace>:<name>`, audience `istio-ca`, issuer and signature checked
//! against a configured public key). Headers, metadata and the source address never name the
//! caller (CVE-2022-39388), and a missing or broken key fails closed: no certificate is issued.

use std::sync::Arc;

use istio_proto::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use istio_proto::ca::{IstioCertificateRequest, IstioCertificateResponse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use tonic::{Request, Response, Status};

use crate::ca::{Ca, Identity};

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

/// The gRPC service.
pub struct CaService {
    ca: Arc<Ca>,
    auth: Arc<JwtAuthenticator>,
}

impl CaService {
    pub fn new(
        ca: Arc<Ca>,
        auth: Arc<JwtAuthenticator>,
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
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                Status::unauthenticated(
                    "no bearer token: the CA issues certificates only to authenticated callers",
                )
            })?;
        let identity = self
            .auth
            .authenticate(token)
            .map_err(|why| Status::unauthenticated(format!("token rejected: {why}")))?;
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
