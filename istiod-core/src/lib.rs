//! istiod-core: a control plane following istiod's architecture.
//!
//! Data flows one way: config (`config_store`) → services (`registry`) → an immutable snapshot
//! (`push_context`) → per-proxy resources (`generators`) → streams (`xds_server`).
//! [`ControlPlane`] owns the snapshot and publishes each new one to every stream.

pub mod ca;
pub mod ca_server;
pub mod config_store;
pub mod generators;
pub mod model;
pub mod push_context;
pub mod registry;
pub mod xds_server;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use config_store::ConfigError;
use push_context::PushContext;
use registry::RegistryError;

pub const DEFAULT_DOMAIN_SUFFIX: &str = "cluster.local";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// The control plane: the current snapshot and the means to replace it.
pub struct ControlPlane {
    config_dir: PathBuf,
    domain_suffix: String,
    tx: watch::Sender<Arc<PushContext>>,
    generation: std::sync::atomic::AtomicU64,
}

fn build(dir: &Path, domain: &str, generation: u64) -> Result<PushContext, Error> {
    let set = config_store::load_dir(dir)?;
    let version = format!(
        "{}.{generation}",
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default()
    );
    Ok(PushContext::build(&set, domain, version)?)
}

impl ControlPlane {
    /// Loads `config_dir`; fails if it does not load, so a bad start is loud.
    pub fn load(config_dir: &Path, domain_suffix: &str) -> Result<Arc<ControlPlane>, Error> {
        let push = build(config_dir, domain_suffix, 1)?;
        tracing::info!(dir = %config_dir.display(), services = push.services.len(), "config loaded");
        let (tx, _) = watch::channel(Arc::new(push));
        Ok(Arc::new(ControlPlane {
            config_dir: config_dir.to_path_buf(),
            domain_suffix: domain_suffix.to_string(),
            tx,
            generation: 1.into(),
        }))
    }

    /// Re-reads the directory. On error the last good snapshot stays in force.
    pub fn reload(&self) -> Result<(), Error> {
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let push = build(&self.config_dir, &self.domain_suffix, generation)?;
        if !push.same_content(&self.tx.borrow()) {
            tracing::info!(version = %push.version, services = push.services.len(), "config changed; pushing");
            self.tx.send_replace(Arc::new(push));
        }
        Ok(())
    }

    pub fn snapshot(&self) -> Arc<PushContext> {
        self.tx.borrow().clone()
    }

    pub fn xds(&self) -> xds_server::XdsServer {
        xds_server::XdsServer::new(self.tx.subscribe())
    }

    /// Watches the config directory (by polling file names, sizes and mtimes every `interval`)
    /// and reloads on change. Runs until the process ends.
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        let mut last = fingerprint(&self.config_dir);
        loop {
            tokio::time::sleep(interval).await;
            let now = fingerprint(&self.config_dir);
            if now != last {
                last = now;
                if let Err(e) = self.reload() {
                    tracing::error!(error = %e, "config rejected; keeping the last good config");
                }
            }
        }
    }
}

fn fingerprint(dir: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((e.path(), meta.len(), meta.modified().ok()))
        })
        .collect();
    out.sort();
    out
}
