//! The test kubelet: binds the Pods that name no node (no scheduler runs), and runs each Pod
//! bound to its Node as a network namespace on the node's bridge, doing with the spec as stored
//! what a kubelet does: volumes (`volumes`), init containers in order (a failing one
//! fails the pod; `restartPolicy: Always` ones are native sidecars, started and waited for),
//! then the containers, as their users with their capabilities; probes as the kubelet sends
//! them; status written back; deletion with the grace period (preStop, SIGTERM, SIGKILL).
//!
//! Names: each pod's `/etc/hosts` (bind-mounted by `ip netns exec`) maps every Service to its
//! ClusterIP, as cluster DNS would, and the Services of components on the node's host network
//! (istiod) to the node. No kube-proxy runs: ClusterIPs work through sidecars only.
//!
//! Whatever a spec asks that this kubelet cannot do is an error naming the field (the pod fails
//! with it as its status message); what it accepts but cannot enforce (resource limits, a
//! read-only root filesystem) is said in a Warning Event on the pod.

mod containers;
mod lifecycle;
mod pod;
mod probes;
mod sandbox;
mod spec;
mod status;
pub mod streaming;
pub mod volumes;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::images;
use crate::node::{KUBELET_PORT, NODE_IP, NODE_NAME, now_rfc3339};
use lifecycle::*;
use pod::*;
use sandbox::refresh_hosts;

pub use crate::http::{http_get_text, http_probe};

/// Locks `m`; a panic elsewhere while it was held does not stop the kubelet.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct PodEntry {
    tx: watch::Sender<Pod>,
    run: Arc<PodRun>,
    task: JoinHandle<()>,
}

struct Inner {
    client: kube::Client,
    root: PathBuf,
    id: String,
    log: Mutex<fs::File>,
    pods: Mutex<HashMap<String, PodEntry>>,
    ips: Mutex<BTreeSet<u8>>,
    services: Mutex<Vec<Service>>,
    host_network: Mutex<HashSet<(String, String)>>,
    next_link: AtomicU32,
}

impl Inner {
    fn say(&self, msg: &str) {
        let mut f = lock(&self.log);
        let _ = writeln!(f, "{} {msg}", now_rfc3339());
    }
}

/// The test kubelet of node `NODE_NAME`.
pub struct Kubelet {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

impl Kubelet {
    /// Starts watching Pods and Services; pods run under `dir/pods`, the log is
    /// `dir/logs/kubelet.log`, namespaces are named `ID-p<N>`.
    pub fn start(
        rt: &tokio::runtime::Handle,
        client: kube::Client,
        dir: &Path,
        id: &str,
    ) -> Result<Kubelet> {
        let root = dir.join("pods");
        fs::create_dir_all(&root)?;
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755))?;
        let inner = Arc::new(Inner {
            client,
            root,
            id: id.to_string(),
            log: Mutex::new(fs::File::create(dir.join("logs/kubelet.log"))?),
            pods: Mutex::new(HashMap::new()),
            ips: Mutex::new(BTreeSet::new()),
            services: Mutex::new(Vec::new()),
            host_network: Mutex::new(HashSet::new()),
            next_link: AtomicU32::new(0),
        });
        let pods = rt.spawn(watch_pods(inner.clone()));
        let services = rt.spawn(watch_services(inner.clone()));
        // The server the API server proxies exec and logs to (the Node's daemonEndpoints).
        let tls =
            streaming::tls_config(&dir.join("pki/kubelet.crt"), &dir.join("pki/kubelet.key"))?;
        let listener = {
            let _guard = rt.enter();
            let std = std::net::TcpListener::bind((NODE_IP, KUBELET_PORT)).with_context(|| {
                format!("bind the kubelet's server on {NODE_IP}:{KUBELET_PORT}")
            })?;
            std.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(std)?
        };
        let lookup_inner = inner.clone();
        let lookup: streaming::Lookup = Arc::new(move |ns: &str, name: &str| {
            let pods = lock(&lookup_inner.pods);
            pods.values()
                .map(|p| p.run.clone())
                .find(|p| p.namespace == ns && p.name == name && !p.stopping.load(Ordering::SeqCst))
        });
        let server = rt.spawn(streaming::serve(listener, tls, lookup));
        Ok(Kubelet {
            inner,
            tasks: vec![pods, services, server],
        })
    }

    /// Declares that Service `namespace/name` is served on the node's host network (istiod):
    /// pods resolve its names to the node's address.
    pub fn host_network_service(&self, namespace: &str, name: &str) {
        lock(&self.inner.host_network).insert((namespace.to_string(), name.to_string()));
        refresh_hosts(&self.inner);
    }

    /// Takes an address of the pod range for a machine this kubelet does not run (a VM on the
    /// node's network): no pod gets it while the kubelet lives.
    pub fn reserve_address(&self) -> Result<String> {
        let mut ips = lock(&self.inner.ips);
        let n = (2u8..=254)
            .rev()
            .find(|n| !ips.contains(n))
            .context("no address left in 10.244.0.0/24")?;
        ips.insert(n);
        Ok(format!("10.244.0.{n}"))
    }

    /// The running pods (not yet torn down).
    pub fn pods(&self) -> Vec<Arc<PodRun>> {
        let pods = lock(&self.inner.pods);
        pods.values().map(|p| p.run.clone()).collect()
    }

    /// The running pod `namespace/name`.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<PodRun>> {
        self.pods().into_iter().find(|p| {
            p.namespace == namespace && p.name == name && !p.stopping.load(Ordering::SeqCst)
        })
    }

    /// Runs `args` in container `container` of pod `namespace/name` (see [`PodRun::exec`]).
    pub fn exec(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
        args: &[&str],
    ) -> Result<Output> {
        self.pod(namespace, name)
            .with_context(|| format!("no running pod {namespace}/{name}"))?
            .exec(container, args)
    }

    /// The kubelet's log.
    pub fn log(&self) -> String {
        fs::read_to_string(
            self.inner
                .root
                .parent()
                .unwrap_or(Path::new("/"))
                .join("logs/kubelet.log"),
        )
        .unwrap_or_default()
    }

    /// Stops watching and kills every pod (the cluster is going away).
    pub fn shutdown(&mut self, rt: &tokio::runtime::Runtime) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        let entries: Vec<PodEntry> = {
            let mut pods = lock(&self.inner.pods);
            pods.drain().map(|(_, e)| e).collect()
        };
        for e in entries {
            e.run.stopping.store(true, Ordering::SeqCst);
            e.task.abort();
            let _ =
                rt.block_on(async { tokio::time::timeout(Duration::from_secs(2), e.task).await });
            teardown(&self.inner, &e.run);
        }
    }
}

async fn watch_pods(inner: Arc<Inner>) {
    let api: Api<Pod> = Api::all(inner.client.clone());
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(pod)) | Ok(watcher::Event::InitApply(pod)) => {
                if let Err(e) = on_pod(&inner, pod).await {
                    inner.say(&format!("pod event: {e:#}"));
                }
            }
            Ok(watcher::Event::Delete(pod)) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let pods = lock(&inner.pods);
                if let Some(e) = pods.get(&uid) {
                    // The object is gone (deleted with no grace): stop now.
                    let mut p = pod.clone();
                    if p.metadata.deletion_timestamp.is_none() {
                        p.metadata.deletion_timestamp =
                            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                                k8s_openapi::jiff::Timestamp::now(),
                            ));
                    }
                    e.run.stopping.store(true, Ordering::SeqCst);
                    let _ = e.tx.send(p);
                }
            }
            Ok(_) => {}
            Err(e) => {
                inner.say(&format!("pod watch: {e}"));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn watch_services(inner: Arc<Inner>) {
    let api: Api<Service> = Api::all(inner.client.clone());
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    let mut all: HashMap<String, Service> = HashMap::new();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(s)) | Ok(watcher::Event::InitApply(s)) => {
                all.insert(s.metadata.uid.clone().unwrap_or_default(), s);
            }
            Ok(watcher::Event::Delete(s)) => {
                all.remove(&s.metadata.uid.clone().unwrap_or_default());
            }
            Ok(watcher::Event::Init) => all.clear(),
            Ok(watcher::Event::InitDone) => {}
            Err(e) => {
                inner.say(&format!("service watch: {e}"));
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        *lock(&inner.services) = all.values().cloned().collect();
        refresh_hosts(&inner);
    }
}

async fn on_pod(inner: &Arc<Inner>, pod: Pod) -> Result<()> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = volumes::namespace(&pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let deleting = pod.metadata.deletion_timestamp.is_some();
    if node.is_none() {
        if !deleting {
            bind(inner, &ns, &name).await?;
        }
        return Ok(());
    }
    if node.as_deref() != Some(NODE_NAME) {
        return Ok(());
    }
    let terminal = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    let known = {
        let pods = lock(&inner.pods);
        match pods.get(&uid) {
            Some(e) => {
                let _ = e.tx.send(pod.clone());
                true
            }
            None => false,
        }
    };
    if known {
        return Ok(());
    }
    if deleting {
        // Never started here (or started by an earlier kubelet): nothing to stop.
        delete_now(inner, &ns, &name, &uid).await;
        return Ok(());
    }
    if terminal {
        return Ok(());
    }
    let run = Arc::new(new_run(inner, &pod)?);
    let (tx, rx) = watch::channel(pod);
    let task = tokio::spawn(run_pod(inner.clone(), run.clone(), rx));
    lock(&inner.pods).insert(uid, PodEntry { tx, run, task });
    Ok(())
}

async fn bind(inner: &Inner, ns: &str, name: &str) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), ns);
    let binding = serde_json::json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
    });
    match api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            name,
            &PostParams::default(),
            &binding,
        )
        .await
    {
        Ok(_) => {
            inner.say(&format!("bound {ns}/{name} to {NODE_NAME}"));
            Ok(())
        }
        // Bound already (a second event for the same pod).
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("bind {ns}/{name}")),
    }
}
