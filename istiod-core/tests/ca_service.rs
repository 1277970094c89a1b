#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! The CA service over real gRPC: certificates only for verified service-account tokens, with
//! the token's identity and nothing the request claims.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use istio_proto::ca::IstioCertificateRequest;
use istio_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use istiod_core::ca::{Ca, DEFAULT_TTL};
use istiod_core::ca_server::{AUDIENCE, CaService, JwtAuthenticator};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::{CertificateParams, KeyPair};
use tonic::Code;

const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn token(key: &KeyPair, sub: &str, aud: &str, exp: u64) -> String {
    let claims = serde_json::json!({ "sub": sub, "aud": aud, "iss": ISSUER, "exp": exp });
    jsonwebtoken::encode(
        &Header::new(Algorithm::ES256),
        &claims,
        &EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).unwrap(),
    )
    .unwrap()
}

fn csr() -> String {
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec![
        "spiffe://cluster.local/ns/kube-system/sa/admin".to_string(),
    ])
    .unwrap();
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn leaf_uri(pem_text: &str) -> String {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem_text.as_bytes()).unwrap();
    let cert = pem.parse_x509().unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    san.general_names
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[tokio::test]
async fn issues_only_to_verified_service_accounts() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Arc::new(Ca::load_or_create(dir.path(), "cluster.local", DEFAULT_TTL).unwrap());
    let signer = KeyPair::generate().unwrap();
    let auth = JwtAuthenticator::from_pem(
        signer.public_key_pem().as_bytes(),
        "test",
        ISSUER,
        "cluster.local",
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CaService::new(ca.clone(), Arc::new(auth)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut client = IstioCertificateServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let call = |token: Option<String>, csr: String, extra: Option<(&'static str, &'static str)>| {
        let mut req = tonic::Request::new(IstioCertificateRequest {
            csr,
            validity_duration: 3600,
            metadata: None,
        });
        if let Some(t) = token {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        if let Some((k, v)) = extra {
            req.metadata_mut().insert(k, v.parse().unwrap());
        }
        req
    };
    let good = token(
        &signer,
        "system:serviceaccount:shop:web",
        AUDIENCE,
        now() + 600,
    );

    // A valid token: the certificate names the token's account, not the CSR's nor a header's.
    let resp = client
        .create_certificate(call(
            Some(good.clone()),
            csr(),
            Some((
                "x-forwarded-client-identity",
                "spiffe://cluster.local/ns/kube-system/sa/admin",
            )),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.cert_chain.len(), 2);
    assert_eq!(
        leaf_uri(&resp.cert_chain[0]),
        "URI(spiffe://cluster.local/ns/shop/sa/web)"
    );
    assert_eq!(resp.cert_chain[1], ca.root_pem());

    let other = KeyPair::generate().unwrap();
    let unsigned = {
        // {"alg":"none"} header with the same claims and no signature.
        let parts: Vec<&str> = good.split('.').collect();
        format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{}.", parts[1])
    };
    let rejected = [
        ("no token", None),
        (
            "wrong audience",
            Some(token(
                &signer,
                "system:serviceaccount:shop:web",
                "other",
                now() + 600,
            )),
        ),
        (
            "expired",
            Some(token(
                &signer,
                "system:serviceaccount:shop:web",
                AUDIENCE,
                now() - 3600,
            )),
        ),
        (
            "foreign key",
            Some(token(
                &other,
                "system:serviceaccount:shop:web",
                AUDIENCE,
                now() + 600,
            )),
        ),
        ("unsigned", Some(unsigned)),
        (
            "not a service account",
            Some(token(&signer, "alice", AUDIENCE, now() + 600)),
        ),
        (
            "bad namespace",
            Some(token(
                &signer,
                "system:serviceaccount:Shop/x:web",
                AUDIENCE,
                now() + 600,
            )),
        ),
    ];
    for (case, t) in rejected {
        let err = client
            .create_certificate(call(t, csr(), None))
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Code::Unauthenticated,
            "{case}: {}",
            err.message()
        );
    }

    // Authenticated, but a bad request: refused with the reason.
    let err = client
        .create_certificate(call(Some(good.clone()), "x".repeat(20_000), None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("larger than"), "{}", err.message());
}
