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
            "NUL byte in the account",
            Some(token(
                &signer,
                "system:serviceaccount:shop:we\u{0}b",
                AUDIENCE,
                now() + 600,
            )),
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

    // Identity headers from a loopback caller without a credential prove nothing.
    for (k, v) in [
        (
            "x-forwarded-client-cert",
            "URI=spiffe://cluster.local/ns/shop/sa/web",
        ),
        ("x-forwarded-for", "127.0.0.1"),
        ("clusterid", "Kubernetes"),
    ] {
        let err = client
            .create_certificate(call(None, csr(), Some((k, v))))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{k}: {}", err.message());
    }

    // Authenticated, but a bad request: refused with the reason.
    let err = client
        .create_certificate(call(Some(good.clone()), "x".repeat(20_000), None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("larger than"), "{}", err.message());
    let mut long = call(Some(good.clone()), csr(), None);
    long.get_mut().validity_duration = 400 * 24 * 3600;
    let err = client.create_certificate(long).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("lifetime"), "{}", err.message());
    // A CSR asking to be a CA still gets a leaf.
    let ca_csr = {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.serialize_request(&key).unwrap().pem().unwrap()
    };
    let resp = client
        .create_certificate(call(Some(good.clone()), ca_csr, None))
        .await
        .unwrap()
        .into_inner();
    let (_, pem) = x509_parser::pem::parse_x509_pem(resp.cert_chain[0].as_bytes()).unwrap();
    assert!(!pem.parse_x509().unwrap().is_ca());
}

#[test]
fn jwks_keys_verify_tokens_and_a_broken_set_fails_closed() {
    let signer = KeyPair::generate().unwrap();
    // The signer's public key as a JWK: P-256 x and y from the uncompressed point.
    let point = signer.public_key_raw();
    assert_eq!(point[0], 4);
    let b64 = |b: &[u8]| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    };
    let jwks = serde_json::json!({ "keys": [{
        "kty": "EC", "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..65]),
        "kid": "k1", "alg": "ES256", "use": "sig"
    }]});
    let auth = JwtAuthenticator::from_jwks(
        jwks.to_string().as_bytes(),
        "jwks.json",
        ISSUER,
        "cluster.local",
    )
    .unwrap();
    let id = auth
        .authenticate(&token(
            &signer,
            "system:serviceaccount:shop:web",
            AUDIENCE,
            now() + 600,
        ))
        .unwrap();
    assert_eq!(id.to_string(), "spiffe://cluster.local/ns/shop/sa/web");
    let other = KeyPair::generate().unwrap();
    assert!(
        auth.authenticate(&token(
            &other,
            "system:serviceaccount:shop:web",
            AUDIENCE,
            now() + 600
        ))
        .is_err()
    );
    for broken in [
        "",
        "{}",
        "{\"keys\": []}",
        "{\"keys\": [{\"kty\": \"oct\", \"k\": \"AAAA\"}]}",
    ] {
        let e =
            JwtAuthenticator::from_jwks(broken.as_bytes(), "jwks.json", ISSUER, "cluster.local");
        assert!(e.is_err(), "{broken:?} was accepted");
    }
}

#[tokio::test]
async fn a_mesh_client_certificate_renews_its_own_identity() {
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
    let (server_chain, server_key) = ca
        .serving_cert(&["istiod.istio-system.svc"], DEFAULT_TTL)
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(
            server_chain,
            server_key,
        ))
        .client_ca_root(tonic::transport::Certificate::from_pem(ca.root_pem()))
        .client_auth_optional(true);
    tokio::spawn(
        tonic::transport::Server::builder()
            .tls_config(tls)
            .unwrap()
            .add_service(CaService::new(ca.clone(), Arc::new(auth)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    // A workload certificate from this CA, used as the TLS client identity.
    let key = KeyPair::generate().unwrap();
    let csr = CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    let me = mesh_common::identity::Identity::new("cluster.local", "shop", "web").unwrap();
    let chain = ca.sign(&csr, &me, 3600).unwrap();
    let connect = |identity: Option<tonic::transport::Identity>| {
        let mut tls = tonic::transport::ClientTlsConfig::new()
            .domain_name("istiod.istio-system.svc")
            .ca_certificate(tonic::transport::Certificate::from_pem(ca.root_pem()));
        if let Some(id) = identity {
            tls = tls.identity(id);
        }
        tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
    };
    let request = || IstioCertificateRequest {
        csr: self::csr(),
        validity_duration: 3600,
        metadata: None,
    };
    let channel = connect(Some(tonic::transport::Identity::from_pem(
        chain[0].clone(),
        key.serialize_pem(),
    )))
    .connect()
    .await
    .unwrap();
    let resp = IstioCertificateServiceClient::new(channel)
        .create_certificate(request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        leaf_uri(&resp.cert_chain[0]),
        "URI(spiffe://cluster.local/ns/shop/sa/web)"
    );
    // Without a client certificate or token: refused.
    let channel = connect(None).connect().await.unwrap();
    let err = IstioCertificateServiceClient::new(channel)
        .create_certificate(request())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
}
