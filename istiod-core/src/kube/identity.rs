//! Identity in a cluster, as istiod keeps it:
//! - the CA authenticates a sidecar's projected service-account token by a TokenReview against
//!   the API server (audience `istio-ca`), and binds the certificate to that service account
//!   (Istio's `pkg/kube/tokenreview` and `security/pkg/server/ca/authenticate/kubeauth`);
//! - the CA's root comes from the plugged-in Secret `cacerts`, else istiod's own
//!   `istio-ca-secret`, else a new self-signed root stored there (`pilot/pkg/bootstrap/istio_ca.go`,
//!   `security/pkg/pki/ca`), so replicas and restarts share one root;
//! - the root is published as the ConfigMap `istio-ca-root-cert` (`root-cert.pem`) in every
//!   namespace, where sidecars mount it (`pilot/pkg/serviceregistry/kube/controller/namespacecontroller.go`).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

use crate::ca::{Ca, CaError};
use crate::ca_server::{AUDIENCE, Authenticator};
use mesh_common::identity::Identity;

/// The ConfigMap holding the mesh root in every namespace.
pub const ROOT_CONFIGMAP: &str = "istio-ca-root-cert";
/// Its data key (the file sidecars read: `var/run/secrets/istio/root-cert.pem`).
pub const ROOT_CONFIGMAP_KEY: &str = "root-cert.pem";
/// The label Istio puts on the ConfigMaps it writes.
pub const ROOT_CONFIGMAP_LABEL: (&str, &str) = ("istio.io/config", "true");
/// Namespaces Istio's namespace controller leaves alone (the injector's ignored namespaces but
/// `kube-system`, which gets the root so ztunnel can run there).
pub const IGNORED_NAMESPACES: [&str; 3] = ["kube-public", "kube-node-lease", "local-path-storage"];
/// The plugged-in CA (operator-provided signing certificate, key, root and chain).
pub const PLUGGED_SECRET: &str = "cacerts";
/// istiod's self-signed root, kept so that restarts and replicas share it.
pub const CA_SECRET: &str = "istio-ca-secret";
/// The type Istio gives `istio-ca-secret`.
pub const CA_SECRET_TYPE: &str = "istio.io/ca-root";
/// Who istiod-core's server-side applies are recorded as.
pub const FIELD_MANAGER: &str = "istiod-core";
/// Largest bearer token sent to the API server: projected tokens are about 1 KiB.
pub const MAX_TOKEN_BYTES: usize = 64 * 1024;

/// Authenticates service-account tokens by asking the API server (TokenReview), for the
/// audience `istio-ca`.
pub struct TokenReviewAuthenticator {
    reviews: Api<TokenReview>,
    trust_domain: String,
}

impl TokenReviewAuthenticator {
    pub fn new(client: kube::Client, trust_domain: &str) -> TokenReviewAuthenticator {
        TokenReviewAuthenticator {
            reviews: Api::all(client),
            trust_domain: trust_domain.to_string(),
        }
    }

    /// The identity the API server says `token` belongs to. A token the server does not
    /// vouch for, or a server that cannot be asked, is a refusal.
    pub async fn authenticate(&self, token: &str) -> Result<Identity, String> {
        if token.is_empty() {
            return Err("empty token".into());
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(format!(
                "token of {} bytes is larger than the {MAX_TOKEN_BYTES}-byte limit",
                token.len()
            ));
        }
        let review = TokenReview {
            metadata: ObjectMeta::default(),
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: Some(vec![AUDIENCE.to_string()]),
            },
            status: None,
        };
        let reviewed = self
            .reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("TokenReview failed, so the token is not trusted: {e}"))?;
        reviewed_identity(reviewed.status.as_ref(), &self.trust_domain)
    }
}

impl Authenticator for TokenReviewAuthenticator {
    fn identify<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Identity, String>> {
        Box::pin(self.authenticate(token))
    }
}

/// What a TokenReview's status proves: a service account's identity, only when the server
/// authenticated the token for `istio-ca` and the user is a service account.
fn reviewed_identity(
    status: Option<&TokenReviewStatus>,
    trust_domain: &str,
) -> Result<Identity, String> {
    let status = status.ok_or("the TokenReview came back without a status")?;
    if let Some(error) = status.error.as_deref().filter(|e| !e.is_empty()) {
        return Err(format!("the API server refused the token: {error}"));
    }
    if status.authenticated != Some(true) {
        return Err("the API server did not authenticate the token".into());
    }
    // The server echoes the audiences the token is good for among those asked; none means it
    // was checked for the server's own audience instead, which is not ours.
    let audiences = status.audiences.as_deref().unwrap_or_default();
    if !audiences.iter().any(|a| a == AUDIENCE) {
        return Err(format!(
            "the token is not for audience {AUDIENCE:?} (reviewed for {audiences:?})"
        ));
    }
    let user = status
        .user
        .as_ref()
        .ok_or("the TokenReview names no user")?;
    let username = user.username.as_deref().unwrap_or_default();
    let groups = user.groups.as_deref().unwrap_or_default();
    if !groups.iter().any(|g| g == "system:serviceaccounts") {
        return Err(format!("user {username:?} is not a service account"));
    }
    service_account_identity(username, trust_domain)
}

/// `system:serviceaccount:NS:SA` → `spiffe://TD/ns/NS/sa/SA`.
fn service_account_identity(username: &str, trust_domain: &str) -> Result<Identity, String> {
    let parts: Vec<&str> = username.split(':').collect();
    match parts[..] {
        ["system", "serviceaccount", ns, sa] => {
            Identity::new(trust_domain, ns, sa).map_err(|e| e.to_string())
        }
        _ => Err(format!(
            "user {username:?} is not system:serviceaccount:<namespace>:<name>"
        )),
    }
}

/// Why the CA could not be had from the cluster, naming the Secret.
#[derive(Debug, thiserror::Error)]
pub enum ClusterCaError {
    #[error("Secret {namespace}/{name}: {reason}")]
    Secret {
        namespace: String,
        name: &'static str,
        reason: String,
    },
    #[error(transparent)]
    Ca(#[from] CaError),
}

/// The CA as istiod finds it in `namespace`: the plugged-in `cacerts` Secret, else istiod's own
/// `istio-ca-secret`, else a new self-signed root created there. Created, never overwritten: if
/// another replica creates it first, theirs is loaded, so every replica signs under one root.
pub async fn ca_from_cluster(
    client: &kube::Client,
    namespace: &str,
    trust_domain: &str,
    max_ttl: Duration,
) -> Result<Ca, ClusterCaError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let fail = |name: &'static str, reason: String| ClusterCaError::Secret {
        namespace: namespace.to_string(),
        name,
        reason,
    };
    let get = |name: &'static str| {
        let secrets = secrets.clone();
        async move {
            secrets
                .get_opt(name)
                .await
                .map_err(|e| fail(name, format!("cannot read it: {e}")))
        }
    };
    if let Some(plugged) = get(PLUGGED_SECRET).await? {
        let ca = plugged_ca(&plugged, max_ttl).map_err(|r| fail(PLUGGED_SECRET, r))?;
        tracing::info!(%namespace, secret = PLUGGED_SECRET, "using the plugged-in CA");
        return Ok(ca);
    }
    if let Some(own) = get(CA_SECRET).await? {
        let ca = own_ca(&own, max_ttl).map_err(|r| fail(CA_SECRET, r))?;
        tracing::info!(%namespace, secret = CA_SECRET, "using the CA's stored root");
        return Ok(ca);
    }
    let (ca, key_pem) = Ca::self_signed(trust_domain, max_ttl)?;
    match secrets
        .create(
            &PostParams::default(),
            &ca_secret(namespace, ca.root_pem(), &key_pem),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(%namespace, secret = CA_SECRET, "created a self-signed root");
            Ok(ca)
        }
        Err(kube::Error::Api(status)) if status.is_already_exists() || status.is_conflict() => {
            let own = get(CA_SECRET).await?.ok_or_else(|| {
                fail(
                    CA_SECRET,
                    "another replica created it, but it is gone again".into(),
                )
            })?;
            tracing::info!(%namespace, secret = CA_SECRET, "another replica created the root first; using it");
            own_ca(&own, max_ttl).map_err(|r| fail(CA_SECRET, r))
        }
        Err(e) => Err(fail(CA_SECRET, format!("cannot create it: {e}"))),
    }
}

/// `istio-ca-secret` as Istio writes it: the self-signed root in `ca-cert.pem`, its key in
/// `ca-key.pem`, and the workload keys (`cert-chain.pem`, `key.pem`, `root-cert.pem`) empty.
fn ca_secret(namespace: &str, root_pem: &str, key_pem: &str) -> Secret {
    let data = [
        ("ca-cert.pem", root_pem),
        ("ca-key.pem", key_pem),
        ("cert-chain.pem", ""),
        ("key.pem", ""),
        ("root-cert.pem", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.to_string()),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        type_: Some(CA_SECRET_TYPE.to_string()),
        data: Some(data),
        ..Secret::default()
    }
}

/// A data item of `secret` as text; `None` when absent or empty.
fn item(secret: &Secret, key: &str) -> Result<Option<String>, String> {
    let Some(value) = secret.data.as_ref().and_then(|d| d.get(key)) else {
        return Ok(None);
    };
    let text = String::from_utf8(value.0.clone()).map_err(|_| format!("{key} is not text"))?;
    Ok(Some(text).filter(|t| !t.trim().is_empty()))
}

fn required(secret: &Secret, key: &str) -> Result<String, String> {
    item(secret, key)?.ok_or_else(|| format!("no {key} in it"))
}

/// `cacerts`: Istio's plug-in keys (`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`, optional
/// `cert-chain.pem`), or a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`, `ca.crt`) as
/// cert-manager writes it, which istiod also accepts.
fn plugged_ca(secret: &Secret, max_ttl: Duration) -> Result<Ca, String> {
    if item(secret, "tls.crt")?.is_some() {
        let cert = required(secret, "tls.crt")?;
        return Ca::from_plugged(
            &cert,
            &required(secret, "tls.key")?,
            &required(secret, "ca.crt")?,
            None,
            max_ttl,
        )
        .map_err(|e| format!("{e} (tls.crt, tls.key, ca.crt)"));
    }
    let chain = item(secret, "cert-chain.pem")?;
    Ca::from_plugged(
        &required(secret, "ca-cert.pem")?,
        &required(secret, "ca-key.pem")?,
        &required(secret, "root-cert.pem")?,
        chain.as_deref(),
        max_ttl,
    )
}

/// `istio-ca-secret`: the root is the signing certificate itself.
fn own_ca(secret: &Secret, max_ttl: Duration) -> Result<Ca, String> {
    let cert = required(secret, "ca-cert.pem")?;
    Ca::from_plugged(
        &cert,
        &required(secret, "ca-key.pem")?,
        &cert,
        None,
        max_ttl,
    )
}

/// Keeps `istio-ca-root-cert` with `root_pem` in every namespace but Istio's ignored ones and
/// those being deleted: created when a namespace appears, restored when the ConfigMap is
/// deleted or its root edited (a server-side apply as `istiod-core`, so other keys and labels
/// someone added stay). Runs for good: watches resume on their own, and a write that fails is
/// retried with backoff and logged.
pub async fn publish_root(client: kube::Client, root_pem: String) {
    let mut events = root_events(&client);
    let mut index = RootIndex::new(root_pem.clone());
    let mut retries: BTreeMap<String, Retry> = BTreeMap::new();
    loop {
        let due = retries.values().map(|r| r.at).min();
        let wanted = tokio::select! {
            event = events.next() => match event {
                Some(Ok(RootEvent::Namespace(e))) => index.namespace(e),
                Some(Ok(RootEvent::ConfigMap(e))) => index.configmap(e),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watching namespaces and {ROOT_CONFIGMAP} ConfigMaps failed; retrying");
                    Vec::new()
                }
                None => {
                    // The watches resume by themselves; should they end, start them again.
                    tracing::warn!("the namespace and ConfigMap watches ended; starting them again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    events = root_events(&client);
                    Vec::new()
                }
            },
            () = sleep_until(due), if due.is_some() => {
                let now = tokio::time::Instant::now();
                retries.iter().filter(|(_, r)| r.at <= now).map(|(ns, _)| ns.clone()).collect()
            }
        };
        for ns in wanted {
            if !index.wants(&ns) {
                retries.remove(&ns);
                continue;
            }
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            match write_root(&api, &ns, &root_pem).await {
                Ok(()) => {
                    retries.remove(&ns);
                }
                Err(e) if gone(&e) => {
                    tracing::debug!(namespace = %ns, "namespace gone or terminating; not publishing the root");
                    retries.remove(&ns);
                }
                Err(e) => {
                    let retry = retries.entry(ns.clone()).or_insert(Retry {
                        at: tokio::time::Instant::now(),
                        backoff: Duration::from_millis(100),
                    });
                    tracing::warn!(namespace = %ns, error = %e, retry_in = ?retry.backoff, "cannot write {ROOT_CONFIGMAP}");
                    retry.at = tokio::time::Instant::now() + retry.backoff;
                    retry.backoff = (retry.backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}

struct Retry {
    at: tokio::time::Instant,
    backoff: Duration,
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

enum RootEvent {
    Namespace(watcher::Event<Namespace>),
    ConfigMap(watcher::Event<ConfigMap>),
}

fn root_events(client: &kube::Client) -> BoxStream<'static, Result<RootEvent, watcher::Error>> {
    let namespaces = watcher(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .map(|e| e.map(RootEvent::Namespace));
    let configmaps = watcher(
        Api::<ConfigMap>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={ROOT_CONFIGMAP}")),
    )
    .default_backoff()
    .map(|e| e.map(RootEvent::ConfigMap));
    futures::stream::select(namespaces, configmaps).boxed()
}

/// The root ConfigMap of `namespace`, applied as `FIELD_MANAGER` (taking back the fields it
/// owns if someone else changed them).
async fn write_root(api: &Api<ConfigMap>, namespace: &str, root_pem: &str) -> kube::Result<()> {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(ROOT_CONFIGMAP.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(
                [(
                    ROOT_CONFIGMAP_LABEL.0.to_string(),
                    ROOT_CONFIGMAP_LABEL.1.to_string(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        data: Some([(ROOT_CONFIGMAP_KEY.to_string(), root_pem.to_string())].into()),
        ..ConfigMap::default()
    };
    api.patch(
        ROOT_CONFIGMAP,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await?;
    tracing::info!(%namespace, "published the root in {ROOT_CONFIGMAP}");
    Ok(())
}

/// A write refused because the namespace no longer exists or is being deleted: nothing to do.
fn gone(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => {
            status.is_not_found()
                || status
                    .details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
        }
        _ => false,
    }
}

/// What the publisher knows of the cluster, fed by the two watches: which namespaces should
/// have the root, and which of them have it already. Each event answers with the namespaces
/// to write.
struct RootIndex {
    root_pem: String,
    /// Namespaces that exist and are not being deleted (ignored ones never enter).
    active: HashSet<String>,
    /// Namespaces whose ConfigMap was last seen with the root and the label.
    published: HashSet<String>,
    /// During a relist, what was listed so far.
    relisting_namespaces: Option<HashSet<String>>,
    relisting_configmaps: Option<HashSet<String>>,
}

impl RootIndex {
    fn new(root_pem: String) -> RootIndex {
        RootIndex {
            root_pem,
            active: HashSet::new(),
            published: HashSet::new(),
            relisting_namespaces: None,
            relisting_configmaps: None,
        }
    }

    /// Whether `namespace` should have the root (checked again before a write or a retry).
    fn wants(&self, namespace: &str) -> bool {
        self.active.contains(namespace)
    }

    fn namespace(&mut self, event: watcher::Event<Namespace>) -> Vec<String> {
        match event {
            watcher::Event::Init => {
                self.relisting_namespaces = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(ns) => {
                if let (Some(seen), Some(name)) =
                    (&mut self.relisting_namespaces, &ns.metadata.name)
                {
                    seen.insert(name.clone());
                }
                self.namespace_seen(&ns)
            }
            watcher::Event::InitDone => {
                // Namespaces deleted while the watch was down are not listed again.
                if let Some(seen) = self.relisting_namespaces.take() {
                    self.active.retain(|ns| seen.contains(ns));
                    self.published.retain(|ns| seen.contains(ns));
                }
                Vec::new()
            }
            watcher::Event::Apply(ns) => self.namespace_seen(&ns),
            watcher::Event::Delete(ns) => {
                if let Some(name) = &ns.metadata.name {
                    self.active.remove(name);
                    self.published.remove(name);
                }
                Vec::new()
            }
        }
    }

    fn namespace_seen(&mut self, ns: &Namespace) -> Vec<String> {
        let Some(name) = ns.metadata.name.clone() else {
            return Vec::new();
        };
        if IGNORED_NAMESPACES.contains(&name.as_str()) {
            return Vec::new();
        }
        let terminating = ns.metadata.deletion_timestamp.is_some()
            || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
        if terminating {
            self.active.remove(&name);
            return Vec::new();
        }
        self.active.insert(name.clone());
        if self.published.contains(&name) {
            Vec::new()
        } else {
            vec![name]
        }
    }

    fn configmap(&mut self, event: watcher::Event<ConfigMap>) -> Vec<String> {
        match event {
            watcher::Event::Init => {
                self.relisting_configmaps = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(cm) => {
                if let (Some(seen), Some(ns)) =
                    (&mut self.relisting_configmaps, &cm.metadata.namespace)
                {
                    seen.insert(ns.clone());
                }
                self.configmap_seen(&cm)
            }
            watcher::Event::InitDone => {
                // A ConfigMap deleted while the watch was down is not listed again: write it.
                let Some(seen) = self.relisting_configmaps.take() else {
                    return Vec::new();
                };
                let lost: Vec<String> = self
                    .published
                    .iter()
                    .filter(|ns| !seen.contains(*ns))
                    .cloned()
                    .collect();
                for ns in &lost {
                    self.published.remove(ns);
                }
                lost.into_iter().filter(|ns| self.wants(ns)).collect()
            }
            watcher::Event::Apply(cm) => self.configmap_seen(&cm),
            watcher::Event::Delete(cm) => match cm.metadata.namespace {
                Some(ns) => {
                    self.published.remove(&ns);
                    if self.wants(&ns) {
                        vec![ns]
                    } else {
                        Vec::new()
                    }
                }
                None => Vec::new(),
            },
        }
    }

    fn configmap_seen(&mut self, cm: &ConfigMap) -> Vec<String> {
        let Some(ns) = cm.metadata.namespace.clone() else {
            return Vec::new();
        };
        let has_root =
            cm.data.as_ref().and_then(|d| d.get(ROOT_CONFIGMAP_KEY)) == Some(&self.root_pem);
        let labelled = cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ROOT_CONFIGMAP_LABEL.0))
            .is_some_and(|v| v == ROOT_CONFIGMAP_LABEL.1);
        if has_root && labelled {
            self.published.insert(ns);
            return Vec::new();
        }
        self.published.remove(&ns);
        if self.wants(&ns) {
            vec![ns]
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;
    use k8s_openapi::api::core::v1::NamespaceStatus;

    const TD: &str = "cluster.local";

    fn status(username: &str, groups: &[&str], audiences: &[&str]) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(audiences.iter().map(|s| s.to_string()).collect()),
            error: None,
            user: Some(UserInfo {
                username: Some(username.to_string()),
                groups: Some(groups.iter().map(|s| s.to_string()).collect()),
                ..UserInfo::default()
            }),
        }
    }

    const SA_GROUPS: [&str; 3] = [
        "system:serviceaccounts",
        "system:serviceaccounts:shop",
        "system:authenticated",
    ];

    #[test]
    fn an_authenticated_service_account_for_istio_ca_is_its_spiffe_identity() {
        let got = reviewed_identity(
            Some(&status(
                "system:serviceaccount:shop:web",
                &SA_GROUPS,
                &["istio-ca"],
            )),
            TD,
        )
        .unwrap();
        assert_eq!(got.to_string(), "spiffe://cluster.local/ns/shop/sa/web");
        // Another trust domain issues in that domain.
        let got = reviewed_identity(
            Some(&status(
                "system:serviceaccount:shop:web",
                &SA_GROUPS,
                &["x", "istio-ca"],
            )),
            "example.org",
        )
        .unwrap();
        assert_eq!(got.to_string(), "spiffe://example.org/ns/shop/sa/web");
    }

    #[test]
    fn anything_else_is_refused_with_the_reason() {
        let ok = status("system:serviceaccount:shop:web", &SA_GROUPS, &["istio-ca"]);
        let refused = |s: Option<&TokenReviewStatus>, why: &str| {
            let err = reviewed_identity(s, TD).unwrap_err();
            assert!(err.contains(why), "{err:?} should say {why:?}");
        };
        refused(None, "without a status");
        refused(
            Some(&TokenReviewStatus {
                authenticated: Some(false),
                ..ok.clone()
            }),
            "did not authenticate",
        );
        refused(
            Some(&TokenReviewStatus {
                authenticated: None,
                ..ok.clone()
            }),
            "did not authenticate",
        );
        // An error wins over a (contradictory) authenticated flag.
        refused(
            Some(&TokenReviewStatus {
                error: Some("token expired".into()),
                ..ok.clone()
            }),
            "token expired",
        );
        refused(
            Some(&status(
                "system:serviceaccount:shop:web",
                &SA_GROUPS,
                &["https://kubernetes.default.svc"],
            )),
            "not for audience",
        );
        refused(
            Some(&status("system:serviceaccount:shop:web", &SA_GROUPS, &[])),
            "not for audience",
        );
        refused(
            Some(&TokenReviewStatus {
                audiences: None,
                ..ok.clone()
            }),
            "not for audience",
        );
        // A user that is not in the service-account group, whatever its name says.
        refused(
            Some(&status(
                "system:serviceaccount:shop:web",
                &["system:authenticated"],
                &["istio-ca"],
            )),
            "not a service account",
        );
        refused(
            Some(&TokenReviewStatus {
                user: None,
                ..ok.clone()
            }),
            "no user",
        );
        for bad in [
            "admin",
            "system:serviceaccount:shop",
            "system:serviceaccount:shop:web:extra",
            "system:node:shop:web",
            "system:serviceaccount::web",
            "system:serviceaccount:Shop:web",
            "system:serviceaccount:shop:web/../x",
        ] {
            let err =
                reviewed_identity(Some(&status(bad, &SA_GROUPS, &["istio-ca"])), TD).unwrap_err();
            assert!(!err.is_empty(), "{bad}");
        }
    }

    #[tokio::test]
    async fn oversized_and_empty_tokens_are_refused_before_asking() {
        // A client for an address nothing listens on: the checks come first, so no request is
        // made (it would fail with a connection error, not these messages).
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let auth = TokenReviewAuthenticator::new(kube::Client::try_from(config).unwrap(), TD);
        let err = auth.authenticate("").await.unwrap_err();
        assert_eq!(err, "empty token");
        let err = auth
            .authenticate(&"a".repeat(MAX_TOKEN_BYTES + 1))
            .await
            .unwrap_err();
        assert!(err.contains("larger than the 65536-byte limit"), "{err}");
        // An API server that cannot be asked is a refusal too.
        let err = auth.authenticate("header.payload.sig").await.unwrap_err();
        assert!(err.contains("TokenReview failed"), "{err}");
    }

    fn ns(name: &str, phase: Option<&str>) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            status: Some(NamespaceStatus {
                phase: phase.map(str::to_string),
                ..NamespaceStatus::default()
            }),
            ..Namespace::default()
        }
    }

    fn cm(namespace: &str, root: &str, labelled: bool) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(ROOT_CONFIGMAP.into()),
                namespace: Some(namespace.into()),
                labels: labelled.then(|| [("istio.io/config".into(), "true".into())].into()),
                ..ObjectMeta::default()
            },
            data: Some([(ROOT_CONFIGMAP_KEY.into(), root.into())].into()),
            ..ConfigMap::default()
        }
    }

    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};

    #[test]
    fn every_namespace_but_ignored_and_terminating_ones_gets_the_root() {
        let mut index = RootIndex::new("ROOT".into());
        let mut wanted = Vec::new();
        wanted.extend(index.namespace(Init));
        for name in [
            "default",
            "kube-system",
            "kube-public",
            "kube-node-lease",
            "shop",
        ] {
            wanted.extend(index.namespace(InitApply(ns(name, Some("Active")))));
        }
        wanted.extend(index.namespace(InitApply(ns("going", Some("Terminating")))));
        wanted.extend(index.namespace(InitDone));
        assert_eq!(wanted, ["default", "kube-system", "shop"]);
        // Already published (seen by the ConfigMap watch): no write on the next namespace event.
        assert!(index.configmap(Apply(cm("shop", "ROOT", true))).is_empty());
        assert!(
            index
                .namespace(Apply(ns("shop", Some("Active"))))
                .is_empty()
        );
        // A namespace that starts terminating is no longer wanted, nor written on a CM event.
        assert!(
            index
                .namespace(Apply(ns("default", Some("Terminating"))))
                .is_empty()
        );
        assert!(!index.wants("default"));
        assert!(
            index
                .configmap(Delete(cm("default", "ROOT", true)))
                .is_empty()
        );
        // A new namespace.
        assert_eq!(index.namespace(Apply(ns("new", None))), ["new"]);
    }

    #[test]
    fn a_deleted_or_edited_configmap_is_written_again() {
        let mut index = RootIndex::new("ROOT".into());
        assert_eq!(index.namespace(Apply(ns("shop", Some("Active")))), ["shop"]);
        assert!(index.configmap(Apply(cm("shop", "ROOT", true))).is_empty());
        assert_eq!(index.configmap(Apply(cm("shop", "EDITED", true))), ["shop"]);
        assert_eq!(index.configmap(Apply(cm("shop", "ROOT", false))), ["shop"]);
        assert!(index.configmap(Apply(cm("shop", "ROOT", true))).is_empty());
        assert_eq!(index.configmap(Delete(cm("shop", "ROOT", true))), ["shop"]);
        // In an ignored or unknown namespace nothing is written.
        assert!(
            index
                .configmap(Apply(cm("kube-public", "OTHER", false)))
                .is_empty()
        );
        assert!(
            index
                .configmap(Delete(cm("elsewhere", "ROOT", true)))
                .is_empty()
        );
        // A deleted namespace is forgotten.
        assert!(index.namespace(Delete(ns("shop", None))).is_empty());
        assert!(!index.wants("shop"));
    }

    #[test]
    fn a_relist_finds_what_changed_while_the_watch_was_down() {
        let mut index = RootIndex::new("ROOT".into());
        for name in ["a", "b", "c"] {
            assert_eq!(index.namespace(Apply(ns(name, None))), [name]);
            assert!(index.configmap(Apply(cm(name, "ROOT", true))).is_empty());
        }
        // Namespace c was deleted and b's ConfigMap too, unseen.
        assert!(index.namespace(Init).is_empty());
        assert!(index.namespace(InitApply(ns("a", None))).is_empty());
        assert!(index.namespace(InitApply(ns("b", None))).is_empty());
        assert!(index.namespace(InitDone).is_empty());
        assert!(!index.wants("c"));
        assert!(index.configmap(Init).is_empty());
        assert!(index.configmap(InitApply(cm("a", "ROOT", true))).is_empty());
        assert_eq!(index.configmap(InitDone), ["b"]);
    }

    /// A root and an intermediate signed by it, in PEM: (root, intermediate, intermediate key).
    fn plugged_pems() -> (String, String, String) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let root_key = KeyPair::generate().unwrap();
        let mut root = CertificateParams::new(Vec::<String>::new()).unwrap();
        root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let root_cert = root.self_signed(&root_key).unwrap();
        let issuer = Issuer::new(root, root_key);
        let key = KeyPair::generate().unwrap();
        let mut inter = CertificateParams::new(Vec::<String>::new()).unwrap();
        inter.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let inter_cert = inter.signed_by(&key, &issuer).unwrap();
        (root_cert.pem(), inter_cert.pem(), key.serialize_pem())
    }

    fn secret(items: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                items
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    fn chain_of(ca: &Ca) -> Vec<String> {
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

    #[test]
    fn plugged_in_secrets_in_istios_forms() {
        let ttl = Duration::from_secs(3600);
        let (root, inter, key) = plugged_pems();
        let chain = format!("{inter}{root}");
        let istio = secret(&[
            ("ca-cert.pem", &inter),
            ("ca-key.pem", &key),
            ("root-cert.pem", &root),
            ("cert-chain.pem", &chain),
        ]);
        let ca = plugged_ca(&istio, ttl).unwrap();
        assert_eq!(ca.root_pem(), root);
        let issued = chain_of(&ca);
        assert_eq!(issued[1..], [inter.clone(), root.clone()]);
        // cert-manager's kubernetes.io/tls form.
        let tls = secret(&[("tls.crt", &inter), ("tls.key", &key), ("ca.crt", &root)]);
        let ca = plugged_ca(&tls, ttl).unwrap();
        assert_eq!(ca.root_pem(), root);
        assert_eq!(chain_of(&ca)[1..], [inter.clone(), root.clone()]);
        // What is missing or wrong is named.
        let err = plugged_ca(
            &secret(&[("ca-cert.pem", &inter), ("ca-key.pem", &key)]),
            ttl,
        )
        .err()
        .unwrap();
        assert_eq!(err, "no root-cert.pem in it");
        let err = plugged_ca(
            &secret(&[
                ("ca-cert.pem", &inter),
                ("ca-key.pem", "not a key"),
                ("root-cert.pem", &root),
            ]),
            ttl,
        )
        .err()
        .unwrap();
        assert!(err.starts_with("ca-key.pem:"), "{err}");
    }

    #[test]
    fn the_ca_secret_round_trips_as_istio_writes_it() {
        let ttl = Duration::from_secs(3600);
        let (ca, key) = Ca::self_signed(TD, ttl).unwrap();
        let stored = ca_secret("istio-system", ca.root_pem(), &key);
        assert_eq!(stored.type_.as_deref(), Some("istio.io/ca-root"));
        let data = stored.data.as_ref().unwrap();
        let mut keys: Vec<&str> = data.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "ca-cert.pem",
                "ca-key.pem",
                "cert-chain.pem",
                "key.pem",
                "root-cert.pem"
            ]
        );
        let loaded = own_ca(&stored, ttl).unwrap();
        assert_eq!(loaded.root_pem(), ca.root_pem());
        // Signed by the loaded CA, the chain is the leaf and the root only.
        assert_eq!(chain_of(&loaded)[1..], [ca.root_pem().to_string()]);
        let err = own_ca(&secret(&[("ca-cert.pem", ca.root_pem())]), ttl)
            .err()
            .unwrap();
        assert_eq!(err, "no ca-key.pem in it");
    }
}
