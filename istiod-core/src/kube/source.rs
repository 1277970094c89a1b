//! The Kubernetes API server as a config source (istiod's kube registry and CRD client): one
//! watch per kind (the `kube` crate's watcher: list, then watch; a watch that breaks or is too
//! old (410 Gone) lists again), each object parsed by the same code as a file's document
//! (`config_store::dir::parse_object`), kept as the typed resource only (not the object), and
//! listed through `ConfigStore` like any other source. An object that does not parse is a
//! `Rejection` naming it, and its last good version stays in force.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

use crate::config_store::dir::{Bounds, Key, Rejection, parse_object};
use crate::config_store::{ConfigError, Resource};
use crate::store::ConfigStore;

/// One kind the source watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kind {
    pub kind: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    /// Only in this namespace (the mesh ConfigMap); `None`: every namespace.
    pub namespace: Option<String>,
    pub field_selector: Option<String>,
    /// An Istio CRD: when it is not installed the kind is empty (and watched for).
    pub crd: bool,
}

impl Kind {
    /// The API resource the kind is served as.
    pub fn api_resource(&self) -> ApiResource {
        let api_version = if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        };
        ApiResource {
            group: self.group.to_string(),
            version: self.version.to_string(),
            api_version,
            kind: self.kind.to_string(),
            plural: self.plural.to_string(),
        }
    }
}

fn kind(kind: &'static str, group: &'static str, plural: &'static str) -> Kind {
    Kind {
        kind,
        group,
        version: "v1",
        plural,
        namespace: None,
        field_selector: None,
        crd: group.ends_with("istio.io") || group == GATEWAY_API,
    }
}

/// What istiod watches: the registry's kinds (Services, EndpointSlices, Pods, Nodes,
/// Namespaces), the TLS Secrets of gateways, the mesh ConfigMap `mesh_config_map` of
/// `istio_namespace`, Istio's networking, security and telemetry kinds (their `v1`, which
/// every stored version of Istio's CRDs is served as; EnvoyFilter's v1alpha3), and the Gateway API's kinds.
pub fn kinds(istio_namespace: &str, mesh_config_map: &str) -> Vec<Kind> {
    vec![
        kind("Service", "", "services"),
        kind("EndpointSlice", "discovery.k8s.io", "endpointslices"),
        kind("Pod", "", "pods"),
        kind("Node", "", "nodes"),
        kind("Namespace", "", "namespaces"),
        kind("Secret", "", "secrets"),
        Kind {
            namespace: Some(istio_namespace.to_string()),
            field_selector: Some(format!("metadata.name={mesh_config_map}")),
            ..kind("ConfigMap", "", "configmaps")
        },
        kind("ServiceEntry", "networking.istio.io", "serviceentries"),
        kind("WorkloadEntry", "networking.istio.io", "workloadentries"),
        kind("WorkloadGroup", "networking.istio.io", "workloadgroups"),
        kind("VirtualService", "networking.istio.io", "virtualservices"),
        kind("DestinationRule", "networking.istio.io", "destinationrules"),
        kind("Gateway", "networking.istio.io", "gateways"),
        kind("Sidecar", "networking.istio.io", "sidecars"),
        kind(
            "PeerAuthentication",
            "security.istio.io",
            "peerauthentications",
        ),
        kind(
            "AuthorizationPolicy",
            "security.istio.io",
            "authorizationpolicies",
        ),
        kind(
            "RequestAuthentication",
            "security.istio.io",
            "requestauthentications",
        ),
        kind("Telemetry", "telemetry.istio.io", "telemetries"),
        // EnvoyFilter is served as v1alpha3 only.
        Kind {
            version: "v1alpha3",
            ..kind("EnvoyFilter", "networking.istio.io", "envoyfilters")
        },
        // The Kubernetes Gateway API (v1 of each kind; a CRD not installed is an empty kind).
        kind("GatewayClass", GATEWAY_API, "gatewayclasses"),
        kind("Gateway", GATEWAY_API, "gateways"),
        kind("HTTPRoute", GATEWAY_API, "httproutes"),
        kind("GRPCRoute", GATEWAY_API, "grpcroutes"),
        kind("TCPRoute", GATEWAY_API, "tcproutes"),
        kind("TLSRoute", GATEWAY_API, "tlsroutes"),
        kind("ReferenceGrant", GATEWAY_API, "referencegrants"),
    ]
}

const GATEWAY_API: &str = crate::config_store::gateway_api::GROUP;

/// The object as the API server names it (the kind watched, not the resource it became: the
/// `istio` ConfigMap is a MeshConfig resource).
type ObjectKey = Key;

#[derive(Default)]
struct State {
    /// The resources in force, by the object they came from, in a stable order.
    objects: BTreeMap<ObjectKey, Resource>,
    rejected: BTreeMap<ObjectKey, Rejection>,
    /// `metadata.generation` and `uid` of each object seen (refused ones too), for the status
    /// writers (the uid tells an object deleted and created again from the one before).
    generations: BTreeMap<ObjectKey, Version>,
}

/// Config from the Kubernetes API server (`serve --kubeconfig`).
pub struct KubeSource {
    state: RwLock<State>,
    changes: watch::Sender<u64>,
    /// Kinds whose first list is complete (or whose CRD is not installed), by `key_kind`.
    synced: watch::Sender<BTreeSet<&'static str>>,
    /// The last error of any watch, for a start that never syncs.
    last_error: Mutex<Option<String>>,
    bounds: Bounds,
    kinds: Vec<Kind>,
}

impl KubeSource {
    pub fn new(kinds: Vec<Kind>) -> Arc<KubeSource> {
        Arc::new(KubeSource {
            state: RwLock::default(),
            changes: watch::Sender::new(0),
            synced: watch::Sender::new(BTreeSet::new()),
            last_error: Mutex::new(None),
            bounds: Bounds::default(),
            kinds,
        })
    }

    /// Watches every kind until the process ends (each watch retries with backoff on its own).
    pub async fn run(self: Arc<Self>, client: kube::Client) {
        let watches = self
            .kinds
            .clone()
            .into_iter()
            .map(|k| self.clone().watch_kind(client.clone(), k));
        futures::future::join_all(watches).await;
    }

    /// Waits until every kind has been listed once (istiod's informers' HasSynced): a control
    /// plane that served before would push a mesh without most of its services. Fails after
    /// `limit` with what is missing and the last error seen.
    pub async fn wait_synced(&self, limit: Duration) -> Result<(), String> {
        let mut rx = self.synced.subscribe();
        let all = self.kinds.len();
        let result = tokio::time::timeout(limit, rx.wait_for(|s| s.len() == all)).await;
        match result {
            Ok(Ok(_)) => Ok(()),
            _ => {
                let done = self.synced.borrow().clone();
                let missing: Vec<&str> = self
                    .kinds
                    .iter()
                    .map(|k| k.key_kind())
                    .filter(|k| !done.contains(k))
                    .collect();
                let last = self
                    .last_error
                    .lock()
                    .ok()
                    .and_then(|e| e.clone())
                    .unwrap_or_else(|| "none".into());
                Err(format!(
                    "not listed within {limit:?}: {}; last error: {last}",
                    missing.join(", ")
                ))
            }
        }
    }

    fn notify(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    async fn watch_kind(self: Arc<Self>, client: kube::Client, kind: Kind) {
        let ar = kind.api_resource();
        let api: Api<DynamicObject> = match &kind.namespace {
            Some(ns) => Api::namespaced_with(client, ns, &ar),
            None => Api::all_with(client, &ar),
        };
        let config = watcher::Config {
            field_selector: kind.field_selector.clone(),
            ..Default::default()
        };
        let mut events = watcher::watcher(api, config)
            .backoff(WatchBackoff::default())
            .boxed();
        // Objects of a (re)list, swapped in at its end: a relist never empties the kind.
        let mut relist: Option<State> = None;
        let mut last_logged: Option<Instant> = None;
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => self.on_event(&kind, &ar, &mut relist, event),
                Err(e) => {
                    let absent = is_not_found(&e);
                    // A kind whose CRD is not installed is empty until it is.
                    if absent && kind.crd && !self.synced.borrow().contains(kind.key_kind()) {
                        tracing::warn!(
                            kind = kind.kind,
                            "the API server does not serve {}/{} (CRD not installed?); none \
                             until it does",
                            kind.group,
                            kind.plural
                        );
                        self.synced.send_modify(|s| {
                            s.insert(kind.key_kind());
                        });
                    }
                    let message = format!("watch {}: {e}", kind.plural);
                    if let Ok(mut last) = self.last_error.lock() {
                        *last = Some(message.clone());
                    }
                    // Every failure is retried with backoff; say so at most every 30 s a kind.
                    if !absent && last_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(30))
                    {
                        tracing::warn!("{message}; retrying");
                        last_logged = Some(Instant::now());
                    }
                }
            }
        }
        tracing::error!(kind = kind.kind, "watch ended");
    }

    /// One watch event of `kind`. A (re)list (`Init` … `InitDone`, after a broken watch or
    /// 410 Gone) is gathered aside and replaces the kind's objects only when complete, so what
    /// is served never lacks what the API server still has.
    fn on_event(
        &self,
        kind: &Kind,
        ar: &ApiResource,
        relist: &mut Option<State>,
        event: Event<DynamicObject>,
    ) {
        match event {
            Event::Init => *relist = Some(State::default()),
            Event::InitApply(obj) => {
                let relisted = relist.get_or_insert_with(State::default);
                let previous = self.state.read().ok().and_then(|s| {
                    let key = object_key(kind, &obj);
                    s.objects.get(&key).cloned()
                });
                apply(relisted, kind, ar, obj, previous, &self.bounds);
            }
            Event::InitDone => {
                let fresh = relist.take().unwrap_or_default();
                if let Ok(mut state) = self.state.write() {
                    let own = kind.key_kind();
                    state.objects.retain(|k, _| k.kind != own);
                    state.rejected.retain(|k, _| k.kind != own);
                    state.generations.retain(|k, _| k.kind != own);
                    state.objects.extend(fresh.objects);
                    state.rejected.extend(fresh.rejected);
                    state.generations.extend(fresh.generations);
                }
                self.synced.send_modify(|s| {
                    s.insert(kind.key_kind());
                });
                self.notify();
            }
            Event::Apply(obj) => {
                if let Ok(mut state) = self.state.write() {
                    let previous = state.objects.get(&object_key(kind, &obj)).cloned();
                    apply(&mut state, kind, ar, obj, previous, &self.bounds);
                }
                self.notify();
            }
            Event::Delete(obj) => {
                let key = object_key(kind, &obj);
                if let Ok(mut state) = self.state.write() {
                    state.objects.remove(&key);
                    state.rejected.remove(&key);
                    state.generations.remove(&key);
                }
                self.notify();
            }
        }
    }
}

/// Retries of a failed list or watch: 100 ms doubling to 2 s, back to 100 ms once one
/// succeeds. The default (800 ms to 30 s) left a control plane blind for 15 s after a 3 s API
/// server restart; 19 watches asking every 2 s cost an API server nothing.
struct WatchBackoff {
    next: Duration,
}

const WATCH_RETRY_FIRST: Duration = Duration::from_millis(100);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(2);

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff {
            next: WATCH_RETRY_FIRST,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (now * 2).min(WATCH_RETRY_MAX);
        Some(now)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_RETRY_FIRST;
    }
}

fn is_not_found(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 404,
        watcher::Error::WatchError(s) => s.code == 404,
        _ => false,
    }
}

fn object_key(kind: &Kind, obj: &DynamicObject) -> ObjectKey {
    Key {
        kind: kind.key_kind().to_string(),
        namespace: obj
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name: obj.metadata.name.clone().unwrap_or_default(),
    }
}

/// Parses `obj` into `state`: in force when it parses; refused (naming it) when it does not,
/// `previous` (its version in force) then staying in its place.
fn apply(
    state: &mut State,
    kind: &Kind,
    ar: &ApiResource,
    obj: DynamicObject,
    previous: Option<Resource>,
    bounds: &Bounds,
) {
    let key = object_key(kind, &obj);
    if let Some(g) = obj.metadata.generation {
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        state
            .generations
            .insert(key.clone(), Version { generation: g, uid });
    }
    // Listed items carry no apiVersion and kind: they are the watched kind's.
    let mut value = match serde_json::to_value(&obj) {
        Ok(v) => v,
        Err(e) => {
            refuse(state, key, format!("cannot read it: {e}"), previous);
            return;
        }
    };
    value["apiVersion"] = ar.api_version.clone().into();
    value["kind"] = ar.kind.clone().into();
    match parse_object(value, bounds) {
        Ok((_, Some(resource))) => {
            state.rejected.remove(&key);
            state.objects.insert(key, resource);
        }
        // No config of ours (a Secret without TLS material).
        Ok((_, None)) => {
            state.rejected.remove(&key);
            state.objects.remove(&key);
        }
        Err(reason) => refuse(state, key, reason, previous),
    }
}

fn refuse(state: &mut State, key: ObjectKey, reason: String, previous: Option<Resource>) {
    let kept = previous.is_some();
    if let Some(p) = previous {
        state.objects.insert(key.clone(), p);
    }
    let object = key.to_string();
    state.rejected.insert(
        key,
        Rejection {
            file: None,
            document: None,
            object: Some(object),
            reason,
            last_good_kept: kept,
            keep: Vec::new(),
        },
    );
}

/// What the status writer needs of one Istio object: its kind, generation and whether it is
/// in force (`None`) or refused (`Some(reason)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStatus {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub version: Version,
    pub refused: Option<String>,
}

/// Which object, in which generation: `metadata.generation` and `metadata.uid`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Version {
    pub generation: i64,
    pub uid: String,
}

impl KubeSource {
    /// Every object of an Istio kind (a CRD), with whether it was refused and why.
    pub fn istio_statuses(&self) -> Vec<ObjectStatus> {
        let Ok(state) = self.state.read() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (key, version) in &state.generations {
            // Istio's kinds only: the Gateway API's status is the gateway controller's.
            let Some(kind) = self
                .kinds
                .iter()
                .find(|k| k.crd && k.group != GATEWAY_API && k.kind == key.kind)
            else {
                continue;
            };
            let refused = state.rejected.get(key).map(|r| r.reason.clone());
            if refused.is_none() && !state.objects.contains_key(key) {
                continue;
            }
            out.push(ObjectStatus {
                kind: kind.clone(),
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                version: version.clone(),
                refused,
            });
        }
        out
    }

    /// The watched kind whose objects are keyed `key_kind`.
    pub fn kind_keyed(&self, key_kind: &str) -> Option<&Kind> {
        self.kinds.iter().find(|k| k.key_kind() == key_kind)
    }

    /// The version of every object seen, by (key kind, namespace, name).
    pub fn generations(&self) -> BTreeMap<(String, String, String), Version> {
        let Ok(state) = self.state.read() else {
            return BTreeMap::new();
        };
        state
            .generations
            .iter()
            .map(|(k, v)| {
                (
                    (k.kind.clone(), k.namespace.clone(), k.name.clone()),
                    v.clone(),
                )
            })
            .collect()
    }

    /// Notified on every change (`ConfigStore::changes`, without the trait).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

impl Kind {
    /// The kind its objects are keyed by: the kind, but `KubernetesGateway` for a Gateway API
    /// Gateway (apart from an Istio Gateway, as its documents are keyed).
    pub fn key_kind(&self) -> &'static str {
        if self.group == GATEWAY_API && self.kind == "Gateway" {
            crate::config_store::gateway_api::GATEWAY_KIND
        } else {
            self.kind
        }
    }

    /// `group/version` (`v1` for the core group).
    pub fn api_resource_version(&self) -> String {
        self.api_resource().api_version
    }

    /// The kind's API, for writing to its objects.
    pub fn api(&self, client: kube::Client, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(client, namespace, &self.api_resource())
    }
}

impl ConfigStore for KubeSource {
    fn list(&self) -> Result<Vec<Resource>, ConfigError> {
        Ok(self
            .state
            .read()
            .map(|s| s.objects.values().cloned().collect())
            .unwrap_or_default())
    }

    fn rejected(&self) -> Vec<Rejection> {
        self.state
            .read()
            .map(|s| s.rejected.values().cloned().collect())
            .unwrap_or_default()
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.changes.subscribe())
    }

    fn origin(&self) -> String {
        "kubernetes".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_watched_kind_is_keyed_apart() {
        // Sync and relists go by the key kind: two kinds sharing one (the Istio and the Gateway
        // API Gateway) would never sync, and a relist of one would drop the other's objects.
        let all = kinds("istio-system", "istio");
        let keys: BTreeSet<&str> = all.iter().map(Kind::key_kind).collect();
        assert_eq!(keys.len(), all.len());
        assert!(keys.contains("KubernetesGateway") && keys.contains("Gateway"));
    }

    fn obj(value: serde_json::Value) -> DynamicObject {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    fn rule(name: &str, host: &str) -> DynamicObject {
        obj(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"host": host},
        }))
    }

    fn names(source: &KubeSource) -> Vec<String> {
        source
            .list()
            .unwrap_or_default()
            .iter()
            .map(|r| r.metadata().name.clone())
            .collect()
    }

    /// A relist (after a broken watch or 410 Gone) replaces the kind's objects only when it is
    /// complete: until then the old ones are served; after, what it no longer lists is gone and
    /// the other kinds are untouched. A refused object keeps its last good version.
    #[test]
    fn a_relist_swaps_in_whole_and_a_refused_object_keeps_its_last_good_version() {
        let rules = kind("DestinationRule", "networking.istio.io", "destinationrules");
        let ns = kind("Namespace", "", "namespaces");
        let source = KubeSource::new(vec![rules.clone(), ns.clone()]);
        let (ar, ns_ar) = (rules.api_resource(), ns.api_resource());
        let mut relist = None;
        let mut ns_relist = None;
        let mut changes = source.changes().unwrap_or_else(|| panic!("no changes"));
        source.on_event(&ns, &ns_ar, &mut ns_relist, Event::Init);
        source.on_event(
            &ns,
            &ns_ar,
            &mut ns_relist,
            Event::InitApply(obj(serde_json::json!({"metadata": {"name": "shop"}}))),
        );
        source.on_event(&ns, &ns_ar, &mut ns_relist, Event::InitDone);
        source.on_event(&rules, &ar, &mut relist, Event::Init);
        source.on_event(
            &rules,
            &ar,
            &mut relist,
            Event::InitApply(rule("a", "a.shop")),
        );
        assert_eq!(
            names(&source),
            ["shop"],
            "nothing of a list before it is done"
        );
        source.on_event(&rules, &ar, &mut relist, Event::InitDone);
        source.on_event(&rules, &ar, &mut relist, Event::Apply(rule("b", "b.shop")));
        assert_eq!(names(&source), ["a", "b", "shop"]);
        assert!(changes.has_changed().unwrap_or(false));
        changes.mark_unchanged();

        // The watch broke: a relist that no longer has `a`.
        source.on_event(&rules, &ar, &mut relist, Event::Init);
        source.on_event(
            &rules,
            &ar,
            &mut relist,
            Event::InitApply(rule("b", "b2.shop")),
        );
        assert_eq!(
            names(&source),
            ["a", "b", "shop"],
            "served until the relist is whole"
        );
        source.on_event(&rules, &ar, &mut relist, Event::InitDone);
        assert_eq!(names(&source), ["b", "shop"]);
        assert!(changes.has_changed().unwrap_or(false));

        // `b` edited into something invalid: refused by name, its last version stays.
        let bad = obj(serde_json::json!({
            "metadata": {"name": "b", "namespace": "shop"},
            "spec": {"host": "b.shop", "trafficPolicy": {"loadBalancer": {"simple": "FASTEST"}}},
        }));
        source.on_event(&rules, &ar, &mut relist, Event::Apply(bad));
        let refused = source.rejected();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].object.as_deref(), Some("DestinationRule shop/b"));
        assert!(refused[0].last_good_kept, "{refused:?}");
        let in_force = source.list().unwrap_or_default();
        let Some(Resource::DestinationRule(_, spec)) =
            in_force.iter().find(|r| r.metadata().name == "b")
        else {
            panic!("b is gone: {in_force:?}");
        };
        assert_eq!(spec.host, "b2.shop");
        // Deleted: gone, and so is its refusal.
        source.on_event(&rules, &ar, &mut relist, Event::Delete(rule("b", "b.shop")));
        assert_eq!(names(&source), ["shop"]);
        assert!(source.rejected().is_empty());
    }

    /// Istio's Gateway and the Gateway API's are both kind `Gateway`: listing one never drops
    /// the other's objects, and the source is synced only once both are listed.
    #[tokio::test]
    async fn the_two_gateway_kinds_are_kept_and_synced_apart() {
        let istio = kind("Gateway", "networking.istio.io", "gateways");
        let k8s = kind("Gateway", GATEWAY_API, "gateways");
        let source = KubeSource::new(vec![istio.clone(), k8s.clone()]);
        let (istio_ar, k8s_ar) = (istio.api_resource(), k8s.api_resource());
        let (mut a, mut b) = (None, None);
        source.on_event(&istio, &istio_ar, &mut a, Event::Init);
        source.on_event(
            &istio,
            &istio_ar,
            &mut a,
            Event::InitApply(obj(serde_json::json!({
                "metadata": {"name": "classic", "namespace": "shop"},
                "spec": {"selector": {"istio": "ingressgateway"}, "servers": [
                    {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}
                ]},
            }))),
        );
        source.on_event(&istio, &istio_ar, &mut a, Event::InitDone);
        assert!(
            source.wait_synced(Duration::from_millis(10)).await.is_err(),
            "synced before the Gateway API's Gateways were listed"
        );
        source.on_event(&k8s, &k8s_ar, &mut b, Event::Init);
        source.on_event(
            &k8s,
            &k8s_ar,
            &mut b,
            Event::InitApply(obj(serde_json::json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "metadata": {"name": "api", "namespace": "shop"},
                "spec": {"gatewayClassName": "istio", "listeners": [
                    {"name": "http", "port": 80, "protocol": "HTTP"}
                ]},
            }))),
        );
        source.on_event(&k8s, &k8s_ar, &mut b, Event::InitDone);
        assert_eq!(names(&source), ["classic", "api"]);
        source
            .wait_synced(Duration::from_millis(10))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
