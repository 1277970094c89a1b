//! The test kubelet: binds the Pods that name no node (no scheduler runs), and runs each Pod
//! bound to its Node as a network namespace on the node's bridge, doing with the spec as stored
//! what a kubelet does: volumes (`crate::volumes`), init containers in order (a failing one
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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Event, ObjectReference, Pod, Probe, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::cluster::{KUBELET_PORT, NODE_IP, NODE_NAME, now_rfc3339};
use crate::images;
use crate::streaming;
use crate::volumes;

/// Locks `m`; a panic elsewhere while it was held does not stop the kubelet.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The PATH of every container (the node's tools are the images' filesystems).
const CONTAINER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What a running container is, for status and for `exec`.
#[derive(Debug, Clone)]
pub struct ContainerState {
    pub name: String,
    pub image: String,
    /// An init container (`restartPolicy: Always` ones are native sidecars).
    pub init: bool,
    pub sidecar: bool,
    pub pid: Option<i32>,
    pub started: bool,
    pub ready: bool,
    pub restart_count: i32,
    pub state: serde_json::Value,
    pub uid: u32,
    pub gid: u32,
    /// How `setpriv` makes a process this container's: user, groups, capabilities.
    pub setpriv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub log: PathBuf,
    /// Volumes bound at their mount paths in the container's own mount namespace (volume
    /// directory, mount path), for images whose programs read mounts at absolute paths.
    pub binds: Vec<(PathBuf, String)>,
    /// The container's PATH.
    pub path: String,
}

/// A pod this kubelet runs.
pub struct PodRun {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The pod's network namespace.
    pub netns: String,
    /// The containers' host name: `spec.hostname`, else the pod's name (63 characters at most).
    pub hostname: String,
    pub ip: String,
    /// The containers' working directory; mount paths are paths under it.
    pub dir: PathBuf,
    pub containers: Mutex<Vec<ContainerState>>,
    phase: Mutex<(String, Option<String>)>,
    stopping: AtomicBool,
    changed: Notify,
    initialized: AtomicBool,
}

impl PodRun {
    fn with<R>(&self, name: &str, f: impl FnOnce(&mut ContainerState) -> R) -> Option<R> {
        let mut cs = lock(&self.containers);
        cs.iter_mut().find(|c| c.name == name).map(f)
    }

    pub fn container(&self, name: &str) -> Option<ContainerState> {
        self.with(name, |c| c.clone())
    }

    fn set_phase(&self, phase: &str, message: Option<String>) {
        *lock(&self.phase) = (phase.to_string(), message);
        self.changed.notify_one();
    }

    /// Runs `args` in container `container` as its user, with its env, in its working directory
    /// (what `kubectl exec` does), and waits for it.
    pub fn exec(&self, container: &str, args: &[&str]) -> Result<Output> {
        Ok(self.command(container, args)?.output()?)
    }

    /// The command that runs `args` in container `container` as [`PodRun::exec`] does, for the
    /// caller to wire and spawn (the streaming server's exec).
    pub fn command(&self, container: &str, args: &[&str]) -> Result<Command> {
        let c = self.container(container).with_context(|| {
            format!(
                "pod {}/{} has no container {container}",
                self.namespace, self.name
            )
        })?;
        let argv: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Ok(container_command(self, &c, &argv))
    }

    /// The log of container `name` (all its runs).
    pub fn logs(&self, name: &str) -> String {
        self.container(name)
            .map(|c| fs::read_to_string(c.log).unwrap_or_default())
            .unwrap_or_default()
    }
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

fn new_run(inner: &Inner, pod: &Pod) -> Result<PodRun> {
    let ip = {
        let mut ips = lock(&inner.ips);
        let n = (2u8..=254)
            .find(|n| !ips.contains(n))
            .context("no pod address left in 10.244.0.0/24")?;
        ips.insert(n);
        n
    };
    let namespace = volumes::namespace(pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let dir = inner.root.join(format!("{namespace}_{name}"));
    let hostname = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .unwrap_or_else(|| name.chars().take(63).collect::<String>())
        .trim_end_matches(['-', '.'])
        .to_string();
    Ok(PodRun {
        netns: format!("{}-p{ip}", inner.id),
        hostname,
        ip: format!("10.244.0.{ip}"),
        dir,
        namespace,
        name,
        uid,
        containers: Mutex::new(Vec::new()),
        phase: Mutex::new(("Pending".into(), None)),
        stopping: AtomicBool::new(false),
        changed: Notify::new(),
        initialized: AtomicBool::new(false),
    })
}

async fn run_pod(inner: Arc<Inner>, run: Arc<PodRun>, mut rx: watch::Receiver<Pod>) {
    let pod = rx.borrow().clone();
    let status_task = tokio::spawn(write_status(inner.clone(), run.clone()));
    inner.say(&format!(
        "starting {}/{} at {}",
        run.namespace, run.name, run.ip
    ));
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    if let Err(e) = start_pod(&inner, &run, &pod, &mut tasks).await {
        let msg = format!("{e:#}");
        inner.say(&format!("pod {}/{} failed: {msg}", run.namespace, run.name));
        run.set_phase("Failed", Some(msg));
    }
    loop {
        if rx.borrow().metadata.deletion_timestamp.is_some() {
            break;
        }
        if rx.changed().await.is_err() {
            break;
        }
    }
    let pod = rx.borrow().clone();
    let grace = pod
        .metadata
        .deletion_grace_period_seconds
        .or(pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(30);
    inner.say(&format!(
        "stopping {}/{} (grace {grace} s)",
        run.namespace, run.name
    ));
    terminate(
        &inner,
        &run,
        &pod,
        Duration::from_secs(u64::try_from(grace).unwrap_or(0)),
    )
    .await;
    for t in tasks {
        t.abort();
    }
    status_task.abort();
    teardown(&inner, &run);
    delete_now(&inner, &run.namespace, &run.name, &run.uid).await;
    lock(&inner.pods).remove(&run.uid);
    inner.say(&format!("removed {}/{}", run.namespace, run.name));
}

/// Everything before the containers run: the checks, the sandbox, the volumes; then the init
/// containers in order and the containers.
async fn start_pod(
    inner: &Arc<Inner>,
    run: &Arc<PodRun>,
    pod: &Pod,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<()> {
    let spec = pod.spec.as_ref().context("pod without spec")?;
    let mut not_enforced = check_spec(pod)?;
    sandbox(inner, run, pod).await?;
    // The pod as the containers see it: its address is known from here on.
    let mut pod = pod.clone();
    let status = pod.status.get_or_insert_with(Default::default);
    status.pod_ip = Some(run.ip.clone());
    status.pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP {
        ip: run.ip.clone(),
    }]);
    status.host_ip = Some(NODE_IP.into());
    status.host_ips = Some(vec![k8s_openapi::api::core::v1::HostIP {
        ip: NODE_IP.into(),
    }]);
    run.changed.notify_one();

    let tokens = volumes::materialize(&inner.client, &pod, &run.dir).await?;
    if !tokens.is_empty() {
        tasks.push(tokio::spawn(refresh_tokens(
            inner.clone(),
            pod.clone(),
            tokens,
        )));
    }
    let mut mounts = HashMap::new();
    let inits: Vec<(usize, &Container)> =
        spec.init_containers.iter().flatten().enumerate().collect();
    for (i, c) in &inits {
        volumes::mount(
            c,
            &run.dir,
            &format!("spec.initContainers[{i}]"),
            &mut mounts,
        )?;
    }
    for (i, c) in spec.containers.iter().enumerate() {
        volumes::mount(c, &run.dir, &format!("spec.containers[{i}]"), &mut mounts)?;
    }
    // Every container's state, before any runs (status lists them all).
    let mut prepared = Vec::new();
    for (i, c) in &inits {
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        prepared.push(
            prepare(
                inner,
                run,
                &pod,
                c,
                &format!("spec.initContainers[{i}]"),
                true,
                sidecar,
            )
            .await?,
        );
    }
    for (i, c) in spec.containers.iter().enumerate() {
        prepared.push(
            prepare(
                inner,
                run,
                &pod,
                c,
                &format!("spec.containers[{i}]"),
                false,
                false,
            )
            .await?,
        );
    }
    {
        let mut cs = lock(&run.containers);
        *cs = prepared.iter().map(|p| p.state.clone()).collect();
    }
    not_enforced.sort();
    not_enforced.dedup();
    if !not_enforced.is_empty() {
        warn_event(
            inner,
            &pod,
            "NotEnforced",
            &format!(
                "the test kubelet accepts but does not enforce: {}",
                not_enforced.join(", ")
            ),
        )
        .await;
    }
    run.changed.notify_one();

    let restart_policy = spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".into());
    for p in prepared.iter().filter(|p| p.state.init) {
        if p.state.sidecar {
            tasks.push(tokio::spawn(supervise(
                inner.clone(),
                run.clone(),
                p.clone(),
                "Always".into(),
            )));
            tasks.push(tokio::spawn(probe(inner.clone(), run.clone(), p.clone())));
            post_start(inner, run, p).await?;
            // The next init container waits for this one's startup probe (or its start).
            while !run.with(&p.state.name, |c| c.started).unwrap_or(false) {
                if run.stopping.load(Ordering::SeqCst) {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } else {
            let code = run_to_completion(inner, run, p).await?;
            if code != 0 {
                bail!(
                    "init container {} exited with {code}: {}",
                    p.state.name,
                    cluster_tail(&p.state.log)
                );
            }
        }
    }
    run.initialized.store(true, Ordering::SeqCst);
    run.set_phase("Running", None);
    for p in prepared.iter().filter(|p| !p.state.init) {
        tasks.push(tokio::spawn(supervise(
            inner.clone(),
            run.clone(),
            p.clone(),
            restart_policy.clone(),
        )));
        tasks.push(tokio::spawn(probe(inner.clone(), run.clone(), p.clone())));
        post_start(inner, run, p).await?;
    }
    Ok(())
}

fn cluster_tail(log: &Path) -> String {
    harness::tail(&fs::read_to_string(log).unwrap_or_default(), 10)
}

/// Rejects what this kubelet cannot do (naming the field); returns what it accepts without
/// enforcing.
fn check_spec(pod: &Pod) -> Result<Vec<String>> {
    let spec = pod.spec.as_ref().context("pod without spec")?;
    let mut lax = Vec::new();
    if spec.host_network == Some(true) {
        bail!("spec.hostNetwork: host-network pods are not supported by this kubelet");
    }
    if spec.host_pid == Some(true) || spec.host_ipc == Some(true) {
        bail!("spec.hostPID/hostIPC: not supported by this kubelet");
    }
    if let Some(sc) = &spec.security_context {
        for (i, s) in sc.sysctls.iter().flatten().enumerate() {
            if !s.name.starts_with("net.") {
                bail!(
                    "spec.securityContext.sysctls[{i}] ({}): only net.* sysctls (per network namespace) are supported",
                    s.name
                );
            }
        }
        if sc.seccomp_profile.is_some() {
            lax.push("spec.securityContext.seccompProfile".to_string());
        }
    }
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("spec.containers[{i}]"), c)),
        );
    for (field, c) in all {
        images::resolve(c.image.as_deref().unwrap_or_default())
            .with_context(|| format!("{field}.image"))?;
        for (j, p) in c.ports.iter().flatten().enumerate() {
            if p.host_port.is_some_and(|h| h != 0) {
                bail!("{field}.ports[{j}].hostPort: not supported by this kubelet");
            }
        }
        if let Some(sc) = &c.security_context {
            if sc.read_only_root_filesystem == Some(true) {
                lax.push(format!("{field}.securityContext.readOnlyRootFilesystem"));
            }
            if sc.seccomp_profile.is_some() {
                lax.push(format!("{field}.securityContext.seccompProfile"));
            }
            if sc.se_linux_options.is_some()
                || sc.app_armor_profile.is_some()
                || sc.windows_options.is_some()
            {
                bail!(
                    "{field}.securityContext: seLinuxOptions, appArmorProfile and windowsOptions are not supported by this kubelet"
                );
            }
        }
        if c.resources
            .as_ref()
            .is_some_and(|r| r.limits.is_some() || r.requests.is_some())
        {
            lax.push(format!("{field}.resources"));
        }
        for (what, p) in [
            ("startupProbe", &c.startup_probe),
            ("readinessProbe", &c.readiness_probe),
            ("livenessProbe", &c.liveness_probe),
        ] {
            if let Some(p) = p {
                if p.grpc.is_some() {
                    bail!("{field}.{what}.grpc: not supported by this kubelet");
                }
                if p.http_get
                    .as_ref()
                    .is_some_and(|h| h.scheme.as_deref() == Some("HTTPS"))
                {
                    bail!(
                        "{field}.{what}.httpGet.scheme: HTTPS probes are not supported by this kubelet"
                    );
                }
            }
        }
        if let Some(l) = &c.lifecycle {
            for (what, h) in [("postStart", &l.post_start), ("preStop", &l.pre_stop)] {
                if let Some(h) = h
                    && h.exec.is_none()
                    && h.sleep.is_none()
                    && h.http_get.is_none()
                {
                    bail!(
                        "{field}.lifecycle.{what}: only exec, httpGet and sleep handlers are supported"
                    );
                }
            }
        }
    }
    Ok(lax)
}

/// The pod's network namespace: eth0 on the node's bridge with the pod's address, the default
/// route through the node, `/etc/hosts` and `resolv.conf`, the pod's sysctls.
async fn sandbox(inner: &Inner, run: &PodRun, pod: &Pod) -> Result<()> {
    fs::create_dir_all(&run.dir)?;
    fs::set_permissions(&run.dir, fs::Permissions::from_mode(0o755))?;
    let link = format!("vp{}", inner.next_link.fetch_add(1, Ordering::SeqCst));
    let ns = run.netns.as_str();
    let addr = format!("{}/24", run.ip);
    let etc = Path::new("/etc/netns").join(ns);
    fs::create_dir_all(&etc)?;
    fs::write(etc.join("hosts"), hosts_for(inner, run))?;
    fs::write(
        etc.join("resolv.conf"),
        format!(
            "search {}.svc.cluster.local svc.cluster.local cluster.local\nnameserver {NODE_IP}\noptions ndots:5\n",
            run.namespace
        ),
    )?;
    let steps: Vec<Vec<&str>> = vec![
        vec!["netns", "add", ns],
        vec![
            "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ],
        vec!["link", "set", &link, "master", "cbr0", "up"],
        vec!["-n", ns, "link", "set", "lo", "up"],
        vec!["-n", ns, "addr", "add", &addr, "dev", "eth0"],
        vec!["-n", ns, "link", "set", "eth0", "up"],
        vec!["-n", ns, "route", "add", "default", "via", NODE_IP],
    ];
    for s in steps {
        let out = tokio::process::Command::new("ip").args(&s).output().await?;
        if !out.status.success() {
            bail!(
                "sandbox: ip {}: {}",
                s.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let sysctls = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.sysctls.clone())
        .unwrap_or_default();
    for s in sysctls {
        let path = format!("/proc/sys/{}", s.name.replace('.', "/"));
        let out = tokio::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "sh",
                "-c",
                &format!("echo '{}' > {path}", s.value),
            ])
            .output()
            .await?;
        if !out.status.success() {
            bail!(
                "spec.securityContext.sysctls {}: {}",
                s.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

fn hosts_for(inner: &Inner, run: &PodRun) -> String {
    let mut out = format!(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{}\t{}\n",
        run.ip, run.name
    );
    let services = lock(&inner.services).clone();
    let host_network = lock(&inner.host_network).clone();
    for s in services {
        let name = s.metadata.name.clone().unwrap_or_default();
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        let ip = if host_network.contains(&(ns.clone(), name.clone())) {
            NODE_IP.to_string()
        } else {
            match s.spec.as_ref().and_then(|s| s.cluster_ip.clone()) {
                Some(ip) if ip != "None" && !ip.is_empty() => ip,
                _ => continue,
            }
        };
        let mut names = vec![
            format!("{name}.{ns}.svc.cluster.local"),
            format!("{name}.{ns}.svc"),
            format!("{name}.{ns}"),
        ];
        if ns == run.namespace {
            names.push(name.clone());
        }
        out.push_str(&format!("{ip}\t{}\n", names.join(" ")));
    }
    out
}

/// Rewrites every pod's hosts file in place (the bind mounts keep pointing at it).
fn refresh_hosts(inner: &Inner) {
    let runs: Vec<Arc<PodRun>> = {
        let pods = lock(&inner.pods);
        pods.values().map(|p| p.run.clone()).collect()
    };
    for run in runs {
        let path = Path::new("/etc/netns").join(&run.netns).join("hosts");
        if path.exists() {
            let _ = fs::write(&path, hosts_for(inner, &run));
        }
    }
}

/// A container ready to run: its state and command line.
#[derive(Clone)]
struct Prepared {
    state: ContainerState,
    argv: Vec<String>,
    spec: Container,
}

async fn prepare(
    inner: &Inner,
    run: &PodRun,
    pod: &Pod,
    c: &Container,
    field: &str,
    init: bool,
    sidecar: bool,
) -> Result<Prepared> {
    let image_ref = c.image.clone().unwrap_or_default();
    let image = images::resolve(&image_ref).with_context(|| format!("{field}.image"))?;
    let mut env = service_env(inner, &run.namespace);
    env.extend(volumes::container_env(&inner.client, pod, c, field).await?);
    env.push(("HOSTNAME".into(), run.name.clone()));
    let words: Vec<String> = match (&c.command, &c.args) {
        (Some(cmd), args) => cmd.iter().chain(args.iter().flatten()).cloned().collect(),
        (None, Some(args)) => image.entrypoint.iter().chain(args).cloned().collect(),
        (None, None) => image.entrypoint.iter().chain(&image.cmd).cloned().collect(),
    };
    let argv: Vec<String> = words.iter().map(|w| volumes::expand(w, &env)).collect();
    if argv.is_empty() {
        bail!("{field}: no command (neither the image nor the spec gives one)");
    }
    let pod_sc = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    let uid = sc
        .run_as_user
        .or(pod_sc.run_as_user)
        .map(|u| u as u32)
        .unwrap_or(image.uid);
    let gid = sc
        .run_as_group
        .or(pod_sc.run_as_group)
        .map(|g| g as u32)
        .unwrap_or(image.gid);
    if uid == 0
        && (sc.run_as_non_root == Some(true)
            || (sc.run_as_non_root.is_none() && pod_sc.run_as_non_root == Some(true)))
    {
        bail!("{field}.securityContext.runAsNonRoot: the container would run as root");
    }
    let mut setpriv = vec![
        "--reuid".to_string(),
        uid.to_string(),
        "--regid".to_string(),
        gid.to_string(),
    ];
    let groups: Vec<String> = pod_sc
        .supplemental_groups
        .iter()
        .flatten()
        .chain(pod_sc.fs_group.iter())
        .map(|g| g.to_string())
        .collect();
    if groups.is_empty() {
        setpriv.push("--clear-groups".into());
    } else {
        setpriv.extend(["--groups".to_string(), groups.join(",")]);
    }
    if sc.allow_privilege_escalation == Some(false) {
        setpriv.push("--no-new-privs".into());
    }
    let caps = sc.capabilities.clone().unwrap_or_default();
    let drop_all = caps.drop.iter().flatten().any(|d| d == "ALL");
    let add: Vec<String> = caps
        .add
        .iter()
        .flatten()
        .map(|a| format!("+{}", a.to_lowercase().trim_start_matches("cap_")))
        .collect();
    if sc.privileged == Some(true) {
        // Every capability, as a privileged container has.
    } else if uid == 0 {
        // Root keeps the runtime's default set, less what is dropped, plus what is added.
        let base = if drop_all {
            "-all".to_string()
        } else {
            "-all,+chown,+dac_override,+fowner,+fsetid,+kill,+setgid,+setuid,+setpcap,+net_bind_service,+net_raw,+sys_chroot,+mknod,+audit_write,+setfcap".to_string()
        };
        let set = std::iter::once(base)
            .chain(add.iter().cloned())
            .collect::<Vec<_>>()
            .join(",");
        setpriv.extend(["--bounding-set".to_string(), set]);
    } else if !add.is_empty() {
        let set = add.join(",");
        setpriv.extend([
            "--inh-caps".to_string(),
            set.clone(),
            "--ambient-caps".to_string(),
            set,
        ]);
    }
    let log = run.dir.join(".logs").join(format!("{}.log", c.name));
    fs::create_dir_all(log.parent().unwrap_or(&run.dir))?;
    let mut binds = Vec::new();
    if image.root_mounts {
        for m in c.volume_mounts.iter().flatten() {
            binds.push((run.dir.join(".volumes").join(&m.name), m.mount_path.clone()));
        }
    }
    binds.extend(image.files.iter().cloned());
    for (src, path) in &binds {
        // The mount point must exist in the node's filesystem (shared by every container
        // here): an empty directory or file is made when it is missing.
        let p = Path::new(path);
        if !p.exists() {
            let made = if src.is_dir() {
                fs::create_dir_all(p)
            } else {
                fs::File::create(p).map(|_| ())
            };
            made.with_context(|| format!("{field}: make the mount point {path}"))?;
        }
    }
    let path = image
        .path
        .iter()
        .map(String::as_str)
        .chain([CONTAINER_PATH])
        .collect::<Vec<_>>()
        .join(":");
    Ok(Prepared {
        state: ContainerState {
            name: c.name.clone(),
            image: image_ref,
            init,
            sidecar,
            pid: None,
            started: false,
            ready: false,
            restart_count: 0,
            state: serde_json::json!({"waiting": {"reason": "PodInitializing"}}),
            uid,
            gid,
            setpriv,
            env,
            log,
            binds,
            path,
        },
        argv,
        spec: c.clone(),
    })
}

/// `NAME_SERVICE_HOST`/`_PORT` for the Services of the pod's namespace (enableServiceLinks, the
/// API server's default) and the `kubernetes` Service.
fn service_env(inner: &Inner, namespace: &str) -> Vec<(String, String)> {
    let services = lock(&inner.services).clone();
    let mut env = Vec::new();
    for s in services {
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        let name = s.metadata.name.clone().unwrap_or_default();
        if ns != namespace && !(ns == "default" && name == "kubernetes") {
            continue;
        }
        let Some(spec) = s.spec else { continue };
        let Some(ip) = spec.cluster_ip.filter(|ip| ip != "None" && !ip.is_empty()) else {
            continue;
        };
        let key = name.to_uppercase().replace('-', "_");
        if let Some(p) = spec.ports.iter().flatten().next() {
            env.push((format!("{key}_SERVICE_HOST"), ip.clone()));
            env.push((format!("{key}_SERVICE_PORT"), p.port.to_string()));
        }
    }
    env
}

/// `argv` as container `c` runs it: in the pod's network namespace and directory, as its user
/// with its capabilities (`setpriv`), with its env.
fn container_command(run: &PodRun, c: &ContainerState, argv: &[String]) -> Command {
    let mut cmd = Command::new("ip");
    // `ip netns exec` gives the process a mount namespace of its own, `unshare --uts` a host
    // name of its own: the pod's name, as a kubelet sets it; the volumes of an image that reads
    // them at their absolute paths are bound there, seen by this container alone; then the
    // process becomes the container's user.
    cmd.args([
        "netns", "exec", &run.netns, "unshare", "--uts", "--", "sh", "-c",
    ])
    .arg(
        "echo \"$1\" > /proc/sys/kernel/hostname || exit 127; shift; \
             while [ \"$1\" != -- ]; do mount --bind \"$1\" \"$2\" || exit 127; shift 2; done; \
             shift; exec \"$@\"",
    )
    .arg("sh")
    .arg(&run.hostname);
    for (dir, path) in &c.binds {
        cmd.arg(dir).arg(path);
    }
    cmd.arg("--");
    cmd.arg("setpriv")
        .args(&c.setpriv)
        .arg("--")
        .args(argv)
        .current_dir(&run.dir)
        .env_clear()
        .env("PATH", &c.path)
        .envs(c.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    cmd
}

fn spawn_container(run: &PodRun, p: &Prepared) -> Result<tokio::process::Child> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&p.state.log)?;
    // The container's stdout and stderr belong to its user, as runc makes them (its
    // fixStdioPermissions): a process may reopen them by path, as Envoy does for an access log
    // file `/dev/stdout` (Istio's meshConfig.accessLogFile).
    std::os::unix::fs::fchown(&log, Some(p.state.uid), Some(p.state.gid))?;
    let mut cmd = tokio::process::Command::from(container_command(run, &p.state, &p.argv));
    cmd.stdout(log.try_clone()?).stderr(log).kill_on_drop(true);
    cmd.spawn()
        .with_context(|| format!("start container {}", p.state.name))
}

async fn run_to_completion(inner: &Inner, run: &PodRun, p: &Prepared) -> Result<i32> {
    let started = now_rfc3339();
    let mut child = spawn_container(run, p)?;
    run.with(&p.state.name, |c| {
        c.pid = child.id().map(|p| p as i32);
        c.state = serde_json::json!({"running": {"startedAt": started}});
    });
    run.changed.notify_one();
    let status = child.wait().await?;
    let code = status.code().unwrap_or(128 + nix_signal(&status));
    inner.say(&format!(
        "{}/{}: init container {} exited {code}",
        run.namespace, run.name, p.state.name
    ));
    // A kubelet's prober marks an init container that completed successfully ready.
    run.with(&p.state.name, |c| {
        c.pid = None;
        c.ready = code == 0;
        c.state = terminated(code, &started);
    });
    run.changed.notify_one();
    Ok(code)
}

fn nix_signal(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.signal().unwrap_or(0)
}

fn terminated(code: i32, started: &str) -> serde_json::Value {
    serde_json::json!({"terminated": {
        "exitCode": code,
        "reason": if code == 0 { "Completed" } else { "Error" },
        "startedAt": started,
        "finishedAt": now_rfc3339(),
    }})
}

/// Runs a long-lived container, restarting it as `restart_policy` says until the pod stops.
async fn supervise(inner: Arc<Inner>, run: Arc<PodRun>, p: Prepared, restart_policy: String) {
    let mut backoff = Duration::from_millis(500);
    loop {
        let started = now_rfc3339();
        let mut child = match spawn_container(&run, &p) {
            Ok(c) => c,
            Err(e) => {
                inner.say(&format!("{}/{}: {e:#}", run.namespace, run.name));
                run.set_phase("Failed", Some(format!("{e:#}")));
                return;
            }
        };
        let no_startup_probe = p.spec.startup_probe.is_none();
        run.with(&p.state.name, |c| {
            c.pid = child.id().map(|p| p as i32);
            c.state = serde_json::json!({"running": {"startedAt": started}});
            c.started = no_startup_probe;
        });
        run.changed.notify_one();
        let status = child.wait().await;
        let code = status
            .as_ref()
            .map(|s| s.code().unwrap_or(128 + nix_signal(s)))
            .unwrap_or(-1);
        inner.say(&format!(
            "{}/{}: container {} exited {code}",
            run.namespace, run.name, p.state.name
        ));
        run.with(&p.state.name, |c| {
            c.pid = None;
            c.ready = false;
            c.started = false;
            c.state = terminated(code, &started);
        });
        run.changed.notify_one();
        let again = match restart_policy.as_str() {
            "Always" => true,
            "OnFailure" => code != 0,
            _ => false,
        };
        if !again || run.stopping.load(Ordering::SeqCst) {
            if !run.stopping.load(Ordering::SeqCst) {
                finished(&run);
            }
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
        if run.stopping.load(Ordering::SeqCst) {
            return;
        }
        run.with(&p.state.name, |c| c.restart_count += 1);
    }
}

/// A pod whose containers do not restart is Succeeded or Failed once they all exited.
fn finished(run: &PodRun) {
    let cs = lock(&run.containers).clone();
    let regular: Vec<&ContainerState> = cs.iter().filter(|c| !c.init).collect();
    if regular.iter().all(|c| c.state.get("terminated").is_some()) {
        let ok = regular
            .iter()
            .all(|c| c.state["terminated"]["exitCode"].as_i64() == Some(0));
        run.set_phase(if ok { "Succeeded" } else { "Failed" }, None);
    }
}

async fn post_start(inner: &Inner, run: &PodRun, p: &Prepared) -> Result<()> {
    let Some(h) = p.spec.lifecycle.as_ref().and_then(|l| l.post_start.clone()) else {
        return Ok(());
    };
    run_handler(inner, run, p, &h, "postStart").await
}

async fn run_handler(
    inner: &Inner,
    run: &PodRun,
    p: &Prepared,
    h: &k8s_openapi::api::core::v1::LifecycleHandler,
    what: &str,
) -> Result<()> {
    if let Some(e) = &h.exec {
        let argv: Vec<String> = e
            .command
            .iter()
            .flatten()
            .map(|w| volumes::expand(w, &p.state.env))
            .collect();
        let prepared = Prepared { argv, ..p.clone() };
        let out = spawn_container(run, &prepared)?.wait().await?;
        inner.say(&format!(
            "{}/{}: {what} of {} exited {out}",
            run.namespace, run.name, p.state.name
        ));
        if !out.success() && what == "postStart" {
            bail!("{what} hook of container {} failed ({out})", p.state.name);
        }
    } else if let Some(s) = &h.sleep {
        tokio::time::sleep(Duration::from_secs(u64::try_from(s.seconds).unwrap_or(0))).await;
    } else if let Some(g) = &h.http_get {
        let port = port_of(&p.spec, &g.port)?;
        let _ = http_probe(
            &run.ip,
            port,
            g.path.as_deref().unwrap_or("/"),
            &[],
            Duration::from_secs(10),
        )
        .await;
    }
    Ok(())
}

/// Startup, readiness and liveness probes of one container, as the kubelet runs them.
async fn probe(inner: Arc<Inner>, run: Arc<PodRun>, p: Prepared) {
    let name = p.state.name.clone();
    loop {
        // Wait for the process.
        while run.with(&name, |c| c.pid.is_none()).unwrap_or(true) {
            if run.stopping.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pid = run.with(&name, |c| c.pid).flatten();
        if let Some(sp) = &p.spec.startup_probe {
            if !probe_until(&run, &p, sp, pid).await {
                // Failed its startup probe: killed, the supervisor restarts it.
                kill_pid(pid);
                continue;
            }
            run.with(&name, |c| c.started = true);
            run.changed.notify_one();
        }
        // Readiness: without a probe, ready once started (and running).
        let readiness = p.spec.readiness_probe.clone();
        let liveness = p.spec.liveness_probe.clone();
        let mut next_ready = Instant::now();
        let mut next_live = Instant::now()
            + Duration::from_secs(
                liveness
                    .as_ref()
                    .and_then(|l| l.initial_delay_seconds)
                    .unwrap_or(0) as u64,
            );
        let (mut r_ok, mut r_fail, mut l_fail) = (0, 0, 0);
        if readiness.is_none() {
            run.with(&name, |c| c.ready = c.pid.is_some());
            run.changed.notify_one();
        }
        loop {
            if run.stopping.load(Ordering::SeqCst) {
                return;
            }
            if run.with(&name, |c| c.pid).flatten() != pid {
                break; // restarted
            }
            let now = Instant::now();
            if let Some(rp) = &readiness
                && now >= next_ready
            {
                next_ready = now + period(rp);
                if probe_once(&run, &p, rp).await {
                    r_ok += 1;
                    r_fail = 0;
                    if r_ok >= rp.success_threshold.unwrap_or(1) {
                        set_ready(&run, &name, true);
                    }
                } else {
                    r_fail += 1;
                    r_ok = 0;
                    if r_fail >= rp.failure_threshold.unwrap_or(3) {
                        set_ready(&run, &name, false);
                    }
                }
            }
            if let Some(lp) = &liveness
                && now >= next_live
            {
                next_live = now + period(lp);
                if probe_once(&run, &p, lp).await {
                    l_fail = 0;
                } else {
                    l_fail += 1;
                    if l_fail >= lp.failure_threshold.unwrap_or(3) {
                        inner.say(&format!(
                            "{}/{}: {name} failed its liveness probe: restarting",
                            run.namespace, run.name
                        ));
                        kill_pid(pid);
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn set_ready(run: &PodRun, name: &str, ready: bool) {
    if run.with(name, |c| std::mem::replace(&mut c.ready, ready)) != Some(ready) {
        run.changed.notify_one();
    }
}

fn kill_pid(pid: Option<i32>) {
    if let Some(pid) = pid {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn period(p: &Probe) -> Duration {
    Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64)
}

/// Runs `p` until it succeeds (true) or fails `failureThreshold` times in a row (false).
async fn probe_until(run: &PodRun, c: &Prepared, p: &Probe, pid: Option<i32>) -> bool {
    tokio::time::sleep(Duration::from_secs(
        p.initial_delay_seconds.unwrap_or(0) as u64
    ))
    .await;
    let mut failures = 0;
    loop {
        if run.stopping.load(Ordering::SeqCst)
            || run.with(&c.state.name, |s| s.pid).flatten() != pid
        {
            return false;
        }
        if probe_once(run, c, p).await {
            return true;
        }
        failures += 1;
        if failures >= p.failure_threshold.unwrap_or(3) {
            return false;
        }
        tokio::time::sleep(period(p)).await;
    }
}

async fn probe_once(run: &PodRun, c: &Prepared, p: &Probe) -> bool {
    let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64);
    if let Some(h) = &p.http_get {
        let Ok(port) = port_of(&c.spec, &h.port) else {
            return false;
        };
        let headers: Vec<(String, String)> = h
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        let host = h.host.clone().unwrap_or_else(|| run.ip.clone());
        return http_probe(
            &host,
            port,
            h.path.as_deref().unwrap_or("/"),
            &headers,
            timeout,
        )
        .await
        .is_ok_and(|code| (200..400).contains(&code));
    }
    if let Some(t) = &p.tcp_socket {
        let Ok(port) = port_of(&c.spec, &t.port) else {
            return false;
        };
        let host = t.host.clone().unwrap_or_else(|| run.ip.clone());
        return tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        .is_ok_and(|r| r.is_ok());
    }
    if let Some(e) = &p.exec {
        let argv: Vec<String> = e.command.iter().flatten().cloned().collect();
        let prepared = Prepared { argv, ..c.clone() };
        let Ok(child) = spawn_container(run, &prepared) else {
            return false;
        };
        return tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .is_ok_and(|r| r.is_ok_and(|o| o.status.success()));
    }
    false
}

fn port_of(c: &Container, port: &IntOrString) -> Result<u16> {
    match port {
        IntOrString::Int(p) => Ok(u16::try_from(*p)?),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| u16::try_from(p.container_port).unwrap_or(0))
            .with_context(|| format!("container {}: no port named {name}", c.name)),
    }
}

/// An HTTP/1.1 GET as the kubelet's prober sends it; returns the status code.
pub async fn http_probe(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Result<u16> {
    Ok(http_get(host, port, path, headers, timeout).await?.0)
}

/// One plain HTTP GET from the node; the body of a 200 answer.
pub async fn http_get_text(host: &str, port: u16, path: &str) -> Result<String> {
    match http_get(host, port, path, &[], Duration::from_secs(10)).await? {
        (200, body) => Ok(body),
        (code, _) => bail!("GET {host}:{port}{path}: {code}"),
    }
}

/// One HTTP/1.1 GET (`Connection: close`, the kubelet's User-Agent and Accept unless `headers`
/// give them) within `timeout`: the status code and the body.
async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Result<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect((host, port)).await?;
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n");
        let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
        if !has("user-agent") {
            req.push_str("User-Agent: kube-probe/1.36\r\n");
        }
        if !has("accept") {
            req.push_str("Accept: */*\r\n");
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("Connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        let text = String::from_utf8_lossy(&out).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let code: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("GET {host}:{port}{path}: not an HTTP response"))?;
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_string()
        };
        anyhow::Ok((code, body))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .with_context(|| format!("GET {host}:{port}{path} timed out"))?
}

/// Writes the pod's status whenever something in it changed.
async fn write_status(inner: Arc<Inner>, run: Arc<PodRun>) {
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), &run.namespace);
    let start_time = now_rfc3339();
    let mut last = serde_json::Value::Null;
    loop {
        run.changed.notified().await;
        // Coalesce a burst of changes.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let status = status_of(&run, &start_time);
        if status == last {
            continue;
        }
        match api
            .patch_status(&run.name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) => last = status,
            Err(e) => {
                inner.say(&format!("{}/{}: status: {e}", run.namespace, run.name));
                tokio::time::sleep(Duration::from_millis(200)).await;
                run.changed.notify_one();
            }
        }
    }
}

fn status_of(run: &PodRun, start_time: &str) -> serde_json::Value {
    let cs = lock(&run.containers).clone();
    let (phase, message) = lock(&run.phase).clone();
    let status = |c: &ContainerState| {
        serde_json::json!({
            "name": c.name, "image": c.image, "imageID": "",
            "containerID": c.pid.map(|p| format!("netns://{p}")),
            "ready": c.ready, "started": c.started,
            "restartCount": c.restart_count, "state": c.state,
        })
    };
    let initialized = run.initialized.load(Ordering::SeqCst);
    let ready = initialized
        && !cs.is_empty()
        && cs.iter().filter(|c| !c.init || c.sidecar).all(|c| c.ready);
    let cond = |t: &str, ok: bool| serde_json::json!({"type": t, "status": if ok { "True" } else { "False" }, "lastTransitionTime": start_time});
    serde_json::json!({"status": {
        "phase": phase,
        "message": message,
        "reason": if phase == "Failed" { Some("TestKubeletError") } else { None },
        "hostIP": NODE_IP, "hostIPs": [{"ip": NODE_IP}],
        "podIP": run.ip, "podIPs": [{"ip": run.ip}],
        "startTime": start_time,
        "conditions": [
            cond("PodReadyToStartContainers", true),
            cond("Initialized", initialized),
            cond("ContainersReady", ready),
            cond("Ready", ready),
            cond("PodScheduled", true),
        ],
        "initContainerStatuses": cs.iter().filter(|c| c.init).map(status).collect::<Vec<_>>(),
        "containerStatuses": cs.iter().filter(|c| !c.init).map(status).collect::<Vec<_>>(),
    }})
}

/// Stops the pod as the kubelet does: preStop hooks and SIGTERM for the containers, SIGKILL for
/// what is left after the grace period; native sidecars after the containers, in reverse order.
async fn terminate(inner: &Inner, run: &PodRun, pod: &Pod, grace: Duration) {
    run.stopping.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + grace;
    let spec = pod.spec.clone().unwrap_or_default();
    let specs: HashMap<String, Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .map(|c| (c.name.clone(), c.clone()))
        .collect();
    let cs = lock(&run.containers).clone();
    let regular: Vec<ContainerState> = cs.iter().filter(|c| !c.init).cloned().collect();
    let mut sidecars: Vec<ContainerState> = cs.iter().filter(|c| c.sidecar).cloned().collect();
    sidecars.reverse();
    for group in [regular, sidecars] {
        let mut waits = Vec::new();
        for c in group {
            let Some(spec) = specs.get(&c.name).cloned() else {
                continue;
            };
            let p = Prepared {
                state: c.clone(),
                argv: vec![],
                spec,
            };
            waits.push(async move {
                if let Some(h) = p.spec.lifecycle.as_ref().and_then(|l| l.pre_stop.clone()) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let _ = tokio::time::timeout(left, run_handler(inner, run, &p, &h, "preStop"))
                        .await;
                }
                if let Some(pid) = run.with(&p.state.name, |c| c.pid).flatten() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
                while Instant::now() < deadline
                    && run
                        .with(&p.state.name, |c| c.pid.is_some())
                        .unwrap_or(false)
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                kill_pid(run.with(&p.state.name, |c| c.pid).flatten());
            });
        }
        futures::future::join_all(waits).await;
    }
}

fn teardown(inner: &Inner, run: &PodRun) {
    harness::kill_all_in(&run.netns);
    // Torn down once: by the pod's task, or by the kubelet's shutdown if that task never ended.
    if Path::new("/run/netns").join(&run.netns).exists() {
        let _ = Command::new("ip")
            .args(["netns", "delete", &run.netns])
            .status();
    }
    let _ = fs::remove_dir_all(Path::new("/etc/netns").join(&run.netns));
    if let Some(n) = run.ip.rsplit('.').next().and_then(|n| n.parse::<u8>().ok()) {
        lock(&inner.ips).remove(&n);
    }
}

async fn delete_now(inner: &Inner, ns: &str, name: &str, uid: &str) {
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), ns);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    if let Err(e) = api.delete(name, &dp).await
        && !matches!(&e, kube::Error::Api(a) if a.code == 404 || a.code == 409)
    {
        inner.say(&format!("delete {ns}/{name}: {e}"));
    }
}

async fn refresh_tokens(inner: Arc<Inner>, pod: Pod, mut tokens: Vec<volumes::TokenFile>) {
    loop {
        let next = tokens
            .iter()
            .map(|t| t.refresh_at)
            .min()
            .unwrap_or_else(Instant::now);
        tokio::time::sleep_until(next.into()).await;
        for t in tokens.iter_mut().filter(|t| t.refresh_at <= Instant::now()) {
            match volumes::write_token(&inner.client, &pod, t).await {
                Ok(()) => {
                    t.refresh_at = Instant::now()
                        + Duration::from_secs((t.expiration_seconds as u64) * 8 / 10);
                }
                Err(e) => {
                    inner.say(&format!("token refresh {}: {e:#}", t.path.display()));
                    t.refresh_at = Instant::now() + Duration::from_secs(5);
                }
            }
        }
    }
}

async fn warn_event(inner: &Inner, pod: &Pod, reason: &str, message: &str) {
    let ns = volumes::namespace(pod);
    let api: Api<Event> = Api::namespaced(inner.client.clone(), &ns);
    let name = format!(
        "{}.{}",
        pod.metadata.name.clone().unwrap_or_default(),
        reason.to_lowercase()
    );
    let event = Event {
        metadata: kube::api::ObjectMeta {
            name: Some(name),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: pod.metadata.name.clone(),
            namespace: Some(ns),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        source: Some(k8s_openapi::api::core::v1::EventSource {
            component: Some("test-kubelet".into()),
            host: Some(NODE_NAME.into()),
        }),
        ..Default::default()
    };
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        inner.say(&format!("event {reason}: {e}"));
    }
    inner.say(&format!(
        "{}: {message}",
        pod.metadata.name.clone().unwrap_or_default()
    ));
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is the failure report
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap()
    }

    const PROXY: &str = "localhost/istio-rs/proxyv2:test";

    #[test]
    fn what_it_cannot_do_is_refused_by_field() {
        let cases = [
            (
                serde_json::json!({"containers": [{"name": "c", "image": PROXY}], "hostNetwork": true}),
                "spec.hostNetwork",
            ),
            (
                serde_json::json!({"containers": [{"name": "c", "image": "nginx"}]}),
                "spec.containers[0].image",
            ),
            (
                serde_json::json!({"containers": [{"name": "c", "image": PROXY, "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
                "spec.containers[0].ports[0].hostPort",
            ),
            (
                serde_json::json!({"initContainers": [{"name": "i", "image": PROXY, "readinessProbe": {"grpc": {"port": 1}}}], "containers": []}),
                "spec.initContainers[0].readinessProbe.grpc",
            ),
            (
                serde_json::json!({"containers": [], "securityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]}}),
                "spec.securityContext.sysctls[0]",
            ),
        ];
        for (spec, field) in cases {
            let err = check_spec(&pod(spec.clone())).unwrap_err().to_string();
            assert!(err.contains(field), "{spec}: {err}");
        }
    }

    #[test]
    fn what_it_does_not_enforce_is_named() {
        let lax = check_spec(&pod(serde_json::json!({
            "containers": [{
                "name": "c", "image": PROXY,
                "resources": {"limits": {"cpu": "2"}},
                "securityContext": {"readOnlyRootFilesystem": true},
            }],
            "securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]},
        })))
        .unwrap();
        assert_eq!(
            lax,
            [
                "spec.containers[0].securityContext.readOnlyRootFilesystem",
                "spec.containers[0].resources"
            ]
        );
    }
}
