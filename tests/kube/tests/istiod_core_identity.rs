#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! istiod-core's identity against a real API server, as istiod does it in a cluster: the CA
//! authenticates service-account tokens by TokenReview, keeps its root in the cluster's Secrets
//! (`cacerts` plugged in, else `istio-ca-secret`), and publishes the root as ConfigMap
//! `istio-ca-root-cert` in every namespace. One cluster for the whole test; each step says
//! what it proves.

use std::time::{Duration, Instant};

use cluster::Cluster;
use istiod_core::ca::Ca;
use istiod_core::kube::identity::{
    CA_SECRET, ROOT_CONFIGMAP, ROOT_CONFIGMAP_KEY, TokenReviewAuthenticator, ca_from_cluster,
    publish_root,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use mesh_common::identity::Identity;

const TD: &str = "cluster.local";
const TTL: Duration = Duration::from_secs(24 * 3600);
/// How long the publisher may take to react; it takes well under a second here (measured and
/// printed), the bound is for a loaded CI machine.
const REACT: Duration = Duration::from_secs(10);

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(str::to_string),
        ..ObjectMeta::default()
    }
}

fn create_namespace(c: &Cluster, name: &str) {
    let api: Api<Namespace> = Api::all(c.client.clone());
    let ns = Namespace {
        metadata: meta(name, None),
        ..Namespace::default()
    };
    c.block_on(api.create(&PostParams::default(), &ns))
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

fn create_service_account(c: &Cluster, namespace: &str, name: &str) {
    let api: Api<ServiceAccount> = Api::namespaced(c.client.clone(), namespace);
    let sa = ServiceAccount {
        metadata: meta(name, Some(namespace)),
        ..ServiceAccount::default()
    };
    c.block_on(api.create(&PostParams::default(), &sa))
        .unwrap_or_else(|e| panic!("create service account {namespace}/{name}: {e}"));
}

/// A token for `namespace/name` from the TokenRequest API, as the kubelet gets a pod's
/// projected token.
fn token(c: &Cluster, namespace: &str, name: &str, audience: &str) -> String {
    let api: Api<ServiceAccount> = Api::namespaced(c.client.clone(), namespace);
    let request = TokenRequest {
        metadata: ObjectMeta::default(),
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience.to_string()]),
            expiration_seconds: Some(600),
            bound_object_ref: None,
        }),
        status: None,
    };
    let got = c
        .block_on(api.create_token_request(name, &PostParams::default(), &request))
        .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{name}: {e}"));
    got.status
        .and_then(|s| s.token)
        .expect("a TokenRequest answer has a token")
}

/// Polls `check` (every 50 ms) until it gives `Some`, or panics naming `what` after `limit`.
/// Returns the value and how long it took.
fn wait_for<T>(
    c: &Cluster,
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> (T, Duration) {
    let start = Instant::now();
    c.block_on(async {
        loop {
            if let Some(v) = check().await {
                return (v, start.elapsed());
            }
            if start.elapsed() > limit {
                panic!("{what}: not within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// The root ConfigMap's `root-cert.pem` in `namespace`, when the ConfigMap exists.
async fn published(client: &kube::Client, namespace: &str) -> Option<ConfigMap> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    api.get_opt(ROOT_CONFIGMAP).await.ok().flatten()
}

fn root_of(cm: &ConfigMap) -> Option<&str> {
    cm.data
        .as_ref()
        .and_then(|d| d.get(ROOT_CONFIGMAP_KEY))
        .map(String::as_str)
}

fn is_published(cm: &ConfigMap, root: &str) -> bool {
    let labelled = cm
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("istio.io/config"))
        .is_some_and(|v| v == "true");
    root_of(cm) == Some(root) && labelled
}

/// Waits until `namespace` has the root published; returns how long it took.
fn wait_published(c: &Cluster, namespace: &str, root: &str) -> Duration {
    let client = c.client.clone();
    let what = format!("{ROOT_CONFIGMAP} with the root in namespace {namespace}");
    wait_for(c, &what, REACT, async || {
        published(&client, namespace)
            .await
            .filter(|cm| is_published(cm, root))
    })
    .1
}

/// A workload chain from `ca` for shop/web (leaf first, root last).
fn issue(ca: &Ca) -> Vec<String> {
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    ca.sign(&csr, &Identity::new(TD, "shop", "web").unwrap(), 0)
        .unwrap()
}

fn tokens_are_reviewed_by_the_api_server(c: &Cluster) {
    create_namespace(c, "shop");
    create_service_account(c, "shop", "web");
    create_service_account(c, "shop", "gone");
    let auth = TokenReviewAuthenticator::new(c.client.clone(), TD);

    // A projected-style token for istio-ca is the service account's SPIFFE identity.
    let good = token(c, "shop", "web", "istio-ca");
    let id = c.block_on(auth.authenticate(&good)).unwrap();
    assert_eq!(id.to_string(), "spiffe://cluster.local/ns/shop/sa/web");

    // The same service account's token for the API server itself is not one for the CA.
    let wrong_audience = token(
        c,
        "shop",
        "web",
        "https://kubernetes.default.svc.cluster.local",
    );
    let err = c.block_on(auth.authenticate(&wrong_audience)).unwrap_err();
    eprintln!("wrong audience refused: {err}");
    // Garbage, a forged signature, and the token of a deleted service account.
    for (what, bad) in [
        ("garbage", "not-a-token".to_string()),
        ("a token with a broken signature", {
            // A character well inside the signature (the last one may be padding bits only).
            let mut chars: Vec<char> = good.chars().collect();
            let at = chars.len() - 10;
            chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
            chars.into_iter().collect()
        }),
    ] {
        let err = c.block_on(auth.authenticate(&bad)).unwrap_err();
        eprintln!("{what} refused: {err}");
    }
    let orphan = token(c, "shop", "gone", "istio-ca");
    assert!(c.block_on(auth.authenticate(&orphan)).is_ok());
    let sas: Api<ServiceAccount> = Api::namespaced(c.client.clone(), "shop");
    c.block_on(sas.delete("gone", &DeleteParams::default()))
        .unwrap();
    let client = c.client.clone();
    let (err, _) = wait_for(
        c,
        "the token of a deleted service account refused",
        REACT,
        async || {
            TokenReviewAuthenticator::new(client.clone(), TD)
                .authenticate(&orphan)
                .await
                .err()
        },
    );
    eprintln!("deleted service account's token refused: {err}");
}

fn the_root_is_created_once_and_kept(c: &Cluster) -> String {
    create_namespace(c, "istio-system");
    let first = c
        .block_on(ca_from_cluster(&c.client, "istio-system", TD, TTL))
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), "istio-system");
    let stored = c.block_on(secrets.get(CA_SECRET)).unwrap();
    assert_eq!(stored.type_.as_deref(), Some("istio.io/ca-root"));
    let data = stored.data.unwrap();
    assert_eq!(
        data.get("ca-cert.pem").map(|b| b.0.as_slice()),
        Some(first.root_pem().as_bytes()),
        "istio-ca-secret holds the root in ca-cert.pem"
    );
    assert!(data.get("ca-key.pem").is_some_and(|k| !k.0.is_empty()));
    // A restart loads the same root, and what it signs chains to it.
    let again = c
        .block_on(ca_from_cluster(&c.client, "istio-system", TD, TTL))
        .unwrap();
    assert_eq!(again.root_pem(), first.root_pem());
    let chain = issue(&again);
    assert_eq!(chain.len(), 2);
    assert_eq!(chain[1], first.root_pem());

    // Two replicas starting together on an empty namespace end up with one root: one
    // creates the Secret, the other finds it taken and loads it.
    create_namespace(c, "istio-race");
    let (a, b) = c.block_on(async {
        tokio::join!(
            ca_from_cluster(&c.client, "istio-race", TD, TTL),
            ca_from_cluster(&c.client, "istio-race", TD, TTL)
        )
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.root_pem(), b.root_pem());
    assert_ne!(a.root_pem(), first.root_pem());
    first.root_pem().to_string()
}

fn a_plugged_in_root_wins(c: &Cluster) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    create_namespace(c, "istio-plugged");
    // The operator's root and the intermediate istiod signs with, as Istio's docs make them.
    let root_key = KeyPair::generate().unwrap();
    let mut root = CertificateParams::new(Vec::<String>::new()).unwrap();
    root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    root.distinguished_name
        .push(DnType::CommonName, "Operator Root CA");
    let root_pem = root.self_signed(&root_key).unwrap().pem();
    let root_issuer = Issuer::new(root, root_key);
    let key = KeyPair::generate().unwrap();
    let mut inter = CertificateParams::new(Vec::<String>::new()).unwrap();
    inter.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    inter
        .distinguished_name
        .push(DnType::CommonName, "Intermediate CA");
    let inter_pem = inter.signed_by(&key, &root_issuer).unwrap().pem();
    let items = [
        ("ca-cert.pem", inter_pem.clone()),
        ("ca-key.pem", key.serialize_pem()),
        ("root-cert.pem", root_pem.clone()),
        ("cert-chain.pem", format!("{inter_pem}{root_pem}")),
    ];
    let secret = Secret {
        metadata: meta("cacerts", Some("istio-plugged")),
        data: Some(
            items
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Secret::default()
    };
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), "istio-plugged");
    c.block_on(secrets.create(&PostParams::default(), &secret))
        .unwrap();
    let ca = c
        .block_on(ca_from_cluster(&c.client, "istio-plugged", TD, TTL))
        .unwrap();
    assert_eq!(
        ca.root_pem(),
        root_pem,
        "the CA's root is the plugged-in one"
    );
    assert_eq!(issue(&ca)[1..], [inter_pem, root_pem]);
    assert!(
        c.block_on(secrets.get_opt(CA_SECRET)).unwrap().is_none(),
        "with cacerts present no self-signed root is made"
    );
}

fn the_root_is_published_in_every_namespace(c: &Cluster, root: &str) {
    let publisher = c
        .handle()
        .spawn(publish_root(c.client.clone(), root.to_string()));
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    let existing: Vec<String> = c
        .block_on(namespaces.list(&Default::default()))
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for ns in ["default", "kube-system", "istio-system", "shop"] {
        assert!(existing.iter().any(|n| n == ns), "{ns} in {existing:?}");
    }
    let mut slowest = Duration::ZERO;
    let wanted: Vec<&String> = existing
        .iter()
        .filter(|n| !["kube-public", "kube-node-lease"].contains(&n.as_str()))
        .collect();
    for ns in &wanted {
        slowest = slowest.max(wait_published(c, ns, root));
    }
    eprintln!(
        "root published in {} namespaces {wanted:?} within {slowest:?}",
        wanted.len()
    );

    // A namespace created afterwards.
    create_namespace(c, "late");
    let took = wait_published(c, "late", root);
    eprintln!("new namespace: root published after {took:?}");
    // Istio's skipped namespaces stay untouched (checked after "late" was written: the
    // publisher has seen them long before).
    for ns in ["kube-public", "kube-node-lease"] {
        assert!(
            c.block_on(published(&c.client, ns)).is_none(),
            "{ns} is skipped as Istio skips it"
        );
    }

    // Deleted: restored (a new object, not the one deleted).
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "shop");
    let uid = |cm: Option<ConfigMap>| cm.and_then(|cm| cm.metadata.uid);
    let before = uid(c.block_on(published(&c.client, "shop")));
    assert!(before.is_some());
    c.block_on(cms.delete(ROOT_CONFIGMAP, &DeleteParams::default()))
        .unwrap();
    let took = wait_published(c, "shop", root);
    eprintln!("deleted ConfigMap: restored after {took:?}");
    assert_ne!(uid(c.block_on(published(&c.client, "shop"))), before);

    // Its root edited by someone else (a merge patch, as `kubectl edit` would): restored, and
    // a key they added stays.
    let edit = serde_json::json!({
        "data": { ROOT_CONFIGMAP_KEY: "not the root", "note": "mine" },
    });
    c.block_on(cms.patch(
        ROOT_CONFIGMAP,
        &PatchParams::default(),
        &Patch::Merge(&edit),
    ))
    .unwrap();
    let took = wait_published(c, "shop", root);
    eprintln!("edited ConfigMap: restored after {took:?}");
    let cm = c.block_on(published(&c.client, "shop")).unwrap();
    assert_eq!(
        cm.data
            .as_ref()
            .and_then(|d| d.get("note"))
            .map(String::as_str),
        Some("mine")
    );
    // The label taken off: put back.
    let unlabel = serde_json::json!({ "metadata": { "labels": { "istio.io/config": null } } });
    c.block_on(cms.patch(
        ROOT_CONFIGMAP,
        &PatchParams::default(),
        &Patch::Merge(&unlabel),
    ))
    .unwrap();
    wait_published(c, "shop", root);

    // A namespace being deleted is not fought over: the publisher does not write into it, and
    // the namespace goes away.
    create_namespace(c, "doomed");
    wait_published(c, "doomed", root);
    c.block_on(namespaces.delete("doomed", &DeleteParams::default()))
        .unwrap();
    let (_, took) = wait_for(
        c,
        "namespace doomed deleted",
        Duration::from_secs(60),
        async || {
            namespaces
                .get_opt("doomed")
                .await
                .ok()
                .and_then(|n| n.is_none().then_some(()))
        },
    );
    eprintln!("terminating namespace: gone after {took:?}");
    assert!(
        !publisher.is_finished(),
        "the publisher runs for good (serve treats its end as fatal)"
    );
    publisher.abort();
}

/// `serve`'s flags as the command line gives them.
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    serve: istiod_core::config::ServeArgs,
}

/// `istiod-core serve --kubeconfig` in process: its CA loads the root stored in
/// `istio-system` (a restart), issues to a TokenReview-authenticated sidecar token over TLS,
/// refuses a token for another audience, and its publisher covers a namespace made after it
/// started.
fn serve_in_the_cluster(c: &Cluster, root: &str) {
    use clap::Parser;
    use istio_proto::ca::IstioCertificateRequest;
    use istio_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
    let config_dir = c.dir.join("istiod-core-config");
    std::fs::create_dir_all(&config_dir).unwrap();
    let args = Cli::parse_from([
        "serve",
        "--kubeconfig",
        c.kubeconfig.to_str().unwrap(),
        "--config-dir",
        config_dir.to_str().unwrap(),
        "--grpc-addr",
        "127.0.0.1:0",
    ])
    .serve;
    let cfg = istiod_core::config::ServeConfig::new(args, &|name| {
        (name == istiod_core::config::env::POD_NAMESPACE).then(|| "istio-system".to_string())
    })
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let bound = c
        .block_on(istiod_core::serve::serve(cfg, async {
            let _ = stopped.await;
        }))
        .unwrap();
    let grpc = bound.grpc;
    let serving = c.handle().spawn(bound.wait());

    let create = |token: String| {
        let tls = tonic::transport::ClientTlsConfig::new()
            .domain_name("istiod.istio-system.svc")
            .ca_certificate(tonic::transport::Certificate::from_pem(root));
        let key = rcgen::KeyPair::generate().unwrap();
        let csr = rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap();
        async move {
            let channel = tonic::transport::Endpoint::from_shared(format!("https://{grpc}"))
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut request = tonic::Request::new(IstioCertificateRequest {
                csr,
                validity_duration: 3600,
                metadata: None,
            });
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            IstioCertificateServiceClient::new(channel)
                .create_certificate(request)
                .await
        }
    };
    // The serving certificate verified against the stored root: serve loaded it, not a new one.
    let chain = c
        .block_on(create(token(c, "shop", "web", "istio-ca")))
        .unwrap()
        .into_inner()
        .cert_chain;
    assert_eq!(chain.last().map(String::as_str), Some(root));
    let (_, leaf) = x509_parser::pem::parse_x509_pem(chain[0].as_bytes()).unwrap();
    assert_eq!(
        mesh_common::identity::uri_sans(&leaf.parse_x509().unwrap()),
        ["spiffe://cluster.local/ns/shop/sa/web"]
    );
    let err = c
        .block_on(create(token(
            c,
            "shop",
            "web",
            "https://kubernetes.default.svc.cluster.local",
        )))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");

    create_namespace(c, "after-serve");
    let took = wait_published(c, "after-serve", root);
    eprintln!("serve's publisher: root in a new namespace after {took:?}");

    let _ = stop.send(());
    let served = c
        .block_on(async { tokio::time::timeout(Duration::from_secs(30), serving).await })
        .expect("serve stops when asked")
        .unwrap();
    assert!(served.is_ok(), "{served:?}");
}

#[test]
fn istiod_core_identity_in_a_cluster() {
    if !harness::require_root("istiod_core_identity_in_a_cluster") {
        return;
    }
    let c = Cluster::start().expect("start the cluster");
    tokens_are_reviewed_by_the_api_server(&c);
    let root = the_root_is_created_once_and_kept(&c);
    a_plugged_in_root_wins(&c);
    the_root_is_published_in_every_namespace(&c, &root);
    serve_in_the_cluster(&c, &root);
}
