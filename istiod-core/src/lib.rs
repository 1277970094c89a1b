//! istiod-core: a control plane following istiod's architecture.
//!
//! Data flows one way: config (`config_store`) → services (`registry`) → an immutable snapshot
//! (`push_context`) → per-proxy resources (`generators`) → streams (`xds_server`).
//! [`ControlPlane`] owns the snapshot and publishes each new one to every stream.

pub mod ads_http;
pub mod autoregister;
pub mod ca;
pub mod ca_server;
pub mod config;
pub mod config_store;
pub mod debug;
pub mod envoy_proto;
pub mod gateway_conversion;
pub mod generators;
pub mod intern;
pub mod kube;
pub mod model;
pub mod patch;
pub mod push_context;
pub mod registry;
pub mod resource;
pub mod serve;
pub mod store;
pub mod transport;
pub mod wire;
pub mod xds_debug;
pub mod xds_server;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

use config_store::ConfigError;
use config_store::dir::Rejection;
use push_context::PushContext;
use registry::RegistryError;

pub use config::{DEFAULT_DOMAIN_SUFFIX, Debounce};

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The mesh config file overrides the directory's MeshConfig field by field; a trust
    /// domain other than the control plane's is refused and the last good config stays.
    #[test]
    fn mesh_config_file_overrides_and_trust_domain_is_fixed() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mesh_dir = dir.path().join("mesh");
        std::fs::create_dir(&mesh_dir).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            mesh_dir.join("m.yaml"),
            "kind: MeshConfig\nmetadata: {name: m}\nspec: {rootNamespace: from-dir, enableAutoMtls: false}\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("mesh-config");
        std::fs::write(&file, "rootNamespace: from-file\n").unwrap_or_else(|e| panic!("{e}"));
        let cp = ControlPlane::open(Settings {
            config_dir: Some(mesh_dir),
            mesh_file: Some(file.clone()),
            trust_domain: "example.org".into(),
            ..Settings::default()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let push = cp.snapshot();
        assert_eq!(push.root_namespace(), "from-file");
        assert!(
            !push.auto_mtls(),
            "the directory's field stays where the file is silent"
        );

        std::fs::write(&file, "trustDomain: other.org\n").unwrap_or_else(|e| panic!("{e}"));
        let e = cp.reload().unwrap_err().to_string();
        assert!(
            e.contains("\"other.org\"") && e.contains("\"example.org\""),
            "{e}"
        );
        assert_eq!(
            cp.snapshot().root_namespace(),
            "from-file",
            "last good config kept"
        );
        std::fs::write(&file, "trustDomain: example.org\n").unwrap_or_else(|e| panic!("{e}"));
        cp.reload().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cp.snapshot().root_namespace(), "from-dir");
    }

    #[tokio::test(start_paused = true)]
    async fn debounce_waits_for_quiet_but_not_forever() {
        let d = Debounce {
            after: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        // A burst: events at 0, 50 and 120 ms; settles 100 ms after the last.
        let start = tokio::time::Instant::now();
        tokio::spawn({
            let tx = tx.clone();
            async move {
                for at in [50, 120] {
                    tokio::time::sleep_until(start + Duration::from_millis(at)).await;
                    let _ = tx.send(()).await;
                }
            }
        });
        assert!(d.settle(&mut rx).await);
        assert_eq!(start.elapsed(), Duration::from_millis(220));
        // A stream that never pauses: settles at the max.
        let start = tokio::time::Instant::now();
        let flood = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if tx.send(()).await.is_err() {
                    return;
                }
            }
        });
        assert!(d.settle(&mut rx).await);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        flood.abort();
    }

    #[test]
    fn debounce_durations_are_checked() {
        let env = |k: &str| (k == "PILOT_DEBOUNCE_AFTER").then(|| "fast".to_string());
        let e = config::debounce(&env).unwrap_err();
        assert_eq!(e.name, "PILOT_DEBOUNCE_AFTER", "{e}");
        let huge = |k: &str| (k == "PILOT_DEBOUNCE_MAX").then(|| "9999999999999999h".to_string());
        let e = config::debounce(&huge).unwrap_err();
        assert_eq!(e.name, "PILOT_DEBOUNCE_MAX", "{e}");
        assert!(e.to_string().contains("largest"), "{e}");
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(
        "mesh config trustDomain {found:?} differs from the control plane's {expected:?} \
         (fixed at startup by --trust-domain / TRUST_DOMAIN or the mesh config file)"
    )]
    TrustDomain { found: String, expected: String },
}

/// The control plane: the current snapshot and the means to replace it. Config comes from an
/// aggregate of the watched directory (if any) and an in-memory store (`memory()`).
pub struct ControlPlane {
    store: store::AggregateStore,
    memory: Arc<store::MemoryStore>,
    settings: Settings,
    tx: watch::Sender<Arc<PushContext>>,
    generation: std::sync::atomic::AtomicU64,
    autoregister: Arc<autoregister::AutoRegistration>,
    /// What the last load refused (/debug/configz).
    rejected: std::sync::Mutex<Vec<Rejection>>,
}

/// What a control plane is made from. The switches are istiod's environment variables
/// (`config::env`), parsed by the caller (`config::PilotEnv`, or the agent's config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The watched directory of Kubernetes-style YAML/JSON (none: in-memory config only).
    pub config_dir: Option<PathBuf>,
    /// istiod's `--meshConfig` (plain MeshConfig YAML), read after the directory, its fields
    /// overriding any MeshConfig there. Watched.
    pub mesh_file: Option<PathBuf>,
    pub domain_suffix: String,
    /// Identities are `spiffe://<trust_domain>/...` (the SANs clients expect of their peers);
    /// a mesh config naming another trust domain is refused.
    pub trust_domain: String,
    /// PILOT_SCOPE_GATEWAY_TO_NAMESPACE: a Gateway selects routers of its own namespace only.
    pub scope_gateway_to_namespace: bool,
    /// ISTIOD_CACHE_CHECK: every snapshot's generator cache runs in the checked mode
    /// (`GenCache::checked`).
    pub cache_check: bool,
    /// CLUSTER_ID: the cluster the registry's endpoints are in.
    pub cluster_id: String,
    /// PILOT_ENABLE_IP_AUTOALLOCATE (default true): address-less ServiceEntry hosts get
    /// addresses of their own (`push_context::auto_ip`).
    pub auto_allocate: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            config_dir: None,
            mesh_file: None,
            domain_suffix: DEFAULT_DOMAIN_SUFFIX.to_string(),
            trust_domain: push_context::DEFAULT_TRUST_DOMAIN.to_string(),
            scope_gateway_to_namespace: false,
            cache_check: false,
            cluster_id: config::DEFAULT_CLUSTER_ID.to_string(),
            auto_allocate: true,
        }
    }
}

/// Resources the registry may refuse one by one in a build before the build fails as a whole.
const MAX_REFUSED_IN_BUILD: usize = 100;

/// A snapshot of what `store` lists, with what was refused: by the store (each document on its
/// own) and by the registry, where a resource whose error names it is taken out (its version in
/// `previous`, if any, put back once) and the build tried again.
fn build(
    store: &dyn store::ConfigStore,
    settings: &Settings,
    generation: u64,
    previous: Option<&PushContext>,
) -> Result<(PushContext, Vec<Rejection>), Error> {
    let mut set = store::config_set(store)?;
    let rejected_by_store = store.rejected();
    // What a store refused keeps its version in force, if it had one. Most reloads keep
    // nothing (the Kubernetes source keeps its last good versions itself): no key is made then.
    let keep: std::collections::BTreeSet<&config_store::dir::Key> =
        rejected_by_store.iter().flat_map(|r| &r.keep).collect();
    if let Some(previous) = previous
        && !keep.is_empty()
    {
        let present: std::collections::BTreeSet<config_store::dir::Key> = set
            .resources
            .iter()
            .map(config_store::dir::Key::of)
            .collect();
        set.resources.extend(
            previous
                .config
                .resources
                .iter()
                .filter(|r| {
                    let k = config_store::dir::Key::of(r);
                    keep.contains(&k) && !present.contains(&k)
                })
                .cloned(),
        );
    }
    // Only what the mesh's discoverySelectors let it see (istiod's namespace filter).
    let selectors = push_context::merged_mesh(&set).discovery_selectors;
    config_store::discovery::retain_selected(&mut set.resources, &selectors);
    let mut rejected = rejected_by_store;
    // The Gateway API, as the Istio Gateways and VirtualServices it means.
    let (translated, problems) =
        gateway_conversion::translate(&set.resources, &settings.domain_suffix);
    set.resources.extend(translated);
    rejected.extend(problems.into_iter().map(|reason| Rejection {
        file: None,
        document: None,
        object: None,
        reason,
        last_good_kept: false,
        keep: Vec::new(),
    }));
    let version = format!(
        "{}.{generation}",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default()
    );
    let mut reverted: Vec<(String, String, String)> = Vec::new();
    let mut set = Arc::new(set);
    let mut push = loop {
        let e = match PushContext::build_after(
            set.clone(),
            &settings.domain_suffix,
            version.clone(),
            previous,
        ) {
            Ok(push) => break push,
            Err(e) => e,
        };
        let named = |r: &config_store::Resource| {
            r.kind() == e.kind
                && r.metadata().namespace() == e.namespace
                && r.metadata().name == e.name
        };
        // The failed build dropped its share: no copy is made here.
        let resources = &mut Arc::make_mut(&mut set).resources;
        let before = resources.len();
        resources.retain(|r| !named(r));
        if resources.len() == before || reverted.len() >= MAX_REFUSED_IN_BUILD {
            return Err(e.into());
        }
        let id = (e.kind.to_string(), e.namespace.clone(), e.name.clone());
        let fallback = previous
            .and_then(|p| p.config.resources.iter().find(|r| named(r)))
            .filter(|_| !reverted.contains(&id));
        rejected.push(Rejection {
            file: None,
            document: None,
            object: Some(format!("{} {}/{}", e.kind, e.namespace, e.name)),
            reason: e.to_string(),
            last_good_kept: fallback.is_some(),
            keep: Vec::new(),
        });
        if let Some(r) = fallback {
            resources.push(r.clone());
        }
        reverted.push(id);
    };
    if let Some(found) = &push.mesh.trust_domain
        && *found != settings.trust_domain
    {
        return Err(Error::TrustDomain {
            found: found.clone(),
            expected: settings.trust_domain.clone(),
        });
    }
    push.trust_domain = settings.trust_domain.clone();
    push.scope_gateway_to_namespace = settings.scope_gateway_to_namespace;
    push.cluster_id.clone_from(&settings.cluster_id);
    push.auto_ip_cursor = push_context::auto_ip::allocate(
        &mut push.services,
        previous.map(|p| &p.services[..]),
        previous.map(|p| p.auto_ip_cursor).unwrap_or_default(),
        settings.auto_allocate,
    );
    if settings.cache_check {
        push.cache = push_context::GenCache::checked();
    }
    Ok((push, rejected))
}

/// Logs each rejection not in `old`: a refused resource is said once, when it appears.
fn log_rejections(rejected: &[Rejection], old: &[Rejection]) {
    for r in rejected {
        if !old.contains(r) {
            tracing::warn!("config {r}");
        }
    }
}

/// Logs each warning of `push` that `old` did not have: what the config asks for and is not
/// acted on is said once, when it appears.
fn log_warnings(push: &PushContext, old: Option<&PushContext>) {
    for w in &push.warnings {
        if !old.is_some_and(|o| o.warnings.contains(w)) {
            tracing::warn!("{w}");
        }
    }
}

impl ControlPlane {
    /// Loads `config_dir` with the default settings; fails if it does not load.
    pub fn load(config_dir: &Path, domain_suffix: &str) -> Result<Arc<ControlPlane>, Error> {
        Self::open(Settings {
            config_dir: Some(config_dir.to_path_buf()),
            domain_suffix: domain_suffix.to_string(),
            ..Settings::default()
        })
    }

    /// A control plane fed only by its in-memory store (tests, embedders).
    pub fn in_memory(domain_suffix: &str) -> Result<Arc<ControlPlane>, Error> {
        Self::open(Settings {
            domain_suffix: domain_suffix.to_string(),
            ..Settings::default()
        })
    }

    /// Loads the config `settings` name; fails if it does not load, so a bad start is loud.
    pub fn open(settings: Settings) -> Result<Arc<ControlPlane>, Error> {
        Self::open_with(settings, Vec::new())
    }

    /// `open` with more sources (the Kubernetes API server's), listed first: the directory and
    /// the in-memory store add to them, and the mesh config file overrides all, as istiod's
    /// file and CRD stores. A source that says when it changed (`ConfigStore::changes`) is
    /// reloaded from on each change.
    pub fn open_with(
        settings: Settings,
        extra: Vec<Arc<dyn store::ConfigStore>>,
    ) -> Result<Arc<ControlPlane>, Error> {
        let memory = store::MemoryStore::new();
        let mut sources: Vec<Arc<dyn store::ConfigStore>> = extra;
        if let Some(dir) = &settings.config_dir {
            sources.push(Arc::new(store::FileStore::new(dir.clone())));
        }
        sources.push(memory.clone());
        if let Some(path) = &settings.mesh_file {
            sources.push(Arc::new(store::MeshConfigFile::new(path.clone())));
        }
        let store = store::AggregateStore::new(sources);
        let (push, rejected) = build(&store, &settings, 1, None)?;
        log_rejections(&rejected, &[]);
        if settings.cache_check {
            tracing::warn!(
                "ISTIOD_CACHE_CHECK: every cached resource is generated again and compared"
            );
        }
        tracing::info!(dir = ?settings.config_dir, services = push.services.len(), "config loaded");
        log_warnings(&push, None);
        let (tx, _) = watch::channel(Arc::new(push));
        Ok(Arc::new(ControlPlane {
            store,
            settings,
            tx,
            generation: 1.into(),
            autoregister: autoregister::AutoRegistration::new(
                memory.clone(),
                config::DEFAULT_WORKLOAD_ENTRY_GRACE,
            ),
            memory,
            rejected: rejected.into(),
        }))
    }

    /// The source a resource in force came from (`file:DIR`, `kubernetes`, `memory`, ...).
    pub fn origin_of(&self, r: &config_store::Resource) -> Option<String> {
        self.store.origin_of(r)
    }

    /// What the last load refused, each document or resource on its own.
    pub fn rejected(&self) -> Vec<Rejection> {
        self.rejected.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The in-memory source: what is applied here joins the directory's config on the next
    /// reload (`watch` reloads on every change, debounced).
    pub fn memory(&self) -> &Arc<store::MemoryStore> {
        &self.memory
    }

    /// Reads every source again. On error the last good snapshot stays in force.
    pub fn reload(&self) -> Result<(), Error> {
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let old = self.tx.borrow().clone();
        let (mut push, rejected) = build(&self.store, &self.settings, generation, Some(&old))?;
        if let Ok(mut last) = self.rejected.lock() {
            log_rejections(&rejected, &last);
            *last = rejected;
        }
        log_warnings(&push, Some(&old));
        if !push.same_content(&old) {
            push.generation = old.generation + 1;
            push.change = push.change_from(&old);
            if let push_context::Change::Endpoints(hosts) = &push.change {
                generators::eds::carry_over(&push, &old, hosts);
            }
            tracing::info!(
                version = %push.version,
                services = push.services.len(),
                change = ?push.change,
                "config changed; pushing"
            );
            self.tx.send_replace(Arc::new(push));
        }
        Ok(())
    }

    pub fn snapshot(&self) -> Arc<PushContext> {
        self.tx.borrow().clone()
    }

    /// Each snapshot as it comes into force.
    pub fn snapshots(&self) -> watch::Receiver<Arc<PushContext>> {
        self.tx.subscribe()
    }

    pub fn xds(&self) -> xds_server::XdsServer {
        xds_server::XdsServer::new(self.tx.subscribe())
            .with_auto_registration(self.autoregister.clone())
    }

    /// WorkloadEntry auto-registration into the in-memory store (`autoregister`).
    pub fn auto_registration(&self) -> &Arc<autoregister::AutoRegistration> {
        &self.autoregister
    }

    pub fn xds_with_limits(
        &self,
        max_streams: usize,
        push_throttle: usize,
    ) -> xds_server::XdsServer {
        xds_server::XdsServer::with_limits(self.tx.subscribe(), max_streams, push_throttle)
            .with_auto_registration(self.autoregister.clone())
    }

    /// Reloads after each burst of changes of any source has settled (`debounce`): the files'
    /// own watches, the in-memory store, the Kubernetes watches. Runs until the process ends.
    pub async fn watch(self: Arc<Self>, debounce: Debounce) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1024);
        let counters: Vec<watch::Receiver<u64>> = self
            .store
            .sources
            .iter()
            .filter_map(|s| s.changes())
            .collect();
        for mut changes in counters.clone() {
            let tx = tx.clone();
            tokio::spawn(async move {
                while changes.changed().await.is_ok() {
                    if tx.send(()).await.is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        let counts_now = || -> Vec<u64> { counters.iter().map(|c| *c.borrow()).collect() };
        let mut last = counts_now();
        // What changed between the load and the watch's start would otherwise wait for the
        // next change: read once now that the watch is in place.
        if let Err(e) = self.reload() {
            tracing::error!(error = %e, "config rejected; keeping the last good config");
        }
        while rx.recv().await.is_some() {
            if !debounce.settle(&mut rx).await {
                break;
            }
            let now = counts_now();
            if now == last {
                continue;
            }
            last = now;
            if let Err(e) = self.reload() {
                tracing::error!(error = %e, "config rejected; keeping the last good config");
            }
        }
    }
}
