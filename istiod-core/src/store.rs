//! Config sources behind one interface (istiod's `model.ConfigStore` and its aggregate): the
//! directory of files (`FileStore`) and the mesh config file (`MeshConfigFile`), which watch
//! themselves, an in-memory store that tests and embedders write to (`MemoryStore`), and
//! `AggregateStore`, which lists them all as one. Every source says when it changed
//! (`ConfigStore::changes`), as the Kubernetes source does; the control plane reads only through
//! `ConfigStore` and merges the sources' changes, so a source never needs to know about
//! snapshots or pushes, and the control plane never about files.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use mesh_common::watch::{FileWatch, Fingerprint, Watched};
use tokio::sync::watch;

use crate::config_store::dir::{Bounds, Key, LastGood, Rejection, load_dir_each};
use crate::config_store::{ConfigError, ConfigSet, Resource};

/// A source of config resources.
pub trait ConfigStore: Send + Sync {
    /// Every resource, as one consistent view; an error leaves the caller's last good config.
    fn list(&self) -> Result<Vec<Resource>, ConfigError>;

    /// What the last `list` refused (each document on its own), and whether its last good
    /// version stayed in its place.
    fn rejected(&self) -> Vec<Rejection> {
        Vec::new()
    }

    /// Bumped on every change of what the source lists (the files' watch, the in-memory store,
    /// the Kubernetes watches); `None` for a source that never changes. A source that watches
    /// something starts watching on the first call, which must come from inside a Tokio runtime.
    fn changes(&self) -> Option<watch::Receiver<u64>> {
        None
    }

    /// Where its resources come from, as /debug/configz shows it.
    fn origin(&self) -> String;

    /// The resources of one kind (`ServiceEntry`, `Sidecar`, ...).
    fn list_kind(&self, kind: &str) -> Result<Vec<Resource>, ConfigError> {
        Ok(self
            .list()?
            .into_iter()
            .filter(|r| r.kind() == kind)
            .collect())
    }

    /// One resource by kind, namespace and name.
    fn get(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Resource>, ConfigError> {
        Ok(self.list()?.into_iter().find(|r| {
            r.kind() == kind && r.metadata().namespace() == namespace && r.metadata().name == name
        }))
    }
}

/// How often watched files are looked at besides inotify's events (filesystems without inotify,
/// replaced mounts).
const POLL: Duration = Duration::from_secs(2);

/// Reads taken again at most when the files change while they are read.
const READ_TRIES: usize = 5;

/// Files a source watches: inotify events on their directories and a poll every [`POLL`], the
/// counter bumped only when their names, sizes or mtimes changed (a touch, or the CA's writes in
/// a subdirectory, are not config events). Started on the first subscription.
struct FileChanges {
    watched: Vec<Watched>,
    counter: OnceLock<watch::Receiver<u64>>,
}

impl FileChanges {
    fn new(watched: Vec<Watched>) -> FileChanges {
        FileChanges {
            watched,
            counter: OnceLock::new(),
        }
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.counter
            .get_or_init(|| watch_files(self.watched.clone()))
            .clone()
    }

    /// Reads with `read` until the files look the same before and after (an editor or `cp`
    /// truncates first: a file rewritten during the read may have been read half-written).
    fn consistent<T>(&self, mut read: impl FnMut() -> T) -> T {
        let mut tries = 0;
        loop {
            let before = Fingerprint::of(&self.watched);
            let out = read();
            tries += 1;
            if tries == READ_TRIES || Fingerprint::of(&self.watched) == before {
                return out;
            }
            tracing::debug!("config files changed while being read; reading again");
        }
    }
}

/// The watch of `watched`: a task that bumps the counter on each change and ends when no one
/// holds the counter any more.
fn watch_files(watched: Vec<Watched>) -> watch::Receiver<u64> {
    watch_files_counting(watched, Arc::default())
}

/// `watch_files`, counting in `wakeups` each time the task looked at the files.
fn watch_files_counting(
    watched: Vec<Watched>,
    wakeups: Arc<std::sync::atomic::AtomicU64>,
) -> watch::Receiver<u64> {
    let (tx, rx) = watch::channel(0u64);
    let (events_tx, mut events) = tokio::sync::mpsc::channel::<()>(1);
    // Only changes count: reading the directory (our own poll below) raises open/access events
    // on it, which would otherwise wake the loop again and again.
    let mut inotify = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = &ev
            && matches!(ev.kind, notify::EventKind::Access(_))
        {
            return;
        }
        let _ = events_tx.try_send(());
    })
    .ok();
    for w in &watched {
        let dir = match w {
            Watched::Dir(d) => Some(d.clone()),
            Watched::File(f) => f.parent().map(|p| p.to_path_buf()),
        };
        if let (Some(watcher), Some(dir)) = (inotify.as_mut(), dir)
            && let Err(e) =
                notify::Watcher::watch(watcher, &dir, notify::RecursiveMode::NonRecursive)
        {
            tracing::warn!(error = %e, dir = %dir.display(), "no inotify watch; polling only");
        }
    }
    tokio::spawn(async move {
        let _inotify = inotify;
        let mut files = FileWatch::new(watched);
        let mut inotify_open = true;
        loop {
            tokio::select! {
                // A closed channel (no watcher) is ready at once: polling only, then.
                ev = events.recv(), if inotify_open => inotify_open = ev.is_some(),
                _ = tokio::time::sleep(POLL) => {}
                _ = tx.closed() => return,
            }
            wakeups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Some(now) = files.check() {
                files.mark_seen(now);
                tx.send_modify(|n| *n += 1);
            }
        }
    });
    rx
}

/// The directory of YAML/JSON files, watched (`changes`), read document by document: what is
/// refused keeps its last good version from the previous read (`config_store::dir`).
pub struct FileStore {
    dir: PathBuf,
    bounds: Bounds,
    last: Mutex<(LastGood, Vec<Rejection>)>,
    changes: FileChanges,
}

impl FileStore {
    pub fn new(dir: PathBuf) -> FileStore {
        Self::with_bounds(dir, Bounds::default())
    }

    pub fn with_bounds(dir: PathBuf, bounds: Bounds) -> FileStore {
        FileStore {
            changes: FileChanges::new(vec![Watched::Dir(dir.clone())]),
            dir,
            bounds,
            last: Mutex::default(),
        }
    }
}

impl ConfigStore for FileStore {
    fn list(&self) -> Result<Vec<Resource>, ConfigError> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let load = self
            .changes
            .consistent(|| load_dir_each(&self.dir, &last.0, &self.bounds))?;
        *last = (load.last_good, load.rejected);
        Ok(load.resources)
    }

    fn rejected(&self) -> Vec<Rejection> {
        self.last.lock().map(|l| l.1.clone()).unwrap_or_default()
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.changes.subscribe())
    }

    fn origin(&self) -> String {
        format!("file:{}", self.dir.display())
    }
}

/// A mesh config file (plain MeshConfig YAML, istiod's `--meshConfig`), as one MeshConfig,
/// watched (`changes`).
pub struct MeshConfigFile {
    path: PathBuf,
    changes: FileChanges,
}

impl MeshConfigFile {
    pub fn new(path: PathBuf) -> MeshConfigFile {
        MeshConfigFile {
            changes: FileChanges::new(vec![Watched::File(path.clone())]),
            path,
        }
    }

    /// The file's MeshConfig, read and checked now.
    pub fn read(&self) -> Result<crate::config_store::MeshConfigSpec, ConfigError> {
        let text = self
            .changes
            .consistent(|| std::fs::read_to_string(&self.path))
            .map_err(|source| ConfigError::ReadFile {
                file: self.path.clone(),
                source,
            })?;
        crate::config_store::parse_mesh_config(&self.path, &text)
    }
}

impl ConfigStore for MeshConfigFile {
    fn list(&self) -> Result<Vec<Resource>, ConfigError> {
        let spec = self.read()?;
        Ok(vec![Resource::MeshConfig(
            crate::config_store::Metadata {
                name: "mesh-config-file".to_string(),
                namespace: None,
                labels: Default::default(),
                warnings: Vec::new(),
                ..Default::default()
            },
            Box::new(spec),
        )])
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.changes.subscribe())
    }

    fn origin(&self) -> String {
        format!("mesh-config:{}", self.path.display())
    }
}

/// Resources held in memory. Every change bumps `changes`, which the control plane watches.
#[derive(Default)]
pub struct MemoryStore {
    resources: RwLock<Vec<Resource>>,
    changes: watch::Sender<u64>,
}

impl MemoryStore {
    pub fn new() -> Arc<MemoryStore> {
        Arc::new(MemoryStore::default())
    }

    /// Adds `resource`, or replaces the one with its kind, namespace and name.
    pub fn apply(&self, resource: Resource) {
        if let Ok(mut all) = self.resources.write() {
            let key = |r: &Resource| {
                (
                    r.kind(),
                    r.metadata().namespace().to_string(),
                    r.metadata().name.clone(),
                )
            };
            let k = key(&resource);
            match all.iter_mut().find(|r| key(r) == k) {
                Some(slot) => *slot = resource,
                None => all.push(resource),
            }
        }
        self.changes.send_modify(|n| *n += 1);
    }

    /// Removes a resource; true if there was one.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> bool {
        let removed = self.resources.write().is_ok_and(|mut all| {
            let before = all.len();
            all.retain(|r| {
                !(r.kind() == kind
                    && r.metadata().namespace() == namespace
                    && r.metadata().name == name)
            });
            all.len() != before
        });
        if removed {
            self.changes.send_modify(|n| *n += 1);
        }
        removed
    }

    /// Notified on every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

impl ConfigStore for MemoryStore {
    fn list(&self) -> Result<Vec<Resource>, ConfigError> {
        Ok(self.resources.read().map(|r| r.clone()).unwrap_or_default())
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.subscribe())
    }

    fn origin(&self) -> String {
        "memory".into()
    }
}

/// All sources as one, in order. An error from any source fails the whole listing, so a broken
/// source can never make resources disappear from the mesh.
#[derive(Default)]
pub struct AggregateStore {
    pub sources: Vec<Arc<dyn ConfigStore>>,
    /// Which source each resource of the last listing came from (/debug/configz).
    origins: Mutex<std::collections::HashMap<Key, usize>>,
}

impl AggregateStore {
    pub fn new(sources: Vec<Arc<dyn ConfigStore>>) -> AggregateStore {
        AggregateStore {
            sources,
            origins: Mutex::default(),
        }
    }

    /// The source (its `origin`) a resource of the last listing came from.
    pub fn origin_of(&self, r: &Resource) -> Option<String> {
        let at = *self.origins.lock().ok()?.get(&Key::of(r))?;
        Some(self.sources.get(at)?.origin())
    }
}

impl ConfigStore for AggregateStore {
    fn list(&self) -> Result<Vec<Resource>, ConfigError> {
        let mut out = Vec::new();
        let mut origins = std::collections::HashMap::new();
        for (i, source) in self.sources.iter().enumerate() {
            let listed = source.list()?;
            origins.extend(listed.iter().map(|r| (Key::of(r), i)));
            out.extend(listed);
        }
        if let Ok(mut o) = self.origins.lock() {
            *o = origins;
        }
        Ok(out)
    }

    fn origin(&self) -> String {
        let all: Vec<String> = self.sources.iter().map(|s| s.origin()).collect();
        all.join(", ")
    }

    fn rejected(&self) -> Vec<Rejection> {
        self.sources.iter().flat_map(|s| s.rejected()).collect()
    }
}

/// Everything a store lists, as the registry and snapshot take it.
pub fn config_set(store: &dyn ConfigStore) -> Result<ConfigSet, ConfigError> {
    Ok(ConfigSet {
        resources: store.list()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_store::parse_file;
    use std::path::Path;

    fn one(yaml: &str) -> Resource {
        parse_file(Path::new("mem.yaml"), yaml)
            .unwrap()
            .into_iter()
            .next()
            .unwrap()
    }

    /// Looking at the directory raises inotify open/access events on it; they must not wake the
    /// watch again (an idle config directory once kept the agent at 100% CPU). A change still
    /// bumps the counter at once, well before the 2 s poll.
    #[tokio::test]
    async fn an_idle_directory_keeps_the_watch_asleep_and_a_change_wakes_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), "a").unwrap();
        let wakeups = Arc::<std::sync::atomic::AtomicU64>::default();
        let mut rx = watch_files_counting(
            vec![Watched::Dir(dir.path().to_path_buf())],
            wakeups.clone(),
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let idle = wakeups.load(std::sync::atomic::Ordering::Relaxed);
        assert!(idle <= 2, "{idle} wakeups in 1.5 s with nothing changing");
        std::fs::write(dir.path().join("b.yaml"), "b").unwrap();
        tokio::time::timeout(Duration::from_millis(1500), rx.changed())
            .await
            .expect("a new file is seen before the poll")
            .unwrap();
    }

    #[test]
    fn memory_and_files_aggregate() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.yaml"),
            "kind: ServiceEntry\nmetadata: {name: web, namespace: shop}\nspec: {hosts: [web.example]}\n",
        )
        .unwrap();
        let mem = MemoryStore::new();
        let mut changes = mem.subscribe();
        let agg = AggregateStore::new(vec![
            Arc::new(FileStore::new(dir.path().to_path_buf())),
            mem.clone(),
        ]);
        assert_eq!(agg.list().unwrap().len(), 1);
        mem.apply(one(
            "kind: WorkloadEntry\nmetadata: {name: w, namespace: shop}\nspec: {address: 10.0.0.1}\n",
        ));
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        mem.apply(one(
            "kind: WorkloadEntry\nmetadata: {name: w, namespace: shop}\nspec: {address: 10.0.0.2}\n",
        ));
        assert_eq!(
            agg.list_kind("WorkloadEntry").unwrap().len(),
            1,
            "replaced, not added"
        );
        assert!(agg.get("ServiceEntry", "shop", "web").unwrap().is_some());
        assert!(mem.delete("WorkloadEntry", "shop", "w"));
        assert!(!mem.delete("WorkloadEntry", "shop", "w"));
        assert_eq!(agg.list().unwrap().len(), 1);
        // A broken file is refused on its own; the rest is listed.
        std::fs::write(dir.path().join("b.yaml"), "kind: [").unwrap();
        assert_eq!(agg.list().unwrap().len(), 1);
        let rejected = agg.rejected();
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert!(rejected[0].file.as_ref().unwrap().ends_with("b.yaml"));
        // A directory that cannot be listed fails the listing: the caller keeps its config.
        std::fs::remove_dir_all(dir.path()).unwrap();
        assert!(agg.list().is_err());
    }
}
