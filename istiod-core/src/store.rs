//! Config sources behind one interface (istiod's `model.ConfigStore` and its aggregate): the
//! watched directory (`FileStore`), an in-memory store that tests and embedders write to
//! (`MemoryStore`), and `AggregateStore`, which lists them all as one. The control plane reads
//! only through `ConfigStore`, so a source never needs to know about snapshots or pushes.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

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

    /// Bumped on every change, for a source that says when it changed (the in-memory store, the
    /// Kubernetes watches); `None` for one the control plane watches itself (files).
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

/// The directory of YAML/JSON files (watched by the control plane), read document by document:
/// what is refused keeps its last good version from the previous read (`config_store::dir`).
pub struct FileStore {
    dir: PathBuf,
    bounds: Bounds,
    last: Mutex<(LastGood, Vec<Rejection>)>,
}

impl FileStore {
    pub fn new(dir: PathBuf) -> FileStore {
        Self::with_bounds(dir, Bounds::default())
    }

    pub fn with_bounds(dir: PathBuf, bounds: Bounds) -> FileStore {
        FileStore {
            dir,
            bounds,
            last: Mutex::default(),
        }
    }
}

impl ConfigStore for FileStore {
    fn list(&self) -> Result<Vec<Resource>, ConfigError> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let load = load_dir_each(&self.dir, &last.0, &self.bounds)?;
        *last = (load.last_good, load.rejected);
        Ok(load.resources)
    }

    fn rejected(&self) -> Vec<Rejection> {
        self.last.lock().map(|l| l.1.clone()).unwrap_or_default()
    }

    fn origin(&self) -> String {
        format!("file:{}", self.dir.display())
    }
}

/// A mesh config file (plain MeshConfig YAML, istiod's `--meshConfig`), as one MeshConfig.
pub struct MeshConfigFile {
    pub path: PathBuf,
}

impl MeshConfigFile {
    /// The file's MeshConfig, read and checked now.
    pub fn read(&self) -> Result<crate::config_store::MeshConfigSpec, ConfigError> {
        let text = std::fs::read_to_string(&self.path).map_err(|source| ConfigError::ReadFile {
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
